package jobs_test

import (
	"context"
	"maps"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pgtenant/pgtenant/internal/cluster"
	"github.com/pgtenant/pgtenant/internal/config"
	"github.com/pgtenant/pgtenant/internal/jobs"
	"github.com/pgtenant/pgtenant/internal/pgtest"
)

// paced returns handlers of a job ("heavy") whose one step ("ddl") asks the
// pacer for a heavy slot on cluster local, holds it for hold and records
// when it held it.
func paced(h *harness, hold time.Duration) func(owner string) map[string]jobs.Handler {
	return func(owner string) map[string]jobs.Handler {
		return map[string]jobs.Handler{"heavy": h.handler(owner, h.step(owner, "ddl", func(ctx context.Context, r *jobs.Run) error {
			release, err := r.Pace(ctx, "local", jobs.Heavy)
			if err != nil {
				return err
			}
			defer release()
			from := time.Now()
			if err := h.record(ctx, r.Job.ID, "paced work", owner); err != nil {
				return err
			}
			time.Sleep(hold)
			_, err = h.pool.Exec(ctx, `INSERT INTO test_slot (job_id, held_from, held_until) VALUES ($1, $2, $3)`,
				r.Job.ID, from, time.Now())
			return err
		}))}
	}
}

// walLogPaced returns handlers of a job ("wal_log") whose one step ("copy")
// asks the pacer for a WAL_LOG copy slot on cluster local for a copy of
// about wal bytes, holds it for hold and records when it held it.
func walLogPaced(h *harness, hold time.Duration, wal int64) func(owner string) map[string]jobs.Handler {
	return func(owner string) map[string]jobs.Handler {
		return map[string]jobs.Handler{"wal_log": h.handler(owner, h.step(owner, "copy", func(ctx context.Context, r *jobs.Run) error {
			release, err := r.PaceWALLog(ctx, "local", wal)
			if err != nil {
				return err
			}
			defer release()
			from := time.Now()
			time.Sleep(hold)
			_, err = h.pool.Exec(ctx, `INSERT INTO test_slot (job_id, kind, held_from, held_until) VALUES ($1, 'wal_log', $2, $3)`,
				r.Job.ID, from, time.Now())
			return err
		}))}
	}
}

// both is the handlers of paced and walLogPaced.
func both(h *harness, hold time.Duration, wal int64) func(owner string) map[string]jobs.Handler {
	return func(owner string) map[string]jobs.Handler {
		hs := paced(h, hold)(owner)
		maps.Copy(hs, walLogPaced(h, hold, wal)(owner))
		return hs
	}
}

// waitAll waits until every job is finished, and reports whether any was
// seen waiting with a progress line containing reason.
func (h *harness) waitAll(t *testing.T, ids []int64, reason string) bool {
	t.Helper()
	saw := false
	deadline := time.Now().Add(45 * time.Second)
	for {
		done := 0
		for _, id := range ids {
			j := h.get(t, id)
			if j.State == jobs.Waiting && strings.Contains(j.ProgressMsg, reason) {
				saw = true
			}
			if jobs.Finished(j.State) {
				if j.State != jobs.Succeeded {
					t.Fatalf("job %d: %s (%s)", id, j.State, j.LastError)
				}
				done++
			}
		}
		if done == len(ids) {
			return saw
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d of %d jobs finished after 45s", done, len(ids))
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// TestPacer_WALLogCopiesInParallel: WAL_LOG copies of two daemons run
// several at once, never more than pacer.wal_log_slots, while heavy steps
// (FILE_COPY, DROP DATABASE) keep one heavy DDL slot and never overlap: the
// two kinds have slots of their own.
func TestPacer_WALLogCopiesInParallel(t *testing.T) {
	h := newHarness(t)
	h.pacerCfg.HeavyDDLSlots = 1
	h.pacerCfg.WALLogSlots = 3
	var ids []int64
	for range 7 {
		ids = append(ids, h.enqueue(t, jobs.Spec{Type: "wal_log", Cluster: "local"}).ID)
	}
	for range 3 {
		ids = append(ids, h.enqueue(t, jobs.Spec{Type: "heavy", Cluster: "local"}).ID)
	}
	// 10 workers over two daemons: every job is taken at once and only the
	// pacer holds them back. A small copy: the lag budget leaves room for many.
	h.startDaemon(t, 5, both(h, 700*time.Millisecond, 1<<20))
	h.startDaemon(t, 5, both(h, 700*time.Millisecond, 1<<20))

	if !h.waitAll(t, ids, "WAL_LOG copies already in flight") {
		t.Error("no WAL_LOG copy was seen waiting for a slot")
	}
	if got := h.maxOverlap(t, "wal_log"); got != 3 {
		t.Errorf("WAL_LOG copies in flight at once: at most %d, want 3 (pacer.wal_log_slots)", got)
	}
	if got := h.maxOverlap(t, "heavy"); got != 1 {
		t.Errorf("heavy steps in flight at once: at most %d, want 1 (pacer.heavy_ddl_slots)", got)
	}
	if got := h.count(t, `SELECT count(*) FROM test_slot`); got != 10 {
		t.Errorf("slot holdings = %d, want 10", got)
	}
	if got := h.count(t, `SELECT count(*) FROM test_slot x JOIN test_slot y ON x.kind = 'heavy' AND y.kind = 'wal_log'
		AND x.held_from < y.held_until AND y.held_from < x.held_until`); got == 0 {
		t.Error("no WAL_LOG copy ran while a heavy step held its slot: the kinds share a limit")
	}
}

// TestPacer_WALLogCopiesWithinLagBudget: copies too big for two of them to
// fit the replay lag budget at once run one after another, whatever the
// slots, and the waiting one says why.
func TestPacer_WALLogCopiesWithinLagBudget(t *testing.T) {
	h := newHarness(t)
	h.pacerCfg.WALLogSlots = 4
	h.pacerCfg.MaxReplayLag = 64 << 20
	var ids []int64
	for range 3 {
		ids = append(ids, h.enqueue(t, jobs.Spec{Type: "wal_log", Cluster: "local"}).ID)
	}
	h.startDaemon(t, 3, walLogPaced(h, 500*time.Millisecond, 40<<20))

	if !h.waitAll(t, ids, "would put standby replay lag") {
		t.Error("no copy was seen waiting for the lag budget")
	}
	if got := h.maxOverlap(t, "wal_log"); got != 1 {
		t.Errorf("40 MB copies in flight at once: at most %d, want 1 (two would be 80 MB of a 64 MB budget)", got)
	}
}

// TestPacer_WaitsForStandbyReplayLag: a heavy step waits, shown as waiting
// with the reason, while the real standby replays too far behind, and goes
// on once it catches up.
func TestPacer_WaitsForStandbyReplayLag(t *testing.T) {
	h := newHarness(t)
	ctx := testCtx(t)
	h.pacerCfg.MaxReplayLag = 1 << 20

	standby, err := pgx.Connect(ctx, pg.DSN(pg.Standbys()[0], "postgres"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { standby.Close(context.Background()) })
	resume := func() error {
		_, err := standby.Exec(context.Background(), `SELECT pg_wal_replay_resume()`)
		return err
	}
	// Whatever happens, the other tests get a standby that replays.
	t.Cleanup(func() {
		if err := resume(); err != nil {
			t.Errorf("resume replay on the standby: %v", err)
		}
	})
	if _, err := standby.Exec(ctx, `SELECT pg_wal_replay_pause()`); err != nil {
		t.Fatal(err)
	}
	// About 5 MB of WAL: more than the budget, none of it replayed.
	if _, err := h.pool.Exec(ctx, `CREATE TABLE filler AS SELECT g, repeat('x', 1000) AS pad FROM generate_series(1, 5000) g`); err != nil {
		t.Fatal(err)
	}

	h.startDaemon(t, 1, paced(h, 0))
	j := h.enqueue(t, jobs.Spec{Type: "heavy", Cluster: "local"})
	w := h.waitState(t, j.ID, jobs.Waiting)
	if !strings.Contains(w.ProgressMsg, "standby replay lag") {
		t.Errorf("waiting job: progress_msg = %q, want the standby replay lag", w.ProgressMsg)
	}
	// It keeps waiting while the standby does not replay.
	time.Sleep(500 * time.Millisecond)
	if got := h.get(t, j.ID); got.State != jobs.Waiting {
		t.Errorf("after 0.5s: state = %s, want still waiting", got.State)
	}
	if got := h.count(t, `SELECT count(*) FROM test_exec WHERE job_id = $1 AND step = 'paced work'`, j.ID); got != 0 {
		t.Errorf("heavy work ran %d times while the standby lagged, want 0", got)
	}

	resumed := time.Now()
	if err := resume(); err != nil {
		t.Fatal(err)
	}
	j = h.waitFinished(t, j.ID)
	if j.State != jobs.Succeeded {
		t.Fatalf("state = %s (%s), want succeeded", j.State, j.LastError)
	}
	if got, want := h.execs(t, j.ID), []string{"ddl", "paced work"}; !slices.Equal(got, want) {
		t.Errorf("executed %v, want %v", got, want)
	}
	var at time.Time
	if err := h.pool.QueryRow(ctx, `SELECT at FROM test_exec WHERE job_id = $1 AND step = 'paced work'`, j.ID).Scan(&at); err != nil {
		t.Fatal(err)
	}
	if at.Before(resumed) {
		t.Errorf("heavy work ran at %s, before replay resumed at %s", at, resumed)
	}
}

// TestPacer_WaitsForADownStandby: with pacer.standby_down: wait, a heavy
// step waits while a standby is down, and its job's progress line says so
// (docs/jobs.md's "waiting: …" promise); with the default, proceed, it goes
// ahead at once. A standby that is down is, as the primary sees it, a
// physical replication slot that no walreceiver streams from: the test
// makes one rather than stopping the package's standby, which the other
// pacer tests need.
func TestPacer_WaitsForADownStandby(t *testing.T) {
	ctx := testCtx(t)
	slot := "test_down_" + pgtest.RandomSuffix()
	admin := pg.Conn(t, "postgres")
	if _, err := admin.Exec(ctx, `SELECT pg_create_physical_replication_slot($1)`, slot); err != nil {
		t.Fatal(err)
	}
	dropSlot := func() error {
		_, err := admin.Exec(context.Background(), `SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots WHERE slot_name = $1`, slot)
		return err
	}
	t.Cleanup(func() {
		if err := dropSlot(); err != nil {
			t.Errorf("drop the slot %s: %v", slot, err)
		}
	})

	proceed := newHarness(t)
	if proceed.pacerCfg.StandbyDown != "proceed" {
		t.Fatalf("default pacer.standby_down = %q, want proceed", proceed.pacerCfg.StandbyDown)
	}
	proceed.startDaemon(t, 1, paced(proceed, 0))
	j := proceed.waitFinished(t, proceed.enqueue(t, jobs.Spec{Type: "heavy", Cluster: "local"}).ID)
	if j.State != jobs.Succeeded {
		t.Fatalf("standby_down: proceed: state = %s (%s), want succeeded while the standby is down", j.State, j.LastError)
	}

	h := newHarness(t)
	h.pacerCfg.StandbyDown = "wait"
	h.startDaemon(t, 1, paced(h, 0))
	j = h.enqueue(t, jobs.Spec{Type: "heavy", Cluster: "local"})
	w := h.waitState(t, j.ID, jobs.Waiting)
	if want := "a standby of cluster local is down (pacer.standby_down: wait)"; !strings.Contains(w.ProgressMsg, want) {
		t.Errorf("waiting job: progress_msg = %q, want it to contain %q", w.ProgressMsg, want)
	}
	time.Sleep(500 * time.Millisecond)
	if got := h.count(t, `SELECT count(*) FROM test_exec WHERE job_id = $1 AND step = 'paced work'`, j.ID); got != 0 {
		t.Errorf("heavy work ran %d times while a standby was down, want 0", got)
	}
	if err := dropSlot(); err != nil {
		t.Fatal(err)
	}
	if j = h.waitFinished(t, j.ID); j.State != jobs.Succeeded {
		t.Fatalf("after the standby left: state = %s (%s), want succeeded", j.State, j.LastError)
	}
}

// TestPacer_HeavyDDLSlotsAcrossDaemons: with one heavy DDL slot, heavy
// steps of two daemons take turns; the one waiting says why.
func TestPacer_HeavyDDLSlotsAcrossDaemons(t *testing.T) {
	h := newHarness(t)
	h.pacerCfg.HeavyDDLSlots = 1
	a := h.enqueue(t, jobs.Spec{Type: "heavy", Cluster: "local"})
	b := h.enqueue(t, jobs.Spec{Type: "heavy", Cluster: "local"})
	// One worker each: each daemon takes one of the jobs.
	h.startDaemon(t, 1, paced(h, time.Second))
	h.startDaemon(t, 1, paced(h, time.Second))

	var sawWaiting string
	deadline := time.Now().Add(30 * time.Second)
	for {
		ja, jb := h.get(t, a.ID), h.get(t, b.ID)
		for _, j := range []jobs.Job{ja, jb} {
			if j.State == jobs.Waiting && strings.Contains(j.ProgressMsg, "heavy DDL step(s) already in flight") {
				sawWaiting = j.ProgressMsg
			}
		}
		if jobs.Finished(ja.State) && jobs.Finished(jb.State) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("jobs not finished after 30s: %s, %s", ja.State, jb.State)
		}
		time.Sleep(20 * time.Millisecond)
	}
	if sawWaiting == "" {
		t.Error("no job was seen waiting for a heavy DDL slot")
	}
	for _, id := range []int64{a.ID, b.ID} {
		if j := h.get(t, id); j.State != jobs.Succeeded {
			t.Errorf("job %d: state = %s (%s), want succeeded", id, j.State, j.LastError)
		}
	}
	if got := h.count(t, `SELECT count(*) FROM test_slot`); got != 2 {
		t.Errorf("slot holdings = %d, want 2", got)
	}
	if got := h.count(t, `SELECT count(*) FROM test_slot x JOIN test_slot y
		ON x.job_id < y.job_id AND x.held_from < y.held_until AND y.held_from < x.held_until`); got != 0 {
		t.Errorf("overlapping slot holdings = %d, want 0", got)
	}
	if got := h.count(t, `SELECT count(DISTINCT worker) FROM test_exec WHERE step = 'paced work'`); got != 2 {
		t.Errorf("daemons that held the slot = %d, want 2", got)
	}
}

// TestPacer_GoesAheadDuringATimedCheckpoint: a heavy step does not wait for
// a timed checkpoint, which spreads its writes over most of
// checkpoint_timeout (a forced checkpoint the step requests makes the
// checkpointer finish it at full speed anyway): it goes ahead while that
// checkpoint is still running.
func TestPacer_GoesAheadDuringATimedCheckpoint(t *testing.T) {
	if testing.Short() {
		t.Skip("waits for a timed checkpoint")
	}
	ctx := testCtx(t)
	c, err := pgtest.Start(ctx, pgtest.Options{Settings: map[string]string{
		"checkpoint_timeout": "30s", "checkpoint_completion_target": "0.9"}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Close)
	cl, err := cluster.New("local", c.PrimaryDSN("postgres"), nil, pgtest.Logger(t))
	if err != nil {
		t.Fatal(err)
	}
	reg := cluster.NewRegistry()
	reg.Put(cl)
	t.Cleanup(reg.Close)
	admin, err := cl.Admin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	// Dirty the buffers, then wait for the next timed checkpoint to pace
	// itself through them.
	if _, err := admin.Exec(ctx, `CHECKPOINT; CREATE TABLE public.dirty AS SELECT g, repeat('x', 500) AS pad FROM generate_series(1, 60000) g`); err != nil {
		t.Fatal(err)
	}
	var timed int64
	for deadline := time.Now().Add(90 * time.Second); ; {
		h, err := cl.Probe(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if h.CheckpointInProgress && !h.CheckpointUnpaced {
			timed = h.CheckpointsTimed
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("no timed checkpoint pacing itself within 90 s")
		}
		time.Sleep(20 * time.Millisecond)
	}

	budget := config.Default().Pacer
	budget.PollInterval = config.Duration(50 * time.Millisecond)
	budget.MaxCheckpointWait = config.Duration(time.Hour) // were it waited for, it would be waited out
	pacer := jobs.NewPacer(reg, func(string) config.PacerConfig { return budget }, admin, pgtest.Logger(t), nil)
	// What the pacer says while a step waits: nothing, if it goes ahead.
	// (Whether the checkpoint is still running afterwards depends on the
	// machine's load: a loaded one may finish it meanwhile.)
	var waited []string
	release, err := pacer.Acquire(ctx, "local", jobs.Heavy, func(reason string) { waited = append(waited, reason) })
	if err != nil {
		t.Fatal(err)
	}
	release()
	if len(waited) > 0 {
		t.Errorf("the heavy step waited during a timed checkpoint (timed checkpoints before: %d): %q", timed, waited)
	}
}
