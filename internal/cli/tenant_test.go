package cli

import (
	"bytes"
	"encoding/json"
	"io"
	"strings"
	"testing"
	"time"

	"github.com/pgtenant/pgtenant/internal/api"
	"github.com/pgtenant/pgtenant/internal/catalog"
)

// TestEventDetail_KeyValues: `tenant show` prints an event's detail as
// key=value pairs in the order stored (values with spaces quoted, nested
// values as compact JSON), a string detail as itself and an empty one as
// nothing, not as raw JSON; -o json keeps the JSON.
func TestEventDetail_KeyValues(t *testing.T) {
	for _, c := range []struct {
		detail, want string
	}{
		{`{"to": "local2", "job": 42, "from": "local"}`, `to=local2 job=42 from=local`},
		{`{"job": 7, "reason": "dropped by the owner", "empty": ""}`, `job=7 reason="dropped by the owner" empty=""`},
		{`{"keep_sessions": false, "at": null, "tables": ["a", "b"], "limits": {"cpu": 1}}`, `keep_sessions=false at=null tables=["a","b"] limits={"cpu":1}`},
		{`{"pause_ms": 1.5e3, "note": "line\nbreak"}`, `pause_ms=1.5e3 note="line\nbreak"`},
		{`"mirror disabled: the tenant was dropped"`, `mirror disabled: the tenant was dropped`},
		{`{}`, ``},
		{``, ``},
		{`[1, 2]`, `[1,2]`},
	} {
		if got := (catalog.Event{Detail: json.RawMessage(c.detail)}).DetailText(); got != c.want {
			t.Errorf("DetailText of %s = %q, want %q", c.detail, got, c.want)
		}
	}

	at := time.Date(2026, 12, 2, 8, 15, 0, 0, time.UTC)
	tn := api.Tenant{Events: []catalog.Event{{At: at, Kind: "moved", Detail: json.RawMessage(`{"from": "local", "to": "local2", "job": 9}`)},
		{At: at, Kind: "password_rotated", Detail: json.RawMessage(`{}`)}}}
	var table bytes.Buffer
	tenantDetail(&table, tn)
	for _, want := range []string{"moved from=local to=local2 job=9\n", "password_rotated\n"} {
		if !strings.Contains(table.String(), want) {
			t.Errorf("tenant show:\n%s\nwant a line ending %q", table.String(), want)
		}
	}
	if strings.Contains(table.String(), "{") {
		t.Errorf("tenant show prints raw JSON:\n%s", table.String())
	}
	var js bytes.Buffer
	g := &globals{output: "json", stdout: &js}
	if err := g.print(tn, func(w io.Writer) { tenantDetail(w, tn) }); err != nil {
		t.Fatal(err)
	}
	var back struct {
		Events []struct {
			Detail map[string]any `json:"detail"`
		} `json:"events"`
	}
	if err := json.Unmarshal(js.Bytes(), &back); err != nil || len(back.Events) != 2 || back.Events[0].Detail["to"] != "local2" {
		t.Errorf("-o json: %v\n%s\nwant the events' details as JSON objects", err, js.String())
	}
}
