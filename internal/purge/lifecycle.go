package purge

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pgtenant/pgtenant/internal/background"
	"github.com/pgtenant/pgtenant/internal/catalog"
	"github.com/pgtenant/pgtenant/internal/cluster"
	"github.com/pgtenant/pgtenant/internal/jobs"
	"github.com/pgtenant/pgtenant/internal/tenant"
)

// Result is the answer to a lifecycle change.
type Result struct {
	Tenant catalog.Tenant
	Job    *jobs.Job // the purge, when one was started
}

// Drop soft-deletes a tenant: it can no longer log in, its sessions end, its
// data stays, and it is purged when the retention ends (at once with
// purgeNow). Dropping a dropped tenant again is not an error.
func (s *Service) Drop(ctx context.Context, id string, purgeNow bool) (Result, error) {
	var res Result
	var clusterName string
	err := s.change(ctx, id, func(ctx context.Context, tx pgx.Tx, t catalog.Tenant, cl *cluster.Cluster) error {
		clusterName = t.FrontCluster()
		switch t.State {
		case catalog.StateActive, catalog.StateSuspended:
			roles, err := s.loginRoles(ctx, tx, t)
			if err != nil {
				return err
			}
			if err := LockOut(ctx, cl, roles...); err != nil {
				return err
			}
			if err := s.Store.DropTenant(ctx, tx, t.ID, s.Config.Retention.D()); err != nil {
				return err
			}
			if err := s.Store.AddEvent(ctx, tx, t.ID, "dropped", map[string]any{"from": t.State,
				"retention": s.Config.Retention.String(), "purge_now": purgeNow}); err != nil {
				return err
			}
		case catalog.StateDropped, catalog.StatePurging:
		default:
			return fmt.Errorf("%w: tenant %s is %s; only active or suspended tenants can be dropped", catalog.ErrConflict, t.ID, t.State)
		}
		if purgeNow && t.State != catalog.StatePurging {
			j, err := s.startPurge(ctx, tx, t, "purge now")
			if err != nil {
				return err
			}
			res.Job = &j
		}
		return nil
	})
	if err != nil {
		return res, err
	}
	s.Runner.Poke()
	s.Poolers.Sync(ctx, clusterName, "drop "+id)
	res.Tenant, err = s.Store.GetTenant(ctx, nil, id)
	if errors.Is(err, catalog.ErrNotFound) && res.Job != nil {
		res.Tenant, err = s.Store.GetPurged(ctx, id) // purged already
		if errors.Is(err, catalog.ErrNotFound) {
			err = nil // and forgotten (drop.purged_retention 0)
		}
	}
	return res, err
}

// Restore brings a dropped tenant back, as it was, within its retention:
// in the state it had before the drop (a suspended tenant stays suspended,
// locked out, until resumed).
func (s *Service) Restore(ctx context.Context, id string) (Result, error) {
	return s.transition(ctx, id, catalog.StateDropped, "", "restored")
}

// Suspend locks a tenant out without the deletion clock.
func (s *Service) Suspend(ctx context.Context, id string) (Result, error) {
	return s.transition(ctx, id, catalog.StateActive, catalog.StateSuspended, "suspended")
}

// Resume lets a suspended tenant in again.
func (s *Service) Resume(ctx context.Context, id string) (Result, error) {
	return s.transition(ctx, id, catalog.StateSuspended, catalog.StateActive, "resumed")
}

// transition moves a tenant from one state to another (to "": back to the
// state it had before its drop), changing its role's LOGIN on the cluster
// in the same catalog transaction: LOGIN for active, NOLOGIN otherwise.
// Already in the target state is not an error (retries are idempotent).
func (s *Service) transition(ctx context.Context, id string, from, to catalog.TenantState, event string) (Result, error) {
	var clusterName string
	var reached catalog.TenantState
	err := s.change(ctx, id, func(ctx context.Context, tx pgx.Tx, t catalog.Tenant, cl *cluster.Cluster) error {
		clusterName = t.FrontCluster()
		target := to
		if target == "" { // restore
			if t.State == catalog.StateActive || t.State == catalog.StateSuspended {
				reached = t.State
				return nil // restored already
			}
			target = catalog.StateActive
			if t.DroppedFrom == catalog.StateSuspended {
				target = catalog.StateSuspended
			}
		}
		reached = target
		if t.State == target {
			return nil
		}
		if t.State != from {
			return fmt.Errorf("%w: tenant %s is %s, not %s", catalog.ErrConflict, t.ID, t.State, from)
		}
		if from == catalog.StateDropped && t.PurgeAfter != nil && time.Now().After(*t.PurgeAfter) {
			return fmt.Errorf("%w: tenant %s's retention ended at %s; it is being purged", catalog.ErrConflict, t.ID, t.PurgeAfter.Format(time.RFC3339))
		}
		roles, err := s.loginRoles(ctx, tx, t)
		if err != nil {
			return err
		}
		if target != catalog.StateActive {
			if err := LockOut(ctx, cl, roles...); err != nil {
				return err
			}
		} else if err := SetLogin(ctx, cl, true, roles...); err != nil {
			return err
		}
		if to == "" {
			if err := s.Store.RestoreTenant(ctx, tx, t.ID, target); err != nil {
				return err
			}
		} else if err := s.Store.SetTenantState(ctx, tx, t.ID, target, from); err != nil {
			return err
		}
		detail := map[string]any{"from": t.State}
		if to == "" {
			detail["to"] = target
		}
		return s.Store.AddEvent(ctx, tx, t.ID, event, detail)
	})
	if err != nil {
		return Result{}, err
	}
	s.Poolers.Sync(ctx, clusterName, event+" "+id)
	t, err := s.Store.GetTenant(ctx, nil, id)
	if err == nil && reached == catalog.StateActive && s.OnResume != nil {
		if herr := s.OnResume(ctx, t); herr != nil {
			s.Logger.Warn("after resume", "tenant", id, "err", herr)
		}
	}
	return Result{Tenant: t}, err
}

// change runs f with the tenant's row locked in a catalog transaction and an
// admin pool of its cluster. The cluster change inside f comes before the
// catalog commit: a failure leaves the catalog as it was, and the change is
// idempotent for the retry.
func (s *Service) change(ctx context.Context, id string, f func(context.Context, pgx.Tx, catalog.Tenant, *cluster.Cluster) error) error {
	if !tenant.ValidID(id) {
		return fmt.Errorf("tenant %q: %w", id, catalog.ErrNotFound)
	}
	return pgx.BeginFunc(ctx, s.Store.Pool(), func(tx pgx.Tx) error {
		t, err := s.Store.LockTenant(ctx, tx, id)
		if errors.Is(err, catalog.ErrNotFound) {
			if p, perr := s.Store.GetPurged(ctx, id); perr == nil {
				return fmt.Errorf("%w: tenant %s was purged at %s: nothing of it is left to change", catalog.ErrConflict, id, p.PurgedAt.Format(time.RFC3339))
			}
		}
		if err != nil {
			return err
		}
		if t.IsSpare() {
			return fmt.Errorf("tenant %q: %w", id, catalog.ErrNotFound)
		}
		cl, err := s.Clusters.Get(t.Cluster)
		if err != nil {
			return err
		}
		return f(ctx, tx, t, cl)
	})
}

// loginRoles are the roles a tenant logs in with: its own and those of its
// extra logins (the catalog's, in tx).
func (s *Service) loginRoles(ctx context.Context, tx pgx.Tx, t catalog.Tenant) ([]string, error) {
	logins, err := s.Store.Logins(ctx, tx, t.ID)
	return append([]string{tenant.PhysicalName(t.ID)}, catalog.LoginRoles(logins)...), err
}

// SetLogin runs ALTER ROLE … LOGIN (or NOLOGIN) for roles on cl's primary,
// in one batch. It ends no session: LockOut does, for a role shut out of a
// cluster its clients use.
func SetLogin(ctx context.Context, cl *cluster.Cluster, login bool, roles ...string) error {
	admin, err := cl.Admin(ctx)
	if err != nil {
		return err
	}
	verb := "NOLOGIN"
	if login {
		verb = "LOGIN"
	}
	var sql strings.Builder
	for _, r := range roles {
		fmt.Fprintf(&sql, "ALTER ROLE %s %s;\n", cluster.Ident(r), verb)
	}
	_, err = admin.Exec(ctx, sql.String())
	return cluster.Classify(err)
}

func (s *Service) startPurge(ctx context.Context, tx pgx.Tx, t catalog.Tenant, reason string) (jobs.Job, error) {
	// Dropped: by the caller in this transaction, or before.
	if err := s.Store.SetTenantState(ctx, tx, t.ID, catalog.StatePurging, catalog.StateDropped); err != nil {
		return jobs.Job{}, err
	}
	if err := s.Store.AddEvent(ctx, tx, t.ID, "purging", map[string]any{"reason": reason}); err != nil {
		return jobs.Job{}, err
	}
	return s.Runner.Enqueue(ctx, tx, Spec(t, reason))
}

// PurgeSpare purges a template's unclaimed tenant (a delete of its
// template): a spare is moved to purging and its purge job enqueued, in one
// catalog transaction; a tenant already purging, or failed, gets its purge
// job enqueued unless one is unfinished. A spare claimed meanwhile is
// ErrConflict: it is a tenant now. A tenant whose last purge failed is not
// purged again (it would fail the same way): the error names the job.
func (s *Service) PurgeSpare(ctx context.Context, t catalog.Tenant, reason string) error {
	if t.State != catalog.StateSpare {
		last, err := jobs.List(ctx, s.Store.Pool(), jobs.Filter{Type: jobs.TenantPurge, TargetKind: "tenant", Target: t.ID, Limit: 1})
		if err != nil {
			return err
		}
		if len(last) == 1 && last[0].State == jobs.Failed {
			return jobs.Permanent(fmt.Errorf("the purge of tenant %s failed (job %d): %s; fix what it names, then `pgtenant job retry %d`",
				t.ID, last[0].ID, last[0].LastError, last[0].ID))
		}
	}
	err := pgx.BeginFunc(ctx, s.Store.Pool(), func(tx pgx.Tx) error {
		if t.State == catalog.StateSpare {
			if err := s.Store.SetTenantState(ctx, tx, t.ID, catalog.StatePurging, catalog.StateSpare); err != nil {
				return err
			}
		}
		_, err := s.Runner.Enqueue(ctx, tx, Spec(t, reason))
		return err
	})
	if err == nil {
		s.Runner.Poke()
	}
	return err
}

// Retention purges dropped tenants whose retention has ended, and forgets
// purged tenants after drop.purged_retention.
type Retention struct {
	S        *Service
	Interval time.Duration
}

// Run checks every Interval until ctx is done.
func (r *Retention) Run(ctx context.Context) error {
	log := r.S.Logger.With("component", "retention")
	down := cluster.Outage{What: "retention pass"}
	background.Every(ctx, r.Interval, func(ctx context.Context) {
		n, err := r.S.PurgeExpired(ctx)
		forgotten := 0
		if err == nil {
			forgotten, err = r.S.Store.SweepPurged(ctx, r.S.Config.PurgedRetention.D())
		}
		if ctx.Err() == nil {
			down.Report(log, err)
		}
		if n > 0 {
			log.Info("retention ended: purging dropped tenants", "tenants", n)
		}
		if forgotten > 0 {
			log.Info("purged tenants forgotten after drop.purged_retention", "tenants", forgotten)
		}
	})
	return nil
}

// PurgeExpired starts the purge of every dropped tenant past its retention.
func (s *Service) PurgeExpired(ctx context.Context) (int, error) {
	ids, err := s.Store.ExpiredDrops(ctx)
	if err != nil {
		return 0, err
	}
	n := 0
	for _, id := range ids {
		err := pgx.BeginFunc(ctx, s.Store.Pool(), func(tx pgx.Tx) error {
			t, err := s.Store.LockTenant(ctx, tx, id)
			if err != nil || t.State != catalog.StateDropped {
				return err
			}
			_, err = s.startPurge(ctx, tx, t, "retention ended")
			return err
		})
		if err != nil {
			return n, err
		}
		n++
	}
	if n > 0 {
		s.Runner.Poke()
	}
	return n, nil
}
