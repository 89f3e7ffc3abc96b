package analytics

import (
	"regexp"
	"strings"

	"github.com/pgtenant/pgtenant/internal/tenant"
)

// psql's describe commands (\dt, \d TABLE, \dn, \l) and the catalog
// queries of common drivers read PostgreSQL's catalog, which DuckDB
// emulates (pg_class, pg_namespace, pg_attribute, …) but in a dialect of
// its own. catalogCompat rewrites what DuckDB does not take into what it
// does, before the statement is checked and prepared (readonly.go): the
// result is checked as any statement is, so a rewrite can make a
// statement fail, never pass a check it would not pass written so.
var (
	catalogRE = regexp.MustCompile(`(?i)pg_catalog`)
	// OPERATOR(pg_catalog.~) → ~ (DuckDB's own operators of those names).
	operatorRE = regexp.MustCompile(`(?i)OPERATOR\s*\(\s*pg_catalog\s*\.\s*([~!=<>*]+)\s*\)`)
	// COLLATE pg_catalog.default: DuckDB's default collation anyway.
	collateRE = regexp.MustCompile(`(?i)\s+COLLATE\s+pg_catalog\s*\.\s*"?default"?`)
	// ::pg_catalog.text and the like: DuckDB's types have no schema, and
	// it has no reg* types (psql casts oids to them to print names).
	castRE = regexp.MustCompile(`(?i)::\s*pg_catalog\s*\.\s*"?([a-z_][a-z0-9_]*)"?`)
	// psql leaves information_schema out of its lists: the mirror's own
	// state schema goes with it.
	infoSchemaRE = regexp.MustCompile(`(?i)<>\s*'information_schema'`)
	// pg_get_userbyid(owner): every object of the mirror is the tenant's.
	userByIDRE = regexp.MustCompile(`(?i)pg_catalog\s*\.\s*pg_get_userbyid\s*\(\s*[a-z_][a-z0-9_.]*\s*\)`)
)

// psql's \d TABLE and \l (psql 15) read columns of pg_class,
// pg_attribute and pg_database that DuckDB's emulation has not got, and
// catalogs it has not got at all. Their queries are recognised by their
// text and answered from DuckDB's own catalog: the table's facts (an
// ordinary table without checks, indexes, rules or triggers, which is
// what a mirror table is), its columns (duckdb_columns), the session's one
// database, and none of the rest.
var (
	describeTableRE   = regexp.MustCompile(`(?s)^\s*SELECT c\.relchecks, c\.relkind, c\.relhasindex, .*WHERE c\.oid = '(\d+)';?\s*$`)
	describeColumnsRE = regexp.MustCompile(`(?s)^\s*SELECT a\.attname,\s+pg_catalog\.format_type\(a\.atttypid, a\.atttypmod\).*FROM pg_catalog\.pg_attribute a\s+WHERE a\.attrelid = '(\d+)' AND a\.attnum > 0 AND NOT a\.attisdropped\s+ORDER BY a\.attnum;?\s*$`)
	// \l: the session's one database, the tenant's mirror.
	listDatabasesRE = regexp.MustCompile(`(?s)^\s*SELECT d\.datname as "Name",.*FROM pg_catalog\.pg_database d\s+ORDER BY 1;?\s*$`)
	// Catalogs DuckDB has not got, whose rows a mirror never has (psql's
	// footers of \d TABLE): their queries answer no row.
	emptyCatalogRE = regexp.MustCompile(`(?i)\bpg_catalog\s*\.\s*(pg_policy|pg_statistic_ext|pg_publication|pg_publication_rel|pg_publication_namespace|pg_inherits|pg_trigger|pg_rewrite)\b`)
)

// describeCompat answers psql's \d TABLE and \l queries (above) for
// tenant id; ok is false for any other statement.
func describeCompat(q, id string) (string, bool) {
	if listDatabasesRE.MatchString(q) {
		name := "'" + tenant.PhysicalName(id) + "'"
		return `SELECT ` + name + ` AS "Name", ` + name + ` AS "Owner", 'UTF8' AS "Encoding", 'C' AS "Collate", 'C' AS "Ctype",
			CAST(NULL AS VARCHAR) AS "ICU Locale", 'libc' AS "Locale Provider", '' AS "Access privileges"`, true
	}
	if m := describeTableRE.FindStringSubmatch(q); m != nil {
		return `SELECT 0 AS relchecks, 'r' AS relkind, false AS relhasindex, false AS relhasrules, false AS relhastriggers,
			false AS relrowsecurity, false AS relforcerowsecurity, false AS relhasoids, false AS relispartition, '' AS reloptions,
			0 AS reltablespace, '' AS reloftype, 'p' AS relpersistence, 'd' AS relreplident, 'heap' AS amname
			FROM duckdb_tables() WHERE table_oid = ` + m[1], true
	}
	if m := describeColumnsRE.FindStringSubmatch(q); m != nil {
		return `SELECT column_name AS attname, lower(data_type) AS format_type, column_default AS "default", NOT is_nullable AS attnotnull,
			CAST(NULL AS VARCHAR) AS attcollation, '' AS attidentity, '' AS attgenerated
			FROM duckdb_columns() WHERE table_oid = ` + m[1] + ` ORDER BY column_index`, true
	}
	if emptyCatalogRE.MatchString(q) {
		return `SELECT CAST(NULL AS VARCHAR) AS none WHERE false`, true
	}
	return "", false
}

// catalogCompat rewrites q's catalog idioms for DuckDB (above); a
// statement that names no pg_catalog object is left as it is.
func catalogCompat(q, id string) string {
	if !catalogRE.MatchString(q) { // every statement passes here: no copy of it
		return q
	}
	if d, ok := describeCompat(q, id); ok {
		return d
	}
	q = operatorRE.ReplaceAllString(q, "$1")
	q = collateRE.ReplaceAllString(q, "")
	q = castRE.ReplaceAllStringFunc(q, func(m string) string {
		typ := strings.ToLower(castRE.FindStringSubmatch(m)[1])
		if strings.HasPrefix(typ, "reg") || typ == "name" {
			typ = "VARCHAR"
		}
		return "::" + typ
	})
	q = infoSchemaRE.ReplaceAllLiteralString(q, "NOT IN ('information_schema', '"+stateSchema+"')")
	return userByIDRE.ReplaceAllLiteralString(q, "'"+tenant.PhysicalName(id)+"'")
}
