package daemon_test

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"net/http/cookiejar"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/pgtenant/pgtenant/internal/api"
	"github.com/pgtenant/pgtenant/internal/catalog"
	"github.com/pgtenant/pgtenant/internal/config"
	"github.com/pgtenant/pgtenant/internal/daemon/daemontest"
	"github.com/pgtenant/pgtenant/internal/pgtest"
)

var pg *pgtest.Cluster

func TestMain(m *testing.M) { pgtest.Main(m, pgtest.Options{Standbys: 1}, &pg) }

func TestAPI_TokenRequired(t *testing.T) {
	d, _ := daemontest.Start(t, pg, daemontest.Config(t, pg))
	for _, token := range []string{"", "wrong", d.Token() + "x"} {
		c := api.NewClient(d.Addr(), token)
		_, err := c.Clusters(context.Background())
		var apiErr *api.Error
		if !errors.As(err, &apiErr) || apiErr.Status != http.StatusUnauthorized {
			t.Errorf("token %q: err = %v, want 401", token, err)
		}
	}
	// /healthz and /metrics need no token.
	c := api.NewClient(d.Addr(), "")
	h, err := c.Health(context.Background())
	if err != nil || h.Status != "ok" {
		t.Errorf("healthz = %+v, %v; want ok", h, err)
	}
	resp, err := http.Get("http://" + d.Addr() + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Errorf("/metrics status = %d, want 200", resp.StatusCode)
	}
}

func TestClusters_ListShowsStreamingStandby(t *testing.T) {
	_, c := daemontest.Start(t, pg, daemontest.Config(t, pg))
	ctx := context.Background()
	cs, err := c.Clusters(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if len(cs) != 1 || cs[0].Name != "local" || cs[0].Kind != "managed" || cs[0].Status != "up" {
		t.Fatalf("clusters = %+v, want local managed up", cs)
	}
	if len(cs[0].Standbys) != 1 || cs[0].Standbys[0].State != "streaming" {
		t.Errorf("standbys = %+v, want one streaming", cs[0].Standbys)
	}
	if strings.Contains(cs[0].DSN, pgPassword(t)) {
		t.Errorf("listed DSN %q shows the password", cs[0].DSN)
	}
	d, err := c.Cluster(ctx, "local")
	if err != nil {
		t.Fatal(err)
	}
	if d.Info == nil || d.Info.ServerVersion == "" || d.Info.Settings["max_locks_per_transaction"] == "" ||
		!d.Info.Extensions["pg_prewarm"].Available || d.Info.RelationFiles <= 0 {
		t.Errorf("show local = %+v, want version, settings, pg_prewarm and relation files", d.Info)
	}
	if _, err := c.Cluster(ctx, "nope"); !errors.Is(err, catalog.ErrNotFound) {
		t.Errorf("show nope: err = %v, want not found", err)
	}
}

func TestClusters_AddValidates(t *testing.T) {
	_, c := daemontest.Start(t, pg, daemontest.Config(t, pg))
	ctx := context.Background()
	for _, tc := range []struct {
		name, dsn, want string
	}{
		{"bad name", pg.PrimaryDSN("postgres"), "cluster name"},
		{"c2", "postgres://pgtenant:s3cretpw@127.0.0.1:1/postgres?connect_timeout=2", "cannot reach cluster c2"},
		{"c3", "not a dsn ://", "bad dsn"},
	} {
		_, err := c.AddCluster(ctx, api.AddClusterRequest{Name: tc.name, DSN: tc.dsn})
		var apiErr *api.Error
		if !errors.As(err, &apiErr) || apiErr.Status != http.StatusBadRequest || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("add %q: err = %v, want 400 containing %q", tc.name, err, tc.want)
		}
		if err != nil && strings.Contains(err.Error(), "s3cretpw") {
			t.Errorf("add %q: error shows the password: %v", tc.name, err)
		}
	}
	// A good external DSN registers; the listed DSN hides the password.
	got, err := c.AddCluster(ctx, api.AddClusterRequest{Name: "ext", DSN: pg.PrimaryDSN("postgres")})
	if err != nil {
		t.Fatal(err)
	}
	if got.Status != "up" || strings.Contains(got.DSN, pgPassword(t)) {
		t.Errorf("added = %+v, want up with redacted DSN", got)
	}
	// The managed cluster cannot be replaced.
	if _, err := c.AddCluster(ctx, api.AddClusterRequest{Name: "local", DSN: pg.PrimaryDSN("postgres")}); err == nil {
		t.Error("replacing the managed cluster succeeded, want an error")
	}
}

// TestClusters_DaemonsOfOneCatalogAgree: a cluster added through one daemon
// is used by another daemon of the same catalog within seconds, without a
// restart; a daemon whose configuration lists a cluster that `up` manages
// (as an external one) does not take it over.
func TestClusters_DaemonsOfOneCatalogAgree(t *testing.T) {
	ctx := pgtest.Context(t)
	cfg := daemontest.Config(t, pg)
	_, a := daemontest.Start(t, pg, cfg)
	other := cfg
	other.TokenFile = cfg.TokenFile + ".b"
	other.Clusters = []config.ClusterConfig{{Name: "local", DSN: pg.PrimaryDSN("postgres")}}
	_, b := daemontest.Start(t, pg, other)

	if _, err := a.AddCluster(ctx, api.AddClusterRequest{Name: "added", DSN: pg.PrimaryDSN("postgres")}); err != nil {
		t.Fatal(err)
	}
	for deadline := time.Now().Add(30 * time.Second); ; {
		got, err := b.Cluster(ctx, "added")
		if err == nil && got.Status == "up" {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the other daemon does not use the added cluster: %+v, %v", got, err)
		}
		time.Sleep(100 * time.Millisecond)
	}
	cs, err := a.Clusters(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range cs {
		if c.Name == "local" && c.Kind != "managed" {
			t.Errorf("cluster local is %s after a daemon listed it in its configuration, want still managed", c.Kind)
		}
	}
}

// TestConsole_AsksForTheToken: the console shows a login form, refuses a
// wrong token, and shows the fleet with the right one.
func TestConsole_AsksForTheToken(t *testing.T) {
	d, _ := daemontest.Start(t, pg, daemontest.Config(t, pg))
	jar, err := cookiejar.New(nil)
	if err != nil {
		t.Fatal(err)
	}
	hc := &http.Client{Jar: jar}
	base := "http://" + d.Addr()
	get := func() string {
		resp, err := hc.Get(base + "/")
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return string(b)
	}
	if page := get(); !strings.Contains(page, `name="token"`) {
		t.Fatalf("console without a token does not ask for one:\n%s", page)
	}
	resp, err := hc.PostForm(base+"/login", url.Values{"token": {"wrong"}})
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if !strings.Contains(string(b), "not right") {
		t.Errorf("a wrong token was not said to be wrong:\n%s", b)
	}
	if page := get(); strings.Contains(page, "Clusters") {
		t.Error("a wrong token opened the console")
	}
	if _, err := hc.PostForm(base+"/login", url.Values{"token": {d.Token()}}); err != nil {
		t.Fatal(err)
	}
	if page := get(); !strings.Contains(page, "Clusters") || !strings.Contains(page, "local") || !strings.Contains(page, `action="/logout"`) {
		t.Errorf("console with the token does not show the fleet and a logout button:\n%s", page)
	}
}

// console is a browser without a cookie jar (the tests set cookies
// themselves) that does not follow redirects, posting from base's own pages.
type console struct {
	t    *testing.T
	base string
	hc   *http.Client
}

func newConsole(t *testing.T, base string, rt http.RoundTripper) *console {
	return &console{t: t, base: base, hc: &http.Client{Transport: rt,
		CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}}
}

// post sends a form to path with the given Origin ("" for none) and cookies.
func (c *console) post(path, origin string, form url.Values, cookies ...*http.Cookie) *http.Response {
	c.t.Helper()
	req, err := http.NewRequest(http.MethodPost, c.base+path, strings.NewReader(form.Encode()))
	if err != nil {
		c.t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	if origin != "" {
		req.Header.Set("Origin", origin)
	}
	for _, ck := range cookies {
		req.AddCookie(ck)
	}
	resp, err := c.hc.Do(req)
	if err != nil {
		c.t.Fatal(err)
	}
	resp.Body.Close()
	return resp
}

// page gets / with cookies and reports whether it shows the fleet (else it
// asks for the token).
func (c *console) page(cookies ...*http.Cookie) bool {
	c.t.Helper()
	req, err := http.NewRequest(http.MethodGet, c.base+"/", nil)
	if err != nil {
		c.t.Fatal(err)
	}
	for _, ck := range cookies {
		req.AddCookie(ck)
	}
	resp, err := c.hc.Do(req)
	if err != nil {
		c.t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	page := string(b)
	switch {
	case strings.Contains(page, "<h2>Clusters</h2>"):
		return true
	case strings.Contains(page, `name="token"`):
		return false
	}
	c.t.Fatalf("GET /: status %d, neither the fleet nor the login form:\n%s", resp.StatusCode, page)
	return false
}

// login posts the token from the console's own origin and returns the
// session cookie.
func (c *console) login(token string) *http.Cookie {
	c.t.Helper()
	resp := c.post("/login", c.base, url.Values{"token": {token}})
	for _, ck := range resp.Cookies() {
		if ck.Name == "pgtenant_session" {
			return ck
		}
	}
	c.t.Fatalf("login: status %d, no session cookie in %v", resp.StatusCode, resp.Cookies())
	return nil
}

// TestConsole_Sessions: the cookie holds a session id, not the token; the
// id opens the console until logout; the token itself as a cookie does not.
func TestConsole_Sessions(t *testing.T) {
	d, _ := daemontest.Start(t, pg, daemontest.Config(t, pg))
	c := newConsole(t, "http://"+d.Addr(), nil)
	ck := c.login(d.Token())
	if strings.Contains(ck.Value, d.Token()) || strings.Contains(d.Token(), ck.Value) {
		t.Fatalf("session cookie %q holds the token", ck.Value)
	}
	if !ck.HttpOnly || ck.SameSite != http.SameSiteStrictMode || ck.Path != "/" || ck.Secure {
		t.Errorf("session cookie %+v: want HttpOnly, SameSite=Strict, Path=/, not Secure over plain HTTP", ck)
	}
	if got, want := ck.MaxAge, 12*3600; got != want {
		t.Errorf("session cookie Max-Age = %d, want %d (console_session_ttl)", got, want)
	}
	if !c.page(ck) {
		t.Fatal("the session cookie does not open the console")
	}
	// A second login is a second session: logging one out keeps the other.
	other := c.login(d.Token())
	if other.Value == ck.Value {
		t.Fatal("two logins got the same session id")
	}

	// The raw token as a cookie value opens nothing, under either name.
	for _, name := range []string{"pgtenant_session", "pgtenant_token"} {
		if c.page(&http.Cookie{Name: name, Value: d.Token()}) {
			t.Errorf("the raw token in cookie %s opened the console", name)
		}
	}

	resp := c.post("/logout", c.base, nil, ck)
	if resp.StatusCode != http.StatusSeeOther || resp.Header.Get("Location") != "/" {
		t.Errorf("logout: %d to %q, want 303 to /", resp.StatusCode, resp.Header.Get("Location"))
	}
	cleared := false
	for _, k := range resp.Cookies() {
		cleared = cleared || (k.Name == "pgtenant_session" && k.MaxAge < 0 && k.Value == "")
	}
	if !cleared {
		t.Errorf("logout did not clear the cookie: %v", resp.Cookies())
	}
	if c.page(ck) {
		t.Error("the session still opens the console after logout")
	}
	if !c.page(other) {
		t.Error("logging one session out ended another")
	}
}

// TestConsole_CrossOriginPostRefused: a form posted from another site (by
// Origin, or Referer when there is no Origin) is refused before the token
// is looked at, and starts no session; logout likewise.
func TestConsole_CrossOriginPostRefused(t *testing.T) {
	d, _ := daemontest.Start(t, pg, daemontest.Config(t, pg))
	c := newConsole(t, "http://"+d.Addr(), nil)
	for _, origin := range []string{"http://evil.example", "null", "http://" + d.Addr() + ".evil.example"} {
		resp := c.post("/login", origin, url.Values{"token": {d.Token()}})
		if resp.StatusCode != http.StatusForbidden || len(resp.Cookies()) != 0 {
			t.Errorf("login from Origin %q: status %d, cookies %v; want 403 and none", origin, resp.StatusCode, resp.Cookies())
		}
	}
	req, err := http.NewRequest(http.MethodPost, c.base+"/login", strings.NewReader(url.Values{"token": {d.Token()}}.Encode()))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	req.Header.Set("Referer", "http://evil.example/page")
	resp, err := c.hc.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusForbidden {
		t.Errorf("login with a foreign Referer: status %d, want 403", resp.StatusCode)
	}
	ck := c.login(d.Token())
	if resp := c.post("/logout", "http://evil.example", nil, ck); resp.StatusCode != http.StatusForbidden {
		t.Errorf("logout from another origin: status %d, want 403", resp.StatusCode)
	}
	if !c.page(ck) {
		t.Error("a cross-origin logout ended the session")
	}
}

// TestAPI_TrailingDataRefused: a JSON body followed by anything but
// whitespace is a 400 "invalid", and nothing is registered.
func TestAPI_TrailingDataRefused(t *testing.T) {
	d, c := daemontest.Start(t, pg, daemontest.Config(t, pg))
	body := `{"name":"ext","dsn":"` + pg.PrimaryDSN("postgres") + `"} garbage`
	req, err := http.NewRequest(http.MethodPost, "http://"+d.Addr()+"/v1/clusters", strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Authorization", "Bearer "+d.Token())
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var eb api.ErrorBody
	if err := json.NewDecoder(resp.Body).Decode(&eb); err != nil {
		t.Fatal(err)
	}
	if resp.StatusCode != http.StatusBadRequest || eb.Error.Code != "invalid" || !strings.Contains(eb.Error.Message, "after the JSON object") {
		t.Errorf("trailing garbage: %d %+v, want 400 invalid naming the trailing data", resp.StatusCode, eb.Error)
	}
	if _, err := c.Cluster(context.Background(), "ext"); !errors.Is(err, catalog.ErrNotFound) {
		t.Errorf("cluster ext after a refused body: err = %v, want not found", err)
	}
}

// TestHTTP_SecurityHeaders: console pages, the stylesheet, the API and
// /healthz all carry the CSP (with frame-ancestors 'none'), no framing, no
// sniffing and no caching of pages with data.
func TestHTTP_SecurityHeaders(t *testing.T) {
	d, _ := daemontest.Start(t, pg, daemontest.Config(t, pg))
	base := "http://" + d.Addr()
	for _, tc := range []struct {
		path, cache, referrer string
	}{
		{"/", "no-store", "same-origin"},
		{"/static/console.css", "max-age=3600", "no-referrer"},
		{"/v1/clusters", "no-store", "no-referrer"},
		{"/healthz", "no-store", "no-referrer"},
		{"/metrics", "no-store", "no-referrer"},
	} {
		req, err := http.NewRequest(http.MethodGet, base+tc.path, nil)
		if err != nil {
			t.Fatal(err)
		}
		req.Header.Set("Authorization", "Bearer "+d.Token())
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			t.Errorf("GET %s: status %d, want 200", tc.path, resp.StatusCode)
		}
		h := resp.Header
		for name, want := range map[string]string{
			"Content-Security-Policy": api.ContentSecurityPolicy,
			"X-Frame-Options":         "DENY",
			"X-Content-Type-Options":  "nosniff",
			"Referrer-Policy":         tc.referrer,
			"Cache-Control":           tc.cache,
		} {
			if got := h.Get(name); got != want {
				t.Errorf("GET %s: %s = %q, want %q", tc.path, name, got, want)
			}
		}
		if csp := h.Get("Content-Security-Policy"); !strings.Contains(csp, "frame-ancestors 'none'") || strings.Contains(csp, "unsafe-inline") {
			t.Errorf("GET %s: CSP %q, want frame-ancestors 'none' and no unsafe-inline", tc.path, csp)
		}
	}
}

// getMetrics GETs url with token ("" for none) and returns the status and body.
func getMetrics(t *testing.T, url, token string) (int, string) {
	t.Helper()
	req, err := http.NewRequest(http.MethodGet, url, nil)
	if err != nil {
		t.Fatal(err)
	}
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

// TestMetrics_BehindTheToken: with metrics_auth, /metrics answers 401
// without the bearer token (or with a wrong one) and 200 with it.
func TestMetrics_BehindTheToken(t *testing.T) {
	cfg := daemontest.Config(t, pg)
	cfg.MetricsAuth = true
	d, _ := daemontest.Start(t, pg, cfg)
	u := "http://" + d.Addr() + "/metrics"
	for _, token := range []string{"", "wrong"} {
		if status, body := getMetrics(t, u, token); status != http.StatusUnauthorized || !strings.Contains(body, `"unauthorized"`) || strings.Contains(body, "pgtenant_") {
			t.Errorf("/metrics with token %q: %d %s, want 401 unauthorized and no series", token, status, body)
		}
	}
	if status, body := getMetrics(t, u, d.Token()); status != http.StatusOK || !strings.Contains(body, "pgtenant_cluster_up") {
		t.Errorf("/metrics with the token: status %d, want 200 with pgtenant_cluster_up", status)
	}
}

// TestMetrics_OwnListener: with metrics_listen, /metrics is served there
// (without a token unless metrics_auth) and only there; that listener serves
// nothing else.
func TestMetrics_OwnListener(t *testing.T) {
	cfg := daemontest.Config(t, pg)
	cfg.MetricsListen = "127.0.0.1:0"
	d, _ := daemontest.Start(t, pg, cfg)
	if d.MetricsAddr() == "" || d.MetricsAddr() == d.Addr() {
		t.Fatalf("metrics address %q (API %q), want one of its own", d.MetricsAddr(), d.Addr())
	}
	metricsURL := "http://" + d.MetricsAddr()
	if status, body := getMetrics(t, metricsURL+"/metrics", ""); status != http.StatusOK || !strings.Contains(body, "pgtenant_cluster_up") {
		t.Errorf("GET metrics_listen/metrics: status %d, want 200 with pgtenant_cluster_up", status)
	}
	if status, _ := getMetrics(t, "http://"+d.Addr()+"/metrics", d.Token()); status != http.StatusNotFound {
		t.Errorf("GET listen/metrics: status %d, want 404 (served on metrics_listen only)", status)
	}
	for _, path := range []string{"/", "/v1/clusters", "/healthz"} {
		if status, _ := getMetrics(t, metricsURL+path, d.Token()); status != http.StatusNotFound {
			t.Errorf("GET metrics_listen%s: status %d, want 404", path, status)
		}
	}

	// metrics_auth holds on metrics_listen too.
	cfg = daemontest.Config(t, pg)
	cfg.MetricsListen, cfg.MetricsAuth = "127.0.0.1:0", true
	d, _ = daemontest.Start(t, pg, cfg)
	if status, _ := getMetrics(t, "http://"+d.MetricsAddr()+"/metrics", ""); status != http.StatusUnauthorized {
		t.Errorf("metrics_listen with metrics_auth, no token: status %d, want 401", status)
	}
	if status, _ := getMetrics(t, "http://"+d.MetricsAddr()+"/metrics", d.Token()); status != http.StatusOK {
		t.Errorf("metrics_listen with metrics_auth, the token: status %d, want 200", status)
	}
}
