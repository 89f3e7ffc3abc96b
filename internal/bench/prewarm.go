package bench

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"sort"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pgtenant/pgtenant/internal/api"
	"github.com/pgtenant/pgtenant/internal/config"
	"github.com/pgtenant/pgtenant/internal/fleet"
	"github.com/pgtenant/pgtenant/internal/jobs"
	"github.com/pgtenant/pgtenant/internal/provision"
	"github.com/pgtenant/pgtenant/internal/templates"
	"github.com/pgtenant/pgtenant/internal/tenant"
)

// PrewarmOptions shape the prewarm benchmark.
type PrewarmOptions struct {
	Tenants       int           // database tenants
	SchemaTenants int           // schema tenants
	Hot           int           // database tenants with a read workload
	MBPerTenant   int           // data per tenant
	SharedBuffers string        // of the bench's primary
	Measure       time.Duration // how long the workload is measured after each restart
	Warmup        time.Duration // workload before each restart
}

// prewarmRun is one variant's result.
type prewarmRun struct {
	Variant       string        `json:"variant"`
	TimeTo99      time.Duration `json:"time_to_99_percent_hit_ns"` // -1: not reached
	P50First10s   time.Duration `json:"p50_first_10s_ns"`
	P95First10s   time.Duration `json:"p95_first_10s_ns"`
	P50Measure    time.Duration `json:"p50_ns"`
	P95Measure    time.Duration `json:"p95_ns"`
	Queries       int           `json:"queries"`
	ColdBlocks    int64         `json:"cold_tenant_blocks_loaded"`
	HotResident   float64       `json:"hot_resident_after_prewarm"` // fraction of the hot tenants' hot sets in shared_buffers once prewarm ended
	OSCacheDrop   string        `json:"os_cache_dropped"`
	PrewarmFinish time.Duration `json:"prewarm_finished_after_ns,omitempty"`
}

// Prewarm compares, after a restart with a cold OS cache, how fast the hot
// tenants' workload gets back to a 99% buffer hit ratio with (a) no
// prewarm, (b) PostgreSQL's autoprewarm and (c) pgtenant's prioritised
// prewarm.
func (e *Env) Prewarm(ctx context.Context, o PrewarmOptions) ([]prewarmRun, Table, error) {
	fc, stop, err := e.fleetFor(ctx, "prewarm", map[string]string{"shared_buffers": o.SharedBuffers, "max_connections": "300"}, false)
	if err != nil {
		return nil, Table{}, err
	}
	defer stop()
	dir := e.Dir + "/prewarm"
	cfg := benchConfig(fc, dir)
	cfg.Prewarm.WatchInterval = config.Default().Prewarm.WatchInterval // as shipped
	cfg.Prewarm.Standbys = false
	d, err := e.startDaemonInProcess(ctx, fc, cfg)
	if err != nil {
		return nil, Table{}, err
	}
	defer func() {
		if d != nil {
			_ = d.Stop()
		}
	}()
	if err := d.createTemplate(ctx, "kv", []templates.Upload{{Name: "0001.sql", Body: "CREATE TABLE kv (k int PRIMARY KEY, v text);"}}); err != nil {
		return nil, Table{}, err
	}
	b := &prewarmBench{e: e, fc: fc, o: o}
	e.logf("prewarm: creating %d database and %d schema tenants of %d MB each", o.Tenants, o.SchemaTenants, o.MBPerTenant)
	if err := b.makeTenants(ctx, d.client); err != nil {
		return nil, Table{}, err
	}
	// Variants (a) and (b) run without pgtenant.
	if err := d.Stop(); err != nil {
		return nil, Table{}, err
	}
	d = nil

	var runs []prewarmRun
	for _, variant := range []string{"none", "autoprewarm", "pgtenant"} {
		e.logf("prewarm: variant %s", variant)
		r, err := b.variant(ctx, variant, cfg)
		if err != nil {
			return runs, Table{}, fmt.Errorf("variant %s: %w", variant, err)
		}
		runs = append(runs, r)
	}
	return runs, prewarmTable(o, runs), nil
}

type prewarmBench struct {
	e    *Env
	fc   *fleet.Cluster
	o    PrewarmOptions
	hot  []string // databases of the hot tenants
	cold []string // databases of the others (schema tenants share one)
	ids  []string // hot tenant ids
}

func (b *prewarmBench) makeTenants(ctx context.Context, c *api.Client) error {
	rows := b.o.MBPerTenant * 128 * 100 // ~100 rows of ~80 bytes per 8 kB page
	for i := 0; i < b.o.Tenants+b.o.SchemaTenants; i++ {
		mode := tenant.ModeDatabase
		if i >= b.o.Tenants {
			mode = tenant.ModeSchema
		}
		r, err := c.CreateTenant(ctx, provision.Request{Template: "kv", Mode: mode})
		if err != nil {
			return err
		}
		conn, err := pgx.Connect(ctx, b.fc.PrimaryDSN(r.Tenant.Database))
		if err != nil {
			return err
		}
		table := "kv"
		if mode == tenant.ModeSchema {
			table = pgx.Identifier{"t_" + r.Tenant.ID, "kv"}.Sanitize()
		}
		_, err = conn.Exec(ctx, `INSERT INTO `+table+` SELECT i, repeat('x', 60) FROM generate_series(1, $1) i`, rows)
		if err == nil {
			_, err = conn.Exec(ctx, `VACUUM ANALYZE `+table)
		}
		conn.Close(ctx)
		if err != nil {
			return err
		}
		switch {
		case mode == tenant.ModeDatabase && len(b.hot) < b.o.Hot && i%(max(b.o.Tenants/b.o.Hot, 1)) == 0:
			b.hot = append(b.hot, r.Tenant.Database)
			b.ids = append(b.ids, r.Tenant.ID)
		case mode == tenant.ModeDatabase || len(b.cold) == 0 || b.cold[len(b.cold)-1] != r.Tenant.Database:
			b.cold = append(b.cold, r.Tenant.Database)
		}
		if (i+1)%20 == 0 {
			b.e.logf("prewarm: %d tenants made", i+1)
		}
	}
	return nil
}

// variant warms the cache the same way each time (cold tenants read once,
// then the hot workload), restarts the primary with a cold OS cache, and
// measures the hot workload.
func (b *prewarmBench) variant(ctx context.Context, variant string, cfg config.Config) (prewarmRun, error) {
	run := prewarmRun{Variant: variant, TimeTo99: -1}
	if err := b.setAutoprewarm(ctx, variant == "autoprewarm"); err != nil {
		return run, err
	}
	var d *benchDaemon
	if variant == "pgtenant" {
		var err error
		if d, err = b.e.startDaemonInProcess(ctx, b.fc, cfg); err != nil {
			return run, err
		}
		defer func() { _ = d.Stop() }()
	}
	if err := b.readAll(ctx, b.cold); err != nil {
		return run, err
	}
	wctx, cancel := context.WithTimeout(ctx, b.o.Warmup)
	_, err := b.workload(wctx, time.Now())
	cancel()
	if err != nil && !errors.Is(err, context.DeadlineExceeded) {
		return run, err
	}
	if d != nil {
		if _, err := d.client.Capture(ctx, api.CaptureRequest{}); err != nil {
			return run, err
		}
	}
	if err := b.fc.StopNode(ctx, "primary", "fast"); err != nil {
		return run, err
	}
	run.OSCacheDrop = dropOSCache()
	if err := b.fc.StartNode(ctx, "primary"); err != nil {
		return run, err
	}
	start := time.Now()
	if d != nil {
		d.catalog.Reset()
	}
	mctx, cancel := context.WithTimeout(ctx, b.o.Measure)
	defer cancel()
	var wg sync.WaitGroup
	if d != nil {
		wg.Add(1)
		go func() {
			defer wg.Done()
			run.PrewarmFinish, run.HotResident = b.waitPrewarm(mctx, d, start)
		}()
	}
	samples, err := b.workload(mctx, start)
	wg.Wait()
	if err != nil && !errors.Is(err, context.DeadlineExceeded) {
		return run, err
	}
	b.summarise(&run, samples, start)
	if run.ColdBlocks, err = b.coldBlocks(ctx); err != nil {
		return run, err
	}
	return run, nil
}

// setAutoprewarm turns PostgreSQL's autoprewarm on or off (a restart
// applies it; the worker then dumps the cache at shutdown and reloads it at
// start, one database at a time).
func (b *prewarmBench) setAutoprewarm(ctx context.Context, on bool) error {
	conn, err := pgx.Connect(ctx, b.fc.PrimaryDSN("postgres"))
	if err != nil {
		return err
	}
	_, err = conn.Exec(ctx, fmt.Sprintf(`ALTER SYSTEM SET pg_prewarm.autoprewarm = %v`, on))
	conn.Close(ctx)
	if err != nil {
		return err
	}
	if err := b.fc.StopNode(ctx, "primary", "fast"); err != nil {
		return err
	}
	return b.fc.StartNode(ctx, "primary")
}

// readAll reads databases' kv tables through their index (so the pages go
// into shared_buffers; a large sequential scan would use a small ring).
func (b *prewarmBench) readAll(ctx context.Context, dbs []string) error {
	for _, db := range dbs {
		conn, err := pgx.Connect(ctx, b.fc.PrimaryDSN(db))
		if err != nil {
			return err
		}
		var tables []string
		rows, err := conn.Query(ctx, `SELECT quote_ident(schemaname) || '.kv' FROM pg_tables WHERE tablename = 'kv'`)
		if err == nil {
			tables, err = pgx.CollectRows(rows, pgx.RowTo[string])
		}
		for _, t := range tables {
			if err == nil {
				_, err = conn.Exec(ctx, `SET enable_seqscan = off; SET enable_bitmapscan = off; SELECT count(v) FROM `+t+` WHERE k > 0`)
			}
		}
		conn.Close(ctx)
		if err != nil {
			return err
		}
	}
	return nil
}

// sample is one query of the workload.
type sample struct {
	at      time.Duration // since the restart
	latency time.Duration
	hit     int64 // shared buffers hit and read, from EXPLAIN (ANALYZE, BUFFERS)
	read    int64
}

// workload runs random point reads on the hot tenants until ctx ends. Every
// fourth query runs under EXPLAIN (ANALYZE, BUFFERS) to count its buffer
// hits and reads (the others time the plain query): the hit ratio is the
// workload's own, not polluted by the prewarm's reads.
func (b *prewarmBench) workload(ctx context.Context, start time.Time) ([]sample, error) {
	var mu sync.Mutex
	var all []sample
	var wg sync.WaitGroup
	keys := b.o.MBPerTenant * 128 * 100
	for w := range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rng := rand.New(rand.NewPCG(uint64(w), uint64(time.Now().UnixNano())))
			conns := map[string]*pgx.Conn{}
			defer func() {
				for _, c := range conns {
					c.Close(context.Background())
				}
			}()
			for i := 0; ctx.Err() == nil; i++ {
				db := b.hot[rng.IntN(len(b.hot))]
				c := conns[db]
				if c == nil {
					var err error
					if c, err = pgx.Connect(ctx, b.fc.PrimaryDSN(db)); err != nil {
						if ctx.Err() == nil {
							time.Sleep(20 * time.Millisecond) // the server is still starting
						}
						continue
					}
					conns[db] = c
				}
				k := 1 + rng.IntN(keys)
				s := sample{at: time.Since(start)}
				t0 := time.Now()
				var err error
				if i%4 == 0 {
					var plan []byte
					err = c.QueryRow(ctx, `EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) SELECT v FROM kv WHERE k = $1`, k).Scan(&plan)
					if err == nil {
						s.hit, s.read = buffersOf(plan)
						s.latency = -1
					}
				} else {
					var v string
					err = c.QueryRow(ctx, `SELECT v FROM kv WHERE k = $1`, k).Scan(&v)
					s.latency = time.Since(t0)
				}
				if err != nil {
					if ctx.Err() != nil {
						return
					}
					c.Close(context.Background())
					delete(conns, db)
					continue
				}
				mu.Lock()
				all = append(all, s)
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	sort.Slice(all, func(i, j int) bool { return all[i].at < all[j].at })
	return all, ctx.Err()
}

func buffersOf(plan []byte) (hit, read int64) {
	var p []struct {
		Plan struct {
			Hit  int64 `json:"Shared Hit Blocks"`
			Read int64 `json:"Shared Read Blocks"`
		} `json:"Plan"`
	}
	if json.Unmarshal(plan, &p) == nil && len(p) == 1 {
		return p[0].Plan.Hit, p[0].Plan.Read
	}
	return 0, 0
}

// summarise computes latencies and the time to a 99% hit ratio: the start
// of the first 1-second window of the workload's queries whose hit ratio is
// at least 99% (the same rule for every variant).
func (b *prewarmBench) summarise(run *prewarmRun, samples []sample, start time.Time) {
	var first10, whole []time.Duration
	for _, s := range samples {
		if s.latency < 0 {
			continue
		}
		whole = append(whole, s.latency)
		if s.at < 10*time.Second {
			first10 = append(first10, s.latency)
		}
	}
	run.Queries = len(samples)
	run.P50First10s, run.P95First10s = percentile(first10, 50), percentile(first10, 95)
	run.P50Measure, run.P95Measure = percentile(whole, 50), percentile(whole, 95)
	for lo, hi := 0, 0; lo < len(samples); lo++ {
		for hi < len(samples) && samples[hi].at < samples[lo].at+time.Second {
			hi++
		}
		var h, r int64
		for _, s := range samples[lo:hi] {
			h, r = h+s.hit, r+s.read
		}
		if h+r >= 20 && float64(h)/float64(h+r) >= 0.99 {
			run.TimeTo99 = samples[lo].at
			return
		}
	}
}

// waitPrewarm waits for pgtenant's prewarm job after the restart and
// measures how much of the hot tenants' hot sets is then in shared_buffers.
func (b *prewarmBench) waitPrewarm(ctx context.Context, d *benchDaemon, start time.Time) (time.Duration, float64) {
	for ctx.Err() == nil {
		var state string
		err := d.catalog.QueryRow(ctx, `SELECT state FROM jobs WHERE type = $1 AND created_at > $2 ORDER BY id DESC LIMIT 1`,
			jobs.Prewarm, start.Add(-time.Second)).Scan(&state)
		if err == nil && (state == "succeeded" || state == "failed") {
			took := time.Since(start)
			return took, b.hotResident(ctx, d)
		}
		time.Sleep(50 * time.Millisecond)
	}
	return 0, 0
}

// hotResident is the fraction of the hot tenants' captured hot blocks that
// are in shared_buffers.
func (b *prewarmBench) hotResident(ctx context.Context, d *benchDaemon) float64 {
	var want int64
	if err := d.catalog.QueryRow(ctx, `SELECT coalesce(sum(blocks), 0) FROM hot_sets WHERE tenant = ANY($1) AND node = 'primary'`, b.ids).Scan(&want); err != nil || want == 0 {
		return 0
	}
	n, err := b.cachedBlocks(ctx, b.hot)
	if err != nil {
		return 0
	}
	return min(float64(n)/float64(want), 1)
}

func (b *prewarmBench) cachedBlocks(ctx context.Context, dbs []string) (int64, error) {
	conn, err := pgx.Connect(ctx, b.fc.PrimaryDSN("postgres"))
	if err != nil {
		return 0, err
	}
	defer conn.Close(ctx)
	var n int64
	err = conn.QueryRow(ctx, `SELECT count(*) FROM pg_buffercache c JOIN pg_database d ON d.oid = c.reldatabase WHERE d.datname = ANY($1)`, dbs).Scan(&n)
	return n, err
}

// coldBlocks counts the cold tenants' blocks in shared_buffers: the
// workload reads only hot tenants, so they were loaded by a prewarm.
func (b *prewarmBench) coldBlocks(ctx context.Context) (int64, error) {
	return b.cachedBlocks(ctx, b.cold)
}

// dropOSCache empties the page cache (root only); it says what it did.
func dropOSCache() string {
	syscall.Sync()
	if err := os.WriteFile("/proc/sys/vm/drop_caches", []byte("3\n"), 0o200); err != nil {
		return "no: " + err.Error()
	}
	return "yes"
}

func prewarmTable(o PrewarmOptions, runs []prewarmRun) Table {
	t := Table{
		Title: fmt.Sprintf("pgtenant bench prewarm: %d database + %d schema tenants of %d MB, %d hot, shared_buffers %s, restart with a cold OS cache",
			o.Tenants, o.SchemaTenants, o.MBPerTenant, o.Hot, o.SharedBuffers),
		Columns: []string{"variant", "time to 99% hit", "p50 first 10s", "p95 first 10s", fmt.Sprintf("p50 first %s", o.Measure), fmt.Sprintf("p95 first %s", o.Measure),
			"cold-tenant blocks loaded", "hot sets resident after prewarm", "OS cache dropped"},
		Data: map[string]any{"runs": runs, "options": o},
	}
	by := map[string]prewarmRun{}
	for _, r := range runs {
		by[r.Variant] = r
		to99 := "not reached"
		if r.TimeTo99 >= 0 {
			to99 = r.TimeTo99.Round(10 * time.Millisecond).String()
		}
		resident := "-"
		if r.Variant == "pgtenant" {
			resident = fmt.Sprintf("%.1f%% (prewarm done after %s)", 100*r.HotResident, r.PrewarmFinish.Round(10*time.Millisecond))
		}
		t.Rows = append(t.Rows, []string{r.Variant, to99, ms(r.P50First10s), ms(r.P95First10s), ms(r.P50Measure), ms(r.P95Measure),
			fmt.Sprint(r.ColdBlocks), resident, r.OSCacheDrop})
	}
	auto, pgt := by["autoprewarm"], by["pgtenant"]
	ratio := "n/a"
	met := false
	if pgt.TimeTo99 > 0 {
		if auto.TimeTo99 < 0 {
			ratio, met = "autoprewarm never reached 99% within the window", true
		} else {
			r := float64(auto.TimeTo99) / float64(pgt.TimeTo99)
			ratio, met = fmt.Sprintf("%.1fx sooner", r), r >= 3
		}
	}
	t.Checks = []Check{
		{Target: "hot tenants reach 99% hit ratio >= 3x sooner than with autoprewarm", Got: ratio, Met: met},
		{Target: "prewarm never evicts a hotter tenant's blocks for a colder one's (hot sets fully resident after prewarm)",
			Got: fmt.Sprintf("%.1f%% resident", 100*pgt.HotResident), Met: pgt.HotResident >= 0.99},
	}
	t.Notes = append(t.Notes, "time to 99% hit: from the restart to the start of the first 1-second window in which the hot workload's own buffer hits and reads (EXPLAIN (ANALYZE, BUFFERS) on every 4th query) give a hit ratio >= 99%",
		"pgtenant's prewarm runs as shipped (prewarm.watch_interval, rate_limit, parallel, buffer_fraction defaults): it starts when the daemon sees the node again after the restart",
		"cold-tenant blocks: blocks of non-hot tenants in shared_buffers at the end of the window (the workload never reads them)")
	if strings.HasPrefix(pgt.OSCacheDrop, "no") {
		t.Notes = append(t.Notes, "the OS page cache could not be dropped here (needs root and a writable /proc/sys): reads after the restart may come from it")
	}
	return t
}
