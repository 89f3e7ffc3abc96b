package console

import (
	"strings"
	"testing"
	"time"

	"github.com/pgtenant/pgtenant/internal/api"
)

// TestAccess_ActionsHaveScopes: every console action names an API route
// the API's OpenAPI document describes, with the scope the API needs for
// it; a scope allows exactly the actions of its kind (admin all of them,
// read-only none).
func TestAccess_ActionsHaveScopes(t *testing.T) {
	want := map[string]api.Scope{"tenant": api.ScopeTenants, "template": api.ScopeTemplates, "rollout": api.ScopeTemplates,
		"cluster": api.ScopeClusters, "job": api.ScopeAdmin, "reconcile": api.ScopeAdmin, "backup": api.ScopeClusters}
	// A move is placement: the API asks scope clusters for it.
	exceptions := map[string]api.Scope{"tenant/move": api.ScopeClusters}
	for action, route := range actionRoutes {
		need, ok := routeScope(route)
		if !ok {
			t.Errorf("%s: route %s is not in the API's OpenAPI document", action, route)
			continue
		}
		kind, _, _ := strings.Cut(action, "/")
		wantScope, ok := exceptions[action]
		if !ok {
			wantScope = want[kind]
		}
		if got := need; got != wantScope {
			t.Errorf("%s (%s) needs scope %s, want %s", action, route, got, wantScope)
		}
		for _, sc := range api.Scopes {
			who := api.Principal{Actor: "t", Scope: sc}
			if got, want := may(who, action), sc == api.ScopeAdmin || sc == need; got != want {
				t.Errorf("may(%s, %s) = %v, want %v", sc, action, got, want)
			}
			if got := refusal(who, action); (got == "") != may(who, action) {
				t.Errorf("refusal(%s, %s) = %q", sc, action, got)
			}
		}
	}
	id := int64(7)
	msg := refusal(api.Principal{TokenID: &id, Actor: "viewer", Scope: api.ScopeReadOnly}, "tenant/suspend")
	for _, w := range []string{`"viewer" (token 7)`, "scope read-only", "POST /v1/tenants/{id}/suspend", "needs scope tenants"} {
		if !strings.Contains(msg, w) {
			t.Errorf("refusal %q lacks %q", msg, w)
		}
	}
}

// TestPages_AuditRender: the audit page shows each entry's time, actor and
// token, method, route, target (a tenant's linked), remote and status,
// escaped; the layout names who is logged in.
func TestPages_AuditRender(t *testing.T) {
	id := int64(3)
	at := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	rows := []auditRow{{AuditEntry: api.AuditEntry{At: at, Actor: "<b>ops</b>", TokenID: &id, Method: "POST", Route: "/v1/tenants/{id}/suspend",
		Target: map[string]string{"id": "t_abc"}, Remote: "10.0.0.1:5555", Status: 403}, Targets: "id=t_abc", Tenant: "t_abc"}}
	var b strings.Builder
	if err := pages.ExecuteTemplate(&b, "audit.html", view{"LoggedIn": true, "CSRF": "x", "Entries": rows, "Since": "1h", "Limit": "200",
		"Who": api.Principal{TokenID: &id, Actor: "ops", Scope: api.ScopeTenants}}); err != nil {
		t.Fatal(err)
	}
	out := b.String()
	for _, w := range []string{"2026-01-02 03:04:05", "&lt;b&gt;ops&lt;/b&gt;", "(token 3)", "<code>/v1/tenants/{id}/suspend</code>",
		`<a href="/tenants/t_abc">id=t_abc</a>`, "10.0.0.1:5555", `class="down">403`, `value="1h"`, `<a href="/audit">Audit</a>`,
		`id="who">ops (token 3), scope tenants`} {
		if !strings.Contains(out, w) {
			t.Errorf("audit page lacks %q:\n%s", w, out)
		}
	}
}
