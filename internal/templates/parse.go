package templates

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"strings"
)

// File is one SQL file of a template version.
type File struct {
	Name          string   `json:"name"`
	Body          string   `json:"body"`     // the file as written; parsed again when used
	Checksum      string   `json:"checksum"` // sha256 of Body
	NoTransaction bool     `json:"no_transaction"`
	Statements    []string `json:"-"` // the Up section, split into statements
}

// ParseFile reads a template file: plain SQL, or goose-style with
// `-- +goose Up` / `-- +goose Down` sections (Down is ignored),
// `-- +goose StatementBegin` / `StatementEnd` around statements that must not
// be split, and `-- +goose NO TRANSACTION` for statements that cannot run in
// a transaction block (CREATE INDEX CONCURRENTLY).
func ParseFile(name, body string) (File, error) {
	sum := sha256.Sum256([]byte(body))
	f := File{Name: name, Body: body, Checksum: hex.EncodeToString(sum[:])}
	stmts, noTx, err := splitGoose(body)
	if err != nil {
		return File{}, fmt.Errorf("%s: %w", name, err)
	}
	f.Statements, f.NoTransaction = stmts, noTx
	return f, nil
}

// splitGoose splits a file's Up section into statements.
func splitGoose(body string) (stmts []string, noTx bool, err error) {
	hasUp := strings.Contains(body, "-- +goose Up")
	inUp := !hasUp
	verbatim := false
	var lx lexer
	var cur strings.Builder
	flush := func() {
		if s := strings.TrimSpace(cur.String()); s != "" && !onlyComments(s) {
			stmts = append(stmts, s)
		}
		cur.Reset()
	}
	for _, line := range strings.SplitAfter(body, "\n") {
		if lx.normal() {
			if ann, ok := strings.CutPrefix(strings.TrimSpace(line), "-- +goose "); ok {
				switch strings.ToUpper(strings.TrimSpace(ann)) {
				case "UP":
					inUp = true
				case "DOWN":
					flush()
					return stmts, noTx, nil
				case "STATEMENTBEGIN":
					flush()
					verbatim = true
				case "STATEMENTEND":
					if !verbatim {
						return nil, false, fmt.Errorf("-- +goose StatementEnd without StatementBegin")
					}
					verbatim = false
					flush()
				case "NO TRANSACTION":
					noTx = true
				case "ENVSUB ON", "ENVSUB OFF":
				default:
					return nil, false, fmt.Errorf("unknown annotation %q", strings.TrimSpace(line))
				}
				continue
			}
		}
		if !inUp {
			continue
		}
		if verbatim {
			cur.WriteString(line)
			continue
		}
		for i := 0; i < len(line); i++ {
			lx.step(line, i)
			c := line[i]
			if c == ';' && lx.normal() {
				cur.WriteByte(';')
				flush()
				continue
			}
			cur.WriteByte(c)
		}
	}
	if verbatim {
		return nil, false, fmt.Errorf("-- +goose StatementBegin without StatementEnd")
	}
	if !lx.normal() {
		return nil, false, fmt.Errorf("unterminated %s", lx.what())
	}
	flush()
	return stmts, noTx, nil
}

// lexer tracks whether a position is inside a string, quoted identifier,
// dollar quote or comment, so that only top-level semicolons split.
type lexer struct {
	state   int // 0 normal, 1 'string', 2 "ident", 3 $dollar$, 4 -- comment, 5 /* comment */
	escapes bool
	tag     string
	depth   int
	skip    int
}

func (l *lexer) normal() bool { return l.state == 0 }

func (l *lexer) what() string {
	return [...]string{"", "string", "quoted identifier", "dollar-quoted string", "comment", "block comment"}[l.state]
}

// step consumes line[i] and updates the state.
func (l *lexer) step(line string, i int) {
	if l.skip > 0 {
		l.skip--
		return
	}
	c := line[i]
	next := byte(0)
	if i+1 < len(line) {
		next = line[i+1]
	}
	switch l.state {
	case 0:
		switch {
		case c == '\'':
			l.state = 1
			l.escapes = i > 0 && (line[i-1] == 'E' || line[i-1] == 'e') && (i < 2 || !isIdent(line[i-2]))
		case c == '"':
			l.state = 2
		case c == '-' && next == '-':
			l.state, l.skip = 4, 1
		case c == '/' && next == '*':
			l.state, l.depth, l.skip = 5, 1, 1
		case c == '$' && (i == 0 || !isIdent(line[i-1])):
			if end := strings.IndexByte(line[i+1:], '$'); end >= 0 {
				tag := line[i : i+end+2]
				if validTag(tag) {
					l.state, l.tag, l.skip = 3, tag, len(tag)-1
				}
			}
		}
	case 1:
		switch {
		case l.escapes && c == '\\':
			l.skip = 1
		case c == '\'' && next == '\'':
			l.skip = 1
		case c == '\'':
			l.state = 0
		}
	case 2:
		if c == '"' && next == '"' {
			l.skip = 1
		} else if c == '"' {
			l.state = 0
		}
	case 3:
		if c == '$' && strings.HasPrefix(line[i:], l.tag) {
			l.state, l.skip = 0, len(l.tag)-1
		}
	case 4:
		if c == '\n' {
			l.state = 0
		}
	case 5:
		switch {
		case c == '/' && next == '*':
			l.depth++
			l.skip = 1
		case c == '*' && next == '/':
			l.depth--
			l.skip = 1
			if l.depth == 0 {
				l.state = 0
			}
		}
	}
}

func isIdent(c byte) bool {
	return c == '_' || c >= '0' && c <= '9' || c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= 0x80
}

// validTag checks a dollar-quote tag: $$ or $name$ where name is an identifier
// not starting with a digit ($1 is a parameter).
func validTag(tag string) bool {
	inner := tag[1 : len(tag)-1]
	if inner == "" {
		return true
	}
	if inner[0] >= '0' && inner[0] <= '9' {
		return false
	}
	for i := 0; i < len(inner); i++ {
		if !isIdent(inner[i]) {
			return false
		}
	}
	return true
}

// onlyComments reports whether s has nothing but comments and whitespace.
func onlyComments(s string) bool {
	var l lexer
	for i := 0; i < len(s); i++ {
		wasNormal := l.normal() && l.skip == 0
		l.step(s, i)
		if wasNormal && l.normal() && s[i] != ' ' && s[i] != '\t' && s[i] != '\n' && s[i] != '\r' {
			return false
		}
	}
	return true
}
