package jobs_test

import (
	"strings"
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
	// another type; t3: the new tenant of t2's finished fork, t4: the copy
	// a finished rewind of t2 made (data.into); t9: no job; a job without
	// a target names nobody.
	old := h.enqueue(t, jobs.Spec{Type: "purge", TargetKind: "tenant", Target: "t1"})
	set(old.ID, jobs.Succeeded, "")
	last := h.enqueue(t, jobs.Spec{Type: "purge", TargetKind: "tenant", Target: "t1"})
	set(last.ID, jobs.Failed, "boom")
	h.enqueue(t, jobs.Spec{Type: "warm", TargetKind: "tenant", Target: "t2"})
	fork := h.enqueue(t, jobs.Spec{Type: "fork", TargetKind: "tenant", Target: "t2", Args: map[string]string{"tenant": "t2", "into": "t3"}})
	set(fork.ID, jobs.Succeeded, "")
	rewind := h.enqueue(t, jobs.Spec{Type: "rewind", TargetKind: "tenant", Target: "t2", Args: map[string]string{"tenant": "t2"}})
	if _, err := h.pool.Exec(ctx, `UPDATE jobs SET data = '{"into": "t4"}', state = 'cancelled' WHERE id = $1`, rewind.ID); err != nil {
		t.Fatal(err)
	}
	h.enqueue(t, jobs.Spec{Type: "warm"})
	got, err := jobs.History(ctx, h.pool, "purge", []string{"t1", "t2", "t3", "t4", "t9"})
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]jobs.TenantJobs{
		"t1": {Active: false, Last: last.ID, LastState: jobs.Failed, LastError: "boom"},
		"t2": {Active: true},
		"t3": {}, "t4": {},
	}
	if len(got) != len(want) {
		t.Errorf("History = %+v, want %+v", got, want)
	}
	for id, w := range want {
		if g, ok := got[id]; !ok || g != w {
			t.Errorf("History[%s] = %+v (listed: %v), want %+v", id, g, ok, w)
		}
	}
	if got, err := jobs.History(ctx, h.pool, "purge", []string{"t3"}); err != nil || len(got) != 1 {
		t.Errorf("History(t3) = %+v, %v: want t3 alone", got, err)
	}
	// At work: t2's queued job; t1's jobs are over.
	if busy, err := jobs.AtWork(ctx, h.pool); err != nil || !busy["t2"] || busy["t1"] || busy["t3"] {
		t.Errorf("AtWork = %v, %v: want t2, not t1 or t3", busy, err)
	}
}

// TestJobReads_ReadTheirJobsOnly: reconcile's reads of the jobs (History
// of the tenants it judges, AtWork) and List's with a filter go through
// indexes, not the whole history: at a month of jobs in a million-tenant
// catalog, reading all of it twice made a reconcile of one cluster take
// 8–13 s, and a list of the active moves on each /metrics walked every job
// (bench density). With 5,000 finished jobs of other tenants and the
// table analysed, their generic plans read jobs through its indexes, and
// never scan it or walk it by id.
func TestJobReads_ReadTheirJobsOnly(t *testing.T) {
	h := newHarness(t)
	ctx := testCtx(t)
	if _, err := h.pool.Exec(ctx, `INSERT INTO jobs (type, target_kind, target, state, args, data, finished_at)
		SELECT 'tenant.fork', 'tenant', 'a' || i, 'succeeded', jsonb_build_object('tenant', 'a' || i, 'into', 'b' || i),
		       jsonb_build_object('into', 'c' || i), now()
		FROM generate_series(1, 5000) i;
		ANALYZE jobs`); err != nil {
		t.Fatal(err)
	}
	h.enqueue(t, jobs.Spec{Type: "warm", TargetKind: "tenant", Target: "t1"})
	active, activeArgs := jobs.ListQuery(jobs.Filter{Type: "tenant.move", State: jobs.Active})
	last, lastArgs := jobs.ListQuery(jobs.Filter{Type: "tenant.purge", TargetKind: "tenant", Target: "a7", Limit: 1})
	waiting, waitingArgs := jobs.ListQuery(jobs.Filter{State: jobs.Waiting, Limit: 1000})
	failed, failedArgs := jobs.ListQuery(jobs.Filter{State: jobs.Failed})         // `job list --state failed`: none here
	restores, restoresArgs := jobs.ListQuery(jobs.Filter{Type: "tenant.restore"}) // `job list --type …` of a type with no job
	for name, q := range map[string]struct {
		sql  string
		args []any
	}{
		"History":                  {jobs.HistoryQuery, []any{[]string{"a7", "b8", "c9"}, "tenant.purge"}},
		"AtWork":                   {jobs.AtWorkQuery, nil},
		"List of the active moves": {active, activeArgs},
		"List of a tenant's purge": {last, lastArgs},
		"List of the waiting jobs": {waiting, waitingArgs}, // the console's charts, every few seconds
		"List of the failed jobs":  {failed, failedArgs},
		"List of one type of job":  {restores, restoresArgs},
	} {
		if plan := h.genericPlan(t, q.sql, q.args...); strings.Contains(plan, "Seq Scan on jobs") || strings.Contains(plan, "jobs_pkey") || !strings.Contains(plan, "Index") {
			t.Errorf("%s scans the jobs:\n%s", name, plan)
		}
	}
	// Prune deletes by id, but finds what to delete through jobs_finished.
	if plan := h.genericPlan(t, jobs.PruneQuery, time.Now(), 1000); strings.Contains(plan, "Seq Scan on jobs") || !strings.Contains(plan, "jobs_finished") {
		t.Errorf("Prune scans the jobs:\n%s", plan)
	}
	got, err := jobs.History(ctx, h.pool, "tenant.purge", []string{"a7", "b8", "c9", "zz"})
	if err != nil || len(got) != 3 {
		t.Errorf("History(a7, b8, c9, zz) = %+v, %v: want a7, b8 and c9", got, err)
	}
}

// TestPrune_DeletesFinishedJobsPastRetention: the jobs that finished
// before the cut are deleted oldest first, a batch at a time, with their
// step records; unfinished jobs stay however old, and so do the recent
// ones. A daemon's runner prunes when it starts.
func TestPrune_DeletesFinishedJobsPastRetention(t *testing.T) {
	h := newHarness(t)
	ctx := testCtx(t)
	aged := func(state jobs.State, finishedDaysAgo int) int64 {
		t.Helper()
		j := h.enqueue(t, jobs.Spec{Type: "warm", TargetKind: "tenant", Target: "t1"})
		if _, err := h.pool.Exec(ctx, `UPDATE jobs SET state = $2, created_at = now() - interval '60 days',
			finished_at = CASE WHEN $3::int > 0 THEN now() - make_interval(days => $3::int) END WHERE id = $1`,
			j.ID, state, finishedDaysAgo); err != nil {
			t.Fatal(err)
		}
		return j.ID
	}
	stepped := aged(jobs.Succeeded, 40)
	if _, err := h.pool.Exec(ctx, `INSERT INTO job_steps (job_id, step, worker, attempt, started_at) VALUES ($1, 's', 'w', 1, now())`, stepped); err != nil {
		t.Fatal(err)
	}
	aged(jobs.Failed, 39)
	aged(jobs.Cancelled, 38)
	paused := aged(jobs.Paused, 0)
	queued := aged(jobs.Queued, 0)
	recent := aged(jobs.Succeeded, 1)

	cut := time.Now().Add(-30 * 24 * time.Hour)
	for i, want := range []int64{2, 1, 0} {
		if n, err := jobs.Prune(ctx, h.pool, cut, 2); err != nil || n != want {
			t.Fatalf("Prune #%d = %d, %v; want %d", i+1, n, err, want)
		}
		if i == 0 && h.count(t, `SELECT count(*) FROM jobs WHERE id = $1`, stepped) != 0 {
			t.Errorf("the first batch kept the oldest job %d", stepped)
		}
	}
	if n := h.count(t, `SELECT count(*) FROM job_steps WHERE job_id = $1`, stepped); n != 0 {
		t.Errorf("%d step records of a deleted job remain", n)
	}
	left := h.count(t, `SELECT count(*) FROM jobs WHERE id IN ($1, $2, $3)`, paused, queued, recent)
	if all := h.count(t, `SELECT count(*) FROM jobs`); left != 3 || all != 3 {
		t.Errorf("%d jobs left, %d of them the unfinished and the recent one: want those 3 only", all, left)
	}

	old := aged(jobs.Succeeded, 31)
	h.startDaemon(t, 1, func(string) map[string]jobs.Handler { return nil })
	deadline := time.Now().Add(30 * time.Second)
	for h.count(t, `SELECT count(*) FROM jobs WHERE id = $1`, old) != 0 {
		if time.Now().After(deadline) {
			t.Fatalf("the runner did not delete job %d, finished 31 days ago (jobs.retention %s)", old, h.jobsCfg.Retention)
		}
		time.Sleep(20 * time.Millisecond)
	}
	if n := h.count(t, `SELECT count(*) FROM jobs`); n != 3 {
		t.Errorf("the runner left %d jobs, want 3", n)
	}
}
