package purge_test

import (
	"context"
	"errors"
	"net/http"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	examples "github.com/pgtenant/pgtenant/examples/templates"
	"github.com/pgtenant/pgtenant/internal/api"
	"github.com/pgtenant/pgtenant/internal/catalog"
	"github.com/pgtenant/pgtenant/internal/config"
	"github.com/pgtenant/pgtenant/internal/daemon/daemontest"
	"github.com/pgtenant/pgtenant/internal/jobs"
	"github.com/pgtenant/pgtenant/internal/pgtest"
	"github.com/pgtenant/pgtenant/internal/provision"
	"github.com/pgtenant/pgtenant/internal/templates"
	"github.com/pgtenant/pgtenant/internal/tenant"
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
	_, c := daemontest.Start(t, pg, cfg)
	e := env{c: c, catalog: daemontest.CatalogDB(t, cfg), cfg: cfg}
	daemontest.CreateTemplate(t, c, "saas", examples.Saas())
	return e
}

// tenant creates a tenant with some data and returns it.
func (e env) tenant(t *testing.T, template, mode string) api.CreateTenantResponse {
	t.Helper()
	ctx := pgtest.Context(t)
	r, err := e.c.CreateTenant(ctx, provision.Request{Template: template, Mode: tenant.Mode(mode)})
	if err != nil {
		t.Fatal(err)
	}
	if template == "saas" {
		conn := pgtest.Connect(t, r.DSN)
		if _, err := conn.Exec(ctx, `INSERT INTO organizations (name, slug) SELECT 'org ' || i, 'org-' || i FROM generate_series(1, 50) i;
			INSERT INTO users (email, display_name) SELECT 'u' || i || '@x', 'U ' || i FROM generate_series(1, 50) i`); err != nil {
			t.Fatal(err)
		}
		conn.Close(ctx)
	}
	return r
}

// checksum hashes every row of every table of a tenant, as the admin sees it.
func checksum(t *testing.T, tn catalog.Tenant) string {
	t.Helper()
	ctx := pgtest.Context(t)
	conn := pg.Conn(t, tn.Database)
	schema := "public"
	if tn.Mode == tenant.ModeSchema {
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
	if tn.Mode == tenant.ModeSchema {
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
			session := pgtest.Connect(t, tn.DSN)
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
			conn := pgtest.Connect(t, tn.DSN) // the password is unchanged
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
			if got := eventKinds(shown); got != "created,dropped,restored" {
				t.Errorf("history = %s, want created,dropped,restored", got)
			}
		})
	}
}

// TestDropRestore_SuspendedStaysSuspended: a tenant dropped while
// suspended is restored suspended (still locked out), and resume lets it in.
func TestDropRestore_SuspendedStaysSuspended(t *testing.T) {
	e := start(t, nil)
	ctx := pgtest.Context(t)
	tn := e.tenant(t, "saas", "database")
	if _, err := e.c.TenantAction(ctx, tn.Tenant.ID, "suspend"); err != nil {
		t.Fatal(err)
	}
	if _, err := e.c.DropTenant(ctx, tn.Tenant.ID, false); err != nil {
		t.Fatal(err)
	}
	restored, err := e.c.TenantAction(ctx, tn.Tenant.ID, "restore")
	if err != nil {
		t.Fatal(err)
	}
	if restored.Tenant.State != catalog.StateSuspended || restored.Tenant.PurgeAfter != nil {
		t.Fatalf("restored = %s (purge_after %v), want suspended as before the drop, without a purge time", restored.Tenant.State, restored.Tenant.PurgeAfter)
	}
	if conn, err := pgx.Connect(ctx, tn.DSN); err == nil {
		conn.Close(ctx)
		t.Error("a tenant restored suspended logged in")
	}
	if again, err := e.c.TenantAction(ctx, tn.Tenant.ID, "restore"); err != nil || again.Tenant.State != catalog.StateSuspended {
		t.Errorf("restore again = %s, %v; want suspended, no error", again.Tenant.State, err)
	}
	if r, err := e.c.TenantAction(ctx, tn.Tenant.ID, "resume"); err != nil || r.Tenant.State != catalog.StateActive {
		t.Fatalf("resume = %+v, %v", r.Tenant, err)
	}
	pgtest.Connect(t, tn.DSN)
}

func eventKinds(tn api.Tenant) string {
	var kinds []string
	for _, ev := range tn.Events {
		kinds = append(kinds, ev.Kind)
	}
	return strings.Join(kinds, ",")
}

// listed reports whether the tenant list with q holds id.
func listed(t *testing.T, c *api.Client, q url.Values, id string) bool {
	t.Helper()
	list, err := c.Tenants(pgtest.Context(t), q)
	if err != nil {
		t.Fatal(err)
	}
	for _, tn := range list {
		if tn.ID == id {
			return true
		}
	}
	return false
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
	// Restore changes nothing of a tenant that is not dropped (it may
	// have been restored suspended already).
	if r, err := e.c.TenantAction(ctx, tn.Tenant.ID, "restore"); err != nil || r.Tenant.State != catalog.StateSuspended {
		t.Errorf("restore of a suspended tenant: %s, %v; want it left suspended", r.Tenant.State, err)
	}
	if r, err := e.c.TenantAction(ctx, tn.Tenant.ID, "resume"); err != nil || r.Tenant.State != catalog.StateActive {
		t.Fatalf("resume = %+v, %v", r.Tenant, err)
	}
	pgtest.Connect(t, tn.DSN)
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
		pgtest.Connect(t, tn.DSN) // an open session does not stop the purge
		res, err := e.c.DropTenant(ctx, tn.Tenant.ID, true)
		if err != nil {
			t.Fatal(err)
		}
		waitJob(t, e.c, res.Job)
		if left := objectsLeft(t, e, tn.Tenant.Tenant); len(left) > 0 {
			t.Errorf("%s purge left %v", mode, left)
		}
		// It is remembered: shown purged with its history, listed with
		// --state purged, and no longer among the tenants.
		shown, err := e.c.Tenant(ctx, tn.Tenant.ID)
		if err != nil {
			t.Fatalf("show purged %s tenant: %v", mode, err)
		}
		if shown.State != catalog.StatePurged || shown.PurgedAt == nil || shown.DSN != "" {
			t.Errorf("purged %s tenant shown as %s (purged_at %v, dsn %q), want purged, a time, no DSN", mode, shown.State, shown.PurgedAt, shown.DSN)
		}
		if got, want := eventKinds(shown), "created,dropped,purging,purged"; got != want {
			t.Errorf("purged %s tenant's history = %s, want %s", mode, got, want)
		}
		if !listed(t, e.c, url.Values{"state": {"purged"}}, tn.Tenant.ID) || listed(t, e.c, url.Values{}, tn.Tenant.ID) {
			t.Errorf("purged %s tenant: want it listed with --state purged only", mode)
		}
	}
	for i, n := range neighbours {
		if got := checksum(t, n); got != sums[i] {
			t.Errorf("neighbour %s (%s) changed by a purge", n.ID, n.Mode)
		}
	}
}

// TestDrop_UnknownAndWrongState: an unknown id is 404; a purging tenant
// cannot be restored (409: it stays purging, locked out, its data as it
// was, and its purge goes on to the end); a purged one neither, nor changed
// in any way.
func TestDrop_UnknownAndWrongState(t *testing.T) {
	// The purge is held while the standby replays nothing: its DROP
	// DATABASE waits for the replay lag to come under 1 MB.
	e := start(t, func(c *config.Config) { c.Pacer.MaxReplayLag = 1 << 20 })
	ctx := pgtest.Context(t)
	for _, id := range []string{"aaaaaaaaaaaa", "not-an-id", "'; DROP TABLE tenants; --"} {
		_, err := e.c.DropTenant(ctx, id, false)
		var apiErr *api.Error
		if !errors.As(err, &apiErr) || apiErr.Status != http.StatusNotFound {
			t.Errorf("drop %q: %v, want 404", id, err)
		}
	}

	tn := e.tenant(t, "saas", "database")
	data := checksum(t, tn.Tenant.Tenant)
	if _, err := e.c.DropTenant(ctx, tn.Tenant.ID, false); err != nil { // locked out while the standby replays
		t.Fatal(err)
	}
	resume := pauseReplay(t)
	res, err := e.c.DropTenant(ctx, tn.Tenant.ID, true)
	if err != nil {
		t.Fatal(err)
	}
	for j := *res.Job; j.State != jobs.Waiting; { // its storage step held by the pacer
		if jobs.Finished(j.State) {
			t.Fatalf("purge job %d ended %s (%s) while the standby replayed nothing", j.ID, j.State, j.LastError)
		}
		time.Sleep(20 * time.Millisecond)
		if j, err = e.c.Job(ctx, j.ID); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := e.c.TenantAction(ctx, tn.Tenant.ID, "restore"); !errors.Is(err, catalog.ErrConflict) {
		t.Errorf("restore of a purging tenant: %v, want conflict", err)
	}
	if shown, err := e.c.Tenant(ctx, tn.Tenant.ID); err != nil || shown.State != catalog.StatePurging {
		t.Errorf("tenant after the refused restore: %s, %v; want purging", shown.State, err)
	}
	var login bool
	if err := pg.Conn(t, "postgres").QueryRow(ctx, `SELECT rolcanlogin FROM pg_roles WHERE rolname = $1`, "t_"+tn.Tenant.ID).Scan(&login); err != nil || login {
		t.Errorf("tenant role after the refused restore: login %v, %v; want locked out", login, err)
	}
	if got := checksum(t, tn.Tenant.Tenant); got != data {
		t.Errorf("tenant data after the refused restore = %s, want %s (as before the drop)", got, data)
	}
	resume()
	waitJob(t, e.c, res.Job)
	if left := objectsLeft(t, e, tn.Tenant.Tenant); len(left) > 0 {
		t.Errorf("purge after a refused restore left %v", left)
	}
	for _, verb := range []string{"restore", "resume", "suspend"} {
		if _, err := e.c.TenantAction(ctx, tn.Tenant.ID, verb); !errors.Is(err, catalog.ErrConflict) || !strings.Contains(err.Error(), "purged") {
			t.Errorf("%s of a purged tenant: %v, want a conflict saying it was purged", verb, err)
		}
	}
	if _, err := e.c.DropTenant(ctx, tn.Tenant.ID, true); !errors.Is(err, catalog.ErrConflict) {
		t.Errorf("drop of a purged tenant: %v, want conflict", err)
	}
	if shown, err := e.c.Tenant(ctx, tn.Tenant.ID); err != nil || shown.State != catalog.StatePurged {
		t.Errorf("purged tenant after the refused changes: %s, %v; want purged", shown.State, err)
	}
}

// pauseReplay stops WAL replay on the standby and writes WAL beyond 1 MB
// that it does not replay. It returns the function that resumes replay,
// which runs at the end of the test too.
func pauseReplay(t *testing.T) (resume func()) {
	t.Helper()
	ctx := pgtest.Context(t)
	standby := pgtest.Connect(t, pg.DSN(pg.Standbys()[0], "postgres"))
	resume = func() {
		if _, err := standby.Exec(context.Background(), `SELECT pg_wal_replay_resume()`); err != nil {
			t.Errorf("resume replay on the standby: %v", err)
		}
	}
	t.Cleanup(resume) // the other tests get a standby that replays
	if _, err := standby.Exec(ctx, `SELECT pg_wal_replay_pause()`); err != nil {
		t.Fatal(err)
	}
	filler := pg.Conn(t, pg.NewDatabase(t))
	if _, err := filler.Exec(ctx, `CREATE TABLE filler AS SELECT g, repeat('x', 1000) AS pad FROM generate_series(1, 5000) g`); err != nil {
		t.Fatal(err)
	}
	return resume
}

// TestPurged_ForgottenAfterRetention: a purged tenant's tombstone and its
// events go once drop.purged_retention has passed; with 0 nothing is kept.
func TestPurged_ForgottenAfterRetention(t *testing.T) {
	for _, keep := range []time.Duration{0, time.Second} {
		e := start(t, func(c *config.Config) {
			c.Drop.PurgedRetention = config.Duration(keep)
			c.Drop.CheckInterval = config.Duration(200 * time.Millisecond)
		})
		ctx := pgtest.Context(t)
		tn := e.tenant(t, "saas", "schema")
		res, err := e.c.DropTenant(ctx, tn.Tenant.ID, true)
		if err != nil {
			t.Fatal(err)
		}
		waitJob(t, e.c, res.Job)
		for {
			_, err := e.c.Tenant(ctx, tn.Tenant.ID)
			if errors.Is(err, catalog.ErrNotFound) {
				break
			}
			if err != nil {
				t.Fatal(err)
			}
			select {
			case <-ctx.Done():
				t.Fatalf("purged_retention %s: the purged tenant is still shown", keep)
			case <-time.After(100 * time.Millisecond):
			}
		}
		var events int
		if err := pg.Conn(t, e.catalog).QueryRow(ctx, `SELECT count(*) FROM tenant_events WHERE tenant = $1`, tn.Tenant.ID).Scan(&events); err != nil || events != 0 {
			t.Errorf("purged_retention %s: %d events left, %v; want none", keep, events, err)
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
	catDB := daemontest.CatalogDB(t, cfg)
	first, cancelFirst := daemontest.StartCancellable(t, pg, cfg)
	e := env{c: first, catalog: catDB, cfg: cfg}
	daemontest.CreateTemplate(t, e.c, "wide", templates.Wide(20))
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
