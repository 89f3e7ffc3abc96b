// Package console is pgtenant's web console, rendered on the server (no
// JavaScript but the copy buttons' few lines): clusters with their
// standbys' lag and the pacer over time, tenants searched and paged, a
// tenant's events, quota, prewarm state and metrics charts, templates and
// their builds, jobs and rollouts refreshing while they run, the doctor,
// reconcile and backups, and the operator's actions (create a tenant,
// suspend, resume, drop, restore, purge now, password, analytics, move,
// rewind, fork; start, continue and retry a rollout; drain and undrain a
// cluster; a reconcile fix, a backup), each confirmed on a page of its own.
//
// It reads and acts only through the API's own handlers, called in-process
// with the token the operator logged in with (inprocess.go): there is no
// second implementation of a rule, and what the console shows is what the
// API answers. The token may be the admin token or a scoped one: the API
// checks it, and its scope, at every call and audits the console's actions
// under its name; the console only hides what the scope cannot do
// (access.go). It asks for the token once and answers with a server-side
// session: the cookie holds a random session id, never the token. Its
// forms post only with the session's CSRF token and from the console's own
// origin. It also shows the API's audit log (/audit).
package console

import (
	"bytes"
	"context"
	"crypto/subtle"
	"embed"
	"errors"
	"fmt"
	"html/template"
	"log/slog"
	"net/http"
	"net/url"
	"strings"
	"sync"
	"time"

	"github.com/pgtenant/pgtenant/internal/api"
	"github.com/pgtenant/pgtenant/internal/catalog"
	"github.com/pgtenant/pgtenant/internal/cluster"
	"github.com/pgtenant/pgtenant/internal/config"
	"github.com/pgtenant/pgtenant/internal/jobs"
)

//go:embed templates/*.html
var files embed.FS

// stylesheet is the console's CSS, a file rather than inline so that the
// Content-Security-Policy needs no 'unsafe-inline'.
//
//go:embed static/console.css
var stylesheet []byte

// script is the console's only JavaScript: the copy buttons of the pages
// that show a connection string once. Every page works without it.
//
//go:embed static/console.js
var script []byte

var pages = template.Must(template.New("").Funcs(funcs).ParseFS(files, "templates/*.html"))

// humanBytes writes a size as the CLI does (1.5 GiB), so that a figure
// reads the same in a terminal and on a page.
func humanBytes(n int64) string { return config.ByteSize(n).Human() }

// Console serves the pages. It must not be copied after first use.
type Console struct {
	Store    *catalog.Store
	Clusters *cluster.Registry
	// API is the API server: every page reads, and every action acts,
	// through its handlers (inprocess.go). When it can (the daemon's
	// *api.Server), it also checks the tokens of logins (authenticator).
	API http.Handler
	// Token is the admin token. Only a console whose API checks no tokens
	// (unit tests) compares it itself.
	Token string
	// SessionTTL is how long a login lasts, from the login (absolute expiry:
	// a session in use is not extended, so a stolen cookie is good for at
	// most this long); 0 means 12h.
	SessionTTL time.Duration
	Logger     *slog.Logger

	sessions sessions
	now      func() time.Time // tests move the clock; nil is time.Now
	history  history          // clusters over time (Run)

	muxOnce sync.Once
	mux     *http.ServeMux
}

const (
	cookieName = "pgtenant_session"
	// legacyCookie held the raw token in older versions; it is deleted
	// wherever a browser still sends it.
	legacyCookie = "pgtenant_token"
	// failDelay slows the answer to a wrong token. Guessing a 192-bit token
	// is hopeless anyway; this keeps a scanner from hammering the daemon.
	failDelay = time.Second
)

// ServeHTTP routes the console's pages.
func (c *Console) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if _, err := r.Cookie(legacyCookie); err == nil {
		http.SetCookie(w, &http.Cookie{Name: legacyCookie, Path: "/", MaxAge: -1, HttpOnly: true, Secure: r.TLS != nil, SameSite: http.SameSiteStrictMode})
	}
	c.muxOnce.Do(c.routes)
	c.mux.ServeHTTP(w, r)
}

// routes builds the console's mux. Pages need a session; a page asked for
// without one shows the login form. Every POST but login and logout also
// needs the session's CSRF token (action).
func (c *Console) routes() {
	m := http.NewServeMux()
	m.HandleFunc("GET /static/console.css", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/css; charset=utf-8")
		w.Header().Set("Cache-Control", "max-age=3600") // no data in it
		_, _ = w.Write(stylesheet)
	})
	m.HandleFunc("GET /static/console.js", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/javascript; charset=utf-8")
		w.Header().Set("Cache-Control", "max-age=3600")
		_, _ = w.Write(script)
	})
	m.HandleFunc("POST /login", c.sameOriginOnly(c.login))
	m.HandleFunc("POST /logout", c.sameOriginOnly(c.logout))
	m.HandleFunc("GET /{$}", c.page(c.overview))
	m.HandleFunc("GET /tenants", c.page(c.tenants))
	m.HandleFunc("GET /tenants/new", c.page(c.newTenant))
	m.HandleFunc("GET /tenants/new/confirm", c.page(c.confirmCreateTenant))
	m.HandleFunc("POST /tenants/new", c.action(c.createTenant))
	m.HandleFunc("GET /tenants/{id}", c.page(c.tenant))
	m.HandleFunc("GET /tenants/{id}/{action}", c.page(c.confirmTenant))
	m.HandleFunc("POST /tenants/{id}/{action}", c.action(c.tenantAction))
	m.HandleFunc("GET /jobs", c.page(c.jobs))
	m.HandleFunc("GET /jobs/{id}", c.page(c.job))
	m.HandleFunc("GET /jobs/{id}/{action}", c.page(c.confirmJob))
	m.HandleFunc("POST /jobs/{id}/{action}", c.action(c.jobAction))
	m.HandleFunc("GET /templates", c.page(c.templates))
	m.HandleFunc("GET /templates/{name}", c.page(c.template))
	m.HandleFunc("GET /templates/{name}/rollout", c.page(c.confirmStartRollout))
	m.HandleFunc("POST /templates/{name}/rollout", c.action(c.startRollout))
	m.HandleFunc("GET /rollouts", c.page(c.rollouts))
	m.HandleFunc("GET /rollouts/{id}", c.page(c.rollout))
	m.HandleFunc("GET /rollouts/{id}/{action}", c.page(c.confirmRollout))
	m.HandleFunc("POST /rollouts/{id}/{action}", c.action(c.rolloutAction))
	m.HandleFunc("GET /clusters", c.page(c.clusters))
	m.HandleFunc("GET /clusters/{name}/switchover", c.page(c.confirmSwitchover))
	m.HandleFunc("POST /clusters/{name}/switchover", c.action(c.switchover))
	m.HandleFunc("GET /clusters/{name}/{action}", c.page(c.confirmCluster))
	m.HandleFunc("POST /clusters/{name}/{action}", c.action(c.clusterAction))
	m.HandleFunc("GET /doctor", c.page(c.doctor))
	m.HandleFunc("GET /reconcile", c.page(c.reconcile))
	m.HandleFunc("GET /reconcile/fix", c.page(c.confirmReconcileFix))
	m.HandleFunc("POST /reconcile/fix", c.action(c.reconcileFix))
	m.HandleFunc("GET /backups", c.page(c.backups))
	m.HandleFunc("GET /backups/now", c.page(c.confirmBackupNow))
	m.HandleFunc("POST /backups/now", c.action(c.backupNow))
	m.HandleFunc("GET /audit", c.page(c.audit))
	c.mux = m
}

// sameOriginOnly refuses a POST from another site.
func (c *Console) sameOriginOnly(h http.HandlerFunc) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		if !sameOrigin(r) {
			http.Error(w, "cross-origin request refused", http.StatusForbidden)
			return
		}
		h(w, r)
	}
}

// view is what every page's layout needs; pages add their own fields.
type view map[string]any

// page serves a GET page to a logged-in operator; others get the login
// form, and so does one whose token was revoked or has expired since the
// login (recheck).
func (c *Console) page(h func(w http.ResponseWriter, r *http.Request, v view) error) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		ss, ok := c.session(r)
		if !ok {
			c.render(w, http.StatusOK, "login.html", view{"Failed": r.URL.Query().Has("failed") && r.URL.Path == "/"})
			return
		}
		v := view{"LoggedIn": true, "CSRF": ss.csrf, "Now": c.clock(), "Path": r.URL.Path, "Who": ss.who}
		ss, err := c.recheck(w, r, ss)
		if errors.Is(err, api.ErrUnauthorized) {
			c.render(w, http.StatusUnauthorized, "login.html", view{"Ended": err.Error()})
			return
		}
		if err != nil {
			c.fail(w, r, v, err)
			return
		}
		v["Who"] = ss.who
		if err := h(w, r.WithContext(withSession(r.Context(), ss)), v); err != nil {
			c.fail(w, r, v, err)
		}
	}
}

// action serves a POST that changes something: a session whose token is
// still valid, a form from the console's own origin and the session's CSRF
// token are all required.
func (c *Console) action(h func(w http.ResponseWriter, r *http.Request, v view) error) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		ss, ok := c.session(r)
		if !ok || !sameOrigin(r) {
			http.Error(w, "refused: log in to the console first, from its own pages", http.StatusForbidden)
			return
		}
		r.Body = http.MaxBytesReader(w, r.Body, 16<<10)
		if subtle.ConstantTimeCompare([]byte(r.PostFormValue("csrf")), []byte(ss.csrf)) != 1 {
			c.Logger.Warn("console form without its CSRF token refused", "component", "console", "remote", r.RemoteAddr, "path", r.URL.Path)
			http.Error(w, "refused: the form's CSRF token is missing or stale; reload the page and try again", http.StatusForbidden)
			return
		}
		v := view{"LoggedIn": true, "CSRF": ss.csrf, "Now": c.clock(), "Path": r.URL.Path, "Who": ss.who}
		ss, err := c.recheck(w, r, ss)
		if errors.Is(err, api.ErrUnauthorized) {
			http.Error(w, "refused: "+err.Error()+"; log in again", http.StatusForbidden)
			return
		}
		if err != nil {
			c.fail(w, r, v, err)
			return
		}
		v["Who"] = ss.who
		c.Logger.Info("console action", "component", "console", "path", r.URL.Path, "remote", r.RemoteAddr, "actor", ss.who.Actor)
		if err := h(w, r.WithContext(withSession(r.Context(), ss)), v); err != nil {
			c.fail(w, r, v, err)
		}
	}
}

// recheck checks the session's token again, as the API checks a token at
// every call (no cache): on every request, reads included, because some
// pages (the overview) read the catalog directly rather than through the
// API, and a revoked token must see nothing more. It costs one lookup by
// hash in the catalog, as each API call does. A token revoked or expired
// since the login ends the session (and its cookie); the error, wrapping
// api.ErrUnauthorized, says why. A catalog that does not answer is another
// error and leaves the session alone.
func (c *Console) recheck(w http.ResponseWriter, r *http.Request, ss session) (session, error) {
	who, err := c.authenticate(r.Context(), ss.token)
	if errors.Is(err, api.ErrUnauthorized) {
		if ck, cerr := r.Cookie(cookieName); cerr == nil {
			c.sessions.delete(ck.Value)
		}
		http.SetCookie(w, &http.Cookie{Name: cookieName, Path: "/", MaxAge: -1,
			HttpOnly: true, Secure: r.TLS != nil, SameSite: http.SameSiteStrictMode})
		c.Logger.Warn("console session ended: its token is no longer valid", "component", "console", "actor", ss.who.Actor, "remote", r.RemoteAddr, "err", err)
		return session{}, err
	}
	if err != nil {
		return session{}, err
	}
	ss.who = who
	return ss, nil
}

// authenticator checks an API token as the API does (*api.Server).
type authenticator interface {
	Authenticate(ctx context.Context, token string) (api.Principal, error)
}

// authenticate says whose token is: the API's own check when c.API has
// one; else (a console without a real API, in unit tests) the admin token
// compared in constant time.
func (c *Console) authenticate(ctx context.Context, token string) (api.Principal, error) {
	if a, ok := c.API.(authenticator); ok {
		return a.Authenticate(ctx, token)
	}
	if c.Token == "" || subtle.ConstantTimeCompare([]byte(token), []byte(c.Token)) != 1 {
		return api.Principal{}, fmt.Errorf("%w: wrong token", api.ErrUnauthorized)
	}
	return api.Principal{Actor: "admin token", Scope: api.ScopeAdmin}, nil
}

func (c *Console) clock() time.Time {
	if c.now != nil {
		return c.now()
	}
	return time.Now()
}

func (c *Console) ttl() time.Duration {
	if c.SessionTTL > 0 {
		return c.SessionTTL
	}
	return 12 * time.Hour
}

// authorized reports whether the request carries a live session's id.
func (c *Console) authorized(r *http.Request) bool {
	_, ok := c.session(r)
	return ok
}

// session returns the request's live session.
func (c *Console) session(r *http.Request) (session, bool) {
	ck, err := r.Cookie(cookieName)
	if err != nil {
		return session{}, false
	}
	return c.sessions.get(ck.Value, c.clock())
}

// sameOrigin reports whether a POST comes from the console's own pages:
// its Origin, or without one its Referer, names this host (and https when
// the request came over TLS). "Origin: null" is refused. A request with
// neither header is let through: browsers send Origin on every POST, so it
// is not a cross-site form, and login needs the token anyway. Behind a
// reverse proxy, the proxy must pass the Host header through.
func sameOrigin(r *http.Request) bool {
	src := r.Header.Get("Origin")
	if src == "" {
		src = r.Header.Get("Referer")
	}
	if src == "" {
		return true
	}
	u, err := url.Parse(src)
	if err != nil || u.Host == "" || (u.Scheme != "http" && u.Scheme != "https") {
		return false
	}
	if r.TLS != nil && u.Scheme != "https" {
		return false
	}
	return strings.EqualFold(u.Host, r.Host)
}

// login checks the token (the admin token or a scoped one, by the API's
// own check) and starts a session of whom it names. A wrong, revoked or
// expired token gets the same answer as an empty one, after failDelay;
// nothing tells how it was wrong. A catalog that does not answer is a 503.
func (c *Console) login(w http.ResponseWriter, r *http.Request) {
	r.Body = http.MaxBytesReader(w, r.Body, 4<<10)
	tok := r.PostFormValue("token")
	who, err := c.authenticate(r.Context(), tok)
	if err != nil && !errors.Is(err, api.ErrUnauthorized) {
		c.fail(w, r, view{}, err)
		return
	}
	if err != nil || tok == "" {
		c.Logger.Warn("console login refused", "component", "console", "remote", r.RemoteAddr)
		sleep(r.Context(), failDelay)
		http.Redirect(w, r, "/?failed", http.StatusSeeOther)
		return
	}
	c.Logger.Info("console login", "component", "console", "actor", who.Actor, "scope", who.Scope, "remote", r.RemoteAddr)
	ttl := c.ttl()
	id := c.sessions.create(c.clock(), ttl, tok, who)
	http.SetCookie(w, &http.Cookie{Name: cookieName, Value: id, Path: "/", MaxAge: int(ttl / time.Second),
		HttpOnly: true, Secure: r.TLS != nil, SameSite: http.SameSiteStrictMode})
	http.Redirect(w, r, "/", http.StatusSeeOther)
}

// logout ends the session and clears the cookie.
func (c *Console) logout(w http.ResponseWriter, r *http.Request) {
	if ck, err := r.Cookie(cookieName); err == nil {
		c.sessions.delete(ck.Value)
	}
	http.SetCookie(w, &http.Cookie{Name: cookieName, Path: "/", MaxAge: -1,
		HttpOnly: true, Secure: r.TLS != nil, SameSite: http.SameSiteStrictMode})
	http.Redirect(w, r, "/", http.StatusSeeOther)
}

// sleep waits d or until ctx ends (a client gone, a shutdown).
func sleep(ctx context.Context, d time.Duration) {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
	case <-ctx.Done():
	}
}

// clusterRow is one cluster on the overview.
type clusterRow struct {
	Name, Kind, Status, Error string
	Health                    cluster.Health
}

func (c *Console) overview(w http.ResponseWriter, r *http.Request, v view) error {
	ctx := r.Context()
	cls, err := c.Store.Clusters(ctx)
	if err != nil {
		return err
	}
	var rows []clusterRow
	for _, cr := range cls {
		row := clusterRow{Name: cr.Name, Kind: cr.Kind, Status: "down"}
		if cl, err := c.Clusters.Get(cr.Name); err == nil {
			if h, err := cl.LastProbeResult(); err == nil && !h.At.IsZero() {
				row.Status, row.Health = "up", h
			} else if err != nil {
				row.Error = err.Error()
			}
		}
		rows = append(rows, row)
	}
	up := 0
	for _, row := range rows {
		if row.Status == "up" {
			up++
		}
	}
	v["Clusters"], v["Up"] = rows, up
	if v["Templates"], err = c.Store.Templates(ctx); err != nil {
		return err
	}
	// The latest ten jobs but background builds (spares), which a busy
	// pool would fill the list with (the jobs page shows them on demand).
	latest, err := jobs.List(ctx, c.Store.Pool(), jobs.Filter{Limit: 100})
	if err != nil {
		return err
	}
	var js []jobs.Job
	for _, j := range latest {
		if j.Type != jobs.TenantBuild && len(js) < 10 {
			js = append(js, j)
		}
	}
	running, failed := 0, 0
	for _, j := range js {
		switch j.State {
		case jobs.Running, jobs.Waiting:
			running++
		case jobs.Failed:
			failed++
		}
	}
	v["Jobs"], v["Running"], v["Failed"] = js, running, failed
	c.render(w, http.StatusOK, "overview.html", v)
	return nil
}

// pageTitles are the <title>s of the pages that set none of their own.
var pageTitles = map[string]string{
	"overview.html": "Overview", "tenants.html": "Tenants", "jobs.html": "Jobs", "rollouts.html": "Rollouts",
	"clusters.html": "Clusters", "audit.html": "Audit", "templates.html": "Templates", "doctor.html": "Doctor",
	"reconcile.html": "Reconcile", "backups.html": "Backups", "login.html": "Log in", "error.html": "Error",
	"newtenant.html": "New tenant", "created.html": "Tenant created", "password.html": "New password",
}

func (c *Console) render(w http.ResponseWriter, status int, name string, data any) {
	if v, ok := data.(view); ok && v["PageTitle"] == nil {
		if t, ok := v["Title"].(string); ok && name == "confirm.html" {
			v["PageTitle"] = t + "?"
		} else {
			v["PageTitle"] = pageTitles[name]
		}
	}
	var b bytes.Buffer
	if err := pages.ExecuteTemplate(&b, name, data); err != nil {
		c.Logger.Error("render console page", "component", "console", "page", name, "err", err)
		http.Error(w, "the page could not be rendered (a bug, logged)", http.StatusInternalServerError)
		return
	}
	w.Header().Set("Content-Type", "text/html; charset=utf-8")
	// Not no-referrer: with it browsers send "Origin: null" on the page's
	// own form posts (Fetch standard), which the Origin check must refuse.
	// same-origin sends nothing to other sites either.
	w.Header().Set("Referrer-Policy", "same-origin")
	w.Header().Set("Cache-Control", "no-store")
	w.WriteHeader(status)
	_, _ = w.Write(b.Bytes())
}

// fail shows an error page: the API's message and status (a refused
// action says why, e.g. "tenant … is dropped"), or 503 for the catalog.
func (c *Console) fail(w http.ResponseWriter, r *http.Request, v view, err error) {
	status, msg := http.StatusServiceUnavailable, "the catalog could not be read: "+err.Error()
	var ae *api.Error
	if errors.As(err, &ae) {
		status, msg = ae.Status, ae.Message
	}
	if status >= 500 {
		c.Logger.Error("console", "component", "console", "path", r.URL.Path, "err", err)
	}
	v["Status"], v["Error"] = status, msg
	c.render(w, status, "error.html", v)
}
