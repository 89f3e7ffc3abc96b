package catalog

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pgtenant/pgtenant/internal/tenant"
)

// RolloutState is where a rollout is: rollouts.state. The job's own state
// wins once it is paused or finished (see migrate.Status).
type RolloutState string

// Rollout states.
const (
	RolloutQueued    RolloutState = "queued"
	RolloutBuilding  RolloutState = "building"  // waiting for the target version's template builds
	RolloutMigrating RolloutState = "migrating" // tenants being migrated
	RolloutPaused    RolloutState = "paused"    // canary done: waiting for `rollout continue`
	RolloutSucceeded RolloutState = "succeeded"
	RolloutFailed    RolloutState = "failed"
	RolloutCancelled RolloutState = "cancelled"
)

// RolloutTenantState is where a tenant is within a rollout:
// rollout_tenants.state.
type RolloutTenantState string

// States of a tenant within a rollout.
const (
	RolloutTenantPending RolloutTenantState = "pending"
	RolloutTenantRunning RolloutTenantState = "running"
	RolloutTenantDone    RolloutTenantState = "done"
	RolloutTenantFailed  RolloutTenantState = "failed"
	RolloutTenantSkipped RolloutTenantState = "skipped" // purged or gone while the rollout ran
)

// Rollout is one row of rollouts, with its tenants counted by state.
type Rollout struct {
	ID              int64                      `json:"id"`
	Template        string                     `json:"template"`
	TargetVersion   int                        `json:"target_version"`
	Canary          int                        `json:"canary"`
	CanaryPassed    bool                       `json:"canary_passed"`
	Parallel        int                        `json:"parallel"`
	Cluster         string                     `json:"cluster,omitempty"`
	State           RolloutState               `json:"state"`
	JobID           int64                      `json:"job_id"`
	AlreadyAtTarget int                        `json:"already_at_target"`
	CreatedAt       time.Time                  `json:"created_at"`
	UpdatedAt       time.Time                  `json:"updated_at"`
	Counts          map[RolloutTenantState]int `json:"counts"` // pending, running, done, failed, skipped
	Total           int                        `json:"total"`  // tenants the rollout has to move
}

// RolloutTenant is one tenant of a rollout.
type RolloutTenant struct {
	Tenant      string             `json:"tenant"`
	Cluster     string             `json:"cluster"`
	Mode        tenant.Mode        `json:"mode"`
	FromVersion int                `json:"from_version"`
	Version     int                `json:"version"`
	State       RolloutTenantState `json:"state"`
	Error       string             `json:"error,omitempty"`
	Attempts    int                `json:"attempts"`
	StartedAt   *time.Time         `json:"started_at,omitempty"`
	FinishedAt  *time.Time         `json:"finished_at,omitempty"`
}

// InsertRollout adds a rollout in tx and returns its id.
func (s *Store) InsertRollout(ctx context.Context, q Querier, r Rollout) (int64, error) {
	var id int64
	err := q.QueryRow(ctx, `INSERT INTO rollouts (template, target_version, canary, parallel, cluster, already_at_target)
		VALUES ($1, $2, $3, $4, $5, $6) RETURNING id`,
		r.Template, r.TargetVersion, r.Canary, r.Parallel, r.Cluster, r.AlreadyAtTarget).Scan(&id)
	return id, err
}

// SetRolloutJob records the job that runs a rollout.
func (s *Store) SetRolloutJob(ctx context.Context, q Querier, id, jobID int64) error {
	_, err := q.Exec(ctx, `UPDATE rollouts SET job_id = $2, updated_at = now() WHERE id = $1`, id, jobID)
	return err
}

// SetRolloutState records a rollout's state.
func (s *Store) SetRolloutState(ctx context.Context, q Querier, id int64, state RolloutState) error {
	_, err := q.Exec(ctx, `UPDATE rollouts SET state = $2, updated_at = now() WHERE id = $1`, id, state)
	return err
}

// PassCanary records that a rollout may go on past its canary.
func (s *Store) PassCanary(ctx context.Context, q Querier, id int64) error {
	_, err := q.Exec(ctx, `UPDATE rollouts SET canary_passed = true, updated_at = now() WHERE id = $1`, id)
	return err
}

// migratable are the tenant states a rollout moves: a suspended or dropped
// tenant still has its data, and must find it consistent with its version
// when it is resumed or restored. Spares are not migrated (the pool retires
// them), and purging or failed tenants are on their way out.
const migratable = `('active', 'suspended', 'dropped')`

// AddRolloutTenants adds to a rollout, as pending, every migratable tenant of
// its template (on its cluster, if it has one) below its target version that
// it does not list yet. It returns how many it added.
func (s *Store) AddRolloutTenants(ctx context.Context, q Querier, id int64) (int, error) {
	tag, err := q.Exec(ctx, `INSERT INTO rollout_tenants (rollout, tenant, cluster, mode, from_version, version)
		SELECT r.id, t.id, t.cluster, t.mode, t.version, t.version
		FROM rollouts r JOIN tenants t ON t.template = r.template AND t.version < r.target_version
		 AND (r.cluster = '' OR t.cluster = r.cluster) AND t.state IN `+migratable+`
		WHERE r.id = $1
		ON CONFLICT (rollout, tenant) DO NOTHING`, id)
	if err != nil {
		return 0, err
	}
	return int(tag.RowsAffected()), nil
}

// VersionCount is a number of tenants of a template at a version on a cluster.
type VersionCount struct {
	Template string `json:"template"`
	Cluster  string `json:"cluster"`
	Version  int    `json:"version"`
	Tenants  int    `json:"tenants"`
}

// MigratableVersions counts the migratable tenants of a template (of every
// template with template ""), by cluster and version.
func (s *Store) MigratableVersions(ctx context.Context, template, cluster string) ([]VersionCount, error) {
	rows, err := s.pool.Query(ctx, `SELECT template, cluster, version, count(*)::int FROM tenants
		WHERE ($1 = '' OR template = $1) AND ($2 = '' OR cluster = $2) AND state IN `+migratable+`
		GROUP BY 1, 2, 3 ORDER BY 1, 2, 3`, template, cluster)
	if err != nil {
		return nil, err
	}
	return pgx.CollectRows(rows, func(r pgx.CollectableRow) (VersionCount, error) {
		var v VersionCount
		return v, r.Scan(&v.Template, &v.Cluster, &v.Version, &v.Tenants)
	})
}

// TenantVersions counts the tenants of every template by version, for
// /metrics: what a rollout moves plus tenants being provisioned. One query.
func (s *Store) TenantVersions(ctx context.Context) ([]VersionCount, error) {
	rows, err := s.pool.Query(ctx, `SELECT template, version, count(*)::int FROM tenants
		WHERE state IN ('active', 'suspended', 'dropped', 'provisioning') GROUP BY 1, 2 ORDER BY 1, 2`)
	if err != nil {
		return nil, err
	}
	return pgx.CollectRows(rows, func(r pgx.CollectableRow) (VersionCount, error) {
		var v VersionCount
		return v, r.Scan(&v.Template, &v.Version, &v.Tenants)
	})
}

// ProvisioningBelow counts a rollout's template's tenants still being built
// at a version below its target: they join the rollout once active.
func (s *Store) ProvisioningBelow(ctx context.Context, id int64) (int, error) {
	var n int
	err := s.pool.QueryRow(ctx, `SELECT count(*) FROM rollouts r JOIN tenants t ON t.template = r.template
		AND t.version < r.target_version AND (r.cluster = '' OR t.cluster = r.cluster) AND t.state = 'provisioning'
		WHERE r.id = $1`, id).Scan(&n)
	return n, err
}

const rolloutColumns = `r.id, r.template, r.target_version, r.canary, r.canary_passed, r.parallel, r.cluster, r.state,
	coalesce(r.job_id, 0), r.already_at_target, r.created_at, r.updated_at,
	coalesce((SELECT jsonb_object_agg(state, n) FROM (SELECT state, count(*) AS n FROM rollout_tenants
		WHERE rollout = r.id GROUP BY state) c), '{}')`

func scanRollout(row pgx.Row) (Rollout, error) {
	var r Rollout
	err := row.Scan(&r.ID, &r.Template, &r.TargetVersion, &r.Canary, &r.CanaryPassed, &r.Parallel, &r.Cluster, &r.State,
		&r.JobID, &r.AlreadyAtTarget, &r.CreatedAt, &r.UpdatedAt, &r.Counts)
	if r.Counts == nil {
		r.Counts = map[RolloutTenantState]int{}
	}
	for _, st := range []RolloutTenantState{RolloutTenantPending, RolloutTenantRunning, RolloutTenantDone, RolloutTenantFailed, RolloutTenantSkipped} {
		r.Total += r.Counts[st]
		r.Counts[st] += 0
	}
	return r, err
}

// LockRollout reads a rollout FOR UPDATE in tx: changes of its state
// (continue, retry, the end of its migrate step) serialise on it.
func (s *Store) LockRollout(ctx context.Context, tx pgx.Tx, id int64) (Rollout, error) {
	if _, err := tx.Exec(ctx, `SELECT 1 FROM rollouts WHERE id = $1 FOR UPDATE`, id); err != nil {
		return Rollout{}, err
	}
	return s.GetRollout(ctx, tx, id)
}

// RequeueRunningRolloutTenants sets a rollout's tenants in flight back to
// pending (their migration was rolled back when its job stopped).
func (s *Store) RequeueRunningRolloutTenants(ctx context.Context, q Querier, id int64) error {
	_, err := q.Exec(ctx, `UPDATE rollout_tenants SET state = 'pending' WHERE rollout = $1 AND state = 'running'`, id)
	return err
}

// GetRollout returns a rollout with its counts.
func (s *Store) GetRollout(ctx context.Context, q Querier, id int64) (Rollout, error) {
	if q == nil {
		q = s.pool
	}
	r, err := scanRollout(q.QueryRow(ctx, `SELECT `+rolloutColumns+` FROM rollouts r WHERE r.id = $1`, id))
	if errors.Is(err, pgx.ErrNoRows) {
		return r, fmt.Errorf("rollout %d: %w (list rollouts with `pgtenant rollout list`)", id, ErrNotFound)
	}
	return r, err
}

// ListRollouts returns rollouts, newest first, optionally of one template.
func (s *Store) ListRollouts(ctx context.Context, template string, limit int) ([]Rollout, error) {
	if limit <= 0 || limit > 10000 {
		limit = 100
	}
	rows, err := s.pool.Query(ctx, `SELECT `+rolloutColumns+` FROM rollouts r
		WHERE $1 = '' OR r.template = $1 ORDER BY r.id DESC LIMIT $2`, template, limit)
	if err != nil {
		return nil, err
	}
	return pgx.CollectRows(rows, func(r pgx.CollectableRow) (Rollout, error) { return scanRollout(r) })
}

const rolloutTenantColumns = `tenant, cluster, mode, from_version, version, state, error, attempts, started_at, finished_at`

func scanRolloutTenant(row pgx.Row) (RolloutTenant, error) {
	var t RolloutTenant
	err := row.Scan(&t.Tenant, &t.Cluster, &t.Mode, &t.FromVersion, &t.Version, &t.State, &t.Error, &t.Attempts,
		&t.StartedAt, &t.FinishedAt)
	return t, err
}

// RolloutTenants lists a rollout's tenants in the given states (all with
// none), failed first, then running, pending, skipped and done.
func (s *Store) RolloutTenants(ctx context.Context, id int64, states []RolloutTenantState, limit int) ([]RolloutTenant, error) {
	if limit <= 0 || limit > 100000 {
		limit = 1000
	}
	if states == nil {
		states = []RolloutTenantState{}
	}
	rows, err := s.pool.Query(ctx, `SELECT `+rolloutTenantColumns+` FROM rollout_tenants
		WHERE rollout = $1 AND (cardinality($2::text[]) = 0 OR state = ANY($2))
		ORDER BY array_position(ARRAY['failed', 'running', 'pending', 'skipped', 'done'], state), tenant
		LIMIT $3`, id, states, limit)
	if err != nil {
		return nil, err
	}
	return pgx.CollectRows(rows, func(r pgx.CollectableRow) (RolloutTenant, error) { return scanRolloutTenant(r) })
}

// RolloutWork is a tenant a rollout still has to move, with what the catalog
// says of it now (Tenant.ID is empty when the tenant is gone).
type RolloutWork struct {
	RolloutTenant
	Tenant Tenant
}

// PendingRolloutTenants returns a rollout's pending and running tenants (a
// running one was in flight when a daemon stopped) with their catalog rows.
func (s *Store) PendingRolloutTenants(ctx context.Context, id int64) ([]RolloutWork, error) {
	rows, err := s.pool.Query(ctx, `SELECT rt.tenant, rt.cluster, rt.mode, rt.from_version, rt.version, rt.state, rt.error,
		rt.attempts, rt.started_at, rt.finished_at, `+tenantColumnsNullable+`
		FROM rollout_tenants rt LEFT JOIN tenants t ON t.id = rt.tenant
		WHERE rt.rollout = $1 AND rt.state IN ('pending', 'running') ORDER BY rt.tenant`, id)
	if err != nil {
		return nil, err
	}
	return pgx.CollectRows(rows, func(r pgx.CollectableRow) (RolloutWork, error) {
		var w RolloutWork
		var t nullableTenant
		err := r.Scan(&w.RolloutTenant.Tenant, &w.Cluster, &w.Mode, &w.FromVersion, &w.Version, &w.State, &w.Error,
			&w.Attempts, &w.StartedAt, &w.FinishedAt,
			&t.id, &t.name, &t.externalID, &t.mode, &t.cluster, &t.template, &t.version, &t.tier, &t.state, &t.database)
		if t.id != nil {
			w.Tenant = Tenant{ID: *t.id, Name: *t.name, ExternalID: *t.externalID, Mode: tenant.Mode(*t.mode), Cluster: *t.cluster,
				Template: *t.template, Version: *t.version, Tier: *t.tier, State: TenantState(*t.state), Database: *t.database}
		}
		return w, err
	})
}

const tenantColumnsNullable = `t.id, t.name, coalesce(t.external_id, ''), t.mode, t.cluster, t.template, t.version, t.tier,
	t.state, t.database`

type nullableTenant struct {
	id, name, externalID, mode, cluster, template, tier, state, database *string
	version                                                              *int
}

// RolloutOutcome is what became of a tenant in a rollout: the version it
// has committed inside itself and, once settled, its state (done, failed,
// skipped) with the reason; an empty State leaves the state as it is.
type RolloutOutcome struct {
	Tenant   string
	Version  int
	State    RolloutTenantState
	Error    string
	Attempts int // transactions tried
}

// RecordRollout records, in one catalog transaction, the tenants a rollout
// has started and what became of others: their catalog version (never
// lowered), their rollout rows and a "migrated" event for each done one.
// Rollouts batch these writes: a tenant's version is committed inside the
// tenant first (its marker), so a batch lost in a crash is caught up when
// the rollout resumes, and the commit need not wait for the WAL flush.
func (s *Store) RecordRollout(ctx context.Context, id int64, started []string, outcomes []RolloutOutcome) error {
	if len(started) == 0 && len(outcomes) == 0 {
		return nil
	}
	if started == nil {
		started = []string{}
	}
	n := len(outcomes)
	tenants, states, errs := make([]string, n), make([]string, n), make([]string, n)
	versions, attempts := make([]int32, n), make([]int32, n)
	for i, o := range outcomes {
		tenants[i], states[i], errs[i], versions[i], attempts[i] = o.Tenant, string(o.State), o.Error, int32(o.Version), int32(o.Attempts)
	}
	return pgx.BeginFunc(ctx, s.pool, func(tx pgx.Tx) error {
		batch := &pgx.Batch{}
		batch.Queue(`SET LOCAL synchronous_commit = off`)
		batch.Queue(`UPDATE rollout_tenants SET state = 'running', started_at = coalesce(started_at, now())
			WHERE rollout = $1 AND tenant = ANY($2) AND state = 'pending'`, id, started)
		batch.Queue(`UPDATE tenants t SET version = u.version, updated_at = now()
			FROM unnest($1::text[], $2::int[]) u (id, version) WHERE t.id = u.id AND t.version < u.version`, tenants, versions)
		batch.Queue(`INSERT INTO tenant_events (tenant, kind, detail)
			SELECT r.tenant, 'migrated', jsonb_build_object('from', r.from_version, 'to', u.version, 'rollout', r.rollout)
			FROM unnest($2::text[], $3::int[], $4::text[]) u (tenant, version, state)
			JOIN rollout_tenants r ON r.rollout = $1 AND r.tenant = u.tenant
			JOIN tenants t ON t.id = u.tenant
			WHERE u.state = 'done' AND r.state <> 'done'`, id, tenants, versions, states)
		batch.Queue(`UPDATE rollout_tenants r SET version = greatest(r.version, u.version),
			state = CASE WHEN u.state = '' THEN r.state ELSE u.state END,
			error = CASE WHEN u.state = '' THEN r.error ELSE u.error END,
			finished_at = CASE WHEN u.state = '' THEN r.finished_at ELSE now() END,
			started_at = CASE WHEN u.attempts > 0 THEN coalesce(r.started_at, now()) ELSE r.started_at END,
			attempts = r.attempts + u.attempts
			FROM unnest($2::text[], $3::int[], $4::text[], $5::text[], $6::int[]) u (tenant, version, state, error, attempts)
			WHERE r.rollout = $1 AND r.tenant = u.tenant`, id, tenants, versions, states, errs, attempts)
		return tx.SendBatch(ctx, batch).Close()
	})
}

// RetryRolloutTenants sets a rollout's failed tenants (or the one named)
// back to pending and returns how many.
func (s *Store) RetryRolloutTenants(ctx context.Context, q Querier, id int64, tenant string) (int, error) {
	tag, err := q.Exec(ctx, `UPDATE rollout_tenants SET state = 'pending', error = '', finished_at = NULL
		WHERE rollout = $1 AND state = 'failed' AND ($2 = '' OR tenant = $2)`, id, tenant)
	if err != nil {
		return 0, err
	}
	return int(tag.RowsAffected()), nil
}
