package migrate

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pgtenant/pgtenant/internal/catalog"
	"github.com/pgtenant/pgtenant/internal/cluster"
	"github.com/pgtenant/pgtenant/internal/jobs"
)

// Handler is the job handler of Job. Steps: builds (the target version
// materialised on every cluster of the rollout, so that tenants created from
// now on start at it), then migrate (every tenant, in parallel). When the
// job ends failed or cancelled its rollout is marked so.
func (s *Service) Handler() jobs.Handler {
	return jobs.Handler{
		Steps: func(j *jobs.Job) ([]jobs.Step, error) {
			var a jobArgs
			if err := j.DecodeArgs(&a); err != nil {
				return nil, err
			}
			return []jobs.Step{
				{Name: "builds", Run: func(ctx context.Context, r *jobs.Run) error { return s.builds(ctx, r, a.Rollout) }},
				{Name: "migrate", Run: func(ctx context.Context, r *jobs.Run) error { return s.migrate(ctx, r, a.Rollout) }},
			}, nil
		},
		Cleanup: func(ctx context.Context, r *jobs.Run) error {
			var a jobArgs
			if err := r.Job.DecodeArgs(&a); err != nil {
				return err
			}
			j, err := jobs.Get(ctx, s.Store.Pool(), r.Job.ID)
			if err != nil {
				return err
			}
			state := catalog.RolloutFailed
			if j.CancelRequested {
				state = catalog.RolloutCancelled
			}
			return pgx.BeginFunc(ctx, s.Store.Pool(), func(tx pgx.Tx) error {
				// Tenants in flight were rolled back: they are pending again.
				if err := s.Store.RequeueRunningRolloutTenants(ctx, tx, a.Rollout); err != nil {
					return err
				}
				return s.Store.SetRolloutState(ctx, tx, a.Rollout, state)
			})
		},
	}
}

// builds makes sure the target version (or a newer one) is materialised on
// every cluster of the rollout, starting builds where needed and waiting
// for them, then pokes the pool manager to retire old spares and refill.
func (s *Service) builds(ctx context.Context, r *jobs.Run, id int64) error {
	ro, err := s.Store.GetRollout(ctx, nil, id)
	if err != nil {
		return err
	}
	if err := s.Store.SetRolloutState(ctx, s.Store.Pool(), id, catalog.RolloutBuilding); err != nil {
		return err
	}
	for {
		var waiting []string
		for _, name := range s.scope(ro.Cluster) {
			v, err := s.Templates.ProvisionVersion(ctx, ro.Template, name)
			if err == nil && v >= ro.TargetVersion {
				continue
			}
			if err != nil && !errors.Is(err, catalog.ErrNotFound) {
				return err
			}
			if err := s.Templates.Failed(ctx, ro.Template, ro.TargetVersion); err != nil {
				return jobs.Permanent(err)
			}
			b, err := s.Store.GetBuild(ctx, ro.Template, ro.TargetVersion, name)
			if err == nil && b.State == catalog.BuildFailed {
				return jobs.Permanent(fmt.Errorf("template %s version %d failed to build on cluster %s: %s (retry its build job, see `pgtenant job list --type template.build`, then `pgtenant rollout retry %d`)",
					ro.Template, ro.TargetVersion, name, b.Error, id))
			}
			if _, err := s.Templates.EnsureBuild(ctx, ro.Template, ro.TargetVersion, name); err != nil {
				return err
			}
			waiting = append(waiting, name)
		}
		if len(waiting) == 0 {
			break
		}
		r.Progress(ctx, 0, 0, fmt.Sprintf("waiting for template %s v%d to be materialised on %v", ro.Template, ro.TargetVersion, waiting))
		select {
		case <-ctx.Done():
			return context.Cause(ctx)
		case <-time.After(200 * time.Millisecond):
		}
	}
	if s.Pool != nil {
		s.Pool.Poke()
	}
	return nil
}

// migrate moves every tenant of the rollout, then, until none is left, the
// tenants that joined the template meanwhile at an older version (created
// before the target was materialised, or retried). With failed tenants it
// ends the job failed (Permanent: retrying is an operator's decision, after
// a fix). With a canary it pauses once the canary's tenants are done.
func (s *Service) migrate(ctx context.Context, r *jobs.Run, id int64) error {
	if err := s.Store.SetRolloutState(ctx, s.Store.Pool(), id, catalog.RolloutMigrating); err != nil {
		return err
	}
	locks, err := newTenantLocks(ctx, s.Store.Pool())
	if err != nil {
		return err
	}
	d := &dispatcher{s: s, r: r, id: id, clusters: map[string]slots{}, lastPace: map[string]time.Time{}, locks: locks}
	defer d.close()
	provisioningSince := time.Time{}
	for {
		ro, err := s.Store.GetRollout(ctx, nil, id)
		if err != nil {
			return err
		}
		d.ro = ro
		work, err := s.Store.PendingRolloutTenants(ctx, id)
		if err != nil {
			return err
		}
		if len(work) > 0 {
			if err := d.run(ctx, work); err != nil {
				return err
			}
			continue
		}
		added, err := s.Store.AddRolloutTenants(ctx, s.Store.Pool(), id)
		if err != nil {
			return err
		}
		if added > 0 {
			continue
		}
		n, err := s.Store.ProvisioningBelow(ctx, id)
		if err != nil {
			return err
		}
		if n > 0 {
			if provisioningSince.IsZero() {
				provisioningSince = time.Now()
			}
			if time.Since(provisioningSince) < s.Provision.ColdWait.D() {
				d.progress(ctx, true, fmt.Sprintf("waiting for %d tenant(s) being provisioned at an older version", n))
				select {
				case <-ctx.Done():
					return context.Cause(ctx)
				case <-time.After(250 * time.Millisecond):
				}
				continue
			}
			s.Logger.Warn("tenants still provisioning at an older version; a new rollout will move them",
				"component", "migrate", "rollout", id, "tenants", n)
		}
		end, err := s.finish(ctx, id)
		if err != nil || end {
			return err
		}
	}
}

// finish decides, with the rollout locked against a concurrent Retry,
// whether the rollout is over: it is not if tenants were set pending again.
func (s *Service) finish(ctx context.Context, id int64) (bool, error) {
	var failed error
	over := false
	err := pgx.BeginFunc(ctx, s.Store.Pool(), func(tx pgx.Tx) error {
		ro, err := s.Store.LockRollout(ctx, tx, id)
		if err != nil {
			return err
		}
		if ro.Counts[catalog.RolloutTenantPending]+ro.Counts[catalog.RolloutTenantRunning] > 0 {
			return nil
		}
		over = true
		if n := ro.Counts[catalog.RolloutTenantFailed]; n > 0 {
			first := ""
			if ts, err := s.Store.RolloutTenants(ctx, id, []catalog.RolloutTenantState{catalog.RolloutTenantFailed}, 1); err == nil && len(ts) > 0 {
				first = fmt.Sprintf(" (first: tenant %s: %s)", ts[0].Tenant, ts[0].Error)
			}
			failed = jobs.Permanent(fmt.Errorf("%d of %d tenant(s) failed to migrate to version %d%s; they are at their previous version. Fix them and run `pgtenant rollout retry %d`",
				n, ro.Total, ro.TargetVersion, first, id))
			return s.Store.SetRolloutState(ctx, tx, id, catalog.RolloutFailed)
		}
		return s.Store.SetRolloutState(ctx, tx, id, catalog.RolloutSucceeded)
	})
	if err != nil {
		return false, err
	}
	return over, failed
}

// dispatcher hands a rollout's tenants to workers: at most ro.Parallel in
// flight, at most a cluster's slots on each cluster, clusters served round
// robin, the pacer asked before each tenant. It is the only goroutine that
// talks to the job's Run (progress, pacing, pause) and to the catalog about
// tenants: it records them in batches (catalog.RecordRollout).
type dispatcher struct {
	s        *Service
	r        *jobs.Run
	id       int64
	ro       catalog.Rollout
	vs       *versions
	clusters map[string]slots
	locks    *tenantLocks
	lastPace map[string]time.Time
	lastProg time.Time
	inflight int
	settled  map[catalog.RolloutTenantState]int // tenants settled in this run, by state

	started   []string
	outcomes  []catalog.RolloutOutcome
	lastFlush time.Time
}

// paceEvery bounds how often the pacer probes a cluster: before each tenant,
// its answer is at most this old. Probing per tenant would cost the cluster
// more than the migrations of small tenants.
const paceEvery = 100 * time.Millisecond

// flushEvery bounds how long a tenant's outcome waits to be recorded.
const flushEvery = 100 * time.Millisecond

func (d *dispatcher) close() {
	for _, sl := range d.clusters {
		sl.close()
	}
	d.locks.close()
}

// slotsOf returns a cluster's slots, made on first use: per_cluster of them,
// fewer if the cluster has few free connections (never more than half).
func (d *dispatcher) slotsOf(ctx context.Context, name string) (slots, error) {
	if sl, ok := d.clusters[name]; ok {
		return sl, nil
	}
	cl, err := d.s.Clusters.Get(name)
	if err != nil {
		return nil, err
	}
	n := min(d.s.Migrate.PerCluster, d.ro.Parallel)
	admin, err := cl.Admin(ctx)
	if err != nil {
		return nil, err
	}
	var free int
	if err := admin.QueryRow(ctx, `SELECT current_setting('max_connections')::int - current_setting('superuser_reserved_connections')::int
		- (SELECT count(*) FROM pg_stat_activity WHERE backend_type = 'client backend')::int`).Scan(&free); err != nil {
		return nil, fmt.Errorf("connections free on cluster %s: %w", name, cluster.Classify(err))
	}
	n = max(1, min(n, free/2))
	sl := newSlots(d.s.Clusters, name, d.s.Agents, n)
	d.clusters[name] = sl
	return sl, nil
}

// run migrates the given tenants (or stops at the canary).
func (d *dispatcher) run(ctx context.Context, work []catalog.RolloutWork) (err error) {
	lowest := d.ro.TargetVersion
	for _, w := range work {
		if w.Tenant.ID != "" {
			lowest = min(lowest, w.Tenant.Version)
		}
	}
	if d.vs == nil || lowest < d.vs.lowest {
		vs, err := d.s.loadVersions(ctx, d.ro.Template, lowest, d.ro.TargetVersion)
		if err != nil {
			return err
		}
		d.vs = vs
	}
	queues := map[string][]catalog.RolloutWork{}
	var order []string
	for _, w := range work {
		if _, ok := queues[w.Cluster]; !ok {
			order = append(order, w.Cluster)
		}
		queues[w.Cluster] = append(queues[w.Cluster], w)
	}
	d.settled = map[catalog.RolloutTenantState]int{}
	// Whatever happens, what is known is recorded before run returns.
	defer func() {
		if ferr := d.flush(ctx, true); err == nil {
			err = ferr
		}
	}()
	canary := d.ro.Canary > 0 && !d.ro.CanaryPassed
	tried := d.ro.Counts[catalog.RolloutTenantDone] + d.ro.Counts[catalog.RolloutTenantFailed]
	results := make(chan outcome, d.ro.Parallel)
	tick := time.NewTicker(flushEvery)
	defer tick.Stop()
	perCluster := map[string]int{}
	next := 0
	d.inflight = 0
	stopping := false
	var stopErr error
	for {
		for !stopping && d.inflight < d.ro.Parallel && !(canary && tried+d.inflight >= d.ro.Canary) {
			// The next cluster, round robin, with work and a free slot.
			name := ""
			for i := range order {
				c := order[(next+i)%len(order)]
				if len(queues[c]) == 0 {
					continue
				}
				sl, err := d.slotsOf(ctx, c)
				if err != nil {
					// An unknown or unreachable cluster fails its tenants, not the rollout.
					for _, w := range queues[c] {
						d.end(w.RolloutTenant.Tenant, catalog.RolloutTenantFailed, err.Error())
					}
					queues[c] = nil
					continue
				}
				if perCluster[c] < sl.limit() {
					name, next = c, (next+i+1)%len(order)
					break
				}
			}
			if name == "" {
				break
			}
			w := queues[name][0]
			queues[name] = queues[name][1:]
			if d.precheck(w) {
				continue
			}
			if err := d.pace(ctx, name); err != nil {
				if ctx.Err() != nil {
					stopping, stopErr = true, context.Cause(ctx)
					break
				}
				// The cluster cannot be probed (down?): its tenant fails like
				// one that cannot be connected to; the others go on.
				d.end(w.Tenant.ID, catalog.RolloutTenantFailed, err.Error())
				continue
			}
			pool := d.clusters[name]
			sl := pool.take()
			d.inflight++
			perCluster[name]++
			d.started = append(d.started, w.Tenant.ID)
			m := &tenantMove{s: d.s, vs: d.vs, t: w.Tenant, slot: sl, locks: d.locks}
			go func() {
				o := m.run(ctx)
				sl.drop()
				pool.put(sl)
				results <- o
			}()
		}
		if d.inflight == 0 {
			if stopping {
				return stopErr
			}
			if canary && (tried >= d.ro.Canary || !d.pending(queues)) {
				// Every tenant settled so far is one of the canary's: record
				// them, whether the rollout pauses now or has no one left.
				ro, canaryTenants, err := d.recordCanary(ctx)
				if err != nil {
					return err
				}
				if tried >= d.ro.Canary && d.pending(queues) {
					if err := d.canary(ctx, ro, canaryTenants); err != nil {
						return err
					}
					canary = false
					continue
				}
			}
			if !d.pending(queues) {
				d.progress(ctx, true, "")
				return nil
			}
			return fmt.Errorf("rollout %d: tenants left that no worker can take", d.id) // cannot happen: all slots are free
		}
		select {
		case o := <-results:
			d.inflight--
			perCluster[o.cluster]--
			if d.outcome(ctx, o) {
				tried++
			}
			if err := d.flush(ctx, false); err != nil {
				d.s.Logger.Warn("record tenants of a rollout; will retry", "component", "migrate", "rollout", d.id, "err", err)
			}
			d.progress(ctx, false, "")
		case <-tick.C:
			if err := d.flush(ctx, false); err != nil {
				d.s.Logger.Warn("record tenants of a rollout; will retry", "component", "migrate", "rollout", d.id, "err", err)
			}
		case <-ctx.Done():
			if !stopping {
				stopping, stopErr = true, context.Cause(ctx)
			}
			// Workers see ctx too; wait for them to roll back and return.
			for d.inflight > 0 {
				o := <-results
				d.inflight--
				perCluster[o.cluster]--
				d.outcome(ctx, o)
			}
		}
	}
}

// flush records the tenants started and settled since the last flush, at
// most every flushEvery unless now. Records are kept for the next flush
// when the catalog does not answer.
func (d *dispatcher) flush(ctx context.Context, now bool) error {
	if len(d.started) == 0 && len(d.outcomes) == 0 || !now && time.Since(d.lastFlush) < flushEvery {
		return nil
	}
	// Tenants have committed these: record them even while stopping.
	fctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 30*time.Second)
	defer cancel()
	if err := d.s.Store.RecordRollout(fctx, d.id, d.started, d.outcomes); err != nil {
		return fmt.Errorf("record rollout %d: %w", d.id, err)
	}
	d.started, d.outcomes, d.lastFlush = d.started[:0], d.outcomes[:0], time.Now()
	return nil
}

func (d *dispatcher) pending(queues map[string][]catalog.RolloutWork) bool {
	for _, q := range queues {
		if len(q) > 0 {
			return true
		}
	}
	return false
}

// precheck settles a tenant without connecting to it when the catalog says
// enough: gone or on its way out (skipped), already at the target (done by
// someone else: skipped). It reports whether it settled it.
func (d *dispatcher) precheck(w catalog.RolloutWork) bool {
	t := w.Tenant
	switch {
	case t.ID == "":
		d.end(w.RolloutTenant.Tenant, catalog.RolloutTenantSkipped, "the tenant no longer exists (purged)")
	case t.State != catalog.StateActive && t.State != catalog.StateSuspended && t.State != catalog.StateDropped:
		d.end(t.ID, catalog.RolloutTenantSkipped, "the tenant is "+string(t.State))
	case t.Version >= d.ro.TargetVersion:
		d.end(t.ID, catalog.RolloutTenantSkipped, fmt.Sprintf("already at version %d", t.Version))
	default:
		return false
	}
	return true
}

// pace asks the pacer (Light: replay lag) before a tenant of cluster name.
func (d *dispatcher) pace(ctx context.Context, name string) error {
	if time.Since(d.lastPace[name]) < paceEvery {
		return nil
	}
	release, err := d.r.Pace(ctx, name, jobs.Light)
	if err != nil {
		return err
	}
	release()
	d.lastPace[name] = time.Now()
	return nil
}

// outcome queues how a tenant ended for the next flush; it reports whether
// the tenant counts for the canary (done or failed).
func (d *dispatcher) outcome(ctx context.Context, o outcome) bool {
	log := d.s.Logger.With("component", "migrate", "rollout", d.id, "tenant", o.tenant, "cluster", o.cluster)
	rec := catalog.RolloutOutcome{Tenant: o.tenant, Version: o.version, State: o.state, Attempts: o.attempts}
	switch {
	case o.state == catalog.RolloutTenantDone:
		log.Debug("tenant migrated", "version", o.version, "attempts", o.attempts)
	case o.state == "" && ctx.Err() != nil:
		// Rolled back by the stop: it is pending for the next run (the
		// versions it did commit are recorded).
		d.outcomes = append(d.outcomes, rec)
		return false
	case o.state == "" || o.state == catalog.RolloutTenantFailed:
		// Its storage is gone, or it failed: if the tenant is on its way
		// out (a purge that began during the rollout locks its roles out
		// before it drops anything) it is skipped, else it failed.
		t, err := d.s.Store.GetTenant(ctx, nil, o.tenant)
		if errors.Is(err, catalog.ErrNotFound) || (err == nil && t.State != catalog.StateActive &&
			t.State != catalog.StateSuspended && t.State != catalog.StateDropped) {
			rec.State, rec.Error = catalog.RolloutTenantSkipped, "the tenant was dropped for good during the rollout"
			d.outcomes = append(d.outcomes, rec)
			d.settled[rec.State]++
			return false
		}
		rec.State = catalog.RolloutTenantFailed
		fallthrough
	default:
		rec.Error = "unknown error"
		if o.err != nil {
			rec.Error = o.err.Error()
		}
		log.Warn("tenant migration failed; it stays at its previous version", "version", o.version, "attempts", o.attempts, "err", rec.Error)
	}
	d.outcomes = append(d.outcomes, rec)
	d.settled[rec.State]++
	return true
}

// end settles a tenant that was not migrated (skipped, or failed before it
// was tried).
func (d *dispatcher) end(tenant string, state catalog.RolloutTenantState, reason string) {
	d.outcomes = append(d.outcomes, catalog.RolloutOutcome{Tenant: tenant, State: state, Error: reason})
	d.settled[state]++
}

// jobData is what a rollout's job keeps (jobs.Run.SaveData): its canary's
// tenants as they ended, which Get shows. The catalog cannot tell them
// apart once the rollout has gone on.
type jobData struct {
	Canary []catalog.RolloutTenant `json:"canary,omitempty"`
}

// recordCanary records the canary's tenants on the job: while the canary
// holds the rollout back, every tenant done or failed is one of them
// (skipped ones were never tried).
func (d *dispatcher) recordCanary(ctx context.Context) (catalog.Rollout, []catalog.RolloutTenant, error) {
	if err := d.flush(ctx, true); err != nil {
		return catalog.Rollout{}, nil, err
	}
	ro, err := d.s.Store.GetRollout(ctx, nil, d.id)
	if err != nil {
		return ro, nil, err
	}
	tried := ro.Counts[catalog.RolloutTenantDone] + ro.Counts[catalog.RolloutTenantFailed]
	if tried == 0 {
		return ro, nil, nil
	}
	ts, err := d.s.Store.RolloutTenants(ctx, d.id, []catalog.RolloutTenantState{catalog.RolloutTenantFailed, catalog.RolloutTenantDone}, min(tried, 100000))
	if err != nil {
		return ro, nil, err
	}
	if err := d.r.SaveData(ctx, jobData{Canary: ts}); err != nil {
		return ro, nil, fmt.Errorf("record the canary of rollout %d: %w", d.id, err)
	}
	return ro, ts, nil
}

// canary pauses the rollout once its canary tenants are done, or lets it go
// on when canary_auto_continue is set and none of them failed. The pause
// names the tenants to check, with how each ended.
func (d *dispatcher) canary(ctx context.Context, ro catalog.Rollout, ts []catalog.RolloutTenant) error {
	failed := ro.Counts[catalog.RolloutTenantFailed]
	if d.s.Migrate.CanaryAutoContinue && failed == 0 {
		d.s.Logger.Info("canary succeeded; continuing (migrate.canary_auto_continue)", "component", "migrate", "rollout", d.id)
		d.ro.CanaryPassed = true
		return d.s.Store.PassCanary(ctx, d.s.Store.Pool(), d.id)
	}
	if err := d.s.Store.SetRolloutState(ctx, d.s.Store.Pool(), d.id, catalog.RolloutPaused); err != nil {
		return err
	}
	return d.r.Pause(ctx, fmt.Sprintf("canary: %d tenant(s) migrated to v%d, %d failed (%s); check them (`pgtenant rollout show %d`), then `pgtenant rollout continue %d`",
		ro.Counts[catalog.RolloutTenantDone], ro.TargetVersion, failed, canaryList(ts), d.id, d.id))
}

// canaryList names the canary's tenants and how each ended, the failed
// first (jobs.Listed).
func canaryList(ts []catalog.RolloutTenant) string {
	items := make([]string, len(ts))
	for i, t := range ts {
		items[i] = fmt.Sprintf("%s %s", t.Tenant, t.State)
		if t.State == catalog.RolloutTenantFailed {
			items[i] += ": " + strings.Join(strings.Fields(t.Error), " ")
		}
	}
	return jobs.Listed(items, ", ")
}

// progress records the rollout's progress on its job, at most every 250 ms
// unless now.
func (d *dispatcher) progress(ctx context.Context, now bool, msg string) {
	if !now && time.Since(d.lastProg) < 250*time.Millisecond {
		return
	}
	d.lastProg = time.Now()
	c := func(state catalog.RolloutTenantState) int { return d.ro.Counts[state] + d.settled[state] }
	settled := c(catalog.RolloutTenantDone) + c(catalog.RolloutTenantFailed) + c(catalog.RolloutTenantSkipped)
	if msg == "" {
		msg = fmt.Sprintf("%s to v%d: %d done, %d failed, %d skipped, %d in flight", d.ro.Template, d.ro.TargetVersion,
			c(catalog.RolloutTenantDone), c(catalog.RolloutTenantFailed), c(catalog.RolloutTenantSkipped), d.inflight)
	}
	d.r.Progress(ctx, int64(settled), int64(d.ro.Total), msg)
}
