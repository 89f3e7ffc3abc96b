package bench

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	examples "github.com/pgtenant/pgtenant/examples/templates"
	"github.com/pgtenant/pgtenant/internal/api"
	"github.com/pgtenant/pgtenant/internal/catalog"
	"github.com/pgtenant/pgtenant/internal/cluster"
	"github.com/pgtenant/pgtenant/internal/config"
	"github.com/pgtenant/pgtenant/internal/fleet"
	"github.com/pgtenant/pgtenant/internal/jobs"
	"github.com/pgtenant/pgtenant/internal/migrate"
	"github.com/pgtenant/pgtenant/internal/provision"
	"github.com/pgtenant/pgtenant/internal/templates"
	"github.com/pgtenant/pgtenant/internal/tenant"
)

// MigrateOptions tune `bench migrate`.
type MigrateOptions struct {
	Schemas    int `json:"schemas"`     // schema tenants of saas
	Databases  int `json:"databases"`   // database tenants of saas
	Rows       int `json:"rows"`        // users rows per tenant (the new index has something to index)
	Parallel   int `json:"parallel"`    // the rollout's migrate.parallel (0: the default)
	PerCluster int `json:"per_cluster"` // migrate.per_cluster (0: the default)
}

// Methods of `bench migrate`.
const (
	methodSequential = "(a) sequential, new connection per tenant"
	methodRollout    = "(b) pgtenant rollout"
	methodSerial     = "(c) pgtenant rollout, --parallel 1"
)

// MigrateRow is one method's migration of every tenant.
type MigrateRow struct {
	Method   string        `json:"method"`
	Tenants  int           `json:"tenants"`
	Failed   int           `json:"failed"`
	Duration time.Duration `json:"duration_ns"`
	PerSec   float64       `json:"tenants_per_sec"`
	// NoOp is a second run with nothing left to apply.
	NoOp time.Duration `json:"noop_duration_ns"`
	// PeakConns are the method's own connections to tenants' databases;
	// PeakBackends every client backend of the primary (the daemon's pools,
	// the catalog, the meters included).
	PeakConns    int `json:"peak_connections"`
	PeakBackends int `json:"peak_client_backends"`
	// CPUBusy is the share of the machine's CPU time in use during the
	// method (everything on it: PostgreSQL, pgtenant, the bench).
	CPUBusy float64 `json:"cpu_busy"`
	Cost    Cost    `json:"cost"`
}

// MigrateResult is what `bench migrate` measured.
type MigrateResult struct {
	Options MigrateOptions `json:"options"`
	Budget  int            `json:"connection_budget"` // migrate.per_cluster
	Setup   time.Duration  `json:"setup_ns"`
	Rows    []MigrateRow   `json:"rows"`
}

// The two new versions: the same change under two names, one for each
// method (each method moves every tenant by one version). A column with a
// default (no table rewrite), a table with a foreign key, an index.
func benchVersion(suffix string) templates.Upload {
	return templates.Upload{Name: fmt.Sprintf("000%s_locale_%s.sql", map[string]string{"a": "2", "b": "3", "c": "4"}[suffix], suffix),
		Body: fmt.Sprintf(`ALTER TABLE users ADD COLUMN locale_%[1]s text NOT NULL DEFAULT 'en';
CREATE TABLE feature_flags_%[1]s (
    id              bigserial PRIMARY KEY,
    organization_id bigint NOT NULL REFERENCES organizations (id) ON DELETE CASCADE,
    name            text NOT NULL,
    enabled         boolean NOT NULL DEFAULT false,
    UNIQUE (organization_id, name)
);
CREATE INDEX users_locale_%[1]s ON users (locale_%[1]s);
`, suffix)}
}

// Migrate runs `bench migrate`: on one primary with a streaming standby it
// makes Schemas schema tenants and Databases database tenants of saas, then
// moves all of them by one version (a) sequentially, one tenant after
// another with a new connection each (what django-tenants and the Rails
// libraries do), and (b) with pgtenant's rollout; each is run a second time
// with nothing left to apply. (c), a rollout one tenant at a time, shows
// what a tenant's migration costs without a connection of its own: the
// part that only more cores can speed up. All run with fsync on (the
// tenants are made with fsync off, to be quick).
func (e *Env) Migrate(ctx context.Context, o MigrateOptions) (MigrateResult, Table, error) {
	if o.Schemas < 0 || o.Databases < 0 || o.Schemas+o.Databases == 0 {
		return MigrateResult{}, Table{}, fmt.Errorf("bench migrate: --schemas and --databases must add up to at least 1")
	}
	res := MigrateResult{Options: o}
	fc, stop, err := e.fleetFor(ctx, "migrate", map[string]string{"max_wal_size": "8GB", "max_connections": "200"}, true)
	if err != nil {
		return res, Table{}, err
	}
	defer stop()
	dir := filepath.Join(e.Dir, "migrate")

	setupStart := time.Now()
	if err := e.migrateSpares(ctx, fc, dir, o); err != nil {
		return res, Table{}, err
	}
	cfg := benchConfig(fc, dir)
	if o.Parallel > 0 {
		cfg.Migrate.Parallel = o.Parallel
	}
	if o.PerCluster > 0 {
		cfg.Migrate.PerCluster = o.PerCluster
	}
	res.Budget = cfg.Migrate.PerCluster
	d, err := e.startDaemonInProcess(ctx, fc, cfg)
	if err != nil {
		return res, Table{}, err
	}
	defer d.Stop()
	tenants, err := e.migrateTenants(ctx, d, fc, o)
	if err != nil {
		return res, Table{}, err
	}
	files := examples.Saas()
	for _, v := range []string{"a", "b", "c"} {
		files = append(files, benchVersion(v))
		added, err := d.client.PushTemplate(ctx, "saas", files)
		if err != nil {
			return res, Table{}, fmt.Errorf("push saas: %w", err)
		}
		for _, j := range added.BuildJobs {
			if j, err := d.waitJob(ctx, j.ID); err != nil || j.State != jobs.Succeeded {
				return res, Table{}, fmt.Errorf("build saas v%d: %v %s", added.Version, err, j.LastError)
			}
		}
	}
	if err := d.waitIdle(ctx); err != nil {
		return res, Table{}, err
	}
	// Measure with fsync on: commits cost what they cost in production.
	admin, err := smallPool(ctx, fc.PrimaryDSN("postgres"))
	if err != nil {
		return res, Table{}, err
	}
	defer admin.Close()
	if _, err := admin.Exec(ctx, `ALTER SYSTEM SET fsync = on`); err != nil {
		return res, Table{}, err
	}
	if _, err := admin.Exec(ctx, `SELECT pg_reload_conf()`); err != nil {
		return res, Table{}, err
	}
	res.Setup = time.Since(setupStart)
	e.logf("migrate: %d tenants ready in %s; measuring with fsync on", len(tenants), res.Setup.Round(time.Second))

	meter, err := newMeter(ctx, fc)
	if err != nil {
		return res, Table{}, err
	}
	defer meter.Close()

	seq, err := e.migrateSequential(ctx, fc, admin, meter, d, tenants)
	if err != nil {
		return res, Table{}, err
	}
	res.Rows = append(res.Rows, seq)
	for _, m := range []struct {
		method      string
		to, workers int
	}{{methodRollout, 3, 0}, {methodSerial, 4, 1}} {
		row, err := e.migrateRollout(ctx, admin, meter, d, len(tenants), m.method, m.to, m.workers)
		if err != nil {
			return res, Table{}, err
		}
		res.Rows = append(res.Rows, row)
	}
	return res, migrateTable(res), nil
}

// migrateSpares fills spare pools of saas as large as the tenants wanted
// (at most 1,000 per mode; the rest is made on the cold path), with daemons
// of their own: the one that is measured must not refill behind the claims.
// Schema spares first, then database spares (which take the cluster's heavy
// DDL slots and would hold every worker while the schema builds wait).
func (e *Env) migrateSpares(ctx context.Context, fc *fleet.Cluster, dir string, o MigrateOptions) error {
	schemas, databases := min(o.Schemas, 1000), min(o.Databases, 1000)
	for i, want := range [][2]int{{schemas, 0}, {schemas, databases}} {
		cfg := benchConfig(fc, dir)
		cfg.Jobs.Workers = 6
		cfg.Pacer.HeavyDDLSlots = 3
		cfg.Pacer.WaitForCheckpoint = false // spread checkpoints would hold every create: setup only
		cfg.Provision.PoolInterval = config.Duration(500 * time.Millisecond)
		cfg.Pools = []config.PoolConfig{
			{Template: "saas", Mode: string(tenant.ModeSchema), Size: want[0]},
			{Template: "saas", Mode: string(tenant.ModeDatabase), Size: want[1]},
		}
		d, err := e.startDaemonInProcess(ctx, fc, cfg)
		if err != nil {
			return err
		}
		if i == 0 {
			if err := d.createTemplate(ctx, "saas", examples.Saas()); err != nil {
				d.Stop()
				return err
			}
		}
		err = e.waitSpares(ctx, d, want[0], want[1])
		if serr := d.Stop(); err == nil {
			err = serr
		}
		if err != nil {
			return err
		}
	}
	return nil
}

// waitSpares waits until saas has the spares wanted in each mode.
func (e *Env) waitSpares(ctx context.Context, d *benchDaemon, schemas, databases int) error {
	start, last := time.Now(), time.Now()
	for {
		s, err := d.spares(ctx, "saas", tenant.ModeSchema)
		if err != nil {
			return err
		}
		db, err := d.spares(ctx, "saas", tenant.ModeDatabase)
		if err != nil {
			return err
		}
		if s >= schemas && db >= databases {
			e.logf("migrate: %d schema and %d database spares ready after %s", s, db, time.Since(start).Round(time.Second))
			return nil
		}
		if time.Since(last) > 15*time.Second {
			e.logf("migrate: building spares: %d/%d schema, %d/%d database", s, schemas, db, databases)
			last = time.Now()
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(250 * time.Millisecond):
		}
	}
}

// migrateTenants claims the tenants through the API and gives each some rows.
func (e *Env) migrateTenants(ctx context.Context, d *benchDaemon, fc *fleet.Cluster, o MigrateOptions) ([]catalog.Tenant, error) {
	modes := make([]tenant.Mode, 0, o.Schemas+o.Databases)
	for range o.Schemas {
		modes = append(modes, tenant.ModeSchema)
	}
	for range o.Databases {
		modes = append(modes, tenant.ModeDatabase)
	}
	var mu sync.Mutex
	var out []catalog.Tenant
	err := parallel(ctx, 8, len(modes), func(ctx context.Context, i int) error {
		// Concurrent claims of schema tenants can collide on the shared
		// database's ACL ("tuple concurrently updated"): retried.
		var r api.CreateTenantResponse
		var err error
		for attempt := 0; ; attempt++ {
			r, err = d.client.CreateTenant(ctx, provision.Request{Template: "saas", Mode: modes[i]})
			if err == nil || attempt == 10 || !strings.Contains(err.Error(), "tuple concurrently updated") {
				break
			}
			time.Sleep(time.Duration(attempt+1) * 5 * time.Millisecond)
		}
		if err != nil {
			return err
		}
		if r.Job != nil {
			if j, err := d.waitJob(ctx, r.Job.ID); err != nil || j.State != jobs.Succeeded {
				return fmt.Errorf("cold create: %v %s", err, j.LastError)
			}
		}
		mu.Lock()
		out = append(out, r.Tenant.Tenant)
		mu.Unlock()
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("create tenants: %w", err)
	}
	e.logf("migrate: %d tenants claimed; adding %d users to each", len(out), o.Rows)
	err = parallel(ctx, 8, len(out), func(ctx context.Context, i int) error {
		t := out[i]
		conn, err := pgx.Connect(ctx, fc.PrimaryDSN(t.Database))
		if err != nil {
			return err
		}
		defer conn.Close(context.WithoutCancel(ctx))
		table := "users"
		if t.Mode == tenant.ModeSchema {
			table = cluster.Ident(tenant.PhysicalName(t.ID)) + ".users"
		}
		_, err = conn.Exec(ctx, `INSERT INTO `+table+` (email, display_name)
			SELECT 'user' || i || '@example.com', 'User ' || i FROM generate_series(1, $1) i`, o.Rows)
		return err
	})
	return out, err
}

// parallel runs f(0..n-1) on workers goroutines and returns the first error.
func parallel(ctx context.Context, workers, n int, f func(context.Context, int) error) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var next atomic.Int64
	var once sync.Once
	var first error
	var wg sync.WaitGroup
	for range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				i := int(next.Add(1)) - 1
				if i >= n || ctx.Err() != nil {
					return
				}
				if err := f(ctx, i); err != nil {
					once.Do(func() { first = err; cancel() })
					return
				}
			}
		}()
	}
	wg.Wait()
	return first
}

// connSampler records the peak of a method's connections (by
// application_name) and of all client backends on the primary.
type connSampler struct {
	peakApp, peakAll  atomic.Int64
	stop              context.CancelFunc
	done              chan struct{}
	cpuBusy0, cpuAll0 int64
}

// cpuTimes reads the machine's busy and total CPU time (Linux; zeros elsewhere).
func cpuTimes() (busy, total int64) {
	b, err := os.ReadFile("/proc/stat")
	if err != nil {
		return 0, 0
	}
	line, _, _ := strings.Cut(string(b), "\n")
	f := strings.Fields(line)
	for i, v := range f[1:] {
		n, _ := strconv.ParseInt(v, 10, 64)
		total += n
		if i != 3 && i != 4 { // idle, iowait
			busy += n
		}
	}
	return busy, total
}

func sampleConns(ctx context.Context, pool *pgxpool.Pool, app string) *connSampler {
	s := &connSampler{done: make(chan struct{})}
	s.cpuBusy0, s.cpuAll0 = cpuTimes()
	sctx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	s.stop = cancel
	go func() {
		defer close(s.done)
		for sctx.Err() == nil {
			var mine, all int64
			err := pool.QueryRow(sctx, `SELECT count(*) FILTER (WHERE application_name = $1), count(*)
				FROM pg_stat_activity WHERE backend_type = 'client backend'`, app).Scan(&mine, &all)
			if err == nil {
				s.peakApp.Store(max(s.peakApp.Load(), mine))
				s.peakAll.Store(max(s.peakAll.Load(), all))
			}
			time.Sleep(5 * time.Millisecond)
		}
	}()
	return s
}

func (s *connSampler) Stop() (app, all int, cpuBusy float64) {
	s.stop()
	<-s.done
	busy, total := cpuTimes()
	if total > s.cpuAll0 {
		cpuBusy = float64(busy-s.cpuBusy0) / float64(total-s.cpuAll0)
	}
	return int(s.peakApp.Load()), int(s.peakAll.Load()), cpuBusy
}

const sequentialApp = "bench sequential migrate"

// migrateSequential moves every tenant from v1 to v2 the way per-tenant
// migration libraries do: one tenant after another, a new connection each,
// a version check, the new file in a transaction that records the version.
// Then once more with nothing to apply (connect, check, leave).
func (e *Env) migrateSequential(ctx context.Context, fc *fleet.Cluster, admin *pgxpool.Pool, meter *Meter, d *benchDaemon, ts []catalog.Tenant) (MigrateRow, error) {
	row := MigrateRow{Method: methodSequential, Tenants: len(ts)}
	files, err := templates.ParseUpload([]templates.Upload{benchVersion("a")})
	if err != nil {
		return row, err
	}
	stmts := files[0].Statements
	if _, err := admin.Exec(ctx, `CHECKPOINT`); err != nil {
		return row, err
	}
	pass := func(apply bool) (int, error) {
		failed := 0
		for _, t := range ts {
			cc, err := pgx.ParseConfig(fc.PrimaryDSN(t.Database))
			if err != nil {
				return 0, err
			}
			cc.RuntimeParams["application_name"] = sequentialApp
			conn, err := pgx.ConnectConfig(ctx, cc)
			if err != nil {
				return 0, err
			}
			err = pgx.BeginFunc(ctx, conn, func(tx pgx.Tx) error {
				name, markerSchema := cluster.Ident(tenant.PhysicalName(t.ID)), tenant.MarkerSchema
				if t.Mode == tenant.ModeSchema {
					markerSchema = tenant.PhysicalName(t.ID)
				}
				q := `SELECT obj_description(oid, 'pg_namespace') FROM pg_namespace WHERE nspname = ` + cluster.Literal(markerSchema)
				var comment *string
				if err := tx.QueryRow(ctx, q).Scan(&comment); err != nil {
					return err
				}
				mk := tenant.BuiltMarker(t.Version)
				if comment != nil {
					mk, _ = tenant.ParseMarker(*comment)
				}
				if mk.Version >= 2 || !apply {
					return nil
				}
				set := "SET LOCAL ROLE " + name
				if t.Mode == tenant.ModeSchema {
					set += "; SET LOCAL search_path = " + name
				}
				if _, err := tx.Exec(ctx, set); err != nil {
					return err
				}
				for _, s := range stmts {
					if _, err := tx.Exec(ctx, s); err != nil {
						return err
					}
				}
				mk.Version = 2
				_, err := tx.Exec(ctx, "RESET ROLE; COMMENT ON SCHEMA "+cluster.Ident(markerSchema)+" IS "+cluster.Literal(mk.String()))
				return err
			})
			conn.Close(ctx)
			if err != nil {
				failed++
				e.logf("migrate: sequential: tenant %s: %v", t.ID, err)
			}
		}
		return failed, nil
	}
	x, err := meter.Start(ctx)
	if err != nil {
		return row, err
	}
	sampler := sampleConns(ctx, admin, sequentialApp)
	start := time.Now()
	row.Failed, err = pass(true)
	row.Duration = time.Since(start)
	row.PeakConns, row.PeakBackends, row.CPUBusy = sampler.Stop()
	if err != nil {
		return row, err
	}
	if row.Cost, err = x.Stop(ctx); err != nil {
		return row, err
	}
	row.PerSec = float64(len(ts)) / row.Duration.Seconds()
	e.logf("migrate: (a) sequential: %d tenants in %s", len(ts), row.Duration.Round(time.Millisecond))
	start = time.Now()
	if _, err := pass(false); err != nil {
		return row, err
	}
	row.NoOp = time.Since(start)
	// What the library kept in each tenant, pgtenant's catalog learns here
	// (not timed), so that the rollout starts from v2.
	if _, err := d.catalog.Exec(ctx, `UPDATE tenants SET version = 2 WHERE template = 'saas' AND version = 1 AND state = 'active'`); err != nil {
		return row, err
	}
	return row, nil
}

// migrateRollout moves every tenant by one version (to) with a rollout
// through the API (parallel 0: the configured parallelism), then starts a
// second rollout that has nothing to do.
func (e *Env) migrateRollout(ctx context.Context, admin *pgxpool.Pool, meter *Meter, d *benchDaemon, n int, method string, to, parallel int) (MigrateRow, error) {
	row := MigrateRow{Method: method, Tenants: n}
	if _, err := admin.Exec(ctx, `CHECKPOINT`); err != nil {
		return row, err
	}
	run := func() (migrate.Status, time.Duration, error) {
		start := time.Now()
		out, err := d.client.StartRollout(ctx, migrate.Request{Template: "saas", To: to, Parallel: parallel})
		if err != nil {
			return migrate.Status{}, 0, err
		}
		if _, err := d.waitJob(ctx, out.Rollout.JobID); err != nil {
			return migrate.Status{}, 0, err
		}
		took := time.Since(start)
		st, err := d.client.Rollout(ctx, out.Rollout.ID, nil)
		return st, took, err
	}
	x, err := meter.Start(ctx)
	if err != nil {
		return row, err
	}
	sampler := sampleConns(ctx, admin, migrate.ApplicationName)
	st, took, err := run()
	row.PeakConns, row.PeakBackends, row.CPUBusy = sampler.Stop()
	if err != nil {
		return row, err
	}
	row.Duration = took
	if row.Cost, err = x.Stop(ctx); err != nil {
		return row, err
	}
	row.PerSec = float64(n) / took.Seconds()
	row.Failed = st.Counts[catalog.RolloutTenantFailed] + (n - st.Total)
	if st.State != catalog.RolloutSucceeded {
		e.logf("migrate: rollout %d ended %s: %s", st.ID, st.State, st.Error)
	}
	e.logf("migrate: %s: %d tenants in %s", method, st.Counts[catalog.RolloutTenantDone], took.Round(time.Millisecond))
	noop, took, err := run()
	if err != nil {
		return row, err
	}
	if noop.State != catalog.RolloutSucceeded || noop.Total != 0 {
		return row, errors.New("the second rollout had work to do: " + string(noop.State))
	}
	row.NoOp = took
	return row, nil
}

func migrateTable(r MigrateResult) Table {
	t := Table{
		Title: fmt.Sprintf("pgtenant bench migrate: %d schema + %d database tenants of saas, one new version (column with a default, table, index)",
			r.Options.Schemas, r.Options.Databases),
		Columns: []string{"method", "tenants", "failed", "total time", "tenants/s", "no-op re-run", "peak connections", "peak client backends", "CPU busy", "peak replay lag", "WAL"},
		Data:    map[string]any{"result": r},
	}
	for _, x := range r.Rows {
		t.Rows = append(t.Rows, []string{x.Method, fmt.Sprint(x.Tenants), fmt.Sprint(x.Failed),
			x.Duration.Round(10 * time.Millisecond).String(), fmt.Sprintf("%.0f", x.PerSec), x.NoOp.Round(time.Millisecond).String(),
			fmt.Sprint(x.PeakConns), fmt.Sprint(x.PeakBackends), fmt.Sprintf("%.0f%%", 100*x.CPUBusy), kb(x.Cost.PeakLagBytes), kb(x.Cost.WALBytes)})
	}
	if len(r.Rows) == 3 {
		a, b, c := r.Rows[0], r.Rows[1], r.Rows[2]
		speedup := a.Duration.Seconds() / b.Duration.Seconds()
		t.Checks = []Check{
			{Target: "rollout finishes in <= 60 s", Got: b.Duration.Round(10 * time.Millisecond).String(), Met: b.Duration <= time.Minute && b.Failed == 0},
			{Target: "rollout >= 5x faster than sequential", Got: fmt.Sprintf("%.1fx", speedup), Met: speedup >= 5},
			{Target: "no-op rollout <= 2 s", Got: b.NoOp.Round(time.Millisecond).String(), Met: b.NoOp <= 2*time.Second},
			{Target: "peak standby replay lag <= 64 MB", Got: kb(b.Cost.PeakLagBytes), Met: b.Cost.PeakLagBytes <= 64<<20},
			{Target: fmt.Sprintf("rollout connections never exceed the budget (migrate.per_cluster = %d)", r.Budget),
				Got: fmt.Sprint(b.PeakConns), Met: b.PeakConns <= r.Budget},
		}
		// Per tenant: (a) pays a connection and the migration, one after
		// another; the rollout pays the migration only, on every core.
		perA := a.Duration.Seconds() / float64(a.Tenants)
		perConn := a.NoOp.Seconds() / float64(a.Tenants)
		perMig := c.Duration.Seconds() / float64(c.Tenants)
		t.Notes = append(t.Notes, fmt.Sprintf("per tenant: (a) %.1f ms, of which %.1f ms connecting and checking its version (its no-op re-run); "+
			"the migration alone, on a warm connection, %.1f ms (c). The rollout removes the first and runs the second on %d cores: "+
			"at most about %.1fx faster on this machine, %.1fx measured",
			1000*perA, 1000*perConn, 1000*perMig, runtime.NumCPU(), perA/(perMig/float64(runtime.NumCPU())), speedup))
	}
	t.Notes = append(t.Notes,
		"each method moves every tenant by one version with the same change (a: v1 to v2, b: v2 to v3, c: v3 to v4), measured with fsync on, in that order, after a CHECKPOINT each",
		"peak connections: the method's own connections to tenant databases; peak client backends: all of the primary's (the daemon's pools and the meters included)",
		fmt.Sprintf("setup (tenants claimed from spare pools built with fsync off, %d users each): %s", r.Options.Rows, r.Setup.Round(time.Second)))
	return t
}
