package main

import (
	"context"
	"encoding/json"
	"fmt"
	"net/url"
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

// TestClusterRestore_AfterLosingBothNodes is the disaster-recovery runbook,
// for a fleet up runs itself and for one under Patroni: a fleet made by up
// (backed up, a primary and a standby) serves a tenant; cluster restore is
// refused while up runs and for a cluster the data dir has not got; with
// up stopped and both nodes' dirs gone, `cluster restore local` rebuilds
// them from the repository, and up then serves the tenant with its rows,
// reconcile clean. Under Patroni the etcd, which survived, still holds the
// lost cluster's leader, members and last position: the restore clears
// them, and the old nodes' state left in it does not stop the restored
// node from leading.
func TestClusterRestore_AfterLosingBothNodes(t *testing.T) {
	if testing.Short() {
		t.Skip("end-to-end")
	}
	if _, err := backup.Find(); err != nil {
		t.Skip(err)
	}
	t.Run("up runs it", func(t *testing.T) {
		restoreAfterLosingBothNodes(t, []string{"primary", "standby1"}, "--patroni=false")
	})
	t.Run("under Patroni", func(t *testing.T) {
		skipWithoutPatroni(t)
		restoreAfterLosingBothNodes(t, []string{"n1", "n2"})
	})
}

// restoreAfterLosingBothNodes runs the runbook on a fleet that up starts
// with upArgs, whose cluster local has the node dirs nodes.
func restoreAfterLosingBothNodes(t *testing.T, nodes []string, upArgs ...string) {
	dataDir := filepath.Join(pgtest.TempDir(t), "data")
	ctx, cancel := context.WithTimeout(context.Background(), 12*time.Minute)
	defer cancel()
	p := startUp(t, dataDir, upArgs...)
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
	if err := execAs(ctx, r.DirectDSN, `INSERT INTO items SELECT generate_series(1, 500)`); err != nil {
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
	// TIME, then rows written after it, archived: a restore to TIME
	// recovers to a commit after it, and one to the end of the archive has
	// them.
	time.Sleep(1100 * time.Millisecond)
	at := time.Now()
	time.Sleep(1100 * time.Millisecond)
	if err := execAs(ctx, r.DirectDSN, `INSERT INTO items SELECT generate_series(501, 600)`); err != nil {
		fail("insert: %v", err)
	}
	if err := archiveNow(ctx, dataDir, p.info.Clusters[0].Nodes[0].DSN); err != nil {
		fail("archive: %v", err)
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
	for _, step := range []struct {
		what string
		args []string
		want int
	}{
		{"the end of the archive", nil, 600},
		// Its latest timeline, the first restore's, forked after TIME.
		{"TIME", []string{"--to-time", at.Format(time.RFC3339Nano)}, 500},
	} {
		for _, n := range nodes {
			if err := os.RemoveAll(filepath.Join(dataDir, "local", n)); err != nil {
				t.Fatal(err)
			}
		}
		out, err := restore(append([]string{"local"}, step.args...)...)
		if err != nil {
			t.Fatalf("cluster restore local to %s: %v\n%s", step.what, err, out)
		}
		var res struct {
			Cluster  string `json:"cluster"`
			Standbys []struct {
				Name string `json:"name"`
			} `json:"standbys"`
		}
		if err := json.Unmarshal([]byte(out[strings.Index(out, "{"):]), &res); err != nil || res.Cluster != "local" || len(res.Standbys) != 1 {
			t.Errorf("cluster restore to %s printed %s (%v); want cluster local with its standby", step.what, out, err)
		}

		p = startUp(t, dataDir)
		c = api.NewClient(p.info.URL, p.info.Token)
		var n int
		if err := queryAs(ctx, r.DirectDSN, `SELECT count(*) FROM items`, &n); err != nil || n != step.want {
			t.Errorf("the tenant's rows after the restore to %s: %d (%v), want %d", step.what, n, err, step.want)
		}
		// up's front door syncs its entries once it runs: reconcile
		// after the tenant logs in through it.
		for deadline := time.Now().Add(time.Minute); ; time.Sleep(300 * time.Millisecond) {
			err := execAs(ctx, r.DSN, `SELECT 1`)
			if err == nil {
				break
			} else if time.Now().After(deadline) {
				fail("log in through the pooler after the restore to %s: %v", step.what, err)
			}
		}
		rep, err := c.Reconcile(ctx, api.ReconcileRequest{})
		if err != nil {
			fail("reconcile: %v", err)
		}
		for _, f := range rep.Findings {
			if f.Tenant == r.Tenant.ID {
				t.Errorf("reconcile after the restore to %s: %+v", step.what, f)
			}
		}
		p.stop(t)
	}
}

// execAs runs sql in a session of dsn.
func execAs(ctx context.Context, dsn, sql string) error {
	conn, err := pgx.Connect(ctx, dsn)
	if err != nil {
		return err
	}
	defer conn.Close(ctx)
	_, err = conn.Exec(ctx, sql)
	return err
}

// queryAs scans the one row of sql, run in a session of dsn, into dest.
func queryAs(ctx context.Context, dsn, sql string, dest ...any) error {
	conn, err := pgx.Connect(ctx, dsn)
	if err != nil {
		return err
	}
	defer conn.Close(ctx)
	return conn.QueryRow(ctx, sql).Scan(dest...)
}

// archiveNow switches the WAL of the primary at node DSN dsn (up's, without
// its password: the superuser's is in the data dir) and waits until the
// segment it closed is archived.
func archiveNow(ctx context.Context, dataDir, dsn string) error {
	password, err := os.ReadFile(filepath.Join(dataDir, "local", "superuser.password"))
	if err != nil {
		return err
	}
	u, err := url.Parse(dsn)
	if err != nil {
		return err
	}
	u.User = url.UserPassword(u.User.Username(), strings.TrimSpace(string(password)))
	conn, err := pgx.Connect(ctx, u.String())
	if err != nil {
		return err
	}
	defer conn.Close(ctx)
	var wal string
	if err := conn.QueryRow(ctx, `SELECT pg_walfile_name(pg_switch_wal())`).Scan(&wal); err != nil {
		return err
	}
	for {
		var done bool
		if err := conn.QueryRow(ctx, `SELECT coalesce(last_archived_wal >= $1, false) FROM pg_stat_archiver`, wal).Scan(&done); err != nil {
			return err
		}
		if done {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("segment %s not archived: %w", wal, ctx.Err())
		case <-time.After(200 * time.Millisecond):
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
