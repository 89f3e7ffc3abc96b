package jobs_test

import (
	"testing"
	"time"

	"github.com/pgtenant/pgtenant/internal/jobs"
)

// TestQueries_BusyUnfinishedSucceededTargets: the reads services make of
// the jobs table answer by state, type, cluster and target.
func TestQueries_BusyUnfinishedSucceededTargets(t *testing.T) {
	h := newHarness(t)
	ctx := testCtx(t)
	set := func(id int64, state jobs.State, lastError string) {
		t.Helper()
		if _, err := h.pool.Exec(ctx, `UPDATE jobs SET state = $2, last_error = $3,
			finished_at = CASE WHEN $2 IN ('succeeded', 'failed', 'cancelled') THEN now() END WHERE id = $1`, id, state, lastError); err != nil {
			t.Fatal(err)
		}
	}
	a := h.enqueue(t, jobs.Spec{Type: "warm", Cluster: "c1", TargetKind: "tenant", Target: "t1"})
	for _, tc := range []struct {
		state                jobs.State
		busy, unfinished     bool
		succeededSinceBefore int
	}{
		{jobs.Queued, true, true, 0},
		{jobs.Waiting, true, true, 0},
		{jobs.Paused, false, true, 0}, // waits for an operator: not busy
		{jobs.Succeeded, false, false, 1},
		{jobs.Failed, false, false, 0},
	} {
		set(a.ID, tc.state, "")
		if busy, err := jobs.Busy(ctx, h.pool, "warm", "c1"); err != nil || busy != tc.busy {
			t.Errorf("%s: Busy(warm, c1) = %v, %v; want %v", tc.state, busy, err, tc.busy)
		}
		if busy, err := jobs.Busy(ctx, h.pool, "warm", "c2"); err != nil || busy {
			t.Errorf("%s: Busy(warm, c2) = %v, %v; want false", tc.state, busy, err)
		}
		if u, err := jobs.Unfinished(ctx, h.pool, "warm", "t1"); err != nil || u != tc.unfinished {
			t.Errorf("%s: Unfinished(warm, t1) = %v, %v; want %v", tc.state, u, err, tc.unfinished)
		}
		if u, err := jobs.Unfinished(ctx, h.pool, "other", "t1"); err != nil || u {
			t.Errorf("%s: Unfinished(other, t1) = %v, %v; want false", tc.state, u, err)
		}
		if n, err := jobs.SucceededSince(ctx, h.pool, "c1", "warm", time.Now().Add(-time.Hour)); err != nil || n != tc.succeededSinceBefore {
			t.Errorf("%s: SucceededSince(an hour ago) = %d, %v; want %d", tc.state, n, err, tc.succeededSinceBefore)
		}
		if n, err := jobs.SucceededSince(ctx, h.pool, "c1", "warm", time.Now().Add(time.Hour)); err != nil || n != 0 {
			t.Errorf("%s: SucceededSince(in an hour) = %d, %v; want 0", tc.state, n, err)
		}
	}

	// t1: a's failure, then a newer purge that failed; t2: a queued job of
	// another type; no target: not listed.
	old := h.enqueue(t, jobs.Spec{Type: "purge", TargetKind: "tenant", Target: "t1"})
	set(old.ID, jobs.Succeeded, "")
	last := h.enqueue(t, jobs.Spec{Type: "purge", TargetKind: "tenant", Target: "t1"})
	set(last.ID, jobs.Failed, "boom")
	h.enqueue(t, jobs.Spec{Type: "warm", TargetKind: "tenant", Target: "t2"})
	h.enqueue(t, jobs.Spec{Type: "warm"})
	got, err := jobs.Targets(ctx, h.pool, "purge")
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]jobs.TargetJobs{
		"t1": {Active: false, Last: last.ID, LastState: jobs.Failed, LastError: "boom"},
		"t2": {Active: true},
	}
	if len(got) != len(want) {
		t.Errorf("Targets = %+v, want %+v", got, want)
	}
	for target, w := range want {
		if got[target] != w {
			t.Errorf("Targets[%s] = %+v, want %+v", target, got[target], w)
		}
	}
}
