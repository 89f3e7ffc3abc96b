package catalog

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
)

// BlockRange is a run of consecutive blocks of one relation fork in a
// node's buffer cache.
type BlockRange struct {
	Filenode uint32 `json:"f"`
	Fork     int16  `json:"k"`
	First    int64  `json:"a"`
	Last     int64  `json:"b"`
	Usage    int64  `json:"u"` // sum of the blocks' usage counts
}

// Blocks is the number of blocks in the range.
func (r BlockRange) Blocks() int64 { return r.Last - r.First + 1 }

// HotSet is one tenant's hot blocks on one node (a row of hot_sets).
type HotSet struct {
	Tenant     string       `json:"tenant"`
	Cluster    string       `json:"cluster"`
	Node       string       `json:"node"`
	CapturedAt time.Time    `json:"captured_at"`
	Blocks     int64        `json:"blocks"`
	Usage      int64        `json:"usage"`
	Counter    int64        `json:"-"`
	Activity   int64        `json:"activity"` // blocks hit + read since the previous capture
	Ranges     []BlockRange `json:"-"`
}

// PrewarmOutcome is how a tenant's prewarm on a node ended.
type PrewarmOutcome string

// Outcomes of a tenant's prewarm.
const (
	PrewarmDone    PrewarmOutcome = "done"
	PrewarmSkipped PrewarmOutcome = "skipped" // the tenant is not active
	PrewarmFailed  PrewarmOutcome = "failed"
)

// PrewarmResult is the last prewarm of a tenant on a node (a row of
// prewarm_tenants).
type PrewarmResult struct {
	Tenant       string         `json:"tenant"`
	Node         string         `json:"node"`
	JobID        int64          `json:"job_id"`
	State        PrewarmOutcome `json:"state"`
	BlocksBuffer int64          `json:"blocks_buffer"`
	BlocksOS     int64          `json:"blocks_os"`
	Error        string         `json:"error,omitempty"`
	At           time.Time      `json:"at"`
}

// PrewarmNode is what pgtenant last saw of a node (a row of prewarm_nodes).
type PrewarmNode struct {
	Cluster         string     `json:"cluster"`
	Node            string     `json:"node"`
	PostmasterStart *time.Time `json:"postmaster_start,omitempty"`
	Timeline        *int       `json:"timeline,omitempty"`
	CapturedAt      *time.Time `json:"captured_at,omitempty"`
	CapturedTenants int        `json:"captured_tenants"`
	CapturedBlocks  int64      `json:"captured_blocks"`
}

// ReplaceHotSets replaces a node's hot sets with a capture taken at, in
// one transaction: each set's activity is the change of its counter since
// the previous capture (the counter itself on a first capture or after a
// statistics reset), and only tenants (not spares, not rows gone since)
// that live on cluster keep one: a moved tenant's leftover copy on its old
// cluster, purged later, is not the tenant's hot set. The node's row records the capture, and the node's start and
// timeline when it had none. It returns how many sets were kept.
func (s *Store) ReplaceHotSets(ctx context.Context, cluster, node string, start time.Time, timeline int, at time.Time, sets []HotSet) (int, error) {
	kept := 0
	var blocks int64
	rows := make([][]any, 0, len(sets))
	for _, h := range sets {
		b, err := json.Marshal(h.Ranges)
		if err != nil {
			return 0, err
		}
		rows = append(rows, []any{h.Tenant, cluster, node, at, h.Blocks, h.Usage, h.Counter, string(b)})
		blocks += h.Blocks
	}
	err := pgx.BeginFunc(ctx, s.pool, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, `CREATE TEMP TABLE hot_sets_prev ON COMMIT DROP AS
			SELECT tenant, counter FROM hot_sets WHERE cluster = $1 AND node = $2`, cluster, node); err != nil {
			return err
		}
		if _, err := tx.Exec(ctx, `DELETE FROM hot_sets WHERE cluster = $1 AND node = $2`, cluster, node); err != nil {
			return err
		}
		if len(rows) > 0 {
			if _, err := tx.Exec(ctx, `CREATE TEMP TABLE hot_sets_in (LIKE hot_sets INCLUDING DEFAULTS) ON COMMIT DROP`); err != nil {
				return err
			}
			if _, err := tx.CopyFrom(ctx, pgx.Identifier{"hot_sets_in"},
				[]string{"tenant", "cluster", "node", "captured_at", "blocks", "usage", "counter", "ranges"}, pgx.CopyFromRows(rows)); err != nil {
				return err
			}
			tag, err := tx.Exec(ctx, `INSERT INTO hot_sets (tenant, cluster, node, captured_at, blocks, usage, counter, activity, ranges)
				SELECT i.tenant, i.cluster, i.node, i.captured_at, i.blocks, i.usage, i.counter,
				       CASE WHEN p.counter IS NULL OR p.counter > i.counter THEN i.counter ELSE i.counter - p.counter END, i.ranges
				FROM hot_sets_in i JOIN tenants t ON t.id = i.tenant LEFT JOIN hot_sets_prev p ON p.tenant = i.tenant
				WHERE t.state NOT IN ('building', 'spare') AND t.cluster = i.cluster`)
			if err != nil {
				return err
			}
			kept = int(tag.RowsAffected())
		}
		_, err := tx.Exec(ctx, `INSERT INTO prewarm_nodes (cluster, node, postmaster_start, timeline, captured_at, captured_tenants, captured_blocks)
			VALUES ($1, $2, $3, $4, $5, $6, $7)
			ON CONFLICT (cluster, node) DO UPDATE SET captured_at = $5, captured_tenants = $6, captured_blocks = $7,
				postmaster_start = coalesce(prewarm_nodes.postmaster_start, $3), timeline = coalesce(prewarm_nodes.timeline, $4),
				updated_at = now()`, cluster, node, start, timeline, at, kept, blocks)
		return err
	})
	return kept, err
}

const hotSetColumns = `tenant, cluster, node, captured_at, blocks, usage, activity, ranges`

func scanHotSet(r pgx.CollectableRow) (HotSet, error) {
	var h HotSet
	var ranges []byte
	if err := r.Scan(&h.Tenant, &h.Cluster, &h.Node, &h.CapturedAt, &h.Blocks, &h.Usage, &h.Activity, &ranges); err != nil {
		return h, err
	}
	return h, json.Unmarshal(ranges, &h.Ranges)
}

// HotSets returns a tenant's hot sets, one per node.
func (s *Store) HotSets(ctx context.Context, tenant string) ([]HotSet, error) {
	rows, err := s.pool.Query(ctx, `SELECT `+hotSetColumns+` FROM hot_sets WHERE tenant = $1 ORDER BY node`, tenant)
	if err != nil {
		return nil, err
	}
	return pgx.CollectRows(rows, scanHotSet)
}

// NodeHotSets returns the hot sets captured on a node: of tenants only,
// or of all its tenants when tenants is empty.
func (s *Store) NodeHotSets(ctx context.Context, cluster, node string, tenants []string) ([]HotSet, error) {
	rows, err := s.pool.Query(ctx, `SELECT `+hotSetColumns+`
		FROM hot_sets WHERE cluster = $1 AND node = $2 AND (coalesce(cardinality($3::text[]), 0) = 0 OR tenant = ANY($3))`,
		cluster, node, tenants)
	if err != nil {
		return nil, err
	}
	return pgx.CollectRows(rows, scanHotSet)
}

// RecordPrewarm keeps a tenant's last prewarm on a node; nothing for a
// tenant whose row is gone since.
func (s *Store) RecordPrewarm(ctx context.Context, r PrewarmResult) error {
	_, err := s.pool.Exec(ctx, `INSERT INTO prewarm_tenants (tenant, node, job_id, state, blocks_buffer, blocks_os, error, at)
		SELECT $1, $2, $3, $4, $5, $6, $7, now() WHERE EXISTS (SELECT 1 FROM tenants WHERE id = $1)
		ON CONFLICT (tenant, node) DO UPDATE SET job_id = $3, state = $4, blocks_buffer = $5, blocks_os = $6, error = $7, at = now()`,
		r.Tenant, r.Node, r.JobID, r.State, r.BlocksBuffer, r.BlocksOS, r.Error)
	return err
}

// PrewarmResults returns a tenant's last prewarm per node.
func (s *Store) PrewarmResults(ctx context.Context, tenant string) ([]PrewarmResult, error) {
	rows, err := s.pool.Query(ctx, `SELECT tenant, node, coalesce(job_id, 0), state, blocks_buffer, blocks_os, error, at
		FROM prewarm_tenants WHERE tenant = $1 ORDER BY node`, tenant)
	if err != nil {
		return nil, err
	}
	return pgx.CollectRows(rows, func(r pgx.CollectableRow) (PrewarmResult, error) {
		var x PrewarmResult
		return x, r.Scan(&x.Tenant, &x.Node, &x.JobID, &x.State, &x.BlocksBuffer, &x.BlocksOS, &x.Error, &x.At)
	})
}

// PrewarmCount is the number of tenants whose last prewarm on a node ended
// in a state, and the blocks they loaded.
type PrewarmCount struct {
	Cluster, Node, State   string
	Tenants                int64
	BlocksBuffer, BlocksOS int64
}

// PrewarmCounts sums the last prewarms by cluster, node and state.
func (s *Store) PrewarmCounts(ctx context.Context) ([]PrewarmCount, error) {
	rows, err := s.pool.Query(ctx, `SELECT t.cluster, p.node, p.state, count(*), sum(p.blocks_buffer), sum(p.blocks_os)
		FROM prewarm_tenants p JOIN tenants t ON t.id = p.tenant GROUP BY 1, 2, 3`)
	if err != nil {
		return nil, err
	}
	return pgx.CollectRows(rows, func(r pgx.CollectableRow) (PrewarmCount, error) {
		var c PrewarmCount
		return c, r.Scan(&c.Cluster, &c.Node, &c.State, &c.Tenants, &c.BlocksBuffer, &c.BlocksOS)
	})
}

// GetPrewarmNode returns what pgtenant last saw of a node; ErrNotFound if
// it has seen nothing yet.
func (s *Store) GetPrewarmNode(ctx context.Context, cluster, node string) (PrewarmNode, error) {
	var n PrewarmNode
	err := s.pool.QueryRow(ctx, `SELECT cluster, node, postmaster_start, timeline, captured_at, captured_tenants, captured_blocks
		FROM prewarm_nodes WHERE cluster = $1 AND node = $2`, cluster, node).
		Scan(&n.Cluster, &n.Node, &n.PostmasterStart, &n.Timeline, &n.CapturedAt, &n.CapturedTenants, &n.CapturedBlocks)
	if errors.Is(err, pgx.ErrNoRows) {
		return n, fmt.Errorf("node %s/%s: %w", cluster, node, ErrNotFound)
	}
	return n, err
}

// SeePrewarmNode records a node's life (its start time and timeline), keeping
// its last capture.
func (s *Store) SeePrewarmNode(ctx context.Context, cluster, node string, start time.Time, timeline int) error {
	_, err := s.pool.Exec(ctx, `INSERT INTO prewarm_nodes (cluster, node, postmaster_start, timeline) VALUES ($1, $2, $3, $4)
		ON CONFLICT (cluster, node) DO UPDATE SET postmaster_start = $3, timeline = $4, updated_at = now()`,
		cluster, node, start, timeline)
	return err
}
