package catalog

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
)

// Token is a scoped API token as the catalog keeps it: its SHA-256, never
// the token (internal/api makes, hashes and checks tokens).
type Token struct {
	ID        int64
	Name      string
	Scope     string
	Hash      []byte
	CreatedAt time.Time
	ExpiresAt *time.Time // nil: never
	RevokedAt *time.Time
}

const tokenColumns = `id, name, scope, hash, created_at, expires_at, revoked_at`

func scanToken(row pgx.Row) (Token, error) {
	var t Token
	err := row.Scan(&t.ID, &t.Name, &t.Scope, &t.Hash, &t.CreatedAt, &t.ExpiresAt, &t.RevokedAt)
	return t, err
}

// InsertToken keeps a new token's hash and returns its row.
func (s *Store) InsertToken(ctx context.Context, name, scope string, hash []byte, expiresAt *time.Time) (Token, error) {
	return scanToken(s.pool.QueryRow(ctx, `INSERT INTO api_tokens (name, scope, hash, expires_at)
		VALUES ($1, $2, $3, $4) RETURNING `+tokenColumns, name, scope, hash, expiresAt))
}

// Tokens lists every token, revoked and expired ones included, oldest first.
func (s *Store) Tokens(ctx context.Context) ([]Token, error) {
	rows, err := s.pool.Query(ctx, `SELECT `+tokenColumns+` FROM api_tokens ORDER BY id`)
	if err != nil {
		return nil, err
	}
	return pgx.CollectRows(rows, func(r pgx.CollectableRow) (Token, error) { return scanToken(r) })
}

// TokenByHash returns the token whose hash is hash, whatever its state
// (the caller refuses revoked and expired ones), or ErrNotFound.
func (s *Store) TokenByHash(ctx context.Context, hash []byte) (Token, error) {
	t, err := scanToken(s.pool.QueryRow(ctx, `SELECT `+tokenColumns+` FROM api_tokens WHERE hash = $1`, hash))
	return t, notFound(err, "token")
}

// RevokeToken revokes a token from now on and returns it; a token revoked
// already keeps its first revocation time. ErrNotFound if there is none.
func (s *Store) RevokeToken(ctx context.Context, id int64) (Token, error) {
	t, err := scanToken(s.pool.QueryRow(ctx, `UPDATE api_tokens SET revoked_at = coalesce(revoked_at, now())
		WHERE id = $1 RETURNING `+tokenColumns, id))
	return t, notFound(err, fmt.Sprintf("token %d", id))
}

// AuditEntry is one mutating API call.
type AuditEntry struct {
	ID      int64
	At      time.Time
	TokenID *int64 // the scoped token's; nil for the admin token or none
	Actor   string
	Method  string
	Route   string
	Target  map[string]string // the route's path values
	Remote  string
	Status  int
}

// InsertAudit appends an entry (At is the insert's time). The audit is
// append-only: there is no method that changes or deletes entries, and the
// table's trigger refuses it.
func (s *Store) InsertAudit(ctx context.Context, e AuditEntry) error {
	if e.Target == nil {
		e.Target = map[string]string{}
	}
	_, err := s.pool.Exec(ctx, `INSERT INTO audit_log (token_id, actor, method, route, target, remote, status)
		VALUES ($1, $2, $3, $4, $5, $6, $7)`, e.TokenID, e.Actor, e.Method, e.Route, e.Target, e.Remote, e.Status)
	return err
}

// AuditEntries lists entries at or after since, newest first, at most limit.
func (s *Store) AuditEntries(ctx context.Context, since time.Time, limit int) ([]AuditEntry, error) {
	rows, err := s.pool.Query(ctx, `SELECT id, at, token_id, actor, method, route, target, remote, status
		FROM audit_log WHERE at >= $1 ORDER BY id DESC LIMIT $2`, since, limit)
	if err != nil {
		return nil, err
	}
	return pgx.CollectRows(rows, func(r pgx.CollectableRow) (AuditEntry, error) {
		var e AuditEntry
		err := r.Scan(&e.ID, &e.At, &e.TokenID, &e.Actor, &e.Method, &e.Route, &e.Target, &e.Remote, &e.Status)
		return e, err
	})
}
