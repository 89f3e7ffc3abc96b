// Package move moves a tenant online to another cluster: its schema is
// recreated empty on the target (pg_dump --schema-only, restored in the
// tenant's agent session), its rows follow by logical replication (a
// publication on the source, a subscription on the target whose apply
// worker runs as a role without privilege), and the cut-over pauses the
// tenant's pool at its pooler, stops writes on the source, waits for the
// target to have everything, sets the sequences and switches the catalog and
// the pooler entry in one step before resuming. The source copy stays
// locked for the drop retention, then the usual purge removes it.
//
// It also copies a tenant as it was at a past instant (fork.go): into a new
// tenant (a fork), or back into the tenant itself (a rewind), reading the
// past from the cluster's backup restored into a scratch instance.
//
// It owns the move, fork and rewind jobs and the objects named pgt_move_<id> (publication,
// slot, subscription, its role) and pgtenant_move.t_<id> (the sentinel
// table); it never runs SQL that can set off tenant code in an admin
// session (docs/SECURITY.md). Logical replication of its own lives here,
// apart from the analytics mirror's.
package move

import (
	"cmp"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"os/exec"
	"path/filepath"
	"strings"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgtenant/pgtenant/internal/backup"
	"github.com/pgtenant/pgtenant/internal/catalog"
	"github.com/pgtenant/pgtenant/internal/cluster"
	"github.com/pgtenant/pgtenant/internal/config"
	"github.com/pgtenant/pgtenant/internal/credentials"
	"github.com/pgtenant/pgtenant/internal/jobs"
	"github.com/pgtenant/pgtenant/internal/migrate"
	"github.com/pgtenant/pgtenant/internal/pooler"
	"github.com/pgtenant/pgtenant/internal/provision"
	"github.com/pgtenant/pgtenant/internal/purge"
	"github.com/pgtenant/pgtenant/internal/sandbox"
	"github.com/pgtenant/pgtenant/internal/templates"
	"github.com/pgtenant/pgtenant/internal/tenant"
)

// SentinelSchema holds, on both clusters, one table per move in flight
// (t_<id>, admin-owned): the row the cut-over writes on the source last and
// waits for on the target, which logical replication applies in commit order.
const SentinelSchema = "pgtenant_move"

// Name is the publication, slot, subscription and subscription owner of a
// tenant's move.
func Name(id string) string { return "pgt_move_" + id }

// ErrRefused is a move that cannot be done, said before anything is copied.
var ErrRefused = errors.New("move refused")

// catchUpTimeout is CatchUpTimeout's default (tests shorten it).
var catchUpTimeout = 10 * time.Minute

// ErrBehind is a move that gave up before its cut-over: the target applies
// the tenant's writes more slowly than the tenant writes them.
var ErrBehind = errors.New("move cannot catch up")

// ErrRolloutBusy says a rollout is migrating the tenant now: a move may
// be started again once it is done (a conflict, not a refusal).
var ErrRolloutBusy = errors.New("a rollout is migrating the tenant")

type args struct {
	Tenant string `json:"tenant"`
	To     string `json:"to"`
	// Tier: the move carries a tier change (provision.SetTier): the
	// target's role gets that tier's limits and the switch records it.
	Tier string `json:"tier,omitempty"`
}

// state is what the job keeps between steps.
type state struct {
	From string `json:"from"`
	// Checked: the refusals were checked and the target found free; from
	// here on the target's copy is this move's.
	Checked bool `json:"checked"`
	// Triggers are the tenant's ENABLE ALWAYS / ENABLE REPLICA triggers,
	// disabled on the target while the subscription applies (they would
	// fire in the apply worker) and enabled back at the cut-over.
	Triggers []trigger `json:"triggers,omitempty"`
	PauseMS  int64     `json:"pause_ms,omitempty"`
	// LeftoverJob: the purge job of the copy an earlier move left on the
	// target, cancelled by check, which purges that copy itself (see
	// purgeLeftover); kept so that a check resumed after a crash goes on
	// with it.
	LeftoverJob int64 `json:"leftover_job,omitempty"`
}

type trigger struct {
	Schema, Table, Name string
	Enabled             string // A (always) or R (replica)
}

// Service moves tenants.
type Service struct {
	Store    *catalog.Store
	Clusters *cluster.Registry
	Runner   *jobs.Runner
	Agents   *sandbox.Agents
	Drop     config.DropConfig // the source copy is kept for its retention, then dropped in batches
	Logger   *slog.Logger
	Poolers  *pooler.Set
	// Backups, Provision and Lifecycle serve forks and rewinds (fork.go):
	// the clusters' repositories, the making of the new tenant, and its
	// suspend, resume and drop. Backups may be nil: no fork nor rewind.
	// Provision also gives a tier change's limits (StartTierChange).
	Backups   *backup.Service
	Provision *provision.Service
	Lifecycle *purge.Service
	// PauseTimeout bounds the wait for the tenant's pool to pause (in
	// session mode its clients must disconnect: past it their sessions
	// are ended, see pause); SwitchTimeout the wait
	// for the target to apply the source's last write while paused (at
	// most what the pooler's query_wait_timeout leaves: switchWait);
	// CopyTimeout the initial copy; CatchUpTimeout the unpaused catch-up
	// before the pause (then the move pauses, or fails if the target is
	// too far behind: see cutover). Defaults: 10 s, 30 s, 6 h, 1 min.
	PauseTimeout, SwitchTimeout, CopyTimeout, CatchUpTimeout time.Duration
}

// switchWait is how long the paused move waits for the target to apply
// the source's last write: limit, but no longer than the pooler keeps a
// queued client waiting (query_wait_timeout, counted from the pause) less
// clientMargin, so that the move fails and the tenant resumes before a
// client waiting since the pause gets an error.
func switchWait(limit time.Duration, front *pooler.Front, pausing time.Time) time.Duration {
	if front == nil || front.Settings.QueryWaitTimeout <= 0 {
		return limit
	}
	return max(min(limit, front.Settings.QueryWaitTimeout-clientMargin-time.Since(pausing)), time.Second)
}

// clientMargin is the time switchWait leaves for the resume before a
// queued client's wait ends.
const clientMargin = 5 * time.Second

// Spec is the job that moves tenant id to cluster to.
func Spec(t catalog.Tenant, to string) jobs.Spec {
	return jobs.Spec{Type: jobs.TenantMove, Key: "move:" + t.ID, TargetKind: "tenant", Target: t.ID, Cluster: to,
		Args: args{Tenant: t.ID, To: to}, MaxAttempts: 20, Priority: 1}
}

// Start checks and enqueues a move. A rollout migrating the tenant at this
// moment makes it a conflict (retry later); a rollout that comes later
// skips the tenant while its move is unfinished (internal/migrate).
func (s *Service) Start(ctx context.Context, id, to string) (jobs.Job, error) {
	return s.start(ctx, id, to, "")
}

// StartTierChange starts the move that carries tenant id to the cluster
// its new tier needs (provision.SetTier chose it): at the switch the
// tenant takes tier.
func (s *Service) StartTierChange(ctx context.Context, id, to, tier string) (jobs.Job, error) {
	return s.start(ctx, id, to, tier)
}

func (s *Service) start(ctx context.Context, id, to, tier string) (jobs.Job, error) {
	t, err := s.Store.GetTenant(ctx, nil, id)
	if err != nil {
		return jobs.Job{}, err
	}
	if t.State != catalog.StateActive {
		return jobs.Job{}, fmt.Errorf("%w: tenant %s is %s; only active tenants move", catalog.ErrConflict, id, t.State)
	}
	if t.Cluster == to {
		return jobs.Job{}, fmt.Errorf("%w: tenant %s is on cluster %s already", catalog.ErrConflict, id, to)
	}
	if _, err := s.Clusters.Get(to); err != nil {
		return jobs.Job{}, err
	}
	if len(t.Pins) > 0 {
		c, err := s.Store.GetCluster(ctx, to)
		if err != nil {
			return jobs.Job{}, err
		}
		if missing := tenant.MissingPins(c.Labels, t.Pins); len(missing) > 0 {
			return jobs.Job{}, fmt.Errorf("%w: tenant %s is pinned to clusters labelled %s, and %s lacks %s: label it (`pgtenant cluster set %s --label %s`), "+
				"or change the tenant's labels (`pgtenant tenant set %s --label …`)", catalog.ErrConflict, id, strings.Join(t.Pins, ","), to,
				strings.Join(missing, ","), to, missing[0], id)
		}
	}
	// The rollout's per-tenant lock, in the catalog: held only while the
	// job row is written, so that a rollout either had the tenant before
	// (a conflict here) or sees the move's job after.
	conn, err := s.Store.Pool().Acquire(ctx)
	if err != nil {
		return jobs.Job{}, err
	}
	defer conn.Release()
	var ok bool
	if err := conn.QueryRow(ctx, `SELECT pg_try_advisory_lock($1, hashtext($2))`, migrate.TenantLockSpace, id).Scan(&ok); err != nil {
		return jobs.Job{}, err
	}
	if !ok {
		return jobs.Job{}, fmt.Errorf("%w: %w: a rollout is migrating tenant %s; move it once that is done", catalog.ErrConflict, ErrRolloutBusy, id)
	}
	defer conn.Exec(context.WithoutCancel(ctx), `SELECT pg_advisory_unlock($1, hashtext($2))`, migrate.TenantLockSpace, id)
	spec := Spec(t, to)
	spec.Args = args{Tenant: id, To: to, Tier: tier}
	j, err := s.Runner.Enqueue(ctx, s.Store.Pool(), spec)
	if err != nil {
		return j, err
	}
	if j.Target == id && j.Cluster != to {
		return j, fmt.Errorf("%w: tenant %s is moving to %s already (job %d)", catalog.ErrConflict, id, j.Cluster, j.ID)
	}
	return j, nil
}

// Handler is the job handler of Job.
func (s *Service) Handler() jobs.Handler {
	return jobs.Handler{
		Steps: func(j *jobs.Job) ([]jobs.Step, error) {
			var a args
			if err := j.DecodeArgs(&a); err != nil {
				return nil, err
			}
			m := &mover{s: s, a: a}
			return []jobs.Step{
				{Name: "check", Run: m.check},
				{Name: "roles", Run: step("roles", m.load, m.roles)},
				{Name: "schema", Run: step("schema", m.load, m.schema)},
				{Name: "subscribe", Run: step("subscribe", m.load, m.subscribe)},
				{Name: "copy", Run: step("copy", m.load, m.copy)},
				{Name: "cutover", Run: step("cutover", m.load, m.cutover)},
				{Name: "finish", Run: step("finish", m.load, m.finish)},
			}, nil
		},
		Cleanup: func(ctx context.Context, r *jobs.Run) error {
			var a args
			if err := r.Job.DecodeArgs(&a); err != nil {
				return err
			}
			m := &mover{s: s, a: a}
			return m.cleanup(ctx, r)
		},
	}
}

// crashHook is set by the tests only (export_test.go): called at the
// points a daemon is killed at in them, it returns once the daemon is
// stopping, and the step returns then, cleaning up nothing.
var crashHook atomic.Pointer[func(ctx context.Context, point string) error]

// crashPoint is a point where the tests kill the daemon.
func crashPoint(ctx context.Context, point string) error {
	if f := crashHook.Load(); f != nil {
		return (*f)(ctx, point)
	}
	return nil
}

type mover struct {
	s *Service
	a args
}

// env is what every step after check works with.
type env struct {
	t        catalog.Tenant
	st       state
	src, dst *cluster.Cluster
	role     string
	switched bool // the catalog has the tenant on the target
	// logins are the tenant's extra logins: their roles follow its own
	// (made NOLOGIN on the target, locked out on the source, let in at
	// the switch).
	logins []catalog.Login
}

func (m *mover) load(ctx context.Context, r *jobs.Run) (*env, error) {
	e := &env{role: tenant.PhysicalName(m.a.Tenant)}
	var err error
	if e.t, err = m.s.Store.GetTenant(ctx, nil, m.a.Tenant); err != nil {
		return nil, err
	}
	if err := r.LoadData(&e.st); err != nil {
		return nil, err
	}
	if e.logins, err = m.s.Store.Logins(ctx, nil, m.a.Tenant); err != nil {
		return nil, err
	}
	if e.st.From == "" {
		return nil, jobs.Permanent(fmt.Errorf("move of tenant %s: no source recorded", m.a.Tenant))
	}
	e.switched = e.t.Cluster == m.a.To
	if e.src, err = m.s.Clusters.Get(e.st.From); err != nil {
		return nil, err
	}
	if e.dst, err = m.s.Clusters.Get(m.a.To); err != nil {
		return nil, err
	}
	return e, nil
}

// step makes fn a job step: the tests' crash point, then the job's state
// loaded by load (a move's, a fork's) for fn.
func step[E any](name string, load func(context.Context, *jobs.Run) (E, error), fn func(context.Context, *jobs.Run, E) error) func(context.Context, *jobs.Run) error {
	return func(ctx context.Context, r *jobs.Run) error {
		if err := crashPoint(ctx, name); err != nil {
			return err
		}
		e, err := load(ctx, r)
		if err != nil {
			return err
		}
		return fn(ctx, r, e)
	}
}

// check refuses, before anything is made, what the move cannot carry.
func (m *mover) check(ctx context.Context, r *jobs.Run) error {
	var st state
	if err := r.LoadData(&st); err != nil {
		return err
	}
	t, err := m.s.Store.GetTenant(ctx, nil, m.a.Tenant)
	if err != nil {
		return jobs.Permanent(err)
	}
	if st.Checked {
		return nil
	}
	if t.State != catalog.StateActive {
		return jobs.Permanent(fmt.Errorf("%w: tenant %s is %s; only active tenants move", ErrRefused, t.ID, t.State))
	}
	if t.Cluster == m.a.To {
		return jobs.Permanent(fmt.Errorf("%w: tenant %s is on cluster %s already", ErrRefused, t.ID, m.a.To))
	}
	src, err := m.s.Clusters.Get(t.Cluster)
	if err != nil {
		return err
	}
	dst, err := m.s.Clusters.Get(m.a.To)
	if err != nil {
		return jobs.Permanent(err)
	}
	left, hint, err := m.leftoverJob(ctx, st, t)
	if err != nil {
		return err
	}
	reasons, err := Refusals(ctx, src, dst, t, hint)
	if err != nil {
		return err
	}
	if len(reasons) == 0 && left.ID != 0 {
		if err := m.purgeLeftover(ctx, r, &st, t, left); err != nil {
			return err
		}
		reasons, err = Refusals(ctx, src, dst, t, "the purge of the earlier move's leftover left it: drop it by hand")
		if err != nil {
			return err
		}
	}
	if len(reasons) > 0 {
		return jobs.Permanent(fmt.Errorf("%w: tenant %s cannot move to %s: %s", ErrRefused, t.ID, m.a.To, strings.Join(reasons, "; ")))
	}
	st.From, st.Checked = t.Cluster, true
	return r.SaveData(ctx, st)
}

// leftoverJob finds the purge job (purge.LeftoverSpec) of the copy of
// tenant t that an earlier move left on the target, when the tenant moves
// back to it within drop.retention and that job is pending: the copy is
// the same tenant's data, older, locked out since, and the move purges
// it first (purgeLeftover). The hint returned is Refusals' for a copy
// there is no such job of: "" when there is one.
func (m *mover) leftoverJob(ctx context.Context, st state, t catalog.Tenant) (jobs.Job, string, error) {
	pool := m.s.Store.Pool()
	if st.LeftoverJob != 0 { // a check resumed: it had begun the purge
		j, err := jobs.Get(ctx, pool, st.LeftoverJob)
		return j, "", err
	}
	js, err := jobs.List(ctx, pool, jobs.Filter{Type: jobs.TenantPurge, TargetKind: "tenant", Target: t.ID})
	if err != nil {
		return jobs.Job{}, "", err
	}
	key := purge.LeftoverKey(t.ID, m.a.To)
	var left jobs.Job
	for _, j := range js { // newest first
		if j.Key == key {
			left = j
			break
		}
	}
	switch {
	case left.ID == 0 || left.State == jobs.Succeeded:
		return jobs.Job{}, fmt.Sprintf("pgtenant has no purge of it pending, so it is no leftover of the tenant's moves that pgtenant purges: drop it by hand (role %s and its database or schema, role %s) once you know it is not needed",
			tenant.PhysicalName(t.ID), tenant.AgentRole(t.ID)), nil
	case jobs.Finished(left.State):
		how := "failed"
		if left.State == jobs.Cancelled {
			how = "was cancelled"
		}
		return jobs.Job{}, fmt.Sprintf("it is the leftover of an earlier move, whose purge (job %d) %s: `pgtenant job retry %d` purges it, then move the tenant again",
			left.ID, how, left.ID), nil
	case m.s.Lifecycle == nil:
		return jobs.Job{}, fmt.Sprintf("it is the leftover of an earlier move, purged by job %d once its retention ends (%s)",
			left.ID, left.RunAfter.UTC().Format(time.RFC3339)), nil
	}
	return left, "", nil
}

// leftoverWait bounds the wait for a running purge of the target's
// leftover to stop once cancelled (it stops at its next lease renewal).
const leftoverWait = time.Minute

// purgeLeftover purges the copy of tenant t an earlier move left on the
// target, found by leftoverJob: its purge job is cancelled first (it must
// not run while this move builds the tenant there), then its steps run in
// this job, and the tenant gets a move_leftover_purged event. The job is
// recorded in st first: a check resumed after a crash goes on with it.
func (m *mover) purgeLeftover(ctx context.Context, r *jobs.Run, st *state, t catalog.Tenant, left jobs.Job) error {
	pool := m.s.Store.Pool()
	if st.LeftoverJob == 0 {
		st.LeftoverJob = left.ID
		if err := r.SaveData(ctx, *st); err != nil {
			return err
		}
	}
	left, err := jobs.Cancel(ctx, pool, left.ID)
	if err != nil && !errors.Is(err, jobs.ErrWrongState) {
		return err
	}
	// Cancelled while running, it stops at its next lease renewal; queued,
	// it runs no step more.
	for deadline := time.Now().Add(leftoverWait); left.State == jobs.Running || left.State == jobs.Waiting; {
		if time.Now().After(deadline) {
			return fmt.Errorf("the purge job %d of tenant %s's leftover on %s still runs after its cancel", left.ID, t.ID, m.a.To)
		}
		r.Progress(ctx, 0, 1, fmt.Sprintf("waiting for the cancelled purge job %d of the leftover on %s to stop", left.ID, m.a.To))
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(200 * time.Millisecond):
		}
		if left, err = jobs.Get(ctx, pool, left.ID); err != nil {
			return err
		}
	}
	r.Progress(ctx, 0, 1, fmt.Sprintf("purging the leftover of an earlier move of tenant %s on %s first (its purge job %d cancelled)", t.ID, m.a.To, left.ID))
	if err := m.s.Lifecycle.PurgeLeftover(ctx, r, left); err != nil {
		return fmt.Errorf("purge tenant %s's leftover on %s: %w", t.ID, m.a.To, err)
	}
	m.s.Logger.Info("leftover of an earlier move purged for the move back", "component", "move", "tenant", t.ID, "cluster", m.a.To, "purge_job", left.ID)
	return m.s.Store.AddEvent(ctx, pool, t.ID, "move_leftover_purged", map[string]any{"cluster": m.a.To, "job": r.Job.ID, "purge_job": left.ID})
}

// Refusals lists why tenant t cannot move from src to dst (none: it can).
// copyHint says what to do about a copy of the tenant dst has already;
// "": it is an earlier move's leftover that the move purges first
// (leftoverJob), not a reason.
func Refusals(ctx context.Context, src, dst *cluster.Cluster, t catalog.Tenant, copyHint string) ([]string, error) {
	var out []string
	admin, err := src.Admin(ctx)
	if err != nil {
		return nil, err
	}
	var level string
	if err := admin.QueryRow(ctx, `SELECT pg_catalog.current_setting('wal_level')`).Scan(&level); err != nil {
		return nil, cluster.Classify(err)
	}
	if level != "logical" {
		out = append(out, fmt.Sprintf("cluster %s has wal_level=%s; a move replicates logically: set wal_level=logical (and max_replication_slots, max_wal_senders) and restart it", src.Name(), level))
	}
	// While its quota is enforced, a tenant's objects belong to its lock
	// role (internal/quota), which the target has not got.
	if locked, err := quotaEnforced(ctx, src, t.ID); err != nil {
		return nil, err
	} else if locked != "" {
		out = append(out, locked)
	}
	role := tenant.PhysicalName(t.ID)
	conn, err := src.Connect(ctx, t.Database)
	if err != nil {
		return nil, err
	}
	defer conn.Close(context.WithoutCancel(ctx))
	schemas, err := tenantSchemas(ctx, conn, t)
	if err != nil {
		return nil, err
	}
	var los int
	if err := conn.QueryRow(ctx, `SELECT pg_catalog.count(*) FROM pg_catalog.pg_largeobject_metadata
		WHERE $1 = 'database' OR lomowner = (SELECT oid FROM pg_catalog.pg_roles WHERE rolname = $2)`, t.Mode, role).Scan(&los); err != nil {
		return nil, cluster.Classify(err)
	}
	if los > 0 {
		out = append(out, fmt.Sprintf("it has %d large objects, which logical replication does not carry: move their contents to bytea columns", los))
	}
	if t.Mode == tenant.ModeDatabase {
		_, refused, err := carriedExtensions(ctx, conn, dst)
		if err != nil {
			return nil, err
		}
		out = append(out, refused...)
	}
	rows, err := conn.Query(ctx, `SELECT pg_catalog.format('%I.%I', n.nspname, c.relname),
			CASE WHEN c.relkind = 'f' THEN 'is a foreign table (not replicated)'
			     WHEN c.relkind = 'm' THEN 'is a materialized view (not replicated)'
			     WHEN c.relpersistence = 'u' THEN 'is unlogged (not replicated)'
			     WHEN c.relforcerowsecurity THEN 'is under FORCE ROW LEVEL SECURITY, which neither the copy nor the apply worker may write through (PostgreSQL refuses it): NO FORCE it for the move'
			     ELSE 'has no primary key or replica identity: its updates and deletes could not be replicated (and would fail on the source during the move); add a primary key or set REPLICA IDENTITY FULL'
			END
		FROM pg_catalog.pg_class c JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace
		WHERE n.nspname = ANY($1) AND (c.relkind IN ('f', 'm') OR (c.relkind = 'r' AND (c.relpersistence = 'u' OR c.relforcerowsecurity
		   OR c.relreplident = 'n'
		   OR (c.relreplident = 'd' AND NOT EXISTS (SELECT 1 FROM pg_catalog.pg_index i WHERE i.indrelid = c.oid AND i.indisprimary)))))
		ORDER BY 1 LIMIT 20`, schemas)
	if err != nil {
		return nil, cluster.Classify(err)
	}
	type bad struct{ rel, why string }
	bads, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (bad, error) {
		var b bad
		return b, r.Scan(&b.rel, &b.why)
	})
	if err != nil {
		return nil, cluster.Classify(err)
	}
	for _, b := range bads {
		out = append(out, fmt.Sprintf("table %s %s", b.rel, b.why))
	}
	// The target must be free: no database or role of the tenant's name
	// (but an earlier move's leftover whose purge is pending: check purges
	// it first, see leftoverJob), and in schema mode the template's shared
	// database built there.
	dadmin, err := dst.Admin(ctx)
	if err != nil {
		return nil, err
	}
	var hasRole, hasDB, hasShared bool
	if err := dadmin.QueryRow(ctx, `SELECT
			EXISTS (SELECT 1 FROM pg_catalog.pg_roles WHERE rolname = $1),
			EXISTS (SELECT 1 FROM pg_catalog.pg_database WHERE datname = $1),
			EXISTS (SELECT 1 FROM pg_catalog.pg_database WHERE datname = $2)`,
		role, t.Database).Scan(&hasRole, &hasDB, &hasShared); err != nil {
		return nil, cluster.Classify(err)
	}
	if copyHint != "" && (hasRole || (t.Mode == tenant.ModeDatabase && hasDB)) {
		out = append(out, fmt.Sprintf("cluster %s still has a copy of the tenant (role or database %s): %s", dst.Name(), role, copyHint))
	}
	if t.Mode == tenant.ModeSchema && !hasShared {
		out = append(out, fmt.Sprintf("template %s is not built on cluster %s (no %s)", t.Template, dst.Name(), t.Database))
	}
	return out, nil
}

// quotaEnforced says, when tenant id's storage quota is enforced on cl,
// why its objects cannot be moved or swapped ("" when it is not): they
// belong to its lock role (internal/quota) until it is back under quota.
func quotaEnforced(ctx context.Context, cl *cluster.Cluster, id string) (string, error) {
	admin, err := cl.Admin(ctx)
	if err != nil {
		return "", err
	}
	var locked bool
	if err := admin.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM pg_catalog.pg_roles WHERE rolname = $1)`, tenant.LockRole(id)).Scan(&locked); err != nil {
		return "", cluster.Classify(err)
	}
	if !locked {
		return "", nil
	}
	return fmt.Sprintf("its storage quota is enforced (its objects belong to role %s until it is back under its quota, or its tier's quota is raised)", tenant.LockRole(id)), nil
}

// tenantSchemas are the schemas a move carries: the tenant's own (schema
// mode), or every schema of its database but the system's and pgtenant's.
func tenantSchemas(ctx context.Context, conn *pgx.Conn, t catalog.Tenant) ([]string, error) {
	if t.Mode == tenant.ModeSchema {
		return []string{tenant.PhysicalName(t.ID)}, nil
	}
	var out []string
	err := conn.QueryRow(ctx, `SELECT coalesce(pg_catalog.array_agg(nspname::text), '{}') FROM pg_catalog.pg_namespace
		WHERE nspname NOT IN ('pg_catalog', 'information_schema', $1, $2) AND nspname NOT LIKE 'pg\_toast%' AND nspname NOT LIKE 'pg\_temp\_%'`,
		tenant.MarkerSchema, SentinelSchema).Scan(&out)
	return out, cluster.Classify(err)
}

// roles makes the tenant's role on the target with the source's SCRAM
// verifier (the same password works), connection limit and tier settings,
// NOLOGIN until the switch, and its agent.
func (m *mover) roles(ctx context.Context, r *jobs.Run, e *env) error {
	if e.switched {
		return nil
	}
	sadmin, err := e.src.Admin(ctx)
	if err != nil {
		return err
	}
	var verifier string
	var connLimit int
	var settings []string
	if err := sadmin.QueryRow(ctx, `SELECT coalesce(a.rolpassword, ''), a.rolconnlimit,
			coalesce((SELECT s.setconfig FROM pg_catalog.pg_db_role_setting s WHERE s.setrole = a.oid AND s.setdatabase = 0), '{}')
		FROM pg_catalog.pg_authid a WHERE a.rolname = $1`, e.role).Scan(&verifier, &connLimit, &settings); err != nil {
		return fmt.Errorf("read role %s on %s: %w", e.role, e.src.Name(), cluster.Classify(err))
	}
	if !pooler.ValidVerifier(verifier) {
		return jobs.Permanent(fmt.Errorf("%w: tenant %s's role has no SCRAM-SHA-256 password: rotate it (`pgtenant tenant password %s`) and move again", ErrRefused, e.t.ID, e.t.ID))
	}
	dadmin, err := e.dst.Admin(ctx)
	if err != nil {
		return err
	}
	if err := cluster.CreateRole(ctx, dadmin, e.role); err != nil {
		return err
	}
	id := cluster.Ident(e.role)
	var sql strings.Builder
	if e.t.Mode == tenant.ModeSchema {
		// First in the batch: it takes the shared database's lock.
		sql.WriteString(templates.ConnectSQL(true, e.t.Template, e.role))
	}
	fmt.Fprintf(&sql, "ALTER ROLE %s NOLOGIN CONNECTION LIMIT %d PASSWORD %s;\nALTER ROLE %s RESET ALL;\n", id, connLimit, cluster.Literal(verifier), id)
	// Only the settings a tier (or schema mode) gives: what else a tenant
	// put on its own role is not carried, and never set by the admin.
	for _, kv := range settings {
		k, v, ok := strings.Cut(kv, "=")
		if !ok || !copiedSettings[k] {
			continue
		}
		fmt.Fprintf(&sql, "ALTER ROLE %s SET %s = %s;\n", id, k, cluster.Literal(v))
	}
	if e.t.Mode == tenant.ModeSchema {
		// As provisioning sets it: a schema tenant finds its tables by its role.
		fmt.Fprintf(&sql, "ALTER ROLE %s SET search_path = %s;\n", id, id)
	}
	if m.a.Tier != "" {
		sql.WriteString(m.s.Provision.TierSQL(e.t.ID, m.a.Tier))
	}
	if _, err := dadmin.Exec(ctx, sql.String()); err != nil {
		return fmt.Errorf("make role %s on %s: %w", e.role, e.dst.Name(), cluster.Classify(err))
	}
	if err := m.loginRoles(ctx, e, sadmin, dadmin); err != nil {
		return err
	}
	return m.s.Agents.EnsureRole(ctx, dadmin, e.t.ID)
}

// loginRoles makes the roles of the tenant's extra logins on the target,
// NOLOGIN until the switch, with their passwords (verifiers) on the
// source and the tier the tenant has there (or takes with the move).
func (m *mover) loginRoles(ctx context.Context, e *env, sadmin, dadmin *pgxpool.Pool) error {
	tier := e.t.Tier
	if m.a.Tier != "" {
		tier = m.a.Tier
	}
	for _, l := range e.logins {
		role := tenant.LoginRole(e.t.ID, l.Name)
		var verifier string
		if err := sadmin.QueryRow(ctx, `SELECT coalesce(rolpassword, '') FROM pg_catalog.pg_authid WHERE rolname = $1`, role).Scan(&verifier); err != nil {
			return fmt.Errorf("read role %s on %s: %w", role, e.src.Name(), cluster.Classify(err))
		}
		if !pooler.ValidVerifier(verifier) {
			verifier = "" // none (or not SCRAM): the target's login gets none either; rotate it
		}
		if err := cluster.CreateRole(ctx, dadmin, role); err != nil {
			return err
		}
		if err := cluster.ExecLockBounded(ctx, dadmin, 10*time.Second, credentials.LoginRoleSQL(e.t, l, verifier, m.s.Provision.Tiers[tier], false)); err != nil {
			return fmt.Errorf("make role %s on %s: %w", role, e.dst.Name(), err)
		}
	}
	return nil
}

var copiedSettings = map[string]bool{
	"statement_timeout": true, "idle_in_transaction_session_timeout": true, "work_mem": true, "temp_file_limit": true,
}

// schema recreates the tenant's schema, empty, on the target: the storage
// as provisioning makes it (admin-owned database, or the schema in the
// shared database), then the source's pg_dump --schema-only run in the
// tenant's agent session as the tenant's role, the tenant's ALWAYS/REPLICA
// triggers disabled and the version marker written, in one transaction:
// the marker on the target says the restore is complete.
func (m *mover) schema(ctx context.Context, r *jobs.Run, e *env) error {
	if e.switched {
		return nil
	}
	marker, err := readMarker(ctx, e.src, e.t)
	if err != nil {
		return err
	}
	if have, err := readMarker(ctx, e.dst, e.t); err == nil && have == marker {
		return nil
	}
	dadmin, err := e.dst.Admin(ctx)
	if err != nil {
		return err
	}
	id := cluster.Ident(e.role)
	if e.t.Mode == tenant.ModeDatabase {
		tier := e.t.Tier
		if m.a.Tier != "" {
			tier = m.a.Tier
		}
		if err := makeDatabase(ctx, r, e.dst, e.t, m.s.Provision.Tiers[tier], hasPrewarm(ctx, e.src, e.t.Database)); err != nil {
			return err
		}
	} else {
		if err := sandbox.GrantConnect(ctx, dadmin, sandbox.TargetOf(e.t)); err != nil {
			return err
		}
		conn, err := e.dst.Connect(ctx, e.t.Database)
		if err != nil {
			return err
		}
		// The schema is empty or half-restored by an interrupted attempt
		// (the restore is one transaction: empty), and the tenant has
		// never logged in on this cluster.
		_, err = conn.Exec(ctx, fmt.Sprintf("DROP SCHEMA IF EXISTS %[1]s CASCADE; CREATE SCHEMA %[1]s AUTHORIZATION %[1]s", id))
		conn.Close(context.WithoutCancel(ctx))
		if err != nil {
			return cluster.Classify(err)
		}
	}
	r.Progress(ctx, 0, 1, "dumping the schema of tenant "+e.t.ID+" on "+e.src.Name())
	dump, err := m.dump(ctx, e)
	if err != nil {
		return err
	}
	r.Progress(ctx, 0, 1, "restoring it on "+e.dst.Name()+" in the tenant's agent session")
	sess, err := m.s.Agents.Open(ctx, e.dst, sandbox.TargetOf(e.t), "pgtenant move")
	if err != nil {
		return err
	}
	defer sess.Close(context.WithoutCancel(ctx))
	tx, err := sess.Conn().Begin(ctx)
	if err != nil {
		return cluster.Classify(err)
	}
	defer tx.Rollback(context.WithoutCancel(ctx))
	if _, err := tx.Exec(ctx, "SET LOCAL ROLE "+id+";\n"+dump); err != nil {
		return jobs.Permanent(fmt.Errorf("restore the schema of tenant %s on %s: %w", e.t.ID, e.dst.Name(), cluster.Classify(err)))
	}
	// pg_dump leaves the search path empty for the rest of the session.
	if _, err := tx.Exec(ctx, "SET LOCAL search_path = pg_catalog, pg_temp"); err != nil {
		return cluster.Classify(err)
	}
	schemas := []string{e.role}
	if e.t.Mode == tenant.ModeDatabase {
		if schemas, err = tenantSchemas(ctx, sess.Conn(), e.t); err != nil {
			return err
		}
	}
	rows, err := tx.Query(ctx, `SELECT n.nspname::text, c.relname::text, tg.tgname::text, tg.tgenabled::text
		FROM pg_catalog.pg_trigger tg JOIN pg_catalog.pg_class c ON c.oid = tg.tgrelid JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace
		WHERE NOT tg.tgisinternal AND tg.tgenabled IN ('A', 'R') AND n.nspname = ANY($1) ORDER BY 1, 2, 3`, schemas)
	if err != nil {
		return cluster.Classify(err)
	}
	trigs, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (trigger, error) {
		var t trigger
		return t, r.Scan(&t.Schema, &t.Table, &t.Name, &t.Enabled)
	})
	if err != nil {
		return cluster.Classify(err)
	}
	e.st.Triggers = trigs
	if err := r.SaveData(ctx, e.st); err != nil {
		return err
	}
	var sql strings.Builder
	for _, tg := range trigs {
		fmt.Fprintf(&sql, "ALTER TABLE %s.%s DISABLE TRIGGER %s;\n", cluster.Ident(tg.Schema), cluster.Ident(tg.Table), cluster.Ident(tg.Name))
	}
	// The marker last: in database mode its schema is the agent's.
	if e.t.Mode == tenant.ModeDatabase {
		fmt.Fprintf(&sql, "RESET ROLE; COMMENT ON SCHEMA %s IS %s", cluster.Ident(tenant.MarkerSchema), cluster.Literal(marker))
	} else {
		fmt.Fprintf(&sql, "COMMENT ON SCHEMA %s IS %s", id, cluster.Literal(marker))
	}
	if _, err := tx.Exec(ctx, sql.String()); err != nil {
		return cluster.Classify(err)
	}
	return cluster.Classify(tx.Commit(ctx))
}

// makeDatabase makes a database tenant's storage on cl as provisioning
// makes it, empty: admin-owned, its public schema the tenant's, the
// marker schema its agent's, the extension guard with the tier's list
// (and pg_prewarm when the source has it). What an interrupted attempt
// made is dropped first.
func makeDatabase(ctx context.Context, r *jobs.Run, cl *cluster.Cluster, t catalog.Tenant, tier config.Tier, prewarm bool) error {
	dadmin, err := cl.Admin(ctx)
	if err != nil {
		return err
	}
	role := tenant.PhysicalName(t.ID)
	agent := cluster.Ident(tenant.AgentRole(t.ID))
	id := cluster.Ident(role)
	exists, err := cluster.DatabaseExists(ctx, dadmin, role)
	if err != nil {
		return err
	}
	if exists { // an interrupted restore: made again
		cl.ClosePool(role)
		if err := cluster.DropDatabase(ctx, dadmin, role); err != nil {
			return err
		}
	}
	release, err := r.PaceWALLog(ctx, cl.Name(), 8<<20)
	if err != nil {
		return err
	}
	err = cluster.CreateDatabase(ctx, dadmin, role, "template0", "", cluster.WALLog)
	release()
	if err != nil {
		return err
	}
	if _, err := dadmin.Exec(ctx, fmt.Sprintf("REVOKE ALL ON DATABASE %[1]s FROM PUBLIC; GRANT ALL ON DATABASE %[1]s TO %[1]s", id)); err != nil {
		return cluster.Classify(err)
	}
	if err := sandbox.GrantConnect(ctx, dadmin, sandbox.TargetOf(t)); err != nil {
		return err
	}
	conn, err := cl.Connect(ctx, role)
	if err != nil {
		return err
	}
	_, err = conn.Exec(ctx, tenant.ExtensionGuardSQL+tenant.ExtensionsSQL(role, tier)+fmt.Sprintf(`REVOKE SELECT ON pg_catalog.pg_db_role_setting FROM PUBLIC;
		ALTER SCHEMA public OWNER TO %[1]s;
		CREATE SCHEMA IF NOT EXISTS %[3]s AUTHORIZATION %[2]s;
		REVOKE ALL ON SCHEMA %[3]s FROM PUBLIC`, id, agent, cluster.Ident(tenant.MarkerSchema)))
	if err == nil && prewarm {
		_, err = conn.Exec(ctx, `CREATE EXTENSION IF NOT EXISTS pg_prewarm SCHEMA pg_catalog`)
	}
	conn.Close(context.WithoutCancel(ctx))
	if err != nil {
		return cluster.Classify(err)
	}
	return nil
}

func hasPrewarm(ctx context.Context, cl *cluster.Cluster, db string) bool {
	conn, err := cl.Connect(ctx, db)
	if err != nil {
		return false
	}
	defer conn.Close(context.WithoutCancel(ctx))
	var ok bool
	_ = conn.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM pg_catalog.pg_extension WHERE extname = 'pg_prewarm')`).Scan(&ok)
	return ok
}

// readMarker reads the tenant's version marker on a cluster ("" if none).
func readMarker(ctx context.Context, cl *cluster.Cluster, t catalog.Tenant) (string, error) {
	conn, err := cl.Connect(ctx, t.Database)
	if err != nil {
		return "", err
	}
	defer conn.Close(context.WithoutCancel(ctx))
	schema := tenant.PhysicalName(t.ID)
	if t.Mode == tenant.ModeDatabase {
		schema = tenant.MarkerSchema
	}
	var c *string
	err = conn.QueryRow(ctx, `SELECT pg_catalog.obj_description(oid, 'pg_namespace') FROM pg_catalog.pg_namespace WHERE nspname = $1`, schema).Scan(&c)
	if errors.Is(err, pgx.ErrNoRows) || c == nil {
		return "", nil
	}
	return *c, cluster.Classify(err)
}

// dump runs pg_dump --schema-only of the tenant's scope on the source.
func (m *mover) dump(ctx context.Context, e *env) (string, error) {
	dsn, err := m.s.adminConnString(ctx, e.st.From, e.t.Database)
	if err != nil {
		return "", err
	}
	var exts []string
	if e.t.Mode == tenant.ModeDatabase {
		conn, err := e.src.Connect(ctx, e.t.Database)
		if err != nil {
			return "", err
		}
		exts, err = extraExtensions(ctx, conn)
		conn.Close(context.WithoutCancel(ctx))
		if err != nil {
			return "", err
		}
	}
	out, err := dumpSQL(ctx, dsn, e.t.Mode, e.role, exts, "--schema-only")
	if err != nil {
		return "", fmt.Errorf("tenant %s on %s: %w", e.t.ID, e.st.From, err)
	}
	return out, nil
}

// dumpSQL runs pg_dump of a tenant's definitions (args say which: the
// schema, or a section) on dsn: its schema (schema mode) or every schema
// of its database but pgtenant's, without owners (what the restore makes
// belongs to the tenant's role), privileges, extensions (only plpgsql is
// named, which pg_dump never dumps; the admin made the one pgtenant uses),
// publications, subscriptions and security labels. The result is SQL to
// run as one batch.
func dumpSQL(ctx context.Context, dsn string, mode tenant.Mode, schema string, exts []string, args ...string) (string, error) {
	bin, err := pgDump()
	if err != nil {
		return "", err
	}
	argv := append(append(args, dumpScope(mode, schema, exts)...), "--dbname="+dsn)
	cmd := exec.CommandContext(ctx, bin, argv...)
	var stderr strings.Builder
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return "", fmt.Errorf("pg_dump: %w: %s", err, strings.TrimSpace(stderr.String()))
	}
	text := string(out)
	if mode == tenant.ModeSchema {
		// The schema exists (made by the admin: the tenant may not create
		// schemas in the shared database).
		text = strings.Replace(text, "\nCREATE SCHEMA "+schema+";\n", "\n", 1)
	}
	// pg_dump (15.14 and later) brackets its output with \restrict and
	// \unrestrict, which guard psql against meta-commands smuggled into
	// object names. The script goes to the server as SQL, which has no
	// meta-commands: the two lines are dropped, nothing else is.
	var lines []string
	for _, line := range strings.Split(text, "\n") {
		if strings.HasPrefix(line, "\\restrict ") || strings.HasPrefix(line, "\\unrestrict ") {
			continue
		}
		lines = append(lines, line)
	}
	return strings.Join(lines, "\n"), nil
}

// dumpScope are the pg_dump options that keep a dump to a tenant's own
// objects: its schema (schema mode) or every schema of its database but
// pgtenant's, without owners, privileges, extensions but plpgsql and exts
// (a database tenant's own, carriedExtensions), publications,
// subscriptions, security labels and tablespaces, and with a bounded wait
// for the tenant's locks.
func dumpScope(mode tenant.Mode, schema string, exts []string) []string {
	argv := []string{"--no-owner", "--no-privileges", "--no-publications", "--no-subscriptions",
		"--no-security-labels", "--no-tablespaces", "--extension=plpgsql", "--lock-wait-timeout=10000"}
	for _, e := range exts {
		argv = append(argv, `--extension="`+strings.ReplaceAll(e, `"`, `""`)+`"`)
	}
	if mode == tenant.ModeSchema {
		return append(argv, "--schema="+schema)
	}
	return append(argv, "--exclude-schema="+tenant.MarkerSchema, "--exclude-schema="+SentinelSchema)
}

func pgDump() (string, error) { return pgClient("pg_dump") }

// pgClient finds a PostgreSQL client program: on the PATH, else the newest
// of Debian's installed majors.
func pgClient(name string) (string, error) {
	if p, err := exec.LookPath(name); err == nil {
		return p, nil
	}
	matches, _ := filepath.Glob("/usr/lib/postgresql/*/bin/" + name)
	if len(matches) == 0 {
		return "", fmt.Errorf("%s not found: install the PostgreSQL client (apt-get install -y postgresql-client-15)", name)
	}
	return matches[len(matches)-1], nil
}

// adminConnString is a libpq connection string of a cluster's admin for a
// database, from its catalog DSN.
func (s *Service) adminConnString(ctx context.Context, clusterName, database string) (string, error) {
	c, err := s.Store.GetCluster(ctx, clusterName)
	if err != nil {
		return "", err
	}
	pc, err := pgconn.ParseConfig(c.DSN)
	if err != nil {
		return "", fmt.Errorf("cluster %s: dsn: %w", clusterName, err)
	}
	q := func(v string) string { return "'" + strings.NewReplacer(`\`, `\\`, `'`, `\'`).Replace(v) + "'" }
	ssl := "disable"
	if pc.TLSConfig != nil {
		ssl = "require"
	}
	return fmt.Sprintf("host=%s port=%d user=%s password=%s dbname=%s sslmode=%s application_name=pgtenant_move",
		q(pc.Host), pc.Port, q(pc.User), q(pc.Password), q(database), ssl), nil
}

// subscribe publishes the tenant's tables on the source and makes, on the
// target, the sentinel table and the role that will own the subscription.
// The subscription itself is made by copy, once the rows it starts from are
// there.
func (m *mover) subscribe(ctx context.Context, r *jobs.Run, e *env) error {
	if e.switched {
		return nil
	}
	// The read-only logins' grants on the schema restored (pg_dump ran
	// without privileges): again on each run, they are idempotent.
	for _, l := range e.logins {
		if err := credentials.GrantLogin(ctx, e.dst, e.t, l); err != nil {
			return err
		}
	}
	name := Name(e.t.ID)
	sentinel := cluster.Ident(SentinelSchema) + "." + cluster.Ident(e.role)
	sentinelSQL := fmt.Sprintf(`CREATE SCHEMA IF NOT EXISTS %[1]s; REVOKE ALL ON SCHEMA %[1]s FROM PUBLIC;
		CREATE TABLE IF NOT EXISTS %[2]s (id int PRIMARY KEY, token text NOT NULL)`, cluster.Ident(SentinelSchema), sentinel)
	sconn, err := e.src.Connect(ctx, e.t.Database)
	if err != nil {
		return err
	}
	defer sconn.Close(context.WithoutCancel(ctx))
	if _, err := sconn.Exec(ctx, sentinelSQL); err != nil {
		return cluster.Classify(err)
	}
	var published bool
	if err := sconn.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM pg_catalog.pg_publication WHERE pubname = $1)`, name).Scan(&published); err != nil {
		return cluster.Classify(err)
	}
	if !published {
		what := "ALL TABLES"
		if e.t.Mode == tenant.ModeSchema {
			what = "TABLES IN SCHEMA " + cluster.Ident(e.role) + ", TABLE " + sentinel
		}
		if _, err := sconn.Exec(ctx, "CREATE PUBLICATION "+cluster.Ident(name)+" FOR "+what); err != nil {
			return cluster.Classify(err)
		}
	}
	dadmin, err := e.dst.Admin(ctx)
	if err != nil {
		return err
	}
	owner := cluster.Ident(name)
	if _, err := dadmin.Exec(ctx, fmt.Sprintf(`DO $$ BEGIN
			IF NOT EXISTS (SELECT 1 FROM pg_catalog.pg_roles WHERE rolname = %s) THEN
				CREATE ROLE %s LOGIN;
			END IF;
		END $$`, cluster.Literal(name), owner)); err != nil {
		return cluster.Classify(err)
	}
	dconn, err := e.dst.Connect(ctx, e.t.Database)
	if err != nil {
		return err
	}
	defer dconn.Close(context.WithoutCancel(ctx))
	if _, err := dconn.Exec(ctx, sentinelSQL+fmt.Sprintf(`; GRANT USAGE ON SCHEMA %s TO %s; GRANT SELECT, INSERT, UPDATE, DELETE ON %s TO %s`,
		cluster.Ident(SentinelSchema), owner, sentinel, owner)); err != nil {
		return cluster.Classify(err)
	}
	return nil
}

// createSubscription subscribes the target to the slot copy made, without
// a copy of its own (copy_data = false) and without a slot of its own
// (create_slot = false): the apply worker starts at the slot's
// confirmed_flush_lsn, the point of the snapshot the rows were copied in
// (START_REPLICATION starts at the requested LSN, 0/0 for a new
// subscription, or the slot's confirmed_flush_lsn, whichever is greater),
// so no change is missed or applied twice. The subscription is made by a
// role of its own that is a superuser only while it creates it
// (PostgreSQL 15 wants a superuser owner), then NOSUPERUSER and a member
// of the tenant's role: the apply worker runs as its owner, so whatever
// tenant code replication sets off (triggers, defaults, generated columns,
// index expressions, constraints) has the tenant's rights and no more.
func (m *mover) createSubscription(ctx context.Context, e *env, dconn *pgx.Conn) error {
	name := Name(e.t.ID)
	owner := cluster.Ident(name)
	dadmin, err := e.dst.Admin(ctx)
	if err != nil {
		return err
	}
	conninfo, err := m.s.adminConnString(ctx, e.st.From, e.t.Database)
	if err != nil {
		return err
	}
	for _, stmt := range []string{
		"ALTER ROLE " + owner + " SUPERUSER",
		"SET ROLE " + owner,
		"SET statement_timeout = '60s'",
		fmt.Sprintf("CREATE SUBSCRIPTION %s CONNECTION %s PUBLICATION %s WITH (enabled = false, create_slot = false, slot_name = %s, copy_data = false)",
			owner, cluster.Literal(conninfo), owner, cluster.Literal(name)),
	} {
		if _, err := dconn.Exec(ctx, stmt); err != nil {
			_, _ = dconn.Exec(context.WithoutCancel(ctx), "RESET ROLE; RESET statement_timeout")
			_, _ = dadmin.Exec(context.WithoutCancel(ctx), "ALTER ROLE "+owner+" NOSUPERUSER")
			return fmt.Errorf("subscribe %s to %s: %w", e.dst.Name(), e.src.Name(), cluster.Classify(err))
		}
	}
	if _, err := dconn.Exec(ctx, "RESET ROLE; RESET statement_timeout"); err != nil {
		return cluster.Classify(err)
	}
	// Before it is enabled: the owner has no privilege beyond the
	// tenant's.
	if _, err := dadmin.Exec(ctx, fmt.Sprintf("ALTER ROLE %s NOSUPERUSER NOCREATEDB NOCREATEROLE NOREPLICATION NOBYPASSRLS; GRANT %s TO %s",
		owner, cluster.Ident(e.role), owner)); err != nil {
		return cluster.Classify(err)
	}
	var super bool
	if err := dadmin.QueryRow(ctx, `SELECT rolsuper FROM pg_catalog.pg_roles WHERE rolname = $1`, name).Scan(&super); err != nil || super {
		return fmt.Errorf("the subscription owner %s is still a superuser: %w", name, cluster.Classify(err))
	}
	_, err = dconn.Exec(ctx, "ALTER SUBSCRIPTION "+owner+" ENABLE")
	return cluster.Classify(err)
}

// cutover switches the tenant to the target with its pool paused.
func (m *mover) cutover(ctx context.Context, r *jobs.Run, e *env) error {
	front := m.s.Poolers.Get(e.t.FrontCluster())
	if e.switched {
		return m.resume(ctx, front, e)
	}
	srcMarker, err := readMarker(ctx, e.src, e.t)
	if err != nil {
		return err
	}
	if dstMarker, err := readMarker(ctx, e.dst, e.t); err != nil || dstMarker != srcMarker {
		return jobs.Permanent(fmt.Errorf("tenant %s's version marker changed during the move (%q on %s, %q on %s): a rollout reached it; move it again", e.t.ID, srcMarker, e.src.Name(), dstMarker, e.dst.Name()))
	}
	agent := tenant.AgentRole(e.t.ID)
	// Everything the paused stretch needs is opened and read before it:
	// a session on each side and the tenant's schemas.
	sconn, err := e.src.Connect(ctx, e.t.Database)
	if err != nil {
		return err
	}
	defer sconn.Close(context.WithoutCancel(ctx))
	dconn, err := e.dst.Connect(ctx, e.t.Database)
	if err != nil {
		return err
	}
	defer dconn.Close(context.WithoutCancel(ctx))
	// The source failed over since the copy: a logical slot does not
	// survive a promotion (PostgreSQL 15), so the subscription has nothing
	// left to stream from. The copy is made again from the new primary
	// (it empties the target first).
	if _, err := slotBacklog(ctx, sconn, Name(e.t.ID)); errors.Is(err, errSlotGone) {
		r.Note(ctx, fmt.Sprintf("the move's slot is gone from %s (a failover since the copy): copying again", e.src.Name()))
		if err := m.record(ctx, e.t.ID, "move_copied_again", map[string]any{"cluster": e.src.Name(), "why": "the move's slot is gone (a failover since the copy)", "job": r.Job.ID}); err != nil {
			return err
		}
		if err := m.copy(ctx, r, e); err != nil {
			return err
		}
	} else if err != nil {
		return err
	}
	schemas, err := tenantSchemas(ctx, sconn, e.t)
	if err != nil {
		return err
	}
	// An earlier attempt that did not switch may have left the target as
	// the switch wants it: back to replicating, triggers off, no login.
	if err := m.resetTarget(ctx, e, dconn); err != nil {
		return err
	}
	// The target catches up first, unpaused, on what the tenant wrote
	// during the copy: the pause starts once a sentinel's round trip takes
	// under 100 ms. While the slot's backlog on the source shrinks, that
	// goes on, for at most CatchUpTimeout. A tenant that writes about as
	// fast as the apply worker applies stops the backlog from shrinking:
	// after a minute without progress (or at the end of CatchUpTimeout)
	// the move pauses anyway, and the paused catch-up, with the writes
	// stopped, gets SwitchTimeout; past it the move fails (ErrBehind) and
	// the tenant resumes where it was. Bound: CatchUpTimeout, then a pause
	// of at most SwitchTimeout.
	// One sentinel in flight at a time: each is a transaction the apply
	// worker must get through (a tenant's code that leaves the apply
	// worker's session as the tenant's role costs it a restart at each).
	window := cmp.Or(m.s.CatchUpTimeout, catchUpTimeout)
	stall := min(window, time.Minute)
	best, bestAt, logged := int64(-1), time.Now(), time.Time{}
	var token string
	var sent time.Time
	for until := time.Now().Add(window); ; {
		if token == "" {
			if token, err = sentinel(ctx, sconn, e.t); err != nil {
				return err
			}
			sent = time.Now()
		}
		err = waitSentinel(ctx, dconn, e.dst.Name(), e.t, token, time.Second)
		if err != nil && ctx.Err() != nil {
			return err
		}
		if err == nil {
			if time.Since(sent) < 100*time.Millisecond {
				break
			}
			token = "" // arrived, slowly: another
		}
		backlog, err := slotBacklog(ctx, sconn, Name(e.t.ID))
		if err != nil {
			return err
		}
		if best < 0 || backlog < best-best/10 {
			best, bestAt = backlog, time.Now()
		}
		if time.Since(bestAt) >= stall || time.Now().After(until) {
			m.s.Logger.Info("target not catching up further; pausing", "component", "move", "tenant", e.t.ID, "backlog_bytes", backlog)
			break
		}
		if time.Since(logged) > 10*time.Second {
			m.s.Logger.Info("target catching up before the pause", "component", "move", "tenant", e.t.ID, "backlog_bytes", backlog)
			logged = time.Now()
		}
	}
	phases := map[string]int64{}
	mark := time.Now()
	phase := func(name string) {
		phases[name] = time.Since(mark).Milliseconds()
		mark = time.Now()
	}
	// 1. Clients queue at the pooler once their transactions end (in
	//    session mode: once they disconnect, or their sessions are ended).
	pausing := time.Now()
	ended, err := m.s.pause(ctx, front, e.src, e.t, e.role)
	if err != nil {
		return err
	}
	paused := time.Now()
	phase("pause")
	undo := func(cause error) error {
		uctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 15*time.Second)
		defer cancel()
		return errors.Join(cause, m.unlock(uctx, e), m.resume(uctx, front, e))
	}
	if ended > 0 {
		if err := m.s.Store.AddEvent(ctx, m.s.Store.Pool(), e.t.ID, "move_sessions_ended", map[string]any{"sessions": ended,
			"from": e.st.From, "to": m.a.To, "job": r.Job.ID, "waited_ms": paused.Sub(pausing).Milliseconds()}); err != nil {
			return undo(err)
		}
	}
	// 2. Nobody writes on the source any more: NOLOGIN, sessions ended
	//    (a direct client's transaction in flight is aborted).
	if err := lockOut(ctx, e.src, append([]string{e.role, agent}, catalog.LoginRoles(e.logins)...)...); err != nil {
		return undo(err)
	}
	phase("lock_out")
	// 3. The sentinel, written last on the source, reached the target:
	//    everything committed before it has been applied.
	token, err = sentinel(ctx, sconn, e.t)
	if err != nil {
		return undo(err)
	}
	if err := waitSentinel(ctx, dconn, e.dst.Name(), e.t, token, switchWait(cmp.Or(m.s.SwitchTimeout, 30*time.Second), front, pausing)); err != nil {
		if ctx.Err() == nil {
			err = jobs.Permanent(fmt.Errorf("%w: %v: its apply worker does not keep up with its writes; move it when it writes less", ErrBehind, err))
		}
		return undo(err)
	}
	phase("catch_up")
	// 4. Sequences from the source; the subscription stops; the tenant's
	//    own triggers are enabled as they were; the role may log in.
	if err := m.prepareTarget(ctx, e, sconn, dconn, schemas); err != nil {
		return undo(err)
	}
	phase("target")
	if err := crashPoint(ctx, "cutover:paused"); err != nil {
		return err
	}
	// 5. The switch: the catalog, then the pooler's entry, then resume.
	err = pgx.BeginFunc(ctx, m.s.Store.Pool(), func(tx pgx.Tx) error {
		t, err := m.s.Store.LockTenant(ctx, tx, e.t.ID)
		if err != nil {
			return err
		}
		if t.State != catalog.StateActive {
			return jobs.Permanent(fmt.Errorf("tenant %s became %s during its move", t.ID, t.State))
		}
		if err := m.s.Store.MoveTenant(ctx, tx, t.ID, e.st.From, m.a.To); err != nil {
			return err
		}
		if m.a.Tier != "" && m.a.Tier != t.Tier {
			if err := m.s.Store.SetTenantTier(ctx, tx, t.ID, m.a.Tier); err != nil {
				return err
			}
			if err := m.s.Store.AddEvent(ctx, tx, t.ID, provision.EventTierChanged, map[string]any{"from": t.Tier, "to": m.a.Tier,
				"moved_to": m.a.To, "job": r.Job.ID}); err != nil {
				return err
			}
		}
		return m.s.Store.AddEvent(ctx, tx, t.ID, "moved", map[string]any{"from": e.st.From, "to": m.a.To, "job": r.Job.ID})
	})
	if err != nil {
		if lerr := m.relock(ctx, e); lerr != nil {
			err = errors.Join(err, lerr)
		}
		return undo(err)
	}
	e.switched = true
	phase("switch")
	if err := crashPoint(ctx, "cutover:switched"); err != nil {
		return err
	}
	if err := m.resume(ctx, front, e); err != nil {
		return err
	}
	phase("resume")
	e.st.PauseMS = time.Since(paused).Milliseconds()
	if err := m.s.Store.AddEvent(ctx, m.s.Store.Pool(), e.t.ID, "move_pause", map[string]any{"pause_ms": e.st.PauseMS,
		"from": e.st.From, "to": m.a.To, "job": r.Job.ID, "phases_ms": phases}); err != nil {
		return err
	}
	m.s.Logger.Info("tenant moved", "component", "move", "tenant", e.t.ID, "from", e.st.From, "to", m.a.To, "pause_ms", e.st.PauseMS, "phases_ms", phases)
	return r.SaveData(ctx, e.st)
}

// endedPauseWait bounds the wait for the pause to complete once pause has
// ended the sessions holding it up: the pooler notices their ends at once.
const endedPauseWait = 10 * time.Second

// pause pauses tenant t's pool (role) at its pooler (none: nothing to
// pause) and returns how many of the tenant's sessions on cl it ended for
// it. PAUSE completes once the pool's server connections are released: in
// transaction mode when the transactions in flight end, in session mode
// when the clients disconnect, which a client keeping its connection open
// never does. So, after PauseTimeout, in session mode the tenant's
// sessions on cl are ended (as the lock-out that follows ends them, and as
// a switchover cuts a session-mode client's server connection): each
// client holding one loses its connection, the pause completes, and the
// clients queued at the pooler since the PAUSE, or reconnecting, wait for
// the resume. In transaction mode the pause gives up after PauseTimeout (a
// transaction that long is the client's work, not ours to abort): the
// step is retried. A move's cut-over and a rewind's swap pause so.
func (s *Service) pause(ctx context.Context, front *pooler.Front, cl *cluster.Cluster, t catalog.Tenant, role string) (int, error) {
	if front == nil {
		return 0, nil
	}
	wait := cmp.Or(s.PauseTimeout, 10*time.Second)
	if front.Snapshot().Databases[role].PoolMode != pooler.ModeSession {
		pctx, cancel := context.WithTimeout(ctx, wait)
		defer cancel()
		if err := front.Pause(pctx, role); err != nil {
			return 0, fmt.Errorf("pause tenant %s's pool (its transactions in flight must end first; at most %s): %w", t.ID, wait, err)
		}
		return 0, nil
	}
	pctx, cancel := context.WithTimeout(ctx, wait+endedPauseWait)
	defer cancel()
	done := make(chan error, 1)
	go func() { done <- front.Pause(pctx, role) }()
	timer := time.NewTimer(wait)
	defer timer.Stop()
	select {
	case err := <-done:
		if err != nil {
			return 0, fmt.Errorf("pause tenant %s's pool: %w", t.ID, err)
		}
		return 0, nil
	case <-timer.C:
	}
	ended, err := purge.EndSessions(ctx, cl, role)
	if err != nil {
		cancel()
		return 0, errors.Join(err, <-done)
	}
	s.Logger.Info("the tenant's session-mode clients did not leave for the pause: their sessions ended", "component", "move",
		"tenant", t.ID, "sessions", ended, "waited", wait)
	if err := <-done; err != nil {
		return ended, fmt.Errorf("pause tenant %s's pool (its %d sessions ended after %s): %w", t.ID, ended, wait, err)
	}
	return ended, nil
}

// resetTarget puts the target back as the copy needs it (idempotent): the
// role NOLOGIN, the tenant's ALWAYS/REPLICA triggers disabled, the
// subscription enabled.
func (m *mover) resetTarget(ctx context.Context, e *env, dconn *pgx.Conn) error {
	if err := lockOut(ctx, e.dst, append([]string{e.role}, catalog.LoginRoles(e.logins)...)...); err != nil {
		return err
	}
	var sql strings.Builder
	for _, tg := range e.st.Triggers {
		fmt.Fprintf(&sql, "ALTER TABLE %s.%s DISABLE TRIGGER %s;\n", cluster.Ident(tg.Schema), cluster.Ident(tg.Table), cluster.Ident(tg.Name))
	}
	fmt.Fprintf(&sql, "ALTER SUBSCRIPTION %s ENABLE", cluster.Ident(Name(e.t.ID)))
	if _, err := dconn.Exec(ctx, sql.String()); err != nil {
		return fmt.Errorf("reset tenant %s on %s for the cut-over: %w", e.t.ID, e.dst.Name(), cluster.Classify(err))
	}
	return nil
}

// lockOut stops a role from logging in on the primary and ends its
// sessions there (standbys serve no writes; their sessions end in finish).
func lockOut(ctx context.Context, cl *cluster.Cluster, roles ...string) error {
	if _, err := purge.EndSessions(ctx, cl, roles...); err != nil {
		return err
	}
	if err := purge.SetLogin(ctx, cl, false, roles...); err != nil {
		return err
	}
	_, err := purge.EndSessions(ctx, cl, roles...)
	return err
}

// errSlotGone: the move's slot is not on the source (it failed over).
var errSlotGone = errors.New("gone from the source")

// slotBacklog is the WAL of the source the move's subscription has not
// confirmed yet.
func slotBacklog(ctx context.Context, sconn *pgx.Conn, slot string) (int64, error) {
	var n int64
	err := sconn.QueryRow(ctx, `SELECT coalesce(pg_catalog.pg_wal_lsn_diff(pg_catalog.pg_current_wal_lsn(), confirmed_flush_lsn), 0)::int8
		FROM pg_catalog.pg_replication_slots WHERE slot_name = $1`, slot).Scan(&n)
	if errors.Is(err, pgx.ErrNoRows) {
		return 0, fmt.Errorf("slot %s is %w", slot, errSlotGone)
	}
	return n, cluster.Classify(err)
}

// sentinel writes a fresh token into the source's sentinel table.
func sentinel(ctx context.Context, conn *pgx.Conn, t catalog.Tenant) (string, error) {
	b := make([]byte, 12)
	_, _ = rand.Read(b)
	token := hex.EncodeToString(b)
	_, err := conn.Exec(ctx, fmt.Sprintf(`INSERT INTO %s.%s VALUES (1, $1) ON CONFLICT (id) DO UPDATE SET token = EXCLUDED.token`,
		cluster.Ident(SentinelSchema), cluster.Ident(tenant.PhysicalName(t.ID))), token)
	return token, cluster.Classify(err)
}

func waitSentinel(ctx context.Context, conn *pgx.Conn, clusterName string, t catalog.Tenant, token string, limit time.Duration) error {
	deadline := time.Now().Add(limit)
	q := fmt.Sprintf(`SELECT EXISTS (SELECT 1 FROM %s.%s WHERE id = 1 AND token = $1)`, cluster.Ident(SentinelSchema), cluster.Ident(tenant.PhysicalName(t.ID)))
	for {
		var ok bool
		if err := conn.QueryRow(ctx, q, token).Scan(&ok); err != nil {
			return cluster.Classify(err)
		}
		if ok {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("cluster %s did not apply tenant %s's last writes within %s (is its subscription failing? see its log)", clusterName, t.ID, limit)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(2 * time.Millisecond):
		}
	}
}

// prepareTarget sets the sequences from the source, stops the
// subscription, enables the tenant's triggers as they were and lets the
// tenant's roles log in on the target.
func (m *mover) prepareTarget(ctx context.Context, e *env, sconn, dconn *pgx.Conn, schemas []string) error {
	rows, err := sconn.Query(ctx, `SELECT schemaname::text, sequencename::text, last_value FROM pg_catalog.pg_sequences
		WHERE schemaname = ANY($1) AND last_value IS NOT NULL`, schemas)
	if err != nil {
		return cluster.Classify(err)
	}
	type seq struct {
		schema, name string
		last         int64
	}
	seqs, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (seq, error) {
		var s seq
		return s, r.Scan(&s.schema, &s.name, &s.last)
	})
	if err != nil {
		return cluster.Classify(err)
	}
	var sql strings.Builder
	fmt.Fprintf(&sql, "ALTER SUBSCRIPTION %s DISABLE;\n", cluster.Ident(Name(e.t.ID)))
	for _, s := range seqs {
		fmt.Fprintf(&sql, "SELECT pg_catalog.setval(%s::pg_catalog.regclass, %d, true);\n", cluster.Literal(cluster.Ident(s.schema)+"."+cluster.Ident(s.name)), s.last)
	}
	for _, tg := range e.st.Triggers {
		mode := "ALWAYS"
		if tg.Enabled == "R" {
			mode = "REPLICA"
		}
		fmt.Fprintf(&sql, "ALTER TABLE %s.%s ENABLE %s TRIGGER %s;\n", cluster.Ident(tg.Schema), cluster.Ident(tg.Table), mode, cluster.Ident(tg.Name))
	}
	if _, err := dconn.Exec(ctx, sql.String()); err != nil {
		return fmt.Errorf("prepare tenant %s on %s: %w", e.t.ID, e.dst.Name(), cluster.Classify(err))
	}
	return purge.SetLogin(ctx, e.dst, true, append([]string{e.role}, catalog.LoginRoles(e.logins)...)...)
}

// unlock lets the tenant log in on the source again (a cut-over that did
// not switch).
func (m *mover) unlock(ctx context.Context, e *env) error {
	t, err := m.s.Store.GetTenant(ctx, nil, e.t.ID)
	if err != nil || t.Cluster != e.st.From || t.State != catalog.StateActive {
		return err
	}
	return purge.SetLogin(ctx, e.src, true, append([]string{e.role, tenant.AgentRole(e.t.ID)}, catalog.LoginRoles(e.logins)...)...)
}

// relock keeps the target's role out when the switch did not happen.
func (m *mover) relock(ctx context.Context, e *env) error {
	return purge.SetLogin(ctx, e.dst, false, append([]string{e.role}, catalog.LoginRoles(e.logins)...)...)
}

// resume brings the pooler's entry in line with the catalog (pointed at
// the tenant's cluster now) and lets its clients go on.
func (m *mover) resume(ctx context.Context, front *pooler.Front, e *env) error {
	if front == nil {
		return nil
	}
	var err error
	for attempt := 0; attempt < 3; attempt++ {
		if err = front.Sync(ctx); err == nil {
			break
		}
	}
	return errors.Join(err, front.Resume(ctx, e.role))
}

// finish removes the move's replication objects and, once switched,
// queues the source copy's purge after the drop retention.
func (m *mover) finish(ctx context.Context, r *jobs.Run, e *env) error {
	if err := m.dropReplication(ctx, e); err != nil {
		return err
	}
	if err := crashPoint(ctx, "finish:dropped"); err != nil {
		return err
	}
	if !e.switched {
		return nil
	}
	// Sessions the source's standbys still serve end too.
	if _, _, err := purge.OnStandbys(ctx, e.src, true, e.role, tenant.AgentRole(e.t.ID)); err != nil {
		m.s.Logger.Warn("end the moved tenant's sessions on the source's standbys", "component", "move", "tenant", e.t.ID, "err", err)
	}
	left := e.t
	left.Cluster = e.st.From
	spec := purge.LeftoverSpec(left, "moved to "+m.a.To)
	spec.RunAfter = time.Now().Add(m.s.Drop.Retention.D())
	_, err := r.Enqueue(ctx, spec)
	return err
}

// dropReplication removes the subscription (and its owner), the
// publication, the slot and the sentinel tables. Each is checked first:
// run again, it finds them gone.
func (m *mover) dropReplication(ctx context.Context, e *env) error {
	name := Name(e.t.ID)
	sentinel := "DROP TABLE IF EXISTS " + cluster.Ident(SentinelSchema) + "." + cluster.Ident(e.role)
	dconn, err := e.dst.Connect(ctx, e.t.Database)
	if err != nil && !errors.Is(err, cluster.ErrNotFound) {
		return err
	}
	if err == nil {
		defer dconn.Close(context.WithoutCancel(ctx))
		if err := dropSubscription(ctx, dconn, name); err != nil {
			return err
		}
		if _, err := dconn.Exec(ctx, sentinel); err != nil {
			return cluster.Classify(err)
		}
		if err := cluster.DropOwned(ctx, dconn, name); err != nil {
			return err
		}
	}
	dadmin, err := e.dst.Admin(ctx)
	if err != nil {
		return err
	}
	if err := cluster.DropRoles(ctx, dadmin, name); err != nil {
		return err
	}
	if err := revokeCopyParameter(ctx, dadmin, e.t.ID, e.t.Database); err != nil {
		return err
	}
	sconn, err := e.src.Connect(ctx, e.t.Database)
	if err != nil {
		return err
	}
	defer sconn.Close(context.WithoutCancel(ctx))
	if _, err := sconn.Exec(ctx, "DROP PUBLICATION IF EXISTS "+cluster.Ident(name)+"; "+sentinel); err != nil {
		return cluster.Classify(err)
	}
	return dropSlot(ctx, e.src, name)
}

// cleanup runs when the job fails or is cancelled. Switched, the tenant is
// on the target: only the replication objects go. Not switched, the tenant
// is where it was, serving: everything the move made on the target goes.
func (m *mover) cleanup(ctx context.Context, r *jobs.Run) error {
	e, err := m.load(ctx, r)
	if errors.Is(err, catalog.ErrNotFound) {
		return nil
	}
	if err != nil {
		var st state
		if lerr := r.LoadData(&st); lerr == nil && st.From == "" {
			return nil // refused at check: nothing was made
		}
		return err
	}
	front := m.s.Poolers.Get(e.t.FrontCluster())
	if e.switched {
		return errors.Join(m.resume(ctx, front, e), m.dropReplication(ctx, e))
	}
	if !e.st.Checked {
		return nil
	}
	if err := errors.Join(m.unlock(ctx, e), m.resume(ctx, front, e)); err != nil {
		return err
	}
	if err := m.dropReplication(ctx, e); err != nil {
		return err
	}
	dadmin, err := e.dst.Admin(ctx)
	if err != nil {
		return err
	}
	roles := []string{e.role, tenant.AgentRole(e.t.ID)}
	if _, err := purge.EndSessions(ctx, e.dst, roles...); err != nil {
		return err
	}
	if e.t.Mode == tenant.ModeDatabase {
		e.dst.ClosePool(e.role)
		if err := cluster.DropDatabase(ctx, dadmin, e.role); err != nil {
			return err
		}
	} else {
		conn, err := e.dst.Connect(ctx, e.t.Database)
		if err != nil {
			return err
		}
		err = cluster.DropSchemaBatched(ctx, conn, e.role, m.s.Drop.BatchRelations, func(context.Context, int, int) error { return nil })
		if err == nil {
			err = cluster.DropOwned(ctx, conn, roles...)
		}
		conn.Close(context.WithoutCancel(ctx))
		if err != nil {
			return err
		}
	}
	return cluster.DropRoles(ctx, dadmin, roles...)
}
