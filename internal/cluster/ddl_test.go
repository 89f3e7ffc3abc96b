package cluster_test

import (
	"errors"
	"strings"
	"testing"

	"github.com/pgtenant/pgtenant/internal/cluster"
	"github.com/pgtenant/pgtenant/internal/pgtest"
)

// referenceObjectsSQL is what schemaObjectsSQL replaced: a schema's objects
// by their namespace column, one sequential scan of each catalog.
const referenceObjectsSQL = `
WITH s AS (SELECT oid FROM pg_catalog.pg_namespace WHERE nspname = $1)
SELECT 'pg_class'::regclass, x.oid FROM pg_class x, s WHERE x.relnamespace = s.oid
UNION ALL SELECT 'pg_type'::regclass, x.oid FROM pg_type x, s WHERE x.typnamespace = s.oid
UNION ALL SELECT 'pg_proc'::regclass, x.oid FROM pg_proc x, s WHERE x.pronamespace = s.oid
UNION ALL SELECT 'pg_operator'::regclass, x.oid FROM pg_operator x, s WHERE x.oprnamespace = s.oid
UNION ALL SELECT 'pg_collation'::regclass, x.oid FROM pg_collation x, s WHERE x.collnamespace = s.oid
UNION ALL SELECT 'pg_conversion'::regclass, x.oid FROM pg_conversion x, s WHERE x.connamespace = s.oid
UNION ALL SELECT 'pg_opclass'::regclass, x.oid FROM pg_opclass x, s WHERE x.opcnamespace = s.oid
UNION ALL SELECT 'pg_opfamily'::regclass, x.oid FROM pg_opfamily x, s WHERE x.opfnamespace = s.oid
UNION ALL SELECT 'pg_ts_config'::regclass, x.oid FROM pg_ts_config x, s WHERE x.cfgnamespace = s.oid
UNION ALL SELECT 'pg_ts_dict'::regclass, x.oid FROM pg_ts_dict x, s WHERE x.dictnamespace = s.oid
UNION ALL SELECT 'pg_statistic_ext'::regclass, x.oid FROM pg_statistic_ext x, s WHERE x.stxnamespace = s.oid
UNION ALL SELECT 'pg_constraint'::regclass, x.oid FROM pg_constraint x, s WHERE x.connamespace = s.oid`

// TestSchemaObjects_AsTheCatalogsSay: a schema's objects found through
// pg_depend (what the purge's check of outside dependents starts from) are
// exactly those whose namespace is the schema, for every kind a tenant can
// make; and the check names every object of another schema that depends on
// them, as CASCADE would drop it.
func TestSchemaObjects_AsTheCatalogsSay(t *testing.T) {
	ctx := pgtest.Context(t)
	conn := pg.Conn(t, pg.NewDatabase(t))
	for _, sql := range []string{
		`CREATE SCHEMA a`, `CREATE SCHEMA b`, `CREATE SCHEMA c`,
		`CREATE TYPE a.mood AS ENUM ('ok', 'sad')`,
		`CREATE DOMAIN a.posint AS int CHECK (VALUE > 0)`,
		`CREATE TYPE a.pair AS (x int, y int)`,
		`CREATE TYPE a.span AS RANGE (subtype = int)`,
		`CREATE TABLE a.parent (id serial PRIMARY KEY, note text UNIQUE, m a.mood, n a.posint)`,
		`CREATE TABLE a.child (id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY, parent int REFERENCES a.parent, body text CHECK (body <> ''))`,
		`CREATE INDEX ON a.child (lower(body))`,
		`CREATE TABLE a.part (k int, v text) PARTITION BY RANGE (k)`,
		`CREATE TABLE a.part1 PARTITION OF a.part FOR VALUES FROM (0) TO (10)`,
		`CREATE VIEW a.v AS SELECT id, note FROM a.parent`,
		`CREATE MATERIALIZED VIEW a.mv AS SELECT count(*) FROM a.child`,
		`CREATE SEQUENCE a.seq`,
		`CREATE FUNCTION a.f(int) RETURNS int LANGUAGE sql IMMUTABLE AS 'SELECT $1 + 1'`,
		`CREATE FUNCTION a.trg() RETURNS trigger LANGUAGE plpgsql AS 'BEGIN RETURN NEW; END'`,
		`CREATE TRIGGER t BEFORE INSERT ON a.child FOR EACH ROW EXECUTE FUNCTION a.trg()`,
		`CREATE OPERATOR a.<~> (LEFTARG = int, RIGHTARG = int, FUNCTION = int4pl)`,
		`CREATE STATISTICS a.st ON id, parent FROM a.child`,
		`CREATE COLLATION a.coll FROM "C"`,
		`CREATE TEXT SEARCH CONFIGURATION a.ts (COPY = simple)`,
		`CREATE TEXT SEARCH DICTIONARY a.dict (TEMPLATE = simple)`,
		`CREATE OPERATOR FAMILY a.fam USING btree`,
		`CREATE OPERATOR CLASS a.cls FOR TYPE a.pair USING hash AS FUNCTION 1 hash_record(record)`,
		`CREATE CONVERSION a.conv FOR 'LATIN1' TO 'UTF8' FROM iso8859_1_to_utf8`,
		`CREATE TABLE c.alone (id int PRIMARY KEY, t text)`,
		// b's objects that depend on a's.
		`CREATE TABLE b.borrow (m a.mood, p a.pair, r a.parent)`,
		`CREATE VIEW b.peek AS SELECT * FROM a.parent`,
		`CREATE TABLE b.fk (id int REFERENCES a.parent)`,
		`CREATE TABLE b.def (x int DEFAULT a.f(1))`,
		`CREATE FUNCTION b.g() RETURNS a.mood LANGUAGE sql AS $$SELECT 'ok'::a.mood$$`,
	} {
		if _, err := conn.Exec(ctx, sql); err != nil {
			t.Fatalf("%s: %v", sql, err)
		}
	}
	for _, schema := range []string{"a", "b", "c"} {
		var missing, extra []string
		for _, q := range []struct {
			out *[]string
			sql string
		}{
			{&missing, `SELECT pg_describe_object(classid, objid, 0) FROM (` + referenceObjectsSQL + `) r (classid, objid)
				WHERE (classid, objid) NOT IN (SELECT classid, objid FROM (` + cluster.SchemaObjectsSQL + ` SELECT * FROM mine) m)`},
			{&extra, cluster.SchemaObjectsSQL + ` SELECT pg_describe_object(classid, objid, 0) FROM mine
				WHERE (classid, objid) NOT IN (SELECT classid, objid FROM (` + referenceObjectsSQL + `) r (classid, objid))`},
		} {
			rows, err := conn.Query(ctx, q.sql, schema)
			if err != nil {
				t.Fatalf("schema %s: %v", schema, err)
			}
			for rows.Next() {
				var d string
				if err := rows.Scan(&d); err != nil {
					t.Fatal(err)
				}
				*q.out = append(*q.out, d)
			}
			if err := rows.Err(); err != nil {
				t.Fatal(err)
			}
		}
		if len(missing) > 0 || len(extra) > 0 {
			t.Errorf("schema %s: objects not found through pg_depend %v, found but not in the schema %v", schema, missing, extra)
		}
	}

	err := cluster.CheckOutsideDependents(ctx, conn, "a")
	if !errors.Is(err, cluster.ErrOutsideDependents) {
		t.Fatalf("a's outside dependents: %v, want ErrOutsideDependents", err)
	}
	for _, want := range []string{"column m of table b.borrow", "column p of table b.borrow", "column r of table b.borrow",
		"b.peek", "b.fk", "b.def", "function b.g()"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("a's outside dependents do not name %q: %v", want, err)
		}
	}
	for _, schema := range []string{"b", "c"} {
		if err := cluster.CheckOutsideDependents(ctx, conn, schema); err != nil {
			t.Errorf("%s's outside dependents: %v, want none", schema, err)
		}
	}
}
