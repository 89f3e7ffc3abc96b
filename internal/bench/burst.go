package bench

import (
	"context"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	examples "github.com/pgtenant/pgtenant/examples/templates"
	"github.com/pgtenant/pgtenant/internal/api"
	"github.com/pgtenant/pgtenant/internal/config"
	"github.com/pgtenant/pgtenant/internal/fleet"
	"github.com/pgtenant/pgtenant/internal/jobs"
	"github.com/pgtenant/pgtenant/internal/provision"
	"github.com/pgtenant/pgtenant/internal/tenant"
)

// BurstOptions tune `bench burst`.
type BurstOptions struct {
	Creates     int           // requests in the burst
	RetryShare  float64       // of them, retries of an external id sent earlier in the burst
	SchemaShare float64       // of the new tenants, schema mode (the rest database mode)
	RetryAfter  time.Duration // retries are sent this long after the burst starts (a client's timeout)
	BigPool     int           // pool size per mode of the second variant
	Observe     time.Duration // the pools are watched this long after the burst
	Sample      time.Duration // pool sizes are sampled this often
	// Probes pool creates of a template of their own are sent one at a
	// time, every ProbeEvery, from the burst's start (its pool holds as many).
	Probes     int
	ProbeEvery time.Duration
	Seed       uint64
}

// Paths a burst request can be answered by.
const (
	pathPool  = "pool"
	pathCold  = "cold"
	pathRetry = "retry" // existing: an earlier request with the external id made the tenant
	pathProbe = "probe" // a pool create of the probe template, one at a time during the burst
)

// BurstPath is the latency of the requests answered by one path.
type BurstPath struct {
	N   int           `json:"n"`
	P50 time.Duration `json:"p50_ns"`
	P95 time.Duration `json:"p95_ns"`
	P99 time.Duration `json:"p99_ns"`
}

// PoolSample is the pool of the burst's template at one moment.
type PoolSample struct {
	At       time.Duration `json:"at_ns"` // since the burst started (negative: before)
	Database int           `json:"database_spares"`
	Schema   int           `json:"schema_spares"`
	Building int           `json:"building"`
}

// Ready is the number of ready spares of both modes.
func (s PoolSample) Ready() int { return s.Database + s.Schema }

// BurstRow is one variant's burst.
type BurstRow struct {
	Variant    string               `json:"variant"`
	PoolSize   int                  `json:"pool_size_per_mode"`
	MaxPool    int                  `json:"max_pool_size"`
	Requests   int                  `json:"requests"`
	Retries    int                  `json:"retries_sent"`
	Answered   int                  `json:"answered"`
	Correct    int                  `json:"correct"`
	Wrong      []string             `json:"wrong,omitempty"` // what was wrong with the first few answers that were
	Tenants    int                  `json:"tenants"`         // distinct tenants answered
	Duplicates int                  `json:"duplicates"`      // external ids with more than one tenant in the catalog
	Wall       time.Duration        `json:"wall_ns"`         // from the burst's start to its last answer
	PerSec     float64              `json:"creates_per_sec"` // requests answered per second of wall time
	Paths      map[string]BurstPath `json:"paths"`
	Cost       Cost                 `json:"cost"` // peak replay lag, WAL, checkpoints during the burst
	Pool       []PoolSample         `json:"pool"`
	PoolAtEnd  PoolSample           `json:"pool_at_burst_end"`
	// ColdBuilds are the build jobs of the creates that went cold: how long
	// they were queued and how long they ran. SpareBuilds counts the spare
	// builds that ran during the burst.
	ColdBuilds  BuildJobs `json:"cold_builds"`
	SpareBuilds int       `json:"spare_builds_during_burst"`
	// Probe is the probe creates served from their pool during the burst,
	// ProbeIdle the same just before it; ProbeMissed counts those that
	// failed or did not find a spare.
	Probe       BurstPath `json:"probe"`
	ProbeIdle   BurstPath `json:"probe_idle"`
	ProbeMissed int       `json:"probe_missed"`
}

// idleProbes are the probe creates sent one at a time before each burst:
// what a pool create costs on the same fleet when nothing else runs.
const idleProbes = 10

// BuildJobs summarises build jobs.
type BuildJobs struct {
	N         int           `json:"n"`
	QueuedP50 time.Duration `json:"queued_p50_ns"`
	QueuedMax time.Duration `json:"queued_max_ns"`
	RunP50    time.Duration `json:"run_p50_ns"`
	RunP95    time.Duration `json:"run_p95_ns"`
}

// BurstResult is what `bench burst` measured.
type BurstResult struct {
	Options BurstOptions `json:"options"`
	Rows    []BurstRow   `json:"rows"`
}

// burstReq is one request of the burst.
type burstReq struct {
	ext   string
	mode  tenant.Mode
	retry bool // the external id was sent earlier in the burst
}

// burstPlan makes n requests: round(n × retryShare) of them retry an external
// id sent by an earlier request (same mode), the others are new external ids,
// round(new × schemaShare) of them schema tenants. The first request is new.
func burstPlan(n int, retryShare, schemaShare float64, prefix string, rng *rand.Rand) []burstReq {
	retries := int(math.Round(float64(n) * retryShare))
	retries = min(retries, n-1)
	isRetry := make([]bool, n)
	for i := 1; i <= retries; i++ {
		isRetry[i] = true
	}
	rng.Shuffle(n-1, func(i, j int) { isRetry[i+1], isRetry[j+1] = isRetry[j+1], isRetry[i+1] })
	fresh := n - retries
	schema := make([]bool, fresh)
	for i := range int(math.Round(float64(fresh) * schemaShare)) {
		schema[i] = true
	}
	rng.Shuffle(fresh, func(i, j int) { schema[i], schema[j] = schema[j], schema[i] })
	var out, originals []burstReq
	for i := range n {
		if isRetry[i] {
			o := originals[rng.IntN(len(originals))]
			out = append(out, burstReq{ext: o.ext, mode: o.mode, retry: true})
			continue
		}
		r := burstReq{ext: fmt.Sprintf("%s-%d", prefix, len(originals)+1), mode: tenant.ModeDatabase}
		if schema[len(originals)] {
			r.mode = tenant.ModeSchema
		}
		originals = append(originals, r)
		out = append(out, r)
	}
	return out
}

// burstAnswer is what one request got.
type burstAnswer struct {
	req     burstReq
	resp    api.CreateTenantResponse
	err     error
	latency time.Duration // from the request to a usable tenant (its build job waited for, if any)
	path    string
}

// Burst runs `bench burst`: on one fleet (a primary and a streaming standby),
// the same burst of concurrent creates against (a) the shipped defaults and
// (b) pools of BigPool spares per mode, each variant with a catalog and a
// template of its own so that they share no spares.
func (e *Env) Burst(ctx context.Context, o BurstOptions) (BurstResult, Table, error) {
	res := BurstResult{Options: o}
	if o.Creates < 2 || o.RetryShare < 0 || o.RetryShare >= 1 || o.SchemaShare < 0 || o.SchemaShare > 1 || o.BigPool < 1 {
		return res, Table{}, errors.New("--creates must be at least 2, --retries in [0, 1), --schema-share in [0, 1], --big-pool at least 1")
	}
	if o.Probes < 1 || o.ProbeEvery <= 0 {
		return res, Table{}, errors.New("--probes must be at least 1 and --probe-every positive")
	}
	if o.Sample <= 0 {
		o.Sample = 250 * time.Millisecond
	}
	// Real fsync, as in bench provision: what the copies cost the disk is
	// part of what the burst meets.
	fc, stop, err := e.fleetFor(ctx, "burst", nil, false)
	if err != nil {
		return res, Table{}, err
	}
	defer stop()
	meter, err := newMeter(ctx, fc)
	if err != nil {
		return res, Table{}, err
	}
	defer meter.Close()

	defaults := config.Default()
	variants := []struct {
		key, name string
		pool      int
	}{
		{"default", "default settings", defaults.Provision.DefaultPoolSize},
		{fmt.Sprintf("pool%d", o.BigPool), fmt.Sprintf("pool of %d", o.BigPool), o.BigPool},
	}
	for i, v := range variants {
		rng := rand.New(rand.NewPCG(o.Seed, o.Seed^uint64(i+1)))
		rows, err := e.burstVariant(ctx, fc, meter, o, v.key, v.name, v.pool, i == 0, rng)
		res.Rows = append(res.Rows, rows...)
		if err != nil {
			return res, Table{}, fmt.Errorf("%s: %w", v.name, err)
		}
	}
	return res, burstTable(res), nil
}

// burstConfig is the daemon configuration of a variant: the shipped defaults
// for everything that provisions (pools, pacer, jobs, cold_wait), with
// background work no row measures turned off, as in every bench.
func burstConfig(fc *fleet.Cluster, dir, catalogDB, template string, pool int, probe string, probes int) config.Config {
	cfg := benchConfig(fc, dir)
	def := config.Default()
	cfg.Catalog.DSN = fc.PrimaryDSN(catalogDB)
	cfg.Provision.DefaultPoolSize = def.Provision.DefaultPoolSize
	cfg.Provision.ColdWait = def.Provision.ColdWait
	cfg.Pools = []config.PoolConfig{{Template: probe, Mode: string(tenant.ModeDatabase), Size: probes}}
	if pool != def.Provision.DefaultPoolSize {
		cfg.Pools = append(cfg.Pools,
			config.PoolConfig{Template: template, Mode: string(tenant.ModeDatabase), Size: pool},
			config.PoolConfig{Template: template, Mode: string(tenant.ModeSchema), Size: pool})
	}
	return cfg
}

// burstVariant starts a daemon with the variant's configuration on a
// catalog of its own, fills its pools and runs the burst; with again, it
// waits until the pools have grown after it and runs a second burst.
func (e *Env) burstVariant(ctx context.Context, fc *fleet.Cluster, meter *Meter, o BurstOptions, key, name string, pool int,
	again bool, rng *rand.Rand) ([]BurstRow, error) {
	v := burstSetup{name: name, prefix: "burst-" + key, catalogDB: "pgtenant_burst_" + key, template: "saas_" + key,
		probe: "probe_" + key, pool: pool}
	dir := filepath.Join(e.Dir, "burst", key)
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, err
	}
	cfg := burstConfig(fc, dir, v.catalogDB, v.template, pool, v.probe, o.Probes+idleProbes)
	v.maxPool = max(pool, cfg.Provision.MaxPoolSize)
	d, err := e.startDaemonInProcess(ctx, fc, cfg)
	if err != nil {
		return nil, err
	}
	defer d.Stop()
	e.logf("burst: %s: materialising template %s and filling its pools (%d spares per mode)", name, v.template, pool)
	for _, tp := range []string{v.template, v.probe} {
		if err := d.createTemplate(ctx, tp, examples.Saas()); err != nil {
			return nil, err
		}
	}
	for _, mode := range tenant.Modes {
		if err := waitPool(ctx, d, v.template, mode, pool); err != nil {
			return nil, err
		}
	}
	row, err := e.burstRun(ctx, meter, d, o, v, rng)
	if err != nil || !again {
		return []BurstRow{row}, err
	}
	// The pools grew with the burst's creates: the next burst meets them.
	const regrow = 5 * time.Minute
	e.logf("burst: %s: waiting (at most %s) until its pools have grown to %d spares per mode", name, regrow, v.maxPool)
	wctx, cancel := context.WithTimeout(ctx, regrow)
	for _, mode := range tenant.Modes {
		if err := waitPool(wctx, d, v.template, mode, v.maxPool); err != nil && ctx.Err() == nil {
			e.logf("burst: %s: the %s pool did not reach %d within %s (%v)", name, mode, v.maxPool, regrow, err)
		}
	}
	cancel()
	v.name, v.prefix = name+", 2nd burst", v.prefix+"-2nd"
	again2, err := e.burstRun(ctx, meter, d, o, v, rng)
	return []BurstRow{row, again2}, err
}

// burstSetup is one daemon's burst: its catalog, templates and pools.
type burstSetup struct {
	name, prefix, catalogDB, template, probe string
	pool, maxPool                            int
}

// burstRun runs one burst on a daemon whose pools are filled: idle probes,
// then the burst with probes alongside, then the pools are watched.
func (e *Env) burstRun(ctx context.Context, meter *Meter, d *benchDaemon, o BurstOptions, v burstSetup, rng *rand.Rand) (BurstRow, error) {
	row := BurstRow{Variant: v.name, PoolSize: v.pool, MaxPool: v.maxPool, Requests: o.Creates, Paths: map[string]BurstPath{}}
	if err := waitPool(ctx, d, v.probe, tenant.ModeDatabase, o.Probes+idleProbes); err != nil {
		return row, err
	}
	if err := d.waitIdle(ctx); err != nil {
		return row, err
	}
	idle := probeCreates(ctx, d, v.probe, idleProbes, o.ProbeEvery, nil)
	row.ProbeIdle, _ = probeStats(idle)
	// The probe pool refills behind them before the burst starts.
	if err := waitPool(ctx, d, v.probe, tenant.ModeDatabase, o.Probes+idleProbes); err != nil {
		return row, err
	}
	if err := d.waitIdle(ctx); err != nil {
		return row, err
	}
	if err := meter.Settle(ctx, v.catalogDB); err != nil {
		return row, err
	}

	plan := burstPlan(o.Creates, o.RetryShare, o.SchemaShare, v.prefix, rng)
	for _, r := range plan {
		if r.retry {
			row.Retries++
		}
	}
	e.logf("burst: %s: %d creates at once (%d new external ids, %d retries sent after %s)", v.name, len(plan),
		len(plan)-row.Retries, row.Retries, o.RetryAfter)
	x, err := meter.Start(ctx)
	if err != nil {
		return row, err
	}
	start := time.Now()
	sampler := samplePool(ctx, d.catalog, v.template, start, o.Sample)
	burstDone := make(chan struct{})
	probed := make(chan []burstAnswer, 1)
	go func() { probed <- probeCreates(ctx, d, v.probe, o.Probes, o.ProbeEvery, burstDone) }()
	answers := make([]burstAnswer, len(plan))
	var wg sync.WaitGroup
	for i, r := range plan {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if r.retry {
				select {
				case <-ctx.Done():
				case <-time.After(time.Until(start.Add(o.RetryAfter))):
				}
			}
			answers[i] = burstCreate(ctx, d, v.template, r)
		}()
	}
	wg.Wait()
	row.Wall = time.Since(start)
	close(burstDone)
	row.Probe, row.ProbeMissed = probeStats(<-probed)
	row.PoolAtEnd = sampler.now(ctx)
	cost, err := x.Stop(ctx)
	if err != nil {
		sampler.stop()
		return row, err
	}
	row.Cost = cost
	e.logf("burst: %s: %d answers in %s; watching the pools for %s", v.name, len(answers), row.Wall.Round(time.Millisecond), o.Observe)
	select {
	case <-ctx.Done():
	case <-time.After(time.Until(start.Add(row.Wall + o.Observe))):
	}
	row.Pool = sampler.stop()

	byPath := map[string][]time.Duration{}
	for _, a := range answers {
		if a.err == nil {
			row.Answered++
			byPath[a.path] = append(byPath[a.path], a.latency)
		}
	}
	for _, p := range []string{pathPool, pathCold, pathRetry} {
		lat := byPath[p]
		row.Paths[p] = BurstPath{N: len(lat), P50: percentile(lat, 50), P95: percentile(lat, 95), P99: percentile(lat, 99)}
	}
	if row.Wall > 0 {
		row.PerSec = float64(row.Answered) / row.Wall.Seconds()
	}
	wrong, tenants, err := checkBurst(ctx, answers)
	if err != nil {
		return row, err
	}
	row.Tenants = tenants
	row.Correct = len(answers) - len(wrong)
	row.Wrong = wrong[:min(len(wrong), 5)]
	for _, w := range row.Wrong {
		e.logf("burst: %s: wrong answer: %s", v.name, w)
	}
	if err := d.catalog.QueryRow(ctx, `SELECT count(*) FROM (SELECT external_id FROM tenants
		WHERE external_id LIKE $1 GROUP BY external_id HAVING count(*) > 1) d`, v.prefix+"-%").Scan(&row.Duplicates); err != nil {
		return row, err
	}
	if row.ColdBuilds, row.SpareBuilds, err = burstBuilds(ctx, d, start, start.Add(row.Wall)); err != nil {
		return row, err
	}
	e.logf("burst: %s: cold builds: %d, queued p50 %s (max %s), ran p50 %s, p95 %s; %d spare builds ran during the burst", v.name,
		row.ColdBuilds.N, ms(row.ColdBuilds.QueuedP50), ms(row.ColdBuilds.QueuedMax), ms(row.ColdBuilds.RunP50), ms(row.ColdBuilds.RunP95), row.SpareBuilds)
	e.logf("burst: %s: %d/%d correct, %d tenants, %d duplicates, pool %d → %d ready spares, peak lag %s",
		v.name, row.Correct, row.Requests, row.Tenants, row.Duplicates, row.PoolAtEnd.Ready(), lastReady(row.Pool), kb(row.Cost.PeakLagBytes))
	return row, nil
}

// burstBuilds reads the build jobs of the burst from the catalog: the cold
// creates' (their args carry an activation) and the spare builds that
// started between from and to.
func burstBuilds(ctx context.Context, d *benchDaemon, from, to time.Time) (BuildJobs, int, error) {
	var b BuildJobs
	rows, err := d.catalog.Query(ctx, `SELECT (extract(epoch FROM started_at - created_at) * 1e9)::bigint,
		(extract(epoch FROM finished_at - started_at) * 1e9)::bigint
		FROM jobs WHERE type = $1 AND args ? 'activate' AND created_at >= $2 AND finished_at IS NOT NULL`, jobs.TenantBuild, from)
	if err != nil {
		return b, 0, err
	}
	var queued, ran []time.Duration
	var q, r int64
	if _, err := pgx.ForEachRow(rows, []any{&q, &r}, func() error {
		queued, ran = append(queued, time.Duration(q)), append(ran, time.Duration(r))
		return nil
	}); err != nil {
		return b, 0, err
	}
	b.N = len(ran)
	b.QueuedP50, b.QueuedMax, b.RunP50, b.RunP95 = percentile(queued, 50), percentile(queued, 100), percentile(ran, 50), percentile(ran, 95)
	var spares int
	err = d.catalog.QueryRow(ctx, `SELECT count(*) FROM jobs WHERE type = $1 AND NOT args ? 'activate'
		AND started_at BETWEEN $2 AND $3`, jobs.TenantBuild, from, to).Scan(&spares)
	return b, spares, err
}

func lastReady(s []PoolSample) int {
	if len(s) == 0 {
		return 0
	}
	return s[len(s)-1].Ready()
}

// burstCreate sends one create and, when it is answered with a build job
// still running, follows the job until the tenant is usable.
func burstCreate(ctx context.Context, d *benchDaemon, template string, r burstReq) burstAnswer {
	a := burstAnswer{req: r}
	t0 := time.Now()
	a.resp, a.err = d.client.CreateTenant(ctx, provision.Request{Template: template, Mode: r.mode, ExternalID: r.ext})
	if a.err == nil && a.resp.Job != nil && !jobs.Finished(a.resp.Job.State) {
		j, err := pollJob(ctx, d.client, a.resp.Job.ID)
		switch {
		case err != nil:
			a.err = err
		case j.State != jobs.Succeeded:
			a.err = fmt.Errorf("build job %d %s: %s", j.ID, j.State, j.LastError)
		}
	}
	a.latency = time.Since(t0)
	a.path = a.resp.Path
	if a.resp.Existing {
		a.path = pathRetry
	}
	return a
}

// probeStats are the latencies of the probe creates served from their
// pool, and how many were not.
func probeStats(as []burstAnswer) (BurstPath, int) {
	var lat []time.Duration
	missed := 0
	for _, a := range as {
		if a.err != nil || a.path != pathPool {
			missed++
			continue
		}
		lat = append(lat, a.latency)
	}
	return BurstPath{N: len(lat), P50: percentile(lat, 50), P95: percentile(lat, 95), P99: percentile(lat, 99)}, missed
}

// probeCreates sends n pool creates of the probe template one at a time,
// one every interval, until done is closed (never, if nil): what a sign-up that finds a
// spare gets while the burst runs, without queueing behind the burst's own
// claims.
func probeCreates(ctx context.Context, d *benchDaemon, template string, n int, every time.Duration, done <-chan struct{}) []burstAnswer {
	var out []burstAnswer
	tick := time.NewTicker(every)
	defer tick.Stop()
	for range n {
		out = append(out, burstCreate(ctx, d, template, burstReq{mode: tenant.ModeDatabase}))
		select {
		case <-done:
			return out
		case <-ctx.Done():
			return out
		case <-tick.C:
		}
	}
	return out
}

// pollJob follows a job every 200 ms, as the CLI does (many clients poll
// at once: finer would load the daemon it measures).
func pollJob(ctx context.Context, c *api.Client, id int64) (jobs.Job, error) {
	for {
		j, err := c.Job(ctx, id)
		if err != nil || jobs.Finished(j.State) {
			return j, err
		}
		select {
		case <-ctx.Done():
			return j, ctx.Err()
		case <-time.After(200 * time.Millisecond):
		}
	}
}

// checkBurst checks every answer: no error, a tenant of the mode asked for
// with a password; all answers for one external id name the same tenant with
// the same password and DSN, and exactly one of them made it (not
// existing); that tenant logs in with that DSN. It returns what was wrong
// and the number of distinct tenants.
func checkBurst(ctx context.Context, answers []burstAnswer) ([]string, int, error) {
	var wrong []string
	bad := map[int]bool{}
	fail := func(i int, format string, args ...any) {
		if !bad[i] {
			bad[i] = true
			wrong = append(wrong, fmt.Sprintf("request %d (%s): %s", i, answers[i].req.ext, fmt.Sprintf(format, args...)))
		}
	}
	byExt := map[string][]int{}
	for i, a := range answers {
		byExt[a.req.ext] = append(byExt[a.req.ext], i)
		switch {
		case a.err != nil:
			fail(i, "%v", a.err)
		case a.resp.Tenant.ID == "" || a.resp.Password == "" || a.resp.DSN == "":
			fail(i, "no tenant, password or DSN in the answer (note: %q)", a.resp.Note)
		case a.resp.Tenant.Mode != a.req.mode:
			fail(i, "a %s tenant, asked for %s", a.resp.Tenant.Mode, a.req.mode)
		}
	}
	exts := slices.Sorted(func(yield func(string) bool) {
		for k := range byExt {
			if !yield(k) {
				return
			}
		}
	})
	tenants := map[string]bool{}
	for _, ext := range exts {
		idx := byExt[ext]
		first := answers[idx[0]]
		made := 0
		for _, i := range idx {
			a := answers[i]
			if a.err != nil {
				continue
			}
			tenants[a.resp.Tenant.ID] = true
			if !a.resp.Existing {
				made++
			}
			if a.resp.Tenant.ID != first.resp.Tenant.ID || a.resp.Password != first.resp.Password || a.resp.DSN != first.resp.DSN {
				fail(i, "answered tenant %s, another request with this external id got %s (or another password or DSN)",
					a.resp.Tenant.ID, first.resp.Tenant.ID)
			}
		}
		if made != 1 {
			for _, i := range idx {
				fail(i, "%d of the %d answers for this external id say they made the tenant, want exactly 1", made, len(idx))
			}
			continue
		}
		if first.err != nil || bad[idx[0]] {
			continue
		}
		if err := loginAs(ctx, first.resp.DSN, "t_"+first.resp.Tenant.ID); err != nil {
			fail(idx[0], "log in with the answered DSN: %v", err)
		}
	}
	return wrong, len(tenants), nil
}

// loginAs connects with dsn and checks the session's user.
func loginAs(ctx context.Context, dsn, role string) error {
	cctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	conn, err := pgx.Connect(cctx, dsn)
	if err != nil {
		return err
	}
	defer conn.Close(context.WithoutCancel(ctx))
	var user string
	if err := conn.QueryRow(cctx, `SELECT current_user`).Scan(&user); err != nil {
		return err
	}
	if user != role {
		return fmt.Errorf("logged in as %s, want %s", user, role)
	}
	return nil
}

// waitPool waits until a pool holds n ready spares.
func waitPool(ctx context.Context, d *benchDaemon, template string, mode tenant.Mode, n int) error {
	for {
		got, err := d.spares(ctx, template, mode)
		if err != nil || got >= n {
			return err
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// poolSampler samples the spares of a template every interval.
type poolSampler struct {
	pool     *pgxpool.Pool
	template string
	start    time.Time
	cancel   context.CancelFunc
	done     chan struct{}
	mu       sync.Mutex
	samples  []PoolSample
}

func samplePool(ctx context.Context, pool *pgxpool.Pool, template string, start time.Time, every time.Duration) *poolSampler {
	sctx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	s := &poolSampler{pool: pool, template: template, start: start, cancel: cancel, done: make(chan struct{})}
	go func() {
		defer close(s.done)
		t := time.NewTicker(every)
		defer t.Stop()
		for {
			p := s.now(sctx)
			s.mu.Lock()
			s.samples = append(s.samples, p)
			s.mu.Unlock()
			select {
			case <-sctx.Done():
				return
			case <-t.C:
			}
		}
	}()
	return s
}

// now reads the pool.
func (s *poolSampler) now(ctx context.Context) PoolSample {
	p := PoolSample{At: time.Since(s.start)}
	_ = s.pool.QueryRow(ctx, `SELECT count(*) FILTER (WHERE state = 'spare' AND mode = 'database'),
		count(*) FILTER (WHERE state = 'spare' AND mode = 'schema'), count(*) FILTER (WHERE state = 'building')
		FROM tenants WHERE template = $1 AND state IN ('spare', 'building')`, s.template).Scan(&p.Database, &p.Schema, &p.Building)
	return p
}

func (s *poolSampler) stop() []PoolSample {
	s.cancel()
	<-s.done
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.samples
}

func burstTable(r BurstResult) Table {
	o := r.Options
	t := Table{
		Title: fmt.Sprintf("pgtenant bench burst: %d concurrent creates (%.0f%% retries of an external id, %.0f%% of new tenants in schema mode), one primary + streaming standby",
			o.Creates, 100*o.RetryShare, 100*o.SchemaShare),
		Columns: []string{"variant", "path", "n", "p50", "p95", "p99", "correct", "tenants", "duplicates", "wall", "creates/s",
			"peak replay lag", "ready spares: before, at end, after"},
		Data: map[string]any{"result": r},
	}
	for _, x := range r.Rows {
		before := 0
		if len(x.Pool) > 0 {
			before = x.Pool[0].Ready()
		}
		t.Rows = append(t.Rows, []string{x.Variant, "all", fmt.Sprint(x.Answered), "", "", "",
			fmt.Sprintf("%d/%d", x.Correct, x.Requests), fmt.Sprint(x.Tenants), fmt.Sprint(x.Duplicates),
			x.Wall.Round(10 * time.Millisecond).String(), fmt.Sprintf("%.1f", x.PerSec), kb(x.Cost.PeakLagBytes),
			fmt.Sprintf("%d, %d, %d", before, x.PoolAtEnd.Ready(), lastReady(x.Pool))})
		for _, p := range []string{pathPool, pathCold, pathRetry} {
			s := x.Paths[p]
			t.Rows = append(t.Rows, []string{"", p, fmt.Sprint(s.N), ms(s.P50), ms(s.P95), ms(s.P99), "", "", "", "", "", "", ""})
		}
		t.Rows = append(t.Rows, []string{"", pathProbe, fmt.Sprint(x.Probe.N), ms(x.Probe.P50), ms(x.Probe.P95), ms(x.Probe.P99),
			"", "", "", "", "", "", ""},
			[]string{"", "probe, before the burst", fmt.Sprint(x.ProbeIdle.N), ms(x.ProbeIdle.P50), ms(x.ProbeIdle.P95), ms(x.ProbeIdle.P99),
				"", "", "", "", "", "", ""})
		if x.ProbeMissed > 0 {
			t.Notes = append(t.Notes, fmt.Sprintf("%s: %d probe creates failed or found no spare", x.Variant, x.ProbeMissed))
		}
		for _, w := range x.Wrong {
			t.Notes = append(t.Notes, x.Variant+": wrong answer: "+w)
		}
	}
	for _, x := range r.Rows {
		t.Checks = append(t.Checks,
			Check{Target: x.Variant + ": every request answered correctly", Got: fmt.Sprintf("%d of %d", x.Correct, x.Requests),
				Met: x.Correct == x.Requests},
			Check{Target: x.Variant + ": no external id made two tenants", Got: fmt.Sprint(x.Duplicates), Met: x.Duplicates == 0},
			Check{Target: x.Variant + ": peak standby replay lag <= 64 MB", Got: kb(x.Cost.PeakLagBytes),
				Met: x.Cost.PeakLagBytes <= 64<<20})
		if s := x.Paths[pathPool]; s.N > 0 {
			t.Checks = append(t.Checks, Check{Target: x.Variant + ": pool-served creates p95 <= 50 ms during the burst",
				Got: fmt.Sprintf("p95 %s (n %d)", ms(s.P95), s.N), Met: s.P95 <= 50*time.Millisecond})
		}
		if s := x.Probe; s.N > 0 {
			t.Checks = append(t.Checks, Check{Target: x.Variant + ": pool creates sent one at a time during the burst (probe) p95 <= 50 ms",
				Got: fmt.Sprintf("p95 %s (n %d)", ms(s.P95), s.N), Met: s.P95 <= 50*time.Millisecond && x.ProbeMissed == 0})
		}
	}
	if len(r.Rows) > 0 {
		x := r.Rows[0]
		t.Checks = append(t.Checks, Check{Target: fmt.Sprintf("%s: the %d creates finish in <= 40 s", x.Variant, x.Requests),
			Got: x.Wall.Round(10 * time.Millisecond).String(), Met: x.Correct == x.Requests && x.Wall <= 40*time.Second})
	}
	for _, x := range r.Rows {
		t.Notes = append(t.Notes, fmt.Sprintf("%s: ready spares (database+schema) every 2 s from the burst's start: %s", x.Variant, poolLine(x.Pool, 2*time.Second)))
	}
	t.Notes = append(t.Notes,
		fmt.Sprintf("all new external ids are sent at once; the retries (the same create again, same external id and mode) %s later, as a client whose request timed out would.", o.RetryAfter),
		fmt.Sprintf("probe: a template of its own (saas files, a database pool of %d) gets one create every %s from the burst's start until its end (at most %d): the latency of a sign-up that finds a spare while the burst runs, not queued behind the burst's own simultaneous claims; probe, before the burst: %d such creates on the same daemon just before, with nothing else running.", o.Probes+idleProbes, o.ProbeEvery, o.Probes, idleProbes),
		"default settings, 2nd burst: the same daemon and catalog once its pools have grown after the first burst (or after 5 minutes), a second burst of the same shape with new external ids.",
		"latency: from a request to a usable tenant; an answer with a build job still running (202 after provision.cold_wait, or a retry of a tenant still being built) is followed until the job ends. path: pool (a spare claimed), cold (built for the request), retry (the answer of an earlier request with that external id: existing).",
		"correct: no error, a tenant of the mode asked for with its password; every answer for an external id names the same tenant, password and DSN, exactly one says it made it, and that DSN logs in as the tenant. duplicates: external ids with more than one tenant row in the catalog.",
		"each variant has its own catalog database and template (saas_<variant>), so they share no spares; the daemon runs in this process with the shipped defaults except pools (variant b), and admission, the reconciler, metrics and prewarm off as in every bench.",
		"peak replay lag: primary pg_current_wal_lsn() - standby pg_last_wal_replay_lsn(), sampled every 25 ms from the burst's start to its last answer.",
	)
	return t
}

// poolLine shows the ready spares once per step.
func poolLine(s []PoolSample, step time.Duration) string {
	var b strings.Builder
	next := time.Duration(0)
	for _, p := range s {
		if p.At < next {
			continue
		}
		if b.Len() > 0 {
			b.WriteByte(' ')
		}
		fmt.Fprint(&b, p.Ready())
		next += step
		for p.At >= next {
			next += step
		}
	}
	return b.String()
}
