// Package jobs runs pgtenant's durable, resumable operations. A job is a row
// in the catalog with ordered steps; workers claim jobs with FOR UPDATE SKIP
// LOCKED, hold a lease while they work, and record each completed step, so
// that any daemon can resume a job whose worker died from its last completed
// step. The pacer (pacer.go) holds heavy steps while a cluster is over budget.
// Steps must be idempotent; this package knows nothing of what they do.
//
// Every query of the jobs and job_steps tables is here (their schema is in
// catalog's migrations): services read jobs through List, Get, Unfinished,
// Busy, SucceededSince and Targets, never with SQL of their own.
package jobs

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pgtenant/pgtenant/internal/catalog"
)

// State is where a job is: the catalog's jobs.state.
type State string

// Job states.
const (
	Queued    State = "queued"
	Running   State = "running"
	Waiting   State = "waiting" // running, held by the pacer
	Paused    State = "paused"  // waits for an operator (e.g. a canary rollout)
	Succeeded State = "succeeded"
	Failed    State = "failed"
	Cancelled State = "cancelled"
)

// Active is the filter of List for every unfinished state: not a state
// of a job.
const Active State = "active"

// FilterStates are the states List filters on: every state, and Active.
var FilterStates = []State{Queued, Running, Waiting, Paused, Succeeded, Failed, Cancelled, Active}

// Finished reports whether a state is final.
func Finished(state State) bool { return state == Succeeded || state == Failed || state == Cancelled }

// Job is one row of the jobs table.
type Job struct {
	ID              int64           `json:"id"`
	Type            Type            `json:"type"`
	Key             string          `json:"key,omitempty"`
	TargetKind      string          `json:"target_kind,omitempty"`
	Target          string          `json:"target,omitempty"`
	Cluster         string          `json:"cluster,omitempty"`
	Args            json.RawMessage `json:"args"`
	Data            json.RawMessage `json:"-"`
	State           State           `json:"state"`
	Attempts        int             `json:"attempts"`
	MaxAttempts     int             `json:"max_attempts"`
	RunAfter        time.Time       `json:"run_after"`
	Priority        int             `json:"priority,omitempty"`
	LeaseOwner      string          `json:"lease_owner,omitempty"`
	LeaseExpires    *time.Time      `json:"lease_expires,omitempty"`
	CancelRequested bool            `json:"cancel_requested,omitempty"`
	ProgressDone    int64           `json:"progress_done"`
	ProgressTotal   int64           `json:"progress_total"`
	ProgressMsg     string          `json:"progress_msg"`
	LastError       string          `json:"last_error,omitempty"`
	CreatedAt       time.Time       `json:"created_at"`
	UpdatedAt       time.Time       `json:"updated_at"`
	StartedAt       *time.Time      `json:"started_at,omitempty"`
	FinishedAt      *time.Time      `json:"finished_at,omitempty"`
	Steps           []StepRecord    `json:"steps,omitempty"`
}

// StepRecord is one completed step.
type StepRecord struct {
	Step       string    `json:"step"`
	Worker     string    `json:"worker"`
	Attempt    int       `json:"attempt"`
	StartedAt  time.Time `json:"started_at"`
	FinishedAt time.Time `json:"finished_at"`
}

// DecodeArgs unmarshals the job's arguments.
func (j *Job) DecodeArgs(v any) error {
	if err := json.Unmarshal(j.Args, v); err != nil {
		return Permanent(fmt.Errorf("job %d (%s): bad args: %w", j.ID, j.Type, err))
	}
	return nil
}

// Spec describes a job to enqueue.
type Spec struct {
	Type        Type
	Key         string // optional: at most one unfinished job per key
	TargetKind  string // tenant, template, cluster, rollout …
	Target      string
	Cluster     string
	Args        any
	MaxAttempts int // 0: the runner's default
	RunAfter    time.Time
	// Priority: among due jobs, higher ones are claimed first (a cold
	// create's build, which a request waits for, before spare builds);
	// equal ones in order of run_after.
	Priority int
}

// Querier is a pool or a transaction: Enqueue can run inside a caller's
// catalog transaction so that a row and the job that works on it commit together.
type Querier = catalog.Querier

// UnfinishedStates is the SQL list of the states of a job not finished
// (Finished's complement), for queries on the jobs table.
const UnfinishedStates = `('queued', 'running', 'waiting', 'paused')`

// finishedStates is the SQL list of the states of a finished job
// (Finished's), as jobs_finished's predicate spells it.
const finishedStates = `('succeeded', 'failed', 'cancelled')`

// ErrNotFound is returned for an unknown job id.
var ErrNotFound = errors.New("job not found")

// ErrWrongState is returned when a job cannot move as asked (cancel a finished job …).
var ErrWrongState = errors.New("job is in the wrong state")

const jobColumns = `id, type, coalesce(key, ''), target_kind, target, coalesce(cluster, ''), args, data, state,
	attempts, max_attempts, run_after, priority, coalesce(lease_owner, ''), lease_expires, cancel_requested,
	progress_done, progress_total, progress_msg, last_error, created_at, updated_at, started_at, finished_at`

func scanJob(row pgx.Row) (Job, error) {
	var j Job
	err := row.Scan(&j.ID, &j.Type, &j.Key, &j.TargetKind, &j.Target, &j.Cluster, &j.Args, &j.Data, &j.State,
		&j.Attempts, &j.MaxAttempts, &j.RunAfter, &j.Priority, &j.LeaseOwner, &j.LeaseExpires, &j.CancelRequested,
		&j.ProgressDone, &j.ProgressTotal, &j.ProgressMsg, &j.LastError, &j.CreatedAt, &j.UpdatedAt, &j.StartedAt, &j.FinishedAt)
	return j, err
}

// Enqueue inserts a job. With a Key, an unfinished job with the same key is
// returned instead of a new one (submission is idempotent). Services go
// through Runner.Enqueue, which supplies the configured attempts and wakes
// a worker.
func Enqueue(ctx context.Context, q Querier, s Spec, defaultAttempts int) (Job, error) {
	args, err := json.Marshal(s.Args)
	if err != nil {
		return Job{}, err
	}
	if s.Args == nil {
		args = []byte("{}")
	}
	if s.MaxAttempts == 0 {
		s.MaxAttempts = defaultAttempts
	}
	if s.RunAfter.IsZero() {
		s.RunAfter = time.Now()
	}
	var key, cluster *string
	if s.Key != "" {
		key = &s.Key
	}
	if s.Cluster != "" {
		cluster = &s.Cluster
	}
	// A few rounds: under read committed each statement sees the jobs
	// committed before it, so a key freed between the two is taken by the
	// next insert.
	for round := 0; ; round++ {
		j, err := scanJob(q.QueryRow(ctx, `
		INSERT INTO jobs (type, key, target_kind, target, cluster, args, max_attempts, run_after, priority)
		VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9)
		ON CONFLICT (key) WHERE key IS NOT NULL AND state IN `+UnfinishedStates+` DO NOTHING
		RETURNING `+jobColumns, s.Type, key, s.TargetKind, s.Target, cluster, args, s.MaxAttempts, s.RunAfter, s.Priority))
		if errors.Is(err, pgx.ErrNoRows) && key != nil {
			j, err = scanJob(q.QueryRow(ctx, `SELECT `+jobColumns+` FROM jobs
			WHERE key = $1 AND state IN `+UnfinishedStates, *key))
			if errors.Is(err, pgx.ErrNoRows) && round < 5 {
				continue // the job that held the key ended in between: insert again
			}
		}
		if err != nil {
			return Job{}, fmt.Errorf("enqueue %s job: %w", s.Type, err)
		}
		return j, nil
	}
}

// Get returns a job with its completed steps.
func Get(ctx context.Context, q Querier, id int64) (Job, error) {
	j, err := scanJob(q.QueryRow(ctx, `SELECT `+jobColumns+` FROM jobs WHERE id = $1`, id))
	if errors.Is(err, pgx.ErrNoRows) {
		return Job{}, fmt.Errorf("job %d: %w (finished jobs are deleted after jobs.retention)", id, ErrNotFound)
	}
	if err != nil {
		return Job{}, err
	}
	rows, err := q.Query(ctx, `SELECT step, worker, attempt, started_at, finished_at FROM job_steps
		WHERE job_id = $1 ORDER BY finished_at`, id)
	if err != nil {
		return Job{}, err
	}
	j.Steps, err = pgx.CollectRows(rows, func(r pgx.CollectableRow) (StepRecord, error) {
		var s StepRecord
		return s, r.Scan(&s.Step, &s.Worker, &s.Attempt, &s.StartedAt, &s.FinishedAt)
	})
	return j, err
}

// Filter narrows List.
type Filter struct {
	State      State // one state, or Active for queued/running/waiting/paused
	Type       Type
	TargetKind string
	Target     string
	Limit      int
}

// List returns jobs, newest first.
func List(ctx context.Context, q Querier, f Filter) ([]Job, error) {
	query, args := listQuery(f)
	rows, err := q.Query(ctx, query, args...)
	if err != nil {
		return nil, err
	}
	return pgx.CollectRows(rows, func(r pgx.CollectableRow) (Job, error) { return scanJob(r) })
}

// listQuery is List's statement with only the filters given. Folded into
// "the parameter is empty OR …", its generic plan walked the jobs newest
// first until it had a page: the whole history when nothing matched, as
// for the active moves that /metrics reads (bench density, 500,000
// finished jobs). Active, and any unfinished state, reads through
// jobs_unfinished or jobs_unfinished_id (the state's list, spelled as
// their predicate, lets a generic plan use them), a target through
// jobs_target, a finished state through jobs_state_id, a type through
// jobs_type_id.
func listQuery(f Filter) (string, []any) {
	if f.Limit <= 0 || f.Limit > 10000 {
		f.Limit = 100
	}
	var where []string
	var args []any
	eq := func(column, value string) {
		if value != "" {
			args = append(args, value)
			where = append(where, fmt.Sprintf("%s = $%d", column, len(args)))
		}
	}
	if f.State == Active || (f.State != "" && !Finished(f.State)) {
		where = append(where, "state IN "+UnfinishedStates)
	}
	if f.State != Active {
		eq("state", string(f.State))
	}
	eq("type", string(f.Type))
	eq("target_kind", f.TargetKind)
	eq("target", f.Target)
	query := `SELECT ` + jobColumns + ` FROM jobs`
	if len(where) > 0 {
		query += " WHERE " + strings.Join(where, " AND ")
	}
	args = append(args, f.Limit)
	return query + fmt.Sprintf(" ORDER BY id DESC LIMIT $%d", len(args)), args
}

// Cancel asks a job to stop. A queued job that never started is cancelled at
// once. A running one stops when its worker next renews the lease. One that
// started but is not running now (queued for a retry, paused) may have
// half-built something: it is queued at once for a worker to run its
// handler's cleanup and end it cancelled.
func Cancel(ctx context.Context, q Querier, id int64) (Job, error) {
	tag, err := q.Exec(ctx, `UPDATE jobs SET
		state = CASE WHEN state = 'queued' AND started_at IS NULL THEN 'cancelled'
		             WHEN state IN ('queued', 'paused') THEN 'queued' ELSE state END,
		finished_at = CASE WHEN state = 'queued' AND started_at IS NULL THEN now() END,
		run_after = CASE WHEN state IN ('queued', 'paused') THEN now() ELSE run_after END,
		cancel_requested = true, updated_at = now()
		WHERE id = $1 AND state NOT IN ('succeeded', 'failed', 'cancelled')`, id)
	if err != nil {
		return Job{}, err
	}
	if tag.RowsAffected() == 0 {
		j, err := Get(ctx, q, id)
		if err != nil {
			return Job{}, err
		}
		return j, fmt.Errorf("%w: job %d is already %s", ErrWrongState, id, j.State)
	}
	return Get(ctx, q, id)
}

// RetriedMsg is the progress message of a job requeued by Retry until it
// runs again: the failure it had is no longer its state.
const RetriedMsg = "queued again by a retry"

// Retry requeues a failed or cancelled job. Its completed steps stay
// recorded, so it resumes after the last one (a handler whose cleanup undid
// them cleared them). Its last error and progress message are cleared: a
// retried job shows the failure it had no longer.
func Retry(ctx context.Context, q Querier, id int64) (Job, error) {
	tag, err := q.Exec(ctx, `UPDATE jobs SET state = 'queued', attempts = 0, cancel_requested = false,
		run_after = now(), finished_at = NULL, updated_at = now(), last_error = '', progress_msg = $2
		WHERE id = $1 AND state IN ('failed', 'cancelled')`, id, RetriedMsg)
	if err != nil {
		return Job{}, err
	}
	if tag.RowsAffected() == 0 {
		j, err := Get(ctx, q, id)
		if err != nil {
			return Job{}, err
		}
		return j, fmt.Errorf("%w: only failed or cancelled jobs can be retried; job %d is %s", ErrWrongState, id, j.State)
	}
	return Get(ctx, q, id)
}

// Resume moves a paused job back to the queue.
func Resume(ctx context.Context, q Querier, id int64) error {
	tag, err := q.Exec(ctx, `UPDATE jobs SET state = 'queued', run_after = now(), updated_at = now()
		WHERE id = $1 AND state = 'paused'`, id)
	if err != nil {
		return err
	}
	if tag.RowsAffected() == 0 {
		return fmt.Errorf("%w: job %d is not paused", ErrWrongState, id)
	}
	return nil
}

// permanentError marks an error that retrying cannot fix.
type permanentError struct{ err error }

func (e permanentError) Error() string { return e.err.Error() }
func (e permanentError) Unwrap() error { return e.err }

// Permanent marks err as not worth retrying: the job fails at once.
func Permanent(err error) error {
	if err == nil {
		return nil
	}
	return permanentError{err}
}

// IsPermanent reports whether err was marked Permanent.
func IsPermanent(err error) bool {
	var p permanentError
	return errors.As(err, &p)
}

// laterError marks a wait on something outside the job that it may not
// end itself (another session's transaction).
type laterError struct{ err error }

func (e laterError) Error() string { return e.err.Error() }
func (e laterError) Unwrap() error { return e.err }

// Later marks err as a wait that only time (or an operator) ends: the job
// is tried again after jobs.max_backoff, and the failure does not count
// as one of its max_attempts, so that a job held up by something it must
// not end neither fails nor spins. err should say what holds it up and
// what to do.
func Later(err error) error {
	if err == nil {
		return nil
	}
	return laterError{err}
}

// IsLater reports whether err was marked Later.
func IsLater(err error) bool {
	var l laterError
	return errors.As(err, &l)
}

// Busy reports whether a job of a type on a cluster is queued, running or
// waiting (paused ones do not count: they wait for an operator).
func Busy(ctx context.Context, q Querier, typ Type, cluster string) (bool, error) {
	var busy bool
	err := q.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM jobs WHERE type = $1 AND cluster = $2
		AND state IN ('queued', 'running', 'waiting'))`, typ, cluster).Scan(&busy)
	return busy, err
}

// Unfinished reports whether a job of a type on a target is queued,
// running, waiting or paused.
func Unfinished(ctx context.Context, q Querier, typ Type, target string) (bool, error) {
	var ok bool
	err := q.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM jobs WHERE type = $1 AND target = $2
		AND state IN `+UnfinishedStates+`)`, typ, target).Scan(&ok)
	return ok, err
}

// SucceededSince counts the jobs of a type that succeeded on a cluster
// since a time.
func SucceededSince(ctx context.Context, q Querier, cluster string, typ Type, since time.Time) (int, error) {
	var n int
	err := q.QueryRow(ctx, `SELECT count(*) FROM jobs WHERE cluster = $1 AND type = $2 AND state = 'succeeded'
		AND finished_at >= $3`, cluster, typ, since).Scan(&n)
	return n, err
}

// pruneQuery finds its jobs through jobs_finished and deletes them by id
// (an array, so that no plan joins them with the whole table); rows
// another daemon is deleting are skipped, not waited for.
const pruneQuery = `DELETE FROM jobs WHERE id = ANY (ARRAY (SELECT id FROM jobs WHERE state IN ` + finishedStates + `
	AND finished_at < $1 ORDER BY finished_at LIMIT $2 FOR UPDATE SKIP LOCKED))`

// Prune deletes up to batch jobs that finished before a time, oldest
// first, with their step records, and returns how many it deleted. An
// unfinished job is never deleted, however old.
func Prune(ctx context.Context, q Querier, before time.Time, batch int) (int64, error) {
	tag, err := q.Exec(ctx, pruneQuery, before, batch)
	return tag.RowsAffected(), err
}

// historyQuery reads through jobs_target, jobs_args_into and jobs_data_into.
const historyQuery = `SELECT x.id, bool_or(j.state IN ` + UnfinishedStates + `),
	coalesce((array_agg(j.id ORDER BY j.id DESC) FILTER (WHERE j.type = $2 AND j.target = x.id))[1], 0),
	coalesce((array_agg(j.state ORDER BY j.id DESC) FILTER (WHERE j.type = $2 AND j.target = x.id))[1], ''),
	coalesce((array_agg(j.last_error ORDER BY j.id DESC) FILTER (WHERE j.type = $2 AND j.target = x.id))[1], '')
	FROM jobs j CROSS JOIN LATERAL (VALUES (j.target), (j.args->>'into'), (j.data->>'into')) AS x(id)
	WHERE j.target_kind = 'tenant' AND (j.target = ANY($1) OR j.args->>'into' = ANY($1) OR j.data->>'into' = ANY($1))
	  AND x.id = ANY($1)
	GROUP BY x.id`

// atWorkQuery reads through jobs_unfinished.
const atWorkQuery = `SELECT DISTINCT x.id FROM jobs j
	CROSS JOIN LATERAL (VALUES (j.target), (CASE WHEN j.target_kind = 'tenant' THEN j.args->>'tenant' END),
		(CASE WHEN j.target_kind = 'tenant' THEN j.args->>'into' END), (CASE WHEN j.target_kind = 'tenant' THEN j.data->>'into' END)) AS x(id)
	WHERE j.state IN ` + UnfinishedStates + ` AND x.id <> ''`

// AtWork is what the unfinished jobs work on: their targets (tenants,
// templates, clusters), and the tenants a tenant job names besides its
// target (History's). It reads those jobs only, not the history.
func AtWork(ctx context.Context, q Querier) (map[string]bool, error) {
	rows, err := q.Query(ctx, atWorkQuery)
	if err != nil {
		return nil, err
	}
	ids, err := pgx.CollectRows(rows, pgx.RowTo[string])
	out := make(map[string]bool, len(ids))
	for _, id := range ids {
		out[id] = true
	}
	return out, err
}

// TenantJobs is what the jobs table holds of one tenant: whether one of
// its jobs is unfinished, and its newest job of one type.
type TenantJobs struct {
	Active    bool
	Last      int64 // id of the newest job of the type that targets it; 0 if none
	LastState State
	LastError string
}

// History summarises the jobs that name each of ids, tenants that have at
// least one (reconcile tells by it what pgtenant ever had a job for): as
// their target (a tenant job's args.tenant is its target), or as the new
// tenant of a fork or an import (args.into) or a rewind's copy
// (data.into), with the newest job of type typ that targets it. It reads
// those tenants' jobs only, through indexes, not the whole history.
func History(ctx context.Context, q Querier, typ Type, ids []string) (map[string]TenantJobs, error) {
	out := map[string]TenantJobs{}
	if len(ids) == 0 {
		return out, nil
	}
	rows, err := q.Query(ctx, historyQuery, ids, typ)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	for rows.Next() {
		var id string
		var t TenantJobs
		if err := rows.Scan(&id, &t.Active, &t.Last, &t.LastState, &t.LastError); err != nil {
			return nil, err
		}
		out[id] = t
	}
	return out, rows.Err()
}
