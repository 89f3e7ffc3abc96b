package console

import (
	"crypto/tls"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"net/url"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/pgtenant/pgtenant/internal/api"
	"github.com/pgtenant/pgtenant/internal/catalog"
	"github.com/pgtenant/pgtenant/internal/cluster"
	"github.com/pgtenant/pgtenant/internal/jobs"
)

// TestPages_Render renders the login page and the overview with
// representative data, so a template error is a test failure, not a blank
// page in production (the other pages render in TestConsole_Pages, on a
// real daemon).
func TestPages_Render(t *testing.T) {
	var b strings.Builder
	if err := pages.ExecuteTemplate(&b, "login.html", view{"Failed": true}); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(b.String(), "not right") {
		t.Errorf("login page does not say the token was wrong")
	}
	if strings.Contains(b.String(), `action="/logout"`) {
		t.Errorf("login page offers to log out")
	}
	b.Reset()
	data := view{
		"Now": time.Now(),
		"Clusters": []clusterRow{{Name: "local", Kind: "managed", Status: "up", Health: cluster.Health{ServerVersion: "15.18",
			WALBytesPerSec: 2048, Standbys: []cluster.StandbyState{{Name: "local/standby1", State: "streaming", ReplayLagBytes: 3 << 20}}}}},
		"Templates": []catalog.Template{{Name: "<script>alert(1)</script>", CurrentVersion: 2, CreatedAt: time.Now()}},
		"Jobs":      []jobs.Job{{ID: 7, Type: "purge", State: "running", ProgressDone: 1, ProgressTotal: 4, ProgressMsg: "dropping"}},
		"LoggedIn":  true,
		"CSRF":      "tok",
	}
	if err := pages.ExecuteTemplate(&b, "overview.html", data); err != nil {
		t.Fatal(err)
	}
	out := b.String()
	for _, want := range []string{"local/standby1", "3.0 MiB", "2.0 KiB/s", "&lt;script&gt;", `<form method="post" action="/logout">`,
		`<progress max="100" value="25">`, `href="/jobs/7"`} {
		if !strings.Contains(out, want) {
			t.Errorf("overview lacks %q", want)
		}
	}
	if strings.Contains(out, "<script>alert") {
		t.Error("a name reached the page unescaped")
	}
}

// TestPages_ClustersShowPlacement: the clusters page shows each cluster's
// tenants, caps, labels and draining.
func TestPages_ClustersShowPlacement(t *testing.T) {
	var b strings.Builder
	cl := api.Cluster{Name: "local2", Kind: "managed", Status: "up", Tenants: 12, SizeBytes: 3 << 20,
		Placement: catalog.Placement{MaxTenants: 500, Labels: map[string]string{"disk": "ssd"}, Draining: true}}
	if err := pages.ExecuteTemplate(&b, "clusters.html", view{"Now": time.Now(), "Clusters": []api.Cluster{cl}, "LoggedIn": true}); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"draining", "12 (3.0 MiB)", "max 500 tenants", "disk=ssd"} {
		if !strings.Contains(b.String(), want) {
			t.Errorf("clusters page lacks %q", want)
		}
	}
}

// TestCharts_Draw: a series becomes a polyline scaled to its largest value
// within the window; points before the window are left out; no series
// says so instead of drawing an empty frame.
func TestCharts_Draw(t *testing.T) {
	now := time.Date(2025, 1, 1, 12, 0, 0, 0, time.UTC)
	pts := []point{{now.Add(-2 * time.Hour), 1e9}, {now.Add(-30 * time.Minute), 100}, {now.Add(-time.Minute), 200}}
	c := drawChart("size", pts, time.Hour, now, formatCount)
	svg := string(c.SVG)
	if got, want := c.Latest, "200"; got != want {
		t.Errorf("latest = %q, want %q", got, want)
	}
	// 30 minutes into the hour: x = 180; 100 of a 200 top: y = 90 - 86/2 = 47.
	for _, want := range []string{`points="180.0,47.0 354.0,4.0"`, "max 200", "1h ago"} {
		if !strings.Contains(svg, want) {
			t.Errorf("chart lacks %q:\n%s", want, svg)
		}
	}
	if inlineRE.MatchString(svg) {
		t.Errorf("chart has what the CSP blocks:\n%s", svg)
	}
	if e := drawChart("size", nil, time.Hour, now, formatCount); !e.Empty || e.SVG != "" {
		t.Errorf("empty series drawn: %+v", e)
	}
	hist := tenantCharts([]catalog.Rollup{{Minute: now.Add(-time.Minute), BlksHit: 3, BlksRead: 1, Connections: 2}}, time.Hour, now)
	if got, want := hist[3].Latest, "75.0%"; got != want {
		t.Errorf("hit ratio = %q, want %q", got, want)
	}
}

// TestClusterCharts: the samples Run keeps become each cluster's charts of
// the last hour (largest replay lag, WAL/s, steps held by the pacer);
// samples older than the hour are not drawn.
func TestClusterCharts(t *testing.T) {
	now := time.Date(2025, 1, 1, 12, 0, 0, 0, time.UTC)
	c := &Console{}
	c.history.samples = map[string][]sample{
		"b": {{at: now.Add(-2 * time.Hour), lag: 1 << 30}, {at: now.Add(-time.Minute), lag: 2 << 20, walPerS: 4096, waiting: 3}},
		"a": {{at: now.Add(-time.Minute)}},
	}
	got := c.clusterCharts(now)
	if len(got) != 2 || got[0].Cluster != "a" || got[1].Cluster != "b" {
		t.Fatalf("charts for %+v, want a then b", got)
	}
	b := got[1].Charts
	for i, want := range []string{"2.0 MiB", "4.0 KiB/s", "3"} {
		if b[i].Latest != want || b[i].Empty {
			t.Errorf("b %s: latest %q, want %q", b[i].Title, b[i].Latest, want)
		}
	}
	if strings.Contains(string(b[0].SVG), "1.0 GiB") {
		t.Error("a sample older than the hour was drawn")
	}
}

// inlineRE finds what the Content-Security-Policy blocks in a page: inline
// styles and scripts, javascript: URLs and event handler attributes.
// A script from a file (<script src=…></script>) is allowed: the CSP lets
// the daemon's own files run.
var inlineRE = regexp.MustCompile(`(?i)<style|\sstyle=|<script(\s[^>]*)?>\s*[^<\s]|<script>|javascript:|\son[a-z]+=`)

// TestPages_NoInlineStyleOrScript: the CSP allows no inline style or
// script, so a page with one would render broken.
func TestPages_NoInlineStyleOrScript(t *testing.T) {
	entries, err := files.ReadDir("templates")
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range entries {
		b, err := files.ReadFile("templates/" + e.Name())
		if err != nil {
			t.Fatal(err)
		}
		if m := inlineRE.Find(b); m != nil {
			t.Errorf("%s has %q, which the CSP blocks; put styles in static/console.css", e.Name(), m)
		}
	}
}

// TestSessions_Expire: a login lasts SessionTTL from the login, however
// much it is used; then the console asks for the token again and the
// session is gone from memory.
func TestSessions_Expire(t *testing.T) {
	now := time.Date(2025, 1, 1, 12, 0, 0, 0, time.UTC)
	c := &Console{Token: "pgt_secret", SessionTTL: time.Hour, Logger: slog.New(slog.DiscardHandler), now: func() time.Time { return now }}
	ck := login(t, c, "pgt_secret")
	if ck.Value == "pgt_secret" || strings.Contains(ck.Value, "pgt_secret") || len(ck.Value) < 43 {
		t.Fatalf("session cookie %q: want a random id of 256 bits, not the token", ck.Value)
	}
	if got, want := ck.MaxAge, 3600; got != want {
		t.Errorf("cookie Max-Age = %d, want %d", got, want)
	}
	req := httptest.NewRequest(http.MethodGet, "/", nil)
	req.AddCookie(&http.Cookie{Name: ck.Name, Value: ck.Value})
	now = now.Add(59 * time.Minute)
	if !c.authorized(req) {
		t.Fatal("session refused before its expiry")
	}
	now = now.Add(time.Minute) // used a minute ago: still expires an hour after the login
	w := httptest.NewRecorder()
	c.ServeHTTP(w, req)
	if body := w.Body.String(); !strings.Contains(body, `name="token"`) {
		t.Errorf("expired session: the console did not ask for the token:\n%s", body)
	}
	if n := c.sessions.len(); n != 0 {
		t.Errorf("%d sessions kept after expiry, want 0", n)
	}
	// Expired sessions nobody presents again are pruned at the next login.
	login(t, c, "pgt_secret")
	now = now.Add(2 * time.Hour)
	login(t, c, "pgt_secret")
	if n := c.sessions.len(); n != 1 {
		t.Errorf("%d sessions after an expired one and a new login, want 1", n)
	}
}

// TestLogin_CookieOverTLS: the session cookie is Secure when the login came
// over TLS, and HttpOnly, SameSite=Strict, Path=/ always.
func TestLogin_CookieOverTLS(t *testing.T) {
	c := &Console{Token: "pgt_secret", Logger: slog.New(slog.DiscardHandler)}
	for _, overTLS := range []bool{false, true} {
		req := httptest.NewRequest(http.MethodPost, "/login", strings.NewReader(url.Values{"token": {"pgt_secret"}}.Encode()))
		req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
		if overTLS {
			req.TLS = &tls.ConnectionState{}
		}
		w := httptest.NewRecorder()
		c.ServeHTTP(w, req)
		cks := w.Result().Cookies()
		if len(cks) != 1 {
			t.Fatalf("TLS %v: cookies %v, want one", overTLS, cks)
		}
		ck := cks[0]
		if ck.Name != cookieName || ck.Secure != overTLS || !ck.HttpOnly || ck.SameSite != http.SameSiteStrictMode || ck.Path != "/" {
			t.Errorf("TLS %v: cookie %+v, want %s HttpOnly SameSite=Strict Path=/ Secure=%v", overTLS, ck, cookieName, overTLS)
		}
		if got, want := c.ttl(), 12*time.Hour; ck.MaxAge != int(want/time.Second) || got != want {
			t.Errorf("default session: Max-Age %d, ttl %v; want %v", ck.MaxAge, got, want)
		}
	}
}

// TestSameOrigin: POSTs from another site (by Origin, else Referer) are
// refused; requests with neither header are not a browser's cross-site form.
func TestSameOrigin(t *testing.T) {
	for _, tc := range []struct {
		origin, referer string
		tls             bool
		want            bool
	}{
		{"http://console.example:8080", "", false, true},
		{"HTTP://Console.Example:8080", "", false, true},
		{"https://console.example:8080", "", false, true}, // TLS ended by a proxy in front
		{"http://evil.example", "", false, false},
		{"http://console.example:8081", "", false, false},
		{"null", "", false, false},
		{"", "http://console.example:8080/?failed", false, true},
		{"", "http://evil.example/console.example:8080", false, false},
		{"", "", false, true},
		{"http://console.example:8080", "", true, false}, // a plain-HTTP page posting to the HTTPS console
		{"https://console.example:8080", "", true, true},
	} {
		req := httptest.NewRequest(http.MethodPost, "http://console.example:8080/login", nil)
		if tc.origin != "" {
			req.Header.Set("Origin", tc.origin)
		}
		if tc.referer != "" {
			req.Header.Set("Referer", tc.referer)
		}
		if tc.tls {
			req.TLS = &tls.ConnectionState{}
		}
		if got := sameOrigin(req); got != tc.want {
			t.Errorf("Origin %q Referer %q TLS %v: sameOrigin = %v, want %v", tc.origin, tc.referer, tc.tls, got, tc.want)
		}
	}
}

// login posts the token and returns the session cookie it sets.
func login(t *testing.T, c *Console, token string) *http.Cookie {
	t.Helper()
	req := httptest.NewRequest(http.MethodPost, "/login", strings.NewReader(url.Values{"token": {token}}.Encode()))
	req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	w := httptest.NewRecorder()
	c.ServeHTTP(w, req)
	for _, ck := range w.Result().Cookies() {
		if ck.Name == cookieName {
			return ck
		}
	}
	t.Fatalf("login: status %d, no %s cookie", w.Code, cookieName)
	return nil
}
