// Package api is pgtenant's HTTP JSON API (/v1, bearer token), /healthz and
// /metrics, and the Go client the CLI and tests use. Handlers validate input
// and call the workflow packages; they hold no business rules themselves.
package api

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"strings"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/pgtenant/pgtenant/internal/analytics"
	"github.com/pgtenant/pgtenant/internal/backup"
	"github.com/pgtenant/pgtenant/internal/catalog"
	"github.com/pgtenant/pgtenant/internal/cluster"
	"github.com/pgtenant/pgtenant/internal/credentials"
	"github.com/pgtenant/pgtenant/internal/doctor"
	"github.com/pgtenant/pgtenant/internal/failover"
	"github.com/pgtenant/pgtenant/internal/jobs"
	"github.com/pgtenant/pgtenant/internal/metrics"
	"github.com/pgtenant/pgtenant/internal/migrate"
	"github.com/pgtenant/pgtenant/internal/move"
	"github.com/pgtenant/pgtenant/internal/placement"
	"github.com/pgtenant/pgtenant/internal/prewarm"
	"github.com/pgtenant/pgtenant/internal/provision"
	"github.com/pgtenant/pgtenant/internal/purge"
	"github.com/pgtenant/pgtenant/internal/quota"
	"github.com/pgtenant/pgtenant/internal/reconcile"
	"github.com/pgtenant/pgtenant/internal/templates"
)

// Version is reported by /healthz.
const Version = "0.1.0"

// Deps are what the API serves.
type Deps struct {
	Store    *catalog.Store
	Clusters *cluster.Registry
	Registry *prometheus.Registry
	Token    string
	Logger   *slog.Logger

	Runner     *jobs.Runner
	Templates  *templates.Service
	Provision  *provision.Service
	Purge      *purge.Service
	Reconciler *reconcile.Reconciler
	Migrate    *migrate.Service
	Prewarm    *prewarm.Service
	Move       *move.Service
	Placement  *placement.Service
	// Failover follows Patroni clusters' leaders and runs switchovers.
	Failover *failover.Follower
	// Analytics runs tenants' columnar mirrors; nil when not wired.
	Analytics *analytics.Service
	// Backups takes and lists the managed clusters' pgBackRest backups;
	// nil when not wired (every cluster then answers "no backups configured").
	Backups *backup.Service

	// Credentials rotates tenants' passwords.
	Credentials *credentials.Service
	// Metrics, Quota and Doctor serve tenant metrics, quota state and
	// `doctor`; nil when not wired.
	Metrics *metrics.Collector
	Quota   *quota.Service
	Doctor  *doctor.Doctor
	// Console, if set, is served at /.
	Console http.Handler
	// MetricsAuth: /metrics needs the bearer token, wherever it is served.
	MetricsAuth bool
	// MetricsElsewhere: /metrics is not served by this server but on a
	// listener of its own, with MetricsHandler (config metrics_listen).
	MetricsElsewhere bool
}

// Server routes requests to handlers.
type Server struct {
	Deps
	mux *http.ServeMux
	log *slog.Logger
	// routes are the /v1 patterns registered, for the OpenAPI test.
	routes []string
}

// NewServer builds the routes.
func NewServer(d Deps) *Server {
	s := &Server{Deps: d, mux: http.NewServeMux(), log: d.Logger.With("component", "api")}
	s.mux.HandleFunc("GET /healthz", s.healthz)
	if !d.MetricsElsewhere {
		s.mux.Handle("GET /metrics", s.metrics())
	}
	s.mux.HandleFunc("GET /v1/openapi.json", s.serveOpenAPI)
	s.routes = append(s.routes, "GET /v1/openapi.json")
	s.handle("GET /v1/clusters", s.listClusters)
	s.handle("POST /v1/clusters", s.addCluster)
	s.handle("GET /v1/clusters/{name}", s.showCluster)
	s.handle("PATCH /v1/clusters/{name}", s.setCluster)
	s.handle("POST /v1/clusters/{name}/drain", s.drainCluster)
	s.handle("POST /v1/clusters/{name}/undrain", s.undrainCluster)
	s.handle("POST /v1/clusters/{name}/switchover", s.switchoverCluster)
	s.handle("POST /v1/clusters/{name}/failover", s.failoverCluster)
	s.handle("POST /v1/rebalance", s.rebalance)
	s.handle("GET /v1/backups", s.listBackups)
	s.handle("POST /v1/backups", s.startBackup)
	s.handle("GET /v1/templates", s.listTemplates)
	s.handle("POST /v1/templates", s.createTemplate)
	s.handle("GET /v1/templates/{name}", s.showTemplate)
	s.handle("POST /v1/templates/{name}/versions", s.pushTemplate)
	s.handle("DELETE /v1/templates/{name}", s.deleteTemplate)
	s.handle("GET /v1/tenants", s.listTenants)
	s.handle("POST /v1/tenants", s.createTenant)
	s.handle("GET /v1/tenants/{id}", s.showTenant)
	s.handle("PATCH /v1/tenants/{id}", s.setTenant)
	s.handle("DELETE /v1/tenants/{id}", s.dropTenant)
	s.handle("POST /v1/tenants/{id}/restore", s.lifecycle(s.Purge.Restore))
	s.handle("POST /v1/tenants/{id}/suspend", s.lifecycle(s.Purge.Suspend))
	s.handle("POST /v1/tenants/{id}/resume", s.lifecycle(s.Purge.Resume))
	s.handle("POST /v1/tenants/{id}/password", s.rotatePassword)
	s.handle("GET /v1/tenants/{id}/credentials", s.listCredentials)
	s.handle("POST /v1/tenants/{id}/credentials", s.createCredential)
	s.handle("POST /v1/tenants/{id}/credentials/{name}/password", s.rotateCredential)
	s.handle("DELETE /v1/tenants/{id}/credentials/{name}", s.revokeCredential)
	s.handle("POST /v1/tenants/{id}/move", s.moveTenant)
	s.handle("POST /v1/tenants/{id}/rewind", s.rewindTenant)
	s.handle("POST /v1/tenants/{id}/fork", s.forkTenant)
	s.handle("POST /v1/tenants/{id}/export", s.exportTenant)
	s.handle("POST /v1/tenants/import", s.importTenant)
	s.handle("GET /v1/tenants/{id}/analytics", s.analyticsStatus)
	s.handle("POST /v1/tenants/{id}/analytics", s.enableAnalytics)
	s.handle("DELETE /v1/tenants/{id}/analytics", s.disableAnalytics)
	s.handle("GET /v1/jobs", s.listJobs)
	s.handle("GET /v1/jobs/{id}", s.showJob)
	s.handle("POST /v1/jobs/{id}/cancel", s.cancelJob)
	s.handle("POST /v1/jobs/{id}/retry", s.retryJob)
	s.handle("POST /v1/reconcile", s.reconcile)
	s.handle("POST /v1/prewarm", s.startPrewarm)
	s.handle("POST /v1/prewarm/capture", s.capture)
	s.handle("POST /v1/tenants/{id}/prewarm", s.prewarmTenant)
	s.handle("POST /v1/templates/{name}/rollouts", s.startRollout)
	s.handle("GET /v1/rollouts", s.listRollouts)
	s.handle("GET /v1/rollouts/{id}", s.showRollout)
	s.handle("POST /v1/rollouts/{id}/continue", s.continueRollout)
	s.handle("POST /v1/rollouts/{id}/retry", s.retryRollout)
	s.metricsRoutes()
	s.handle("POST /v1/tokens", s.createToken)
	s.handle("GET /v1/tokens", s.listTokens)
	s.handle("DELETE /v1/tokens/{id}", s.revokeToken)
	s.handle("GET /v1/audit", s.listAudit)
	s.handle("GET /v1/usage", s.usage)
	s.mux.HandleFunc("GET /v1/", s.wrap("GET /v1/", func(w http.ResponseWriter, r *http.Request) error {
		return fmt.Errorf("%w: no route %s %s", catalog.ErrNotFound, r.Method, r.URL.Path)
	}))
	if d.Console != nil {
		s.mux.Handle("/", d.Console)
	}
	return s
}

// routeScopes is the scope each mutating route needs (every GET route
// needs read-only, which every token has; admin may call every route).
// handle refuses to register a mutating route missing here.
var routeScopes = map[string]Scope{
	"POST /v1/clusters":                   ScopeClusters,
	"PATCH /v1/clusters/{name}":           ScopeClusters,
	"POST /v1/clusters/{name}/drain":      ScopeClusters,
	"POST /v1/clusters/{name}/undrain":    ScopeClusters,
	"POST /v1/clusters/{name}/switchover": ScopeClusters,
	"POST /v1/clusters/{name}/failover":   ScopeClusters,
	"POST /v1/rebalance":                  ScopeClusters,
	"POST /v1/tenants/{id}/move":          ScopeClusters, // placement
	"POST /v1/backups":                    ScopeClusters,
	"POST /v1/prewarm":                    ScopeClusters, // a cluster's or the fleet's caches
	"POST /v1/prewarm/capture":            ScopeClusters,

	"POST /v1/templates":                 ScopeTemplates,
	"POST /v1/templates/{name}/versions": ScopeTemplates,
	"DELETE /v1/templates/{name}":        ScopeTemplates,
	"POST /v1/templates/{name}/rollouts": ScopeTemplates,
	"POST /v1/rollouts/{id}/continue":    ScopeTemplates,
	"POST /v1/rollouts/{id}/retry":       ScopeTemplates,

	"POST /v1/tenants":                                  ScopeTenants,
	"PATCH /v1/tenants/{id}":                            ScopeTenants, // a plan change (its move, if any, too)
	"DELETE /v1/tenants/{id}":                           ScopeTenants,
	"POST /v1/tenants/{id}/restore":                     ScopeTenants,
	"POST /v1/tenants/{id}/suspend":                     ScopeTenants,
	"POST /v1/tenants/{id}/resume":                      ScopeTenants,
	"POST /v1/tenants/{id}/password":                    ScopeTenants,
	"POST /v1/tenants/{id}/credentials":                 ScopeTenants,
	"POST /v1/tenants/{id}/credentials/{name}/password": ScopeTenants,
	"DELETE /v1/tenants/{id}/credentials/{name}":        ScopeTenants,
	"POST /v1/tenants/{id}/rewind":                      ScopeTenants,
	"POST /v1/tenants/{id}/fork":                        ScopeTenants,
	"POST /v1/tenants/{id}/export":                      ScopeTenants, // all of its data: not for read-only tokens
	"POST /v1/tenants/import":                           ScopeTenants,
	"POST /v1/tenants/{id}/analytics":                   ScopeTenants,
	"DELETE /v1/tenants/{id}/analytics":                 ScopeTenants,
	"POST /v1/tenants/{id}/prewarm":                     ScopeTenants,
	"PUT /v1/tenants/{id}/metrics/export":               ScopeTenants,

	// Jobs of every kind, repairs and the tokens themselves.
	"POST /v1/jobs/{id}/cancel": ScopeAdmin,
	"POST /v1/jobs/{id}/retry":  ScopeAdmin,
	"POST /v1/reconcile":        ScopeAdmin,
	"POST /v1/tokens":           ScopeAdmin,
	"DELETE /v1/tokens/{id}":    ScopeAdmin,
}

// scopeOf is the scope a route needs; it panics on a mutating route
// missing from routeScopes (a programming error, found by every test that
// builds a Server).
func scopeOf(pattern string) Scope {
	method, _, _ := strings.Cut(pattern, " ")
	if method == http.MethodGet || method == http.MethodHead {
		return ScopeReadOnly
	}
	need, ok := routeScopes[pattern]
	if !ok {
		panic(fmt.Sprintf("api: route %s has no scope in routeScopes", pattern))
	}
	return need
}

// ServeHTTP sets the headers every answer carries, then routes.
func (s *Server) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	setSecurityHeaders(w.Header())
	s.mux.ServeHTTP(w, r)
}

// ContentSecurityPolicy allows a page the daemon's own files only: no inline
// script or style (the console's CSS is a file), no framing by another site
// (clickjacking), forms that post only to the daemon, no <base> or plugins.
const ContentSecurityPolicy = "default-src 'self'; frame-ancestors 'none'; form-action 'self'; base-uri 'none'; object-src 'none'"

// setSecurityHeaders sets the headers of every answer: API, console,
// /healthz and /metrics. Answers carry tenant passwords (create) and the
// fleet's state, so no browser or proxy may store them. The console
// overrides Cache-Control for its stylesheet and Referrer-Policy for its
// pages (see console.render).
func setSecurityHeaders(h http.Header) {
	h.Set("Content-Security-Policy", ContentSecurityPolicy)
	h.Set("X-Frame-Options", "DENY")
	h.Set("X-Content-Type-Options", "nosniff")
	h.Set("Referrer-Policy", "no-referrer")
	h.Set("Cache-Control", "no-store")
}

// MetricsHandler serves GET /metrics only (404 elsewhere), with the same
// headers and, with MetricsAuth, the same token as the API: the daemon
// runs it on metrics_listen.
func (s *Server) MetricsHandler() http.Handler {
	mux := http.NewServeMux()
	mux.Handle("GET /metrics", s.metrics())
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		setSecurityHeaders(w.Header())
		mux.ServeHTTP(w, r)
	})
}

// metrics is the Prometheus registry, behind the token with MetricsAuth.
func (s *Server) metrics() http.Handler {
	prom := promhttp.HandlerFor(s.Registry, promhttp.HandlerOpts{})
	if !s.MetricsAuth {
		return prom
	}
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if _, err := s.authenticate(r); err != nil {
			s.refuse(w, r, err)
			return
		}
		prom.ServeHTTP(w, r)
	})
}

// refuse answers a request whose token could not be checked or is not
// valid (err from authenticate: 401, or 503 when the catalog is down).
func (s *Server) refuse(w http.ResponseWriter, r *http.Request, err error) {
	if errors.Is(err, ErrUnauthorized) {
		w.Header().Set("WWW-Authenticate", `Bearer realm="pgtenant"`)
	}
	s.writeErr(w, r, err)
}

// handle registers a /v1 route, wrapped with token auth, scope check,
// audit (mutating routes) and error mapping. Each one must be described in
// openapi.go (TestOpenAPI_DescribesEveryRoute); a mutating one needs its
// scope in routeScopes.
func (s *Server) handle(pattern string, h func(http.ResponseWriter, *http.Request) error) {
	s.routes = append(s.routes, pattern)
	s.mux.HandleFunc(pattern, s.wrap(pattern, h))
}

// wrap adds token auth, the scope check, the audit of mutating calls and
// error mapping to a handler.
func (s *Server) wrap(pattern string, h func(http.ResponseWriter, *http.Request) error) http.HandlerFunc {
	need := scopeOf(pattern)
	mutating := need != ScopeReadOnly
	names := wildcards(pattern)
	return func(w http.ResponseWriter, r *http.Request) {
		p, err := s.authenticate(r)
		if mutating {
			w = &auditWriter{ResponseWriter: w, record: func(status int) { s.audit(r, pattern, names, p, status) }}
			defer func() {
				if aw := w.(*auditWriter); !aw.done {
					aw.WriteHeader(http.StatusOK) // the handler wrote nothing: net/http's 200
				}
			}()
		}
		if err != nil {
			s.refuse(w, r, err)
			return
		}
		if !p.scope.Allows(need) {
			s.writeErr(w, r, forbidden(p, pattern, need))
			return
		}
		if err := h(w, r); err != nil {
			s.writeErr(w, r, err)
		}
	}
}

// writeErr answers with err, logging what is a bug (500; not an outage's
// 503, which the workers' outage log reports once).
func (s *Server) writeErr(w http.ResponseWriter, r *http.Request, err error) {
	if status, _ := statusOf(err); status == http.StatusInternalServerError {
		s.log.Error("request failed", "method", r.Method, "path", r.URL.Path, "err", err)
	}
	writeError(w, err)
}

func writeError(w http.ResponseWriter, err error) {
	status, code := statusOf(err)
	msg := err.Error()
	if code == "invalid" {
		msg = strings.TrimPrefix(msg, ErrInvalid.Error()+": ")
	}
	if cause, ok := cluster.Unreachable(err); ok {
		// Not the driver's text: what does not answer, and that it is retried.
		msg = "a database pgtenant needs does not answer (" + cause + "); pgtenant retries on its own: GET /healthz says which, `pgtenant cluster list` shows the clusters"
	}
	writeJSON(w, status, ErrorBody{Error: ErrorDetail{Code: code, Message: msg}})
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	_ = enc.Encode(v)
}

// decode reads a JSON body strictly: one JSON value with known fields and
// nothing after it but whitespace. `{"a":1} garbage` is refused rather than
// half-read, so that a client bug (or a body glued to another) is seen at once.
func decode(r *http.Request, v any) error {
	dec := json.NewDecoder(http.MaxBytesReader(nil, r.Body, 16<<20))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		if errors.Is(err, io.EOF) {
			return invalid("request body: empty; this route needs a JSON object")
		}
		return invalid("request body: %v", err)
	}
	var extra json.RawMessage
	if err := dec.Decode(&extra); !errors.Is(err, io.EOF) {
		return invalid("request body: unexpected data after the JSON object; send exactly one JSON value")
	}
	return nil
}

// healthz says whether the daemon can work: 200 when its catalog answers
// (clusters that do not are listed: tenants elsewhere are served), 503 when
// the catalog does not. Causes are short, never the driver's text.
func (s *Server) healthz(w http.ResponseWriter, r *http.Request) {
	h := Health{Status: "ok", Catalog: "ok", Version: Version, Clusters: map[string]string{}}
	for _, cl := range s.Clusters.All() {
		h.Clusters[cl.Name()] = "ok"
		if _, err := cl.LastProbeResult(); err != nil {
			cause, ok := cluster.Unreachable(err)
			if !ok {
				cause = "probe failed"
			}
			h.Clusters[cl.Name()], h.Status = "down: "+cause, "degraded"
		}
	}
	status := http.StatusOK
	if err := s.Store.Ping(r.Context()); err != nil {
		cause, ok := cluster.Unreachable(err)
		if !ok {
			cause = "does not answer"
		}
		h.Status, h.Catalog, status = "down", "down: "+cause, http.StatusServiceUnavailable
	}
	writeJSON(w, status, h)
}

// clusterView is the list row of one cluster, probed now: a list shows
// the standbys' current replay lag, not the monitor's last reading.
func (s *Server) clusterView(ctx context.Context, c catalog.Cluster, loads map[string]map[string]catalog.Load) Cluster {
	v := Cluster{Name: c.Name, Kind: c.Kind, DSN: cluster.RedactDSN(c.DSN), CreatedAt: c.CreatedAt, Standbys: []cluster.StandbyState{}, Status: "up",
		Placement: c.Placement, Patroni: c.PatroniURLs}
	for _, l := range loads[c.Name] {
		v.Tenants += l.Tenants
		v.SizeBytes += l.SizeBytes
	}
	cl, err := s.Clusters.Get(c.Name)
	if err == nil {
		var h cluster.Health
		if h, err = cl.Probe(ctx); err == nil {
			if h.Standbys != nil {
				v.Standbys = h.Standbys
			}
			return v
		}
	}
	v.Status, v.Error = "down", err.Error()
	return v
}
