package quota_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	examples "github.com/pgtenant/pgtenant/examples/templates"
	"github.com/pgtenant/pgtenant/internal/api"
	"github.com/pgtenant/pgtenant/internal/catalog"
	"github.com/pgtenant/pgtenant/internal/config"
	"github.com/pgtenant/pgtenant/internal/daemon/daemontest"
	"github.com/pgtenant/pgtenant/internal/metrics"
	"github.com/pgtenant/pgtenant/internal/pgtest"
	"github.com/pgtenant/pgtenant/internal/provision"
	"github.com/pgtenant/pgtenant/internal/quota"
	"github.com/pgtenant/pgtenant/internal/tenant"
)

var pg *pgtest.Cluster

// A standby: the capper checks every node, and tenants run long queries on
// standbys too.
func TestMain(m *testing.M) {
	pgtest.Main(m, pgtest.Options{Standbys: 1}, &pg)
}

// TestNext walks the state machine without a database.
func TestNext(t *testing.T) {
	now := time.Date(2026, 1, 1, 12, 0, 0, 0, time.UTC)
	tier := config.Tier{StorageWarn: 80, StorageQuota: 100, StorageGrace: config.Duration(time.Hour)}
	over := now.Add(-30 * time.Minute)
	longOver := now.Add(-2 * time.Hour)
	for _, tc := range []struct {
		name      string
		state     string
		overSince *time.Time
		size      int64
		tier      config.Tier
		want      string
		events    []string
	}{
		{"ok stays", catalog.QuotaOK, nil, 50, tier, catalog.QuotaOK, nil},
		{"ok to warning", catalog.QuotaOK, nil, 90, tier, catalog.QuotaWarning, []string{quota.EventWarning}},
		{"ok straight to grace", catalog.QuotaOK, nil, 150, tier, catalog.QuotaGrace, []string{quota.EventExceeded}},
		{"warning back to ok", catalog.QuotaWarning, nil, 10, tier, catalog.QuotaOK, []string{quota.EventOK}},
		{"warning to grace", catalog.QuotaWarning, nil, 101, tier, catalog.QuotaGrace, []string{quota.EventExceeded}},
		{"grace within the period", catalog.QuotaGrace, &over, 150, tier, catalog.QuotaGrace, nil},
		{"grace over the period", catalog.QuotaGrace, &longOver, 150, tier, catalog.QuotaEnforced, []string{quota.EventEnforced}},
		{"grace back under to warning", catalog.QuotaGrace, &over, 90, tier, catalog.QuotaWarning, []string{quota.EventBackUnder}},
		{"enforced stays", catalog.QuotaEnforced, &longOver, 150, tier, catalog.QuotaEnforced, nil},
		{"enforced restored", catalog.QuotaEnforced, &longOver, 100, tier, catalog.QuotaWarning, []string{quota.EventRestored}},
		{"enforced restored to ok", catalog.QuotaEnforced, &longOver, 10, tier, catalog.QuotaOK, []string{quota.EventRestored}},
		{"zero grace enforces at once", catalog.QuotaOK, nil, 150, config.Tier{StorageQuota: 100}, catalog.QuotaEnforced,
			[]string{quota.EventExceeded, quota.EventEnforced}},
		{"tier without quota restores", catalog.QuotaEnforced, &longOver, 150, config.Tier{}, catalog.QuotaOK, []string{quota.EventRestored}},
		{"tier without warning", catalog.QuotaWarning, nil, 90, config.Tier{StorageQuota: 100}, catalog.QuotaOK, []string{quota.EventOK}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, trans := quota.Next(catalog.Quota{State: tc.state, OverSince: tc.overSince}, tc.size, tc.tier, now)
			var events []string
			for _, tr := range trans {
				events = append(events, tr.Event)
			}
			if got.State != tc.want || strings.Join(events, ",") != strings.Join(tc.events, ",") {
				t.Errorf("got %s %v, want %s %v", got.State, events, tc.want, tc.events)
			}
			if got.State == catalog.QuotaGrace && tc.state != catalog.QuotaGrace && (got.OverSince == nil || !got.OverSince.Equal(now)) {
				t.Errorf("entering grace: over_since = %v, want now", got.OverSince)
			}
		})
	}
}

func start(t *testing.T, mutate func(*config.Config)) (*api.Client, *catalog.Store, config.Config) {
	t.Helper()
	cfg := daemontest.Config(t, pg)
	cfg.Provision.DefaultPoolSize = 0
	cfg.Metrics.Interval = 0
	cfg.Tiers["quota_database"] = cfg.Tiers["default"]
	cfg.Tiers["quota_schema"] = cfg.Tiers["default"]
	if mutate != nil {
		mutate(&cfg)
	}
	d, c := daemontest.Start(t, pg, cfg)
	daemontest.CreateTemplate(t, c, "saas", examples.Saas())
	return c, d.Store(), cfg
}

func mustExec(t *testing.T, conn *pgx.Conn, sql string) {
	t.Helper()
	if _, err := conn.Exec(context.Background(), sql); err != nil {
		t.Fatalf("%s: %v", sql, err)
	}
}

// refused runs sql and wants it refused for lack of privilege (42501).
func refused(t *testing.T, conn *pgx.Conn, sql string) {
	t.Helper()
	_, err := conn.Exec(context.Background(), sql)
	var pgErr *pgconn.PgError
	if !errors.As(err, &pgErr) || pgErr.Code != "42501" {
		t.Errorf("%s while enforced: err = %v, want permission denied (42501)", sql, err)
	}
}

// TestQuota_WarnGraceEnforceRestore: a tenant that grows over its tier's
// thresholds walks warning → grace → enforced (real writes refused, even
// after it tries to grant itself rights back) → restored once it truncates
// its way back under, in both modes; each step is an event.
func TestQuota_WarnGraceEnforceRestore(t *testing.T) {
	c, store, cfg := start(t, nil)
	ctx := pgtest.Context(t)
	reg := pg.Registry(t, false)

	for _, mode := range []string{"database", "schema"} {
		t.Run(mode, func(t *testing.T) {
			tierName := "quota_" + mode
			r, err := c.CreateTenant(ctx, provision.Request{Template: "saas", Mode: tenant.Mode(mode), Tier: tierName})
			if err != nil {
				t.Fatal(err)
			}
			id := r.Tenant.ID
			conn := pgtest.Connect(t, r.DSN)
			mustExec(t, conn, `CREATE TABLE blob (b text)`)

			// The tier's thresholds, from the tenant's size as built.
			clock := pgtest.NewClock(time.Now())
			qcfg := cfg
			qcfg.Metrics.Interval = config.Duration(15 * time.Second)
			qcfg.Metrics.SizeInterval = config.Duration(15 * time.Second)
			probe := &metrics.Collector{Store: store, Clusters: reg, Metrics: qcfg.Metrics, Tiers: qcfg.Tiers, Now: clock.Now}
			if err := probe.Pass(ctx, "local"); err != nil {
				t.Fatal(err)
			}
			f, err := probe.Tenant(id)
			if err != nil || f.SizeBytes == nil {
				t.Fatalf("no size for %s: %v", id, err)
			}
			base := *f.SizeBytes
			qcfg.Tiers = map[string]config.Tier{"default": cfg.Tiers["default"], tierName: {
				StorageWarn: config.ByteSize(base + 2<<20), StorageQuota: config.ByteSize(base + 5<<20), StorageGrace: config.Duration(time.Hour)}}
			svc := &quota.Service{Store: store, Clusters: reg, Tiers: qcfg.Tiers, Logger: pgtest.Logger(t), Now: clock.Now}
			col := &metrics.Collector{Store: store, Clusters: reg, Metrics: qcfg.Metrics, Tiers: qcfg.Tiers, Logger: pgtest.Logger(t), Quota: svc, Now: clock.Now}
			step := func(want string) {
				t.Helper()
				clock.Add(15 * time.Second)
				if err := col.Pass(ctx, "local"); err != nil {
					t.Fatal(err)
				}
				q, err := store.GetQuota(ctx, id)
				if err != nil {
					t.Fatal(err)
				}
				f, _ := col.Tenant(id)
				if q.State != want {
					t.Fatalf("quota state = %s at size %d (base %d), want %s", q.State, *f.SizeBytes, base, want)
				}
			}
			step(catalog.QuotaOK)

			// 1,000 rows of 1 kB: about 1 MB each time.
			grow := `INSERT INTO blob SELECT repeat(md5(g::text), 32) FROM generate_series(1, 1000) g`
			for range 3 {
				mustExec(t, conn, grow)
			}
			step(catalog.QuotaWarning)
			for range 3 {
				mustExec(t, conn, grow)
			}
			step(catalog.QuotaGrace)
			mustExec(t, conn, `INSERT INTO blob VALUES ('still allowed during the grace period')`)
			v, err := c.TenantMetrics(ctx, id, "")
			if err != nil || v.Quota == nil || v.Quota.State != catalog.QuotaGrace || v.Quota.EnforceAt == nil {
				t.Errorf("API quota in grace = %+v, %v", v.Quota, err)
			}
			step(catalog.QuotaGrace) // the grace period has not passed
			clock.Add(time.Hour)
			step(catalog.QuotaEnforced)

			// Refused, in the session that was open (schema mode: database
			// mode ends the tenant's sessions, which could hold temporary
			// tables) and in a new one, whatever it tries.
			if mode == "database" {
				if _, err := conn.Exec(ctx, `SELECT 1`); err == nil {
					t.Error("a database tenant's session survived enforcement")
				}
				conn = pgtest.Connect(t, r.DSN)
			}
			fresh := pgtest.Connect(t, r.DSN)
			for _, s := range []*pgx.Conn{conn, fresh} {
				refused(t, s, grow)
				refused(t, s, `UPDATE blob SET b = 'x'`)
				refused(t, s, `CREATE TABLE more (i int)`)
				refused(t, s, `CREATE TEMP TABLE scratch (i int)`)
				refused(t, s, `INSERT INTO organizations (name, slug) VALUES ('a', 'a')`)
			}
			refused(t, conn, `CREATE SCHEMA elsewhere`)
			if mode == "database" {
				refused(t, conn, `SELECT lo_creat(-1)`)
				refused(t, conn, `CREATE TABLE public.more (i int)`)
			}
			mustExec(t, conn, `SET default_transaction_read_only = off`)
			_, _ = conn.Exec(ctx, `GRANT INSERT, UPDATE ON blob TO CURRENT_USER`) // a warning: it may grant nothing
			refused(t, conn, `ALTER TABLE blob OWNER TO CURRENT_USER`)
			refused(t, conn, grow)
			// What remains: reading, deleting, truncating.
			var n int
			if err := conn.QueryRow(ctx, `SELECT count(*) FROM blob`).Scan(&n); err != nil || n != 6001 {
				t.Errorf("SELECT while enforced: %d rows, %v", n, err)
			}
			mustExec(t, conn, `DELETE FROM blob WHERE b LIKE 'still%'`)
			v, err = c.TenantMetrics(ctx, id, "")
			if err != nil || v.Quota == nil || v.Quota.State != catalog.QuotaEnforced || v.Quota.Enforcement == nil {
				t.Errorf("API quota when enforced = %+v, %v", v.Quota, err)
			}
			step(catalog.QuotaEnforced)

			mustExec(t, conn, `TRUNCATE blob`)
			step(catalog.QuotaOK)
			mustExec(t, conn, grow)
			mustExec(t, conn, `CREATE TABLE more (i int)`)
			mustExec(t, conn, `UPDATE blob SET b = 'x' WHERE false`)
			var owner string
			if err := conn.QueryRow(ctx, `SELECT tableowner FROM pg_tables WHERE tablename = 'blob'`).Scan(&owner); err != nil || owner != "t_"+id {
				t.Errorf("blob's owner after restore = %q, %v", owner, err)
			}
			if mode == "database" {
				mustExec(t, conn, `SELECT lo_unlink(lo_creat(-1))`)
			}

			events, err := store.Events(ctx, id)
			if err != nil {
				t.Fatal(err)
			}
			var kinds []string
			for _, e := range events {
				if strings.HasPrefix(e.Kind, "quota_") {
					kinds = append(kinds, e.Kind)
				}
			}
			want := []string{quota.EventWarning, quota.EventExceeded, quota.EventEnforced, quota.EventRestored}
			if strings.Join(kinds, ",") != strings.Join(want, ",") {
				t.Errorf("quota events = %v, want %v", kinds, want)
			}
			tv, err := c.Tenant(ctx, id)
			if err != nil || len(tv.Events) == 0 || tv.Metrics == nil || tv.Metrics.Quota == nil || tv.Metrics.Quota.State != catalog.QuotaOK {
				t.Errorf("tenant show: %+v, %v", tv.Metrics, err)
			}
		})
	}
}

// TestCapper_CancelsStatementsOverTheCap: a statement running longer than
// its tier's statement_cap is cancelled from outside even after the tenant
// turned statement_timeout off; shorter ones run.
func TestCapper_CancelsStatementsOverTheCap(t *testing.T) {
	c, store, _ := start(t, func(cfg *config.Config) {
		cfg.Tiers["capped"] = config.Tier{ConnectionLimit: 5, StatementTimeout: config.Duration(time.Minute), StatementCap: config.Duration(2 * time.Second)}
		cfg.Metrics.CapInterval = config.Duration(200 * time.Millisecond)
	})
	ctx := pgtest.Context(t)
	for _, mode := range []string{"database", "schema"} {
		t.Run(mode, func(t *testing.T) {
			r, err := c.CreateTenant(ctx, provision.Request{Template: "saas", Mode: tenant.Mode(mode), Tier: "capped"})
			if err != nil {
				t.Fatal(err)
			}
			conn := pgtest.Connect(t, r.DSN)
			mustExec(t, conn, `SET statement_timeout = 0`)
			mustExec(t, conn, `SELECT pg_sleep(1)`) // under the cap: runs
			begin := time.Now()
			_, err = conn.Exec(ctx, `SELECT pg_sleep(30)`)
			took := time.Since(begin)
			var pgErr *pgconn.PgError
			if !errors.As(err, &pgErr) || pgErr.Code != "57014" {
				t.Fatalf("30 s statement under a 2 s cap: err = %v, want canceled (57014)", err)
			}
			if took < 2*time.Second || took > 8*time.Second {
				t.Errorf("cancelled after %s, want soon after the 2 s cap", took)
			}
			mustExec(t, conn, `SELECT 1`) // the session survives a cancel
			// The capper records the event right after the cancel.
			deadline := time.Now().Add(10 * time.Second)
			for {
				events, err := store.Events(ctx, r.Tenant.ID)
				if err != nil {
					t.Fatal(err)
				}
				found := false
				for _, e := range events {
					found = found || e.Kind == quota.EventStatementCancelled
				}
				if found {
					break
				}
				if time.Now().After(deadline) {
					t.Fatalf("no statement_cancelled event in %v", events)
				}
				time.Sleep(100 * time.Millisecond)
			}
		})
	}
}
