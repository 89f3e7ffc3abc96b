package placement

import (
	"context"
	"fmt"
	"slices"

	"github.com/pgtenant/pgtenant/internal/catalog"
	"github.com/pgtenant/pgtenant/internal/jobs"
	"github.com/pgtenant/pgtenant/internal/provision"
	"github.com/pgtenant/pgtenant/internal/tenant"
)

// minSizeGain is the least a move must even out the sizes of two clusters
// by to be worth its copy, once their tenant counts are even.
const minSizeGain = 64 << 20

// PlanRebalance plans up to maxMoves moves that even out the clusters that
// are not draining, by the policy's measure of load: first the number of
// tenants (from the most loaded cluster while it is above the mean, to the
// cluster the policy chooses, while the move narrows the gap; its largest
// tenants first), then their sizes (a tenant from the largest cluster to
// the smallest, when that narrows the gap by at least minSizeGain without
// widening the counts'). Caps, labels, dedicated tiers and draining
// clusters are the policy's; moves in flight count as done. Tenants of
// dedicated tiers stay where they are.
func (s *Service) PlanRebalance(ctx context.Context, maxMoves int) (Plan, error) {
	fleet, err := s.Provision.LoadFleet(ctx)
	if err != nil {
		return Plan{}, err
	}
	ts, err := s.Store.SizedTenants(ctx, "")
	if err != nil {
		return Plan{}, err
	}
	fl, err := s.inFlight(ctx)
	if err != nil {
		return Plan{}, err
	}
	size := map[string]int64{}
	for _, t := range ts {
		size[t.ID] = t.SizeBytes
	}
	for _, m := range fl.tenants {
		tier := tierOf(ts, m.Tenant)
		fleet.Add(m.From, tier, size[m.Tenant], -1)
		fleet.Add(m.To, tier, size[m.Tenant], 1)
	}
	movable := map[string][]catalog.SizedTenant{} // by cluster, largest first
	for _, t := range ts {
		if _, moving := fl.tenants[t.ID]; moving || t.State != catalog.StateActive || s.Tiers[t.Tier].Dedicated() {
			continue
		}
		movable[t.Cluster] = append(movable[t.Cluster], t)
	}
	p := Plan{Moves: []Move{}}
	planned := map[string]bool{}
	for len(p.Moves) < maxMoves {
		m, ok := nextMove(fleet, movable, planned)
		if !ok {
			break
		}
		tier := tierOf(ts, m.Tenant)
		fleet.Add(m.From, tier, m.SizeBytes, -1)
		fleet.Add(m.To, tier, m.SizeBytes, 1)
		planned[m.Tenant] = true
		p.Moves = append(p.Moves, m)
	}
	return p, nil
}

// loads are the clusters that are balanced (not draining), most loaded first.
func loads(fleet *provision.Fleet) []tenant.Candidate {
	var out []tenant.Candidate
	for _, c := range fleet.Candidates("default") {
		if !c.Draining {
			out = append(out, c)
		}
	}
	slices.SortFunc(out, func(a, b tenant.Candidate) int { return tenant.Less(b, a) })
	return out
}

// nextMove is the move with the largest gain, if any.
func nextMove(fleet *provision.Fleet, movable map[string][]catalog.SizedTenant, planned map[string]bool) (Move, bool) {
	cs := loads(fleet)
	if len(cs) < 2 {
		return Move{}, false
	}
	by := map[string]tenant.Candidate{}
	total := 0
	for _, c := range cs {
		by[c.Name] = c
		total += c.Tenants
	}
	mean := float64(total) / float64(len(cs))
	// Tenant counts.
	for _, src := range cs {
		if float64(src.Tenants) <= mean {
			break
		}
		for _, t := range movable[src.Name] {
			if planned[t.ID] {
				continue
			}
			to, err := fleet.Place("", t.Tier, t.Pins, t.SizeBytes, src.Name)
			if err != nil {
				continue
			}
			if dst, ok := by[to]; ok && src.Tenants-dst.Tenants >= 2 {
				return Move{Tenant: t.ID, From: src.Name, To: to, SizeBytes: t.SizeBytes,
					Reason: fmt.Sprintf("%s holds %d tenants, %s %d (mean %.1f)", src.Name, src.Tenants, to, dst.Tenants, mean)}, true
			}
		}
	}
	// Sizes, the counts being even: the largest cluster's largest tenant
	// that narrows the gap to the smallest cluster that takes it.
	bySize := slices.Clone(cs)
	slices.SortFunc(bySize, func(a, b tenant.Candidate) int { return cmpInt64(b.SizeBytes, a.SizeBytes) })
	src := bySize[0]
	for i := len(bySize) - 1; i > 0; i-- {
		dst := bySize[i]
		if src.Tenants < dst.Tenants+1 {
			continue // the counts would widen
		}
		gap := src.SizeBytes - dst.SizeBytes
		for _, t := range movable[src.Name] {
			if planned[t.ID] || t.SizeBytes <= 0 || t.SizeBytes >= gap {
				continue
			}
			// The gap after the move is |gap - 2·size|.
			after := gap - 2*t.SizeBytes
			if after < 0 {
				after = -after
			}
			if gap-after < minSizeGain {
				continue
			}
			if to, err := fleet.Place(dst.Name, t.Tier, t.Pins, t.SizeBytes); err != nil || to != dst.Name {
				continue
			}
			return Move{Tenant: t.ID, From: src.Name, To: dst.Name, SizeBytes: t.SizeBytes,
				Reason: fmt.Sprintf("%s holds %s, %s %s", src.Name, humanBytes(src.SizeBytes), dst.Name, humanBytes(dst.SizeBytes))}, true
		}
	}
	return Move{}, false
}

func cmpInt64(a, b int64) int {
	switch {
	case a < b:
		return -1
	case a > b:
		return 1
	}
	return 0
}

func humanBytes(n int64) string {
	const unit = 1024
	if n < unit {
		return fmt.Sprintf("%d B", n)
	}
	div, exp := int64(unit), 0
	for m := n / unit; m >= unit; m /= unit {
		div *= unit
		exp++
	}
	return fmt.Sprintf("%.1f %ciB", float64(n)/float64(div), "KMGTPE"[exp])
}

// Rebalance plans up to maxMoves moves and, unless dryRun, starts the job
// that runs them (nil when there is nothing to move). One rebalance runs at
// a time.
func (s *Service) Rebalance(ctx context.Context, dryRun bool, maxMoves int) (Plan, *jobs.Job, error) {
	if maxMoves <= 0 {
		maxMoves = 10
	}
	if !dryRun {
		js, err := jobs.List(ctx, s.Store.Pool(), jobs.Filter{Type: jobs.Rebalance, State: jobs.Active, Limit: 1})
		if err != nil {
			return Plan{}, nil, err
		}
		if len(js) > 0 {
			return Plan{}, nil, fmt.Errorf("%w: a rebalance is running (job %d): wait for it (`pgtenant job show %d`) or cancel it",
				catalog.ErrConflict, js[0].ID, js[0].ID)
		}
	}
	p, err := s.PlanRebalance(ctx, maxMoves)
	if err != nil || dryRun || len(p.Moves) == 0 {
		return p, nil, err
	}
	j, err := s.Runner.Enqueue(ctx, s.Store.Pool(), jobs.Spec{Type: jobs.Rebalance, Key: "rebalance", TargetKind: "fleet", Args: p})
	if err != nil {
		return p, nil, err
	}
	return p, &j, nil
}
