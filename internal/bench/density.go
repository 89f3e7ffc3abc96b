package bench

import (
	"context"
	"fmt"
	"math"
	"math/rand/v2"
	"net/url"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgtenant/pgtenant/internal/api"
	"github.com/pgtenant/pgtenant/internal/catalog"
	"github.com/pgtenant/pgtenant/internal/cluster"
	"github.com/pgtenant/pgtenant/internal/config"
	"github.com/pgtenant/pgtenant/internal/fleet"
	"github.com/pgtenant/pgtenant/internal/pooler"
	"github.com/pgtenant/pgtenant/internal/provision"
	"github.com/pgtenant/pgtenant/internal/tenant"
)

// DensityOptions size bench density's simulated catalog.
type DensityOptions struct {
	SimulateTenants int // catalog rows of tenants at the last scale point
	Clusters        int // registered clusters the tenants are spread over
	Jobs            int // finished jobs in the catalog: about a month of history
	Requests        int // API requests per measured call and scale point
}

// densityCreates are the creates measured at each scale point.
const densityCreates = 20

// DensityPoint is what one scale point of the simulated catalog cost.
type DensityPoint struct {
	Tenants int `json:"tenants"`
	// Create p50/p95: pool claims through the API, placement included.
	CreateP50, CreateP95 time.Duration
	// API p50/p95 through one daemon.
	ListFirst, ListFirstP95     time.Duration
	ListDeepP95, ListClusterP95 time.Duration
	SearchP50, SearchP95        time.Duration
	ShowP50, ShowP95            time.Duration
	JobsP95                     time.Duration
	// ClusterLoads is the read behind placement's cache (in the background
	// every 10 s in each daemon); ClusterTenants the catalog read of one
	// cluster's tenants (reconcile's and the pooler sync's); Render the
	// pooler config of that cluster.
	ClusterLoads, ClusterTenants, Render time.Duration
	PoolerBytes                          int `json:"pooler_config_bytes"`
	PerCluster                           int `json:"tenants_per_cluster"`
	MetricsScrape                        time.Duration
	MetricsBytes                         int `json:"metrics_bytes"`
	DaemonStart                          time.Duration
	HeapBytes                            uint64 `json:"heap_bytes"`
	CatalogBytes                         int64  `json:"catalog_bytes"`
	JobsBytes                            int64  `json:"jobs_bytes"` // of CatalogBytes
	// Placement is its decision alone (p95 of 20) on the fleet it read:
	// every cluster a candidate with its tenants counted.
	Placement time.Duration
	// Reconcile is one of the real cluster, whose share of the simulated
	// tenants (catalog rows without a schema or database) it finds missing.
	Reconcile         time.Duration
	ReconcileFindings int `json:"reconcile_findings"`
	// Other daemons on the same catalog, all serving: show p95 through each.
	OtherDaemonsShowP95 []time.Duration
}

// Density runs bench density --simulate-tenants: the control plane's own
// cost at internet scale. The catalog gets tenant rows (no PostgreSQL
// objects behind them) spread over Clusters registered clusters, and a
// month of finished jobs; at each scale point a daemon is started on it
// and its API, placement query, pooler config generation, /metrics and
// memory are measured.
func (e *Env) Density(ctx context.Context, o DensityOptions) ([]DensityPoint, Table, error) {
	fc, stop, err := e.fleetFor(ctx, "density", nil, true)
	if err != nil {
		return nil, Table{}, err
	}
	defer stop()
	dir, removeDir, err := e.daemonDir("density-daemon")
	if err != nil {
		return nil, Table{}, err
	}
	defer removeDir()
	cfg := benchConfig(fc, dir)
	// Spares of tiny on the real cluster, for the creates measured at each
	// point: placement's decision with a catalog of that size behind it.
	cfg.Pools = []config.PoolConfig{{Template: "tiny", Mode: string(tenant.ModeSchema), Size: densityCreates + 10}}
	d, err := e.startDaemonInProcess(ctx, fc, cfg)
	if err != nil {
		return nil, Table{}, err
	}
	if err := d.createTemplate(ctx, "tiny", tinyTemplate); err != nil {
		d.Stop()
		return nil, Table{}, err
	}
	if err := d.Stop(); err != nil {
		return nil, Table{}, err
	}
	cat, err := smallPool(ctx, cfg.Catalog.DSN)
	if err != nil {
		return nil, Table{}, err
	}
	defer cat.Close()
	clusters, err := registerSimulatedClusters(ctx, cat, fc.Name(), o.Clusters)
	if err != nil {
		return nil, Table{}, err
	}
	e.logf("density: %d clusters registered (%d simulated: their DSNs answer nothing); %d finished jobs of a month", len(clusters), len(clusters)-1, o.Jobs)
	if err := simulateJobs(ctx, cat, o.Jobs, clusters); err != nil {
		return nil, Table{}, err
	}
	store, err := catalog.Open(ctx, cfg.Catalog.DSN, nil)
	if err != nil {
		return nil, Table{}, err
	}
	defer store.Close()

	var points []DensityPoint
	have := 0
	for _, n := range densitySteps(o.SimulateTenants) {
		e.logf("density: adding %d tenants (catalog rows only) to reach %d", n-have, n)
		if err := simulateCatalogTenants(ctx, cat, clusters, n-have); err != nil {
			return nil, Table{}, err
		}
		have = n
		for _, table := range []string{"tenants", "jobs"} {
			if _, err := cat.Exec(ctx, "VACUUM ANALYZE "+table); err != nil {
				return nil, Table{}, err
			}
		}
		p, err := e.densityPoint(ctx, fc, cfg, store, cat, clusters, n, o)
		if err != nil {
			return nil, Table{}, err
		}
		e.logf("density: %d tenants: show p95 %s, search p95 %s, placement query %s, /metrics %s", n, ms(p.ShowP95), ms(p.SearchP95), ms(p.ClusterLoads), ms(p.MetricsScrape))
		points = append(points, p)
	}
	return points, densityTable(points, o), nil
}

// densitySteps are the scale points up to n: each a tenth of the next.
func densitySteps(n int) []int {
	out := []int{n}
	for s := n / 10; s >= 1000 && len(out) < 3; s /= 10 {
		out = append([]int{s}, out...)
	}
	return out
}

// registerSimulatedClusters adds n-1 external clusters beside the real
// one; their DSNs point at a port nothing listens on, so that what is
// measured is the catalog's size, not their servers.
func registerSimulatedClusters(ctx context.Context, cat *pgxpool.Pool, real string, n int) ([]string, error) {
	out := []string{real}
	for i := 1; i < n; i++ {
		out = append(out, fmt.Sprintf("sim%03d", i))
	}
	_, err := cat.Exec(ctx, `INSERT INTO clusters (name, kind, dsn)
		SELECT c, 'external', 'postgres://nobody@127.0.0.1:9/postgres?connect_timeout=1' FROM unnest($1::text[]) c
		ON CONFLICT (name) DO NOTHING`, out[1:])
	return out, err
}

// simulateCatalogTenants adds n active tenants spread evenly over
// clusters: four in five schema tenants (a shared database per cluster),
// one in five database tenants; each with a name and an external id, as a
// platform's sign-up would give them.
func simulateCatalogTenants(ctx context.Context, cat *pgxpool.Pool, clusters []string, n int) error {
	const batch = 50000
	for done := 0; done < n; done += batch {
		k := min(batch, n-done)
		ids, names, cl, modes, dbs := make([]string, k), make([]string, k), make([]string, k), make([]string, k), make([]string, k)
		for i := range k {
			ids[i] = tenant.NewID()
			names[i] = "Customer " + strings.ToLower(ids[i][:8]) + " Ltd"
			cl[i] = clusters[rand.IntN(len(clusters))]
			modes[i], dbs[i] = "schema", "tpl_tiny_shared"
			if i%5 == 0 {
				modes[i], dbs[i] = "database", tenant.PhysicalName(ids[i])
			}
		}
		// Created and claimed at one moment of the last year each (claimed
		// all at once, they would all count as the pools' recent demand).
		if _, err := cat.Exec(ctx, `INSERT INTO tenants (id, name, external_id, mode, cluster, template, version, state, database, created_at, claimed_at, size_bytes)
			SELECT id, name, 'ext-' || id, mode, cluster, 'tiny', 1, 'active', db, at, at, (random() * 50e6)::bigint
			FROM (SELECT u.*, now() - random() * interval '365 days' AS at
			      FROM unnest($1::text[], $2::text[], $3::text[], $4::text[], $5::text[]) AS u(id, name, cluster, mode, db)) s`,
			ids, names, cl, modes, dbs); err != nil {
			return fmt.Errorf("simulated tenants: %w", err)
		}
	}
	return nil
}

// simulateJobs adds n finished jobs created over the last 30 days (each at
// a moment of its own), of the kinds a fleet runs most: purges, builds,
// prewarms and rollout steps.
func simulateJobs(ctx context.Context, cat *pgxpool.Pool, n int, clusters []string) error {
	_, err := cat.Exec(ctx, `INSERT INTO jobs (type, target_kind, target, cluster, state, attempts, created_at, updated_at, started_at, finished_at)
		SELECT (ARRAY['purge','build_template','prewarm','backup'])[1 + g % 4], 'tenant', 'sim' || g, ($2::text[])[1 + g % cardinality($2::text[])],
		       CASE WHEN g % 50 = 0 THEN 'failed' ELSE 'succeeded' END, 1, ts, ts, ts, ts + interval '2 seconds'
		FROM (SELECT g, now() - random() * interval '30 days' AS ts FROM generate_series(1, $1) g) x`, n, clusters)
	if err != nil {
		return fmt.Errorf("simulated jobs: %w", err)
	}
	return nil
}

// densityPoint measures one scale point: a daemon started on the catalog
// (its start, its API, its memory), the placement query, one cluster's
// pooler config, /metrics, a placement decision, a reconcile of the real
// cluster, and more daemons on the same catalog.
func (e *Env) densityPoint(ctx context.Context, fc *fleet.Cluster, cfg config.Config, store *catalog.Store, cat *pgxpool.Pool, clusters []string, n int, o DensityOptions) (DensityPoint, error) {
	p := DensityPoint{Tenants: n}
	if err := cat.QueryRow(ctx, `SELECT pg_total_relation_size('tenants') + pg_total_relation_size('jobs'), pg_total_relation_size('jobs')`).Scan(&p.CatalogBytes, &p.JobsBytes); err != nil {
		return p, err
	}
	var sample []string
	if err := cat.QueryRow(ctx, `SELECT array_agg(id) FROM (SELECT id FROM tenants ORDER BY random() LIMIT $1) s`, o.Requests).Scan(&sample); err != nil {
		return p, err
	}
	if len(sample) == 0 {
		return p, fmt.Errorf("density: no tenant sampled")
	}
	pick := func() string { return sample[rand.IntN(len(sample))] }

	begin := time.Now()
	d, err := e.startDaemonInProcess(ctx, fc, cfg)
	if err != nil {
		return p, err
	}
	defer d.Stop()
	if _, err := d.client.Tenants(ctx, url.Values{"limit": {"1"}}); err != nil {
		return p, err
	}
	p.DaemonStart = time.Since(begin)

	// Creates (pool claims) once the daemon's placement cache is older
	// than its 10 s: the first of them starts its reload, none waits for it.
	// Placement passes over the clusters its monitor found down, so the
	// creates wait for its first probe of each (the simulated ones answer
	// nothing): else one placed there would wait for ever for its template.
	if err := waitPool(ctx, d, "tiny", tenant.ModeSchema, densityCreates+10); err != nil {
		return p, err
	}
	if err := waitProbed(ctx, d, len(clusters)-1); err != nil {
		return p, err
	}
	create := func() error {
		r, err := d.client.CreateTenant(ctx, provision.Request{Template: "tiny", Mode: tenant.ModeSchema})
		if err == nil && r.Path != "pool" {
			err = fmt.Errorf("density: a create was built cold (%s), not claimed", r.Path)
		}
		return err
	}
	if err := create(); err != nil {
		return p, err
	}
	time.Sleep(11 * time.Second)
	if p.CreateP50, p.CreateP95, err = timeCalls(densityCreates, create); err != nil {
		return p, err
	}

	timeCalls := func(f func() error) (p50, p95 time.Duration, err error) { return timeCalls(o.Requests, f) }
	list := func(q url.Values) func() error {
		return func() error { _, err := d.client.Tenants(ctx, q); return err }
	}
	if p.ListFirst, p.ListFirstP95, err = timeCalls(list(url.Values{"limit": {"100"}})); err != nil {
		return p, err
	}
	if _, p.ListDeepP95, err = timeCalls(func() error { return list(url.Values{"limit": {"100"}, "after": {pick()}})() }); err != nil {
		return p, err
	}
	if _, p.ListClusterP95, err = timeCalls(func() error {
		return list(url.Values{"limit": {"100"}, "cluster": {clusters[rand.IntN(len(clusters))]}})()
	}); err != nil {
		return p, err
	}
	// A search a support engineer types: part of a customer's name.
	if p.SearchP50, p.SearchP95, err = timeCalls(func() error { return list(url.Values{"q": {strings.ToLower(pick()[:6])}, "limit": {"100"}})() }); err != nil {
		return p, err
	}
	if p.ShowP50, p.ShowP95, err = timeCalls(func() error { _, err := d.client.Tenant(ctx, pick()); return err }); err != nil {
		return p, err
	}
	if _, p.JobsP95, err = timeCalls(func() error { _, err := d.client.Jobs(ctx, url.Values{"limit": {"100"}}); return err }); err != nil {
		return p, err
	}

	// The placement query, five times (median).
	var loads []time.Duration
	for range 5 {
		b := time.Now()
		if _, err := store.ClusterLoads(ctx); err != nil {
			return p, err
		}
		loads = append(loads, time.Since(b))
	}
	p.ClusterLoads = percentile(loads, 50)
	if p.Placement, err = timePlacement(ctx, store, cfg); err != nil {
		return p, err
	}
	if p.Reconcile, p.ReconcileFindings, err = timeReconcile(ctx, d, fc.Name()); err != nil {
		return p, err
	}

	// One simulated cluster's tenants and its pooler config.
	b := time.Now()
	ts, err := store.ListTenantsOnCluster(ctx, clusters[len(clusters)-1])
	if err != nil {
		return p, err
	}
	p.ClusterTenants, p.PerCluster = time.Since(b), len(ts)
	entries := make([]pooler.Entry, 0, len(ts))
	for _, t := range ts {
		entries = append(entries, pooler.Entry{Name: tenant.PhysicalName(t.ID), Database: t.Database, Verifier: simVerifier,
			PoolMode: pooler.ModeTransaction, PoolSize: 2, MaxDBConnections: 5})
	}
	b = time.Now()
	files, err := pooler.Render("/var/lib/pgtenant/pooler", pooler.Settings{ListenHost: "127.0.0.1", ListenPort: 6432, ServerHost: "127.0.0.1",
		ServerPort: 5432, MaxClientConn: 5000, ServerIdleTimeout: 10 * time.Second, QueryWaitTimeout: 30 * time.Second, AdminVerifier: simVerifier}, entries)
	if err != nil {
		return p, err
	}
	p.Render, p.PoolerBytes = time.Since(b), len(files.Config)+len(files.Auth)+len(files.HBA)

	// /metrics, as Prometheus scrapes it.
	body, took, err := scrape(ctx, d.client.BaseURL+"/metrics")
	if err != nil {
		return p, err
	}
	p.MetricsScrape, p.MetricsBytes = took, len(body)

	runtime.GC()
	var m runtime.MemStats
	runtime.ReadMemStats(&m)
	p.HeapBytes = m.HeapInuse

	// More daemons on the same catalog, all serving.
	for i := 2; i <= densityDaemons; i++ {
		cfgN := cfg
		cfgN.TokenFile = filepath.Join(filepath.Dir(cfg.TokenFile), fmt.Sprintf("token%d", i))
		dn, err := e.startDaemonInProcess(ctx, fc, cfgN)
		if err != nil {
			return p, err
		}
		defer dn.Stop()
		_, p95, err := timeCalls(func() error { _, err := dn.client.Tenant(ctx, pick()); return err })
		if err != nil {
			return p, err
		}
		p.OtherDaemonsShowP95 = append(p.OtherDaemonsShowP95, p95)
	}
	return p, nil
}

// waitProbed waits (a minute at most) until d's /healthz says down
// clusters down: its monitor has probed each.
func waitProbed(ctx context.Context, d *benchDaemon, down int) error {
	n := 0
	for wait := time.Now(); time.Since(wait) < time.Minute; time.Sleep(time.Second) {
		h, err := d.client.Health(ctx)
		if err != nil {
			return err
		}
		n = 0
		for _, st := range h.Clusters {
			if strings.HasPrefix(st, "down") {
				n++
			}
		}
		if n >= down {
			return nil
		}
	}
	return fmt.Errorf("density: the daemon's monitor found %d of the %d simulated clusters down within a minute", n, down)
}

// timeReconcile reconciles a cluster through d's API (report only),
// reconciles times: how long it took (the median) and what it found.
func timeReconcile(ctx context.Context, d *benchDaemon, cluster string) (time.Duration, int, error) {
	var findings int
	took, _, err := timeCalls(reconciles, func() error {
		rep, err := d.client.Reconcile(ctx, api.ReconcileRequest{Cluster: cluster})
		findings = len(rep.Findings)
		return err
	})
	return took, findings, err
}

// reconciles are the reconciles timed at each point: their median is the
// figure (one took 0.2 s and another 4.6 s at the same million tenants).
const reconciles = 3

// densityDaemons is how many daemons share the simulated catalog.
const densityDaemons = 3

// timePlacement reads the fleet as a daemon's placement does (every
// registered cluster, its tenants by tier; connections not counted: the
// simulated clusters have no server) and times its decision for a new
// tenant of the default tier: p95 of 20.
func timePlacement(ctx context.Context, store *catalog.Store, cfg config.Config) (time.Duration, error) {
	cs, err := store.Clusters(ctx)
	if err != nil {
		return 0, err
	}
	reg := cluster.NewRegistry()
	defer reg.Close()
	for _, c := range cs {
		cl, err := cluster.New(c.Name, c.DSN, nil, nil)
		if err != nil {
			return 0, err
		}
		reg.Put(cl)
	}
	pc := cfg.Provision
	pc.ConnectionOvercommit = 0
	s := &provision.Service{Store: store, Clusters: reg, Provision: pc, Tiers: cfg.Tiers}
	f, err := s.LoadFleet(ctx)
	if err != nil {
		return 0, err
	}
	_, p95, err := timeCalls(20, func() error { _, err := f.Place("", "default", nil, 0); return err })
	return p95, err
}

// timeCalls calls f n times in a row: the p50 and p95 of its calls.
func timeCalls(n int, f func() error) (p50, p95 time.Duration, err error) {
	var ds []time.Duration
	for range n {
		b := time.Now()
		if err := f(); err != nil {
			return 0, 0, err
		}
		ds = append(ds, time.Since(b))
	}
	return percentile(ds, 50), percentile(ds, 95), nil
}

// simVerifier is a well-formed SCRAM-SHA-256 verifier for rendered
// configs nobody logs in with.
const simVerifier = "SCRAM-SHA-256$4096:c2FsdHNhbHRzYWx0$c3RvcmVka2V5c3RvcmVka2V5c3RvcmVka2V5MTIzNDU=:c2VydmVya2V5c2VydmVya2V5c2VydmVya2V5MTIzNDU="

func densityTable(ps []DensityPoint, o DensityOptions) Table {
	t := Table{Title: fmt.Sprintf("pgtenant bench density --simulate-tenants %d: the control plane on a catalog of that many tenants over %d clusters (catalog rows only)",
		o.SimulateTenants, o.Clusters), Columns: []string{"measure"}, Data: map[string]any{"points": ps}}
	row := pointRows(&t, ps, func(p DensityPoint) string { return strconv.Itoa(p.Tenants) })
	dur := inMs[DensityPoint]
	row(fmt.Sprintf("create (a pool claim, placement's decision included), p50 of %d", densityCreates), dur(func(p DensityPoint) time.Duration { return p.CreateP50 }))
	row("create, p95", dur(func(p DensityPoint) time.Duration { return p.CreateP95 }))
	row("API list, first page of 100, p95", dur(func(p DensityPoint) time.Duration { return p.ListFirstP95 }))
	row("API list, page after a random id, p95", dur(func(p DensityPoint) time.Duration { return p.ListDeepP95 }))
	row("API list, one cluster's first page, p95", dur(func(p DensityPoint) time.Duration { return p.ListClusterP95 }))
	row("API search (part of a name), p50", dur(func(p DensityPoint) time.Duration { return p.SearchP50 }))
	row("API search (part of a name), p95", dur(func(p DensityPoint) time.Duration { return p.SearchP95 }))
	row("API show, p50", dur(func(p DensityPoint) time.Duration { return p.ShowP50 }))
	row("API show, p95", dur(func(p DensityPoint) time.Duration { return p.ShowP95 }))
	for i := 2; i <= densityDaemons; i++ {
		row(fmt.Sprintf("API show through daemon %d of %d, p95", i, densityDaemons), func(p DensityPoint) string {
			if i-2 < len(p.OtherDaemonsShowP95) {
				return ms(p.OtherDaemonsShowP95[i-2])
			}
			return "-"
		})
	}
	row(fmt.Sprintf("API jobs list (%d finished jobs), p95", o.Jobs), dur(func(p DensityPoint) time.Duration { return p.JobsP95 }))
	row("placement query (loads of every cluster and tier)", dur(func(p DensityPoint) time.Duration { return p.ClusterLoads }))
	row("placement decision on what it read, p95", func(p DensityPoint) string { return fmt.Sprintf("%.3f ms", p.Placement.Seconds()*1000) })
	row(fmt.Sprintf("reconcile of one cluster (its simulated tenants found missing), p50 of %d", reconciles), dur(func(p DensityPoint) time.Duration { return p.Reconcile }))
	row("reconcile findings", func(p DensityPoint) string { return strconv.Itoa(p.ReconcileFindings) })
	row("one cluster's tenants read from the catalog", dur(func(p DensityPoint) time.Duration { return p.ClusterTenants }))
	row("tenants per cluster", func(p DensityPoint) string { return strconv.Itoa(p.PerCluster) })
	row("its pooler config rendered", dur(func(p DensityPoint) time.Duration { return p.Render }))
	row("its pooler config size", func(p DensityPoint) string { return kb(int64(p.PoolerBytes)) })
	row("/metrics scrape", dur(func(p DensityPoint) time.Duration { return p.MetricsScrape }))
	row("/metrics size", func(p DensityPoint) string { return kb(int64(p.MetricsBytes)) })
	row("daemon start to first answer", dur(func(p DensityPoint) time.Duration { return p.DaemonStart }))
	row(fmt.Sprintf("Go heap in use (bench and daemon 1; before daemons 2–%d started)", densityDaemons), func(p DensityPoint) string { return kb(int64(p.HeapBytes)) })
	row("catalog tenants + jobs tables", func(p DensityPoint) string { return kb(p.CatalogBytes) })
	row(fmt.Sprintf("of which jobs (%d finished)", o.Jobs), func(p DensityPoint) string { return kb(p.JobsBytes) })
	t.Notes = []string{
		"catalog rows only: the simulated tenants have no database or schema; their clusters are registered with DSNs nothing answers, so health checks and syncs of those clusters fail fast and are not measured.",
		"each API figure is over --requests calls in a row through one daemon (p50/p95); ids are sampled at random, searches type six letters of a random tenant's name.",
		"the placement query is the read behind a daemon's placement cache: a create that finds the cache older than 10 s starts it in the background and places with the cache it has; only a daemon's first create, and the first after a policy change through it, wait for it.",
	}
	if len(ps) > 0 {
		last := ps[len(ps)-1]
		api := max(last.ListFirstP95, last.ListDeepP95, last.ListClusterP95, last.SearchP95, last.ShowP95)
		t.Checks = append(t.Checks,
			Check{Target: fmt.Sprintf("at %d tenants: API list, search and show p95 <= 50 ms", last.Tenants), Got: "slowest " + ms(api), Met: api <= 50*time.Millisecond},
			Check{Target: fmt.Sprintf("at %d tenants: a create p95 <= 50 ms, placement's cache expired (its read never waited for)", last.Tenants),
				Got: fmt.Sprintf("p95 %s, p50 %s; the read itself %s", ms(last.CreateP95), ms(last.CreateP50), ms(last.ClusterLoads)), Met: last.CreateP95 > 0 && last.CreateP95 <= 50*time.Millisecond},
			Check{Target: fmt.Sprintf("at %d tenants: a placement decision <= 10 ms", last.Tenants),
				Got: fmt.Sprintf("%.3f ms on the fleet it read (the read: %s, in the background)", last.Placement.Seconds()*1000, ms(last.ClusterLoads)), Met: last.Placement > 0 && last.Placement <= 10*time.Millisecond},
			Check{Target: fmt.Sprintf("at %d tenants: /metrics <= 1 s", last.Tenants), Got: ms(last.MetricsScrape), Met: last.MetricsScrape <= time.Second})
	}
	if len(ps) >= 2 {
		first, last := ps[0], ps[len(ps)-1]
		grow := float64(last.Tenants) / float64(first.Tenants)
		t.Notes = append(t.Notes, growthNotes(grow, fmt.Sprintf("%.0f", grow), []growthCase{
			timeGrowth("search p95", "a trigram index's matches, then the page", first.SearchP95, last.SearchP95),
			timeGrowth("placement query", "counts every cluster's tenants by tier: linear, read in the background", first.ClusterLoads, last.ClusterLoads),
			timeGrowth("show p95", "", first.ShowP95, last.ShowP95), timeGrowth("list first page p95", "", first.ListFirstP95, last.ListFirstP95),
			timeGrowth("reconcile of one cluster", "reads the cluster's tenants, and the jobs of those it judges", first.Reconcile, last.Reconcile),
			timeGrowth("placement decision", "", first.Placement, last.Placement),
			timeGrowth("/metrics", "", first.MetricsScrape, last.MetricsScrape),
			sizeGrowth("Go heap", "", int64(first.HeapBytes), int64(last.HeapBytes))})...)
	}
	return t
}

// pointRows gives t a column per point, headed by column, and returns
// the function that adds a row of f over the points.
func pointRows[P any](t *Table, ps []P, column func(P) string) func(name string, f func(P) string) {
	for _, p := range ps {
		t.Columns = append(t.Columns, column(p))
	}
	return func(name string, f func(P) string) {
		r := []string{name}
		for _, p := range ps {
			r = append(r, f(p))
		}
		t.Rows = append(t.Rows, r)
	}
}

// inMs shows a point's duration in milliseconds.
func inMs[P any](f func(P) time.Duration) func(P) string {
	return func(p P) string { return ms(f(p)) }
}

// growthCase is a figure at the first and at the last point, shown by
// show; why says what it reads or holds, printed where it grows.
type growthCase struct {
	name, why string
	a, b      float64
	show      func(float64) string
}

// timeGrowth and sizeGrowth are growth cases of durations and of bytes.
func timeGrowth(name, why string, a, b time.Duration) growthCase {
	return growthCase{name, why, float64(a), float64(b), func(v float64) string { return ms(time.Duration(v)) }}
}

func sizeGrowth(name, why string, a, b int64) growthCase {
	return growthCase{name, why, float64(a), float64(b), func(v float64) string { return kb(int64(v)) }}
}

// countGrowth is a growth case of a count.
func countGrowth(name, why string, a, b int64) growthCase {
	return growthCase{name, why, float64(a), float64(b), func(v float64) string { return strconv.FormatInt(int64(v), 10) }}
}

// growthNotes say how each figure grew while the tenants grew grow times
// (shown as growText), and why where it grew; a figure that was 0 at
// first is left out.
func growthNotes(grow float64, growText string, cs []growthCase) []string {
	var out []string
	for _, c := range cs {
		if c.a > 0 {
			r := c.b / c.a
			verdict := growth(r, grow)
			if verdict != "flat" && c.why != "" {
				verdict += " (" + c.why + ")"
			}
			out = append(out, fmt.Sprintf("%s: ×%.1f for ×%s tenants (%s → %s): %s", c.name, r, growText, c.show(c.a), c.show(c.b), verdict))
		}
	}
	return out
}

// growth names how a figure that became r times larger while the tenants
// became grow times more grew: faster than them (a bend), with them (more
// than the square root of their growth) or flat.
func growth(r, grow float64) string {
	switch {
	case r > grow*1.5:
		return "faster than the tenants: a bend"
	case r > math.Sqrt(grow):
		return "grows with the tenants"
	}
	return "flat"
}
