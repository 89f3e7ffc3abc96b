package quota

import (
	"context"
	"fmt"
	"log/slog"
	"math"
	"strconv"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/pgtenant/pgtenant/internal/catalog"
	"github.com/pgtenant/pgtenant/internal/cluster"
	"github.com/pgtenant/pgtenant/internal/config"
	"github.com/pgtenant/pgtenant/internal/tenant"
)

// Capper holds tenants to their tier's limits from outside. The tier's
// statement_timeout, idle_in_transaction_session_timeout and work_mem are
// role defaults, which a tenant can SET away in its session or change with
// ALTER ROLE on its own role (a role may change its own defaults, also IN
// DATABASE). So, every metrics.cap_interval, the capper reads
// pg_stat_activity on every node of every cluster (the primary and each
// standby: a tenant's sessions on a standby are read-only but can run long
// queries and hold old snapshots) and
//   - cancels a statement that has run longer than its tier's cap
//     (tenant.StatementCap: statement_cap, else statement_timeout), and
//     terminates its session if it still runs terminateAfter later (a cancel
//     can be ignored while a backend waits in some system calls);
//   - terminates a session idle in a transaction for longer than its tier's
//     idle_in_transaction_session_timeout, as PostgreSQL itself does in a
//     session that kept the default.
//
// Each action is an event in the tenant's history and counted in
// pgtenant_statements_capped_total.
//
// work_mem SET in a session cannot be seen from outside: it is a soft limit,
// and a tenant can give its own sorts and hashes more memory. What bounds
// such a tenant anyway is hard: its connection limit (changing it needs
// CREATEROLE) bounds how many sessions it runs, the statement cap how long
// each query holds its memory, and temp_file_limit (superuser-only, so
// neither SET nor ALTER ROLE by the tenant can change it) what spills to disk.
type Capper struct {
	Store    *catalog.Store
	Clusters *cluster.Registry
	Config   config.Config
	Logger   *slog.Logger

	actions  *prometheus.CounterVec
	mu       sync.Mutex
	canceled map[capKey]time.Time // statements cancelled and sessions terminated, by when
}

// capKey is one statement of a backend on a node (start: its query_start),
// or one idle spell in a transaction (idle, start: its state_change).
type capKey struct {
	cluster, node string
	pid           int32
	start         time.Time
	idle          bool
}

// terminateAfter is how long a cancelled statement may still run before its
// session is terminated (and how long a terminated session may take to go
// before it is terminated again).
const terminateAfter = 5 * time.Second

// timeoutMargin: where the capper enforces a tier's statement_timeout or
// idle_in_transaction_session_timeout (no statement_cap), it acts this long
// after the limit, so that in a session that kept the role default
// PostgreSQL's own timer ends the statement or session first, and the
// capper's events are the overrides only.
const timeoutMargin = 500 * time.Millisecond

// nodeTimeout bounds one node check.
const nodeTimeout = 10 * time.Second

// Events the capper adds to a tenant's history.
const (
	EventStatementCancelled = "statement_cancelled"            // a statement over its tier's cap
	EventSessionTerminated  = "session_terminated"             // ... still running terminateAfter later
	EventIdleTerminated     = "idle_in_transaction_terminated" // idle in a transaction past the tier's limit
)

// Register adds the capper's counter (pgtenant_statements_capped_total) to reg.
func (c *Capper) Register(reg prometheus.Registerer) {
	c.actions = prometheus.NewCounterVec(prometheus.CounterOpts{Name: "pgtenant_statements_capped_total",
		Help: "Tenant limits enforced from outside, by action: cancel and terminate (a statement over its tier's statement_cap, " +
			"else statement_timeout), idle_terminate (idle in a transaction past the tier's limit)."},
		[]string{"cluster", "action"})
	reg.MustRegister(c.actions)
}

func (c *Capper) count(cl, action string) {
	if c.actions != nil {
		c.actions.WithLabelValues(cl, action).Inc()
	}
}

func (c *Capper) log() *slog.Logger {
	if c.Logger == nil {
		return slog.New(slog.DiscardHandler)
	}
	return c.Logger.With("component", "capper")
}

// limits are what the capper holds one tier to.
type limits struct {
	stmt     time.Duration // a statement's cap (0: none)
	stmtFrom string        // the tier setting it comes from: statement_cap or statement_timeout
	stmtAt   time.Duration // acted on from: stmt, plus timeoutMargin for a statement_timeout
	idle     time.Duration // idle_in_transaction_session_timeout (0: none)
	idleAt   time.Duration // acted on from: idle plus timeoutMargin
}

func tierLimits(t config.Tier) limits {
	l := limits{stmt: tenant.StatementCap(t), stmtFrom: "statement_cap"}
	l.stmtAt = l.stmt
	if t.StatementCap <= 0 && l.stmt > 0 {
		l.stmtFrom, l.stmtAt = "statement_timeout", l.stmt+timeoutMargin
	}
	if d := t.IdleInTransactionSessionTimeout.D(); d > 0 {
		l.idle, l.idleAt = d, d+timeoutMargin
	}
	return l
}

// thresholds are the smallest stmtAt and idleAt of any tier (0: no tier
// has that limit): the node query's filters.
func (c *Capper) thresholds() (stmt, idle time.Duration) {
	for _, t := range c.Config.Tiers {
		l := tierLimits(t)
		if l.stmt > 0 && (stmt == 0 || l.stmtAt < stmt) {
			stmt = l.stmtAt
		}
		if l.idle > 0 && (idle == 0 || l.idleAt < idle) {
			idle = l.idleAt
		}
	}
	return stmt, idle
}

// enforces reports whether any tier gives the capper something to hold
// tenants to: a statement cap or timeout, or an idle limit.
func (c *Capper) enforces() bool {
	stmt, idle := c.thresholds()
	return stmt > 0 || idle > 0
}

// Run checks every node of every cluster each cap interval until ctx is done.
// With no tier limit to enforce it only waits.
func (c *Capper) Run(ctx context.Context) error {
	if !c.enforces() {
		<-ctx.Done()
		return nil
	}
	var w inFlight
	defer w.wg.Wait() // after the ticker stops: the checks in flight end with ctx
	t := time.NewTicker(c.Config.Metrics.CapInterval.D())
	defer t.Stop()
	for {
		for _, cl := range c.Clusters.All() {
			for _, node := range cl.Nodes() {
				c.spawn(ctx, &w, cl.Name(), node, nodeTimeout, func(ctx context.Context) error {
					_, err := c.CheckNode(ctx, cl, node)
					return err
				})
			}
		}
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		}
	}
}

// inFlight tracks the checks running: each node of a cluster is checked by
// one goroutine at a time, so a node
// that does not answer (a standby that is down) holds up only its own
// checks, which are skipped until the one in flight gives up. A check that
// fails is logged once, when it starts failing.
type inFlight struct {
	wg      sync.WaitGroup
	mu      sync.Mutex
	busy    map[[2]string]bool
	failing map[[2]string]bool
}

func (c *Capper) spawn(ctx context.Context, w *inFlight, cl, what string, timeout time.Duration, check func(context.Context) error) {
	key := [2]string{cl, what}
	w.mu.Lock()
	if w.busy == nil {
		w.busy, w.failing = map[[2]string]bool{}, map[[2]string]bool{}
	}
	if w.busy[key] {
		w.mu.Unlock()
		return
	}
	w.busy[key] = true
	w.mu.Unlock()
	w.wg.Go(func() {
		cctx, cancel := context.WithTimeout(ctx, timeout)
		err := check(cctx)
		cancel()
		w.mu.Lock()
		defer w.mu.Unlock()
		delete(w.busy, key)
		switch {
		case err != nil && ctx.Err() == nil && !w.failing[key]:
			w.failing[key] = true
			c.log().Warn("capper check failed; retried quietly until it works", "cluster", cl, "node", what, "err", err)
		case err == nil && w.failing[key]:
			delete(w.failing, key)
			c.log().Info("capper check works again", "cluster", cl, "node", what)
		}
	})
}

// secs is a threshold as the node query's parameter: NULL for none, which
// matches no session.
func secs(d time.Duration) *float64 {
	if d <= 0 {
		return nil
	}
	s := d.Seconds()
	return &s
}

// The node query: tenant sessions running a statement for longer than $1
// seconds, or idle in a transaction for longer than $2 (usually none),
// bounded by max_connections.
const overSQL = `
	SELECT pid, usename, idle, since, extract(epoch FROM pg_catalog.clock_timestamp() - since)::float8
	FROM (SELECT pid, usename, state NOT IN ('active', 'fastpath function call') AS idle,
	             CASE WHEN state IN ('active', 'fastpath function call') THEN query_start ELSE state_change END AS since
	      FROM pg_catalog.pg_stat_activity
	      WHERE backend_type = 'client backend' AND usename LIKE 't\_%'
	        AND state IN ('active', 'fastpath function call', 'idle in transaction', 'idle in transaction (aborted)')) a
	WHERE since < pg_catalog.clock_timestamp() - pg_catalog.make_interval(secs => CASE WHEN idle THEN $2::float8 ELSE $1::float8 END)`

// Statements that stop a backend only if it is still in the statement or
// the idle spell that was found ($2: its query_start or state_change).
const (
	cancelSQL = `SELECT coalesce((SELECT pg_catalog.pg_cancel_backend(pid) FROM pg_catalog.pg_stat_activity
		WHERE pid = $1 AND query_start = $2 AND state IN ('active', 'fastpath function call')), false)`
	terminateSQL = `SELECT coalesce((SELECT pg_catalog.pg_terminate_backend(pid) FROM pg_catalog.pg_stat_activity
		WHERE pid = $1 AND query_start = $2 AND state IN ('active', 'fastpath function call')), false)`
	terminateIdleSQL = `SELECT coalesce((SELECT pg_catalog.pg_terminate_backend(pid) FROM pg_catalog.pg_stat_activity
		WHERE pid = $1 AND state_change = $2 AND state IN ('idle in transaction', 'idle in transaction (aborted)')), false)`
)

// CheckNode stops, on one node of a cluster ("primary", "standby1", …: see
// cluster.Nodes), the tenant statements over their tier's cap and the
// sessions idle in a transaction past their tier's limit, and returns how
// many it stopped. One query finds the sessions past the smallest limits;
// tiers are looked up only for those.
func (c *Capper) CheckNode(ctx context.Context, cl *cluster.Cluster, node string) (int, error) {
	stmtMin, idleMin := c.thresholds()
	if stmtMin == 0 && idleMin == 0 {
		return 0, nil
	}
	pool, err := cl.NodeAdmin(ctx, node)
	if err != nil {
		return 0, err
	}
	rows, err := pool.Query(ctx, overSQL, secs(stmtMin), secs(idleMin))
	if err != nil {
		return 0, fmt.Errorf("read pg_stat_activity of %s/%s: %w", cl.Name(), node, cluster.Classify(err))
	}
	type over struct {
		pid   int32
		id    string
		idle  bool
		since time.Time // query_start, or state_change when idle
		age   float64   // seconds
	}
	var found []over
	var ids []string
	for rows.Next() {
		var o over
		var role string
		if err := rows.Scan(&o.pid, &role, &o.idle, &o.since, &o.age); err != nil {
			rows.Close()
			return 0, err
		}
		id, ok := tenant.IDFromPhysical(role)
		if !ok {
			continue
		}
		o.id = id
		found = append(found, o)
		ids = append(ids, id)
	}
	if err := rows.Err(); err != nil {
		return 0, fmt.Errorf("read pg_stat_activity of %s/%s: %w", cl.Name(), node, cluster.Classify(err))
	}
	c.forget(time.Now())
	if len(found) == 0 {
		return 0, nil
	}
	tiers, err := c.Store.TenantTiers(ctx, ids)
	if err != nil {
		return 0, err
	}
	stopped := 0
	for _, o := range found {
		lim := tierLimits(c.Config.Tiers[tiers[o.id]])
		key := capKey{cl.Name(), node, o.pid, o.since, o.idle}
		at, seen := c.actedAt(key)
		var action, sql, kind string
		detail := map[string]any{"pid": o.pid, "node": node, "tier": tiers[o.id]}
		switch {
		case o.idle:
			if lim.idle <= 0 || o.age < lim.idleAt.Seconds() || (seen && time.Since(at) < terminateAfter) {
				continue
			}
			action, sql, kind = "idle_terminate", terminateIdleSQL, EventIdleTerminated
			detail["idle_seconds"] = math.Round(o.age*10) / 10
			detail["idle_in_transaction_session_timeout"] = lim.idle.String()
			detail["state_change"] = o.since.UTC().Format(time.RFC3339Nano)
		default:
			if lim.stmt <= 0 || o.age < lim.stmtAt.Seconds() {
				continue
			}
			action, sql, kind = "cancel", cancelSQL, EventStatementCancelled
			if seen {
				if time.Since(at) < terminateAfter {
					continue // cancelled a moment ago: give it time to stop
				}
				action, sql, kind = "terminate", terminateSQL, EventSessionTerminated
			}
			detail["ran_seconds"] = math.Round(o.age*10) / 10
			detail["statement_cap"] = lim.stmt.String()
			detail["limit"] = lim.stmtFrom
			detail["query_start"] = o.since.UTC().Format(time.RFC3339Nano)
		}
		var done bool
		if err := pool.QueryRow(ctx, sql, o.pid, o.since).Scan(&done); err != nil {
			return stopped, fmt.Errorf("%s backend %d on %s/%s: %w", action, o.pid, cl.Name(), node, cluster.Classify(err))
		}
		if !done {
			continue // it finished meanwhile
		}
		stopped++
		c.acted(key)
		c.count(cl.Name(), action)
		if err := c.Store.AddEvent(ctx, c.Store.Pool(), o.id, kind, detail); err != nil {
			c.log().Warn("record capper event", "tenant", o.id, "event", kind, "err", err)
		}
		c.log().Info("tenant held to its tier", "tenant", o.id, "cluster", cl.Name(), "node", node, "action", action,
			"pid", strconv.Itoa(int(o.pid)), "seconds", math.Round(o.age*10)/10)
	}
	return stopped, nil
}

func (c *Capper) actedAt(k capKey) (time.Time, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	at, ok := c.canceled[k]
	return at, ok
}

func (c *Capper) acted(k capKey) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.canceled == nil {
		c.canceled = map[capKey]time.Time{}
	}
	c.canceled[k] = time.Now()
}

// forget drops statements cancelled long ago (they ended, or were terminated).
func (c *Capper) forget(now time.Time) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for k, at := range c.canceled {
		if now.Sub(at) > time.Minute {
			delete(c.canceled, k)
		}
	}
}
