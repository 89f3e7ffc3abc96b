package templates_test

import (
	"errors"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pgtenant/pgtenant/internal/api"
	"github.com/pgtenant/pgtenant/internal/catalog"
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

// A standby: template deletes and rollouts are paced by its replay lag.
func TestMain(m *testing.M) { pgtest.Main(m, pgtest.Options{Standbys: 1}, &pg) }

type env struct {
	c   *api.Client
	cat *pgx.Conn // the test's own connection to its catalog
}

// start runs a daemon whose pools keep spares spares of each template and mode.
func start(t *testing.T, spares int) env {
	t.Helper()
	cfg := daemontest.Config(t, pg)
	cfg.Provision.DefaultPoolSize = spares
	cfg.Provision.PoolInterval = config.Duration(100 * time.Millisecond)
	cfg.Migrate.RetryBackoff = config.Duration(50 * time.Millisecond)
	_, c := daemontest.Start(t, pg, cfg)
	return env{c: c, cat: daemontest.CatalogConn(t, pg, cfg)}
}

// add creates (push false) or pushes a version and waits for its builds,
// which must end in state.
func (e env) add(t *testing.T, push bool, name string, state jobs.State, files ...templates.Upload) (templates.Added, []jobs.Job) {
	t.Helper()
	ctx := pgtest.Context(t)
	f := e.c.CreateTemplate
	if push {
		f = e.c.PushTemplate
	}
	added, err := f(ctx, name, files)
	if err != nil {
		t.Fatal(err)
	}
	var out []jobs.Job
	for _, j := range added.BuildJobs {
		j, err := e.c.WaitJob(ctx, j.ID, nil)
		if err != nil || j.State != state {
			t.Fatalf("build of %s v%d: %v %s (%s), want %s", name, added.Version, err, j.State, j.LastError, state)
		}
		out = append(out, j)
	}
	return added, out
}

func (e env) tenant(t *testing.T, template, mode string) api.CreateTenantResponse {
	t.Helper()
	r, err := e.c.CreateTenant(pgtest.Context(t), provision.Request{Template: template, Mode: tenant.Mode(mode)})
	if err != nil {
		t.Fatal(err)
	}
	if r.Tenant.State != catalog.StateActive {
		t.Fatalf("tenant %+v not active", r.Tenant)
	}
	return r
}

func version(d api.TemplateDetail, v int) catalog.TemplateVersion {
	for _, tv := range d.Versions {
		if tv.Version == v {
			return tv
		}
	}
	return catalog.TemplateVersion{}
}

var (
	init1 = templates.Upload{Name: "0001_init.sql", Body: `CREATE TABLE accounts (id int PRIMARY KEY, balance int NOT NULL);
INSERT INTO accounts VALUES (1, 10), (2, 20);`}
	broken = templates.Upload{Name: "0002_note.sql", Body: `ALTER TABLE accounts ADD COLUMN note text;
ALTER TABLE no_such_table ADD COLUMN x int;`}
	// fixed replaces broken under the same name; its build takes a second
	// (only the build: pgt_build_<job>), so that a push while it builds is seen.
	fixed = templates.Upload{Name: "0002_note.sql", Body: `-- +goose StatementBegin
DO $$ BEGIN IF pg_catalog.current_database() LIKE 'pgt\_build\_%' THEN PERFORM pg_catalog.pg_sleep(1); END IF; END $$;
-- +goose StatementEnd
ALTER TABLE accounts ADD COLUMN note text;`}
	index = templates.Upload{Name: "0003_index.sql", Body: `-- +goose NO TRANSACTION
CREATE INDEX CONCURRENTLY IF NOT EXISTS accounts_note ON accounts (note);`}
)

const realError = `relation "no_such_table" does not exist`

// TestPush_FailedVersionIsFixed: a version whose build fails is recorded
// failed with the real error (job, build, template show), the current
// version stays the last good one (new tenants, from the pool and cold,
// get it), the broken file can be replaced in the next push (compared with
// the last good version), a push waits for the version before it, and the
// fixed version becomes current and rolls out over the failed one.
func TestPush_FailedVersionIsFixed(t *testing.T) {
	e := start(t, 1)
	ctx := pgtest.Context(t)
	e.add(t, false, "fix_push", jobs.Succeeded, init1)
	before := []api.CreateTenantResponse{e.tenant(t, "fix_push", "database"), e.tenant(t, "fix_push", "schema")}

	_, failed := e.add(t, true, "fix_push", jobs.Failed, init1, broken)
	if !strings.Contains(failed[0].LastError, realError) {
		t.Errorf("failed build job's error = %q, want the real error (%s)", failed[0].LastError, realError)
	}
	d, err := e.c.Template(ctx, "fix_push")
	if err != nil {
		t.Fatal(err)
	}
	if d.CurrentVersion != 1 || d.LatestVersion != 2 {
		t.Errorf("current, latest = %d, %d; want 1, 2", d.CurrentVersion, d.LatestVersion)
	}
	if v := version(d, 2); v.State != catalog.VersionFailed || !strings.Contains(v.Error, realError) || !strings.Contains(v.Error, "cluster local") {
		t.Errorf("version 2 = %s %q, want failed with the real error on cluster local", v.State, v.Error)
	}
	for _, b := range d.Builds {
		if b.Version == 2 && (b.State != "failed" || !strings.Contains(b.Error, realError)) {
			t.Errorf("build of v2 = %s %q, want failed with the real error", b.State, b.Error)
		}
	}
	// New tenants, from the pool and cold, keep getting version 1.
	for _, mode := range []string{"database", "schema"} {
		for range 2 {
			if r := e.tenant(t, "fix_push", mode); r.Tenant.Version != 1 {
				t.Errorf("%s tenant created after the failed push (%s path) is at v%d, want 1", mode, r.Path, r.Tenant.Version)
			}
		}
	}
	// A push must keep version 1's files, not version 2's.
	if _, err := e.c.PushTemplate(ctx, "fix_push", []templates.Upload{broken}); !errors.Is(err, api.ErrInvalid) {
		t.Errorf("push without version 1's file: %v, want invalid", err)
	}

	added, err := e.c.PushTemplate(ctx, "fix_push", []templates.Upload{init1, fixed, index})
	if err != nil {
		t.Fatalf("push replacing the broken file: %v", err)
	}
	if added.Version != 3 {
		t.Errorf("fixed push is version %d, want 3", added.Version)
	}
	_, err = e.c.PushTemplate(ctx, "fix_push", []templates.Upload{init1, fixed, index, {Name: "0004_more.sql", Body: `SELECT 1;`}})
	if !errors.Is(err, catalog.ErrConflict) || !strings.Contains(err.Error(), "still being built") {
		t.Errorf("push while version 3 builds: %v, want a conflict saying so", err)
	}
	for _, j := range added.BuildJobs {
		if j, err := e.c.WaitJob(ctx, j.ID, nil); err != nil || j.State != jobs.Succeeded {
			t.Fatalf("build of v3: %v %s %s", err, j.State, j.LastError)
		}
	}
	if d, err = e.c.Template(ctx, "fix_push"); err != nil {
		t.Fatal(err)
	}
	if d.CurrentVersion != 3 || version(d, 3).State != catalog.VersionReady || version(d, 2).State != catalog.VersionFailed {
		t.Errorf("after the fix: current %d, v3 %s, v2 %s; want 3, ready, failed", d.CurrentVersion, version(d, 3).State, version(d, 2).State)
	}
	after := e.tenant(t, "fix_push", "schema")
	if after.Tenant.Version != 3 {
		t.Errorf("tenant created after the fix is at v%d, want 3", after.Tenant.Version)
	}

	// The tenants of version 1 roll out to 3, over the failed version.
	started, err := e.c.StartRollout(ctx, migrate.Request{Template: "fix_push"})
	if err != nil {
		t.Fatal(err)
	}
	if started.Plan.To != 3 || len(started.Plan.Versions) != 1 || started.Plan.Versions[0].Version != 3 {
		t.Errorf("plan = to %d, versions %+v; want to 3 with version 3 only", started.Plan.To, started.Plan.Versions)
	}
	if _, err := e.c.WaitJob(ctx, started.Rollout.JobID, nil); err != nil {
		t.Fatal(err)
	}
	st, err := e.c.Rollout(ctx, started.Rollout.ID, url.Values{"state": {"all"}})
	if err != nil {
		t.Fatal(err)
	}
	if st.State != catalog.RolloutSucceeded || st.Counts[catalog.RolloutTenantFailed] != 0 {
		t.Fatalf("rollout = %s %+v (%s), want succeeded", st.State, st.Counts, st.Error)
	}
	for _, r := range append(before, after) {
		conn, err := pgx.Connect(ctx, r.DSN)
		if err != nil {
			t.Fatal(err)
		}
		var note *string
		err = conn.QueryRow(ctx, `SELECT note FROM accounts WHERE id = 1`).Scan(&note)
		conn.Close(ctx)
		if err != nil {
			t.Errorf("tenant %s (built at v%d): %v, want the column of version 3", r.Tenant.ID, r.Tenant.Version, err)
		}
		var v int
		if err := e.cat.QueryRow(ctx, `SELECT version FROM tenants WHERE id = $1`, r.Tenant.ID).Scan(&v); err != nil || v != 3 {
			t.Errorf("tenant %s at v%d (%v), want 3", r.Tenant.ID, v, err)
		}
	}
}

// TestCreate_FirstVersionFails: a template whose first version fails has no
// current version; a cold create says why with the build's real error; the
// name cannot be created again, but a push with the file fixed builds and
// serves tenants.
func TestCreate_FirstVersionFails(t *testing.T) {
	e := start(t, 0)
	ctx := pgtest.Context(t)
	bad := templates.Upload{Name: "0001_init.sql", Body: `CREATE TABLE accounts (id int PRIMARY KEY);
ALTER TABLE no_such_table ADD COLUMN x int;`}
	e.add(t, false, "fix_first", jobs.Failed, bad)
	d, err := e.c.Template(ctx, "fix_first")
	if err != nil {
		t.Fatal(err)
	}
	if d.CurrentVersion != 0 || version(d, 1).State != catalog.VersionFailed {
		t.Errorf("current %d, v1 %s; want 0, failed", d.CurrentVersion, version(d, 1).State)
	}
	for _, mode := range []string{"database", "schema"} {
		_, err := e.c.CreateTenant(ctx, provision.Request{Template: "fix_first", Mode: tenant.Mode(mode)})
		if !errors.Is(err, catalog.ErrConflict) || !strings.Contains(err.Error(), "failed to build on cluster local: ") ||
			!strings.Contains(err.Error(), realError) {
			t.Errorf("%s tenant of a failed first version: %v, want a conflict with the build's error (%s)", mode, err, realError)
		}
	}
	if _, err := e.c.CreateTemplate(ctx, "fix_first", []templates.Upload{init1}); !errors.Is(err, catalog.ErrConflict) ||
		!strings.Contains(err.Error(), "template push") {
		t.Errorf("create again: %v, want a conflict pointing to push", err)
	}
	added, _ := e.add(t, true, "fix_first", jobs.Succeeded, init1)
	if added.Version != 2 {
		t.Errorf("fixed push is version %d, want 2", added.Version)
	}
	for _, mode := range []string{"database", "schema"} {
		r := e.tenant(t, "fix_first", mode)
		if r.Tenant.Version != 2 {
			t.Errorf("%s tenant is at v%d, want 2", mode, r.Tenant.Version)
		}
		conn, err := pgx.Connect(ctx, r.DSN)
		if err != nil {
			t.Fatal(err)
		}
		var n int
		err = conn.QueryRow(ctx, `SELECT count(*) FROM accounts`).Scan(&n)
		conn.Close(ctx)
		if err != nil || n != 2 {
			t.Errorf("%s tenant: %d accounts, %v; want 2", mode, n, err)
		}
	}

	// The other way out: delete the template and create it again.
	e.add(t, false, "fix_first2", jobs.Failed, bad)
	deleted, err := e.c.DeleteTemplate(ctx, "fix_first2")
	if err != nil {
		t.Fatal(err)
	}
	if j, err := e.c.WaitJob(ctx, deleted.Job.ID, nil); err != nil || j.State != jobs.Succeeded {
		t.Fatalf("delete of a template whose first version failed: %v %s %s", err, j.State, j.LastError)
	}
	if left := leftovers(t, "fix_first2", nil); len(left) > 0 {
		t.Errorf("left on the cluster: %v", left)
	}
	if added, _ := e.add(t, false, "fix_first2", jobs.Succeeded, init1); added.Version != 1 {
		t.Errorf("created again at version %d, want 1", added.Version)
	}
	if r := e.tenant(t, "fix_first2", "database"); r.Tenant.Version != 1 {
		t.Errorf("tenant of the template created again is at v%d, want 1", r.Tenant.Version)
	}
}

// waitSpares waits until a template has n spares in each mode.
func (e env) waitSpares(t *testing.T, template string, n int) []string {
	t.Helper()
	ctx := pgtest.Context(t)
	for {
		var ids []string
		err := e.cat.QueryRow(ctx, `SELECT coalesce(array_agg(id), '{}') FROM tenants WHERE template = $1 AND state = 'spare'`, template).Scan(&ids)
		if err != nil {
			t.Fatal(err)
		}
		var modes int
		if err := e.cat.QueryRow(ctx, `SELECT count(DISTINCT mode) FROM tenants WHERE template = $1 AND state = 'spare'`, template).Scan(&modes); err != nil {
			t.Fatal(err)
		}
		if len(ids) >= 2*n && modes == 2 {
			return ids
		}
		select {
		case <-ctx.Done():
			t.Fatalf("template %s: %d spares, want %d of each mode", template, len(ids), n)
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// leftovers lists what is left on the cluster of a template and of the
// tenants whose ids are given: databases, roles, schemas in shared databases.
func leftovers(t *testing.T, template string, ids []string) []string {
	t.Helper()
	ctx := pgtest.Context(t)
	admin := pg.Conn(t, "postgres")
	names := []string{"pgt_shared_" + template, "pgt_connect_" + template}
	for _, id := range ids {
		names = append(names, "t_"+id, "pgt_agent_"+id)
	}
	var out []string
	rows, err := admin.Query(ctx, `SELECT 'database ' || datname FROM pg_database WHERE datname = ANY($1) OR datname ~ $2
		UNION ALL SELECT 'role ' || rolname FROM pg_roles WHERE rolname = ANY($1)`, names, `^pgt_tpl_`+template+`_v[0-9]+$`)
	if err != nil {
		t.Fatal(err)
	}
	got, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		t.Fatal(err)
	}
	out = append(out, got...)
	var shared []string
	if err := admin.QueryRow(ctx, `SELECT coalesce(array_agg(datname::text), '{}') FROM pg_database WHERE datname LIKE 'pgt\_shared\_%'`).Scan(&shared); err != nil {
		t.Fatal(err)
	}
	for _, db := range shared {
		conn := pg.Conn(t, db)
		var schemas []string
		if err := conn.QueryRow(ctx, `SELECT coalesce(array_agg(nspname::text), '{}') FROM pg_namespace WHERE nspname = ANY($1)`, names).Scan(&schemas); err != nil {
			t.Fatal(err)
		}
		for _, s := range schemas {
			out = append(out, "schema "+s+" in "+db)
		}
		conn.Close(ctx)
	}
	return out
}

// TestDelete_RefusedWithTenantsThenLeavesNothing: a template with tenants
// cannot be deleted (409 naming how many, in which states); once they are
// purged, the delete job removes its spares, template databases, shared
// database and connect role, then its catalog rows: nothing is left, the
// reconciler finds nothing of it, and the name can be created again (and
// deleted again while its spares are being built).
func TestDelete_RefusedWithTenantsThenLeavesNothing(t *testing.T) {
	e := start(t, 1)
	ctx := pgtest.Context(t)
	e.add(t, false, "del_me", jobs.Succeeded, init1)
	e.add(t, true, "del_me", jobs.Succeeded, init1, fixed)
	db, sc := e.tenant(t, "del_me", "database"), e.tenant(t, "del_me", "schema")
	if _, err := e.c.DropTenant(ctx, db.Tenant.ID, false); err != nil {
		t.Fatal(err)
	}
	_, err := e.c.DeleteTemplate(ctx, "del_me")
	if !errors.Is(err, catalog.ErrConflict) || !strings.Contains(err.Error(), "2 tenants (1 active, 1 dropped)") {
		t.Fatalf("delete with tenants: %v, want a conflict naming 2 tenants (1 active, 1 dropped)", err)
	}
	if d, err := e.c.Template(ctx, "del_me"); err != nil || d.Deleting {
		t.Fatalf("refused delete: template %+v, %v; want it untouched", d.TemplateSummary, err)
	}
	var ids []string
	for _, r := range []api.CreateTenantResponse{db, sc} {
		ids = append(ids, r.Tenant.ID)
		out, err := e.c.DropTenant(ctx, r.Tenant.ID, true)
		if err != nil {
			t.Fatal(err)
		}
		if j, err := e.c.WaitJob(ctx, out.Job.ID, nil); err != nil || j.State != jobs.Succeeded {
			t.Fatalf("purge of %s: %v %s", r.Tenant.ID, err, j.LastError)
		}
	}
	ids = append(ids, e.waitSpares(t, "del_me", 1)...)

	deleted, err := e.c.DeleteTemplate(ctx, "del_me")
	if err != nil {
		t.Fatal(err)
	}
	again, err := e.c.DeleteTemplate(ctx, "del_me")
	if err != nil || again.Job.ID != deleted.Job.ID {
		t.Errorf("delete again while it runs: job %d, %v; want the same job %d", again.Job.ID, err, deleted.Job.ID)
	}
	if j, err := e.c.WaitJob(ctx, deleted.Job.ID, nil); err != nil || j.State != jobs.Succeeded {
		t.Fatalf("delete job: %v %s %s", err, j.State, j.LastError)
	}
	if _, err := e.c.Template(ctx, "del_me"); !errors.Is(err, catalog.ErrNotFound) {
		t.Errorf("template show after delete: %v, want not found", err)
	}
	var rows int
	if err := e.cat.QueryRow(ctx, `SELECT (SELECT count(*) FROM templates WHERE name = 'del_me') + (SELECT count(*) FROM template_versions WHERE template = 'del_me')
		+ (SELECT count(*) FROM template_builds WHERE template = 'del_me') + (SELECT count(*) FROM tenants WHERE template = 'del_me')`).Scan(&rows); err != nil || rows != 0 {
		t.Errorf("catalog rows of del_me left: %d (%v)", rows, err)
	}
	if left := leftovers(t, "del_me", ids); len(left) > 0 {
		t.Errorf("left on the cluster: %v", left)
	}
	rep, err := e.c.Reconcile(ctx, api.ReconcileRequest{})
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range rep.Findings {
		for _, id := range append(ids, "del_me") {
			if strings.Contains(f.Object, id) || f.Tenant == id {
				t.Errorf("reconcile after delete: %+v", f)
			}
		}
	}
	if _, err := e.c.DeleteTemplate(ctx, "del_me"); !errors.Is(err, catalog.ErrNotFound) {
		t.Errorf("delete a deleted template: %v, want not found", err)
	}

	// The name is free again; a delete while the pool builds spares stops them.
	e.add(t, false, "del_me", jobs.Succeeded, init1)
	deleted, err = e.c.DeleteTemplate(ctx, "del_me")
	if err != nil {
		t.Fatal(err)
	}
	if j, err := e.c.WaitJob(ctx, deleted.Job.ID, nil); err != nil || j.State != jobs.Succeeded {
		t.Fatalf("second delete job: %v %s %s", err, j.State, j.LastError)
	}
	var all []string
	if err := e.cat.QueryRow(ctx, `SELECT coalesce(array_agg(DISTINCT target), '{}') FROM jobs WHERE target_kind = 'tenant'`).Scan(&all); err != nil {
		t.Fatal(err)
	}
	if left := leftovers(t, "del_me", all); len(left) > 0 {
		t.Errorf("left on the cluster after the second delete: %v", left)
	}
}
