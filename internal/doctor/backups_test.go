package doctor

import (
	"strings"
	"testing"
	"time"
)

// TestBackupChecks: archiving fails on a failure newer than the last
// success; backup_age warns with no backup or none within twice the
// schedule (diff_every, or full_every without diffs); backup_disk warns
// under 10% free and fails under 5%. Each non-ok check has a fix. (The
// facts come from a real cluster in internal/backup's
// TestBackup_MetricsDoctorRetention.)
func TestBackupChecks(t *testing.T) {
	now := time.Date(2026, 12, 2, 12, 0, 0, 0, time.UTC)
	day := 24 * time.Hour
	base := BackupFacts{Now: now, Backups: 2, Newest: now.Add(-time.Hour), FullEvery: 7 * day, DiffEvery: day,
		LastArchivedAt: now.Add(-time.Minute), RepoPath: "/r", DiskFree: 50, DiskTotal: 100}
	for _, tc := range []struct {
		name  string
		edit  func(*BackupFacts)
		check func(BackupFacts) Check
		want  string
	}{
		{"archiving ok", func(*BackupFacts) {}, archiving, OK},
		{"archiving failing", func(b *BackupFacts) {
			b.ArchiveFailing, b.LastFailedAt, b.LastFailedWAL, b.FailedCount = true, now, "000000010000000000000009", 3
		}, archiving, Fail},
		{"archiver unreadable", func(b *BackupFacts) { b.ArchiverErr = "primary down" }, archiving, Unknown},
		{"fresh backup", func(*BackupFacts) {}, ageOf, OK},
		{"no backup", func(b *BackupFacts) { b.Backups, b.Newest = 0, time.Time{} }, ageOf, Warn},
		{"first backup running", func(b *BackupFacts) { b.Backups, b.Newest, b.Running = 0, time.Time{}, true }, ageOf, OK},
		{"within twice diff_every", func(b *BackupFacts) { b.Newest = now.Add(-47 * time.Hour) }, ageOf, OK},
		{"past twice diff_every", func(b *BackupFacts) { b.Newest = now.Add(-49 * time.Hour) }, ageOf, Warn},
		{"no diffs: within twice full_every", func(b *BackupFacts) { b.DiffEvery, b.Newest = 0, now.Add(-10*day) }, ageOf, OK},
		{"no diffs: past twice full_every", func(b *BackupFacts) { b.DiffEvery, b.Newest = 0, now.Add(-15*day) }, ageOf, Warn},
		{"disk half free", func(*BackupFacts) {}, backupDisk, OK},
		{"disk 8% free", func(b *BackupFacts) { b.DiskFree = 8 }, backupDisk, Warn},
		{"disk 3% free", func(b *BackupFacts) { b.DiskFree = 3 }, backupDisk, Fail},
		{"disk unreadable", func(b *BackupFacts) { b.DiskErr = "statfs /r: no such file" }, backupDisk, Unknown},
	} {
		t.Run(tc.name, func(t *testing.T) {
			b := base
			tc.edit(&b)
			c := tc.check(b)
			if c.Status != tc.want {
				t.Fatalf("status = %s, want %s: %+v", c.Status, tc.want, c)
			}
			if c.Why == "" || c.Got == "" {
				t.Errorf("check %+v: want what was seen and why", c)
			}
			if (c.Status == Warn || c.Status == Fail) && c.Fix == "" {
				t.Errorf("check %+v: a warning or failure says the fix", c)
			}
		})
	}
}

func ageOf(b BackupFacts) Check { return backupAge("c1", b) }

func TestSpan(t *testing.T) {
	for d, want := range map[time.Duration]string{0: "0s", 90 * time.Second: "1m30s", 48 * time.Hour: "2d",
		36 * time.Hour: "1d12h", 14 * 24 * time.Hour: "14d"} {
		if got := span(d); got != want {
			t.Errorf("span(%v) = %s, want %s", d, got, want)
		}
	}
	if c := backupAge("c1", BackupFacts{FullEvery: 7 * 24 * time.Hour, DiffEvery: 24 * time.Hour}); !strings.Contains(c.Want, "2d, backups.diff_every 1d") {
		t.Errorf("want = %q, want it to name twice diff_every in days", c.Want)
	}
}
