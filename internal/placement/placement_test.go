package placement_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	examples "github.com/pgtenant/pgtenant/examples/templates"
	"github.com/pgtenant/pgtenant/internal/api"
	"github.com/pgtenant/pgtenant/internal/catalog"
	"github.com/pgtenant/pgtenant/internal/cluster"
	"github.com/pgtenant/pgtenant/internal/config"
	"github.com/pgtenant/pgtenant/internal/daemon"
	"github.com/pgtenant/pgtenant/internal/daemon/daemontest"
	"github.com/pgtenant/pgtenant/internal/jobs"
	"github.com/pgtenant/pgtenant/internal/metrics"
	"github.com/pgtenant/pgtenant/internal/pgtest"
	"github.com/pgtenant/pgtenant/internal/provision"
	"github.com/pgtenant/pgtenant/internal/tenant"
)

// pgs are two clusters, local and local2.
var pgs []*pgtest.Cluster

func TestMain(m *testing.M) {
	os.Exit(pgtest.MainClusters(m, []pgtest.Options{{Name: "local"}, {Name: "local2"}}, &pgs))
}

func testConfig(t *testing.T) config.Config {
	cfg := daemontest.Config(t, pgs[0])
	cfg.Provision.DefaultPoolSize = 0
	cfg.Metrics.Interval = 0
	cfg.Prewarm.CaptureInterval = 0
	cfg.Prewarm.WatchInterval = 0
	cfg.Drop.Retention = config.Duration(time.Second)
	cfg.Tiers["own"] = config.Tier{ConnectionLimit: 5, Placement: "dedicated"}
	cfg.Tiers["ssd"] = config.Tier{ConnectionLimit: 5, ClusterLabel: "disk=ssd"}
	return cfg
}

// fleet runs a daemon over both clusters (with their PgBouncers when
// pooled: moves need them) and the saas template built on both.
func fleet(t *testing.T, cfg config.Config, pooled bool) (*daemon.Daemon, *api.Client) {
	t.Helper()
	d, c, _ := daemontest.StartClusters(t, pgs, cfg, pooled)
	ctx := pgtest.Context(t)
	added, err := c.CreateTemplate(ctx, "saas", examples.Saas())
	if err != nil {
		t.Fatal(err)
	}
	for _, j := range added.BuildJobs {
		if j, err := c.WaitJob(ctx, j.ID, nil); err != nil || j.State != jobs.Succeeded {
			t.Fatalf("build: %v %s", err, j.LastError)
		}
	}
	return d, c
}

func create(t *testing.T, c *api.Client, tier, cluster string) (string, error) {
	t.Helper()
	r, err := c.CreateTenant(pgtest.Context(t), provision.Request{Template: "saas", Mode: "schema", Tier: tier, Cluster: cluster})
	return r.Tenant.Cluster, err
}

func mustCreate(t *testing.T, c *api.Client, tier, cluster, want string) {
	t.Helper()
	got, err := create(t, c, tier, cluster)
	if err != nil || got != want {
		t.Fatalf("create a %s tenant (cluster %q): on %q, %v; want on %s", tier, cluster, got, err, want)
	}
}

// refused checks a create is a 503 no_capacity whose message holds each of want.
func refused(t *testing.T, c *api.Client, tier, cluster string, want ...string) {
	t.Helper()
	got, err := create(t, c, tier, cluster)
	if !errors.Is(err, provision.ErrNoCapacity) {
		t.Fatalf("create a %s tenant (cluster %q): on %q, %v; want no_capacity", tier, cluster, got, err)
	}
	for _, w := range want {
		if !strings.Contains(err.Error(), w) {
			t.Errorf("refusal %q does not say %q", err, w)
		}
	}
}

func ptr[T any](v T) *T { return &v }

// TestPlacement_Rules: the least loaded cluster (fewest tenants, then
// smallest size), caps of tenants and size, labels, dedicated tiers and
// pinning, each against the two clusters, with refusals naming the fix.
func TestPlacement_Rules(t *testing.T) {
	ctx := pgtest.Context(t)
	d, c := fleet(t, testConfig(t), false)

	// A dedicated tenant takes the first empty cluster; no one joins it.
	mustCreate(t, c, "own", "", "local")
	mustCreate(t, c, "default", "", "local2")
	mustCreate(t, c, "default", "", "local2")
	refused(t, c, "own", "", "local holds a tenant of a dedicated tier", "local2 holds 2 tenants", "of its own")
	refused(t, c, "default", "local", "local holds a tenant of a dedicated tier", "asked for on cluster local")

	// Labels: only clusters that carry the tier's label.
	refused(t, c, "ssd", "", "lacks label disk=ssd", "cluster set local2 --label disk=ssd")
	if _, err := c.SetCluster(ctx, "local2", catalog.PlacementChange{Labels: map[string]string{"disk": "ssd"}}); err != nil {
		t.Fatal(err)
	}
	mustCreate(t, c, "ssd", "", "local2")

	// Caps of tenants: local2 holds 3.
	if _, err := c.SetCluster(ctx, "local2", catalog.PlacementChange{MaxTenants: ptr(3)}); err != nil {
		t.Fatal(err)
	}
	refused(t, c, "default", "", "local2 is at its cap of 3 tenants", "--max-tenants")
	if _, err := c.SetCluster(ctx, "local2", catalog.PlacementChange{MaxTenants: ptr(0), RemoveLabels: []string{"disk"}}); err != nil {
		t.Fatal(err)
	}
	mustCreate(t, c, "default", "local2", "local2") // pinned, the cap removed

	// Caps of size, from the sizes the collector stores: 4 tenants of 1 GB.
	ts, err := d.Store().SizedTenants(ctx, "local2")
	if err != nil {
		t.Fatal(err)
	}
	var rollups []catalog.Rollup
	for _, tn := range ts {
		rollups = append(rollups, catalog.Rollup{Tenant: tn.ID, Minute: time.Now().Truncate(time.Minute), SizeBytes: ptr(int64(1 << 30))})
	}
	if err := d.Store().InsertRollups(ctx, rollups); err != nil {
		t.Fatal(err)
	}
	if _, err := c.SetCluster(ctx, "local2", catalog.PlacementChange{MaxSizeBytes: ptr(int64(4 << 30))}); err != nil {
		t.Fatal(err)
	}
	refused(t, c, "default", "local2", "--max-size")
	cs, err := c.Clusters(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for _, cl := range cs {
		if cl.Name == "local2" && (cl.Tenants != 4 || cl.SizeBytes != 4<<30 || cl.MaxSizeBytes != 4<<30 || len(cl.Labels) != 0) {
			t.Errorf("cluster list: local2 %+v; want 4 tenants of 4 GiB, max size 4 GiB, no labels", cl)
		}
	}
}

// TestPlacement_LeastLoaded: with the tenant counts even, the cluster whose
// tenants are smaller gets the next one.
func TestPlacement_LeastLoaded(t *testing.T) {
	ctx := pgtest.Context(t)
	d, c := fleet(t, testConfig(t), false)
	mustCreate(t, c, "default", "", "local")
	mustCreate(t, c, "default", "", "local2")
	ts, err := d.Store().SizedTenants(ctx, "local")
	if err != nil {
		t.Fatal(err)
	}
	if err := d.Store().InsertRollups(ctx, []catalog.Rollup{{Tenant: ts[0].ID, Minute: time.Now().Truncate(time.Minute), SizeBytes: ptr(int64(1 << 30))}}); err != nil {
		t.Fatal(err)
	}
	// A change of policy through the daemon rereads the fleet at once.
	if _, err := c.SetCluster(ctx, "local", catalog.PlacementChange{}); err != nil {
		t.Fatal(err)
	}
	mustCreate(t, c, "default", "", "local2")
	mustCreate(t, c, "default", "", "local")
}

// activeMoves counts the move jobs not finished.
func activeMoves(t *testing.T, c *api.Client) int {
	js, err := c.Jobs(context.Background(), map[string][]string{"type": {string(jobs.TenantMove)}, "state": {"active"}})
	if err != nil {
		t.Error(err)
	}
	return len(js)
}

// watchMoves records the most move jobs seen in flight at once, and the
// phases /metrics showed moves in, until stop.
func watchMoves(t *testing.T, c *api.Client, d *daemon.Daemon) (stop func() (int, map[string]bool)) {
	var mu sync.Mutex
	most := 0
	phases := map[string]bool{}
	done := make(chan struct{})
	ended := make(chan struct{})
	go func() {
		defer close(ended)
		for {
			n := activeMoves(t, c)
			mfs, err := d.Metrics().Gather()
			if err != nil {
				t.Error(err)
			}
			mu.Lock()
			most = max(most, n)
			for _, mf := range mfs {
				if mf.GetName() == "pgtenant_move_lag_bytes" && len(mf.GetMetric()) > 0 {
					phases["lag"] = true
				}
				if mf.GetName() != "pgtenant_moves_in_progress" {
					continue
				}
				for _, m := range mf.GetMetric() {
					if m.GetGauge().GetValue() > 0 {
						phases[m.GetLabel()[0].GetValue()] = true
					}
				}
			}
			mu.Unlock()
			select {
			case <-done:
				return
			case <-time.After(20 * time.Millisecond):
			}
		}
	}()
	return func() (int, map[string]bool) {
		close(done)
		<-ended
		return most, phases
	}
}

// TestDrain_MovesTenantsAway: a drained cluster gets no new tenant (a
// pinned create is refused naming undrain), draining twice is one job, its
// tenants move to the other cluster one at a time
// (move.max_concurrent_per_cluster 1), and `cluster list` shows it
// draining and empty; undrained, it takes tenants again.
func TestDrain_MovesTenantsAway(t *testing.T) {
	ctx := pgtest.Context(t)
	cfg := testConfig(t)
	cfg.Pools = []config.PoolConfig{{Template: "saas", Mode: "schema", Cluster: "local", Size: 1}}
	d, c := fleet(t, cfg, true)
	for range 3 {
		mustCreate(t, c, "default", "local", "local")
	}
	watch := watchMoves(t, c, d)
	j1, err := c.DrainCluster(ctx, "local")
	if err != nil {
		t.Fatal(err)
	}
	j2, err := c.DrainCluster(ctx, "local")
	if err != nil || j2.ID != j1.ID {
		t.Fatalf("drain again: job %d, %v; want the same job %d", j2.ID, err, j1.ID)
	}
	refused(t, c, "default", "local", "local is draining", "cluster undrain local")
	mustCreate(t, c, "default", "", "local2")

	j, err := c.WaitJob(ctx, j1.ID, nil)
	if err != nil || j.State != jobs.Succeeded {
		t.Fatalf("drain: %v %s %s", err, j.State, j.LastError)
	}
	most, phases := watch()
	if most > 1 {
		t.Errorf("%d moves ran at once; move.max_concurrent_per_cluster is 1", most)
	}
	if !phases["copy"] && !phases["cutover"] && !phases["subscribe"] && !phases["schema"] {
		t.Errorf("pgtenant_moves_in_progress showed moves only in phases %v during the drain", phases)
	}
	if !phases["lag"] {
		t.Error("pgtenant_move_lag_bytes never showed a move's slot during the drain")
	}
	if j.ProgressDone != 3 || j.ProgressTotal != 3 {
		t.Errorf("drain progress %d/%d; want 3/3", j.ProgressDone, j.ProgressTotal)
	}
	cs, err := c.Clusters(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for _, cl := range cs {
		if cl.Name == "local" && (!cl.Draining || cl.Tenants != 0) {
			t.Errorf("local after the drain: draining %v with %d tenants; want draining and empty", cl.Draining, cl.Tenants)
		}
		if cl.Name == "local2" && cl.Tenants != 4 {
			t.Errorf("local2 after the drain: %d tenants; want 4", cl.Tenants)
		}
	}
	// Its spare pool is retired.
	deadline := time.Now().Add(time.Minute)
	for {
		var n int
		if err := d.Store().Pool().QueryRow(ctx, `SELECT count(*) FROM tenants WHERE cluster = 'local' AND state = 'spare'`).Scan(&n); err != nil {
			t.Fatal(err)
		}
		if n == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d spares left on the drained cluster", n)
		}
		time.Sleep(100 * time.Millisecond)
	}
	moved, err := d.Store().SizedTenants(ctx, "local2")
	if err != nil || len(moved) == 0 {
		t.Fatalf("tenants on local2: %v", err)
	}
	if _, err := c.MoveTenant(ctx, moved[0].ID, "local"); !errors.Is(err, catalog.ErrConflict) || !strings.Contains(err.Error(), "draining") {
		t.Errorf("a move onto the draining cluster: %v; want a conflict naming the drain", err)
	}
	if _, err := c.UndrainCluster(ctx, "local"); err != nil {
		t.Fatal(err)
	}
	mustCreate(t, c, "default", "", "local")
}

// TestRebalance_MovesAboutHalf: with every tenant on one cluster the plan
// moves half of them, largest first, to the other; a dry run starts
// nothing; a run moves them.
func TestRebalance_MovesAboutHalf(t *testing.T) {
	ctx := pgtest.Context(t)
	d, c := fleet(t, testConfig(t), true)
	for range 4 {
		mustCreate(t, c, "default", "local", "local")
	}
	ts, err := d.Store().SizedTenants(ctx, "local")
	if err != nil {
		t.Fatal(err)
	}
	var rollups []catalog.Rollup
	for i, tn := range ts {
		rollups = append(rollups, catalog.Rollup{Tenant: tn.ID, Minute: time.Now().Truncate(time.Minute), SizeBytes: ptr(int64(i+1) << 20)})
	}
	if err := d.Store().InsertRollups(ctx, rollups); err != nil {
		t.Fatal(err)
	}
	largest := ts[len(ts)-1].ID

	plan, err := c.Rebalance(ctx, api.RebalanceRequest{DryRun: true})
	if err != nil {
		t.Fatal(err)
	}
	if len(plan.Moves) != 2 || plan.Job != nil {
		t.Fatalf("dry run: %d moves, job %v; want 2 and none", len(plan.Moves), plan.Job)
	}
	if m := plan.Moves[0]; m.Tenant != largest || m.From != "local" || m.To != "local2" || m.SizeBytes != 4<<20 || m.Reason == "" {
		t.Errorf("first move %+v; want the largest tenant %s from local to local2 with a reason", m, largest)
	}
	if n := activeMoves(t, c); n != 0 {
		t.Errorf("a dry run started %d moves", n)
	}
	if one, err := c.Rebalance(ctx, api.RebalanceRequest{DryRun: true, MaxMoves: 1}); err != nil || len(one.Moves) != 1 {
		t.Errorf("max_moves 1: %d moves, %v", len(one.Moves), err)
	}

	out, err := c.Rebalance(ctx, api.RebalanceRequest{})
	if err != nil || out.Job == nil {
		t.Fatalf("rebalance: %v, job %v", err, out.Job)
	}
	if _, err := c.Rebalance(ctx, api.RebalanceRequest{}); !errors.Is(err, catalog.ErrConflict) {
		t.Errorf("a second rebalance while one runs: %v; want a conflict", err)
	}
	j, err := c.WaitJob(ctx, out.Job.ID, nil)
	if err != nil || j.State != jobs.Succeeded {
		t.Fatalf("rebalance job: %v %s %s", err, j.State, j.LastError)
	}
	cs, err := c.Clusters(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for _, cl := range cs {
		if cl.Tenants != 2 {
			t.Errorf("%s holds %d tenants after the rebalance; want 2", cl.Name, cl.Tenants)
		}
	}
	again, err := c.Rebalance(ctx, api.RebalanceRequest{DryRun: true})
	if err != nil || len(again.Moves) != 0 {
		t.Errorf("balanced fleet: plan of %d moves, %v; want none", len(again.Moves), err)
	}
}

// TestHostile_PlantedSizeFunctionsDoNotSteerPlacement: tenants of both
// modes plant functions that shadow PostgreSQL's size functions (answering
// 1 PiB) where their own sessions and search_path find them, and write so
// that their sizes are stored; the sizes placement reads are the
// collector's real measures, so a size cap of 1 GiB still admits a tenant.
func TestHostile_PlantedSizeFunctionsDoNotSteerPlacement(t *testing.T) {
	ctx := pgtest.Context(t)
	d, c := fleet(t, testConfig(t), false)
	const lie = int64(1) << 50
	var dsns []string
	for _, mode := range tenant.Modes {
		r, err := c.CreateTenant(ctx, provision.Request{Template: "saas", Mode: mode, Cluster: "local"})
		if err != nil {
			t.Fatal(err)
		}
		dsns = append(dsns, r.DSN)
		conn, err := pgx.Connect(ctx, r.DSN)
		if err != nil {
			t.Fatal(err)
		}
		for _, sig := range []string{"pg_database_size(oid)", "pg_database_size(name)", "pg_total_relation_size(regclass)",
			"pg_relation_size(regclass)", "pg_table_size(regclass)", "pg_indexes_size(regclass)"} {
			if _, err := conn.Exec(ctx, fmt.Sprintf(`CREATE FUNCTION %s RETURNS bigint LANGUAGE sql AS 'SELECT %d::bigint'`, sig, lie)); err != nil {
				t.Fatalf("%s tenant: plant %s: %v", mode, sig, err)
			}
		}
		// Its functions first, wherever it can say so (a role may set its
		// own defaults).
		_, _ = conn.Exec(ctx, `DO $$BEGIN EXECUTE format('ALTER ROLE %I SET search_path = %I, pg_catalog', current_user, current_schema()); END$$`)
		conn.Close(ctx)
	}
	reg := cluster.NewRegistry()
	cl, err := cluster.New("local", pgs[0].PrimaryDSN("postgres"), nil, pgtest.Logger(t))
	if err != nil {
		t.Fatal(err)
	}
	reg.Put(cl)
	t.Cleanup(reg.Close)
	cfg := testConfig(t)
	cfg.Metrics.Interval = config.Duration(15 * time.Second)
	cfg.Metrics.SizeInterval = cfg.Metrics.Interval
	now := time.Now().Truncate(time.Minute)
	col := &metrics.Collector{Store: d.Store(), Clusters: reg, Metrics: cfg.Metrics, Tiers: cfg.Tiers, Logger: pgtest.Logger(t), Now: func() time.Time { return now }}
	pass := func() {
		t.Helper()
		if err := col.Pass(ctx, "local"); err != nil {
			t.Fatal(err)
		}
	}
	// A pass; the tenants write; a pass in the same minute sees them
	// active; one in the next minute writes the minute's rollups, sizes
	// with them.
	pass()
	for _, dsn := range dsns {
		conn, err := pgx.Connect(ctx, dsn)
		if err != nil {
			t.Fatal(err)
		}
		for _, q := range []string{`CREATE TABLE junk AS SELECT generate_series(1, 1000) AS i`, `SELECT pg_stat_force_next_flush()`} {
			if _, err := conn.Exec(ctx, q); err != nil {
				t.Fatal(err)
			}
		}
		conn.Close(ctx)
	}
	now = now.Add(30 * time.Second)
	pass()
	now = now.Add(time.Minute)
	pass()

	ts, err := d.Store().SizedTenants(ctx, "local")
	if err != nil {
		t.Fatal(err)
	}
	if len(ts) != 2 {
		t.Fatalf("%d tenants on local; want 2", len(ts))
	}
	for _, tn := range ts {
		if tn.SizeBytes <= 0 || tn.SizeBytes >= 1<<30 {
			t.Errorf("tenant %s: stored size %d; want its real size (a few MB), not the planted %d", tn.ID, tn.SizeBytes, lie)
		}
	}
	if _, err := c.SetCluster(ctx, "local", catalog.PlacementChange{MaxSizeBytes: ptr(int64(1 << 30))}); err != nil {
		t.Fatal(err)
	}
	mustCreate(t, c, "default", "local", "local")
}

// TestRebalance_EvensSizes: with the tenant counts within one, the plan
// moves the largest cluster's tenant that narrows the size gap most, and
// nothing once a move would not narrow it by minSizeGain.
func TestRebalance_EvensSizes(t *testing.T) {
	ctx := pgtest.Context(t)
	d, c := fleet(t, testConfig(t), false)
	sizes := map[string][]int64{"local": {200 << 20, 200 << 20, 1 << 20}, "local2": {1 << 20, 1 << 20}}
	var rollups []catalog.Rollup
	for _, cl := range []string{"local", "local2"} {
		for _, size := range sizes[cl] {
			r, err := c.CreateTenant(ctx, provision.Request{Template: "saas", Mode: "schema", Cluster: cl})
			if err != nil {
				t.Fatal(err)
			}
			rollups = append(rollups, catalog.Rollup{Tenant: r.Tenant.ID, Minute: time.Now().Truncate(time.Minute), SizeBytes: ptr(size)})
		}
	}
	if err := d.Store().InsertRollups(ctx, rollups); err != nil {
		t.Fatal(err)
	}
	plan, err := c.Rebalance(ctx, api.RebalanceRequest{DryRun: true})
	if err != nil {
		t.Fatal(err)
	}
	if len(plan.Moves) != 1 {
		t.Fatalf("plan %+v; want one move", plan.Moves)
	}
	if m := plan.Moves[0]; m.From != "local" || m.To != "local2" || m.SizeBytes != 200<<20 {
		t.Errorf("move %+v; want a 200 MiB tenant from local to local2", m)
	}
}

// TestDrain_ResumesAfterTheDaemonStops stops the daemon once the drain has
// started a move and starts another on the same catalog: the drain goes on
// from what it recorded, and each tenant is moved by exactly one move job.
func TestDrain_ResumesAfterTheDaemonStops(t *testing.T) {
	ctx := pgtest.Context(t)
	cfg := testConfig(t)
	_, c, stop := daemontest.StartClusters(t, pgs, cfg, false)
	added, err := c.CreateTemplate(ctx, "saas", examples.Saas())
	if err != nil {
		t.Fatal(err)
	}
	for _, j := range added.BuildJobs {
		if j, err := c.WaitJob(ctx, j.ID, nil); err != nil || j.State != jobs.Succeeded {
			t.Fatalf("build: %v %s", err, j.LastError)
		}
	}
	var ids []string
	for range 2 {
		r, err := c.CreateTenant(ctx, provision.Request{Template: "saas", Mode: "schema", Cluster: "local"})
		if err != nil {
			t.Fatal(err)
		}
		ids = append(ids, r.Tenant.ID)
	}
	dj, err := c.DrainCluster(ctx, "local")
	if err != nil {
		t.Fatal(err)
	}
	for deadline := time.Now().Add(time.Minute); ; time.Sleep(20 * time.Millisecond) {
		js, err := c.Jobs(ctx, map[string][]string{"type": {string(jobs.TenantMove)}})
		if err != nil {
			t.Fatal(err)
		}
		if len(js) > 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the drain started no move within a minute")
		}
	}
	stop()

	_, c, _ = daemontest.StartClusters(t, pgs, cfg, false)
	j, err := c.WaitJob(ctx, dj.ID, nil)
	if err != nil || j.State != jobs.Succeeded {
		t.Fatalf("drain after the restart: %v %s %s", err, j.State, j.LastError)
	}
	for _, id := range ids {
		tn, err := c.Tenant(ctx, id)
		if err != nil || tn.Cluster != "local2" {
			t.Errorf("tenant %s after the drain: on %s, %v; want local2", id, tn.Cluster, err)
		}
		js, err := c.Jobs(ctx, map[string][]string{"type": {string(jobs.TenantMove)}, "target": {id}})
		if err != nil || len(js) != 1 || js[0].State != jobs.Succeeded {
			t.Errorf("tenant %s: %d move jobs (%v); want one, succeeded", id, len(js), err)
		}
	}
}
