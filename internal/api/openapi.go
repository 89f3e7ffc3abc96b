package api

import (
	"encoding/json"
	"fmt"
	"net/http"
	"reflect"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/pgtenant/pgtenant/internal/analytics"

	"github.com/pgtenant/pgtenant/internal/backup"
	"github.com/pgtenant/pgtenant/internal/catalog"
	"github.com/pgtenant/pgtenant/internal/doctor"
	"github.com/pgtenant/pgtenant/internal/jobs"
	"github.com/pgtenant/pgtenant/internal/migrate"
	"github.com/pgtenant/pgtenant/internal/prewarm"
	"github.com/pgtenant/pgtenant/internal/provision"
	"github.com/pgtenant/pgtenant/internal/reconcile"
	"github.com/pgtenant/pgtenant/internal/templates"
)

// The OpenAPI 3.1 document of /v1 (GET /v1/openapi.json). Its operations
// are the table below; its schemas are built from the wire types
// themselves, so that a field is described exactly as encoding/json writes
// it. TestOpenAPI_* check the table against the router (every route
// described, nothing described that is not routed), the schemas against
// answers of a real daemon, and docs/api.md's table against the document.

// operation is one route as the document describes it.
type operation struct {
	method, path string
	summary      string
	query        []param
	request      any // a value of the JSON body's type; nil: no body
	optionalBody bool
	status       int // the success status
	response     any // a value of the answer's type
	public       bool
	// rawRequest and rawResponse are the media type of a body that is not
	// JSON (request and response are then unset).
	rawRequest, rawResponse string
	// also are the other success statuses (same answer type); errors the
	// error statuses the operation gives besides those errorStatuses
	// declares for every operation of its kind.
	also, errors []int
}

type param struct{ name, typ, desc string }

var (
	limitParam = param{"limit", "integer", "at most this many"}
	// operations is every /v1 route, in docs/api.md's order.
	operations = []operation{
		{method: "GET", path: "/v1/openapi.json", summary: "this document (no token needed)", status: 200, response: map[string]any{}, public: true},
		{method: "GET", path: "/v1/clusters", summary: "list clusters, probed now", status: 200, response: []Cluster{}},
		{method: "POST", path: "/v1/clusters", summary: "register an external cluster", request: AddClusterRequest{}, status: 201, response: Cluster{}},
		{method: "GET", path: "/v1/clusters/{name}", summary: "show a cluster with its server's settings", status: 200, response: ClusterDetail{}},
		{method: "PATCH", path: "/v1/clusters/{name}", summary: "set a cluster's placement caps and labels", request: catalog.PlacementChange{}, status: 200, response: Cluster{}},
		{method: "POST", path: "/v1/clusters/{name}/drain", summary: "drain a cluster: no new tenants, its tenants moved away (a job)", status: 202, response: jobs.Job{}},
		{method: "POST", path: "/v1/clusters/{name}/undrain", summary: "place tenants on a drained cluster again", status: 200, response: Cluster{}},
		{method: "POST", path: "/v1/clusters/{name}/switchover", summary: "change a Patroni cluster's leader, its front door paused meanwhile (a job); 400 for a cluster Patroni does not run or a member that cannot take over",
			request: SwitchoverRequest{}, status: 202, response: jobs.Job{}},
		{method: "POST", path: "/v1/clusters/{name}/failover", summary: "force the member to leads a Patroni cluster (a job), even with a healthy leader or none",
			request: SwitchoverRequest{}, status: 202, response: jobs.Job{}},
		{method: "POST", path: "/v1/rebalance", summary: "plan moves that even out the clusters; without dry_run, start them (a job: 202; a dry run or nothing to move: 200)", request: RebalanceRequest{}, status: 202, also: []int{200}, response: RebalanceResponse{}},
		{method: "GET", path: "/v1/backups", summary: "list a cluster's pgBackRest backups, archive and recovery window (every backed-up cluster without cluster)",
			query: []param{{"cluster", "string", "only this cluster"}}, status: 200, errors: []int{409}, response: []backup.ClusterBackups{}},
		{method: "POST", path: "/v1/backups", summary: "start a backup of a cluster (or every backed-up cluster): a job; 409 while one runs", request: BackupRequest{}, status: 202, response: []jobs.Job{}},
		{method: "GET", path: "/v1/templates", summary: "list templates", status: 200, response: []TemplateSummary{}},
		{method: "POST", path: "/v1/templates", summary: "create a template (version 1) and start its builds", request: CreateTemplateRequest{}, status: 201, response: templates.Added{}},
		{method: "GET", path: "/v1/templates/{name}", summary: "show a template: versions, builds, tenants by version", status: 200, response: TemplateDetail{}},
		{method: "POST", path: "/v1/templates/{name}/versions", summary: "push the next version of a template", request: CreateTemplateRequest{}, status: 201, response: templates.Added{}},
		{method: "DELETE", path: "/v1/templates/{name}", summary: "delete a template without tenants", status: 202, response: templates.Deleted{}},
		{method: "POST", path: "/v1/tenants", summary: "create a tenant (201; 200 for a known external id; 202 while a cold build outlasts provision.cold_wait; 409 for a known external id asked with other parameters, naming them)", request: provision.Request{}, status: 201, also: []int{200, 202}, response: CreateTenantResponse{}},
		{method: "GET", path: "/v1/tenants", summary: "list tenants (spares are never listed)", query: []param{
			{"q", "string", "search: the id, or part of the name or external id (case-insensitive)"},
			{"state", "string", "active, suspended, dropped, provisioning, purging"},
			{"template", "string", "template name"}, {"mode", "string", "database or schema"},
			{"cluster", "string", "cluster name"}, {"tier", "string", "tier name"},
			{"sort", "string", "size or activity: largest or busiest first (not paged)"},
			limitParam, {"after", "string", "the last id of the previous page"}}, status: 200, response: []Tenant{}},
		{method: "GET", path: "/v1/tenants/{id}", summary: "show a tenant with its events, metrics and prewarm state", status: 200, response: Tenant{}},
		{method: "PATCH", path: "/v1/tenants/{id}", summary: "change a tenant's tier, labels (placement pins) or allowlist: in place, or by a move to a cluster the tier or labels need (202 with its job)",
			request: SetTenantRequest{}, status: 200, also: []int{202}, response: LifecycleResponse{}},
		{method: "DELETE", path: "/v1/tenants/{id}", summary: "drop a tenant (restorable until its purge)", query: []param{{"purge_now", "boolean", "purge at once"}}, status: 200, response: LifecycleResponse{}},
		{method: "POST", path: "/v1/tenants/{id}/restore", summary: "restore a dropped tenant", status: 200, response: LifecycleResponse{}},
		{method: "POST", path: "/v1/tenants/{id}/suspend", summary: "suspend a tenant: no logins, sessions ended", status: 200, response: LifecycleResponse{}},
		{method: "POST", path: "/v1/tenants/{id}/resume", summary: "resume a suspended tenant", status: 200, response: LifecycleResponse{}},
		{method: "GET", path: "/v1/tenants/{id}/credentials", summary: "list a tenant's extra logins (never their passwords)", status: 200, response: []catalog.Login{}},
		{method: "POST", path: "/v1/tenants/{id}/credentials", summary: "give a tenant another login: read-write, read-only or replica (its password shown once)",
			request: CreateCredentialRequest{}, status: 201, response: CredentialResponse{}},
		{method: "POST", path: "/v1/tenants/{id}/credentials/{name}/password", summary: "give one of a tenant's logins a new password", status: 200, response: CredentialResponse{}},
		{method: "DELETE", path: "/v1/tenants/{id}/credentials/{name}", summary: "revoke one of a tenant's logins; the answer is those left", status: 200, response: []catalog.Login{}},
		{method: "POST", path: "/v1/tenants/{id}/move", summary: "move a tenant to another cluster (a job)", request: MoveTenantRequest{}, status: 202, response: jobs.Job{}},
		{method: "POST", path: "/v1/tenants/{id}/rewind", summary: "take a tenant back to a time, in place, from its cluster's backup (a job)", request: RewindTenantRequest{}, status: 202, response: jobs.Job{}},
		{method: "POST", path: "/v1/tenants/{id}/fork", summary: "make a new tenant holding a tenant's data as of a time (its credentials, and the job that copies the data)", request: ForkTenantRequest{}, status: 202, response: CreateTenantResponse{}},
		{method: "POST", path: "/v1/tenants/{id}/export", summary: "a portable archive of the tenant (a tar of manifest.json and pg_dump's custom format), consistent as of one snapshot; 409 unless active or suspended, or with extensions in its database",
			status: 200, rawResponse: ArchiveType},
		{method: "POST", path: "/v1/tenants/import", summary: "make a new tenant from an archive of `tenant export` (its credentials, and the job that copies the data); 400 for a damaged archive, 409 when this installation lacks the archive's template version, the disk has not room for it, or its dump is larger than the tier's storage quota",
			query: []param{{"cluster", "string", "the cluster to put it on (default: placement chooses)"}, {"tier", "string", "its tier (default: the default tier)"},
				{"name", "string", "its name (default: the archived tenant's)"}},
			rawRequest: ArchiveType, status: 202, response: CreateTenantResponse{}},
		{method: "POST", path: "/v1/tenants/{id}/password", summary: "rotate a tenant's password", request: RotatePasswordRequest{}, optionalBody: true, status: 200, response: RotatePasswordResponse{}},
		{method: "GET", path: "/v1/jobs", summary: "list jobs, newest first", query: []param{
			{"state", "string", "a state, or active"}, {"type", "string", "job type"},
			{"target_kind", "string", "tenant, template, cluster …"}, {"target", "string", "target id"}, limitParam}, status: 200, response: []jobs.Job{}},
		{method: "GET", path: "/v1/jobs/{id}", summary: "show a job with its steps", status: 200, response: jobs.Job{}},
		{method: "POST", path: "/v1/jobs/{id}/cancel", summary: "cancel a job", status: 200, response: jobs.Job{}},
		{method: "POST", path: "/v1/jobs/{id}/retry", summary: "requeue a failed or cancelled job", status: 200, response: jobs.Job{}},
		{method: "POST", path: "/v1/reconcile", summary: "compare the catalog with the clusters (and repair with fix)", request: ReconcileRequest{}, status: 200, response: reconcile.Report{}},
		{method: "POST", path: "/v1/prewarm", summary: "start prewarm jobs for a tenant, a cluster or all", request: PrewarmRequest{}, status: 202, response: []jobs.Job{}},
		{method: "POST", path: "/v1/tenants/{id}/prewarm", summary: "prewarm a tenant on every node", status: 202, response: []jobs.Job{}},
		{method: "POST", path: "/v1/prewarm/capture", summary: "capture hot sets now", request: CaptureRequest{}, status: 200, response: []prewarm.CaptureResult{}},
		{method: "POST", path: "/v1/templates/{name}/rollouts", summary: "start a rollout (201), or plan one with dry_run (200)", request: migrate.Request{}, status: 201, also: []int{200}, response: migrate.Started{}},
		{method: "GET", path: "/v1/rollouts", summary: "list rollouts, newest first", query: []param{{"template", "string", "template name"}, limitParam}, status: 200, response: []migrate.Status{}},
		{method: "GET", path: "/v1/rollouts/{id}", summary: "show a rollout with its tenants", query: []param{
			{"state", "string", "tenants in these states (comma-separated: pending, running, done, failed, skipped) or all; default all but done"}, limitParam}, status: 200, response: migrate.Status{}},
		{method: "POST", path: "/v1/rollouts/{id}/continue", summary: "let a rollout paused after its canary go on", status: 200, response: migrate.Status{}},
		{method: "POST", path: "/v1/rollouts/{id}/retry", summary: "rerun a rollout's failed tenants (or one)", request: RetryRolloutRequest{}, optionalBody: true, status: 200, response: migrate.Status{}},
		{method: "GET", path: "/v1/tenants/{id}/metrics", summary: "a tenant's figures, quota state and minute history", query: []param{{"history", "string", "a duration such as 1h or 7d"}}, status: 200, response: TenantMetrics{}},
		{method: "PUT", path: "/v1/tenants/{id}/metrics/export", summary: "always export (or stop exporting) a tenant's series on /metrics", request: MetricsExportRequest{}, status: 200, response: TenantMetrics{}},
		{method: "GET", path: "/v1/tenants/{id}/analytics", summary: "a tenant's analytics mirror: its state, DSN and lag", status: 200, response: analytics.Status{}},
		{method: "POST", path: "/v1/tenants/{id}/analytics", summary: "enable a tenant's analytics mirror", request: EnableAnalyticsRequest{}, optionalBody: true, status: 202, response: analytics.Status{}},
		{method: "DELETE", path: "/v1/tenants/{id}/analytics", summary: "disable a tenant's analytics mirror (slot, publication and file dropped)", status: 202, response: analytics.Status{}},
		{method: "GET", path: "/v1/usage", summary: "usage per tenant and hour, for billing: storage byte-hours, CPU seconds, rows written, connection-seconds, front door bytes (read from the catalog only)", query: []param{
			{"tenant", "string", "one tenant (default every tenant)"},
			{"from", "string", "an RFC 3339 time, a date or a duration back from now (default: to - 24h); down to its hour"},
			{"to", "string", "an RFC 3339 time, a date or a duration back from now (default now); up to the next hour; at most 92 days after from"}},
			status: 200, response: UsageReport{}},
		{method: "GET", path: "/v1/doctor", summary: "the doctor's report", query: []param{{"cluster", "string", "one cluster (default all)"}}, status: 200, response: doctor.Report{}},
		{method: "POST", path: "/v1/tokens", summary: "create a scoped API token (admin): the answer holds the token, shown this once", request: CreateTokenRequest{}, status: 201, response: CreateTokenResponse{}},
		{method: "GET", path: "/v1/tokens", summary: "list scoped API tokens (never the tokens themselves)", status: 200, response: []Token{}},
		{method: "DELETE", path: "/v1/tokens/{id}", summary: "revoke a scoped API token, at once (admin)", status: 200, response: Token{}},
		{method: "GET", path: "/v1/audit", summary: "the audit log of mutating calls, newest first", query: []param{
			{"since", "string", "a duration back from now such as 24h or 7d, or an RFC 3339 time"}, {"limit", "integer", "at most this many (default 100, at most 10000)"}}, status: 200, response: []AuditEntry{}},
	}
)

var (
	openAPIOnce sync.Once
	openAPIJSON []byte
)

// OpenAPI returns the document, built once.
func OpenAPI() []byte {
	openAPIOnce.Do(func() {
		b, err := json.MarshalIndent(buildOpenAPI(), "", "  ")
		if err != nil {
			panic(err) // maps and strings only
		}
		openAPIJSON = b
	})
	return openAPIJSON
}

// serveOpenAPI answers GET /v1/openapi.json without a token: it describes
// the routes, not the fleet.
func (s *Server) serveOpenAPI(w http.ResponseWriter, r *http.Request) {
	w.Header().Set("Content-Type", "application/json")
	_, _ = w.Write(OpenAPI())
}

func buildOpenAPI() map[string]any {
	sch := &schemas{defs: map[string]any{}, names: map[reflect.Type]string{}}
	paths := map[string]any{}
	errResp := map[string]any{"description": "an error: code and message", "content": map[string]any{
		"application/json": map[string]any{"schema": sch.of(reflect.TypeFor[ErrorBody]())}}}
	for _, op := range operations {
		o := map[string]any{"summary": op.summary, "operationId": operationID(op)}
		var params []any
		for _, seg := range strings.Split(op.path, "/") {
			if name, ok := strings.CutPrefix(seg, "{"); ok {
				params = append(params, map[string]any{"name": strings.TrimSuffix(name, "}"), "in": "path", "required": true,
					"schema": map[string]any{"type": "string"}})
			}
		}
		for _, p := range op.query {
			params = append(params, map[string]any{"name": p.name, "in": "query", "description": p.desc, "schema": map[string]any{"type": p.typ}})
		}
		if params != nil {
			o["parameters"] = params
		}
		raw := func(media string) map[string]any {
			return map[string]any{media: map[string]any{"schema": map[string]any{"type": "string", "contentMediaType": media}}}
		}
		if op.request != nil {
			o["requestBody"] = map[string]any{"required": !op.optionalBody, "content": map[string]any{
				"application/json": map[string]any{"schema": sch.of(reflect.TypeOf(op.request))}}}
		} else if op.rawRequest != "" {
			o["requestBody"] = map[string]any{"required": true, "content": raw(op.rawRequest)}
		}
		content := raw(op.rawResponse)
		if op.rawResponse == "" {
			content = map[string]any{"application/json": map[string]any{"schema": sch.of(reflect.TypeOf(op.response))}}
		}
		resps := map[string]any{"default": errResp}
		for _, st := range append([]int{op.status}, op.also...) {
			resps[fmt.Sprint(st)] = map[string]any{"description": http.StatusText(st), "content": content}
		}
		for _, st := range errorStatuses(op) {
			resps[fmt.Sprint(st)] = map[string]any{"description": http.StatusText(st) + ": " + errorMeaning[st], "content": errResp["content"]}
		}
		o["responses"] = resps
		o["tags"] = []string{tagOf(op.path)}
		if op.public {
			o["security"] = []any{}
		} else {
			o["x-pgtenant-scope"] = string(scopeOf(op.method + " " + op.path))
		}
		item, _ := paths[op.path].(map[string]any)
		if item == nil {
			item = map[string]any{}
			paths[op.path] = item
		}
		item[strings.ToLower(op.method)] = o
	}
	var tags []any
	for _, t := range tagList {
		tags = append(tags, map[string]any{"name": t[0], "description": t[1]})
	}
	return map[string]any{
		"openapi": "3.1.0",
		"servers": []any{map[string]any{"url": "/", "description": "the daemon that serves this document"}},
		"tags":    tags,
		"info": map[string]any{"title": "pgtenant", "version": Version,
			"description": "pgtenant's control-plane API. Every route but this document needs `Authorization: Bearer $PGTENANT_TOKEN`: the token file's admin token, or a scoped token (POST /v1/tokens). Each operation's x-pgtenant-scope is the scope it needs (read-only: any token; admin: every operation); a token without it gets 403. A request body is exactly one JSON object with known fields."},
		"paths":    paths,
		"security": []any{map[string]any{"token": []any{}}},
		"components": map[string]any{
			"securitySchemes": map[string]any{"token": map[string]any{"type": "http", "scheme": "bearer"}},
			"schemas":         sch.defs,
		},
	}
}

// errorStatuses are the error statuses op gives (besides 500, the default
// answer): 401 and 403 and 503 (a database pgtenant needs does not answer)
// unless public, 400 for what it reads (a body, a query, a write), 404 for
// a path naming a resource, 409 for a write, and op.errors.
func errorStatuses(op operation) []int {
	if op.public {
		return nil
	}
	out := []int{http.StatusUnauthorized, http.StatusForbidden, http.StatusServiceUnavailable}
	if op.request != nil || op.rawRequest != "" || len(op.query) > 0 || op.method != "GET" {
		out = append(out, http.StatusBadRequest)
	}
	if strings.Contains(op.path, "{") {
		out = append(out, http.StatusNotFound)
	}
	if op.method != "GET" {
		out = append(out, http.StatusConflict)
	}
	for _, st := range op.errors {
		if !slices.Contains(out, st) {
			out = append(out, st)
		}
	}
	return out
}

// errorMeaning is what an error status means in this API (the error
// body's code says it too).
var errorMeaning = map[int]string{
	http.StatusBadRequest:         "the request is invalid (code invalid); the message names what and what is accepted",
	http.StatusUnauthorized:       "no token, or one not known or expired (code unauthorized)",
	http.StatusForbidden:          "the token's scope does not allow this operation (code forbidden)",
	http.StatusNotFound:           "what the path names does not exist (code not_found)",
	http.StatusConflict:           "the request is fine but the state refuses it now (code conflict); the message says why and what to do",
	http.StatusServiceUnavailable: "a database or pooler pgtenant needs does not answer, or there is no capacity (code unavailable or no_capacity); retried later, it may succeed",
}

// tagList are the document's tags, in order: the first path segment
// after /v1/ picks one (tagOf).
var tagList = [][2]string{
	{"clusters", "clusters: register, inspect, cap, drain, rebalance, switch over"},
	{"backups", "pgBackRest backups of the clusters"},
	{"templates", "templates, their versions and rollouts"},
	{"tenants", "tenants: create, inspect, drop, suspend, move, rewind, fork, export, import, metrics, usage, analytics"},
	{"jobs", "durable jobs: list, show, cancel, retry"},
	{"operations", "reconcile, doctor, prewarm"},
	{"access", "scoped API tokens and the audit log"},
	{"meta", "this document"},
}

// tagOf is the tag of an operation's path.
func tagOf(path string) string {
	seg, _, _ := strings.Cut(strings.TrimPrefix(path, "/v1/"), "/")
	switch seg {
	case "clusters", "rebalance":
		return "clusters"
	case "backups", "templates", "tenants", "jobs":
		return seg
	case "usage":
		return "tenants"
	case "rollouts":
		return "templates"
	case "reconcile", "doctor", "prewarm":
		return "operations"
	case "tokens", "audit":
		return "access"
	}
	return "meta"
}

// operationID is e.g. "post_tenants_id_suspend".
func operationID(op operation) string {
	p := strings.NewReplacer("/v1/", "", "{", "", "}", "", "/", "_", ".", "_").Replace(op.path)
	return strings.ToLower(op.method) + "_" + p
}

// schemas builds JSON Schemas (draft 2020-12, as OpenAPI 3.1 uses) from Go
// types the way encoding/json marshals them; each struct becomes a named
// component.
type schemas struct {
	defs  map[string]any
	names map[reflect.Type]string
}

var (
	timeType = reflect.TypeFor[time.Time]()
	rawType  = reflect.TypeFor[json.RawMessage]()
)

func (s *schemas) of(t reflect.Type) map[string]any {
	switch {
	case t == timeType:
		return map[string]any{"type": "string", "format": "date-time"}
	case t == rawType:
		return map[string]any{} // any JSON value
	case t.Kind() == reflect.Pointer:
		return map[string]any{"anyOf": []any{s.of(t.Elem()), map[string]any{"type": "null"}}}
	}
	switch t.Kind() {
	case reflect.String:
		return map[string]any{"type": "string"}
	case reflect.Bool:
		return map[string]any{"type": "boolean"}
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64,
		reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64:
		return map[string]any{"type": "integer"}
	case reflect.Float32, reflect.Float64:
		return map[string]any{"type": "number"}
	case reflect.Slice, reflect.Array:
		if t.Elem().Kind() == reflect.Uint8 {
			return map[string]any{"type": "string", "contentEncoding": "base64"}
		}
		// A nil slice is written as null.
		return map[string]any{"type": []any{"array", "null"}, "items": s.of(t.Elem())}
	case reflect.Map:
		return map[string]any{"type": []any{"object", "null"}, "additionalProperties": s.of(t.Elem())}
	case reflect.Interface:
		return map[string]any{}
	case reflect.Struct:
		return map[string]any{"$ref": "#/components/schemas/" + s.component(t)}
	}
	panic(fmt.Sprintf("openapi: no schema for %v", t))
}

// component defines t's schema once and returns its name.
func (s *schemas) component(t reflect.Type) string {
	if name, ok := s.names[t]; ok {
		return name
	}
	name := t.Name()
	if pkg := t.PkgPath(); !strings.HasSuffix(pkg, "/internal/api") {
		name = pkg[strings.LastIndex(pkg, "/")+1:] + "." + name
	}
	s.names[t] = name
	props, required := map[string]any{}, []any{}
	for _, f := range jsonFields(t) {
		props[f.name] = s.of(f.typ)
		if !f.omitEmpty {
			required = append(required, f.name)
		}
	}
	def := map[string]any{"type": "object", "properties": props, "additionalProperties": false}
	if len(required) > 0 {
		def["required"] = required
	}
	s.defs[name] = def
	return name
}

// field is one JSON member of a struct.
type field struct {
	name      string
	typ       reflect.Type
	omitEmpty bool
}

// jsonFields lists the members encoding/json writes for struct t: exported
// fields by their tag's name, "-" skipped, untagged embedded structs
// flattened (an outer field wins over an embedded one of the same name).
func jsonFields(t reflect.Type) []field {
	var out []field
	seen := map[string]bool{}
	var walk func(t reflect.Type, depth int)
	var embedded []reflect.Type
	walk = func(t reflect.Type, depth int) {
		for i := range t.NumField() {
			f := t.Field(i)
			tag := f.Tag.Get("json")
			if tag == "-" {
				continue
			}
			name, opts, _ := strings.Cut(tag, ",")
			if f.Anonymous && name == "" {
				et := f.Type
				if et.Kind() == reflect.Pointer {
					et = et.Elem()
				}
				if et.Kind() == reflect.Struct {
					embedded = append(embedded, et)
					continue
				}
			}
			if !f.IsExported() {
				continue
			}
			if name == "" {
				name = f.Name
			}
			if seen[name] {
				continue
			}
			seen[name] = true
			out = append(out, field{name: name, typ: f.Type, omitEmpty: strings.Contains(","+opts+",", ",omitempty,") || strings.Contains(","+opts+",", ",omitzero,")})
		}
	}
	walk(t, 0)
	for len(embedded) > 0 {
		next := embedded
		embedded = nil
		for _, et := range next {
			walk(et, 1)
		}
	}
	return out
}
