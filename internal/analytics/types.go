package analytics

import (
	"database/sql/driver"
	"fmt"
	"strconv"
	"strings"
	"time"
)

// duckType is the DuckDB column type of a PostgreSQL type (by OID and
// typmod). Values travel as PostgreSQL's text output and are CAST to it in
// DuckDB; a type without a faithful DuckDB twin is kept as its text.
func duckType(oid uint32, typmod int32) string {
	switch oid {
	case 16:
		return "BOOLEAN"
	case 20:
		return "BIGINT"
	case 21:
		return "SMALLINT"
	case 23:
		return "INTEGER"
	case 26:
		return "UBIGINT" // oid
	case 700:
		return "REAL"
	case 701:
		return "DOUBLE"
	case 1700: // numeric: DECIMAL when its precision fits, DOUBLE otherwise (NaN, unbounded)
		if typmod >= 4 {
			p, sc := ((typmod-4)>>16)&0xffff, (typmod-4)&0xffff
			if p >= 1 && p <= 38 && sc <= p {
				return fmt.Sprintf("DECIMAL(%d,%d)", p, sc)
			}
		}
		return "DOUBLE"
	case 1082:
		return "DATE"
	case 1083:
		return "TIME"
	case 1114:
		return "TIMESTAMP"
	case 1184:
		return "TIMESTAMPTZ"
	case 2950:
		return "UUID"
	}
	return "VARCHAR" // text, varchar, bpchar, name, json, jsonb, bytea (hex), arrays, intervals, enums …
}

// plainLine: a line of COPY's text format whose only backslashes are NULL
// fields (\N alone between tabs): its fields are its text split on tabs.
func plainLine(line string) bool {
	for i := strings.IndexByte(line, '\\'); i >= 0; {
		if (i > 0 && line[i-1] != '\t') || i+1 >= len(line) || line[i+1] != 'N' || (i+2 < len(line) && line[i+2] != '\t') {
			return false
		}
		j := strings.IndexByte(line[i+2:], '\\')
		if j < 0 {
			return true
		}
		i += 2 + j
	}
	return true
}

// parseCopyLine splits a line of COPY's text format into its fields.
func parseCopyLine(line string) []*string {
	fields := strings.Split(line, "\t")
	out := make([]*string, len(fields))
	for i, f := range fields {
		if f == `\N` {
			continue
		}
		v := unescapeCopy(f)
		out[i] = &v
	}
	return out
}

func unescapeCopy(f string) string {
	if !strings.Contains(f, `\`) {
		return f
	}
	var b strings.Builder
	for i := 0; i < len(f); i++ {
		c := f[i]
		if c != '\\' || i+1 == len(f) {
			b.WriteByte(c)
			continue
		}
		i++
		switch n := f[i]; n {
		case 'b':
			b.WriteByte('\b')
		case 'f':
			b.WriteByte('\f')
		case 'n':
			b.WriteByte('\n')
		case 'r':
			b.WriteByte('\r')
		case 't':
			b.WriteByte('\t')
		case 'v':
			b.WriteByte('\v')
		case 'x':
			j := i + 1
			for j < len(f) && j < i+3 && isHex(f[j]) {
				j++
			}
			v, _ := strconv.ParseUint(f[i+1:j], 16, 8)
			b.WriteByte(byte(v))
			i = j - 1
		default:
			if n >= '0' && n <= '7' {
				j := i
				for j < len(f) && j < i+3 && f[j] >= '0' && f[j] <= '7' {
					j++
				}
				v, _ := strconv.ParseUint(f[i:j], 8, 8)
				b.WriteByte(byte(v))
				i = j - 1
			} else {
				b.WriteByte(n)
			}
		}
	}
	return b.String()
}

func isHex(c byte) bool {
	return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f') || (c >= 'A' && c <= 'F')
}

// quoteDuck quotes a DuckDB identifier.
func quoteDuck(name string) string {
	return `"` + strings.ReplaceAll(name, `"`, `""`) + `"`
}

// converter turns one field of a plain line (PostgreSQL's text output) into
// the Go value DuckDB's appender takes for its column, or reports that it
// cannot (a value such as infinity or a BC date): its line is then cast by
// DuckDB instead.
type converter func(string) (driver.Value, bool)

// timestampLayout reads PostgreSQL's ISO timestamps, with or without a
// fraction; a year past 9999 or BC does not match.
const timestampLayout = "2006-01-02 15:04:05.999999"

// convert is the converter of each DuckDB type that has one giving what
// DuckDB's own cast from the text gives (TestAppendLines_AsDuckDBCasts).
var convert = map[string]converter{
	"VARCHAR": func(s string) (driver.Value, bool) { return s, true },
	"BIGINT":  func(s string) (driver.Value, bool) { v, err := strconv.ParseInt(s, 10, 64); return v, err == nil },
	"INTEGER": func(s string) (driver.Value, bool) {
		v, err := strconv.ParseInt(s, 10, 32)
		return int32(v), err == nil
	},
	"SMALLINT": func(s string) (driver.Value, bool) {
		v, err := strconv.ParseInt(s, 10, 16)
		return int16(v), err == nil
	},
	"UBIGINT": func(s string) (driver.Value, bool) { v, err := strconv.ParseUint(s, 10, 64); return v, err == nil },
	"DOUBLE":  func(s string) (driver.Value, bool) { v, err := strconv.ParseFloat(s, 64); return v, err == nil },
	"REAL": func(s string) (driver.Value, bool) {
		v, err := strconv.ParseFloat(s, 32)
		return float32(v), err == nil
	},
	"BOOLEAN":   func(s string) (driver.Value, bool) { return s == "t", s == "t" || s == "f" },
	"TIMESTAMP": func(s string) (driver.Value, bool) { v, err := time.Parse(timestampLayout, s); return v, err == nil },
}

// converters: one for each column, when every column's type has one; nil
// otherwise.
func converters(cols []column) []converter {
	conv := make([]converter, len(cols))
	for i, c := range cols {
		if conv[i] = convert[c.typ]; conv[i] == nil {
			return nil
		}
	}
	return conv
}

// convertLine fills vals from a plain line's fields (\N: NULL); false if
// the line has another number of fields or one does not convert.
func convertLine(line string, conv []converter, vals []driver.Value) bool {
	for i := range conv {
		f := line
		j := strings.IndexByte(line, '\t')
		if (j >= 0) == (i == len(conv)-1) { // a tab after the last field, or none before the next
			return false
		}
		if j >= 0 {
			f, line = line[:j], line[j+1:]
		}
		if f == `\N` {
			vals[i] = nil
			continue
		}
		v, ok := conv[i](f)
		if !ok {
			return false
		}
		vals[i] = v
	}
	return true
}
