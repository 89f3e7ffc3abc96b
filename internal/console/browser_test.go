package console_test

import (
	"context"
	"errors"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
	"github.com/jackc/pgx/v5"

	"github.com/pgtenant/pgtenant/examples/templates"
	"github.com/pgtenant/pgtenant/internal/api"
	"github.com/pgtenant/pgtenant/internal/catalog"
	"github.com/pgtenant/pgtenant/internal/jobs"
	"github.com/pgtenant/pgtenant/internal/pgtest"
	tpl "github.com/pgtenant/pgtenant/internal/templates"
)

// chrome starts one headless Chromium for the test (Debian's chromium
// package, which .ci/run installs) and returns a tab's context. When the
// test fails, the page it was on is saved as a screenshot and its HTML
// under $PGTENANT_SCREENSHOTS (default: $TMPDIR/pgtenant-screenshots).
func chrome(t *testing.T) context.Context {
	t.Helper()
	path := ""
	for _, name := range []string{"chromium", "chromium-browser", "google-chrome"} {
		if p, err := exec.LookPath(name); err == nil {
			path = p
			break
		}
	}
	if path == "" {
		t.Skip("no chromium: apt-get install chromium (.ci/run does)")
	}
	opts := append(chromedp.DefaultExecAllocatorOptions[:], chromedp.ExecPath(path), chromedp.WindowSize(1280, 1000),
		chromedp.Flag("disable-dev-shm-usage", true))
	if os.Geteuid() == 0 {
		opts = append(opts, chromedp.NoSandbox) // Chromium refuses to run as root with its sandbox
	}
	actx, cancelAlloc := chromedp.NewExecAllocator(context.Background(), opts...)
	tab, cancelTab := chromedp.NewContext(actx, chromedp.WithLogf(t.Logf))
	// The first call starts the browser, which lives as long as its
	// context: no deadline on that one, one on the test's actions.
	if err := chromedp.Do(tab); err != nil {
		cancelTab()
		cancelAlloc()
		t.Fatalf("start chromium: %v", err)
	}
	ctx, cancelTimeout := context.WithTimeout(tab, 3*time.Minute)
	t.Cleanup(func() {
		if t.Failed() {
			screenshot(t, tab)
		}
		cancelTimeout()
		cancelTab()
		cancelAlloc()
	})
	return ctx
}

func screenshot(t *testing.T, ctx context.Context) {
	dir := os.Getenv("PGTENANT_SCREENSHOTS")
	if dir == "" {
		dir = filepath.Join(os.TempDir(), "pgtenant-screenshots")
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Logf("screenshot: %v", err)
		return
	}
	sctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	at, _ := chromedp.Run(sctx, chromedp.Location())
	png, err := chromedp.Run(sctx, chromedp.FullScreenshot(100))
	if err != nil {
		t.Logf("screenshot: %v", err)
		return
	}
	page, _ := chromedp.Run(sctx, chromedp.OuterHTML(chromedp.CSS("html")))
	base := filepath.Join(dir, strings.ReplaceAll(t.Name(), "/", "_"))
	_ = os.WriteFile(base+".png", png, 0o644)
	_ = os.WriteFile(base+".html", []byte(page), 0o644)
	t.Logf("the browser was at %s: screenshot %s.png, page %s.html", at, base, base)
}

// waitText waits until the element sel of the page the browser is on
// reads want, as the page reloads itself (<meta http-equiv="refresh">
// while work runs); the test never reloads it. A read that meets a reload
// half-way is tried again.
func waitText(t *testing.T, ctx context.Context, sel, want string) {
	t.Helper()
	var got string
	var err error
	for {
		rctx, cancel := context.WithTimeout(ctx, 3*time.Second)
		got, err = chromedp.Run(rctx, chromedp.Text(chromedp.CSS(sel)))
		cancel()
		got = strings.TrimSpace(got)
		if err == nil && got == want {
			return
		}
		if err == nil && catalogFailed(got) {
			t.Fatalf("%s is %q, want %q", sel, got, want)
		}
		select {
		case <-ctx.Done():
			t.Fatalf("%s is %q (%v), want %q", sel, got, err, want)
		case <-time.After(200 * time.Millisecond):
		}
	}
}

func catalogFailed(state string) bool {
	s := strings.TrimSpace(state)
	return s == string(catalog.RolloutFailed) || s == string(catalog.RolloutCancelled)
}

// TestBrowser_OperatorFlows drives the console in headless Chromium against
// a real daemon: log in with the token, find a tenant by part of its name,
// open its page, suspend and resume it through the confirmation pages
// (each checked through the API), then plan a rollout with a canary, watch
// it pause and, once continued, follow it to the end (every tenant done) on
// its page as the page refreshes itself.
func TestBrowser_OperatorFlows(t *testing.T) {
	f := startFleet(t)
	ctx := chrome(t)
	api := pgtest.Context(t)
	run := func(what string, steps ...chromedp.Action[chromedp.Void]) {
		t.Helper()
		if err := chromedp.Do(ctx, steps...); err != nil {
			t.Fatalf("%s: %v", what, err)
		}
	}
	text := func(sel string) string {
		t.Helper()
		s, err := chromedp.Run(ctx, chromedp.Text(chromedp.CSS(sel)))
		if err != nil {
			t.Fatalf("text of %s: %v", sel, err)
		}
		return strings.TrimSpace(s)
	}

	css := func(sel string) chromedp.CSS { return chromedp.CSS(sel) }
	run("log in", chromedp.Navigate(f.base+"/tenants"),
		chromedp.WaitVisible(css(`input[name="token"]`)),
		chromedp.SendKeys(css(`input[name="token"]`), f.token),
		chromedp.Submit(css(`input[name="token"]`)),
		chromedp.WaitVisible(css(`nav`)))

	link := css(`#tenants a[href="/tenants/` + f.acme.ID + `"]`)
	run("find the tenant", chromedp.Navigate(f.base+"/tenants"),
		chromedp.SendKeys(css(`input[name="q"]`), "acme co"),
		chromedp.Click(css(`#search`)),
		// The results page, not the one the form was on: its field carries the search.
		chromedp.WaitVisible(css(`input[name="q"][value="acme co"]`)),
		chromedp.WaitVisible(link))
	if list := text("#tenants"); strings.Contains(list, f.globex.ID) {
		t.Errorf("searching acme co lists Globex:\n%s", list)
	}

	run("open its page", chromedp.Click(link), chromedp.WaitVisible(css(`#state`)))
	if state := text("#state"); state != string(catalog.StateActive) {
		t.Fatalf("tenant page state %q, want active", state)
	}

	for _, step := range []struct{ action, want, flash string }{
		{"suspend", string(catalog.StateSuspended), "Suspended."},
		{"resume", string(catalog.StateActive), "Resumed."},
	} {
		run(step.action, chromedp.Click(css(`#action-`+step.action)), chromedp.WaitVisible(css(`#confirm`)))
		title := text("h2")
		run("confirm "+step.action, chromedp.Click(css(`#confirm`)), chromedp.WaitVisible(css(`#flash`)))
		if flash, state := text("#flash"), text("#state"); !strings.HasSuffix(title, "?") || flash != step.flash || state != step.want {
			t.Errorf("%s: confirmation %q, then %q with state %q; want a question, %q and %s", step.action, title, flash, state, step.flash, step.want)
		}
		tn, err := f.c.Tenant(api, f.acme.ID)
		if err != nil {
			t.Fatal(err)
		}
		if string(tn.State) != step.want {
			t.Errorf("after %s in the console the API says %s, want %s", step.action, tn.State, step.want)
		}
	}

	// A rollout to version 2 with a canary of one tenant.
	if _, err := f.c.PushTemplate(api, "saas", append(templates.Saas(), tpl.Upload{Name: "0002_notes.sql", Body: "CREATE TABLE notes (id bigint PRIMARY KEY, body text);"})); err != nil {
		t.Fatal(err)
	}
	run("plan the rollout", chromedp.Navigate(f.base+"/templates/saas"),
		chromedp.SetValue(css(`input[name="to"]`), "2"),
		chromedp.SetValue(css(`input[name="canary"]`), "1"),
		chromedp.Click(css(`#plan`)),
		chromedp.WaitVisible(css(`#confirm`)))
	if what := text("b"); !strings.Contains(what, "version 2: 2 tenants") {
		t.Errorf("the plan says %q, want version 2: 2 tenants", what)
	}
	run("start it", chromedp.Click(css(`#confirm`)), chromedp.WaitVisible(css(`#rollout-tenants`)))
	at, err := chromedp.Run(ctx, chromedp.Location())
	if err != nil || !strings.Contains(at, "/rollouts/") {
		t.Fatalf("after starting the rollout the browser is at %s (%v)", at, err)
	}
	waitText(t, ctx, "#state", string(catalog.RolloutPaused))
	// Paused after its canary: the page shows the canary's tenant, done,
	// and marks it in the list of all.
	if canary := text("#canary-tenants"); strings.Count(canary, "done") != 1 || (!strings.Contains(canary, f.acme.ID) && !strings.Contains(canary, f.globex.ID)) {
		t.Errorf("paused rollout's canary: want one tenant, done:\n%s", canary)
	}
	if n := strings.Count(text("#rollout-tenants"), "canary"); n != 1 {
		t.Errorf("%d tenants marked canary in the rollout's list, want 1:\n%s", n, text("#rollout-tenants"))
	}
	newShots(t, ctx).take("rollout")
	run("continue it", chromedp.Click(css(`#action-continue`)),
		chromedp.WaitVisible(css(`#confirm`)), chromedp.Click(css(`#confirm`)),
		chromedp.WaitVisible(css(`#flash`)))
	waitText(t, ctx, "#state", string(catalog.RolloutSucceeded))
	tenants := text("#rollout-tenants")
	for _, id := range []string{f.acme.ID, f.globex.ID} {
		if !strings.Contains(tenants, id) {
			t.Errorf("rollout page lacks tenant %s:\n%s", id, tenants)
		}
	}
	if n := strings.Count(tenants, "done"); n != 2 {
		t.Errorf("%d tenants done on the rollout page, want 2:\n%s", n, tenants)
	}
}

// shots saves screenshots of a test's pages: under $PGTENANT_SCREENSHOTS
// when set (kept), else the test's artifact directory (kept under
// -outputdir with go test -artifacts).
type shots struct {
	t   *testing.T
	ctx context.Context
	dir string
}

func newShots(t *testing.T, ctx context.Context) shots {
	dir := t.ArtifactDir()
	if env := os.Getenv("PGTENANT_SCREENSHOTS"); env != "" {
		dir = filepath.Join(env, strings.ReplaceAll(t.Name(), "/", "_"))
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	return shots{t: t, ctx: ctx, dir: dir}
}

// take saves the page the browser is on as name.png and logs its path.
func (s shots) take(name string) {
	s.t.Helper()
	png, err := chromedp.Run(s.ctx, chromedp.FullScreenshot(100))
	if err != nil {
		s.t.Fatalf("screenshot %s: %v", name, err)
	}
	path := filepath.Join(s.dir, name+".png")
	if err := os.WriteFile(path, png, 0o644); err != nil {
		s.t.Fatal(err)
	}
	s.t.Logf("screenshot of %s: %s", name, path)
}

// TestBrowser_ConsolePages drives the console's other pages and actions in
// headless Chromium against a real daemon, checking each against the API,
// and saves screenshots of the main pages: the overview's figures; a
// tenant created from the form, whose connection string (shown once, as a
// URI, a psql command and environment lines, with copy buttons) logs in;
// its page's chart window fitting its age; analytics enabled and disabled;
// a fork made from the tenant page (its own connection string logs in);
// a move, a rewind and a backup confirmed and answered as the API answers
// them; the templates and a template's builds; jobs paged, filtered, with
// background builds hidden until asked for; the doctor; reconcile checked
// and fixed; a cluster drained and undrained.
func TestBrowser_ConsolePages(t *testing.T) {
	f := startFleet(t)
	ctx := chrome(t)
	shot := newShots(t, ctx)
	apictx := pgtest.Context(t)
	css := func(sel string) chromedp.CSS { return chromedp.CSS(sel) }
	run := func(what string, steps ...chromedp.Action[chromedp.Void]) {
		t.Helper()
		if err := chromedp.Do(ctx, steps...); err != nil {
			t.Fatalf("%s: %v", what, err)
		}
	}
	text := func(sel string) string {
		t.Helper()
		s, err := chromedp.Run(ctx, chromedp.Text(css(sel)))
		if err != nil {
			t.Fatalf("text of %s: %v", sel, err)
		}
		return strings.TrimSpace(s)
	}
	present := func(sel string) bool {
		t.Helper()
		n, err := chromedp.Run(ctx, chromedp.Evaluate[bool](`document.querySelector(`+strconv.Quote(sel)+`) !== null`))
		if err != nil {
			t.Fatalf("query %s: %v", sel, err)
		}
		return n
	}
	// confirm clicks the confirmation page's button after checking its
	// question, and waits for sel on the page it leads to.
	confirm := func(question, sel string) {
		t.Helper()
		run("confirmation page", chromedp.WaitVisible(css(`#confirm`)))
		if got := text("h2"); got != question {
			t.Errorf("confirmation page asks %q, want %q", got, question)
		}
		run("confirm "+question, chromedp.Click(css(`#confirm`)), chromedp.WaitNotPresent(css(`#confirm`)), chromedp.WaitVisible(css(sel)))
	}
	apiMessage := func(err error) string {
		t.Helper()
		var ae *api.Error
		if !errors.As(err, &ae) {
			t.Fatalf("the API answered %v, want a refusal", err)
		}
		return ae.Message
	}
	login := func(ctx context.Context, dsn string) {
		t.Helper()
		conn, err := pgx.Connect(ctx, dsn)
		if err != nil {
			t.Fatalf("the connection string shown does not log in: %v", err)
		}
		defer conn.Close(ctx)
		var one int
		if err := conn.QueryRow(ctx, "SELECT 1").Scan(&one); err != nil || one != 1 {
			t.Fatalf("SELECT 1 through the connection string shown: %v", err)
		}
	}

	run("log in", chromedp.Navigate(f.base+"/"),
		chromedp.WaitVisible(css(`input[name="token"]`)),
		chromedp.SendKeys(css(`input[name="token"]`), f.token),
		chromedp.Submit(css(`input[name="token"]`)),
		chromedp.WaitVisible(css(`#clusters-up`)))
	if got := text("#clusters-up"); got != "1/1" {
		t.Errorf("overview: clusters up %q, want 1/1", got)
	}
	if title, _ := chromedp.Run(ctx, chromedp.Title()); title != "Overview · pgtenant" {
		t.Errorf("overview title %q", title)
	}
	shot.take("overview")

	// Create a tenant from the tenants page.
	run("tenants", chromedp.Navigate(f.base+"/tenants"), chromedp.WaitVisible(css(`#tenants`)))
	shot.take("tenants")
	run("create form", chromedp.Click(css(`#new-tenant`)), chromedp.WaitVisible(css(`#create`)),
		chromedp.SendKeys(css(`#name`), "Initech"), chromedp.SendKeys(css(`#external_id`), "initech-1"),
		chromedp.Click(css(`#create-tenant`)))
	if what := func() string { run("create confirmation", chromedp.WaitVisible(css(`#confirm`))); return text("b") }(); !strings.Contains(what, `template saas named "Initech" (external id initech-1)`) {
		t.Errorf("create confirmation says %q", what)
	}
	shot.take("confirm")
	confirm("Create the tenant?", `#dsn-uri`)
	uri, psql, env := text("#dsn-uri"), text("#dsn-psql"), text("#dsn-env")
	if psql != "psql '"+uri+"'" || !strings.HasPrefix(env, "DATABASE_URL='"+uri+"'") || !strings.Contains(uri, text("#password")) {
		t.Errorf("created page: uri %q, psql %q, env %q: want the same connection string, with the password", uri, psql, env)
	}
	login(apictx, uri)
	shot.take("created")
	run("copy", chromedp.Click(css(`#copy-uri`)))
	for deadline := time.Now().Add(5 * time.Second); text("#copy-uri") == "Copy"; {
		if time.Now().After(deadline) {
			t.Fatal("the copy button did nothing")
		}
		time.Sleep(100 * time.Millisecond)
	}
	id := text("#tenant-id")
	tn, err := f.c.Tenant(apictx, id)
	if err != nil || tn.Name != "Initech" || tn.ExternalID != "initech-1" || tn.State != catalog.StateActive {
		t.Fatalf("the API's tenant %s: %+v, %v; want Initech (initech-1), active", id, tn.Tenant, err)
	}

	// Its page: a tenant made a minute ago is charted over the last hour.
	run("tenant page", chromedp.Click(css(`#tenant-link`)), chromedp.WaitVisible(css(`#state`)))
	if w := text(".windows b"); w != "1h" {
		t.Errorf("a new tenant's charts default to %s, want 1h", w)
	}
	if title, _ := chromedp.Run(ctx, chromedp.Title()); title != "Tenant "+id+" Initech · pgtenant" {
		t.Errorf("tenant page title %q", title)
	}
	shot.take("tenant")

	// Analytics on, then off.
	for _, step := range []struct {
		action, flash string
		enabled       bool
	}{{"analytics-enable", "Analytics enabled: the mirror is being made.", true}, {"analytics-disable", "Analytics disabled.", false}} {
		run(step.action, chromedp.Click(css(`#action-`+step.action)))
		confirm(map[bool]string{true: "Enable analytics?", false: "Disable analytics?"}[step.enabled], `#flash`)
		if got := text("#flash"); got != step.flash {
			t.Errorf("%s: flash %q, want %q", step.action, got, step.flash)
		}
		// A disabled mirror is removed in the background: off, or on its way.
		st, err := f.c.AnalyticsStatus(apictx, id)
		if err != nil || (st.Enabled != step.enabled && st.State != "disabling") {
			t.Errorf("after %s in the console the API says enabled %v, %s (%v), want %v", step.action, st.Enabled, st.State, err, step.enabled)
		}
	}

	// Fork it from its page: a new tenant, its connection string shown
	// once. Without backups (the test's cluster has none unless pgbackrest
	// is installed) the API refuses it, and the console says what it says.
	run("fork", chromedp.SendKeys(css(`#fork-name`), "Initech copy"), chromedp.Click(css(`#action-fork`)), chromedp.WaitVisible(css(`#confirm`)))
	if what := text("b"); !strings.Contains(what, `into a new tenant "Initech copy", as of now`) {
		t.Errorf("fork confirmation says %q", what)
	}
	confirm("Fork?", `main`)
	if present("#error") {
		name := "Initech copy"
		_, err := f.c.ForkTenant(apictx, id, api.ForkTenantRequest{Name: &name})
		if got, want := text("#error"), apiMessage(err); got != want {
			t.Errorf("fork: the console says %q, the API %q", got, want)
		}
	} else {
		run("fork page", chromedp.WaitVisible(css(`#tenant-id`)))
		forkID, forkURI := text("#tenant-id"), text("#dsn-uri")
		if forkID == id {
			t.Fatalf("the fork page shows the forked tenant %s", id)
		}
		if present(`main a[href^="/jobs/"]`) { // still being copied: its job
			href, _ := chromedp.Run(ctx, chromedp.Evaluate[string](`document.querySelector('main a[href^="/jobs/"]').getAttribute("href")`))
			jobID, _ := strconv.ParseInt(strings.TrimPrefix(href, "/jobs/"), 10, 64)
			if j, err := f.c.WaitJob(apictx, jobID, nil); err != nil || j.State != jobs.Succeeded {
				t.Fatalf("fork job %s: %v %s %s", href, err, j.State, j.LastError)
			}
		}
		fork, err := f.c.Tenant(apictx, forkID)
		if err != nil || fork.Name != "Initech copy" || fork.State != catalog.StateActive {
			t.Fatalf("the fork %s: %+v, %v; want Initech copy, active", forkID, fork.Tenant, err)
		}
		login(apictx, forkURI)
	}

	// A move to the cluster it is on, and a rewind without backups: the
	// console asks, posts, and shows the API's own refusal.
	run("move", chromedp.Navigate(f.base+"/tenants/"+id+"/move?to=local"))
	if what := func() string { run("move confirmation", chromedp.WaitVisible(css(`#confirm`))); return text("b") }(); !strings.Contains(what, "from cluster local to local") {
		t.Errorf("move confirmation says %q", what)
	}
	confirm("Move?", `#error`)
	_, err = f.c.MoveTenant(apictx, id, "local")
	if got, want := text("#error"), apiMessage(err); got != want {
		t.Errorf("move: the console says %q, the API %q", got, want)
	}
	at := time.Now().UTC().Add(-time.Minute).Truncate(time.Second)
	run("rewind", chromedp.Navigate(f.base+"/tenants/"+id),
		chromedp.WaitVisible(css(`#rewind-to`)), chromedp.SetValue(css(`#rewind-to`), at.Format(time.RFC3339)),
		chromedp.Click(css(`#action-rewind`)))
	confirm("Rewind?", `#error`)
	_, err = f.c.RewindTenant(apictx, id, at)
	if got, want := text("#error"), apiMessage(err); got != want {
		t.Errorf("rewind: the console says %q, the API %q", got, want)
	}

	// Backups: the page and a backup, as the API answers them.
	run("backups", chromedp.Navigate(f.base+"/backups"), chromedp.WaitVisible(css(`h2`)))
	if _, err := f.c.Backups(apictx, ""); err != nil {
		if got, want := text("#error"), apiMessage(err); got != want {
			t.Errorf("backups page says %q, the API %q", got, want)
		}
	} else if !strings.Contains(text("main"), "local") {
		t.Errorf("backups page lacks cluster local")
	}
	run("backup now", chromedp.Navigate(f.base+"/backups/now?cluster=local&type=full"))
	confirm("Take a backup?", `main`)
	if _, err := f.c.BackupNow(apictx, api.BackupRequest{Cluster: "local", Type: "full"}); err != nil {
		if got, want := text("#error"), apiMessage(err); got != want {
			t.Errorf("backup now: the console says %q, the API %q", got, want)
		}
	} else if loc, _ := chromedp.Run(ctx, chromedp.Location()); !strings.Contains(loc, "/jobs") {
		t.Errorf("backup now led to %s, want its job", loc)
	}

	// Templates and a template's builds.
	run("templates", chromedp.Navigate(f.base+"/templates"), chromedp.WaitVisible(css(`#templates`)))
	if row := text("#templates"); !strings.Contains(row, "saas") || !strings.Contains(row, "ready") {
		t.Errorf("templates page:\n%s", row)
	}
	shot.take("templates")
	run("template", chromedp.Click(css(`#templates a[href="/templates/saas"]`)), chromedp.WaitVisible(css(`#builds`)))
	if builds := text("#builds"); !strings.Contains(builds, "local") || !strings.Contains(builds, "ready") {
		t.Errorf("template builds:\n%s", builds)
	}
	if pools := text("#pools"); !strings.Contains(pools, "local") || !strings.Contains(pools, "database") || !strings.Contains(pools, "schema") {
		t.Errorf("template's spare pools:\n%s", pools)
	}
	shot.take("template")

	// Jobs: background builds hidden, then shown; paged; filtered.
	run("jobs", chromedp.Navigate(f.base+"/jobs"), chromedp.WaitVisible(css(`#jobs`)))
	shot.take("jobs")
	all, err := f.c.Jobs(apictx, url.Values{"limit": {"1000"}})
	if err != nil {
		t.Fatal(err)
	}
	builds := 0
	for _, j := range all {
		if j.Type == jobs.TenantBuild {
			builds++
		}
	}
	if builds == 0 {
		t.Fatal("no tenant.build job to hide: the fleet's pool builds spares")
	}
	if list := text("#jobs"); strings.Contains(list, "tenant.build") || !present("#hidden-builds") {
		t.Errorf("jobs page shows background builds by default:\n%s", list)
	}
	run("show builds", chromedp.Click(css(`#hidden-builds a`)), chromedp.WaitVisible(css(`#jobs`)))
	if list := text("#jobs"); !strings.Contains(list, "tenant.build") {
		t.Errorf("jobs page with builds=1 lacks them:\n%s", list)
	}
	// Two a page: page 2 goes on, older, from where page 1 ended.
	run("jobs paged", chromedp.Navigate(f.base+"/jobs?per=2&builds=1"), chromedp.WaitVisible(css(`#jobs`)))
	if n := strings.Count(text("#jobs"), "\n"); n != 2 {
		t.Errorf("page 1 of two a page has %d lines:\n%s", n+1, text("#jobs"))
	}
	p1, _ := strconv.Atoi(text("#jobs tr:nth-child(3) td:first-child"))
	run("next page", chromedp.Click(css(`#next`)), chromedp.WaitVisible(css(`#prev`)))
	if p2, _ := strconv.Atoi(text("#jobs tr:nth-child(2) td:first-child")); p2 >= p1 || p1 == 0 {
		t.Errorf("page 2 starts at job %d, page 1 ends at %d: want an older one", p2, p1)
	}
	run("filter", chromedp.Navigate(f.base+"/jobs"), chromedp.WaitVisible(css(`#jobs`)),
		chromedp.SetValue(css(`select[name="type"]`), "template.build"), chromedp.Click(css(`#filter`)),
		chromedp.WaitReady(css(`select[name="type"] option[selected]`)))
	if list := text("#jobs"); !strings.Contains(list, "template.build") || strings.Contains(list, "tenant.fork") {
		t.Errorf("jobs filtered by template.build:\n%s", list)
	}

	// Doctor.
	run("doctor", chromedp.Navigate(f.base+"/doctor"), chromedp.WaitVisible(css(`#doctor-status`)))
	rep, err := f.c.Doctor(apictx, "")
	if err != nil {
		t.Fatal(err)
	}
	if got := text("#doctor-status"); got != rep.Status {
		t.Errorf("doctor page says %s, the API %s", got, rep.Status)
	}
	if !present("#doctor-local") {
		t.Error("doctor page lacks cluster local's checks")
	}
	shot.take("doctor")

	// Reconcile: checked, then fixed after its confirmation.
	run("reconcile", chromedp.Navigate(f.base+"/reconcile"), chromedp.WaitVisible(css(`#findings`)))
	if !present("#clean") && !present("#action-fix") {
		t.Error("reconcile page lists findings without its fix")
	}
	run("reconcile fix", chromedp.Navigate(f.base+"/reconcile/fix"))
	confirm("Fix what reconcile finds?", `#findings`)
	if h := text("h2"); h != "Reconcile: fixed" {
		t.Errorf("after the fix the page says %q", h)
	}

	// Clusters: drain, then undrain.
	run("clusters", chromedp.Navigate(f.base+"/clusters"), chromedp.WaitVisible(css(`#clusters`)))
	shot.take("clusters")
	draining := func() bool {
		t.Helper()
		d, err := f.c.Cluster(apictx, "local")
		if err != nil {
			t.Fatal(err)
		}
		return d.Draining
	}
	run("drain", chromedp.Click(css(`#drain-local`)))
	confirm("Drain the cluster?", `main`)
	if !draining() {
		t.Fatalf("after the drain in the console the API says local is not draining (page: %s)", text("main"))
	}
	run("clusters draining", chromedp.Navigate(f.base+"/clusters"), chromedp.WaitVisible(css(`#draining-local`)),
		chromedp.Click(css(`#undrain-local`)))
	confirm("Undrain the cluster?", `#flash`)
	if draining() {
		t.Error("after the undrain in the console the API says local is draining")
	}
}
