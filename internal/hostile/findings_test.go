package hostile_test

// One test per finding of the red-team run (issue "Hostile tenants"): each
// reproduces what a tenant did and checks that it no longer works.

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pgtenant/pgtenant/internal/api"
	"github.com/pgtenant/pgtenant/internal/catalog"
	"github.com/pgtenant/pgtenant/internal/cluster"
	"github.com/pgtenant/pgtenant/internal/config"
	"github.com/pgtenant/pgtenant/internal/jobs"
	"github.com/pgtenant/pgtenant/internal/metrics"
	"github.com/pgtenant/pgtenant/internal/pgtest"
	"github.com/pgtenant/pgtenant/internal/provision"
	"github.com/pgtenant/pgtenant/internal/quota"
	"github.com/pgtenant/pgtenant/internal/templates"
)

// shadowUnnest plants, in the tenant's schema, unnest for concrete array
// types: an exact argument type beats pg_catalog.unnest(anyarray) whatever
// the schema order, so an admin session that searches the tenant's schema
// would call it.
func shadowUnnest(t *testing.T, conn *pgx.Conn, l login) {
	t.Helper()
	for _, typ := range []string{"oid", "text", "int8", "int4", "name"} {
		mustExec(t, conn, fmt.Sprintf(`CREATE FUNCTION %[1]s.unnest(%[2]s[]) RETURNS SETOF %[2]s LANGUAGE plpgsql AS $f$
			BEGIN PERFORM %[1]s.pwn('unnest(%[2]s[])'); RETURN QUERY SELECT pg_catalog.unnest($1); END $f$`, cluster.Ident(l.Schema), typ))
	}
}

func isShadow(what string) bool { return strings.Contains(what, "(") }

// TestFinding1_PrewarmRunsNoTenantCode: a database tenant owns public in its
// database and plants public.unnest(oid[]); hot-set capture and prewarm,
// which run admin SQL in its database, never call it.
func TestFinding1_PrewarmRunsNoTenantCode(t *testing.T) {
	e := start(t, nil)
	ctx := pgtest.Context(t)
	l := e.tenant(t, "database", "default")
	conn := connect(t, l.DSN)
	plantPayload(t, conn, l)
	shadowUnnest(t, conn, l)
	mustExec(t, conn, `INSERT INTO organizations (name, slug) SELECT 'o' || g, 's' || g FROM generate_series(1, 2000) g`)
	mustExec(t, conn, `SELECT count(*) FROM organizations`)

	if _, err := e.c.Capture(ctx, api.CaptureRequest{}); err != nil {
		t.Fatal(err)
	}
	js, err := e.c.Prewarm(ctx, api.PrewarmRequest{Tenant: l.ID})
	if err != nil {
		t.Fatal(err)
	}
	if len(js) == 0 {
		t.Fatal("prewarm started no job")
	}
	for _, j := range js {
		waitJob(t, e.c, j.ID, jobs.Succeeded)
	}
	noneGainedPrivilege(t)
	noPrivilegedTrips(t, l, isShadow)
}

// quotaRig runs metrics and quota passes in the test, as the daemon's
// collector does, over a tier of the tenant's own whose quota is a margin
// (1 MB by default) above the tenant's size when the rig is made (no grace).
type quotaRig struct {
	store *catalog.Store
	col   *metrics.Collector
	id    string
	now   time.Time
}

// collector is a metrics collector of the test's catalog, over the test
// cluster, that measures every tenant's size at each pass; it returns the
// configuration it uses too.
func (e *env) collector(t *testing.T) (*metrics.Collector, config.Config) {
	t.Helper()
	reg := srv.Registry(t)
	cfg := e.cfg
	cfg.Metrics.Interval = config.Duration(15 * time.Second)
	cfg.Metrics.SizeInterval = cfg.Metrics.Interval
	return &metrics.Collector{Store: e.store, Clusters: reg, Metrics: cfg.Metrics, Tiers: cfg.Tiers, Logger: pgtest.Logger(t)}, cfg
}

// newQuotaRig makes the rig of l's tenant, its quota 1 MB above its size.
func newQuotaRig(t *testing.T, e *env, l login) *quotaRig {
	t.Helper()
	return newQuotaRigMargin(t, e, l, 1<<20)
}

// newQuotaRigMargin is newQuotaRig with the quota margin bytes above the
// tenant's size.
func newQuotaRigMargin(t *testing.T, e *env, l login, margin int64) *quotaRig {
	t.Helper()
	probe, cfg := e.collector(t)
	if err := probe.Pass(pgtest.Context(t), srv.Name()); err != nil {
		t.Fatal(err)
	}
	f, err := probe.Tenant(l.ID)
	if err != nil || f.SizeBytes == nil {
		t.Fatalf("no size for %s: %v", l.ID, err)
	}
	tier := cfg.Tiers[l.Tier]
	tier.StorageQuota = config.ByteSize(*f.SizeBytes + margin)
	cfg.Tiers = map[string]config.Tier{"default": cfg.Tiers["default"], l.Tier: tier}
	q := &quotaRig{store: e.store, id: l.ID, now: time.Now()}
	q.col = &metrics.Collector{Store: e.store, Clusters: probe.Clusters, Metrics: cfg.Metrics, Tiers: cfg.Tiers, Logger: probe.Logger,
		Quota: &quota.Service{Store: e.store, Clusters: probe.Clusters, Tiers: cfg.Tiers, Logger: probe.Logger},
		Now:   func() time.Time { return q.now }}
	return q
}

// until runs passes (a minute apart on the rig's clock) until the tenant's
// quota state is want, at most three: a pass that times out on the
// tenant's locks ends its sessions at the next. It returns the state and
// the last pass's error.
func (q *quotaRig) until(t *testing.T, want string) (string, error) {
	t.Helper()
	ctx := pgtest.Context(t)
	var state string
	var err error
	for range 3 {
		q.now = q.now.Add(time.Minute)
		err = q.col.Pass(ctx, srv.Name())
		st, qerr := q.store.GetQuota(ctx, q.id)
		if qerr != nil {
			t.Fatal(qerr)
		}
		if state = st.State; state == want {
			return state, err
		}
	}
	return state, err
}

// grow2MB writes about 2 MB that do not compress (random hex) into the
// tenant's organizations. Every name is qualified: a hostile tenant's
// shadows would take its own unqualified calls too.
func grow2MB(l login) string {
	return fmt.Sprintf(`INSERT INTO %s.organizations (name, slug)
		SELECT (SELECT pg_catalog.string_agg(pg_catalog.md5(pg_catalog.random()::text), '') FROM pg_catalog.generate_series(1, 64) i),
		       pg_catalog.concat('g', g) FROM pg_catalog.generate_series(1, 2000) g`, cluster.Ident(l.Schema))
}

// TestFinding2_QuotaCheckRunsNoTenantCode: the check after enforcing a quota
// (unnest($3::text[])) never calls a tenant's public.unnest(text[]); the
// tenant, filling itself past its quota, triggers it itself.
func TestFinding2_QuotaCheckRunsNoTenantCode(t *testing.T) {
	e := start(t, nil)
	l := e.tenant(t, "database", "default")
	conn := connect(t, l.DSN)
	plantPayload(t, conn, l)
	shadowUnnest(t, conn, l)
	rig := newQuotaRig(t, e, l)
	mustExec(t, conn, grow2MB(l))
	if state, err := rig.until(t, catalog.QuotaEnforced); err != nil || state != catalog.QuotaEnforced {
		t.Errorf("quota = %s, %v; want enforced", state, err)
	}
	noneGainedPrivilege(t)
	noPrivilegedTrips(t, l, isShadow)
}

// TestFinding3_RolloutTriggersRunAsTheTenant: a rollout's files set off the
// tenant's BEFORE and deferred constraint triggers (at COMMIT); they run
// in the tenant's agent session and every way back to privilege they try
// (RESET ROLE, SET SESSION AUTHORIZATION, ALTER ROLE … SUPERUSER) fails.
// Both modes.
func TestFinding3_RolloutTriggersRunAsTheTenant(t *testing.T) {
	e := start(t, nil)
	var ls []login
	for _, mode := range []string{"database", "schema"} {
		l := e.tenant(t, mode, "default")
		conn := connect(t, l.DSN)
		plantPayload(t, conn, l)
		plantTriggers(t, conn, l)
		ls = append(ls, l)
	}
	v := e.pushVersion(t, templates.Upload{Name: "0002_seed.sql", Body: `CREATE TABLE seeded (id int);
INSERT INTO organizations (name, slug) VALUES ('seeded by version 2', 'v2-seed');`})
	st := e.rollout(t, v)
	for _, l := range ls {
		if o := tenantOutcome(st, l.ID); o.State != catalog.RolloutTenantDone {
			t.Errorf("%s tenant %s: rollout state %q (%s), want done", l.Mode, l.ID, o.State, o.Error)
		}
		got := trips(t, l)
		if len(got) < 2 {
			t.Errorf("%s tenant %s: triggers ran %d times, want the BEFORE and the deferred one: %v", l.Mode, l.ID, len(got), got)
		}
		for _, tr := range got {
			if tr.SessionRole != "pgt_agent_"+l.ID || tr.Privileged {
				t.Errorf("%s tenant %s: trigger ran in a session of %s: %s", l.Mode, l.ID, tr.SessionRole, tr)
			}
		}
	}
	noneGainedPrivilege(t)
}

// plantTriggers puts a BEFORE INSERT trigger and a deferred constraint
// trigger running pwn on the tenant's organizations table.
func plantTriggers(t *testing.T, conn *pgx.Conn, l login) {
	t.Helper()
	mustExec(t, conn, fmt.Sprintf(`
		CREATE FUNCTION %[1]s.on_insert() RETURNS trigger LANGUAGE plpgsql AS $f$
			BEGIN PERFORM %[1]s.pwn(TG_NAME); RETURN NEW; END $f$;
		CREATE TRIGGER before_insert BEFORE INSERT ON %[1]s.organizations FOR EACH ROW EXECUTE FUNCTION %[1]s.on_insert();
		CREATE CONSTRAINT TRIGGER at_commit AFTER INSERT ON %[1]s.organizations DEFERRABLE INITIALLY DEFERRED
			FOR EACH ROW EXECUTE FUNCTION %[1]s.on_insert()`, cluster.Ident(l.Schema)))
}

// TestFinding4_DatabaseSettingsCannotEvadeQuota: a database tenant cannot
// set defaults on its database (it does not own it), and the read-only
// default it sets on its own role does not reach the control plane, which
// enforces its quota.
func TestFinding4_DatabaseSettingsCannotEvadeQuota(t *testing.T) {
	e := start(t, nil)
	l := e.tenant(t, "database", "default")
	conn := connect(t, l.DSN)
	db := cluster.Ident(l.Database)
	for _, s := range []string{"default_transaction_read_only = on", "search_path = public", "statement_timeout = 1", "lock_timeout = 1"} {
		refused(t, conn, "42501", "ALTER DATABASE "+db+" SET "+s)
	}
	mustExec(t, conn, "ALTER ROLE "+cluster.Ident(l.Role)+" SET default_transaction_read_only = on")
	rig := newQuotaRig(t, e, l)
	mustExec(t, conn, `SET default_transaction_read_only = off`)
	mustExec(t, conn, grow2MB(l))
	if state, err := rig.until(t, catalog.QuotaEnforced); err != nil || state != catalog.QuotaEnforced {
		t.Fatalf("quota = %s, %v; want enforced", state, err)
	}
	fresh := connect(t, l.DSN)
	mustExec(t, fresh, "SET default_transaction_read_only = off")
	refused(t, fresh, "42501", grow2MB(l))
}

// TestFinding5_TenantCannotBlockItsPurge: a database tenant cannot make its
// database a template (nor close it to connections); a schema tenant's
// large objects and default privileges do not survive, nor stop, its purge.
func TestFinding5_TenantCannotBlockItsPurge(t *testing.T) {
	e := start(t, nil)
	db := e.tenant(t, "database", "default")
	conn := connect(t, db.DSN)
	for _, s := range []string{"IS_TEMPLATE true", "ALLOW_CONNECTIONS false", "CONNECTION LIMIT 0"} {
		refused(t, conn, "42501", "ALTER DATABASE "+cluster.Ident(db.Database)+" WITH "+s)
	}
	sc := e.tenant(t, "schema", "default")
	conn = connect(t, sc.DSN)
	mustExec(t, conn, `SELECT lo_from_bytea(0, $1::bytea)`, []byte("secret of "+sc.ID))
	mustExec(t, conn, `ALTER DEFAULT PRIVILEGES GRANT SELECT ON TABLES TO PUBLIC`)
	mustExec(t, conn, `ALTER DEFAULT PRIVILEGES IN SCHEMA `+cluster.Ident(sc.Schema)+` GRANT EXECUTE ON FUNCTIONS TO PUBLIC`)
	for _, l := range []login{db, sc} {
		e.purge(t, l.ID, jobs.Succeeded)
		if left := leftBehind(t, l); len(left) > 0 {
			t.Errorf("%s tenant %s: left behind by its purge: %v", l.Mode, l.ID, left)
		}
	}
}

// TestFinding6_NeighbourLocksCannotStallRollout: a schema tenant holding the
// advisory lock a rollout used to take in the shared database (both keys
// of its victim) neither fails nor blocks its neighbour's migration, with
// transactional and NO TRANSACTION files.
func TestFinding6_NeighbourLocksCannotStallRollout(t *testing.T) {
	e := start(t, nil)
	attacker := e.tenant(t, "schema", "default")
	victim := e.tenant(t, "schema", "default")
	conn := connect(t, attacker.DSN)
	// The key the rollout's per-tenant lock had in the shared database: "pgt\x03", hashtext(id).
	mustExec(t, conn, `SELECT pg_advisory_lock($1, hashtext($2))`, 0x70677403, victim.ID)
	mustExec(t, conn, `SELECT pg_advisory_lock($1, hashtext($2))`, 0x70677403, attacker.ID)
	e.pushVersion(t, templates.Upload{Name: "0002_col.sql", Body: `ALTER TABLE organizations ADD COLUMN note text;`})
	v := e.pushVersion(t, templates.Upload{Name: "0003_index.sql", Body: "-- +goose NO TRANSACTION\n-- +goose Up\n" +
		"CREATE INDEX CONCURRENTLY IF NOT EXISTS organizations_note ON organizations (note);"})
	st := e.rollout(t, v)
	for _, l := range []login{victim, attacker} {
		if o := tenantOutcome(st, l.ID); o.State != catalog.RolloutTenantDone || o.Version != v {
			t.Errorf("tenant %s: rollout state %q at version %d (%s), want done at %d", l.ID, o.State, o.Version, o.Error, v)
		}
	}
}

// TestFinding7_ConnectionAdmission: tenants are admitted on a cluster only
// while their connection limits fit its connections (no overcommit): the
// one that would not fit is refused with a clear error, and every admitted
// tenant can open its whole limit while its neighbours hold theirs.
func TestFinding7_ConnectionAdmission(t *testing.T) {
	// 100 connections − 3 superuser-reserved − 20 reserved − 4 for rollouts:
	// 73, two tenants of 30.
	e := start(t, func(c *config.Config) {
		c.Provision.ConnectionOvercommit = 1
		c.Provision.ReservedConnections = 20
		c.Tiers["thirty"] = config.Tier{ConnectionLimit: 30}
	})
	ctx := pgtest.Context(t)
	a := e.tenant(t, "schema", "thirty")
	b := e.tenant(t, "database", "thirty")
	_, err := e.c.CreateTenant(ctx, provision.Request{Template: "saas", Mode: "schema", Tier: "thirty"})
	var apiErr *api.Error
	if !errors.As(err, &apiErr) || apiErr.Status != 503 || apiErr.Code != "no_capacity" || !strings.Contains(apiErr.Message, "connection_overcommit") {
		t.Fatalf("third tenant of 30 connections: err = %v, want 503 no_capacity naming provision.connection_overcommit", err)
	}
	for _, l := range []login{a, b} {
		for i := range 30 {
			cctx, cancel := context.WithTimeout(ctx, 10*time.Second)
			conn, err := pgx.Connect(cctx, l.DSN)
			cancel()
			if err != nil {
				t.Fatalf("tenant %s, connection %d of its 30: %v", l.ID, i+1, err)
			}
			t.Cleanup(func() { conn.Close(context.Background()) })
		}
	}
	// The control plane still gets in.
	if _, err := e.c.Tenant(ctx, a.ID); err != nil {
		t.Errorf("API with every tenant connection open: %v", err)
	}
}

// TestFinding8_SessionsEndOnStandbys: suspend and drop end a tenant's
// sessions on the standby too, and its new logins there are refused.
func TestFinding8_SessionsEndOnStandbys(t *testing.T) {
	e := start(t, nil)
	ctx := pgtest.Context(t)
	for _, action := range []string{"suspend", "drop"} {
		l := e.tenant(t, "database", "default")
		standby := srv.OnStandby(t, l.DSN)
		var conn *pgx.Conn
		for deadline := time.Now().Add(30 * time.Second); ; { // the role reaches the standby by replication
			c, err := pgx.Connect(ctx, standby)
			if err == nil {
				conn = c
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("%s: tenant cannot log in on the standby: %v", action, err)
			}
			time.Sleep(100 * time.Millisecond)
		}
		t.Cleanup(func() { conn.Close(context.Background()) })
		mustExec(t, conn, `SELECT count(*) FROM organizations`)
		var err error
		if action == "suspend" {
			_, err = e.c.TenantAction(ctx, l.ID, "suspend")
		} else {
			_, err = e.c.DropTenant(ctx, l.ID, false)
		}
		if err != nil {
			t.Fatal(err)
		}
		if _, err := conn.Exec(ctx, `SELECT 1`); err == nil {
			t.Errorf("%s: the tenant's session on the standby still runs queries", action)
		}
		if c, err := pgx.Connect(ctx, standby); err == nil {
			c.Close(ctx)
			t.Errorf("%s: the tenant can still log in on the standby", action)
		}
	}
}

// TestFinding9_LockedTenantStalesOnlyItsOwnMetrics: a schema tenant holding
// ACCESS EXCLUSIVE on its table makes its own size stale; the metrics pass
// succeeds and its neighbour's size is measured.
func TestFinding9_LockedTenantStalesOnlyItsOwnMetrics(t *testing.T) {
	e := start(t, nil)
	ctx := pgtest.Context(t)
	locker := e.tenant(t, "schema", "default")
	neighbour := e.tenant(t, "schema", "default")
	conn := connect(t, locker.DSN)
	mustExec(t, conn, `BEGIN`)
	mustExec(t, conn, `LOCK TABLE organizations IN ACCESS EXCLUSIVE MODE`)

	col, _ := e.collector(t)
	pctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	if err := col.Pass(pctx, srv.Name()); err != nil {
		t.Fatalf("metrics pass with a tenant holding ACCESS EXCLUSIVE: %v", err)
	}
	if f, err := col.Tenant(neighbour.ID); err != nil || f.SizeBytes == nil || *f.SizeBytes == 0 {
		t.Errorf("neighbour's size not measured: %+v, %v", f, err)
	}
	mustExec(t, conn, `ROLLBACK`)
}

// TestFinding10_PurgeStopsAtAnotherTenantsRowTypes: the purge finds a
// schema's objects through pg_depend (what depends on the schema, then what
// those own), so B borrows what only that second step reaches: the row
// type of A's table and its array type, and a foreign key to A's primary
// key index. Purging A stops naming each, B's rows intact.
func TestFinding10_PurgeStopsAtAnotherTenantsRowTypes(t *testing.T) {
	e := start(t, nil)
	ctx := pgtest.Context(t)
	a := e.tenant(t, "schema", "default")
	b := e.tenant(t, "schema", "default")
	ca, cb := connect(t, a.DSN), connect(t, b.DSN)
	mustExec(t, ca, `GRANT USAGE ON SCHEMA `+cluster.Ident(a.Schema)+` TO `+cluster.Ident(b.Role))
	mustExec(t, ca, `GRANT REFERENCES ON organizations TO `+cluster.Ident(b.Role))
	sa := cluster.Ident(a.Schema)
	mustExec(t, cb, `CREATE TABLE snapshot (id int, org `+sa+`.organizations, orgs `+sa+`.organizations[])`)
	mustExec(t, cb, `CREATE TABLE pinned (org bigint REFERENCES `+sa+`.organizations (id))`)
	mustExec(t, cb, `INSERT INTO snapshot (id) VALUES (1)`)

	j := e.purge(t, a.ID, jobs.Failed)
	for _, want := range []string{"column org of table " + b.Schema + ".snapshot", "column orgs of table " + b.Schema + ".snapshot",
		"on table " + b.Schema + ".pinned"} {
		if !strings.Contains(j.LastError, want) {
			t.Errorf("purge error does not name %q: %s", want, j.LastError)
		}
	}
	var n int
	if err := cb.QueryRow(ctx, `SELECT count(*) FROM snapshot`).Scan(&n); err != nil || n != 1 {
		t.Fatalf("B's rows after A's refused purge: %d, %v", n, err)
	}
	if left := leftBehind(t, a); len(left) == 0 {
		t.Error("A's refused purge left nothing: it dropped A's objects although B's depend on them")
	}
	neighbourWorks(t, b)
}

// TestFinding10_PurgeStopsAtAnotherTenantsObjects: B uses A's enum type in a
// column (A granted it USAGE); purging A stops with B's column named and
// B's data intact; once B's column is gone, the purge, retried, finishes.
func TestFinding10_PurgeStopsAtAnotherTenantsObjects(t *testing.T) {
	e := start(t, nil)
	ctx := pgtest.Context(t)
	a := e.tenant(t, "schema", "default")
	b := e.tenant(t, "schema", "default")
	ca, cb := connect(t, a.DSN), connect(t, b.DSN)
	mustExec(t, ca, `GRANT USAGE ON SCHEMA `+cluster.Ident(a.Schema)+` TO `+cluster.Ident(b.Role))
	mustExec(t, cb, `CREATE TABLE borrowed (id int, tier `+cluster.Ident(a.Schema)+`.plan_tier)`)
	mustExec(t, cb, `INSERT INTO borrowed VALUES (1, 'pro')`)

	j := e.purge(t, a.ID, jobs.Failed)
	if !strings.Contains(j.LastError, "column tier of table "+b.Schema+".borrowed") {
		t.Errorf("purge error does not name the dependent column: %s", j.LastError)
	}
	var tier string
	if err := cb.QueryRow(ctx, `SELECT tier::text FROM borrowed WHERE id = 1`).Scan(&tier); err != nil || tier != "pro" {
		t.Fatalf("B's column after A's refused purge: %q, %v", tier, err)
	}
	mustExec(t, cb, `ALTER TABLE borrowed DROP COLUMN tier`)
	if _, err := e.c.RetryJob(ctx, j.ID); err != nil {
		t.Fatal(err)
	}
	waitJob(t, e.c, j.ID, jobs.Succeeded)
	if left := leftBehind(t, a); len(left) > 0 {
		t.Errorf("left behind by the purge: %v", left)
	}
	neighbourWorks(t, b)
}
