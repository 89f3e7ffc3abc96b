package reconcile_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	examples "github.com/pgtenant/pgtenant/examples/templates"
	"github.com/pgtenant/pgtenant/internal/api"
	"github.com/pgtenant/pgtenant/internal/catalog"
	"github.com/pgtenant/pgtenant/internal/cluster"
	"github.com/pgtenant/pgtenant/internal/config"
	"github.com/pgtenant/pgtenant/internal/daemon/daemontest"
	"github.com/pgtenant/pgtenant/internal/jobs"
	"github.com/pgtenant/pgtenant/internal/pgtest"
	"github.com/pgtenant/pgtenant/internal/provision"
	"github.com/pgtenant/pgtenant/internal/reconcile"
	"github.com/pgtenant/pgtenant/internal/templates"
	"github.com/pgtenant/pgtenant/internal/tenant"
)

var pg *pgtest.Cluster

func TestMain(m *testing.M) { pgtest.Main(m, pgtest.Options{}, &pg) }

func findingFor(rep reconcile.Report, object string) (reconcile.Finding, bool) {
	for _, f := range rep.Findings {
		if f.Object == object {
			return f, true
		}
	}
	return reconcile.Finding{}, false
}

// TestReconcile_ReportsAndFixesOnlyWhatItCanAttribute builds each kind of
// discrepancy by hand and checks what the reconciler says and does.
func TestReconcile_ReportsAndFixesOnlyWhatItCanAttribute(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	cfg := daemontest.Config(t, pg)
	cfg.Provision.DefaultPoolSize = 1
	cfg.Provision.PoolInterval = config.Duration(100 * time.Millisecond)
	cat := daemontest.CatalogConn(t, pg, cfg)
	_, c := daemontest.Start(t, pg, cfg)
	admin := pg.Conn(t, "postgres")

	daemontest.CreateTemplate(t, c, "saas", examples.Saas())
	// Nothing is wrong yet (once the pools are full).
	waitSpares(t, ctx, cat, 2)
	waitNoActiveJobs(t, ctx, cat)
	clean, err := c.Reconcile(ctx, api.ReconcileRequest{})
	if err != nil {
		t.Fatal(err)
	}
	if len(clean.Findings) != 0 {
		t.Fatalf("findings on a clean fleet: %+v", clean.Findings)
	}

	// 1. A database named like a tenant that pgtenant never worked on.
	stranger := tenant.PhysicalName(tenant.NewID())
	exec(t, admin, "CREATE DATABASE "+stranger)
	// 2. A role left by a purge job whose row is gone.
	leftID := tenant.NewID()
	exec(t, admin, "CREATE ROLE "+tenant.PhysicalName(leftID)+" NOLOGIN")
	exec(t, cat, `INSERT INTO jobs (type, target_kind, target, state) VALUES ('tenant.purge', 'tenant', '`+leftID+`', 'failed')`)
	// 3. A scratch build database of a job that is not running.
	exec(t, admin, "CREATE DATABASE pgt_build_999999")
	// 5. An active tenant whose database was dropped by hand.
	gone, err := c.CreateTenant(ctx, provision.Request{Template: "saas", Mode: "database"})
	if err != nil {
		t.Fatal(err)
	}
	exec(t, admin, "DROP DATABASE "+gone.Tenant.Database+" WITH (FORCE)")
	// 6. A tenant left purging with no job to finish it.
	stuck, err := c.CreateTenant(ctx, provision.Request{Template: "saas", Mode: "schema"})
	if err != nil {
		t.Fatal(err)
	}
	exec(t, cat, `UPDATE tenants SET state = 'purging' WHERE id = '`+stuck.Tenant.ID+`'`)
	waitSpares(t, ctx, cat, 2)
	waitNoActiveJobs(t, ctx, cat)
	// 4. A spare whose role can log in (an interrupted claim).
	var spare string
	if err := cat.QueryRow(ctx, `SELECT id FROM tenants WHERE state = 'spare' LIMIT 1`).Scan(&spare); err != nil {
		t.Fatal(err)
	}
	exec(t, admin, "ALTER ROLE "+tenant.PhysicalName(spare)+" LOGIN")

	rep, err := c.Reconcile(ctx, api.ReconcileRequest{Fix: true})
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		object, kind string
		fixed        bool
	}{
		{"database " + stranger, reconcile.Orphan, false},
		{"role " + tenant.PhysicalName(leftID), reconcile.Orphan, true},
		{"database pgt_build_999999", reconcile.Orphan, true},
		{"role " + tenant.PhysicalName(spare), reconcile.Mismatch, true},
		{"tenant " + gone.Tenant.ID, reconcile.Missing, false},
		{"tenant " + stuck.Tenant.ID, reconcile.Missing, true},
	} {
		f, ok := findingFor(rep, tc.object)
		if !ok {
			t.Errorf("no finding for %s; findings: %+v", tc.object, rep.Findings)
			continue
		}
		if f.Kind != tc.kind || f.Fixed != tc.fixed || f.Error != "" {
			t.Errorf("%s: kind %s fixed %v err %q (action %q), want kind %s fixed %v", tc.object, f.Kind, f.Fixed, f.Error, f.Action, tc.kind, tc.fixed)
		}
	}
	if len(rep.Findings) != 6 {
		t.Errorf("findings = %d, want 6: %+v", len(rep.Findings), rep.Findings)
	}
	// The unattributable database is still there; the rest is repaired.
	var n int
	if err := admin.QueryRow(ctx, `SELECT count(*) FROM pg_database WHERE datname = $1`, stranger).Scan(&n); err != nil || n != 1 {
		t.Errorf("the unattributable database was touched (%d, %v)", n, err)
	}
	waitNoActiveJobs(t, ctx, cat)
	after, err := c.Reconcile(ctx, api.ReconcileRequest{})
	if err != nil {
		t.Fatal(err)
	}
	var left []string
	for _, f := range after.Findings {
		left = append(left, f.Object)
	}
	if got, want := strings.Join(left, ";"), "database "+stranger+";tenant "+gone.Tenant.ID; got != want {
		t.Errorf("after fix, findings = %s, want %s", got, want)
	}
	exec(t, admin, "DROP DATABASE "+stranger)
}

// TestReconcile_TemplateObjectsWithoutTemplate: template databases, shared
// databases and connect roles of a template the catalog does not know (or
// of a version it does not have) are reported; fix drops those that are
// pgtenant's (template databases; a shared database with pgtenant's comment
// and nothing in it, with its connect role; a lone connect role) and leaves
// a shared database that holds what pgtenant did not make.
func TestReconcile_TemplateObjectsWithoutTemplate(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	cfg := daemontest.Config(t, pg)
	cfg.Provision.DefaultPoolSize = 0
	_, c := daemontest.Start(t, pg, cfg)
	admin := pg.Conn(t, "postgres")
	added, err := c.CreateTemplate(ctx, "rec_known", []templates.Upload{{Name: "0001_init.sql", Body: `CREATE TABLE a (id int);`}})
	if err != nil {
		t.Fatal(err)
	}
	if j, err := c.WaitJob(ctx, added.BuildJobs[0].ID, nil); err != nil || j.State != jobs.Succeeded {
		t.Fatalf("build: %v %s", err, j.LastError)
	}

	// What a deleted (or never recorded) template "rec_ghost" left: its
	// template database, its shared database and its connect role.
	exec(t, admin, "CREATE DATABASE pgt_tpl_rec_ghost_v1")
	exec(t, admin, "ALTER DATABASE pgt_tpl_rec_ghost_v1 WITH IS_TEMPLATE true ALLOW_CONNECTIONS false")
	exec(t, admin, "CREATE DATABASE pgt_shared_rec_ghost")
	exec(t, admin, "COMMENT ON DATABASE pgt_shared_rec_ghost IS 'pgtenant: schema-mode tenants of template rec_ghost'")
	exec(t, admin, "CREATE ROLE pgt_connect_rec_ghost NOLOGIN")
	exec(t, admin, "GRANT CONNECT ON DATABASE pgt_shared_rec_ghost TO pgt_connect_rec_ghost")
	// A version the known template does not have.
	exec(t, admin, "CREATE DATABASE pgt_tpl_rec_known_v7")
	// A connect role alone.
	exec(t, admin, "CREATE ROLE pgt_connect_rec_lone NOLOGIN")
	// A shared database of an unknown template with a schema pgtenant did not make.
	exec(t, admin, "CREATE DATABASE pgt_shared_rec_handmade")
	exec(t, admin, "COMMENT ON DATABASE pgt_shared_rec_handmade IS 'pgtenant: schema-mode tenants of template rec_handmade'")
	hand := pg.Conn(t, "pgt_shared_rec_handmade")
	exec(t, hand, "CREATE SCHEMA billing; CREATE TABLE billing.invoices (id int)")
	hand.Close(ctx)
	t.Cleanup(func() {
		_, _ = admin.Exec(context.Background(), "DROP DATABASE IF EXISTS pgt_shared_rec_handmade WITH (FORCE)")
	})

	want := []struct {
		object string
		fixed  bool
		detail string
	}{
		{"database pgt_tpl_rec_ghost_v1", true, "no template rec_ghost"},
		{"database pgt_shared_rec_ghost", true, "shared database of template rec_ghost"},
		{"database pgt_tpl_rec_known_v7", true, "no version 7"},
		{"role pgt_connect_rec_lone", true, "connect role of template rec_lone"},
		{"database pgt_shared_rec_handmade", false, "schemas [billing]"},
	}
	mine := func(rep reconcile.Report) []reconcile.Finding {
		var out []reconcile.Finding
		for _, f := range rep.Findings {
			if strings.Contains(f.Object, "rec_") {
				out = append(out, f)
			}
		}
		return out
	}
	for _, fix := range []bool{false, true} {
		rep, err := c.Reconcile(ctx, api.ReconcileRequest{Fix: fix})
		if err != nil {
			t.Fatal(err)
		}
		for _, w := range want {
			f, ok := findingFor(rep, w.object)
			switch {
			case !ok:
				t.Errorf("fix=%v: no finding for %s; findings: %+v", fix, w.object, mine(rep))
			case f.Kind != reconcile.Orphan || !strings.Contains(f.Detail, w.detail) || f.Fixed != (fix && w.fixed) || f.Error != "":
				t.Errorf("fix=%v: %s: %+v, want an orphan (%q) fixed=%v", fix, w.object, f, w.detail, fix && w.fixed)
			case !w.fixed && !strings.HasPrefix(f.Action, "none"):
				t.Errorf("%s: action %q, want none (not attributable)", w.object, f.Action)
			}
		}
		if got := mine(rep); len(got) != len(want) {
			t.Errorf("fix=%v: %d findings of these objects, want %d: %+v", fix, len(got), len(want), got)
		}
	}
	var dbs, roles int
	if err := admin.QueryRow(ctx, `SELECT (SELECT count(*) FROM pg_database WHERE datname IN ('pgt_tpl_rec_ghost_v1', 'pgt_shared_rec_ghost', 'pgt_tpl_rec_known_v7')),
		(SELECT count(*) FROM pg_roles WHERE rolname IN ('pgt_connect_rec_ghost', 'pgt_connect_rec_lone'))`).Scan(&dbs, &roles); err != nil {
		t.Fatal(err)
	}
	if dbs != 0 || roles != 0 {
		t.Errorf("after fix: %d databases and %d roles left of those pgtenant's, want none", dbs, roles)
	}
	after, err := c.Reconcile(ctx, api.ReconcileRequest{})
	if err != nil {
		t.Fatal(err)
	}
	var left []string
	for _, f := range mine(after) {
		left = append(left, f.Object)
	}
	if got, want := strings.Join(left, ";"), "database pgt_shared_rec_handmade"; got != want {
		t.Errorf("after fix, findings = %s, want %s", got, want)
	}
	if d, err := c.Template(ctx, "rec_known"); err != nil || d.CurrentVersion != 1 {
		t.Errorf("the known template: %+v %v, want untouched at v1", d.TemplateSummary, err)
	}
}

func exec(t *testing.T, conn *pgx.Conn, sql string) {
	t.Helper()
	if _, err := conn.Exec(context.Background(), sql); err != nil {
		t.Fatalf("%s: %v", sql, err)
	}
}

func waitNoActiveJobs(t *testing.T, ctx context.Context, cat *pgx.Conn) {
	t.Helper()
	for {
		var n int
		if err := cat.QueryRow(ctx, `SELECT count(*) FROM jobs WHERE state IN ('queued', 'running', 'waiting')`).Scan(&n); err != nil {
			t.Fatal(err)
		}
		if n == 0 {
			return
		}
		select {
		case <-ctx.Done():
			t.Fatal("jobs did not finish")
		case <-time.After(100 * time.Millisecond):
		}
	}
}

func waitSpares(t *testing.T, ctx context.Context, cat *pgx.Conn, n int) {
	t.Helper()
	for {
		var spares int
		if err := cat.QueryRow(ctx, `SELECT count(*) FROM tenants WHERE state = 'spare'`).Scan(&spares); err != nil {
			t.Fatal(err)
		}
		if spares >= n {
			return
		}
		select {
		case <-ctx.Done():
			t.Fatalf("spares = %d, want %d", spares, n)
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// slowSchemaBuild is a template whose schema tenants take half a second
// each to build (the pause runs in the shared database only, so the
// template's own build and database tenants' copies stay quick): spare
// builds stay in flight long enough for reconciles to meet them.
var slowSchemaBuild = []templates.Upload{{Name: "0001_init.sql", Body: `-- +goose StatementBegin
DO $$ BEGIN IF pg_catalog.current_database() LIKE 'pgt\_shared\_%' THEN PERFORM pg_catalog.pg_sleep(0.5); END IF; END $$;
-- +goose StatementEnd
CREATE TABLE items (id int PRIMARY KEY);`}}

// TestReconcile_InFlightBuildsAreNotFindings: while the spare pools are
// being built (claims start more builds; a new version retires the old
// spares, a purge each), reconcile, with and without fix, reports nothing
// of this daemon's: every object it sees belongs to a tenant whose job is
// at work, or was at work during the scan. Fix touches none of them: every
// job succeeds and the pools fill. (Before the fix, a purge's role seen
// before its row was deleted, or a build that ended between the row and
// the job reads, were reported, and fix dropped or purged them.)
func TestReconcile_InFlightBuildsAreNotFindings(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	cfg := daemontest.Config(t, pg)
	cfg.Provision.DefaultPoolSize = 3
	cfg.Provision.RefillParallel = 2
	cfg.Provision.PoolInterval = config.Duration(50 * time.Millisecond)
	cat := daemontest.CatalogConn(t, pg, cfg)
	_, c := daemontest.Start(t, pg, cfg)
	daemontest.CreateTemplate(t, c, "rec_slow", slowSchemaBuild)

	var reconciles, inFlight int
	var wrong []reconcile.Finding
	claims := 0
	deadline := time.Now().Add(90 * time.Second)
	for time.Now().Before(deadline) {
		var active int
		if err := cat.QueryRow(ctx, `SELECT count(*) FROM jobs WHERE state IN ('queued', 'running', 'waiting')`).Scan(&active); err != nil {
			t.Fatal(err)
		}
		if active == 0 && claims >= 4 {
			break
		}
		if active > 0 {
			inFlight++
		}
		rep, err := c.Reconcile(ctx, api.ReconcileRequest{Fix: reconciles%2 == 1})
		if err != nil {
			t.Fatal(err)
		}
		reconciles++
		wrong = append(wrong, ours(t, ctx, cat, rep)...)
		// Claims empty the pools again, and each starts a refill; a new
		// version retires every spare of the old one (a purge each) and
		// builds the pools anew.
		if claims < 4 && reconciles%3 == 0 {
			if _, err := c.CreateTenant(ctx, provision.Request{Template: "rec_slow", Mode: "schema"}); err != nil {
				t.Fatal(err)
			}
			claims++
			if claims == 2 {
				if _, err := c.PushTemplate(ctx, "rec_slow", append(slowSchemaBuild, templates.Upload{Name: "0002_more.sql", Body: `ALTER TABLE items ADD COLUMN note text;`})); err != nil {
					t.Fatal(err)
				}
			}
		}
	}
	t.Logf("%d reconciles, %d with builds in flight, %d claims", reconciles, inFlight, claims)
	if inFlight < 5 {
		t.Fatalf("only %d of %d reconciles met builds in flight: the test did not test", inFlight, reconciles)
	}
	for _, f := range wrong {
		t.Errorf("finding while builds were in flight: %+v", f)
	}
	waitNoActiveJobs(t, ctx, cat)
	var failed, spares int
	if err := cat.QueryRow(ctx, `SELECT (SELECT count(*) FROM jobs WHERE state NOT IN ('succeeded')),
		(SELECT count(*) FROM tenants WHERE state = 'spare' AND template = 'rec_slow')`).Scan(&failed, &spares); err != nil {
		t.Fatal(err)
	}
	if got, want := failed, 0; got != want {
		t.Errorf("jobs not succeeded = %d, want %d (a fix dropped what a build was making?)", got, want)
	}
	if got, want := spares, 6; got != want {
		t.Errorf("spares of rec_slow = %d, want %d", got, want)
	}
	after, err := c.Reconcile(ctx, api.ReconcileRequest{})
	if err != nil {
		t.Fatal(err)
	}
	if got := ours(t, ctx, cat, after); len(got) != 0 {
		t.Errorf("findings once the builds are done: %+v", got)
	}
}

// ours returns the findings about this test's daemon's tenants and
// templates (its catalog's rows and jobs): the test cluster also holds
// what earlier tests' daemons left.
func ours(t *testing.T, ctx context.Context, cat *pgx.Conn, rep reconcile.Report) []reconcile.Finding {
	t.Helper()
	var out []reconcile.Finding
	for _, f := range rep.Findings {
		mine := strings.Contains(f.Object, "rec_slow")
		if f.Tenant != "" && !mine {
			if err := cat.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM tenants WHERE id = $1)
				OR EXISTS (SELECT 1 FROM jobs WHERE $1 IN (target, args->>'tenant', args->>'into', data->>'into'))`, f.Tenant).Scan(&mine); err != nil {
				t.Fatal(err)
			}
		}
		if mine {
			out = append(out, f)
		}
	}
	return out
}

// TestReconcile_ObjectsOfATenantInAJobAreLeftToIt: objects of a tenant
// that an unfinished job works on, here the new tenant of a fork held
// paused (named in the job's args, not its target), are no finding and
// fix leaves them; once the job is over they are an interrupted job's
// leftovers, reported and dropped.
func TestReconcile_ObjectsOfATenantInAJobAreLeftToIt(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cfg := daemontest.Config(t, pg)
	cfg.Provision.DefaultPoolSize = 0
	cat := daemontest.CatalogConn(t, pg, cfg)
	_, c := daemontest.Start(t, pg, cfg)
	admin := pg.Conn(t, "postgres")

	source, into := tenant.NewID(), tenant.NewID()
	role, db := tenant.PhysicalName(into), tenant.PhysicalName(into)
	exec(t, cat, `INSERT INTO jobs (type, target_kind, target, state, args) VALUES ('tenant.fork', 'tenant', '`+source+`', 'paused',
		'{"tenant": "`+source+`", "into": "`+into+`"}')`)
	exec(t, admin, "CREATE ROLE "+role+" NOLOGIN")
	exec(t, admin, "CREATE DATABASE "+db+" OWNER "+role)
	t.Cleanup(func() {
		_, _ = admin.Exec(context.Background(), "DROP DATABASE IF EXISTS "+db+" WITH (FORCE)")
		_, _ = admin.Exec(context.Background(), "DROP ROLE IF EXISTS "+role)
	})
	exists := func() (dbs, roles int) {
		t.Helper()
		if err := admin.QueryRow(ctx, `SELECT (SELECT count(*) FROM pg_database WHERE datname = $1), (SELECT count(*) FROM pg_roles WHERE rolname = $1)`,
			db).Scan(&dbs, &roles); err != nil {
			t.Fatal(err)
		}
		return dbs, roles
	}

	for _, fix := range []bool{false, true} {
		rep, err := c.Reconcile(ctx, api.ReconcileRequest{Fix: fix})
		if err != nil {
			t.Fatal(err)
		}
		for _, f := range rep.Findings {
			if f.Tenant == into {
				t.Errorf("fix=%v: finding for a tenant a job works on: %+v", fix, f)
			}
		}
	}
	if dbs, roles := exists(); dbs != 1 || roles != 1 {
		t.Fatalf("fix dropped what a job works on: %d databases, %d roles left, want 1 and 1", dbs, roles)
	}

	// The job is cancelled: what it left is pgtenant's to drop.
	exec(t, cat, `UPDATE jobs SET state = 'cancelled' WHERE target = '`+source+`'`)
	rep, err := c.Reconcile(ctx, api.ReconcileRequest{Fix: true})
	if err != nil {
		t.Fatal(err)
	}
	for _, object := range []string{"database " + db, "role " + role} {
		f, ok := findingFor(rep, object)
		if !ok || f.Kind != reconcile.Orphan || f.Tenant != into || !f.Fixed || f.Error != "" {
			t.Errorf("%s once its job is over: %+v (found %v), want an orphan of tenant %s, fixed", object, f, ok, into)
		}
	}
	if dbs, roles := exists(); dbs != 0 || roles != 0 {
		t.Errorf("after fix: %d databases, %d roles of the cancelled job's tenant, want none", dbs, roles)
	}
}

// TestReconcile_CountsThePoolersEntries: the report's pooler_entries is
// the number of entries the cluster's PgBouncer has, one per active or
// suspended tenant, not the number of differences found.
func TestReconcile_CountsThePoolersEntries(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	cfg := daemontest.Config(t, pg)
	cfg.Provision.DefaultPoolSize = 0
	cat := daemontest.CatalogConn(t, pg, cfg)
	d, c := daemontest.StartPooled(t, pg, cfg)
	daemontest.CreateTemplate(t, c, "rec_pooled", []templates.Upload{{Name: "0001_init.sql", Body: `CREATE TABLE a (id int);`}})
	var ids []string
	for _, mode := range []tenant.Mode{"database", "schema", "database"} {
		r, err := c.CreateTenant(ctx, provision.Request{Template: "rec_pooled", Mode: mode})
		if err != nil {
			t.Fatal(err)
		}
		ids = append(ids, r.Tenant.ID)
	}
	if _, err := c.TenantAction(ctx, ids[2], "suspend"); err != nil {
		t.Fatal(err)
	}
	if err := d.Poolers().Get("local").Sync(ctx); err != nil {
		t.Fatal(err)
	}
	var withEntries int
	if err := cat.QueryRow(ctx, `SELECT count(*) FROM tenants WHERE state IN ('active', 'suspended')`).Scan(&withEntries); err != nil {
		t.Fatal(err)
	}
	if withEntries != len(ids) {
		t.Fatalf("tenants with entries = %d, want %d", withEntries, len(ids))
	}
	rep, err := c.Reconcile(ctx, api.ReconcileRequest{Cluster: "local"})
	if err != nil {
		t.Fatal(err)
	}
	if got, want := rep.Checked["pooler_entries"], withEntries; got != want {
		t.Errorf("checked pooler_entries = %d, want %d (the tenants with entries); report: %+v", got, want, rep)
	}
	for _, f := range rep.Findings {
		if strings.HasPrefix(f.Object, "pooler entry ") {
			t.Errorf("finding on a synced pooler: %+v", f)
		}
	}
	if len(rep.Errors) != 0 {
		t.Errorf("reconcile could not check: %v", rep.Errors)
	}
}

// TestLoop_OneDaemonOfACatalogAtATime: a periodic round runs only while no
// other daemon's round holds the catalog's lock, so the daemons of a
// catalog do not each reconcile, and repair, every cluster.
func TestLoop_OneDaemonOfACatalogAtATime(t *testing.T) {
	ctx := pgtest.Context(t)
	log := pgtest.Logger(t)
	store, err := catalog.Open(ctx, pg.PrimaryDSN(pg.NewDatabase(t)), log)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(store.Close)
	clusters := cluster.NewRegistry()
	t.Cleanup(clusters.Close)
	loop := &reconcile.Loop{R: &reconcile.Reconciler{Store: store, Clusters: clusters, Logger: log}, Interval: time.Hour}
	if ran, err := loop.Round(ctx); !ran || err != nil {
		t.Fatalf("a round alone = %v, %v; want it run", ran, err)
	}
	other := pgtest.Connect(t, pg.PrimaryDSN(store.Pool().Config().ConnConfig.Database))
	if _, err := other.Exec(ctx, `SELECT pg_advisory_lock($1)`, int64(reconcile.LoopLockKey)); err != nil {
		t.Fatal(err)
	}
	if ran, err := loop.Round(ctx); ran || err != nil {
		t.Errorf("a round while another daemon's holds the lock = %v, %v; want it skipped", ran, err)
	}
	if _, err := other.Exec(ctx, `SELECT pg_advisory_unlock($1)`, int64(reconcile.LoopLockKey)); err != nil {
		t.Fatal(err)
	}
	if ran, err := loop.Round(ctx); !ran || err != nil {
		t.Errorf("a round once the other's ended = %v, %v; want it run", ran, err)
	}
}
