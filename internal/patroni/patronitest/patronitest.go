// Package patronitest is the test harness for clusters under Patroni: a
// one-member etcd and Patroni nodes started as real processes in a temp
// dir (Start), waits on what Patroni and PostgreSQL report, and a client
// that writes through a DSN while a test kills, switches or fails over
// nodes (Writer). Everything it starts is stopped, killed if need be, when
// the test ends.
//
// It drives the clusters only through internal/patroni and SQL: it never
// runs pg_ctl on a node's data dir, and it does not touch a catalog, a
// daemon or a pooler (following the leader is the tests' subject).
package patronitest

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"

	"github.com/pgtenant/pgtenant/internal/patroni"
	"github.com/pgtenant/pgtenant/internal/pgtest"
)

// Options describe a test cluster.
type Options struct {
	Scope string // Patroni's scope, the cluster's name in etcd
	Nodes int    // how many Patroni nodes, named n1, n2 …; 2 when 0
	// Parameters are PostgreSQL parameters set over the harness's small
	// servers' (a daemon's pools and a PgBouncer want more connections).
	Parameters map[string]string
	// Programs are what the test runs besides patroni and etcd (pgbouncer):
	// the test is skipped without them, before anything starts.
	Programs []string
}

// Cluster is the Patroni nodes of a test cluster, on their etcd.
type Cluster struct{ *patroni.Cluster }

// packages are the Debian packages of the programs Start may need, for the
// skip message.
var packages = map[string]string{"patroni": "patroni", "etcd": "etcd-server", "pgbouncer": "pgbouncer"}

// Start starts etcd and opts.Nodes Patroni nodes, and returns once the
// first node leads and the others are started (not yet streaming: see
// WaitLeaderAndSyncStandby). The test is skipped with -short or when a
// program is missing. Cleanups stop the nodes, then etcd, so they run
// before those of what the test starts later (a daemon following the
// cluster stops first).
func Start(t testing.TB, ctx context.Context, opts Options) *Cluster {
	t.Helper()
	if testing.Short() {
		t.Skip("starts etcd and Patroni nodes and waits out failovers")
	}
	for _, p := range append([]string{"patroni", "etcd"}, opts.Programs...) {
		if _, err := exec.LookPath(p); err != nil {
			t.Skipf("%s not installed: apt-get install %s (.ci/run does)", p, packages[p])
		}
	}
	if _, err := os.Stat(filepath.Join(patroni.DefaultBinDir, "postgres")); err != nil {
		t.Skip("no PostgreSQL 15 server: apt-get install postgresql-15 (.ci/run does)")
	}
	dir := pgtest.TempDir(t)
	log := pgtest.Logger(t)

	etcd, err := patroni.StartEtcd(ctx, patroni.EtcdOptions{Dir: filepath.Join(dir, "etcd"), Logger: log})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		defer cancel()
		if err := etcd.Stop(ctx); err != nil {
			t.Error(err)
		}
	})
	settings := patroni.DefaultSettings()
	// Small servers: the nodes share 2 cores with other tests. fsync off is
	// safe here: the tests kill processes, never the machine.
	settings.Parameters = map[string]string{"shared_buffers": "32MB", "max_connections": "50", "fsync": "off"}
	for k, v := range opts.Parameters {
		settings.Parameters[k] = v
	}
	pc, err := patroni.NewCluster(patroni.ClusterOptions{Scope: opts.Scope, Dir: filepath.Join(dir, opts.Scope), Nodes: max(opts.Nodes, 2),
		Etcd: []string{etcd.Endpoint()}, Settings: settings, Logger: log})
	if err != nil {
		t.Fatal(err)
	}
	c := &Cluster{pc}
	// Nodes stop before etcd (cleanups run last first): a Patroni without
	// its store would demote and retry until killed.
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 45*time.Second)
		defer cancel()
		if err := c.Stop(ctx); err != nil {
			t.Error(err)
		}
		if t.Failed() {
			for _, n := range c.Nodes {
				t.Logf("%s's patroni.log ends:\n%s", n.Name(), tail(Log(t, n), 4000))
			}
		}
	})
	if err := c.Start(ctx); err != nil {
		t.Fatal(err)
	}
	return c
}

// Node is the node called name. Names come from Patroni's members, so a
// name the cluster does not have is a bug in the test.
func (c *Cluster) Node(name string) *patroni.Node {
	if n := c.Cluster.Node(name); n != nil {
		return n
	}
	panic("patronitest: no node " + name)
}

// DSN is the clients' multi-host DSN: whichever node is read-write.
func (c *Cluster) DSN() string { return c.PrimaryDSN("postgres") }

// NodeDSN is one node's DSN, primary or standby.
func (c *Cluster) NodeDSN(name string) string { return c.Cluster.DSN(c.Node(name).Port(), "postgres") }

// WaitLeaderAndSyncStandby waits up to 2 minutes for a running leader
// (leader, when not "") and a streaming synchronous standby
// (patroni.Cluster.WaitStandby): only that standby is promoted after a
// node loss.
func (c *Cluster) WaitLeaderAndSyncStandby(t testing.TB, ctx context.Context, leader string) (l, s patroni.Member) {
	t.Helper()
	wctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	l, s, err := c.WaitStandby(wctx, leader, true)
	if err != nil {
		t.Fatal(err)
	}
	return l, s
}

// Log is n's patroni.log (what Patroni and its PostgreSQL said), or what
// could be read of it.
func Log(t testing.TB, n *patroni.Node) string {
	b, err := os.ReadFile(n.LogPath())
	if err != nil {
		t.Logf("read %s: %v", n.LogPath(), err)
	}
	return string(b)
}

func tail(s string, n int) string {
	if len(s) > n {
		return s[len(s)-n:]
	}
	return s
}

// WaitFor polls cond every 200 ms for up to bound, failing the test with
// what and state() when it never holds.
func WaitFor(t testing.TB, ctx context.Context, bound time.Duration, what string, cond func() bool, state func() string) {
	t.Helper()
	deadline := time.Now().Add(bound)
	for !cond() {
		if time.Now().After(deadline) || ctx.Err() != nil {
			t.Fatalf("waited %v for %s; last: %s", bound, what, state())
		}
		sleep(ctx, 200*time.Millisecond)
	}
}

func sleep(ctx context.Context, d time.Duration) {
	select {
	case <-ctx.Done():
	case <-time.After(d):
	}
}
