package catalog

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
)

// Credential is a tenant's password sealed for the retry window
// (internal/credentials seals and opens it; the catalog never sees the
// plaintext).
type Credential struct {
	Tenant    string
	KeyID     string
	Sealed    []byte
	CreatedAt time.Time
	ExpiresAt time.Time
}

// live is the condition of a live credential, the current window in
// seconds being parameter $n: its own expiry and the current window (which
// may have been shortened since it was kept) both lie ahead.
func live(n int) string {
	return fmt.Sprintf(`(expires_at > now() AND created_at > now() - make_interval(secs => $%d))`, n)
}

// InsertCredential keeps a tenant's sealed password for window.
func (s *Store) InsertCredential(ctx context.Context, q Querier, c Credential, window time.Duration) error {
	_, err := q.Exec(ctx, `INSERT INTO credentials (tenant, key_id, sealed, expires_at)
		VALUES ($1, $2, $3, now() + make_interval(secs => $4))`, c.Tenant, c.KeyID, c.Sealed, window.Seconds())
	return err
}

// GetCredential returns a tenant's live credential, or ErrNotFound (never
// kept, or its window has ended).
func (s *Store) GetCredential(ctx context.Context, tenant string, window time.Duration) (Credential, error) {
	var c Credential
	err := s.pool.QueryRow(ctx, `SELECT tenant, key_id, sealed, created_at, expires_at FROM credentials
		WHERE tenant = $1 AND `+live(2), tenant, window.Seconds()).
		Scan(&c.Tenant, &c.KeyID, &c.Sealed, &c.CreatedAt, &c.ExpiresAt)
	return c, notFound(err, "credential of tenant "+tenant)
}

// ReplaceCredential seals a new password into a tenant's live credential
// (a rotation), keeping its expiry. It reports whether there was one.
func (s *Store) ReplaceCredential(ctx context.Context, q Querier, c Credential, window time.Duration) (bool, error) {
	tag, err := q.Exec(ctx, `UPDATE credentials SET key_id = $3, sealed = $4 WHERE tenant = $1 AND `+live(2),
		c.Tenant, window.Seconds(), c.KeyID, c.Sealed)
	return tag.RowsAffected() > 0, err
}

// DeleteExpiredCredentials deletes credentials whose window has ended: one
// tenant's (tenant != "") or every one. With window 0 nothing is live.
func (s *Store) DeleteExpiredCredentials(ctx context.Context, tenant string, window time.Duration) (int64, error) {
	tag, err := s.pool.Exec(ctx, `DELETE FROM credentials WHERE ($1 = '' OR tenant = $1) AND NOT `+live(2),
		tenant, window.Seconds())
	return tag.RowsAffected(), err
}

// CredentialKeyIDs lists the keys that sealed live credentials.
func (s *Store) CredentialKeyIDs(ctx context.Context, window time.Duration) ([]string, error) {
	rows, err := s.pool.Query(ctx, `SELECT DISTINCT key_id FROM credentials WHERE `+live(1)+` ORDER BY key_id`, window.Seconds())
	if err != nil {
		return nil, err
	}
	return pgx.CollectRows(rows, pgx.RowTo[string])
}

// SetSparePassword records a spare's sealed password (SparePassword) while
// it is building or spare.
func (s *Store) SetSparePassword(ctx context.Context, id, keyID string, sealed []byte) error {
	tag, err := s.pool.Exec(ctx, `UPDATE tenants SET spare_key_id = $2, spare_sealed = $3 WHERE id = $1 AND state IN ('building', 'spare')`, id, keyID, sealed)
	if err == nil && tag.RowsAffected() == 0 {
		err = fmt.Errorf("%w: tenant %s is not a spare being built", ErrConflict, id)
	}
	return err
}

// TakeSparePassword returns the sealed password of a spare claimed in tx
// and clears it (ErrNotFound: none was recorded).
func (s *Store) TakeSparePassword(ctx context.Context, tx pgx.Tx, id string) (keyID string, sealed []byte, err error) {
	err = tx.QueryRow(ctx, `UPDATE tenants t SET spare_key_id = NULL, spare_sealed = NULL FROM tenants o
		WHERE t.id = $1 AND o.id = t.id AND o.spare_sealed IS NOT NULL RETURNING o.spare_key_id, o.spare_sealed`, id).Scan(&keyID, &sealed)
	return keyID, sealed, notFound(err, "spare password of "+id)
}
