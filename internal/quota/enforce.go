package quota

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"github.com/jackc/pgx/v5"

	"github.com/pgtenant/pgtenant/internal/cluster"
	"github.com/pgtenant/pgtenant/internal/metrics"
	"github.com/pgtenant/pgtenant/internal/tenant"
)

// LockRole owns a tenant's tables and schemas while its quota is enforced.
// It cannot log in and nobody is a member of it.
const LockRole = "pgt_quota_lock"

// How enforcement refuses writes, and why the tenant cannot undo it.
//
// Role settings (default_transaction_read_only, …) are defaults a tenant can
// override with SET, and the owner of a table or schema can always GRANT
// itself back any privilege REVOKE took from it. So enforcement moves
// ownership away instead: every table and materialized view the tenant's
// role owns (with their indexes, TOAST tables and owned sequences, which
// follow) and every schema it owns are given to LockRole, and the tenant is
// granted back SELECT, DELETE and TRUNCATE on its tables and USAGE on its
// schemas. A tenant's database belongs to the admin role, never to the
// tenant: in database mode CREATE and TEMPORARY on it are revoked.
// Not being the owner, it can neither re-grant itself INSERT or UPDATE, nor
// CREATE in a schema or a database, nor ALTER, VACUUM FULL, REINDEX or
// REFRESH; only a superuser (pgtenant) can give ownership back. Privileges
// are checked when a statement runs, so sessions already open are refused
// too; ALTER … OWNER needs a brief ACCESS EXCLUSIVE lock per table, taken
// with lock_timeout, and a second attempt ends the tenant's sessions first.
//
// Other write paths are closed the same way: write grants PUBLIC held on the
// tenant's tables (PUBLIC includes the tenant) and CREATE on its schemas are
// revoked and recorded; in database mode the large-object write functions
// are revoked from PUBLIC in the tenant's own database (large objects live
// outside any table); TEMPORARY is not granted back (temporary tables take
// disk too). Views and functions stay the tenant's: a view writes through
// its base table with its owner's (the tenant's) rights, which no longer
// include INSERT or UPDATE, and a SECURITY DEFINER function of the tenant
// runs with those same rights. After enforcing, pgtenant checks with
// has_*_privilege that the tenant holds no INSERT, UPDATE, CREATE or
// TEMPORARY anywhere in its scope, and reports a failure otherwise.
//
// Restoring gives back exactly what was taken: ownership of what LockRole
// owns in the tenant's scope (nothing else ever belongs to it there), the
// recorded PUBLIC grants and the large-object functions.
//
// Known edges: while enforced, row-level security policies the tenant
// defined apply to it (it is no longer the owner); schema-mode tenants'
// large objects are outside their schema (not counted, not blocked);
// migrations that run as the tenant fail until it is back under its quota.

// lockBudget bounds the locks one ownership transaction holds.
const lockBudget = 1000

// scope is the SQL predicate (on pg_namespace n) of a tenant's schemas: the
// whole database in database mode ($1 = ”), its schema in schema mode.
const scope = `(($1 = '' AND n.nspname NOT IN ('pg_catalog', 'information_schema') AND n.nspname NOT LIKE 'pg\_toast%'
	AND n.nspname NOT LIKE 'pg\_temp%') OR n.nspname = $1)`

// largeObjectWriters are the functions that create or write large objects.
var largeObjectWriters = []string{"pg_catalog.lo_creat(integer)", "pg_catalog.lo_create(oid)", "pg_catalog.lo_from_bytea(oid, bytea)",
	"pg_catalog.lowrite(integer, bytea)", "pg_catalog.lo_put(oid, bigint, bytea)"}

// schemaArg is $1 of scope: "" for a database tenant, its schema otherwise.
func schemaArg(u metrics.Usage) string {
	if u.Mode == tenant.ModeSchema {
		return tenant.PhysicalName(u.Tenant)
	}
	return ""
}

// plan reads (without changing anything) what enforcement will revoke from
// PUBLIC, so that it is recorded before it is changed.
func (s *Service) plan(ctx context.Context, cl *cluster.Cluster, u metrics.Usage) (Enforcement, error) {
	conn, err := cl.Connect(ctx, u.Database)
	if err != nil {
		return Enforcement{}, err
	}
	defer conn.Close(context.WithoutCancel(ctx))
	rows, err := conn.Query(ctx, `
		SELECT n.nspname, c.relname, '', a.privilege_type
		FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace, pg_catalog.aclexplode(c.relacl) a
		WHERE `+scope+` AND c.relkind IN ('r', 'p') AND a.grantee = 0 AND a.privilege_type IN ('INSERT', 'UPDATE')
		UNION ALL
		SELECT n.nspname, c.relname, att.attname, a.privilege_type
		FROM pg_attribute att JOIN pg_class c ON c.oid = att.attrelid JOIN pg_namespace n ON n.oid = c.relnamespace,
		     pg_catalog.aclexplode(att.attacl) a
		WHERE `+scope+` AND c.relkind IN ('r', 'p') AND att.attnum > 0 AND NOT att.attisdropped
		  AND a.grantee = 0 AND a.privilege_type IN ('INSERT', 'UPDATE')
		UNION ALL
		SELECT n.nspname, '', '', a.privilege_type FROM pg_namespace n, pg_catalog.aclexplode(n.nspacl) a
		WHERE `+scope+` AND a.grantee = 0 AND a.privilege_type = 'CREATE'`, schemaArg(u))
	if err != nil {
		return Enforcement{}, cluster.Classify(err)
	}
	grants, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (Grant, error) {
		var g Grant
		return g, r.Scan(&g.Schema, &g.Table, &g.Column, &g.Privilege)
	})
	if err != nil {
		return Enforcement{}, cluster.Classify(err)
	}
	return Enforcement{PublicGrants: grants, LargeObjects: u.Mode == tenant.ModeDatabase}, nil
}

// lock enforces the quota: see the comment at the top of this file. Every
// step is idempotent; an interrupted lock is finished by the next attempt or
// undone by unlock.
func (s *Service) lock(ctx context.Context, cl *cluster.Cluster, u metrics.Usage, rec *Enforcement) error {
	role := tenant.PhysicalName(u.Tenant)
	admin, err := cl.Admin(ctx)
	if err != nil {
		return err
	}
	if err := cluster.CreateRole(ctx, admin, LockRole); err != nil {
		return err
	}
	if rec.LockTimedOut {
		// The last attempt timed out on a lock the tenant held: end its
		// sessions so that this one gets the locks.
		if err := cluster.TerminateSessions(ctx, admin, role); err != nil {
			return err
		}
	}
	conn, err := cl.Connect(ctx, u.Database)
	if err != nil {
		return err
	}
	defer conn.Close(context.WithoutCancel(ctx))
	if _, err := conn.Exec(ctx, `SET lock_timeout = '3s'`); err != nil {
		return cluster.Classify(err)
	}
	if err := moveOwnership(ctx, conn, schemaArg(u), role, LockRole, role); err != nil {
		return err
	}
	var sql strings.Builder
	for _, g := range rec.PublicGrants {
		fmt.Fprintf(&sql, "%s;\n", g.sql("REVOKE", "FROM"))
	}
	if rec.LargeObjects {
		fmt.Fprintf(&sql, "REVOKE EXECUTE ON FUNCTION %s FROM PUBLIC;\n", strings.Join(largeObjectWriters, ", "))
	}
	if sql.Len() > 0 {
		if _, err := conn.Exec(ctx, sql.String()); err != nil {
			return fmt.Errorf("revoke public write grants: %w", cluster.Classify(err))
		}
	}
	if u.Mode == tenant.ModeDatabase {
		// The database is the admin's: the tenant cannot grant these back.
		if _, err := admin.Exec(ctx, fmt.Sprintf(`REVOKE CREATE, TEMPORARY ON DATABASE %s FROM %s`,
			cluster.Ident(u.Database), cluster.Ident(role))); err != nil {
			return fmt.Errorf("take CREATE and TEMPORARY on database %s from its tenant: %w", u.Database, cluster.Classify(err))
		}
	}
	return verifyLocked(ctx, conn, u)
}

// ErrNotEnforced is returned when, after enforcing, the tenant still holds a
// write privilege (e.g. through a role it was made a member of by hand).
var ErrNotEnforced = errors.New("quota not enforced: the tenant can still write")

// verifyLocked checks the tenant's effective rights, whatever their source.
func verifyLocked(ctx context.Context, conn *pgx.Conn, u metrics.Usage) error {
	role := tenant.PhysicalName(u.Tenant)
	rows, err := conn.Query(ctx, `
		SELECT w FROM (
			SELECT pg_catalog.format('INSERT/UPDATE on table %I.%I', n.nspname, c.relname) AS w
			FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
			WHERE `+scope+` AND c.relkind IN ('r', 'p')
			  AND (pg_catalog.has_any_column_privilege($2, c.oid, 'INSERT') OR pg_catalog.has_any_column_privilege($2, c.oid, 'UPDATE'))
			UNION ALL
			SELECT pg_catalog.format('CREATE on schema %I', n.nspname) FROM pg_catalog.pg_namespace n WHERE pg_catalog.has_schema_privilege($2, n.oid, 'CREATE')
			UNION ALL
			SELECT 'CREATE or TEMPORARY on database ' || pg_catalog.current_database()
			WHERE pg_catalog.has_database_privilege($2, pg_catalog.current_database(), 'CREATE') OR pg_catalog.has_database_privilege($2, pg_catalog.current_database(), 'TEMPORARY')
			UNION ALL
			SELECT 'EXECUTE on ' || f FROM pg_catalog.unnest($3::text[]) f
			WHERE $1 = '' AND pg_catalog.has_function_privilege($2, f, 'EXECUTE')
		) x LIMIT 10`, schemaArg(u), role, largeObjectWriters)
	if err != nil {
		return cluster.Classify(err)
	}
	left, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		return cluster.Classify(err)
	}
	if len(left) > 0 {
		return fmt.Errorf("%w: %s", ErrNotEnforced, strings.Join(left, "; "))
	}
	return nil
}

// unlock gives back what lock took. Idempotent.
func (s *Service) unlock(ctx context.Context, cl *cluster.Cluster, u metrics.Usage, rec Enforcement) error {
	role := tenant.PhysicalName(u.Tenant)
	admin, err := cl.Admin(ctx)
	if err != nil {
		return err
	}
	if rec.LockTimedOut {
		// As in lock: the last attempt timed out on the tenant's own locks.
		if err := cluster.TerminateSessions(ctx, admin, role); err != nil {
			return err
		}
	}
	if u.Mode == tenant.ModeDatabase {
		if _, err := admin.Exec(ctx, fmt.Sprintf(`GRANT CREATE, TEMPORARY ON DATABASE %s TO %s`,
			cluster.Ident(u.Database), cluster.Ident(role))); err != nil {
			return fmt.Errorf("give CREATE and TEMPORARY on database %s back to its tenant: %w", u.Database, cluster.Classify(err))
		}
	}
	conn, err := cl.Connect(ctx, u.Database)
	if err != nil {
		return err
	}
	defer conn.Close(context.WithoutCancel(ctx))
	if _, err := conn.Exec(ctx, `SET lock_timeout = '3s'`); err != nil {
		return cluster.Classify(err)
	}
	var exists bool
	if err := conn.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM pg_catalog.pg_roles WHERE rolname = $1)`, LockRole).Scan(&exists); err != nil {
		return cluster.Classify(err)
	}
	if exists {
		if err := moveOwnership(ctx, conn, schemaArg(u), LockRole, role, role); err != nil {
			return err
		}
	}
	var sql strings.Builder
	for _, g := range rec.PublicGrants {
		var ok bool
		if err := conn.QueryRow(ctx, `SELECT CASE WHEN $2 = '' THEN pg_catalog.to_regnamespace(pg_catalog.quote_ident($1)) IS NOT NULL
			ELSE pg_catalog.to_regclass(pg_catalog.format('%I.%I', $1, $2)) IS NOT NULL END`, g.Schema, g.Table).Scan(&ok); err != nil {
			return cluster.Classify(err)
		}
		if ok { // dropped meanwhile: nothing to give back
			fmt.Fprintf(&sql, "%s;\n", g.sql("GRANT", "TO"))
		}
	}
	if rec.LargeObjects {
		fmt.Fprintf(&sql, "GRANT EXECUTE ON FUNCTION %s TO PUBLIC;\n", strings.Join(largeObjectWriters, ", "))
	}
	if sql.Len() > 0 {
		if _, err := conn.Exec(ctx, sql.String()); err != nil {
			return fmt.Errorf("restore public grants: %w", cluster.Classify(err))
		}
	}
	return nil
}

// sql renders a grant as GRANT … TO PUBLIC or REVOKE … FROM PUBLIC.
func (g Grant) sql(verb, prep string) string {
	priv := map[string]string{"INSERT": "INSERT", "UPDATE": "UPDATE", "CREATE": "CREATE"}[g.Privilege]
	if g.Table == "" {
		return fmt.Sprintf("%s %s ON SCHEMA %s %s PUBLIC", verb, priv, cluster.Ident(g.Schema), prep)
	}
	if g.Column != "" {
		priv += " (" + cluster.Ident(g.Column) + ")"
	}
	return fmt.Sprintf("%s %s ON TABLE %s %s PUBLIC", verb, priv, pgx.Identifier{g.Schema, g.Table}.Sanitize(), prep)
}

// moveOwnership gives the tables, materialized views and schemas that from
// owns in scope to to, in transactions of at most lockBudget locks. Towards
// LockRole the tenant keeps SELECT, DELETE, TRUNCATE and USAGE; back to the
// tenant those grants are removed first (the owner has every right).
func moveOwnership(ctx context.Context, conn *pgx.Conn, schema, from, to, tenantRole string) error {
	locking := to == LockRole
	r := cluster.Ident(tenantRole)
	for {
		rows, err := conn.Query(ctx, `
			SELECT n.nspname, c.relname, c.relkind::text FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
			WHERE c.relowner = (SELECT oid FROM pg_roles WHERE rolname = $2) AND c.relkind IN ('r', 'p', 'm') AND `+scope+`
			ORDER BY c.oid LIMIT 500`, schema, from)
		if err != nil {
			return cluster.Classify(err)
		}
		type rel struct{ schema, name, kind string }
		rels, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (rel, error) {
			var x rel
			return x, r.Scan(&x.schema, &x.name, &x.kind)
		})
		if err != nil {
			return cluster.Classify(err)
		}
		if len(rels) == 0 {
			break
		}
		err = pgx.BeginFunc(ctx, conn, func(tx pgx.Tx) error {
			for i, x := range rels {
				name := pgx.Identifier{x.schema, x.name}.Sanitize()
				kind, privs := "TABLE", "SELECT, DELETE, TRUNCATE"
				if x.kind == "m" {
					kind, privs = "MATERIALIZED VIEW", "SELECT"
				}
				var sql string
				if locking {
					sql = fmt.Sprintf("ALTER %s %s OWNER TO %s; GRANT %s ON %s TO %s", kind, name, cluster.Ident(to), privs, name, r)
				} else {
					sql = fmt.Sprintf("REVOKE %s ON %s FROM %s; ALTER %s %s OWNER TO %s", privs, name, r, kind, name, cluster.Ident(to))
				}
				if _, err := tx.Exec(ctx, sql); err != nil {
					return fmt.Errorf("change owner of %s: %w", name, cluster.Classify(err))
				}
				if i%50 == 49 {
					var locks int
					if err := tx.QueryRow(ctx, `SELECT pg_catalog.count(*) FROM pg_catalog.pg_locks WHERE pid = pg_catalog.pg_backend_pid()`).Scan(&locks); err != nil {
						return cluster.Classify(err)
					}
					if locks >= lockBudget {
						return nil // commit; the next query finds the rest
					}
				}
			}
			return nil
		})
		if err != nil {
			return err
		}
	}
	rows, err := conn.Query(ctx, `SELECT n.nspname FROM pg_namespace n
		WHERE n.nspowner = (SELECT oid FROM pg_roles WHERE rolname = $2) AND `+scope, schema, from)
	if err != nil {
		return cluster.Classify(err)
	}
	schemas, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		return cluster.Classify(err)
	}
	for _, n := range schemas {
		var sql string
		if locking {
			sql = fmt.Sprintf("ALTER SCHEMA %[1]s OWNER TO %[2]s; GRANT USAGE ON SCHEMA %[1]s TO %[3]s", cluster.Ident(n), cluster.Ident(to), r)
		} else {
			sql = fmt.Sprintf("REVOKE USAGE ON SCHEMA %[1]s FROM %[3]s; ALTER SCHEMA %[1]s OWNER TO %[2]s", cluster.Ident(n), cluster.Ident(to), r)
		}
		if _, err := conn.Exec(ctx, sql); err != nil {
			return fmt.Errorf("change owner of schema %s: %w", n, cluster.Classify(err))
		}
	}
	return nil
}
