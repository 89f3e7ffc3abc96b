package provision

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/pgtenant/pgtenant/internal/catalog"
	"github.com/pgtenant/pgtenant/internal/cluster"
	"github.com/pgtenant/pgtenant/internal/tenant"
)

// ErrNoCapacity says no cluster admits the tenant (docs/operations/placement.md):
// the error names each cluster's reason and the fix.
var ErrNoCapacity = tenant.ErrNoCapacity

// placement caches the fleet that placement and admission read. Reading it
// on each create would cost a scan of the catalog's tenants per sign-up
// (149 ms at a million tenants, bench density), so it is bumped for each
// tenant placed and read again in the background once placementTTL old:
// creates meanwhile use the one they have. Only the first create, and the
// first after Invalidate, wait for a read.
type placement struct {
	mu        sync.Mutex
	fleet     *Fleet
	at        time.Time
	reloading bool
	ttl       time.Duration // placementTTL when 0
}

const placementTTL = 10 * time.Second

// Fleet is what placement knows of every cluster at one moment: the policy
// set on it, what it holds by tier, and (admission on) its connections.
type Fleet struct {
	s        *Service
	Clusters []catalog.Cluster // registered and known to this daemon, by name
	Loads    map[string]map[string]catalog.Load
	// Conns: with admission on, the clusters that answered; Down the
	// others (not candidates until they answer).
	Conns map[string]tenant.Connections
	Down  []string
}

// LoadFleet reads the fleet now.
func (s *Service) LoadFleet(ctx context.Context) (*Fleet, error) {
	cs, err := s.Store.Clusters(ctx)
	if err != nil {
		return nil, err
	}
	loads, err := s.Store.ClusterLoads(ctx)
	if err != nil {
		return nil, err
	}
	f := &Fleet{s: s, Loads: loads, Conns: map[string]tenant.Connections{}}
	for _, c := range cs {
		cl, err := s.Clusters.Get(c.Name)
		if err != nil {
			continue // in the catalog, not (yet) in this daemon's registry
		}
		f.Clusters = append(f.Clusters, c)
		if s.Provision.ConnectionOvercommit == 0 {
			continue
		}
		cc, err := s.connections(ctx, cl)
		if err != nil {
			s.Logger.Warn("placement: cluster did not answer; not placing tenants there", "cluster", c.Name, "err", err)
			f.Down = append(f.Down, c.Name)
			continue
		}
		for t, l := range loads[c.Name] {
			cc.Used += l.Tenants * s.share(c.Name, t, cc.MaxConnections)
		}
		f.Conns[c.Name] = cc
	}
	return f, nil
}

// Need is what a tenant of tier with pins asks of its cluster, size bytes big.
func (f *Fleet) Need(tier string, pins []string, size int64) tenant.Need {
	t := f.s.Tiers[tier]
	return tenant.Need{Tier: tier, Dedicated: t.Dedicated(), Label: t.ClusterLabel, Pins: pins, SizeBytes: size,
		Overcommit: f.s.Provision.ConnectionOvercommit}
}

// Candidates are the clusters as placement sees them for a tenant of tier,
// with their loads; clusters down (admission on) are left out.
func (f *Fleet) Candidates(tier string) []tenant.Candidate {
	var out []tenant.Candidate
	for _, c := range f.Clusters {
		cand := tenant.Candidate{Name: c.Name, MaxTenants: c.MaxTenants, MaxSizeBytes: c.MaxSizeBytes, Labels: c.Labels, Draining: c.Draining}
		for t, l := range f.Loads[c.Name] {
			cand.Tenants += l.Tenants
			cand.SizeBytes += l.SizeBytes
			if l.Tenants > 0 && f.s.Tiers[t].Dedicated() {
				cand.Dedicated = true
			}
		}
		if f.s.Provision.ConnectionOvercommit > 0 {
			cc, ok := f.Conns[c.Name]
			if !ok {
				continue
			}
			cand.Conns = &cc
			cand.Share = f.s.share(c.Name, tier, cc.MaxConnections)
		}
		out = append(out, cand)
	}
	return out
}

// Add counts n tenants of tier (each size bytes) onto a cluster (n < 0:
// off it): a placement or a planned move.
func (f *Fleet) Add(clusterName, tier string, size int64, n int) {
	if f.Loads[clusterName] == nil {
		f.Loads[clusterName] = map[string]catalog.Load{}
	}
	l := f.Loads[clusterName][tier]
	l.Tenants += n
	l.SizeBytes += int64(n) * size
	f.Loads[clusterName][tier] = l
	if cc, ok := f.Conns[clusterName]; ok {
		cc.Used += n * f.s.share(clusterName, tier, cc.MaxConnections)
		f.Conns[clusterName] = cc
	}
}

// Place chooses a cluster for a tenant of tier, pins and size by the
// policy, among every candidate but those in except, or only the one
// named (it must admit the tenant too).
func (f *Fleet) Place(name, tier string, pins []string, size int64, except ...string) (string, error) {
	var cands []tenant.Candidate
	for _, c := range f.Candidates(tier) {
		if (name == "" || c.Name == name) && !contains(except, c.Name) {
			cands = append(cands, c)
		}
	}
	if len(cands) == 0 && (len(f.Down) > 0 && (name == "" || contains(f.Down, name))) {
		return "", fmt.Errorf("%w: no cluster answered when tenants were last counted; retry when one is up", cluster.ErrUnavailable)
	}
	if len(cands) == 0 && len(except) > 0 {
		return "", fmt.Errorf("%w: no other cluster to place a tenant of tier %s on: add one (`pgtenant cluster add`, or `pgtenant up --clusters N`)",
			ErrNoCapacity, tier)
	}
	return tenant.Place(cands, f.Need(tier, pins, size))
}

func contains(xs []string, x string) bool {
	for _, y := range xs {
		if y == x {
			return true
		}
	}
	return false
}

// Invalidate makes the next create read the fleet again (after a change
// of a cluster's policy through this daemon; other daemons see it within
// placementTTL).
func (s *Service) Invalidate() {
	s.placed.mu.Lock()
	s.placed.fleet = nil
	s.placed.mu.Unlock()
}

// place returns the cluster for a new tenant of tier: the named one if it
// admits the tenant, else the least loaded that does (tenant.Place).
func (s *Service) place(ctx context.Context, name, tier string, pins []string) (*cluster.Cluster, error) {
	if name != "" {
		if _, err := s.Clusters.Get(name); err != nil {
			return nil, err
		}
	}
	p := &s.placed
	p.mu.Lock()
	defer p.mu.Unlock()
	switch {
	case p.fleet == nil:
		f, err := s.LoadFleet(ctx)
		if err != nil {
			return nil, err
		}
		p.fleet, p.at = f, time.Now()
	case time.Since(p.at) > cmp.Or(p.ttl, placementTTL) && !p.reloading:
		p.reloading = true
		go s.reloadFleet(context.WithoutCancel(ctx))
	}
	// A cluster that does not answer (the monitor's last probe failed) or
	// whose front door does not serve takes no new tenant while another
	// admits it: a fault stays in its cluster, and creates go elsewhere.
	chosen, err := "", errors.New("no cluster")
	if down := s.down(); name == "" && len(down) > 0 {
		chosen, err = p.fleet.Place(name, tier, pins, 0, down...)
	}
	if err != nil {
		chosen, err = p.fleet.Place(name, tier, pins, 0)
	}
	if err != nil {
		if name != "" && errors.Is(err, ErrNoCapacity) {
			err = fmt.Errorf("%w (the tenant was asked for on cluster %s: choose another, or none)", err, name)
		}
		return nil, err
	}
	p.fleet.Add(chosen, tier, 0, 1)
	return s.Clusters.Get(chosen)
}

// reloadFleet reads the fleet for placement's cache; a failed read keeps
// the old one until the next create tries again.
func (s *Service) reloadFleet(ctx context.Context) {
	ctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	started := time.Now()
	f, err := s.LoadFleet(ctx)
	p := &s.placed
	p.mu.Lock()
	defer p.mu.Unlock()
	p.reloading = false
	if err != nil {
		s.Logger.Warn("placement: read the fleet", "err", err)
		return
	}
	// Not if invalidated meanwhile (the read may predate the change) or
	// read again since it started (that one is newer).
	if p.fleet != nil && p.at.Before(started) {
		p.fleet, p.at = f, time.Now()
	}
}

// down lists the clusters placement avoids when it has a choice: those
// whose last probe failed and those whose front door does not serve (both
// read from memory).
func (s *Service) down() []string {
	out := s.Poolers.Down()
	for _, cl := range s.Clusters.All() {
		if !cl.Answering() {
			out = append(out, cl.Name())
		}
	}
	return out
}

// share is what a tenant of a tier holds of a cluster's connections: its
// connection_limit, or with a pooler in front of the cluster the server
// connections its pool may open (max_db_connections;
// docs/connections.md). An unlimited tier without a pooler may take them all.
func (s *Service) share(clusterName, tierName string, maxConnections int) int {
	tier := s.Tiers[tierName]
	if s.Poolers.Get(clusterName) != nil {
		_, _, maxDB := tier.Pooling()
		return maxDB
	}
	return tenant.Share(tier.ConnectionLimit, maxConnections)
}
