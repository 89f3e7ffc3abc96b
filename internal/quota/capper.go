package quota

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/pgtenant/pgtenant/internal/background"
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
//     can be ignored while a backend waits in some system calls). A
//     statement's time counts from pg_stat_activity.query_start, so a
//     string of several statements sent as one query is capped as a whole
//     (PostgreSQL's statement_timeout times each of them);
//   - terminates a session idle in a transaction for longer than its tier's
//     idle_in_transaction_session_timeout, as PostgreSQL itself does in a
//     session that kept the default;
//   - terminates a session whose transaction has been open longer than its
//     tier's max_transaction_age, whatever it does meanwhile (PostgreSQL 15
//     has no such timeout): a tenant that keeps a transaction open with
//     short statements and short pauses holds back vacuum's horizon for
//     every tenant of the cluster (on a standby, with
//     hot_standby_feedback, the primary's), and, holding an xid, the making
//     of every logical slot there (cluster.CreateSlot bounds that wait too).
//
// Every settingsEvery intervals it also puts back, on each primary, the
// tier's role defaults that tenants changed (RestoreSettings), so that new
// sessions start with them again. Each action is an event in the tenant's
// history and counted in pgtenant_statements_capped_total.
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
	Metrics  config.MetricsConfig   // its interval: metrics.cap_interval
	Tiers    map[string]config.Tier // the caps
	Logger   *slog.Logger

	actions  *prometheus.CounterVec
	mu       sync.Mutex
	canceled map[capKey]time.Time // statements cancelled and sessions terminated, by when
}

// capKey is one statement of a backend on a node (start: its query_start),
// one idle spell in a transaction (idle, start: its state_change), or one
// transaction (xact, start: its xact_start).
type capKey struct {
	cluster, node string
	pid           int32
	start         time.Time
	idle, xact    bool
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

// settingsEvery is how many cap intervals pass between two settings passes
// (30 s at the default cap_interval of 1 s). Role defaults only apply to
// sessions that start later, and every session is held by the node checks
// from its first statement whatever it SETs, so the pass need not be fast;
// it reads one row per tenant role and writes only what a tenant changed.
const settingsEvery = 30

// settingsLockSpace is the advisory lock space ("pgt\x07") of the settings
// passes: a cluster's pass runs in one daemon of the catalog at a time.
const settingsLockSpace = 0x70677407

// settingsPass restores a cluster's role settings (RestoreSettings) unless
// another daemon's pass over it holds its lock in the catalog: then ran is
// false. The daemons of a catalog would otherwise each read every
// cluster's tenants and roles every 30 s.
func (c *Capper) settingsPass(ctx context.Context, cl *cluster.Cluster) (ran bool, err error) {
	return c.Store.Exclusively(ctx, catalog.LockKey(settingsLockSpace, cl.Name()), func(ctx context.Context) error {
		_, err := c.RestoreSettings(ctx, cl)
		return err
	})
}

// settingsParallel is how many clusters' settings passes run at once: each
// reads its cluster's tenants from the catalog, and a fleet's all at once
// would take every catalog connection the API needs.
const settingsParallel = 4

// nodeTimeout bounds one node check, settingsTimeout one settings pass.
const (
	nodeTimeout     = 10 * time.Second
	settingsTimeout = time.Minute
)

// restoreLockTimeout bounds the settings pass's wait on a tenant's role
// settings row: a tenant transaction that changed its own role holds the
// row until it ends; the pass tries again next time.
const restoreLockTimeout = 2 * time.Second

// Events the capper adds to a tenant's history.
const (
	EventStatementCancelled = "statement_cancelled"            // a statement over its tier's cap
	EventSessionTerminated  = "session_terminated"             // ... still running terminateAfter later
	EventIdleTerminated     = "idle_in_transaction_terminated" // idle in a transaction past the tier's limit
	EventXactTerminated     = "transaction_age_terminated"     // a transaction open past the tier's max_transaction_age
	EventSettingRestored    = "tier_setting_restored"          // a role default the tenant changed, put back
)

// Register adds the capper's counter (pgtenant_statements_capped_total) to reg.
func (c *Capper) Register(reg prometheus.Registerer) {
	c.actions = prometheus.NewCounterVec(prometheus.CounterOpts{Name: "pgtenant_statements_capped_total",
		Help: "Tenant limits enforced from outside, by action: cancel and terminate (a statement over its tier's statement_cap, " +
			"else statement_timeout), idle_terminate (idle in a transaction past the tier's limit), xact_terminate " +
			"(a transaction open past the tier's max_transaction_age), setting_restore (role defaults a tenant changed, put back)."},
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
	xact     time.Duration // max_transaction_age (0: none); no PostgreSQL timer to leave first
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
	l.xact = max(t.MaxTransactionAge.D(), 0)
	return l
}

// thresholds are the smallest stmtAt, idleAt and xact of any tier (0: no
// tier has that limit): the node query's filters.
func (c *Capper) thresholds() (stmt, idle, xact time.Duration) {
	for _, t := range c.Tiers {
		l := tierLimits(t)
		if l.stmt > 0 && (stmt == 0 || l.stmtAt < stmt) {
			stmt = l.stmtAt
		}
		if l.idle > 0 && (idle == 0 || l.idleAt < idle) {
			idle = l.idleAt
		}
		if l.xact > 0 && (xact == 0 || l.xact < xact) {
			xact = l.xact
		}
	}
	return stmt, idle, xact
}

// enforces reports whether any tier gives the capper something to hold
// tenants to: a statement cap or timeout, an idle limit, a transaction
// age, or role defaults.
func (c *Capper) enforces() bool {
	if stmt, idle, xact := c.thresholds(); stmt > 0 || idle > 0 || xact > 0 {
		return true
	}
	for _, t := range c.Tiers {
		if len(tenant.RoleSettings(t)) > 0 {
			return true
		}
	}
	return false
}

// Run checks every node of every cluster each cap interval, and every
// cluster's role settings every settingsEvery intervals, until ctx is done.
// With no tier limit to enforce it only waits.
func (c *Capper) Run(ctx context.Context) error {
	if !c.enforces() {
		<-ctx.Done()
		return nil
	}
	var w inFlight
	defer w.wg.Wait() // after the loop: the checks in flight end with ctx
	settings := make(chan struct{}, settingsParallel)
	tick := 0
	background.Every(ctx, c.Metrics.CapInterval.D(), func(ctx context.Context) {
		defer func() { tick++ }()
		for _, cl := range c.Clusters.All() {
			for _, node := range cl.Nodes() {
				c.spawn(ctx, &w, cl.Name(), node, nodeTimeout, func(ctx context.Context) error {
					_, err := c.CheckNode(ctx, cl, node)
					return err
				})
			}
			if tick%settingsEvery == 0 {
				c.spawn(ctx, &w, cl.Name(), "settings", settingsTimeout, func(ctx context.Context) error {
					select {
					case settings <- struct{}{}:
					case <-ctx.Done():
						return ctx.Err()
					}
					defer func() { <-settings }()
					_, err := c.settingsPass(ctx, cl)
					return err
				})
			}
		}
	})
	return nil
}

// inFlight tracks the checks running: each node of a cluster, and each
// cluster's settings pass, is checked by one goroutine at a time, so a node
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
// seconds, idle in a transaction for longer than $2, or in a transaction
// open for longer than $3 (usually none), bounded by max_connections.
const overSQL = `
	SELECT pid, usename, idle, since, extract(epoch FROM clock - since)::float8,
	       xact_start, coalesce(extract(epoch FROM clock - xact_start), 0)::float8
	FROM (SELECT pid, usename, state NOT IN ('active', 'fastpath function call') AS idle,
	             CASE WHEN state IN ('active', 'fastpath function call') THEN query_start ELSE state_change END AS since,
	             xact_start, pg_catalog.clock_timestamp() AS clock
	      FROM pg_catalog.pg_stat_activity
	      WHERE backend_type = 'client backend' AND usename LIKE 't\_%'
	        AND state IN ('active', 'fastpath function call', 'idle in transaction', 'idle in transaction (aborted)')) a
	WHERE since < clock - pg_catalog.make_interval(secs => CASE WHEN idle THEN $2::float8 ELSE $1::float8 END)
	   OR xact_start < clock - pg_catalog.make_interval(secs => $3::float8)`

// Statements that stop a backend only if it is still in the statement, the
// idle spell or the transaction that was found ($2: its query_start,
// state_change or xact_start).
const (
	cancelSQL = `SELECT coalesce((SELECT pg_catalog.pg_cancel_backend(pid) FROM pg_catalog.pg_stat_activity
		WHERE pid = $1 AND query_start = $2 AND state IN ('active', 'fastpath function call')), false)`
	terminateSQL = `SELECT coalesce((SELECT pg_catalog.pg_terminate_backend(pid) FROM pg_catalog.pg_stat_activity
		WHERE pid = $1 AND query_start = $2 AND state IN ('active', 'fastpath function call')), false)`
	terminateIdleSQL = `SELECT coalesce((SELECT pg_catalog.pg_terminate_backend(pid) FROM pg_catalog.pg_stat_activity
		WHERE pid = $1 AND state_change = $2 AND state IN ('idle in transaction', 'idle in transaction (aborted)')), false)`
	terminateXactSQL = `SELECT coalesce((SELECT pg_catalog.pg_terminate_backend(pid) FROM pg_catalog.pg_stat_activity
		WHERE pid = $1 AND xact_start = $2), false)`
)

// CheckNode stops, on one node of a cluster ("primary", "standby1", …: see
// cluster.Nodes), the tenant statements over their tier's cap, the
// sessions idle in a transaction past their tier's limit and those whose
// transaction is older than their tier's max_transaction_age, and returns
// how many it stopped. One query finds the sessions past the smallest
// limits; tiers are looked up only for those.
func (c *Capper) CheckNode(ctx context.Context, cl *cluster.Cluster, node string) (int, error) {
	stmtMin, idleMin, xactMin := c.thresholds()
	if stmtMin == 0 && idleMin == 0 && xactMin == 0 {
		return 0, nil
	}
	pool, err := cl.NodeAdmin(ctx, node)
	if err != nil {
		return 0, err
	}
	rows, err := pool.Query(ctx, overSQL, secs(stmtMin), secs(idleMin), secs(xactMin))
	if err != nil {
		return 0, fmt.Errorf("read pg_stat_activity of %s/%s: %w", cl.Name(), node, cluster.Classify(err))
	}
	type over struct {
		pid   int32
		id    string
		idle  bool
		since time.Time // query_start, or state_change when idle
		age   float64   // seconds
		xact  *time.Time
		xage  float64 // seconds
	}
	var found []over
	var ids []string
	for rows.Next() {
		var o over
		var role string
		if err := rows.Scan(&o.pid, &role, &o.idle, &o.since, &o.age, &o.xact, &o.xage); err != nil {
			rows.Close()
			return 0, err
		}
		id, ok := tenant.IDFromRole(role) // its own login or one of its extra ones
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
		lim := tierLimits(c.Tiers[tiers[o.id]])
		key := capKey{cl.Name(), node, o.pid, o.since, o.idle, false}
		at, seen := c.actedAt(key)
		var action, sql, kind string
		var arg time.Time // what the statement stops: query_start, state_change or xact_start
		detail := map[string]any{"pid": o.pid, "node": node, "tier": tiers[o.id]}
		xactOver := lim.xact > 0 && o.xact != nil && o.xage >= lim.xact.Seconds()
		if xactOver {
			// The transaction, whatever its statement or pause is doing:
			// ending the session is the only way to end it from outside.
			key = capKey{cl.Name(), node, o.pid, *o.xact, false, true}
			at, seen = c.actedAt(key)
		}
		switch {
		case xactOver:
			if seen && time.Since(at) < terminateAfter {
				continue // terminated a moment ago: give it time to go
			}
			action, sql, kind, arg = "xact_terminate", terminateXactSQL, EventXactTerminated, *o.xact
			detail["age_seconds"] = math.Round(o.xage*10) / 10
			detail["max_transaction_age"] = lim.xact.String()
			detail["xact_start"] = o.xact.UTC().Format(time.RFC3339Nano)
		case o.idle:
			if lim.idle <= 0 || o.age < lim.idleAt.Seconds() || (seen && time.Since(at) < terminateAfter) {
				continue
			}
			action, sql, kind, arg = "idle_terminate", terminateIdleSQL, EventIdleTerminated, o.since
			detail["idle_seconds"] = math.Round(o.age*10) / 10
			detail["idle_in_transaction_session_timeout"] = lim.idle.String()
			detail["state_change"] = o.since.UTC().Format(time.RFC3339Nano)
		default:
			if lim.stmt <= 0 || o.age < lim.stmtAt.Seconds() {
				continue
			}
			action, sql, kind, arg = "cancel", cancelSQL, EventStatementCancelled, o.since
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
		if err := pool.QueryRow(ctx, sql, o.pid, arg).Scan(&done); err != nil {
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
		took := o.age
		if xactOver {
			took = o.xage
		}
		c.log().Info("tenant held to its tier", "tenant", o.id, "cluster", cl.Name(), "node", node, "action", action,
			"pid", strconv.Itoa(int(o.pid)), "seconds", math.Round(took*10)/10)
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

// SettingChange is one role default the settings pass put back, as its
// event records it.
type SettingChange struct {
	Setting  string `json:"setting"`
	Database string `json:"database,omitempty"` // set with ALTER ROLE … IN DATABASE (always reset)
	Found    string `json:"found"`              // the tenant's value
	Tier     string `json:"tier,omitempty"`     // the tier's value put back ("": reset, the tier sets none)
}

// roleSettings are one tenant role's defaults for the tier parameters:
// its own (ALTER ROLE … SET) and per database (ALTER ROLE … IN DATABASE … SET).
type roleSettings struct {
	own  map[string]string
	inDB map[string]map[string]string
}

// The settings pass's read: every tenant role with its settings, one row
// per role and per database it has settings in.
const roleSettingsSQL = `
	SELECT r.rolname, coalesce(d.datname, ''), coalesce(s.setdatabase, 0) <> 0, coalesce(s.setconfig, '{}')
	FROM pg_catalog.pg_roles r
	LEFT JOIN pg_catalog.pg_db_role_setting s ON s.setrole = r.oid
	LEFT JOIN pg_catalog.pg_database d ON d.oid = s.setdatabase
	WHERE r.rolname LIKE 't\_%'`

// RestoreSettings puts back, on one cluster's primary (pg_db_role_setting
// replicates to the standbys), the tier's role defaults that tenants
// changed: a tier parameter (tenant.TierParameters) whose value on the
// tenant's role differs from what its tier sets (tenant.RoleSettings; a
// parameter the tier does not set must be absent) is set back or reset, and
// a tier parameter set for the role IN DATABASE (which would override the
// role's own default) is reset. Other settings (a schema tenant's
// search_path) are left alone. Each tenant restored gets a
// tier_setting_restored event; it returns how many were.
//
// Only tenants that can have changed their role are looked at (active,
// suspended, dropped), and of a tier the configuration knows: one whose
// tier was removed from it keeps its settings rather than lose every limit.
func (c *Capper) RestoreSettings(ctx context.Context, cl *cluster.Cluster) (int, error) {
	// Whether the cluster answers, before its tenants are read from the
	// catalog: thousands of rows a cluster, read for nothing when it is
	// down (a million tenants' daemon, starting with clusters down, spent
	// its catalog connections on them for 8 s).
	admin, err := cl.Admin(ctx)
	if err != nil {
		return 0, err
	}
	if err := admin.Ping(ctx); err != nil {
		return 0, fmt.Errorf("reach %s: %w", cl.Name(), cluster.Classify(err))
	}
	// The catalog, then the roles: a claim changes the spare's role on the
	// cluster before its catalog transaction commits, so a tenant read
	// here as active already has its tier's settings there.
	ts, err := c.Store.MetricTenants(ctx, cl.Name())
	if err != nil {
		return 0, err
	}
	tiers := map[string]string{}
	for _, t := range ts {
		switch t.State {
		case catalog.StateActive, catalog.StateSuspended, catalog.StateDropped:
			if _, ok := c.Tiers[t.Tier]; ok {
				tiers[t.ID] = t.Tier
			}
		}
	}
	if len(tiers) == 0 {
		return 0, nil
	}
	roles, err := readRoleSettings(ctx, admin)
	if err != nil {
		return 0, fmt.Errorf("read role settings of %s: %w", cl.Name(), err)
	}
	names := make([]string, 0, len(roles))
	for role := range roles {
		if id, _ := tenant.IDFromRole(role); tiers[id] != "" {
			names = append(names, role)
		}
	}
	sort.Strings(names)
	restored, failed := 0, 0
	var first error
	for _, role := range names {
		id, _ := tenant.IDFromRole(role)
		tierName := tiers[id]
		sql, changes := restoreSQL(role, roles[role], tenant.RoleSettings(c.Tiers[tierName]))
		if len(changes) == 0 {
			continue
		}
		if err := cluster.ExecLockBounded(ctx, admin, restoreLockTimeout, sql); errors.Is(err, cluster.ErrNotFound) {
			continue // the role was purged meanwhile
		} else if err != nil {
			failed++
			if first == nil {
				first = fmt.Errorf("restore role settings of tenant %s (role %s): %w", id, role, err)
			}
			continue
		}
		restored++
		c.count(cl.Name(), "setting_restore")
		if err := c.Store.AddEvent(ctx, c.Store.Pool(), id, EventSettingRestored,
			map[string]any{"tier": tierName, "role": role, "settings": changes}); err != nil {
			c.log().Warn("record capper event", "tenant", id, "event", EventSettingRestored, "err", err)
		}
		c.log().Info("tier settings put back", "tenant", id, "cluster", cl.Name(), "settings", len(changes))
	}
	if failed > 0 {
		return restored, fmt.Errorf("%d of the tenants to restore failed (tried again next pass); first: %w", failed, first)
	}
	return restored, nil
}

// readRoleSettings reads the tier parameters every role a tenant logs in
// with has set (its own, its extra logins': tenant.IDFromRole), by role
// (every such role is there, settings or not).
func readRoleSettings(ctx context.Context, q interface {
	Query(context.Context, string, ...any) (pgx.Rows, error)
}) (map[string]roleSettings, error) {
	rows, err := q.Query(ctx, roleSettingsSQL)
	if err != nil {
		return nil, cluster.Classify(err)
	}
	defer rows.Close()
	out := map[string]roleSettings{}
	for rows.Next() {
		var role, db string
		var inDB bool
		var setconfig []string
		if err := rows.Scan(&role, &db, &inDB, &setconfig); err != nil {
			return nil, err
		}
		if _, ok := tenant.IDFromRole(role); !ok { // not the agents (pgt_agent_<id>)
			continue
		}
		rs, ok := out[role]
		if !ok {
			rs = roleSettings{own: map[string]string{}, inDB: map[string]map[string]string{}}
			out[role] = rs
		}
		set := rs.own
		if inDB {
			if db == "" {
				continue // its database is being dropped
			}
			set = map[string]string{}
			rs.inDB[db] = set
		}
		for _, kv := range setconfig {
			k, v, _ := strings.Cut(kv, "=")
			k = strings.ToLower(k)
			for _, p := range tenant.TierParameters {
				if k == p {
					set[k] = v
				}
			}
		}
	}
	return out, cluster.Classify(rows.Err())
}

// restoreSQL returns the statements that give role the tier's settings
// back, and what they change (nothing when it has them).
func restoreSQL(role string, have roleSettings, want map[string]string) (string, []SettingChange) {
	var b strings.Builder
	var changes []SettingChange
	r := cluster.Ident(role)
	for _, p := range tenant.TierParameters {
		got, has := have.own[p]
		w, wants := want[p]
		switch {
		case wants && (!has || !tenant.SameSetting(p, got, w)):
			fmt.Fprintf(&b, "ALTER ROLE %s SET %s = %s;\n", r, cluster.Ident(p), cluster.Literal(w))
			changes = append(changes, SettingChange{Setting: p, Found: got, Tier: w})
		case !wants && has:
			fmt.Fprintf(&b, "ALTER ROLE %s RESET %s;\n", r, cluster.Ident(p))
			changes = append(changes, SettingChange{Setting: p, Found: got})
		}
	}
	dbs := make([]string, 0, len(have.inDB))
	for db := range have.inDB {
		dbs = append(dbs, db)
	}
	sort.Strings(dbs)
	for _, db := range dbs {
		for _, p := range tenant.TierParameters {
			if got, has := have.inDB[db][p]; has {
				fmt.Fprintf(&b, "ALTER ROLE %s IN DATABASE %s RESET %s;\n", r, cluster.Ident(db), cluster.Ident(p))
				changes = append(changes, SettingChange{Setting: p, Database: db, Found: got, Tier: want[p]})
			}
		}
	}
	return b.String(), changes
}
