package bench

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"slices"
	"time"

	"github.com/jackc/pgx/v5"

	examples "github.com/pgtenant/pgtenant/examples/templates"
	"github.com/pgtenant/pgtenant/internal/cluster"
	"github.com/pgtenant/pgtenant/internal/config"
	"github.com/pgtenant/pgtenant/internal/fleet"
	"github.com/pgtenant/pgtenant/internal/jobs"
	"github.com/pgtenant/pgtenant/internal/provision"
	"github.com/pgtenant/pgtenant/internal/templates"
	"github.com/pgtenant/pgtenant/internal/tenant"
)

// ProvisionOptions tune `bench provision`.
type ProvisionOptions struct {
	Tenants    int // tenants per cold method (SQL replay, WAL_LOG, FILE_COPY) and template
	Claims     int // saas: spares refilled per mode, then claimed
	WideClaims int // wide: spares refilled per mode, then claimed (each is ~100·T relations)
	WideCopies int // T of the wide template (at least 20)
}

// Methods of `bench provision`, in table order.
const (
	methodSQLReplay     = "schema: SQL replay (django-tenants style)"
	methodWALLog        = "database: cold, WAL_LOG"
	methodFileCopy      = "database: cold, FILE_COPY"
	methodClaimDatabase = "pool claim: database"
	methodClaimSchema   = "pool claim: schema"
	methodRefillDB      = "pool refill: database spares"
	methodRefillSchema  = "pool refill: schema spares"
)

// ProvisionRow is one method on one template.
type ProvisionRow struct {
	Template     string        `json:"template"`
	Method       string        `json:"method"`
	N            int           `json:"n"`
	Failed       int           `json:"failed"`
	FirstError   string        `json:"first_error,omitempty"`
	P50          time.Duration `json:"p50_ns"`
	P95          time.Duration `json:"p95_ns"`
	PerSec       float64       `json:"tenants_per_sec"`
	WALPerTenant int64         `json:"wal_bytes_per_tenant"`
	Cost         Cost          `json:"cost"`
}

// ProvisionResult is what `bench provision` measured.
type ProvisionResult struct {
	Options   ProvisionOptions `json:"options"`
	Templates []TemplateInfo   `json:"templates"`
	Rows      []ProvisionRow   `json:"rows"`
}

// TemplateInfo is a template as materialised on the bench fleet.
type TemplateInfo struct {
	Name      string `json:"name"`
	Relations int    `json:"relations"`
	SizeBytes int64  `json:"size_bytes"`
}

func (r ProvisionResult) row(template, method string) (ProvisionRow, bool) {
	for _, x := range r.Rows {
		if x.Template == template && x.Method == method {
			return x, true
		}
	}
	return ProvisionRow{}, false
}

// Provision runs `bench provision`: on one fleet (a primary and a streaming
// standby), for `saas` and `wide` (T copies), it provisions tenants by each
// method in turn and measures latency, WAL, checkpoints and standby lag.
func (e *Env) Provision(ctx context.Context, opts ProvisionOptions) (ProvisionResult, Table, error) {
	res := ProvisionResult{Options: opts}
	if opts.WideCopies < 20 {
		return res, Table{}, fmt.Errorf("--wide-copies must be at least 20, not %d", opts.WideCopies)
	}
	if opts.Tenants < 1 || opts.Claims < 1 || opts.WideClaims < 1 {
		return res, Table{}, errors.New("--tenants, --claims and --wide-claims must be at least 1")
	}
	// Real fsync: what FILE_COPY's checkpoints cost is part of the comparison.
	// WAL is kept so that pg_waldump can read each method's range afterwards.
	fc, stop, err := e.fleetFor(ctx, "provision", map[string]string{"wal_keep_size": "2GB"}, false)
	if err != nil {
		return res, Table{}, err
	}
	defer stop()
	meter, err := newMeter(ctx, fc)
	if err != nil {
		return res, Table{}, err
	}
	defer meter.Close()
	dir := filepath.Join(e.Dir, "provision")
	base := benchConfig(fc, dir)

	wide := fmt.Sprintf("wide%d", opts.WideCopies)
	tpls := []struct {
		name   string
		files  []templates.Upload
		claims int
	}{{"saas", examples.Saas(), opts.Claims}, {wide, templates.Wide(opts.WideCopies), opts.WideClaims}}

	d, err := e.startDaemonInProcess(ctx, fc, base)
	if err != nil {
		return res, Table{}, err
	}
	for _, tp := range tpls {
		e.logf("provision: materialising template %s", tp.name)
		if err := d.createTemplate(ctx, tp.name, tp.files); err != nil {
			d.Stop()
			return res, Table{}, err
		}
		detail, err := d.client.Template(ctx, tp.name)
		if err != nil {
			d.Stop()
			return res, Table{}, err
		}
		info := TemplateInfo{Name: tp.name}
		if len(detail.Builds) > 0 {
			info.Relations, info.SizeBytes = detail.Builds[0].Relations, detail.Builds[0].SizeBytes
		}
		res.Templates = append(res.Templates, info)
	}
	if err := d.Stop(); err != nil {
		return res, Table{}, err
	}
	if err := createDatabase(ctx, fc, "bench_sql"); err != nil {
		return res, Table{}, err
	}

	for _, tp := range tpls {
		add := func(r ProvisionRow, err error) error {
			if err != nil {
				return fmt.Errorf("%s, %s: %w", tp.name, r.Method, err)
			}
			e.logf("provision: %s, %s: %d tenants, p50 %s, p95 %s, %s WAL/tenant, largest record %s, peak lag %s (WAL %s..%s)",
				tp.name, r.Method, r.N, ms(r.P50), ms(r.P95), withFPI(r.WALPerTenant, r.Cost), r.Cost.LargestRecord,
				kb(r.Cost.PeakLagBytes), r.Cost.StartLSN, r.Cost.EndLSN)
			res.Rows = append(res.Rows, r)
			return nil
		}
		e.logf("provision: %s: (a) %d schema tenants by replaying the template SQL", tp.name, opts.Tenants)
		if err := add(sqlReplay(ctx, meter, fc, tp.name, tp.files, opts.Tenants)); err != nil {
			return res, Table{}, err
		}
		for _, m := range []struct {
			method string
			maxLog config.ByteSize
		}{{methodWALLog, 1 << 50}, {methodFileCopy, 1}} {
			e.logf("provision: %s: %s, %d tenants through the API", tp.name, m.method, opts.Tenants)
			cfg := base
			cfg.Provision.WALLogMaxSize = m.maxLog // forces the strategy (tenant.CreateStrategy)
			if err := add(e.apiCreates(ctx, meter, fc, cfg, tp.name, tenant.ModeDatabase, m.method, opts.Tenants)); err != nil {
				return res, Table{}, err
			}
		}
		for _, mode := range tenant.Modes {
			e.logf("provision: %s: refilling %d %s spares", tp.name, tp.claims, mode)
			cfg := base
			cfg.Pools = []config.PoolConfig{{Template: tp.name, Mode: string(tenant.ModeDatabase), Size: tp.claims}}
			if mode == tenant.ModeSchema {
				cfg.Pools = append(cfg.Pools, config.PoolConfig{Template: tp.name, Mode: string(tenant.ModeSchema), Size: tp.claims})
			}
			if err := add(e.refill(ctx, meter, fc, cfg, tp.name, mode, tp.claims)); err != nil {
				return res, Table{}, err
			}
		}
		for _, m := range []struct {
			mode   tenant.Mode
			method string
		}{{tenant.ModeDatabase, methodClaimDatabase}, {tenant.ModeSchema, methodClaimSchema}} {
			e.logf("provision: %s: %s, %d tenants through the API", tp.name, m.method, tp.claims)
			// Pool size 0 while claiming: refill builds would otherwise run
			// under the claims and their WAL would count as the claims'.
			if err := add(e.apiCreates(ctx, meter, fc, base, tp.name, m.mode, m.method, tp.claims)); err != nil {
				return res, Table{}, err
			}
		}
	}
	return res, provisionTable(res), nil
}

// createDatabase creates a plain database on the fleet's primary.
func createDatabase(ctx context.Context, fc *fleet.Cluster, name string) error {
	conn, err := pgx.Connect(ctx, fc.PrimaryDSN("postgres"))
	if err != nil {
		return err
	}
	defer conn.Close(ctx)
	_, err = conn.Exec(ctx, "CREATE DATABASE "+cluster.Ident(name))
	return err
}

// queryRow runs one query on a new connection and scans its row.
func queryRow(ctx context.Context, dsn, sql string, dest ...any) error {
	conn, err := pgx.Connect(ctx, dsn)
	if err != nil {
		return err
	}
	defer conn.Close(ctx)
	return conn.QueryRow(ctx, sql).Scan(dest...)
}

// sqlReplay builds n schema tenants the way django-tenants and apartment do:
// on one connection, CREATE SCHEMA, SET search_path, then each template
// file in one transaction (an atomic migration). It does not go through
// pgtenant.
func sqlReplay(ctx context.Context, meter *Meter, fc *fleet.Cluster, template string, upload []templates.Upload, n int) (ProvisionRow, error) {
	row := ProvisionRow{Template: template, Method: methodSQLReplay}
	files, err := templates.ParseUpload(slices.Clone(upload))
	if err != nil {
		return row, err
	}
	conn, err := pgx.Connect(ctx, fc.PrimaryDSN("bench_sql"))
	if err != nil {
		return row, err
	}
	defer conn.Close(context.WithoutCancel(ctx))
	build := func(schema string) error {
		id := cluster.Ident(schema)
		if _, err := conn.Exec(ctx, "CREATE SCHEMA "+id+"; SET search_path = "+id); err != nil {
			return err
		}
		for _, f := range files {
			if f.NoTransaction {
				for _, s := range f.Statements {
					if _, err := conn.Exec(ctx, s); err != nil {
						return fmt.Errorf("%s: %w", f.Name, err)
					}
				}
				continue
			}
			err := pgx.BeginFunc(ctx, conn, func(tx pgx.Tx) error {
				for _, s := range f.Statements {
					if _, err := tx.Exec(ctx, s); err != nil {
						return fmt.Errorf("%s: %w", f.Name, err)
					}
				}
				return nil
			})
			if err != nil {
				return err
			}
		}
		return nil
	}
	if err := meter.Settle(ctx, "pgtenant"); err != nil {
		return row, err
	}
	x, err := meter.Start(ctx)
	if err != nil {
		return row, err
	}
	var lat []time.Duration
	for i := range n {
		t0 := time.Now()
		if err := build(fmt.Sprintf("%s_%d", template, i+1)); err != nil {
			row.Failed++
			if row.FirstError == "" {
				row.FirstError = err.Error()
			}
			continue
		}
		lat = append(lat, time.Since(t0))
	}
	return finishRow(ctx, row, x, lat)
}

func finishRow(ctx context.Context, row ProvisionRow, x *Measurement, lat []time.Duration) (ProvisionRow, error) {
	cost, err := x.Stop(ctx)
	if err != nil {
		return row, err
	}
	row.Cost, row.N = cost, len(lat)
	row.P50, row.P95, row.PerSec = latencyStats(lat, cost.Duration)
	if row.N > 0 {
		row.WALPerTenant = cost.WALBytes / int64(row.N)
	}
	return row, nil
}

// apiCreates creates n tenants one after another through the API of a
// daemon started with cfg. method says which path they must take: a pool
// claim for the claim methods, the cold path for the others.
func (e *Env) apiCreates(ctx context.Context, meter *Meter, fc *fleet.Cluster, cfg config.Config, template string, mode tenant.Mode, method string, n int) (ProvisionRow, error) {
	row := ProvisionRow{Template: template, Method: method}
	d, err := e.startDaemonInProcess(ctx, fc, cfg)
	if err != nil {
		return row, err
	}
	defer d.Stop()
	if err := d.waitIdle(ctx); err != nil {
		return row, err
	}
	wantPath := "cold"
	if method == methodClaimDatabase || method == methodClaimSchema {
		wantPath = "pool"
		if got, err := d.spares(ctx, template, mode); err != nil || got < n {
			return row, fmt.Errorf("%d %s spares ready, want %d (%v)", got, mode, n, err)
		}
	}
	if err := meter.Settle(ctx, "pgtenant"); err != nil {
		return row, err
	}
	x, err := meter.Start(ctx)
	if err != nil {
		return row, err
	}
	var lat []time.Duration
	for i := range n {
		name := fmt.Sprintf("bench %s %d", method, i+1)
		t0 := time.Now()
		r, err := d.client.CreateTenant(ctx, provision.Request{Template: template, Mode: mode, Name: &name})
		if err == nil && r.Job != nil { // still building after cold_wait: wait for it
			var j jobs.Job
			if j, err = d.waitJob(ctx, r.Job.ID); err == nil && j.State != jobs.Succeeded {
				err = fmt.Errorf("build job %d %s: %s", j.ID, j.State, j.LastError)
			}
		}
		if err == nil && r.Path != wantPath {
			err = fmt.Errorf("tenant %s took the %s path, want %s", r.Tenant.ID, r.Path, wantPath)
		}
		if err != nil {
			row.Failed++
			if row.FirstError == "" {
				row.FirstError = err.Error()
			}
			continue
		}
		lat = append(lat, time.Since(t0))
	}
	return finishRow(ctx, row, x, lat)
}

// refill starts a daemon whose pools want n spares of template in mode (cfg
// says so) and measures from its start until they are ready. The latencies
// are the build jobs' run times.
func (e *Env) refill(ctx context.Context, meter *Meter, fc *fleet.Cluster, cfg config.Config, template string, mode tenant.Mode, n int) (ProvisionRow, error) {
	row := ProvisionRow{Template: template, Method: methodRefillDB}
	if mode == tenant.ModeSchema {
		row.Method = methodRefillSchema
	}
	// Jobs after the last one so far are this refill's.
	var lastJob int64
	if err := queryRow(ctx, fc.PrimaryDSN("pgtenant"), `SELECT coalesce(max(id), 0) FROM jobs`, &lastJob); err != nil {
		return row, err
	}
	if err := meter.Settle(ctx, "pgtenant"); err != nil {
		return row, err
	}
	x, err := meter.Start(ctx)
	if err != nil {
		return row, err
	}
	d, err := e.startDaemonInProcess(ctx, fc, cfg)
	if err != nil {
		x.Stop(ctx)
		return row, err
	}
	defer d.Stop()
	for {
		got, err := d.spares(ctx, template, mode)
		if err != nil {
			x.Stop(ctx)
			return row, err
		}
		if got >= n {
			break
		}
		select {
		case <-ctx.Done():
			x.Stop(ctx)
			return row, ctx.Err()
		case <-time.After(50 * time.Millisecond):
		}
	}
	if err := d.waitIdle(ctx); err != nil {
		x.Stop(ctx)
		return row, err
	}
	rows, err := d.catalog.Query(ctx, `SELECT (extract(epoch FROM finished_at - started_at) * 1e9)::bigint FROM jobs
		WHERE type = $1 AND state = 'succeeded' AND id > $2 AND started_at IS NOT NULL`, jobs.TenantBuild, lastJob)
	if err != nil {
		x.Stop(ctx)
		return row, err
	}
	ns, err := pgx.CollectRows(rows, pgx.RowTo[int64])
	if err != nil {
		x.Stop(ctx)
		return row, err
	}
	lat := make([]time.Duration, len(ns))
	for i, v := range ns {
		lat[i] = time.Duration(v)
	}
	var failed int
	if err := d.catalog.QueryRow(ctx, `SELECT count(*) FROM jobs WHERE type = $1 AND state <> 'succeeded' AND id > $2`,
		jobs.TenantBuild, lastJob).Scan(&failed); err != nil {
		x.Stop(ctx)
		return row, err
	}
	row.Failed = failed
	if failed > 0 {
		row.FirstError = fmt.Sprintf("%d spare build jobs did not succeed", failed)
	}
	return finishRow(ctx, row, x, lat)
}

func provisionTable(r ProvisionResult) Table {
	t := Table{
		Title: "pgtenant bench provision: one primary + streaming standby, tenants created one after another",
		Columns: []string{"template", "method", "n", "p50", "p95", "tenants/s", "WAL/tenant", "largest WAL record",
			"ckpts", "peak replay lag", "standby caught up"},
		Data: map[string]any{"result": r},
	}
	label := map[string]string{}
	for _, ti := range r.Templates {
		label[ti.Name] = fmt.Sprintf("%s (%d rels, %s)", ti.Name, ti.Relations, kb(ti.SizeBytes))
	}
	for _, x := range r.Rows {
		t.Rows = append(t.Rows, []string{label[x.Template], x.Method, fmt.Sprint(x.N), ms(x.P50), ms(x.P95),
			fmt.Sprintf("%.1f", x.PerSec), withFPI(x.WALPerTenant, x.Cost), x.Cost.LargestRecord.String(), fmt.Sprint(x.Cost.Checkpoints),
			kb(x.Cost.PeakLagBytes), caughtUp(x.Cost)})
		if x.Failed > 0 {
			t.Notes = append(t.Notes, fmt.Sprintf("%s, %s: %d failed; first: %s", x.Template, x.Method, x.Failed, x.FirstError))
		}
		if x.Cost.WALDumpError != "" {
			t.Notes = append(t.Notes, fmt.Sprintf("%s, %s: pg_waldump: %s", x.Template, x.Method, x.Cost.WALDumpError))
		}
	}
	for _, ti := range r.Templates {
		claimDB, ok1 := r.row(ti.Name, methodClaimDatabase)
		claimSchema, ok2 := r.row(ti.Name, methodClaimSchema)
		fileCopy, ok3 := r.row(ti.Name, methodFileCopy)
		if !ok1 || !ok2 || !ok3 {
			continue
		}
		for _, c := range []ProvisionRow{claimDB, claimSchema} {
			t.Checks = append(t.Checks,
				Check{Target: fmt.Sprintf("%s, %s: p50 <= 15 ms and p95 <= 50 ms through the API", ti.Name, c.Method),
					Got: fmt.Sprintf("p50 %s, p95 %s", ms(c.P50), ms(c.P95)),
					Met: c.Failed == 0 && c.N > 0 && c.P50 <= 15*time.Millisecond && c.P95 <= 50*time.Millisecond},
				Check{Target: fmt.Sprintf("%s, %s: <= 16 KB of WAL per claim", ti.Name, c.Method),
					Got: kb(c.WALPerTenant) + " per claim", Met: c.N > 0 && c.WALPerTenant <= 16<<10})
		}
		ratio := 0.0
		if claimDB.P50 > 0 {
			ratio = float64(fileCopy.P50) / float64(claimDB.P50)
		}
		t.Checks = append(t.Checks, Check{Target: fmt.Sprintf("%s: database claim >= 30x faster than cold FILE_COPY (p50)", ti.Name),
			Got: fmt.Sprintf("%.0fx (%s vs %s)", ratio, ms(claimDB.P50), ms(fileCopy.P50)), Met: ratio >= 30})
	}
	if rf, ok := r.row("saas", methodRefillDB); ok {
		t.Checks = append(t.Checks, Check{Target: fmt.Sprintf("refilling %d saas database spares keeps standby replay lag <= 64 MB", rf.N),
			Got: "peak " + kb(rf.Cost.PeakLagBytes), Met: rf.N > 0 && rf.Failed == 0 && rf.Cost.PeakLagBytes <= 64<<20})
	}
	t.Notes = append(t.Notes,
		"(a) is not pgtenant: one superuser connection runs CREATE SCHEMA, SET search_path, then each template file in one transaction, as django-tenants' atomic migrations do.",
		"(b)/(c) go through pgtenant's API with the pool empty; the strategy is forced with provision.wal_log_max_size (2^50 bytes: WAL_LOG; 1 byte: FILE_COPY). Latency includes the job runner, the role, CREATE DATABASE, giving the objects to the tenant's role and activation.",
		"claims go through the API with the pool refill off (pool size 0) so that refill builds do not run under them; the refill is measured on its own rows, where p50/p95 are the spare build jobs' run times and tenants/s is spares per second of wall time.",
		"the catalog lives on the same primary, so its WAL (tenant row, event, job rows) counts in each method's WAL, claims included.",
		"before each method the bench runs VACUUM in the catalog database (shared catalogs included) and CHECKPOINT, waits for the standby and makes it restartpoint (CHECKPOINT on the standby), so that no method pays for the previous one's dirty buffers, hint bits (data checksums are on) or checkpoint; each method then pays a full-page image for the first change of every page it touches, shown as the FPI share of its WAL.",
		"WAL = pg_current_wal_insert_lsn() difference; largest record from pg_waldump over the method's LSN range; ckpts = pg_stat_bgwriter.checkpoints_req difference (forced by FILE_COPY, or by WAL volume over max_wal_size).",
		"peak replay lag = primary pg_current_wal_lsn() - standby pg_last_wal_replay_lsn(), sampled every 25 ms; standby caught up = time from the method's end until the standby replayed its last WAL.",
	)
	return t
}

// withFPI shows a WAL amount with the share of full-page images in the method's WAL.
func withFPI(n int64, c Cost) string {
	if c.WALBytes <= 0 || c.FPIBytes <= 0 {
		return kb(n)
	}
	return fmt.Sprintf("%s (%.0f%% FPI)", kb(n), 100*float64(c.FPIBytes)/float64(c.WALBytes))
}

func caughtUp(c Cost) string {
	if !c.CaughtUp {
		return "not within " + c.CatchUp.Round(time.Second).String()
	}
	return ms(c.CatchUp)
}
