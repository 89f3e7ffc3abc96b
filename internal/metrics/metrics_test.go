package metrics_test

import (
	"context"
	"fmt"
	"net"
	"net/url"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/prometheus/client_golang/prometheus"

	examples "github.com/pgtenant/pgtenant/examples/templates"
	"github.com/pgtenant/pgtenant/internal/api"
	"github.com/pgtenant/pgtenant/internal/catalog"
	"github.com/pgtenant/pgtenant/internal/cluster"
	"github.com/pgtenant/pgtenant/internal/config"
	"github.com/pgtenant/pgtenant/internal/daemon/daemontest"
	"github.com/pgtenant/pgtenant/internal/metrics"
	"github.com/pgtenant/pgtenant/internal/pgtest"
	"github.com/pgtenant/pgtenant/internal/provision"
	"github.com/pgtenant/pgtenant/internal/tenant"
)

var pg *pgtest.Cluster

func TestMain(m *testing.M) {
	// No autovacuum: an autoanalyze of a new database tenant writes
	// pg_statistic rows, which its rows_written counts, at a moment the
	// idle-fleet tests cannot foresee.
	opts := pgtest.Options{Settings: map[string]string{"autovacuum": "off"}}
	if kcacheInstalled() {
		// Usage's CPU seconds (usage_test.go): this package's cluster only.
		opts.Settings["shared_preload_libraries"] = "'pg_prewarm,pg_stat_statements,pg_stat_kcache'"
	}
	pgtest.Main(m, opts, &pg)
}

// fleet is a daemon with the saas template and tenants of both modes.
type fleet struct {
	c       *api.Client
	store   *catalog.Store
	cfg     config.Config
	tenants map[string]api.CreateTenantResponse // by label: db1, db2, sc1, sc2
}

func startFleet(t *testing.T, mutate func(*config.Config)) fleet {
	t.Helper()
	ctx := pgtest.Context(t)
	cfg := daemontest.Config(t, pg)
	cfg.Provision.DefaultPoolSize = 0
	cfg.Metrics.Interval = 0 // the tests drive their own collector
	if mutate != nil {
		mutate(&cfg)
	}
	d, c := daemontest.Start(t, pg, cfg)
	daemontest.CreateTemplate(t, c, "saas", examples.Saas())
	f := fleet{c: c, store: d.Store(), cfg: cfg, tenants: map[string]api.CreateTenantResponse{}}
	for _, l := range []struct{ label, mode string }{{"db1", "database"}, {"db2", "database"}, {"sc1", "schema"}, {"sc2", "schema"}} {
		r, err := c.CreateTenant(ctx, provision.Request{Template: "saas", Mode: tenant.Mode(l.mode)})
		if err != nil {
			t.Fatal(err)
		}
		if r.Job != nil {
			t.Fatalf("tenant %s still provisioning", l.label)
		}
		f.tenants[l.label] = r
	}
	return f
}

// collector is a collector of the fleet's catalog and cluster with a clock
// the test moves.
func (f fleet) collector(t *testing.T, clock *pgtest.Clock) *metrics.Collector {
	reg := pg.Registry(t, false)
	cfg := f.cfg
	cfg.Metrics.Interval = config.Duration(15 * time.Second)
	cfg.Metrics.SizeInterval = config.Duration(15 * time.Second) // every tenant's size on every pass
	return &metrics.Collector{Store: f.store, Clusters: reg, Metrics: cfg.Metrics, Tiers: cfg.Tiers, Logger: pgtest.Logger(t), Now: clock.Now}
}

func exec(t *testing.T, conn *pgx.Conn, sql string) {
	t.Helper()
	if _, err := conn.Exec(context.Background(), sql); err != nil {
		t.Fatalf("%s: %v", sql, err)
	}
}

// work runs statements as a tenant in a session of their own, whose
// statistics are flushed before work returns.
func work(t *testing.T, dsn string, sqls ...string) {
	t.Helper()
	conn, err := pgx.Connect(context.Background(), dsn)
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range append(sqls, `SELECT pg_stat_force_next_flush()`) {
		if _, err := conn.Exec(context.Background(), s); err != nil {
			conn.Close(context.Background())
			t.Fatalf("%s: %v", s, err)
		}
	}
	conn.Close(context.Background())
}

func pass(t *testing.T, c *metrics.Collector) metrics.PassStats {
	t.Helper()
	if err := c.Pass(pgtest.Context(t), "local"); err != nil {
		t.Fatal(err)
	}
	return c.LastPass()["local"]
}

// waitFigures passes (a second later each time) until cond holds for the
// figures of every tenant, or fails.
func waitFigures(t *testing.T, c *metrics.Collector, clock *pgtest.Clock, cond func(map[string]metrics.Figures) error) map[string]metrics.Figures {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for {
		clock.Add(time.Second)
		pass(t, c)
		all := c.All()
		err := cond(all)
		if err == nil {
			return all
		}
		if time.Now().After(deadline) {
			t.Fatal(err)
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// TestCollector_AttributesToTheRightTenant: each tenant's writes, reads,
// sessions and size land on that tenant, in both modes, and the collector
// never opens a session in a tenant's database.
func TestCollector_AttributesToTheRightTenant(t *testing.T) {
	f := startFleet(t, nil)
	clock := pgtest.NewClock(time.Now())
	c := f.collector(t, clock)
	admin := pg.Conn(t, "postgres")
	ctx := pgtest.Context(t)

	// Each tenant makes a table before the baseline, so that the catalog rows
	// CREATE TABLE writes are not part of what is compared.
	rows := map[string]int{"db1": 3000, "db2": 30, "sc1": 2000, "sc2": 20}
	for label := range rows {
		work(t, f.tenants[label].DSN, `CREATE TABLE w (i int, pad text)`)
	}
	base := waitFigures(t, c, clock, func(map[string]metrics.Figures) error { return nil })
	sessions := func(db string) int64 {
		var n int64
		if err := admin.QueryRow(ctx, `SELECT sessions FROM pg_stat_database WHERE datname = $1`, db).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n
	}
	sessionsBefore := map[string]int64{"db1": sessions(f.tenants["db1"].Tenant.Database), "db2": sessions(f.tenants["db2"].Tenant.Database)}

	for label, n := range rows {
		work(t, f.tenants[label].DSN,
			fmt.Sprintf(`INSERT INTO w SELECT g, repeat('x', 200) FROM generate_series(1, %d) g`, n),
			`SELECT count(*) FROM w`, `SELECT count(*) FROM w`)
	}
	// Sessions left open: two idle for db2, one idle in transaction for sc2.
	pgtest.Connect(t, f.tenants["db2"].DSN)
	pgtest.Connect(t, f.tenants["db2"].DSN)
	inTx := pgtest.Connect(t, f.tenants["sc2"].DSN)
	exec(t, inTx, `BEGIN; SELECT 1`)

	id := func(label string) string { return f.tenants[label].Tenant.ID }
	got := waitFigures(t, c, clock, func(all map[string]metrics.Figures) error {
		for label, n := range rows {
			written := all[id(label)].RowsWritten - base[id(label)].RowsWritten
			if written < int64(n) {
				return fmt.Errorf("%s: rows written %d, want at least %d", label, written, n)
			}
			// Sized at the turn after the one that saw the writes.
			if *all[id(label)].SizeBytes <= *base[id(label)].SizeBytes {
				return fmt.Errorf("%s: size not sampled since the writes", label)
			}
		}
		if all[id("db2")].Connections.Idle != 2 || all[id("sc2")].Connections.IdleInTransaction != 1 {
			return fmt.Errorf("sessions: db2 %+v, sc2 %+v", all[id("db2")].Connections, all[id("sc2")].Connections)
		}
		return nil
	})
	for label, n := range rows {
		g := got[id(label)]
		written := g.RowsWritten - base[id(label)].RowsWritten
		read := g.RowsRead - base[id(label)].RowsRead
		t.Logf("%s (%s): written %d, read %d, size %v, conns %+v", label, g.Mode, written, read, *g.SizeBytes, g.Connections)
		// Table statistics count exactly a schema's own rows; a database's
		// counters also hold its catalogs (autoanalyze of the new rows).
		if g.Mode == tenant.ModeSchema && written != int64(n) {
			t.Errorf("%s: rows written = %d, want %d", label, written, n)
		}
		if g.Mode == tenant.ModeDatabase && (written < int64(n) || written > int64(n)+500) {
			t.Errorf("%s: rows written = %d, want %d (+ a few catalog rows)", label, written, n)
		}
		if read < 2*int64(n) {
			t.Errorf("%s: rows read = %d, want at least %d (two counts of the table)", label, read, 2*n)
		}
		if g.SizeBytes == nil || *g.SizeBytes <= 0 {
			t.Errorf("%s: no size", label)
		}
		if g.Mode == tenant.ModeDatabase && (g.CommitsPerSec == nil || g.Commits == nil || *g.Commits == 0) {
			t.Errorf("%s: database tenant without transaction counts: %+v", label, g)
		}
		if g.Mode == tenant.ModeSchema && g.Commits != nil {
			t.Errorf("%s: schema tenant with per-database transaction counts", label)
		}
	}
	for _, pair := range [][2]string{{"db1", "db2"}, {"sc1", "sc2"}} {
		if a, b := *got[id(pair[0])].SizeBytes, *got[id(pair[1])].SizeBytes; a <= b {
			t.Errorf("size of %s (%d rows) = %d, not above %s's (%d rows) = %d", pair[0], rows[pair[0]], a, pair[1], rows[pair[1]], b)
		}
	}
	if n := got[id("db1")].Connections.Total(); n != 0 {
		t.Errorf("db1 sessions = %d, want 0", n)
	}
	for label, before := range sessionsBefore {
		// The two sessions work() opened, and, for db2, the two left open.
		want := before + 1
		if label == "db2" {
			want += 2
		}
		// Open sessions report their start when they flush statistics (within
		// a second or so of going idle); the closed one has already.
		if got := sessions(f.tenants[label].Tenant.Database); got > want || got < before+1 {
			t.Errorf("%s: %d sessions were opened in its database, want %d (the tenant's own): the collector connected to it", label, got-before, want-before)
		}
	}
}

// TestCollector_ConstantQueries: a pass costs the same number of statements
// whatever the number of tenants: catalog, pg_stat_database, pg_stat_activity,
// one statistics query per shared database, and the size batches.
func TestCollector_ConstantQueries(t *testing.T) {
	f := startFleet(t, nil)
	clock := pgtest.NewClock(time.Now().Truncate(time.Minute).Add(5 * time.Second))
	c := f.collector(t, clock)
	first := pass(t, c)
	// Four more tenants of each mode: same shared database, same queries.
	for i := 0; i < 4; i++ {
		for _, mode := range []string{"database", "schema"} {
			if _, err := f.c.CreateTenant(pgtest.Context(t), provision.Request{Template: "saas", Mode: tenant.Mode(mode)}); err != nil {
				t.Fatal(err)
			}
		}
	}
	clock.Add(15 * time.Second)
	second := pass(t, c)
	t.Logf("pass over 4 tenants: %+v; over 12: %+v", first, second)
	if second.Tenants != first.Tenants+8 {
		t.Errorf("tenants measured = %d, want %d", second.Tenants, first.Tenants+8)
	}
	// Catalog + 2 views + 1 shared database + 2 size batches + relation
	// files (every pass here: size_interval = interval); the first pass also
	// loads the sizes the catalog remembers. Same minute: no history write.
	if first.Queries != 8 || second.Queries != 7 {
		t.Errorf("queries: %d with 4 tenants (want 8), %d with 12 (want 7)", first.Queries, second.Queries)
	}
}

// TestCollector_HistoryOnlyWhenCountersChange: a minute rollup is written
// for the tenants that did something in that minute, in one INSERT; an idle
// fleet writes no rows.
func TestCollector_HistoryOnlyWhenCountersChange(t *testing.T) {
	f := startFleet(t, nil)
	clock := pgtest.NewClock(time.Now().Truncate(time.Minute).Add(5 * time.Second))
	c := f.collector(t, clock)
	ctx := pgtest.Context(t)
	for _, label := range []string{"db1", "sc1"} {
		work(t, f.tenants[label].DSN, `CREATE TABLE w (i int)`)
	}
	pass(t, c) // minute m0: baseline
	clock.Add(time.Minute)
	p := pass(t, c) // m1: m0's rollups: nobody did anything
	if p.Rollups != 0 {
		t.Errorf("rollups of an idle minute = %d, want 0", p.Rollups)
	}
	for _, label := range []string{"db1", "sc1"} {
		work(t, f.tenants[label].DSN, `INSERT INTO w SELECT generate_series(1, 100)`)
	}
	waitFigures(t, c, clock, func(all map[string]metrics.Figures) error {
		for _, label := range []string{"db1", "sc1"} {
			if all[f.tenants[label].Tenant.ID].RowsWritten < 100 {
				return fmt.Errorf("%s: writes not seen yet", label)
			}
		}
		return nil
	})
	clock.Add(time.Minute)
	if p = pass(t, c); p.Rollups != 2 { // m2: m1's rollups: db1 and sc1 only, in one INSERT
		t.Errorf("rollups of the busy minute = %d, want 2", p.Rollups)
	}
	hist, err := f.store.Rollups(ctx, f.tenants["sc1"].Tenant.ID, time.Time{})
	if err != nil {
		t.Fatal(err)
	}
	var inserted int64
	for _, h := range hist {
		inserted += h.RowsWritten
	}
	if inserted != 100 {
		t.Errorf("sc1 history: %d rows written, want 100: %+v", inserted, hist)
	}
	for _, label := range []string{"db2", "sc2"} {
		h, err := f.store.Rollups(ctx, f.tenants[label].Tenant.ID, time.Time{})
		if err != nil {
			t.Fatal(err)
		}
		if len(h) != 0 {
			t.Errorf("%s (idle) has %d minutes of history, want none", label, len(h))
		}
	}
	// Idle minutes: nothing.
	for i := 0; i < 3; i++ {
		clock.Add(time.Minute)
		if p = pass(t, c); p.Rollups != 0 {
			t.Errorf("idle minute %d: %d rollups written, want 0", i, p.Rollups)
		}
	}
}

// TestCollector_IdleTenantsSizedLessOften: a tenant whose clients did
// nothing since its last size is passed over at its turns until
// idle_size_interval has gone by; a write or an open session has it sized
// at its next turn again, in both modes.
func TestCollector_IdleTenantsSizedLessOften(t *testing.T) {
	f := startFleet(t, nil)
	clock := pgtest.NewClock(time.Now())
	c := f.collector(t, clock) // every tenant's turn on every pass
	c.Metrics.IdleSizeInterval = config.Duration(time.Hour)
	sizedAt := func() map[string]time.Time {
		out := map[string]time.Time{}
		for label, r := range f.tenants {
			fg, err := c.Tenant(r.Tenant.ID)
			if err != nil || fg.SizeAt == nil {
				t.Fatalf("%s: no size: %v", label, err)
			}
			out[label] = *fg.SizeAt
		}
		return out
	}
	// Until the statistics of the tenants' making are all in: then passes
	// size nobody.
	for i := 0; ; i++ {
		clock.Add(15 * time.Second)
		if pass(t, c).Sizes == 0 {
			break
		}
		if i == 10 {
			t.Fatal("idle tenants are still sized on every pass after 10 passes")
		}
	}
	before := sizedAt()
	for range 3 {
		clock.Add(15 * time.Second)
		if p := pass(t, c); p.Sizes != 0 {
			t.Fatalf("an idle fleet had %d sizes taken in a pass, want 0", p.Sizes)
		}
	}

	// A write in one tenant of each mode; a session left open in another.
	for _, label := range []string{"db1", "sc1"} {
		work(t, f.tenants[label].DSN, `CREATE TABLE w AS SELECT generate_series(1, 1000) AS i`)
	}
	open, err := pgx.Connect(pgtest.Context(t), f.tenants["sc2"].DSN)
	if err != nil {
		t.Fatal(err)
	}
	defer open.Close(context.Background())
	for range 2 { // the pass that reads the writes, the one that sizes them
		clock.Add(15 * time.Second)
		pass(t, c)
	}
	after := sizedAt()
	for label, was := range before {
		moved := after[label].After(was)
		if want := label != "db2"; moved != want {
			t.Errorf("%s sized again: %v, want %v", label, moved, want)
		}
	}
	for _, label := range []string{"db1", "sc1"} {
		fg, _ := c.Tenant(f.tenants[label].Tenant.ID)
		if *fg.SizeBytes < 1000*4 {
			t.Errorf("%s: size %d after 1,000 rows written", label, *fg.SizeBytes)
		}
	}

	// An hour on: every tenant is sized at its turn, idle or not.
	clock.Add(time.Hour)
	if p := pass(t, c); p.Sizes != len(f.tenants) {
		t.Errorf("an hour later, %d of %d tenants were sized", p.Sizes, len(f.tenants))
	}
}

// TestCollector_RoundPassesOverClustersAtOnce: a cluster that accepts
// connections and never answers holds up its own pass only. In a round
// that takes it first, the next cluster is measured while its pass still
// waits.
func TestCollector_RoundPassesOverClustersAtOnce(t *testing.T) {
	f := startFleet(t, nil)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	go func() { // accept, and say nothing
		var held []net.Conn
		defer func() {
			for _, c := range held {
				c.Close()
			}
		}()
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			held = append(held, c)
		}
	}()
	silent, err := cluster.New("silent", "postgres://nobody@"+ln.Addr().String()+"/postgres?sslmode=disable&connect_timeout=120", nil, pgtest.Logger(t))
	if err != nil {
		t.Fatal(err)
	}
	clock := pgtest.NewClock(time.Now())
	c := f.collector(t, clock)
	c.Clusters.Put(silent)
	local, err := c.Clusters.Get("local")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(pgtest.Context(t))
	defer cancel()
	done := make(chan []error, 1)
	go func() { done <- c.Round(ctx, []*cluster.Cluster{silent, local}, time.Minute) }()
	deadline := time.Now().Add(30 * time.Second)
	for c.LastPass()["local"].At.IsZero() {
		if time.Now().After(deadline) {
			t.Fatal("the cluster after a silent one was not measured in 30 s: the round waits for the silent one")
		}
		time.Sleep(50 * time.Millisecond)
	}
	select {
	case errs := <-done:
		t.Fatalf("the round ended before its silent cluster's pass timed out: %v", errs)
	default:
	}
	if p := c.LastPass()["local"]; p.Err != "" || p.Tenants < len(f.tenants) {
		t.Errorf("local's pass: %+v, want its %d tenants measured", p, len(f.tenants))
	}
	cancel()
	if errs := <-done; errs[0] == nil || errs[1] != nil {
		t.Errorf("round errors = %v, want the silent cluster's only", errs)
	}
}

// TestCollector_SpillsNothing: a pass reads the sizes of a shared database's
// schema tenants in memory, however small the server's work_mem, and after
// as many passes as turn a prepared statement generic: nothing goes to temp
// files. (The statistics query's generic plan spilled at 1,000 schema
// tenants, not at this size: see schemaStats.)
func TestCollector_SpillsNothing(t *testing.T) {
	f := startFleet(t, nil)
	ctx := pgtest.Context(t)
	for range 10 { // 12 schema tenants: 12,000 catalog rows to size
		if _, err := f.c.CreateTenant(ctx, provision.Request{Template: "saas", Mode: tenant.ModeSchema}); err != nil {
			t.Fatal(err)
		}
	}
	shared := f.tenants["sc1"].Tenant.Database
	admin := pg.Conn(t, "postgres")
	exec(t, admin, `ALTER SYSTEM SET work_mem = '64kB'`)
	exec(t, admin, `SELECT pg_reload_conf()`)
	t.Cleanup(func() {
		_, _ = admin.Exec(context.Background(), `ALTER SYSTEM RESET work_mem`)
		_, _ = admin.Exec(context.Background(), `SELECT pg_reload_conf()`)
	})
	// temp_files of the shared database, once no session is left in it
	// (a session's counts reach pg_stat_database when it ends).
	tempFiles := func() int64 {
		t.Helper()
		deadline := time.Now().Add(20 * time.Second)
		for {
			var sessions, files int64
			if err := admin.QueryRow(ctx, `SELECT (SELECT count(*) FROM pg_stat_activity WHERE datname = $1),
				(SELECT temp_files FROM pg_stat_database WHERE datname = $1)`, shared).Scan(&sessions, &files); err != nil {
				t.Fatal(err)
			}
			if sessions == 0 {
				return files
			}
			if time.Now().After(deadline) {
				t.Fatalf("%d sessions still in %s", sessions, shared)
			}
			time.Sleep(100 * time.Millisecond)
		}
	}
	clock := pgtest.NewClock(time.Now())
	c := f.collector(t, clock)
	before := tempFiles()
	sized := 0
	for range 8 {
		clock.Add(15 * time.Second)
		sized += pass(t, c).Sizes
	}
	c.Clusters.Close()
	if sized < 14 {
		t.Fatalf("%d sizes taken in 8 passes, want every tenant's at least once", sized)
	}
	if n := tempFiles() - before; n != 0 {
		t.Errorf("8 passes wrote %d temp files in %s, want 0", n, shared)
	}
}

// TestTenantCollector_CardinalityGuard: per-tenant series only for the top N
// by activity plus opted-in tenants; the API sorts by size and activity.
func TestTenantCollector_CardinalityGuard(t *testing.T) {
	f := startFleet(t, func(cfg *config.Config) {
		cfg.Metrics.Interval = config.Duration(300 * time.Millisecond)
		cfg.Metrics.SizeInterval = config.Duration(300 * time.Millisecond)
	})
	clock := pgtest.NewClock(time.Now())
	c := f.collector(t, clock)
	busy, quiet := f.tenants["db1"], f.tenants["sc2"]
	work(t, busy.DSN, `CREATE TABLE w (i int)`)
	pass(t, c)
	if _, err := f.c.SetMetricsExport(pgtest.Context(t), quiet.Tenant.ID, true); err != nil {
		t.Fatal(err)
	}
	work(t, busy.DSN, `INSERT INTO w SELECT generate_series(1, 50000)`, `SELECT count(*) FROM w`)
	clock.Add(15 * time.Second)
	waitFigures(t, c, clock, func(all map[string]metrics.Figures) error {
		clock.Add(15 * time.Second)
		if all[busy.Tenant.ID].Activity <= 0 || all[busy.Tenant.ID].RowsWritten < 50000 {
			return fmt.Errorf("busy tenant's activity not seen yet")
		}
		return nil
	})

	reg := prometheus.NewRegistry()
	reg.MustRegister(metrics.NewTenantCollector(c, 1))
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	series := map[string]map[string]bool{}
	var omitted, tenantsTotal float64
	for _, mf := range mfs {
		for _, m := range mf.GetMetric() {
			labels := map[string]string{}
			for _, l := range m.GetLabel() {
				labels[l.GetName()] = l.GetValue()
			}
			if id, ok := labels["tenant"]; ok {
				if series[mf.GetName()] == nil {
					series[mf.GetName()] = map[string]bool{}
				}
				series[mf.GetName()][id] = true
			}
			switch mf.GetName() {
			case "pgtenant_tenant_series_omitted":
				omitted += m.GetGauge().GetValue()
			case "pgtenant_tenants":
				if labels["state"] == string(catalog.StateActive) {
					tenantsTotal += m.GetGauge().GetValue()
				}
			}
		}
	}
	got := series["pgtenant_tenant_activity"]
	if len(got) != 2 || !got[busy.Tenant.ID] || !got[quiet.Tenant.ID] {
		t.Errorf("tenants with series = %v, want the busiest (%s) and the opted-in (%s)", got, busy.Tenant.ID, quiet.Tenant.ID)
	}
	if omitted != 2 || tenantsTotal != 4 {
		t.Errorf("omitted = %v (want 2), active tenants = %v (want 4)", omitted, tenantsTotal)
	}
	if !series["pgtenant_tenant_transactions_total"][busy.Tenant.ID] || series["pgtenant_tenant_transactions_total"][quiet.Tenant.ID] {
		t.Errorf("transactions series: %v (database tenants only)", series["pgtenant_tenant_transactions_total"])
	}

	// The daemon's own collector serves the API: sorted lists and /metrics.
	ctx := pgtest.Context(t)
	deadline := time.Now().Add(30 * time.Second)
	for {
		byActivity, err := f.c.Tenants(ctx, url.Values{"sort": {"activity"}, "limit": {"2"}})
		if err != nil {
			t.Fatal(err)
		}
		bySize, err := f.c.Tenants(ctx, url.Values{"sort": {"size"}})
		if err != nil {
			t.Fatal(err)
		}
		if len(byActivity) == 2 && byActivity[0].ID == busy.Tenant.ID && len(bySize) == 4 && bySize[0].ID == busy.Tenant.ID &&
			bySize[3].Mode == tenant.ModeSchema && bySize[0].Metrics != nil && bySize[0].Metrics.Figures.RowsWritten >= 50000 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("sorted lists: by activity %v, by size %v", ids(byActivity), ids(bySize))
		}
		time.Sleep(300 * time.Millisecond)
	}
	m, err := f.c.TenantMetrics(ctx, busy.Tenant.ID, "1h")
	if err != nil {
		t.Fatal(err)
	}
	if m.Figures == nil || m.Figures.RowsWritten < 50000 || m.Quota == nil || m.Quota.State != catalog.QuotaOK {
		t.Errorf("GET metrics = %+v, figures %+v, quota %+v", m, m.Figures, m.Quota)
	}
	if _, err := f.c.Tenants(ctx, url.Values{"sort": {"name"}}); err == nil {
		t.Error("sort=name accepted")
	}

	// Purged, the tenant shows no figures any more, though the collector
	// may still hold its last ones.
	dropped, err := f.c.DropTenant(ctx, busy.Tenant.ID, true)
	if err != nil {
		t.Fatal(err)
	}
	if dropped.Job != nil {
		if _, err := f.c.WaitJob(ctx, dropped.Job.ID, nil); err != nil {
			t.Fatal(err)
		}
	}
	if shown, err := f.c.Tenant(ctx, busy.Tenant.ID); err != nil || shown.State != catalog.StatePurged || shown.Metrics != nil {
		t.Errorf("tenant show of the purged tenant = %s %+v, %v; want purged, no figures", shown.State, shown.Metrics, err)
	}
	purged, err := f.c.Tenants(ctx, url.Values{"state": {"purged"}})
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range purged {
		if p.ID == busy.Tenant.ID && p.Metrics != nil {
			t.Errorf("tenant list shows the purged tenant's figures: %+v", p.Metrics)
		}
	}
}

func ids(ts []api.Tenant) []string {
	var out []string
	for _, t := range ts {
		out = append(out, t.ID+"("+string(t.Mode)+")")
	}
	return out
}

// TestCollector_PassesOverAClusterThatIsDown: a cluster whose last health
// probe failed gets no pass, so its tenants are not read from the catalog
// (here closed: a pass would record the catalog's error) each interval
// while it is down.
func TestCollector_PassesOverAClusterThatIsDown(t *testing.T) {
	ctx := pgtest.Context(t)
	store, err := catalog.Open(ctx, pg.PrimaryDSN(pg.NewDatabase(t)), pgtest.Logger(t))
	if err != nil {
		t.Fatal(err)
	}
	store.Close()
	cl, err := cluster.New("gone", pgtest.RefusedDSN(t), nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	reg := cluster.NewRegistry()
	reg.Put(cl)
	t.Cleanup(reg.Close)
	if _, err := cl.Probe(ctx); err == nil {
		t.Fatal("a probe of a closed port succeeded")
	}
	m := config.Default().Metrics
	m.Interval = config.Duration(50 * time.Millisecond)
	c := &metrics.Collector{Store: store, Clusters: reg, Metrics: m, Logger: pgtest.Logger(t)}
	rctx, cancel := context.WithTimeout(ctx, 300*time.Millisecond)
	defer cancel()
	if err := c.Run(rctx); err != nil {
		t.Fatal(err)
	}
	if p, ok := c.LastPass()["gone"]; ok {
		t.Errorf("a cluster whose last probe failed got a pass: %+v", p)
	}
}
