package jobs

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	"golang.org/x/sync/errgroup"

	"github.com/pgtenant/pgtenant/internal/background"
	"github.com/pgtenant/pgtenant/internal/cluster"
	"github.com/pgtenant/pgtenant/internal/config"
)

// Step is one idempotent unit of a job. Running it again after a crash must
// find its effect already there and succeed.
type Step struct {
	Name string
	Run  func(ctx context.Context, r *Run) error
	// Doing is the job's progress message while the step runs, until the
	// step reports its own ("step NAME" when empty): a job never shows an
	// empty line while it works.
	Doing string
}

// Handler runs one job type.
type Handler struct {
	// Steps returns the job's ordered steps.
	Steps func(j *Job) ([]Step, error)
	// Cleanup, if set, removes what a job half-built when it ends failed or
	// cancelled. It must be idempotent too. r.Job.LastError is the error the
	// job ends with ("cancelled by request" for a cancel), so that a cleanup
	// can record why.
	Cleanup func(ctx context.Context, r *Run) error
}

// Runner claims and runs jobs.
type Runner struct {
	pool     *pgxpool.Pool
	cfg      config.JobsConfig
	owner    string
	log      *slog.Logger
	pacer    *Pacer
	handlers map[Type]Handler
	poke     chan struct{}
	claims   atomic.Int64 // numbers this runner's leases
	ends     jobEnds      // wakes waiters when this daemon's workers end a job

	finished *prometheus.CounterVec
	stepTime *prometheus.HistogramVec
	pruned   prometheus.Counter
}

// cancelledMsg ends a cancelled job.
const cancelledMsg = "cancelled by request"

var (
	errLeaseLost       = errors.New("lease lost to another worker")
	errCancelRequested = errors.New("cancel requested")
	errPaused          = errors.New("paused")
)

// NewRunner returns a runner over the catalog pool. The owner id names this
// daemon in leases and step records.
func NewRunner(pool *pgxpool.Pool, cfg config.JobsConfig, pacer *Pacer, logger *slog.Logger, reg prometheus.Registerer) *Runner {
	host, _ := os.Hostname()
	b := make([]byte, 3)
	_, _ = rand.Read(b)
	r := &Runner{
		pool: pool, cfg: cfg, pacer: pacer, handlers: map[Type]Handler{},
		owner: fmt.Sprintf("%s-%d-%s", host, os.Getpid(), hex.EncodeToString(b)),
		log:   logger.With("component", "jobs"),
		poke:  make(chan struct{}, 1),
		finished: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "pgtenant_jobs_finished_total", Help: "Jobs finished by this daemon, by type and final state.",
		}, []string{"type", "state"}),
		stepTime: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name: "pgtenant_job_step_duration_seconds", Help: "Duration of completed job steps.",
			Buckets: prometheus.ExponentialBuckets(0.005, 4, 10),
		}, []string{"type", "step"}),
		pruned: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "pgtenant_jobs_pruned_total", Help: "Finished jobs this daemon deleted past jobs.retention.",
		}),
	}
	if reg != nil {
		reg.MustRegister(r.finished, r.stepTime, r.pruned)
	}
	return r
}

// Owner is this runner's id: it names the daemon in step records and
// prefixes its leases ("<owner>/<n>", one per claim).
func (r *Runner) Owner() string { return r.owner }

// Register adds the handler of a job type. Call before Run.
func (r *Runner) Register(typ Type, h Handler) { r.handlers[typ] = h }

// Enqueue inserts a job (in q, which may be a transaction) and wakes a worker.
func (r *Runner) Enqueue(ctx context.Context, q Querier, s Spec) (Job, error) {
	j, err := Enqueue(ctx, q, s, r.cfg.MaxAttempts)
	if err == nil {
		r.Poke()
	}
	return j, err
}

// Poke wakes an idle worker (after a job was enqueued in a transaction that
// has now committed).
func (r *Runner) Poke() {
	select {
	case r.poke <- struct{}{}:
	default:
	}
}

// Wait polls a job until it is finished or paused, calling onChange when its
// progress changes. Without onChange only the end matters: the job is read
// again when a worker of this daemon ends it, and otherwise every
// waitPoll (a job another daemon runs), so that a burst of requests
// waiting for their builds does not poll the catalog every 20 ms each.
func (r *Runner) Wait(ctx context.Context, id int64, onChange func(Job)) (Job, error) {
	poll := 20 * time.Millisecond
	if onChange == nil {
		poll = waitPoll
	}
	var last string
	var j Job
	for {
		ended, unwatch := r.ends.watch(id)
		cur, err := Get(ctx, r.pool, id)
		if err != nil {
			unwatch()
			return j, err // the last job read, if any
		}
		j = cur
		if sig := fmt.Sprint(j.State, j.ProgressDone, j.ProgressTotal, j.ProgressMsg); sig != last && onChange != nil {
			onChange(j)
			last = sig
		}
		if Finished(j.State) || j.State == Paused {
			unwatch()
			return j, nil
		}
		select {
		case <-ctx.Done():
			unwatch()
			return j, ctx.Err()
		case <-ended:
		case <-time.After(poll):
		}
		unwatch()
	}
}

// waitPoll is how often Wait reads a job that no worker of this daemon has
// ended yet.
const waitPoll = 500 * time.Millisecond

// jobEnds wakes the waiters of a job when a worker of this daemon finishes
// or pauses it.
type jobEnds struct {
	mu sync.Mutex
	m  map[int64]*jobEnd
}

type jobEnd struct {
	ch      chan struct{} // closed when the job ends
	waiters int
}

// watch returns a channel closed when the job next ends on this daemon, and
// the function to call once the caller no longer waits on it.
func (e *jobEnds) watch(id int64) (<-chan struct{}, func()) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.m == nil {
		e.m = map[int64]*jobEnd{}
	}
	w := e.m[id]
	if w == nil {
		w = &jobEnd{ch: make(chan struct{})}
		e.m[id] = w
	}
	w.waiters++
	return w.ch, func() {
		e.mu.Lock()
		defer e.mu.Unlock()
		if w.waiters--; w.waiters == 0 && e.m[id] == w {
			delete(e.m, id)
		}
	}
}

// ended wakes the job's waiters.
func (e *jobEnds) ended(id int64) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if w := e.m[id]; w != nil {
		close(w.ch)
		delete(e.m, id)
	}
}

// Run runs cfg.Workers workers until ctx is done, and deletes the jobs
// past cfg.Retention at once and every pruneInterval. A job in progress
// at shutdown is handed back to the queue (its completed steps stay
// recorded).
func (r *Runner) Run(ctx context.Context) error {
	types := make([]string, 0, len(r.handlers))
	for t := range r.handlers {
		types = append(types, string(t))
	}
	g, ctx := errgroup.WithContext(ctx)
	if r.cfg.Retention > 0 {
		g.Go(func() error {
			background.Every(ctx, pruneInterval, r.prune)
			return nil
		})
	}
	down := cluster.Outage{What: "claim jobs"}
	for i := 0; i < r.cfg.Workers; i++ {
		g.Go(func() error {
			for {
				j, err := r.claim(ctx, types)
				poll := 500 * time.Millisecond
				switch {
				case err == nil || errors.Is(err, pgx.ErrNoRows):
					down.OK(r.log)
				case ctx.Err() == nil:
					down.Fail(r.log, err)
					poll = 2 * time.Second // the catalog does not answer: poll it less
				}
				if err == nil {
					r.execute(ctx, j)
					r.Poke() // there may be more: let an idle worker look too
					continue
				}
				select {
				case <-ctx.Done():
					return nil
				case <-r.poke:
				case <-time.After(poll):
				}
			}
		})
	}
	return g.Wait()
}

const (
	pruneInterval = 10 * time.Minute
	pruneBatch    = 1000 // jobs deleted per statement: short transactions, whatever the backlog
)

// prune deletes the finished jobs older than cfg.Retention, a batch at a
// time. Every daemon prunes; they skip each other's rows.
func (r *Runner) prune(ctx context.Context) {
	before := time.Now().Add(-r.cfg.Retention.D())
	var total int64
	for ctx.Err() == nil {
		n, err := Prune(ctx, r.pool, before, pruneBatch)
		total += n
		if err != nil {
			if ctx.Err() == nil {
				r.log.Warn("deleting the finished jobs past jobs.retention", "err", err)
			}
			break
		}
		if n < pruneBatch {
			break
		}
	}
	if total > 0 {
		r.pruned.Add(float64(total))
		r.log.Info("deleted the finished jobs past jobs.retention", "jobs", total, "retention", r.cfg.Retention.String())
	}
}

// claim takes the next runnable job: queued and due, or running with an
// expired lease (its worker died); of those, the highest priority first,
// then the earliest due. The lease is this claim's own, not the
// daemon's: if the lease expires under a live worker and another worker of
// the same daemon takes the job over, the old worker must lose it too.
// j.LeaseOwner is the lease.
func (r *Runner) claim(ctx context.Context, types []string) (Job, error) {
	lease := fmt.Sprintf("%s/%d", r.owner, r.claims.Add(1))
	j, err := scanJob(r.pool.QueryRow(ctx, `
		UPDATE jobs SET state = 'running', lease_owner = $1, lease_expires = now() + make_interval(secs => $2),
		       started_at = coalesce(started_at, now()), updated_at = now()
		WHERE id = (
			SELECT id FROM jobs
			WHERE type = ANY($3)
			  AND ((state = 'queued' AND run_after <= now())
			    OR (state IN ('running', 'waiting') AND lease_expires < now()))
			ORDER BY priority DESC, run_after, id
			LIMIT 1 FOR UPDATE SKIP LOCKED)
		RETURNING `+jobColumns, lease, r.cfg.Lease.D().Seconds(), types))
	return j, err
}

// execute runs a claimed job's remaining steps.
func (r *Runner) execute(parent context.Context, j Job) {
	log := r.log.With("job", j.ID, "type", j.Type)
	run := &Run{Job: &j, runner: r, lease: j.LeaseOwner}
	// ctx, the steps' context, ends when a cancel is requested or the lease
	// is lost. The lease itself is renewed until the job's outcome is
	// recorded, cleanup included: a cleanup longer than the lease must not
	// let another worker take the job over and run its steps again.
	ctx, cancel := context.WithCancelCause(parent)
	leaseCtx, stopRenew := context.WithCancel(parent)
	renewDone := make(chan struct{})
	go func() {
		defer close(renewDone)
		r.renew(leaseCtx, cancel, j.ID, run.lease)
	}()
	defer func() { stopRenew(); <-renewDone; cancel(nil) }()

	err := r.runSteps(ctx, run, log)
	cause := context.Cause(ctx)
	switch {
	case err == nil:
		r.finish(parent, run, Succeeded, run.result)
		log.Info("job succeeded")
	case errors.Is(cause, errLeaseLost) || errors.Is(err, errLeaseLost):
		log.Warn("lease lost; another worker has the job")
	case parent.Err() != nil:
		r.release(j.ID, run.lease) // shutting down: hand it back
	case errors.Is(err, errPaused):
		r.pause(parent, j.ID, run.lease)
	case errors.Is(cause, errCancelRequested) || errors.Is(err, errCancelRequested):
		if !r.holdsLease(parent, run, log) {
			return
		}
		run.Job.LastError = cancelledMsg
		r.cleanup(run, log)
		r.finish(parent, run, Cancelled, cancelledMsg)
		log.Info("job cancelled")
	default:
		r.failed(parent, run, err, log)
	}
}

// holdsLease reports whether this worker still holds the job's lease. A step
// may fail because the job was taken over before the renewal noticed; the
// new owner's work must not be cleaned up under it.
func (r *Runner) holdsLease(ctx context.Context, run *Run, log *slog.Logger) bool {
	var ok bool
	err := r.pool.QueryRow(context.WithoutCancel(ctx), `SELECT EXISTS (SELECT FROM jobs WHERE id = $1 AND lease_owner = $2)`,
		run.Job.ID, run.lease).Scan(&ok)
	if err != nil {
		log.Error("check job lease", "err", err)
		return false // the lease will expire and another worker will decide
	}
	if !ok {
		log.Warn("lease lost; another worker has the job")
	}
	return ok
}

func (r *Runner) runSteps(ctx context.Context, run *Run, log *slog.Logger) error {
	h, ok := r.handlers[run.Job.Type]
	if !ok {
		return Permanent(fmt.Errorf("no handler for job type %q", run.Job.Type))
	}
	if run.Job.CancelRequested {
		// Cancelled while queued for a retry or paused: clean up, run nothing.
		return errCancelRequested
	}
	steps, err := h.Steps(run.Job)
	if err != nil {
		return err
	}
	done := map[string]bool{}
	rows, err := r.pool.Query(ctx, `SELECT step FROM job_steps WHERE job_id = $1`, run.Job.ID)
	if err != nil {
		return err
	}
	names, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		return err
	}
	for _, n := range names {
		done[n] = true
	}
	for _, st := range steps {
		if done[st.Name] {
			continue
		}
		if err := context.Cause(ctx); err != nil {
			return err
		}
		start := time.Now()
		doing := st.Doing
		if doing == "" {
			doing = "step " + st.Name
		}
		run.Note(ctx, doing)
		if err := st.Run(ctx, run); err != nil {
			return fmt.Errorf("step %s: %w", st.Name, err)
		}
		if err := r.recordStep(ctx, run, st.Name, start); err != nil {
			return err
		}
		r.stepTime.WithLabelValues(string(run.Job.Type), st.Name).Observe(time.Since(start).Seconds())
		log.Debug("step done", "step", st.Name, "took", time.Since(start))
	}
	return nil
}

// recordStep marks a step complete, fenced by the lease: a worker that lost
// its lease cannot record, and the primary key stops a step completing twice.
func (r *Runner) recordStep(ctx context.Context, run *Run, step string, start time.Time) error {
	return pgx.BeginFunc(ctx, r.pool, func(tx pgx.Tx) error {
		tag, err := tx.Exec(ctx, `UPDATE jobs SET updated_at = now() WHERE id = $1 AND lease_owner = $2`, run.Job.ID, run.lease)
		if err != nil {
			return err
		}
		if tag.RowsAffected() == 0 {
			return errLeaseLost
		}
		_, err = tx.Exec(ctx, `INSERT INTO job_steps (job_id, step, worker, attempt, started_at) VALUES ($1, $2, $3, $4, $5)`,
			run.Job.ID, step, r.owner, run.Job.Attempts+1, start)
		if err != nil {
			return fmt.Errorf("record step %s: %w", step, err)
		}
		return nil
	})
}

// renew extends the lease every third of its length until ctx is done. It
// cancels the steps (cancel) when a cancel is requested, and goes on renewing
// while the job is cleaned up; it stops when the lease is lost.
func (r *Runner) renew(ctx context.Context, cancel context.CancelCauseFunc, id int64, lease string) {
	ctx, lost := context.WithCancel(ctx)
	defer lost()
	background.EveryAfter(ctx, r.cfg.Lease.D()/3, func(ctx context.Context) {
		var cancelReq bool
		err := r.pool.QueryRow(ctx, `UPDATE jobs SET lease_expires = now() + make_interval(secs => $3)
			WHERE id = $1 AND lease_owner = $2 RETURNING cancel_requested`, id, lease, r.cfg.Lease.D().Seconds()).Scan(&cancelReq)
		switch {
		case errors.Is(err, pgx.ErrNoRows):
			cancel(errLeaseLost)
			lost() // no more renewals
		case err != nil:
			if ctx.Err() == nil {
				r.log.Warn("lease renewal failed", "job", id, "err", err)
			}
		case cancelReq:
			cancel(errCancelRequested)
		}
	})
}

func (r *Runner) finish(ctx context.Context, run *Run, state State, msg string) {
	ctx = context.WithoutCancel(ctx)
	_, err := r.pool.Exec(ctx, `UPDATE jobs SET state = $3, finished_at = now(), updated_at = now(),
		lease_owner = NULL, lease_expires = NULL,
		progress_done = CASE WHEN $3 = 'succeeded' THEN greatest(progress_total, progress_done) ELSE progress_done END,
		progress_msg = CASE WHEN $4 <> '' THEN $4 WHEN $3 = 'succeeded' THEN 'done' ELSE progress_msg END
		WHERE id = $1 AND lease_owner = $2`, run.Job.ID, run.lease, state, msg)
	if err != nil {
		r.log.Error("record job end", "job", run.Job.ID, "state", state, "err", err)
	}
	r.ends.ended(run.Job.ID)
	r.finished.WithLabelValues(string(run.Job.Type), string(state)).Inc()
}

// failed counts the attempt and either schedules a retry with backoff or
// ends the job failed after cleaning up.
func (r *Runner) failed(ctx context.Context, run *Run, stepErr error, log *slog.Logger) {
	ctx = context.WithoutCancel(ctx)
	attempts := run.Job.Attempts + 1
	later := IsLater(stepErr) && !IsPermanent(stepErr)
	if later {
		attempts = run.Job.Attempts // a wait on another session is not the job's failure
	}
	if IsPermanent(stepErr) || (!later && attempts >= run.Job.MaxAttempts) {
		if !r.holdsLease(ctx, run, log) {
			return
		}
		log.Error("job failed", "attempts", attempts, "err", stepErr)
		msg := stepErr.Error()
		run.Job.LastError = msg // what the cleanup records (a template build's error)
		if err := r.cleanup(run, log); err != nil {
			msg += "; cleanup also failed (the reconciler lists what is left): " + err.Error()
		}
		_, err := r.pool.Exec(ctx, `UPDATE jobs SET attempts = $3, last_error = $4 WHERE id = $1 AND lease_owner = $2`,
			run.Job.ID, run.lease, attempts, msg)
		if err != nil {
			log.Error("record job failure", "err", err)
		}
		r.finish(ctx, run, Failed, firstLine(msg)) // the state says failed: the message says why
		return
	}
	backoff := min(r.cfg.Backoff.D()<<min(max(attempts-1, 0), 20), r.cfg.MaxBackoff.D())
	if later {
		backoff = r.cfg.MaxBackoff.D()
		log.Warn("job step held up by another session; will retry, not counted as an attempt", "retry_in", backoff, "err", stepErr)
	} else {
		log.Warn("job step failed; will retry", "attempt", attempts, "retry_in", backoff, "err", stepErr)
	}
	_, err := r.pool.Exec(ctx, `UPDATE jobs SET state = 'queued', attempts = $3, last_error = $4,
		run_after = now() + make_interval(secs => $5), lease_owner = NULL, lease_expires = NULL,
		progress_msg = $6, updated_at = now()
		WHERE id = $1 AND lease_owner = $2`, run.Job.ID, run.lease, attempts, stepErr.Error(), backoff.Seconds(),
		fmt.Sprintf("retrying in %s after: %s", backoff.Round(time.Millisecond), firstLine(stepErr.Error())))
	if err != nil {
		log.Error("record job retry", "err", err)
	}
}

// cleanup runs the handler's cleanup; on success the completed steps are
// forgotten, so a retry starts from the beginning.
func (r *Runner) cleanup(run *Run, log *slog.Logger) error {
	h := r.handlers[run.Job.Type]
	if h.Cleanup == nil {
		return nil
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	if err := h.Cleanup(ctx, run); err != nil {
		log.Error("job cleanup failed", "err", err)
		return err
	}
	_, err := r.pool.Exec(ctx, `DELETE FROM job_steps WHERE job_id = $1
		AND EXISTS (SELECT FROM jobs WHERE id = $1 AND lease_owner = $2)`, run.Job.ID, run.lease)
	return err
}

// release hands a job back to the queue at shutdown without counting an attempt.
func (r *Runner) release(id int64, lease string) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	_, _ = r.pool.Exec(ctx, `UPDATE jobs SET state = 'queued', lease_owner = NULL, lease_expires = NULL, updated_at = now()
		WHERE id = $1 AND lease_owner = $2`, id, lease)
}

func (r *Runner) pause(ctx context.Context, id int64, lease string) {
	_, err := r.pool.Exec(context.WithoutCancel(ctx), `UPDATE jobs SET state = 'paused', lease_owner = NULL, lease_expires = NULL,
		updated_at = now() WHERE id = $1 AND lease_owner = $2`, id, lease)
	if err != nil {
		r.log.Error("pause job", "job", id, "err", err)
	}
	r.ends.ended(id)
}

func firstLine(s string) string {
	for i, c := range s {
		if c == '\n' {
			return s[:i]
		}
	}
	return s
}

// Run is a job in the hands of a worker: what its steps use to report
// progress, keep state between steps and ask the pacer for budget.
type Run struct {
	Job    *Job
	runner *Runner
	lease  string // the claim's lease: every write to the job is fenced by it
	result string // the line a job that succeeds ends with; "": done
	paced  time.Duration
}

// Paced is how long this run has waited on the pacer so far.
func (r *Run) Paced() time.Duration { return r.paced }

// Result sets the line the job ends with if it succeeds (by default
// "done"): what it did, for `job show`.
func (r *Run) Result(msg string) { r.result = msg }

// Progress records done/total and a human line ("3/10 batches", "waiting: …").
func (r *Run) Progress(ctx context.Context, done, total int64, msg string) {
	r.Job.ProgressDone, r.Job.ProgressTotal, r.Job.ProgressMsg = done, total, msg
	_, err := r.runner.pool.Exec(ctx, `UPDATE jobs SET progress_done = $3, progress_total = $4, progress_msg = $5, updated_at = now()
		WHERE id = $1 AND lease_owner = $2`, r.Job.ID, r.lease, done, total, msg)
	if err != nil && ctx.Err() == nil {
		r.runner.log.Warn("record progress", "job", r.Job.ID, "err", err)
	}
}

// Note sets the job's progress message, keeping its counts: what the job
// is doing now (a wait, a long statement).
func (r *Run) Note(ctx context.Context, msg string) {
	r.Progress(ctx, r.Job.ProgressDone, r.Job.ProgressTotal, msg)
}

// LoadData decodes the job's saved state into v (left as is if none saved).
func (r *Run) LoadData(v any) error {
	if len(r.Job.Data) == 0 || string(r.Job.Data) == "{}" || string(r.Job.Data) == "null" {
		return nil
	}
	return json.Unmarshal(r.Job.Data, v)
}

// SaveData stores the job's state (cursors, ids) so that a resumed job picks
// up where this one was; fenced by the lease.
func (r *Run) SaveData(ctx context.Context, v any) error {
	b, err := json.Marshal(v)
	if err != nil {
		return err
	}
	tag, err := r.runner.pool.Exec(ctx, `UPDATE jobs SET data = $3, updated_at = now() WHERE id = $1 AND lease_owner = $2`,
		r.Job.ID, r.lease, b)
	if err != nil {
		return err
	}
	if tag.RowsAffected() == 0 {
		return errLeaseLost
	}
	r.Job.Data = b
	return nil
}

// Pace waits for the cluster's budget before a step's heavy work and returns
// the function that gives the budget back. While it waits the job is shown
// as waiting with the reason.
func (r *Run) Pace(ctx context.Context, cluster string, kind Kind) (release func(), err error) {
	return r.pace(ctx, func(report func(string)) (func(), error) {
		return r.runner.pacer.Acquire(ctx, cluster, kind, report)
	})
}

// PaceWALLog is Pace for a CREATE DATABASE … STRATEGY WAL_LOG that writes
// about wal bytes of WAL (Pacer.AcquireWALLog).
func (r *Run) PaceWALLog(ctx context.Context, cluster string, wal int64) (release func(), err error) {
	return r.pace(ctx, func(report func(string)) (func(), error) {
		return r.runner.pacer.AcquireWALLog(ctx, cluster, wal, report)
	})
}

// SlotWait is how long a step's logical slot on a cluster may wait on
// other sessions' transactions (Pacer.SlotWait).
func (r *Run) SlotWait(cluster string) time.Duration {
	return r.runner.pacer.SlotWait(cluster)
}

func (r *Run) pace(ctx context.Context, acquire func(report func(string)) (func(), error)) (release func(), err error) {
	if r.runner.pacer == nil {
		return func() {}, nil
	}
	waiting := false
	defer func(start time.Time) { r.paced += time.Since(start) }(time.Now())
	release, err = acquire(func(reason string) {
		waiting = true
		r.setState(ctx, Waiting, "waiting: "+reason)
	})
	if waiting {
		r.setState(ctx, Running, r.Job.ProgressMsg)
	}
	return release, err
}

func (r *Run) setState(ctx context.Context, state State, msg string) {
	_, err := r.runner.pool.Exec(ctx, `UPDATE jobs SET state = $3, progress_msg = $4, updated_at = now()
		WHERE id = $1 AND lease_owner = $2`, r.Job.ID, r.lease, state, msg)
	if err != nil && ctx.Err() == nil {
		r.runner.log.Warn("record job state", "job", r.Job.ID, "err", err)
	}
}

// Pause stops the job without finishing it: it waits, state paused, until
// Resume requeues it; the current step then runs again. A step returns the
// result of Pause.
func (r *Run) Pause(ctx context.Context, msg string) error {
	r.Progress(ctx, r.Job.ProgressDone, r.Job.ProgressTotal, msg)
	return errPaused
}

// Enqueue submits a follow-up job.
func (r *Run) Enqueue(ctx context.Context, s Spec) (Job, error) {
	return r.runner.Enqueue(ctx, r.runner.pool, s)
}
