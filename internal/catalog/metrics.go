package catalog

import (
	"context"
	"encoding/json"
	"errors"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pgtenant/pgtenant/internal/tenant"
)

// MetricTenant is what the metrics collector needs of one tenant row: where
// it lives, its tier, its quota state and whether it is always exported.
type MetricTenant struct {
	ID         string
	Mode       tenant.Mode
	Database   string
	Tier       string
	State      TenantState
	Export     bool       // opted in to per-tenant series on /metrics
	Quota      string     // ok, warning, grace, enforced ("ok" without a row)
	QuotaSince *time.Time // entered that quota state
	OverSince  *time.Time // first seen over the quota
}

// MetricTenants lists every tenant of a cluster, spares included, with its
// quota state: one query per collector pass, however many tenants.
func (s *Store) MetricTenants(ctx context.Context, cluster string) ([]MetricTenant, error) {
	rows, err := s.pool.Query(ctx, `
		SELECT t.id, t.mode, t.database, t.tier, t.state, e.tenant IS NOT NULL,
		       coalesce(q.state, 'ok'), q.since, q.over_since
		FROM tenants t
		LEFT JOIN tenant_quota q ON q.tenant = t.id
		LEFT JOIN tenant_metrics_export e ON e.tenant = t.id
		WHERE t.cluster = $1`, cluster)
	if err != nil {
		return nil, err
	}
	return pgx.CollectRows(rows, func(r pgx.CollectableRow) (MetricTenant, error) {
		var m MetricTenant
		return m, r.Scan(&m.ID, &m.Mode, &m.Database, &m.Tier, &m.State, &m.Export, &m.Quota, &m.QuotaSince, &m.OverSince)
	})
}

// Rollup is one tenant's minute of activity. Pointers are NULL where the
// figure is unknown (schema-mode tenants have no per-schema transaction
// counts; a size not sampled yet).
type Rollup struct {
	Tenant      string    `json:"-"`
	Minute      time.Time `json:"minute"`
	SizeBytes   *int64    `json:"size_bytes,omitempty"`
	Connections int       `json:"connections"`
	Commits     *int64    `json:"commits,omitempty"`
	Rollbacks   *int64    `json:"rollbacks,omitempty"`
	RowsRead    int64     `json:"rows_read"`
	RowsWritten int64     `json:"rows_written"`
	BlksHit     int64     `json:"blks_hit"`
	BlksRead    int64     `json:"blks_read"`
	TempBytes   *int64    `json:"temp_bytes,omitempty"`
	Deadlocks   *int64    `json:"deadlocks,omitempty"`
}

// InsertRollups writes minute rollups in one multi-row INSERT (arrays
// unnested server-side). A minute another daemon already wrote is kept.
func (s *Store) InsertRollups(ctx context.Context, rs []Rollup) error {
	if len(rs) == 0 {
		return nil
	}
	n := len(rs)
	tenant, minute := make([]string, n), make([]time.Time, n)
	size, commits, rollbacks, temp, deadlocks := make([]*int64, n), make([]*int64, n), make([]*int64, n), make([]*int64, n), make([]*int64, n)
	conns := make([]int32, n)
	read, written, hit, blksRead := make([]int64, n), make([]int64, n), make([]int64, n), make([]int64, n)
	for i, r := range rs {
		tenant[i], minute[i], size[i], conns[i] = r.Tenant, r.Minute, r.SizeBytes, int32(r.Connections)
		commits[i], rollbacks[i], temp[i], deadlocks[i] = r.Commits, r.Rollbacks, r.TempBytes, r.Deadlocks
		read[i], written[i], hit[i], blksRead[i] = r.RowsRead, r.RowsWritten, r.BlksHit, r.BlksRead
	}
	// Rows of tenants purged meanwhile are skipped by the join, not an error.
	_, err := s.pool.Exec(ctx, `
		INSERT INTO tenant_metrics (tenant, minute, size_bytes, connections, commits, rollbacks,
		                            rows_read, rows_written, blks_hit, blks_read, temp_bytes, deadlocks)
		SELECT u.* FROM unnest($1::text[], $2::timestamptz[], $3::bigint[], $4::int[], $5::bigint[], $6::bigint[],
		                       $7::bigint[], $8::bigint[], $9::bigint[], $10::bigint[], $11::bigint[], $12::bigint[])
		       AS u(tenant, minute, size_bytes, connections, commits, rollbacks, rows_read, rows_written,
		            blks_hit, blks_read, temp_bytes, deadlocks)
		JOIN tenants t ON t.id = u.tenant
		ON CONFLICT (tenant, minute) DO NOTHING`,
		tenant, minute, size, conns, commits, rollbacks, read, written, hit, blksRead, temp, deadlocks)
	if err != nil {
		return err
	}
	// The newest size of each tenant on its row, for placement's loads;
	// unchanged sizes write nothing, and a row locked by a lifecycle step
	// is skipped (its next sample catches up) rather than waited for.
	_, err = s.pool.Exec(ctx, `
		WITH last AS (
			SELECT DISTINCT ON (tenant) tenant, size_bytes FROM unnest($1::text[], $2::timestamptz[], $3::bigint[]) AS u(tenant, minute, size_bytes)
			WHERE size_bytes IS NOT NULL ORDER BY tenant, minute DESC),
		locked AS (
			SELECT t.id, last.size_bytes FROM tenants t JOIN last ON last.tenant = t.id
			WHERE t.size_bytes IS DISTINCT FROM last.size_bytes
			FOR UPDATE OF t SKIP LOCKED)
		UPDATE tenants t SET size_bytes = locked.size_bytes FROM locked WHERE t.id = locked.id`, tenant, minute, size)
	return err
}

// DeleteRollupsBefore removes history older than t. Deleting nothing writes
// nothing.
func (s *Store) DeleteRollupsBefore(ctx context.Context, t time.Time) (int64, error) {
	tag, err := s.pool.Exec(ctx, `DELETE FROM tenant_metrics WHERE minute < $1`, t)
	return tag.RowsAffected(), err
}

// Rollups returns a tenant's minute rollups since a time, oldest first.
func (s *Store) Rollups(ctx context.Context, tenant string, since time.Time) ([]Rollup, error) {
	rows, err := s.pool.Query(ctx, `
		SELECT tenant, minute, size_bytes, connections, commits, rollbacks, rows_read, rows_written,
		       blks_hit, blks_read, temp_bytes, deadlocks
		FROM tenant_metrics WHERE tenant = $1 AND minute >= $2 ORDER BY minute`, tenant, since)
	if err != nil {
		return nil, err
	}
	return pgx.CollectRows(rows, scanRollup)
}

func scanRollup(r pgx.CollectableRow) (Rollup, error) {
	var x Rollup
	return x, r.Scan(&x.Tenant, &x.Minute, &x.SizeBytes, &x.Connections, &x.Commits, &x.Rollbacks, &x.RowsRead,
		&x.RowsWritten, &x.BlksHit, &x.BlksRead, &x.TempBytes, &x.Deadlocks)
}

// SizeSample is a tenant size and when it was taken.
type SizeSample struct {
	Bytes int64
	At    time.Time
}

// LastSizes returns the last size written for each tenant of a cluster, so
// that a restarted daemon does not wait a whole size interval to know them.
func (s *Store) LastSizes(ctx context.Context, cluster string) (map[string]SizeSample, error) {
	rows, err := s.pool.Query(ctx, `
		SELECT DISTINCT ON (m.tenant) m.tenant, m.size_bytes, m.minute
		FROM tenant_metrics m JOIN tenants t ON t.id = m.tenant
		WHERE t.cluster = $1 AND m.size_bytes IS NOT NULL
		ORDER BY m.tenant, m.minute DESC`, cluster)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	out := map[string]SizeSample{}
	for rows.Next() {
		var id string
		var s SizeSample
		if err := rows.Scan(&id, &s.Bytes, &s.At); err != nil {
			return nil, err
		}
		out[id] = s
	}
	return out, rows.Err()
}

// SizeGrowth sums, per cluster, the latest size of each tenant now and as it
// was about a day ago (the last size written before then), over tenants that
// have both: the doctor's growth projection.
func (s *Store) SizeGrowth(ctx context.Context, cluster string, ago time.Duration) (now, before int64, tenants int, err error) {
	err = s.pool.QueryRow(ctx, `
		WITH cur AS (
			SELECT DISTINCT ON (m.tenant) m.tenant, m.size_bytes FROM tenant_metrics m JOIN tenants t ON t.id = m.tenant
			WHERE t.cluster = $1 AND m.size_bytes IS NOT NULL ORDER BY m.tenant, m.minute DESC),
		old AS (
			SELECT DISTINCT ON (m.tenant) m.tenant, m.size_bytes FROM tenant_metrics m JOIN tenants t ON t.id = m.tenant
			WHERE t.cluster = $1 AND m.size_bytes IS NOT NULL AND m.minute <= now() - make_interval(secs => $2)
			ORDER BY m.tenant, m.minute DESC)
		SELECT coalesce(sum(cur.size_bytes), 0)::bigint, coalesce(sum(old.size_bytes), 0)::bigint, count(*)::int
		FROM cur JOIN old USING (tenant)`, cluster, ago.Seconds()).Scan(&now, &before, &tenants)
	return now, before, tenants, err
}

// Quota is a tenant's storage quota state.
type Quota struct {
	Tenant      string          `json:"-"`
	State       string          `json:"state"` // ok, warning, grace, enforced
	Since       time.Time       `json:"since"`
	OverSince   *time.Time      `json:"over_since,omitempty"`
	SizeBytes   int64           `json:"size_bytes"`
	Enforcement json.RawMessage `json:"-"`
}

// Quota states.
const (
	QuotaOK       = "ok"
	QuotaWarning  = "warning"
	QuotaGrace    = "grace"
	QuotaEnforced = "enforced"
)

// GetQuota returns a tenant's quota state; a tenant without a row is ok.
func (s *Store) GetQuota(ctx context.Context, tenant string) (Quota, error) {
	q := Quota{Tenant: tenant, State: QuotaOK, Enforcement: json.RawMessage("{}")}
	err := s.pool.QueryRow(ctx, `SELECT state, since, over_since, size_bytes, enforcement FROM tenant_quota WHERE tenant = $1`, tenant).
		Scan(&q.State, &q.Since, &q.OverSince, &q.SizeBytes, &q.Enforcement)
	if errors.Is(err, pgx.ErrNoRows) {
		return q, nil
	}
	return q, err
}

// LockQuota reads a tenant's quota row FOR UPDATE in tx, creating it (ok)
// when missing, so that of several daemons only one makes a transition.
func (s *Store) LockQuota(ctx context.Context, tx pgx.Tx, tenant string) (Quota, error) {
	if _, err := tx.Exec(ctx, `INSERT INTO tenant_quota (tenant, state) SELECT id, 'ok' FROM tenants WHERE id = $1
		ON CONFLICT (tenant) DO NOTHING`, tenant); err != nil {
		return Quota{}, err
	}
	q := Quota{Tenant: tenant}
	err := tx.QueryRow(ctx, `SELECT state, since, over_since, size_bytes, enforcement FROM tenant_quota WHERE tenant = $1 FOR UPDATE`, tenant).
		Scan(&q.State, &q.Since, &q.OverSince, &q.SizeBytes, &q.Enforcement)
	return q, notFound(err, "tenant "+tenant)
}

// SaveQuota writes a tenant's quota row in tx (after LockQuota).
func (s *Store) SaveQuota(ctx context.Context, tx pgx.Tx, q Quota) error {
	if len(q.Enforcement) == 0 {
		q.Enforcement = json.RawMessage("{}")
	}
	_, err := tx.Exec(ctx, `UPDATE tenant_quota SET state = $2, since = $3, over_since = $4, size_bytes = $5,
		enforcement = $6, updated_at = now() WHERE tenant = $1`, q.Tenant, q.State, q.Since, q.OverSince, q.SizeBytes, q.Enforcement)
	return err
}

// SetMetricsExport opts a tenant in to (or out of) per-tenant series on /metrics.
func (s *Store) SetMetricsExport(ctx context.Context, tenant string, export bool) error {
	if !export {
		_, err := s.pool.Exec(ctx, `DELETE FROM tenant_metrics_export WHERE tenant = $1`, tenant)
		return err
	}
	_, err := s.pool.Exec(ctx, `INSERT INTO tenant_metrics_export (tenant) VALUES ($1) ON CONFLICT DO NOTHING`, tenant)
	return err
}

// LargestBuild is the template build with the most relations on any cluster
// (any template may be materialised on any cluster).
type LargestBuild struct {
	Template  string `json:"template"`
	Version   int    `json:"version"`
	Cluster   string `json:"cluster"`
	Relations int    `json:"relations"`
	SizeBytes int64  `json:"size_bytes"`
}

// LargestTemplateBuild returns the ready build with the most relations, and
// the largest build size; ErrNotFound when nothing is built.
func (s *Store) LargestTemplateBuild(ctx context.Context) (LargestBuild, int64, error) {
	var b LargestBuild
	var maxSize int64
	err := s.pool.QueryRow(ctx, `
		SELECT template, version, cluster, relations, size_bytes, max(size_bytes) OVER ()
		FROM template_builds WHERE state = 'ready' ORDER BY relations DESC, template LIMIT 1`).
		Scan(&b.Template, &b.Version, &b.Cluster, &b.Relations, &b.SizeBytes, &maxSize)
	return b, maxSize, notFound(err, "template build")
}

// ModeCounts counts a cluster's tenants by mode: its spares (ready and
// being built: the doctor's estimate of what the pools hold on disk) and
// its claimed tenants (provisioning, active, suspended, dropped: how dense
// it is).
func (s *Store) ModeCounts(ctx context.Context, cluster string) (spares, claimed map[string]int, err error) {
	rows, err := s.pool.Query(ctx, `SELECT mode, state IN ('spare', 'building'), count(*) FROM tenants
		WHERE cluster = $1 AND state IN ('spare', 'building', 'provisioning', 'active', 'suspended', 'dropped') GROUP BY 1, 2`, cluster)
	if err != nil {
		return nil, nil, err
	}
	defer rows.Close()
	spares, claimed = map[string]int{}, map[string]int{}
	for rows.Next() {
		var m string
		var spare bool
		var n int
		if err := rows.Scan(&m, &spare, &n); err != nil {
			return nil, nil, err
		}
		if spare {
			spares[m] = n
		} else {
			claimed[m] = n
		}
	}
	return spares, claimed, rows.Err()
}

// TenantTiers returns the tier of each of the given tenants.
func (s *Store) TenantTiers(ctx context.Context, ids []string) (map[string]string, error) {
	rows, err := s.pool.Query(ctx, `SELECT id, tier FROM tenants WHERE id = ANY($1)`, ids)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	out := map[string]string{}
	for rows.Next() {
		var id, tier string
		if err := rows.Scan(&id, &tier); err != nil {
			return nil, err
		}
		out[id] = tier
	}
	return out, rows.Err()
}
