package console_test

import (
	"context"
	"html"
	"io"
	"net/http"
	"net/http/cookiejar"
	"net/url"
	"regexp"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/pgtenant/pgtenant/examples/templates"
	"github.com/pgtenant/pgtenant/internal/api"
	"github.com/pgtenant/pgtenant/internal/catalog"
	"github.com/pgtenant/pgtenant/internal/daemon/daemontest"
	"github.com/pgtenant/pgtenant/internal/jobs"
	"github.com/pgtenant/pgtenant/internal/pgtest"
	"github.com/pgtenant/pgtenant/internal/provision"
)

var pg *pgtest.Cluster

func TestMain(m *testing.M) {
	pgtest.Main(m, pgtest.Options{Standbys: 1}, &pg)
}

// fleet is a daemon with template saas and two tenants.
type fleet struct {
	base   string
	token  string
	c      *api.Client
	acme   api.Tenant
	globex api.Tenant
}

func startFleet(t *testing.T) fleet {
	t.Helper()
	ctx := pgtest.Context(t)
	cfg := daemontest.Config(t, pg)
	cfg.Provision.DefaultPoolSize = 1
	d, c := daemontest.Start(t, pg, cfg)
	added, err := c.CreateTemplate(ctx, "saas", templates.Saas())
	if err != nil {
		t.Fatal(err)
	}
	for _, j := range added.BuildJobs {
		if j, err := c.WaitJob(ctx, j.ID, nil); err != nil || j.State != jobs.Succeeded {
			t.Fatalf("build: %v %s %s", err, j.State, j.LastError)
		}
	}
	f := fleet{base: d.URL(), token: d.Token(), c: c}
	for _, x := range []struct {
		name, ext string
		out       *api.Tenant
	}{{"Acme Corp", "acme-42", &f.acme}, {"Globex", "globex-7", &f.globex}} {
		name := x.name
		r, err := c.CreateTenant(ctx, provision.Request{Template: "saas", Name: &name, ExternalID: x.ext})
		if err != nil {
			t.Fatal(err)
		}
		*x.out = r.Tenant
	}
	return f
}

// browser is an HTTP client with a cookie jar that does not follow
// redirects and posts forms from the console's own origin.
type browser struct {
	t    *testing.T
	base string
	hc   *http.Client
}

func newBrowser(t *testing.T, base string) *browser {
	jar, _ := cookiejar.New(nil)
	return &browser{t: t, base: base, hc: &http.Client{Jar: jar,
		CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}}
}

func (b *browser) get(path string) (int, string) {
	b.t.Helper()
	resp, err := b.hc.Get(b.base + path)
	if err != nil {
		b.t.Fatal(err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(body)
}

func (b *browser) post(path, origin string, form url.Values) (int, string, string) {
	b.t.Helper()
	req, _ := http.NewRequest(http.MethodPost, b.base+path, strings.NewReader(form.Encode()))
	req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	if origin != "" {
		req.Header.Set("Origin", origin)
	}
	resp, err := b.hc.Do(req)
	if err != nil {
		b.t.Fatal(err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, resp.Header.Get("Location"), string(body)
}

var csrfRE = regexp.MustCompile(`name="csrf" value="([^"]+)"`)

// TestConsole_Pages: logged in, the search finds a tenant by part of its
// name or external id (and not the other), every page renders from a real
// daemon, and a missing tenant is the API's 404.
func TestConsole_Pages(t *testing.T) {
	f := startFleet(t)
	b := newBrowser(t, f.base)
	if status, page := b.get("/tenants"); status != 200 || !strings.Contains(page, `name="token"`) {
		t.Fatalf("/tenants without a session: %d, no login form", status)
	}
	if status, loc, _ := b.post("/login", f.base, url.Values{"token": {f.token}}); status != http.StatusSeeOther || loc != "/" {
		t.Fatalf("login: %d %s", status, loc)
	}
	for _, q := range []string{"acme", "ACME-4", f.acme.ID} {
		_, page := b.get("/tenants?q=" + url.QueryEscape(q))
		if !strings.Contains(page, f.acme.ID) || strings.Contains(page, f.globex.ID) {
			t.Errorf("search %q: want %s only:\n%s", q, f.acme.ID, page)
		}
	}
	if _, page := b.get("/tenants?tier=gold&state=active"); !strings.Contains(page, "no tenant matches") {
		t.Errorf("filter by an unused tier lists tenants:\n%s", page)
	}
	if _, page := b.get("/tenants?sort=size"); !strings.Contains(page, f.acme.ID) || !strings.Contains(page, f.globex.ID) {
		t.Errorf("sorted list lacks a tenant:\n%s", page)
	}
	for path, want := range map[string][]string{
		"/":                                {"<h2>Clusters</h2>", "saas"},
		"/tenants/" + f.acme.ID:            {"Acme Corp", "acme-42", `id="action-suspend"`, `id="action-drop"`, "buffer hit ratio", "<h2>Events</h2>", "<h2>Prewarm</h2>", "Quota"},
		"/jobs":                            {"template.build"},
		"/jobs/1":                          {"Job 1: template.build", "Steps done", "succeeded"},
		"/rollouts":                        {"no rollout yet"},
		"/templates/saas":                  {"Start a rollout"},
		"/clusters":                        {"local", "Steps held by the pacer now"},
		"/tenants/" + f.acme.ID + "/purge": {"Purge now?", "cannot be undone", `name="csrf"`},
	} {
		status, page := b.get(path)
		if status != 200 {
			t.Errorf("GET %s: %d\n%s", path, status, page)
			continue
		}
		for _, w := range want {
			if !strings.Contains(page, w) {
				t.Errorf("GET %s lacks %q", path, w)
			}
		}
	}
	// Paged one by one, by id and by size: each page has one tenant and
	// links to the next or previous page, keeping the filters.
	for _, first := range []string{"/tenants?per=1&state=active", "/tenants?per=1&state=active&sort=size"} {
		_, p1 := b.get(first)
		next := regexp.MustCompile(`href="([^"]+)" id="next"`).FindStringSubmatch(p1)
		if next == nil {
			t.Fatalf("%s: no next link:\n%s", first, p1)
		}
		nextURL := html.UnescapeString(next[1])
		if !strings.Contains(nextURL, "state=active") || !strings.Contains(nextURL, "per=1") {
			t.Errorf("%s: next link %s drops the filters", first, nextURL)
		}
		_, p2 := b.get(nextURL)
		for _, tn := range []api.Tenant{f.acme, f.globex} {
			in1, in2 := strings.Contains(p1, tn.ID), strings.Contains(p2, tn.ID)
			if in1 == in2 {
				t.Errorf("%s: tenant %s on page 1 %v, page 2 %v: want exactly one", first, tn.ID, in1, in2)
			}
		}
		if strings.Contains(p2, `id="next"`) || !strings.Contains(p2, `id="prev"`) {
			t.Errorf("%s: the last page has a next link or no previous one", first)
		}
	}
	if status, page := b.get("/tenants/abcdefghijkl"); status != 404 || !strings.Contains(page, "not found") {
		t.Errorf("missing tenant: %d\n%s", status, page)
	}
}

// TestConsole_ActionsNeedCSRFAndOrigin: an action posted without the
// session's CSRF token, or from another origin, or without a session,
// changes nothing; a confirmed one goes through the API (the tenant is
// suspended, resumed; a rotated password logs in).
func TestConsole_ActionsNeedCSRFAndOrigin(t *testing.T) {
	f := startFleet(t)
	ctx := pgtest.Context(t)
	b := newBrowser(t, f.base)
	b.post("/login", f.base, url.Values{"token": {f.token}})
	_, page := b.get("/tenants/" + f.acme.ID + "/suspend")
	m := csrfRE.FindStringSubmatch(page)
	if m == nil {
		t.Fatalf("confirmation page without a CSRF token:\n%s", page)
	}
	csrf := m[1]
	path := "/tenants/" + f.acme.ID + "/suspend"
	for _, tc := range []struct {
		name   string
		b      *browser
		origin string
		form   url.Values
	}{
		{"no csrf", b, f.base, url.Values{}},
		{"wrong csrf", b, f.base, url.Values{"csrf": {csrf + "x"}}},
		{"other origin", b, "http://evil.example", url.Values{"csrf": {csrf}}},
		{"no session", newBrowser(t, f.base), f.base, url.Values{"csrf": {csrf}}},
	} {
		if status, _, _ := tc.b.post(path, tc.origin, tc.form); status != http.StatusForbidden {
			t.Errorf("%s: status %d, want 403", tc.name, status)
		}
	}
	state := func() string {
		t.Helper()
		tn, err := f.c.Tenant(ctx, f.acme.ID)
		if err != nil {
			t.Fatal(err)
		}
		return tn.State
	}
	if got := state(); got != catalog.StateActive {
		t.Fatalf("refused posts left the tenant %s", got)
	}
	// A restore of a tenant that is not dropped is a no-op (retries are
	// idempotent): it stays suspended.
	for _, step := range []struct{ action, want string }{{"suspend", catalog.StateSuspended}, {"restore", catalog.StateSuspended}, {"resume", catalog.StateActive}} {
		status, loc, body := b.post("/tenants/"+f.acme.ID+"/"+step.action, f.base, url.Values{"csrf": {csrf}})
		if status != http.StatusSeeOther || loc != "/tenants/"+f.acme.ID+"?done="+step.action {
			t.Fatalf("%s: %d %s\n%s", step.action, status, loc, body)
		}
		if got := state(); got != step.want {
			t.Errorf("after %s: %s, want %s", step.action, got, step.want)
		}
	}
	status, _, body := b.post("/tenants/"+f.acme.ID+"/password", f.base, url.Values{"csrf": {csrf}})
	dsn := regexp.MustCompile(`<th>direct DSN</th><td><code>([^<]+)</code>|<th>DSN</th><td><code>([^<]+)</code>`).FindStringSubmatch(body)
	if status != 200 || dsn == nil {
		t.Fatalf("password: %d\n%s", status, body)
	}
	conn, err := pgx.Connect(context.Background(), html.UnescapeString(dsn[1]+dsn[2]))
	if err != nil {
		t.Fatalf("the new password shown does not log in: %v", err)
	}
	conn.Close(ctx)
}
