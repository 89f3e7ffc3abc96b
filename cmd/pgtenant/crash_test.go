package main

import (
	"context"
	"os"
	"testing"
	"time"

	"github.com/pgtenant/pgtenant/internal/bench"
	"github.com/pgtenant/pgtenant/internal/pgtest"
)

// TestCrash_KilledDaemonLosesNothing SIGKILLs a daemon process 32 times at
// random job step boundaries while it provisions and purges tenants, and
// restarts it each time: every job ends succeeded or failed, the reconciler
// finds no orphan in either direction, and no tenant exists twice. The soak
// variant is `pgtenant bench crash --iterations 500`.
func TestCrash_KilledDaemonLosesNothing(t *testing.T) {
	if testing.Short() {
		t.Skip("crash soak")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 8*time.Minute)
	defer cancel()
	env := &bench.Env{Dir: pgtest.TempDir(t), Log: os.Stderr}
	res, table, err := env.Crash(ctx, bench.CrashOptions{Binary: binary, Iterations: 32, Seed: uint64(time.Now().UnixNano())})
	if err != nil {
		t.Fatal(err)
	}
	table.Write(os.Stderr)
	if res.Kills < 30 {
		t.Errorf("kills = %d, want at least 30", res.Kills)
	}
	if res.KillsAtStep == 0 {
		t.Errorf("no kill landed right after a step; the soak did not exercise step boundaries")
	}
	if res.Unfinished != 0 {
		t.Errorf("unfinished jobs = %d (%v), want 0", res.Unfinished, res.JobsByState)
	}
	if res.JobsByState["succeeded"] == 0 {
		t.Errorf("no job succeeded: %v", res.JobsByState)
	}
	for _, f := range res.Findings {
		t.Errorf("reconcile finding: %+v", f)
	}
	if res.DuplicateTenants != 0 {
		t.Errorf("tenants created twice = %d, want 0", res.DuplicateTenants)
	}
	if res.Creates == 0 || res.Drops == 0 {
		t.Errorf("creates = %d, drops = %d; want both exercised", res.Creates, res.Drops)
	}
}
