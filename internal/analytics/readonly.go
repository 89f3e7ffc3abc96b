package analytics

import (
	"context"
	"database/sql/driver"
	"encoding/json"
	"fmt"
	"io"
	"strings"

	"github.com/duckdb/duckdb-go/v2"
)

// A tenant's statement is read-only by construction, not by its text:
//
//   - it runs on a DuckDB connection of its own (mirror.connect), inside
//     BEGIN TRANSACTION READ ONLY, rolled back and closed after: DuckDB
//     refuses any write to the mirror's file in it (the tenant's tables
//     and the mirror's own state alike), and what it may change on its
//     connection (temporary objects, variables, the search path, the
//     transaction itself) ends with the connection;
//   - DuckDB parses the text first (json_serialize_sql, which shows only
//     SELECTs): one SELECT, or EXPLAIN [ANALYZE] of one, and nothing else,
//     reaches PrepareContext; DuckDB's classification of what it then
//     prepared must agree;
//   - that parse tree (names as DuckDB resolved quoting, case and
//     comments) may not call the functions, nor read the views, that
//     report the daemon's files and settings or act on the whole database
//     (deniedFunctions, deniedViews, deniedSettings).
//
// The file is opened with external access off, the configuration locked
// and a neutral home directory (mirror.open).

// errReadOnly answers anything but a query.
var errReadOnly = &pgError{"25006", "the analytics mirror is read-only: only SELECT, and EXPLAIN [ANALYZE] of a SELECT, run here"}

// deniedFunctions may not appear in a tenant's statement: they show the
// daemon's paths and settings (the mirror's file, its temporary and home
// directories), act on the whole database (checkpoints, logging), or run
// SQL text the parse tree does not show (query, query_table).
var deniedFunctions = map[string]bool{
	"duckdb_databases": true, "duckdb_settings": true, "duckdb_temporary_files": true, "duckdb_extensions": true,
	"duckdb_secrets": true, "which_secret": true, "duckdb_external_file_cache": true, "duckdb_logs": true, "duckdb_logs_parsed": true, "duckdb_log_contexts": true,
	"pragma_database_list": true, "checkpoint": true, "force_checkpoint": true,
	"enable_logging": true, "disable_logging": true, "truncate_duckdb_logs": true, "query": true, "query_table": true,
}

// deniedViews are DuckDB's views over denied functions (a tenant table of
// that name is refused too: the name alone does not tell them apart).
var deniedViews = map[string]bool{"duckdb_databases": true, "pragma_database_list": true, "pg_settings": true}

// deniedSettings are the settings current_setting() may not read: their
// values are the daemon's paths.
var deniedSettings = map[string]bool{
	"temp_directory": true, "home_directory": true, "allowed_paths": true, "allowed_directories": true,
	"secret_directory": true, "extension_directory": true, "extension_directories": true, "file_search_path": true, "log_query_path": true,
}

// errDenied refuses a statement naming a denied function or view.
func errDenied(name string) error {
	return &pgError{"42501", fmt.Sprintf("%s is not available on the analytics port", name)}
}

// prepareReadOnly prepares q on c (in its read-only transaction) if it is
// one SELECT, or an EXPLAIN [ANALYZE] of one, that calls no denied
// function. DuckDB's parse tree is checked before q is prepared: the
// driver runs every statement of a text but the last while preparing it,
// so a text of several statements never reaches PrepareContext.
func prepareReadOnly(ctx context.Context, c *duckdb.Conn, q string) (*duckdb.Stmt, error) {
	query, explain := explained(q)
	if !explain {
		query = q
	}
	if err := checkParseTree(ctx, c, query); err != nil {
		return nil, err
	}
	ds, err := c.PrepareContext(ctx, q)
	if err != nil {
		return nil, &pgError{"42601", err.Error()}
	}
	st := ds.(*duckdb.Stmt)
	typ, err := st.StatementType()
	if err == nil && (typ != duckdb.STATEMENT_TYPE_SELECT || explain) && (typ != duckdb.STATEMENT_TYPE_EXPLAIN || !explain) {
		err = errReadOnly
	}
	if err != nil {
		st.Close()
		return nil, err
	}
	return st, nil
}

// explained is the statement an EXPLAIN explains: the text after EXPLAIN,
// an optional ANALYZE (or ANALYSE) and an optional parenthesised option
// list (without quotes, semicolons or nested parentheses). What is found
// must be one SELECT (checkParseTree); a text of any other shape is
// checked whole, and is then no SELECT DuckDB would EXPLAIN.
func explained(q string) (string, bool) {
	rest := skipSpace(q)
	word := func(w string) bool {
		if len(rest) < len(w) || !strings.EqualFold(rest[:len(w)], w) {
			return false
		}
		if len(rest) > len(w) && isIdent(rest[len(w)]) {
			return false
		}
		rest = skipSpace(rest[len(w):])
		return true
	}
	if !word("explain") {
		return "", false
	}
	if !word("analyze") {
		word("analyse")
	}
	if strings.HasPrefix(rest, "(") {
		end := strings.IndexByte(rest, ')')
		if end < 0 || strings.ContainsAny(rest[1:end], `("';`) || strings.Contains(rest[1:end], "--") || strings.Contains(rest[1:end], "/*") {
			return "", false
		}
		rest = skipSpace(rest[end+1:])
	}
	if rest == "" {
		return "", false
	}
	return rest, true
}

// skipSpace skips white space and comments (a comment that does not end,
// or nests, leaves its opening in place: the statement is then refused).
func skipSpace(s string) string {
	for {
		s = strings.TrimLeft(s, " \t\r\n\f\v")
		switch {
		case strings.HasPrefix(s, "--"):
			i := strings.IndexByte(s, '\n')
			if i < 0 {
				return ""
			}
			s = s[i+1:]
		case strings.HasPrefix(s, "/*"):
			i := strings.Index(s, "*/")
			if i < 0 || strings.Contains(s[2:i], "/*") {
				return s
			}
			s = s[i+2:]
		default:
			return s
		}
	}
}

func isIdent(b byte) bool {
	return b == '_' || b == '$' || b >= '0' && b <= '9' || b >= 'a' && b <= 'z' || b >= 'A' && b <= 'Z' || b >= 0x80
}

// checkParseTree refuses q if DuckDB's parse tree of it names a denied
// function or view, or reads a denied setting.
func checkParseTree(ctx context.Context, c *duckdb.Conn, q string) error {
	rows, err := c.QueryContext(ctx, `SELECT CAST(json_serialize_sql(?::VARCHAR) AS VARCHAR)`, []driver.NamedValue{{Ordinal: 1, Value: q}})
	if err != nil {
		return fmt.Errorf("parse tree: %w", err)
	}
	defer rows.Close()
	vals := make([]driver.Value, 1)
	if err := rows.Next(vals); err != nil {
		if err == io.EOF {
			err = io.ErrUnexpectedEOF
		}
		return fmt.Errorf("parse tree: %w", err)
	}
	text, _ := vals[0].(string)
	var tree struct {
		Error      bool   `json:"error"`
		Message    string `json:"error_message"`
		Statements []any  `json:"statements"`
	}
	if err := json.Unmarshal([]byte(text), &tree); err != nil {
		return fmt.Errorf("parse tree: %w", err)
	}
	if tree.Error {
		// Not a SELECT (json_serialize_sql shows only those), or not
		// parsed: refused before anything runs.
		if strings.Contains(tree.Message, "Only SELECT") {
			return errReadOnly
		}
		return &pgError{"42601", tree.Message}
	}
	if len(tree.Statements) != 1 {
		return &pgError{"42601", "one statement at a time on the analytics port"}
	}
	return walkTree(tree.Statements)
}

// walkTree looks at every node of a parse tree: function calls (scalar,
// aggregate, table), table references and current_setting's argument.
func walkTree(n any) error {
	switch n := n.(type) {
	case []any:
		for _, x := range n {
			if err := walkTree(x); err != nil {
				return err
			}
		}
	case map[string]any:
		if name, ok := n["function_name"].(string); ok {
			name = strings.ToLower(name)
			if deniedFunctions[name] {
				return errDenied(name + "()")
			}
			if name == "current_setting" {
				if err := checkSetting(n["children"]); err != nil {
					return err
				}
			}
		}
		if n["type"] == "BASE_TABLE" {
			if name, ok := n["table_name"].(string); ok && deniedViews[strings.ToLower(name)] {
				return errDenied(strings.ToLower(name))
			}
		}
		for _, x := range n {
			if err := walkTree(x); err != nil {
				return err
			}
		}
	}
	return nil
}

// checkSetting lets current_setting read a constant setting name that is
// not denied.
func checkSetting(children any) error {
	args, _ := children.([]any)
	if len(args) == 1 {
		if arg, ok := args[0].(map[string]any); ok && arg["class"] == "CONSTANT" {
			if v, ok := arg["value"].(map[string]any); ok {
				if name, ok := v["value"].(string); ok && !deniedSettings[strings.ToLower(strings.TrimSpace(name))] {
					return nil
				}
			}
		}
	}
	return errDenied("this setting")
}
