package backup_test

import (
	"context"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/pgtenant/pgtenant/internal/backup"
	"github.com/pgtenant/pgtenant/internal/backup/backuptest"
	"github.com/pgtenant/pgtenant/internal/catalog"
	"github.com/pgtenant/pgtenant/internal/cluster"
	"github.com/pgtenant/pgtenant/internal/config"
	"github.com/pgtenant/pgtenant/internal/doctor"
)

// TestSegmentEnd: a WAL file name's end position, for 16 MB segments.
func TestSegmentEnd(t *testing.T) {
	for _, tc := range []struct {
		seg  string
		want int64
		ok   bool
	}{
		{"000000010000000000000001", 2 << 24, true},
		{"0000000100000001000000FF", 1<<32 + 256<<24, true},
		{"00000001000000000000000", 0, false},
		{"00000001000000000000000G", 0, false},
	} {
		got, ok := backup.SegmentEnd(tc.seg, 16<<20)
		if got != tc.want || ok != tc.ok {
			t.Errorf("SegmentEnd(%s) = %d, %v, want %d, %v", tc.seg, got, ok, tc.want, tc.ok)
		}
	}
}

// TestStanza_RetentionDays: backups.retention in whole days, rounded up;
// the default without it.
func TestStanza_RetentionDays(t *testing.T) {
	for _, tc := range []struct {
		d    time.Duration
		want int
	}{{0, backup.RetentionDays}, {24 * time.Hour, 1}, {36 * time.Hour, 2}, {30 * 24 * time.Hour, 30}} {
		if got := (&backup.Stanza{Retention: tc.d}).RetentionDays(); got != tc.want {
			t.Errorf("RetentionDays(%v) = %d, want %d", tc.d, got, tc.want)
		}
	}
}

// metric returns the value of the series name with the given labels.
func metric(t *testing.T, reg *prometheus.Registry, name string, labels map[string]string) (float64, bool) {
	t.Helper()
	fams, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range fams {
		if f.GetName() != name {
			continue
		}
	next:
		for _, m := range f.GetMetric() {
			for _, lp := range m.GetLabel() {
				if v, ok := labels[lp.GetName()]; ok && v != lp.GetValue() {
					continue next
				}
			}
			switch {
			case m.GetGauge() != nil:
				return m.GetGauge().GetValue(), true
			case m.GetCounter() != nil:
				return m.GetCounter().GetValue(), true
			}
		}
	}
	return 0, false
}

func doctorCheck(t *testing.T, ctx context.Context, d *doctor.Doctor, clusterName, name string) doctor.Check {
	t.Helper()
	rep, err := d.Run(ctx, clusterName)
	if err != nil {
		t.Fatal(err)
	}
	if rep.Clusters[0].Error != "" {
		t.Fatalf("doctor: %s", rep.Clusters[0].Error)
	}
	for _, c := range rep.Clusters[0].Checks {
		if c.Name == name {
			return c
		}
	}
	t.Fatalf("no check %q in %+v", name, rep.Clusters[0].Checks)
	return doctor.Check{}
}

// TestBackup_MetricsDoctorRetention follows one cluster through what the
// metrics and the doctor say: a stanza without a backup (no age series;
// doctor warns that there is none); a full backup, which says it started
// before it ends (when a job gives its pacer slot back) and ran with the
// configured retention, then its age, the repository size, an archive lag
// within a segment after a WAL switch; then archive_command pointed at
// false (failing = 1, the lag grows past a segment, doctor fails archiving
// with the fix) and put back (archiving works again).
func TestBackup_MetricsDoctorRetention(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	fc, st := backuptest.Cluster(t, ctx, 0)
	name := fc.Name()
	primary := fc.PrimaryDSN("postgres")
	backuptest.Exec(t, ctx, primary, `CREATE DATABASE catalog`)
	log := slog.New(slog.DiscardHandler)
	store, err := catalog.Open(ctx, fc.PrimaryDSN("catalog"), log)
	if err != nil {
		t.Fatal(err)
	}
	defer store.Close()
	cl, err := cluster.New(name, primary, nil, log)
	if err != nil {
		t.Fatal(err)
	}
	clusters := cluster.NewRegistry()
	clusters.Put(cl)
	defer clusters.Close()

	cfg := config.Default()
	cfg.Backups.Retention = config.Duration(3 * 24 * time.Hour)
	svc := &backup.Service{Store: store, Stanzas: map[string]*backup.Stanza{name: st}, Clusters: clusters, Schedule: cfg.Backups, Logger: log}
	// Retention follows backups.retention: in the config, then in what
	// pgBackRest runs with.
	if err := svc.Configure(); err != nil {
		t.Fatal(err)
	}
	if err := st.Setup(ctx); err != nil {
		t.Fatal(err)
	}
	conf, err := os.ReadFile(st.ConfigPath())
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(conf), "\nrepo1-retention-full=3\n") || !strings.Contains(string(conf), "\nrepo1-retention-full-type=time\n") {
		t.Errorf("pgbackrest.conf does not keep 3 days:\n%s", conf)
	}
	reg := prometheus.NewRegistry()
	reg.MustRegister(backup.NewCollector(svc))
	doc := &doctor.Doctor{Store: store, Clusters: clusters, Config: cfg, Logger: log, Backups: svc}
	c := map[string]string{"cluster": name}

	// No backup yet.
	runs := st.InfoRuns()
	if v, ok := metric(t, reg, "pgtenant_backup_up", c); !ok || v != 1 {
		t.Errorf("pgtenant_backup_up = %v (%v), want 1", v, ok)
	}
	if _, ok := metric(t, reg, "pgtenant_backup_last_age_seconds", c); ok {
		t.Error("pgtenant_backup_last_age_seconds before any backup: want no series")
	}
	// The second scrape read no pgbackrest info: it is read once per
	// infoTTL, or after a command of this daemon's changed the repository.
	if n := st.InfoRuns() - runs; n != 1 {
		t.Errorf("two scrapes ran pgbackrest info %d times, want once", n)
	}
	if got := doctorCheck(t, ctx, doc, name, "backup_age"); got.Status != doctor.Warn || !strings.Contains(got.Got, "no backup") || got.Fix == "" {
		t.Errorf("backup_age check before any backup = %+v, want a warning that there is none, with the fix", got)
	}
	if got := doctorCheck(t, ctx, doc, name, "backup_disk"); got.Status == doctor.Unknown || !strings.Contains(got.Got, st.RepoPath()) {
		t.Errorf("backup_disk check = %+v, want the repository's file system measured", got)
	}

	// A full backup, then a WAL switch that reaches the repository. The
	// pacer's slot is given back (started) once the backup has started,
	// before it ends.
	logPath := filepath.Join(st.Dir, "log", name+"-backup.log")
	var startedLog string
	if err := st.BackupStarted(ctx, backup.Full, func() {
		b, _ := os.ReadFile(logPath)
		startedLog = string(b)
	}); err != nil {
		t.Fatal(err)
	}
	// Called at the end (the fallback), the log would say the command ended.
	if !strings.Contains(startedLog, "backup command begin") || strings.Contains(startedLog, "backup command end") {
		t.Errorf("started was called with the backup log at:\n%s\nwant it once the backup started, before it ended", startedLog)
	}
	blog, err := os.ReadFile(logPath)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(blog), "backup start archive") {
		t.Errorf("the backup log has no %q line: pgBackRest no longer says when a backup started; log:\n%s", "backup start archive", blog)
	}
	if !strings.Contains(string(blog), "--repo1-retention-full=3") {
		t.Errorf("the backup (and its expire) did not run with retention 3 days; log:\n%s", blog)
	}
	seg := switchWAL(t, ctx, primary)
	waitFor(t, ctx, func() bool {
		info, err := st.Info(ctx)
		return err == nil && info.ArchiveMax >= seg
	})
	runs = st.InfoRuns()
	if v, ok := metric(t, reg, "pgtenant_backup_last_age_seconds", map[string]string{"cluster": name, "type": "full"}); !ok || v < 0 || v > 120 {
		t.Errorf("age of the full backup = %v (%v), want 0..120 s (the backup did not make the scrape read pgbackrest info again)", v, ok)
	}
	if n := st.InfoRuns() - runs; n != 1 {
		t.Errorf("the scrape after the backup ran pgbackrest info %d times, want once", n)
	}
	if v, ok := metric(t, reg, "pgtenant_backup_repository_size_bytes", c); !ok || v < 1<<20 {
		t.Errorf("repository size = %v (%v), want at least a backup's MB", v, ok)
	}
	a, err := svc.Archiver(ctx, name)
	if err != nil {
		t.Fatal(err)
	}
	if v, ok := metric(t, reg, "pgtenant_backup_archive_lag_bytes", c); !ok || v < 0 || v >= float64(a.SegmentSize) {
		t.Errorf("archive lag after the switch was archived = %v (%v), want 0 <= lag < one segment (%d)", v, ok, a.SegmentSize)
	}
	if v, ok := metric(t, reg, "pgtenant_backup_archive_failing", c); !ok || v != 0 {
		t.Errorf("pgtenant_backup_archive_failing = %v (%v), want 0", v, ok)
	}
	if got := doctorCheck(t, ctx, doc, name, "backup_age"); got.Status != doctor.OK {
		t.Errorf("backup_age check after a backup = %+v, want ok", got)
	}
	if got := doctorCheck(t, ctx, doc, name, "archiving"); got.Status != doctor.OK {
		t.Errorf("archiving check = %+v, want ok", got)
	}

	// Archiving fails.
	var orig string
	conn, err := pgx.Connect(ctx, primary)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	if err := conn.QueryRow(ctx, `SELECT current_setting('archive_command')`).Scan(&orig); err != nil {
		t.Fatal(err)
	}
	setArchive := func(cmd string) {
		t.Helper()
		backuptest.Exec(t, ctx, primary, `ALTER SYSTEM SET archive_command = '`+strings.ReplaceAll(cmd, "'", "''")+`'`)
		backuptest.Exec(t, ctx, primary, `SELECT pg_reload_conf()`)
	}
	setArchive("false")
	backuptest.Exec(t, ctx, primary, `CREATE TABLE churn AS SELECT generate_series(1, 1000) AS v`)
	switchWAL(t, ctx, primary)
	waitFor(t, ctx, func() bool {
		a, err := svc.Archiver(ctx, name)
		return err == nil && a.Failing()
	})
	if v, ok := metric(t, reg, "pgtenant_backup_archive_failing", c); !ok || v != 1 {
		t.Errorf("pgtenant_backup_archive_failing while archive_command is false = %v (%v), want 1", v, ok)
	}
	if v, ok := metric(t, reg, "pgtenant_backup_archive_failures_total", c); !ok || v < 1 {
		t.Errorf("pgtenant_backup_archive_failures_total = %v (%v), want at least 1", v, ok)
	}
	if v, ok := metric(t, reg, "pgtenant_backup_archive_lag_bytes", c); !ok || v < float64(a.SegmentSize) {
		t.Errorf("archive lag with a segment not archived = %v (%v), want at least one segment (%d)", v, ok, a.SegmentSize)
	}
	got := doctorCheck(t, ctx, doc, name, "archiving")
	if got.Status != doctor.Fail || !strings.Contains(got.Got, "failed") || got.Why == "" || got.Fix == "" {
		t.Errorf("archiving check while archive_command is false = %+v, want fail with why and fix", got)
	}

	// Put back: the archiver retries and catches up.
	setArchive(orig)
	backuptest.Exec(t, ctx, primary, `SELECT pg_switch_wal()`)
	waitFor(t, ctx, func() bool {
		a, err := svc.Archiver(ctx, name)
		return err == nil && !a.Failing()
	})
	if got := doctorCheck(t, ctx, doc, name, "archiving"); got.Status != doctor.OK {
		t.Errorf("archiving check once archive_command is back = %+v, want ok", got)
	}
	if v, ok := metric(t, reg, "pgtenant_backup_archive_failing", c); !ok || v != 0 {
		t.Errorf("pgtenant_backup_archive_failing once archive_command is back = %v (%v), want 0", v, ok)
	}
}

// switchWAL closes the current WAL segment and returns its name.
func switchWAL(t *testing.T, ctx context.Context, dsn string) string {
	t.Helper()
	conn, err := pgx.Connect(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	var seg string
	if err := conn.QueryRow(ctx, `SELECT pg_walfile_name(pg_switch_wal())`).Scan(&seg); err != nil {
		t.Fatal(err)
	}
	return seg
}
