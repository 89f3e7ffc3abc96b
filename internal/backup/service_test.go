package backup_test

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pgtenant/pgtenant/internal/api"
	"github.com/pgtenant/pgtenant/internal/backup"
	"github.com/pgtenant/pgtenant/internal/backup/backuptest"
	"github.com/pgtenant/pgtenant/internal/catalog"
	"github.com/pgtenant/pgtenant/internal/fleet"
	"github.com/pgtenant/pgtenant/internal/jobs"
)

// startDaemon runs a daemon over fc with the given stanzas (backuptest.Daemon).
func startDaemon(t *testing.T, fc *fleet.Cluster, catalogDB string, stanzas map[string]*backup.Stanza) *api.Client {
	t.Helper()
	c, _ := backuptest.Daemon(t, fc, catalogDB, stanzas, nil)
	return c
}

func waitJob(t *testing.T, ctx context.Context, c *api.Client, id int64) jobs.Job {
	t.Helper()
	j, err := c.WaitJob(ctx, id, nil)
	if err != nil {
		t.Fatal(err)
	}
	if j.State != jobs.Succeeded {
		t.Fatalf("job %d %s: %s", j.ID, j.State, j.LastError)
	}
	return j
}

// TestBackup_NowListWindowThroughAPI drives backups the way `pgtenant
// backup` does: the daemon starts the first full backup of a new cluster by
// itself, a backup asked for while one runs is refused naming that job,
// `backup now` full then diff are listed with their times, WAL archived
// after them shows in the archive, and the recovery window spans them. A
// daemon that does not back the cluster up answers with what to do.
func TestBackup_NowListWindowThroughAPI(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	fc, st := backuptest.Cluster(t, ctx, 1)
	backuptest.Exec(t, ctx, fc.PrimaryDSN("postgres"), `CREATE DATABASE catalog`)
	c := startDaemon(t, fc, "catalog", map[string]*backup.Stanza{fc.Name(): st})

	// The daemon queued the new cluster's first full backup: a second one
	// now is refused, naming it.
	_, busy := c.BackupNow(ctx, api.BackupRequest{Cluster: fc.Name(), Type: backup.Full})
	if !errors.Is(busy, catalog.ErrConflict) || !strings.Contains(busy.Error(), "already") {
		t.Fatalf("backup now during the first backup: err = %v, want a conflict saying one is already running", busy)
	}
	all, err := c.Jobs(ctx, map[string][]string{"target": {"cluster:" + fc.Name()}})
	if err != nil {
		t.Fatal(err)
	}
	var first []jobs.Job
	for _, j := range all {
		if j.Type == jobs.ClusterBackup {
			first = append(first, j)
		}
	}
	if len(first) != 1 {
		t.Fatalf("backup jobs = %+v, want the first backup", first)
	}
	if want := "job " + itoa(first[0].ID); !strings.Contains(busy.Error(), want) {
		t.Errorf("busy error %q does not name %q", busy, want)
	}
	waitJob(t, ctx, c, first[0].ID)

	js, err := c.BackupNow(ctx, api.BackupRequest{Cluster: fc.Name(), Type: backup.Full})
	if err != nil {
		t.Fatal(err)
	}
	waitJob(t, ctx, c, js[0].ID)
	backuptest.Exec(t, ctx, fc.PrimaryDSN("postgres"), `CREATE TABLE after_full AS SELECT generate_series(1, 5000) AS v`)
	js, err = c.BackupNow(ctx, api.BackupRequest{Cluster: fc.Name(), Type: backup.Diff})
	if err != nil {
		t.Fatal(err)
	}
	// While the diff is queued or running, another is refused.
	if _, err := c.BackupNow(ctx, api.BackupRequest{Cluster: fc.Name(), Type: backup.Incr}); !errors.Is(err, catalog.ErrConflict) {
		t.Errorf("backup now during a diff: err = %v, want a conflict", err)
	}
	waitJob(t, ctx, c, js[0].ID)

	// WAL written after the backups reaches the archive.
	conn, err := pgx.Connect(ctx, fc.PrimaryDSN("postgres"))
	if err != nil {
		t.Fatal(err)
	}
	var seg string
	if err := conn.QueryRow(ctx, `SELECT pg_walfile_name(pg_switch_wal())`).Scan(&seg); err != nil {
		t.Fatal(err)
	}
	conn.Close(ctx)
	var got backup.ClusterBackups
	waitFor(t, ctx, func() bool {
		out, err := c.Backups(ctx, fc.Name())
		if err != nil {
			t.Fatal(err)
		}
		got = out[0]
		return got.ArchiveMax >= seg
	})
	if got.Cluster != fc.Name() || !got.FromStandby || got.Running {
		t.Errorf("list = %+v, want %s, from the standby, nothing running", got, fc.Name())
	}
	var types []string
	for _, b := range got.Backups {
		types = append(types, b.Type)
	}
	if strings.Join(types, ",") != "full,full,diff" {
		t.Fatalf("backup types = %v, want full,full,diff", types)
	}
	full, diff := got.Backups[1], got.Backups[2]
	if diff.Prior != full.Label || !diff.Start.After(full.Stop.Add(-time.Second)) {
		t.Errorf("diff %+v does not follow full %+v", diff, full)
	}
	w := got.Window
	if w == nil || !w.Earliest.Equal(got.Backups[0].Stop) || w.Latest.Before(diff.Stop) || w.Latest.After(time.Now().Add(time.Second)) {
		t.Errorf("window = %+v, want from the first backup's stop %v to at least the diff's %v, not in the future", w, got.Backups[0].Stop, diff.Stop)
	}

	// A cluster this daemon does not back up says what to do.
	other := startDaemon(t, fc, "catalog", nil)
	for name, call := range map[string]func() error{
		"list": func() error { _, err := other.Backups(ctx, fc.Name()); return err },
		"now":  func() error { _, err := other.BackupNow(ctx, api.BackupRequest{Cluster: fc.Name()}); return err },
	} {
		err := call()
		if !errors.Is(err, catalog.ErrConflict) || !strings.Contains(err.Error(), "no backups configured") || !strings.Contains(err.Error(), backup.InstallHint) {
			t.Errorf("%s on a cluster without backups: err = %v, want a conflict saying what to do", name, err)
		}
	}
	if _, err := c.Backups(ctx, "nosuch"); !errors.Is(err, catalog.ErrNotFound) {
		t.Errorf("list of an unknown cluster: err = %v, want not found", err)
	}
}

// TestBackup_ClusterWithoutBackups: a cluster made without
// fleet.Options.Backups has no stanza, and says what to do.
func TestBackup_ClusterWithoutBackups(t *testing.T) {
	dir := t.TempDir()
	// The postgres OS user (when we are root) must traverse the temp dir.
	if err := os.Chmod(filepath.Dir(dir), 0o755); err != nil {
		t.Fatal(err)
	}
	fc, err := fleet.Open(fleet.Options{Dir: filepath.Join(dir, "plain"), Name: "plain"})
	if err != nil {
		t.Fatal(err)
	}
	_, err = backup.ForCluster(fc, true)
	if !errors.Is(err, backup.ErrNotConfigured) || !strings.Contains(err.Error(), backup.InstallHint) {
		t.Errorf("err = %v, want ErrNotConfigured with the install command", err)
	}
}

func itoa(n int64) string { return strconv.FormatInt(n, 10) }
