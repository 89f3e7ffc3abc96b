package console_test

import (
	"context"
	"errors"
	"fmt"
	"html"
	"net/http"
	"net/url"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pgtenant/pgtenant/examples/templates"
	"github.com/pgtenant/pgtenant/internal/api"
	"github.com/pgtenant/pgtenant/internal/catalog"
	"github.com/pgtenant/pgtenant/internal/console/consoletest"
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

// fleet is a daemon with template saas and two tenants.
type fleet struct {
	base    string
	token   string
	c       *api.Client
	catalog string // DSN
	acme    api.Tenant
	globex  api.Tenant
	dsn     map[string]string // by tenant id, with the password
}

func startFleet(t *testing.T) fleet {
	t.Helper()
	ctx := pgtest.Context(t)
	cfg := daemontest.Config(t, pg)
	cfg.Provision.DefaultPoolSize = 1
	d, c := daemontest.Start(t, pg, cfg)
	daemontest.CreateTemplate(t, c, "saas", templates.Saas())
	f := fleet{base: d.URL(), token: d.Token(), c: c, catalog: cfg.Catalog.DSN, dsn: map[string]string{}}
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
		f.dsn[r.Tenant.ID] = r.DSN
	}
	return f
}

// browser is an HTTP client with a cookie jar that does not follow
// redirects and posts forms from the console's own origin.
// TestConsole_Pages: logged in, the search finds a tenant by part of its
// name or external id (and not the other), every page renders from a real
// daemon, and a missing tenant is the API's 404.
func TestConsole_Pages(t *testing.T) {
	f := startFleet(t)
	b := consoletest.New(t, f.base)
	if status, page := b.Get("/tenants"); status != 200 || !strings.Contains(page, `name="token"`) {
		t.Fatalf("/tenants without a session: %d, no login form", status)
	}
	if status, loc, _ := b.Post("/login", f.base, url.Values{"token": {f.token}}); status != http.StatusSeeOther || loc != "/" {
		t.Fatalf("login: %d %s", status, loc)
	}
	for _, q := range []string{"acme", "ACME-4", f.acme.ID} {
		_, page := b.Get("/tenants?q=" + url.QueryEscape(q))
		if !strings.Contains(page, f.acme.ID) || strings.Contains(page, f.globex.ID) {
			t.Errorf("search %q: want %s only:\n%s", q, f.acme.ID, page)
		}
	}
	if _, page := b.Get("/tenants?tier=gold&state=active"); !strings.Contains(page, "no tenant matches") {
		t.Errorf("filter by an unused tier lists tenants:\n%s", page)
	}
	if _, page := b.Get("/tenants?sort=size"); !strings.Contains(page, f.acme.ID) || !strings.Contains(page, f.globex.ID) {
		t.Errorf("sorted list lacks a tenant:\n%s", page)
	}
	for path, want := range map[string][]string{
		"/":                                {"<h2>Clusters</h2>", "saas"},
		"/tenants/" + f.acme.ID:            {"Acme Corp", "acme-42", `id="action-suspend"`, `id="action-drop"`, "buffer hit ratio", "<h2>Events</h2>", "<h2>Prewarm</h2>", "Quota"},
		"/jobs":                            {"template.build"},
		"/jobs/1":                          {"Job 1: template.build", "Steps done", "succeeded"},
		"/rollouts":                        {"no rollout yet"},
		"/templates/saas":                  {"Start a rollout", "Spare pools", "<td>local</td><td>database</td>", "<td>local</td><td>schema</td>"},
		"/clusters":                        {"local", "Steps held by the pacer now"},
		"/tenants/" + f.acme.ID + "/purge": {"Purge now?", "cannot be undone", `name="csrf"`},
		"/templates":                       {`<a href="/templates/saas"><b>saas</b></a>`, "<title>Templates · pgtenant</title>"},
		"/tenants/new":                     {`id="create"`, "<option>saas</option>", "<option>local</option>"},
		"/tenants/new/confirm?template=saas&name=Hooli":             {"Create the tenant?", `template saas named &#34;Hooli&#34;`, `name="template" value="saas"`, `name="csrf"`},
		"/tenants/" + f.acme.ID + "/move?to=local2":                 {"Move?", "from cluster local to local2", `name="to" value="local2"`},
		"/tenants/" + f.acme.ID + "/rewind?to=2025-01-01T00:00:00Z": {"Rewind?", "back to 2025-01-01T00:00:00Z", `name="to" value="2025-01-01T00:00:00Z"`},
		"/tenants/" + f.acme.ID + "/fork?name=Copy":                 {"Fork?", `new tenant &#34;Copy&#34;, as of now`, `name="name" value="Copy"`},
		"/tenants/" + f.acme.ID + "/analytics-enable":               {"Enable analytics?", "analytics port"},
		"/clusters/local/drain":                                     {"Drain the cluster?", "cluster local: 2 tenants"},
		"/clusters/local/undrain":                                   {"Undrain the cluster?"},
		"/doctor":                                                   {`id="doctor-status"`, `id="doctor-local"`},
		"/doctor?cluster=local":                                     {`id="doctor-local"`},
		"/reconcile":                                                {`id="findings"`, "<b>local</b>"},
		"/reconcile/fix":                                            {"Fix what reconcile finds?", `name="csrf"`},
		"/backups":                                                  {"<h2>Backups</h2>"},
		"/backups/now?type=diff":                                    {"Take a backup?", "a diff backup of every backed-up cluster"},
		"/jobs?type=tenant.build":                                   {"<td>tenant.build</td>"},
	} {
		status, page := b.Get(path)
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
		_, p1 := b.Get(first)
		next := regexp.MustCompile(`href="([^"]+)" id="next"`).FindStringSubmatch(p1)
		if next == nil {
			t.Fatalf("%s: no next link:\n%s", first, p1)
		}
		nextURL := html.UnescapeString(next[1])
		if !strings.Contains(nextURL, "state=active") || !strings.Contains(nextURL, "per=1") {
			t.Errorf("%s: next link %s drops the filters", first, nextURL)
		}
		_, p2 := b.Get(nextURL)
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
	// The confirmation pages asked for above changed nothing: only their
	// forms, posted, act.
	ctx := pgtest.Context(t)
	if d, err := f.c.Cluster(ctx, "local"); err != nil || d.Draining {
		t.Errorf("after GET /clusters/local/drain the cluster is draining (%v)", err)
	}
	if st, err := f.c.AnalyticsStatus(ctx, f.acme.ID); err != nil || st.Enabled {
		t.Errorf("after GET of analytics-enable the mirror is on (%v)", err)
	}
	if ts, err := f.c.Tenants(ctx, url.Values{"q": {"Hooli"}}); err != nil || len(ts) != 0 {
		t.Errorf("after GET of the create confirmation: %d tenants named Hooli (%v)", len(ts), err)
	}
	// Jobs: background builds hidden unless asked for; paged.
	if _, page := b.Get("/jobs"); strings.Contains(page, "<td>tenant.build</td>") || !strings.Contains(page, `id="hidden-builds"`) {
		t.Errorf("/jobs shows background builds, or does not say they are hidden:\n%s", page)
	}
	if _, page := b.Get("/jobs?builds=1"); !strings.Contains(page, "<td>tenant.build</td>") {
		t.Errorf("/jobs?builds=1 lacks the builds:\n%s", page)
	}
	_, j1 := b.Get("/jobs?per=1&builds=1")
	next := regexp.MustCompile(`href="([^"]+)" id="next"`).FindStringSubmatch(j1)
	if next == nil || !strings.Contains(html.UnescapeString(next[1]), "per=1") || !strings.Contains(html.UnescapeString(next[1]), "builds=1") {
		t.Fatalf("/jobs?per=1: no next link keeping the filters:\n%s", j1)
	}
	_, j2 := b.Get(html.UnescapeString(next[1]))
	firstJob := regexp.MustCompile(`<tr><td><a href="/jobs/(\d+)">`)
	if a, c := firstJob.FindStringSubmatch(j1), firstJob.FindStringSubmatch(j2); a == nil || c == nil || a[1] == c[1] || !strings.Contains(j2, `id="prev"`) {
		t.Errorf("jobs page 1 and 2 of one a page: %v, %v; want two jobs and a link back", a, c)
	}
	if status, page := b.Get("/tenants/abcdefghijkl"); status != 404 || !strings.Contains(page, "not found") {
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
	b := consoletest.New(t, f.base)
	b.Post("/login", f.base, url.Values{"token": {f.token}})
	_, page := b.Get("/tenants/" + f.acme.ID + "/suspend")
	m := consoletest.CSRF.FindStringSubmatch(page)
	if m == nil {
		t.Fatalf("confirmation page without a CSRF token:\n%s", page)
	}
	csrf := m[1]
	path := "/tenants/" + f.acme.ID + "/suspend"
	for _, tc := range []struct {
		name   string
		b      *consoletest.Browser
		origin string
		form   url.Values
	}{
		{"no csrf", b, f.base, url.Values{}},
		{"wrong csrf", b, f.base, url.Values{"csrf": {csrf + "x"}}},
		{"other origin", b, "http://evil.example", url.Values{"csrf": {csrf}}},
		{"no session", consoletest.New(t, f.base), f.base, url.Values{"csrf": {csrf}}},
	} {
		if status, _, _ := tc.b.Post(path, tc.origin, tc.form); status != http.StatusForbidden {
			t.Errorf("%s: status %d, want 403", tc.name, status)
		}
	}
	state := func(id string) catalog.TenantState {
		t.Helper()
		tn, err := f.c.Tenant(ctx, id)
		if err != nil {
			t.Fatal(err)
		}
		return tn.State
	}
	if got := state(f.acme.ID); got != catalog.StateActive {
		t.Fatalf("refused posts left the tenant %s", got)
	}
	for _, step := range []struct {
		tenant, action string
		want           catalog.TenantState // "": refused by the API, with its status and message
	}{
		{f.acme.ID, "suspend", catalog.StateSuspended},
		{f.acme.ID, "restore", catalog.StateSuspended}, // not dropped: a no-op (retries are idempotent)
		{f.acme.ID, "resume", catalog.StateActive},
		{f.globex.ID, "drop", catalog.StateDropped},
		{f.globex.ID, "password", ""},
		{f.globex.ID, "restore", catalog.StateActive},
	} {
		status, loc, body := b.Post("/tenants/"+step.tenant+"/"+step.action, f.base, url.Values{"csrf": {csrf}})
		if step.want == "" {
			if status != http.StatusConflict || !strings.Contains(body, "is dropped and cannot log in") {
				t.Errorf("%s of a dropped tenant: %d, want the API's 409 and its message\n%s", step.action, status, body)
			}
			continue
		}
		if status != http.StatusSeeOther || loc != "/tenants/"+step.tenant+"?done="+step.action {
			t.Fatalf("%s: %d %s\n%s", step.action, status, loc, body)
		}
		if got := state(step.tenant); got != step.want {
			t.Errorf("after %s: %s, want %s", step.action, got, step.want)
		}
	}
	status, _, body := b.Post("/tenants/"+f.acme.ID+"/password", f.base, url.Values{"csrf": {csrf}})
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

// TestConsole_RolloutErrorsAndRetry: a rollout that fails for one tenant
// (its data breaks the new version's constraint) shows that tenant's error
// on the rollout page with a Retry action; once the data is fixed, the
// retry posted from the console migrates it.
func TestConsole_RolloutErrorsAndRetry(t *testing.T) {
	f := startFleet(t)
	ctx := pgtest.Context(t)
	exec := func(sql string) {
		t.Helper()
		conn, err := pgx.Connect(ctx, f.dsn[f.globex.ID])
		if err != nil {
			t.Fatal(err)
		}
		defer conn.Close(ctx)
		if _, err := conn.Exec(ctx, sql); err != nil {
			t.Fatal(err)
		}
	}
	exec(`INSERT INTO organizations (name, slug) VALUES ('bad', 'bad')`)
	if _, err := f.c.PushTemplate(ctx, "saas", append(templates.Saas(), tpl.Upload{Name: "0002_check.sql",
		Body: "ALTER TABLE organizations ADD CONSTRAINT org_name_ok CHECK (name <> 'bad');"})); err != nil {
		t.Fatal(err)
	}
	started, err := f.c.StartRollout(ctx, migrate.Request{Template: "saas", To: 2})
	if err != nil || started.Rollout == nil {
		t.Fatalf("start rollout: %v", err)
	}
	id := started.Rollout.ID
	waitRollout := func(want catalog.RolloutState) {
		t.Helper()
		for {
			st, err := f.c.Rollout(ctx, id, nil)
			if err != nil {
				t.Fatal(err)
			}
			if st.State == want {
				return
			}
			select {
			case <-ctx.Done():
				t.Fatalf("rollout %d is %s, want %s", id, st.State, want)
			case <-time.After(100 * time.Millisecond):
			}
		}
	}
	waitRollout(catalog.RolloutFailed)

	b := consoletest.New(t, f.base)
	b.Post("/login", f.base, url.Values{"token": {f.token}})
	path := fmt.Sprintf("/rollouts/%d", id)
	_, page := b.Get(path)
	for _, want := range []string{`id="state">failed`, "org_name_ok", f.globex.ID, `id="action-retry"`, "1 failed"} {
		if !strings.Contains(page, want) {
			t.Errorf("failed rollout page lacks %q:\n%s", want, page)
		}
	}
	_, confirm := b.Get(path + "/retry")
	m := consoletest.CSRF.FindStringSubmatch(confirm)
	if m == nil {
		t.Fatalf("retry confirmation without a CSRF token:\n%s", confirm)
	}
	exec(`DELETE FROM organizations WHERE name = 'bad'`)
	// The rollout is failed before its job has ended: until then a retry
	// is refused with "is finishing; retry it in a moment", as it says.
	for deadline := time.Now().Add(time.Minute); ; time.Sleep(200 * time.Millisecond) {
		status, loc, body := b.Post(path+"/retry", f.base, url.Values{"csrf": {m[1]}})
		if status == http.StatusSeeOther && loc == path+"?done=retry" {
			break
		}
		if status != http.StatusConflict || !strings.Contains(body, "is finishing; retry it in a moment") || time.Now().After(deadline) {
			t.Fatalf("retry: %d %s\n%s", status, loc, body)
		}
	}
	waitRollout(catalog.RolloutSucceeded)
	if _, page := b.Get(path); !strings.Contains(page, `id="state">succeeded`) || strings.Contains(page, `id="action-retry"`) {
		t.Errorf("succeeded rollout page:\n%s", page)
	}
}

// TestConsole_TenantCharts: a tenant's minute rollups (as the collector
// writes them) become the four charts of its page, through the API's
// history.
func TestConsole_TenantCharts(t *testing.T) {
	f := startFleet(t)
	ctx := pgtest.Context(t)
	store, err := catalog.Open(ctx, f.catalog, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer store.Close()
	now := time.Now().Truncate(time.Minute)
	var rs []catalog.Rollup
	for i := 10; i >= 1; i-- {
		size, commits := int64(8<<20+i<<10), int64(60*i)
		rs = append(rs, catalog.Rollup{Tenant: f.acme.ID, Minute: now.Add(-time.Duration(i) * time.Minute), SizeBytes: &size,
			Connections: i, Commits: &commits, BlksHit: 90, BlksRead: 10})
	}
	if err := store.InsertRollups(ctx, rs); err != nil {
		t.Fatal(err)
	}
	b := consoletest.New(t, f.base)
	b.Post("/login", f.base, url.Values{"token": {f.token}})
	_, page := b.Get("/tenants/" + f.acme.ID + "?history=1h")
	if n := strings.Count(page, "<polyline"); n != 4 {
		t.Errorf("%d charts drawn, want 4 (size, connections, commits/s, hit ratio):\n%s", n, page)
	}
	for _, want := range []string{"size: 8.0 MiB", "connections: 1", "commits/s: 1.00/s", "buffer hit ratio: 90.0%", "<b>1h</b>"} {
		if !strings.Contains(page, want) {
			t.Errorf("tenant page lacks %q", want)
		}
	}
}

// TestConsole_CreateTenant: the create form's confirmation posts through
// the API; the answer shows the connection string with the password once
// (not stored by the browser), and it logs in; posted without the CSRF
// token, nothing is created. A fork posted from the tenant's page is a new
// tenant whose connection string logs in too.
func TestConsole_CreateTenant(t *testing.T) {
	f := startFleet(t)
	ctx := pgtest.Context(t)
	b := consoletest.New(t, f.base)
	b.Login(f.token)
	csrf := csrfOf(t, b, "/tenants/new/confirm?template=saas&name=Hooli&external_id=hooli-1")
	form := url.Values{"template": {"saas"}, "name": {"Hooli"}, "external_id": {"hooli-1"}}
	if status, _, _ := b.Post("/tenants/new", f.base, form); status != http.StatusForbidden {
		t.Errorf("create without the CSRF token: %d, want 403", status)
	}
	if ts, err := f.c.Tenants(ctx, url.Values{"q": {"hooli"}}); err != nil || len(ts) != 0 {
		t.Fatalf("a refused create made %d tenants (%v)", len(ts), err)
	}
	form.Set("csrf", csrf)
	status, _, page := b.Post("/tenants/new", f.base, form)
	uri := regexp.MustCompile(`<pre id="dsn-uri">([^<]+)</pre>`).FindStringSubmatch(page)
	if status != http.StatusOK || uri == nil || !strings.Contains(page, `data-copy="dsn-uri"`) || !strings.Contains(page, "psql '") || !strings.Contains(page, "DATABASE_URL=") {
		t.Fatalf("create: %d, want the connection string with copy buttons and snippets:\n%s", status, page)
	}
	dsn := html.UnescapeString(uri[1])
	conn, err := pgx.Connect(ctx, dsn)
	if err != nil {
		t.Fatalf("the connection string shown does not log in: %v", err)
	}
	conn.Close(ctx)
	ts, err := f.c.Tenants(ctx, url.Values{"q": {"hooli-1"}})
	if err != nil || len(ts) != 1 || ts[0].Name != "Hooli" {
		t.Fatalf("the API lists %+v (%v), want Hooli", ts, err)
	}
	// The same external id again: the first tenant, not another.
	_, _, again := b.Post("/tenants/new", f.base, form)
	if !strings.Contains(again, `<code id="tenant-id">`+ts[0].ID+`</code>`) || !strings.Contains(again, "existed already") {
		t.Errorf("a second create with the same external id shows another tenant:\n%s", again)
	}
	// Pinned by labels: to a label no cluster has, the API's refusal; to
	// one local has, made there, its page saying so.
	if _, err := f.c.SetCluster(ctx, "local", catalog.PlacementChange{Labels: map[string]string{"region": "eu"}}); err != nil {
		t.Fatal(err)
	}
	_, _, mars := b.Post("/tenants/new", f.base, url.Values{"csrf": {csrf}, "template": {"saas"}, "labels": {"region=mars"}})
	if !strings.Contains(mars, "lacks label region=mars") {
		t.Errorf("a create pinned to a label no cluster has: want the API's refusal naming it:\n%s", mars)
	}
	_, _, eu := b.Post("/tenants/new", f.base, url.Values{"csrf": {csrf}, "template": {"saas"}, "name": {"Pinned"}, "labels": {" region=eu "}})
	pid := regexp.MustCompile(`<code id="tenant-id">([^<]+)</code>`).FindStringSubmatch(eu)
	if pid == nil {
		t.Fatalf("a create pinned to region=eu: no tenant shown:\n%s", eu)
	}
	if _, tp := b.Get("/tenants/" + pid[1]); !strings.Contains(tp, "region=eu") || !strings.Contains(tp, "pinned: only clusters with these") {
		t.Errorf("the pinned tenant's page does not show its labels:\n%s", tp)
	}
	// A fork: a new tenant, its password shown once; without backups (the
	// test's cluster has none unless pgbackrest is installed), the API's
	// refusal, status and message.
	status, _, page = b.Post("/tenants/"+ts[0].ID+"/fork", f.base, url.Values{"csrf": {csrf}, "name": {"Hooli copy"}})
	id := regexp.MustCompile(`<code id="tenant-id">([^<]+)</code>`).FindStringSubmatch(page)
	if id == nil {
		name := "Hooli copy"
		_, err := f.c.ForkTenant(ctx, ts[0].ID, api.ForkTenantRequest{Name: &name})
		var ae *api.Error
		if !errors.As(err, &ae) || status != ae.Status || !strings.Contains(page, html.EscapeString(ae.Message)) {
			t.Fatalf("fork: %d, the API %v:\n%s", status, err, page)
		}
		return
	}
	if status != http.StatusOK || id[1] == ts[0].ID || !strings.Contains(page, "Fork of") {
		t.Fatalf("fork: %d\n%s", status, page)
	}
	if m := regexp.MustCompile(`<a href="/jobs/(\d+)">`).FindStringSubmatch(page); m != nil {
		jid, _ := strconv.ParseInt(m[1], 10, 64)
		if j, err := f.c.WaitJob(ctx, jid, nil); err != nil || j.State != jobs.Succeeded {
			t.Fatalf("fork job %d: %v %s %s", jid, err, j.State, j.LastError)
		}
	}
	if tn, err := f.c.Tenant(ctx, id[1]); err != nil || tn.Name != "Hooli copy" || tn.State != catalog.StateActive {
		t.Fatalf("the fork: %+v %v", tn.Tenant, err)
	}
}

// TestConsole_ClusterAndTenantActions: a cluster drained and undrained,
// analytics enabled and disabled, each posted with its CSRF token and
// checked through the API; a move to the tenant's own cluster and a
// rewind without backups are the API's refusals, status and message.
func TestConsole_ClusterAndTenantActions(t *testing.T) {
	f := startFleet(t)
	ctx := pgtest.Context(t)
	b := consoletest.New(t, f.base)
	b.Login(f.token)
	id := f.acme.ID
	// Every new action refuses a post without the session's CSRF token, or
	// from another origin, and does nothing.
	for _, path := range []string{"/tenants/new", "/tenants/" + id + "/analytics-enable", "/tenants/" + id + "/move", "/tenants/" + id + "/rewind",
		"/tenants/" + id + "/fork", "/clusters/local/drain", "/clusters/local/undrain", "/reconcile/fix", "/backups/now"} {
		if status, _, _ := b.Post(path, f.base, url.Values{"to": {"local"}, "template": {"saas"}}); status != http.StatusForbidden {
			t.Errorf("POST %s without the CSRF token: %d, want 403", path, status)
		}
		if status, _, _ := b.Post(path, "http://evil.example", url.Values{"csrf": {csrfOf(t, b, "/")}}); status != http.StatusForbidden {
			t.Errorf("POST %s from another origin: %d, want 403", path, status)
		}
	}
	if d, err := f.c.Cluster(ctx, "local"); err != nil || d.Draining {
		t.Errorf("refused posts drained the cluster (%v)", err)
	}
	if st, err := f.c.AnalyticsStatus(ctx, id); err != nil || st.Enabled {
		t.Errorf("refused posts enabled analytics (%v)", err)
	}
	for _, step := range []struct{ path, loc string }{
		{"/tenants/" + id + "/analytics-enable", "/tenants/" + id + "?done=analytics-enable"},
		{"/tenants/" + id + "/analytics-disable", "/tenants/" + id + "?done=analytics-disable"},
	} {
		status, loc := b.Confirm(step.path)
		if status != http.StatusSeeOther || loc != step.loc {
			t.Fatalf("%s: %d %s, want 303 %s", step.path, status, loc, step.loc)
		}
		switch {
		case strings.HasSuffix(step.path, "enable"):
			if st, err := f.c.AnalyticsStatus(ctx, id); err != nil || !st.Enabled {
				t.Errorf("after enable: %+v %v", st, err)
			}
			if _, page := b.Get(step.loc); !strings.Contains(page, `id="action-analytics-disable"`) || strings.Contains(page, `id="action-analytics-enable"`) {
				t.Errorf("tenant page with analytics on offers the wrong action")
			}
		case strings.HasSuffix(step.path, "disable"):
			// The mirror is removed in the background: off, or on its way.
			if st, err := f.c.AnalyticsStatus(ctx, id); err != nil || (st.Enabled && st.State != "disabling") {
				t.Errorf("after disable: %+v %v", st, err)
			}
			if _, page := b.Get(step.loc); strings.Contains(page, `id="action-analytics-disable"`) {
				t.Errorf("tenant page of a disabled mirror offers to disable it")
			}
		}
	}
	status, loc := b.Confirm("/clusters/local/drain")
	if status != http.StatusSeeOther || !strings.HasPrefix(loc, "/jobs/") || !strings.HasSuffix(loc, "?done=drain") {
		t.Fatalf("drain: %d %s, want its job", status, loc)
	}
	if d, err := f.c.Cluster(ctx, "local"); err != nil || !d.Draining {
		t.Errorf("after drain: draining %v (%v)", d.Draining, err)
	}
	if _, page := b.Get("/clusters"); !strings.Contains(page, `id="undrain-local"`) || strings.Contains(page, `id="drain-local"`) {
		t.Errorf("clusters page of a draining cluster offers the wrong action")
	}
	if status, loc := b.Confirm("/clusters/local/undrain"); status != http.StatusSeeOther || loc != "/clusters?done=undrain" {
		t.Fatalf("undrain: %d %s", status, loc)
	}
	if d, err := f.c.Cluster(ctx, "local"); err != nil || d.Draining {
		t.Errorf("after undrain: draining %v (%v)", d.Draining, err)
	}
	csrf := csrfOf(t, b, "/tenants/"+id)
	at := time.Now().UTC().Add(-time.Minute).Truncate(time.Second)
	for _, tc := range []struct {
		path string
		form url.Values
		call func() error
	}{
		{"/tenants/" + id + "/move", url.Values{"to": {"local"}}, func() error { _, err := f.c.MoveTenant(ctx, id, "local"); return err }},
		{"/tenants/" + id + "/rewind", url.Values{"to": {at.Format(time.RFC3339)}}, func() error { _, err := f.c.RewindTenant(ctx, id, at); return err }},
	} {
		tc.form.Set("csrf", csrf)
		status, _, body := b.Post(tc.path, f.base, tc.form)
		var ae *api.Error
		if err := tc.call(); !errors.As(err, &ae) {
			t.Fatalf("%s through the API: %v, want a refusal", tc.path, err)
		}
		if status != ae.Status || !strings.Contains(body, html.EscapeString(ae.Message)) {
			t.Errorf("%s: %d, want the API's %d and %q:\n%s", tc.path, status, ae.Status, ae.Message, body)
		}
	}
	if status, _, _ := b.Post("/tenants/"+id+"/rewind", f.base, url.Values{"csrf": {csrf}, "to": {"yesterday"}}); status != http.StatusBadRequest {
		t.Errorf("rewind to yesterday: %d, want 400", status)
	}
}
