package patroni_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"go.yaml.in/yaml/v3"

	"github.com/pgtenant/pgtenant/internal/patroni"
	"github.com/pgtenant/pgtenant/internal/patroni/patronitest"
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
	ctx := pgtest.Context(t)
	c := patronitest.Start(t, ctx, patronitest.Options{Scope: "c1"})
	leader, standby := c.WaitLeaderAndSyncStandby(t, ctx, "")
	createTable(t, ctx, c)

	w := patronitest.StartWriter(t, ctx, c.DSN())
	w.WaitAcks(t, ctx, 50, "50 writes before the kill")

	killed := time.Now()
	c.Node(leader.Name).Kill()
	t.Logf("killed %s (leader, timeline %d): patroni and postgres", leader.Name, leader.Timeline)

	newLeader := waitNewLeader(t, ctx, c, leader.Name, 90*time.Second)
	elected := time.Since(killed)
	if newLeader.Name != standby.Name {
		t.Fatalf("new leader: got %s, want the synchronous standby %s", newLeader.Name, standby.Name)
	}
	waitTimeline(t, ctx, c, newLeader.Name, leader.Timeline+1)
	first := w.WaitAckOn(t, ctx, c.Node(newLeader.Name).Port(), killed, 90*time.Second)
	t.Logf("node loss: leader elected %.1fs after the kill, first acknowledged write %.1fs after the kill (ttl %v, loop_wait %v)",
		elected.Seconds(), first.Sub(killed).Seconds(), patroni.DefaultSettings().TTL, patroni.DefaultSettings().LoopWait)
	w.WaitAcks(t, ctx, len(w.Acks())+20, "20 writes on the new leader")

	// The old node comes back: Patroni rewinds it onto the new timeline
	// and it streams from the new leader.
	old := c.Node(leader.Name)
	if err := old.Start(ctx); err != nil {
		t.Fatal(err)
	}
	rejoinStart := time.Now()
	_, back := c.WaitLeaderAndSyncStandby(t, ctx, newLeader.Name)
	if back.Name != leader.Name {
		t.Fatalf("synchronous standby after the rejoin: got %s, want the old leader %s", back.Name, leader.Name)
	}
	t.Logf("old leader back as synchronous standby %.1fs after its restart", time.Since(rejoinStart).Seconds())
	// It was killed with WAL past the point where the standby took over
	// (the writes since its last checkpoint): it must have been rewound.
	oldLog := patronitest.Log(t, old)
	for _, line := range strings.Split(oldLog, "\n") {
		if strings.Contains(line, "rewind") {
			t.Logf("%s: %s", old.Name(), line)
		}
	}
	if !strings.Contains(oldLog, "pg_rewind exit code=0") {
		t.Errorf("%s's log: no successful pg_rewind", old.Name())
	}
	if ok, err := c.Client.Check(ctx, old.APIURL(), patroni.CheckReplica); err != nil || !ok {
		t.Errorf("old leader's /replica: got %v, %v; want 200", ok, err)
	}

	acked := w.Stop()
	t.Logf("writer: %d acknowledged writes, %d errors", len(acked), w.Errors())
	patronitest.CheckRows(t, ctx, c.NodeDSN(newLeader.Name), "on "+newLeader.Name, acked)
	waitSameRows(t, ctx, c, newLeader.Name, leader.Name)
}

// TestFailover_Switchover is the planned change: Switchover swaps the
// roles, writes go on through the same DSN, then Failover moves the leader
// back.
func TestFailover_Switchover(t *testing.T) {
	ctx := pgtest.Context(t)
	c := patronitest.Start(t, ctx, patronitest.Options{Scope: "c1"})
	leader, standby := c.WaitLeaderAndSyncStandby(t, ctx, "")
	createTable(t, ctx, c)

	w := patronitest.StartWriter(t, ctx, c.DSN())
	w.WaitAcks(t, ctx, 30, "30 writes before the switchover")

	start := time.Now()
	if err := c.Client.Switchover(ctx, leader.Name, standby.Name); err != nil {
		t.Fatal(err)
	}
	returned := time.Since(start)
	got, err := c.Client.Leader(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if got.Name != standby.Name {
		t.Fatalf("leader after the switchover: got %s, want %s", got.Name, standby.Name)
	}
	waitTimeline(t, ctx, c, got.Name, leader.Timeline+1)
	first := w.WaitAckOn(t, ctx, c.Node(standby.Name).Port(), start, 60*time.Second)
	t.Logf("switchover: returned after %.1fs, first write on the new leader %.1fs after the request, longest pause between two writes %.1fs",
		returned.Seconds(), first.Sub(start).Seconds(), w.LongestPause(start).Seconds())

	_, back := c.WaitLeaderAndSyncStandby(t, ctx, standby.Name)
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
		ok, err := c.Client.Check(ctx, c.Node(chk.node).APIURL(), chk.check)
		if err != nil || ok != chk.want {
			t.Errorf("%s %s: got %v, %v; want %v", chk.node, chk.check, ok, err, chk.want)
		}
	}

	// A forced failover back to the first node.
	start = time.Now()
	if err := c.Client.Failover(ctx, leader.Name); err != nil {
		t.Fatal(err)
	}
	if got, err := c.Client.Leader(ctx); err != nil || got.Name != leader.Name {
		t.Fatalf("leader after the failover: got %s, %v; want %s", got.Name, err, leader.Name)
	}
	first = w.WaitAckOn(t, ctx, c.Node(leader.Name).Port(), start, 60*time.Second)
	t.Logf("failover back: first write on %s %.1fs after the request", leader.Name, first.Sub(start).Seconds())
	w.WaitAcks(t, ctx, len(w.Acks())+10, "10 writes after the failover")

	acked := w.Stop()
	t.Logf("writer: %d acknowledged writes, %d errors", len(acked), w.Errors())
	patronitest.CheckRows(t, ctx, c.NodeDSN(leader.Name), "on "+leader.Name, acked)
}

// TestFailover_StandbyDown loses the only standby: in synchronous mode
// (not strict) the primary turns synchronous replication off and goes on
// taking writes, which Patroni shows as a cluster with no synchronous
// standby; once the standby is back it is synchronous again.
func TestFailover_StandbyDown(t *testing.T) {
	ctx := pgtest.Context(t)
	c := patronitest.Start(t, ctx, patronitest.Options{Scope: "c1"})
	leader, standby := c.WaitLeaderAndSyncStandby(t, ctx, "")
	createTable(t, ctx, c)

	w := patronitest.StartWriter(t, ctx, c.DSN())
	w.WaitAcks(t, ctx, 30, "30 writes before the kill")

	killed := time.Now()
	c.Node(standby.Name).Kill()
	var last string
	patronitest.WaitFor(t, ctx, 60*time.Second, "Patroni to show no synchronous standby", func() bool {
		ms, err := c.Client.Members(ctx)
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
	first := w.WaitAckOn(t, ctx, c.Node(leader.Name).Port(), killed, 60*time.Second)
	w.WaitAcks(t, ctx, len(w.Acks())+20, "20 writes without a standby")
	t.Logf("standby lost: first write acknowledged %.1fs after the kill; longest pause between two writes %.1fs",
		first.Sub(killed).Seconds(), w.LongestPause(killed).Seconds())

	conn, err := pgx.Connect(ctx, c.NodeDSN(leader.Name))
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

	if err := c.Node(standby.Name).Start(ctx); err != nil {
		t.Fatal(err)
	}
	l, s := c.WaitLeaderAndSyncStandby(t, ctx, leader.Name)
	if s.Name != standby.Name {
		t.Fatalf("synchronous standby after its restart: got %s, want %s", s.Name, standby.Name)
	}
	if err := conn.QueryRow(ctx, `SHOW synchronous_standby_names`).Scan(&names); err != nil {
		t.Fatal(err)
	}
	if names != standby.Name {
		t.Errorf("synchronous_standby_names with the standby back: got %q, want %q", names, standby.Name)
	}
	acked := w.Stop()
	t.Logf("writer: %d acknowledged writes, %d errors", len(acked), w.Errors())
	patronitest.CheckRows(t, ctx, c.NodeDSN(l.Name), "on "+l.Name, acked)
}

// waitNewLeader waits until a running leader other than old holds the lock.
func waitNewLeader(t *testing.T, ctx context.Context, c *patronitest.Cluster, old string, bound time.Duration) patroni.Member {
	t.Helper()
	var got patroni.Member
	var last string
	patronitest.WaitFor(t, ctx, bound, "a new leader", func() bool {
		m, err := c.Client.Leader(ctx)
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
func waitTimeline(t *testing.T, ctx context.Context, c *patronitest.Cluster, node string, want int) {
	t.Helper()
	var last string
	patronitest.WaitFor(t, ctx, 20*time.Second, fmt.Sprintf("%s on timeline %d", node, want), func() bool {
		ms, err := c.Client.Members(ctx)
		last = fmt.Sprintf("%+v %v", ms, err)
		for _, m := range ms {
			if m.Name == node && m.Timeline == want {
				return true
			}
		}
		return false
	}, func() string { return last })
}

func createTable(t *testing.T, ctx context.Context, c *patronitest.Cluster) {
	t.Helper()
	conn, err := pgx.Connect(ctx, c.DSN())
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	// No unique key on purpose: a write retried twice would show as a
	// duplicate instead of failing.
	if _, err := conn.Exec(ctx, `CREATE TABLE writes (id int NOT NULL)`); err != nil {
		t.Fatal(err)
	}
}

// waitSameRows waits until standby has replayed every row of leader.
func waitSameRows(t *testing.T, ctx context.Context, c *patronitest.Cluster, leader, standby string) {
	t.Helper()
	count := func(node string) (int, bool, error) {
		conn, err := pgx.Connect(ctx, c.NodeDSN(node))
		if err != nil {
			return 0, false, err
		}
		defer conn.Close(ctx)
		var n int
		var recovery bool
		err = conn.QueryRow(ctx, `SELECT (SELECT count(*) FROM writes), pg_is_in_recovery()`).Scan(&n, &recovery)
		return n, recovery, err
	}
	want, _, err := count(leader)
	if err != nil {
		t.Fatal(err)
	}
	var last string
	patronitest.WaitFor(t, ctx, 30*time.Second, standby+" to have the leader's rows", func() bool {
		got, recovery, err := count(standby)
		last = fmt.Sprintf("%d rows (want %d), in recovery %v, err %v", got, want, recovery, err)
		return err == nil && recovery && got == want
	}, func() string { return last })
}
