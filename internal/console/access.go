package console

import (
	"encoding/json"
	"fmt"
	"strings"
	"sync"

	"github.com/pgtenant/pgtenant/internal/api"
)

// What a login's scope lets the console offer. The API decides: each
// action calls one API route, whose scope is the one the API's OpenAPI
// document declares (x-pgtenant-scope, from the API's routeScopes), and the
// API refuses a call outside the token's scope with its 403 whatever the
// console shows. The console only hides the buttons a scope cannot use and
// says so on a confirmation page reached anyway, so that an operator with a
// read-only token is not offered actions that can only fail.

// actionRoutes are the API route (method and pattern) each console action
// calls, by the console's name for it.
var actionRoutes = map[string]string{
	"tenant/suspend":           "POST /v1/tenants/{id}/suspend",
	"tenant/resume":            "POST /v1/tenants/{id}/resume",
	"tenant/restore":           "POST /v1/tenants/{id}/restore",
	"tenant/drop":              "DELETE /v1/tenants/{id}",
	"tenant/purge":             "DELETE /v1/tenants/{id}",
	"tenant/password":          "POST /v1/tenants/{id}/password",
	"job/cancel":               "POST /v1/jobs/{id}/cancel",
	"job/retry":                "POST /v1/jobs/{id}/retry",
	"template/rollout":         "POST /v1/templates/{name}/rollouts",
	"rollout/continue":         "POST /v1/rollouts/{id}/continue",
	"rollout/retry":            "POST /v1/rollouts/{id}/retry",
	"cluster/switchover":       "POST /v1/clusters/{name}/switchover",
	"cluster/drain":            "POST /v1/clusters/{name}/drain",
	"cluster/undrain":          "POST /v1/clusters/{name}/undrain",
	"tenant/create":            "POST /v1/tenants",
	"tenant/move":              "POST /v1/tenants/{id}/move",
	"tenant/rewind":            "POST /v1/tenants/{id}/rewind",
	"tenant/fork":              "POST /v1/tenants/{id}/fork",
	"tenant/analytics-enable":  "POST /v1/tenants/{id}/analytics",
	"tenant/analytics-disable": "DELETE /v1/tenants/{id}/analytics",
	"reconcile/fix":            "POST /v1/reconcile",
	"backup/now":               "POST /v1/backups",
}

var (
	scopesOnce sync.Once
	scopes     map[string]api.Scope // "POST /v1/tenants/{id}/suspend" → tenants
)

// routeScope is the scope the API route ("METHOD /path") needs, as the
// API's OpenAPI document declares it; false for a route it does not
// describe (TestAccess_ActionsHaveScopes keeps actionRoutes within it).
func routeScope(route string) (api.Scope, bool) {
	scopesOnce.Do(func() {
		var doc struct {
			Paths map[string]map[string]struct {
				Scope api.Scope `json:"x-pgtenant-scope"`
			} `json:"paths"`
		}
		if err := json.Unmarshal(api.OpenAPI(), &doc); err != nil {
			panic(fmt.Sprintf("console: the API's OpenAPI document: %v", err)) // built by the API from Go maps
		}
		scopes = map[string]api.Scope{}
		for path, ops := range doc.Paths {
			for method, op := range ops {
				if op.Scope != "" {
					scopes[strings.ToUpper(method)+" "+path] = op.Scope
				}
			}
		}
	})
	need, ok := scopes[route]
	return need, ok
}

// may reports whether who may run the console action named action. An
// action whose route the API does not describe is offered to admin only.
func may(who api.Principal, action string) bool {
	need, ok := routeScope(actionRoutes[action])
	if !ok {
		need = api.ScopeAdmin
	}
	return who.Scope.Allows(need)
}

// refusal is what a confirmation page says when who may not run action
// ("" when it may): who is logged in, with which scope, and the scope the
// API route needs. The form stays, disabled; posted anyway, the API
// refuses it with its 403.
func refusal(who api.Principal, action string) string {
	if may(who, action) {
		return ""
	}
	route := actionRoutes[action]
	need, ok := routeScope(route)
	if !ok {
		need = api.ScopeAdmin
	}
	return fmt.Sprintf("You are logged in as %s with scope %s: this action calls %s, which needs scope %s (or admin). The API refuses it; log in with a token of that scope.",
		whoName(who), who.Scope, route, need)
}

// whoName names a login as the audit log does, with the token's id.
func whoName(p api.Principal) string {
	if p.TokenID == nil {
		return p.Actor
	}
	return fmt.Sprintf("%q (token %d)", p.Actor, *p.TokenID)
}
