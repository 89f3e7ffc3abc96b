package prewarm

import (
	"context"
	"fmt"
	"sort"

	"github.com/pgtenant/pgtenant/internal/catalog"
	"github.com/pgtenant/pgtenant/internal/cluster"
	"github.com/pgtenant/pgtenant/internal/jobs"
	"github.com/pgtenant/pgtenant/internal/tenant"
)

// Args of a prewarm job.
type Args struct {
	Cluster string   `json:"cluster"`
	Node    string   `json:"node"`              // primary, standby1, …
	Tenants []string `json:"tenants,omitempty"` // only these; all with a hot set when empty
	Reason  string   `json:"reason"`            // restart, failover, resume, manual
}

// Spec is the job for a prewarm.
func Spec(a Args) jobs.Spec {
	key := "prewarm:" + a.Cluster + ":" + a.Node
	target, kind := a.Cluster, "cluster"
	if len(a.Tenants) == 1 {
		key += ":" + a.Tenants[0]
		target, kind = a.Tenants[0], "tenant"
	}
	return jobs.Spec{Type: jobs.Prewarm, Key: key, TargetKind: kind, Target: target, Cluster: a.Cluster, Args: a, MaxAttempts: 3}
}

// Outcome is how a tenant's prewarm on a node ended (TenantResult.State).
type Outcome = catalog.PrewarmOutcome

// Outcomes of a tenant's prewarm.
const (
	Done    = catalog.PrewarmDone
	Skipped = catalog.PrewarmSkipped
	Failed  = catalog.PrewarmFailed
)

// TenantResult is the last prewarm of a tenant on a node.
type TenantResult = catalog.PrewarmResult

// Handler is the job handler of Job: one step that loads the hot sets of the
// node's tenants in priority order. A tenant that cannot be prewarmed is
// recorded and skipped while the others go on; the job's result line then
// names it (`job show`), rather than say "done".
func (s *Service) Handler() jobs.Handler {
	return jobs.Handler{Steps: func(j *jobs.Job) ([]jobs.Step, error) {
		var a Args
		if err := j.DecodeArgs(&a); err != nil {
			return nil, err
		}
		return []jobs.Step{{Name: "prewarm", Run: func(ctx context.Context, r *jobs.Run) error { return s.prewarm(ctx, r, a) }}}, nil
	}}
}

// planned is one tenant's work, in order.
type planned struct {
	t   catalog.Tenant
	hot HotSet
}

// plan orders the node's tenants: tier priority first, then recent activity
// (blocks hit or read between the last two captures), then how hot their
// cached blocks were.
func (s *Service) plan(ctx context.Context, a Args) ([]planned, error) {
	sets, err := s.Store.NodeHotSets(ctx, a.Cluster, a.Node, a.Tenants)
	if err != nil {
		return nil, err
	}
	all, err := s.Store.ListTenantsOnCluster(ctx, a.Cluster)
	if err != nil {
		return nil, err
	}
	byID := map[string]catalog.Tenant{}
	for _, t := range all {
		byID[t.ID] = t
	}
	var out []planned
	for _, h := range sets {
		if t, ok := byID[h.Tenant]; ok { // else dropped and purged since the capture
			out = append(out, planned{t: t, hot: h})
		}
	}
	sort.SliceStable(out, func(i, j int) bool {
		pi, pj := s.Tiers[out[i].t.Tier].Priority, s.Tiers[out[j].t.Tier].Priority
		if pi != pj {
			return pi > pj
		}
		if out[i].hot.Activity != out[j].hot.Activity {
			return out[i].hot.Activity > out[j].hot.Activity
		}
		return out[i].hot.Usage > out[j].hot.Usage
	})
	return out, nil
}

// freeBuffers counts the node's shared buffers that prewarm may fill without
// pushing out anything in use: free ones (all of them after a restart) and,
// unless neverUsed, ones whose usage count has decayed to zero, which the
// clock sweep would evict next anyway. Hotter buffers are never taken.
func (s *Service) freeBuffers(ctx context.Context, cl *cluster.Cluster, node string, neverUsed bool) (int64, error) {
	conn, err := cl.ConnectNode(ctx, node, cl.MaintenanceDB())
	if err != nil {
		return 0, err
	}
	defer conn.Close(context.WithoutCancel(ctx))
	view, err := ensureBufferCache(ctx, conn, node)
	if err != nil {
		return 0, err
	}
	var free int64
	err = conn.QueryRow(ctx, `SELECT pg_catalog.count(*) FROM `+view+`
		WHERE relfilenode IS NULL OR (NOT $1 AND usagecount = 0 AND pinning_backends = 0)`, neverUsed).Scan(&free)
	return free, cluster.Classify(err)
}

func (s *Service) record(ctx context.Context, r TenantResult) error {
	return s.Store.RecordPrewarm(ctx, r)
}

// Results returns a tenant's last prewarm per node.
func (s *Service) Results(ctx context.Context, tenantID string) ([]TenantResult, error) {
	return s.Store.PrewarmResults(ctx, tenantID)
}

// Enqueue starts a prewarm job (idempotent per cluster, node and tenant).
func (s *Service) Enqueue(ctx context.Context, a Args) (jobs.Job, error) {
	if _, err := s.Clusters.Get(a.Cluster); err != nil {
		return jobs.Job{}, err
	}
	for _, id := range a.Tenants {
		if !tenant.ValidID(id) {
			return jobs.Job{}, fmt.Errorf("tenant %q: %w", id, catalog.ErrNotFound)
		}
	}
	return s.Runner.Enqueue(ctx, s.Store.Pool(), Spec(a))
}

// PrewarmTenant prewarms one tenant on its cluster's primary (and standbys
// when prewarm.standbys), e.g. after it was resumed.
func (s *Service) PrewarmTenant(ctx context.Context, t catalog.Tenant) error {
	_, err := s.PrewarmNodes(ctx, t.Cluster, []string{t.ID}, "resume")
	return err
}

// PrewarmNodes starts a prewarm of a cluster's nodes (the primary, and the
// standbys when prewarm.standbys), for some tenants or all with a hot set.
func (s *Service) PrewarmNodes(ctx context.Context, clusterName string, tenants []string, reason string) ([]jobs.Job, error) {
	cl, err := s.Clusters.Get(clusterName)
	if err != nil {
		return nil, err
	}
	nodes := []string{"primary"}
	if s.Prewarm.Standbys {
		nodes = cl.Nodes()
	}
	var out []jobs.Job
	for _, n := range nodes {
		j, err := s.Enqueue(ctx, Args{Cluster: clusterName, Node: n, Tenants: tenants, Reason: reason})
		if err != nil {
			return out, err
		}
		out = append(out, j)
	}
	return out, nil
}
