package main

import (
	"context"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pgtenant/pgtenant/internal/api"
	"github.com/pgtenant/pgtenant/internal/backup"
	"github.com/pgtenant/pgtenant/internal/pgtest"
	"github.com/pgtenant/pgtenant/internal/provision"
	"github.com/pgtenant/pgtenant/internal/templates"
)

// TestClusterRestore_AfterLosingBothNodes is the disaster-recovery runbook:
// a fleet made by up (backed up, a primary and a standby) serves a tenant;
// cluster restore is refused while up runs and for a cluster the data dir
// has not got; with up stopped and both nodes' data dirs gone, `cluster
// restore local` rebuilds them from the repository, and up then serves
// the tenant with its rows, reconcile clean.
func TestClusterRestore_AfterLosingBothNodes(t *testing.T) {
	if testing.Short() {
		t.Skip("end-to-end")
	}
	if _, err := backup.Find(); err != nil {
		t.Skip(err)
	}
	dataDir := filepath.Join(pgtest.TempDir(t), "data")
	ctx, cancel := context.WithTimeout(context.Background(), 8*time.Minute)
	defer cancel()
	p := startUp(t, dataDir, "--patroni=false")
	c := api.NewClient(p.info.URL, p.info.Token)
	fail := func(format string, args ...any) {
		t.Helper()
		p.stop(t)
		t.Fatalf(format, args...)
	}
	if _, err := c.CreateTemplate(ctx, "shop", []templates.Upload{{Name: "0001_init.sql", Body: "CREATE TABLE items (id int PRIMARY KEY);"}}); err != nil {
		fail("template: %v", err)
	}
	var r api.CreateTenantResponse
	for deadline := time.Now().Add(time.Minute); ; time.Sleep(300 * time.Millisecond) {
		var err error
		if r, err = c.CreateTenant(ctx, provision.Request{Template: "shop"}); err == nil {
			break
		} else if time.Now().After(deadline) {
			fail("create: %v", err)
		}
	}
	if r.Job != nil {
		if _, err := c.WaitJob(ctx, r.Job.ID, nil); err != nil {
			fail("build: %v", err)
		}
	}
	conn, err := pgx.Connect(ctx, r.DirectDSN)
	if err != nil {
		fail("connect: %v", err)
	}
	_, err = conn.Exec(ctx, `INSERT INTO items SELECT generate_series(1, 500)`)
	conn.Close(ctx)
	if err != nil {
		fail("insert: %v", err)
	}
	// A backup holding the rows, once up's first one is done.
	for deadline := time.Now().Add(3 * time.Minute); ; time.Sleep(time.Second) {
		js, err := c.BackupNow(ctx, api.BackupRequest{Cluster: "local", Type: backup.Diff})
		if err == nil {
			if j, err := c.WaitJob(ctx, js[0].ID, nil); err != nil || j.State != "succeeded" {
				fail("backup: %v %s %s", err, j.State, j.LastError)
			}
			break
		}
		if time.Now().After(deadline) {
			fail("backup now: %v", err)
		}
	}
	restore := func(args ...string) (string, error) {
		out, err := exec.Command(binary, append([]string{"cluster", "restore", "--data-dir", dataDir, "-o", "json"}, args...)...).CombinedOutput()
		return string(out), err
	}
	if out, err := restore("local", "--yes"); err == nil || !strings.Contains(out, "another `pgtenant up`") {
		t.Errorf("cluster restore while up runs: %v %s; want a refusal naming up", err, out)
	}
	p.stop(t)
	if out, err := restore("nosuch"); exitCode(err) != 2 || !strings.Contains(out, "has no such cluster") {
		t.Errorf("cluster restore nosuch: exit %d %s; want 2 naming the data dir's clusters", exitCode(err), out)
	}
	for _, n := range []string{"primary", "standby1"} {
		if err := os.RemoveAll(filepath.Join(dataDir, "local", n)); err != nil {
			t.Fatal(err)
		}
	}
	out, err := restore("local")
	if err != nil {
		t.Fatalf("cluster restore local: %v\n%s", err, out)
	}
	var res struct {
		Cluster  string `json:"cluster"`
		Standbys []struct {
			Name string `json:"name"`
		} `json:"standbys"`
	}
	if err := json.Unmarshal([]byte(out[strings.Index(out, "{"):]), &res); err != nil || res.Cluster != "local" || len(res.Standbys) != 1 {
		t.Errorf("cluster restore printed %s (%v); want cluster local with its standby", out, err)
	}

	p = startUp(t, dataDir)
	defer p.stop(t)
	c = api.NewClient(p.info.URL, p.info.Token)
	conn, err = pgx.Connect(ctx, r.DirectDSN)
	if err != nil {
		t.Fatalf("the tenant after the restore: %v", err)
	}
	defer conn.Close(ctx)
	var n int
	if err := conn.QueryRow(ctx, `SELECT count(*) FROM items`).Scan(&n); err != nil || n != 500 {
		t.Errorf("the tenant's rows after the restore: %d (%v), want 500", n, err)
	}
	rep, err := c.Reconcile(ctx, api.ReconcileRequest{})
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range rep.Findings {
		if f.Tenant == r.Tenant.ID {
			t.Errorf("reconcile after the restore: %+v", f)
		}
	}
}

// exitCode is a finished command's exit status (0: none).
func exitCode(err error) int {
	if ee, ok := err.(*exec.ExitError); ok {
		return ee.ExitCode()
	}
	return 0
}
