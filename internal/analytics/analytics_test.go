package analytics_test

import (
	"context"
	"database/sql"
	"errors"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pgtenant/pgtenant/internal/analytics"
	"github.com/pgtenant/pgtenant/internal/api"
	"github.com/pgtenant/pgtenant/internal/catalog"
	"github.com/pgtenant/pgtenant/internal/config"
	"github.com/pgtenant/pgtenant/internal/daemon"
	"github.com/pgtenant/pgtenant/internal/daemon/daemontest"
	"github.com/pgtenant/pgtenant/internal/jobs"
	"github.com/pgtenant/pgtenant/internal/pgtest"
	"github.com/pgtenant/pgtenant/internal/provision"
	"github.com/pgtenant/pgtenant/internal/reconcile"
	"github.com/pgtenant/pgtenant/internal/templates"
	"github.com/pgtenant/pgtenant/internal/tenant"
)

var pg *pgtest.Cluster

func TestMain(m *testing.M) {
	if spec := os.Getenv(childEnv); spec != "" {
		os.Exit(runChild(spec))
	}
	pgtest.Main(m, pgtest.Options{}, &pg)
}

// config is a daemon's configuration with quick analytics timings and
// its files in dir.
func testConfig(t *testing.T) config.Config {
	cfg := daemontest.Config(t, pg)
	cfg.Analytics.Dir = filepath.Join(t.TempDir(), "analytics")
	cfg.Analytics.Listen = "127.0.0.1:0"
	cfg.Analytics.PollInterval = config.Duration(100 * time.Millisecond)
	cfg.Analytics.Lease = config.Duration(2 * time.Second)
	cfg.Analytics.FlushInterval = config.Duration(50 * time.Millisecond)
	return cfg
}

const schema = `CREATE TABLE items (id bigint PRIMARY KEY, qty int, name text, at timestamp, price numeric(10,2), big text);`

func template(t *testing.T, c *api.Client) {
	t.Helper()
	ctx := context.Background()
	added, err := c.CreateTemplate(ctx, "an", []templates.Upload{{Name: "0001_init.sql", Body: schema}})
	if err != nil {
		t.Fatal(err)
	}
	if j, err := c.WaitJob(ctx, added.BuildJobs[0].ID, nil); err != nil || j.State != jobs.Succeeded {
		t.Fatalf("build: %v %s", err, j.LastError)
	}
}

// exec runs statements as the tenant.
func exec(t *testing.T, dsn string, sqls ...string) {
	t.Helper()
	ctx := context.Background()
	conn, err := pgx.Connect(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	for _, q := range sqls {
		if _, err := conn.Exec(ctx, q); err != nil {
			t.Fatalf("%s: %v", q, err)
		}
	}
}

// digest is every row of a table, every column as text (NULL apart from
// ”), in key order (rows of equal keys by their text): the same
// expression on the heap and on the mirror. The first column is the key.
func digest(cols string) string {
	key, _, _ := strings.Cut(cols, ",")
	var vals []string
	for _, c := range strings.Split(cols, ",") {
		vals = append(vals, "coalesce(("+strings.TrimSpace(c)+")::text, '<NULL>')")
	}
	row := "concat_ws('|', " + strings.Join(vals, ", ") + ")"
	return `SELECT count(*)::text || ':' || coalesce(string_agg(` + row + `, chr(10) ORDER BY ` + key + `, ` + row + `), '') FROM `
}

// waitSame waits until the mirror's table holds what the heap's does.
func waitSame(t *testing.T, d *daemon.Daemon, tenantDSN, id, table, cols string) {
	t.Helper()
	ctx := context.Background()
	conn, err := pgx.Connect(ctx, tenantDSN)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	var heap, mirror string
	if err := conn.QueryRow(ctx, digest(cols)+table).Scan(&heap); err != nil {
		t.Fatal(err)
	}
	var last error
	for range 600 {
		last = d.Analytics().WithMirror(id, func(db *sql.DB) error {
			return db.QueryRow(digest(cols) + table).Scan(&mirror)
		})
		if last == nil && mirror == heap {
			return
		}
		time.Sleep(100 * time.Millisecond)
	}
	st, _ := d.Analytics().Status(ctx, catalog.Tenant{ID: id})
	t.Fatalf("mirror of %s never matched the heap (last error %v; status %+v)\nheap:   %.400s\nmirror: %.400s", table, last, st, heap, mirror)
}

const itemCols = `id, qty, name, "at", price, big`

func TestMirror_ChangesReachTheMirror(t *testing.T) {
	for _, mode := range []string{"database", "schema"} {
		t.Run(mode, func(t *testing.T) { testChanges(t, mode) })
	}
}

func testChanges(t *testing.T, mode string) {
	ctx := context.Background()
	cfg := testConfig(t)
	d, c := daemontest.Start(t, pg, cfg)
	template(t, c)
	r, err := c.CreateTenant(ctx, provision.Request{Template: "an", Mode: tenant.Mode(mode)})
	if err != nil {
		t.Fatal(err)
	}
	id, dsn := r.Tenant.ID, r.DSN
	exec(t, dsn, `INSERT INTO items SELECT i, i % 7, 'n' || i, timestamp '2024-01-01' + i * interval '1 minute', i / 3.0, NULL FROM generate_series(1, 500) i`,
		// Values COPY escapes (tab, newline, backslash, a text that reads \N).
		`INSERT INTO items VALUES (501, NULL, E'tab\there\nnew line', NULL, NULL, E'back\\slash'), (502, 1, E'\\N', NULL, NULL, '')`)

	st, err := c.EnableAnalytics(ctx, id, nil)
	if err != nil || !st.Enabled {
		t.Fatalf("enable: %+v %v", st, err)
	}
	waitSame(t, d, dsn, id, "items", itemCols)

	// Insert, update (a key too, and a large TOASTed value left unchanged
	// by a later update), delete, a new column, a new table, truncate.
	exec(t, dsn,
		`INSERT INTO items SELECT i, i % 5, 'late' || i, NULL, NULL, NULL FROM generate_series(503, 700) i`,
		`UPDATE items SET qty = qty + 100, name = name || '!' WHERE id % 3 = 0`,
		`UPDATE items SET id = id + 10000 WHERE id BETWEEN 10 AND 20`,
		`UPDATE items SET big = repeat(md5(id::text), 200) WHERE id = 42`,
		`UPDATE items SET qty = -1 WHERE id = 42`,
		`DELETE FROM items WHERE id % 11 = 0`,
		`BEGIN; INSERT INTO items VALUES (900000, 1, 'gone', NULL, NULL, NULL); DELETE FROM items WHERE id = 900000; COMMIT`,
		`ALTER TABLE items ADD COLUMN note text`,
		`UPDATE items SET note = 'noted ' || id WHERE id < 50`,
		`CREATE TABLE extra (k int PRIMARY KEY, v text)`,
		`INSERT INTO extra SELECT i, 'v' || i FROM generate_series(1, 30) i`)
	waitSame(t, d, dsn, id, "items", itemCols+", note")
	waitSame(t, d, dsn, id, "extra", "k, v")
	exec(t, dsn, `TRUNCATE extra`, `INSERT INTO extra VALUES (7, 'after truncate')`)
	waitSame(t, d, dsn, id, "extra", "k, v")

	// Disable: no slot, no publication, no file.
	if _, err := c.DisableAnalytics(ctx, id); err != nil {
		t.Fatal(err)
	}
	for i := 0; ; i++ {
		st, err := c.AnalyticsStatus(ctx, id)
		if err != nil {
			t.Fatal(err)
		}
		if !st.Enabled {
			break
		}
		if i == 300 {
			t.Fatalf("disable did not end: %+v", st)
		}
		time.Sleep(100 * time.Millisecond)
	}
	assertGone(t, cfg, r.Tenant.Database, id)
}

// assertGone checks that nothing of a tenant's mirror is left.
func assertGone(t *testing.T, cfg config.Config, database, id string) {
	t.Helper()
	ctx := context.Background()
	admin := pg.Conn(t, "postgres")
	var slots int
	if err := admin.QueryRow(ctx, `SELECT count(*) FROM pg_replication_slots WHERE slot_name = $1`, analytics.SlotName(id)).Scan(&slots); err != nil {
		t.Fatal(err)
	}
	if slots != 0 {
		t.Errorf("slot %s left", analytics.SlotName(id))
	}
	if conn, err := pgx.Connect(ctx, pg.PrimaryDSN(database)); err == nil {
		var pubs int
		if err := conn.QueryRow(ctx, `SELECT count(*) FROM pg_publication WHERE pubname = $1`, analytics.SlotName(id)).Scan(&pubs); err != nil {
			t.Fatal(err)
		}
		conn.Close(ctx)
		if pubs != 0 {
			t.Errorf("publication %s left", analytics.SlotName(id))
		}
	}
	if _, err := os.Stat(filepath.Join(cfg.Analytics.Dir, id+".duckdb")); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("mirror file left: %v", err)
	}
}

// A daemon stopped while the tenant writes, and another started on the
// same catalog and files, resumes from the file's LSN: no row lost, none
// twice (the digest counts rows).
func TestMirror_RestartResumes(t *testing.T) {
	ctx := context.Background()
	cfg := testConfig(t)
	c, stop, id, dsn := stoppableWithTenant(t, cfg)
	if _, err := c.EnableAnalytics(ctx, id, nil); err != nil {
		t.Fatal(err)
	}
	waitStreaming(t, c, id)
	// Writes while the daemon runs, then while it is stopped.
	done := make(chan struct{})
	go func() {
		defer close(done)
		for i := range 40 {
			exec(t, dsn, `INSERT INTO items SELECT g, 1, 'r', NULL, NULL, NULL FROM generate_series(`+strconv.Itoa(i*100+1)+`, `+strconv.Itoa(i*100+100)+`) g`,
				`UPDATE items SET qty = qty + 1 WHERE id % 2 = 0`)
		}
	}()
	time.Sleep(300 * time.Millisecond)
	stop()
	<-done
	exec(t, dsn, `DELETE FROM items WHERE id % 5 = 0`)
	d, _ := daemontest.Start(t, pg, cfg)
	waitSame(t, d, dsn, id, "items", itemCols)
}

// waitStreaming waits until the tenant's mirror has its copy and streams.
func waitStreaming(t *testing.T, c *api.Client, id string) analytics.Status {
	t.Helper()
	for i := 0; ; i++ {
		st, err := c.AnalyticsStatus(context.Background(), id)
		if err != nil {
			t.Fatal(err)
		}
		if st.State == analytics.StateStreaming {
			return st
		}
		if i == 600 {
			t.Fatalf("never streaming: %+v", st)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// A purged tenant leaves no slot, publication or file (both modes: the
// database is dropped; the schema tenant's publication lives in the
// shared database, which stays).
func TestMirror_PurgeDropsIt(t *testing.T) {
	ctx := context.Background()
	cfg := testConfig(t)
	_, c := daemontest.Start(t, pg, cfg)
	template(t, c)
	for _, mode := range []string{"database", "schema"} {
		r, err := c.CreateTenant(ctx, provision.Request{Template: "an", Mode: tenant.Mode(mode)})
		if err != nil {
			t.Fatal(err)
		}
		if _, err := c.EnableAnalytics(ctx, r.Tenant.ID, nil); err != nil {
			t.Fatal(err)
		}
		waitStreaming(t, c, r.Tenant.ID)
		resp, err := c.DropTenant(ctx, r.Tenant.ID, true)
		if err != nil || resp.Job == nil {
			t.Fatalf("drop: %+v %v", resp, err)
		}
		if j, err := c.WaitJob(ctx, resp.Job.ID, nil); err != nil || j.State != jobs.Succeeded {
			t.Fatalf("%s purge: %v %s", mode, err, j.LastError)
		}
		assertGone(t, cfg, r.Tenant.Database, r.Tenant.ID)
	}
}

// reconcile reports an analytics slot without a mirror in the catalog,
// and fix drops it.
func TestReconcile_OrphanSlot(t *testing.T) {
	ctx := context.Background()
	cfg := testConfig(t)
	_, c := daemontest.Start(t, pg, cfg)
	slot := analytics.SlotName("aaaaaaaaaaaa")
	admin := pg.Conn(t, "postgres")
	if _, err := admin.Exec(ctx, `SELECT pg_create_logical_replication_slot($1, 'pgoutput')`, slot); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_, _ = admin.Exec(context.Background(), `SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots WHERE slot_name = $1`, slot)
	})
	for _, fix := range []bool{false, true} {
		rep, err := c.Reconcile(ctx, api.ReconcileRequest{Cluster: "local", Fix: fix})
		if err != nil {
			t.Fatal(err)
		}
		var found *reconcile.Finding
		for i, f := range rep.Findings {
			if f.Object == "replication slot "+slot {
				found = &rep.Findings[i]
			}
		}
		if found == nil || found.Kind != reconcile.Orphan || found.Fixed != fix {
			t.Fatalf("fix=%v: finding %+v in %+v", fix, found, rep.Findings)
		}
	}
	var n int
	if err := admin.QueryRow(ctx, `SELECT count(*) FROM pg_replication_slots WHERE slot_name = $1`, slot).Scan(&n); err != nil || n != 0 {
		t.Errorf("the orphan slot is still there after reconcile --fix: %d %v", n, err)
	}
}

// A slot invalidated by max_slot_wal_keep_size (its mirror's daemon was
// down while the primary wrote more WAL than that) is dropped and the
// mirror copied again, with an event: the mirror matches the heap after.
func TestMirror_InvalidatedSlotIsRecovered(t *testing.T) {
	ctx := context.Background()
	cfg := testConfig(t)
	c, stop, id, dsn := stoppableWithTenant(t, cfg)
	exec(t, dsn, `INSERT INTO items SELECT i, 1, 'a', NULL, NULL, NULL FROM generate_series(1, 100) i`)
	if _, err := c.EnableAnalytics(ctx, id, nil); err != nil {
		t.Fatal(err)
	}
	waitStreaming(t, c, id)
	stop()

	admin := pg.Conn(t, "postgres")
	t.Cleanup(func() {
		_, _ = admin.Exec(context.Background(), `ALTER SYSTEM RESET max_slot_wal_keep_size`)
		_, _ = admin.Exec(context.Background(), `SELECT pg_reload_conf()`)
	})
	exec(t, dsn, `INSERT INTO items SELECT i, 2, 'while down', NULL, NULL, NULL FROM generate_series(101, 200) i`)
	for _, q := range []string{`ALTER SYSTEM SET max_slot_wal_keep_size = '1MB'`, `SELECT pg_reload_conf()`,
		`CREATE TABLE wal_burn AS SELECT repeat(md5(i::text), 30) AS x FROM generate_series(1, 60000) i`, `DROP TABLE wal_burn`,
		`SELECT pg_switch_wal()`, `CHECKPOINT`, `SELECT pg_switch_wal()`, `CHECKPOINT`} {
		if _, err := admin.Exec(ctx, q); err != nil {
			t.Fatalf("%s: %v", q, err)
		}
	}
	var status string
	if err := admin.QueryRow(ctx, `SELECT wal_status FROM pg_replication_slots WHERE slot_name = $1`, analytics.SlotName(id)).Scan(&status); err != nil || status != "lost" {
		t.Fatalf("slot not invalidated: %q %v", status, err)
	}
	d, c := daemontest.Start(t, pg, cfg)
	waitSame(t, d, dsn, id, "items", itemCols)
	wantEvent(t, c, id, "copying again")
}

// wantEvent checks that a tenant's history has an analytics event whose
// detail says what.
func wantEvent(t *testing.T, c *api.Client, id, what string) {
	t.Helper()
	tv, err := c.Tenant(pgtest.Context(t), id)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range tv.Events {
		if e.Kind == "analytics" && strings.Contains(string(e.Detail), what) {
			return
		}
	}
	t.Errorf("no analytics event saying %q in %+v", what, tv.Events)
}

// stoppableWithTenant starts a daemon the test may stop, with the "an"
// template and a database tenant of it: the daemon's client, its stop, the
// tenant's id and DSN.
func stoppableWithTenant(t *testing.T, cfg config.Config) (*api.Client, func(), string, string) {
	t.Helper()
	c, stop := daemontest.StartCancellable(t, pg, cfg)
	template(t, c)
	r, err := c.CreateTenant(pgtest.Context(t), provision.Request{Template: "an", Mode: "database"})
	if err != nil {
		t.Fatal(err)
	}
	return c, stop, r.Tenant.ID, r.DSN
}
