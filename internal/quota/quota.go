// Package quota enforces each tier's limits that PostgreSQL itself cannot,
// or that a tenant could undo: storage quotas, following Heroku's state
// machine (ok → warning → grace → enforced → back to ok), and, from outside,
// the tier's session limits (capper.go: statement cap and timeout, idle
// transactions, the role defaults a tenant changed, on every node). It is
// told tenant sizes by the metrics collector and records every transition
// and every action as a tenant event. While a quota is enforced the tenant
// keeps SELECT, DELETE and TRUNCATE and loses INSERT, UPDATE and CREATE
// (enforce.go says how, and why the tenant cannot undo it). It touches
// nothing but the tenant's own objects, grants, role settings and sessions,
// and its own lock role.
package quota

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pgtenant/pgtenant/internal/catalog"
	"github.com/pgtenant/pgtenant/internal/cluster"
	"github.com/pgtenant/pgtenant/internal/config"
	"github.com/pgtenant/pgtenant/internal/metrics"
	"github.com/pgtenant/pgtenant/internal/tenant"
)

// Events a tenant's history gets, one per transition.
const (
	EventWarning   = "quota_warning"    // ok → warning: above storage_warn
	EventOK        = "quota_ok"         // warning → ok: back under storage_warn
	EventExceeded  = "quota_exceeded"   // → grace: above storage_quota, the grace period starts
	EventBackUnder = "quota_back_under" // grace → ok/warning: under the quota before the grace ended
	EventEnforced  = "quota_enforced"   // grace → enforced: INSERT/UPDATE/CREATE revoked
	EventRestored  = "quota_restored"   // enforced → ok/warning: rights given back
)

// Service evaluates storage quotas and enforces them.
type Service struct {
	Store    *catalog.Store
	Clusters *cluster.Registry
	Tiers    map[string]config.Tier // the quotas
	Logger   *slog.Logger
	// Now is the clock (tests may replace it).
	Now func() time.Time
}

func (s *Service) now() time.Time {
	if s.Now != nil {
		return s.Now()
	}
	return time.Now()
}

func (s *Service) log() *slog.Logger {
	if s.Logger == nil {
		return slog.New(slog.DiscardHandler)
	}
	return s.Logger.With("component", "quota")
}

// Transition is one step of the state machine.
type Transition struct {
	From, To, Event string
}

// Next evaluates a tenant's quota state for a size: the new state and the
// transitions that lead there (none when nothing changes). It is pure.
//
//	ok       → warning  size > storage_warn
//	ok, warning → grace size > storage_quota (the grace period starts)
//	warning  → ok       size ≤ storage_warn
//	grace    → ok/warning   size ≤ storage_quota
//	grace    → enforced size still > storage_quota when storage_grace has passed
//	enforced → ok/warning   size ≤ storage_quota
//
// A tier without a quota (or a warning) brings a tenant back to ok.
func Next(q catalog.Quota, size int64, tier config.Tier, now time.Time) (catalog.Quota, []Transition) {
	var out []Transition
	for range 3 { // at most ok → grace → enforced (a zero grace) in one evaluation
		to, event := step(q, size, tier, now)
		if to == q.State {
			break
		}
		out = append(out, Transition{From: q.State, To: to, Event: event})
		switch to {
		case catalog.QuotaGrace:
			q.OverSince = &now
		case catalog.QuotaOK, catalog.QuotaWarning:
			q.OverSince = nil
		}
		q.State, q.Since = to, now
	}
	if len(out) > 0 {
		q.SizeBytes = size
	}
	return q, out
}

func step(q catalog.Quota, size int64, tier config.Tier, now time.Time) (string, string) {
	over := tier.StorageQuota > 0 && size > int64(tier.StorageQuota)
	warn := tier.StorageWarn > 0 && size > int64(tier.StorageWarn)
	under := catalog.QuotaOK
	if warn {
		under = catalog.QuotaWarning
	}
	switch q.State {
	case catalog.QuotaOK, "":
		switch {
		case over:
			return catalog.QuotaGrace, EventExceeded
		case warn:
			return catalog.QuotaWarning, EventWarning
		}
		return catalog.QuotaOK, ""
	case catalog.QuotaWarning:
		switch {
		case over:
			return catalog.QuotaGrace, EventExceeded
		case !warn:
			return catalog.QuotaOK, EventOK
		}
	case catalog.QuotaGrace:
		switch {
		case !over:
			return under, EventBackUnder
		case q.OverSince == nil || now.Sub(*q.OverSince) >= tier.StorageGrace.D():
			return catalog.QuotaEnforced, EventEnforced
		}
	case catalog.QuotaEnforced:
		if !over {
			return under, EventRestored
		}
	}
	return q.State, ""
}

// CheckQuotas implements metrics.QuotaChecker: for each tenant whose state
// would change, it makes the transition (enforcing or restoring on the
// cluster first) and records it. Tenants whose state stays cost nothing: no
// catalog write, no query.
func (s *Service) CheckQuotas(ctx context.Context, clusterName string, usage []metrics.Usage) error {
	cl, err := s.Clusters.Get(clusterName)
	if err != nil {
		return err
	}
	now := s.now()
	var errs []error
	for _, u := range usage {
		tier, ok := s.Tiers[u.Tier]
		if !ok {
			tier = config.Tier{} // a tier removed from the config: no quota
		}
		cur := catalog.Quota{Tenant: u.Tenant, State: u.Quota, OverSince: u.OverSince}
		if _, trans := Next(cur, u.SizeBytes, tier, now); len(trans) == 0 {
			continue
		}
		if err := s.transition(ctx, cl, u, tier, now); err != nil {
			errs = append(errs, fmt.Errorf("tenant %s: %w", u.Tenant, err))
		}
	}
	return errors.Join(errs...)
}

// Enforcement is what enforcing a quota changed besides ownership, kept in
// the catalog so that restoring undoes exactly that.
type Enforcement struct {
	StartedAt time.Time `json:"started_at"`
	// LockRole owns the tenant's objects while enforced (tenant.LockRole);
	// empty for enforcements that started with the shared pgt_quota_lock.
	LockRole string `json:"lock_role,omitempty"`
	// PublicGrants are write privileges PUBLIC, or a role other than the
	// owner, held on the tenant's tables (or CREATE on its schemas): PUBLIC
	// includes the tenant, and another role could write for it, so they
	// are revoked while enforced and granted back after.
	PublicGrants []Grant `json:"public_grants,omitempty"`
	// SecurityDefiners are the tenant's SECURITY DEFINER routines
	// (pg_identify_object identities), SECURITY INVOKER while enforced:
	// they would run as the lock role.
	SecurityDefiners []string `json:"security_definers,omitempty"`
	// SessionsEnded counts the tenant's sessions enforcement ended on the
	// primary (they could hold, or make, temporary tables).
	SessionsEnded int `json:"sessions_ended,omitempty"`
	// LargeObjects: the large-object write functions were revoked from
	// PUBLIC in the tenant's own database.
	LargeObjects bool `json:"large_objects,omitempty"`
	// Attempts that failed, and whether the last one timed out on a lock
	// the tenant held (then the next attempt first ends its sessions).
	Attempts     int    `json:"attempts,omitempty"`
	LastError    string `json:"last_error,omitempty"`
	LockTimedOut bool   `json:"lock_timed_out,omitempty"`
}

// Grant is one privilege of PUBLIC (or of another role) on a table (or a
// column of it), or on a schema.
type Grant struct {
	Schema    string `json:"schema"`
	Table     string `json:"table,omitempty"`  // empty: the schema itself
	Column    string `json:"column,omitempty"` // empty: the whole table
	Role      string `json:"role,omitempty"`   // empty: PUBLIC
	Privilege string `json:"privilege"`        // INSERT, UPDATE or CREATE
}

func decodeEnforcement(b []byte) Enforcement {
	var e Enforcement
	if len(b) > 0 {
		_ = json.Unmarshal(b, &e)
	}
	return e
}

func encode(e Enforcement) json.RawMessage {
	if e.StartedAt.IsZero() {
		return json.RawMessage("{}")
	}
	b, _ := json.Marshal(e)
	return b
}

// transition moves one tenant in three steps: decide under the catalog row
// lock (and record what enforcement will change before changing it), change
// the cluster (idempotent), then record the new state and the events under
// the row lock again. Of several daemons the first records; the others find
// nothing left to do.
func (s *Service) transition(ctx context.Context, cl *cluster.Cluster, u metrics.Usage, tier config.Tier, now time.Time) error {
	pool := s.Store.Pool()
	var next catalog.Quota
	var trans []Transition
	var rec Enforcement
	err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		q, err := s.Store.LockQuota(ctx, tx, u.Tenant)
		if err != nil {
			return err
		}
		next, trans = Next(q, u.SizeBytes, tier, now)
		rec = decodeEnforcement(q.Enforcement)
		if next.State != catalog.QuotaEnforced || !rec.StartedAt.IsZero() || len(trans) == 0 {
			return nil
		}
		plan, err := s.plan(ctx, cl, u)
		if err != nil {
			return err
		}
		plan.StartedAt = now
		rec = plan
		q.Enforcement = encode(rec)
		return s.Store.SaveQuota(ctx, tx, q)
	})
	if err != nil || len(trans) == 0 {
		return err
	}

	switch {
	case next.State == catalog.QuotaEnforced:
		err = s.lock(ctx, cl, u, &rec)
	case !rec.StartedAt.IsZero():
		// Leaving grace after a partial attempt, or enforced: restore.
		if err = s.unlock(ctx, cl, u, rec); err == nil {
			rec = Enforcement{}
		}
	}
	if err != nil {
		rec.Attempts++
		rec.LastError = err.Error()
		rec.LockTimedOut = errors.Is(err, cluster.ErrLockNotAvailable)
		_ = pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
			q, lerr := s.Store.LockQuota(ctx, tx, u.Tenant)
			if lerr != nil {
				return lerr
			}
			q.Enforcement = encode(rec)
			return s.Store.SaveQuota(ctx, tx, q)
		})
		return err
	}

	return pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		q, err := s.Store.LockQuota(ctx, tx, u.Tenant)
		if err != nil {
			return err
		}
		n, trans := Next(q, u.SizeBytes, tier, now)
		if len(trans) == 0 {
			return nil
		}
		if n.State == catalog.QuotaEnforced {
			rec.Attempts, rec.LastError, rec.LockTimedOut = 0, "", false
		}
		n.Enforcement = encode(rec)
		if err := s.Store.SaveQuota(ctx, tx, n); err != nil {
			return err
		}
		for _, t := range trans {
			detail := map[string]any{"from": t.From, "to": t.To, "size_bytes": u.SizeBytes,
				"size_sampled_at": u.SizeAt.UTC().Format(time.RFC3339)}
			if tier.StorageWarn > 0 {
				detail["warn_bytes"] = int64(tier.StorageWarn)
			}
			if tier.StorageQuota > 0 {
				detail["quota_bytes"] = int64(tier.StorageQuota)
			}
			if t.To == catalog.QuotaGrace {
				detail["grace"] = tier.StorageGrace.String()
				detail["enforce_at"] = now.Add(tier.StorageGrace.D()).UTC().Format(time.RFC3339)
			}
			if t.To == catalog.QuotaEnforced {
				detail["revoked"] = "INSERT, UPDATE, CREATE, TEMPORARY, ownership of every object (SELECT, DELETE, TRUNCATE remain)"
				detail["owner_while_enforced"] = rec.LockRole
				// Sessions that could hold or make temporary tables were ended.
				detail["sessions_ended"] = rec.SessionsEnded
				if len(rec.SecurityDefiners) > 0 {
					detail["security_invoker_while_enforced"] = rec.SecurityDefiners
				}
			}
			if err := s.Store.AddEvent(ctx, tx, u.Tenant, t.Event, detail); err != nil {
				return err
			}
			s.log().Info("quota transition", "tenant", u.Tenant, "from", t.From, "to", t.To, "size", u.SizeBytes)
		}
		return nil
	})
}

// View is a tenant's quota as the API shows it.
type View struct {
	State        string       `json:"state"`
	Since        *time.Time   `json:"since,omitempty"`
	OverSince    *time.Time   `json:"over_since,omitempty"`
	EnforceAt    *time.Time   `json:"enforce_at,omitempty"` // in grace: when enforcement starts if still over
	WarnBytes    int64        `json:"warn_bytes,omitempty"`
	QuotaBytes   int64        `json:"quota_bytes,omitempty"`
	Grace        string       `json:"grace,omitempty"`
	StatementCap string       `json:"statement_cap,omitempty"` // tenant.StatementCap: statement_cap, else statement_timeout
	Enforcement  *Enforcement `json:"enforcement,omitempty"`
}

// View returns a tenant's quota state with its tier's limits.
func (s *Service) View(ctx context.Context, tenantID, tierName string) (View, error) {
	q, err := s.Store.GetQuota(ctx, tenantID)
	if err != nil {
		return View{}, err
	}
	tier := s.Tiers[tierName]
	v := View{State: q.State, WarnBytes: int64(tier.StorageWarn), QuotaBytes: int64(tier.StorageQuota), OverSince: q.OverSince}
	if !q.Since.IsZero() {
		v.Since = &q.Since
	}
	if tier.StorageQuota > 0 {
		v.Grace = tier.StorageGrace.String()
	}
	if d := tenant.StatementCap(tier); d > 0 {
		v.StatementCap = d.String()
	}
	if q.State == catalog.QuotaGrace && q.OverSince != nil {
		at := q.OverSince.Add(tier.StorageGrace.D())
		v.EnforceAt = &at
	}
	if e := decodeEnforcement(q.Enforcement); !e.StartedAt.IsZero() {
		v.Enforcement = &e
	}
	return v, nil
}
