package purge_test

import (
	"context"
	"errors"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pgtenant/pgtenant/internal/api"
	"github.com/pgtenant/pgtenant/internal/catalog"
	"github.com/pgtenant/pgtenant/internal/config"
	"github.com/pgtenant/pgtenant/internal/daemon/daemontest"
	"github.com/pgtenant/pgtenant/internal/jobs"
	"github.com/pgtenant/pgtenant/internal/pgtest"
	"github.com/pgtenant/pgtenant/internal/provision"
	"github.com/pgtenant/pgtenant/internal/templates"
)

var pg *pgtest.Cluster

func TestMain(m *testing.M) {
	pgtest.Main(m, pgtest.Options{Standbys: 1, Settings: map[string]string{"max_locks_per_transaction": "64"}}, &pg)
}

type env struct {
	c       *api.Client
	catalog string
	cfg     config.Config
}

func start(t *testing.T, mutate func(*config.Config)) env {
	cfg := daemontest.Config(t, pg)
	cfg.Provision.DefaultPoolSize = 0
	if mutate != nil {
		mutate(&cfg)
	}
	u, _ := url.Parse(cfg.Catalog.DSN)
	_, c := daemontest.Start(t, pg, cfg)
	e := env{c: c, catalog: strings.TrimPrefix(u.Path, "/"), cfg: cfg}
	e.template(t, "saas", readDir(t, filepath.Join("..", "..", "examples", "templates", "saas")))
	return e
}

func readDir(t *testing.T, dir string) []templates.Upload {
	entries, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	var out []templates.Upload
	for _, e := range entries {
		b, err := os.ReadFile(filepath.Join(dir, e.Name()))
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, templates.Upload{Name: e.Name(), Body: string(b)})
	}
	return out
}

func (e env) template(t *testing.T, name string, files []templates.Upload) {
	t.Helper()
	ctx := pgtest.Context(t)
	added, err := e.c.CreateTemplate(ctx, name, files)
	if err != nil {
		t.Fatal(err)
	}
	for _, j := range added.BuildJobs {
		if j, err := e.c.WaitJob(ctx, j.ID, nil); err != nil || j.State != jobs.Succeeded {
			t.Fatalf("build: %v %s %s", err, j.State, j.LastError)
		}
	}
}

// tenant creates a tenant with some data and returns it.
func (e env) tenant(t *testing.T, template, mode string) api.CreateTenantResponse {
	t.Helper()
	ctx := pgtest.Context(t)
	r, err := e.c.CreateTenant(ctx, provision.Request{Template: template, Mode: mode})
	if err != nil {
		t.Fatal(err)
	}
	if template == "saas" {
		conn := connect(t, r.DSN)
		if _, err := conn.Exec(ctx, `INSERT INTO organizations (name, slug) SELECT 'org ' || i, 'org-' || i FROM generate_series(1, 50) i;
			INSERT INTO users (email, display_name) SELECT 'u' || i || '@x', 'U ' || i FROM generate_series(1, 50) i`); err != nil {
			t.Fatal(err)
		}
		conn.Close(ctx)
	}
	return r
}

func connect(t *testing.T, dsn string) *pgx.Conn {
	t.Helper()
	conn, err := pgx.Connect(context.Background(), dsn)
	if err != nil {
		t.Fatalf("connect: %v", err)
	}
	t.Cleanup(func() { conn.Close(context.Background()) })
	return conn
}

// checksum hashes every row of every table of a tenant, as the admin sees it.
func checksum(t *testing.T, tn catalog.Tenant) string {
	t.Helper()
	ctx := pgtest.Context(t)
	conn := pg.Conn(t, tn.Database)
	schema := "public"
	if tn.Mode == "schema" {
		schema = "t_" + tn.ID
	}
	rows, err := conn.Query(ctx, `SELECT quote_ident(schemaname) || '.' || quote_ident(tablename) FROM pg_tables WHERE schemaname = $1 ORDER BY 1`, schema)
	if err != nil {
		t.Fatal(err)
	}
	tables, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil || len(tables) == 0 {
		t.Fatalf("tables of %s: %v %v", tn.ID, tables, err)
	}
	var all strings.Builder
	for _, tb := range tables {
		var sum string
		if err := conn.QueryRow(ctx, `SELECT coalesce(md5(string_agg(x::text, '|' ORDER BY x::text)), '') FROM `+tb+` x`).Scan(&sum); err != nil {
			t.Fatal(err)
		}
		all.WriteString(tb + "=" + sum + ";")
	}
	return all.String()
}

func waitJob(t *testing.T, c *api.Client, j *jobs.Job) jobs.Job {
	t.Helper()
	if j == nil {
		t.Fatal("no job")
	}
	got, err := c.WaitJob(pgtest.Context(t), j.ID, nil)
	if err != nil || got.State != jobs.Succeeded {
		t.Fatalf("job %d: %v %s %s", j.ID, err, got.State, got.LastError)
	}
	return got
}

// objectsLeft lists what of a tenant exists on the cluster and in the catalog.
func objectsLeft(t *testing.T, e env, tn catalog.Tenant) []string {
	t.Helper()
	ctx := pgtest.Context(t)
	admin := pg.Conn(t, "postgres")
	name := "t_" + tn.ID
	var left []string
	var n int
	if err := admin.QueryRow(ctx, `SELECT count(*) FROM pg_database WHERE datname = $1`, name).Scan(&n); err != nil || n > 0 {
		left = append(left, "database")
	}
	if err := admin.QueryRow(ctx, `SELECT count(*) FROM pg_roles WHERE rolname = $1`, name).Scan(&n); err != nil || n > 0 {
		left = append(left, "role")
	}
	if tn.Mode == "schema" {
		if err := pg.Conn(t, tn.Database).QueryRow(ctx, `SELECT count(*) FROM pg_namespace WHERE nspname = $1`, name).Scan(&n); err != nil || n > 0 {
			left = append(left, "schema")
		}
	}
	if err := pg.Conn(t, e.catalog).QueryRow(ctx, `SELECT count(*) FROM tenants WHERE id = $1`, tn.ID).Scan(&n); err != nil || n > 0 {
		left = append(left, "catalog row")
	}
	return left
}

// TestDropRestore_RoundTrip: drop locks the tenant out and keeps its data;
// restore brings it back with the same data and password.
func TestDropRestore_RoundTrip(t *testing.T) {
	e := start(t, nil)
	ctx := pgtest.Context(t)
	for _, mode := range []string{"database", "schema"} {
		t.Run(mode, func(t *testing.T) {
			tn := e.tenant(t, "saas", mode)
			before := checksum(t, tn.Tenant.Tenant)
			session := connect(t, tn.DSN)
			dropped, err := e.c.DropTenant(ctx, tn.Tenant.ID, false)
			if err != nil {
				t.Fatal(err)
			}
			if dropped.Tenant.State != catalog.StateDropped || dropped.Tenant.PurgeAfter == nil || dropped.Job != nil {
				t.Fatalf("dropped = %+v, want dropped with a purge time and no purge job", dropped)
			}
			// Its open session was ended and it cannot log in again.
			if _, err := session.Exec(ctx, `SELECT 1`); err == nil {
				t.Error("the tenant's open session survived the drop")
			}
			if conn, err := pgx.Connect(ctx, tn.DSN); err == nil {
				conn.Close(ctx)
				t.Error("a dropped tenant logged in")
			}
			// Dropping again is not an error.
			if again, err := e.c.DropTenant(ctx, tn.Tenant.ID, false); err != nil || again.Tenant.State != catalog.StateDropped {
				t.Errorf("second drop = %+v, %v; want dropped", again.Tenant.State, err)
			}
			if got := checksum(t, tn.Tenant.Tenant); got != before {
				t.Error("data changed while dropped")
			}
			restored, err := e.c.TenantAction(ctx, tn.Tenant.ID, "restore")
			if err != nil {
				t.Fatal(err)
			}
			if restored.Tenant.State != catalog.StateActive || restored.Tenant.PurgeAfter != nil {
				t.Errorf("restored = %+v, want active without a purge time", restored.Tenant)
			}
			conn := connect(t, tn.DSN) // the password is unchanged
			var orgs int
			if err := conn.QueryRow(ctx, `SELECT count(*) FROM organizations`).Scan(&orgs); err != nil || orgs != 50 {
				t.Errorf("after restore: %d organizations, %v; want 50", orgs, err)
			}
			if got := checksum(t, tn.Tenant.Tenant); got != before {
				t.Error("data checksum changed by drop and restore")
			}
			shown, err := e.c.Tenant(ctx, tn.Tenant.ID)
			if err != nil {
				t.Fatal(err)
			}
			var kinds []string
			for _, ev := range shown.Events {
				kinds = append(kinds, ev.Kind)
			}
			if got := strings.Join(kinds, ","); got != "created,dropped,restored" {
				t.Errorf("history = %s, want created,dropped,restored", got)
			}
		})
	}
}

// TestSuspendResume: the same lock-out without the deletion clock.
func TestSuspendResume(t *testing.T) {
	e := start(t, nil)
	ctx := pgtest.Context(t)
	tn := e.tenant(t, "saas", "database")
	s, err := e.c.TenantAction(ctx, tn.Tenant.ID, "suspend")
	if err != nil || s.Tenant.State != catalog.StateSuspended || s.Tenant.PurgeAfter != nil {
		t.Fatalf("suspend = %+v, %v", s.Tenant, err)
	}
	if conn, err := pgx.Connect(ctx, tn.DSN); err == nil {
		conn.Close(ctx)
		t.Error("a suspended tenant logged in")
	}
	if _, err := e.c.TenantAction(ctx, tn.Tenant.ID, "restore"); !errors.Is(err, catalog.ErrConflict) {
		t.Errorf("restore of a suspended tenant: %v, want conflict", err)
	}
	if r, err := e.c.TenantAction(ctx, tn.Tenant.ID, "resume"); err != nil || r.Tenant.State != catalog.StateActive {
		t.Fatalf("resume = %+v, %v", r.Tenant, err)
	}
	connect(t, tn.DSN)
}

// TestPurge_LeavesNothingAndSparesNeighbours: purging either mode removes
// database, schema, role and catalog row, and no neighbour's data changes.
func TestPurge_LeavesNothingAndSparesNeighbours(t *testing.T) {
	e := start(t, nil)
	ctx := pgtest.Context(t)
	var neighbours []catalog.Tenant
	var sums []string
	for _, mode := range []string{"database", "schema"} {
		n := e.tenant(t, "saas", mode)
		neighbours = append(neighbours, n.Tenant.Tenant)
		sums = append(sums, checksum(t, n.Tenant.Tenant))
	}
	for _, mode := range []string{"database", "schema"} {
		tn := e.tenant(t, "saas", mode)
		connect(t, tn.DSN) // an open session does not stop the purge
		res, err := e.c.DropTenant(ctx, tn.Tenant.ID, true)
		if err != nil {
			t.Fatal(err)
		}
		waitJob(t, e.c, res.Job)
		if left := objectsLeft(t, e, tn.Tenant.Tenant); len(left) > 0 {
			t.Errorf("%s purge left %v", mode, left)
		}
		if _, err := e.c.Tenant(ctx, tn.Tenant.ID); !errors.Is(err, catalog.ErrNotFound) {
			t.Errorf("show purged %s tenant: %v, want not found", mode, err)
		}
	}
	for i, n := range neighbours {
		if got := checksum(t, n); got != sums[i] {
			t.Errorf("neighbour %s (%s) changed by a purge", n.ID, n.Mode)
		}
	}
}

// TestDrop_UnknownAndWrongState: an unknown id is 404; a purging tenant
// cannot be restored.
func TestDrop_UnknownAndWrongState(t *testing.T) {
	e := start(t, nil)
	ctx := pgtest.Context(t)
	for _, id := range []string{"aaaaaaaaaaaa", "not-an-id", "'; DROP TABLE tenants; --"} {
		_, err := e.c.DropTenant(ctx, id, false)
		var apiErr *api.Error
		if !errors.As(err, &apiErr) || apiErr.Status != http.StatusNotFound {
			t.Errorf("drop %q: %v, want 404", id, err)
		}
	}
}

// TestRetention_PurgesAutomatically: a dropped tenant whose retention ends
// is purged by the daemon, with an event in its history first.
func TestRetention_PurgesAutomatically(t *testing.T) {
	e := start(t, func(c *config.Config) {
		c.Drop.Retention = config.Duration(time.Second)
		c.Drop.CheckInterval = config.Duration(200 * time.Millisecond)
	})
	ctx := pgtest.Context(t)
	tn := e.tenant(t, "saas", "schema")
	if _, err := e.c.DropTenant(ctx, tn.Tenant.ID, false); err != nil {
		t.Fatal(err)
	}
	for {
		js, err := e.c.Jobs(ctx, url.Values{"type": {"tenant.purge"}, "target": {tn.Tenant.ID}})
		if err != nil {
			t.Fatal(err)
		}
		if len(js) == 1 && js[0].State == jobs.Succeeded {
			if !strings.Contains(string(js[0].Args), "retention ended") {
				t.Errorf("purge args = %s, want the reason", js[0].Args)
			}
			break
		}
		select {
		case <-ctx.Done():
			t.Fatal("the dropped tenant was not purged after its retention")
		case <-time.After(100 * time.Millisecond):
		}
	}
	if left := objectsLeft(t, e, tn.Tenant.Tenant); len(left) > 0 {
		t.Errorf("retention purge left %v", left)
	}
}

// TestPurge_InterruptedResumes: a schema purge of a wide tenant stopped
// mid-way (its daemon shut down between batches) is finished by another
// daemon, in small batches.
func TestPurge_InterruptedResumes(t *testing.T) {
	cfg := daemontest.Config(t, pg)
	cfg.Provision.DefaultPoolSize = 0
	cfg.Drop.BatchRelations = 100
	u, _ := url.Parse(cfg.Catalog.DSN)
	catDB := strings.TrimPrefix(u.Path, "/")
	first, cancelFirst := daemontest.StartCancellable(t, pg, cfg)
	e := env{c: first, catalog: catDB, cfg: cfg}
	e.template(t, "wide", templates.Wide(20))
	ctx := pgtest.Context(t)
	tn := e.tenant(t, "wide", "schema")
	res, err := first.DropTenant(ctx, tn.Tenant.ID, true)
	if err != nil {
		t.Fatal(err)
	}
	// Stop the daemon once some batches are done.
	for {
		j, err := first.Job(ctx, res.Job.ID)
		if err != nil {
			t.Fatal(err)
		}
		if j.ProgressDone > 0 && j.ProgressDone < j.ProgressTotal {
			break
		}
		if jobs.Finished(j.State) {
			t.Fatalf("purge finished before it could be interrupted (%d/%d)", j.ProgressDone, j.ProgressTotal)
		}
		time.Sleep(5 * time.Millisecond)
	}
	cancelFirst()
	var left int
	if err := pg.Conn(t, tn.Tenant.Database).QueryRow(ctx, `SELECT count(*) FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
		WHERE n.nspname = $1`, "t_"+tn.Tenant.ID).Scan(&left); err != nil || left == 0 {
		t.Fatalf("relations left after the interruption = %d, %v; want some", left, err)
	}
	_, second := daemontest.Start(t, pg, cfg)
	got := waitJob(t, second, res.Job)
	if len(got.Steps) != 5 { // lock-out, analytics, storage, role, catalog
		t.Errorf("steps = %+v, want 5", got.Steps)
	}
	if l := objectsLeft(t, e, tn.Tenant.Tenant); len(l) > 0 {
		t.Errorf("resumed purge left %v", l)
	}
}
