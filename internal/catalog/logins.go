package catalog

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pgtenant/pgtenant/internal/cluster"
	"github.com/pgtenant/pgtenant/internal/tenant"
)

// Login is one of a tenant's extra logins (internal/credentials makes its
// role; the password is never kept).
type Login struct {
	Tenant    string     `json:"tenant"`
	Name      string     `json:"name"`
	ReadOnly  bool       `json:"read_only"`
	Replica   bool       `json:"replica"`
	CreatedAt time.Time  `json:"created_at"`
	RotatedAt *time.Time `json:"rotated_at,omitempty"`
}

// Role is the login's role on the tenant's cluster.
func (l Login) Role() string { return tenant.LoginRole(l.Tenant, l.Name) }

// LoginRoles are the roles of logins.
func LoginRoles(ls []Login) []string {
	out := make([]string, len(ls))
	for i, l := range ls {
		out[i] = l.Role()
	}
	return out
}

const loginColumns = `tenant, name, read_only, replica, created_at, rotated_at`

func scanLogin(row pgx.Row) (Login, error) {
	var l Login
	err := row.Scan(&l.Tenant, &l.Name, &l.ReadOnly, &l.Replica, &l.CreatedAt, &l.RotatedAt)
	return l, err
}

// InsertLogin records a new login; one of that name is ErrConflict.
func (s *Store) InsertLogin(ctx context.Context, q Querier, l Login) (Login, error) {
	out, err := scanLogin(q.QueryRow(ctx, `INSERT INTO tenant_logins (tenant, name, read_only, replica)
		VALUES ($1, $2, $3, $4) RETURNING `+loginColumns, l.Tenant, l.Name, l.ReadOnly, l.Replica))
	if errors.Is(cluster.Classify(err), cluster.ErrUniqueViolation) {
		return Login{}, fmt.Errorf("%w: tenant %s has a credential named %s already", ErrConflict, l.Tenant, l.Name)
	}
	return out, err
}

// Logins lists a tenant's logins by name.
func (s *Store) Logins(ctx context.Context, q Querier, tenant string) ([]Login, error) {
	if q == nil {
		q = s.pool
	}
	rows, err := q.Query(ctx, `SELECT `+loginColumns+` FROM tenant_logins WHERE tenant = $1 ORDER BY name`, tenant)
	if err != nil {
		return nil, err
	}
	return pgx.CollectRows(rows, func(r pgx.CollectableRow) (Login, error) { return scanLogin(r) })
}

// LoginsFronted lists, by tenant, the logins of the active and suspended
// tenants whose front door is cluster's pooler (its entries).
func (s *Store) LoginsFronted(ctx context.Context, cluster string) (map[string][]Login, error) {
	rows, err := s.pool.Query(ctx, `SELECT `+loginColumns+` FROM tenant_logins l
		WHERE EXISTS (SELECT 1 FROM tenants t WHERE t.id = l.tenant AND coalesce(t.front, t.cluster) = $1 AND t.state IN ('active', 'suspended'))
		ORDER BY tenant, name`, cluster)
	if err != nil {
		return nil, err
	}
	ls, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (Login, error) { return scanLogin(r) })
	out := map[string][]Login{}
	for _, l := range ls {
		out[l.Tenant] = append(out[l.Tenant], l)
	}
	return out, err
}

// GetLogin returns one login, or ErrNotFound.
func (s *Store) GetLogin(ctx context.Context, q Querier, tenant, name string) (Login, error) {
	if q == nil {
		q = s.pool
	}
	l, err := scanLogin(q.QueryRow(ctx, `SELECT `+loginColumns+` FROM tenant_logins WHERE tenant = $1 AND name = $2`, tenant, name))
	return l, notFound(err, fmt.Sprintf("credential %s of tenant %s", name, tenant))
}

// LoginRotated records a login's new password's time.
func (s *Store) LoginRotated(ctx context.Context, q Querier, tenant, name string) error {
	_, err := q.Exec(ctx, `UPDATE tenant_logins SET rotated_at = now() WHERE tenant = $1 AND name = $2`, tenant, name)
	return err
}

// DeleteLogins forgets a tenant's logins: the one named, or all (name "").
func (s *Store) DeleteLogins(ctx context.Context, q Querier, tenant, name string) error {
	_, err := q.Exec(ctx, `DELETE FROM tenant_logins WHERE tenant = $1 AND ($2 = '' OR name = $2)`, tenant, name)
	return err
}
