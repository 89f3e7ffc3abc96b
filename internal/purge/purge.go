// Package purge removes tenants for good: it locks the tenant out, drops its
// database (one at a time per cluster: each DROP DATABASE forces a
// checkpoint) or its schema's relations in small batches paced by the
// standby's replay lag, then its role and its catalog row. It touches
// nothing outside the tenant. Soft delete, restore and retention live here too.
package purge

import (
	"context"
	"errors"
	"fmt"
	"log/slog"

	"github.com/pgtenant/pgtenant/internal/catalog"
	"github.com/pgtenant/pgtenant/internal/cluster"
	"github.com/pgtenant/pgtenant/internal/config"
	"github.com/pgtenant/pgtenant/internal/jobs"
	"github.com/pgtenant/pgtenant/internal/tenant"
)

// Job is the purge job type.
const Job = "tenant.purge"

type args struct {
	Tenant string `json:"tenant"`
	Reason string `json:"reason,omitempty"`
}

// Spec is the job that purges a tenant.
func Spec(t catalog.Tenant, reason string) jobs.Spec {
	return jobs.Spec{Type: Job, Key: "purge:" + t.ID, TargetKind: "tenant", Target: t.ID, Cluster: t.Cluster,
		Args: args{Tenant: t.ID, Reason: reason}}
}

// Service purges tenants.
type Service struct {
	Store    *catalog.Store
	Clusters *cluster.Registry
	Runner   *jobs.Runner
	Config   config.Config
	Logger   *slog.Logger
	// OnResume, if set, runs after a tenant is resumed or restored (the
	// daemon prewarms it). Its error is logged, not returned.
	OnResume func(ctx context.Context, t catalog.Tenant) error
}

// Handler is the job handler of Job.
func (s *Service) Handler() jobs.Handler {
	return jobs.Handler{Steps: func(j *jobs.Job) ([]jobs.Step, error) {
		var a args
		if err := j.DecodeArgs(&a); err != nil {
			return nil, err
		}
		p := &purger{s: s, id: a.Tenant}
		return []jobs.Step{
			{Name: "lock-out", Run: p.lockOut},
			{Name: "storage", Run: p.storage},
			{Name: "role", Run: p.role},
			{Name: "catalog", Run: p.catalog},
		}, nil
	}}
}

type purger struct {
	s  *Service
	id string
}

// load returns the tenant and its cluster.
func (p *purger) load(ctx context.Context) (catalog.Tenant, *cluster.Cluster, error) {
	t, err := p.s.Store.GetTenant(ctx, nil, p.id)
	if err != nil {
		return t, nil, err
	}
	cl, err := p.s.Clusters.Get(t.Cluster)
	return t, cl, err
}

func (p *purger) run(ctx context.Context, f func(context.Context, catalog.Tenant, *cluster.Cluster) error) error {
	t, cl, err := p.load(ctx)
	if errors.Is(err, catalog.ErrNotFound) {
		return nil // the catalog step ran before a crash let it record so
	}
	if err != nil {
		return err
	}
	return f(ctx, t, cl)
}

func (p *purger) lockOut(ctx context.Context, r *jobs.Run) error {
	return p.run(ctx, func(ctx context.Context, t catalog.Tenant, cl *cluster.Cluster) error {
		if t.State != catalog.StatePurging {
			if err := p.s.Store.SetTenantState(ctx, p.s.Store.Pool(), t.ID, catalog.StatePurging, t.State); err != nil {
				return err
			}
		}
		admin, err := cl.Admin(ctx)
		if err != nil {
			return err
		}
		return LockOut(ctx, admin, tenant.PhysicalName(t.ID))
	})
}

// LockOut stops a role from logging in and ends its sessions. A role that
// does not exist is locked out already.
func LockOut(ctx context.Context, admin cluster.Execer, role string) error {
	_, err := admin.Exec(ctx, fmt.Sprintf(`DO $$ BEGIN
		IF EXISTS (SELECT 1 FROM pg_roles WHERE rolname = %[1]s) THEN
			EXECUTE format('ALTER ROLE %%I NOLOGIN', %[1]s);
		END IF;
	END $$; SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE usename = %[1]s`, cluster.Literal(role)))
	return cluster.Classify(err)
}

func (p *purger) storage(ctx context.Context, r *jobs.Run) error {
	return p.run(ctx, func(ctx context.Context, t catalog.Tenant, cl *cluster.Cluster) error {
		name := tenant.PhysicalName(t.ID)
		if t.Mode == "database" {
			admin, err := cl.Admin(ctx)
			if err != nil {
				return err
			}
			exists, err := cluster.DatabaseExists(ctx, admin, name)
			if err != nil || !exists {
				return err
			}
			release, err := r.Pace(ctx, t.Cluster, jobs.Heavy)
			if err != nil {
				return err
			}
			defer release()
			cl.ClosePool(name)
			return cluster.DropDatabase(ctx, admin, name)
		}
		conn, err := cl.Connect(ctx, t.Database)
		if errors.Is(err, cluster.ErrNotFound) {
			return nil // the shared database is gone: nothing of the tenant is left in it
		}
		if err != nil {
			return err
		}
		defer conn.Close(context.WithoutCancel(ctx))
		return cluster.DropSchemaBatched(ctx, conn, name, p.s.Config.Drop.BatchRelations, func(ctx context.Context, done, total int) error {
			r.Progress(ctx, int64(done), int64(total), fmt.Sprintf("dropped %d of ~%d relations of schema %s", done, total, name))
			release, err := r.Pace(ctx, t.Cluster, jobs.Light)
			if err == nil {
				release()
			}
			return err
		})
	})
}

func (p *purger) role(ctx context.Context, r *jobs.Run) error {
	return p.run(ctx, func(ctx context.Context, t catalog.Tenant, cl *cluster.Cluster) error {
		admin, err := cl.Admin(ctx)
		if err != nil {
			return err
		}
		return cluster.DropRole(ctx, admin, tenant.PhysicalName(t.ID))
	})
}

func (p *purger) catalog(ctx context.Context, r *jobs.Run) error {
	return p.s.Store.DeleteTenant(ctx, p.s.Store.Pool(), p.id)
}
