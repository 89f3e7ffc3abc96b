package pooler_test

import (
	"context"
	"errors"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/pgtenant/pgtenant/internal/cluster"
	"github.com/pgtenant/pgtenant/internal/pgtest"
	"github.com/pgtenant/pgtenant/internal/pooler"
	"github.com/pgtenant/pgtenant/internal/tenant"
)

var pg *pgtest.Cluster

func TestMain(m *testing.M) {
	os.Exit(pgtest.Main(m, pgtest.Options{}, &pg))
}

// fixture is a pooler in front of the test cluster whose entries a test sets.
type fixture struct {
	front   *pooler.Front
	mu      sync.Mutex
	entries []pooler.Entry
	reloads atomic.Int64
}

func (fx *fixture) set(es ...pooler.Entry) {
	fx.mu.Lock()
	defer fx.mu.Unlock()
	fx.entries = es
}

// role makes a login role with a database of its own and returns its entry
// and password.
func role(t *testing.T, mode string) (pooler.Entry, string) {
	t.Helper()
	ctx := pgtest.Context(t)
	name := tenant.PhysicalName(tenant.NewID())
	password, verifier := tenant.NewPassword()
	conn := pg.Conn(t, "postgres")
	for _, sql := range []string{
		"CREATE ROLE " + cluster.Ident(name) + " LOGIN PASSWORD " + cluster.Literal(verifier),
		"CREATE DATABASE " + cluster.Ident(name) + " OWNER " + cluster.Ident(name),
	} {
		if _, err := conn.Exec(ctx, sql); err != nil {
			t.Fatal(err)
		}
	}
	t.Cleanup(func() {
		c, err := pgx.Connect(context.Background(), pg.PrimaryDSN("postgres"))
		if err != nil {
			return
		}
		defer c.Close(context.Background())
		_, _ = c.Exec(context.Background(), "DROP DATABASE IF EXISTS "+cluster.Ident(name)+" WITH (FORCE)")
		_, _ = c.Exec(context.Background(), "DROP ROLE IF EXISTS "+cluster.Ident(name))
	})
	return pooler.Entry{Name: name, Database: name, Verifier: verifier, PoolMode: mode, PoolSize: 2, MaxDBConnections: 2}, password
}

func start(t *testing.T) *fixture {
	t.Helper()
	proc, err := pooler.NewProcess(filepath.Join(pgtest.TempDir(t), "pooler"))
	if err != nil {
		t.Fatal(err)
	}
	port, err := pooler.LocalPort(proc.Dir)
	if err != nil {
		t.Fatal(err)
	}
	fx := &fixture{}
	fx.front = &pooler.Front{Cluster: "local", Proc: proc,
		Settings: pooler.Settings{ListenHost: "127.0.0.1", ListenPort: port, ServerHost: "127.0.0.1", ServerPort: pg.Primary().Port,
			MaxClientConn: 200, ServerIdleTimeout: 5 * time.Second, QueryWaitTimeout: 10 * time.Second},
		Source: func(context.Context) ([]pooler.Entry, map[string]string, error) {
			fx.mu.Lock()
			defer fx.mu.Unlock()
			return append([]pooler.Entry(nil), fx.entries...), nil, nil
		},
		StopOnExit: true, Logger: pgtest.Logger(t), CheckInterval: 200 * time.Millisecond,
		OnReload: func() { fx.reloads.Add(1) }}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- fx.front.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		<-done
	})
	if err := fx.front.Sync(pgtest.Context(t)); err != nil {
		t.Fatal(err)
	}
	return fx
}

func (fx *fixture) connect(ctx context.Context, db, user, password string) (*pgx.Conn, error) {
	cfg, err := pgx.ParseConfig("postgres://" + fx.front.PublicAddr() + "/" + db + "?sslmode=disable")
	if err != nil {
		return nil, err
	}
	cfg.User, cfg.Password = user, password
	cfg.ConnectTimeout = 5 * time.Second
	return pgx.ConnectConfig(ctx, cfg)
}

// fatalCode returns the error's message from PgBouncer or PostgreSQL.
func message(err error) string {
	var pe *pgconn.PgError
	if errors.As(err, &pe) {
		return pe.Message
	}
	if err == nil {
		return ""
	}
	return err.Error()
}

func TestPooler_IdentityBoundEntries(t *testing.T) {
	ctx := pgtest.Context(t)
	fx := start(t)
	a, pwA := role(t, pooler.ModeSession)
	b, pwB := role(t, pooler.ModeTransaction)
	fx.set(a, b)
	if err := fx.front.Sync(ctx); err != nil {
		t.Fatal(err)
	}

	conn, err := fx.connect(ctx, a.Name, a.Name, pwA)
	if err != nil {
		t.Fatalf("tenant a through the pooler: %v", err)
	}
	var user, db string
	if err := conn.QueryRow(ctx, "SELECT current_user, current_database()").Scan(&user, &db); err != nil {
		t.Fatal(err)
	}
	conn.Close(ctx)
	if got, want := user+"/"+db, a.Name+"/"+a.Name; got != want {
		t.Errorf("server session is %s, want %s (the client's own role, with its own SCRAM keys)", got, want)
	}

	for _, c := range []struct{ what, db, user, password, want string }{
		{"wrong password", a.Name, a.Name, "wrong", "SASL authentication failed"},
		{"another tenant's entry", b.Name, a.Name, pwA, "login rejected"},
		{"the admin console", "pgbouncer", a.Name, pwA, "not allowed"},
		{"a database without an entry", "postgres", a.Name, pwA, "login rejected"},
		{"an unknown user", a.Name, "t_zzzzzzzzzzzz", "x", "login rejected"},
	} {
		conn, err := fx.connect(ctx, c.db, c.user, c.password)
		if err == nil {
			conn.Close(ctx)
			t.Errorf("%s: logged in, want %q", c.what, c.want)
			continue
		}
		if got := message(err); !strings.Contains(got, c.want) {
			t.Errorf("%s: %q, want %q", c.what, got, c.want)
		}
	}

	// Suspended: disabled, sessions killed, new logins refused with a clear error.
	conn, err = fx.connect(ctx, b.Name, b.Name, pwB)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	b.Disabled = true
	fx.set(a, b)
	if err := fx.front.Sync(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := conn.Exec(ctx, "SELECT 1"); err == nil {
		t.Error("a suspended tenant's session still runs queries through the pooler")
	}
	if c, err := fx.connect(ctx, b.Name, b.Name, pwB); err == nil {
		c.Close(ctx)
		t.Error("a suspended tenant logged in through the pooler")
	} else if got := message(err); !strings.Contains(got, "is disabled") {
		t.Errorf("suspended: %q, want a 'disabled' error", got)
	}
	// Resumed: in again at once.
	b.Disabled = false
	fx.set(a, b)
	if err := fx.front.Sync(ctx); err != nil {
		t.Fatal(err)
	}
	c, err := fx.connect(ctx, b.Name, b.Name, pwB)
	if err != nil {
		t.Fatalf("resumed tenant: %v", err)
	}
	c.Close(ctx)

	// Dropped: the entry goes, its sessions with it.
	c, err = fx.connect(ctx, b.Name, b.Name, pwB)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close(ctx)
	fx.set(a)
	if err := fx.front.Sync(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Exec(ctx, "SELECT 1"); err == nil {
		t.Error("a dropped tenant's session still runs queries through the pooler")
	}
	if c, err := fx.connect(ctx, b.Name, b.Name, pwB); err == nil {
		c.Close(ctx)
		t.Error("a dropped tenant logged in through the pooler")
	}
	if s := fx.front.Snapshot(); len(s.Drift) != 0 || s.Entries != 1 || !s.Up {
		t.Errorf("snapshot: up %v, %d entries, drift %v; want up, 1 entry, no drift", s.Up, s.Entries, s.Drift)
	}
}

func TestPooler_RestartedWithTheSameEntries(t *testing.T) {
	ctx := pgtest.Context(t)
	fx := start(t)
	a, pwA := role(t, pooler.ModeTransaction)
	b, pwB := role(t, pooler.ModeSession)
	b.Disabled = true
	fx.set(a, b)
	if err := fx.front.Sync(ctx); err != nil {
		t.Fatal(err)
	}
	pid := fx.front.Proc.PID()
	if pid == 0 {
		t.Fatal("pooler not running")
	}
	if err := syscall.Kill(pid, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(20 * time.Second)
	for {
		if p := fx.front.Proc.PID(); p != 0 && p != pid && fx.front.Snapshot().Restarts > 0 && fx.front.Snapshot().Up {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("pooler not restarted within 20 s: %+v", fx.front.Snapshot())
		}
		time.Sleep(100 * time.Millisecond)
	}
	conn, err := fx.connect(ctx, a.Name, a.Name, pwA)
	if err != nil {
		t.Fatalf("after the restart: %v", err)
	}
	conn.Close(ctx)
	// The suspended tenant is disabled again: runtime state is not in the files.
	if err := fx.front.Sync(ctx); err != nil {
		t.Fatal(err)
	}
	if c, err := fx.connect(ctx, b.Name, b.Name, pwB); err == nil {
		c.Close(ctx)
		t.Error("a suspended tenant logged in after the pooler's restart")
	}
}

func TestPooler_BurstOfSyncsCoalesced(t *testing.T) {
	ctx := pgtest.Context(t)
	fx := start(t)
	var made []pooler.Entry
	for i := 0; i < 40; i++ {
		e, _ := role(t, pooler.ModeTransaction)
		made = append(made, e)
	}
	before := fx.reloads.Load()
	var es []pooler.Entry
	var wg sync.WaitGroup
	for _, e := range made {
		time.Sleep(5 * time.Millisecond) // a change every 5 ms, each waiting for the pooler
		fx.mu.Lock()
		es = append(es, e)
		fx.entries = append([]pooler.Entry(nil), es...)
		fx.mu.Unlock()
		wg.Go(func() {
			if err := fx.front.Sync(ctx); err != nil {
				t.Error(err)
			}
		})
	}
	wg.Wait()
	got := fx.reloads.Load() - before
	t.Logf("40 changes, %d reloads", got)
	if got > 8 {
		t.Errorf("40 changes cost %d reloads, want them batched", got)
	}
	if s := fx.front.Snapshot(); s.Entries != 40 || len(s.Drift) != 0 {
		t.Errorf("after the burst: %d entries, drift %v", s.Entries, s.Drift)
	}
}

func TestPooler_PauseQueuesClientsUntilResume(t *testing.T) {
	ctx := pgtest.Context(t)
	fx := start(t)
	a, pwA := role(t, pooler.ModeTransaction)
	fx.set(a)
	if err := fx.front.Sync(ctx); err != nil {
		t.Fatal(err)
	}
	conn, err := fx.connect(ctx, a.Name, a.Name, pwA)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	if err := fx.front.Pause(ctx, a.Name); err != nil {
		t.Fatal(err)
	}
	// A sync leaves a paused entry paused.
	if err := fx.front.Sync(ctx); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	start := time.Now()
	go func() {
		_, err := conn.Exec(ctx, "SELECT 1")
		done <- err
	}()
	select {
	case err := <-done:
		t.Fatalf("a query ran while the tenant was paused (err %v)", err)
	case <-time.After(500 * time.Millisecond):
	}
	if err := fx.front.Resume(ctx, a.Name); err != nil {
		t.Fatal(err)
	}
	if err := <-done; err != nil {
		t.Fatalf("the queued query failed after resume: %v", err)
	}
	if waited := time.Since(start); waited < 500*time.Millisecond {
		t.Errorf("the query waited %s, want it held until resume", waited)
	}
}

// TestProcess_CancelledStartLeavesNothingRunning: a daemon stopped while
// its PgBouncer starts (pgbouncer -d has forked, its pid file not written
// yet) leaves no PgBouncer behind, even one kept running across daemon
// restarts (StopOnExit false): the cancelled start stops what it began.
func TestProcess_CancelledStartLeavesNothingRunning(t *testing.T) {
	proc, err := pooler.NewProcess(filepath.Join(pgtest.TempDir(t), "pooler"))
	if err != nil {
		t.Fatal(err)
	}
	port, err := pooler.LocalPort(proc.Dir)
	if err != nil {
		t.Fatal(err)
	}
	front := &pooler.Front{Cluster: "local", Proc: proc,
		Settings: pooler.Settings{ListenHost: "127.0.0.1", ListenPort: port, ServerHost: "127.0.0.1", ServerPort: pg.Primary().Port,
			MaxClientConn: 20, ServerIdleTimeout: 5 * time.Second, QueryWaitTimeout: 10 * time.Second},
		Source: func(context.Context) ([]pooler.Entry, map[string]string, error) { return nil, nil, nil },
		Logger: pgtest.Logger(t), CheckInterval: time.Second}
	t.Cleanup(func() { _ = proc.Stop() })
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if err := front.Run(ctx); err != nil {
		t.Fatal(err)
	}
	if pid := proc.PID(); pid != 0 {
		t.Errorf("a PgBouncer (pid %d) runs after its start was cancelled", pid)
	}
	if c, err := net.DialTimeout("tcp", front.Addr(), time.Second); err == nil {
		c.Close()
		t.Errorf("something listens on %s after the cancelled start", front.Addr())
	}
}
