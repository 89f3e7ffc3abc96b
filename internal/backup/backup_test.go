package backup_test

import (
	"context"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pgtenant/pgtenant/internal/backup"
	"github.com/pgtenant/pgtenant/internal/backup/backuptest"
	"github.com/pgtenant/pgtenant/internal/fleet"
)

// TestBackup_StanzaArchiveFullDiff walks a cluster's backups through their
// first steps: the stanza is made, a WAL switch reaches the repository, a
// full then a differential backup are listed in order with their times,
// and the recovery window runs from the full backup to the newest WAL.
func TestBackup_StanzaArchiveFullDiff(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	fc, st := backuptest.Cluster(t, ctx, 1)
	// Setup twice is harmless (up runs it on every start).
	if err := st.Setup(ctx); err != nil {
		t.Fatalf("second Setup: %v", err)
	}

	// A WAL switch reaches the repository.
	backuptest.Exec(t, ctx, fc.PrimaryDSN("postgres"), `CREATE TABLE marker (v int); INSERT INTO marker SELECT generate_series(1, 1000)`)
	var seg string
	conn, err := pgx.Connect(ctx, fc.PrimaryDSN("postgres"))
	if err != nil {
		t.Fatal(err)
	}
	if err := conn.QueryRow(ctx, `SELECT pg_walfile_name(pg_switch_wal())`).Scan(&seg); err != nil {
		t.Fatal(err)
	}
	conn.Close(ctx)
	waitFor(t, ctx, func() bool {
		m, _ := filepath.Glob(filepath.Join(st.RepoPath(), "archive", "bk", "*", seg[:16], seg+"-*"))
		return len(m) == 1
	})

	before := time.Now().Add(-time.Second).Truncate(time.Second)
	if err := st.Backup(ctx, backup.Full); err != nil {
		t.Fatal(err)
	}
	backuptest.Exec(t, ctx, fc.PrimaryDSN("postgres"), `INSERT INTO marker SELECT generate_series(1, 1000)`)
	if err := st.Backup(ctx, backup.Diff); err != nil {
		t.Fatal(err)
	}
	after := time.Now().Add(time.Second)
	info, err := st.Info(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if got, want := len(info.Backups), 2; got != want {
		t.Fatalf("backups = %+v, want %d", info.Backups, want)
	}
	full, diff := info.Backups[0], info.Backups[1]
	if full.Type != backup.Full || diff.Type != backup.Diff {
		t.Errorf("types = %s, %s, want full, diff", full.Type, diff.Type)
	}
	if diff.Prior != full.Label {
		t.Errorf("diff prior = %q, want %q", diff.Prior, full.Label)
	}
	for _, b := range info.Backups {
		if b.Start.Before(before) || b.Stop.After(after) || b.Stop.Before(b.Start) {
			t.Errorf("backup %s ran %v..%v, want within %v..%v", b.Label, b.Start, b.Stop, before, after)
		}
		if b.Size <= 0 || b.RepoSize <= 0 || b.LSNStart == "" || b.LSNStop == "" || b.WALStart == "" {
			t.Errorf("backup %+v: sizes, LSNs and WAL must be set", b)
		}
	}
	if info.Status != "ok" || info.Running {
		t.Errorf("status = %q running=%v, want ok and not running", info.Status, info.Running)
	}
	if info.ArchiveMin == "" || info.ArchiveMax < diff.WALStop {
		t.Errorf("archive %s..%s, want up to at least the diff's %s", info.ArchiveMin, info.ArchiveMax, diff.WALStop)
	}
	// The full backup's files are bundled: a new cluster's ~1,000 files
	// (most of them small) in a few repository files.
	var clusterFiles, repoFiles int
	count := func(n *int) fs.WalkDirFunc {
		return func(_ string, d fs.DirEntry, err error) error {
			if err == nil && !d.IsDir() {
				*n++
			}
			return nil // a file the server removes meanwhile is not counted
		}
	}
	_ = filepath.WalkDir(filepath.Join(fc.DataDir("primary"), "base"), count(&clusterFiles))
	_ = filepath.WalkDir(filepath.Join(st.RepoPath(), "backup", "bk", full.Label), count(&repoFiles))
	if clusterFiles < 500 || repoFiles == 0 || repoFiles > clusterFiles/10 {
		t.Errorf("full backup %s: %d files in the repository for the cluster's %d relation files, want them bundled (under a tenth)", full.Label, repoFiles, clusterFiles)
	}
	w := info.Window
	if w == nil {
		t.Fatal("no recovery window after two backups")
	}
	if !w.Earliest.Equal(full.Stop) || w.Latest.Before(diff.Stop) || w.Latest.After(after) {
		t.Errorf("window = %v..%v, want %v..(>= %v, <= %v)", w.Earliest, w.Latest, full.Stop, diff.Stop, after)
	}
	// The cluster keeps archiving when opened again without the option:
	// it was made so.
	again, err := fleet.Open(fleet.Options{Dir: filepath.Dir(st.Dir), Name: "bk"})
	if err != nil {
		t.Fatal(err)
	}
	if !again.Backups() {
		t.Error("a cluster made with backups, opened again without the option: Backups() = false")
	}

	logs, _ := filepath.Glob(filepath.Join(st.Dir, "log", "bk-backup.log"))
	if len(logs) == 1 {
		b, _ := os.ReadFile(logs[0])
		for _, l := range strings.Split(string(b), "\n") {
			if strings.Contains(l, "standby") {
				t.Log(l)
			}
		}
	}
	t.Logf("standby=%v full %s (%d bytes, %v) diff %s (%v)", st.Standby != nil, full.Label, full.Size, full.Stop.Sub(full.Start), diff.Label, diff.Stop.Sub(diff.Start))
}

func waitFor(t *testing.T, ctx context.Context, cond func() bool) {
	t.Helper()
	for !cond() {
		select {
		case <-ctx.Done():
			t.Fatal("timed out waiting")
		case <-time.After(200 * time.Millisecond):
		}
	}
}

// TestStanzaCreate_WaitsForTheArchiveLock: stanza-create takes the archive
// lock, which the archiver's async archive-push holds for a moment (a new
// cluster archives its first segments while up makes its stanza: up failed
// on it once in CI). Held by another process for a second, the lock delays
// the stanza's creation; it does not fail it.
func TestStanzaCreate_WaitsForTheArchiveLock(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	_, st := backuptest.Cluster(t, ctx, 0)
	path := filepath.Join(st.Dir, "lock", st.Name+"-archive.lock")
	f, err := os.OpenFile(path, os.O_CREATE|os.O_RDWR, 0o666)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if err := os.Chmod(path, 0o666); err != nil { // pgBackRest opens it as the server's OS user
		t.Fatal(err)
	}
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX); err != nil {
		t.Fatal(err)
	}
	var released atomic.Int64
	go func() {
		time.Sleep(time.Second)
		released.Store(time.Now().UnixNano())
		syscall.Flock(int(f.Fd()), syscall.LOCK_UN)
	}()
	if err := st.CreateStanza(ctx); err != nil {
		t.Fatalf("stanza-create with the archive lock held a second: %v", err)
	}
	if r := released.Load(); r == 0 || time.Now().UnixNano() < r {
		t.Errorf("stanza-create succeeded while the archive lock was held: it did not take it")
	}
}
