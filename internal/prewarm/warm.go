package prewarm

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"golang.org/x/sync/errgroup"

	"github.com/pgtenant/pgtenant/internal/catalog"
	"github.com/pgtenant/pgtenant/internal/cluster"
	"github.com/pgtenant/pgtenant/internal/jobs"
)

// prewarm loads the node's tenants' hot sets in priority order:
// prewarm.parallel workers take the next tenant from the ordered plan, so
// that the first tenants are loaded together and first. The buffer budget
// is handed out in plan order too, so a colder tenant never takes buffers a
// hotter one was planned to get.
func (s *Service) prewarm(ctx context.Context, r *jobs.Run, a Args) error {
	cl, err := s.Clusters.Get(a.Cluster)
	if err != nil {
		return jobs.Permanent(err)
	}
	if !slices.Contains(cl.Nodes(), a.Node) {
		// A standby that left the cluster since the job was queued: a
		// failover, whose old leader is not back as a standby yet. The
		// watcher prewarms it when it sees it start.
		r.Result(fmt.Sprintf("%s/%s is not in the cluster now (a failover?): nothing prewarmed there", a.Cluster, a.Node))
		return nil
	}
	plan, err := s.plan(ctx, a)
	if err != nil {
		return err
	}
	var total int64
	for _, p := range plan {
		total += p.hot.Blocks
	}
	free, err := s.freeBuffers(ctx, cl, a.Node, false)
	if err != nil {
		return err
	}
	w := &warmer{s: s, cl: cl, node: a.Node, r: r, plan: plan, total: total,
		budget:  int64(float64(free) * s.Prewarm.BufferFraction),
		limiter: newLimiter(int64(s.Prewarm.RateLimit))}
	w.recheck = max(w.budget/10, 1)
	r.Progress(ctx, 0, total, fmt.Sprintf("prewarming %d tenants on %s/%s (%s): %d free buffers", len(plan), a.Cluster, a.Node, a.Reason, free))
	g, gctx := errgroup.WithContext(ctx)
	for range max(s.Prewarm.Parallel, 1) {
		g.Go(func() error { return w.work(gctx) })
	}
	if err := g.Wait(); err != nil {
		return err
	}
	// The others are prewarmed: the job succeeds (a tenant that holds its
	// own tables locked, or a database that takes no connections, is not
	// the node's fault, nor worth loading every tenant again for), and
	// its result names the tenants it could not prewarm and why.
	if len(w.failed) > 0 {
		r.Result(fmt.Sprintf("%d of %d tenant(s) not prewarmed on %s/%s (%s); the others were: see `pgtenant tenant show ID`, then `pgtenant prewarm ID`",
			len(w.failed), len(plan), a.Cluster, a.Node, failedList(w.failed)))
	}
	return nil
}

// failedList names tenants that failed and why (jobs.Listed).
func failedList(failed []TenantResult) string {
	items := make([]string, len(failed))
	for i, r := range failed {
		items[i] = fmt.Sprintf("tenant %s: %s", r.Tenant, r.Error)
	}
	return jobs.Listed(items, "; ")
}

// warmer loads one node's plan, within the buffer budget and the rate limit.
type warmer struct {
	s       *Service
	cl      *cluster.Cluster
	node    string
	r       *jobs.Run
	limiter *limiter
	extMu   sync.Mutex // one worker at a time creates pg_prewarm (another daemon's at the same moment is tolerated)

	mu        sync.Mutex // guards what follows
	plan      []planned  // tenants not yet taken, hottest first
	budget    int64      // blocks that may still go into shared_buffers
	recheck   int64      // blocks loaded between budget measurements
	checked   int64      // inBuffers at the last measurement
	inBuffers int64
	inOS      int64
	total     int64 // blocks of every hot set
	done      int64
	finished  int
	failed    []TenantResult // tenants that could not be prewarmed, in the order they ended
}

// work is one worker: it prewarms tenants until the plan is empty. Its
// connections (one per database) are its own.
func (w *warmer) work(ctx context.Context) error {
	conns := map[string]*warmConn{}
	defer func() {
		for _, c := range conns {
			c.conn.Close(context.WithoutCancel(ctx))
		}
	}()
	for {
		p, inBuffer, beyond, ok, err := w.next(ctx)
		if !ok || err != nil {
			return err
		}
		res := w.tenant(ctx, conns, p, inBuffer, beyond)
		res.JobID = w.r.Job.ID
		if err := w.s.record(ctx, res); err != nil {
			return err
		}
		w.mu.Lock()
		if res.State == Failed {
			w.failed = append(w.failed, res)
		}
		w.done += p.hot.Blocks
		w.finished++
		w.r.Progress(ctx, w.done, w.total, fmt.Sprintf("%d tenants done; %d blocks into shared_buffers, %d into the OS cache",
			w.finished, w.inBuffers, w.inOS))
		w.mu.Unlock()
	}
}

// load is a run of blocks of one relation fork to read with pg_prewarm
// (rel is a filenode until the relation is looked up).
type load struct {
	rel         uint32
	fork        string
	first, last int64
}

var forkNames = map[int16]string{0: "main", 1: "fsm", 2: "vm", 3: "init"}

// next takes the next tenant of the plan and splits its hot set: the
// hottest blocks into the free buffers while the budget lasts, the rest to
// the OS cache (prewarm.beyond).
func (w *warmer) next(ctx context.Context) (p planned, inBuffer, beyond []load, ok bool, err error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if len(w.plan) == 0 || ctx.Err() != nil {
		return p, nil, nil, false, ctx.Err()
	}
	// The node's own work takes buffers too (after a restart, the clients
	// coming back). Once a tenth of the budget is handed out, the budget is
	// measured again: only never-used buffers count then, since the blocks
	// just loaded are the ones whose usage count decays first, and
	// overrunning the free buffers would make the clock sweep evict them
	// for colder tenants' blocks.
	if w.inBuffers-w.checked >= w.recheck && w.budget > 0 {
		free, err := w.s.freeBuffers(ctx, w.cl, w.node, true)
		if err != nil {
			return p, nil, nil, false, err
		}
		w.budget = min(w.budget, int64(float64(free)*w.s.Prewarm.BufferFraction))
		w.checked = w.inBuffers
	}
	p, w.plan = w.plan[0], w.plan[1:]
	for _, rg := range p.hot.Ranges {
		fork := forkNames[rg.Fork]
		first, last := rg.First, rg.Last
		if n := min(w.budget, last-first+1); n > 0 {
			inBuffer = append(inBuffer, load{rg.Filenode, fork, first, first + n - 1})
			w.budget -= n
			w.inBuffers += n
			first += n
		}
		if first <= last && w.s.Prewarm.Beyond != "none" {
			beyond = append(beyond, load{rg.Filenode, fork, first, last})
			w.inOS += last - first + 1
		}
	}
	return p, inBuffer, beyond, true, nil
}

// tenant prewarms one tenant; errors are recorded, not returned. A tenant
// costs a few round trips whatever the number of its ranges: one to find
// the relations, then one per loadChunk blocks.
func (w *warmer) tenant(ctx context.Context, conns map[string]*warmConn, p planned, inBuffer, beyond []load) TenantResult {
	res := TenantResult{Tenant: p.t.ID, Node: w.node, State: Done}
	switch p.t.State {
	case catalog.StateActive, catalog.StateSuspended:
	default:
		res.State, res.Error = Skipped, "tenant is "+string(p.t.State)
		return res
	}
	fail := func(err error) TenantResult {
		res.State, res.Error = Failed, err.Error()
		w.s.Logger.Warn("prewarm: tenant skipped", "component", "prewarm", "tenant", p.t.ID, "err", err)
		return res
	}
	wc, err := w.conn(ctx, conns, p.t.Database)
	if err != nil {
		return fail(err)
	}
	rels, err := relations(ctx, wc.conn, p.hot.Ranges)
	if err != nil {
		return fail(err)
	}
	for _, l := range []struct {
		mode  string
		loads []load
		n     *int64
	}{{"buffer", inBuffer, &res.BlocksBuffer}, {w.s.Prewarm.Beyond, beyond, &res.BlocksOS}} {
		var found []load
		for _, ld := range l.loads {
			if rel, ok := rels[ld.rel]; ok { // else dropped or rewritten since the capture
				ld.rel = rel
				found = append(found, ld)
				*l.n += ld.last - ld.first + 1
			}
		}
		if err := w.loadAll(ctx, wc, l.mode, found); err != nil {
			return fail(err)
		}
	}
	return res
}

// relations maps the ranges' filenodes to the relations that have them now.
func relations(ctx context.Context, conn *pgx.Conn, ranges []Range) (map[uint32]uint32, error) {
	var nodes []uint32
	for _, rg := range ranges {
		nodes = append(nodes, rg.Filenode)
	}
	rows, err := conn.Query(ctx, `SELECT f, pg_catalog.pg_filenode_relation(0, f)::oid FROM pg_catalog.unnest($1::oid[]) AS f
		WHERE pg_catalog.pg_filenode_relation(0, f) IS NOT NULL`, nodes)
	if err != nil {
		return nil, cluster.Classify(err)
	}
	out := map[uint32]uint32{}
	var f, rel uint32
	_, err = pgx.ForEachRow(rows, []any{&f, &rel}, func() error {
		out[f] = rel
		return nil
	})
	return out, cluster.Classify(err)
}

// loadChunk bounds the blocks of one pg_prewarm statement (8 MB), so that
// the rate limit paces a big tenant too.
const loadChunk = 1024

// loadAll reads loads in mode, loadChunk blocks per statement, within the
// rate limit.
func (w *warmer) loadAll(ctx context.Context, wc *warmConn, mode string, loads []load) error {
	for len(loads) > 0 {
		var rels []uint32
		var forks []string
		var firsts, lasts []int64
		var blocks int64
		for len(loads) > 0 && blocks < loadChunk {
			l := &loads[0]
			last := min(l.last, l.first+loadChunk-blocks-1)
			rels, forks, firsts, lasts = append(rels, l.rel), append(forks, l.fork), append(firsts, l.first), append(lasts, last)
			blocks += last - l.first + 1
			if l.first = last + 1; l.first > l.last {
				loads = loads[1:]
			}
		}
		if err := w.limiter.wait(ctx, blocks*8192); err != nil {
			return err
		}
		_, err := wc.conn.Exec(ctx, `SELECT `+wc.fn+`(r.rel::regclass, $1, r.fork, r.first, r.last)
			FROM ROWS FROM (pg_catalog.unnest($2::oid[]), pg_catalog.unnest($3::text[]), pg_catalog.unnest($4::int8[]),
			                pg_catalog.unnest($5::int8[])) AS r(rel, fork, first, last)`, mode, rels, forks, firsts, lasts)
		if err != nil {
			return cluster.Classify(err)
		}
	}
	return nil
}

// warmConn is a connection to one database of the node, with the qualified
// name of pg_prewarm there.
type warmConn struct {
	conn *pgx.Conn
	fn   string
}

// conn returns a worker's connection to a database on the node. A database
// without pg_prewarm gets it on the primary; on a standby, which cannot
// create it and gets it by replication only, the worker then waits until
// the standby has replayed it (at most extensionReplayWait).
func (w *warmer) conn(ctx context.Context, conns map[string]*warmConn, database string) (*warmConn, error) {
	if wc, ok := conns[database]; ok {
		return wc, nil
	}
	c, err := w.cl.ConnectNode(ctx, w.node, database)
	if err != nil {
		return nil, err
	}
	schema, err := cluster.ExtensionSchema(ctx, c, "pg_prewarm")
	if errors.Is(err, cluster.ErrNotFound) {
		schema, err = w.ensureExtension(ctx, c, database)
	}
	if err != nil {
		c.Close(context.WithoutCancel(ctx))
		return nil, fmt.Errorf("pg_prewarm in %s on %s: %w", database, w.node, cluster.Classify(err))
	}
	wc := &warmConn{conn: c, fn: schema + ".pg_prewarm"}
	conns[database] = wc
	return wc, nil
}

// extensionReplayWait bounds how long a standby's prewarm waits for the
// standby to replay pg_prewarm created on the primary: replay is usually a
// matter of milliseconds; a standby far behind fails the tenant instead.
const extensionReplayWait = 30 * time.Second

// ensureExtension makes pg_prewarm exist in a database of the node, whose
// connection is c, and returns its schema: created on the primary, as the
// admin (whose sessions pin search_path, so that nothing of the tenant's
// is looked up), in pg_catalog so that it adds nothing to the tenant's own
// schemas; waited for on a standby.
func (w *warmer) ensureExtension(ctx context.Context, c *pgx.Conn, database string) (string, error) {
	w.extMu.Lock()
	lsn, err := w.createExtension(ctx, database)
	w.extMu.Unlock()
	if err != nil {
		return "", err
	}
	// On the primary itself (whatever its node's name) there is nothing to
	// replay: waitReplay returns at once.
	if err := w.waitReplay(ctx, c, lsn); err != nil {
		return "", err
	}
	return cluster.ExtensionSchema(ctx, c, "pg_prewarm")
}

// createExtension creates pg_prewarm, if missing, in a database on the
// primary and returns the primary's WAL position once it is committed.
func (w *warmer) createExtension(ctx context.Context, database string) (string, error) {
	c, err := w.cl.Connect(ctx, database)
	if err != nil {
		return "", err
	}
	defer c.Close(context.WithoutCancel(ctx))
	if _, err = c.Exec(ctx, `CREATE EXTENSION IF NOT EXISTS pg_prewarm SCHEMA pg_catalog`); err != nil {
		if err := cluster.ExtensionError("pg_prewarm", w.cl.Name()+"/"+database, err); err != nil {
			return "", err
		}
	}
	var lsn string
	if err := c.QueryRow(ctx, `SELECT pg_catalog.pg_current_wal_lsn()::text`).Scan(&lsn); err != nil {
		return "", cluster.Classify(err)
	}
	return lsn, nil
}

// waitReplay waits until the standby whose connection is c has replayed
// the primary's WAL up to lsn, at most extensionReplayWait.
func (w *warmer) waitReplay(ctx context.Context, c *pgx.Conn, lsn string) error {
	deadline := time.Now().Add(extensionReplayWait)
	for {
		var replayed bool
		err := c.QueryRow(ctx, `SELECT coalesce(pg_catalog.pg_last_wal_replay_lsn() >= $1::pg_lsn, true)`, lsn).Scan(&replayed)
		if err != nil {
			return cluster.Classify(err)
		}
		if replayed {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("created on the primary (at WAL %s), not replayed on %s after %s: is its replay paused or far behind? (`pgtenant cluster show %s`)",
				lsn, w.node, extensionReplayWait, w.cl.Name())
		}
		select {
		case <-ctx.Done():
			return context.Cause(ctx)
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// limiter paces reads to a rate in bytes per second, over all workers.
type limiter struct {
	mu    sync.Mutex
	rate  int64
	start time.Time
	sent  int64
}

func newLimiter(rate int64) *limiter { return &limiter{rate: rate, start: time.Now()} }

func (l *limiter) wait(ctx context.Context, n int64) error {
	l.mu.Lock()
	l.sent += n
	due := l.start.Add(time.Duration(float64(l.sent) / float64(l.rate) * float64(time.Second)))
	l.mu.Unlock()
	if d := time.Until(due); d > 0 {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(d):
		}
	}
	return nil
}
