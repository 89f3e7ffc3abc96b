package analytics_test

import (
	"context"
	"database/sql"
	"encoding/json"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"os"
	osexec "os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	_ "github.com/duckdb/duckdb-go/v2"
	"github.com/jackc/pgx/v5"

	"github.com/pgtenant/pgtenant/internal/analytics"
	"github.com/pgtenant/pgtenant/internal/catalog"
	"github.com/pgtenant/pgtenant/internal/config"
	"github.com/pgtenant/pgtenant/internal/daemon"
	"github.com/pgtenant/pgtenant/internal/daemon/daemontest"
	"github.com/pgtenant/pgtenant/internal/pgtest"
	"github.com/pgtenant/pgtenant/internal/provision"
)

// childEnv names the file with a child daemon's configuration: the test
// binary, started again with it set, runs a daemon until it is killed.
const childEnv = "PGTENANT_ANALYTICS_CHILD"

type childSpec struct {
	Config       config.Config
	Cluster, DSN string // the managed cluster (catalog.Cluster keeps its DSNs out of JSON)
	Standbys     []string
}

// runChild is a daemon in a process of its own, for tests that SIGKILL it.
func runChild(path string) int {
	raw, err := os.ReadFile(path)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	var spec childSpec
	if err := json.Unmarshal(raw, &spec); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	ctx := context.Background()
	log := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelInfo}))
	d, err := daemon.New(ctx, daemon.Options{Config: spec.Config, Managed: []catalog.Cluster{{Name: spec.Cluster, DSN: spec.DSN, StandbyDSNs: spec.Standbys}}, Logger: log})
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	if err := d.Run(ctx); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	return 0
}

// child is a daemon process of the test's.
type child struct {
	cmd *osexec.Cmd
	log string
}

// startChild runs a daemon with cfg in a process of its own.
func startChild(t *testing.T, cfg config.Config, n int) *child {
	t.Helper()
	dir := t.TempDir()
	spec := childSpec{Config: cfg, Cluster: pg.Name(), DSN: pg.PrimaryDSN("postgres")}
	for _, s := range pg.Standbys() {
		spec.Standbys = append(spec.Standbys, pg.DSN(s, "postgres"))
	}
	raw, err := json.Marshal(spec)
	if err != nil {
		t.Fatal(err)
	}
	specPath := filepath.Join(dir, "spec.json")
	if err := os.WriteFile(specPath, raw, 0o600); err != nil {
		t.Fatal(err)
	}
	ch := &child{log: filepath.Join(dir, fmt.Sprintf("daemon%d.log", n))}
	out, err := os.Create(ch.log)
	if err != nil {
		t.Fatal(err)
	}
	defer out.Close()
	ch.cmd = osexec.Command(os.Args[0], "-test.run=^$")
	ch.cmd.Env = append(os.Environ(), childEnv+"="+specPath)
	ch.cmd.Stdout, ch.cmd.Stderr = out, out
	if err := ch.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ch.kill(t) })
	return ch
}

// kill SIGKILLs the daemon (kill -9: no deferred code, no file closed)
// and waits for it to be gone.
func (ch *child) kill(t *testing.T) {
	t.Helper()
	if ch.cmd.ProcessState != nil {
		return
	}
	if err := ch.cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatalf("kill -9: %v", err)
	}
	_ = ch.cmd.Wait()
}

func (ch *child) tail() string {
	b, _ := os.ReadFile(ch.log)
	if len(b) > 3000 {
		b = b[len(b)-3000:]
	}
	return string(b)
}

// mirrorState reads the state row of a copy of the tenant's DuckDB file
// (and its WAL), as a crash left them: copied is false when the initial
// copy had not finished.
func mirrorState(t *testing.T, dir, id string) (copied bool) {
	t.Helper()
	tmp := t.TempDir()
	for _, suffix := range []string{"", ".wal"} {
		b, err := os.ReadFile(filepath.Join(dir, id+".duckdb"+suffix))
		if err != nil {
			continue
		}
		if err := os.WriteFile(filepath.Join(tmp, "m.duckdb"+suffix), b, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	db, err := sql.Open("duckdb", filepath.Join(tmp, "m.duckdb"))
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	if err := db.QueryRow(`SELECT copied FROM _pgtenant_mirror.state`).Scan(&copied); err != nil {
		return false // no state table or no row: the copy never recorded its end
	}
	return copied
}

// kill -9 of the daemon during the initial copy and again and again while
// it applies a stream of inserts, updates and deletes: each daemon started
// after resumes (or restarts the copy), and the mirror ends equal to the
// heap, every column of every row, no row lost or twice.
func TestMirror_KillDuringCopyAndApply(t *testing.T) {
	if testing.Short() {
		t.Skip("kills and restarts daemons")
	}
	ctx := context.Background()
	cfg := testConfig(t)
	// The first daemon makes the tenant and records the mirror, but looks
	// at mirrors only when it starts: the children make it.
	first := cfg
	first.Analytics.PollInterval = config.Duration(time.Hour)
	c, stop := daemontest.StartCancellable(t, pg, first)
	template(t, c)
	r, err := c.CreateTenant(ctx, provision.Request{Template: "an", Mode: "database"})
	if err != nil {
		t.Fatal(err)
	}
	id, dsn := r.Tenant.ID, r.DSN
	exec(t, dsn, `INSERT INTO items SELECT i, i % 7, md5(i::text), timestamp '2024-01-01' + i * interval '1 second', i / 7.0, CASE WHEN i % 1000 = 0 THEN repeat(md5(i::text), 100) END
		FROM generate_series(1, 400000) i`)
	if _, err := c.EnableAnalytics(ctx, id, nil); err != nil {
		t.Fatal(err)
	}
	stop()
	store, err := catalog.Open(ctx, cfg.Catalog.DSN, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer store.Close()
	svc := analytics.New(store, nil, cfg.Analytics, cfg.Analytics.Dir, nil)
	tn, err := store.GetTenant(ctx, nil, id)
	if err != nil {
		t.Fatal(err)
	}
	file := filepath.Join(cfg.Analytics.Dir, id+".duckdb")
	state := func() string {
		st, err := svc.Status(ctx, tn)
		if err != nil {
			t.Fatal(err)
		}
		return st.State
	}

	// Killed while copying: as soon as the copy has written to the file.
	n := 0
	ch := startChild(t, cfg, n)
	for i := 0; ; i++ {
		// Large inserts write row groups to the file itself, small ones
		// to its WAL.
		var size int64
		for _, p := range []string{file, file + ".wal"} {
			if fi, err := os.Stat(p); err == nil {
				size += fi.Size()
			}
		}
		if size > 4<<20 {
			break
		}
		if i == 6000 {
			t.Fatalf("the copy never wrote to the file; daemon log:\n%s", ch.tail())
		}
		time.Sleep(10 * time.Millisecond)
	}
	ch.kill(t)
	if mirrorState(t, cfg.Analytics.Dir, id) {
		t.Fatal("the copy had finished before the kill: nothing was killed mid-copy")
	}

	// Then killed while the tenant writes.
	var wg sync.WaitGroup
	loadCtx, endLoad := context.WithCancel(ctx)
	wg.Add(1)
	go func() {
		defer wg.Done()
		conn, err := pgx.Connect(ctx, dsn)
		if err != nil {
			t.Error(err)
			return
		}
		defer conn.Close(ctx)
		rng := rand.New(rand.NewPCG(1, 2))
		next := 400001
		for loadCtx.Err() == nil {
			lo := rng.IntN(400000)
			var q string
			switch rng.IntN(4) {
			case 0:
				q = fmt.Sprintf(`INSERT INTO items SELECT i, 1, 'new', now()::timestamp, 1.5, NULL FROM generate_series(%d, %d) i`, next, next+49)
				next += 50
			case 1:
				q = fmt.Sprintf(`UPDATE items SET qty = qty + 1, name = name || 'u' WHERE id BETWEEN %d AND %d`, lo, lo+200)
			case 2:
				q = fmt.Sprintf(`DELETE FROM items WHERE id BETWEEN %d AND %d`, lo, lo+20)
			case 3:
				q = fmt.Sprintf(`BEGIN; UPDATE items SET price = price * 2 WHERE id = %d; INSERT INTO items VALUES (%d, 2, 'txn', NULL, NULL, NULL) ON CONFLICT (id) DO UPDATE SET qty = items.qty + 1; COMMIT`, lo, lo+1)
			}
			if _, err := conn.Exec(ctx, q); err != nil {
				t.Error(err)
				return
			}
		}
	}()
	rng := rand.New(rand.NewPCG(3, 4))
	kills := 0
	for kills < 4 {
		n++
		ch = startChild(t, cfg, n)
		for i := 0; state() != analytics.StateStreaming; i++ {
			if i == 3000 {
				t.Fatalf("never streaming again; daemon log:\n%s", ch.tail())
			}
			time.Sleep(20 * time.Millisecond)
		}
		// Let it apply for a while, then kill it wherever it is.
		time.Sleep(time.Duration(300+rng.IntN(1200)) * time.Millisecond)
		ch.kill(t)
		kills++
	}
	endLoad()
	wg.Wait()
	if t.Failed() {
		return
	}
	d, _ := daemontest.Start(t, pg, cfg)
	waitSame(t, d, dsn, id, "items", itemCols)
}

// A mirror file that is missing, or that DuckDB cannot read, is made again
// from a fresh copy, with an event.
func TestMirror_LostOrCorruptFileIsRebuilt(t *testing.T) {
	ctx := context.Background()
	cfg := testConfig(t)
	c, stop, id, dsn := stoppableWithTenant(t, cfg)
	exec(t, dsn, `INSERT INTO items SELECT i, i, 'a' || i, NULL, NULL, NULL FROM generate_series(1, 1000) i`)
	if _, err := c.EnableAnalytics(ctx, id, nil); err != nil {
		t.Fatal(err)
	}
	waitStreaming(t, c, id)
	stop()
	file := filepath.Join(cfg.Analytics.Dir, id+".duckdb")

	// Missing: the file and its WAL are gone.
	for _, p := range []string{file, file + ".wal"} {
		if err := os.Remove(p); err != nil && !os.IsNotExist(err) {
			t.Fatal(err)
		}
	}
	exec(t, dsn, `UPDATE items SET qty = -qty WHERE id % 2 = 0`)
	d, _, stop := daemontest.StartClusters(t, []*pgtest.Cluster{pg}, cfg, false)
	waitSame(t, d, dsn, id, "items", itemCols)
	stop()

	// Corrupt: its header and first blocks overwritten.
	f, err := os.OpenFile(file, os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.WriteAt([]byte(strings.Repeat("garbage!", 40000)), 0); err != nil {
		t.Fatal(err)
	}
	f.Close()
	_ = os.Remove(file + ".wal")
	exec(t, dsn, `DELETE FROM items WHERE id % 3 = 0`)
	d, c = daemontest.Start(t, pg, cfg)
	waitSame(t, d, dsn, id, "items", itemCols)
	wantEvent(t, c, id, "unreadable")
}
