package provision

import (
	"context"
	"errors"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pgtenant/pgtenant/internal/catalog"
	"github.com/pgtenant/pgtenant/internal/cluster"
	"github.com/pgtenant/pgtenant/internal/jobs"
	"github.com/pgtenant/pgtenant/internal/purge"
	"github.com/pgtenant/pgtenant/internal/tenant"
)

// Pool keeps, for each (cluster, template, mode), Size spares of the version
// new tenants get there (templates.ProvisionVersion): it starts builds of
// template versions that are missing on a cluster, enqueues spare builds (paced jobs) for each
// missing spare, and retires spares of older versions. One daemon at a time
// refills (an advisory lock), so several daemons never overfill a pool.
type Pool struct {
	Svc      *Service
	Interval time.Duration
	poke     chan struct{}
}

// NewPool returns a pool manager for svc and wires svc to poke it.
func NewPool(svc *Service, interval time.Duration) *Pool {
	p := &Pool{Svc: svc, Interval: interval, poke: make(chan struct{}, 1)}
	svc.Pool = p
	return p
}

// Poke asks for a refill soon (after a claim). Safe on a nil Pool.
func (p *Pool) Poke() {
	if p == nil {
		return
	}
	select {
	case p.poke <- struct{}{}:
	default:
	}
}

// Run refills until ctx is done.
func (p *Pool) Run(ctx context.Context) error {
	log := p.Svc.Logger.With("component", "pool")
	down := cluster.Outage{What: "pool refill"}
	for {
		if err := p.Refill(ctx); ctx.Err() == nil {
			down.Report(log, err)
		}
		select {
		case <-ctx.Done():
			return nil
		case <-p.poke:
		case <-time.After(p.Interval):
		}
	}
}

// poolLockKey is the advisory lock one refill holds ("pgt\x02").
const poolLockKey = 0x70677402

// Size returns how many spares a pool keeps: the configured pools of the
// template, or, when none is configured for it, the default size in both modes.
func (p *Pool) Size(clusterName, template, mode string) int {
	listed, size := false, 0
	for _, pc := range p.Svc.Config.Pools {
		if pc.Template != template {
			continue
		}
		listed = true
		if pc.Mode == mode && (pc.Cluster == "" || pc.Cluster == clusterName) {
			size = pc.Size
		}
	}
	if !listed {
		return p.Svc.Config.Provision.DefaultPoolSize
	}
	return size
}

// Refill runs one pass over every pool.
func (p *Pool) Refill(ctx context.Context) error {
	s := p.Svc
	conn, err := s.Store.Pool().Acquire(ctx)
	if err != nil {
		return err
	}
	defer conn.Release()
	var locked bool
	if err := conn.QueryRow(ctx, `SELECT pg_try_advisory_lock($1)`, int64(poolLockKey)).Scan(&locked); err != nil {
		return err
	}
	if !locked {
		return nil // another daemon is refilling
	}
	defer conn.Exec(context.WithoutCancel(ctx), `SELECT pg_advisory_unlock($1)`, int64(poolLockKey))

	tpls, err := s.Store.Templates(ctx)
	if err != nil {
		return err
	}
	var errs []error
	for _, tp := range tpls {
		if tp.Deleting {
			continue // its delete job purges its spares
		}
		// Every cluster builds the current version (a cluster added since
		// lacks it) and the newest one unless it failed (it becomes current
		// once built everywhere).
		builds := []int{}
		if tp.CurrentVersion > 0 {
			builds = append(builds, tp.CurrentVersion)
		}
		if tp.LatestVersion > tp.CurrentVersion {
			if err := s.Templates.Failed(ctx, tp.Name, tp.LatestVersion); err == nil {
				builds = append(builds, tp.LatestVersion)
			} else if !errors.Is(err, catalog.ErrConflict) {
				errs = append(errs, err)
			}
		}
		for _, cl := range s.Clusters.All() {
			for _, v := range builds {
				if _, err := s.Templates.EnsureBuild(ctx, tp.Name, v, cl.Name()); err != nil {
					errs = append(errs, err)
				}
			}
			version, err := s.Templates.ProvisionVersion(ctx, tp.Name, cl.Name())
			if errors.Is(err, catalog.ErrNotFound) {
				continue
			}
			if err != nil {
				errs = append(errs, err)
				continue
			}
			for _, mode := range []string{ModeDatabase, ModeSchema} {
				if err := p.fill(ctx, cl.Name(), tp.Name, version, mode); err != nil {
					errs = append(errs, err)
				}
			}
		}
	}
	if err := p.retire(ctx); err != nil {
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}

func (p *Pool) fill(ctx context.Context, clusterName, template string, version int, mode string) error {
	s := p.Svc
	want := p.Size(clusterName, template, mode)
	ready, building, err := s.Store.CountPool(ctx, s.Store.Pool(), clusterName, template, version, mode)
	if err != nil {
		return err
	}
	for i := ready + building; i < want; i++ {
		t := catalog.Tenant{ID: tenant.NewID(), Mode: mode, Cluster: clusterName, Template: template, Version: version,
			Tier: "default", State: catalog.StateBuilding}
		t.Database = s.databaseOf(t)
		err := pgx.BeginFunc(ctx, s.Store.Pool(), func(tx pgx.Tx) error {
			if err := s.Store.InsertTenant(ctx, tx, t); err != nil {
				return err
			}
			_, err := jobs.Enqueue(ctx, tx, buildSpec(t, nil), s.Config.Jobs.MaxAttempts)
			return err
		})
		if err != nil {
			return err
		}
	}
	if ready+building < want {
		s.Runner.Poke()
	}
	return nil
}

// retire purges ready spares of versions older than the template's newest
// materialised one on their cluster.
func (p *Pool) retire(ctx context.Context) error {
	s := p.Svc
	stale, err := s.Store.StaleSpares(ctx)
	if err != nil {
		return err
	}
	for _, t := range stale {
		v, err := s.Templates.ProvisionVersion(ctx, t.Template, t.Cluster)
		if err != nil || v <= t.Version {
			continue // the newer version is not materialised here yet: keep serving this one
		}
		err = pgx.BeginFunc(ctx, s.Store.Pool(), func(tx pgx.Tx) error {
			if err := s.Store.SetTenantState(ctx, tx, t.ID, catalog.StatePurging, catalog.StateSpare); err != nil {
				return err
			}
			_, err := jobs.Enqueue(ctx, tx, purge.Spec(t, "spare of an old template version"), s.Config.Jobs.MaxAttempts)
			return err
		})
		if err != nil && !errors.Is(err, catalog.ErrConflict) {
			return err
		}
	}
	return nil
}
