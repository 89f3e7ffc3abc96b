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

// catalogCompat rewrites q's catalog idioms for DuckDB (above); a
// statement that names no pg_catalog object is left as it is.
func catalogCompat(q, id string) string {
	if !strings.Contains(strings.ToLower(q), "pg_catalog") {
		return q
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
