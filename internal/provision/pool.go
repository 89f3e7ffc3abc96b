package provision

import (
	"context"
	"errors"
	"fmt"
	"math"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pgtenant/pgtenant/internal/catalog"
	"github.com/pgtenant/pgtenant/internal/cluster"
	"github.com/pgtenant/pgtenant/internal/config"
	"github.com/pgtenant/pgtenant/internal/purge"
	"github.com/pgtenant/pgtenant/internal/tenant"
)

// Pool keeps, for each (cluster, template, mode), spares of the version new
// tenants get there (templates.ProvisionVersion): it starts builds of template versions
// that are missing on a cluster, enqueues spare builds (paced jobs) for
// missing spares, and retires spares of older versions. A pool follows
// demand: its target is its configured size, grown with its recent creates
// (those within provision.pool_demand_window before its latest one) up to
// provision.max_pool_size, and its spares above the configured size are
// retired once it has been idle for provision.pool_idle_after. One daemon at a time refills (an advisory
// lock), so several daemons never overfill a pool.
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

// Size returns how many spares a pool keeps at least: the configured pools
// of the template, or, when none is configured for it, the default size in
// both modes.
func (p *Pool) Size(clusterName, template string, mode tenant.Mode) int {
	listed, size := false, 0
	for _, pc := range p.Svc.Pools {
		if pc.Template != template {
			continue
		}
		listed = true
		if tenant.Mode(pc.Mode) == mode && (pc.Cluster == "" || pc.Cluster == clusterName) {
			size = pc.Size
		}
	}
	if !listed {
		return p.Svc.Provision.DefaultPoolSize
	}
	return size
}

// Target is how many spares a pool of the given size wants after recent
// creates (PoolDemand.Recent): recent × pool_demand_factor, at least size
// and at most max_pool_size. A pool of size 0 is off and stays so; a
// pool configured at or above the maximum keeps its size.
func Target(cfg config.ProvisionConfig, size, recent int) int {
	if size <= 0 || size >= cfg.MaxPoolSize {
		return max(size, 0)
	}
	want := int(math.Ceil(float64(recent) * cfg.PoolDemandFactor))
	return max(size, min(want, cfg.MaxPoolSize))
}

// PoolStatus is one pool as its refill sees it: the spares of the version
// new tenants get on a cluster, in one mode.
type PoolStatus struct {
	Cluster  string      `json:"cluster"`
	Mode     tenant.Mode `json:"mode"`
	Version  int         `json:"version"`
	Size     int         `json:"size"`   // configured: provision.pools, else provision.default_pool_size
	Target   int         `json:"target"` // the size grown with recent creates, up to provision.max_pool_size
	Ready    int         `json:"ready"`
	Building int         `json:"building"`
	Retiring int         `json:"retiring"`
	// RecentCreates are the creates within provision.pool_demand_window
	// before LastCreate, the latest (within provision.pool_idle_after).
	RecentCreates int        `json:"recent_creates"`
	LastCreate    *time.Time `json:"last_create,omitempty"`
	Draining      bool       `json:"draining,omitempty"` // its cluster keeps no spares
}

// Status is the pools of a template, by cluster and mode (none on a
// cluster where no version of it is built yet). Safe on a nil Pool.
func (p *Pool) Status(ctx context.Context, template string) ([]PoolStatus, error) {
	if p == nil {
		return nil, nil
	}
	s := p.Svc
	pc := s.Provision
	demand, err := s.Store.PoolDemands(ctx, pc.PoolDemandWindow.D(), pc.PoolIdleAfter.D())
	if err != nil {
		return nil, err
	}
	cs, err := s.Store.Clusters(ctx)
	if err != nil {
		return nil, err
	}
	var out []PoolStatus
	for _, c := range cs {
		version, err := s.Templates.ProvisionVersion(ctx, template, c.Name)
		if errors.Is(err, catalog.ErrNotFound) {
			continue
		}
		if err != nil {
			return nil, err
		}
		for _, mode := range tenant.Modes {
			d := demand[catalog.PoolKey{Cluster: c.Name, Template: template, Mode: mode}]
			st := PoolStatus{Cluster: c.Name, Mode: mode, Version: version, RecentCreates: d.Recent, Draining: c.Draining}
			st.Size, st.Target = p.sizes(c.Name, template, mode, d, c.Draining)
			if !d.Last.IsZero() {
				st.LastCreate = &d.Last
			}
			n, err := s.Store.CountPool(ctx, s.Store.Pool(), c.Name, template, version, mode)
			if err != nil {
				return nil, err
			}
			st.Ready, st.Building, st.Retiring = n.Ready, n.Building, n.Retiring
			out = append(out, st)
		}
	}
	return out, nil
}

// sizes are a pool's configured size and its target after its demand d;
// a draining cluster's pool has both 0.
func (p *Pool) sizes(clusterName, template string, mode tenant.Mode, d catalog.PoolDemand, draining bool) (size, target int) {
	if draining {
		return 0, 0
	}
	size = p.Size(clusterName, template, mode)
	return size, Target(p.Svc.Provision, size, d.Recent)
}

// Refill runs one pass over every pool, unless another daemon is refilling.
func (p *Pool) Refill(ctx context.Context) error {
	_, err := p.Svc.Store.Exclusively(ctx, poolLockKey, p.refill)
	return err
}

func (p *Pool) refill(ctx context.Context) error {
	s := p.Svc
	tpls, err := s.Store.Templates(ctx)
	if err != nil {
		return err
	}
	// One query for the demand of every pool: the catalog's claim times
	// are every daemon's creates.
	pc := s.Provision
	demand, err := s.Store.PoolDemands(ctx, pc.PoolDemandWindow.D(), pc.PoolIdleAfter.D())
	if err != nil {
		return err
	}
	// A draining cluster keeps no spares: its pools are retired.
	draining := map[string]bool{}
	cs, err := s.Store.Clusters(ctx)
	if err != nil {
		return err
	}
	for _, c := range cs {
		draining[c.Name] = c.Draining
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
			for _, mode := range tenant.Modes {
				d := demand[catalog.PoolKey{Cluster: cl.Name(), Template: tp.Name, Mode: mode}]
				if err := p.fill(ctx, cl.Name(), tp.Name, version, mode, d, draining[cl.Name()]); err != nil {
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

// fill brings one pool towards its target: it enqueues spare builds, a few
// in flight at a time, and retires one spare above the configured size when
// the pool is idle. A draining cluster's pool has size 0 and is retired
// whether idle or not.
func (p *Pool) fill(ctx context.Context, clusterName, template string, version int, mode tenant.Mode, d catalog.PoolDemand, draining bool) error {
	s := p.Svc
	pc := s.Provision
	size, target := p.sizes(clusterName, template, mode, d, draining)
	n, err := s.Store.CountPool(ctx, s.Store.Pool(), clusterName, template, version, mode)
	if err != nil {
		return err
	}
	idle := draining || d.Last.IsZero() || time.Since(d.Last) >= pc.PoolIdleAfter.D()
	if idle && n.Ready+n.Building > size && n.Retiring == 0 && n.Ready > 0 {
		return p.shrink(ctx, clusterName, template, version, mode, size)
	}
	if n.Ready+n.Building >= target {
		return nil // full, or above its target until it is idle
	}
	// Several builds in flight, within what the pacer lets run at once:
	// the rest are enqueued as those end (each pokes the pool), so that a
	// big pool does not queue hundreds of builds ahead of other jobs.
	inFlight, err := p.parallel(ctx, clusterName, template, version, mode)
	if err != nil {
		return err
	}
	start := min(target-n.Ready-n.Building, inFlight-n.Building)
	for range start {
		t := catalog.Tenant{ID: tenant.NewID(), Mode: mode, Cluster: clusterName, Template: template, Version: version,
			Tier: "default", State: catalog.StateBuilding}
		t.Database = s.databaseOf(t)
		err := pgx.BeginFunc(ctx, s.Store.Pool(), func(tx pgx.Tx) error {
			if err := s.Store.InsertTenant(ctx, tx, t); err != nil {
				return err
			}
			_, err := s.Runner.Enqueue(ctx, tx, buildSpec(t, nil))
			return err
		})
		if err != nil {
			return err
		}
	}
	if start > 0 {
		s.Runner.Poke()
	}
	return nil
}

// parallel is how many spare builds a pool may have in flight:
// provision.refill_parallel, within the pacer's slots for its copies
// (database mode: WAL_LOG copies run pacer.wal_log_slots at once, FILE_COPY
// ones one heavy DDL slot each). More would only wait in the pacer, each
// holding a job worker.
func (p *Pool) parallel(ctx context.Context, clusterName, template string, version int, mode tenant.Mode) (int, error) {
	s := p.Svc
	n := s.Provision.RefillParallel
	if mode != tenant.ModeDatabase {
		return n, nil
	}
	build, err := s.Store.GetBuild(ctx, template, version, clusterName)
	if err != nil {
		return 0, err
	}
	budget := s.PacerFor(clusterName)
	// The strategy as if the cluster had standbys (tenant.CreateStrategy):
	// without, a build may copy with WAL_LOG where this counted FILE_COPY.
	if tenant.CreateStrategy(build.SizeBytes, 1, int64(s.Provision.WALLogMaxSize)) == cluster.WALLog {
		return min(n, budget.WALLogSlots), nil
	}
	return min(n, budget.HeavyDDLSlots), nil
}

// shrink retires the pool's newest spare (a paced purge job), one per pass
// and only when no other retirement of the pool is in flight: spares above
// the configured size go back gradually, so that a DROP DATABASE (a forced
// checkpoint each) at a time is all an idle pool costs.
func (p *Pool) shrink(ctx context.Context, clusterName, template string, version int, mode tenant.Mode, size int) error {
	s := p.Svc
	t, err := s.Store.NewestSpare(ctx, clusterName, template, version, mode)
	if errors.Is(err, catalog.ErrNotFound) {
		return nil
	}
	if err != nil {
		return err
	}
	err = pgx.BeginFunc(ctx, s.Store.Pool(), func(tx pgx.Tx) error {
		if err := s.Store.SetTenantState(ctx, tx, t.ID, catalog.StatePurging, catalog.StateSpare); err != nil {
			return err
		}
		_, err := s.Runner.Enqueue(ctx, tx, purge.Spec(t, fmt.Sprintf("spare above the pool's size %d, idle", size)))
		return err
	})
	if errors.Is(err, catalog.ErrConflict) {
		return nil // claimed meanwhile
	}
	if err == nil {
		s.Runner.Poke()
	}
	return err
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
			_, err := s.Runner.Enqueue(ctx, tx, purge.Spec(t, "spare of an old template version"))
			return err
		})
		if err != nil && !errors.Is(err, catalog.ErrConflict) {
			return err
		}
	}
	return nil
}
