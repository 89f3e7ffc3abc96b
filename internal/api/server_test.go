package api

import (
	"errors"
	"net/http/httptest"
	"strings"
	"testing"
)

// TestDecode_Strict: one JSON object with known fields, and nothing after it
// but whitespace.
func TestDecode_Strict(t *testing.T) {
	for _, tc := range []struct {
		name, body, want string // want "" = accepted
	}{
		{"object", `{"name":"c1","dsn":"x"}`, ""},
		{"trailing whitespace", "{\"name\":\"c1\"}\n\t ", ""},
		{"trailing garbage", `{"name":"c1"} garbage`, "unexpected data after the JSON object"},
		{"second object", `{"name":"c1"}{"name":"c2"}`, "unexpected data after the JSON object"},
		{"stray brace", `{"name":"c1"}}`, "unexpected data after the JSON object"},
		{"empty", ``, "empty"},
		{"unknown field", `{"nmae":"c1"}`, "unknown field"},
		{"truncated", `{"name":`, "request body"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var req AddClusterRequest
			err := decode(httptest.NewRequest("POST", "/v1/clusters", strings.NewReader(tc.body)), &req)
			if tc.want == "" {
				if err != nil {
					t.Fatalf("decode(%q) = %v, want nil", tc.body, err)
				}
				return
			}
			if !errors.Is(err, ErrInvalid) || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("decode(%q) = %v, want invalid containing %q", tc.body, err, tc.want)
			}
			if status, code := statusOf(err); status != 400 || code != "invalid" {
				t.Errorf("decode(%q): status %d %s, want 400 invalid", tc.body, status, code)
			}
		})
	}
}
