package api

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/hex"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"time"
	"unicode"
	"unicode/utf8"

	"github.com/pgtenant/pgtenant/internal/catalog"
	"github.com/pgtenant/pgtenant/internal/config"
)

// Scoped API tokens and the audit log. The token file's token is the admin
// token, as before; scoped tokens live in the catalog as SHA-256 hashes and
// are checked on every request (no cache: a revocation holds at once, on
// every daemon sharing the catalog). Each route needs a scope (routeScopes
// in server.go); each mutating call, refused or not, is audited before its
// answer leaves.

// Scope is what a token may do. Every token may read (GET routes need
// read-only); a mutating route needs its own scope, and admin may do
// everything.
type Scope string

// The scopes: tenants is tenant lifecycle (create, drop, suspend, rewind,
// fork, passwords, analytics); templates is templates and rollouts;
// clusters is clusters and placement (drain, rebalance, moves, backups,
// fleet prewarm); admin is all of them, plus tokens, jobs and reconcile.
const (
	ScopeReadOnly  Scope = "read-only"
	ScopeTenants   Scope = "tenants"
	ScopeTemplates Scope = "templates"
	ScopeClusters  Scope = "clusters"
	ScopeAdmin     Scope = "admin"
)

// Scopes are the valid scopes, from the least to the most allowed.
var Scopes = []Scope{ScopeReadOnly, ScopeTenants, ScopeTemplates, ScopeClusters, ScopeAdmin}

// Allows reports whether a token of scope s may call a route that needs need.
func (s Scope) Allows(need Scope) bool {
	return s == ScopeAdmin || need == ScopeReadOnly || s == need
}

// Token is a scoped token as the API shows it: never the token or its hash.
type Token struct {
	ID        int64      `json:"id"`
	Name      string     `json:"name"`
	Scope     Scope      `json:"scope"`
	State     string     `json:"state"` // active, expired or revoked
	CreatedAt time.Time  `json:"created_at"`
	ExpiresAt *time.Time `json:"expires_at,omitempty"`
	RevokedAt *time.Time `json:"revoked_at,omitempty"`
}

// CreateTokenRequest makes a scoped token.
type CreateTokenRequest struct {
	Name  string `json:"name,omitempty"`
	Scope Scope  `json:"scope"`
	// ExpiresIn is a duration such as 12h or 30d; empty: never expires.
	ExpiresIn string `json:"expires_in,omitempty"`
}

// CreateTokenResponse carries the token itself: the only time it is shown.
type CreateTokenResponse struct {
	Token  Token  `json:"token"`
	Secret string `json:"secret"`
}

// AuditEntry is one mutating API call.
type AuditEntry struct {
	ID int64     `json:"id"`
	At time.Time `json:"at"`
	// Actor is the token's name ("token N" if it has none), "admin token",
	// or "unauthenticated" for a call without a valid token.
	Actor   string            `json:"actor"`
	TokenID *int64            `json:"token_id,omitempty"`
	Method  string            `json:"method"`
	Route   string            `json:"route"`  // the route's pattern: /v1/tenants/{id}/suspend
	Target  map[string]string `json:"target"` // the route's path values: {"id": "t_…"}
	Remote  string            `json:"remote"` // the peer's address
	Status  int               `json:"status"` // the answer's HTTP status
}

// Actors of calls made without a scoped token.
const (
	actorAdmin   = "admin token"
	actorUnknown = "unauthenticated"
)

// principal is who makes a call.
type principal struct {
	tokenID *int64
	actor   string
	scope   Scope
}

// Token names: free text (they are values, never SQL), printable, short.
const maxTokenName = 200

// auditTimeout bounds an audit insert, which runs even when the client has
// gone (its context is detached from the request's).
const auditTimeout = 10 * time.Second

// authenticate returns who sent r: the admin token (compared in constant
// time), or a live scoped token found by its hash. A missing, wrong,
// revoked or expired token is ErrUnauthorized.
func (s *Server) authenticate(r *http.Request) (principal, error) {
	got, ok := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer ")
	if !ok || got == "" {
		return principal{actor: actorUnknown}, errNoToken
	}
	if s.Token != "" && subtle.ConstantTimeCompare([]byte(got), []byte(s.Token)) == 1 {
		return principal{actor: actorAdmin, scope: ScopeAdmin}, nil
	}
	if s.Store == nil {
		return principal{actor: actorUnknown}, errNoToken
	}
	// The lookup is by the hash of a 256-bit random value: its timing says
	// nothing usable about a stored token.
	sum := sha256.Sum256([]byte(got))
	t, err := s.Store.TokenByHash(r.Context(), sum[:])
	if errors.Is(err, catalog.ErrNotFound) {
		return principal{actor: actorUnknown}, errNoToken
	}
	if err != nil {
		return principal{actor: actorUnknown}, fmt.Errorf("check token: %w", err)
	}
	p := principal{tokenID: &t.ID, actor: tokenActor(t), scope: Scope(t.Scope)}
	switch state, at := tokenState(t, time.Now()); state {
	case "revoked":
		return p, fmt.Errorf("%w: token %d was revoked at %s", ErrUnauthorized, t.ID, at.UTC().Format(time.RFC3339))
	case "expired":
		return p, fmt.Errorf("%w: token %d expired at %s", ErrUnauthorized, t.ID, at.UTC().Format(time.RFC3339))
	}
	return p, nil
}

var errNoToken = fmt.Errorf("%w: missing or wrong bearer token; export PGTENANT_TOKEN (printed by `pgtenant up`, stored in the token file, or made by `pgtenant token create`)", ErrUnauthorized)

func tokenActor(t catalog.Token) string {
	if t.Name == "" {
		return "token " + strconv.FormatInt(t.ID, 10)
	}
	return t.Name
}

// tokenState is active, expired or revoked, with the time it became so.
func tokenState(t catalog.Token, now time.Time) (string, time.Time) {
	switch {
	case t.RevokedAt != nil:
		return "revoked", *t.RevokedAt
	case t.ExpiresAt != nil && !now.Before(*t.ExpiresAt):
		return "expired", *t.ExpiresAt
	}
	return "active", time.Time{}
}

func tokenView(t catalog.Token) Token {
	state, _ := tokenState(t, time.Now())
	return Token{ID: t.ID, Name: t.Name, Scope: Scope(t.Scope), State: state, CreatedAt: t.CreatedAt, ExpiresAt: t.ExpiresAt, RevokedAt: t.RevokedAt}
}

// forbidden is the 403 of a token without the scope a route needs.
func forbidden(p principal, pattern string, need Scope) error {
	who := "this token"
	if p.tokenID != nil {
		who = fmt.Sprintf("token %d (%q)", *p.tokenID, p.actor)
	}
	return fmt.Errorf("%w: %s has scope %s; %s needs scope %s (or admin)", ErrForbidden, who, p.scope, pattern, need)
}

// auditWriter writes a mutating call's audit entry when its status is
// known, before any of the answer reaches the client: a client that has
// its answer can read its entry.
type auditWriter struct {
	http.ResponseWriter
	record func(status int)
	done   bool
}

func (w *auditWriter) WriteHeader(status int) {
	if !w.done {
		w.done = true
		w.record(status)
	}
	w.ResponseWriter.WriteHeader(status)
}

func (w *auditWriter) Write(b []byte) (int, error) {
	if !w.done {
		w.WriteHeader(http.StatusOK)
	}
	return w.ResponseWriter.Write(b)
}

// audit appends a call's entry. A failure to write it is logged (the call
// has been made; its answer still goes out).
func (s *Server) audit(r *http.Request, pattern string, wildcards []string, p principal, status int) {
	if s.Store == nil {
		return
	}
	method, route, _ := strings.Cut(pattern, " ")
	target := map[string]string{}
	for _, name := range wildcards {
		target[name] = r.PathValue(name)
	}
	ctx, cancel := context.WithTimeout(context.WithoutCancel(r.Context()), auditTimeout)
	defer cancel()
	err := s.Store.InsertAudit(ctx, catalog.AuditEntry{TokenID: p.tokenID, Actor: p.actor, Method: method, Route: route,
		Target: target, Remote: r.RemoteAddr, Status: status})
	if err != nil {
		s.log.Error("audit entry not written", "method", method, "route", route, "actor", p.actor, "status", status, "err", err)
	}
}

// wildcards are a pattern's path wildcards' names: "{id}" → "id".
func wildcards(pattern string) []string {
	var names []string
	for _, seg := range strings.Split(pattern, "/") {
		if name, ok := strings.CutPrefix(seg, "{"); ok {
			names = append(names, strings.TrimSuffix(strings.TrimSuffix(name, "}"), "..."))
		}
	}
	return names
}

func (s *Server) createToken(w http.ResponseWriter, r *http.Request) error {
	var req CreateTokenRequest
	if err := decode(r, &req); err != nil {
		return err
	}
	if !slices.Contains(Scopes, req.Scope) {
		return invalid("scope %q: one of %s", req.Scope, scopeList())
	}
	if err := validTokenName(req.Name); err != nil {
		return err
	}
	var expires *time.Time
	if req.ExpiresIn != "" {
		d, err := config.ParseDuration(req.ExpiresIn)
		if err != nil || d <= 0 {
			return invalid("expires_in %q: a positive duration such as 12h or 30d", req.ExpiresIn)
		}
		at := time.Now().Add(d)
		expires = &at
	}
	buf := make([]byte, 32)
	if _, err := rand.Read(buf); err != nil {
		return err
	}
	secret := "pgt_" + hex.EncodeToString(buf)
	sum := sha256.Sum256([]byte(secret))
	t, err := s.Store.InsertToken(r.Context(), req.Name, string(req.Scope), sum[:], expires)
	if err != nil {
		return fmt.Errorf("create token: %w", err)
	}
	writeJSON(w, http.StatusCreated, CreateTokenResponse{Token: tokenView(t), Secret: secret})
	return nil
}

// validTokenName refuses names that would garble a table or a log line:
// control characters, invalid UTF-8, more than maxTokenName bytes. Quotes,
// semicolons and the like are fine: a name is only ever a value.
func validTokenName(name string) error {
	if len(name) > maxTokenName {
		return invalid("name: at most %d bytes", maxTokenName)
	}
	if !utf8.ValidString(name) || strings.ContainsFunc(name, unicode.IsControl) {
		return invalid("name %q: printable characters only", name)
	}
	return nil
}

func scopeList() string {
	names := make([]string, len(Scopes))
	for i, sc := range Scopes {
		names[i] = string(sc)
	}
	return strings.Join(names, ", ")
}

func (s *Server) listTokens(w http.ResponseWriter, r *http.Request) error {
	ts, err := s.Store.Tokens(r.Context())
	if err != nil {
		return err
	}
	out := make([]Token, len(ts))
	for i, t := range ts {
		out[i] = tokenView(t)
	}
	writeJSON(w, http.StatusOK, out)
	return nil
}

func (s *Server) revokeToken(w http.ResponseWriter, r *http.Request) error {
	id, err := strconv.ParseInt(r.PathValue("id"), 10, 64)
	if err != nil {
		return fmt.Errorf("token %q: %w", r.PathValue("id"), catalog.ErrNotFound)
	}
	t, err := s.Store.RevokeToken(r.Context(), id)
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusOK, tokenView(t))
	return nil
}

// Audit list bounds: the default page, and the most one answer holds.
const (
	defaultAuditLimit = 100
	maxAuditLimit     = 10000
)

// GET /v1/audit?since=24h&limit=100
func (s *Server) listAudit(w http.ResponseWriter, r *http.Request) error {
	q := r.URL.Query()
	var since time.Time
	if v := q.Get("since"); v != "" {
		var err error
		if since, err = time.Parse(time.RFC3339, v); err != nil {
			d, derr := config.ParseDuration(v)
			if derr != nil || d < 0 {
				return invalid("since %q: a duration back from now such as 1h or 7d, or an RFC 3339 time", v)
			}
			since = time.Now().Add(-d)
		}
	}
	limit := defaultAuditLimit
	if v := q.Get("limit"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 || n > maxAuditLimit {
			return invalid("limit %q: a number from 1 to %d", v, maxAuditLimit)
		}
		limit = n
	}
	es, err := s.Store.AuditEntries(r.Context(), since, limit)
	if err != nil {
		return err
	}
	out := make([]AuditEntry, len(es))
	for i, e := range es {
		out[i] = AuditEntry{ID: e.ID, At: e.At, Actor: e.Actor, TokenID: e.TokenID, Method: e.Method, Route: e.Route,
			Target: e.Target, Remote: e.Remote, Status: e.Status}
	}
	writeJSON(w, http.StatusOK, out)
	return nil
}

// CreateToken makes a scoped token; the answer holds the token itself, once.
func (c *Client) CreateToken(ctx context.Context, req CreateTokenRequest) (CreateTokenResponse, error) {
	var out CreateTokenResponse
	return out, c.Do(ctx, http.MethodPost, "/v1/tokens", req, &out)
}

// Tokens lists the scoped tokens.
func (c *Client) Tokens(ctx context.Context) ([]Token, error) {
	var out []Token
	return out, c.Do(ctx, http.MethodGet, "/v1/tokens", nil, &out)
}

// RevokeToken revokes a scoped token at once.
func (c *Client) RevokeToken(ctx context.Context, id int64) (Token, error) {
	var out Token
	return out, c.Do(ctx, http.MethodDelete, "/v1/tokens/"+strconv.FormatInt(id, 10), nil, &out)
}

// Audit lists audit entries, newest first (q: since, limit).
func (c *Client) Audit(ctx context.Context, q url.Values) ([]AuditEntry, error) {
	var out []AuditEntry
	path := "/v1/audit"
	if len(q) > 0 {
		path += "?" + q.Encode()
	}
	return out, c.Do(ctx, http.MethodGet, path, nil, &out)
}
