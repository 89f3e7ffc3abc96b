package analytics_test

import (
	"context"
	"database/sql"
	"strings"
	"testing"

	"github.com/pgtenant/pgtenant/internal/daemon"
	"github.com/pgtenant/pgtenant/internal/daemon/daemontest"
	"github.com/pgtenant/pgtenant/internal/provision"
)

// Changes of a table's definition beyond a new column reach the mirror:
// a column renamed, dropped, retyped (with USING, which rewrites the rows
// without a change in the stream), added with a default; a table without a
// primary key is refused at enable, and one with REPLICA IDENTITY FULL is
// mirrored with equal rows kept apart.
func TestMirror_SchemaChanges(t *testing.T) {
	for _, mode := range []string{"database", "schema"} {
		t.Run(mode, func(t *testing.T) { testSchemaChanges(t, mode) })
	}
}

func testSchemaChanges(t *testing.T, mode string) {
	ctx := context.Background()
	cfg := testConfig(t)
	d, c := daemontest.Start(t, pg, cfg)
	template(t, c)
	req := provision.Request{Template: "an"}
	switch mode { // constants: Request.Mode becomes a type of its own
	case "database":
		req.Mode = "database"
	case "schema":
		req.Mode = "schema"
	}
	r, err := c.CreateTenant(ctx, req)
	if err != nil {
		t.Fatal(err)
	}
	id, dsn := r.Tenant.ID, r.DSN
	exec(t, dsn, `INSERT INTO items SELECT i, i % 7, 'n' || i, timestamp '2024-01-01' + i * interval '1 minute', i / 3.0, NULL FROM generate_series(1, 500) i`,
		`CREATE TABLE nokey (a int, b text)`,
		// Names a tenant chooses reach SQL on both sides quoted.
		`CREATE TABLE "odd ""name; --" (k int PRIMARY KEY, "co;l" text)`,
		`INSERT INTO "odd ""name; --" VALUES (1, 'a'), (2, NULL)`,
		`INSERT INTO nokey VALUES (1, 'x'), (1, 'x'), (2, 'y'), (3, 'z')`)

	_, err = c.EnableAnalytics(ctx, id, nil)
	if err == nil || !strings.Contains(err.Error(), "nokey") || !strings.Contains(err.Error(), "primary key") {
		t.Fatalf("enable with a table without a primary key: got %v, want a refusal naming it", err)
	}
	if st, err := c.AnalyticsStatus(ctx, id); err != nil || st.Enabled {
		t.Fatalf("a refused enable left a mirror: %+v %v", st, err)
	}
	exec(t, dsn, `ALTER TABLE nokey REPLICA IDENTITY FULL`)
	if _, err := c.EnableAnalytics(ctx, id, nil); err != nil {
		t.Fatal(err)
	}
	waitSame(t, d, dsn, id, "items", itemCols)
	waitSame(t, d, dsn, id, "nokey", "a, b")

	// REPLICA IDENTITY FULL: one of two equal rows deleted, one updated.
	exec(t, dsn, `INSERT INTO nokey VALUES (2, 'y'), (4, NULL)`,
		`DELETE FROM nokey WHERE ctid = (SELECT min(ctid) FROM nokey WHERE a = 1)`,
		`UPDATE nokey SET b = 'w' WHERE ctid = (SELECT max(ctid) FROM nokey WHERE a = 2)`,
		`UPDATE nokey SET b = 'q' WHERE a = 4`)
	waitSame(t, d, dsn, id, "nokey", "a, b")

	// Rename, then a change to the table.
	exec(t, dsn, `ALTER TABLE items RENAME COLUMN name TO title`,
		`UPDATE items SET title = title || '*' WHERE id % 10 = 0`)
	cols := `id, qty, title, "at", price, big`
	waitSame(t, d, dsn, id, "items", cols)

	exec(t, dsn, `ALTER TABLE "odd ""name; --" RENAME COLUMN "co;l" TO "x""y"`, `INSERT INTO "odd ""name; --" VALUES (3, 'c')`)
	waitSame(t, d, dsn, id, `"odd ""name; --"`, `k, "x""y"`)

	// Drop.
	exec(t, dsn, `ALTER TABLE items DROP COLUMN big`,
		`INSERT INTO items VALUES (1001, 1, 'after drop', NULL, 1.25)`)
	cols = `id, qty, title, "at", price`
	waitSame(t, d, dsn, id, "items", cols)
	if got := mirrorColumns(t, d, id, "items"); got != `at,id,price,qty,title` {
		t.Errorf("mirror columns after the drop: got %s", got)
	}

	// Type change that rewrites every row (no change in the stream for
	// them), then one insert.
	exec(t, dsn, `ALTER TABLE items ALTER COLUMN qty TYPE numeric(12,3) USING qty * 1.5`,
		`INSERT INTO items VALUES (1002, 2.25, 'after retype', NULL, NULL)`)
	waitSame(t, d, dsn, id, "items", cols)

	// A column added with a default that existing rows take without a
	// rewrite, and a rename and a change in one transaction with it.
	exec(t, dsn, `ALTER TABLE items ADD COLUMN flag boolean NOT NULL DEFAULT true`,
		`BEGIN; UPDATE items SET flag = false WHERE id < 5; ALTER TABLE items RENAME COLUMN title TO label; UPDATE items SET label = 'renamed' WHERE id = 7; COMMIT`)
	waitSame(t, d, dsn, id, "items", `id, qty, label, "at", price, flag::int`)
	waitSame(t, d, dsn, id, "nokey", "a, b")
}

// mirrorColumns lists a mirror table's columns, sorted, comma-separated.
func mirrorColumns(t *testing.T, d *daemon.Daemon, id, table string) string {
	t.Helper()
	var got string
	err := d.Analytics().WithMirror(id, func(db *sql.DB) error {
		return db.QueryRow(`SELECT string_agg(column_name, ',' ORDER BY column_name) FROM duckdb_columns() WHERE table_name = ? AND schema_name = 'main'`, table).Scan(&got)
	})
	if err != nil {
		t.Fatal(err)
	}
	return got
}
