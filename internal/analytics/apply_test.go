package analytics

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"fmt"
	"math/rand/v2"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/jackc/pglogrepl"

	"github.com/pgtenant/pgtenant/internal/catalog"
	"github.com/pgtenant/pgtenant/internal/tenant"
)

// TestAppendLines_AsDuckDBCasts: lines appended through the converters
// (insertLines) hold what DuckDB's casts of the same text hold (castLines),
// for each converted type at its limits; a value a converter does not take
// (infinity, a BC date) leaves its line to the cast.
func TestAppendLines_AsDuckDBCasts(t *testing.T) {
	ctx := context.Background()
	db, err := sql.Open("duckdb", "")
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	conn, err := db.Conn(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	w := newWriter(conn)
	cols := []column{{name: "v", typ: "VARCHAR"}, {name: "b", typ: "BIGINT"}, {name: "i", typ: "INTEGER"}, {name: "s", typ: "SMALLINT"},
		{name: "u", typ: "UBIGINT"}, {name: "d", typ: "DOUBLE"}, {name: "r", typ: "REAL"}, {name: "t", typ: "BOOLEAN"}, {name: "ts", typ: "TIMESTAMP"}}
	converted := []string{
		"héllo wörld\t9223372036854775807\t2147483647\t32767\t18446744073709551615\t1.7976931348623157e+308\t3.4028235e+38\tt\t2026-12-02 22:41:25.123456",
		"\t-9223372036854775808\t-2147483648\t-32768\t0\t-0\t1.1754944e-38\tf\t0001-01-01 00:00:00",
		"x\t0\t0\t0\t42\tNaN\tNaN\tt\t9999-12-31 23:59:59.999999",
		`\N	\N	\N	\N	\N	\N	\N	\N	\N`,
		"y\t1\t1\t1\t1\tInfinity\t-Infinity\tf\t1970-01-01 00:00:00.5",
		"z\t-1\t-1\t-1\t1\t5e-324\t1.4e-45\tt\t2000-02-29 12:00:00.000001",
		"0.1\t12\t12\t12\t12\t0.1\t0.1\tf\t1999-12-31 23:59:59.99",
	}
	cast := []string{
		"w\t2\t2\t2\t2\t1\t1\tf\tinfinity",
		"q\t3\t3\t3\t3\t1\t1\tt\t-infinity",
	}
	lines := append(slices.Clone(converted), cast...)
	conv := converters(cols)
	if conv == nil {
		t.Fatal("no converters for the test's types")
	}
	for _, q := range []string{`CREATE TABLE appended (v VARCHAR, b BIGINT, i INTEGER, s SMALLINT, u UBIGINT, d DOUBLE, r REAL, t BOOLEAN, ts TIMESTAMP)`,
		`CREATE TABLE casted AS FROM appended`, `BEGIN TRANSACTION`} {
		if _, err := conn.ExecContext(ctx, q); err != nil {
			t.Fatal(err)
		}
	}
	rest, err := appendLines(ctx, w, "main", "appended", cols, conv, lines)
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(rest, cast) {
		t.Errorf("lines left to the cast: %q, want %q", rest, cast)
	}
	if err := castLines(ctx, w, "main", "appended", cols, rest); err != nil {
		t.Fatal(err)
	}
	if err := castLines(ctx, w, "main", "casted", cols, lines); err != nil {
		t.Fatal(err)
	}
	if _, err := conn.ExecContext(ctx, `COMMIT`); err != nil {
		t.Fatal(err)
	}
	// Compared as text too: EXCEPT takes -0 for 0.
	for _, q := range []string{
		`SELECT count(*) FROM (FROM appended EXCEPT ALL FROM casted)`, `SELECT count(*) FROM (FROM casted EXCEPT ALL FROM appended)`,
		`SELECT count(*) FROM (SELECT CAST(COLUMNS(*) AS VARCHAR) FROM appended EXCEPT ALL SELECT CAST(COLUMNS(*) AS VARCHAR) FROM casted)`,
	} {
		var n int
		if err := conn.QueryRowContext(ctx, q).Scan(&n); err != nil || n != 0 {
			t.Errorf("%s: %d (%v), want 0", q, n, err)
		}
	}
	var n int
	if err := conn.QueryRowContext(ctx, `SELECT count(*) FROM appended`).Scan(&n); err != nil || n != len(lines) {
		t.Errorf("appended %d rows (%v), want %d", n, err, len(lines))
	}
	// Lines of another shape are left whole.
	vals := make([]driver.Value, len(cols))
	for _, l := range []string{"a\t1", strings.Repeat("1\t", len(cols)), converted[0] + "\tmore"} {
		if convertLine(l, conv, vals) {
			t.Errorf("line %q of %d fields converted", l, strings.Count(l, "\t")+1)
		}
	}
}

// TestBatch_FreshKeysDeleteNothing: a key the batch inserted first has no
// row in the file, so the apply deletes only the keys it found there
// (updated, deleted, or inserted again after a delete); the file then
// holds what the table holds.
func TestBatch_FreshKeysDeleteNothing(t *testing.T) {
	ctx := context.Background()
	db := testFile(t, filepath.Join(t.TempDir(), "m.duckdb"), 10) // ids 1..10
	defer db.Close()
	conn, err := db.Conn(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	r := rand.New(rand.NewPCG(3, 4))
	tuple := func(p pgout, id int) pgout {
		p = p.u16(benchCols)
		for _, v := range benchRow(r, id) {
			p = append(p.u8('t').u32(uint32(len(v))), v...)
		}
		return p
	}
	key := func(p pgout, id int) pgout {
		v := fmt.Appendf(nil, "%d", id)
		p = append(p.u16(benchCols).u8('t').u32(uint32(len(v))), v...)
		for range benchCols - 1 {
			p = p.u8('n')
		}
		return p
	}
	insert := func(id int) []byte { return tuple(pgout{'I'}.u32(16384).u8('N'), id) }
	update := func(id int) []byte { return tuple(pgout{'U'}.u32(16384).u8('N'), id) }
	del := func(id int) []byte { return key(pgout{'D'}.u32(16384).u8('K'), id) }
	msgs := [][]byte{benchRelation(), pgout{'B'}.u64(100).u64(0).u32(7),
		insert(11), insert(12), update(12), insert(13), del(13), // fresh: inserted first
		update(5), del(6), del(7), insert(7), // in the file
		pgout{'C'}.u8(0).u64(100).u64(101).u64(0)}
	bt := newBatch(catalog.Tenant{ID: "t1", Mode: tenant.ModeDatabase}, map[uint32]*relation{}, map[string]pglogrepl.LSN{})
	var dec rowDecoder
	for _, m := range msgs {
		if _, err := bt.addMessage(m, 0, &dec); err != nil {
			t.Fatal(err)
		}
	}
	var fresh []string
	for _, k := range bt.tables[16384].order {
		if bt.tables[16384].entries[k].fresh {
			fresh = append(fresh, strings.TrimRight(k, "\x00"))
		}
	}
	if want := []string{"11", "12", "13"}; !slices.Equal(fresh, want) {
		t.Errorf("fresh keys %q, want %q", fresh, want)
	}
	if _, err := bt.apply(ctx, newWriter(conn)); err != nil {
		t.Fatal(err)
	}
	var ids string
	if err := conn.QueryRowContext(ctx, `SELECT string_agg(id::VARCHAR, ',' ORDER BY id) FROM main.t`).Scan(&ids); err != nil {
		t.Fatal(err)
	}
	if want := "1,2,3,4,5,7,8,9,10,11,12"; ids != want {
		t.Errorf("ids in the file %s, want %s", ids, want)
	}
}
