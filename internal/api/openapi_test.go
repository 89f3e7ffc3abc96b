package api

import (
	"encoding/json"
	"log/slog"
	"net/http/httptest"
	"os"
	"regexp"
	"slices"
	"strings"
	"testing"
)

// described returns the document's operations as "METHOD /path".
func described(t *testing.T) (map[string]bool, map[string]any) {
	t.Helper()
	var doc map[string]any
	if err := json.Unmarshal(OpenAPI(), &doc); err != nil {
		t.Fatal(err)
	}
	if got, want := doc["openapi"], "3.1.0"; got != want {
		t.Errorf("openapi = %v, want %v", got, want)
	}
	ops := map[string]bool{}
	for path, item := range doc["paths"].(map[string]any) {
		for method := range item.(map[string]any) {
			ops[strings.ToUpper(method)+" "+path] = true
		}
	}
	return ops, doc
}

// TestOpenAPI_DescribesEveryRoute: every /v1 route the server registers is
// in the document, every operation in the document is routed to its own
// handler (not the catch-all 404), and the document is served without a
// token.
func TestOpenAPI_DescribesEveryRoute(t *testing.T) {
	s := NewServer(Deps{Logger: slog.New(slog.DiscardHandler), Token: "pgt_x"})
	ops, _ := described(t)
	for _, r := range s.routes {
		if !ops[r] {
			t.Errorf("route %s is not in the OpenAPI document (add it to operations in openapi.go)", r)
		}
	}
	for op := range ops {
		if !slices.Contains(s.routes, op) {
			t.Errorf("the OpenAPI document describes %s, which the server does not route", op)
			continue
		}
		method, path, _ := strings.Cut(op, " ")
		req := httptest.NewRequest(method, strings.NewReplacer("{id}", "1", "{name}", "x").Replace(path), nil)
		if _, pattern := s.mux.Handler(req); pattern != op {
			t.Errorf("%s is served by %q", op, pattern)
		}
	}
	if len(ops) != len(operations) {
		t.Errorf("%d operations in the table, %d in the document: one is listed twice", len(operations), len(ops))
	}
	w := httptest.NewRecorder()
	s.ServeHTTP(w, httptest.NewRequest("GET", "/v1/openapi.json", nil))
	if w.Code != 200 || w.Header().Get("Content-Type") != "application/json" || w.Body.String() != string(OpenAPI()) {
		t.Errorf("GET /v1/openapi.json: %d %s, want 200 with the document", w.Code, w.Header().Get("Content-Type"))
	}
}

// TestOpenAPI_SchemasFollowEncodingJSON: a struct's schema lists exactly the
// members encoding/json writes (embedded structs flattened, "-" left out,
// omitempty not required), checked on a marshalled value of each.
func TestOpenAPI_SchemasFollowEncodingJSON(t *testing.T) {
	_, doc := described(t)
	defs := doc["components"].(map[string]any)["schemas"].(map[string]any)
	tenant := defs["Tenant"].(map[string]any)
	props := tenant["properties"].(map[string]any)
	b, err := json.Marshal(Tenant{})
	if err != nil {
		t.Fatal(err)
	}
	var written map[string]any
	_ = json.Unmarshal(b, &written)
	for k := range written {
		if props[k] == nil {
			t.Errorf("Tenant: %q is written but not in the schema", k)
		}
		if !slices.Contains(tenant["required"].([]any), any(k)) {
			t.Errorf("Tenant: %q is always written but not required", k)
		}
	}
	for _, k := range []string{"events", "prewarm", "metrics", "claimed_at"} {
		if props[k] == nil || slices.Contains(tenant["required"].([]any), any(k)) {
			t.Errorf("Tenant: %q must be an optional property", k)
		}
	}
	if req := defs["migrate.Request"].(map[string]any)["properties"].(map[string]any); req["Template"] != nil || req["template"] != nil {
		t.Errorf("migrate.Request: the field tagged \"-\" is in the schema")
	}
}

// routeRE finds a route in docs/api.md's table: `GET /v1/tenants?state=&limit=`.
var routeRE = regexp.MustCompile("`(GET|POST|PUT|PATCH|DELETE) (/v1/[^`? ]*)(\\?[^` ]*)?`")

// TestOpenAPI_APIDoc: docs/api.md's table names every operation of the
// document, and nothing else; the query parameters it shows exist.
func TestOpenAPI_APIDoc(t *testing.T) {
	b, err := os.ReadFile("../../docs/api.md")
	if err != nil {
		t.Fatal(err)
	}
	section := string(b)
	ops, doc := described(t)
	inDoc := map[string]bool{}
	for _, m := range routeRE.FindAllStringSubmatch(section, -1) {
		op := m[1] + " " + m[2]
		inDoc[op] = true
		if !ops[op] {
			t.Errorf("docs/api.md names %s, which the OpenAPI document does not describe", op)
			continue
		}
		params := map[string]bool{}
		o := doc["paths"].(map[string]any)[m[2]].(map[string]any)[strings.ToLower(m[1])].(map[string]any)
		ps, _ := o["parameters"].([]any)
		for _, p := range ps {
			params[p.(map[string]any)["name"].(string)] = true
		}
		for _, kv := range strings.Split(strings.TrimPrefix(m[3], "?"), "&") {
			if k, _, _ := strings.Cut(kv, "="); k != "" && !params[k] {
				t.Errorf("docs/api.md: %s takes ?%s=, which the document does not describe", op, k)
			}
		}
	}
	for op := range ops {
		if !inDoc[op] {
			t.Errorf("docs/api.md's table lacks %s", op)
		}
	}
}

// TestOpenAPI_StatusesTagsServers: every operation has a tag the document
// lists and declares its statuses (the other successes of a create, a dry
// run, a slow build; the errors of its kind); the document names its
// server.
func TestOpenAPI_StatusesTagsServers(t *testing.T) {
	_, doc := described(t)
	if servers, _ := doc["servers"].([]any); len(servers) != 1 {
		t.Errorf("servers = %v, want the daemon itself", doc["servers"])
	}
	listed := map[string]bool{}
	for _, tg := range doc["tags"].([]any) {
		listed[tg.(map[string]any)["name"].(string)] = true
	}
	for path, item := range doc["paths"].(map[string]any) {
		for method, o := range item.(map[string]any) {
			op := o.(map[string]any)
			tags, _ := op["tags"].([]any)
			if len(tags) != 1 || !listed[tags[0].(string)] {
				t.Errorf("%s %s: tags %v, want one of the document's", method, path, op["tags"])
			}
		}
	}
	for _, c := range []struct {
		method, path string
		want         []string
	}{
		{"post", "/v1/tenants", []string{"200", "201", "202", "400", "401", "403", "409", "503", "default"}},
		{"post", "/v1/templates/{name}/rollouts", []string{"200", "201", "404"}},
		{"post", "/v1/rebalance", []string{"200", "202"}},
		{"get", "/v1/backups", []string{"200", "409"}},
		{"get", "/v1/openapi.json", []string{"200", "default"}},
	} {
		resps := doc["paths"].(map[string]any)[c.path].(map[string]any)[c.method].(map[string]any)["responses"].(map[string]any)
		for _, st := range c.want {
			if _, ok := resps[st]; !ok {
				t.Errorf("%s %s does not declare %s", c.method, c.path, st)
			}
		}
	}
}
