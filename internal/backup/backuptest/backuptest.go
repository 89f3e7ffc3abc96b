// Package backuptest is the test harness of what needs backups: a small
// managed cluster that archives from its creation with its stanza set up
// (as `pgtenant up` makes one), and a daemon over it that holds the stanza.
// Both are real (PostgreSQL, pgBackRest) and removed when the test ends.
package backuptest

import (
	"context"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pgtenant/pgtenant/internal/api"
	"github.com/pgtenant/pgtenant/internal/backup"
	"github.com/pgtenant/pgtenant/internal/catalog"
	"github.com/pgtenant/pgtenant/internal/config"
	"github.com/pgtenant/pgtenant/internal/daemon"
	"github.com/pgtenant/pgtenant/internal/daemon/daemontest"
	"github.com/pgtenant/pgtenant/internal/fleet"
)

// Cluster starts a small cluster with standbys that archives from its
// creation, with its stanza set up. The test is skipped when pgBackRest is
// not installed.
func Cluster(t *testing.T, ctx context.Context, standbys int) (*fleet.Cluster, *backup.Stanza) {
	t.Helper()
	if _, err := backup.Find(); err != nil {
		t.Skip(err)
	}
	fc := startCluster(t, ctx, fleet.Options{Name: "bk", Standbys: standbys, Backups: true})
	st, err := backup.ForCluster(fc, true)
	if err != nil {
		t.Fatal(err)
	}
	if err := st.Setup(ctx); err != nil {
		t.Fatal(err)
	}
	return fc, st
}

// Server starts a small cluster without standbys or backups, removed when
// the test ends: e.g. a catalog that outlives the cluster it describes.
func Server(t *testing.T, ctx context.Context, name string) *fleet.Cluster {
	t.Helper()
	return startCluster(t, ctx, fleet.Options{Name: name})
}

// startCluster makes and starts a small test cluster as o says, in a temp
// dir, stopped and removed when the test ends.
func startCluster(t *testing.T, ctx context.Context, o fleet.Options) *fleet.Cluster {
	t.Helper()
	dir, err := os.MkdirTemp("", "pgtest-backup-")
	if err != nil {
		t.Fatal(err)
	}
	// The postgres OS user (when we are root) must traverse the temp dir.
	if err := os.Chmod(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	o.Dir, o.Fast = filepath.Join(dir, o.Name), true
	o.Settings = map[string]string{"shared_buffers": "16MB", "max_connections": "60", "logging_collector": "off"}
	fc, err := fleet.Open(o)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		sctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		_ = fc.Stop(sctx)
	})
	if err := fc.Start(ctx); err != nil {
		t.Fatal(err)
	}
	return fc
}

// Daemon runs a daemon whose catalog is database catalogDB on fc, managing
// fc, with the given stanzas and the configuration changed by mod (nil:
// none), logging to the test. stop stops it (it stops when the test ends
// otherwise); another Daemon on the same catalog then takes over its jobs.
func Daemon(t *testing.T, fc *fleet.Cluster, catalogDB string, stanzas map[string]*backup.Stanza, mod func(*config.Config)) (c *api.Client, stop func()) {
	t.Helper()
	return start(t, fc, catalogDB, stanzas, mod, nil)
}

// DaemonPooled is Daemon with a PgBouncer in front of fc (stopped with the
// daemon): tenants' DSNs go through it.
func DaemonPooled(t *testing.T, fc *fleet.Cluster, catalogDB string, stanzas map[string]*backup.Stanza, mod func(*config.Config)) (c *api.Client, stop func()) {
	t.Helper()
	return start(t, fc, catalogDB, stanzas, mod, map[string]config.PoolerConfig{fc.Name(): daemontest.Pooler(t)})
}

func start(t *testing.T, fc *fleet.Cluster, catalogDB string, stanzas map[string]*backup.Stanza, mod func(*config.Config),
	poolers map[string]config.PoolerConfig) (c *api.Client, stop func()) {
	t.Helper()
	cfg := config.Default()
	cfg.Listen = "127.0.0.1:0"
	cfg.Catalog.DSN = fc.PrimaryDSN(catalogDB)
	cfg.TokenFile = filepath.Join(t.TempDir(), "token")
	cfg.Jobs.Backoff = config.Duration(50 * time.Millisecond)
	cfg.Reconcile.Interval = 0
	cfg.Provision.DefaultPoolSize = 0
	cfg.Prewarm.CaptureInterval = 0
	cfg.Prewarm.WatchInterval = 0
	cfg.Metrics.Interval = 0
	if mod != nil {
		mod(&cfg)
	}
	managed := catalog.Cluster{Name: fc.Name(), DSN: fc.PrimaryDSN("postgres")}
	for _, s := range fc.Standbys() {
		managed.StandbyDSNs = append(managed.StandbyDSNs, fc.DSN(s, "postgres"))
	}
	_, c, stop = daemontest.StartOptions(t, daemon.Options{Config: cfg, Managed: []catalog.Cluster{managed}, Backups: stanzas, Poolers: poolers})
	return c, stop
}

// Exec runs sql on dsn, failing the test on an error.
func Exec(t *testing.T, ctx context.Context, dsn, sql string) {
	t.Helper()
	conn, err := pgx.Connect(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	if _, err := conn.Exec(ctx, sql); err != nil {
		t.Fatal(err)
	}
}
