package templates

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgtenant/pgtenant/internal/cluster"
)

// How a schema tenant reaches its template's shared database.
//
// Each schema tenant's role, and its agent role, is granted CONNECT on the
// shared database directly, and is a member of no role another tenant is a
// member of. Earlier, every claimed schema tenant of a template was made a
// member of one role holding CONNECT (ConnectRole). A member of a role can
// hand its tables to it (ALTER … OWNER, and keep writing past its quota),
// SET ROLE to it, and DROP OWNED BY it (dropping what its neighbours handed
// to it, large objects included): no role is shared by two tenants now
// (docs/SECURITY.md, "Databases, markers and what a tenant owns").
//
// A grant on a database rewrites the database's one row in pg_database, and
// two at once fail with "tuple concurrently updated". So each grant and
// revoke on a shared database first takes a transaction advisory lock on
// it, in the transaction that changes the row and before anything else in
// that transaction reads pg_database (the grant then reads the row as the
// previous holder committed it): concurrent claims of one template's
// schema tenants on a cluster queue there for the few milliseconds of their
// activation batch. The row's ACL grows by 12 bytes a tenant (about 120 kB
// at 10,000 tenants, kept out of line by TOAST).

// connectLockSpace is the first key of the advisory lock on a shared
// database's row (the second is the hash of its name). The lock is taken
// in the maintenance database, where the admin pool runs the grants.
const connectLockSpace = 0x70677463 // "pgtc"

// ConnectSQL returns the statements that grant (or, with grant false,
// revoke) CONNECT on template's shared database to (from) roles: the
// advisory lock, then the grant. Run them in one transaction (one Exec of
// a statement batch is one), before any other statement of it that
// reads pg_database.
func ConnectSQL(grant bool, template string, roles ...string) string {
	db := SharedDatabase(template)
	ids := make([]string, len(roles))
	for i, r := range roles {
		ids[i] = cluster.Ident(r)
	}
	verb, prep := "GRANT", "TO"
	if !grant {
		verb, prep = "REVOKE", "FROM"
	}
	return connectLock(template) + fmt.Sprintf("%s CONNECT ON DATABASE %s %s %s;\n", verb, cluster.Ident(db), prep, strings.Join(ids, ", "))
}

// connectLock is the statement that takes the lock on the row of
// template's shared database: the first of every batch that changes it.
func connectLock(template string) string {
	return fmt.Sprintf("SELECT pg_catalog.pg_advisory_xact_lock(%d, pg_catalog.hashtext(%s));\n", connectLockSpace, cluster.Literal(SharedDatabase(template)))
}

// ConnectRole is the role that schema tenants of a template were members
// of before each got its own CONNECT grant. pgtenant no longer makes it;
// reconcile dissolves one it finds (DissolveConnectRole).
func ConnectRole(template string) string { return dbPrefix + "connect_" + template }

// DissolveConnectRole gives every member of template's legacy connect role
// CONNECT on the shared database directly, takes the memberships away, and
// drops the role when nothing depends on it. What a tenant handed to the
// role is not dropped (it may be another tenant's): the role then stays,
// without members, and the error names what it owns. It returns how many
// members it had.
func DissolveConnectRole(ctx context.Context, admin *pgxpool.Pool, template string) (int, error) {
	role := ConnectRole(template)
	var members []string
	if err := admin.QueryRow(ctx, `SELECT coalesce(pg_catalog.array_agg(m.rolname::text ORDER BY m.rolname), '{}')
		FROM pg_catalog.pg_auth_members am
		JOIN pg_catalog.pg_roles r ON r.oid = am.roleid JOIN pg_catalog.pg_roles m ON m.oid = am.member
		WHERE r.rolname = $1`, role).Scan(&members); err != nil {
		return 0, cluster.Classify(err)
	}
	shared, err := cluster.DatabaseExists(ctx, admin, SharedDatabase(template))
	if err != nil {
		return 0, err
	}
	if len(members) > 0 {
		var sql strings.Builder
		if shared {
			sql.WriteString(ConnectSQL(true, template, members...))
		}
		ids := make([]string, len(members))
		for i, m := range members {
			ids[i] = cluster.Ident(m)
		}
		fmt.Fprintf(&sql, "REVOKE %s FROM %s", cluster.Ident(role), strings.Join(ids, ", "))
		if _, err := admin.Exec(ctx, sql.String()); err != nil {
			return 0, fmt.Errorf("give the members of %s CONNECT of their own: %w", role, cluster.Classify(err))
		}
	}
	var exists bool
	if err := admin.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM pg_catalog.pg_roles WHERE rolname = $1)`, role).Scan(&exists); err != nil || !exists {
		return len(members), cluster.Classify(err)
	}
	if shared {
		if _, err := admin.Exec(ctx, ConnectSQL(false, template, role)); err != nil {
			return len(members), fmt.Errorf("revoke CONNECT from %s: %w", role, cluster.Classify(err))
		}
	}
	_, err = admin.Exec(ctx, "DROP ROLE "+cluster.Ident(role))
	if err = cluster.Classify(err); errors.Is(err, cluster.ErrDependents) {
		detail := ""
		var pgErr *pgconn.PgError
		if errors.As(err, &pgErr) {
			detail = ": " + strings.ReplaceAll(pgErr.Detail, "\n", "; ")
		}
		return len(members), fmt.Errorf("%s has no members now, but keeps what a tenant handed to it (pgtenant never drops it; hand it back or drop it by hand)%s", role, detail)
	}
	return len(members), err
}
