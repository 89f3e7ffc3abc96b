package api_test

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/pgtenant/pgtenant/examples/templates"
	"github.com/pgtenant/pgtenant/internal/api"
	"github.com/pgtenant/pgtenant/internal/catalog"
	"github.com/pgtenant/pgtenant/internal/daemon/daemontest"
	"github.com/pgtenant/pgtenant/internal/pgtest"
	"github.com/pgtenant/pgtenant/internal/provision"
	tpl "github.com/pgtenant/pgtenant/internal/templates"
)

// newToken makes a scoped token with the admin client and returns a client
// that uses it.
func newToken(t *testing.T, admin *api.Client, req api.CreateTokenRequest) (api.CreateTokenResponse, *api.Client) {
	t.Helper()
	created, err := admin.CreateToken(pgtest.Context(t), req)
	if err != nil {
		t.Fatalf("create token %+v: %v", req, err)
	}
	return created, api.NewClient(admin.BaseURL, created.Secret)
}

// wantStatus checks err is an API error with status want whose message
// holds each of msgs.
func wantStatus(t *testing.T, what string, err error, want int, msgs ...string) {
	t.Helper()
	var ae *api.Error
	if !errors.As(err, &ae) {
		t.Errorf("%s: err = %v, want status %d", what, err, want)
		return
	}
	if got := ae.Status; got != want {
		t.Errorf("%s: status = %d (%s), want %d", what, got, ae.Message, want)
	}
	for _, m := range msgs {
		if !strings.Contains(ae.Message, m) {
			t.Errorf("%s: message %q does not say %q", what, ae.Message, m)
		}
	}
}

// TestTokens_ScopesAllowAndRefuse: a read-only token lists but does not
// create (403 naming the scope needed); a tenants token creates a tenant
// but not a template; only admin makes tokens; a name with SQL in it
// round-trips unharmed; the catalog holds the token's SHA-256, never the
// token.
func TestTokens_ScopesAllowAndRefuse(t *testing.T) {
	ctx := pgtest.Context(t)
	cfg := daemontest.Config(t, pg)
	cfg.Provision.DefaultPoolSize = 0
	_, admin := daemontest.Start(t, pg, cfg)
	daemontest.CreateTemplate(t, admin, "saas", templates.Saas())

	_, ro := newToken(t, admin, api.CreateTokenRequest{Name: "dashboard", Scope: api.ScopeReadOnly})
	if _, err := ro.Tenants(ctx, nil); err != nil {
		t.Errorf("read-only token: list tenants: %v", err)
	}
	if _, err := ro.Templates(ctx); err != nil {
		t.Errorf("read-only token: list templates: %v", err)
	}
	_, err := ro.CreateTenant(ctx, provision.Request{Template: "saas"})
	wantStatus(t, "read-only token: create tenant", err, http.StatusForbidden, "scope read-only", "POST /v1/tenants needs scope tenants")
	if !errors.Is(err, api.ErrForbidden) {
		t.Errorf("read-only token: create tenant: %v is not ErrForbidden", err)
	}

	_, tn := newToken(t, admin, api.CreateTokenRequest{Name: "provisioner", Scope: api.ScopeTenants, ExpiresIn: "30d"})
	cr, err := tn.CreateTenant(ctx, provision.Request{Template: "saas"})
	if err != nil {
		t.Fatalf("tenants token: create tenant: %v", err)
	}
	if _, err := tn.TenantAction(ctx, cr.Tenant.ID, "suspend"); err != nil {
		t.Errorf("tenants token: suspend: %v", err)
	}
	_, err = tn.CreateTemplate(ctx, "other", []tpl.Upload{{Name: "0001_init.sql", Body: "CREATE TABLE t (id int);"}})
	wantStatus(t, "tenants token: create template", err, http.StatusForbidden, "needs scope templates")
	_, err = tn.DrainCluster(ctx, "local")
	wantStatus(t, "tenants token: drain", err, http.StatusForbidden, "needs scope clusters")
	_, err = tn.CreateToken(ctx, api.CreateTokenRequest{Scope: api.ScopeAdmin})
	wantStatus(t, "tenants token: create token", err, http.StatusForbidden, "needs scope admin")

	// Hostile names are values: stored and shown as given.
	names := []string{`x'); DROP TABLE api_tokens; --`, `"; DELETE FROM audit_log WHERE true; --`, `Robert'); SELECT pg_sleep(10)--`}
	for _, name := range names {
		hostile, hc := newToken(t, admin, api.CreateTokenRequest{Name: name, Scope: api.ScopeClusters})
		if got := hostile.Token.Name; got != name {
			t.Errorf("create: name = %q, want %q", got, name)
		}
		if _, err := hc.UndrainCluster(ctx, "local"); err != nil {
			t.Errorf("clusters token %q: undrain: %v", name, err)
		}
	}
	list, err := ro.Tokens(ctx)
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]bool{}
	for _, tok := range list {
		got[tok.Name] = true
	}
	for _, name := range names {
		if !got[name] {
			t.Errorf("token list lacks the name %q: %+v", name, list)
		}
	}
	entries, err := admin.Audit(ctx, url.Values{"limit": {"10"}})
	if err != nil {
		t.Fatal(err)
	}
	actors := map[string]bool{}
	for _, e := range entries {
		actors[e.Actor] = true
	}
	for _, name := range names {
		if !actors[name] {
			t.Errorf("audit lacks the actor %q", name)
		}
	}

	// Not in clear: the catalog holds the SHA-256 of each token and no
	// trace of the token itself, in any table (as text or hex).
	secret, _ := newToken(t, admin, api.CreateTokenRequest{Name: "needle-7f3a", Scope: api.ScopeAdmin})
	conn := daemontest.CatalogConn(t, pg, cfg)
	var hash []byte
	if err := conn.QueryRow(ctx, `SELECT hash FROM api_tokens WHERE id = $1`, secret.Token.ID).Scan(&hash); err != nil {
		t.Fatal(err)
	}
	if sum := sha256.Sum256([]byte(secret.Secret)); string(hash) != string(sum[:]) {
		t.Errorf("stored hash %x, want the SHA-256 of the token %x", hash, sum)
	}
	holding := func(needle string) int {
		t.Helper()
		var n int
		if err := conn.QueryRow(ctx, `SELECT count(*) FROM pg_class c JOIN pg_namespace ns ON ns.oid = c.relnamespace,
			LATERAL (SELECT query_to_xml(format('SELECT * FROM %I.%I', ns.nspname, c.relname), false, false, '')::text AS x) d
			WHERE c.relkind = 'r' AND ns.nspname = 'public' AND (d.x LIKE '%' || $1 || '%' OR encode(convert_to(d.x, 'UTF8'), 'hex') LIKE '%' || $1 || '%')`,
			needle).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n
	}
	if holding("needle-7f3a") == 0 { // the search itself works: it finds the token's name
		t.Fatal("no catalog table holds the token's name: the search is broken")
	}
	raw := strings.TrimPrefix(secret.Secret, "pgt_")
	for _, needle := range []string{secret.Secret, raw, hex.EncodeToString([]byte(secret.Secret))} {
		if n := holding(needle); n != 0 {
			t.Errorf("%d catalog tables hold the token (as %.12s…) in clear", n, needle)
		}
	}
}

// TestTokens_ExpiredAndRevokedRefused: an expired token and a revoked one
// get 401 (the revocation holds at the next request); the admin token
// still works.
func TestTokens_ExpiredAndRevokedRefused(t *testing.T) {
	ctx := pgtest.Context(t)
	cfg := daemontest.Config(t, pg)
	cfg.Provision.DefaultPoolSize = 0
	_, admin := daemontest.Start(t, pg, cfg)

	short, sc := newToken(t, admin, api.CreateTokenRequest{Name: "short", Scope: api.ScopeReadOnly, ExpiresIn: "1s"})
	if short.Token.ExpiresAt == nil || short.Token.State != "active" {
		t.Errorf("token with expires_in 1s: %+v, want active with an expiry", short.Token)
	}
	time.Sleep(time.Until(*short.Token.ExpiresAt) + 100*time.Millisecond)
	_, err := sc.Tenants(ctx, nil)
	wantStatus(t, "expired token", err, http.StatusUnauthorized, "expired")

	rev, rc := newToken(t, admin, api.CreateTokenRequest{Name: "soon revoked", Scope: api.ScopeAdmin})
	if _, err := rc.Tenants(ctx, nil); err != nil {
		t.Fatalf("token before revocation: %v", err)
	}
	revoked, err := admin.RevokeToken(ctx, rev.Token.ID)
	if err != nil {
		t.Fatal(err)
	}
	if revoked.State != "revoked" || revoked.RevokedAt == nil {
		t.Errorf("revoke: %+v, want revoked", revoked)
	}
	_, err = rc.Tenants(ctx, nil)
	wantStatus(t, "revoked token", err, http.StatusUnauthorized, "revoked")
	_, err = rc.CreateToken(ctx, api.CreateTokenRequest{Scope: api.ScopeAdmin})
	wantStatus(t, "revoked token: create token", err, http.StatusUnauthorized)
	if _, err := admin.RevokeToken(ctx, 999999); !errors.Is(err, catalog.ErrNotFound) {
		t.Errorf("revoke an unknown token: %v, want not found", err)
	}

	list, err := admin.Tokens(ctx)
	if err != nil {
		t.Fatal(err)
	}
	states := map[string]string{}
	for _, tok := range list {
		states[tok.Name] = tok.State
	}
	if got, want := states["short"], "expired"; got != want {
		t.Errorf("listed state of the expired token = %q, want %q", got, want)
	}
	if got, want := states["soon revoked"], "revoked"; got != want {
		t.Errorf("listed state of the revoked token = %q, want %q", got, want)
	}

	for _, req := range []api.CreateTokenRequest{{Scope: "root"}, {Scope: api.ScopeAdmin, ExpiresIn: "-1h"},
		{Scope: api.ScopeAdmin, Name: "bell\a"}, {Scope: api.ScopeAdmin, Name: strings.Repeat("n", 201)}} {
		_, err := admin.CreateToken(ctx, req)
		wantStatus(t, "create token "+strings.ToValidUTF8(string(req.Scope)+" "+req.ExpiresIn, "?"), err, http.StatusBadRequest)
	}
}

// TestAudit_RecordsEveryMutatingCall: every mutating call, allowed or
// refused (no token, wrong scope, revoked), has its entry with who, what,
// target, from where and result, readable as soon as the answer is; reads
// have none; the table refuses changes.
func TestAudit_RecordsEveryMutatingCall(t *testing.T) {
	ctx := pgtest.Context(t)
	cfg := daemontest.Config(t, pg)
	cfg.Provision.DefaultPoolSize = 0
	_, admin := daemontest.Start(t, pg, cfg)
	daemontest.CreateTemplate(t, admin, "saas", templates.Saas())
	cr, err := admin.CreateTenant(ctx, provision.Request{Template: "saas"})
	if err != nil {
		t.Fatal(err)
	}
	id := cr.Tenant.ID
	ro, roc := newToken(t, admin, api.CreateTokenRequest{Name: "viewer", Scope: api.ScopeReadOnly})
	tn, tnc := newToken(t, admin, api.CreateTokenRequest{Name: "ops", Scope: api.ScopeTenants})
	anon := api.NewClient(admin.BaseURL, "")
	wrong := api.NewClient(admin.BaseURL, "pgt_wrong")

	type want struct {
		actor   string
		tokenID *int64
		method  string
		route   string
		target  string // the id path value, if any
		status  int
	}
	var wants []want
	call := func(w want, err error) {
		t.Helper()
		if (w.status >= 400) != (err != nil) {
			t.Errorf("%s %s by %s: err = %v, want status %d", w.method, w.route, w.actor, err, w.status)
		}
		wants = append(wants, w)
	}
	_, err = tnc.TenantAction(ctx, id, "suspend")
	call(want{"ops", &tn.Token.ID, "POST", "/v1/tenants/{id}/suspend", id, 200}, err)
	_, err = roc.TenantAction(ctx, id, "resume")
	call(want{"viewer", &ro.Token.ID, "POST", "/v1/tenants/{id}/resume", id, 403}, err)
	_, err = anon.DropTenant(ctx, id, false)
	call(want{"unauthenticated", nil, "DELETE", "/v1/tenants/{id}", id, 401}, err)
	_, err = wrong.TenantAction(ctx, id, "resume")
	call(want{"unauthenticated", nil, "POST", "/v1/tenants/{id}/resume", id, 401}, err)
	_, err = tnc.TenantAction(ctx, "t_nosuch", "resume")
	call(want{"ops", &tn.Token.ID, "POST", "/v1/tenants/{id}/resume", "t_nosuch", 404}, err)
	_, err = admin.TenantAction(ctx, id, "resume")
	call(want{"admin token", nil, "POST", "/v1/tenants/{id}/resume", id, 200}, err)
	_, err = admin.RevokeToken(ctx, tn.Token.ID)
	call(want{"admin token", nil, "DELETE", "/v1/tokens/{id}", strconv.FormatInt(tn.Token.ID, 10), 200}, err)
	_, err = tnc.TenantAction(ctx, id, "suspend")
	call(want{"ops", &tn.Token.ID, "POST", "/v1/tenants/{id}/suspend", id, 401}, err)
	// Reads are not audited.
	if _, err := roc.Tenant(ctx, id); err != nil {
		t.Fatal(err)
	}

	entries, err := roc.Audit(ctx, url.Values{"since": {"1h"}, "limit": {"20"}})
	if err != nil {
		t.Fatal(err)
	}
	if len(entries) < len(wants) {
		t.Fatalf("%d audit entries, want at least %d: %+v", len(entries), len(wants), entries)
	}
	// Newest first: the last calls are the first entries.
	for i, w := range wants {
		e := entries[len(wants)-1-i]
		if e.Actor != w.actor || e.Method != w.method || e.Route != w.route || e.Status != w.status {
			t.Errorf("entry %d = %s %s %s → %d, want %s %s %s → %d", e.ID, e.Actor, e.Method, e.Route, e.Status, w.actor, w.method, w.route, w.status)
		}
		if (e.TokenID == nil) != (w.tokenID == nil) || e.TokenID != nil && *e.TokenID != *w.tokenID {
			t.Errorf("entry %d (%s %s): token_id = %v, want %v", e.ID, e.Method, e.Route, e.TokenID, w.tokenID)
		}
		if w.target != "" && e.Target["id"] != w.target {
			t.Errorf("entry %d (%s %s): target = %v, want id %s", e.ID, e.Method, e.Route, e.Target, w.target)
		}
		if !strings.HasPrefix(e.Remote, "127.0.0.1:") {
			t.Errorf("entry %d: remote = %q, want the loopback peer", e.ID, e.Remote)
		}
		if time.Since(e.At) > time.Hour || e.At.IsZero() {
			t.Errorf("entry %d: at = %v", e.ID, e.At)
		}
	}
	for _, e := range entries {
		if e.Method == "GET" {
			t.Errorf("a read was audited: %+v", e)
		}
	}

	// Append-only: the catalog refuses to change or delete an entry.
	conn := daemontest.CatalogConn(t, pg, cfg)
	for _, q := range []string{`UPDATE audit_log SET status = 200`, `DELETE FROM audit_log`, `TRUNCATE audit_log`} {
		if _, err := conn.Exec(ctx, q); err == nil || !strings.Contains(err.Error(), "append-only") {
			t.Errorf("%s: err = %v, want refused as append-only", q, err)
		}
	}
	var n int
	if err := conn.QueryRow(context.Background(), `SELECT count(*) FROM audit_log`).Scan(&n); err != nil || n < len(wants) {
		t.Errorf("audit_log holds %d rows (%v), want at least %d", n, err, len(wants))
	}
}
