package metrics_test

import (
	"bytes"
	"context"
	"encoding/csv"
	"fmt"
	"math"
	"net/url"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	examples "github.com/pgtenant/pgtenant/examples/templates"
	"github.com/pgtenant/pgtenant/internal/api"
	"github.com/pgtenant/pgtenant/internal/catalog"
	"github.com/pgtenant/pgtenant/internal/cli"
	"github.com/pgtenant/pgtenant/internal/config"
	"github.com/pgtenant/pgtenant/internal/daemon/daemontest"
	"github.com/pgtenant/pgtenant/internal/metrics"
	"github.com/pgtenant/pgtenant/internal/pgtest"
	"github.com/pgtenant/pgtenant/internal/pooler"
	"github.com/pgtenant/pgtenant/internal/provision"
	"github.com/pgtenant/pgtenant/internal/tenant"
)

// kcacheInstalled says whether the server has pg_stat_kcache's library
// (Debian's postgresql-15-pg-stat-kcache; scripts/deps installs it).
func kcacheInstalled() bool {
	m, _ := filepath.Glob("/usr/lib/postgresql/15/lib/pg_stat_kcache.so")
	return len(m) > 0
}

// simpleConn connects with the simple protocol (fine through any pool mode).
func simpleConn(t *testing.T, dsn string) *pgx.Conn {
	t.Helper()
	cfg, err := pgx.ParseConfig(dsn)
	if err != nil {
		t.Fatal(err)
	}
	cfg.DefaultQueryExecMode = pgx.QueryExecModeSimpleProtocol
	conn, err := pgx.ConnectConfig(pgtest.Context(t), cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close(context.Background()) })
	return conn
}

// waitSessions waits until the tenant's role has n sessions on the server
// (a closed session's backend leaves a moment after its client).
func waitSessions(t *testing.T, admin *pgx.Conn, id string, n int) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for {
		var got int
		if err := admin.QueryRow(pgtest.Context(t), `SELECT count(*) FROM pg_stat_activity WHERE usename = $1`, tenant.PhysicalName(id)).Scan(&got); err != nil {
			t.Fatal(err)
		}
		if got == n {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("tenant %s: %d sessions, want %d", id, got, n)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// usageOf picks one tenant's hour out of a report.
func usageOf(rep api.UsageReport, id string, hour time.Time) (catalog.UsageHour, bool) {
	for _, h := range rep.Hours {
		if h.Tenant == id && h.Hour.Equal(hour) {
			return h, true
		}
	}
	return catalog.UsageHour{}, false
}

// TestUsage_FiguresMatchKnownWork: a tenant's hour holds the rows it wrote,
// the seconds its sessions were open, CPU seconds for a statement that
// burns CPU, bytes through its front door; storage byte-hours follow the
// size it held over known spans, up to its purge. /v1/usage filters by
// tenant and hours (a read-only token is enough); the CLI prints CSV.
func TestUsage_FiguresMatchKnownWork(t *testing.T) {
	ctx := pgtest.Context(t)
	cfg := daemontest.Config(t, pg)
	cfg.Provision.DefaultPoolSize = 0
	cfg.Metrics.Interval = 0 // the test drives its own collector
	d, c := daemontest.StartPooled(t, pg, cfg)
	daemontest.CreateTemplate(t, c, "saas", examples.Saas())
	tenants := map[string]api.CreateTenantResponse{}
	for _, l := range []struct{ label, mode string }{{"db1", "database"}, {"sc1", "schema"}, {"db2", "database"}, {"gone", "database"}} {
		r, err := c.CreateTenant(ctx, provision.Request{Template: "saas", Mode: tenant.Mode(l.mode)})
		if err != nil {
			t.Fatal(err)
		}
		tenants[l.label] = r
	}
	id := func(label string) string { return tenants[label].Tenant.ID }
	admin := pg.Conn(t, "postgres")
	for _, label := range []string{"db1", "sc1"} {
		work(t, tenants[label].DirectDSN, `CREATE TABLE w (i int, pad text)`)
		waitSessions(t, admin, id(label), 0)
	}

	// The clock runs hours in the past, so that every hour is over when usage is read.
	h0 := time.Now().Truncate(time.Hour).Add(-4 * time.Hour)
	clock := pgtest.NewClock(h0.Add(5 * time.Minute))
	col := &metrics.Collector{Store: d.Store(), Clusters: pg.Registry(t, false), Tiers: cfg.Tiers, Logger: pgtest.Logger(t), Now: clock.Now,
		Poolers: d.Poolers()}
	col.Metrics = cfg.Metrics
	col.Metrics.Interval = config.Duration(15 * time.Second)
	col.Metrics.SizeInterval = config.Duration(15 * time.Second) // every size on every pass
	first := pass(t, col)                                        // h0+5m: the baselines, and every size
	t.Logf("first pass: %+v", first)
	var goneSize int64
	if err := admin.QueryRow(ctx, `SELECT pg_database_size($1)`, tenants["gone"].Tenant.Database).Scan(&goneSize); err != nil {
		t.Fatal(err)
	}

	// Known work: rows, a statement that burns CPU, bytes through the pooler.
	work(t, tenants["db1"].DirectDSN, `INSERT INTO w SELECT g, 'x' FROM generate_series(1, 1000) g`)
	burnStart := time.Now()
	work(t, tenants["db1"].DirectDSN, `SELECT count(*) FROM generate_series(1, 5000000)`)
	burn := time.Since(burnStart)
	work(t, tenants["sc1"].DirectDSN, `INSERT INTO w SELECT g, 'x' FROM generate_series(1, 700) g`)
	front := simpleConn(t, tenants["db2"].DSN)
	for i := 0; i < 3; i++ {
		exec(t, front, `SELECT repeat('x', 100000)`)
	}
	front.Close(ctx)
	// PgBouncer's SHOW STATS totals move once per stats_period (60 s).
	waitFrontStats(t, d.Poolers().Get("local"), tenant.PhysicalName(id("db2")), 300000)
	// Closed sessions gone before the passes count sessions again.
	waitSessions(t, admin, id("sc1"), 0)
	waitSessions(t, admin, id("db1"), 0)
	waitFigures(t, col, clock, func(all map[string]metrics.Figures) error {
		if all[id("db1")].RowsWritten < 1000 || all[id("sc1")].RowsWritten < 700 {
			return fmt.Errorf("writes not seen yet")
		}
		return nil
	})

	// Two sessions of sc1 held over two passes ten minutes apart: each
	// pass counts them for the time since the previous one.
	heldFrom := clock.Now()
	held := []*pgx.Conn{pgtest.Connect(t, tenants["sc1"].DirectDSN), pgtest.Connect(t, tenants["sc1"].DirectDSN)}
	setClock(clock, h0.Add(15*time.Minute))
	pass(t, col)
	setClock(clock, h0.Add(25*time.Minute))
	pass(t, col)
	for _, conn := range held {
		conn.Close(ctx)
	}
	waitSessions(t, admin, id("sc1"), 0)

	setClock(clock, h0.Add(time.Hour+time.Minute))
	pass(t, col) // h0's hour ends: written
	// gone is purged; the pass at h0+2h30m sees it go.
	dropped, err := c.DropTenant(ctx, id("gone"), true)
	if err != nil {
		t.Fatal(err)
	}
	if dropped.Job != nil {
		if _, err := c.WaitJob(ctx, dropped.Job.ID, nil); err != nil {
			t.Fatal(err)
		}
	}
	setClock(clock, h0.Add(2*time.Hour+30*time.Minute))
	pass(t, col)
	setClock(clock, h0.Add(3*time.Hour+time.Minute))
	pass(t, col)

	// Read with a read-only token.
	tok, err := c.CreateToken(ctx, api.CreateTokenRequest{Name: "billing", Scope: api.ScopeReadOnly})
	if err != nil {
		t.Fatal(err)
	}
	ro := api.NewClient(c.BaseURL, tok.Secret)
	rep, err := ro.Usage(ctx, url.Values{"from": {h0.Format(time.RFC3339)}, "to": {h0.Add(3 * time.Hour).Format(time.RFC3339)}})
	if err != nil {
		t.Fatal(err)
	}
	for _, h := range rep.Hours {
		t.Logf("usage: %s %s storage %.0f byte-h, cpu %v s, rows %d, conn %.0f s, in %v, out %v", h.Tenant, h.Hour.Format("15:04"),
			h.StorageByteHours, fmtPtr(h.CPUSeconds), h.RowsWritten, h.ConnectionSeconds, fmtPtr(h.BytesIn), fmtPtr(h.BytesOut))
		if h.Hour.Before(h0) || !h.Hour.Before(h0.Add(3*time.Hour)) {
			t.Errorf("hour %s outside [from, to)", h.Hour)
		}
	}

	sc1, ok := usageOf(rep, id("sc1"), h0)
	if !ok {
		t.Fatalf("no usage of sc1 in %s", h0)
	}
	// Table statistics count exactly a schema's own rows.
	if sc1.RowsWritten != 700 {
		t.Errorf("sc1 rows written = %d, want 700", sc1.RowsWritten)
	}
	// Sessions are seen at each pass and count for the time since the
	// previous one: 2 sessions × 600 s, twice.
	wantConn := 2 * h0.Add(25*time.Minute).Sub(heldFrom).Seconds()
	if sc1.ConnectionSeconds != wantConn {
		t.Errorf("sc1 connection-seconds = %v, want %v (2 sessions seen at two passes, %v since the pass before)", sc1.ConnectionSeconds, wantConn, h0.Add(25*time.Minute).Sub(heldFrom))
	}
	db1, _ := usageOf(rep, id("db1"), h0)
	// A database's counters hold its catalog rows too (autoanalyze's).
	if db1.RowsWritten < 1000 || db1.RowsWritten > 1500 {
		t.Errorf("db1 rows written = %d, want 1000 (+ a few catalog rows)", db1.RowsWritten)
	}
	if kcacheInstalled() {
		// 5 M rows counted take a few hundred ms of CPU; never more than the wall time.
		if db1.CPUSeconds == nil || *db1.CPUSeconds < 0.05 || *db1.CPUSeconds > burn.Seconds()+1 {
			t.Errorf("db1 cpu seconds = %v, want 0.05 s to %.2f s (its statement's wall time + 1 s)", fmtPtr(db1.CPUSeconds), burn.Seconds()+1)
		}
		if sc1.CPUSeconds == nil {
			t.Errorf("sc1 cpu seconds unknown with pg_stat_kcache")
		}
	} else {
		t.Log("pg_stat_kcache not installed: CPU seconds not checked")
		if db1.CPUSeconds != nil {
			t.Errorf("db1 cpu seconds = %v without pg_stat_kcache, want null", *db1.CPUSeconds)
		}
	}
	db2, ok := usageOf(rep, id("db2"), h0)
	if !ok || db2.BytesOut == nil || *db2.BytesOut < 300000 || db2.BytesIn == nil || *db2.BytesIn <= 0 {
		t.Errorf("db2 front door bytes: in %v, out %v; want > 0 in and >= 300000 out (three 100 kB answers)", fmtPtr(db2.BytesIn), fmtPtr(db2.BytesOut))
	}
	// Storage: gone held its size from h0+5m, all of h0+1h, and until its
	// purge at h0+2h30m. Its size is the server's (checked to 1%: an idle
	// database's files do not move); the spans are the collector's clock.
	want := map[time.Time]float64{h0: 55.0 / 60, h0.Add(time.Hour): 1, h0.Add(2 * time.Hour): 0.5}
	for hour, frac := range want {
		g, _ := usageOf(rep, id("gone"), hour)
		if exp := float64(goneSize) * frac; math.Abs(g.StorageByteHours-exp) > 0.01*exp {
			t.Errorf("gone's storage in %s = %.0f byte-hours, want %.0f (%d bytes × %.3f h)", hour.Format("15:04"), g.StorageByteHours, exp, goneSize, frac)
		}
	}
	if g, ok := usageOf(rep, id("gone"), h0.Add(3*time.Hour)); ok {
		t.Errorf("gone has usage after its purge: %+v", g)
	}

	// Filters: one tenant, one hour.
	one, err := ro.Usage(ctx, url.Values{"tenant": {id("gone")}, "from": {h0.Add(time.Hour + 10*time.Minute).Format(time.RFC3339)},
		"to": {h0.Add(2 * time.Hour).Format(time.RFC3339)}})
	if err != nil {
		t.Fatal(err)
	}
	if len(one.Hours) != 1 || one.Hours[0].Tenant != id("gone") || !one.Hours[0].Hour.Equal(h0.Add(time.Hour)) || !one.From.Equal(h0.Add(time.Hour)) {
		t.Errorf("usage of gone in [h0+1h10m, h0+2h) = %+v, want its one hour h0+1h (from down to its hour)", one)
	}
	if _, err := ro.Usage(ctx, url.Values{"from": {"2026-01-01"}, "to": {"2026-12-01"}}); err == nil {
		t.Error("a span of 334 days was accepted")
	}

	// The CLI's CSV.
	t.Setenv("PGTENANT_TOKEN", tok.Secret)
	var out, errOut bytes.Buffer
	if err := cli.Run(ctx, []string{"--server", c.BaseURL, "usage", id("sc1"), "--from", h0.Format(time.RFC3339), "--to", h0.Add(time.Hour).Format(time.RFC3339), "-o", "csv"}, &out, &errOut); err != nil {
		t.Fatalf("usage -o csv: %v: %s", err, errOut.String())
	}
	t.Logf("usage -o csv:\n%s", out.String())
	recs, err := csv.NewReader(&out).ReadAll()
	if err != nil {
		t.Fatal(err)
	}
	wantHeader := []string{"tenant", "hour", "storage_byte_hours", "cpu_seconds", "rows_written", "connection_seconds", "bytes_in", "bytes_out", "analytics_queries"}
	if len(recs) != 2 || fmt.Sprint(recs[0]) != fmt.Sprint(wantHeader) {
		t.Fatalf("csv = %q, want the header and one line", recs)
	}
	line := recs[1]
	if want := strconv.FormatFloat(wantConn, 'f', 3, 64); line[0] != id("sc1") || line[1] != h0.UTC().Format(time.RFC3339) || line[4] != "700" || line[5] != want {
		t.Errorf("csv line = %q, want sc1, %s, rows 700, %s connection-seconds", line, h0.UTC().Format(time.RFC3339), want)
	}
	if n, err := strconv.ParseFloat(line[2], 64); err != nil || n <= 0 {
		t.Errorf("csv storage_byte_hours = %q, want > 0", line[2])
	}
	if err := cli.Run(ctx, []string{"--server", c.BaseURL, "tenant", "list", "-o", "csv"}, &out, &errOut); cli.ExitCode(err) != cli.ExitUsage {
		t.Errorf("tenant list -o csv: %v, want a usage error (only usage prints CSV)", err)
	}
}

// waitFrontStats waits until the pooler's SHOW STATS shows at least sent
// bytes sent to the clients of entry.
func waitFrontStats(t *testing.T, f *pooler.Front, entry string, sent int64) {
	t.Helper()
	ctx := pgtest.Context(t)
	pw, err := f.Proc.AdminPassword()
	if err != nil {
		t.Fatal(err)
	}
	a, err := pooler.DialAdmin(ctx, f.Addr(), pooler.AdminUser, pw)
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	start := time.Now()
	for {
		rows, err := a.Show(ctx, "STATS")
		if err != nil {
			t.Fatal(err)
		}
		for _, r := range rows {
			if n, _ := strconv.ParseInt(r["total_sent"], 10, 64); r["database"] == entry && n >= sent {
				t.Logf("SHOW STATS showed %s's bytes after %v: %v", entry, time.Since(start).Round(time.Second), r)
				return
			}
		}
		if time.Since(start) > 90*time.Second {
			t.Fatalf("SHOW STATS: %s has not sent %d bytes after %v: %v", entry, sent, time.Since(start), rows)
		}
		time.Sleep(time.Second)
	}
}

// setClock moves the test's clock to at.
func setClock(c *pgtest.Clock, at time.Time) { c.Add(at.Sub(c.Now())) }

func fmtPtr[T any](p *T) string {
	if p == nil {
		return "null"
	}
	return fmt.Sprint(*p)
}

// usageWrites is the rows of the usage tables and the newest row version
// (an update makes one): what any write to them changes.
func usageWrites(t *testing.T, conn *pgx.Conn) string {
	t.Helper()
	var hours, sizes, hoursX, sizesX int64
	if err := conn.QueryRow(pgtest.Context(t), `
		SELECT (SELECT count(*) FROM usage_hours), (SELECT count(*) FROM usage_sizes),
		       (SELECT coalesce(max(xmin::text::bigint), 0) FROM usage_hours), (SELECT coalesce(max(xmin::text::bigint), 0) FROM usage_sizes)`).
		Scan(&hours, &sizes, &hoursX, &sizesX); err != nil {
		t.Fatal(err)
	}
	return fmt.Sprintf("usage_hours: %d rows (newest xmin %d), usage_sizes: %d rows (newest xmin %d)", hours, hoursX, sizes, sizesX)
}

// TestUsage_IdleFleetWritesNothing: once each tenant's first size is
// recorded, passes over an idle fleet, across the end of an hour, write
// nothing for usage: storage held while idle costs no row.
func TestUsage_IdleFleetWritesNothing(t *testing.T) {
	f := startFleet(t, nil)
	// A backend's table statistics reach shared memory up to 10 s after
	// its last transaction (PGSTAT_IDLE_INTERVAL): the seed rows the
	// builds of the schema tenants inserted must be counted before the
	// baseline, not in the idle window.
	time.Sleep(11 * time.Second)
	h := time.Now().Truncate(time.Hour).Add(-3 * time.Hour)
	clock := pgtest.NewClock(h.Add(10 * time.Minute))
	c := f.collector(t, clock)
	conn := daemontest.CatalogConn(t, pg, f.cfg)
	pass(t, c) // the first sizes: one row per tenant
	clock.Add(time.Minute)
	pass(t, c)
	var sizes int
	if err := conn.QueryRow(pgtest.Context(t), `SELECT count(*) FROM usage_sizes`).Scan(&sizes); err != nil {
		t.Fatal(err)
	}
	if sizes != len(f.tenants) {
		t.Errorf("usage_sizes has %d rows after the first passes, want %d (each tenant's first size)", sizes, len(f.tenants))
	}
	before := usageWrites(t, conn)
	setClock(clock, h.Add(50*time.Minute))
	p1 := pass(t, c)
	setClock(clock, h.Add(time.Hour+5*time.Minute)) // the hour ends
	p2 := pass(t, c)
	after := usageWrites(t, conn)
	t.Logf("idle passes: %+v, %+v; %s", p1, p2, after)
	if before != after {
		var rows []string
		r, err := conn.Query(pgtest.Context(t), `SELECT 'hour ' || row(h.*)::text FROM usage_hours h UNION ALL SELECT 'size ' || row(z.*)::text FROM usage_sizes z`)
		if err == nil {
			rows, _ = pgx.CollectRows(r, pgx.RowTo[string])
		}
		t.Errorf("an idle fleet wrote usage: before %s; after %s; rows %q (tenants %v)", before, after, rows, f.tenants)
	}
	if p1.Rollups != 0 || p2.Rollups != 0 {
		t.Errorf("rollups of idle minutes: %d, %d, want 0", p1.Rollups, p2.Rollups)
	}
	for _, p := range []metrics.PassStats{p1, p2} {
		if want := 0; kcacheInstalled() {
			want = 1 // the CPU read; no write
			if p.UsageQueries != want {
				t.Errorf("usage queries of an idle pass = %d, want %d (no write)", p.UsageQueries, want)
			}
		} else if p.UsageQueries != want {
			t.Errorf("usage queries of an idle pass = %d, want %d (no write)", p.UsageQueries, want)
		}
	}
}
