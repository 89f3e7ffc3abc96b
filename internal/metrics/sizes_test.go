package metrics_test

import (
	"context"
	"fmt"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/pgtenant/pgtenant/internal/metrics"
	"github.com/pgtenant/pgtenant/internal/pgtest"
)

// schemaObjectsByScan defines a schema tenant's objects as the catalogs
// hold them: every relation, constraint, routine, type, operator and
// dictionary whose namespace is its schema, and every temporary relation
// its role owns. It is what the collector's query reaches through the
// catalogs' indexes (metrics.SchemaSizesSQL), by scans of whole catalogs.
const schemaObjectsByScan = `
		relations AS (
			SELECT t.name, c.oid, c.relkind, c.relpersistence FROM tenants t JOIN pg_catalog.pg_class c ON c.relnamespace = t.nsp
			UNION ALL
			SELECT t.name, c.oid, c.relkind, c.relpersistence FROM tenants t JOIN pg_catalog.pg_class c ON c.relowner = t.role AND c.relpersistence = 't'
			UNION ALL
			SELECT t.name, x.oid, x.relkind, x.relpersistence FROM tenants t JOIN pg_catalog.pg_class c ON c.relnamespace = t.nsp
			JOIN pg_catalog.pg_class x ON x.oid = c.reltoastrelid
			UNION ALL
			SELECT t.name, x.oid, x.relkind, x.relpersistence FROM tenants t JOIN pg_catalog.pg_class c ON c.relnamespace = t.nsp
			JOIN pg_catalog.pg_index i ON i.indrelid = c.reltoastrelid JOIN pg_catalog.pg_class x ON x.oid = i.indexrelid
			WHERE c.reltoastrelid <> 0
		),
		owned (name, classid, objid, bytes) AS (
			SELECT t.name, 'pg_catalog.pg_constraint'::pg_catalog.regclass, k.oid, pg_catalog.pg_column_size(k.*) FROM tenants t JOIN pg_catalog.pg_constraint k ON k.connamespace = t.nsp
			UNION ALL SELECT t.name, 'pg_catalog.pg_proc'::pg_catalog.regclass, p.oid, pg_catalog.pg_column_size(p.*) FROM tenants t JOIN pg_catalog.pg_proc p ON p.pronamespace = t.nsp
			UNION ALL SELECT t.name, 'pg_catalog.pg_type'::pg_catalog.regclass, y.oid, pg_catalog.pg_column_size(y.*) FROM tenants t JOIN pg_catalog.pg_type y ON y.typnamespace = t.nsp
			UNION ALL SELECT t.name, 0, 0, pg_catalog.pg_column_size(e.*) FROM tenants t JOIN pg_catalog.pg_type y ON y.typnamespace = t.nsp JOIN pg_catalog.pg_enum e ON e.enumtypid = y.oid
			UNION ALL SELECT t.name, 'pg_catalog.pg_operator'::pg_catalog.regclass, o.oid, pg_catalog.pg_column_size(o.*) FROM tenants t JOIN pg_catalog.pg_operator o ON o.oprnamespace = t.nsp
			UNION ALL SELECT t.name, 'pg_catalog.pg_ts_dict'::pg_catalog.regclass, d.oid, pg_catalog.pg_column_size(d.*) FROM tenants t JOIN pg_catalog.pg_ts_dict d ON d.dictnamespace = t.nsp
		)`

// TestSchemaSizes_IndexesFindWhatScansFind: the collector reaches a schema
// tenant's objects through pg_depend, pg_shdepend and the catalogs' other
// indexes instead of scanning catalogs by namespace (which grows with every
// tenant of the shared database), and stats only the forks a relation can
// have. For two schemas holding every kind of object a tenant can make —
// moved in from elsewhere, handed to another owner, unlogged, with TOAST,
// maps, comments, statistics, a temporary table in an open session and a
// large object — both find the same objects and the same bytes (but for
// alignment).
func TestSchemaSizes_IndexesFindWhatScansFind(t *testing.T) {
	ctx := pgtest.Context(t)
	db := pg.NewDatabase(t)
	admin := pg.Conn(t, db)
	suffix := pgtest.RandomSuffix()
	s1, s2 := "t_sizes1_"+suffix, "t_sizes2_"+suffix
	t.Cleanup(func() {
		c := pg.Conn(t, "postgres")
		for _, r := range []string{s1, s2} {
			_, _ = c.Exec(context.Background(), fmt.Sprintf(`DROP OWNED BY %[1]s CASCADE; DROP ROLE IF EXISTS %[1]s`, r))
		}
	})
	for _, r := range []string{s1, s2} {
		exec(t, admin, fmt.Sprintf(`CREATE ROLE %[1]s LOGIN; CREATE SCHEMA %[1]s AUTHORIZATION %[1]s; GRANT CREATE, TEMPORARY ON DATABASE %[2]s TO %[1]s`, r, db))
	}
	// Made elsewhere by the superuser, then moved into the schema.
	exec(t, admin, fmt.Sprintf(`
		CREATE TABLE public.moved (i int PRIMARY KEY, b text);
		CREATE TYPE public.moved_t AS ENUM ('x', 'y');
		CREATE FUNCTION public.moved_f() RETURNS int LANGUAGE sql AS 'SELECT 1';
		ALTER TABLE public.moved SET SCHEMA %[1]s; ALTER TYPE public.moved_t SET SCHEMA %[1]s; ALTER FUNCTION public.moved_f() SET SCHEMA %[1]s`, s1))
	for _, r := range []string{s1, s2} {
		exec(t, admin, `SET ROLE `+r)
		exec(t, admin, fmt.Sprintf(`
			CREATE TABLE %[1]s.t (id serial PRIMARY KEY, b text CHECK (b <> 'x'), c int DEFAULT 3, u int UNIQUE);
			INSERT INTO %[1]s.t (b) SELECT pg_catalog.md5(i::text) FROM pg_catalog.generate_series(1, 200) i;
			CREATE TABLE %[1]s.child (id int REFERENCES %[1]s.t (id), EXCLUDE USING btree (id WITH =));
			CREATE INDEX ON %[1]s.t (pg_catalog.lower(b));
			CREATE TABLE %[1]s.p (k int, v text) PARTITION BY RANGE (k);
			CREATE TABLE %[1]s.p1 PARTITION OF %[1]s.p FOR VALUES FROM (0) TO (10);
			CREATE INDEX ON %[1]s.p (k);
			CREATE VIEW %[1]s.v AS SELECT id FROM %[1]s.t;
			CREATE MATERIALIZED VIEW %[1]s.mv AS SELECT id FROM %[1]s.t;
			CREATE SEQUENCE %[1]s.seq;
			CREATE TYPE %[1]s.comp AS (a int, b text);
			CREATE TYPE %[1]s.mood AS ENUM ('a', 'b', 'c');
			CREATE TYPE %[1]s.rng AS RANGE (subtype = float8);
			CREATE DOMAIN %[1]s.pos AS int CHECK (VALUE > 0);
			CREATE FUNCTION %[1]s.f(int) RETURNS int LANGUAGE sql AS 'SELECT $1';
			CREATE PROCEDURE %[1]s.pr() LANGUAGE sql AS 'SELECT 1';
			CREATE AGGREGATE %[1]s.agg(int) (sfunc = pg_catalog.int4pl, stype = int);
			CREATE OPERATOR %[1]s.=== (leftarg = int, rightarg = int, function = pg_catalog.int4eq);
			CREATE TEXT SEARCH DICTIONARY %[1]s.d (template = pg_catalog.simple);
			CREATE STATISTICS %[1]s.st ON id, c FROM %[1]s.t;
			ALTER TABLE %[1]s.t ENABLE ROW LEVEL SECURITY;
			CREATE POLICY pol ON %[1]s.t USING (true);
			CREATE FUNCTION %[1]s.trg() RETURNS trigger LANGUAGE plpgsql AS 'BEGIN RETURN NEW; END';
			CREATE TRIGGER tr BEFORE INSERT ON %[1]s.t FOR EACH ROW EXECUTE FUNCTION %[1]s.trg();
			CREATE RULE r AS ON DELETE TO %[1]s.child DO INSTEAD NOTHING;
			CREATE UNLOGGED TABLE %[1]s.scratch (i int PRIMARY KEY, b text);
			INSERT INTO %[1]s.scratch SELECT i, pg_catalog.md5(i::text) FROM pg_catalog.generate_series(1, 2000) i;
			CREATE TABLE %[1]s.big (b text);
			INSERT INTO %[1]s.big SELECT pg_catalog.repeat(pg_catalog.md5(i::text), 200) FROM pg_catalog.generate_series(1, 50) i;
			COMMENT ON TABLE %[1]s.t IS 'table'; COMMENT ON COLUMN %[1]s.t.b IS 'column'; COMMENT ON FUNCTION %[1]s.f(int) IS 'function';
			COMMENT ON TYPE %[1]s.mood IS 'type'; COMMENT ON CONSTRAINT t_b_check ON %[1]s.t IS 'constraint'; COMMENT ON DOMAIN %[1]s.pos IS 'domain';
			COMMENT ON SCHEMA %[1]s IS 'schema'; COMMENT ON OPERATOR %[1]s.=== (int, int) IS 'operator'; COMMENT ON TRIGGER tr ON %[1]s.t IS 'trigger';
			ANALYZE %[1]s.t`, r))
		exec(t, admin, fmt.Sprintf(`VACUUM %[1]s.t, %[1]s.scratch`, r)) // free space and visibility maps
		exec(t, admin, `RESET ROLE`)
	}
	// A table the tenant handed to another role stays in its schema.
	exec(t, admin, fmt.Sprintf(`ALTER TABLE %s.child OWNER TO %s`, s1, s2))
	var lo uint32
	exec(t, admin, `SET ROLE `+s1)
	if err := admin.QueryRow(ctx, `SELECT lo_from_bytea(0, pg_catalog.convert_to(pg_catalog.repeat('lo', 5000), 'UTF8'))`).Scan(&lo); err != nil {
		t.Fatal(err)
	}
	exec(t, admin, `RESET ROLE`)
	// A temporary table with TOAST and an index, in a session that stays open.
	temp, err := pgx.Connect(ctx, pg.PrimaryDSN(db))
	if err != nil {
		t.Fatal(err)
	}
	defer temp.Close(context.Background())
	exec(t, temp, `SET ROLE `+s2+`; SET temp_buffers = '1MB'`)
	exec(t, temp, `CREATE TEMP TABLE scratch (b text PRIMARY KEY); INSERT INTO scratch SELECT pg_catalog.repeat(pg_catalog.md5(i::text), 100) FROM pg_catalog.generate_series(1, 300) i`)

	read := func(sql string) map[string]int64 {
		t.Helper()
		rows, err := admin.Query(ctx, sql, []string{s1, s2})
		if err != nil {
			t.Fatal(err)
		}
		got := map[string]int64{}
		for rows.Next() {
			var name string
			var n int64
			if err := rows.Scan(&name, &n); err != nil {
				t.Fatal(err)
			}
			got[name] = n
		}
		if err := rows.Err(); err != nil {
			t.Fatal(err)
		}
		return got
	}
	// By scan, and with every fork of every relation stat'ed.
	byScan := read(strings.Replace(metrics.SchemaSizes(schemaObjectsByScan), metrics.Forks, "", 1))
	byIndex := read(metrics.SchemaSizesSQL)
	t.Logf("by scan %v, by index %v", byScan, byIndex)
	if len(byScan) != 2 || byScan[s1] < 200<<10 || byScan[s2] < 200<<10 {
		t.Fatalf("sizes by scan %v: want two tenants of more than 200 kB", byScan)
	}
	// The same objects; the same bytes but for a row's few bytes of
	// alignment, which a whole-row value's size can gain or lose with the
	// plan (pg_enum's: 97 or 100).
	scanned, indexed := objects(t, admin, schemaObjectsByScan, s1, s2), objects(t, admin, metrics.SchemaObjects, s1, s2)
	for k, n := range scanned {
		if indexed[k] != n {
			t.Errorf("%s: %d by scan, %d through the indexes", k, n, indexed[k])
		}
	}
	for k, n := range indexed {
		if _, ok := scanned[k]; !ok {
			t.Errorf("%s: %d through the indexes, none by scan", k, n)
		}
	}
	for name, n := range byScan {
		if d := byIndex[name] - n; d < -n/1000 || d > n/1000 {
			t.Errorf("%s: %d bytes through the indexes, %d by scan", name, byIndex[name], n)
		}
	}
}

// objects counts a definition's objects by tenant, catalog and oid.
func objects(t *testing.T, conn *pgx.Conn, definition string, schemas ...string) map[string]int {
	t.Helper()
	rows, err := conn.Query(pgtest.Context(t), metrics.SchemaObjectsQuery(definition), schemas)
	if err != nil {
		t.Fatal(err)
	}
	keys, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		t.Fatal(err)
	}
	n := map[string]int{}
	for _, k := range keys {
		n[k]++
	}
	return n
}
