package api

import (
	"log/slog"
	"slices"
	"testing"
)

// TestScopes_TableMatchesRoutes: every entry of routeScopes is a routed,
// mutating route (a renamed route leaves none behind), and the scopes
// allow what their names say.
func TestScopes_TableMatchesRoutes(t *testing.T) {
	s := NewServer(Deps{Logger: slog.New(slog.DiscardHandler), Token: "pgt_x"}) // panics on a mutating route without a scope
	for pattern, need := range routeScopes {
		if !slices.Contains(s.routes, pattern) {
			t.Errorf("routeScopes names %s, which the server does not route", pattern)
		}
		if need == ScopeReadOnly {
			t.Errorf("routeScopes gives %s read-only: a mutating route needs a writing scope", pattern)
		}
	}
	for _, tc := range []struct {
		have, need Scope
		want       bool
	}{
		{ScopeReadOnly, ScopeReadOnly, true},
		{ScopeReadOnly, ScopeTenants, false},
		{ScopeTenants, ScopeTenants, true},
		{ScopeTenants, ScopeTemplates, false},
		{ScopeTemplates, ScopeClusters, false},
		{ScopeClusters, ScopeAdmin, false},
		{ScopeClusters, ScopeReadOnly, true},
		{ScopeAdmin, ScopeClusters, true},
		{ScopeAdmin, ScopeAdmin, true},
	} {
		if got := tc.have.Allows(tc.need); got != tc.want {
			t.Errorf("%s.Allows(%s) = %v, want %v", tc.have, tc.need, got, tc.want)
		}
	}
}
