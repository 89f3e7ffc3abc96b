// Package placement drains clusters and rebalances the fleet: it plans
// moves of tenants (internal/move) to the clusters the placement policy
// chooses (provision.Fleet, tenant.Place; docs/operations/placement.md) and runs a
// plan as a durable job that starts the moves a few at a time per cluster
// (move.max_concurrent_per_cluster) and follows them to the end.
//
// It owns the cluster.drain and fleet.rebalance jobs and the clusters'
// draining flag. It never touches a tenant database itself: sizes are the
// metrics collector's stored numbers, and the moves are move's.
package placement

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"time"

	"github.com/pgtenant/pgtenant/internal/catalog"
	"github.com/pgtenant/pgtenant/internal/cluster"
	"github.com/pgtenant/pgtenant/internal/config"
	"github.com/pgtenant/pgtenant/internal/jobs"
	"github.com/pgtenant/pgtenant/internal/move"
	"github.com/pgtenant/pgtenant/internal/provision"
)

// Service drains and rebalances.
type Service struct {
	Store     *catalog.Store
	Clusters  *cluster.Registry // for the moves' slot lag on /metrics
	Runner    *jobs.Runner
	Provision *provision.Service
	Move      *move.Service
	Config    config.MoveConfig // move: its concurrency limit
	Tiers     map[string]config.Tier
	Logger    *slog.Logger
	// Poll is how often a drain or rebalance job looks at its moves (2 s).
	Poll time.Duration
}

// Move is one planned move.
type Move struct {
	Tenant    string `json:"tenant"`
	From      string `json:"from"`
	To        string `json:"to"`
	SizeBytes int64  `json:"size_bytes"`
	Reason    string `json:"reason"`
}

// Stuck is a tenant a plan cannot move, and why.
type Stuck struct {
	Tenant string `json:"tenant"`
	Reason string `json:"reason"`
}

// Plan is what a drain or rebalance does.
type Plan struct {
	Moves []Move  `json:"moves"`
	Stuck []Stuck `json:"stuck,omitempty"`
}

// inFlight are the moves not finished, any job's: tenant → its move, and
// per cluster how many touch it (as source or target).
type inFlight struct {
	tenants  map[string]Move
	clusters map[string]int
}

func (s *Service) inFlight(ctx context.Context) (inFlight, error) {
	js, err := jobs.List(ctx, s.Store.Pool(), jobs.Filter{Type: jobs.TenantMove, State: jobs.Active})
	if err != nil {
		return inFlight{}, err
	}
	f := inFlight{tenants: map[string]Move{}, clusters: map[string]int{}}
	for _, j := range js {
		var st struct {
			From string `json:"from"`
		}
		_ = json.Unmarshal(j.Data, &st) // no state yet: the tenant's cluster
		if st.From == "" {
			if t, err := s.Store.GetTenant(ctx, nil, j.Target); err == nil {
				st.From = t.Cluster
			}
		}
		f.tenants[j.Target] = Move{Tenant: j.Target, From: st.From, To: j.Cluster}
		f.clusters[st.From]++
		f.clusters[j.Cluster]++
	}
	return f, nil
}

func (s *Service) limit() int { return max(s.Config.MaxConcurrentPerCluster, 1) }

// Drain marks a cluster draining (no new tenants or spares there; the pool
// retires its spares) and starts the job that moves its tenants away.
// Draining again returns the same job while it runs.
func (s *Service) Drain(ctx context.Context, name string) (jobs.Job, error) {
	if _, err := s.Store.GetCluster(ctx, name); err != nil {
		return jobs.Job{}, err
	}
	if _, err := s.Store.SetDraining(ctx, name, true); err != nil {
		return jobs.Job{}, err
	}
	s.Provision.Invalidate()
	s.Provision.Pool.Poke()
	return s.Runner.Enqueue(ctx, s.Store.Pool(), jobs.Spec{Type: jobs.ClusterDrain, Key: "drain:" + name, TargetKind: "cluster",
		Target: name, Cluster: name, Args: drainArgs{Cluster: name}})
}

// Undrain places tenants on the cluster again. A drain job still running
// stops starting moves (those in flight finish).
func (s *Service) Undrain(ctx context.Context, name string) error {
	if _, err := s.Store.SetDraining(ctx, name, false); err != nil {
		return err
	}
	s.Provision.Invalidate()
	s.Provision.Pool.Poke()
	return nil
}

type drainArgs struct {
	Cluster string `json:"cluster"`
}

// PlanDrain plans moving every tenant off a cluster, largest first, each to
// the cluster the policy chooses with the moves before it counted.
func (s *Service) PlanDrain(ctx context.Context, name string) (Plan, error) {
	fleet, err := s.Provision.LoadFleet(ctx)
	if err != nil {
		return Plan{}, err
	}
	ts, err := s.Store.SizedTenants(ctx, name)
	if err != nil {
		return Plan{}, err
	}
	fl, err := s.inFlight(ctx)
	if err != nil {
		return Plan{}, err
	}
	for _, m := range fl.tenants {
		if m.From == name {
			fleet.Add(m.To, tierOf(ts, m.Tenant), 0, 1)
		}
	}
	p := Plan{Moves: []Move{}}
	for _, t := range ts {
		if m, ok := fl.tenants[t.ID]; ok {
			m.SizeBytes, m.Reason = t.SizeBytes, "moving already"
			p.Moves = append(p.Moves, m)
			continue
		}
		if t.State != catalog.StateActive {
			p.Stuck = append(p.Stuck, Stuck{t.ID, fmt.Sprintf("%s: only active tenants move (resume it, or let its purge remove it)", t.State)})
			continue
		}
		to, err := fleet.Place("", t.Tier, t.Pins, t.SizeBytes, name)
		if err != nil {
			p.Stuck = append(p.Stuck, Stuck{t.ID, err.Error()})
			continue
		}
		fleet.Add(to, t.Tier, t.SizeBytes, 1)
		p.Moves = append(p.Moves, Move{Tenant: t.ID, From: name, To: to, SizeBytes: t.SizeBytes, Reason: "drain " + name})
	}
	return p, nil
}

func tierOf(ts []catalog.SizedTenant, id string) string {
	for _, t := range ts {
		if t.ID == id {
			return t.Tier
		}
	}
	return "default"
}

// progress is what a drain or rebalance job keeps between polls.
type progress struct {
	Plan   *Plan             `json:"plan,omitempty"`
	Jobs   map[string]int64  `json:"jobs,omitempty"`   // tenant → its move job
	Done   []string          `json:"done,omitempty"`   // moved
	Failed map[string]string `json:"failed,omitempty"` // tenant → why its move did not happen
}

// Handlers are the job handlers of jobs.ClusterDrain and jobs.Rebalance.
func (s *Service) DrainHandler() jobs.Handler {
	return jobs.Handler{Steps: func(j *jobs.Job) ([]jobs.Step, error) {
		var a drainArgs
		if err := j.DecodeArgs(&a); err != nil {
			return nil, err
		}
		plan := func(ctx context.Context) (Plan, error) { return s.PlanDrain(ctx, a.Cluster) }
		stop := func(ctx context.Context) (bool, error) {
			c, err := s.Store.GetCluster(ctx, a.Cluster)
			return err == nil && !c.Draining, err
		}
		return []jobs.Step{{Name: "moves", Doing: "planning the drain of " + a.Cluster,
			Run: func(ctx context.Context, r *jobs.Run) error { return s.run(ctx, r, plan, stop) }}}, nil
	}}
}

// RebalanceHandler runs a rebalance's plan (its args).
func (s *Service) RebalanceHandler() jobs.Handler {
	return jobs.Handler{Steps: func(j *jobs.Job) ([]jobs.Step, error) {
		var p Plan
		if err := j.DecodeArgs(&p); err != nil {
			return nil, err
		}
		plan := func(context.Context) (Plan, error) { return p, nil }
		return []jobs.Step{{Name: "moves", Doing: "starting the planned moves",
			Run: func(ctx context.Context, r *jobs.Run) error { return s.run(ctx, r, plan, nil) }}}, nil
	}}
}

// run starts a plan's moves, at most move.max_concurrent_per_cluster in
// flight into or out of any cluster (counting every move, this job's or
// not), and follows them until each has ended; it ends failed naming the
// tenants that did not move. stop, polled, ends it early (an undrained
// cluster): moves in flight go on.
func (s *Service) run(ctx context.Context, r *jobs.Run, plan func(context.Context) (Plan, error), stop func(context.Context) (bool, error)) error {
	replan := stop != nil
	var pr progress
	if err := r.LoadData(&pr); err != nil {
		return err
	}
	if pr.Plan == nil {
		p, err := plan(ctx)
		if err != nil {
			return err
		}
		pr.Plan, pr.Jobs, pr.Failed = &p, map[string]int64{}, map[string]string{}
		for _, st := range p.Stuck {
			pr.Failed[st.Tenant] = st.Reason
		}
		if err := r.SaveData(ctx, pr); err != nil {
			return err
		}
	}
	poll := cmp.Or(s.Poll, 2*time.Second)
	total := int64(len(pr.Plan.Moves) + len(pr.Plan.Stuck))
	for {
		if stop != nil {
			if halt, err := stop(ctx); err != nil {
				return err
			} else if halt {
				r.Note(ctx, "stopped: the cluster is not draining any more")
				return nil
			}
		}
		if err := s.follow(ctx, &pr); err != nil {
			return err
		}
		waiting, err := s.startMoves(ctx, &pr)
		if err != nil {
			return err
		}
		if err := r.SaveData(ctx, pr); err != nil {
			return err
		}
		moving := len(pr.Jobs)
		r.Progress(ctx, int64(len(pr.Done)+len(pr.Failed)), total,
			fmt.Sprintf("%d moved, %d moving, %d waiting for a slot, %d cannot move", len(pr.Done), moving, waiting, len(pr.Failed)))
		if moving == 0 && waiting == 0 {
			if !replan {
				break
			}
			// A drain plans again once its moves are done: a tenant that
			// arrived meanwhile (a move into the cluster, a create placed
			// before it was draining) goes too.
			p, err := plan(ctx)
			if err != nil {
				return err
			}
			if !pr.add(p) {
				break
			}
			total = int64(len(pr.Plan.Moves) + len(pr.Plan.Stuck))
			continue
		}
		select {
		case <-ctx.Done():
			return context.Cause(ctx)
		case <-time.After(poll):
		}
	}
	if len(pr.Failed) > 0 {
		ids := make([]string, 0, len(pr.Failed))
		for id := range pr.Failed {
			ids = append(ids, id)
		}
		slices.Sort(ids)
		var b strings.Builder
		for _, id := range ids {
			fmt.Fprintf(&b, "; %s: %s", id, pr.Failed[id])
		}
		return jobs.Permanent(fmt.Errorf("%d moved, %d did not%s", len(pr.Done), len(pr.Failed), b.String()))
	}
	return nil
}

// add adds the moves and refusals of p for tenants the job has not seen,
// and says whether there were any.
func (pr *progress) add(p Plan) bool {
	seen := map[string]bool{}
	for _, m := range pr.Plan.Moves {
		seen[m.Tenant] = true
	}
	for id := range pr.Failed {
		seen[id] = true
	}
	added := false
	for _, m := range p.Moves {
		if !seen[m.Tenant] {
			pr.Plan.Moves = append(pr.Plan.Moves, m)
			added = true
		}
	}
	for _, st := range p.Stuck {
		if !seen[st.Tenant] {
			pr.Plan.Stuck = append(pr.Plan.Stuck, st)
			pr.Failed[st.Tenant] = st.Reason
			added = true
		}
	}
	return added
}

// follow records the moves that ended.
func (s *Service) follow(ctx context.Context, pr *progress) error {
	for id, jid := range pr.Jobs {
		j, err := jobs.Get(ctx, s.Store.Pool(), jid)
		if err != nil {
			return err
		}
		switch j.State {
		case jobs.Succeeded:
			pr.Done = append(pr.Done, id)
		case jobs.Failed, jobs.Cancelled:
			pr.Failed[id] = fmt.Sprintf("move job %d %s: %s", jid, j.State, j.LastError)
		default:
			continue
		}
		delete(pr.Jobs, id)
	}
	return nil
}

// startMoves starts the planned moves that have a slot on both clusters and
// returns how many are still waiting for one.
func (s *Service) startMoves(ctx context.Context, pr *progress) (waiting int, err error) {
	fl, err := s.inFlight(ctx)
	if err != nil {
		return 0, err
	}
	limit := s.limit()
	for _, m := range pr.Plan.Moves {
		if _, ok := pr.Jobs[m.Tenant]; ok || slices.Contains(pr.Done, m.Tenant) || pr.Failed[m.Tenant] != "" {
			continue
		}
		if cur, ok := fl.tenants[m.Tenant]; ok && cur.To != m.To {
			// Moving elsewhere by another request: follow that move.
			m.To = cur.To
		}
		if _, ok := fl.tenants[m.Tenant]; !ok && (fl.clusters[m.From] >= limit || fl.clusters[m.To] >= limit) {
			waiting++
			continue
		}
		if t, err := s.Store.GetTenant(ctx, nil, m.Tenant); err != nil {
			pr.Failed[m.Tenant] = err.Error()
			continue
		} else if t.Cluster == m.To {
			pr.Done = append(pr.Done, m.Tenant) // moved meanwhile
			continue
		}
		j, err := s.Move.Start(ctx, m.Tenant, m.To)
		switch {
		case err == nil || (errors.Is(err, catalog.ErrConflict) && j.ID != 0):
			// Started, or moving already (to m.To or elsewhere): follow its job.
			if _, ok := fl.tenants[m.Tenant]; !ok {
				fl.clusters[m.From]++
				fl.clusters[m.To]++
			}
			pr.Jobs[m.Tenant] = j.ID
		case errors.Is(err, move.ErrRolloutBusy):
			// move.Start's conflict with a rollout migrating the tenant
			// now: try again at the next poll.
			waiting++
		case errors.Is(err, catalog.ErrConflict), errors.Is(err, catalog.ErrNotFound):
			pr.Failed[m.Tenant] = err.Error()
		default:
			return waiting, err
		}
	}
	return waiting, nil
}
