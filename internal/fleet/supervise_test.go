package fleet_test

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pgtenant/pgtenant/internal/fleet"
	"github.com/pgtenant/pgtenant/internal/pgtest"
)

// TestSupervisor_RestartsKilledNodes kills -9 the postmaster of a standby,
// then of the primary: the supervisor restarts each, with a log line and an
// event per attempt; the primary answers queries again and the standby
// streams again (it replays what the primary writes after each restart).
func TestSupervisor_RestartsKilledNodes(t *testing.T) {
	ctx := testCtx(t)
	c, err := pgtest.Start(ctx, pgtest.Options{Standbys: 1})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	rec, logs := &events{}, &pgtest.LogBuffer{}
	defer runSupervisor(t, &fleet.Supervisor{Cluster: c.Cluster, Interval: 50 * time.Millisecond,
		MinBackoff: 50 * time.Millisecond, MaxBackoff: time.Second, MaxRestarts: 20,
		Logger: slog.New(slog.NewTextHandler(logs, nil)), OnEvent: rec.add})()

	sb := c.Standbys()[0]
	oldStandby := kill9(t, c, sb.Name)
	waitFor(t, ctx, func() bool { return rec.count(sb.Name, fleet.OutcomeRestarted) == 1 })
	if got := postmasterPID(t, c, sb.Name); got == oldStandby {
		t.Errorf("standby postmaster pid = %d after the restart, want a new one", got)
	}
	waitReplicated(t, ctx, c, "after standby restart")

	oldPrimary := kill9(t, c, "primary")
	waitFor(t, ctx, func() bool { return rec.count("primary", fleet.OutcomeRestarted) == 1 })
	if got := postmasterPID(t, c, "primary"); got == oldPrimary {
		t.Errorf("primary postmaster pid = %d after the restart, want a new one", got)
	}
	// The standby reconnects to the restarted primary on its own.
	waitReplicated(t, ctx, c, "after primary restart")

	for _, ev := range rec.all() {
		if ev.Outcome == fleet.OutcomeGaveUp {
			t.Errorf("event %+v, want no give-up", ev)
		}
	}
	for _, node := range []string{sb.Name, "primary"} {
		if !logs.HasLine(`msg="node restarted"`, "component=supervisor", "cluster=local", "node="+node, "attempt=1", "outcome=restarted") {
			t.Errorf("log lacks the restart of %s:\n%s", node, logs)
		}
	}
}

// TestSupervisor_GivesUpOnNodeThatCannotStart breaks a standby's
// postgresql.conf and kills it: after MaxRestarts failed attempts the
// supervisor gives up on it with an ERROR naming the node and its log, makes
// no further attempt, and still restarts the primary. Started again by hand
// once fixed, the standby is supervised again.
func TestSupervisor_GivesUpOnNodeThatCannotStart(t *testing.T) {
	ctx := testCtx(t)
	c, err := pgtest.Start(ctx, pgtest.Options{Standbys: 1})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	rec, logs := &events{}, &pgtest.LogBuffer{}
	defer runSupervisor(t, &fleet.Supervisor{Cluster: c.Cluster, Interval: 50 * time.Millisecond,
		MinBackoff: 10 * time.Millisecond, MaxBackoff: 40 * time.Millisecond, MaxRestarts: 3,
		Logger: slog.New(slog.NewTextHandler(logs, nil)), OnEvent: rec.add})()

	sb := c.Standbys()[0].Name
	conf := filepath.Join(c.DataDir(sb), "postgresql.conf")
	good, err := os.ReadFile(conf)
	if err != nil {
		t.Fatal(err)
	}
	// The running server does not read it again; the next start fails on it.
	if err := os.WriteFile(conf, append(append([]byte(nil), good...), "this is not a setting\n"...), 0o600); err != nil {
		t.Fatal(err)
	}
	kill9(t, c, sb)
	waitFor(t, ctx, func() bool { return rec.count(sb, fleet.OutcomeGaveUp) == 1 })

	var attempts []int
	for _, ev := range rec.all() {
		if ev.Node == sb && ev.Outcome == fleet.OutcomeFailed {
			attempts = append(attempts, ev.Attempt)
			if ev.Err == nil || !strings.Contains(ev.Err.Error(), "start "+sb) {
				t.Errorf("failed attempt %d: err = %v, want the start error", ev.Attempt, ev.Err)
			}
		}
	}
	if got, want := fmt.Sprint(attempts), "[1 2 3]"; got != want {
		t.Errorf("failed attempts = %s, want %s", got, want)
	}
	gaveUp := ""
	for _, line := range strings.Split(logs.String(), "\n") {
		if strings.Contains(line, "level=ERROR") {
			gaveUp = line
		}
	}
	for _, want := range []string{"gave up restarting " + sb + " after 3 failed attempts",
		filepath.Join(c.DataDir(sb), "startup.log"), "node=" + sb, "outcome=gave_up", "run it again"} {
		if !strings.Contains(gaveUp, want) {
			t.Errorf("give-up line %q lacks %q", gaveUp, want)
		}
	}

	// The other nodes are still supervised.
	kill9(t, c, "primary")
	waitFor(t, ctx, func() bool { return rec.count("primary", fleet.OutcomeRestarted) == 1 })
	if got := rec.count(sb, fleet.OutcomeFailed); got != 3 {
		t.Errorf("failed attempts on %s after giving up = %d, want still 3", sb, got)
	}
	conn, err := pgx.Connect(ctx, c.PrimaryDSN("postgres"))
	if err != nil {
		t.Fatalf("primary after restart: %v", err)
	}
	conn.Close(ctx)

	// Fixed and started by hand, the standby is supervised again.
	if err := os.WriteFile(conf, good, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := c.StartNode(ctx, sb); err != nil {
		t.Fatal(err)
	}
	waitFor(t, ctx, func() bool {
		return logs.HasLine(`msg="node runs again; supervising it"`, "node="+sb)
	})
	kill9(t, c, sb)
	waitFor(t, ctx, func() bool { return rec.count(sb, fleet.OutcomeRestarted) == 1 })
	waitReplicated(t, ctx, c, "after the fixed standby's restart")
}

// runSupervisor runs s until the returned function is called; that function
// waits for Run to return (call it before stopping the cluster).
func runSupervisor(t *testing.T, s *fleet.Supervisor) func() {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- s.Run(ctx) }()
	return func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("supervisor Run = %v, want nil", err)
		}
	}
}

// postmasterPID reads a node's postmaster pid from the first line of its
// postmaster.pid.
func postmasterPID(t *testing.T, c *pgtest.Cluster, node string) int {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(c.DataDir(node), "postmaster.pid"))
	if err != nil {
		t.Fatal(err)
	}
	first, _, _ := strings.Cut(string(b), "\n")
	pid, err := strconv.Atoi(strings.TrimSpace(first))
	if err != nil {
		t.Fatalf("postmaster.pid of %s: %v", node, err)
	}
	return pid
}

// kill9 kills a node's postmaster with SIGKILL, as a crash would, and
// returns its pid.
func kill9(t *testing.T, c *pgtest.Cluster, node string) int {
	t.Helper()
	pid := postmasterPID(t, c, node)
	if err := syscall.Kill(pid, syscall.SIGKILL); err != nil {
		t.Fatalf("kill -9 %s (pid %d): %v", node, pid, err)
	}
	return pid
}

// waitReplicated writes a row on the primary and waits until the standby
// has replayed it: the standby streams from the running primary.
func waitReplicated(t *testing.T, ctx context.Context, c *pgtest.Cluster, label string) {
	t.Helper()
	var conn *pgx.Conn
	waitFor(t, ctx, func() bool {
		var err error
		conn, err = pgx.Connect(ctx, c.PrimaryDSN("postgres"))
		return err == nil
	})
	defer conn.Close(ctx)
	if _, err := conn.Exec(ctx, `CREATE TABLE IF NOT EXISTS supervised (label text)`); err != nil {
		t.Fatal(err)
	}
	if _, err := conn.Exec(ctx, `INSERT INTO supervised VALUES ($1)`, label); err != nil {
		t.Fatal(err)
	}
	dsn := c.DSN(c.Standbys()[0], "postgres")
	waitFor(t, ctx, func() bool {
		sconn, err := pgx.Connect(ctx, dsn)
		if err != nil {
			return false
		}
		defer sconn.Close(ctx)
		var n int
		return sconn.QueryRow(ctx, `SELECT count(*) FROM supervised WHERE label = $1`, label).Scan(&n) == nil && n == 1
	})
}

// events records the supervisor's events.
type events struct {
	mu  sync.Mutex
	evs []fleet.RestartEvent
}

func (e *events) add(ev fleet.RestartEvent) {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.evs = append(e.evs, ev)
}

func (e *events) all() []fleet.RestartEvent {
	e.mu.Lock()
	defer e.mu.Unlock()
	return append([]fleet.RestartEvent(nil), e.evs...)
}

func (e *events) count(node, outcome string) int {
	n := 0
	for _, ev := range e.all() {
		if ev.Node == node && ev.Outcome == outcome {
			n++
		}
	}
	return n
}
