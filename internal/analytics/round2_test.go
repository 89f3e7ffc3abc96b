package analytics_test

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	_ "github.com/duckdb/duckdb-go/v2"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgproto3"

	"github.com/pgtenant/pgtenant/internal/analytics"
	"github.com/pgtenant/pgtenant/internal/daemon/daemontest"
)

// Issue 23, second round of hostile tenants: the analytics port.

// batch sends msgs then Sync on a logged-in session and reads until
// ReadyForQuery: how many ParseComplete and BindComplete came, and the
// SQLSTATE of the first error ("" without one).
func batch(t *testing.T, conn *pgx.Conn, msgs ...pgproto3.FrontendMessage) (parsed, bound int, code string) {
	t.Helper()
	fe := conn.PgConn().Frontend()
	for _, m := range msgs {
		fe.Send(m)
	}
	fe.Send(&pgproto3.Sync{})
	if err := fe.Flush(); err != nil {
		t.Fatal(err)
	}
	for {
		msg, err := fe.Receive()
		if err != nil {
			t.Fatalf("after %d parsed, %d bound: %v", parsed, bound, err)
		}
		switch msg := msg.(type) {
		case *pgproto3.ParseComplete:
			parsed++
		case *pgproto3.BindComplete:
			bound++
		case *pgproto3.ErrorResponse:
			if code == "" {
				code = msg.Code
			}
		case *pgproto3.ReadyForQuery:
			return parsed, bound, code
		}
	}
}

// sqlstate is err's SQLSTATE ("" for none).
func sqlstate(err error) string {
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) {
		return pgErr.Code
	}
	return ""
}

// metric reads one sample of the daemon's /metrics (-1 without it).
func metric(t *testing.T, url, sample string) float64 {
	t.Helper()
	resp, err := http.Get(url + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	m := regexp.MustCompile(`(?m)^` + regexp.QuoteMeta(sample) + ` (\S+)$`).FindSubmatch(body)
	if m == nil {
		return -1
	}
	v, _ := strconv.ParseFloat(string(m[1]), 64)
	return v
}

// TestR2Finding2_AnalyticsPortRefusesRatherThanGrows: a session keeps at
// most 1,000 named statements, 100 named portals and 16 MB of their text
// and parameters, reads messages of up to 1 MiB, and a tenant has at most
// its connection limit of analytics sessions; each refusal is an error to
// the tenant and a count in /metrics, and the port goes on serving.
func TestR2Finding2_AnalyticsPortRefusesRatherThanGrows(t *testing.T) {
	ctx := context.Background()
	d, c := daemontest.Start(t, pg, testConfig(t))
	template(t, c)
	m := mirroredTenant(t, c, "schema")
	var sessions []*pgx.Conn
	login := func() *pgx.Conn {
		t.Helper()
		for i := 0; ; i++ {
			conn, err := analyticsConn(t, m.dsn, m.r.Password, pgx.QueryExecModeSimpleProtocol)
			if sqlstate(err) == "53300" && i < 50 { // a session closed just before is not uncounted yet
				time.Sleep(20 * time.Millisecond)
				continue
			}
			if err != nil {
				t.Fatal(err)
			}
			sessions = append(sessions, conn)
			return conn
		}
	}
	t.Cleanup(func() {
		for _, conn := range sessions {
			conn.Close(ctx)
		}
	})

	// Statements: the 1,001st is refused.
	conn := login()
	var parses []pgproto3.FrontendMessage
	for i := range 1001 {
		parses = append(parses, &pgproto3.Parse{Name: fmt.Sprintf("s%d", i), Query: "SELECT 1"})
	}
	if parsed, _, code := batch(t, conn, parses...); parsed != 1000 || code != "54000" {
		t.Errorf("1,001 statements: %d parsed, error %q; want 1000 and 54000", parsed, code)
	}
	// Closing one makes room for one.
	if parsed, _, code := batch(t, conn, &pgproto3.Close{ObjectType: 'S', Name: "s0"}, &pgproto3.Parse{Name: "again", Query: "SELECT 1"}); parsed != 1 || code != "" {
		t.Errorf("after a Close: %d parsed, error %q", parsed, code)
	}

	// What a session holds: 1 MB statements, the 17th is refused.
	conn = login()
	big := "SELECT 1 -- " + strings.Repeat("x", 1<<20-100)
	parses = nil
	for i := range 20 {
		parses = append(parses, &pgproto3.Parse{Name: fmt.Sprintf("b%d", i), Query: big})
	}
	if parsed, _, code := batch(t, conn, parses...); parsed != 16 || code != "54000" {
		t.Errorf("20 statements of 1 MB: %d parsed, error %q; want 16 and 54000", parsed, code)
	}

	// Portals: the 101st is refused.
	conn = login()
	msgs := []pgproto3.FrontendMessage{&pgproto3.Parse{Name: "p", Query: "SELECT 1"}}
	for i := range 101 {
		msgs = append(msgs, &pgproto3.Bind{DestinationPortal: fmt.Sprintf("p%d", i), PreparedStatement: "p"})
	}
	if _, bound, code := batch(t, conn, msgs...); bound != 100 || code != "54000" {
		t.Errorf("101 portals: %d bound, error %q; want 100 and 54000", bound, code)
	}

	// A message over 1 MiB ends the session with an error.
	conn = login()
	fe := conn.PgConn().Frontend()
	fe.Send(&pgproto3.Parse{Name: "huge", Query: "SELECT 1 -- " + strings.Repeat("x", 1<<20+1000)})
	fe.Send(&pgproto3.Sync{})
	if err := fe.Flush(); err != nil {
		t.Fatal(err)
	}
	if msg, err := fe.Receive(); err != nil {
		t.Errorf("a message over 1 MiB: %v, want an error response", err)
	} else if e, ok := msg.(*pgproto3.ErrorResponse); !ok || e.Code != "54000" || e.Severity != "FATAL" {
		t.Errorf("a message over 1 MiB: %#v, want FATAL 54000", msg)
	}

	// Sessions: the tier's connection limit (default: 10) holds on the
	// analytics port; a session that ends makes room.
	for _, conn := range sessions {
		conn.Close(ctx)
	}
	sessions = nil
	for range 10 {
		login()
	}
	_, err := analyticsConn(t, m.dsn, m.r.Password, pgx.QueryExecModeSimpleProtocol)
	if got := sqlstate(err); got != "53300" {
		t.Errorf("the 11th session: %v, want 53300", err)
	}
	sessions[0].Close(ctx)
	again := login()
	var n int
	if err := again.QueryRow(ctx, `SELECT count(*) FROM items`).Scan(&n); err != nil || n != 300 {
		t.Errorf("a query after the refusals: %d %v", n, err)
	}

	for _, reason := range []string{"statements", "session_memory", "portals", "message_size", "sessions"} {
		if got := metric(t, d.URL(), `pgtenant_analytics_refusals_total{reason="`+reason+`"}`); got < 1 {
			t.Errorf("pgtenant_analytics_refusals_total{reason=%q} = %v, want ≥ 1", reason, got)
		}
	}
}

// TestR2Finding4_LifecycleEndsAnalyticsSessions: a password rotation, a
// suspend and a drop end the tenant's open analytics sessions, idle or
// not, as they end its other sessions; a rotation with --keep-sessions
// keeps them; a dropped tenant's mirror is no longer streaming.
func TestR2Finding4_LifecycleEndsAnalyticsSessions(t *testing.T) {
	ctx := context.Background()
	_, c := daemontest.Start(t, pg, testConfig(t))
	template(t, c)
	m := mirroredTenant(t, c, "database")
	id := m.r.Tenant.ID
	password := m.r.Password
	open := func() (idle, busy *pgx.Conn) {
		t.Helper()
		var err error
		if idle, err = analyticsConn(t, m.dsn, password, pgx.QueryExecModeSimpleProtocol); err != nil {
			t.Fatal(err)
		}
		if busy, err = analyticsConn(t, m.dsn, password, pgx.QueryExecModeCacheStatement); err != nil {
			t.Fatal(err)
		}
		var n int
		if err := busy.QueryRow(ctx, `SELECT count(*) FROM items`).Scan(&n); err != nil || n != 300 {
			t.Fatalf("before: %d %v", n, err)
		}
		return idle, busy
	}
	// ended: the idle session is told (it sends nothing) and the busy one's
	// next query fails, both 57P01.
	ended := func(what string, idle, busy *pgx.Conn) {
		t.Helper()
		rctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		defer cancel()
		if _, err := idle.PgConn().ReceiveMessage(rctx); sqlstate(err) != "57P01" {
			t.Errorf("%s: the idle session: %v, want 57P01", what, err)
		}
		var n int
		err := busy.QueryRow(ctx, `SELECT count(*) FROM items`).Scan(&n)
		if err == nil {
			t.Errorf("%s: the session still answers", what)
		} else if code := sqlstate(err); code != "57P01" && !busy.IsClosed() {
			t.Errorf("%s: %v, want 57P01", what, err)
		}
		idle.Close(ctx)
		busy.Close(ctx)
	}

	idle, busy := open()
	r, err := c.RotatePassword(ctx, id, false)
	if err != nil {
		t.Fatal(err)
	}
	ended("password rotation", idle, busy)
	password = r.Password

	// --keep-sessions keeps them, as it keeps the heap's.
	idle, busy = open()
	if r, err = c.RotatePassword(ctx, id, true); err != nil {
		t.Fatal(err)
	}
	time.Sleep(time.Second) // several sweeps
	var n int
	if err := busy.QueryRow(ctx, `SELECT count(*) FROM items`).Scan(&n); err != nil || n != 300 {
		t.Errorf("after a rotation keeping sessions: %d %v", n, err)
	}
	if err := idle.QueryRow(ctx, `SELECT count(*) FROM items`).Scan(&n); err != nil || n != 300 {
		t.Errorf("after a rotation keeping sessions, the idle session: %d %v", n, err)
	}
	idle.Close(ctx)
	busy.Close(ctx)
	password = r.Password

	idle, busy = open()
	if _, err := c.TenantAction(ctx, id, "suspend"); err != nil {
		t.Fatal(err)
	}
	ended("suspend", idle, busy)
	if _, err := analyticsConn(t, m.dsn, password, pgx.QueryExecModeSimpleProtocol); sqlstate(err) != "28P01" {
		t.Errorf("login while suspended: %v, want 28P01", err)
	}
	if _, err := c.TenantAction(ctx, id, "resume"); err != nil {
		t.Fatal(err)
	}

	idle, busy = open()
	if _, err := c.DropTenant(ctx, id, false); err != nil {
		t.Fatal(err)
	}
	ended("drop", idle, busy)
	var st analytics.Status
	for i := 0; ; i++ {
		if st, err = c.AnalyticsStatus(ctx, id); err != nil {
			t.Fatal(err)
		}
		if !st.Enabled {
			break
		}
		if st.State == analytics.StateStreaming || i == 100 {
			t.Fatalf("analytics status of a dropped tenant: %+v", st)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// TestR2Finding5_MirrorReadOnlyByConstruction: EXPLAIN ANALYZE of anything
// but a SELECT, a text of several statements, and the functions that act
// on the whole database are refused; nothing a statement does stays on
// a connection for the next one; the mirror's file and state are as the
// apply left them, and the apply goes on.
func TestR2Finding5_MirrorReadOnlyByConstruction(t *testing.T) {
	ctx := context.Background()
	cfg := testConfig(t)
	_, c := daemontest.Start(t, pg, cfg)
	template(t, c)
	m := mirroredTenant(t, c, "database")
	for _, mode := range []pgx.QueryExecMode{pgx.QueryExecModeSimpleProtocol, pgx.QueryExecModeExec} {
		conn, err := analyticsConn(t, m.dsn, m.r.Password, mode)
		if err != nil {
			t.Fatal(err)
		}
		var lsn uint64
		if err := conn.QueryRow(ctx, `SELECT lsn FROM _pgtenant_mirror.state`).Scan(&lsn); err != nil {
			t.Fatal(err)
		}
		for _, q := range []string{
			`EXPLAIN ANALYZE UPDATE _pgtenant_mirror.state SET lsn = 0`,
			`EXPLAIN ANALYZE DELETE FROM items`,
			`EXPLAIN ANALYZE INSERT INTO items (id) VALUES (-1)`,
			`EXPLAIN ANALYZE CREATE TABLE grown AS SELECT range AS i FROM range(1000000)`,
			`EXPLAIN ANALYZE CREATE TEMP TABLE grown AS SELECT 1`,
			`EXPLAIN ANALYZE CREATE MACRO m(a) AS a`,
			`EXPLAIN ANALYZE CREATE SEQUENCE s`,
			`EXPLAIN ANALYZE CHECKPOINT`,
			`EXPLAIN ANALYZE BEGIN`,
			`EXPLAIN ANALYZE COMMIT`,
			`EXPLAIN ANALYZE SET VARIABLE x = 1`,
			`EXPLAIN ANALYZE SET search_path = 'temp'`,
			`EXPLAIN ANALYZE PRAGMA threads = 4`,
			`EXPLAIN /* c */ analyse (FORMAT json) UPDATE items SET qty = 0`,
			`EXPLAIN (ANALYZE) UPDATE items SET qty = 0`,
			`explain analyze
			-- a comment
			DELETE FROM items`,
			`UPDATE items SET qty = 0; SELECT 1`,
			`COMMIT; UPDATE items SET qty = 0; SELECT 1`,
			`SET VARIABLE x = 1; SELECT 1`,
			`CREATE TEMP MACRO m(a) AS a; SELECT 1`,
			`SELECT 1; SELECT 2`,
			`SELECT * FROM checkpoint()`,
			`SELECT * FROM force_checkpoint()`,
			`SELECT * FROM "Checkpoint"()`,
			`SELECT * FROM query('SELECT 1')`,
			`SELECT nextval('s')`,
			`BEGIN`,
			`USE temp`,
			`ATTACH ':memory:' AS m`,
			`DETACH main`,
			`SET search_path = 'temp'`,
			`PRAGMA threads = 4`,
			`CALL checkpoint()`,
			`INSTALL httpfs`,
			`LOAD httpfs`,
			`COPY items TO '/tmp/pgtenant-r2-leak.csv'`,
			`EXPORT DATABASE '/tmp/pgtenant-r2-leak'`,
			`PIVOT items ON qty USING count(*)`,
		} {
			rows, err := conn.Query(ctx, q)
			if err == nil {
				for rows.Next() {
				}
				err = rows.Err()
				rows.Close()
			}
			if err == nil {
				t.Errorf("%v: %s: ran", mode, q)
			}
		}
		// Nothing stayed: no table, macro or variable, the same search
		// path, no transaction left open or aborted.
		var n, tables, macros int
		var variable *int64
		var schemaName string
		err = conn.QueryRow(ctx, `SELECT (SELECT count(*) FROM items), (SELECT count(*) FROM duckdb_tables() WHERE table_name = 'grown'),
			(SELECT count(*) FROM duckdb_functions() WHERE function_name = 'm'), getvariable('x'), current_schema()`).Scan(&n, &tables, &macros, &variable, &schemaName)
		if err != nil {
			t.Fatalf("%v: after the attempts: %v", mode, err)
		}
		if n != 300 || tables != 0 || macros != 0 || variable != nil || schemaName != "main" {
			t.Errorf("%v: after the attempts: %d items, %d tables grown, %d macros m, variable x %v, schema %s", mode, n, tables, macros, variable, schemaName)
		}
		var after uint64
		if err := conn.QueryRow(ctx, `SELECT lsn FROM _pgtenant_mirror.state`).Scan(&after); err != nil || after < lsn {
			t.Errorf("%v: the mirror's LSN went from %d to %d (%v)", mode, lsn, after, err)
		}
		// A SELECT, its EXPLAIN and its EXPLAIN ANALYZE run.
		for _, q := range []string{`SELECT count(*) FROM items`, `EXPLAIN SELECT count(*) FROM items`, `EXPLAIN ANALYZE SELECT count(*) FROM items`,
			`WITH x AS (SELECT qty FROM items) SELECT max(qty) FROM x`, `FROM items SELECT count(*)`} {
			rows, err := conn.Query(ctx, q)
			if err == nil {
				for rows.Next() {
				}
				err = rows.Err()
				rows.Close()
			}
			if err != nil {
				t.Errorf("%v: %s: %v", mode, q, err)
			}
		}
		conn.Close(ctx)
	}
	// The file did not grow by a copy of a million rows.
	if fi, err := os.Stat(filepath.Join(cfg.Analytics.Dir, m.r.Tenant.ID+".duckdb")); err != nil || fi.Size() > 8<<20 {
		t.Errorf("the mirror's file: %v %v", fi.Size(), err)
	}
	// The apply goes on.
	if got := writeThenRead(t, ctx, m, 7000, "after"); got != "after" {
		t.Errorf("the apply after the attempts: %q", got)
	}
}

// TestR2_AnalyticsHidesDaemonPaths: nothing a tenant can read on the
// analytics port names the daemon's analytics directory or its home
// directory: DuckDB's catalog functions and views, and every setting.
func TestR2_AnalyticsHidesDaemonPaths(t *testing.T) {
	ctx := context.Background()
	cfg := testConfig(t)
	_, c := daemontest.Start(t, pg, cfg)
	template(t, c)
	m := mirroredTenant(t, c, "schema")
	dir, err := filepath.Abs(cfg.Analytics.Dir)
	if err != nil {
		t.Fatal(err)
	}
	secrets := []string{filepath.Dir(dir)} // the test's own directory, which holds the analytics one
	if home, err := os.UserHomeDir(); err == nil && len(home) > 1 {
		secrets = append(secrets, home)
	}
	conn, err := analyticsConn(t, m.dsn, m.r.Password, pgx.QueryExecModeSimpleProtocol)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	// seen is everything a query shows: its rows or its error.
	seen := func(q string) string {
		rows, err := conn.Query(ctx, q)
		if err != nil {
			return err.Error()
		}
		defer rows.Close()
		var b strings.Builder
		for rows.Next() {
			vals, err := rows.Values()
			if err != nil {
				return err.Error()
			}
			fmt.Fprintln(&b, vals...)
		}
		if err := rows.Err(); err != nil {
			b.WriteString(err.Error())
		}
		return b.String()
	}
	queries := []string{
		`SELECT * FROM duckdb_databases()`, `SELECT * FROM duckdb_databases`, `SELECT * FROM "DuckDB_Databases"()`,
		`SELECT * FROM system.main.duckdb_settings()`, `SELECT * FROM duckdb_settings()`, `SELECT * FROM pg_catalog.pg_settings`,
		`SELECT * FROM pragma_database_list`, `SELECT * FROM duckdb_temporary_files()`, `SELECT * FROM duckdb_extensions()`,
		`SELECT * FROM duckdb_secrets()`, `SELECT * FROM query('SELECT * FROM duckdb_settings()')`,
		`SELECT current_setting('home_directory'), current_setting('temp_directory')`, `SELECT current_setting('TEMP_DIRECTORY')`,
		`SELECT current_setting('allowed_paths')`, `SELECT current_setting('allowed_directories')`, `SELECT getenv('HOME')`,
		`SELECT * FROM read_text('nothing')`, `LOAD httpfs`,
	}
	// Every view and every table function DuckDB has that takes no
	// argument, as the tenant sees them listed.
	rows, err := conn.Query(ctx, `SELECT 'SELECT * FROM ' || schema_name || '.' || view_name FROM duckdb_views() WHERE internal
		UNION ALL SELECT DISTINCT 'SELECT * FROM ' || function_name || '()' FROM duckdb_functions() WHERE function_type = 'table' AND len(parameters) = 0`)
	if err != nil {
		t.Fatal(err)
	}
	listed, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil || len(listed) < 20 {
		t.Fatalf("views and table functions: %d %v", len(listed), err)
	}
	queries = append(queries, listed...)
	// Every setting, named as DuckDB names them.
	local, err := sql.Open("duckdb", "")
	if err != nil {
		t.Fatal(err)
	}
	defer local.Close()
	srows, err := local.Query(`SELECT name FROM duckdb_settings()`)
	if err != nil {
		t.Fatal(err)
	}
	for srows.Next() {
		var name string
		if err := srows.Scan(&name); err != nil {
			t.Fatal(err)
		}
		queries = append(queries, `SELECT current_setting('`+name+`')`)
	}
	srows.Close()
	for _, q := range queries {
		got := seen(q)
		for _, s := range secrets {
			if strings.Contains(got, s) {
				t.Errorf("%s shows %s: %.300s", q, s, got)
			}
		}
	}
	// Its own tables and settings it still sees.
	var tables int
	var mem string
	if err := conn.QueryRow(ctx, `SELECT count(*), current_setting('memory_limit') FROM duckdb_tables() WHERE table_name = 'items'`).Scan(&tables, &mem); err != nil || tables != 1 || mem == "" {
		t.Errorf("its tables and memory_limit: %d %q %v", tables, mem, err)
	}
}
