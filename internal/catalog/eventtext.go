package catalog

import (
	"bytes"
	"encoding/json"
	"fmt"
	"strconv"
	"strings"
)

// DetailText renders an event's detail for people (tenant show's table,
// the console; JSON output keeps the JSON): an object's fields as
// key=value pairs in the order stored, a string as itself, anything else
// as compact JSON.
func (e Event) DetailText() string {
	raw := e.Detail
	if len(bytes.TrimSpace(raw)) == 0 {
		return ""
	}
	var s string
	if json.Unmarshal(raw, &s) == nil {
		return s
	}
	dec := json.NewDecoder(bytes.NewReader(raw))
	if tok, err := dec.Token(); err != nil || tok != json.Delim('{') {
		return compactJSON(raw)
	}
	var pairs []string
	for dec.More() {
		key, err := dec.Token()
		if err != nil {
			return compactJSON(raw)
		}
		var v json.RawMessage
		if err := dec.Decode(&v); err != nil {
			return compactJSON(raw)
		}
		pairs = append(pairs, fmt.Sprint(key)+"="+detailValue(v))
	}
	return strings.Join(pairs, " ")
}

// detailValue is one value of an event's detail: a string bare, or quoted
// when it is empty or holds spaces, quotes or '='; anything else as JSON.
func detailValue(v json.RawMessage) string {
	var s string
	if !bytes.HasPrefix(bytes.TrimSpace(v), []byte(`"`)) || json.Unmarshal(v, &s) != nil {
		return compactJSON(v) // null too: it is not ""
	}
	if s == "" || strings.ContainsAny(s, " \t\n\"=") || strconv.Quote(s) != `"`+s+`"` {
		return strconv.Quote(s)
	}
	return s
}

func compactJSON(raw json.RawMessage) string {
	var b bytes.Buffer
	if json.Compact(&b, raw) != nil {
		return string(raw)
	}
	return b.String()
}
