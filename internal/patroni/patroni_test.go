package patroni_test

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"go.yaml.in/yaml/v3"

	"github.com/pgtenant/pgtenant/internal/patroni"
	"github.com/pgtenant/pgtenant/internal/pgtest"
)

func TestSettings_Validate(t *testing.T) {
	if err := patroni.DefaultSettings().Validate(); err != nil {
		t.Fatalf("defaults: %v", err)
	}
	tooShort := patroni.DefaultSettings()
	tooShort.TTL = 11 * time.Second // 2 + 2×5 = 12 > 11
	err := tooShort.Validate()
	if err == nil || !strings.Contains(err.Error(), "ttl") {
		t.Fatalf("ttl 11s with loop_wait 2s and retry_timeout 5s: got %v, want an error naming ttl", err)
	}
	fraction := patroni.DefaultSettings()
	fraction.LoopWait = 1500 * time.Millisecond
	if err := fraction.Validate(); err == nil || !strings.Contains(err.Error(), "loop_wait") {
		t.Fatalf("loop_wait 1.5s: got %v, want an error naming loop_wait", err)
	}
	strict := patroni.DefaultSettings()
	strict.SynchronousMode, strict.SynchronousModeStrict = false, true
	if err := strict.Validate(); err == nil {
		t.Fatal("strict without synchronous mode: got no error")
	}
}

// TestNewNode_Config checks the config Patroni gets: the timing, the modes,
// the addresses and the roles.
func TestNewNode_Config(t *testing.T) {
	pw, err := patroni.NewPasswords()
	if err != nil {
		t.Fatal(err)
	}
	dir := filepath.Join(pgtest.TempDir(t), "n1")
	n, err := patroni.NewNode(patroni.NodeOptions{
		Cluster: "c1", Name: "n1", Dir: dir, Etcd: []string{"127.0.0.1:2379"},
		Settings: patroni.DefaultSettings(), Passwords: pw,
	})
	if err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(n.ConfigPath())
	if err != nil {
		t.Fatal(err)
	}
	var c struct {
		Scope, Name string
		Etcd3       struct{ Hosts []string }
		RESTAPI     struct{ Listen string } `yaml:"restapi"`
		Bootstrap   struct {
			DCS map[string]any `yaml:"dcs"`
		}
		PostgreSQL struct {
			Listen         string
			DataDir        string `yaml:"data_dir"`
			BinDir         string `yaml:"bin_dir"`
			Authentication map[string]struct{ Username, Password string }
			PGHBA          []string `yaml:"pg_hba"`
		} `yaml:"postgresql"`
	}
	if err := yaml.Unmarshal(b, &c); err != nil {
		t.Fatal(err)
	}
	dcs := c.Bootstrap.DCS
	pg, _ := dcs["postgresql"].(map[string]any)
	for _, f := range []struct {
		what      string
		got, want any
	}{
		{"scope", c.Scope, "c1"},
		{"name", c.Name, "n1"},
		{"etcd3.hosts", strings.Join(c.Etcd3.Hosts, ","), "127.0.0.1:2379"},
		{"restapi.listen", c.RESTAPI.Listen, strings.TrimPrefix(n.APIURL(), "http://")},
		{"ttl", dcs["ttl"], 20},
		{"loop_wait", dcs["loop_wait"], 2},
		{"retry_timeout", dcs["retry_timeout"], 5},
		{"synchronous_mode", dcs["synchronous_mode"], true},
		{"use_pg_rewind", pg["use_pg_rewind"], true},
		{"postgresql.listen", c.PostgreSQL.Listen, fmt.Sprintf("127.0.0.1:%d", n.Port())},
		{"data_dir", c.PostgreSQL.DataDir, filepath.Join(dir, "data")},
		{"bin_dir", c.PostgreSQL.BinDir, patroni.DefaultBinDir},
		{"superuser", c.PostgreSQL.Authentication["superuser"].Password, pw.Superuser},
		{"replication", c.PostgreSQL.Authentication["replication"].Username, patroni.ReplicationName},
		{"rewind", c.PostgreSQL.Authentication["rewind"].Password, pw.Rewind},
	} {
		if fmt.Sprint(f.got) != fmt.Sprint(f.want) {
			t.Errorf("%s: got %v, want %v", f.what, f.got, f.want)
		}
	}
	for _, line := range c.PostgreSQL.PGHBA {
		if !strings.Contains(line, "scram-sha-256") || (strings.HasPrefix(line, "host") && !strings.Contains(line, "127.0.0.1/32")) {
			t.Errorf("pg_hba line %q: want loopback and scram-sha-256 only", line)
		}
	}
	fi, err := os.Stat(n.ConfigPath())
	if err != nil {
		t.Fatal(err)
	}
	if got := fi.Mode().Perm(); got != 0o600 {
		t.Errorf("config mode: got %v, want 0600 (it holds the passwords)", got)
	}
}

// TestFailover_NodeLoss kills the leader's Patroni and PostgreSQL together
// while a client writes through a multi-host DSN: the synchronous standby
// is promoted, the client writes again through the same DSN, every
// acknowledged row is there exactly once, and the old node, started again,
// comes back as a standby of the new leader (pg_rewind).
func TestFailover_NodeLoss(t *testing.T) {
	c := startCluster(t)
	ctx := c.ctx
	leader, standby := c.waitSynchronous(t, "")
	c.createTable(t)

	w := startWriter(t, c.dsn())
	w.waitAcks(t, ctx, 50, "50 writes before the kill")

	killed := time.Now()
	c.node(leader.Name).Kill()
	t.Logf("killed %s (leader, timeline %d): patroni and postgres", leader.Name, leader.Timeline)

	newLeader := c.waitNewLeader(t, leader.Name, 90*time.Second)
	elected := time.Since(killed)
	if newLeader.Name != standby.Name {
		t.Fatalf("new leader: got %s, want the synchronous standby %s", newLeader.Name, standby.Name)
	}
	c.waitTimeline(t, newLeader.Name, leader.Timeline+1)
	first := w.waitAckOn(t, ctx, c.node(newLeader.Name).Port(), killed, 90*time.Second)
	t.Logf("node loss: leader elected %.1fs after the kill, first acknowledged write %.1fs after the kill (ttl %v, loop_wait %v)",
		elected.Seconds(), first.Sub(killed).Seconds(), patroni.DefaultSettings().TTL, patroni.DefaultSettings().LoopWait)
	w.waitAcks(t, ctx, w.count()+20, "20 writes on the new leader")

	// The old node comes back: Patroni rewinds it onto the new timeline
	// and it streams from the new leader.
	old := c.node(leader.Name)
	if err := old.Start(ctx); err != nil {
		t.Fatal(err)
	}
	rejoinStart := time.Now()
	_, back := c.waitSynchronous(t, newLeader.Name)
	if back.Name != leader.Name {
		t.Fatalf("synchronous standby after the rejoin: got %s, want the old leader %s", back.Name, leader.Name)
	}
	t.Logf("old leader back as synchronous standby %.1fs after its restart", time.Since(rejoinStart).Seconds())
	// It was killed with WAL past the point where the standby took over
	// (the writes since its last checkpoint): it must have been rewound.
	oldLog := readFile(t, old.LogPath())
	for _, line := range strings.Split(oldLog, "\n") {
		if strings.Contains(line, "rewind") {
			t.Logf("%s: %s", old.Name(), line)
		}
	}
	if !strings.Contains(oldLog, "pg_rewind exit code=0") {
		t.Errorf("%s's log: no successful pg_rewind", old.Name())
	}
	if ok, err := c.client.Check(ctx, old.APIURL(), patroni.CheckReplica); err != nil || !ok {
		t.Errorf("old leader's /replica: got %v, %v; want 200", ok, err)
	}

	acked := w.stop()
	t.Logf("writer: %d acknowledged writes, %d errors", len(acked), w.errorCount())
	c.checkRows(t, newLeader.Name, acked)
	c.waitSameRows(t, newLeader.Name, leader.Name)
}

// TestFailover_Switchover is the planned change: Switchover swaps the
// roles, writes go on through the same DSN, then Failover moves the leader
// back.
func TestFailover_Switchover(t *testing.T) {
	c := startCluster(t)
	ctx := c.ctx
	leader, standby := c.waitSynchronous(t, "")
	c.createTable(t)

	w := startWriter(t, c.dsn())
	w.waitAcks(t, ctx, 30, "30 writes before the switchover")

	start := time.Now()
	if err := c.client.Switchover(ctx, leader.Name, standby.Name); err != nil {
		t.Fatal(err)
	}
	returned := time.Since(start)
	got, err := c.client.Leader(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if got.Name != standby.Name {
		t.Fatalf("leader after the switchover: got %s, want %s", got.Name, standby.Name)
	}
	c.waitTimeline(t, got.Name, leader.Timeline+1)
	first := w.waitAckOn(t, ctx, c.node(standby.Name).Port(), start, 60*time.Second)
	t.Logf("switchover: returned after %.1fs, first write on the new leader %.1fs after the request, longest pause between two writes %.1fs",
		returned.Seconds(), first.Sub(start).Seconds(), w.longestPause(start).Seconds())

	_, back := c.waitSynchronous(t, standby.Name)
	if back.Name != leader.Name {
		t.Fatalf("synchronous standby after the switchover: got %s, want %s", back.Name, leader.Name)
	}
	for _, chk := range []struct {
		node  string
		check patroni.Check
		want  bool
	}{
		{standby.Name, patroni.CheckPrimary, true},
		{leader.Name, patroni.CheckReplica, true},
		{leader.Name, patroni.CheckPrimary, false},
		{leader.Name, patroni.CheckHealth, true},
	} {
		ok, err := c.client.Check(ctx, c.node(chk.node).APIURL(), chk.check)
		if err != nil || ok != chk.want {
			t.Errorf("%s %s: got %v, %v; want %v", chk.node, chk.check, ok, err, chk.want)
		}
	}

	// A forced failover back to the first node.
	start = time.Now()
	if err := c.client.Failover(ctx, leader.Name); err != nil {
		t.Fatal(err)
	}
	if got, err := c.client.Leader(ctx); err != nil || got.Name != leader.Name {
		t.Fatalf("leader after the failover: got %s, %v; want %s", got.Name, err, leader.Name)
	}
	first = w.waitAckOn(t, ctx, c.node(leader.Name).Port(), start, 60*time.Second)
	t.Logf("failover back: first write on %s %.1fs after the request", leader.Name, first.Sub(start).Seconds())
	w.waitAcks(t, ctx, w.count()+10, "10 writes after the failover")

	acked := w.stop()
	t.Logf("writer: %d acknowledged writes, %d errors", len(acked), w.errorCount())
	c.checkRows(t, leader.Name, acked)
}

// TestFailover_StandbyDown loses the only standby: in synchronous mode
// (not strict) the primary turns synchronous replication off and goes on
// taking writes, which Patroni shows as a cluster with no synchronous
// standby; once the standby is back it is synchronous again.
func TestFailover_StandbyDown(t *testing.T) {
	c := startCluster(t)
	ctx := c.ctx
	leader, standby := c.waitSynchronous(t, "")
	c.createTable(t)

	w := startWriter(t, c.dsn())
	w.waitAcks(t, ctx, 30, "30 writes before the kill")

	killed := time.Now()
	c.node(standby.Name).Kill()
	var last string
	waitFor(t, ctx, 60*time.Second, "Patroni to show no synchronous standby", func() bool {
		ms, err := c.client.Members(ctx)
		last = fmt.Sprintf("%+v %v", ms, err)
		if err != nil {
			return false
		}
		for _, m := range ms {
			if m.Role == patroni.RoleSyncStandby {
				return false
			}
		}
		return true
	}, func() string { return last })
	first := w.waitAckOn(t, ctx, c.node(leader.Name).Port(), killed, 60*time.Second)
	w.waitAcks(t, ctx, w.count()+20, "20 writes without a standby")
	t.Logf("standby lost: first write acknowledged %.1fs after the kill; longest pause between two writes %.1fs",
		first.Sub(killed).Seconds(), w.longestPause(killed).Seconds())

	conn, err := pgx.Connect(ctx, c.nodeDSN(leader.Name))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	var names string
	if err := conn.QueryRow(ctx, `SHOW synchronous_standby_names`).Scan(&names); err != nil {
		t.Fatal(err)
	}
	if names != "" {
		t.Errorf("synchronous_standby_names without a standby: got %q, want empty (asynchronous)", names)
	}

	if err := c.node(standby.Name).Start(ctx); err != nil {
		t.Fatal(err)
	}
	l, s := c.waitSynchronous(t, leader.Name)
	if s.Name != standby.Name {
		t.Fatalf("synchronous standby after its restart: got %s, want %s", s.Name, standby.Name)
	}
	if err := conn.QueryRow(ctx, `SHOW synchronous_standby_names`).Scan(&names); err != nil {
		t.Fatal(err)
	}
	if names != standby.Name {
		t.Errorf("synchronous_standby_names with the standby back: got %q, want %q", names, standby.Name)
	}
	acked := w.stop()
	t.Logf("writer: %d acknowledged writes, %d errors", len(acked), w.errorCount())
	c.checkRows(t, l.Name, acked)
}

// cluster is a test cluster: one etcd, two Patroni nodes.
type cluster struct {
	ctx    context.Context
	pw     patroni.Passwords
	nodes  []*patroni.Node
	client *patroni.Client
}

// startCluster starts etcd and two Patroni nodes in a temp dir, all
// stopped (killed if need be) at the end of the test, failed or not.
func startCluster(t *testing.T) *cluster {
	t.Helper()
	if testing.Short() {
		t.Skip("starts etcd and two Patroni nodes and waits out failovers")
	}
	for _, p := range []string{"patroni", "etcd"} {
		if _, err := exec.LookPath(p); err != nil {
			t.Skipf("%s not installed: apt-get install patroni etcd-server (.ci/run does)", p)
		}
	}
	if _, err := os.Stat(filepath.Join(patroni.DefaultBinDir, "postgres")); err != nil {
		t.Skip("no PostgreSQL 15 server: apt-get install postgresql-15 (.ci/run does)")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
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
	// Small servers: two nodes share 2 cores with other tests. fsync off is
	// safe here: the test kills processes, never the machine.
	settings.Parameters = map[string]string{"shared_buffers": "32MB", "max_connections": "50", "fsync": "off"}
	c := &cluster{ctx: ctx, pw: pw}
	var urls []string
	for _, name := range []string{"n1", "n2"} {
		n, err := patroni.NewNode(patroni.NodeOptions{
			Cluster: "c1", Name: name, Dir: filepath.Join(dir, name), Etcd: []string{etcd.Endpoint()},
			Settings: settings, Passwords: pw, Logger: log,
		})
		if err != nil {
			t.Fatal(err)
		}
		c.nodes = append(c.nodes, n)
		urls = append(urls, n.APIURL())
	}
	// Nodes stop before etcd (cleanups run last first): a Patroni without
	// its store would demote and retry until killed.
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 45*time.Second)
		defer cancel()
		var wg sync.WaitGroup
		for _, n := range c.nodes {
			wg.Go(func() {
				if err := n.Stop(ctx); err != nil {
					t.Error(err)
				}
			})
		}
		wg.Wait()
		if t.Failed() {
			for _, n := range c.nodes {
				t.Logf("%s's patroni.log ends:\n%s", n.Name(), tail(readFile(t, n.LogPath()), 4000))
			}
		}
	})
	// The first node bootstraps (initdb) before the second one starts, so
	// that the second one makes a standby instead of racing for the
	// initialize key.
	if err := c.nodes[0].Start(ctx); err != nil {
		t.Fatal(err)
	}
	c.client = patroni.NewClient(urls, nil)
	wctx, wcancel := context.WithTimeout(ctx, 90*time.Second)
	defer wcancel()
	if _, err := c.client.WaitLeader(wctx); err != nil {
		t.Fatalf("first node bootstrapping: %v", err)
	}
	if err := c.nodes[1].Start(ctx); err != nil {
		t.Fatal(err)
	}
	return c
}

func (c *cluster) node(name string) *patroni.Node {
	for _, n := range c.nodes {
		if n.Name() == name {
			return n
		}
	}
	panic("no node " + name)
}

// dsn is the clients' multi-host DSN: whichever node is read-write.
func (c *cluster) dsn() string {
	var ports []string
	for _, n := range c.nodes {
		ports = append(ports, fmt.Sprint(n.Port()))
	}
	return fmt.Sprintf("host=127.0.0.1,127.0.0.1 port=%s user=%s password=%s dbname=postgres sslmode=disable connect_timeout=2 target_session_attrs=read-write",
		strings.Join(ports, ","), patroni.SuperuserName, c.pw.Superuser)
}

// nodeDSN is one node's DSN, primary or standby.
func (c *cluster) nodeDSN(name string) string {
	return fmt.Sprintf("host=127.0.0.1 port=%d user=%s password=%s dbname=postgres sslmode=disable connect_timeout=2",
		c.node(name).Port(), patroni.SuperuserName, c.pw.Superuser)
}

// waitSynchronous waits until the cluster has a running leader (leader,
// when not "") and a running synchronous standby that streams, less than
// 1 MiB behind (Patroni samples the positions once per loop).
func (c *cluster) waitSynchronous(t *testing.T, leader string) (patroni.Member, patroni.Member) {
	t.Helper()
	var l, s patroni.Member
	var last string
	waitFor(t, c.ctx, 120*time.Second, "a leader and a streaming synchronous standby", func() bool {
		ms, err := c.client.Members(c.ctx)
		if err != nil {
			last = err.Error()
			return false
		}
		last = fmt.Sprintf("%+v", ms)
		l, s = patroni.Member{}, patroni.Member{}
		for _, m := range ms {
			switch {
			case m.Role == patroni.RoleLeader && m.State == "running":
				l = m
			case m.Role == patroni.RoleSyncStandby && m.State == "running" && m.Lag >= 0 && m.Lag < 1<<20:
				s = m
			}
		}
		if l.Name == "" || s.Name == "" || (leader != "" && l.Name != leader) {
			return false
		}
		// Patroni's view comes from the store; PostgreSQL's own says the
		// standby streams and is synchronous.
		conn, err := pgx.Connect(c.ctx, c.nodeDSN(l.Name))
		if err != nil {
			last = err.Error()
			return false
		}
		defer conn.Close(c.ctx)
		var n int
		if err := conn.QueryRow(c.ctx, `SELECT count(*) FROM pg_stat_replication WHERE application_name = $1 AND state = 'streaming' AND sync_state = 'sync'`, s.Name).Scan(&n); err != nil {
			last = err.Error()
			return false
		}
		return n == 1
	}, func() string { return last })
	return l, s
}

// waitNewLeader waits until a running leader other than old holds the lock.
func (c *cluster) waitNewLeader(t *testing.T, old string, bound time.Duration) patroni.Member {
	t.Helper()
	var got patroni.Member
	var last string
	waitFor(t, c.ctx, bound, "a new leader", func() bool {
		m, err := c.client.Leader(c.ctx)
		if err != nil {
			last = err.Error()
			return false
		}
		last = "leader " + m.Name
		got = m
		return m.Name != old
	}, func() string { return last })
	return got
}

// waitTimeline waits until Patroni reports node on timeline want: a
// promoted node publishes its new timeline one loop after the promotion.
func (c *cluster) waitTimeline(t *testing.T, node string, want int) {
	t.Helper()
	var last string
	waitFor(t, c.ctx, 20*time.Second, fmt.Sprintf("%s on timeline %d", node, want), func() bool {
		ms, err := c.client.Members(c.ctx)
		last = fmt.Sprintf("%+v %v", ms, err)
		for _, m := range ms {
			if m.Name == node && m.Timeline == want {
				return true
			}
		}
		return false
	}, func() string { return last })
}

func (c *cluster) createTable(t *testing.T) {
	t.Helper()
	conn, err := pgx.Connect(c.ctx, c.dsn())
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(c.ctx)
	// No unique key on purpose: a write retried twice would show as a
	// duplicate instead of failing.
	if _, err := conn.Exec(c.ctx, `CREATE TABLE writes (id int NOT NULL)`); err != nil {
		t.Fatal(err)
	}
}

// checkRows checks on node that every acknowledged id is there exactly
// once and that no id is there twice.
func (c *cluster) checkRows(t *testing.T, node string, acked []ack) {
	t.Helper()
	conn, err := pgx.Connect(c.ctx, c.nodeDSN(node))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(c.ctx)
	rows, err := conn.Query(c.ctx, `SELECT id, count(*) FROM writes GROUP BY id`)
	if err != nil {
		t.Fatal(err)
	}
	counts := map[int]int{}
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
			t.Errorf("acknowledged id %d: %d rows, want 1", a.id, counts[a.id])
		}
	}
	for id, n := range counts {
		if n > 1 {
			t.Errorf("id %d: %d rows, want at most 1", id, n)
		}
	}
	t.Logf("%d acknowledged writes, %d rows on %s, %d acknowledged writes lost", len(acked), len(counts), node, lost)
}

// waitSameRows waits until standby has replayed every row of leader.
func (c *cluster) waitSameRows(t *testing.T, leader, standby string) {
	t.Helper()
	count := func(node string) (int, bool, error) {
		conn, err := pgx.Connect(c.ctx, c.nodeDSN(node))
		if err != nil {
			return 0, false, err
		}
		defer conn.Close(c.ctx)
		var n int
		var recovery bool
		err = conn.QueryRow(c.ctx, `SELECT (SELECT count(*) FROM writes), pg_is_in_recovery()`).Scan(&n, &recovery)
		return n, recovery, err
	}
	want, _, err := count(leader)
	if err != nil {
		t.Fatal(err)
	}
	var last string
	waitFor(t, c.ctx, 30*time.Second, standby+" to have the leader's rows", func() bool {
		got, recovery, err := count(standby)
		last = fmt.Sprintf("%d rows (want %d), in recovery %v, err %v", got, want, recovery, err)
		return err == nil && recovery && got == want
	}, func() string { return last })
}

// ack is one acknowledged write: its id and the server that took it.
type ack struct {
	id   int
	port int
	at   time.Time
}

// writer inserts ids one by one through a DSN, reconnecting after any
// error, and records the acknowledged ones. An id whose outcome is unknown
// (an error) is never retried.
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

func readFile(t *testing.T, path string) string {
	b, err := os.ReadFile(path)
	if err != nil {
		t.Logf("read %s: %v", path, err)
	}
	return string(b)
}

func tail(s string, n int) string {
	if len(s) > n {
		return s[len(s)-n:]
	}
	return s
}
