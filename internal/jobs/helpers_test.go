package jobs_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgtenant/pgtenant/internal/catalog"
	"github.com/pgtenant/pgtenant/internal/cluster"
	"github.com/pgtenant/pgtenant/internal/config"
	"github.com/pgtenant/pgtenant/internal/jobs"
	"github.com/pgtenant/pgtenant/internal/pgtest"
)

var pg *pgtest.Cluster

// One primary and one streaming standby: the pacer tests hold the standby's
// replay to make real replay lag.
func TestMain(m *testing.M) { pgtest.Main(m, pgtest.Options{Standbys: 1}, &pg) }

func testCtx(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	t.Cleanup(cancel)
	return ctx
}

// harness is one test's private catalog, with the side tables its steps
// write to, and the settings shared by the daemons the test starts.
//
// test_exec has one row per execution of a step (or cleanup), written when
// the step starts, so that a step run twice shows twice even if it never
// completed. test_slot records when a step held a heavy DDL slot (kind
// heavy) or a WAL_LOG copy slot (kind wal_log).
type harness struct {
	db       string
	pool     *pgxpool.Pool // the test's own view of the catalog
	clusters *cluster.Registry
	jobsCfg  config.JobsConfig
	pacerCfg config.PacerConfig
}

func newHarness(t *testing.T) *harness {
	t.Helper()
	ctx := testCtx(t)
	logger := pgtest.Logger(t)
	db := pg.NewDatabase(t)
	store, err := catalog.Open(ctx, pg.PrimaryDSN(db), logger)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(store.Close)
	if _, err := store.Pool().Exec(ctx, `
		CREATE TABLE test_exec (job_id bigint NOT NULL, step text NOT NULL, worker text NOT NULL,
			at timestamptz NOT NULL DEFAULT clock_timestamp());
		CREATE TABLE test_slot (job_id bigint NOT NULL, kind text NOT NULL DEFAULT 'heavy',
			held_from timestamptz NOT NULL, held_until timestamptz NOT NULL)`); err != nil {
		t.Fatal(err)
	}
	cl, err := cluster.New("local", pg.PrimaryDSN("postgres"), nil, logger)
	if err != nil {
		t.Fatal(err)
	}
	reg := cluster.NewRegistry()
	reg.Put(cl)
	t.Cleanup(reg.Close)

	jobsCfg := config.Default().Jobs
	jobsCfg.Lease = config.Duration(2 * time.Second)
	jobsCfg.Backoff = config.Duration(20 * time.Millisecond)
	jobsCfg.MaxBackoff = config.Duration(200 * time.Millisecond)
	pacerCfg := config.Default().Pacer
	pacerCfg.PollInterval = config.Duration(50 * time.Millisecond)
	return &harness{db: db, pool: store.Pool(), clusters: reg, jobsCfg: jobsCfg, pacerCfg: pacerCfg}
}

// startDaemon starts what one pgtenant daemon runs for jobs: its own catalog
// pool, a pacer and a runner with the handlers (built for the runner's owner
// id), until the end of the test.
func (h *harness) startDaemon(t *testing.T, workers int, handlers func(owner string) map[string]jobs.Handler) *jobs.Runner {
	t.Helper()
	logger := pgtest.Logger(t)
	store, err := catalog.Open(testCtx(t), pg.PrimaryDSN(h.db), logger)
	if err != nil {
		t.Fatal(err)
	}
	pacerCfg := h.pacerCfg
	pacer := jobs.NewPacer(h.clusters, func(string) config.PacerConfig { return pacerCfg }, store.Pool(), logger, nil)
	cfg := h.jobsCfg
	cfg.Workers = workers
	r := jobs.NewRunner(store.Pool(), cfg, pacer, logger, nil)
	for typ, hd := range handlers(r.Owner()) {
		r.Register(jobs.Type(typ), hd)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- r.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("runner %s: %v", r.Owner(), err)
		}
		store.Close()
	})
	return r
}

// record writes one execution of a step to test_exec. It does not use the
// step's context: an execution is recorded even if the job is being stopped.
func (h *harness) record(ctx context.Context, jobID int64, step, worker string) error {
	_, err := h.pool.Exec(context.WithoutCancel(ctx), `INSERT INTO test_exec (job_id, step, worker) VALUES ($1, $2, $3)`,
		jobID, step, worker)
	return err
}

// step returns a step that records its execution, then runs fn (if any).
func (h *harness) step(owner, name string, fn func(ctx context.Context, r *jobs.Run) error) jobs.Step {
	return jobs.Step{Name: name, Run: func(ctx context.Context, r *jobs.Run) error {
		if err := h.record(ctx, r.Job.ID, name, owner); err != nil {
			return err
		}
		if fn == nil {
			return nil
		}
		return fn(ctx, r)
	}}
}

// handler returns a handler of steps with a cleanup that records itself as
// "cleanup".
func (h *harness) handler(owner string, steps ...jobs.Step) jobs.Handler {
	return jobs.Handler{
		Steps:   func(*jobs.Job) ([]jobs.Step, error) { return steps, nil },
		Cleanup: func(ctx context.Context, r *jobs.Run) error { return h.record(ctx, r.Job.ID, "cleanup", owner) },
	}
}

// three is a handler of three steps (one, two, three) that each take d.
func (h *harness) three(owner string, d time.Duration) jobs.Handler {
	sleep := func(context.Context, *jobs.Run) error { time.Sleep(d); return nil }
	return h.handler(owner, h.step(owner, "one", sleep), h.step(owner, "two", sleep), h.step(owner, "three", sleep))
}

// execs returns the steps a job executed, in order.
func (h *harness) execs(t *testing.T, id int64) []string {
	t.Helper()
	rows, err := h.pool.Query(testCtx(t), `SELECT step FROM test_exec WHERE job_id = $1 ORDER BY at`, id)
	if err != nil {
		t.Fatal(err)
	}
	got, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		t.Fatal(err)
	}
	return got
}

// genericPlan is EXPLAIN of sql as a generic plan, the one pgx's
// statement cache gets after five runs.
func (h *harness) genericPlan(t *testing.T, sql string, args ...any) string {
	t.Helper()
	ctx := testCtx(t)
	tx, err := h.pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx)
	if _, err := tx.Exec(ctx, "SET LOCAL plan_cache_mode = force_generic_plan"); err != nil {
		t.Fatal(err)
	}
	rows, err := tx.Query(ctx, "EXPLAIN "+sql, args...)
	if err != nil {
		t.Fatal(err)
	}
	lines, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		t.Fatal(err)
	}
	return strings.Join(lines, "\n")
}

// count runs a query returning one integer.
func (h *harness) count(t *testing.T, sql string, args ...any) int {
	t.Helper()
	var n int
	if err := h.pool.QueryRow(testCtx(t), sql, args...).Scan(&n); err != nil {
		t.Fatalf("%s: %v", sql, err)
	}
	return n
}

// get reads a job.
func (h *harness) get(t *testing.T, id int64) jobs.Job {
	t.Helper()
	j, err := jobs.Get(testCtx(t), h.pool, id)
	if err != nil {
		t.Fatal(err)
	}
	return j
}

// enqueue submits a job.
func (h *harness) enqueue(t *testing.T, s jobs.Spec) jobs.Job {
	t.Helper()
	j, err := jobs.Enqueue(testCtx(t), h.pool, s, h.jobsCfg.MaxAttempts)
	if err != nil {
		t.Fatal(err)
	}
	return j
}

// maxOverlap is the most holdings of a kind in test_slot at one moment.
func (h *harness) maxOverlap(t *testing.T, kind string) int {
	t.Helper()
	return h.count(t, `SELECT coalesce(max(n), 0)::int FROM (
		SELECT (SELECT count(*) FROM test_slot y WHERE y.kind = x.kind AND y.held_from <= x.held_from AND x.held_from < y.held_until) AS n
		FROM test_slot x WHERE x.kind = $1) m`, kind)
}

// waitJob waits until cond holds for the job and returns it.
func (h *harness) waitJob(t *testing.T, id int64, what string, cond func(jobs.Job) bool) jobs.Job {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		j := h.get(t, id)
		if cond(j) {
			return j
		}
		if time.Now().After(deadline) {
			t.Fatalf("job %d: waited 30s for %s; it is %s (%q, last error %q)", id, what, j.State, j.ProgressMsg, j.LastError)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// waitState waits until the job is in state.
func (h *harness) waitState(t *testing.T, id int64, state jobs.State) jobs.Job {
	t.Helper()
	return h.waitJob(t, id, string(state), func(j jobs.Job) bool { return j.State == state })
}

// waitFinished waits until the job is finished, whatever the outcome.
func (h *harness) waitFinished(t *testing.T, id int64) jobs.Job {
	t.Helper()
	return h.waitJob(t, id, "a final state", func(j jobs.Job) bool { return jobs.Finished(j.State) })
}

// waitExec waits until a job has executed a step n times.
func (h *harness) waitExec(t *testing.T, id int64, step string, n int) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		got := h.count(t, `SELECT count(*) FROM test_exec WHERE job_id = $1 AND step = $2`, id, step)
		if got >= n {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("job %d: step %s executed %d times after 30s, want %d", id, step, got, n)
		}
		time.Sleep(20 * time.Millisecond)
	}
}
