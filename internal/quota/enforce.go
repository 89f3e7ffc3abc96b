package quota

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"

	"github.com/jackc/pgx/v5"

	"github.com/pgtenant/pgtenant/internal/cluster"
	"github.com/pgtenant/pgtenant/internal/metrics"
	"github.com/pgtenant/pgtenant/internal/tenant"
)

// legacyLockRole owned the tables and schemas of every enforced tenant
// before each tenant got a lock role of its own (tenant.LockRole). It is
// still given back from, for enforcements that started with it.
const legacyLockRole = "pgt_quota_lock"

// How enforcement refuses growth, and why the tenant cannot undo it.
//
// Role settings (default_transaction_read_only, …) are defaults a tenant can
// override with SET, and the owner of an object can always GRANT itself
// back any privilege REVOKE took from it, COMMENT on it (a comment is up to
// 1 GB of catalog) or ALTER it. So enforcement moves ownership away
// instead: every object the tenant's role owns in its database (database
// mode) or in the shared database (schema mode) — tables, views,
// materialized views, sequences, schemas, functions, procedures,
// aggregates, types, domains, operators, large objects, extensions … — is
// given to the tenant's LockRole: relations one by one in transactions of at
// most lockBudget locks, the rest with REASSIGN OWNED (pg_shdepend knows
// every owned object; in a shared database it never names another
// tenant's). The tenant is granted back what reading and shrinking need:
// SELECT, DELETE and TRUNCATE on its tables, SELECT on its other relations
// and large objects, USAGE on its schemas and types, EXECUTE on its
// routines. A tenant's database belongs to the admin role, never to the
// tenant: in database mode CREATE and TEMPORARY on it are revoked.
// Not being the owner, it can neither re-grant itself INSERT or UPDATE, nor
// CREATE in a schema or a database, nor ALTER, COMMENT, VACUUM FULL,
// REINDEX, ANALYZE or REFRESH; only a superuser (pgtenant) can give
// ownership back. Privileges are checked when a statement runs, so
// sessions already open (and not ended, below) are refused too; ALTER …
// OWNER needs a brief ACCESS
// EXCLUSIVE lock per table, taken with lock_timeout, and a second attempt
// ends the tenant's sessions first.
//
// The lock role runs the tenant's code where PostgreSQL runs an owner's
// (see LockRole), so it is made unable to write too: INSERT and UPDATE on
// the tables it owns are revoked from it (a rule's action, or a view, writes
// with its owner's rights), and the tenant's SECURITY DEFINER routines are
// made SECURITY INVOKER while enforced (recorded, and made definers again
// on restore).
//
// Temporary tables: PostgreSQL checks TEMPORARY once per session, when the
// session makes its first temporary table; after that the session creates
// and fills temporary tables without the privilege, and no one else can
// truncate or drop them. PostgreSQL 15 does not say which backend a
// pg_temp_N belongs to (pg_stat_get_backend_idset numbers live backends, not
// backend ids), and a session that dropped its temporary tables keeps the
// right to make more. So in database mode, once TEMPORARY is revoked,
// enforcement ends every session of the tenant on the primary (standbys
// have no temporary tables); in schema mode, where tenants never hold
// TEMPORARY on the shared database, only if the tenant owns temporary
// relations there. The quota_enforced event says how many sessions ended.
//
// Other write paths are closed the same way: write grants that PUBLIC or
// any role but the owner held on the tenant's tables (PUBLIC includes the
// tenant; another role might be a neighbour writing for it) and CREATE on
// its schemas are revoked and recorded; in database mode the large-object
// write functions are revoked from PUBLIC in the tenant's own database
// (large objects live outside any table); TEMPORARY is not granted back.
// After enforcing, pgtenant checks with has_*_privilege that the tenant
// holds no INSERT, UPDATE, CREATE or TEMPORARY anywhere in its scope, and
// with pg_shdepend that it owns nothing but default privileges, and reports
// a failure otherwise.
//
// Restoring gives back exactly what was taken: ownership of everything the
// tenant's lock role owns (nothing else ever belongs to it), the lock role's
// own INSERT and UPDATE, SECURITY DEFINER on the recorded routines, the
// recorded grants and the large-object functions; then the lock role is
// dropped.
//
// Known edges: while enforced, row-level security policies the tenant
// defined apply to it (it is no longer the owner); code of the tenant that
// PostgreSQL runs as the owner (a foreign-key action's triggers, an
// expression index under autovacuum's ANALYZE) can grant the lock role
// INSERT again and write the tenant's own tables (never another tenant's);
// a schema-mode tenant can still create new large objects in the shared
// database (lo_creat is PUBLIC's there; they are counted in its size);
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

// plan reads (without changing anything) what enforcement will revoke and
// which routines it will make SECURITY INVOKER, so that it is recorded
// before it is changed.
func (s *Service) plan(ctx context.Context, cl *cluster.Cluster, u metrics.Usage) (Enforcement, error) {
	conn, err := cl.Connect(ctx, u.Database)
	if err != nil {
		return Enforcement{}, err
	}
	defer conn.Close(context.WithoutCancel(ctx))
	// Write privileges of PUBLIC (grantee 0) and of any role but the owner.
	rows, err := conn.Query(ctx, `
		SELECT x.nspname, x.relname, x.attname, coalesce((SELECT r.rolname FROM pg_catalog.pg_roles r WHERE r.oid = x.grantee), ''), x.privilege_type
		FROM (
			SELECT n.nspname, c.relname, ''::name AS attname, a.grantee, a.privilege_type
			FROM pg_catalog.pg_class c JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace, pg_catalog.aclexplode(c.relacl) a
			WHERE `+scope+` AND c.relkind IN ('r', 'p') AND a.grantee <> c.relowner AND a.privilege_type IN ('INSERT', 'UPDATE')
			UNION ALL
			SELECT n.nspname, c.relname, att.attname, a.grantee, a.privilege_type
			FROM pg_catalog.pg_attribute att JOIN pg_catalog.pg_class c ON c.oid = att.attrelid JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace,
			     pg_catalog.aclexplode(att.attacl) a
			WHERE `+scope+` AND c.relkind IN ('r', 'p') AND att.attnum > 0 AND NOT att.attisdropped
			  AND a.grantee <> c.relowner AND a.privilege_type IN ('INSERT', 'UPDATE')
			UNION ALL
			SELECT n.nspname, '', '', a.grantee, a.privilege_type FROM pg_catalog.pg_namespace n, pg_catalog.aclexplode(n.nspacl) a
			WHERE `+scope+` AND a.grantee <> n.nspowner AND a.privilege_type = 'CREATE'
		) x`, schemaArg(u))
	if err != nil {
		return Enforcement{}, cluster.Classify(err)
	}
	grants, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (Grant, error) {
		var g Grant
		return g, r.Scan(&g.Schema, &g.Table, &g.Column, &g.Role, &g.Privilege)
	})
	if err != nil {
		return Enforcement{}, cluster.Classify(err)
	}
	definers, err := securityDefiners(ctx, conn, tenant.PhysicalName(u.Tenant))
	if err != nil {
		return Enforcement{}, err
	}
	return Enforcement{LockRole: tenant.LockRole(u.Tenant), PublicGrants: grants, LargeObjects: u.Mode == tenant.ModeDatabase,
		SecurityDefiners: definers}, nil
}

// securityDefiners lists the SECURITY DEFINER routines role owns in conn's
// database, by identity (pg_identify_object).
func securityDefiners(ctx context.Context, conn *pgx.Conn, role string) ([]string, error) {
	rows, err := conn.Query(ctx, `
		SELECT o.identity FROM pg_catalog.pg_proc p,
		     pg_catalog.pg_identify_object('pg_catalog.pg_proc'::pg_catalog.regclass, p.oid, 0) o
		WHERE p.proowner = (SELECT r.oid FROM pg_catalog.pg_roles r WHERE r.rolname = $1) AND p.prosecdef
		ORDER BY p.oid`, role)
	if err != nil {
		return nil, cluster.Classify(err)
	}
	out, err := pgx.CollectRows(rows, pgx.RowTo[string])
	return out, cluster.Classify(err)
}

// endSessionsSQL ends a role's sessions on the primary and counts them.
const endSessionsSQL = `SELECT pg_catalog.count(*) FILTER (WHERE pg_catalog.pg_terminate_backend(pid))::int
	FROM pg_catalog.pg_stat_activity WHERE usename = $1 AND pid <> pg_catalog.pg_backend_pid()`

// lock enforces the quota: see the comment at the top of this file. Every
// step is idempotent; an interrupted lock is finished by the next attempt or
// undone by unlock.
func (s *Service) lock(ctx context.Context, cl *cluster.Cluster, u metrics.Usage, rec *Enforcement) error {
	role := tenant.PhysicalName(u.Tenant)
	if rec.LockRole == "" {
		// Started with the shared role: give that back first (below), then
		// lock with the tenant's own.
		rec.LockRole = tenant.LockRole(u.Tenant)
	}
	lockRole := rec.LockRole
	admin, err := cl.Admin(ctx)
	if err != nil {
		return err
	}
	if err := cluster.CreateRole(ctx, admin, lockRole); err != nil {
		return err
	}
	if u.Mode == tenant.ModeDatabase {
		// The database is the admin's: the tenant cannot grant these back.
		if _, err := admin.Exec(ctx, fmt.Sprintf(`REVOKE CREATE, TEMPORARY ON DATABASE %s FROM %s`,
			cluster.Ident(u.Database), cluster.Ident(role))); err != nil {
			return fmt.Errorf("take CREATE and TEMPORARY on database %s from its tenant: %w", u.Database, cluster.Classify(err))
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
	// Sessions that may hold temporary tables end (see the top of this
	// file); so do all of them when the last attempt timed out on a lock
	// the tenant held.
	end := u.Mode == tenant.ModeDatabase || rec.LockTimedOut
	if !end {
		if err := conn.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM pg_catalog.pg_class c
			WHERE c.relowner = (SELECT r.oid FROM pg_catalog.pg_roles r WHERE r.rolname = $1) AND c.relpersistence = 't')`, role).Scan(&end); err != nil {
			return cluster.Classify(err)
		}
	}
	if end {
		var n int
		if err := admin.QueryRow(ctx, endSessionsSQL, role).Scan(&n); err != nil {
			return fmt.Errorf("end the sessions of %s: %w", role, cluster.Classify(err))
		}
		rec.SessionsEnded += n
	}
	// Write grants first: from here on the tenant's hands get emptier.
	var sql strings.Builder
	for _, g := range rec.PublicGrants {
		fmt.Fprintf(&sql, "%s;\n", g.sql("REVOKE", "FROM"))
	}
	if rec.LargeObjects {
		fmt.Fprintf(&sql, "REVOKE EXECUTE ON FUNCTION %s FROM PUBLIC;\n", strings.Join(largeObjectWriters, ", "))
	}
	if sql.Len() > 0 {
		if _, err := conn.Exec(ctx, sql.String()); err != nil {
			return fmt.Errorf("revoke write grants: %w", cluster.Classify(err))
		}
	}
	if err := giveBackLegacy(ctx, conn, u); err != nil {
		return err
	}
	// SECURITY DEFINER routines would run as the lock role: invokers while
	// enforced. Recorded before (plan); one made since is added here.
	definers, err := securityDefiners(ctx, conn, role)
	if err != nil {
		return err
	}
	sql.Reset()
	for _, d := range definers {
		if !slices.Contains(rec.SecurityDefiners, d) {
			rec.SecurityDefiners = append(rec.SecurityDefiners, d)
		}
		fmt.Fprintf(&sql, "ALTER ROUTINE %s SECURITY INVOKER;\n", d)
	}
	if sql.Len() > 0 {
		if _, err := conn.Exec(ctx, sql.String()); err != nil {
			return fmt.Errorf("make the tenant's routines SECURITY INVOKER: %w", cluster.Classify(err))
		}
	}
	if err := moveRelations(ctx, conn, role, lockRole, role); err != nil {
		return err
	}
	if _, err := conn.Exec(ctx, fmt.Sprintf("REASSIGN OWNED BY %s TO %s", cluster.Ident(role), cluster.Ident(lockRole))); err != nil {
		return fmt.Errorf("give what %s owns to %s: %w", role, lockRole, cluster.Classify(err))
	}
	if err := grantBack(ctx, conn, role, lockRole, true); err != nil {
		return err
	}
	return verifyLocked(ctx, conn, u, lockRole)
}

// ErrNotEnforced is returned when, after enforcing, the tenant still holds a
// write privilege (e.g. through a role it was made a member of by hand) or
// owns an object.
var ErrNotEnforced = errors.New("quota not enforced: the tenant can still write")

// verifyLocked checks the tenant's effective rights, whatever their source,
// and what it and its lock role still own.
func verifyLocked(ctx context.Context, conn *pgx.Conn, u metrics.Usage, lockRole string) error {
	role := tenant.PhysicalName(u.Tenant)
	rows, err := conn.Query(ctx, `
		SELECT w FROM (
			SELECT pg_catalog.format('INSERT/UPDATE on table %I.%I', n.nspname, c.relname) AS w
			FROM pg_catalog.pg_class c JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace
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
			UNION ALL
			SELECT pg_catalog.format('owns %s %s', o.type, o.identity)
			FROM pg_catalog.pg_shdepend d, pg_catalog.pg_identify_object(d.classid, d.objid, 0) o
			WHERE d.dbid = (SELECT x.oid FROM pg_catalog.pg_database x WHERE x.datname = pg_catalog.current_database())
			  AND d.refclassid = 'pg_catalog.pg_authid'::pg_catalog.regclass AND d.deptype = 'o'
			  AND d.refobjid = (SELECT r.oid FROM pg_catalog.pg_roles r WHERE r.rolname = $2)
			  AND o.type <> 'default acl' AND NOT ($1 <> '' AND o.type = 'large object')
			  AND NOT (d.classid = 'pg_catalog.pg_class'::pg_catalog.regclass
			           AND EXISTS (SELECT 1 FROM pg_catalog.pg_class c WHERE c.oid = d.objid AND c.relpersistence = 't'))
			UNION ALL
			SELECT pg_catalog.format('SECURITY DEFINER routine %s of %s', p.oid::pg_catalog.regprocedure, $4::text)
			FROM pg_catalog.pg_proc p WHERE p.proowner = (SELECT r.oid FROM pg_catalog.pg_roles r WHERE r.rolname = $4) AND p.prosecdef
			UNION ALL
			SELECT pg_catalog.format('INSERT/UPDATE of %s on %s', $4::text, c.oid::pg_catalog.regclass)
			FROM pg_catalog.pg_class c WHERE c.relowner = (SELECT r.oid FROM pg_catalog.pg_roles r WHERE r.rolname = $4) AND c.relkind IN ('r', 'p')
			  AND (pg_catalog.has_table_privilege($4, c.oid, 'INSERT') OR pg_catalog.has_table_privilege($4, c.oid, 'UPDATE'))
		) x LIMIT 10`, schemaArg(u), role, largeObjectWriters, lockRole)
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
	if err := giveBackLegacy(ctx, conn, u); err != nil {
		return err
	}
	lockRole := rec.LockRole
	var exists bool
	if lockRole != "" {
		if err := conn.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM pg_catalog.pg_roles WHERE rolname = $1)`, lockRole).Scan(&exists); err != nil {
			return cluster.Classify(err)
		}
	}
	if exists {
		if err := moveRelations(ctx, conn, lockRole, role, role); err != nil {
			return err
		}
		if err := grantBack(ctx, conn, role, lockRole, false); err != nil {
			return err
		}
		if _, err := conn.Exec(ctx, fmt.Sprintf("REASSIGN OWNED BY %s TO %s", cluster.Ident(lockRole), cluster.Ident(role))); err != nil {
			return fmt.Errorf("give what %s owns back to %s: %w", lockRole, role, cluster.Classify(err))
		}
	}
	var sql strings.Builder
	for _, d := range rec.SecurityDefiners {
		var ok bool
		if err := conn.QueryRow(ctx, `SELECT pg_catalog.to_regprocedure($1) IS NOT NULL`, d).Scan(&ok); err != nil {
			return cluster.Classify(err)
		}
		if ok { // dropped meanwhile: nothing to give back
			fmt.Fprintf(&sql, "ALTER ROUTINE %s SECURITY DEFINER;\n", d)
		}
	}
	for _, g := range rec.PublicGrants {
		var ok bool
		if err := conn.QueryRow(ctx, `SELECT CASE WHEN $2 = '' THEN pg_catalog.to_regnamespace(pg_catalog.quote_ident($1)) IS NOT NULL
			ELSE pg_catalog.to_regclass(pg_catalog.format('%I.%I', $1, $2)) IS NOT NULL END
			AND ($3 = '' OR EXISTS (SELECT 1 FROM pg_catalog.pg_roles WHERE rolname = $3))`, g.Schema, g.Table, g.Role).Scan(&ok); err != nil {
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
			return fmt.Errorf("restore grants: %w", cluster.Classify(err))
		}
	}
	if exists {
		// It owns nothing now, anywhere (it only ever owned this tenant's objects).
		if err := cluster.DropRoles(ctx, admin, lockRole); err != nil {
			return err
		}
	}
	return nil
}

// sql renders a grant as GRANT … TO <grantee> or REVOKE … FROM <grantee>.
func (g Grant) sql(verb, prep string) string {
	priv := map[string]string{"INSERT": "INSERT", "UPDATE": "UPDATE", "CREATE": "CREATE"}[g.Privilege]
	grantee := "PUBLIC"
	if g.Role != "" {
		grantee = cluster.Ident(g.Role)
	}
	if g.Table == "" {
		return fmt.Sprintf("%s %s ON SCHEMA %s %s %s", verb, priv, cluster.Ident(g.Schema), prep, grantee)
	}
	if g.Column != "" {
		priv += " (" + cluster.Ident(g.Column) + ")"
	}
	return fmt.Sprintf("%s %s ON TABLE %s %s %s", verb, priv, pgx.Identifier{g.Schema, g.Table}.Sanitize(), prep, grantee)
}

// relationGrants are, by relkind, the object word of ALTER and GRANT and
// what the tenant keeps on a relation it no longer owns.
var relationGrants = map[string]struct{ kind, privs string }{
	"r": {"TABLE", "SELECT, DELETE, TRUNCATE"}, "p": {"TABLE", "SELECT, DELETE, TRUNCATE"},
	"m": {"MATERIALIZED VIEW", "SELECT"}, "v": {"VIEW", "SELECT"}, "f": {"FOREIGN TABLE", "SELECT"}, "S": {"SEQUENCE", "SELECT"},
}

// relationSQL moves one relation to lockRole (locking) or back to the
// tenant, with the tenant's grants and the lock role's own INSERT and
// UPDATE (a rule's action, or a view, writes with its owner's rights);
// without alter, it only grants.
func relationSQL(name, relkind, lockRole, tenantRole string, locking, alter bool) string {
	g := relationGrants[relkind]
	on := name
	if relkind == "S" {
		on = "SEQUENCE " + name
	}
	l, r := cluster.Ident(lockRole), cluster.Ident(tenantRole)
	var sql strings.Builder
	if locking {
		if alter {
			fmt.Fprintf(&sql, "ALTER %s %s OWNER TO %s; ", g.kind, name, l)
		}
		if g.kind == "TABLE" {
			fmt.Fprintf(&sql, "REVOKE INSERT, UPDATE ON %s FROM %s; ", name, l)
		}
		fmt.Fprintf(&sql, "GRANT %s ON %s TO %s", g.privs, on, r)
		return sql.String()
	}
	if g.kind == "TABLE" {
		// The owner's full rights, before they become the tenant's.
		fmt.Fprintf(&sql, "GRANT INSERT, UPDATE ON %s TO %s; ", name, l)
	}
	fmt.Fprintf(&sql, "REVOKE %s ON %s FROM %s; ALTER %s %s OWNER TO %s", g.privs, on, r, g.kind, name, r)
	return sql.String()
}

// moveRelations gives the relations from owns in conn's database (but the
// sequences that belong to a table, which follow it, and temporary ones) to
// to, in transactions of at most lockBudget locks, with relationSQL. One of
// from and to is the tenant's role, the other its lock role.
func moveRelations(ctx context.Context, conn *pgx.Conn, from, to, tenantRole string) error {
	locking, lockRole := from == tenantRole, from
	if locking {
		lockRole = to
	}
	for {
		rows, err := conn.Query(ctx, `
			SELECT c.oid::pg_catalog.regclass::text, c.relkind::text FROM pg_catalog.pg_class c
			WHERE c.relowner = (SELECT r.oid FROM pg_catalog.pg_roles r WHERE r.rolname = $1)
			  AND c.relkind IN ('r', 'p', 'm', 'v', 'f', 'S') AND c.relpersistence <> 't'
			  AND NOT EXISTS (SELECT 1 FROM pg_catalog.pg_depend d WHERE d.classid = 'pg_catalog.pg_class'::pg_catalog.regclass AND d.objid = c.oid
			                  AND d.refclassid = 'pg_catalog.pg_class'::pg_catalog.regclass AND d.deptype IN ('a', 'i'))
			ORDER BY c.oid LIMIT 500`, from)
		if err != nil {
			return cluster.Classify(err)
		}
		type rel struct{ name, kind string }
		rels, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (rel, error) {
			var x rel
			return x, r.Scan(&x.name, &x.kind)
		})
		if err != nil {
			return cluster.Classify(err)
		}
		if len(rels) == 0 {
			return nil
		}
		changes := make([]ownerChange, len(rels))
		for i, x := range rels {
			changes[i] = ownerChange{x.name, relationSQL(x.name, x.kind, lockRole, tenantRole, locking, true)}
		}
		if err := changeOwners(ctx, conn, changes); err != nil {
			return err
		}
	}
}

// grantBack gives the tenant (locking) or takes from it (restoring) what it
// keeps on the objects lockRole owns in conn's database: USAGE on schemas
// and types, EXECUTE on routines, SELECT on large objects; and, locking,
// the relation grants of the relations that REASSIGN OWNED moved (made
// after moveRelations looked). The statements go in batches of 500.
func grantBack(ctx context.Context, conn *pgx.Conn, tenantRole, lockRole string, locking bool) error {
	rows, err := conn.Query(ctx, `
		SELECT o.type, o.identity, coalesce(c.oid::pg_catalog.regclass::text, ''), coalesce(c.relkind::text, '')
		FROM pg_catalog.pg_shdepend d CROSS JOIN LATERAL pg_catalog.pg_identify_object(d.classid, d.objid, 0) o
		LEFT JOIN pg_catalog.pg_class c ON d.classid = 'pg_catalog.pg_class'::pg_catalog.regclass AND c.oid = d.objid
		LEFT JOIN pg_catalog.pg_type t ON d.classid = 'pg_catalog.pg_type'::pg_catalog.regclass AND t.oid = d.objid
		WHERE d.dbid = (SELECT x.oid FROM pg_catalog.pg_database x WHERE x.datname = pg_catalog.current_database())
		  AND d.refclassid = 'pg_catalog.pg_authid'::pg_catalog.regclass AND d.deptype = 'o'
		  AND d.refobjid = (SELECT r.oid FROM pg_catalog.pg_roles r WHERE r.rolname = $1)
		  AND (o.type IN ('schema', 'function', 'procedure', 'aggregate', 'large object')
		       OR (t.oid IS NOT NULL AND t.typtype <> 'm')
		       OR ($2 AND c.relkind IN ('r', 'p', 'm', 'v', 'f', 'S') AND c.relpersistence <> 't'
		           AND NOT pg_catalog.has_table_privilege($3, c.oid, 'SELECT')))
		ORDER BY d.classid, d.objid`, lockRole, locking, tenantRole)
	if err != nil {
		return cluster.Classify(err)
	}
	type obj struct{ typ, identity, rel, relkind string }
	objs, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (obj, error) {
		var x obj
		return x, r.Scan(&x.typ, &x.identity, &x.rel, &x.relkind)
	})
	if err != nil {
		return cluster.Classify(err)
	}
	verb, prep := "REVOKE", "FROM"
	if locking {
		verb, prep = "GRANT", "TO"
	}
	r := cluster.Ident(tenantRole)
	for batch := range slices.Chunk(objs, 500) {
		var sql strings.Builder
		for _, x := range batch {
			switch {
			case x.relkind != "":
				fmt.Fprintf(&sql, "%s;\n", relationSQL(x.rel, x.relkind, lockRole, tenantRole, true, false))
			case x.typ == "schema":
				fmt.Fprintf(&sql, "%s USAGE ON SCHEMA %s %s %s;\n", verb, x.identity, prep, r)
			case x.typ == "large object":
				fmt.Fprintf(&sql, "%s SELECT ON LARGE OBJECT %s %s %s;\n", verb, x.identity, prep, r)
			case x.typ == "function" || x.typ == "procedure" || x.typ == "aggregate":
				fmt.Fprintf(&sql, "%s EXECUTE ON ROUTINE %s %s %s;\n", verb, x.identity, prep, r)
			default: // types and domains
				fmt.Fprintf(&sql, "%s USAGE ON TYPE %s %s %s;\n", verb, x.identity, prep, r)
			}
		}
		if _, err := conn.Exec(ctx, sql.String()); err != nil {
			return fmt.Errorf("%s the tenant's grants on what %s owns: %w", strings.ToLower(verb), lockRole, cluster.Classify(err))
		}
	}
	return nil
}

// giveBackLegacy gives what the shared legacyLockRole owns in the tenant's
// scope (its tables, materialized views and schemas, which it took before
// each tenant had a lock role of its own) back to the tenant. Nothing else
// ever belonged to that role there; it is left to other tenants' restores.
func giveBackLegacy(ctx context.Context, conn *pgx.Conn, u metrics.Usage) error {
	var exists bool
	if err := conn.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM pg_catalog.pg_roles WHERE rolname = $1)`, legacyLockRole).Scan(&exists); err != nil {
		return cluster.Classify(err)
	}
	if !exists {
		return nil
	}
	return moveOwnership(ctx, conn, schemaArg(u), legacyLockRole, tenant.PhysicalName(u.Tenant))
}

// moveOwnership gives the tables, materialized views and schemas that from
// (legacyLockRole) owns in scope back to the tenant, in transactions of at
// most lockBudget locks, removing first the grants it kept while locked
// (SELECT, DELETE, TRUNCATE and USAGE: the owner has every right).
func moveOwnership(ctx context.Context, conn *pgx.Conn, schema, from, tenantRole string) error {
	r := cluster.Ident(tenantRole)
	for {
		rows, err := conn.Query(ctx, `
			SELECT n.nspname, c.relname, c.relkind::text FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
			WHERE c.relowner = (SELECT oid FROM pg_roles WHERE rolname = $2) AND c.relkind IN ('r', 'p', 'm') AND `+scope+`
			ORDER BY c.oid LIMIT 500`, schema, from)
		if err != nil {
			return cluster.Classify(err)
		}
		changes, err := pgx.CollectRows(rows, func(row pgx.CollectableRow) (ownerChange, error) {
			var nsp, rel, relkind string
			if err := row.Scan(&nsp, &rel, &relkind); err != nil {
				return ownerChange{}, err
			}
			name := pgx.Identifier{nsp, rel}.Sanitize()
			kind, privs := "TABLE", "SELECT, DELETE, TRUNCATE"
			if relkind == "m" {
				kind, privs = "MATERIALIZED VIEW", "SELECT"
			}
			return ownerChange{name, fmt.Sprintf("REVOKE %s ON %s FROM %s; ALTER %s %s OWNER TO %s", privs, name, r, kind, name, r)}, nil
		})
		if err != nil {
			return cluster.Classify(err)
		}
		if len(changes) == 0 {
			break
		}
		if err := changeOwners(ctx, conn, changes); err != nil {
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
		if _, err := conn.Exec(ctx, fmt.Sprintf("REVOKE USAGE ON SCHEMA %[1]s FROM %[2]s; ALTER SCHEMA %[1]s OWNER TO %[2]s", cluster.Ident(n), r)); err != nil {
			return fmt.Errorf("change owner of schema %s: %w", n, cluster.Classify(err))
		}
	}
	return nil
}

// ownerChange is one relation's change of owner: its name (for errors)
// and its statements.
type ownerChange struct{ name, sql string }

// changeOwners runs changes in one transaction, in order, and commits early
// once the session holds lockBudget locks (each ALTER … OWNER locks its
// relation until the end of the transaction): the caller's next query finds
// the rest.
func changeOwners(ctx context.Context, conn *pgx.Conn, changes []ownerChange) error {
	return pgx.BeginFunc(ctx, conn, func(tx pgx.Tx) error {
		for i, c := range changes {
			if _, err := tx.Exec(ctx, c.sql); err != nil {
				return fmt.Errorf("change owner of %s: %w", c.name, cluster.Classify(err))
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
}
