package cluster

import (
	"strings"

	"github.com/jackc/pgx/v5"
)

// Ident quotes one identifier for SQL. Every name that reaches SQL text goes
// through here (or pgx.Identifier) after validation; values go as $n.
func Ident(name string) string { return pgx.Identifier{name}.Sanitize() }

// Literal quotes a string constant for the few utility statements that take
// no parameters (ALTER ROLE … PASSWORD, COMMENT ON). It relies on
// standard_conforming_strings=on (the default since 9.1) and rejects NUL.
func Literal(s string) string {
	s = strings.ReplaceAll(s, "\x00", "")
	return "'" + strings.ReplaceAll(s, "'", "''") + "'"
}
