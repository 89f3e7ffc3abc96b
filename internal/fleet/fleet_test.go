package fleet_test

import (
	"context"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pgtenant/pgtenant/internal/cluster"
	"github.com/pgtenant/pgtenant/internal/fleet"
	"github.com/pgtenant/pgtenant/internal/pgtest"
)

func testCtx(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	t.Cleanup(cancel)
	return ctx
}

// TestCluster_InitRestartStop walks a managed cluster through its life: init
// with a standby, data replicated, stop, restart on the same ports with the
// same data, and a half-made standby repaired on the next start.
func TestCluster_InitRestartStop(t *testing.T) {
	ctx := testCtx(t)
	c, err := pgtest.Start(ctx, pgtest.Options{Standbys: 1})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()

	conn, err := pgx.Connect(ctx, c.PrimaryDSN("postgres"))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := conn.Exec(ctx, `CREATE TABLE marker (v text); INSERT INTO marker VALUES ('kept')`); err != nil {
		t.Fatal(err)
	}
	var checksums string
	if err := conn.QueryRow(ctx, `SHOW data_checksums`).Scan(&checksums); err != nil {
		t.Fatal(err)
	}
	conn.Close(ctx)
	if checksums != "on" {
		t.Errorf("data_checksums = %q, want on", checksums)
	}

	// The standby replays it.
	sb := c.Standbys()[0]
	waitFor(t, ctx, func() bool {
		sconn, err := pgx.Connect(ctx, c.DSN(sb, "postgres"))
		if err != nil {
			return false
		}
		defer sconn.Close(ctx)
		var v string
		return sconn.QueryRow(ctx, `SELECT v FROM marker`).Scan(&v) == nil && v == "kept"
	})

	// The health probe sees the standby streaming.
	cl, err := cluster.New("local", c.PrimaryDSN("postgres"), nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	h, err := cl.Probe(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if got := len(h.Standbys); got != 1 || h.Standbys[0].State != "streaming" {
		t.Fatalf("standbys = %+v, want one streaming", h.Standbys)
	}
	cl.Close()

	primaryPort := c.Primary().Port
	if err := c.Stop(ctx); err != nil {
		t.Fatal(err)
	}
	// Everything stopped: the ports are free again.
	for _, n := range append([]fleet.Node{c.Primary()}, c.Standbys()...) {
		if _, err := os.Stat(filepath.Join(c.DataDir(n.Name), "postmaster.pid")); err == nil {
			t.Errorf("%s still has a postmaster.pid after Stop", n.Name)
		}
	}

	// Mark the standby half-made, as an interrupted pg_basebackup leaves it;
	// the next start must move it aside and make it again, keeping the primary.
	statePath := filepath.Join(c.Dir(), "local", "cluster.json")
	st, err := os.ReadFile(statePath)
	if err != nil {
		t.Fatal(err)
	}
	st = []byte(strings.Replace(string(st), `"name": "standby1",`, `"name": "standby1", "ready": false,`, 1))
	st = []byte(strings.Replace(string(st), `"ready": true
    }
  ]`, `"ready": false
    }
  ]`, 1))
	if err := os.WriteFile(statePath, st, 0o600); err != nil {
		t.Fatal(err)
	}

	reopened, err := fleet.Open(fleet.Options{Dir: filepath.Join(c.Dir(), "local"), Standbys: 1, Fast: true})
	if err != nil {
		t.Fatal(err)
	}
	if err := reopened.Start(ctx); err != nil {
		t.Fatal(err)
	}
	defer reopened.Stop(ctx)
	if got := reopened.Primary().Port; got != primaryPort {
		t.Errorf("restarted primary port = %d, want %d", got, primaryPort)
	}
	aside, _ := filepath.Glob(filepath.Join(c.Dir(), "local", "standby1.incomplete-*"))
	if len(aside) != 1 {
		t.Errorf("half-made standby moved aside to %v, want one directory", aside)
	}
	conn, err = pgx.Connect(ctx, reopened.PrimaryDSN("postgres"))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	var v string
	if err := conn.QueryRow(ctx, `SELECT v FROM marker`).Scan(&v); err != nil || v != "kept" {
		t.Fatalf("after restart marker = %q, %v; want kept", v, err)
	}
	waitFor(t, ctx, func() bool {
		var n int
		return conn.QueryRow(ctx, `SELECT count(*) FROM pg_stat_replication WHERE state = 'streaming'`).Scan(&n) == nil && n == 1
	})
	// A second Start on a running cluster is a no-op.
	if err := reopened.Start(ctx); err != nil {
		t.Fatalf("second Start: %v", err)
	}
}

// TestOpen_OtherMajor refuses a data dir made by a PostgreSQL major version
// whose binaries are not installed, and says which.
func TestOpen_OtherMajor(t *testing.T) {
	dir := pgtest.TempDir(t)
	if err := os.MkdirAll(filepath.Join(dir, "primary"), 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "primary", "PG_VERSION"), []byte("9\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	_, err := fleet.Open(fleet.Options{Dir: dir})
	if err == nil || !strings.Contains(err.Error(), "PostgreSQL 9") {
		t.Fatalf("Open = %v, want an error naming PostgreSQL 9", err)
	}
}

// TestStart_HalfInitialisedPrimary moves an interrupted initdb aside (never
// deleting it) and initialises again.
func TestStart_HalfInitialisedPrimary(t *testing.T) {
	ctx := testCtx(t)
	base := pgtest.TempDir(t)
	dir := filepath.Join(base, "local")
	if err := os.MkdirAll(filepath.Join(dir, "primary", "base"), 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "primary", "leftover"), []byte("x"), 0o600); err != nil {
		t.Fatal(err)
	}
	c, err := fleet.Open(fleet.Options{Dir: dir, Fast: true})
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Start(ctx); err != nil {
		t.Fatal(err)
	}
	defer c.Stop(ctx)
	aside, _ := filepath.Glob(filepath.Join(dir, "primary.incomplete-*", "leftover"))
	if len(aside) != 1 {
		t.Errorf("leftover kept at %v, want one copy moved aside", aside)
	}
}

// TestStart_PortTaken gives a clear error when a recorded port is taken.
func TestStart_PortTaken(t *testing.T) {
	ctx := testCtx(t)
	c, err := pgtest.Start(ctx, pgtest.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if err := c.Stop(ctx); err != nil {
		t.Fatal(err)
	}
	l, err := net.Listen("tcp", fmt.Sprintf("127.0.0.1:%d", c.Primary().Port))
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	err = c.Start(ctx)
	if err == nil || !strings.Contains(err.Error(), "is taken by another process") {
		t.Fatalf("Start = %v, want a port-taken error", err)
	}
}

func waitFor(t *testing.T, ctx context.Context, cond func() bool) {
	t.Helper()
	for !cond() {
		select {
		case <-ctx.Done():
			t.Fatal("condition not met before timeout")
		case <-time.After(100 * time.Millisecond):
		}
	}
}
