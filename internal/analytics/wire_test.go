package analytics_test

import (
	"context"
	"errors"
	"io"
	"net/http"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/pgtenant/pgtenant/internal/api"
	"github.com/pgtenant/pgtenant/internal/config"
	"github.com/pgtenant/pgtenant/internal/daemon/daemontest"
	"github.com/pgtenant/pgtenant/internal/provision"
	"github.com/pgtenant/pgtenant/internal/tenant"
)

// analyticsConn logs in to the analytics port as a tenant (its role and
// password from its create).
func analyticsConn(t *testing.T, st string, password string, mode pgx.QueryExecMode) (*pgx.Conn, error) {
	t.Helper()
	u, err := url.Parse(st)
	if err != nil {
		t.Fatal(err)
	}
	u.User = url.UserPassword(u.User.Username(), password)
	cfg, err := pgx.ParseConfig(u.String())
	if err != nil {
		t.Fatal(err)
	}
	cfg.DefaultQueryExecMode = mode
	return pgx.ConnectConfig(context.Background(), cfg)
}

type mirrored struct {
	r   api.CreateTenantResponse
	dsn string // the analytics DSN, without password
}

func mirroredTenant(t *testing.T, c *api.Client, mode string) mirrored {
	t.Helper()
	ctx := context.Background()
	r, err := c.CreateTenant(ctx, provision.Request{Template: "an", Mode: tenant.Mode(mode)})
	if err != nil {
		t.Fatal(err)
	}
	exec(t, r.DSN, `INSERT INTO items SELECT i, i % 7, 'n' || i, timestamp '2024-01-01' + i * interval '1 minute', i / 3.0, NULL FROM generate_series(1, 300) i`)
	if _, err := c.EnableAnalytics(ctx, r.Tenant.ID, nil); err != nil {
		t.Fatal(err)
	}
	st := waitStreaming(t, c, r.Tenant.ID)
	if st.DSN == "" {
		t.Fatalf("no analytics DSN: %+v", st)
	}
	tv, err := c.Tenant(ctx, r.Tenant.ID)
	if err != nil || tv.Analytics == nil || tv.Analytics.DSN != st.DSN {
		t.Fatalf("tenant show has no analytics DSN: %+v %v", tv.Analytics, err)
	}
	return mirrored{r: r, dsn: st.DSN}
}

func TestWire_TenantQueriesItsMirror(t *testing.T) {
	ctx := context.Background()
	cfg := testConfig(t)
	cfg.Metrics.Interval = 0 // usage metering would take the statements counted below
	d, c := daemontest.Start(t, pg, cfg)
	template(t, c)
	m := mirroredTenant(t, c, "schema")

	// /metrics has the mirror's figures and its slot's retained WAL.
	resp, err := http.Get(d.URL() + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	id := m.r.Tenant.ID
	for _, want := range []string{`pgtenant_analytics_applied_rows_total{tenant="` + id + `"} 300`, `pgtenant_analytics_mirror_bytes{tenant="` + id + `"}`,
		`pgtenant_analytics_lag_bytes{tenant="` + id + `"}`, `pgtenant_analytics_slot_retained_wal_bytes{cluster="local",slot="pgt_analytics_` + id + `",wal_status="reserved"}`} {
		if !strings.Contains(string(body), want) {
			t.Errorf("/metrics lacks %s", want)
		}
	}

	for _, mode := range []pgx.QueryExecMode{pgx.QueryExecModeSimpleProtocol, pgx.QueryExecModeCacheStatement} {
		conn, err := analyticsConn(t, m.dsn, m.r.Password, mode)
		if err != nil {
			t.Fatalf("%v: login: %v", mode, err)
		}
		var n, sum int64
		var price float64
		var at time.Time
		var name string
		if err := conn.QueryRow(ctx, `SELECT count(*), sum(qty) FROM items`).Scan(&n, &sum); err != nil {
			t.Fatalf("%v: %v", mode, err)
		}
		if got, want := [2]int64{n, sum}, [2]int64{300, 903}; got != want { // 300 rows of i % 7
			t.Errorf("%v: count, sum = %v, want %v", mode, got, want)
		}
		if err := conn.QueryRow(ctx, `SELECT name, price::double, "at" FROM items WHERE id = $1`, 30).Scan(&name, &price, &at); err != nil {
			t.Fatalf("%v: %v", mode, err)
		}
		if name != "n30" || price != 10 || !at.Equal(time.Date(2024, 1, 1, 0, 30, 0, 0, time.UTC)) {
			t.Errorf("%v: row 30 = %q %v %v", mode, name, price, at)
		}
		conn.Close(ctx)
	}
	// Usage counts the tenant's statements (2 per protocol), once.
	if got := d.Analytics().TakeQueries([]string{id}); got[id] != 4 {
		t.Errorf("analytics statements counted for usage: %v, want 4 of tenant %s", got, id)
	}
	if got := d.Analytics().TakeQueries([]string{id}); len(got) != 0 {
		t.Errorf("analytics statements taken twice: %v", got)
	}

	// Read-your-writes: a write on the primary, its LSN, WAIT FOR LSN,
	// then the mirror has it.
	if got := writeThenRead(t, ctx, m, 5000, "fresh"); got != "fresh" {
		t.Errorf("after WAIT FOR LSN: %q, want fresh", got)
	}
}

// TestHostile_AnalyticsPort: a tenant logs in only as itself, to its own
// mirror; it cannot reach another tenant's mirror, any file, an extension,
// the configuration, or write.
func TestHostile_AnalyticsPort(t *testing.T) {
	ctx := context.Background()
	cfg := testConfig(t)
	cfg.Analytics.StatementTimeout = config.Duration(2 * time.Second)
	_, c := daemontest.Start(t, pg, cfg)
	template(t, c)
	a := mirroredTenant(t, c, "database")
	b := mirroredTenant(t, c, "schema")

	refused := func(what, dsn, password string) {
		t.Helper()
		conn, err := analyticsConn(t, dsn, password, pgx.QueryExecModeSimpleProtocol)
		if err == nil {
			conn.Close(ctx)
			t.Errorf("%s: logged in", what)
			return
		}
		var pgErr *pgconn.PgError
		if !errors.As(err, &pgErr) || pgErr.Code != "28P01" {
			t.Errorf("%s: %v, want 28P01", what, err)
		}
	}
	refused("B's role with A's password", b.dsn, a.r.Password)
	refused("A's role with a wrong password", a.dsn, a.r.Password+"x")
	refused("A's role to B's database", strings.Replace(a.dsn, "/"+"t_"+a.r.Tenant.ID, "/"+"t_"+b.r.Tenant.ID, 1), a.r.Password)
	refused("an admin role", strings.Replace(a.dsn, "t_"+a.r.Tenant.ID+"@", "postgres@", 1), a.r.Password)

	conn, err := analyticsConn(t, a.dsn, a.r.Password, pgx.QueryExecModeSimpleProtocol)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	bFile := cfg.Analytics.Dir + "/" + b.r.Tenant.ID + ".duckdb"
	for _, q := range []string{
		`SELECT * FROM read_csv('/etc/passwd')`,
		`SELECT * FROM read_text('/etc/hostname')`,
		`SELECT * FROM glob('/*')`,
		`SELECT * FROM read_text('` + bFile + `')`,
		`ATTACH '` + bFile + `' AS b`,
		`ATTACH ':memory:' AS m`,
		`COPY items TO '/tmp/pgtenant-leak.csv'`,
		`EXPORT DATABASE '/tmp/pgtenant-leak'`,
		`INSTALL httpfs`,
		`LOAD httpfs`,
		`SET enable_external_access = true`,
		`SET GLOBAL memory_limit = '100GB'`,
		`RESET memory_limit`,
		`PRAGMA threads = 64`,
		`CALL checkpoint()`,
		`DELETE FROM items`,
		`UPDATE items SET qty = 0`,
		`CREATE TABLE x (i int)`,
		`CREATE MACRO m(a) AS a`,
		`DROP TABLE items`,
		`SELECT 1; DELETE FROM items`,
		`SELECT sum(hash(i)) FROM range(1000000000000) t(i)`, // the statement timeout ends it
	} {
		rows, err := conn.Query(ctx, q)
		if err == nil {
			for rows.Next() {
			}
			err = rows.Err()
			rows.Close()
		}
		if err == nil {
			t.Errorf("%s: ran", q)
		}
	}
	// It still sees its own data, and only its own database.
	var n int
	if err := conn.QueryRow(ctx, `SELECT count(*) FROM items`).Scan(&n); err != nil || n != 300 {
		t.Errorf("its items after the attempts: %d %v", n, err)
	}
	var dbs string
	if err := conn.QueryRow(ctx, `SELECT string_agg(DISTINCT database_name, ',') FROM duckdb_tables()`).Scan(&dbs); err != nil {
		t.Fatal(err)
	}
	if strings.Contains(dbs, b.r.Tenant.ID) || !strings.Contains(dbs, a.r.Tenant.ID) {
		t.Errorf("databases seen: %s", dbs)
	}
	var mem string
	if err := conn.QueryRow(ctx, `SELECT current_setting('memory_limit')`).Scan(&mem); err != nil || mem == "" {
		t.Errorf("memory_limit: %q %v", mem, err)
	}
}

// writeThenRead inserts item id named name on the primary as the tenant,
// waits on the analytics port for the LSN after it (WAIT FOR LSN) and
// returns the item's name as the mirror has it ("" with the error logged).
func writeThenRead(t *testing.T, ctx context.Context, m mirrored, id int, name string) string {
	t.Helper()
	heap, err := pgx.Connect(ctx, m.r.DSN)
	if err != nil {
		t.Fatal(err)
	}
	defer heap.Close(ctx)
	var lsn string
	if _, err := heap.Exec(ctx, `INSERT INTO items VALUES ($1, 1, $2, NULL, NULL, NULL)`, id, name); err != nil {
		t.Fatal(err)
	}
	if err := heap.QueryRow(ctx, `SELECT pg_current_wal_lsn()::text`).Scan(&lsn); err != nil {
		t.Fatal(err)
	}
	conn, err := analyticsConn(t, m.dsn, m.r.Password, pgx.QueryExecModeSimpleProtocol)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	var applied, got string
	if err := conn.QueryRow(ctx, `WAIT FOR LSN '`+lsn+`'`).Scan(&applied); err != nil {
		t.Fatal(err)
	}
	if err := conn.QueryRow(ctx, `SELECT name FROM items WHERE id = $1`, id).Scan(&got); err != nil {
		t.Logf("read item %d after WAIT FOR LSN %s (applied %s): %v", id, lsn, applied, err)
	}
	return got
}
