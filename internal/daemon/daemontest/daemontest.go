// Package daemontest runs an in-process pgtenant daemon against a pgtest
// cluster, with a private catalog database, for tests that go through the API.
package daemontest

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pgtenant/pgtenant/internal/api"
	"github.com/pgtenant/pgtenant/internal/catalog"
	"github.com/pgtenant/pgtenant/internal/config"
	"github.com/pgtenant/pgtenant/internal/daemon"
	"github.com/pgtenant/pgtenant/internal/jobs"
	"github.com/pgtenant/pgtenant/internal/patroni"
	"github.com/pgtenant/pgtenant/internal/patroni/patronitest"
	"github.com/pgtenant/pgtenant/internal/pgtest"
	"github.com/pgtenant/pgtenant/internal/pooler"
	"github.com/pgtenant/pgtenant/internal/templates"
)

// Config returns the configuration Start uses before mutate: a fresh catalog
// database on pg, a token file in a temp dir, quick job timings.
func Config(t testing.TB, pg *pgtest.Cluster) config.Config {
	t.Helper()
	cfg := config.Default()
	cfg.Listen = "127.0.0.1:0"
	cfg.Catalog.DSN = pg.PrimaryDSN(pg.NewDatabase(t))
	cfg.TokenFile = filepath.Join(t.TempDir(), "token")
	cfg.Jobs.Backoff = config.Duration(50 * time.Millisecond)
	cfg.Jobs.Lease = config.Duration(5 * time.Second)
	cfg.Pacer.PollInterval = config.Duration(50 * time.Millisecond)
	cfg.Reconcile.Interval = 0
	// Tests create more tenants than a test cluster (100 connections)
	// admits at the default tier's limit; admission has tests of its own.
	cfg.Provision.ConnectionOvercommit = 0
	// Pools keep the size a test gives them: growing with the test's
	// creates would build spares behind every test (provision's pool tests
	// turn it on).
	cfg.Provision.MaxPoolSize = 0
	return cfg
}

// Start runs a daemon with cfg until the test ends and returns it with a
// client (over HTTPS, trusting the certificate, when cfg has one).
func Start(t testing.TB, pg *pgtest.Cluster, cfg config.Config) (*daemon.Daemon, *api.Client) {
	t.Helper()
	return start(t, pg, daemon.Options{Config: cfg})
}

// StartPooled is Start with a PgBouncer in front of the cluster (run by
// the daemon in a temp dir on a free port, stopped with it).
func StartPooled(t testing.TB, pg *pgtest.Cluster, cfg config.Config) (*daemon.Daemon, *api.Client) {
	t.Helper()
	return start(t, pg, daemon.Options{Config: cfg, Poolers: map[string]config.PoolerConfig{"local": socketPooler(t, pg.SocketDir())}})
}

// socketPooler is Pooler reaching its server through the Unix socket in
// dir, as `up` makes it.
func socketPooler(t testing.TB, dir string) config.PoolerConfig {
	pc := Pooler(t)
	pc.ServerSocketDir = dir
	return pc
}

// Pooler is a pooler block for a test: a temp dir, a free loopback port,
// quick syncs, stopped with the daemon.
func Pooler(t testing.TB) config.PoolerConfig {
	t.Helper()
	dir := filepath.Join(pgtest.TempDir(t), "pooler")
	port, err := pooler.LocalPort(dir)
	if err != nil {
		t.Fatal(err)
	}
	pc := config.DefaultPooler()
	pc.Listen = "127.0.0.1:" + strconv.Itoa(port)
	pc.Dir = dir
	pc.SyncInterval = config.Duration(2 * time.Second)
	stop := false
	pc.KeepRunning = &stop
	return pc
}

func start(t testing.TB, pg *pgtest.Cluster, opts daemon.Options) (*daemon.Daemon, *api.Client) {
	t.Helper()
	opts.Managed, opts.Logger = []catalog.Cluster{managed(pg)}, pgtest.Logger(t)
	d, _ := run(t, opts)
	return d, client(t, d, opts.Config)
}

// run runs a daemon with opts until the test ends, or until stop, which
// waits until it has stopped.
func run(t testing.TB, opts daemon.Options) (d *daemon.Daemon, stop func()) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	d, err := daemon.New(ctx, opts)
	if err != nil {
		cancel()
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- d.Run(ctx) }()
	var once sync.Once
	stop = func() {
		once.Do(func() {
			cancel()
			if err := <-done; err != nil {
				t.Errorf("daemon: %v", err)
			}
		})
	}
	t.Cleanup(stop)
	return d, stop
}

// StartCancellable is Start, plus a function that stops the daemon before
// the test ends (as a shutdown would), waiting until it has stopped.
func StartCancellable(t testing.TB, pg *pgtest.Cluster, cfg config.Config) (*api.Client, func()) {
	t.Helper()
	return StartLogged(t, pg, cfg, pgtest.Logger(t))
}

// StartLogged is StartCancellable with the daemon logging to log: for tests
// that read what the daemon logs.
func StartLogged(t testing.TB, pg *pgtest.Cluster, cfg config.Config, log *slog.Logger) (*api.Client, func()) {
	t.Helper()
	d, stop := run(t, daemon.Options{Config: cfg, Managed: []catalog.Cluster{managed(pg)}, Logger: log})
	return client(t, d, cfg), stop
}

// client is an API client of d; with TLS it trusts d's certificate (tests
// use self-signed ones).
func client(t testing.TB, d *daemon.Daemon, cfg config.Config) *api.Client {
	t.Helper()
	c := api.NewClient(d.URL(), d.Token())
	if cfg.TLSCertFile != "" {
		pem, err := os.ReadFile(cfg.TLSCertFile)
		if err != nil {
			t.Fatal(err)
		}
		if err := c.TrustCA(pem); err != nil {
			t.Fatal(err)
		}
	}
	return c
}

// StartClusters runs a daemon whose catalog is on pgs[0] with every
// cluster of pgs managed, named after them (local, local2, …), each with
// a PgBouncer in front when pooled. stop stops it before the test ends,
// waiting until it has stopped (a job in progress goes back to the queue).
func StartClusters(t testing.TB, pgs []*pgtest.Cluster, cfg config.Config, pooled bool) (d *daemon.Daemon, c *api.Client, stop func()) {
	t.Helper()
	opts := daemon.Options{Config: cfg, Logger: pgtest.Logger(t), Poolers: map[string]config.PoolerConfig{}}
	for _, pg := range pgs {
		opts.Managed = append(opts.Managed, managed(pg))
		if pooled {
			opts.Poolers[pg.Name()] = socketPooler(t, pg.SocketDir())
		}
	}
	d, stop = run(t, opts)
	return d, client(t, d, cfg), stop
}

// StartOptions runs a daemon with opts (logging to the test when
// opts.Logger is nil) and returns it with a client and a stop that waits
// until it has stopped: for tests that give the daemon clusters or poolers
// of their own (Managed, Poolers).
func StartOptions(t testing.TB, opts daemon.Options) (d *daemon.Daemon, c *api.Client, stop func()) {
	t.Helper()
	if opts.Logger == nil {
		opts.Logger = pgtest.Logger(t)
	}
	d, stop = run(t, opts)
	return d, client(t, d, opts.Config), stop
}

// Following runs a daemon over pgs (as StartClusters, unpooled) that
// follows the Patroni cluster pc registered as name, as `cluster add
// --patroni` does, with a PgBouncer in front of pc: a first daemon
// registers it, and the one returned is started again with the pooler (a
// pooler block is read at start).
func Following(t testing.TB, ctx context.Context, cfg config.Config, pgs []*pgtest.Cluster, pc *patronitest.Cluster, name string) (*daemon.Daemon, *api.Client) {
	t.Helper()
	var local []catalog.Cluster
	for _, pg := range pgs {
		local = append(local, managed(pg))
	}
	_, c, stop := StartOptions(t, daemon.Options{Config: cfg, Managed: local})
	// The DSN's host and port are nobody's: the leader's replace them.
	dsn := fmt.Sprintf("host=192.0.2.1 port=1 user=%s password=%s dbname=postgres sslmode=disable connect_timeout=2",
		patroni.SuperuserName, pc.Passwords.Superuser)
	if _, err := c.AddCluster(ctx, api.AddClusterRequest{Name: name, DSN: dsn, Patroni: pc.URLs}); err != nil {
		t.Fatal(err)
	}
	stop()
	d, c, _ := StartOptions(t, daemon.Options{Config: cfg, Managed: local, Poolers: map[string]config.PoolerConfig{name: socketPooler(t, pc.SocketDir())}})
	return d, c
}

// WaitFollows waits up to 90 s until the daemon behind c has cluster name
// at port: the port of the Patroni node it follows as the new leader.
func WaitFollows(t testing.TB, ctx context.Context, c *api.Client, name string, port int) {
	t.Helper()
	want := fmt.Sprintf("port=%d", port)
	var dsn string
	patronitest.WaitFor(t, ctx, 90*time.Second, fmt.Sprintf("the daemon to follow the leader at port %d", port), func() bool {
		cl, err := c.Cluster(ctx, name)
		dsn = cl.DSN
		return err == nil && strings.Contains(dsn, want)
	}, func() string { return name + " at " + dsn })
}

// Managed is pg as `up` registers it: its primary's and standbys' DSNs.
func Managed(pg *pgtest.Cluster) catalog.Cluster { return managed(pg) }

func managed(pg *pgtest.Cluster) catalog.Cluster {
	m := catalog.Cluster{Name: pg.Name(), DSN: pg.PrimaryDSN("postgres")}
	for _, s := range pg.Standbys() {
		m.StandbyDSNs = append(m.StandbyDSNs, pg.DSN(s, "postgres"))
	}
	return m
}

// CatalogDB is the name of cfg's catalog database (Config's private one).
func CatalogDB(t testing.TB, cfg config.Config) string {
	t.Helper()
	cc, err := pgx.ParseConfig(cfg.Catalog.DSN)
	if err != nil {
		t.Fatal(err)
	}
	return cc.Database
}

// CatalogConn is a connection of the test's own to cfg's catalog on pg,
// closed when the test ends: for reading and arranging catalog rows.
func CatalogConn(t testing.TB, pg *pgtest.Cluster, cfg config.Config) *pgx.Conn {
	t.Helper()
	return pg.Conn(t, CatalogDB(t, cfg))
}

// CreateTemplate creates a template from files and waits until every
// build it started has succeeded.
func CreateTemplate(t testing.TB, c *api.Client, name string, files []templates.Upload) templates.Added {
	t.Helper()
	ctx := pgtest.Context(t)
	added, err := c.CreateTemplate(ctx, name, files)
	if err != nil {
		t.Fatal(err)
	}
	for _, j := range added.BuildJobs {
		if j, err := c.WaitJob(ctx, j.ID, nil); err != nil || j.State != jobs.Succeeded {
			t.Fatalf("build job %d of template %s: %s %v: %s", j.ID, name, j.State, err, j.LastError)
		}
	}
	return added
}
