package jobs_test

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pgtenant/pgtenant/internal/config"
	"github.com/pgtenant/pgtenant/internal/jobs"
)

// TestRunner_TwoDaemonsRunEachJobOnce: two daemons sharing a catalog split
// 100 jobs between them and no step of any job runs twice.
func TestRunner_TwoDaemonsRunEachJobOnce(t *testing.T) {
	h := newHarness(t)
	const n = 100
	handlers := func(owner string) map[string]jobs.Handler {
		return map[string]jobs.Handler{"three": h.three(owner, 5*time.Millisecond)}
	}
	a := h.startDaemon(t, 4, handlers)
	b := h.startDaemon(t, 4, handlers)
	if a.Owner() == b.Owner() {
		t.Fatalf("two runners share the owner id %q", a.Owner())
	}
	// Submitted while both daemons poll: they race for every job.
	for range n {
		h.enqueue(t, jobs.Spec{Type: "three"})
	}

	deadline := time.Now().Add(30 * time.Second)
	for h.count(t, `SELECT count(*) FROM jobs WHERE state NOT IN ('succeeded', 'failed', 'cancelled')`) > 0 {
		if time.Now().After(deadline) {
			t.Fatal("jobs still unfinished after 30s")
		}
		time.Sleep(50 * time.Millisecond)
	}

	if got := h.count(t, `SELECT count(*) FROM jobs WHERE state = 'succeeded'`); got != n {
		t.Errorf("succeeded jobs = %d, want %d", got, n)
	}
	if got := h.count(t, `SELECT count(*) FROM job_steps`); got != 3*n {
		t.Errorf("job_steps rows = %d, want %d", got, 3*n)
	}
	if got := h.count(t, `SELECT count(*) FROM (SELECT job_id FROM job_steps GROUP BY job_id HAVING count(*) = 3) s`); got != n {
		t.Errorf("jobs with exactly 3 recorded steps = %d, want %d", got, n)
	}
	if got := h.count(t, `SELECT count(*) FROM test_exec`); got != 3*n {
		t.Errorf("step executions = %d, want %d", got, 3*n)
	}
	if got := h.count(t, `SELECT count(*) FROM (SELECT 1 FROM test_exec GROUP BY job_id, step HAVING count(*) <> 1) s`); got != 0 {
		t.Errorf("(job, step) pairs not executed exactly once = %d, want 0", got)
	}
	// Each job was run by one worker from start to end.
	if got := h.count(t, `SELECT count(*) FROM (SELECT 1 FROM test_exec GROUP BY job_id HAVING count(DISTINCT worker) <> 1) s`); got != 0 {
		t.Errorf("jobs executed by more than one runner = %d, want 0", got)
	}
	if got := h.count(t, `SELECT count(*) FROM test_exec e JOIN job_steps s USING (job_id, step) WHERE e.worker <> s.worker`); got != 0 {
		t.Errorf("steps recorded by another runner than the one that executed them = %d, want 0", got)
	}
	for _, r := range []*jobs.Runner{a, b} {
		if got := h.count(t, `SELECT count(DISTINCT job_id) FROM test_exec WHERE worker = $1`, r.Owner()); got == 0 {
			t.Errorf("runner %s ran no job, want both runners to share the work", r.Owner())
		}
	}
}

// TestRunner_ResumesAfterDeadWorker: a running job whose lease expired is
// taken over and resumed after its last completed step; a job whose lease
// is still live is left to its worker until the lease expires.
func TestRunner_ResumesAfterDeadWorker(t *testing.T) {
	h := newHarness(t)
	ctx := testCtx(t)
	var dead, live int64
	var liveUntil time.Time
	if err := h.pool.QueryRow(ctx, `INSERT INTO jobs (type, state, lease_owner, lease_expires, started_at)
		VALUES ('three', 'running', 'dead-worker', now() - interval '1 minute', now()) RETURNING id`).Scan(&dead); err != nil {
		t.Fatal(err)
	}
	if err := h.pool.QueryRow(ctx, `INSERT INTO jobs (type, state, lease_owner, lease_expires, started_at)
		VALUES ('three', 'running', 'live-worker', now() + interval '1.5 seconds', now()) RETURNING id, lease_expires`).Scan(&live, &liveUntil); err != nil {
		t.Fatal(err)
	}
	if _, err := h.pool.Exec(ctx, `INSERT INTO job_steps (job_id, step, worker, attempt, started_at)
		SELECT id, 'one', lease_owner, 1, now() FROM jobs WHERE id IN ($1, $2)`, dead, live); err != nil {
		t.Fatal(err)
	}
	r := h.startDaemon(t, 2, func(owner string) map[string]jobs.Handler {
		return map[string]jobs.Handler{"three": h.three(owner, 0)}
	})

	j := h.waitFinished(t, dead)
	if j.State != jobs.Succeeded {
		t.Fatalf("resumed job: state = %s (%s), want succeeded", j.State, j.LastError)
	}
	if got, want := h.execs(t, dead), []string{"two", "three"}; !slices.Equal(got, want) {
		t.Errorf("resumed job executed %v, want %v", got, want)
	}
	var workers []string
	for _, s := range j.Steps {
		workers = append(workers, s.Step+"@"+s.Worker)
	}
	if want := []string{"one@dead-worker", "two@" + r.Owner(), "three@" + r.Owner()}; !slices.Equal(workers, want) {
		t.Errorf("resumed job steps = %v, want %v", workers, want)
	}

	j = h.waitFinished(t, live)
	if j.State != jobs.Succeeded {
		t.Fatalf("job with a live lease: state = %s (%s), want succeeded", j.State, j.LastError)
	}
	var first time.Time
	if err := h.pool.QueryRow(ctx, `SELECT min(at) FROM test_exec WHERE job_id = $1`, live).Scan(&first); err != nil {
		t.Fatal(err)
	}
	if first.Before(liveUntil) {
		t.Errorf("job with a live lease: taken over at %s, before its lease expired at %s", first, liveUntil)
	}
	if got, want := h.execs(t, live), []string{"two", "three"}; !slices.Equal(got, want) {
		t.Errorf("job with a live lease executed %v, want %v", got, want)
	}
}

// failing returns handlers of jobs whose second step always fails, with
// an ordinary error ("flaky") or a permanent one ("bad").
func failing(h *harness) func(owner string) map[string]jobs.Handler {
	return func(owner string) map[string]jobs.Handler {
		return map[string]jobs.Handler{
			"flaky": h.handler(owner, h.step(owner, "one", nil), h.step(owner, "boom", func(context.Context, *jobs.Run) error {
				return errors.New("boom")
			})),
			"bad": h.handler(owner, h.step(owner, "one", nil), h.step(owner, "boom", func(context.Context, *jobs.Run) error {
				return jobs.Permanent(errors.New("bad input"))
			})),
		}
	}
}

// TestRunner_RetriesWithBackoffThenFails: a failing step is retried with a
// growing delay; after max_attempts the job is failed and cleaned up once.
func TestRunner_RetriesWithBackoffThenFails(t *testing.T) {
	h := newHarness(t)
	h.startDaemon(t, 2, failing(h))
	j := h.enqueue(t, jobs.Spec{Type: "flaky", MaxAttempts: 3})
	j = h.waitFinished(t, j.ID)

	if j.State != jobs.Failed {
		t.Errorf("state = %s, want failed", j.State)
	}
	if got, want := j.Attempts, 3; got != want {
		t.Errorf("attempts = %d, want %d", got, want)
	}
	if !strings.Contains(j.LastError, "boom") {
		t.Errorf("last_error = %q, want the step's error", j.LastError)
	}
	// The state says failed; the message is the error alone (no "failed: failed:").
	if !strings.Contains(j.ProgressMsg, "boom") || strings.HasPrefix(j.ProgressMsg, "failed:") {
		t.Errorf("progress_msg = %q, want the error without a failed: prefix", j.ProgressMsg)
	}
	if j.FinishedAt == nil || j.LeaseOwner != "" {
		t.Errorf("finished_at = %v, lease_owner = %q; want set and empty", j.FinishedAt, j.LeaseOwner)
	}
	// Step one completed once; boom ran on each attempt; then one cleanup.
	if got, want := h.execs(t, j.ID), []string{"one", "boom", "boom", "boom", "cleanup"}; !slices.Equal(got, want) {
		t.Errorf("executed %v, want %v", got, want)
	}
	// The cleanup forgot the completed steps, so that a retry starts over.
	if len(j.Steps) != 0 {
		t.Errorf("recorded steps after cleanup = %+v, want none", j.Steps)
	}
	// Retries wait at least the backoff: 20ms, then 40ms.
	rows, err := h.pool.Query(testCtx(t), `SELECT extract(epoch FROM at - lag(at) OVER (ORDER BY at))::float8
		FROM test_exec WHERE job_id = $1 AND step = 'boom' ORDER BY at OFFSET 1`, j.ID)
	if err != nil {
		t.Fatal(err)
	}
	var gaps []time.Duration
	for rows.Next() {
		var s float64
		if err := rows.Scan(&s); err != nil {
			t.Fatal(err)
		}
		gaps = append(gaps, time.Duration(s*float64(time.Second)))
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	backoff := h.jobsCfg.Backoff.D()
	if len(gaps) != 2 || gaps[0] < backoff || gaps[1] < 2*backoff {
		t.Errorf("delays between attempts = %v, want 2 delays of at least %s and %s", gaps, backoff, 2*backoff)
	}
}

// TestRunner_PermanentErrorFailsAtOnce: a step returning jobs.Permanent is
// not retried.
func TestRunner_PermanentErrorFailsAtOnce(t *testing.T) {
	h := newHarness(t)
	h.startDaemon(t, 2, failing(h))
	j := h.enqueue(t, jobs.Spec{Type: "bad", MaxAttempts: 3})
	j = h.waitFinished(t, j.ID)

	if j.State != jobs.Failed || j.Attempts != 1 {
		t.Errorf("state, attempts = %s, %d; want failed, 1", j.State, j.Attempts)
	}
	if !strings.Contains(j.LastError, "bad input") {
		t.Errorf("last_error = %q, want the step's error", j.LastError)
	}
	if got, want := h.execs(t, j.ID), []string{"one", "boom", "cleanup"}; !slices.Equal(got, want) {
		t.Errorf("executed %v, want %v", got, want)
	}
	// A retried job no longer shows the failure it had (read in the retry's
	// transaction: the runner cannot have run it again yet).
	var rj jobs.Job
	err := pgx.BeginFunc(testCtx(t), h.pool, func(tx pgx.Tx) error {
		var err error
		rj, err = jobs.Retry(testCtx(t), tx, j.ID)
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	if rj.State != jobs.Queued || rj.LastError != "" || rj.ProgressMsg != jobs.RetriedMsg {
		t.Errorf("retried job = %s, last_error %q, progress %q; want queued, no error, %q", rj.State, rj.LastError, rj.ProgressMsg, jobs.RetriedMsg)
	}
}

// TestRunner_CleanupSeesTheError: a cleanup reads the error its job ends
// with in r.Job.LastError, on the first attempt too (a template build
// records it as the build's error), and "cancelled by request" on a cancel.
func TestRunner_CleanupSeesTheError(t *testing.T) {
	h := newHarness(t)
	ctx := testCtx(t)
	seen := make(chan string, 3)
	h.startDaemon(t, 1, func(owner string) map[string]jobs.Handler {
		cleanup := func(ctx context.Context, r *jobs.Run) error { seen <- r.Job.LastError; return nil }
		return map[string]jobs.Handler{
			"bad": {Steps: func(*jobs.Job) ([]jobs.Step, error) {
				return []jobs.Step{h.step(owner, "boom", func(context.Context, *jobs.Run) error {
					return jobs.Permanent(errors.New("bad input"))
				})}, nil
			}, Cleanup: cleanup},
			"flaky": {Steps: func(j *jobs.Job) ([]jobs.Step, error) {
				return []jobs.Step{h.step(owner, "boom", func(_ context.Context, r *jobs.Run) error {
					return fmt.Errorf("boom %d", r.Job.Attempts+1)
				})}, nil
			}, Cleanup: cleanup},
			"block": {Steps: func(*jobs.Job) ([]jobs.Step, error) {
				return []jobs.Step{h.step(owner, "block", func(ctx context.Context, _ *jobs.Run) error {
					<-ctx.Done()
					return ctx.Err()
				})}, nil
			}, Cleanup: cleanup},
		}
	})
	bad := h.enqueue(t, jobs.Spec{Type: "bad", MaxAttempts: 3})
	h.waitFinished(t, bad.ID)
	if got := <-seen; !strings.Contains(got, "bad input") {
		t.Errorf("cleanup of a job failed at its first attempt saw %q, want its error", got)
	}
	flaky := h.enqueue(t, jobs.Spec{Type: "flaky", MaxAttempts: 2})
	h.waitFinished(t, flaky.ID)
	if got := <-seen; !strings.Contains(got, "boom 2") {
		t.Errorf("cleanup after the last attempt saw %q, want that attempt's error (boom 2)", got)
	}
	block := h.enqueue(t, jobs.Spec{Type: "block"})
	h.waitExec(t, block.ID, "block", 1)
	if _, err := jobs.Cancel(ctx, h.pool, block.ID); err != nil {
		t.Fatal(err)
	}
	h.waitFinished(t, block.ID)
	if got, want := <-seen, "cancelled by request"; got != want {
		t.Errorf("cleanup of a cancelled job saw %q, want %q", got, want)
	}
}

// TestRunner_BadArgsFailAtOnce: a job whose arguments do not decode fails
// at its first attempt: retrying cannot fix it.
func TestRunner_BadArgsFailAtOnce(t *testing.T) {
	h := newHarness(t)
	h.startDaemon(t, 1, func(owner string) map[string]jobs.Handler {
		return map[string]jobs.Handler{"nosteps": {Steps: func(j *jobs.Job) ([]jobs.Step, error) {
			var args struct{ N int }
			return nil, j.DecodeArgs(&args)
		}}}
	})
	j := h.enqueue(t, jobs.Spec{Type: "nosteps", Args: []int{1}, MaxAttempts: 3})
	j = h.waitFinished(t, j.ID)
	if j.State != jobs.Failed || j.Attempts != 1 || !strings.Contains(j.LastError, "bad args") {
		t.Errorf("state, attempts, last_error = %s, %d, %q; want failed, 1, bad args", j.State, j.Attempts, j.LastError)
	}
}

// blocking returns handlers of a job ("block") whose second step blocks
// until its context ends while block is set.
func blocking(h *harness, block *atomic.Bool) func(owner string) map[string]jobs.Handler {
	return func(owner string) map[string]jobs.Handler {
		return map[string]jobs.Handler{
			"three": h.three(owner, 0),
			"block": h.handler(owner, h.step(owner, "first", nil), h.step(owner, "block", func(ctx context.Context, _ *jobs.Run) error {
				if !block.Load() {
					return nil
				}
				select {
				case <-ctx.Done():
					return ctx.Err()
				case <-time.After(time.Minute):
					return nil
				}
			})),
		}
	}
}

// TestCancel_QueuedJobAtOnce: a job that has not started is cancelled at
// once and never runs.
func TestCancel_QueuedJobAtOnce(t *testing.T) {
	h := newHarness(t)
	ctx := testCtx(t)
	h.startDaemon(t, 1, func(owner string) map[string]jobs.Handler {
		return map[string]jobs.Handler{"three": h.three(owner, 0)}
	})
	j := h.enqueue(t, jobs.Spec{Type: "three", RunAfter: time.Now().Add(time.Hour)})
	c, err := jobs.Cancel(ctx, h.pool, j.ID)
	if err != nil {
		t.Fatal(err)
	}
	if c.State != jobs.Cancelled || c.FinishedAt == nil {
		t.Errorf("cancelled queued job: state = %s, finished_at = %v; want cancelled at once", c.State, c.FinishedAt)
	}
	// Make it due, then run another job behind it: the single worker would
	// have taken the cancelled one first.
	if _, err := h.pool.Exec(ctx, `UPDATE jobs SET run_after = now() - interval '1 minute' WHERE id = $1`, j.ID); err != nil {
		t.Fatal(err)
	}
	next := h.enqueue(t, jobs.Spec{Type: "three"})
	if got := h.waitFinished(t, next.ID); got.State != jobs.Succeeded {
		t.Fatalf("next job: state = %s, want succeeded", got.State)
	}
	if got := h.execs(t, j.ID); len(got) != 0 {
		t.Errorf("cancelled job executed %v, want nothing", got)
	}
	if got := h.get(t, j.ID); got.State != jobs.Cancelled {
		t.Errorf("cancelled job: state = %s later, want cancelled", got.State)
	}
	if _, err := jobs.Cancel(ctx, h.pool, j.ID); !errors.Is(err, jobs.ErrWrongState) {
		t.Errorf("cancel a cancelled job: err = %v, want ErrWrongState", err)
	}
	if _, err := jobs.Cancel(ctx, h.pool, 999999); !errors.Is(err, jobs.ErrNotFound) {
		t.Errorf("cancel an unknown job: err = %v, want ErrNotFound", err)
	}
}

// TestCancel_RunningJobStopsAndCleansUp: a running job asked to stop is
// stopped within a lease period, cleaned up and ends cancelled; a retry runs
// it again from the start.
func TestCancel_RunningJobStopsAndCleansUp(t *testing.T) {
	h := newHarness(t)
	ctx := testCtx(t)
	var block atomic.Bool
	block.Store(true)
	h.startDaemon(t, 2, blocking(h, &block))
	j := h.enqueue(t, jobs.Spec{Type: "block"})
	h.waitExec(t, j.ID, "block", 1)
	// A step that reports nothing still shows what the job is doing.
	if got := h.get(t, j.ID); got.ProgressMsg != "step block" {
		t.Errorf("progress while the step runs = %q, want %q", got.ProgressMsg, "step block")
	}

	asked := time.Now()
	c, err := jobs.Cancel(ctx, h.pool, j.ID)
	if err != nil {
		t.Fatal(err)
	}
	if !c.CancelRequested || jobs.Finished(c.State) {
		t.Errorf("cancel a running job: state = %s, cancel_requested = %v; want still running, requested", c.State, c.CancelRequested)
	}
	j = h.waitFinished(t, j.ID)
	if took := time.Since(asked); took > h.jobsCfg.Lease.D() {
		t.Errorf("job stopped %s after the cancel request, want within the lease (%s)", took, h.jobsCfg.Lease.D())
	}
	if j.State != jobs.Cancelled {
		t.Fatalf("state = %s (%s), want cancelled", j.State, j.LastError)
	}
	if got, want := h.execs(t, j.ID), []string{"first", "block", "cleanup"}; !slices.Equal(got, want) {
		t.Errorf("executed %v, want %v", got, want)
	}
	if len(j.Steps) != 0 {
		t.Errorf("recorded steps after cleanup = %+v, want none", j.Steps)
	}

	block.Store(false)
	rj, err := jobs.Retry(ctx, h.pool, j.ID)
	if err != nil {
		t.Fatal(err)
	}
	if rj.State != jobs.Queued || rj.CancelRequested || rj.Attempts != 0 || rj.FinishedAt != nil {
		t.Errorf("retried job = %s, cancel_requested %v, attempts %d, finished_at %v; want queued afresh",
			rj.State, rj.CancelRequested, rj.Attempts, rj.FinishedAt)
	}
	if j = h.waitFinished(t, j.ID); j.State != jobs.Succeeded {
		t.Fatalf("retried job: state = %s (%s), want succeeded", j.State, j.LastError)
	}
	if got, want := h.execs(t, j.ID), []string{"first", "block", "cleanup", "first", "block"}; !slices.Equal(got, want) {
		t.Errorf("executed %v, want %v", got, want)
	}
	if _, err := jobs.Retry(ctx, h.pool, j.ID); !errors.Is(err, jobs.ErrWrongState) {
		t.Errorf("retry a succeeded job: err = %v, want ErrWrongState", err)
	}
	if _, err := jobs.Cancel(ctx, h.pool, j.ID); !errors.Is(err, jobs.ErrWrongState) {
		t.Errorf("cancel a succeeded job: err = %v, want ErrWrongState", err)
	}
}

// TestCancel_CleanupLongerThanLease: a cancelled job keeps its lease while
// its cleanup runs, so no other worker takes it over and runs it again.
func TestCancel_CleanupLongerThanLease(t *testing.T) {
	h := newHarness(t)
	h.jobsCfg.Lease = config.Duration(time.Second)
	var block atomic.Bool
	block.Store(true)
	handlers := func(owner string) map[string]jobs.Handler {
		m := blocking(h, &block)(owner)
		hd := m["block"]
		hd.Cleanup = func(ctx context.Context, r *jobs.Run) error {
			if err := h.record(ctx, r.Job.ID, "cleanup", owner); err != nil {
				return err
			}
			time.Sleep(2500 * time.Millisecond)
			return h.record(ctx, r.Job.ID, "cleanup done", owner)
		}
		m["block"] = hd
		return m
	}
	h.startDaemon(t, 2, handlers)
	h.startDaemon(t, 2, handlers)
	j := h.enqueue(t, jobs.Spec{Type: "block"})
	h.waitExec(t, j.ID, "block", 1)
	if _, err := jobs.Cancel(testCtx(t), h.pool, j.ID); err != nil {
		t.Fatal(err)
	}
	j = h.waitFinished(t, j.ID)
	if j.State != jobs.Cancelled {
		t.Errorf("state = %s (%s), want cancelled", j.State, j.LastError)
	}
	if got, want := h.execs(t, j.ID), []string{"first", "block", "cleanup", "cleanup done"}; !slices.Equal(got, want) {
		t.Errorf("executed %v, want %v", got, want)
	}
}

// TestRunner_LostLeaseSkipsCleanup: a worker whose lease was taken over
// while its step failed leaves the job to the new owner: it neither cleans
// up nor touches the job's row.
func TestRunner_LostLeaseSkipsCleanup(t *testing.T) {
	h := newHarness(t)
	ctx := testCtx(t)
	h.startDaemon(t, 1, func(owner string) map[string]jobs.Handler {
		return map[string]jobs.Handler{"stolen": h.handler(owner, h.step(owner, "one", nil),
			h.step(owner, "two", func(ctx context.Context, r *jobs.Run) error {
				// Fail as soon as another worker owns the job (before the
				// lease renewal notices).
				lease := r.Job.LeaseOwner
				if !strings.HasPrefix(lease, owner) {
					return fmt.Errorf("lease %q is not one of runner %s", lease, owner)
				}
				for {
					var cur string
					if err := h.pool.QueryRow(ctx, `SELECT lease_owner FROM jobs WHERE id = $1`, r.Job.ID).Scan(&cur); err != nil {
						return err
					}
					if cur != lease {
						_ = h.record(ctx, r.Job.ID, "gave up", owner)
						return jobs.Permanent(errors.New("gave up"))
					}
					time.Sleep(5 * time.Millisecond)
				}
			})),
			"marker": h.handler(owner, h.step(owner, "marker", nil))}
	})
	j := h.enqueue(t, jobs.Spec{Type: "stolen"})
	h.waitExec(t, j.ID, "two", 1)
	if _, err := h.pool.Exec(ctx, `UPDATE jobs SET lease_owner = 'thief', lease_expires = now() + interval '1 hour' WHERE id = $1`, j.ID); err != nil {
		t.Fatal(err)
	}
	h.waitExec(t, j.ID, "gave up", 1)
	// The runner's one worker takes the marker job only once it is done
	// with the stolen one: whatever it (wrongly) did to it is done by then.
	if m := h.waitFinished(t, h.enqueue(t, jobs.Spec{Type: "marker"}).ID); m.State != jobs.Succeeded {
		t.Fatalf("marker job = %s (%s), want succeeded", m.State, m.LastError)
	}

	if got, want := h.execs(t, j.ID), []string{"one", "two", "gave up"}; !slices.Equal(got, want) {
		t.Errorf("executed %v, want %v", got, want)
	}
	j = h.get(t, j.ID)
	if j.State != jobs.Running || j.LeaseOwner != "thief" || j.Attempts != 0 || j.LastError != "" {
		t.Errorf("job = %s, owner %q, attempts %d, last_error %q; want untouched (running, thief, 0, none)",
			j.State, j.LeaseOwner, j.Attempts, j.LastError)
	}
	if len(j.Steps) != 1 || j.Steps[0].Step != "one" {
		t.Errorf("recorded steps = %+v, want one (kept for the new owner)", j.Steps)
	}
}

// TestRetry_FailedJobRunsAgain: a failed job retried after the cause is
// fixed succeeds; without a cleanup it resumes after its completed steps.
func TestRetry_FailedJobRunsAgain(t *testing.T) {
	h := newHarness(t)
	ctx := testCtx(t)
	var broken atomic.Bool
	broken.Store(true)
	h.startDaemon(t, 2, func(owner string) map[string]jobs.Handler {
		fragile := h.handler(owner, h.step(owner, "one", nil), h.step(owner, "two", func(context.Context, *jobs.Run) error {
			if broken.Load() {
				return jobs.Permanent(errors.New("broken"))
			}
			return nil
		}))
		keep := fragile
		keep.Cleanup = nil
		return map[string]jobs.Handler{"fragile": fragile, "keep": keep}
	})
	a := h.enqueue(t, jobs.Spec{Type: "fragile"})
	b := h.enqueue(t, jobs.Spec{Type: "keep"})
	for _, j := range []jobs.Job{a, b} {
		if got := h.waitFinished(t, j.ID); got.State != jobs.Failed {
			t.Fatalf("job %d (%s): state = %s, want failed", j.ID, j.Type, got.State)
		}
	}
	if err := jobs.Resume(ctx, h.pool, a.ID); !errors.Is(err, jobs.ErrWrongState) {
		t.Errorf("resume a failed job: err = %v, want ErrWrongState", err)
	}

	broken.Store(false)
	for _, j := range []jobs.Job{a, b} {
		if _, err := jobs.Retry(ctx, h.pool, j.ID); err != nil {
			t.Fatal(err)
		}
		if got := h.waitFinished(t, j.ID); got.State != jobs.Succeeded || len(got.Steps) != 2 {
			t.Errorf("retried job %d (%s): state = %s, %d steps; want succeeded, 2", j.ID, j.Type, got.State, len(got.Steps))
		}
	}
	// With a cleanup the retry starts over; without one it goes on after step one.
	if got, want := h.execs(t, a.ID), []string{"one", "two", "cleanup", "one", "two"}; !slices.Equal(got, want) {
		t.Errorf("job with cleanup executed %v, want %v", got, want)
	}
	if got, want := h.execs(t, b.ID), []string{"one", "two", "two"}; !slices.Equal(got, want) {
		t.Errorf("job without cleanup executed %v, want %v", got, want)
	}
}

// TestEnqueue_SameKeyWhileUnfinished: submitting a job whose key belongs to
// an unfinished job returns that job; once it is finished the key is free.
func TestEnqueue_SameKeyWhileUnfinished(t *testing.T) {
	h := newHarness(t)
	ctx := testCtx(t)
	later := time.Now().Add(time.Hour) // no runner: the jobs stay queued
	a := h.enqueue(t, jobs.Spec{Type: "purge", Key: "purge:t1", Target: "t1", RunAfter: later})
	b := h.enqueue(t, jobs.Spec{Type: "purge", Key: "purge:t1", Target: "t1", RunAfter: later})
	if b.ID != a.ID {
		t.Errorf("second enqueue with the same key: id = %d, want %d", b.ID, a.ID)
	}
	if string(a.Args) != "{}" || a.MaxAttempts != h.jobsCfg.MaxAttempts || a.State != jobs.Queued {
		t.Errorf("job = args %s, max_attempts %d, state %s; want {}, %d, queued", a.Args, a.MaxAttempts, a.State, h.jobsCfg.MaxAttempts)
	}
	if c := h.enqueue(t, jobs.Spec{Type: "purge", Key: "purge:t2", RunAfter: later}); c.ID == a.ID {
		t.Errorf("another key: id = %d, want a new job", c.ID)
	}
	if d := h.enqueue(t, jobs.Spec{Type: "purge", RunAfter: later}); d.ID == a.ID {
		t.Errorf("no key: id = %d, want a new job", d.ID)
	}
	if _, err := jobs.Cancel(ctx, h.pool, a.ID); err != nil {
		t.Fatal(err)
	}
	if e := h.enqueue(t, jobs.Spec{Type: "purge", Key: "purge:t1", RunAfter: later}); e.ID == a.ID || e.State != jobs.Queued {
		t.Errorf("same key after the job finished: id %d, state %s; want a new queued job", e.ID, e.State)
	}
	got, err := jobs.List(ctx, h.pool, jobs.Filter{State: "active", Type: "purge"})
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != 3 {
		t.Errorf("active purge jobs = %d, want 3", len(got))
	}
}

// TestPause_ResumeRunsStepAgain: a step that pauses leaves the job paused
// for an operator; resumed, the step runs again, sees it was resumed from
// the job's saved data, and the job succeeds.
func TestPause_ResumeRunsStepAgain(t *testing.T) {
	h := newHarness(t)
	ctx := testCtx(t)
	r := h.startDaemon(t, 2, func(owner string) map[string]jobs.Handler {
		return map[string]jobs.Handler{"canary": h.handler(owner,
			h.step(owner, "first", nil),
			h.step(owner, "approve", func(ctx context.Context, r *jobs.Run) error {
				var d struct{ Asked bool }
				if err := r.LoadData(&d); err != nil {
					return err
				}
				if d.Asked {
					return h.record(ctx, r.Job.ID, "approved", owner)
				}
				if err := r.SaveData(ctx, struct{ Asked bool }{true}); err != nil {
					return err
				}
				return r.Pause(ctx, "waiting for operator")
			}),
			h.step(owner, "last", nil)),
			"marker": h.handler(owner, h.step(owner, "marker", nil))}
	})
	j := h.enqueue(t, jobs.Spec{Type: "canary"})
	wctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	j, err := r.Wait(wctx, j.ID, nil)
	if err != nil {
		t.Fatal(err)
	}
	if j.State != jobs.Paused || j.ProgressMsg != "waiting for operator" || j.LeaseOwner != "" {
		t.Errorf("paused job = %s, %q, owner %q; want paused, waiting for operator, no owner", j.State, j.ProgressMsg, j.LeaseOwner)
	}
	if len(j.Steps) != 1 || j.Steps[0].Step != "first" {
		t.Errorf("recorded steps while paused = %+v, want first", j.Steps)
	}
	// A job queued behind it runs to the end: the workers have claimed
	// since, and would have taken the paused job (the older) first had it
	// been claimable.
	if m := h.waitFinished(t, h.enqueue(t, jobs.Spec{Type: "marker"}).ID); m.State != jobs.Succeeded {
		t.Fatalf("marker job = %s (%s), want succeeded", m.State, m.LastError)
	}
	if got := h.get(t, j.ID); got.State != jobs.Paused || len(got.Steps) != 1 {
		t.Errorf("job left alone: state = %s, steps %+v; want still paused after first", got.State, got.Steps)
	}
	if got, want := h.execs(t, j.ID), []string{"first", "approve"}; !slices.Equal(got, want) {
		t.Errorf("executed while paused %v, want %v", got, want)
	}

	if err := jobs.Resume(ctx, h.pool, j.ID); err != nil {
		t.Fatal(err)
	}
	if j = h.waitFinished(t, j.ID); j.State != jobs.Succeeded {
		t.Fatalf("resumed job: state = %s (%s), want succeeded", j.State, j.LastError)
	}
	if got, want := h.execs(t, j.ID), []string{"first", "approve", "approve", "approved", "last"}; !slices.Equal(got, want) {
		t.Errorf("executed %v, want %v", got, want)
	}
	if err := jobs.Resume(ctx, h.pool, j.ID); !errors.Is(err, jobs.ErrWrongState) {
		t.Errorf("resume a succeeded job: err = %v, want ErrWrongState", err)
	}
}

// TestRunner_ExpiredLeaseTakenOverInSameDaemon: when a job's lease expires
// under a live worker and another worker of the same daemon takes it over,
// the old worker loses it (the lease fences workers, not daemons) and stops;
// the job then runs to the end once, without a cleanup.
func TestRunner_ExpiredLeaseTakenOverInSameDaemon(t *testing.T) {
	h := newHarness(t)
	ctx := testCtx(t)
	var hold atomic.Bool
	hold.Store(true)
	h.startDaemon(t, 2, func(owner string) map[string]jobs.Handler {
		return map[string]jobs.Handler{"hold": h.handler(owner, h.step(owner, "first", nil),
			h.step(owner, "hold", func(ctx context.Context, r *jobs.Run) error {
				for hold.Load() {
					select {
					case <-ctx.Done():
						_ = h.record(ctx, r.Job.ID, "stopped", owner)
						return ctx.Err()
					case <-time.After(10 * time.Millisecond):
					}
				}
				return nil
			}), h.step(owner, "last", nil))}
	})
	j := h.enqueue(t, jobs.Spec{Type: "hold"})
	h.waitExec(t, j.ID, "hold", 1)
	// As if the worker's renewals had stalled for a whole lease.
	if _, err := h.pool.Exec(ctx, `UPDATE jobs SET lease_expires = now() - interval '1 second' WHERE id = $1`, j.ID); err != nil {
		t.Fatal(err)
	}
	h.waitExec(t, j.ID, "hold", 2)
	h.waitExec(t, j.ID, "stopped", 1)
	hold.Store(false)
	if j = h.waitFinished(t, j.ID); j.State != jobs.Succeeded {
		t.Fatalf("state = %s (%s), want succeeded", j.State, j.LastError)
	}
	got := map[string]int{}
	for _, s := range h.execs(t, j.ID) {
		got[s]++
	}
	if want := map[string]int{"first": 1, "hold": 2, "stopped": 1, "last": 1}; !maps.Equal(got, want) {
		t.Errorf("executions = %v, want %v", got, want)
	}
	if len(j.Steps) != 3 || j.Attempts != 0 {
		t.Errorf("recorded steps = %+v, attempts %d; want 3 steps, 0 attempts", j.Steps, j.Attempts)
	}
}

// TestCancel_StartedJobCleansUp: a job that already ran but is not running
// now (queued for a retry, or paused) is cleaned up when cancelled, like a
// running one.
func TestCancel_StartedJobCleansUp(t *testing.T) {
	h := newHarness(t)
	ctx := testCtx(t)
	h.jobsCfg.Backoff = config.Duration(time.Hour)
	h.jobsCfg.MaxBackoff = config.Duration(time.Hour)
	h.startDaemon(t, 2, func(owner string) map[string]jobs.Handler {
		m := failing(h)(owner)
		m["pause"] = h.handler(owner, h.step(owner, "one", nil), h.step(owner, "approve", func(ctx context.Context, r *jobs.Run) error {
			return r.Pause(ctx, "waiting for operator")
		}))
		return m
	})
	retrying := h.enqueue(t, jobs.Spec{Type: "flaky"})
	h.waitJob(t, retrying.ID, "a retry an hour away", func(j jobs.Job) bool { return j.State == jobs.Queued && j.Attempts == 1 })
	paused := h.enqueue(t, jobs.Spec{Type: "pause"})
	h.waitState(t, paused.ID, jobs.Paused)

	for _, j := range []jobs.Job{retrying, paused} {
		c, err := jobs.Cancel(ctx, h.pool, j.ID)
		if err != nil {
			t.Fatal(err)
		}
		if !c.CancelRequested {
			t.Errorf("job %d (%s): cancel_requested = false after cancel", j.ID, j.Type)
		}
		got := h.waitFinished(t, j.ID)
		if got.State != jobs.Cancelled || len(got.Steps) != 0 {
			t.Errorf("job %d (%s): state = %s, steps %+v; want cancelled, cleaned up", j.ID, j.Type, got.State, got.Steps)
		}
	}
	if got, want := h.execs(t, retrying.ID), []string{"one", "boom", "cleanup"}; !slices.Equal(got, want) {
		t.Errorf("retrying job executed %v, want %v", got, want)
	}
	if got, want := h.execs(t, paused.ID), []string{"one", "approve", "cleanup"}; !slices.Equal(got, want) {
		t.Errorf("paused job executed %v, want %v", got, want)
	}
}

// TestRunner_HigherPriorityFirst: a job of higher priority enqueued after
// others is run before them (a cold create's build before spare builds);
// equal ones run in the order they were enqueued.
func TestRunner_HigherPriorityFirst(t *testing.T) {
	h := newHarness(t)
	var low []int64
	for range 3 {
		low = append(low, h.enqueue(t, jobs.Spec{Type: "one"}).ID)
	}
	high := h.enqueue(t, jobs.Spec{Type: "one", Priority: 10})
	if got := h.get(t, high.ID).Priority; got != 10 {
		t.Fatalf("priority = %d, want 10", got)
	}
	// One worker: the order of claims is the order of execution.
	h.startDaemon(t, 1, func(owner string) map[string]jobs.Handler {
		return map[string]jobs.Handler{"one": h.handler(owner, h.step(owner, "only", nil))}
	})
	for _, id := range append(low, high.ID) {
		h.waitFinished(t, id)
	}
	rows, err := h.pool.Query(testCtx(t), `SELECT job_id FROM test_exec ORDER BY at`)
	if err != nil {
		t.Fatal(err)
	}
	got, err := pgx.CollectRows(rows, pgx.RowTo[int64])
	if err != nil {
		t.Fatal(err)
	}
	if want := append([]int64{high.ID}, low...); !slices.Equal(got, want) {
		t.Errorf("jobs ran in order %v, want %v (the high-priority one first)", got, want)
	}
}

// TestRunner_WaitSeesTheEnd: Wait without a progress callback returns as
// soon as a worker of its daemon ends the job, with the job's final state.
func TestRunner_WaitSeesTheEnd(t *testing.T) {
	h := newHarness(t)
	release := make(chan struct{})
	r := h.startDaemon(t, 1, func(owner string) map[string]jobs.Handler {
		return map[string]jobs.Handler{"gated": h.handler(owner, h.step(owner, "gate", func(ctx context.Context, _ *jobs.Run) error {
			select {
			case <-release:
				return nil
			case <-ctx.Done():
				return ctx.Err()
			}
		}))}
	})
	j := h.enqueue(t, jobs.Spec{Type: "gated"})
	r.Poke()
	h.waitExec(t, j.ID, "gate", 1)
	done := make(chan jobs.Job, 1)
	go func() {
		got, err := r.Wait(testCtx(t), j.ID, nil)
		if err != nil {
			t.Errorf("wait: %v", err)
		}
		done <- got
	}()
	close(release)
	if got := <-done; got.State != jobs.Succeeded || got.ID != j.ID {
		t.Errorf("Wait = job %d %s, want job %d succeeded", got.ID, got.State, j.ID)
	}
}
