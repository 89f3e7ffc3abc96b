package prewarm

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pgtenant/pgtenant/internal/catalog"
	"github.com/pgtenant/pgtenant/internal/cluster"
	"github.com/pgtenant/pgtenant/internal/jobs"
	"github.com/pgtenant/pgtenant/internal/tenant"
)

// Job prewarms one node of a cluster.
const Job = "cluster.prewarm"

// Args of a prewarm job.
type Args struct {
	Cluster string   `json:"cluster"`
	Node    string   `json:"node"`              // primary, standby1, …
	Tenants []string `json:"tenants,omitempty"` // only these; all with a hot set when empty
	Reason  string   `json:"reason"`            // restart, failover, resume, manual
}

// Spec is the job for a prewarm.
func Spec(a Args) jobs.Spec {
	key := "prewarm:" + a.Cluster + ":" + a.Node
	target, kind := a.Cluster, "cluster"
	if len(a.Tenants) == 1 {
		key += ":" + a.Tenants[0]
		target, kind = a.Tenants[0], "tenant"
	}
	return jobs.Spec{Type: Job, Key: key, TargetKind: kind, Target: target, Cluster: a.Cluster, Args: a, MaxAttempts: 3}
}

// TenantResult is the last prewarm of a tenant on a node.
type TenantResult struct {
	Tenant       string    `json:"tenant"`
	Node         string    `json:"node"`
	JobID        int64     `json:"job_id"`
	State        string    `json:"state"` // done, skipped, failed
	BlocksBuffer int64     `json:"blocks_buffer"`
	BlocksOS     int64     `json:"blocks_os"`
	Error        string    `json:"error,omitempty"`
	At           time.Time `json:"at"`
}

// Handler is the job handler of Job: one step that loads the hot sets of the
// node's tenants in priority order. It never fails because of one tenant: a
// tenant that cannot be prewarmed is recorded and skipped.
func (s *Service) Handler() jobs.Handler {
	return jobs.Handler{Steps: func(j *jobs.Job) ([]jobs.Step, error) {
		var a Args
		if err := j.DecodeArgs(&a); err != nil {
			return nil, err
		}
		return []jobs.Step{{Name: "prewarm", Run: func(ctx context.Context, r *jobs.Run) error { return s.prewarm(ctx, r, a) }}}, nil
	}}
}

// planned is one tenant's work, in order.
type planned struct {
	t   catalog.Tenant
	hot HotSet
}

// plan orders the node's tenants: tier priority first, then recent activity
// (blocks hit or read between the last two captures), then how hot their
// cached blocks were.
func (s *Service) plan(ctx context.Context, a Args) ([]planned, error) {
	rows, err := s.Store.Pool().Query(ctx, `SELECT tenant, cluster, node, captured_at, blocks, usage, activity, ranges
		FROM hot_sets WHERE cluster = $1 AND node = $2 AND (coalesce(cardinality($3::text[]), 0) = 0 OR tenant = ANY($3))`,
		a.Cluster, a.Node, a.Tenants)
	if err != nil {
		return nil, err
	}
	sets, err := pgx.CollectRows(rows, scanHotSet)
	if err != nil {
		return nil, err
	}
	var out []planned
	for _, h := range sets {
		t, err := s.Store.GetTenant(ctx, nil, h.Tenant)
		if errors.Is(err, catalog.ErrNotFound) {
			continue // dropped and purged since the capture
		}
		if err != nil {
			return nil, err
		}
		out = append(out, planned{t: t, hot: h})
	}
	sort.SliceStable(out, func(i, j int) bool {
		pi, pj := s.Config.Tiers[out[i].t.Tier].Priority, s.Config.Tiers[out[j].t.Tier].Priority
		if pi != pj {
			return pi > pj
		}
		if out[i].hot.Activity != out[j].hot.Activity {
			return out[i].hot.Activity > out[j].hot.Activity
		}
		return out[i].hot.Usage > out[j].hot.Usage
	})
	return out, nil
}

func (s *Service) prewarm(ctx context.Context, r *jobs.Run, a Args) error {
	cl, err := s.Clusters.Get(a.Cluster)
	if err != nil {
		return jobs.Permanent(err)
	}
	plan, err := s.plan(ctx, a)
	if err != nil {
		return err
	}
	var total int64
	for _, p := range plan {
		total += p.hot.Blocks
	}
	budget, err := s.freeBuffers(ctx, cl, a.Node)
	if err != nil {
		return err
	}
	w := &warmer{s: s, cl: cl, node: a.Node, budget: int64(float64(budget) * s.Config.Prewarm.BufferFraction),
		limiter: newLimiter(int64(s.Config.Prewarm.RateLimit)), conns: map[string]*pgx.Conn{}}
	defer w.close()
	r.Progress(ctx, 0, total, fmt.Sprintf("prewarming %d tenants on %s/%s (%s): %d free buffers", len(plan), a.Cluster, a.Node, a.Reason, budget))
	var done int64
	for i, p := range plan {
		if err := ctx.Err(); err != nil {
			return err
		}
		res := w.tenant(ctx, p)
		res.JobID = r.Job.ID
		if err := s.record(ctx, res); err != nil {
			return err
		}
		done += p.hot.Blocks
		r.Progress(ctx, done, total, fmt.Sprintf("%d/%d tenants; %d blocks into shared_buffers, %d into the OS cache",
			i+1, len(plan), w.inBuffers, w.inOS))
	}
	return nil
}

// freeBuffers counts the node's shared buffers that prewarm may fill without
// pushing out anything in use: free ones (all of them after a restart) and
// ones whose usage count has decayed to zero, which the clock sweep would
// evict next anyway. Hotter buffers are never taken.
func (s *Service) freeBuffers(ctx context.Context, cl *cluster.Cluster, node string) (int64, error) {
	conn, err := cl.ConnectNode(ctx, node, cl.MaintenanceDB())
	if err != nil {
		return 0, err
	}
	defer conn.Close(context.WithoutCancel(ctx))
	if err := ensureBufferCache(ctx, conn, node); err != nil {
		return 0, err
	}
	var free int64
	err = conn.QueryRow(ctx, `SELECT count(*) FROM pg_buffercache WHERE relfilenode IS NULL OR (usagecount = 0 AND pinning_backends = 0)`).Scan(&free)
	return free, cluster.Classify(err)
}

func (s *Service) record(ctx context.Context, r TenantResult) error {
	_, err := s.Store.Pool().Exec(ctx, `INSERT INTO prewarm_tenants (tenant, node, job_id, state, blocks_buffer, blocks_os, error, at)
		SELECT $1, $2, $3, $4, $5, $6, $7, now() WHERE EXISTS (SELECT 1 FROM tenants WHERE id = $1)
		ON CONFLICT (tenant, node) DO UPDATE SET job_id = $3, state = $4, blocks_buffer = $5, blocks_os = $6, error = $7, at = now()`,
		r.Tenant, r.Node, r.JobID, r.State, r.BlocksBuffer, r.BlocksOS, r.Error)
	return err
}

// Results returns a tenant's last prewarm per node.
func (s *Service) Results(ctx context.Context, tenantID string) ([]TenantResult, error) {
	rows, err := s.Store.Pool().Query(ctx, `SELECT tenant, node, coalesce(job_id, 0), state, blocks_buffer, blocks_os, error, at
		FROM prewarm_tenants WHERE tenant = $1 ORDER BY node`, tenantID)
	if err != nil {
		return nil, err
	}
	return pgx.CollectRows(rows, func(r pgx.CollectableRow) (TenantResult, error) {
		var x TenantResult
		return x, r.Scan(&x.Tenant, &x.Node, &x.JobID, &x.State, &x.BlocksBuffer, &x.BlocksOS, &x.Error, &x.At)
	})
}

// warmer loads ranges on one node, within the buffer budget and the rate limit.
type warmer struct {
	s         *Service
	cl        *cluster.Cluster
	node      string
	budget    int64 // blocks that may still go into shared_buffers
	inBuffers int64
	inOS      int64
	limiter   *limiter
	conns     map[string]*pgx.Conn // by database
}

func (w *warmer) close() {
	for _, c := range w.conns {
		c.Close(context.Background())
	}
}

var forkNames = map[int16]string{0: "main", 1: "fsm", 2: "vm", 3: "init"}

// tenant prewarms one tenant; errors are recorded, not returned.
func (w *warmer) tenant(ctx context.Context, p planned) TenantResult {
	res := TenantResult{Tenant: p.t.ID, Node: w.node, State: "done"}
	switch p.t.State {
	case catalog.StateActive, catalog.StateSuspended:
	default:
		res.State, res.Error = "skipped", "tenant is "+p.t.State
		return res
	}
	conn, prewarmFn, err := w.conn(ctx, p.t.Database)
	if err != nil {
		res.State, res.Error = "failed", err.Error()
		w.s.Logger.Warn("prewarm: tenant skipped", "component", "prewarm", "tenant", p.t.ID, "err", err)
		return res
	}
	for _, rg := range p.hot.Ranges {
		if ctx.Err() != nil {
			res.State, res.Error = "failed", ctx.Err().Error()
			return res
		}
		var rel *uint32
		if err := conn.QueryRow(ctx, `SELECT pg_filenode_relation(0, $1)::oid`, rg.Filenode).Scan(&rel); err != nil || rel == nil {
			continue // dropped or rewritten since the capture
		}
		fork := forkNames[rg.Fork]
		first, last := rg.First, rg.Last
		// The hottest blocks fill the free buffers; the rest goes to the OS cache.
		if n := min(w.budget, last-first+1); n > 0 {
			if err := w.load(ctx, conn, prewarmFn, *rel, "buffer", fork, first, first+n-1); err != nil {
				res.State, res.Error = "failed", err.Error()
				return res
			}
			w.budget -= n
			res.BlocksBuffer += n
			w.inBuffers += n
			first += n
		}
		if first <= last && w.s.Config.Prewarm.Beyond != "none" {
			if err := w.load(ctx, conn, prewarmFn, *rel, w.s.Config.Prewarm.Beyond, fork, first, last); err != nil {
				res.State, res.Error = "failed", err.Error()
				return res
			}
			res.BlocksOS += last - first + 1
			w.inOS += last - first + 1
		}
	}
	return res
}

func (w *warmer) load(ctx context.Context, conn *pgx.Conn, fn string, rel uint32, mode, fork string, first, last int64) error {
	if err := w.limiter.wait(ctx, (last-first+1)*8192); err != nil {
		return err
	}
	_, err := conn.Exec(ctx, `SELECT `+fn+`($1::oid::regclass, $2, $3, $4, $5)`, rel, mode, fork, first, last)
	return cluster.Classify(err)
}

// conn returns a connection to a database on the node and the qualified name
// of pg_prewarm there, installing the extension on the primary when missing
// (a standby gets it by replication).
func (w *warmer) conn(ctx context.Context, database string) (*pgx.Conn, string, error) {
	c, ok := w.conns[database]
	if !ok {
		if err := w.ensureExtension(ctx, database); err != nil {
			return nil, "", err
		}
		var err error
		if c, err = w.cl.ConnectNode(ctx, w.node, database); err != nil {
			return nil, "", err
		}
		w.conns[database] = c
	}
	var schema string
	err := c.QueryRow(ctx, `SELECT n.nspname FROM pg_extension e JOIN pg_namespace n ON n.oid = e.extnamespace WHERE e.extname = 'pg_prewarm'`).Scan(&schema)
	if err != nil {
		return nil, "", fmt.Errorf("pg_prewarm in %s on %s: %w", database, w.node, cluster.Classify(err))
	}
	return c, cluster.Ident(schema) + ".pg_prewarm", nil
}

// ensureExtension creates pg_prewarm in a database on the primary, in
// pg_catalog so that it adds nothing to the tenant's own schemas.
func (w *warmer) ensureExtension(ctx context.Context, database string) error {
	c, err := w.cl.Connect(ctx, database)
	if err != nil {
		return err
	}
	defer c.Close(context.WithoutCancel(ctx))
	if _, err := c.Exec(ctx, `CREATE EXTENSION IF NOT EXISTS pg_prewarm SCHEMA pg_catalog`); err != nil {
		return fmt.Errorf("create extension pg_prewarm in %s: %w (install the PostgreSQL contrib package)", database, cluster.Classify(err))
	}
	return nil
}

// limiter paces reads to a rate in bytes per second.
type limiter struct {
	rate  int64
	start time.Time
	sent  int64
}

func newLimiter(rate int64) *limiter { return &limiter{rate: rate, start: time.Now()} }

func (l *limiter) wait(ctx context.Context, n int64) error {
	l.sent += n
	due := l.start.Add(time.Duration(float64(l.sent) / float64(l.rate) * float64(time.Second)))
	if d := time.Until(due); d > 0 {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(d):
		}
	}
	return nil
}

// Enqueue starts a prewarm job (idempotent per cluster, node and tenant).
func (s *Service) Enqueue(ctx context.Context, a Args) (jobs.Job, error) {
	if _, err := s.Clusters.Get(a.Cluster); err != nil {
		return jobs.Job{}, err
	}
	for _, id := range a.Tenants {
		if !tenant.ValidID(id) {
			return jobs.Job{}, fmt.Errorf("tenant %q: %w", id, catalog.ErrNotFound)
		}
	}
	return s.Runner.Enqueue(ctx, s.Store.Pool(), Spec(a))
}

// PrewarmTenant prewarms one tenant on its cluster's primary (and standbys
// when prewarm.standbys), e.g. after it was resumed.
func (s *Service) PrewarmTenant(ctx context.Context, t catalog.Tenant) error {
	_, err := s.PrewarmNodes(ctx, t.Cluster, []string{t.ID}, "resume")
	return err
}

// PrewarmNodes starts a prewarm of a cluster's nodes (the primary, and the
// standbys when prewarm.standbys), for some tenants or all with a hot set.
func (s *Service) PrewarmNodes(ctx context.Context, clusterName string, tenants []string, reason string) ([]jobs.Job, error) {
	cl, err := s.Clusters.Get(clusterName)
	if err != nil {
		return nil, err
	}
	nodes := []string{"primary"}
	if s.Config.Prewarm.Standbys {
		nodes = cl.Nodes()
	}
	var out []jobs.Job
	for _, n := range nodes {
		j, err := s.Enqueue(ctx, Args{Cluster: clusterName, Node: n, Tenants: tenants, Reason: reason})
		if err != nil {
			return out, err
		}
		out = append(out, j)
	}
	return out, nil
}
