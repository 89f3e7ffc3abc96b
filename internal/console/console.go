// Package console is pgtenant's small read-only web console: clusters with
// their standbys, templates, tenants and recent jobs, from the same catalog
// and probes the API uses. It asks for the API token once and keeps it in an
// HttpOnly cookie; it changes nothing.
package console

import (
	"crypto/subtle"
	"embed"
	"fmt"
	"html/template"
	"log/slog"
	"net/http"
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

// Console serves the pages.
type Console struct {
	Store    *catalog.Store
	Clusters *cluster.Registry
	Token    string
	Logger   *slog.Logger
}

const cookieName = "pgtenant_token"

// ServeHTTP routes / and /login.
func (c *Console) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	switch {
	case r.URL.Path == "/login" && r.Method == http.MethodPost:
		c.login(w, r)
	case r.URL.Path == "/static/console.css" && r.Method == http.MethodGet:
		w.Header().Set("Content-Type", "text/css; charset=utf-8")
		w.Header().Set("Cache-Control", "max-age=3600") // no data in it
		_, _ = w.Write(stylesheet)
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

func (c *Console) authorized(r *http.Request) bool {
	ck, err := r.Cookie(cookieName)
	return err == nil && c.Token != "" && subtle.ConstantTimeCompare([]byte(ck.Value), []byte(c.Token)) == 1
}

func (c *Console) login(w http.ResponseWriter, r *http.Request) {
	tok := r.PostFormValue("token")
	if subtle.ConstantTimeCompare([]byte(tok), []byte(c.Token)) != 1 {
		http.Redirect(w, r, "/?failed", http.StatusSeeOther)
		return
	}
	http.SetCookie(w, &http.Cookie{Name: cookieName, Value: tok, Path: "/", HttpOnly: true, SameSite: http.SameSiteStrictMode})
	http.Redirect(w, r, "/", http.StatusSeeOther)
}

// clusterRow is one cluster on the overview.
type clusterRow struct {
	Name, Kind, Status, Error string
	Health                    cluster.Health
}

func (c *Console) overview(w http.ResponseWriter, r *http.Request) {
	ctx := r.Context()
	data := map[string]any{"Now": time.Now()}
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
