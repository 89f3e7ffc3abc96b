package analytics

import "testing"

// TestCatalogCompat: psql's catalog idioms become DuckDB's; a statement
// that names no pg_catalog object is left alone.
func TestCatalogCompat(t *testing.T) {
	for _, tc := range []struct{ in, want string }{
		{`SELECT 1 WHERE 'a' ~ 'b'`, `SELECT 1 WHERE 'a' ~ 'b'`},
		{`SELECT pg_catalog.pg_get_userbyid(c.relowner) FROM pg_catalog.pg_class c WHERE c.relname OPERATOR(pg_catalog.~) '^(x)$' COLLATE pg_catalog.default`,
			`SELECT 't_abc' FROM pg_catalog.pg_class c WHERE c.relname ~ '^(x)$'`},
		{`SELECT c.reloftype::pg_catalog.regtype::pg_catalog.text FROM pg_catalog.pg_class c WHERE n.nspname <> 'information_schema'`,
			`SELECT c.reloftype::VARCHAR::text FROM pg_catalog.pg_class c WHERE n.nspname NOT IN ('information_schema', '_pgtenant_mirror')`},
	} {
		if got := catalogCompat(tc.in, "abc"); got != tc.want {
			t.Errorf("catalogCompat(%q)\n got %q\nwant %q", tc.in, got, tc.want)
		}
	}
}
