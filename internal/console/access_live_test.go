package console_test

import (
	"fmt"
	"net/http"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/pgtenant/pgtenant/internal/api"
	"github.com/pgtenant/pgtenant/internal/catalog"
	"github.com/pgtenant/pgtenant/internal/console/consoletest"
	"github.com/pgtenant/pgtenant/internal/pgtest"
)

// scopedToken makes a scoped token through the API (as `pgtenant token
// create` does) and returns it with its secret.
func scopedToken(t *testing.T, f fleet, name string, scope api.Scope) api.CreateTokenResponse {
	t.Helper()
	tok, err := f.c.CreateToken(pgtest.Context(t), api.CreateTokenRequest{Name: name, Scope: scope})
	if err != nil {
		t.Fatal(err)
	}
	return tok
}

func (f fleet) state(t *testing.T, id string) catalog.TenantState {
	t.Helper()
	tn, err := f.c.Tenant(pgtest.Context(t), id)
	if err != nil {
		t.Fatal(err)
	}
	return tn.State
}

// csrfOf reads the session's CSRF token from a page of the console.
func csrfOf(t *testing.T, b *consoletest.Browser, path string) string {
	t.Helper()
	status, page := b.Get(path)
	m := consoletest.CSRF.FindStringSubmatch(page)
	if status != http.StatusOK || m == nil {
		t.Fatalf("GET %s: %d, no CSRF token:\n%s", path, status, page)
	}
	return m[1]
}

// TestConsole_ReadOnlyToken: logged in with a read-only token, every page
// renders and names the token, the actions are hidden, a confirmation page
// reached anyway says why its button is disabled, and its form posted
// anyway gets the API's 403 naming the scope, changes nothing, and is
// audited under the token's name.
func TestConsole_ReadOnlyToken(t *testing.T) {
	f := startFleet(t)
	ctx := pgtest.Context(t)
	tok := scopedToken(t, f, "viewer", api.ScopeReadOnly)
	b := consoletest.New(t, f.base)
	b.Login(tok.Secret)
	who := fmt.Sprintf(`id="who">viewer (token %d), scope read-only`, tok.Token.ID)
	for path, want := range map[string][]string{
		"/":                     {"<h2>Clusters</h2>", "saas", who},
		"/tenants":              {f.acme.ID, f.globex.ID},
		"/tenants/" + f.acme.ID: {"Acme Corp", "<h2>Events</h2>", `id="hidden"`, "need scope tenants"},
		"/jobs":                 {"template.build"},
		"/jobs/1":               {"Job 1: template.build", "succeeded"},
		"/templates/saas":       {"<h3>Start a rollout</h3>", "a rollout needs scope templates"},
		"/rollouts":             {"no rollout yet"},
		"/clusters":             {"local"},
		"/audit":                {"<h2>Audit</h2>", "/v1/tokens"},
		"/templates":            {`<a href="/templates/saas"><b>saas</b></a>`},
		"/tenants/new":          {`id="refused"`, "needs scope tenants", `id="create-tenant" disabled`},
		"/doctor":               {`id="doctor-status"`},
		"/reconcile":            {`id="error"`, "POST /v1/reconcile, which needs scope admin"},
		"/backups":              {"<h2>Backups</h2>"},
	} {
		status, page := b.Get(path)
		if status != http.StatusOK {
			t.Errorf("GET %s: %d, want 200\n%s", path, status, page)
			continue
		}
		for _, w := range append(want, who, `<a href="/audit">Audit</a>`) {
			if !strings.Contains(page, w) {
				t.Errorf("GET %s lacks %q", path, w)
			}
		}
		for _, not := range []string{`id="action-suspend"`, `id="action-drop"`, `id="action-password"`, `id="plan"`, `id="action-retry"`,
			`id="action-move"`, `id="action-fork"`, `id="action-rewind"`, `id="action-analytics-enable"`, `id="drain-local"`, `id="action-fix"`, `id="backup-now"`} {
			if strings.Contains(page, not) {
				t.Errorf("GET %s offers %s to a read-only token", path, not)
			}
		}
	}
	_, confirm := b.Get("/tenants/" + f.acme.ID + "/suspend")
	for _, w := range []string{`id="refused"`, "scope read-only", "needs scope tenants", "disabled"} {
		if !strings.Contains(confirm, w) {
			t.Errorf("confirmation page for a read-only token lacks %q:\n%s", w, confirm)
		}
	}
	csrf := csrfOf(t, b, "/tenants/"+f.acme.ID)
	for _, action := range []string{"suspend", "drop", "password"} {
		status, _, body := b.Post("/tenants/"+f.acme.ID+"/"+action, f.base, url.Values{"csrf": {csrf}})
		want := fmt.Sprintf("token %d (&#34;viewer&#34;) has scope read-only", tok.Token.ID)
		if status != http.StatusForbidden || !strings.Contains(body, want) || !strings.Contains(body, "needs scope tenants") ||
			!strings.Contains(body, `id="error"`) {
			t.Errorf("%s posted with a read-only token: %d, want the API's 403 naming the scopes, on the error page\n%s", action, status, body)
		}
	}
	if got, want := f.state(t, f.acme.ID), catalog.StateActive; got != want {
		t.Errorf("after refused actions the tenant is %s, want %s", got, want)
	}
	// The plan of a rollout is a dry run of a mutating route: refused too.
	if status, page := b.Get("/templates/saas/rollout?to=1"); status != http.StatusForbidden || !strings.Contains(page, "needs scope templates") {
		t.Errorf("rollout plan with a read-only token: %d, want 403 naming scope templates\n%s", status, page)
	}
	es, err := f.c.Audit(ctx, url.Values{"limit": {"4"}})
	if err != nil {
		t.Fatal(err)
	}
	wantRoutes := []string{"/v1/templates/{name}/rollouts", "/v1/tenants/{id}/password", "/v1/tenants/{id}", "/v1/tenants/{id}/suspend"}
	if len(es) != len(wantRoutes) {
		t.Fatalf("audit: %d entries, want %d: %+v", len(es), len(wantRoutes), es)
	}
	for i, e := range es {
		if e.Route != wantRoutes[i] || e.Actor != "viewer" || e.TokenID == nil || *e.TokenID != tok.Token.ID || e.Status != http.StatusForbidden {
			t.Errorf("audit entry %d: %s %s by %q (token %v), status %d; want %s by viewer (token %d), 403",
				i, e.Method, e.Route, e.Actor, e.TokenID, e.Status, wantRoutes[i], tok.Token.ID)
		}
	}
}

// TestConsole_TenantsTokenActsAndIsAudited: logged in with a tenants
// token, the console offers and runs tenant actions (not a rollout); the
// audit log names that token, not the admin token, with the browser's
// address; the Audit page lists the entries newest first, and its since
// filter and the API's refusal of a bad one show.
func TestConsole_TenantsTokenActsAndIsAudited(t *testing.T) {
	f := startFleet(t)
	ctx := pgtest.Context(t)
	tok := scopedToken(t, f, "ops-tenants", api.ScopeTenants)
	b := consoletest.New(t, f.base)
	b.Login(tok.Secret)
	if _, page := b.Get("/tenants/" + f.acme.ID); !strings.Contains(page, `id="action-suspend"`) || strings.Contains(page, `id="hidden"`) {
		t.Errorf("tenant page for a tenants token: want its actions, none hidden\n%s", page)
	}
	if _, page := b.Get("/templates/saas"); strings.Contains(page, `id="plan"`) {
		t.Errorf("template page offers a rollout to a tenants token")
	}
	for _, step := range []struct {
		action string
		want   catalog.TenantState
	}{{"suspend", catalog.StateSuspended}, {"resume", catalog.StateActive}} {
		path := "/tenants/" + f.acme.ID + "/" + step.action
		if status, loc := b.Confirm(path); status != http.StatusSeeOther || loc != "/tenants/"+f.acme.ID+"?done="+step.action {
			t.Fatalf("%s: %d %s", step.action, status, loc)
		}
		if got := f.state(t, f.acme.ID); got != step.want {
			t.Errorf("after %s: %s, want %s", step.action, got, step.want)
		}
	}
	es, err := f.c.Audit(ctx, url.Values{"limit": {"2"}})
	if err != nil {
		t.Fatal(err)
	}
	if len(es) != 2 {
		t.Fatalf("audit: %d entries, want 2", len(es))
	}
	for i, route := range []string{"/v1/tenants/{id}/resume", "/v1/tenants/{id}/suspend"} {
		e := es[i]
		if e.Route != route || e.Method != http.MethodPost || e.Actor != "ops-tenants" || e.TokenID == nil || *e.TokenID != tok.Token.ID ||
			e.Status != http.StatusOK || e.Target["id"] != f.acme.ID || !strings.HasPrefix(e.Remote, "127.0.0.1:") {
			t.Errorf("audit entry %d: %+v (token %v); want POST %s of %s by ops-tenants (token %d), 200, from 127.0.0.1",
				i, e, e.TokenID, route, f.acme.ID, tok.Token.ID)
		}
	}

	status, page := b.Get("/audit")
	if status != http.StatusOK {
		t.Fatalf("/audit: %d\n%s", status, page)
	}
	resume, suspend := strings.Index(page, "/v1/tenants/{id}/resume"), strings.Index(page, "/v1/tenants/{id}/suspend")
	if resume < 0 || suspend < 0 || resume > suspend {
		t.Errorf("audit page: resume at %d, suspend at %d; want both, newest (resume) first", resume, suspend)
	}
	for _, w := range []string{"ops-tenants", fmt.Sprintf("(token %d)", tok.Token.ID), "admin token", "/v1/tokens", "id=" + f.acme.ID,
		`<a href="/tenants/` + f.acme.ID + `">`, "127.0.0.1:", `class="up">200`} {
		if !strings.Contains(page, w) {
			t.Errorf("audit page lacks %q", w)
		}
	}
	// since: from the resume on, the suspend is left out; in the future, nothing.
	_, page = b.Get("/audit?since=" + url.QueryEscape(es[0].At.Format(time.RFC3339Nano)))
	if !strings.Contains(page, "/v1/tenants/{id}/resume") || strings.Contains(page, "/v1/tenants/{id}/suspend") {
		t.Errorf("audit since the resume: want the resume only\n%s", page)
	}
	if _, page := b.Get("/audit?since=2999-01-01T00:00:00Z"); !strings.Contains(page, "no entry since 2999") || strings.Contains(page, "/v1/tenants/{id}/resume") {
		t.Errorf("audit since 2999: want no entry\n%s", page)
	}
	status, page = b.Get("/audit?since=yesterday")
	if status != http.StatusBadRequest || !strings.Contains(page, `id="error"`) || !strings.Contains(page, "a duration back from now") ||
		!strings.Contains(page, `name="since" value="yesterday"`) {
		t.Errorf("audit since=yesterday: %d, want the API's 400 and its message above the form\n%s", status, page)
	}
}

// TestConsole_RevokedTokenRefusedAtNextRequest: a token revoked while
// console sessions use it ends them at their next request, a page (the
// login form, saying why) or a form (403, nothing done), and no longer
// logs in.
func TestConsole_RevokedTokenRefusedAtNextRequest(t *testing.T) {
	f := startFleet(t)
	ctx := pgtest.Context(t)
	tok := scopedToken(t, f, "short-lived", api.ScopeTenants)
	reader, actor := consoletest.New(t, f.base), consoletest.New(t, f.base)
	reader.Login(tok.Secret)
	actor.Login(tok.Secret)
	if status, page := reader.Get("/tenants/" + f.acme.ID); status != http.StatusOK || !strings.Contains(page, `id="action-suspend"`) {
		t.Fatalf("before the revocation: %d\n%s", status, page)
	}
	csrf := csrfOf(t, actor, "/tenants/"+f.acme.ID+"/suspend")
	if _, err := f.c.RevokeToken(ctx, tok.Token.ID); err != nil {
		t.Fatal(err)
	}

	status, page := reader.Get("/tenants/" + f.acme.ID)
	if status != http.StatusUnauthorized || !strings.Contains(page, `id="ended"`) || !strings.Contains(page, fmt.Sprintf("token %d was revoked", tok.Token.ID)) ||
		!strings.Contains(page, `name="token"`) || strings.Contains(page, "Acme Corp") {
		t.Errorf("page after the revocation: %d, want 401 with the login form saying the token was revoked\n%s", status, page)
	}
	if status, page := reader.Get("/"); status != http.StatusOK || !strings.Contains(page, `name="token"`) || strings.Contains(page, "<h2>Clusters</h2>") {
		t.Errorf("the ended session still shows pages: %d\n%s", status, page)
	}

	status, _, body := actor.Post("/tenants/"+f.acme.ID+"/suspend", f.base, url.Values{"csrf": {csrf}})
	if status != http.StatusForbidden || !strings.Contains(body, "was revoked") {
		t.Errorf("action after the revocation: %d, want 403 saying the token was revoked\n%s", status, body)
	}
	if got, want := f.state(t, f.acme.ID), catalog.StateActive; got != want {
		t.Errorf("after the refused action the tenant is %s, want %s", got, want)
	}

	if status, loc, _ := consoletest.New(t, f.base).Post("/login", f.base, url.Values{"token": {tok.Secret}}); status != http.StatusSeeOther || loc != "/?failed" {
		t.Errorf("login with the revoked token: %d %s, want 303 /?failed", status, loc)
	}
}
