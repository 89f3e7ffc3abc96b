package migrate_test

import (
	"bytes"
	"context"
	"errors"
	"io"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pgtenant/pgtenant/internal/api"
	"github.com/pgtenant/pgtenant/internal/catalog"
	"github.com/pgtenant/pgtenant/internal/cli"
	"github.com/pgtenant/pgtenant/internal/config"
	"github.com/pgtenant/pgtenant/internal/daemon/daemontest"
	"github.com/pgtenant/pgtenant/internal/jobs"
	"github.com/pgtenant/pgtenant/internal/migrate"
	"github.com/pgtenant/pgtenant/internal/pgtest"
	"github.com/pgtenant/pgtenant/internal/provision"
	"github.com/pgtenant/pgtenant/internal/templates"
	"github.com/pgtenant/pgtenant/internal/tenant"
)

var pg *pgtest.Cluster

// A standby, so that the rollout's pacer really reads replay lag; the
// default max_locks_per_transaction, which a tenant's migration must fit.
func TestMain(m *testing.M) {
	pgtest.Main(m, pgtest.Options{Standbys: 1, Settings: map[string]string{"max_locks_per_transaction": "64"}}, &pg)
}

type env struct {
	d   func() // stops the daemon (StartCancellable)
	c   *api.Client
	cfg config.Config
	cat *pgx.Conn // the test's own connection to the catalog
}

// start runs a daemon with no spare pools (tenants come from the cold path)
// and quick rollout retries.
func start(t *testing.T, mutate func(*config.Config)) env {
	t.Helper()
	cfg := daemontest.Config(t, pg)
	cfg.Provision.DefaultPoolSize = 0
	cfg.Migrate.RetryBackoff = config.Duration(50 * time.Millisecond)
	if mutate != nil {
		mutate(&cfg)
	}
	c, stop := daemontest.StartCancellable(t, pg, cfg)
	return env{d: stop, c: c, cfg: cfg, cat: daemontest.CatalogConn(t, pg, cfg)}
}

// v1 is the first version of every test template: a table with two rows.
var v1 = templates.Upload{Name: "0001_init.sql", Body: `CREATE TABLE accounts (id int PRIMARY KEY, balance int NOT NULL);
INSERT INTO accounts VALUES (1, 10), (2, 20);`}

// upload creates (first) or pushes a version made of files, and waits
// until it is materialised.
func (e env) upload(t *testing.T, name string, files ...templates.Upload) {
	t.Helper()
	ctx := pgtest.Context(t)
	add := e.c.PushTemplate
	if len(files) == 1 {
		add = e.c.CreateTemplate
	}
	added, err := add(ctx, name, files)
	if err != nil {
		t.Fatal(err)
	}
	for _, j := range added.BuildJobs {
		if j, err := e.c.WaitJob(ctx, j.ID, nil); err != nil || j.State != jobs.Succeeded {
			t.Fatalf("build of %s v%d: %v %s %s", name, added.Version, err, j.State, j.LastError)
		}
	}
}

func (e env) tenant(t *testing.T, template, mode string) catalog.Tenant {
	t.Helper()
	r, err := e.c.CreateTenant(pgtest.Context(t), provision.Request{Template: template, Mode: tenant.Mode(mode)})
	if err != nil {
		t.Fatal(err)
	}
	if r.Tenant.State != catalog.StateActive {
		t.Fatalf("tenant %+v not active", r.Tenant)
	}
	return r.Tenant.Tenant
}

// tenants makes n tenants of each mode.
func (e env) tenants(t *testing.T, template string, databases, schemas int) []catalog.Tenant {
	var out []catalog.Tenant
	for range databases {
		out = append(out, e.tenant(t, template, "database"))
	}
	for range schemas {
		out = append(out, e.tenant(t, template, "schema"))
	}
	return out
}

func (e env) rollout(t *testing.T, req migrate.Request) migrate.Status {
	t.Helper()
	out, err := e.c.StartRollout(pgtest.Context(t), req)
	if err != nil {
		t.Fatal(err)
	}
	if out.Rollout == nil {
		t.Fatalf("rollout %+v: no rollout started", req)
	}
	return *out.Rollout
}

// wait waits until a rollout's job is finished or paused and returns the
// rollout with every tenant.
func (e env) wait(t *testing.T, id int64) migrate.Status {
	t.Helper()
	ctx := pgtest.Context(t)
	st, err := e.c.Rollout(ctx, id, nil)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := e.c.WaitJob(ctx, st.JobID, nil); err != nil {
		t.Fatal(err)
	}
	st, err = e.c.Rollout(ctx, id, url.Values{"state": {"all"}})
	if err != nil {
		t.Fatal(err)
	}
	return st
}

// catalogVersion is a tenant's version in the catalog.
func (e env) catalogVersion(t *testing.T, id string) int {
	t.Helper()
	var v int
	if err := e.cat.QueryRow(pgtest.Context(t), `SELECT version FROM tenants WHERE id = $1`, id).Scan(&v); err != nil {
		t.Fatal(err)
	}
	return v
}

// inTenant runs f on a superuser connection to a tenant's database with the
// tenant's schema first on the search path.
func inTenant(t *testing.T, tn catalog.Tenant, f func(conn *pgx.Conn)) {
	t.Helper()
	conn := pg.Conn(t, tn.Database)
	if tn.Mode == tenant.ModeSchema {
		if _, err := conn.Exec(pgtest.Context(t), "SET search_path = t_"+tn.ID); err != nil {
			t.Fatal(err)
		}
	}
	f(conn)
	conn.Close(context.Background())
}

// marker is the comment that records a tenant's version inside it.
func marker(t *testing.T, tn catalog.Tenant) string {
	t.Helper()
	var m *string
	inTenant(t, tn, func(conn *pgx.Conn) {
		q := `SELECT obj_description(oid, 'pg_namespace') FROM pg_namespace WHERE nspname = 'pgtenant'`
		if tn.Mode == tenant.ModeSchema {
			q = `SELECT obj_description(oid, 'pg_namespace') FROM pg_namespace WHERE nspname = 't_` + tn.ID + `'`
		}
		if err := conn.QueryRow(pgtest.Context(t), q).Scan(&m); err != nil {
			t.Fatal(err)
		}
	})
	if m == nil {
		return ""
	}
	return *m
}

func byTenant(st migrate.Status) map[string]catalog.RolloutTenant {
	out := map[string]catalog.RolloutTenant{}
	for _, rt := range st.Tenants {
		out[rt.Tenant] = rt
	}
	return out
}

// TestRollout_BothModes: a dry run changes nothing; a rollout over two
// versions (one with a NO TRANSACTION file) moves database and schema
// tenants, active, suspended and dropped, with their markers, the catalog,
// template show, /metrics and the reconciler agreeing; a second rollout has
// nothing to do and connects to no tenant.
func TestRollout_BothModes(t *testing.T) {
	e := start(t, nil)
	ctx := pgtest.Context(t)
	e.upload(t, "mig_both", v1)
	ts := e.tenants(t, "mig_both", 2, 3)
	if _, err := e.c.TenantAction(ctx, ts[4].ID, "suspend"); err != nil {
		t.Fatal(err)
	}
	if _, err := e.c.DropTenant(ctx, ts[1].ID, false); err != nil {
		t.Fatal(err)
	}
	v2 := templates.Upload{Name: "0002_note.sql", Body: `ALTER TABLE accounts ADD COLUMN note text NOT NULL DEFAULT 'none';
CREATE TABLE events (id bigserial PRIMARY KEY, account_id int NOT NULL REFERENCES accounts (id), at timestamptz NOT NULL DEFAULT now());
CREATE INDEX events_account ON events (account_id);`}
	v3 := templates.Upload{Name: "0003_index.sql", Body: `-- +goose NO TRANSACTION
-- +goose Up
CREATE INDEX CONCURRENTLY IF NOT EXISTS accounts_note ON accounts (note);`}
	e.upload(t, "mig_both", v1, v2)
	e.upload(t, "mig_both", v1, v2, v3)

	// Bad requests.
	for _, tc := range []struct {
		req    migrate.Request
		status int
	}{
		{migrate.Request{Template: "mig_both", To: 9}, http.StatusBadRequest},
		{migrate.Request{Template: "nope"}, http.StatusNotFound},
		{migrate.Request{Template: "mig_both", Cluster: "elsewhere"}, http.StatusNotFound},
		{migrate.Request{Template: "mig_both", Parallel: -1}, http.StatusBadRequest},
	} {
		_, err := e.c.StartRollout(ctx, tc.req)
		var apiErr *api.Error
		if !errors.As(err, &apiErr) || apiErr.Status != tc.status {
			t.Errorf("rollout %+v: %v, want %d", tc.req, err, tc.status)
		}
	}

	dry, err := e.c.StartRollout(ctx, migrate.Request{Template: "mig_both", DryRun: true})
	if err != nil {
		t.Fatal(err)
	}
	p := dry.Plan
	if dry.Rollout != nil || p.To != 3 || p.Tenants != 5 || p.ByVersion["1"] != 5 || len(p.Versions) != 2 ||
		len(p.Versions[1].NoTransaction) != 1 || p.AlreadyAtTarget != 0 {
		t.Fatalf("dry run = %+v, want 5 tenants from v1 to v3 through two versions, v3 outside a transaction, no rollout", dry)
	}
	var rollouts int
	if err := e.cat.QueryRow(ctx, `SELECT (SELECT count(*) FROM rollouts) + (SELECT count(*) FROM jobs WHERE type = $1)`, jobs.Rollout).Scan(&rollouts); err != nil || rollouts != 0 {
		t.Errorf("after a dry run: %d rollouts and rollout jobs, %v; want none", rollouts, err)
	}
	for _, tn := range ts {
		if got := marker(t, tn); got != "pgtenant: built from version 1" {
			t.Errorf("tenant %s (%s) marker before = %q", tn.ID, tn.Mode, got)
		}
	}

	st := e.wait(t, e.rollout(t, migrate.Request{Template: "mig_both"}).ID)
	if st.State != catalog.RolloutSucceeded || st.Counts[catalog.RolloutTenantDone] != 5 || st.Total != 5 {
		t.Fatalf("rollout = %s %+v (%s), want succeeded with 5 done", st.State, st.Counts, st.Error)
	}
	for _, tn := range ts {
		if v := e.catalogVersion(t, tn.ID); v != 3 {
			t.Errorf("tenant %s catalog version %d, want 3", tn.ID, v)
		}
		if got, want := marker(t, tn), "pgtenant: built from version 1, at version 3"; got != want {
			t.Errorf("tenant %s (%s) marker = %q, want %q", tn.ID, tn.Mode, got, want)
		}
		inTenant(t, tn, func(conn *pgx.Conn) {
			var note, owner string
			var valid bool
			err := conn.QueryRow(ctx, `SELECT (SELECT note FROM accounts WHERE id = 1), pg_get_userbyid(relowner),
				(SELECT indisvalid FROM pg_index WHERE indexrelid = 'accounts_note'::regclass)
				FROM pg_class WHERE oid = 'events'::regclass`).Scan(&note, &owner, &valid)
			if err != nil || note != "none" || owner != "t_"+tn.ID || !valid {
				t.Errorf("tenant %s (%s): note %q, events owned by %q, index valid %v, %v", tn.ID, tn.Mode, note, owner, valid, err)
			}
		})
	}
	shown, err := e.c.Tenant(ctx, ts[0].ID)
	if err != nil {
		t.Fatal(err)
	}
	if ev := shown.Events[len(shown.Events)-1]; ev.Kind != "migrated" {
		t.Errorf("last event of %s = %s %s, want migrated", ts[0].ID, ev.Kind, ev.Detail)
	}
	d, err := e.c.Template(ctx, "mig_both")
	if err != nil {
		t.Fatal(err)
	}
	if d.Tenants["3"] != 5 || len(d.Tenants) != 1 {
		t.Errorf("template show tenants_by_version = %v, want 5 at v3", d.Tenants)
	}
	resp, err := http.Get(e.c.BaseURL + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if want := `pgtenant_template_tenants{template="mig_both",version="3"} 5`; !strings.Contains(string(body), want) {
		t.Errorf("/metrics lacks %s", want)
	}
	rep, err := e.c.Reconcile(ctx, api.ReconcileRequest{})
	if err != nil {
		t.Fatal(err)
	}
	if len(rep.Findings) != 0 {
		t.Errorf("reconcile after the rollout: %+v, want no findings", rep.Findings)
	}

	// Nothing left to do: the rollout plans no tenant (every one is at the
	// target already, by the catalog) and succeeds without a tenant row.
	again := e.wait(t, e.rollout(t, migrate.Request{Template: "mig_both", To: 3}).ID)
	if again.State != catalog.RolloutSucceeded || again.Total != 0 || again.AlreadyAtTarget != 5 || len(again.Tenants) != 0 {
		t.Errorf("second rollout = %s total %d at target %d, tenants %+v; want succeeded with nothing to do and 5 at target",
			again.State, again.Total, again.AlreadyAtTarget, again.Tenants)
	}
	// The template has moved: a new tenant starts at v3.
	if tn := e.tenant(t, "mig_both", "schema"); tn.Version != 3 {
		t.Errorf("tenant created after the rollout is at v%d, want 3", tn.Version)
	}
	if _, err := e.c.ContinueRollout(ctx, again.ID); !errors.Is(err, catalog.ErrConflict) {
		t.Errorf("continue a finished rollout: %v, want conflict", err)
	}
	if _, err := e.c.Rollout(ctx, 999999, nil); !errors.Is(err, catalog.ErrNotFound) {
		t.Errorf("show unknown rollout: %v, want not found", err)
	}
}

// TestRollout_FailingTenantRolledBack_RetryAfterFix: a tenant whose data
// violates the new version's constraint is rolled back (nothing of the
// version is left in it) and reported while the others are migrated; once
// its data is fixed, `rollout retry` migrates it.
func TestRollout_FailingTenantRolledBack_RetryAfterFix(t *testing.T) {
	e := start(t, nil)
	ctx := pgtest.Context(t)
	e.upload(t, "mig_fail", v1)
	ts := e.tenants(t, "mig_fail", 2, 2)
	bad := ts[2] // a schema tenant
	inTenant(t, bad, func(conn *pgx.Conn) {
		if _, err := conn.Exec(ctx, `INSERT INTO accounts VALUES (3, -5)`); err != nil {
			t.Fatal(err)
		}
	})
	e.upload(t, "mig_fail", v1, templates.Upload{Name: "0002_check.sql", Body: `CREATE TABLE audit (id int);
ALTER TABLE accounts ADD CONSTRAINT balance_positive CHECK (balance >= 0);`})

	st := e.wait(t, e.rollout(t, migrate.Request{Template: "mig_fail"}).ID)
	if st.State != catalog.RolloutFailed || st.Counts[catalog.RolloutTenantDone] != 3 || st.Counts[catalog.RolloutTenantFailed] != 1 {
		t.Fatalf("rollout = %s %+v, want failed with 3 done and 1 failed", st.State, st.Counts)
	}
	rt := byTenant(st)[bad.ID]
	if rt.State != catalog.RolloutTenantFailed || !strings.Contains(rt.Error, "balance_positive") || rt.Version != 1 {
		t.Errorf("bad tenant in the rollout = %+v, want failed at v1 naming the constraint", rt)
	}
	if !strings.Contains(st.Error, "1 of 4") {
		t.Errorf("rollout error = %q, want it to count the failed tenant", st.Error)
	}
	if v := e.catalogVersion(t, bad.ID); v != 1 {
		t.Errorf("bad tenant catalog version = %d, want 1", v)
	}
	if got := marker(t, bad); got != "pgtenant: built from version 1" {
		t.Errorf("bad tenant marker = %q, want unchanged", got)
	}
	inTenant(t, bad, func(conn *pgx.Conn) {
		var audit *string
		if err := conn.QueryRow(ctx, `SELECT to_regclass('audit')::text`).Scan(&audit); err != nil || audit != nil {
			t.Errorf("bad tenant has table audit (%v, %v): its failed version was not rolled back", audit, err)
		}
	})
	for _, tn := range ts {
		if tn.ID != bad.ID && e.catalogVersion(t, tn.ID) != 2 {
			t.Errorf("good tenant %s not at v2", tn.ID)
		}
	}

	inTenant(t, bad, func(conn *pgx.Conn) {
		if _, err := conn.Exec(ctx, `UPDATE accounts SET balance = 0 WHERE balance < 0`); err != nil {
			t.Fatal(err)
		}
	})
	retried, err := e.c.RetryRollout(ctx, st.ID, bad.ID)
	if err != nil {
		t.Fatal(err)
	}
	// The retried rollout shows its old failure no more (its job may have
	// run on already: any state but the failure it had).
	if retried.Error != "" || retried.Job == nil || strings.Contains(retried.Job.ProgressMsg, "rollout retry") {
		t.Errorf("rollout after retry: error %q, job %+v; want the old failure gone", retried.Error, retried.Job)
	}
	st = e.wait(t, st.ID)
	if st.State != catalog.RolloutSucceeded || st.Counts[catalog.RolloutTenantDone] != 4 {
		t.Fatalf("after retry: %s %+v (%s), want succeeded with 4 done", st.State, st.Counts, st.Error)
	}
	if v := e.catalogVersion(t, bad.ID); v != 2 {
		t.Errorf("fixed tenant catalog version = %d, want 2", v)
	}
	if _, err := e.c.RetryRollout(ctx, st.ID, ""); !errors.Is(err, catalog.ErrConflict) {
		t.Errorf("retry a succeeded rollout: %v, want conflict", err)
	}
}

// TestRollout_KilledMidwayResumes: a daemon stopped in the middle of a
// rollout leaves some tenants migrated; another daemon on the same catalog
// resumes, and no tenant gets the version twice, not even one whose
// catalog row was lost after it committed (the marker guard).
func TestRollout_KilledMidwayResumes(t *testing.T) {
	e := start(t, nil)
	ctx := pgtest.Context(t)
	e.upload(t, "mig_kill", v1)
	ts := e.tenants(t, "mig_kill", 2, 10)
	// Each application inserts a row: a second one would show.
	e.upload(t, "mig_kill", v1, templates.Upload{Name: "0002_once.sql", Body: `CREATE TABLE applied (n int);
INSERT INTO applied VALUES (1);
SELECT pg_sleep(0.2);`})
	st := e.rollout(t, migrate.Request{Template: "mig_kill", Parallel: 2})
	done := 0
	for done < 3 {
		if err := e.cat.QueryRow(ctx, `SELECT count(*) FROM rollout_tenants WHERE rollout = $1 AND state = 'done'`, st.ID).Scan(&done); err != nil {
			t.Fatal(err)
		}
		time.Sleep(20 * time.Millisecond)
	}
	e.d() // stop the daemon: in-flight tenants roll back
	if err := e.cat.QueryRow(ctx, `SELECT count(*) FROM rollout_tenants WHERE rollout = $1 AND state = 'done'`, st.ID).Scan(&done); err != nil {
		t.Fatal(err)
	}
	if done >= len(ts) {
		t.Fatalf("all %d tenants done before the stop: the test did not interrupt the rollout", done)
	}
	// The crash window: a tenant that committed its version, whose catalog
	// rows were not written.
	var lost string
	if err := e.cat.QueryRow(ctx, `UPDATE rollout_tenants SET state = 'running', version = 1
		WHERE (rollout, tenant) = (SELECT rollout, tenant FROM rollout_tenants WHERE rollout = $1 AND state = 'done' LIMIT 1)
		RETURNING tenant`, st.ID).Scan(&lost); err != nil {
		t.Fatal(err)
	}
	if _, err := e.cat.Exec(ctx, `UPDATE tenants SET version = 1 WHERE id = $1`, lost); err != nil {
		t.Fatal(err)
	}
	t.Logf("stopped with %d of %d tenants done; tenant %s's catalog rows rolled back", done, len(ts), lost)

	c2, _ := daemontest.StartCancellable(t, pg, e.cfg) // the same catalog
	e.c = c2
	final := e.wait(t, st.ID)
	if final.State != catalog.RolloutSucceeded || final.Counts[catalog.RolloutTenantDone] != len(ts) {
		t.Fatalf("resumed rollout = %s %+v (%s), want succeeded with all done", final.State, final.Counts, final.Error)
	}
	for _, tn := range ts {
		inTenant(t, tn, func(conn *pgx.Conn) {
			var n int
			if err := conn.QueryRow(ctx, `SELECT count(*) FROM applied`).Scan(&n); err != nil || n != 1 {
				t.Errorf("tenant %s (%s): version applied %d times (%v), want once", tn.ID, tn.Mode, n, err)
			}
		})
		if got := marker(t, tn); got != "pgtenant: built from version 1, at version 2" {
			t.Errorf("tenant %s marker = %q", tn.ID, got)
		}
		if v := e.catalogVersion(t, tn.ID); v != 2 {
			t.Errorf("tenant %s catalog version %d, want 2", tn.ID, v)
		}
	}
}

// TestRollout_CanaryAndTenantsCreatedDuring: with a canary the rollout
// pauses after it until continued; a tenant created before the target was
// materialised (at the old version) is swept into the rollout, one created
// during the pause starts at the new version; a second rollout of the
// template is refused while this one is unfinished.
func TestRollout_CanaryAndTenantsCreatedDuring(t *testing.T) {
	e := start(t, nil)
	ctx := pgtest.Context(t)
	e.upload(t, "mig_canary", v1)
	ts := e.tenants(t, "mig_canary", 0, 4)
	// The template build of v2 takes 3 s (only the build: pgt_build_<job>),
	// long enough to create a tenant at v1 after the rollout has started.
	added, err := e.c.PushTemplate(ctx, "mig_canary", []templates.Upload{v1, {Name: "0002_slow_build.sql", Body: `-- +goose StatementBegin
DO $$ BEGIN IF current_database() LIKE 'pgt\_build\_%' THEN PERFORM pg_sleep(3); END IF; END $$;
-- +goose StatementEnd
ALTER TABLE accounts ADD COLUMN note text;`}})
	if err != nil {
		t.Fatal(err)
	}
	st := e.rollout(t, migrate.Request{Template: "mig_canary", Canary: 2})
	early := e.tenant(t, "mig_canary", "schema")
	if early.Version != 1 {
		t.Fatalf("tenant created while v2 is being built is at v%d, want 1 (the build was too quick for the test)", early.Version)
	}
	for _, j := range added.BuildJobs {
		if j, err := e.c.WaitJob(ctx, j.ID, nil); err != nil || j.State != jobs.Succeeded {
			t.Fatalf("build: %v %s", err, j.LastError)
		}
	}
	paused := e.wait(t, st.ID)
	if paused.State != catalog.RolloutPaused || paused.Counts[catalog.RolloutTenantDone] != 2 {
		t.Fatalf("rollout = %s %+v, want paused after 2 done", paused.State, paused.Counts)
	}
	if _, err := e.c.StartRollout(ctx, migrate.Request{Template: "mig_canary"}); !errors.Is(err, catalog.ErrConflict) {
		t.Errorf("a second rollout while one is paused: %v, want conflict", err)
	}
	during := e.tenant(t, "mig_canary", "schema")
	if during.Version != 2 {
		t.Errorf("tenant created during the rollout is at v%d, want 2", during.Version)
	}
	if _, err := e.c.ContinueRollout(ctx, st.ID); err != nil {
		t.Fatal(err)
	}
	final := e.wait(t, st.ID)
	if final.State != catalog.RolloutSucceeded {
		t.Fatalf("after continue: %s %+v (%s), want succeeded", final.State, final.Counts, final.Error)
	}
	if rt, ok := byTenant(final)[early.ID]; !ok || rt.State != catalog.RolloutTenantDone || rt.FromVersion != 1 {
		t.Errorf("tenant created at v1 during the rollout: %+v (listed %v), want swept in and done", rt, ok)
	}
	if _, ok := byTenant(final)[during.ID]; ok {
		t.Errorf("tenant created at v2 was migrated")
	}
	for _, tn := range append(ts, early, during) {
		if v := e.catalogVersion(t, tn.ID); v != 2 {
			t.Errorf("tenant %s at v%d, want 2", tn.ID, v)
		}
	}
}

// TestRollout_LockTimeoutRetried: a tenant whose table is locked by a long
// transaction is retried after short lock timeouts instead of queueing its
// own traffic behind the migration's lock, and succeeds once the lock is gone.
func TestRollout_LockTimeoutRetried(t *testing.T) {
	e := start(t, func(c *config.Config) {
		c.Migrate.LockTimeout = config.Duration(100 * time.Millisecond)
		c.Migrate.RetryBackoff = config.Duration(100 * time.Millisecond)
	})
	ctx := pgtest.Context(t)
	e.upload(t, "mig_lock", v1)
	busy := e.tenant(t, "mig_lock", "schema")
	e.upload(t, "mig_lock", v1, templates.Upload{Name: "0002_col.sql", Body: `ALTER TABLE accounts ADD COLUMN note text;`})

	holder := pg.Conn(t, busy.Database)
	if _, err := holder.Exec(ctx, `BEGIN; LOCK TABLE t_`+busy.ID+`.accounts IN ACCESS SHARE MODE`); err != nil {
		t.Fatal(err)
	}
	// The tenant's own traffic: reads that would queue behind a waiting ALTER TABLE.
	stop := make(chan struct{})
	var wg sync.WaitGroup
	var worst time.Duration
	conn := pg.Conn(t, busy.Database)
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			select {
			case <-stop:
				return
			case <-time.After(10 * time.Millisecond):
			}
			start := time.Now()
			if _, err := conn.Exec(ctx, `SELECT count(*) FROM t_`+busy.ID+`.accounts`); err != nil {
				t.Error(err)
				return
			}
			worst = max(worst, time.Since(start))
		}
	}()
	st := e.rollout(t, migrate.Request{Template: "mig_lock"})
	time.Sleep(time.Second)
	if _, err := holder.Exec(ctx, `COMMIT`); err != nil {
		t.Fatal(err)
	}
	final := e.wait(t, st.ID)
	close(stop)
	wg.Wait()
	rt := byTenant(final)[busy.ID]
	if final.State != catalog.RolloutSucceeded || rt.State != catalog.RolloutTenantDone || rt.Attempts < 2 {
		t.Fatalf("rollout = %s, tenant %+v; want done after several attempts", final.State, rt)
	}
	if worst > 700*time.Millisecond {
		t.Errorf("the tenant's reads waited up to %s behind the migration, want about lock_timeout (100ms)", worst)
	}
	t.Logf("tenant migrated after %d attempts; its reads waited at most %s", rt.Attempts, worst)
}

// TestRollout_CanaryAutoContinue: with migrate.canary_auto_continue, a
// canary whose tenants all succeeded lets the rollout go on by itself.
func TestRollout_CanaryAutoContinue(t *testing.T) {
	e := start(t, func(c *config.Config) { c.Migrate.CanaryAutoContinue = true })
	e.upload(t, "mig_auto", v1)
	ts := e.tenants(t, "mig_auto", 0, 3)
	e.upload(t, "mig_auto", v1, templates.Upload{Name: "0002_col.sql", Body: `ALTER TABLE accounts ADD COLUMN note text;`})
	st := e.wait(t, e.rollout(t, migrate.Request{Template: "mig_auto", Canary: 1}).ID)
	if st.State != catalog.RolloutSucceeded || st.Counts[catalog.RolloutTenantDone] != len(ts) || !st.CanaryPassed {
		t.Fatalf("rollout = %s %+v canary passed %v, want succeeded without a pause", st.State, st.Counts, st.CanaryPassed)
	}
}

// TestRollout_CanaryShowsItsTenants: a rollout paused after its canary
// names the canary's tenants, with how each ended, in its job's message,
// in `rollout show` (its done tenants included, which the default listing
// leaves out) and in its JSON; its canary passed when every one of them was
// migrated, and not when one failed; a tenant migrated at its first attempt
// shows one attempt.
func TestRollout_CanaryShowsItsTenants(t *testing.T) {
	e := start(t, nil)
	ctx := pgtest.Context(t)
	t.Setenv("PGTENANT_TOKEN", e.c.Token)
	show := func(args ...string) string {
		t.Helper()
		var out bytes.Buffer
		err := cli.Run(ctx, append([]string{"--server", e.c.BaseURL, "rollout", "show"}, args...), &out, &out)
		if err != nil {
			t.Fatalf("rollout show %v: %v\n%s", args, err, out.String())
		}
		return out.String()
	}
	v2 := templates.Upload{Name: "0002_check.sql", Body: `ALTER TABLE accounts ADD CONSTRAINT balance_positive CHECK (balance >= 0);`}

	// A canary that succeeds.
	e.upload(t, "mig_canary_ok", v1)
	ts := e.tenants(t, "mig_canary_ok", 1, 2)
	e.upload(t, "mig_canary_ok", v1, v2)
	id := e.rollout(t, migrate.Request{Template: "mig_canary_ok", Canary: 1}).ID
	e.wait(t, id)
	paused, err := e.c.Rollout(ctx, id, nil) // the default listing: tenants not done
	if err != nil {
		t.Fatal(err)
	}
	if paused.State != catalog.RolloutPaused || paused.Counts[catalog.RolloutTenantDone] != 1 {
		t.Fatalf("rollout = %s %+v, want paused after 1 done", paused.State, paused.Counts)
	}
	if len(paused.CanaryTenants) != 1 {
		t.Fatalf("canary tenants = %+v, want the 1 tenant the canary migrated", paused.CanaryTenants)
	}
	ct := paused.CanaryTenants[0]
	if ct.State != catalog.RolloutTenantDone || ct.Version != 2 || ct.Attempts != 1 || e.catalogVersion(t, ct.Tenant) != 2 {
		t.Errorf("canary tenant = %+v (catalog version %d), want done at v2 after 1 attempt", ct, e.catalogVersion(t, ct.Tenant))
	}
	if paused.CanarySucceeded == nil || !*paused.CanarySucceeded || paused.CanaryPassed {
		t.Errorf("canary succeeded %v, let go on %v; want succeeded, not let go on yet", paused.CanarySucceeded, paused.CanaryPassed)
	}
	if msg := paused.Job.ProgressMsg; !strings.Contains(msg, ct.Tenant+" done") {
		t.Errorf("paused job's message = %q, want it to name canary tenant %s and how it ended", msg, ct.Tenant)
	}
	out := show(strconv.FormatInt(id, 10), "--wait")
	t.Logf("rollout show %d --wait:\n%s", id, out)
	for _, want := range []string{"passed: true (1 done, 0 failed)", "CANARY TENANT", ct.Tenant, "check the canary tenants above"} {
		if !strings.Contains(out, want) {
			t.Errorf("rollout show --wait lacks %q:\n%s", want, out)
		}
	}
	out = show(strconv.FormatInt(id, 10), "-o", "json")
	for _, want := range []string{`"canary_passed": false`, `"canary_succeeded": true`, `"canary_tenants"`} {
		if !strings.Contains(out, want) {
			t.Errorf("rollout show -o json lacks %s:\n%s", want, out)
		}
	}
	if _, err := e.c.ContinueRollout(ctx, id); err != nil {
		t.Fatal(err)
	}
	final := e.wait(t, id)
	if final.State != catalog.RolloutSucceeded || final.Counts[catalog.RolloutTenantDone] != len(ts) {
		t.Fatalf("after continue: %s %+v (%s), want succeeded", final.State, final.Counts, final.Error)
	}
	if final.CanarySucceeded == nil || !*final.CanarySucceeded || !final.CanaryPassed || len(final.CanaryTenants) != 1 || final.CanaryTenants[0].Tenant != ct.Tenant {
		t.Errorf("after continue: canary succeeded %v, let go on %v, tenants %+v; want the same canary, let go on",
			final.CanarySucceeded, final.CanaryPassed, final.CanaryTenants)
	}
	for _, rt := range final.Tenants {
		if rt.Attempts != 1 {
			t.Errorf("tenant %s (%s) migrated at its first attempt shows %d attempts, want 1", rt.Tenant, rt.Mode, rt.Attempts)
		}
	}

	// A canary that fails: the rollout's first tenant (by id) violates the
	// new constraint.
	e.upload(t, "mig_canary_bad", v1)
	bad := slices.MinFunc(e.tenants(t, "mig_canary_bad", 0, 2), func(a, b catalog.Tenant) int { return strings.Compare(a.ID, b.ID) })
	inTenant(t, bad, func(conn *pgx.Conn) {
		if _, err := conn.Exec(ctx, `INSERT INTO accounts VALUES (3, -5)`); err != nil {
			t.Fatal(err)
		}
	})
	e.upload(t, "mig_canary_bad", v1, v2)
	id = e.rollout(t, migrate.Request{Template: "mig_canary_bad", Canary: 1}).ID
	e.wait(t, id)
	paused, err = e.c.Rollout(ctx, id, nil)
	if err != nil {
		t.Fatal(err)
	}
	if paused.State != catalog.RolloutPaused || len(paused.CanaryTenants) != 1 || paused.CanaryTenants[0].Tenant != bad.ID ||
		paused.CanaryTenants[0].State != catalog.RolloutTenantFailed || paused.CanarySucceeded == nil || *paused.CanarySucceeded {
		t.Fatalf("rollout = %s, canary %+v succeeded %v; want paused with tenant %s failed, not succeeded",
			paused.State, paused.CanaryTenants, paused.CanarySucceeded, bad.ID)
	}
	if msg := paused.Job.ProgressMsg; !strings.Contains(msg, bad.ID+" failed: ") || !strings.Contains(msg, "balance_positive") {
		t.Errorf("paused job's message = %q, want it to name failed tenant %s and its error", msg, bad.ID)
	}
	if out := show(strconv.FormatInt(id, 10)); !strings.Contains(out, "passed: false (0 done, 1 failed)") {
		t.Errorf("rollout show lacks the failed canary:\n%s", out)
	}
}
