package backup_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/pgtenant/pgtenant/internal/backup"
	"github.com/pgtenant/pgtenant/internal/backup/backuptest"
	"github.com/pgtenant/pgtenant/internal/config"
	"github.com/pgtenant/pgtenant/internal/jobs"
)

// TestDue: a full backup when there is none or the newest full is
// full_every old, else a diff when the newest backup of any type is
// diff_every old, else none; diff_every 0 takes no diff.
func TestDue(t *testing.T) {
	now := time.Date(2026, 12, 2, 12, 0, 0, 0, time.UTC)
	ago := func(d time.Duration) time.Time { return now.Add(-d) }
	b := func(typ string, stop time.Time) backup.Backup {
		return backup.Backup{Type: typ, Start: stop.Add(-time.Minute), Stop: stop}
	}
	day := 24 * time.Hour
	for _, tc := range []struct {
		name      string
		backups   []backup.Backup
		diffEvery time.Duration
		want      string
	}{
		{"none", nil, day, backup.Full},
		{"fresh full", []backup.Backup{b(backup.Full, ago(time.Hour))}, day, ""},
		{"full a day old", []backup.Backup{b(backup.Full, ago(day))}, day, backup.Diff},
		{"full a day old, no diffs", []backup.Backup{b(backup.Full, ago(day))}, 0, ""},
		{"fresh diff after an old full", []backup.Backup{b(backup.Full, ago(3*day)), b(backup.Diff, ago(time.Hour))}, day, ""},
		{"an incr counts as a backup", []backup.Backup{b(backup.Full, ago(3*day)), b(backup.Incr, ago(time.Hour))}, day, ""},
		{"full a week old", []backup.Backup{b(backup.Full, ago(7*day)), b(backup.Diff, ago(time.Hour))}, day, backup.Full},
		{"only diffs", []backup.Backup{b(backup.Diff, ago(time.Hour))}, day, backup.Full},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := backup.Due(backup.Info{Backups: tc.backups}, now, 7*day, tc.diffEvery)
			if got != tc.want {
				t.Errorf("Due = %q, want %q", got, tc.want)
			}
		})
	}
}

// TestSchedule_DiffWhenDueFullWhenDue_NeverTwoAtOnce runs a daemon with a
// short schedule (a full every 40s, a diff every 10s): after the first full
// come diffs, each once the newest backup is 10s old, then a full once the
// first full is 40s old, diffs or not since; no backup starts before it is
// due, no two overlap, and the cluster never has two unfinished backup jobs.
func TestSchedule_DiffWhenDueFullWhenDue_NeverTwoAtOnce(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	fc, st := backuptest.Cluster(t, ctx, 0)
	backuptest.Exec(t, ctx, fc.PrimaryDSN("postgres"), `CREATE DATABASE catalog`)
	const fullEvery, diffEvery = 40 * time.Second, 10 * time.Second
	c, _ := backuptest.Daemon(t, fc, "catalog", map[string]*backup.Stanza{fc.Name(): st}, func(cfg *config.Config) {
		cfg.Backups.FullEvery = config.Duration(fullEvery)
		cfg.Backups.DiffEvery = config.Duration(diffEvery)
		cfg.Backups.CheckInterval = config.Duration(500 * time.Millisecond)
	})

	var got []backup.Backup
	maxUnfinished := 0
	waitFor(t, ctx, func() bool {
		all, err := c.Jobs(ctx, map[string][]string{"target": {"cluster:" + fc.Name()}})
		if err != nil {
			t.Fatal(err)
		}
		unfinished := 0
		for _, j := range all {
			if j.Type == jobs.ClusterBackup && j.State != jobs.Succeeded && j.State != jobs.Failed && j.State != jobs.Cancelled {
				unfinished++
			}
			if j.Type == jobs.ClusterBackup && j.State == jobs.Failed {
				t.Fatalf("backup job %d failed: %s", j.ID, j.LastError)
			}
		}
		maxUnfinished = max(maxUnfinished, unfinished)
		out, err := c.Backups(ctx, fc.Name())
		if err != nil {
			t.Fatal(err)
		}
		got = out[0].Backups
		fulls := 0
		for _, b := range got {
			if b.Type == backup.Full {
				fulls++
			}
		}
		return fulls >= 2
	})
	var seq []string
	for _, b := range got {
		seq = append(seq, fmt.Sprintf("%s %s..%s", b.Type, b.Start.Format("15:04:05"), b.Stop.Format("15:04:05")))
	}
	t.Logf("backups: %s", strings.Join(seq, ", "))
	if maxUnfinished > 1 {
		t.Errorf("the cluster had %d unfinished backup jobs at once, want at most 1", maxUnfinished)
	}
	if got[0].Type != backup.Full || got[1].Type != backup.Diff || got[len(got)-1].Type != backup.Full {
		t.Fatalf("backups %v: want a full, diffs, then a full", seq)
	}
	// pgBackRest's times are whole seconds: a second of slack.
	lastFull := got[0]
	for i, b := range got[1:] {
		prev := got[i]
		if b.Start.Before(prev.Stop) {
			t.Errorf("backup %s started at %v, before %s stopped at %v: two at once", b.Label, b.Start, prev.Label, prev.Stop)
		}
		// A diff waits diff_every after the newest backup; a full is due
		// by the newest full alone.
		if b.Type == backup.Diff && b.Start.Sub(prev.Stop) < diffEvery-time.Second {
			t.Errorf("diff %s started %v after %s stopped, want at least diff_every %v", b.Label, b.Start.Sub(prev.Stop), prev.Label, diffEvery)
		}
		switch b.Type {
		case backup.Full:
			if b.Start.Sub(lastFull.Stop) < fullEvery-time.Second {
				t.Errorf("full %s started %v after the previous full stopped, want at least full_every %v", b.Label, b.Start.Sub(lastFull.Stop), fullEvery)
			}
			lastFull = b
		case backup.Diff:
			if b.Prior != lastFull.Label {
				t.Errorf("diff %s builds on %s, want the newest full %s", b.Label, b.Prior, lastFull.Label)
			}
			// A diff is taken only while no full is due.
			if b.Start.Sub(lastFull.Stop) >= fullEvery+5*time.Second {
				t.Errorf("diff %s started %v after the full %s: a full was due", b.Label, b.Start.Sub(lastFull.Stop), lastFull.Label)
			}
		default:
			t.Errorf("backup %s is %s: the schedule takes full and diff only", b.Label, b.Type)
		}
	}
}
