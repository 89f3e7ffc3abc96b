package backup_test

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pgtenant/pgtenant/internal/api"
	"github.com/pgtenant/pgtenant/internal/backup"
	"github.com/pgtenant/pgtenant/internal/backup/backuptest"
	"github.com/pgtenant/pgtenant/internal/config"
	"github.com/pgtenant/pgtenant/internal/fleet"
	"github.com/pgtenant/pgtenant/internal/provision"
	"github.com/pgtenant/pgtenant/internal/reconcile"
	"github.com/pgtenant/pgtenant/internal/templates"
	"github.com/pgtenant/pgtenant/internal/tenant"
)

// TestRestoreCluster_BothNodesLost: a cluster with a standby, backed up
// and archiving, serves three tenants (one made after TIME) while its
// catalog lives elsewhere. Both nodes are lost (their data dirs gone);
// RestoreCluster rebuilds the cluster from its repository: to the end of
// the archive, every tenant has every row written before the archive was
// last pushed, the standby is made anew and streams, and reconcile finds
// nothing; to TIME, the rows written after it are gone and reconcile
// reports the tenant made after it as lost. A running node is refused.
func TestRestoreCluster_BothNodesLost(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 6*time.Minute)
	defer cancel()
	fc, st := backuptest.Cluster(t, ctx, 1)
	cat := backuptest.Server(t, ctx, "cat")
	backuptest.Exec(t, ctx, cat.PrimaryDSN("postgres"), `CREATE DATABASE catalog`)
	mod := func(cfg *config.Config) {
		cfg.Catalog.DSN = cat.PrimaryDSN("catalog")
		cfg.Provision.ReservedConnections = 5
		cfg.Provision.ConnectionOvercommit = 100
	}
	stanzas := map[string]*backup.Stanza{fc.Name(): st}
	c, stop := backuptest.Daemon(t, fc, "", stanzas, mod)
	waitBackup(t, ctx, st)
	added, err := c.CreateTemplate(ctx, "shop", []templates.Upload{{Name: "0001_init.sql", Body: "CREATE TABLE items (id int PRIMARY KEY, note text);"}})
	if err != nil {
		t.Fatal(err)
	}
	for _, j := range added.BuildJobs {
		waitJob(t, ctx, c, j.ID)
	}
	mk := func(mode tenant.Mode, rows int) api.CreateTenantResponse {
		r, err := c.CreateTenant(ctx, provision.Request{Template: "shop", Mode: mode})
		if err != nil {
			t.Fatal(err)
		}
		if r.Job != nil {
			waitJob(t, ctx, c, r.Job.ID)
		}
		insert(t, ctx, r.DSN, 1, rows)
		return r
	}
	a, b := mk(tenant.ModeSchema, 150), mk(tenant.ModeDatabase, 150)
	time.Sleep(1100 * time.Millisecond)
	at := time.Now()
	time.Sleep(1100 * time.Millisecond)
	late := mk(tenant.ModeDatabase, 20)
	insert(t, ctx, a.DSN, 151, 160)
	if err := st.Check(ctx); err != nil { // the newest WAL archived
		t.Fatal(err)
	}

	// A running cluster is never restored over.
	if err := st.RestoreCluster(ctx, fc, time.Time{}); err == nil || !strings.Contains(err.Error(), "is running") {
		t.Errorf("restore of a running cluster: err = %v, want a refusal saying a node is running", err)
	}

	lose := func() {
		t.Helper()
		stop()
		if err := fc.Stop(ctx); err != nil {
			t.Fatal(err)
		}
		for _, n := range append([]fleet.Node{fc.Primary()}, fc.Standbys()...) {
			if err := os.RemoveAll(fc.DataDir(n.Name)); err != nil {
				t.Fatal(err)
			}
		}
	}
	restore := func(to time.Time) *api.Client {
		t.Helper()
		if err := st.RestoreCluster(ctx, fc, to); err != nil {
			t.Fatal(err)
		}
		if err := fc.Start(ctx); err != nil { // the standby, made anew
			t.Fatal(err)
		}
		var c *api.Client
		c, stop = backuptest.Daemon(t, fc, "", stanzas, mod)
		if sbs := fc.Standbys(); len(sbs) != 1 || !sbs[0].Ready {
			t.Errorf("standbys after the restore: %+v, want one ready", sbs)
		}
		conn, err := pgx.Connect(ctx, fc.PrimaryDSN("postgres"))
		if err != nil {
			t.Fatal(err)
		}
		defer conn.Close(ctx)
		// The new standby catches up, then streams.
		var states []string
		for deadline := time.Now().Add(time.Minute); ; time.Sleep(200 * time.Millisecond) {
			if err := conn.QueryRow(ctx, `SELECT coalesce(array_agg(state::text), '{}') FROM pg_stat_replication`).Scan(&states); err != nil {
				t.Fatal(err)
			}
			if len(states) == 1 && states[0] == "streaming" {
				break
			}
			if time.Now().After(deadline) {
				t.Errorf("replication after the restore: %v, want one standby streaming", states)
				break
			}
		}
		return c
	}

	lose()
	c = restore(time.Time{})
	for _, x := range []struct {
		r    api.CreateTenantResponse
		want int
	}{{a, 160}, {b, 150}, {late, 20}} {
		if got := count(t, ctx, x.r.DSN); got != x.want {
			t.Errorf("tenant %s (%s) after the restore to the end of the archive: %d rows, want %d", x.r.Tenant.ID, x.r.Tenant.Mode, got, x.want)
		}
	}
	rep, err := c.Reconcile(ctx, api.ReconcileRequest{})
	if err != nil {
		t.Fatal(err)
	}
	if len(rep.Findings) > 0 || len(rep.Errors) > 0 {
		t.Errorf("reconcile after the restore to the end of the archive: %+v %v, want nothing", rep.Findings, rep.Errors)
	}
	if lost, _ := filepath.Glob(fc.DataDir("primary") + ".lost-*"); len(lost) != 0 {
		t.Errorf("node dirs moved aside although they were gone: %v", lost)
	}

	lose()
	c = restore(at)
	for _, x := range []struct {
		r    api.CreateTenantResponse
		want int
	}{{a, 150}, {b, 150}} {
		if got := count(t, ctx, x.r.DSN); got != x.want {
			t.Errorf("tenant %s (%s) after the restore to TIME: %d rows, want %d", x.r.Tenant.ID, x.r.Tenant.Mode, got, x.want)
		}
	}
	rep, err = c.Reconcile(ctx, api.ReconcileRequest{})
	if err != nil {
		t.Fatal(err)
	}
	var lost bool
	for _, f := range rep.Findings {
		if f.Tenant == late.Tenant.ID && f.Kind == reconcile.Missing && strings.Contains(f.Action, "data is gone") {
			lost = true
		} else {
			t.Errorf("reconcile after the restore to TIME: unexpected finding %+v", f)
		}
	}
	if !lost {
		t.Errorf("reconcile after the restore to TIME does not report tenant %s (made after TIME) as lost: %+v", late.Tenant.ID, rep.Findings)
	}
}

func waitBackup(t *testing.T, ctx context.Context, st *backup.Stanza) {
	t.Helper()
	for {
		info, err := st.Info(ctx)
		if err == nil && len(info.Backups) > 0 && !info.Running {
			return
		}
		select {
		case <-ctx.Done():
			t.Fatal("no first backup")
		case <-time.After(200 * time.Millisecond):
		}
	}
}

// insert writes rows from..to into a tenant's items.
func insert(t *testing.T, ctx context.Context, dsn string, from, to int) {
	t.Helper()
	conn, err := pgx.Connect(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	if _, err := conn.Exec(ctx, `INSERT INTO items SELECT g, 'row ' || g FROM generate_series($1::int, $2::int) g`, from, to); err != nil {
		t.Fatal(err)
	}
}

func count(t *testing.T, ctx context.Context, dsn string) int {
	t.Helper()
	conn, err := pgx.Connect(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	var n int
	if err := conn.QueryRow(ctx, `SELECT count(*) FROM items`).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}
