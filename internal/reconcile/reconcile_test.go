package reconcile_test

import (
	"context"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pgtenant/pgtenant/internal/api"
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
	u, _ := url.Parse(cfg.Catalog.DSN)
	cat := pg.Conn(t, strings.TrimPrefix(u.Path, "/"))
	_, c := daemontest.Start(t, pg, cfg)
	admin := pg.Conn(t, "postgres")

	body, err := os.ReadFile(filepath.Join("..", "..", "examples", "templates", "saas", "0001_init.sql"))
	if err != nil {
		t.Fatal(err)
	}
	added, err := c.CreateTemplate(ctx, "saas", []templates.Upload{{Name: "0001_init.sql", Body: string(body)}})
	if err != nil {
		t.Fatal(err)
	}
	if j, err := c.WaitJob(ctx, added.BuildJobs[0].ID, nil); err != nil || j.State != jobs.Succeeded {
		t.Fatalf("build: %v %s", err, j.LastError)
	}
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
