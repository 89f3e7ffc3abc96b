package hostile_test

import (
	"context"
	"fmt"
	"net/url"
	"regexp"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pgtenant/pgtenant/internal/analytics"
	"github.com/pgtenant/pgtenant/internal/api"
	"github.com/pgtenant/pgtenant/internal/catalog"
	"github.com/pgtenant/pgtenant/internal/cluster"
	"github.com/pgtenant/pgtenant/internal/config"
	"github.com/pgtenant/pgtenant/internal/jobs"
	"github.com/pgtenant/pgtenant/internal/pgtest"
	"github.com/pgtenant/pgtenant/internal/templates"
)

// pathBound is how long any control-plane path may take against hostile
// tenants before the suite calls it stuck.
const pathBound = 90 * time.Second

// TestHostile_EveryPathAgainstEveryPlant: hostile tenants of both modes
// plant everything the suite knows (payload, triggers, settings, flags,
// large objects, default privileges, advisory locks on every key the
// control plane ever used, a long ACCESS EXCLUSIVE lock, idle sessions up to
// their connection limit), then every control-plane path runs, twice: the
// first round shows which functions and operators the control plane calls
// in tenant databases (from pg_stat_statements, so the list follows the
// code), shadows for them are planted, and the second round runs again.
// After each path: no role gained a privilege and the neighbours log in,
// read and write; at the end, no planted code ran in a privileged session
// and no shadow ran at all, and purges left nothing behind.
func TestHostile_EveryPathAgainstEveryPlant(t *testing.T) {
	if testing.Short() {
		t.Skip("the hostile suite runs every control-plane path twice")
	}
	runSuite(t, start(t, suiteConfig))
}

// suiteConfig is the daemon's config for the suite: a tier per hostile
// tenant (the quota passes set a quota of each tenant's own), the
// watchers and the analytics port quick.
func suiteConfig(c *config.Config) {
	for _, mode := range suiteModes {
		// A cap of a few seconds: the suite's own statements as the
		// tenant (2 MB inserts) must fit under it on a loaded machine.
		c.Tiers[hostileTier+"_"+mode] = config.Tier{ConnectionLimit: 4, StatementTimeout: config.Duration(5 * time.Second),
			StatementCap: config.Duration(5 * time.Second), IdleInTransactionSessionTimeout: config.Duration(time.Minute),
			WorkMem: 4 << 20, TempFileLimit: 64 << 20, Extensions: []string{"hstore"}}
	}
	c.Prewarm.WatchInterval = config.Duration(200 * time.Millisecond)
	c.Pacer.SlotWait = config.Duration(2 * time.Second)
	c.Analytics.Listen = "127.0.0.1:0"
	c.Analytics.PollInterval = config.Duration(100 * time.Millisecond)
	c.Analytics.Lease = config.Duration(2 * time.Second)
	c.Analytics.FlushInterval = config.Duration(50 * time.Millisecond)
}

// suiteModes are the modes of the suite's hostile tenants.
var suiteModes = []string{"database", "schema"}

// runSuite runs the suite on e's daemon, its tenants on srv.
func runSuite(t *testing.T, e *env) {
	t.Helper()
	ctx := pgtest.Context(t)
	resetStatements(t)

	var hostiles []*hostile
	for _, mode := range suiteModes {
		tier := hostileTier + "_" + mode
		hostiles = append(hostiles, &hostile{login: e.tenant(t, mode, tier), limit: e.cfg.Tiers[tier].ConnectionLimit})
	}
	neighbours := []login{e.tenant(t, "database", "default"), e.tenant(t, "schema", "default")}
	all := append([]login{}, neighbours...)
	for _, h := range hostiles {
		all = append(all, h.login)
	}
	for _, h := range hostiles {
		h.plant(t, all)
	}
	check := func(path string) {
		t.Helper()
		if p := privileged(t); len(p) > 0 {
			t.Fatalf("after %s: roles with privileges no tenant may have: %s", path, strings.Join(p, "; "))
		}
		for _, n := range neighbours {
			neighbourWorks(t, n)
		}
	}

	// Round 1: every path, to learn what the control plane calls.
	paths(t, e, hostiles, neighbours, 1, check)
	fns, ops := calledInTenantDatabases(t)
	t.Logf("the control plane called %d functions and %d operators in tenant databases: %v %v", len(fns), len(ops), fns, ops)
	if len(fns) < 5 || len(ops) < 2 {
		t.Fatalf("pg_stat_statements saw too little (%v, %v): is the suite still exercising the paths?", fns, ops)
	}
	for _, h := range hostiles {
		n := plantShadows(t, h.act, h.login, fns, ops)
		t.Logf("%s tenant %s: %d shadowing functions and operators planted", h.Mode, h.ID, n)
		if h.Mode == "database" {
			shadowsWouldCatchAnAdminSession(t, h.login)
		}
	}

	// Round 2: the same paths, now with shadows everywhere the tenants can write.
	paths(t, e, hostiles, neighbours, 2, check)
	for _, h := range hostiles {
		noPrivilegedTrips(t, h.login, isShadow)
	}

	// Purge, last: everything planted goes with the tenants.
	for _, h := range hostiles {
		for _, tr := range trips(t, h.login) {
			if tr.SessionRole != "pgt_agent_"+h.ID && tr.SessionRole != h.Role {
				t.Errorf("%s tenant %s: planted code ran in a session of %s: %s", h.Mode, h.ID, tr.SessionRole, tr)
			}
		}
		pctx, cancel := context.WithTimeout(ctx, pathBound)
		r, err := e.c.DropTenant(pctx, h.ID, true)
		cancel()
		if err != nil {
			t.Fatalf("purge %s: %v", h.ID, err)
		}
		if r.Job != nil {
			waitJob(t, e.c, r.Job.ID, jobs.Succeeded)
		}
		if left := leftBehind(t, h.login); len(left) > 0 {
			t.Errorf("%s tenant %s: left behind by its purge: %v", h.Mode, h.ID, left)
		}
		check("purge of " + h.ID)
	}
}

// hostile is a hostile tenant with the sessions it keeps open: act, the
// one the suite acts through, a holder of locks, and idle ones up to its
// connection limit.
type hostile struct {
	login
	limit int
	act   *pgx.Conn
	locks []string // advisory lock keys (tenant ids) the holder takes
}

// plant puts into a hostile tenant everything it can plant on its own.
func (h *hostile) plant(t *testing.T, all []login) {
	t.Helper()
	ctx := pgtest.Context(t)
	conn := connect(t, h.DSN)
	plantPayload(t, conn, h.login)
	plantTriggers(t, conn, h.login)
	s, r := cluster.Ident(h.Schema), cluster.Ident(h.Role)
	// Settings on its role, which sessions of its role start with, and on
	// its database, which it does not own (refused: only tried).
	mustExec(t, conn, "ALTER ROLE "+r+" SET statement_timeout = 0")
	mustExec(t, conn, "ALTER ROLE "+r+` SET search_path = "$user", public, pg_catalog`)
	mustExec(t, conn, "ALTER ROLE "+r+" SET idle_in_transaction_session_timeout = 0")
	for _, sql := range []string{
		"ALTER DATABASE " + cluster.Ident(h.Database) + " SET default_transaction_read_only = on",
		"ALTER DATABASE " + cluster.Ident(h.Database) + " SET search_path = public, pg_catalog",
		"ALTER DATABASE " + cluster.Ident(h.Database) + " SET role = " + r,
		"ALTER DATABASE " + cluster.Ident(h.Database) + " IS_TEMPLATE true",
		"ALTER DATABASE " + cluster.Ident(h.Database) + " CONNECTION LIMIT 0",
	} {
		if _, err := conn.Exec(ctx, sql); err == nil {
			t.Errorf("tenant %s may: %s", h.ID, sql)
		}
	}
	mustExec(t, conn, `SELECT lo_from_bytea(0, $1::bytea)`, []byte("secret of "+h.ID))
	mustExec(t, conn, `ALTER DEFAULT PRIVILEGES GRANT ALL ON TABLES TO PUBLIC`)
	mustExec(t, conn, `ALTER DEFAULT PRIVILEGES IN SCHEMA `+s+` GRANT EXECUTE ON FUNCTIONS TO PUBLIC`)
	mustExec(t, conn, `CREATE TABLE `+s+`.hog (b text)`)
	mustExec(t, conn, `INSERT INTO `+s+`.hog SELECT repeat(md5(g::text), 32) FROM generate_series(1, 3000) g`)
	mustExec(t, conn, `INSERT INTO organizations (name, slug) SELECT 'o' || g, 'h' || g FROM generate_series(1, 500) g`)
	conn.Close(ctx)
	for _, o := range all {
		h.locks = append(h.locks, o.ID)
	}
	h.sessions(t)
}

// sessions opens the tenant's sessions, as it does again after the control
// plane ended them: act; a holder of every advisory lock the control plane
// ever took (rollouts' per-tenant keys of every tenant, the catalog's
// migration key) and of ACCESS EXCLUSIVE on a table of its own, in an open
// transaction; idle ones up to its connection limit.
func (h *hostile) sessions(t *testing.T) {
	t.Helper()
	// Its own statements name pg_catalog's functions: its shadows would
	// take its unqualified calls as well.
	h.act = connect(t, h.DSN)
	mustExec(t, h.act, `SET search_path = pg_catalog`)
	holder := connect(t, h.DSN)
	for _, id := range h.locks {
		mustExec(t, holder, `SELECT pg_advisory_lock($1, hashtext($2))`, 0x70677403, id)
	}
	mustExec(t, holder, `SELECT pg_advisory_lock($1)`, int64(0x70677465))
	mustExec(t, holder, `BEGIN`)
	mustExec(t, holder, `SET LOCAL idle_in_transaction_session_timeout = 0`)
	mustExec(t, holder, `LOCK TABLE `+cluster.Ident(h.Schema)+`.hog IN ACCESS EXCLUSIVE MODE`)
	// An xid: every logical slot made on the cluster waits for it.
	mustExec(t, holder, `SELECT txid_current()`)
	for range h.limit - 2 {
		mustExec(t, connect(t, h.DSN), `SELECT 1`)
	}
}

// paths runs every control-plane path that reaches tenants, each within
// pathBound, calling check after each. Round 2 differs only in the
// template version it rolls out.
func paths(t *testing.T, e *env, hostiles []*hostile, neighbours []login, round int, check func(string)) {
	t.Helper()
	ctx := pgtest.Context(t)
	bounded := func() (context.Context, context.CancelFunc) { return context.WithTimeout(ctx, pathBound) }

	// Hot-set capture and prewarm.
	pctx, cancel := bounded()
	if _, err := e.c.Capture(pctx, api.CaptureRequest{}); err != nil {
		t.Fatalf("round %d: capture: %v", round, err)
	}
	js, err := e.c.Prewarm(pctx, api.PrewarmRequest{All: true})
	cancel()
	if err != nil {
		t.Fatalf("round %d: prewarm: %v", round, err)
	}
	for _, j := range js {
		waitJob(t, e.c, j.ID, jobs.Succeeded)
	}
	check("capture and prewarm")

	// Metrics, quota enforcement (its writes refused while it holds its
	// locks and sessions), and back under the quota.
	for _, h := range hostiles {
		// 3 MB of margin: growing adds at least 6 MB, and back under its
		// quota a tenant keeps up to 1.2 MB more than before of the catalog
		// churn its enforcement made (owners and grants changed on the 912
		// shadows planted for round 2).
		rig := newQuotaRigMargin(t, e, h.login, 3<<20)
		mustExec(t, h.act, grow2MB(h.login))
		if state, err := rig.until(t, catalog.QuotaEnforced); state != catalog.QuotaEnforced {
			t.Errorf("round %d: %s tenant %s: quota %s, %v; want enforced", round, h.Mode, h.ID, state, err)
		}
		h.sessions(t) // the second pass ended them to get its locks
		refused(t, h.act, "42501", grow2MB(h.login))
		mustExec(t, h.act, `TRUNCATE `+cluster.Ident(h.Schema)+`.organizations CASCADE`)
		if state, err := rig.until(t, catalog.QuotaOK); state != catalog.QuotaOK {
			t.Errorf("round %d: %s tenant %s back under its quota: %s, %v; want ok", round, h.Mode, h.ID, state, err)
		}
		h.sessions(t) // ended again, for the locks the restore needed
		mustExec(t, h.act, `INSERT INTO `+cluster.Ident(h.Schema)+`.organizations (name, slug) VALUES ('writes again', 'again')`)
	}
	check("metrics and quota")

	// The statement cap, whatever statement_timeout the tenant sets, on the
	// primary and on the standby.
	for _, h := range hostiles {
		for node, conn := range map[string]*pgx.Conn{"primary": h.act, "standby": connect(t, srv.OnStandby(t, h.DSN))} {
			sctx, cancel := bounded()
			_, err := conn.Exec(sctx, `SET statement_timeout = 0; SELECT pg_sleep(60)`)
			stuck := sctx.Err() != nil
			cancel()
			if err == nil || stuck {
				t.Errorf("round %d: %s tenant %s on the %s: a 60 s statement over its 5 s cap was not stopped: %v", round, h.Mode, h.ID, node, err)
			}
		}
	}
	check("statement cap")

	// Extra logins, made, rotated and revoked against the plants: the
	// admin's GRANTs, default privileges and DROP OWNED in the tenant's
	// database run none of its code and wait boundedly behind its locks.
	// A read-only login reads and cannot write; it is held to the
	// tenant's cap whatever statement_timeout it sets, on its own role
	// (put back by the capper) or in its session.
	for _, h := range hostiles {
		lctx, cancel := bounded()
		ro, err := e.c.CreateCredential(lctx, h.ID, api.CreateCredentialRequest{Name: fmt.Sprintf("ro%d", round), ReadOnly: true})
		if err == nil {
			_, err = e.c.CreateCredential(lctx, h.ID, api.CreateCredentialRequest{Name: fmt.Sprintf("rw%d", round)})
		}
		if err == nil {
			ro, err = e.c.RotateCredential(lctx, h.ID, ro.Credential.Name)
		}
		if err == nil {
			_, err = e.c.RevokeCredential(lctx, h.ID, fmt.Sprintf("rw%d", round))
		}
		cancel()
		if err != nil {
			t.Fatalf("round %d: %s tenant %s: credentials: %v", round, h.Mode, h.ID, err)
		}
		conn := connect(t, ro.DSN)
		mustExec(t, conn, `SELECT count(*) FROM `+cluster.Ident(h.Schema)+`.organizations`)
		refused(t, conn, "25006", `INSERT INTO `+cluster.Ident(h.Schema)+`.organizations (name, slug) VALUES ('ro', 'ro')`)
		mustExec(t, conn, `BEGIN READ WRITE; ALTER ROLE `+cluster.Ident(ro.User)+` SET statement_timeout = 0; COMMIT`)
		sctx, cancel := bounded()
		_, err = conn.Exec(sctx, `SET statement_timeout = 0; SELECT pg_sleep(60)`)
		stuck := sctx.Err() != nil
		cancel()
		if err == nil || stuck {
			t.Errorf("round %d: %s tenant %s: a read-only login's 60 s statement over the tenant's 5 s cap was not stopped: %v", round, h.Mode, h.ID, err)
		}
	}
	check("credentials")

	// Extensions: a database tenant creates the one its tier lists (the
	// guard, the admin's SECURITY DEFINER function, runs in its session
	// among its plants) and no other; a schema tenant none (an extension
	// is its shared database's, its neighbours' too).
	for _, h := range hostiles {
		create := func(ext string) string {
			return `CREATE EXTENSION IF NOT EXISTS ` + ext + ` SCHEMA ` + cluster.Ident(h.Schema)
		}
		if h.Mode == "database" {
			mustExec(t, h.act, create("hstore"))
			mustExec(t, h.act, `CREATE TABLE IF NOT EXISTS `+cluster.Ident(h.Schema)+`.attrs (id int PRIMARY KEY, a `+cluster.Ident(h.Schema)+`.hstore)`)
		} else {
			refused(t, h.act, "42501", create("hstore"))
		}
		refused(t, h.act, "42501", create("citext"))
	}
	check("extensions")

	// A rollout: transactional files that set off the tenants' triggers,
	// then a NO TRANSACTION file.
	v := e.pushVersion(t,
		templates.Upload{Name: fmt.Sprintf("%04d_seed.sql", 2*round), Body: fmt.Sprintf(`CREATE TABLE seeded_%[1]d (id int);
INSERT INTO organizations (name, slug) VALUES ('seeded by round %[1]d', 'seed-%[1]d');`, round)},
		templates.Upload{Name: fmt.Sprintf("%04d_index.sql", 2*round+1), Body: fmt.Sprintf("-- +goose NO TRANSACTION\n-- +goose Up\n"+
			"CREATE INDEX CONCURRENTLY IF NOT EXISTS organizations_name_%d ON organizations (name);", round)})
	st := e.rollout(t, v)
	for _, rt := range st.Tenants {
		if rt.State != catalog.RolloutTenantDone {
			t.Errorf("round %d: rollout: tenant %s %s at version %d: %s", round, rt.Tenant, rt.State, rt.Version, rt.Error)
		}
	}
	check("rollout")

	// Suspend and resume, drop and restore, reconcile with repairs.
	for _, h := range hostiles {
		for _, action := range []string{"suspend", "resume"} {
			actx, cancel := bounded()
			_, err := e.c.TenantAction(actx, h.ID, action)
			cancel()
			if err != nil {
				t.Fatalf("round %d: %s %s: %v", round, action, h.ID, err)
			}
		}
		dctx, cancel := bounded()
		_, err := e.c.DropTenant(dctx, h.ID, false)
		if err == nil {
			_, err = e.c.TenantAction(dctx, h.ID, "restore")
		}
		cancel()
		if err != nil {
			t.Fatalf("round %d: drop and restore %s: %v", round, h.ID, err)
		}
		// Locked out and back: its sessions were ended, so it opens its
		// sessions and takes its locks again.
		h.sessions(t)
	}
	check("suspend, resume, drop, restore")
	rctx, cancel := bounded()
	rep, err := e.c.Reconcile(rctx, api.ReconcileRequest{Fix: true})
	cancel()
	if err != nil {
		t.Fatalf("round %d: reconcile --fix: %v", round, err)
	}
	for _, f := range rep.Findings {
		t.Logf("round %d: reconcile: %+v", round, f)
	}
	check("reconcile --fix")

	// Analytics. A neighbour's mirror makes a logical slot, which waits for
	// every transaction holding an xid: the hostiles' holders hold one (and
	// their locks), and past pacer.slot_wait each is ended, with an event
	// in its history. Each hostile's own mirror is made too, and an
	// analytics session of the hostile is held open across a suspend, a
	// password rotation and a drop: each ends it.
	for _, n := range neighbours {
		mirror(t, e, n.ID)
		disable(t, e, n.ID)
	}
	for _, h := range hostiles {
		if got := len(eventsOf(t, e, h.ID, cluster.EventBlockingTerminated)); got < round {
			t.Errorf("round %d: %s tenant %s: %d %s events, want at least %d: did its open transaction not hold the slots up?",
				round, h.Mode, h.ID, got, cluster.EventBlockingTerminated, round)
		}
		st := mirror(t, e, h.ID)
		for _, change := range []string{"suspend", "rotate", "drop"} {
			session := analyticsSession(t, st.DSN, h.DSN)
			actx, cancel := bounded()
			var err error
			switch change {
			case "rotate":
				var r api.RotatePasswordResponse
				if r, err = e.c.RotatePassword(actx, h.ID, false); err == nil {
					h.DSN = e.dsn(r.DSN, r.DirectDSN)
				}
			case "drop":
				_, err = e.c.DropTenant(actx, h.ID, false)
			default:
				_, err = e.c.TenantAction(actx, h.ID, change)
			}
			cancel()
			if err != nil {
				t.Fatalf("round %d: %s %s: %v", round, change, h.ID, err)
			}
			var one int
			if err := session.QueryRow(ctx, `SELECT 1`).Scan(&one); err == nil {
				t.Errorf("round %d: %s tenant %s: its analytics session still answers after %s", round, h.Mode, h.ID, change)
			}
			actx, cancel = bounded()
			switch change {
			case "suspend":
				_, err = e.c.TenantAction(actx, h.ID, "resume")
			case "drop":
				_, err = e.c.TenantAction(actx, h.ID, "restore")
			}
			cancel()
			if err != nil {
				t.Fatalf("round %d: undo %s of %s: %v", round, change, h.ID, err)
			}
		}
		disable(t, e, h.ID) // a drop disables the mirror; restore does not bring it back
		h.sessions(t)       // the suspend, the rotation and the drop ended them
	}
	check("analytics beside open transactions, and its sessions across lifecycle changes")

	// A restart of the primary: the watcher prewarms the hot tenants again
	// on its own.
	before, err := prewarmJobs(ctx, e)
	if err != nil {
		t.Fatal(err)
	}
	if err := srv.Restart(ctx); err != nil {
		t.Fatal(err)
	}
	// The catalog may live on this server too: until the daemon's pools
	// reconnect, the API may answer with the restart's error.
	deadline := time.Now().Add(pathBound)
	for {
		js, err := prewarmJobs(ctx, e)
		if err == nil && len(js) > len(before) && js[0].State == jobs.Succeeded {
			break
		}
		if err == nil && len(js) > len(before) && js[0].State == jobs.Failed {
			t.Fatalf("round %d: prewarm after restart failed: %s", round, js[0].LastError)
		}
		if time.Now().After(deadline) {
			t.Fatalf("round %d: no prewarm finished within %s of the restart (last error: %v)", round, pathBound, err)
		}
		time.Sleep(200 * time.Millisecond)
	}
	for _, h := range hostiles {
		h.sessions(t)
	}
	check("restart and automatic prewarm")
}

// prewarmJobs lists the prewarm jobs, newest first.
func prewarmJobs(ctx context.Context, e *env) ([]jobs.Job, error) {
	return e.c.Jobs(ctx, url.Values{"type": {string(jobs.Prewarm)}, "limit": {"100"}})
}

// resetStatements empties pg_stat_statements, so that what it shows is
// this test's.
func resetStatements(t *testing.T) {
	t.Helper()
	conn := srv.Conn(t, "postgres")
	mustExec(t, conn, `CREATE EXTENSION IF NOT EXISTS pg_stat_statements`)
	mustExec(t, conn, `SELECT pg_stat_statements_reset()`)
}

var (
	callRE     = regexp.MustCompile(`([A-Za-z_][A-Za-z0-9_]*)\s*\(`)
	operatorRE = regexp.MustCompile(`[-+*/<>=~!@#%^&|?]+`)
	literalRE  = regexp.MustCompile(`'(?:[^']|'')*'|"(?:[^"]|"")*"|--[^\n]*`)
)

// calledInTenantDatabases lists the pg_catalog functions and operators
// named in the SQL that admin and agent sessions ran in tenant and shared
// databases, as pg_stat_statements recorded it; the operators SQL implies
// (LIKE, IN, ANY, BETWEEN) included.
func calledInTenantDatabases(t *testing.T) (fns, ops []string) {
	t.Helper()
	ctx := pgtest.Context(t)
	conn := srv.Conn(t, "postgres")
	rows, err := conn.Query(ctx, `SELECT s.query FROM pg_stat_statements s
		JOIN pg_database d ON d.oid = s.dbid JOIN pg_roles r ON r.oid = s.userid
		WHERE (d.datname LIKE 't\_%' OR d.datname LIKE 'pgt\_shared\_%') AND (r.rolsuper OR r.rolname LIKE 'pgt\_agent\_%')`)
	if err != nil {
		t.Fatal(err)
	}
	queries, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		t.Fatal(err)
	}
	names, symbols := map[string]bool{}, map[string]bool{}
	for _, q := range queries {
		for _, m := range callRE.FindAllStringSubmatch(q, -1) {
			names[strings.ToLower(m[1])] = true
		}
		upper := strings.ToUpper(q)
		implied := map[string]string{" LIKE ": "~~", " ILIKE ": "~~*", " NOT LIKE ": "!~~", " IN (": "=", "ANY(": "=", "ANY (": "=",
			" BETWEEN ": ">=", "DISTINCT": "="}
		for word, op := range implied {
			if strings.Contains(upper, word) {
				symbols[op] = true
			}
		}
		if strings.Contains(upper, " BETWEEN ") {
			symbols["<="] = true
		}
		for _, op := range operatorRE.FindAllString(literalRE.ReplaceAllString(q, ""), -1) {
			symbols[op] = true
		}
	}
	keys := func(m map[string]bool) []string {
		var out []string
		for k := range m {
			out = append(out, k)
		}
		return out
	}
	rows, err = conn.Query(ctx, `SELECT DISTINCT proname::text FROM pg_proc
		WHERE pronamespace = 'pg_catalog'::regnamespace AND proname = ANY($1) ORDER BY 1`, keys(names))
	if err != nil {
		t.Fatal(err)
	}
	if fns, err = pgx.CollectRows(rows, pgx.RowTo[string]); err != nil {
		t.Fatal(err)
	}
	rows, err = conn.Query(ctx, `SELECT DISTINCT oprname::text FROM pg_operator
		WHERE oprnamespace = 'pg_catalog'::regnamespace AND oprname = ANY($1) ORDER BY 1`, keys(symbols))
	if err != nil {
		t.Fatal(err)
	}
	if ops, err = pgx.CollectRows(rows, pgx.RowTo[string]); err != nil {
		t.Fatal(err)
	}
	return fns, ops
}

// concrete are the types shadows use for pg_catalog's polymorphic
// parameters: a concrete type is a better match than a polymorphic one,
// whatever the schema order.
var concrete = []string{"oid", "text", "name", "int4", "int8", "bool", "regclass", `"char"`}

var polymorphic = map[string]bool{"anyelement": true, "anynonarray": true, "anyenum": true, "anycompatible": true,
	"anycompatiblenonarray": true, "anyarray": true, "anycompatiblearray": true, `"any"`: true}

// unusable are parameter or result types a shadow cannot have.
var unusable = map[string]bool{"internal": true, "cstring": true, "trigger": true, "event_trigger": true, "language_handler": true,
	"fdw_handler": true, "tsm_handler": true, "index_am_handler": true, "table_am_handler": true, "anyrange": true,
	"anymultirange": true, "anycompatiblerange": true, "anycompatiblemultirange": true, "pg_ddl_command": true}

// substitute replaces polymorphic types by elem (arrays of it for the
// array ones); ok is false for a type a shadow cannot use.
func substitute(typ, elem string) (string, bool) {
	switch {
	case unusable[typ]:
		return "", false
	case typ == "anyarray" || typ == "anycompatiblearray":
		return elem + "[]", true
	case polymorphic[typ]:
		return elem, true
	}
	return typ, true
}

// plantShadows creates, in the tenant's schema, for every pg_catalog
// function and operator named, a copy of each of its signatures and
// variants with concrete types for its polymorphic ones; their body runs
// pwn. It returns how many it made.
func plantShadows(t *testing.T, conn *pgx.Conn, h login, fns, ops []string) int {
	t.Helper()
	ctx := pgtest.Context(t)
	type sig struct {
		name, kind string // kind: f (function) or o (operator)
		args       []string
		ret        string
		set        bool
		variadic   bool
	}
	var sigs []sig
	rows, err := conn.Query(ctx, `SELECT proname::text, coalesce((SELECT array_agg(format_type(a, NULL) ORDER BY i)
			FROM unnest(proargtypes::oid[]) WITH ORDINALITY AS x(a, i)), '{}'), format_type(prorettype, NULL), proretset, provariadic <> 0
		FROM pg_proc WHERE pronamespace = 'pg_catalog'::regnamespace AND proname = ANY($1) AND proallargtypes IS NULL`, fns)
	if err != nil {
		t.Fatal(err)
	}
	for rows.Next() {
		s := sig{kind: "f"}
		if err := rows.Scan(&s.name, &s.args, &s.ret, &s.set, &s.variadic); err != nil {
			t.Fatal(err)
		}
		sigs = append(sigs, s)
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	rows, err = conn.Query(ctx, `SELECT oprname::text, ARRAY[format_type(oprleft, NULL), format_type(oprright, NULL)], format_type(oprresult, NULL)
		FROM pg_operator WHERE oprnamespace = 'pg_catalog'::regnamespace AND oprname = ANY($1)`, ops)
	if err != nil {
		t.Fatal(err)
	}
	for rows.Next() {
		s := sig{kind: "o"}
		if err := rows.Scan(&s.name, &s.args, &s.ret); err != nil {
			t.Fatal(err)
		}
		sigs = append(sigs, s)
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}

	schema := cluster.Ident(h.Schema)
	made, seen := 0, map[string]bool{}
	for _, s := range sigs {
		for _, elem := range concrete {
			var args []string
			ok := true
			for i, a := range s.args {
				if a == `"any"` && s.variadic && i == len(s.args)-1 {
					a = elem // format(text, VARIADIC "any"): one concrete argument
				}
				sub, good := substitute(a, elem)
				ok = ok && good
				args = append(args, sub)
			}
			ret, good := substitute(s.ret, elem)
			if !ok || !good || s.ret == "record" && !s.set {
				continue
			}
			key := s.kind + s.name + "(" + strings.Join(args, ",") + ")"
			if seen[key] {
				continue
			}
			seen[key] = true
			label := cluster.Literal(fmt.Sprintf("%s(%s)", s.name, strings.Join(args, ", ")))
			body := fmt.Sprintf("BEGIN PERFORM %s.pwn(%s); RETURN NULL; END", schema, label)
			setof := ""
			if s.set {
				setof, body = "SETOF ", fmt.Sprintf("BEGIN PERFORM %s.pwn(%s); RETURN; END", schema, label)
			}
			var sql string
			if s.kind == "f" {
				sql = fmt.Sprintf("CREATE FUNCTION %s.%s(%s) RETURNS %s%s LANGUAGE plpgsql AS %s", schema, cluster.Ident(s.name),
					strings.Join(args, ", "), setof, ret, cluster.Literal(body))
			} else {
				fn := fmt.Sprintf("%s.shadow_op_%d", schema, made)
				var params, opArgs []string
				for i, side := range []string{"LEFTARG", "RIGHTARG"} {
					if args[i] != "-" {
						params = append(params, args[i])
						opArgs = append(opArgs, side+" = "+args[i])
					}
				}
				sql = fmt.Sprintf("CREATE FUNCTION %s(%s) RETURNS %s LANGUAGE plpgsql AS %s; CREATE OPERATOR %s.%s (%s, FUNCTION = %s)",
					fn, strings.Join(params, ", "), ret, cluster.Literal(body), schema, s.name, strings.Join(opArgs, ", "), fn)
			}
			if _, err := conn.Exec(ctx, sql); err != nil {
				continue // e.g. a signature the tenant cannot create (a type it may not use)
			}
			made++
		}
	}
	if made == 0 {
		t.Fatalf("tenant %s: no shadow could be planted", h.ID)
	}
	return made
}

// shadowsWouldCatchAnAdminSession runs, in an admin session that does not
// pin its search path (what the control plane did before), the query shape
// of finding 1, in a transaction rolled back: the shadow must trip. This is
// what makes the suite fail if a path runs tenant-reachable SQL in such a
// session.
func shadowsWouldCatchAnAdminSession(t *testing.T, h login) {
	t.Helper()
	ctx := pgtest.Context(t)
	conn := srv.Conn(t, h.Database)
	tx, err := conn.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx)
	if _, err := tx.Exec(ctx, `SELECT f FROM unnest($1::oid[]) AS f`, []uint32{1}); err != nil {
		t.Fatal(err)
	}
	var tripped []string
	rows, err := tx.Query(ctx, fmt.Sprintf(`SELECT what FROM %s.tripwire WHERE privileged`, cluster.Ident(h.Schema)))
	if err != nil {
		t.Fatal(err)
	}
	if tripped, err = pgx.CollectRows(rows, pgx.RowTo[string]); err != nil {
		t.Fatal(err)
	}
	sort.Strings(tripped)
	if len(tripped) == 0 {
		t.Fatal("an unpinned admin session ran unnest($1::oid[]) in the tenant's database and no shadow tripped: the fixture does not catch what it should")
	}
}

// mirror enables a tenant's analytics mirror of its organizations (the
// rollouts' seeded tables have no key) and waits, within pathBound, until
// it streams.
func mirror(t *testing.T, e *env, id string) analytics.Status {
	t.Helper()
	ctx := pgtest.Context(t)
	if _, err := e.c.EnableAnalytics(ctx, id, []string{"organizations"}); err != nil {
		t.Fatalf("analytics enable %s: %v", id, err)
	}
	deadline := time.Now().Add(pathBound)
	for {
		st, err := e.c.AnalyticsStatus(ctx, id)
		if err == nil && st.State == analytics.StateStreaming {
			return st
		}
		if time.Now().After(deadline) {
			t.Fatalf("analytics mirror of %s not streaming within %s: %+v, %v", id, pathBound, st, err)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// disable disables a tenant's mirror (if a drop has not already) and
// waits until it is gone.
func disable(t *testing.T, e *env, id string) {
	t.Helper()
	ctx := pgtest.Context(t)
	if _, err := e.c.DisableAnalytics(ctx, id); err != nil {
		if st, serr := e.c.AnalyticsStatus(ctx, id); serr != nil || st.Enabled {
			t.Fatalf("analytics disable %s: %v", id, err)
		}
	}
	deadline := time.Now().Add(pathBound)
	for {
		st, err := e.c.AnalyticsStatus(ctx, id)
		if err == nil && !st.Enabled {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("analytics mirror of %s not disabled within %s: %+v, %v", id, pathBound, st, err)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// analyticsSession logs in to the analytics port at dsn (no password) with
// the password of the tenant's own DSN, and checks that it answers.
func analyticsSession(t *testing.T, dsn, own string) *pgx.Conn {
	t.Helper()
	u, err := url.Parse(dsn)
	if err != nil {
		t.Fatal(err)
	}
	o, err := url.Parse(own)
	if err != nil {
		t.Fatal(err)
	}
	pw, _ := o.User.Password()
	u.User = url.UserPassword(u.User.Username(), pw)
	conn := connect(t, u.String())
	var one int
	if err := conn.QueryRow(pgtest.Context(t), `SELECT 1`).Scan(&one); err != nil {
		t.Fatalf("analytics session: %v", err)
	}
	return conn
}
