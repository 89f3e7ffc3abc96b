package quota_test

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"net"
	"net/url"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/pgtenant/pgtenant/internal/catalog"
	"github.com/pgtenant/pgtenant/internal/cluster"
	"github.com/pgtenant/pgtenant/internal/config"
	"github.com/pgtenant/pgtenant/internal/pgtest"
	"github.com/pgtenant/pgtenant/internal/provision"
	"github.com/pgtenant/pgtenant/internal/quota"
	"github.com/pgtenant/pgtenant/internal/tenant"
)

// standbyDSN is a tenant's DSN pointed at the package cluster's standby.
func standbyDSN(t *testing.T, dsn string) string {
	t.Helper()
	u, err := url.Parse(dsn)
	if err != nil {
		t.Fatal(err)
	}
	u.Host = net.JoinHostPort(u.Hostname(), strconv.Itoa(pg.Standbys()[0].Port))
	return u.String()
}

// connectWhenReady connects as the tenant, retrying while its role has not
// reached a standby yet.
func connectWhenReady(t *testing.T, dsn string) *pgx.Conn {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		conn, err := pgx.Connect(context.Background(), dsn)
		if err == nil {
			t.Cleanup(func() { conn.Close(context.Background()) })
			return conn
		}
		if time.Now().After(deadline) {
			t.Fatalf("connect as tenant: %v", err)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// waitEvent polls the tenant's history until an event of kind for which
// match holds is there, and returns its detail.
func waitEvent(t *testing.T, store *catalog.Store, id, kind string, match func(map[string]any) bool) map[string]any {
	t.Helper()
	ctx := pgtest.Context(t)
	deadline := time.Now().Add(30 * time.Second)
	for {
		events, err := store.Events(ctx, id)
		if err != nil {
			t.Fatal(err)
		}
		for _, e := range events {
			if e.Kind != kind {
				continue
			}
			var d map[string]any
			if err := json.Unmarshal(e.Detail, &d); err != nil {
				t.Fatal(err)
			}
			if match == nil || match(d) {
				return d
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("no %s event in %+v", kind, events)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// wantCancelled wants err to be a cancel sent from outside (57014 "due to
// user request"), not PostgreSQL's own statement_timeout.
func wantCancelled(t *testing.T, err error) {
	t.Helper()
	var pgErr *pgconn.PgError
	if !errors.As(err, &pgErr) || pgErr.Code != "57014" || !strings.Contains(pgErr.Message, "user request") {
		t.Fatalf("long statement after SET statement_timeout = 0: err = %v, want canceled by the capper (57014, user request)", err)
	}
}

// TestCapper_EnforcesStatementTimeoutOnEveryNode: a tier without
// statement_cap is held to its statement_timeout even after the tenant SETs
// it to 0, on the primary and on the standby; shorter statements run.
func TestCapper_EnforcesStatementTimeoutOnEveryNode(t *testing.T) {
	c, store, _ := start(t, func(cfg *config.Config) {
		cfg.Tiers["timeout"] = config.Tier{ConnectionLimit: 5, StatementTimeout: config.Duration(time.Second)}
		cfg.Metrics.CapInterval = config.Duration(100 * time.Millisecond)
	})
	ctx := pgtest.Context(t)
	r, err := c.CreateTenant(ctx, provision.Request{Template: "saas", Mode: "database", Tier: "timeout"})
	if err != nil {
		t.Fatal(err)
	}
	for _, node := range []string{"primary", "standby1"} {
		t.Run(node, func(t *testing.T) {
			dsn := r.DSN
			if node != "primary" {
				dsn = standbyDSN(t, r.DSN)
			}
			conn := connectWhenReady(t, dsn)
			var timeout string
			if err := conn.QueryRow(ctx, `SHOW statement_timeout`).Scan(&timeout); err != nil || timeout != "1s" {
				t.Fatalf("the tier's statement_timeout on %s = %q, %v; want 1s", node, timeout, err)
			}
			mustExec(t, conn, `SET statement_timeout = 0`)
			mustExec(t, conn, `SELECT pg_sleep(0.2)`) // under the timeout: runs
			_, err := conn.Exec(ctx, `SELECT pg_sleep(60)`)
			wantCancelled(t, err)
			mustExec(t, conn, `SELECT 1`) // the session survives a cancel
			d := waitEvent(t, store, r.Tenant.ID, quota.EventStatementCancelled, func(d map[string]any) bool { return d["node"] == node })
			if d["limit"] != "statement_timeout" || d["statement_cap"] != "1s" || d["tier"] != "timeout" {
				t.Errorf("event detail = %v, want the tier's 1s statement_timeout", d)
			}
		})
	}
}

// TestCapper_TerminatesIdleTransactions: a session left idle in a
// transaction past the tier's idle_in_transaction_session_timeout is
// terminated from outside although the tenant turned the timeout off; a
// short pause in a transaction is left alone.
func TestCapper_TerminatesIdleTransactions(t *testing.T) {
	c, store, _ := start(t, func(cfg *config.Config) {
		cfg.Tiers["idle"] = config.Tier{ConnectionLimit: 5, IdleInTransactionSessionTimeout: config.Duration(time.Second)}
		cfg.Metrics.CapInterval = config.Duration(100 * time.Millisecond)
	})
	ctx := pgtest.Context(t)
	r, err := c.CreateTenant(ctx, provision.Request{Template: "saas", Mode: "schema", Tier: "idle"})
	if err != nil {
		t.Fatal(err)
	}
	conn := pgtest.Connect(t, r.DSN)
	mustExec(t, conn, `SET idle_in_transaction_session_timeout = 0`)
	mustExec(t, conn, `BEGIN`)
	time.Sleep(300 * time.Millisecond) // well under the limit
	mustExec(t, conn, `COMMIT`)

	var pid int32
	if err := conn.QueryRow(ctx, `SELECT pg_backend_pid()`).Scan(&pid); err != nil {
		t.Fatal(err)
	}
	mustExec(t, conn, `BEGIN`)
	mustExec(t, conn, `SELECT 1`)
	admin := pg.Conn(t, "postgres")
	deadline := time.Now().Add(30 * time.Second)
	for {
		var n int
		if err := admin.QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity WHERE pid = $1`, pid).Scan(&n); err != nil {
			t.Fatal(err)
		}
		if n == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("session idle in transaction (pid %d) still there after 30 s", pid)
		}
		time.Sleep(100 * time.Millisecond)
	}
	_, err = conn.Exec(ctx, `SELECT 1`)
	var pgErr *pgconn.PgError
	if !errors.As(err, &pgErr) || pgErr.Code != "57P01" { // PostgreSQL's own timeout would be 25P03
		t.Errorf("statement in the terminated session: err = %v, want the connection gone (57P01, administrator command)", err)
	}
	d := waitEvent(t, store, r.Tenant.ID, quota.EventIdleTerminated, nil)
	if d["node"] != "primary" || d["idle_in_transaction_session_timeout"] != "1s" || d["pid"] != float64(pid) {
		t.Errorf("event detail = %v, want pid %d on the primary, limit 1s", d, pid)
	}
}

// TestCapper_PutsBackRoleSettings: the tier parameters a tenant changes on
// its own role (ALTER ROLE … SET, and IN DATABASE) are put back by the
// settings pass, so that new sessions start with the tier's limits again;
// its other settings and its agent role are left alone.
func TestCapper_PutsBackRoleSettings(t *testing.T) {
	c, store, _ := start(t, func(cfg *config.Config) {
		cfg.Tiers["timeout"] = config.Tier{ConnectionLimit: 5, StatementTimeout: config.Duration(time.Second), WorkMem: 4 << 20}
		cfg.Metrics.CapInterval = config.Duration(100 * time.Millisecond) // a settings pass every 3 s
	})
	ctx := pgtest.Context(t)
	r, err := c.CreateTenant(ctx, provision.Request{Template: "saas", Mode: "database", Tier: "timeout"})
	if err != nil {
		t.Fatal(err)
	}
	id, role := r.Tenant.ID, tenant.PhysicalName(r.Tenant.ID)
	conn := pgtest.Connect(t, r.DSN)
	mustExec(t, conn, `ALTER ROLE CURRENT_USER SET statement_timeout = 0`)
	mustExec(t, conn, `ALTER ROLE CURRENT_USER SET work_mem = '1GB'`)
	mustExec(t, conn, `ALTER ROLE CURRENT_USER SET idle_in_transaction_session_timeout = '1h'`) // the tier sets none
	mustExec(t, conn, `ALTER ROLE CURRENT_USER SET application_name = 'mine'`)                  // not a tier parameter
	mustExec(t, conn, `ALTER ROLE CURRENT_USER IN DATABASE `+cluster.Ident(r.Tenant.Database)+` SET statement_timeout = '1h'`)
	admin := pg.Conn(t, "postgres")
	agent := cluster.Ident(tenant.AgentRole(id))
	if _, err := admin.Exec(ctx, `ALTER ROLE `+agent+` SET statement_timeout = 0`); err != nil {
		t.Fatal(err)
	}

	settings := func() (own, inDB []string) {
		t.Helper()
		err := admin.QueryRow(ctx, `SELECT
			coalesce((SELECT setconfig FROM pg_db_role_setting WHERE setrole = $1::regrole AND setdatabase = 0), '{}'),
			coalesce((SELECT setconfig FROM pg_db_role_setting WHERE setrole = $1::regrole AND setdatabase <> 0), '{}')`, role).
			Scan(&own, &inDB)
		if err != nil {
			t.Fatal(err)
		}
		return own, inDB
	}
	want := []string{"statement_timeout=1000ms", "work_mem=4096kB", "application_name=mine"}
	deadline := time.Now().Add(30 * time.Second)
	for {
		own, inDB := settings()
		if sameSet(own, want) && len(inDB) == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("role settings after 30 s: %v, in its database %v; want %v and none", own, inDB, want)
		}
		time.Sleep(100 * time.Millisecond)
	}

	// A new session starts with the tier's limits.
	fresh := pgtest.Connect(t, r.DSN)
	var timeout, workMem, idle string
	if err := fresh.QueryRow(ctx, `SELECT current_setting('statement_timeout'), current_setting('work_mem'),
		current_setting('idle_in_transaction_session_timeout')`).Scan(&timeout, &workMem, &idle); err != nil {
		t.Fatal(err)
	}
	if timeout != "1s" || workMem != "4MB" || idle != "0" {
		t.Errorf("new session: statement_timeout=%s work_mem=%s idle_in_transaction_session_timeout=%s, want 1s, 4MB, 0", timeout, workMem, idle)
	}

	d := waitEvent(t, store, id, quota.EventSettingRestored, nil)
	b, _ := json.Marshal(d["settings"])
	var changes []quota.SettingChange
	if err := json.Unmarshal(b, &changes); err != nil {
		t.Fatal(err)
	}
	for _, want := range []quota.SettingChange{
		{Setting: "statement_timeout", Found: "0", Tier: "1000ms"},
		{Setting: "work_mem", Found: "1GB", Tier: "4096kB"},
		{Setting: "idle_in_transaction_session_timeout", Found: "1h"},
		{Setting: "statement_timeout", Database: r.Tenant.Database, Found: "1h", Tier: "1000ms"},
	} {
		found := false
		for _, ch := range changes {
			found = found || ch == want
		}
		if !found {
			t.Errorf("event %s: missing %+v", b, want)
		}
	}
	var agentSettings []string
	if err := admin.QueryRow(ctx, `SELECT setconfig FROM pg_db_role_setting WHERE setrole = $1::regrole AND setdatabase = 0`,
		tenant.AgentRole(id)).Scan(&agentSettings); err != nil || !sameSet(agentSettings, []string{"statement_timeout=0"}) {
		t.Errorf("agent role settings = %v, %v; want its own left alone", agentSettings, err)
	}
}

func sameSet(a, b []string) bool {
	if len(a) != len(b) {
		return false
	}
	m := map[string]bool{}
	for _, s := range a {
		m[s] = true
	}
	for _, s := range b {
		if !m[s] {
			return false
		}
	}
	return true
}

func slogTo(w io.Writer) *slog.Logger { return slog.New(slog.NewTextHandler(w, nil)) }

// TestCapper_SkipsADownStandby: a standby that does not answer is logged
// once and skipped, and the primary is still checked every interval.
func TestCapper_SkipsADownStandby(t *testing.T) {
	// The daemon's tier has no limits: only the capper below acts.
	c, store, cfg := start(t, func(cfg *config.Config) {
		cfg.Tiers["plain"] = config.Tier{ConnectionLimit: 5}
	})
	ctx := pgtest.Context(t)
	r, err := c.CreateTenant(ctx, provision.Request{Template: "saas", Mode: "database", Tier: "plain"})
	if err != nil {
		t.Fatal(err)
	}
	downDSN := pgtest.RefusedDSN(t)
	reg := cluster.NewRegistry()
	cl, err := cluster.New("local", pg.PrimaryDSN("postgres"), []string{downDSN}, nil)
	if err != nil {
		t.Fatal(err)
	}
	reg.Put(cl)
	t.Cleanup(reg.Close)
	ccfg := cfg
	ccfg.Tiers = map[string]config.Tier{"default": {}, "plain": {ConnectionLimit: 5, StatementCap: config.Duration(time.Second)}}
	ccfg.Metrics.CapInterval = config.Duration(100 * time.Millisecond)
	var logs pgtest.LogBuffer
	capper := &quota.Capper{Store: store, Clusters: reg, Metrics: ccfg.Metrics, Tiers: ccfg.Tiers, Logger: slogTo(&logs)}
	cctx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- capper.Run(cctx) }()

	conn := pgtest.Connect(t, r.DSN)
	_, err = conn.Exec(ctx, `SELECT pg_sleep(60)`)
	wantCancelled(t, err)
	waitEvent(t, store, r.Tenant.ID, quota.EventStatementCancelled, func(d map[string]any) bool { return d["node"] == "primary" })
	time.Sleep(time.Second) // ten more intervals with the standby down
	stop()
	if err := <-done; err != nil {
		t.Errorf("Run = %v", err)
	}
	var warned int
	for _, line := range strings.Split(logs.String(), "\n") {
		if strings.Contains(line, "level=WARN") && strings.Contains(line, "node=standby1") {
			warned++
		}
	}
	if warned != 1 {
		t.Errorf("the down standby was logged %d times, want once:\n%s", warned, logs.String())
	}
}

// TestCapper_SettingsPassReadsNoCatalogForADownCluster: the settings pass
// over a cluster that refuses connections ends with the cluster's error
// before it reads that cluster's tenants from the catalog. A daemon of a
// million tenants that started with clusters down spent every catalog
// connection on those reads for 8 s, and its API waited. The catalog here
// is closed, so a pass that read it would fail with the catalog's error.
func TestCapper_SettingsPassReadsNoCatalogForADownCluster(t *testing.T) {
	ctx := pgtest.Context(t)
	store, err := catalog.Open(ctx, pg.PrimaryDSN(pg.NewDatabase(t)), pgtest.Logger(t))
	if err != nil {
		t.Fatal(err)
	}
	store.Close()
	downDSN := pgtest.RefusedDSN(t)
	cl, err := cluster.New("gone", downDSN, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(cl.Close)
	capper := &quota.Capper{Store: store, Tiers: map[string]config.Tier{"default": {ConnectionLimit: 5}}}
	n, err := capper.RestoreSettings(ctx, cl)
	if !errors.Is(err, cluster.ErrUnavailable) || !strings.Contains(err.Error(), "reach gone") {
		t.Errorf("RestoreSettings on a cluster that is down = %d, %v; want its cluster's error (unavailable), not the catalog's", n, err)
	}
}

// TestCapper_SettingsPassOneDaemonAtATime: a cluster's settings pass runs
// in one daemon of a catalog at a time; while another daemon's pass over
// it holds its lock in the catalog, it is skipped.
func TestCapper_SettingsPassOneDaemonAtATime(t *testing.T) {
	ctx := pgtest.Context(t)
	db := pg.NewDatabase(t)
	store, err := catalog.Open(ctx, pg.PrimaryDSN(db), pgtest.Logger(t))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(store.Close)
	cl, err := cluster.New("local", pg.PrimaryDSN("postgres"), nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(cl.Close)
	capper := &quota.Capper{Store: store, Tiers: map[string]config.Tier{"default": {ConnectionLimit: 5}}}
	if ran, err := capper.SettingsPass(ctx, cl); !ran || err != nil {
		t.Fatalf("a pass alone = %v, %v; want it run", ran, err)
	}
	other := pgtest.Connect(t, pg.PrimaryDSN(db))
	lock := func(fn string) {
		t.Helper()
		if _, err := other.Exec(ctx, `SELECT `+fn+`($1)`, catalog.LockKey(quota.SettingsLockSpace, "local")); err != nil {
			t.Fatal(err)
		}
	}
	lock("pg_advisory_lock")
	if ran, err := capper.SettingsPass(ctx, cl); ran || err != nil {
		t.Errorf("a pass while another daemon's holds the cluster's lock = %v, %v; want it skipped", ran, err)
	}
	lock("pg_advisory_unlock")
	if ran, err := capper.SettingsPass(ctx, cl); !ran || err != nil {
		t.Errorf("a pass once the other's ended = %v, %v; want it run", ran, err)
	}
}
