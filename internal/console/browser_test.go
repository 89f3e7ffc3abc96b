package console_test

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"

	"github.com/pgtenant/pgtenant/examples/templates"
	"github.com/pgtenant/pgtenant/internal/catalog"
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
