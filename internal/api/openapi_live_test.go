package api_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/pgtenant/pgtenant/examples/templates"
	"github.com/pgtenant/pgtenant/internal/analytics"
	"github.com/pgtenant/pgtenant/internal/api"
	"github.com/pgtenant/pgtenant/internal/catalog"
	"github.com/pgtenant/pgtenant/internal/daemon/daemontest"
	"github.com/pgtenant/pgtenant/internal/jobs"
	"github.com/pgtenant/pgtenant/internal/migrate"
	"github.com/pgtenant/pgtenant/internal/pgtest"
	"github.com/pgtenant/pgtenant/internal/provision"
	tpl "github.com/pgtenant/pgtenant/internal/templates"
)

var pg *pgtest.Cluster

func TestMain(m *testing.M) {
	pgtest.Main(m, pgtest.Options{Standbys: 1}, &pg)
}

// exchange is one answer the daemon gave.
type exchange struct {
	method, path string
	status       int
	body         []byte
	contentType  string
}

// recorder keeps every answer that passes through it.
type recorder struct {
	mu   sync.Mutex
	seen []exchange
}

func (rec *recorder) RoundTrip(req *http.Request) (*http.Response, error) {
	resp, err := http.DefaultTransport.RoundTrip(req)
	if err != nil {
		return nil, err
	}
	body, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	if err != nil {
		return nil, err
	}
	resp.Body = io.NopCloser(bytes.NewReader(body))
	rec.mu.Lock()
	rec.seen = append(rec.seen, exchange{req.Method, req.URL.Path, resp.StatusCode, body, resp.Header.Get("Content-Type")})
	rec.mu.Unlock()
	return resp, nil
}

// TestOpenAPI_AnswersMatchTheSchemas drives a real daemon through its
// routes and checks every JSON answer against the document: a member the
// schema does not have, or a required one the answer lacks, or a value of
// another type, fails. Each route must be exercised at least once.
func TestOpenAPI_AnswersMatchTheSchemas(t *testing.T) {
	ctx := pgtest.Context(t)
	cfg := daemontest.Config(t, pg)
	cfg.Provision.DefaultPoolSize = 1
	_, c := daemontest.Start(t, pg, cfg)
	rec := &recorder{}
	c.HTTP.Transport = rec
	must := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	var doc map[string]any
	must(c.Do(ctx, "GET", "/v1/openapi.json", nil, &doc))

	_, err := c.Clusters(ctx)
	must(err)
	_, err = c.Cluster(ctx, "local")
	must(err)
	_, err = c.AddCluster(ctx, api.AddClusterRequest{Name: "local", DSN: "postgres://x@127.0.0.1:1/postgres"}) // 409: an error body
	if err == nil {
		t.Fatal("adding cluster local twice succeeded")
	}
	daemontest.CreateTemplate(t, c, "saas", templates.Saas())
	_, err = c.Templates(ctx)
	must(err)
	_, err = c.Template(ctx, "saas")
	must(err)
	name := "Acme"
	cr, err := c.CreateTenant(ctx, provision.Request{Template: "saas", Name: &name, ExternalID: "acme-1"})
	must(err)
	id := cr.Tenant.ID
	_, err = c.CreateTenant(ctx, provision.Request{Template: "saas", Name: &name, ExternalID: "acme-1"}) // existing
	must(err)
	for _, q := range []url.Values{{}, {"q": {"acm"}}, {"sort": {"size"}}, {"tier": {"standard"}, "limit": {"5"}}} {
		_, err = c.Tenants(ctx, q)
		must(err)
	}
	_, err = c.Tenant(ctx, id)
	must(err)
	var archive bytes.Buffer
	_, err = c.ExportTenant(ctx, id, &archive, nil)
	must(err)
	imported, err := c.ImportTenant(ctx, &archive, api.ImportTenantQuery{Cluster: "local"})
	must(err)
	_, err = c.WaitJob(ctx, imported.Job.ID, nil)
	must(err)
	_, err = c.TenantMetrics(ctx, id, "1h")
	must(err)
	_, err = c.SetMetricsExport(ctx, id, true)
	must(err)
	_, err = c.TenantAction(ctx, id, "suspend")
	must(err)
	_, err = c.TenantAction(ctx, id, "resume")
	must(err)
	_, err = c.RotatePassword(ctx, id, false)
	must(err)
	_, err = c.SetTenantTier(ctx, id, "default") // its tier already: changes nothing
	must(err)
	cred, err := c.CreateCredential(ctx, id, api.CreateCredentialRequest{Name: "reports", ReadOnly: true})
	must(err)
	_, err = c.Credentials(ctx, id)
	must(err)
	_, err = c.RotateCredential(ctx, id, cred.Credential.Name)
	must(err)
	_, err = c.RevokeCredential(ctx, id, cred.Credential.Name)
	must(err)
	var mv jobs.Job // 409: the tenant is on local already
	if err := c.Do(ctx, "POST", "/v1/tenants/"+id+"/move", api.MoveTenantRequest{To: "local"}, &mv); err == nil {
		t.Fatal("a move to the tenant's own cluster was accepted")
	}
	var an analytics.Status
	must(c.Do(ctx, "POST", "/v1/tenants/"+id+"/analytics", nil, &an))
	must(c.Do(ctx, "GET", "/v1/tenants/"+id+"/analytics", nil, &an))
	must(c.Do(ctx, "DELETE", "/v1/tenants/"+id+"/analytics", nil, &an))
	var pw []jobs.Job
	must(c.Do(ctx, "POST", "/v1/tenants/"+id+"/prewarm", nil, &pw))
	_, err = c.Prewarm(ctx, api.PrewarmRequest{All: true})
	must(err)
	_, err = c.Capture(ctx, api.CaptureRequest{})
	must(err)
	js, err := c.Jobs(ctx, url.Values{"limit": {"10"}})
	must(err)
	j, err := c.Job(ctx, js[0].ID)
	must(err)
	if _, err = c.WaitJob(ctx, j.ID, nil); err != nil {
		t.Fatal(err)
	}
	_, _ = c.CancelJob(ctx, j.ID) // finished: a 409, an error body
	_, _ = c.RetryJob(ctx, j.ID)
	_, err = c.Reconcile(ctx, api.ReconcileRequest{})
	must(err)
	_, err = c.Doctor(ctx, "")
	must(err)
	_, err = c.PushTemplate(ctx, "saas", append(templates.Saas(), templatesUpload("0002_more.sql", "CREATE TABLE more (id int);")))
	must(err)
	st, err := c.StartRollout(ctx, migrate.Request{Template: "saas", DryRun: true})
	must(err)
	_ = st
	started, err := c.StartRollout(ctx, migrate.Request{Template: "saas", Canary: 1})
	must(err)
	ro := started.Rollout
	if ro == nil {
		t.Fatal("no rollout started")
	}
	_, err = c.Rollouts(ctx, nil)
	must(err)
	_, err = c.Rollout(ctx, ro.ID, url.Values{"state": {"all"}})
	must(err)
	_, _ = c.ContinueRollout(ctx, ro.ID) // 200, or 409 before its canary is done
	_, _ = c.RetryRollout(ctx, ro.ID, "")
	_, err = c.DropTenant(ctx, id, false)
	must(err)
	_, err = c.TenantAction(ctx, id, "restore")
	must(err)
	_, _ = c.DeleteTemplate(ctx, "saas") // 409: it has tenants
	maxTenants := 100
	_, err = c.SetCluster(ctx, "local", catalog.PlacementChange{MaxTenants: &maxTenants, Labels: map[string]string{"disk": "ssd"}})
	must(err)
	_, err = c.Rebalance(ctx, api.RebalanceRequest{DryRun: true})
	must(err)
	// This daemon backs nothing up: both answer 409 saying so (internal/backup
	// tests the answers of a cluster that is backed up).
	if _, err := c.Backups(ctx, "local"); !errors.Is(err, catalog.ErrConflict) {
		t.Errorf("backup list without backups: err = %v, want a conflict", err)
	}
	if _, err := c.BackupNow(ctx, api.BackupRequest{Cluster: "local", Type: "diff"}); !errors.Is(err, catalog.ErrConflict) {
		t.Errorf("backup now without backups: err = %v, want a conflict", err)
	}
	if _, err := c.RewindTenant(ctx, id, time.Now().Add(-time.Second)); !errors.Is(err, catalog.ErrConflict) {
		t.Errorf("rewind without backups: err = %v, want a conflict", err)
	}
	if _, err := c.ForkTenant(ctx, id, api.ForkTenantRequest{}); !errors.Is(err, catalog.ErrConflict) {
		t.Errorf("fork without backups: err = %v, want a conflict", err)
	}
	_, err = c.DrainCluster(ctx, "local") // one cluster: its job finds nowhere to move the tenant
	must(err)
	_, err = c.UndrainCluster(ctx, "local")
	must(err)
	// local is not run by Patroni: both answer 400 saying so (internal/failover
	// tests the switchover of a cluster that is).
	for _, change := range []func(context.Context, string, api.SwitchoverRequest) (jobs.Job, error){c.Switchover, c.Failover} {
		if _, err := change(ctx, "local", api.SwitchoverRequest{To: "n2"}); !errors.Is(err, api.ErrInvalid) {
			t.Errorf("switchover of a cluster without Patroni: err = %v, want invalid", err)
		}
	}
	tok, err := c.CreateToken(ctx, api.CreateTokenRequest{Name: "ci", Scope: api.ScopeReadOnly, ExpiresIn: "30d"})
	must(err)
	_, err = c.Tokens(ctx)
	must(err)
	_, err = c.RevokeToken(ctx, tok.Token.ID)
	must(err)
	_, err = c.Audit(ctx, url.Values{"since": {"1h"}, "limit": {"50"}})
	must(err)
	_, err = c.Usage(ctx, url.Values{"tenant": {id}, "from": {"2h"}})
	must(err)
	if _, err := c.Usage(ctx, url.Values{"from": {"yesterday"}}); !errors.Is(err, api.ErrInvalid) { // 400: an error body
		t.Errorf("usage from=yesterday: err = %v, want invalid", err)
	}

	ops := map[string]bool{}
	for _, x := range rec.seen {
		op, o := match(doc, x.method, x.path)
		if o == nil {
			t.Errorf("%s %s: answered %d, but the document has no such operation", x.method, x.path, x.status)
			continue
		}
		ops[op] = true
		// Every status a route answers is declared, with its body's schema
		// (500 is the default answer).
		resps := o["responses"].(map[string]any)
		r, ok := resps[fmt.Sprint(x.status)].(map[string]any)
		if !ok && x.status == http.StatusInternalServerError {
			r, ok = resps["default"].(map[string]any)
		}
		if !ok {
			t.Errorf("%s: answered %d, which the document does not declare (declared: %v)", op, x.status, keys(resps))
			continue
		}
		content := r["content"].(map[string]any)
		if _, ok := content["application/json"]; !ok {
			if _, ok := content[x.contentType]; !ok {
				t.Errorf("%s: answered %s, the document says %v", op, x.contentType, content)
			}
			continue
		}
		schema := content["application/json"].(map[string]any)["schema"].(map[string]any)
		var v any
		if err := json.Unmarshal(x.body, &v); err != nil {
			t.Errorf("%s: answer is not JSON: %v", op, err)
			continue
		}
		for _, problem := range validate(doc, schema, v, "") {
			t.Errorf("%s (%d): %s", op, x.status, problem)
		}
	}
	for path, item := range doc["paths"].(map[string]any) {
		for method := range item.(map[string]any) {
			if op := strings.ToUpper(method) + " " + path; !ops[op] {
				t.Errorf("%s was not exercised: add it to this test", op)
			}
		}
	}

	// Every member of a documented request body is one its handler
	// decodes: handlers refuse unknown members (400 "unknown field"), so a
	// body with all of them, zero-valued, must never be refused for one.
	for path, item := range doc["paths"].(map[string]any) {
		for method, o := range item.(map[string]any) {
			rb, ok := o.(map[string]any)["requestBody"].(map[string]any)
			if !ok {
				continue
			}
			js, ok := rb["content"].(map[string]any)["application/json"].(map[string]any)
			if !ok {
				continue // an archive, not JSON
			}
			schema := js["schema"].(map[string]any)
			body := map[string]any{}
			for k, ps := range resolve(doc, schema)["properties"].(map[string]any) {
				body[k] = zero(doc, ps.(map[string]any))
			}
			url := strings.NewReplacer("{id}", "999999", "{name}", "nosuch").Replace(path)
			err := c.Do(ctx, strings.ToUpper(method), url, body, nil)
			if err != nil && strings.Contains(err.Error(), "unknown field") {
				t.Errorf("%s %s: the handler refuses a member the document lists: %v", strings.ToUpper(method), path, err)
			}
		}
	}
}

// resolve follows a $ref.
func resolve(doc, schema map[string]any) map[string]any {
	if ref, ok := schema["$ref"].(string); ok {
		return doc["components"].(map[string]any)["schemas"].(map[string]any)[strings.TrimPrefix(ref, "#/components/schemas/")].(map[string]any)
	}
	return schema
}

// zero is a zero value of a schema's type.
func zero(doc, schema map[string]any) any {
	schema = resolve(doc, schema)
	if alts, ok := schema["anyOf"].([]any); ok {
		return zero(doc, alts[0].(map[string]any))
	}
	ty := schema["type"]
	if list, ok := ty.([]any); ok {
		ty = list[0]
	}
	switch ty {
	case "string":
		return ""
	case "integer", "number":
		return 0
	case "boolean":
		return false
	case "array":
		return []any{}
	}
	return nil
}

func templatesUpload(name, body string) tpl.Upload { return tpl.Upload{Name: name, Body: body} }

// match finds the operation of a request path.
func match(doc map[string]any, method, path string) (string, map[string]any) {
	segs := strings.Split(path, "/")
	for p, item := range doc["paths"].(map[string]any) {
		ps := strings.Split(p, "/")
		if len(ps) != len(segs) {
			continue
		}
		ok := true
		for i := range ps {
			if ps[i] != segs[i] && !strings.HasPrefix(ps[i], "{") {
				ok = false
			}
		}
		if o, has := item.(map[string]any)[strings.ToLower(method)]; ok && has {
			return method + " " + p, o.(map[string]any)
		}
	}
	return "", nil
}

// validate checks v against the JSON Schema subset the document uses.
func validate(doc, schema map[string]any, v any, at string) []string {
	if ref, ok := schema["$ref"].(string); ok {
		name := strings.TrimPrefix(ref, "#/components/schemas/")
		return validate(doc, doc["components"].(map[string]any)["schemas"].(map[string]any)[name].(map[string]any), v, at)
	}
	if alts, ok := schema["anyOf"].([]any); ok {
		var all []string
		for _, s := range alts {
			p := validate(doc, s.(map[string]any), v, at)
			if len(p) == 0 {
				return nil
			}
			all = append(all, p...)
		}
		return all
	}
	var types []string
	switch ty := schema["type"].(type) {
	case string:
		types = []string{ty}
	case []any:
		for _, x := range ty {
			types = append(types, x.(string))
		}
	case nil:
		return nil // any value
	}
	got := jsonType(v)
	if !slices.Contains(types, got) && !(got == "integer" && slices.Contains(types, "number")) {
		return []string{fmt.Sprintf("%s: a %s, the document says %v", at, got, types)}
	}
	var problems []string
	switch x := v.(type) {
	case []any:
		for i, e := range x {
			problems = append(problems, validate(doc, schema["items"].(map[string]any), e, fmt.Sprintf("%s[%d]", at, i))...)
		}
	case map[string]any:
		props, _ := schema["properties"].(map[string]any)
		for k, e := range x {
			if ps, ok := props[k]; ok {
				problems = append(problems, validate(doc, ps.(map[string]any), e, at+"."+k)...)
			} else if ap, ok := schema["additionalProperties"].(map[string]any); ok {
				problems = append(problems, validate(doc, ap, e, at+"."+k)...)
			} else if schema["additionalProperties"] == false {
				problems = append(problems, fmt.Sprintf("%s.%s is in the answer but not in the document", at, k))
			}
		}
		req, _ := schema["required"].([]any)
		for _, k := range req {
			if _, ok := x[k.(string)]; !ok {
				problems = append(problems, fmt.Sprintf("%s.%s is required by the document but not in the answer", at, k))
			}
		}
	}
	return problems
}

func jsonType(v any) string {
	switch x := v.(type) {
	case nil:
		return "null"
	case bool:
		return "boolean"
	case string:
		return "string"
	case float64:
		if x == float64(int64(x)) {
			return "integer"
		}
		return "number"
	case []any:
		return "array"
	}
	return "object"
}

func keys(m map[string]any) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	slices.Sort(out)
	return out
}
