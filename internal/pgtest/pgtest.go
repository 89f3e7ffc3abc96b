// Package pgtest starts real, throwaway PostgreSQL clusters for tests: a
// primary and optionally streaming standbys, in a temp dir on free ports,
// through the same fleet code `pgtenant up` uses. It works as root (the
// servers run as the postgres OS user) and as a normal user. The database is
// never mocked.
package pgtest

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"log/slog"
	"net"
	"net/url"
	"os"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pgtenant/pgtenant/internal/cluster"
	"github.com/pgtenant/pgtenant/internal/fleet"
)

// Options choose the shape of a test cluster.
type Options struct {
	// Name is the cluster's name (default local; a second cluster of a
	// test is local2).
	Name     string
	Standbys int
	Settings map[string]string // postgresql.conf over fleet's defaults and the test defaults
}

// Cluster is a running test cluster. Its files are removed by Close.
type Cluster struct {
	*fleet.Cluster
	dir string
}

// testSettings keep test clusters small; fleet.Options.Fast adds fsync=off.
var testSettings = map[string]string{
	"shared_buffers":    "32MB",
	"max_connections":   "100",
	"logging_collector": "off",
}

// Start initialises and starts a cluster.
func Start(ctx context.Context, opts Options) (*Cluster, error) {
	dir, err := os.MkdirTemp("", "pgtest-")
	if err != nil {
		return nil, err
	}
	// The postgres OS user (when we are root) must traverse the temp dir.
	if err := os.Chmod(dir, 0o755); err != nil {
		return nil, err
	}
	settings := map[string]string{}
	for k, v := range testSettings {
		settings[k] = v
	}
	for k, v := range opts.Settings {
		settings[k] = v
	}
	name := opts.Name
	if name == "" {
		name = "local"
	}
	fc, err := fleet.Open(fleet.Options{Dir: dir + "/" + name, Name: name, Standbys: opts.Standbys, Settings: settings, Fast: true})
	if err != nil {
		os.RemoveAll(dir)
		return nil, err
	}
	c := &Cluster{Cluster: fc, dir: dir}
	if err := fc.Start(ctx); err != nil {
		c.Close()
		return nil, err
	}
	if opts.Standbys > 0 {
		if err := c.WaitStreaming(ctx, opts.Standbys); err != nil {
			c.Close()
			return nil, err
		}
	}
	return c, nil
}

// Dir is the temp dir holding the cluster (and free for the test's own files).
func (c *Cluster) Dir() string { return c.dir }

// Close stops the servers and removes the files.
func (c *Cluster) Close() {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	if err := c.Stop(ctx); err != nil {
		fmt.Fprintln(os.Stderr, "pgtest: stop:", err)
	}
	os.RemoveAll(c.dir)
}

// Main is the body of a package's TestMain: it starts one cluster shared by
// the package's tests, stores it in *out, runs the tests and tears it down.
func Main(m *testing.M, opts Options, out **Cluster) int {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	c, err := Start(ctx, opts)
	cancel()
	if err != nil {
		fmt.Fprintln(os.Stderr, "pgtest: start PostgreSQL:", err)
		return 1
	}
	*out = c
	defer c.Close()
	return m.Run()
}

// MainClusters is Main with several clusters (a test of moves between
// them), started one after the other and stored in *out in order.
func MainClusters(m *testing.M, opts []Options, out *[]*Cluster) int {
	for _, o := range opts {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
		c, err := Start(ctx, o)
		cancel()
		if err != nil {
			fmt.Fprintln(os.Stderr, "pgtest: start PostgreSQL:", err)
			for _, c := range *out {
				c.Close()
			}
			return 1
		}
		*out = append(*out, c)
	}
	defer func() {
		for _, c := range *out {
			c.Close()
		}
	}()
	return m.Run()
}

// WaitStreaming waits until n standbys stream from the primary.
func (c *Cluster) WaitStreaming(ctx context.Context, n int) error {
	conn, err := pgx.Connect(ctx, c.PrimaryDSN("postgres"))
	if err != nil {
		return err
	}
	defer conn.Close(ctx)
	for {
		var got int
		if err := conn.QueryRow(ctx, `SELECT count(*) FROM pg_stat_replication WHERE state = 'streaming'`).Scan(&got); err != nil {
			return err
		}
		if got >= n {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("wait for %d streaming standbys (have %d): %w", n, got, ctx.Err())
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// Admin returns a cluster.Cluster for the primary, closed at the end of the test.
func (c *Cluster) Admin(t testing.TB) *cluster.Cluster {
	t.Helper()
	cl, err := cluster.New(c.Name(), c.PrimaryDSN("postgres"), nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(cl.Close)
	return cl
}

// Registry returns a cluster registry holding this cluster (its standbys
// too when standbys), logging through t, closed at the end of the test: for
// a service that a test runs outside a daemon.
func (c *Cluster) Registry(t testing.TB, standbys bool) *cluster.Registry {
	t.Helper()
	var dsns []string
	if standbys {
		for _, s := range c.Standbys() {
			dsns = append(dsns, c.DSN(s, "postgres"))
		}
	}
	return NewRegistry(t, c.Name(), c.PrimaryDSN("postgres"), dsns)
}

// NewRegistry holds one cluster, name, at primary (and standbys), closed at
// the end of the test.
func NewRegistry(t testing.TB, name, primary string, standbys []string) *cluster.Registry {
	t.Helper()
	cl, err := cluster.New(name, primary, standbys, Logger(t))
	if err != nil {
		t.Fatal(err)
	}
	reg := cluster.NewRegistry()
	reg.Put(cl)
	t.Cleanup(reg.Close)
	return reg
}

// OnStandby is dsn (one of the primary's) pointed at the first standby.
func (c *Cluster) OnStandby(t testing.TB, dsn string) string {
	t.Helper()
	u, err := url.Parse(dsn)
	if err != nil {
		t.Fatal(err)
	}
	u.Host = "127.0.0.1:" + strconv.Itoa(c.Standbys()[0].Port)
	return u.String()
}

// Conn opens a superuser connection to a database of the primary, closed at
// the end of the test.
func (c *Cluster) Conn(t testing.TB, database string) *pgx.Conn {
	t.Helper()
	ctx := context.Background()
	conn, err := pgx.Connect(ctx, c.PrimaryDSN(database))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close(context.Background()) })
	return conn
}

// NewDatabase creates an empty database for one test and drops it at the end,
// returning its name. Tests use it for a private catalog.
func (c *Cluster) NewDatabase(t testing.TB) string {
	t.Helper()
	name := "test_" + RandomSuffix()
	conn := c.Conn(t, "postgres")
	ctx := context.Background()
	if _, err := conn.Exec(ctx, "CREATE DATABASE "+cluster.Ident(name)); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		conn, err := pgx.Connect(context.Background(), c.PrimaryDSN("postgres"))
		if err != nil {
			return
		}
		defer conn.Close(context.Background())
		_, _ = conn.Exec(context.Background(), "DROP DATABASE IF EXISTS "+cluster.Ident(name)+" WITH (FORCE)")
	})
	return name
}

// RandomSuffix returns 8 random lowercase hex characters.
func RandomSuffix() string {
	b := make([]byte, 4)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

// TempDir returns a temp dir the postgres OS user can traverse (t.TempDir's
// parent is 0700), removed at the end of the test.
func TempDir(t testing.TB) string {
	t.Helper()
	dir, err := os.MkdirTemp("", "pgtest-")
	if err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	return dir
}

// Logger returns a logger that writes through t.Log, so that a failing test
// shows what the code under test logged. A fuzz test's *testing.F may not log
// while its target runs, so it gets a logger that discards.
func Logger(t testing.TB) *slog.Logger {
	if _, ok := t.(*testing.F); ok {
		return slog.New(slog.DiscardHandler)
	}
	return slog.New(slog.NewTextHandler(testWriter{t}, &slog.HandlerOptions{Level: slog.LevelDebug}))
}

type testWriter struct{ t testing.TB }

func (w testWriter) Write(p []byte) (int, error) {
	w.t.Log(strings.TrimRight(string(p), "\n"))
	return len(p), nil
}

// Connect opens a session with dsn (a tenant's, say), closed at the end of
// the test.
func Connect(t testing.TB, dsn string) *pgx.Conn {
	t.Helper()
	conn, err := pgx.Connect(context.Background(), dsn)
	if err != nil {
		t.Fatalf("connect: %v", err)
	}
	t.Cleanup(func() { conn.Close(context.Background()) })
	return conn
}

// Clock is a clock that a test sets and moves, for code that takes a Now
// function.
type Clock struct {
	mu sync.Mutex
	t  time.Time
}

// NewClock returns a clock at t.
func NewClock(t time.Time) *Clock { return &Clock{t: t} }

// Now is the clock's time.
func (c *Clock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.t
}

// Add moves the clock by d.
func (c *Clock) Add(d time.Duration) {
	c.mu.Lock()
	c.t = c.t.Add(d)
	c.mu.Unlock()
}

// Context is a test's context: cancelled when the test ends, and after 4
// minutes so that a stuck wait fails the test instead of the whole run.
func Context(t testing.TB) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	t.Cleanup(cancel)
	return ctx
}

// RefusedDSN is the DSN of a local port nothing listens on (a free port,
// closed again): a cluster that is down, whose connections are refused.
func RefusedDSN(t testing.TB) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return "postgres://nobody@" + ln.Addr().String() + "/postgres?sslmode=disable&connect_timeout=2"
}

// LogBuffer is a log destination safe for concurrent writers (a daemon's
// goroutines) that a test reads back.
type LogBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *LogBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

// String is everything written so far.
func (l *LogBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// Count counts the occurrences of s in what was written.
func (l *LogBuffer) Count(s string) int { return strings.Count(l.String(), s) }

// HasLine reports whether one line of what was written holds every part.
func (l *LogBuffer) HasLine(parts ...string) bool {
	for _, line := range strings.Split(l.String(), "\n") {
		all := true
		for _, p := range parts {
			all = all && strings.Contains(line, p)
		}
		if all {
			return true
		}
	}
	return false
}
