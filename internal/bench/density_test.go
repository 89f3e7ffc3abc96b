package bench

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"
)

// TestDensitySteps: the scale points are a hundredth, a tenth and all of
// the tenants, none below 1,000.
func TestDensitySteps(t *testing.T) {
	for n, want := range map[int][]int{1000000: {10000, 100000, 1000000}, 50000: {5000, 50000}, 5000: {5000}, 1000: {1000}} {
		if got := densitySteps(n); !slices.Equal(got, want) {
			t.Errorf("densitySteps(%d) = %v, want %v", n, got, want)
		}
	}
}

// TestDensityTable: one column per scale point, and a note per watched
// figure saying whether it grows with the catalog.
func TestDensityTable(t *testing.T) {
	ps := []DensityPoint{{Tenants: 10000, SearchP95: 2 * time.Millisecond, ShowP95: time.Millisecond, ClusterLoads: 10 * time.Millisecond, ListFirstP95: time.Millisecond},
		{Tenants: 1000000, SearchP95: 900 * time.Millisecond, ShowP95: time.Millisecond, ClusterLoads: 10 * time.Millisecond, ListFirstP95: time.Millisecond}}
	tb := densityTable(ps, DensityOptions{SimulateTenants: 1000000, Clusters: 200, Jobs: 10})
	if !slices.Equal(tb.Columns, []string{"measure", "10000", "1000000"}) {
		t.Errorf("columns %v", tb.Columns)
	}
	notes := strings.Join(tb.Notes, "\n")
	for _, want := range []string{"search p95: ×450.0 for ×100 tenants (2.0 ms → 900.0 ms): faster than the tenants: a bend (a trigram index's matches, then the page)", "show p95: ×1.0 for ×100 tenants (1.0 ms → 1.0 ms): flat"} {
		if !strings.Contains(notes, want) {
			t.Errorf("notes lack %q:\n%s", want, notes)
		}
	}
}

// TestDensityRealTable: a column per step, and a figure that grows faster
// than the tenants is called a bend.
func TestDensityRealTable(t *testing.T) {
	ps := []DensityRealPoint{{Schema: 1000, Database: 200, Reconcile: 10 * time.Millisecond, CrashRecovery: time.Second, IdleSettle: 4 * time.Second, IdleSettled: true,
		SharedCatalogBytes: 100 << 20, Rollout: MigrateRow{NoOp: 60 * time.Millisecond}},
		{Schema: 2000, Database: 400, Reconcile: 50 * time.Millisecond, CrashRecovery: time.Second, IdleSettle: time.Minute, SharedCatalogBytes: 200 << 20,
			Rollout: MigrateRow{PerSec: 13}, ConnectsPerSec: 45.4}}
	tb := densityRealTable(ps, DensityRealOptions{Claims: 20})
	if !slices.Equal(tb.Columns, []string{"measure", "1000+200", "2000+400"}) {
		t.Errorf("columns %v", tb.Columns)
	}
	for _, r := range tb.Rows {
		if strings.HasPrefix(r[0], "autovacuum's work") && !slices.Equal(r[1:], []string{"4000.0 ms", "> 60000.0 ms"}) {
			t.Errorf("a settle that ran out must say so: %v", r)
		}
		if strings.HasPrefix(r[0], "rollout again") && !slices.Equal(r[1:], []string{"60.0 ms (20000 tenants/s)", "-"}) {
			t.Errorf("a no-op rollout is a time and a rate of tenants (none measured: -): %v", r)
		}
		if strings.HasPrefix(r[0], "new connections per second") && !slices.Equal(r[1:], []string{"0", "45"}) {
			t.Errorf("the machine's connection rate goes next to the rollout's: %v", r)
		}
	}
	if c := tb.Checks[3]; !strings.Contains(c.Target, "rollout") || !strings.Contains(c.Got, "13 tenants/s (0 failed; this machine opened 45 new connections/s") {
		t.Errorf("the rollout's check says what the machine allows: %+v", c)
	}
	notes := strings.Join(tb.Notes, "\n")
	for _, want := range []string{"reconcile: ×5.0 for ×2.0 tenants (10.0 ms → 50.0 ms): faster than the tenants: a bend (lists every tenant's",
		"crash recovery: ×1.0 for ×2.0 tenants (1000.0 ms → 1000.0 ms): flat",
		"shared catalogs (pg_class + pg_attribute): ×2.0 for ×2.0 tenants (100.0 MB → 200.0 MB): grows with the tenants (every schema tenant's"} {
		if !strings.Contains(notes, want) {
			t.Errorf("notes lack %q:\n%s", want, notes)
		}
	}
}

// TestDensityDisk: the full size needs more than this machine's
// 64 GB with a standby (it filled it twice), a tenth of the database
// tenants fits; and a run the disk cannot hold is refused before it starts,
// saying what to pass.
func TestDensityDisk(t *testing.T) {
	const gb = 1 << 30
	if got := densityDisk(10000, 2000, false); got < 64*gb {
		t.Errorf("10,000 + 2,000 tenants: %d GB, want more than the 64 GB they filled", got/gb)
	}
	if got := densityDisk(10000, 1000, false); got > 56*gb {
		t.Errorf("10,000 + 1,000 tenants: %d GB, want less than 56", got/gb)
	}
	if with, without := densityDisk(1000, 100, true), densityDisk(1000, 100, false); with <= without {
		t.Errorf("1,000 + 100 tenants with backups: %d MB, want more than the %d MB without", with>>20, without>>20)
	}
	e := &Env{Dir: filepath.Join(t.TempDir(), "to", "be", "made")}
	if err := e.roomFor(10, 2, true); err != nil {
		t.Errorf("12 tenants refused: %v", err)
	}
	err := e.roomFor(100, 100_000_000, false)
	if err == nil || !strings.Contains(err.Error(), "--database-tenants") {
		t.Errorf("a run of 100 M database tenants: %v, want a refusal naming the flags", err)
	}
}

// TestProcValue: the figures the bench reads from /proc, in bytes (kB
// lines scaled, io's bytes as they are).
func TestProcValue(t *testing.T) {
	rss, err := procValue("/proc/self/status", "VmRSS:")
	if err != nil || rss < 1<<20 {
		t.Errorf("VmRSS of this process: %d, %v (want bytes, over 1 MB)", rss, err)
	}
	if _, err := procValue("/proc/self/io", "write_bytes:"); err != nil {
		t.Errorf("write_bytes: %v", err)
	}
	if _, err := procValue("/proc/self/status", "NoSuchLine:"); err == nil {
		t.Error("a missing line must be an error")
	}
}

// TestWriters: the idle window's writes are named by process, the
// largest first, from /proc/<pid>/cmdline as PostgreSQL sets it.
func TestWriters(t *testing.T) {
	for cmd, want := range map[string]string{
		"postgres: checkpointer ":                                   "checkpointer",
		"postgres: autovacuum worker pgt_shared_saas":               "autovacuum worker",
		"postgres: pgtenant pgt_shared_saas 127.0.0.1(4242) idle":   "pgtenant pgt_shared_saas",
		"/usr/bin/python3\x00-m\x00x":                               "other",
		"postgres: density/primary: pgtenant pgtenant [local] idle": "pgtenant pgtenant",
		"postgres: density/primary: checkpointer ":                  "checkpointer",
	} {
		if got := writerName(cmd, false); got != want {
			t.Errorf("writerName(%q) = %q, want %q", cmd, got, want)
		}
	}
	before := map[string]int64{"checkpointer": 10, "walwriter": 5, "pgtenant pgtenant": 0}
	after := map[string]int64{"checkpointer": 10, "walwriter": 2053, "pgtenant pgtenant": 40960, "autovacuum worker": 1024}
	if got, want := topWriters(before, after, 2), "pgtenant pgtenant 40.0 KB, walwriter 2048 B"; got != want {
		t.Errorf("topWriters = %q, want %q", got, want)
	}
	if got := topWriters(after, after, 3); got != "nothing written" {
		t.Errorf("topWriters of no change = %q", got)
	}
	if w := treeWriters(os.Getpid()); len(w) == 0 {
		t.Error("treeWriters of this process: nothing")
	}
}
