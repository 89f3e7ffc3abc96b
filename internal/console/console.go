// Package console is pgtenant's small read-only web console: clusters with
// their standbys, templates, tenants and recent jobs, from the same catalog
// and probes the API uses. It asks for the API token once and answers with
// a server-side session: the cookie holds a random session id, never the
// token. It changes nothing in the fleet.
package console

import (
	"context"
	"crypto/subtle"
	"embed"
	"fmt"
	"html/template"
	"log/slog"
	"net/http"
	"net/url"
	"strings"
	"time"

	"github.com/pgtenant/pgtenant/internal/catalog"
	"github.com/pgtenant/pgtenant/internal/cluster"
	"github.com/pgtenant/pgtenant/internal/jobs"
)

//go:embed templates/*.html
var files embed.FS

// stylesheet is the console's CSS, a file rather than inline so that the
// Content-Security-Policy needs no 'unsafe-inline'.
//
//go:embed static/console.css
var stylesheet []byte

var pages = template.Must(template.New("").Funcs(template.FuncMap{
	"bytes": humanBytes,
	"rate":  func(f float64) string { return humanBytes(int64(f)) + "/s" },
	"ago":   func(t time.Time) string { return time.Since(t).Round(time.Second).String() + " ago" },
}).ParseFS(files, "templates/*.html"))

func humanBytes(n int64) string {
	switch {
	case n >= 1<<20:
		return fmt.Sprintf("%.1f MB", float64(n)/(1<<20))
	case n >= 1<<10:
		return fmt.Sprintf("%.1f kB", float64(n)/(1<<10))
	}
	return fmt.Sprintf("%d B", n)
}

// Console serves the pages. It must not be copied after first use.
type Console struct {
	Store    *catalog.Store
	Clusters *cluster.Registry
	Token    string
	// SessionTTL is how long a login lasts, from the login (absolute expiry:
	// a session in use is not extended, so a stolen cookie is good for at
	// most this long); 0 means 12h.
	SessionTTL time.Duration
	Logger     *slog.Logger

	sessions sessions
	now      func() time.Time // tests move the clock; nil is time.Now
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

// ServeHTTP routes /, /login, /logout and the stylesheet.
func (c *Console) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if _, err := r.Cookie(legacyCookie); err == nil {
		http.SetCookie(w, &http.Cookie{Name: legacyCookie, Path: "/", MaxAge: -1, HttpOnly: true, Secure: r.TLS != nil, SameSite: http.SameSiteStrictMode})
	}
	switch {
	case r.URL.Path == "/static/console.css" && r.Method == http.MethodGet:
		w.Header().Set("Content-Type", "text/css; charset=utf-8")
		w.Header().Set("Cache-Control", "max-age=3600") // no data in it
		_, _ = w.Write(stylesheet)
	case (r.URL.Path == "/login" || r.URL.Path == "/logout") && r.Method == http.MethodPost:
		if !sameOrigin(r) {
			http.Error(w, "cross-origin request refused", http.StatusForbidden)
			return
		}
		if r.URL.Path == "/login" {
			c.login(w, r)
		} else {
			c.logout(w, r)
		}
	case r.URL.Path == "/" && r.Method == http.MethodGet:
		if !c.authorized(r) {
			c.render(w, "login.html", map[string]any{"Failed": r.URL.Query().Has("failed")})
			return
		}
		c.overview(w, r)
	default:
		http.NotFound(w, r)
	}
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
	ck, err := r.Cookie(cookieName)
	return err == nil && c.sessions.valid(ck.Value, c.clock())
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

// login checks the token and starts a session. A wrong token gets the same
// answer as an empty one, after failDelay; nothing tells how it was wrong.
func (c *Console) login(w http.ResponseWriter, r *http.Request) {
	r.Body = http.MaxBytesReader(w, r.Body, 4<<10)
	tok := r.PostFormValue("token")
	if c.Token == "" || subtle.ConstantTimeCompare([]byte(tok), []byte(c.Token)) != 1 {
		c.Logger.Warn("console login refused", "component", "console", "remote", r.RemoteAddr)
		sleep(r.Context(), failDelay)
		http.Redirect(w, r, "/?failed", http.StatusSeeOther)
		return
	}
	ttl := c.ttl()
	id := c.sessions.create(c.clock(), ttl)
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

func (c *Console) overview(w http.ResponseWriter, r *http.Request) {
	ctx := r.Context()
	data := map[string]any{"Now": time.Now(), "LoggedIn": true}
	cls, err := c.Store.Clusters(ctx)
	if err != nil {
		c.fail(w, err)
		return
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
	data["Clusters"] = rows
	if data["Templates"], err = c.Store.Templates(ctx); err != nil {
		c.fail(w, err)
		return
	}
	if data["Tenants"], err = c.Store.ListTenants(ctx, catalog.TenantFilter{Limit: 200}); err != nil {
		c.fail(w, err)
		return
	}
	if data["Jobs"], err = jobs.List(ctx, c.Store.Pool(), jobs.Filter{Limit: 30}); err != nil {
		c.fail(w, err)
		return
	}
	c.render(w, "overview.html", data)
}

func (c *Console) render(w http.ResponseWriter, name string, data any) {
	w.Header().Set("Content-Type", "text/html; charset=utf-8")
	// Not no-referrer: with it browsers send "Origin: null" on the page's
	// own form posts (Fetch standard), which the Origin check must refuse.
	// same-origin sends nothing to other sites either.
	w.Header().Set("Referrer-Policy", "same-origin")
	w.Header().Set("Cache-Control", "no-store")
	if err := pages.ExecuteTemplate(w, name, data); err != nil {
		c.Logger.Error("render console page", "component", "console", "page", name, "err", err)
	}
}

func (c *Console) fail(w http.ResponseWriter, err error) {
	c.Logger.Error("console", "component", "console", "err", err)
	http.Error(w, "the catalog could not be read: "+err.Error(), http.StatusServiceUnavailable)
}
