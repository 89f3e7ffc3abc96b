package failover_test

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pgtenant/pgtenant/internal/api"
	"github.com/pgtenant/pgtenant/internal/catalog"
	"github.com/pgtenant/pgtenant/internal/config"
	"github.com/pgtenant/pgtenant/internal/daemon"
	"github.com/pgtenant/pgtenant/internal/daemon/daemontest"
	"github.com/pgtenant/pgtenant/internal/patroni"
	"github.com/pgtenant/pgtenant/internal/pgtest"
	"github.com/pgtenant/pgtenant/internal/provision"
	"github.com/pgtenant/pgtenant/internal/templates"
)

// pg holds the catalog: it must outlive the Patroni cluster's failover.
var pg *pgtest.Cluster

func TestMain(m *testing.M) { pgtest.Main(m, pgtest.Options{}, &pg) }

// TestFollow_NodeLossThroughPooler registers a cluster that Patroni runs
// (etcd and two nodes) with `cluster add --patroni`, gives it a PgBouncer,
// and has a client write through a tenant's DSN while the leader's node
// dies (Patroni and PostgreSQL SIGKILLed): the daemon re-points the
// catalog, its pools and the PgBouncer at the new leader, the client
// writes again through the same DSN, a tenant create works, the old
// node's return as a standby shows in the cluster's standby DSNs, and the
// failover is counted once.
func TestFollow_NodeLossThroughPooler(t *testing.T) {
	pc := startPatroni(t)
	ctx := pc.ctx
	leader, standby := pc.waitSynchronous(t)

	// A first daemon registers the cluster as `cluster add` does; the
	// daemon the test uses is started again with a pooler for it (a
	// pooler block is read at start).
	cfg := daemontest.Config(t, pg)
	local := daemontest.Managed(pg)
	_, c, stop := daemontest.StartOptions(t, daemon.Options{Config: cfg, Managed: []catalog.Cluster{local}})
	// The DSN's host and port are nobody's: the leader's replace them.
	dsn := fmt.Sprintf("host=192.0.2.1 port=1 user=%s password=%s dbname=postgres sslmode=disable connect_timeout=2",
		patroni.SuperuserName, pc.pw.Superuser)
	for _, bad := range []api.AddClusterRequest{
		{Name: "pc1", DSN: dsn, Patroni: []string{"127.0.0.1:8008"}},        // not a URL
		{Name: "pc1", DSN: dsn, Patroni: []string{"http://127.0.0.1:1"}},    // nothing answers
		{Name: "pc1", DSN: dsn, Patroni: pc.urls, Standbys: []string{dsn}},  // standbys are Patroni's
		{Name: "pc1", DSN: dsn, Patroni: []string{pc.urls[0] + "/cluster"}}, // not the base URL
	} {
		var apiErr *api.Error
		if _, err := c.AddCluster(ctx, bad); !errors.As(err, &apiErr) || apiErr.Status != http.StatusBadRequest {
			t.Errorf("cluster add --patroni %v (standbys %d): got %v, want 400", bad.Patroni, len(bad.Standbys), err)
		}
	}
	added, err := c.AddCluster(ctx, api.AddClusterRequest{Name: "pc1", DSN: dsn, Patroni: pc.urls})
	if err != nil {
		t.Fatal(err)
	}
	if added.Status != "up" || len(added.Patroni) != 2 || !strings.Contains(added.DSN, fmt.Sprintf("port=%d", pc.node(leader.Name).Port())) {
		t.Fatalf("cluster add --patroni: got %+v, want up, 2 endpoints, the DSN at %s's port %d", added, leader.Name, pc.node(leader.Name).Port())
	}
	stop()

	d, c, _ := daemontest.StartOptions(t, daemon.Options{Config: cfg, Managed: []catalog.Cluster{local},
		Poolers: map[string]config.PoolerConfig{"pc1": daemontest.Pooler(t)}})
	daemontest.CreateTemplate(t, c, "w", []templates.Upload{{Name: "0001_init.sql", Body: `CREATE TABLE writes (id int NOT NULL);`}})
	created, err := c.CreateTenant(ctx, provision.Request{Template: "w", Cluster: "pc1"})
	if err != nil {
		t.Fatal(err)
	}
	front := d.Poolers().Get("pc1").PublicAddr()
	if !strings.Contains(created.DSN, front) {
		t.Fatalf("tenant DSN %s: want the pooler's %s", created.DSN, front)
	}

	w := startWriter(t, created.DSN)
	w.waitAcks(t, ctx, 30, "30 writes through the pooler before the kill")

	killed := time.Now()
	pc.node(leader.Name).Kill()
	t.Logf("killed %s (leader, timeline %d): patroni and postgres", leader.Name, leader.Timeline)

	var detail api.ClusterDetail
	newPort := fmt.Sprintf("port=%d", pc.node(standby.Name).Port())
	waitFor(t, ctx, 90*time.Second, "the daemon to re-point pc1 at "+standby.Name, func() bool {
		detail, err = c.Cluster(ctx, "pc1")
		return err == nil && strings.Contains(detail.DSN, newPort) && failovers(t, d, "pc1") == 1
	}, func() string {
		return fmt.Sprintf("dsn %s, %v failovers, err %v", detail.DSN, failovers(t, d, "pc1"), err)
	})
	repointed := time.Since(killed)
	first := w.waitAckOn(t, ctx, pc.node(standby.Name).Port(), killed, 60*time.Second)
	w.waitAcks(t, ctx, w.count()+20, "20 writes through the pooler on the new leader")
	t.Logf("node loss: daemon re-pointed pc1 (catalog, pools, pooler) %.1fs after the kill (pgtenant_failover_seconds %.1fs from the first failed check), "+
		"first write through the same tenant DSN %.1fs after the kill, longest pause %.1fs",
		repointed.Seconds(), failoverSeconds(t, d, "pc1"), first.Sub(killed).Seconds(), w.longestPause(killed).Seconds())

	start := time.Now()
	again, err := c.CreateTenant(ctx, provision.Request{Template: "w", Cluster: "pc1"})
	if err != nil {
		t.Fatalf("tenant create after the failover: %v", err)
	}
	conn, err := pgx.Connect(ctx, again.DSN)
	if err != nil {
		t.Fatalf("connect through the new tenant's DSN: %v", err)
	}
	var port int
	err = conn.QueryRow(ctx, `INSERT INTO writes VALUES (1) RETURNING inet_server_port()`).Scan(&port)
	conn.Close(ctx)
	if err != nil || port != pc.node(standby.Name).Port() {
		t.Fatalf("write through the new tenant's DSN: server port %d, %v; want %d", port, err, pc.node(standby.Name).Port())
	}
	t.Logf("tenant create (path %s) and a write through its DSN after the failover: %.1fs", again.Path, time.Since(start).Seconds())

	// The old leader comes back (rewound by Patroni) as a standby: the
	// cluster's standby DSNs follow, and no failover is counted.
	old := pc.node(leader.Name)
	if err := old.Start(ctx); err != nil {
		t.Fatal(err)
	}
	rejoin := time.Now()
	cat := daemontest.CatalogConn(t, pg, cfg)
	oldPort := fmt.Sprintf("port=%d", old.Port())
	var standbys []string
	waitFor(t, ctx, 90*time.Second, "pc1's standby DSNs to name "+leader.Name, func() bool {
		err = cat.QueryRow(ctx, `SELECT standby_dsns FROM clusters WHERE name = 'pc1'`).Scan(&standbys)
		return err == nil && len(standbys) == 1 && strings.Contains(standbys[0], oldPort)
	}, func() string { return fmt.Sprintf("%d standby DSNs, err %v", len(standbys), err) })
	t.Logf("old leader %s back as a standby in pc1's DSNs %.1fs after its restart", leader.Name, time.Since(rejoin).Seconds())

	acked := w.stop()
	t.Logf("writer: %d acknowledged writes, %d errors", len(acked), w.errorCount())
	checkRows(t, ctx, created.DSN, acked)
	if got := failovers(t, d, "pc1"); got != 1 {
		t.Errorf("pgtenant_failovers_total{cluster=pc1}: got %v, want 1", got)
	}
}

// failovers is the daemon's pgtenant_failovers_total of clusterName.
func failovers(t *testing.T, d *daemon.Daemon, clusterName string) float64 {
	v, _ := sample(t, d, "pgtenant_failovers_total", clusterName)
	return v
}

// failoverSeconds is the sum of the daemon's pgtenant_failover_seconds of
// clusterName.
func failoverSeconds(t *testing.T, d *daemon.Daemon, clusterName string) float64 {
	_, v := sample(t, d, "pgtenant_failover_seconds", clusterName)
	return v
}

func sample(t *testing.T, d *daemon.Daemon, name, clusterName string) (counter, histogramSum float64) {
	t.Helper()
	families, err := d.Metrics().Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range families {
		if f.GetName() != name {
			continue
		}
		for _, m := range f.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == "cluster" && l.GetValue() == clusterName {
					return m.GetCounter().GetValue(), m.GetHistogram().GetSampleSum()
				}
			}
		}
	}
	return 0, 0
}

// checkRows checks, through the tenant's DSN (the pooler's, now at the new
// leader), that every acknowledged id is there exactly once.
func checkRows(t *testing.T, ctx context.Context, dsn string, acked []ack) {
	t.Helper()
	conn, err := pgx.Connect(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	counts := map[int]int{}
	rows, err := conn.Query(ctx, `SELECT id, count(*) FROM writes GROUP BY id`)
	if err != nil {
		t.Fatal(err)
	}
	for rows.Next() {
		var id, n int
		if err := rows.Scan(&id, &n); err != nil {
			t.Fatal(err)
		}
		counts[id] = n
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	lost := 0
	for _, a := range acked {
		if counts[a.id] != 1 {
			lost++
		}
	}
	if lost > 0 {
		t.Errorf("%d of %d acknowledged writes are not there exactly once", lost, len(acked))
	}
	t.Logf("%d acknowledged writes, %d lost", len(acked), lost)
}

// patroniCluster is one etcd and two Patroni nodes.
type patroniCluster struct {
	ctx    context.Context
	pw     patroni.Passwords
	nodes  []*patroni.Node
	urls   []string
	client *patroni.Client
}

// startPatroni starts etcd and two Patroni nodes, stopped (killed if need
// be) when the test ends, after the daemon (cleanups run last first).
func startPatroni(t *testing.T) *patroniCluster {
	t.Helper()
	if testing.Short() {
		t.Skip("starts etcd and two Patroni nodes and waits out a failover")
	}
	for _, p := range []string{"patroni", "etcd", "pgbouncer"} {
		if _, err := exec.LookPath(p); err != nil {
			t.Skipf("%s not installed: apt-get install patroni etcd-server pgbouncer (.ci/run does)", p)
		}
	}
	if _, err := os.Stat(filepath.Join(patroni.DefaultBinDir, "postgres")); err != nil {
		t.Skip("no PostgreSQL 15 server: apt-get install postgresql-15 (.ci/run does)")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	t.Cleanup(cancel)
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
	pw, err := patroni.NewPasswords()
	if err != nil {
		t.Fatal(err)
	}
	settings := patroni.DefaultSettings()
	// Small servers on a shared machine; fsync off is safe: the test kills
	// processes, never the machine.
	settings.Parameters = map[string]string{"shared_buffers": "32MB", "max_connections": "60", "fsync": "off"}
	pc := &patroniCluster{ctx: ctx, pw: pw}
	for _, name := range []string{"n1", "n2"} {
		n, err := patroni.NewNode(patroni.NodeOptions{Cluster: "pc1", Name: name, Dir: filepath.Join(dir, name),
			Etcd: []string{etcd.Endpoint()}, Settings: settings, Passwords: pw, Logger: log})
		if err != nil {
			t.Fatal(err)
		}
		pc.nodes = append(pc.nodes, n)
		pc.urls = append(pc.urls, n.APIURL())
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 45*time.Second)
		defer cancel()
		var wg sync.WaitGroup
		for _, n := range pc.nodes {
			wg.Go(func() {
				if err := n.Stop(ctx); err != nil {
					t.Error(err)
				}
			})
		}
		wg.Wait()
	})
	// The first node bootstraps before the second starts, which then
	// makes a standby instead of racing for the initialize key.
	if err := pc.nodes[0].Start(ctx); err != nil {
		t.Fatal(err)
	}
	pc.client = patroni.NewClient(pc.urls, nil)
	wctx, wcancel := context.WithTimeout(ctx, 90*time.Second)
	defer wcancel()
	if _, err := pc.client.WaitLeader(wctx); err != nil {
		t.Fatalf("first node bootstrapping: %v", err)
	}
	if err := pc.nodes[1].Start(ctx); err != nil {
		t.Fatal(err)
	}
	return pc
}

func (pc *patroniCluster) node(name string) *patroni.Node {
	for _, n := range pc.nodes {
		if n.Name() == name {
			return n
		}
	}
	panic("no node " + name)
}

// waitSynchronous waits for a running leader and a streaming synchronous
// standby: only that standby is promoted after a node loss.
func (pc *patroniCluster) waitSynchronous(t *testing.T) (leader, standby patroni.Member) {
	t.Helper()
	var last string
	waitFor(t, pc.ctx, 120*time.Second, "a leader and a synchronous standby", func() bool {
		ms, err := pc.client.Members(pc.ctx)
		last = fmt.Sprintf("%+v %v", ms, err)
		leader, standby = patroni.Member{}, patroni.Member{}
		for _, m := range ms {
			switch {
			case m.Role == patroni.RoleLeader && m.State == "running":
				leader = m
			case m.Role == patroni.RoleSyncStandby && m.State == "running" && m.Lag >= 0 && m.Lag < 1<<20:
				standby = m
			}
		}
		return leader.Name != "" && standby.Name != ""
	}, func() string { return last })
	return leader, standby
}

// ack is one acknowledged write: its id, the server port that took it, when.
type ack struct {
	id, port int
	at       time.Time
}

// writer inserts ids one by one through a DSN, reconnecting after any
// error; an id whose outcome is unknown is never retried.
type writer struct {
	cancel context.CancelFunc
	done   chan struct{}
	mu     sync.Mutex
	acks   []ack
	errs   int
}

func startWriter(t *testing.T, dsn string) *writer {
	ctx, cancel := context.WithCancel(context.Background())
	w := &writer{cancel: cancel, done: make(chan struct{})}
	t.Cleanup(func() { w.stop() })
	go func() {
		defer close(w.done)
		var conn *pgx.Conn
		defer func() {
			if conn != nil {
				conn.Close(context.Background())
			}
		}()
		for id := 1; ctx.Err() == nil; id++ {
			if conn == nil {
				cctx, ccancel := context.WithTimeout(ctx, 3*time.Second)
				c, err := pgx.Connect(cctx, dsn)
				ccancel()
				if err != nil {
					w.failed()
					sleep(ctx, 100*time.Millisecond)
					continue
				}
				conn = c
			}
			ectx, ecancel := context.WithTimeout(ctx, 5*time.Second)
			var port int
			err := conn.QueryRow(ectx, `INSERT INTO writes (id) VALUES ($1) RETURNING inet_server_port()`, id).Scan(&port)
			ecancel()
			if err != nil {
				w.failed()
				conn.Close(context.Background())
				conn = nil
				sleep(ctx, 100*time.Millisecond)
				continue
			}
			w.mu.Lock()
			w.acks = append(w.acks, ack{id: id, port: port, at: time.Now()})
			w.mu.Unlock()
			sleep(ctx, 20*time.Millisecond)
		}
	}()
	return w
}

func (w *writer) failed() {
	w.mu.Lock()
	w.errs++
	w.mu.Unlock()
}

func (w *writer) count() int {
	w.mu.Lock()
	defer w.mu.Unlock()
	return len(w.acks)
}

func (w *writer) errorCount() int {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.errs
}

// stop ends the writer and returns the acknowledged writes.
func (w *writer) stop() []ack {
	w.cancel()
	<-w.done
	w.mu.Lock()
	defer w.mu.Unlock()
	return append([]ack(nil), w.acks...)
}

func (w *writer) waitAcks(t *testing.T, ctx context.Context, n int, what string) {
	t.Helper()
	waitFor(t, ctx, 60*time.Second, what, func() bool { return w.count() >= n },
		func() string { return fmt.Sprintf("%d acknowledged, %d errors", w.count(), w.errorCount()) })
}

// waitAckOn waits for the first write acknowledged by the server on port
// after since, and returns its time.
func (w *writer) waitAckOn(t *testing.T, ctx context.Context, port int, since time.Time, bound time.Duration) time.Time {
	t.Helper()
	var at time.Time
	waitFor(t, ctx, bound, fmt.Sprintf("a write acknowledged by port %d", port), func() bool {
		w.mu.Lock()
		defer w.mu.Unlock()
		for _, a := range w.acks {
			if a.port == port && a.at.After(since) {
				at = a.at
				return true
			}
		}
		return false
	}, func() string { return fmt.Sprintf("%d acknowledged, %d errors", w.count(), w.errorCount()) })
	return at
}

// longestPause is the longest time without an acknowledged write since
// since: what a client saw of the event at since.
func (w *writer) longestPause(since time.Time) time.Duration {
	w.mu.Lock()
	defer w.mu.Unlock()
	var longest time.Duration
	prev := since
	for _, a := range w.acks {
		if a.at.Before(since) {
			continue
		}
		longest = max(longest, a.at.Sub(prev))
		prev = a.at
	}
	return longest
}

// waitFor polls cond every 200 ms for up to bound, failing the test with
// what and state() when it never holds.
func waitFor(t *testing.T, ctx context.Context, bound time.Duration, what string, cond func() bool, state func() string) {
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
