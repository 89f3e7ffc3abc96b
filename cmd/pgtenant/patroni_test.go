package main

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pgtenant/pgtenant/internal/api"
	"github.com/pgtenant/pgtenant/internal/jobs"
	"github.com/pgtenant/pgtenant/internal/patroni"
	"github.com/pgtenant/pgtenant/internal/pgtest"
	"github.com/pgtenant/pgtenant/internal/provision"
	"github.com/pgtenant/pgtenant/internal/templates"
)

// TestUp_Patroni runs `up --patroni`: the cluster under Patroni (etcd, a
// Patroni per node, a leader and a synchronous standby), registered with
// its Patroni endpoints; a tenant created through it works through its
// PgBouncer DSN. The leader's node dies (its Patroni and PostgreSQL
// SIGKILLed): up's supervisor starts its Patroni again, the cluster has a
// leader, and the tenant's DSN writes again. Ctrl-C leaves no Patroni,
// etcd or PostgreSQL behind; a plain `up` on the same data dir runs it
// under Patroni again, with the tenant's rows. The cluster archives and is
// backed up under Patroni: a backup after the node loss works, and a
// rewind takes the tenant back.
func TestUp_Patroni(t *testing.T) {
	skipWithoutPatroni(t)
	dataDir := filepath.Join(pgtest.TempDir(t), "data")
	ctx, cancel := context.WithTimeout(context.Background(), 9*time.Minute)
	defer cancel()

	p := startUp(t, dataDir, "--patroni")
	stopped := false
	defer func() {
		if !stopped {
			p.stop(t)
		}
	}()
	if len(p.info.Clusters) != 1 || len(p.info.Clusters[0].Patroni) != 2 || len(p.info.Clusters[0].Nodes) != 2 {
		t.Fatalf("up --patroni printed clusters %+v; want local with 2 Patroni endpoints and 2 nodes", p.info.Clusters)
	}
	pc := patroni.NewClient(p.info.Clusters[0].Patroni, nil)
	waitLeader(t, ctx, pc)
	c := api.NewClient(p.info.URL, p.info.Token)
	d, err := c.Cluster(ctx, "local")
	if err != nil || d.Kind != "managed" || len(d.Patroni) != 2 || !d.SynchronousMode || len(d.Members) != 2 {
		t.Fatalf("cluster show local: %+v, %v; want managed, 2 Patroni endpoints, synchronous, 2 members", d, err)
	}
	if _, err := c.CreateTemplate(ctx, "w", []templates.Upload{{Name: "0001_init.sql", Body: `CREATE TABLE writes (id int NOT NULL);`}}); err != nil {
		t.Fatal(err)
	}
	created, err := c.CreateTenant(ctx, provision.Request{Template: "w"})
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(created.DSN, p.info.Clusters[0].Pooler) {
		t.Errorf("tenant DSN %s: want the pooler's %s", created.DSN, p.info.Clusters[0].Pooler)
	}
	write(t, ctx, created.DSN, 1, time.Minute)

	// The leader's node dies: Patroni and its PostgreSQL.
	leader := waitLeader(t, ctx, pc)
	node := filepath.Join(dataDir, "local", leader)
	killNode(t, node)
	killed := time.Now()
	write(t, ctx, created.DSN, 2, 2*time.Minute)
	t.Logf("node %s killed: the tenant wrote again through its DSN %.1fs later", leader, time.Since(killed).Seconds())
	// The catalog lives on this cluster too: the API serves again.
	if _, err := c.CreateTenant(ctx, provision.Request{Template: "w"}); err != nil {
		t.Errorf("tenant create after the node loss: %v", err)
	}
	if _, err := pc.Leader(ctx); err != nil {
		t.Errorf("after the node loss: %v", err)
	}
	p.stop(t)
	stopped = true
	if !strings.Contains(p.stderr.String(), `msg="node restarted"`) {
		t.Errorf("up's supervisor did not start the killed Patroni again; up's log:\n%s", p.stderr)
	}
	noProcessesUnder(t, dataDir)

	// Without --patroni: the data dir runs under Patroni again.
	p = startUp(t, dataDir)
	defer p.stop(t)
	if len(p.info.Clusters) != 1 || len(p.info.Clusters[0].Patroni) != 2 {
		t.Fatalf("up again printed clusters %+v; want local under Patroni; up's log:\n%s", p.info.Clusters, p.stderr)
	}
	write(t, ctx, created.DSN, 3, 2*time.Minute)
	conn, err := pgx.Connect(ctx, created.DSN)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	var n int
	if err := conn.QueryRow(ctx, `SELECT count(*) FROM writes`).Scan(&n); err != nil || n != 3 {
		t.Errorf("the tenant's rows after the restart: %d, %v; want 3", n, err)
	}
	conn.Close(ctx)

	// Backups under Patroni: the cluster archives from its creation and was
	// backed up (pgBackRest finds whichever node leads, and backs up from
	// the other); a backup now, after the node loss, works too, and a
	// rewind takes the tenant back.
	if _, err := exec.LookPath("pgbackrest"); err != nil {
		return
	}
	c = api.NewClient(p.info.URL, p.info.Token)
	var incr []jobs.Job
	for deadline := time.Now().Add(3 * time.Minute); ; time.Sleep(time.Second) {
		if incr, err = c.BackupNow(ctx, api.BackupRequest{Cluster: "local", Type: "incr"}); err == nil {
			break
		} else if time.Now().After(deadline) {
			t.Fatalf("backup now under Patroni: %v", err)
		}
	}
	if j, err := c.WaitJob(ctx, incr[0].ID, nil); err != nil || j.State != jobs.Succeeded {
		t.Fatalf("backup under Patroni: %v %s %s", err, j.State, j.LastError)
	}
	bs, err := c.Backups(ctx, "local")
	if err != nil || len(bs) != 1 || len(bs[0].Backups) < 2 {
		t.Fatalf("backup list under Patroni: %+v %v; want the first full backup and the incremental one", bs, err)
	}
	time.Sleep(1100 * time.Millisecond)
	at := time.Now()
	time.Sleep(1100 * time.Millisecond)
	write(t, ctx, created.DSN, 4, time.Minute) // after TIME: gone again
	rw, err := c.RewindTenant(ctx, created.Tenant.ID, at)
	if err != nil {
		t.Fatal(err)
	}
	if j, err := c.WaitJob(ctx, rw.ID, nil); err != nil || j.State != jobs.Succeeded {
		t.Fatalf("rewind under Patroni: %v %s %s", err, j.State, j.LastError)
	}
	if conn, err = pgx.Connect(ctx, created.DSN); err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	if err := conn.QueryRow(ctx, `SELECT count(*) FROM writes`).Scan(&n); err != nil || n != 3 {
		t.Errorf("the tenant's rows after its rewind under Patroni: %d, %v; want 3", n, err)
	}
}

// TestUp_PatroniEtcdThree runs `up --etcd 3` on a new data dir, under
// Patroni by default (one node: --standbys 0): three etcd members
// (DATA_DIR/etcd/e1, e2, e3), every Patroni given their three endpoints.
// The etcd leader is SIGKILLed and stays down (--max-restarts 0): the two
// others keep a quorum, so over loop_wait + retry_timeout and more the
// cluster keeps its leader, Patroni never loses the store, and a tenant
// create through the API works. Ctrl-C leaves no process.
func TestUp_PatroniEtcdThree(t *testing.T) {
	skipWithoutPatroni(t)
	dataDir := filepath.Join(pgtest.TempDir(t), "data")
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()

	p := startUp(t, dataDir, "--etcd", "3", "--standbys", "0", "--max-restarts", "0")
	stopped := false
	defer func() {
		if !stopped {
			p.stop(t)
		}
	}()
	if len(p.info.Clusters) != 1 || len(p.info.Clusters[0].Patroni) != 1 {
		t.Fatalf("up --etcd 3 printed clusters %+v; want local under Patroni (1 endpoint); up's log:\n%s", p.info.Clusters, p.stderr)
	}
	var endpoints []string
	for _, m := range []string{"e1", "e2", "e3"} {
		b, err := os.ReadFile(filepath.Join(dataDir, "etcd", m, "ports.json"))
		var ports struct{ Client int }
		if err != nil || json.Unmarshal(b, &ports) != nil || ports.Client == 0 {
			t.Fatalf("etcd member %s: ports.json %s, %v", m, b, err)
		}
		endpoints = append(endpoints, "127.0.0.1:"+strconv.Itoa(ports.Client))
	}
	conf, err := os.ReadFile(filepath.Join(dataDir, "local", "n1", "patroni.yml"))
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range endpoints {
		if !strings.Contains(string(conf), e) {
			t.Errorf("n1's patroni.yml does not name etcd member %s:\n%s", e, conf)
		}
	}
	pc := patroni.NewClient(p.info.Clusters[0].Patroni, nil)
	leader := waitLeader(t, ctx, pc)
	c := api.NewClient(p.info.URL, p.info.Token)
	if _, err := c.CreateTemplate(ctx, "w", []templates.Upload{{Name: "0001_init.sql", Body: `CREATE TABLE writes (id int NOT NULL);`}}); err != nil {
		t.Fatal(err)
	}

	// The etcd leader dies, and stays down.
	lost := etcdLeader(t, ctx, endpoints)
	pids := pidsWith(filepath.Join(dataDir, "etcd", lost, "data"))
	if len(pids) != 1 {
		t.Fatalf("etcd member %s: pids %v; want one", lost, pids)
	}
	_ = syscall.Kill(pids[0], syscall.SIGKILL)
	killed := time.Now()
	// A leader that lost the store would demote itself within loop_wait
	// (2 s) + retry_timeout (5 s): watch it for twice that.
	for time.Since(killed) < 15*time.Second {
		m, err := pc.Leader(ctx)
		if err != nil || m.Name != leader {
			t.Fatalf("%.1fs after etcd member %s died: leader %+v, %v; want %s still leading", time.Since(killed).Seconds(), lost, m, err, leader)
		}
		time.Sleep(500 * time.Millisecond)
	}
	created, err := c.CreateTenant(ctx, provision.Request{Template: "w"})
	if err != nil {
		t.Fatalf("tenant create with etcd member %s down: %v", lost, err)
	}
	write(t, ctx, created.DSN, 1, time.Minute)
	if log, _ := os.ReadFile(filepath.Join(dataDir, "local", "n1", "patroni.log")); strings.Contains(string(log), "DCS is not accessible") {
		t.Errorf("Patroni lost the store with one etcd member of three down; its log:\n%s", log)
	}
	t.Logf("etcd member %s (the etcd leader) killed: %s still led %.1fs later, and a tenant create worked", lost, leader, time.Since(killed).Seconds())

	p.stop(t)
	stopped = true
	noProcessesUnder(t, dataDir)
}

// etcdLeader names the member (e1, e2, e3: as endpoints) that leads the
// etcd cluster, from each one's status on the v3 gateway.
func etcdLeader(t *testing.T, ctx context.Context, endpoints []string) string {
	t.Helper()
	for i, e := range endpoints {
		req, err := http.NewRequestWithContext(ctx, http.MethodPost, "http://"+e+"/v3/maintenance/status", strings.NewReader("{}"))
		if err != nil {
			t.Fatal(err)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatalf("etcd status of %s: %v", e, err)
		}
		var st struct {
			Header struct {
				MemberID string `json:"member_id"`
			} `json:"header"`
			Leader string `json:"leader"`
		}
		err = json.NewDecoder(resp.Body).Decode(&st)
		resp.Body.Close()
		if err != nil {
			t.Fatalf("etcd status of %s: %v", e, err)
		}
		if st.Leader != "" && st.Leader == st.Header.MemberID {
			return "e" + strconv.Itoa(i+1)
		}
	}
	t.Fatalf("no etcd member of %v leads", endpoints)
	return ""
}

// waitLeader waits for the cluster's running leader and names it.
func waitLeader(t *testing.T, ctx context.Context, pc *patroni.Client) string {
	t.Helper()
	wctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	m, err := pc.WaitLeader(wctx)
	if err != nil {
		t.Fatal(err)
	}
	return m.Name
}

// write inserts id through dsn, retrying (a new connection each time)
// until it is acknowledged or bound has passed.
func write(t *testing.T, ctx context.Context, dsn string, id int, bound time.Duration) {
	t.Helper()
	deadline := time.Now().Add(bound)
	for {
		wctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		conn, err := pgx.Connect(wctx, dsn)
		if err == nil {
			_, err = conn.Exec(wctx, `INSERT INTO writes VALUES ($1)`, id)
			conn.Close(context.Background())
		}
		cancel()
		if err == nil {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("write %d through %s: %v after %v", id, dsn, err, bound)
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// killNode SIGKILLs the Patroni whose node dir is dir and its PostgreSQL
// (the postmaster and its process group): a node loss. It fails the test
// unless both were running and are gone.
func killNode(t *testing.T, dir string) {
	t.Helper()
	patronis := pidsWith(filepath.Join(dir, "patroni.yml"))
	b, err := os.ReadFile(filepath.Join(dir, "data", "postmaster.pid"))
	if err != nil || len(patronis) == 0 {
		t.Fatalf("kill the node in %s: patroni %v, postmaster.pid: %v", dir, patronis, err)
	}
	first, _, _ := strings.Cut(string(b), "\n")
	pg, err := strconv.Atoi(strings.TrimSpace(first))
	if err != nil {
		t.Fatalf("%s/data/postmaster.pid: %v", dir, err)
	}
	for _, pid := range patronis {
		_ = syscall.Kill(pid, syscall.SIGKILL)
	}
	_ = syscall.Kill(-pg, syscall.SIGKILL)
	_ = syscall.Kill(pg, syscall.SIGKILL)
	for _, pid := range append(patronis, pg) {
		for i := 0; syscall.Kill(pid, 0) == nil && !zombie(pid); i++ {
			if i == 100 {
				t.Fatalf("kill the node in %s: pid %d still runs", dir, pid)
			}
			time.Sleep(50 * time.Millisecond)
		}
	}
}

// zombie reports whether pid has exited and waits for its parent.
func zombie(pid int) bool {
	stat, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return true
	}
	_, rest, _ := strings.Cut(string(stat), ") ")
	return strings.HasPrefix(rest, "Z")
}

// processesUnder lists the processes whose command line names a path
// under dir.
func processesUnder(dir string) []string {
	var out []string
	for _, pid := range pidsWith(dir) {
		cmdline, _ := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
		out = append(out, fmt.Sprintf("%d %s", pid, strings.ReplaceAll(string(cmdline), "\x00", " ")))
	}
	return out
}

// pidsWith returns the pids whose command line contains s.
func pidsWith(s string) []int {
	entries, _ := os.ReadDir("/proc")
	var out []int
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil || pid == os.Getpid() {
			continue
		}
		cmdline, err := os.ReadFile(filepath.Join("/proc", e.Name(), "cmdline"))
		if err == nil && strings.Contains(string(cmdline), s) {
			out = append(out, pid)
		}
	}
	return out
}

// skipWithoutPatroni skips an end-to-end test of up under Patroni with
// -short or without the programs it runs.
func skipWithoutPatroni(t *testing.T) {
	t.Helper()
	if testing.Short() {
		t.Skip("end-to-end")
	}
	for _, p := range []string{"patroni", "etcd", "pgbouncer"} {
		if _, err := exec.LookPath(p); err != nil {
			t.Skipf("%s not installed (make test installs it)", p)
		}
	}
}

// noProcessesUnder fails for each process still running from dataDir once
// up has stopped. A pgBackRest backup's remote process (the backup taken
// after the start, when Ctrl-C came while it ran) ends on its own within
// seconds of its parent: it gets 30 s.
func noProcessesUnder(t *testing.T, dataDir string) {
	t.Helper()
	left := processesUnder(dataDir)
	for deadline := time.Now().Add(30 * time.Second); len(left) > 0 && time.Now().Before(deadline); left = processesUnder(dataDir) {
		only := true
		for _, l := range left {
			only = only && strings.Contains(l, "pgbackrest")
		}
		if !only {
			break
		}
		time.Sleep(500 * time.Millisecond)
	}
	for _, leftover := range left {
		t.Errorf("after Ctrl-C, still running: %s", leftover)
	}
}
