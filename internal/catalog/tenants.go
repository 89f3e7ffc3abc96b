package catalog

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/pgtenant/pgtenant/internal/cluster"
	"github.com/pgtenant/pgtenant/internal/tenant"
)

// Querier is a pool or a transaction, so that callers can group writes.
type Querier interface {
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}

// TenantState is where a tenant (or a spare) is: tenants.state.
type TenantState string

// Tenant states.
const (
	StateBuilding     TenantState = "building"     // a spare being made
	StateSpare        TenantState = "spare"        // ready, unclaimed, unusable
	StateProvisioning TenantState = "provisioning" // a tenant made on the cold path
	StateActive       TenantState = "active"
	StateSuspended    TenantState = "suspended"
	StateDropped      TenantState = "dropped" // soft-deleted, restorable until purge_after
	StatePurging      TenantState = "purging"
	StatePurged       TenantState = "purged" // gone from the cluster; the row and its events kept for drop.purged_retention
	StateFailed       TenantState = "failed"
)

// ListedStates are the states of tenants (not spares) that lists filter on.
var ListedStates = []TenantState{StateProvisioning, StateActive, StateSuspended, StateDropped, StatePurging, StatePurged, StateFailed}

// Tenant is one row of tenants (spares included).
type Tenant struct {
	ID         string      `json:"id"`
	Name       string      `json:"name"`
	ExternalID string      `json:"external_id,omitempty"`
	Mode       tenant.Mode `json:"mode"`
	Cluster    string      `json:"cluster"`
	// Front is the cluster whose pooler holds the tenant's entry (its DSN)
	// when that is not its own cluster: a tenant moved keeps the front
	// door it had. "" for every tenant that never moved.
	Front      string      `json:"front,omitempty"`
	Template   string      `json:"template"`
	Version    int         `json:"version"`
	Tier       string      `json:"tier"`
	State      TenantState `json:"state"`
	Database   string      `json:"database"`
	CreatedAt  time.Time   `json:"created_at"`
	UpdatedAt  time.Time   `json:"updated_at"`
	ClaimedAt  *time.Time  `json:"claimed_at,omitempty"` // asked for: claimed from the pool, or a cold create's request; nil for spares
	DroppedAt  *time.Time  `json:"dropped_at,omitempty"`
	PurgeAfter *time.Time  `json:"purge_after,omitempty"`
	PurgedAt   *time.Time  `json:"purged_at,omitempty"` // a purged tenant's tombstone only
	// DroppedFrom is the state a dropped tenant had before its drop
	// (active or suspended): what restore brings back.
	DroppedFrom TenantState `json:"dropped_from,omitempty"`
	// Allow are the client networks (CIDR) its logins may come from
	// through the front door; none: any.
	Allow []string `json:"allow,omitempty"`
	// Pins are labels (k=v) its cluster must carry (data residency):
	// placement, drains, rebalances and moves keep it on such clusters.
	Pins []string `json:"labels,omitempty"`
}

// IsSpare reports whether the row is a spare rather than a tenant: being
// built, ready, or retired and being purged without ever being claimed.
// Spares are never listed nor shown.
func (t Tenant) IsSpare() bool {
	return t.State == StateBuilding || t.State == StateSpare || (t.State == StatePurging && t.ClaimedAt == nil)
}

// notSpare is IsSpare's negation in SQL, over the tenants table.
const notSpare = `state NOT IN ('building', 'spare') AND NOT (state = 'purging' AND claimed_at IS NULL)`

const tenantColumns = `id, name, coalesce(external_id, ''), mode, cluster, coalesce(front, ''), template, version, tier, state, database,
	created_at, updated_at, claimed_at, dropped_at, purge_after, coalesce(dropped_from, ''), allow_cidrs, pins`

func scanTenant(row pgx.Row) (Tenant, error) {
	var t Tenant
	err := row.Scan(&t.ID, &t.Name, &t.ExternalID, &t.Mode, &t.Cluster, &t.Front, &t.Template, &t.Version, &t.Tier, &t.State,
		&t.Database, &t.CreatedAt, &t.UpdatedAt, &t.ClaimedAt, &t.DroppedAt, &t.PurgeAfter, &t.DroppedFrom, &t.Allow, &t.Pins)
	if len(t.Allow) == 0 {
		t.Allow = nil
	}
	if len(t.Pins) == 0 {
		t.Pins = nil
	}
	return t, err
}

// Changeable refuses a change (doing, such as "set its tier") of a tenant
// that is not active or suspended: a spare is not found, the others are a
// conflict saying what to do.
func (t Tenant) Changeable(doing string) error {
	switch {
	case t.IsSpare():
		return fmt.Errorf("tenant %q: %w", t.ID, ErrNotFound)
	case t.State == StateActive, t.State == StateSuspended:
		return nil
	case t.State == StateProvisioning:
		return fmt.Errorf("%w: tenant %s is still being provisioned; %s once it is active", ErrConflict, t.ID, doing)
	case t.State == StateDropped:
		return fmt.Errorf("%w: tenant %s is dropped; restore it first (`pgtenant tenant restore %s`)", ErrConflict, t.ID, t.ID)
	}
	return fmt.Errorf("%w: tenant %s is %s: it is being removed", ErrConflict, t.ID, t.State)
}

// FrontCluster is the cluster whose pooler serves the tenant's DSN.
func (t Tenant) FrontCluster() string {
	if t.Front != "" {
		return t.Front
	}
	return t.Cluster
}

// MoveTenant records a tenant on cluster to (it was on from), keeping the
// front door it had: the switch of a move, in the caller's transaction.
// ErrConflict if the tenant is no longer on from.
func (s *Store) MoveTenant(ctx context.Context, q Querier, id, from, to string) error {
	tag, err := q.Exec(ctx, `UPDATE tenants SET cluster = $3,
		front = CASE WHEN coalesce(front, cluster) = $3 THEN NULL ELSE coalesce(front, cluster) END, updated_at = now()
		WHERE id = $1 AND cluster = $2`, id, from, to)
	if err == nil && tag.RowsAffected() == 0 {
		err = fmt.Errorf("%w: tenant %s is not on cluster %s", ErrConflict, id, from)
	}
	if err == nil {
		// Its analytics mirror read the copy left behind: stale from now
		// until it is copied again from the new one (it then reports).
		_, err = q.Exec(ctx, `UPDATE analytics SET state = 'copying', lag_bytes = 0, error = $2 WHERE tenant = $1 AND state <> 'disabling'`,
			id, fmt.Sprintf("the tenant moved to cluster %s: its mirror is being copied again from there", to))
	}
	return err
}

func nullIfEmpty(s string) *string {
	if s == "" {
		return nil
	}
	return &s
}

// InsertTenant adds a tenant row. A duplicate external id is ErrConflict. A
// tenant inserted provisioning (a cold create) is asked for now: its
// claimed_at is set, as a pool claim sets it, so that pools count it as demand.
func (s *Store) InsertTenant(ctx context.Context, q Querier, t Tenant) error {
	_, err := q.Exec(ctx, `INSERT INTO tenants (id, name, external_id, mode, cluster, template, version, tier, state, database, pins, claimed_at)
		VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, CASE WHEN $9 = 'provisioning' THEN now() END)`,
		t.ID, t.Name, nullIfEmpty(t.ExternalID), t.Mode, t.Cluster, t.Template, t.Version, t.Tier, t.State, t.Database, nonNil(t.Pins))
	if errors.Is(cluster.Classify(err), cluster.ErrUniqueViolation) {
		return fmt.Errorf("%w: tenant with external id %q exists", ErrConflict, t.ExternalID)
	}
	return err
}

// GetTenant returns a tenant by id.
func (s *Store) GetTenant(ctx context.Context, q Querier, id string) (Tenant, error) {
	if q == nil {
		q = s.pool
	}
	t, err := scanTenant(q.QueryRow(ctx, `SELECT `+tenantColumns+` FROM tenants WHERE id = $1`, id))
	return t, notFound(err, "tenant "+id)
}

// TenantByExternalID returns the tenant with an external id.
func (s *Store) TenantByExternalID(ctx context.Context, externalID string) (Tenant, error) {
	t, err := scanTenant(s.pool.QueryRow(ctx, `SELECT `+tenantColumns+` FROM tenants WHERE external_id = $1`, externalID))
	return t, notFound(err, "tenant with external id "+externalID)
}

// TenantFilter narrows ListTenants. Spares (building/spare) are listed only
// when State names them; retired spares being purged never are. State
// purged lists the tombstones of purged tenants.
type TenantFilter struct {
	State TenantState
	// States: any of these (with State empty).
	States  []TenantState
	Cluster string
	// Front lists the tenants whose DSN goes through this cluster's pooler.
	Front    string
	Template string
	Mode     tenant.Mode
	Tier     string
	// Search matches the id exactly, or part of the name or external id
	// (case-insensitive; % and _ are literal).
	Search string
	Limit  int
	After  string // id cursor
}

// ListTenants returns tenants ordered by id.
func (s *Store) ListTenants(ctx context.Context, f TenantFilter) ([]Tenant, error) {
	if f.Limit <= 0 || f.Limit > 100000 {
		f.Limit = 1000
	}
	if f.State == StatePurged {
		return s.listPurged(ctx, f)
	}
	q, args := listTenantsQuery(f)
	rows, err := s.pool.Query(ctx, q, args...)
	if err != nil {
		return nil, err
	}
	return pgx.CollectRows(rows, func(r pgx.CollectableRow) (Tenant, error) { return scanTenant(r) })
}

// listTenantsQuery is ListTenants's statement for f. Only the filters
// given reach it, so that the planner sees them: a search uses the trigram
// indexes, a cluster's page its index (at a million tenants a filter
// folded into "the parameter is empty OR …" scanned them all).
func listTenantsQuery(f TenantFilter) (string, []any) {
	var args []any
	arg := func(v any) string {
		args = append(args, v)
		return "$" + strconv.Itoa(len(args))
	}
	where := []string{notSpare}
	if f.State != "" {
		where = []string{"state = " + arg(f.State) + " AND NOT (state = 'purging' AND claimed_at IS NULL)"}
	} else if len(f.States) > 0 {
		states := make([]string, len(f.States))
		for i, st := range f.States {
			states[i] = string(st)
		}
		where = []string{"state = ANY(" + arg(states) + ") AND NOT (state = 'purging' AND claimed_at IS NULL)"}
	}
	for _, eq := range []struct{ col, v string }{{"cluster", f.Cluster}, {"template", f.Template}, {"mode", string(f.Mode)},
		{"tier", f.Tier}, {"coalesce(front, cluster)", f.Front}} {
		if eq.v != "" {
			where = append(where, eq.col+" = "+arg(eq.v))
		}
	}
	if f.After != "" {
		where = append(where, "id > "+arg(f.After))
	}
	if f.Search != "" {
		like := "'%' || " + arg(likeEscape(f.Search)) + " || '%'"
		where = append(where, "(id = "+arg(f.Search)+" OR name ILIKE "+like+" OR external_id ILIKE "+like+")")
	}
	return `SELECT ` + tenantColumns + ` FROM tenants WHERE ` + strings.Join(where, " AND ") + ` ORDER BY id LIMIT ` + arg(f.Limit), args
}

// likeEscape makes s match itself in a LIKE pattern (escape character \).
func likeEscape(s string) string {
	return strings.NewReplacer(`\`, `\\`, `%`, `\%`, `_`, `\_`).Replace(s)
}

// ClaimSpare locks the oldest ready spare of a pool in tx, or returns
// ErrNotFound when the pool is empty. SKIP LOCKED lets concurrent claims take
// different spares.
func (s *Store) ClaimSpare(ctx context.Context, tx pgx.Tx, cluster, template string, version int, mode tenant.Mode) (Tenant, error) {
	t, err := scanTenant(tx.QueryRow(ctx, `SELECT `+tenantColumns+` FROM tenants
		WHERE state = 'spare' AND cluster = $1 AND template = $2 AND version = $3 AND mode = $4
		ORDER BY created_at LIMIT 1 FOR UPDATE SKIP LOCKED`, cluster, template, version, mode))
	return t, notFound(err, "spare")
}

// ActivateTenant turns a claimed spare into an active
// tenant with the caller's name, external id and tier, and returns the row.
func (s *Store) ActivateTenant(ctx context.Context, q Querier, t Tenant) (Tenant, error) {
	// A spare's created_at was when it was built; from its claim on it is
	// when the tenant was created (a cold create's row was inserted at its
	// request: its created_at stays).
	out, err := scanTenant(q.QueryRow(ctx, `UPDATE tenants SET state = 'active', name = $2, external_id = $3, tier = $4, pins = $5,
		created_at = CASE WHEN state = 'spare' THEN now() ELSE created_at END,
		claimed_at = now(), updated_at = now() WHERE id = $1 RETURNING `+tenantColumns, t.ID, t.Name, nullIfEmpty(t.ExternalID), t.Tier, nonNil(t.Pins)))
	if errors.Is(cluster.Classify(err), cluster.ErrUniqueViolation) {
		return Tenant{}, fmt.Errorf("%w: tenant with external id %q exists", ErrConflict, t.ExternalID)
	}
	return out, notFound(err, "tenant "+t.ID)
}

// SetTenantState moves a tenant from one of the states in from to state. It
// returns ErrConflict if the tenant is in none of them.
func (s *Store) SetTenantState(ctx context.Context, q Querier, id string, state TenantState, from ...TenantState) error {
	tag, err := q.Exec(ctx, `UPDATE tenants SET state = $2, updated_at = now() WHERE id = $1 AND state = ANY($3)`, id, state, from)
	if err != nil {
		return err
	}
	if tag.RowsAffected() == 0 {
		t, err := s.GetTenant(ctx, q, id)
		if err != nil {
			return err
		}
		return fmt.Errorf("%w: tenant %s is %s, not %v", ErrConflict, id, t.State, from)
	}
	return nil
}

// SetTenantVersion records the template version a tenant's storage is at
// (a fork or a rewind brings one back from a backup).
func (s *Store) SetTenantVersion(ctx context.Context, q Querier, id string, version int) error {
	_, err := q.Exec(ctx, `UPDATE tenants SET version = $2, updated_at = now() WHERE id = $1`, id, version)
	return err
}

// SetTenantAllow records a tenant's allowlist (nil: any address).
func (s *Store) SetTenantAllow(ctx context.Context, q Querier, id string, allow []string) error {
	_, err := q.Exec(ctx, `UPDATE tenants SET allow_cidrs = $2, updated_at = now() WHERE id = $1`, id, nonNil(allow))
	return err
}

// SetTenantPins records a tenant's placement pins (nil: none).
func (s *Store) SetTenantPins(ctx context.Context, q Querier, id string, pins []string) error {
	_, err := q.Exec(ctx, `UPDATE tenants SET pins = $2, updated_at = now() WHERE id = $1`, id, nonNil(pins))
	return err
}

// nonNil is an empty array for nil: the text[] columns are NOT NULL.
func nonNil(s []string) []string {
	if s == nil {
		return []string{}
	}
	return s
}

// SetTenantTier records a tenant's tier (a tier change, in place or at a
// move's switch).
func (s *Store) SetTenantTier(ctx context.Context, q Querier, id, tier string) error {
	_, err := q.Exec(ctx, `UPDATE tenants SET tier = $2, updated_at = now() WHERE id = $1`, id, tier)
	return err
}

// DropTenant soft-deletes a tenant: dropped, remembering the state it had
// (what a restore brings back), to be purged after retention. The caller
// holds the row (LockTenant) and has checked its state.
func (s *Store) DropTenant(ctx context.Context, q Querier, id string, retention time.Duration) error {
	_, err := q.Exec(ctx, `UPDATE tenants SET state = 'dropped', dropped_at = now(), dropped_from = state,
		purge_after = now() + make_interval(secs => $2), updated_at = now() WHERE id = $1`, id, retention.Seconds())
	return err
}

// RestoreTenant brings a dropped tenant back to state (the one it was
// dropped from), clearing its deletion clock. The caller holds the row
// (LockTenant) and has checked its state.
func (s *Store) RestoreTenant(ctx context.Context, q Querier, id string, state TenantState) error {
	_, err := q.Exec(ctx, `UPDATE tenants SET state = $2, updated_at = now(),
		dropped_at = NULL, purge_after = NULL, dropped_from = NULL WHERE id = $1`, id, state)
	return err
}

// ExpiredDrops lists dropped tenants whose retention has ended, the
// longest expired first, at most 1000.
func (s *Store) ExpiredDrops(ctx context.Context) ([]string, error) {
	rows, err := s.pool.Query(ctx, `SELECT id FROM tenants WHERE state = 'dropped' AND purge_after <= now() ORDER BY purge_after LIMIT 1000`)
	if err != nil {
		return nil, err
	}
	return pgx.CollectRows(rows, pgx.RowTo[string])
}

// DeleteTenant removes a tenant row and its events, leaving nothing.
func (s *Store) DeleteTenant(ctx context.Context, q Querier, id string) error {
	_, err := q.Exec(ctx, `WITH e AS (DELETE FROM tenant_events WHERE tenant = $1) DELETE FROM tenants WHERE id = $1`, id)
	return err
}

// ForgetTenant removes a purged tenant's row. A tenant that was claimed
// (not a spare) is remembered with keep > 0: its row moves to
// purged_tenants with a purged event and its events stay, until
// SweepPurged removes them. A spare, or keep == 0, leaves nothing. Done
// in one transaction: a crash leaves the row or its tombstone, and the
// purge's catalog step runs again.
func (s *Store) ForgetTenant(ctx context.Context, id string, keep bool, detail any) error {
	return pgx.BeginFunc(ctx, s.pool, func(tx pgx.Tx) error {
		t, err := s.LockTenant(ctx, tx, id)
		if errors.Is(err, ErrNotFound) {
			return nil // forgotten already
		}
		if err != nil {
			return err
		}
		if !keep || t.ClaimedAt == nil {
			return s.DeleteTenant(ctx, tx, id)
		}
		if err := s.AddEvent(ctx, tx, id, "purged", detail); err != nil {
			return err
		}
		if _, err := tx.Exec(ctx, `INSERT INTO purged_tenants (id, name, external_id, mode, cluster, template, version, tier, database,
			created_at, claimed_at, dropped_at)
			SELECT id, name, external_id, mode, cluster, template, version, tier, database, created_at, claimed_at, dropped_at
			FROM tenants WHERE id = $1 ON CONFLICT (id) DO NOTHING`, id); err != nil {
			return err
		}
		_, err = tx.Exec(ctx, `DELETE FROM tenants WHERE id = $1`, id)
		return err
	})
}

const purgedColumns = `id, name, coalesce(external_id, ''), mode, cluster, template, version, tier, 'purged', database,
	created_at, purged_at, claimed_at, dropped_at, NULL::timestamptz, '', purged_at`

func scanPurged(row pgx.Row) (Tenant, error) {
	var t Tenant
	err := row.Scan(&t.ID, &t.Name, &t.ExternalID, &t.Mode, &t.Cluster, &t.Template, &t.Version, &t.Tier, &t.State,
		&t.Database, &t.CreatedAt, &t.UpdatedAt, &t.ClaimedAt, &t.DroppedAt, &t.PurgeAfter, &t.DroppedFrom, &t.PurgedAt)
	return t, err
}

// GetPurged returns the tombstone of a purged tenant (state purged), or
// ErrNotFound.
func (s *Store) GetPurged(ctx context.Context, id string) (Tenant, error) {
	t, err := scanPurged(s.pool.QueryRow(ctx, `SELECT `+purgedColumns+` FROM purged_tenants WHERE id = $1`, id))
	return t, notFound(err, "tenant "+id)
}

func (s *Store) listPurged(ctx context.Context, f TenantFilter) ([]Tenant, error) {
	rows, err := s.pool.Query(ctx, `SELECT `+purgedColumns+` FROM purged_tenants
		WHERE ($1 = '' OR cluster = $1) AND ($2 = '' OR template = $2) AND ($3 = '' OR mode = $3) AND id > $4
		  AND ($6 = '' OR tier = $6)
		  AND ($7 = '' OR id = $7 OR name ILIKE '%' || $8 || '%' OR external_id ILIKE '%' || $8 || '%')
		ORDER BY id LIMIT $5`, f.Cluster, f.Template, f.Mode, f.After, f.Limit, f.Tier, f.Search, likeEscape(f.Search))
	if err != nil {
		return nil, err
	}
	return pgx.CollectRows(rows, func(r pgx.CollectableRow) (Tenant, error) { return scanPurged(r) })
}

// SweepPurged forgets the tombstones (and their events) of tenants purged
// more than keep ago, at most 1000 at a time, and returns how many.
func (s *Store) SweepPurged(ctx context.Context, keep time.Duration) (int, error) {
	var n int
	err := s.pool.QueryRow(ctx, `WITH gone AS (
			DELETE FROM purged_tenants WHERE id IN (SELECT id FROM purged_tenants
				WHERE purged_at < now() - make_interval(secs => $1) ORDER BY purged_at LIMIT 1000)
			RETURNING id),
		e AS (DELETE FROM tenant_events WHERE tenant IN (SELECT id FROM gone))
		SELECT count(*) FROM gone`, keep.Seconds()).Scan(&n)
	return n, err
}

// PoolCount is a pool's spares by state.
type PoolCount struct {
	Ready    int // spare
	Building int // being built
	Retiring int // never claimed, being purged (retired above the pool's size)
}

// CountPool counts a pool's spares: ready, being built, and being retired.
func (s *Store) CountPool(ctx context.Context, q Querier, cluster, template string, version int, mode tenant.Mode) (PoolCount, error) {
	var c PoolCount
	err := q.QueryRow(ctx, `SELECT count(*) FILTER (WHERE state = 'spare'), count(*) FILTER (WHERE state = 'building'),
		count(*) FILTER (WHERE state = 'purging' AND claimed_at IS NULL)
		FROM tenants WHERE cluster = $1 AND template = $2 AND version = $3 AND mode = $4 AND state IN ('spare', 'building', 'purging')`,
		cluster, template, version, mode).Scan(&c.Ready, &c.Building, &c.Retiring)
	return c, err
}

// PoolKey names a pool: its cluster, template and mode (of any version).
type PoolKey struct {
	Cluster, Template string
	Mode              tenant.Mode
}

// PoolDemand is what a pool was asked for lately.
type PoolDemand struct {
	Recent int       // creates within the window that ends at the latest one
	Last   time.Time // the latest create
}

// PoolDemands reads, in one query for every pool, the latest create (a
// tenant claimed from the pool or created cold, by claimed_at) within
// lookback, and the creates within window before it. Counting back from the
// latest create rather than from now keeps a burst's size while its cold
// builds are still being served (a pool cannot grow until they are) and
// until the pool goes idle. A pool with no create within lookback is absent.
func (s *Store) PoolDemands(ctx context.Context, window, lookback time.Duration) (map[PoolKey]PoolDemand, error) {
	rows, err := s.pool.Query(ctx, `SELECT cluster, template, mode,
		count(*) FILTER (WHERE claimed_at > last - make_interval(secs => $1)), last
		FROM (SELECT cluster, template, mode, claimed_at, max(claimed_at) OVER (PARTITION BY cluster, template, mode) AS last
		      FROM tenants WHERE claimed_at > now() - make_interval(secs => $2)) recent
		GROUP BY cluster, template, mode, last`, window.Seconds(), max(window, lookback).Seconds())
	if err != nil {
		return nil, err
	}
	out := map[PoolKey]PoolDemand{}
	var k PoolKey
	var d PoolDemand
	_, err = pgx.ForEachRow(rows, []any{&k.Cluster, &k.Template, &k.Mode, &d.Recent, &d.Last}, func() error {
		out[k] = d
		return nil
	})
	return out, err
}

// NewestSpare returns a pool's most recently built ready spare, or
// ErrNotFound.
func (s *Store) NewestSpare(ctx context.Context, cluster, template string, version int, mode tenant.Mode) (Tenant, error) {
	t, err := scanTenant(s.pool.QueryRow(ctx, `SELECT `+tenantColumns+` FROM tenants
		WHERE state = 'spare' AND cluster = $1 AND template = $2 AND version = $3 AND mode = $4
		ORDER BY created_at DESC LIMIT 1`, cluster, template, version, mode))
	return t, notFound(err, "spare")
}

// StaleSpares lists ready spares of versions older than the template's
// current one.
func (s *Store) StaleSpares(ctx context.Context) ([]Tenant, error) {
	rows, err := s.pool.Query(ctx, `SELECT `+tenantColumns+` FROM tenants
		WHERE state = 'spare' AND version < (SELECT current_version FROM templates WHERE name = tenants.template) ORDER BY id`)
	if err != nil {
		return nil, err
	}
	return pgx.CollectRows(rows, func(r pgx.CollectableRow) (Tenant, error) { return scanTenant(r) })
}

// Event is one entry of a tenant's history.
type Event struct {
	At     time.Time       `json:"at"`
	Kind   string          `json:"kind"`
	Detail json.RawMessage `json:"detail,omitempty"`
}

// AddEvent appends to a tenant's history.
func (s *Store) AddEvent(ctx context.Context, q Querier, tenant, kind string, detail any) error {
	b, err := json.Marshal(detail)
	if err != nil {
		return err
	}
	if detail == nil {
		b = []byte("{}")
	}
	_, err = q.Exec(ctx, `INSERT INTO tenant_events (tenant, kind, detail) VALUES ($1, $2, $3)`, tenant, kind, b)
	return err
}

// Events returns a tenant's history, oldest first.
func (s *Store) Events(ctx context.Context, tenant string) ([]Event, error) {
	rows, err := s.pool.Query(ctx, `SELECT at, kind, detail FROM tenant_events WHERE tenant = $1 ORDER BY id`, tenant)
	if err != nil {
		return nil, err
	}
	return pgx.CollectRows(rows, func(r pgx.CollectableRow) (Event, error) {
		var e Event
		return e, r.Scan(&e.At, &e.Kind, &e.Detail)
	})
}

// TenantCounts counts tenants by cluster (spares excluded), for placement.
func (s *Store) TenantCounts(ctx context.Context) (map[string]int, error) {
	rows, err := s.pool.Query(ctx, `SELECT cluster, count(*) FROM tenants WHERE `+notSpare+` GROUP BY cluster`)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	out := map[string]int{}
	for rows.Next() {
		var c string
		var n int
		if err := rows.Scan(&c, &n); err != nil {
			return nil, err
		}
		out[c] = n
	}
	return out, rows.Err()
}

// TierCounts counts, per cluster and tier, the tenants that hold a share
// of the cluster's connections (every claimed tenant not being purged:
// provisioning, active, suspended, dropped and restorable).
func (s *Store) TierCounts(ctx context.Context) (map[string]map[string]int, error) {
	rows, err := s.pool.Query(ctx, `SELECT cluster, tier, count(*) FROM tenants
		WHERE state IN ('provisioning', 'active', 'suspended', 'dropped') GROUP BY cluster, tier`)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	out := map[string]map[string]int{}
	for rows.Next() {
		var c, tier string
		var n int
		if err := rows.Scan(&c, &tier, &n); err != nil {
			return nil, err
		}
		if out[c] == nil {
			out[c] = map[string]int{}
		}
		out[c][tier] = n
	}
	return out, rows.Err()
}

// VersionDistribution counts a template's tenants by version: active,
// suspended, dropped (restorable) and being provisioned; not spares, nor
// tenants being purged.
func (s *Store) VersionDistribution(ctx context.Context, template string) (map[int]int, error) {
	rows, err := s.pool.Query(ctx, `SELECT version, count(*) FROM tenants
		WHERE template = $1 AND state IN ('provisioning', 'active', 'suspended', 'dropped') GROUP BY version`, template)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	out := map[int]int{}
	for rows.Next() {
		var v, n int
		if err := rows.Scan(&v, &n); err != nil {
			return nil, err
		}
		out[v] = n
	}
	return out, rows.Err()
}

// ListTenantsOnCluster returns every tenant row of a cluster, spares included.
func (s *Store) ListTenantsOnCluster(ctx context.Context, cluster string) ([]Tenant, error) {
	rows, err := s.pool.Query(ctx, `SELECT `+tenantColumns+` FROM tenants WHERE cluster = $1 ORDER BY id`, cluster)
	if err != nil {
		return nil, err
	}
	return pgx.CollectRows(rows, func(r pgx.CollectableRow) (Tenant, error) { return scanTenant(r) })
}

// LockTenant reads a tenant FOR UPDATE in tx.
func (s *Store) LockTenant(ctx context.Context, tx pgx.Tx, id string) (Tenant, error) {
	t, err := scanTenant(tx.QueryRow(ctx, `SELECT `+tenantColumns+` FROM tenants WHERE id = $1 FOR UPDATE`, id))
	return t, notFound(err, "tenant "+id)
}
