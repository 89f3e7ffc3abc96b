package cluster

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
)

// DDL helpers shared by the workflows. Names are quoted here; callers pass
// validated physical names.

// CreateRole creates a NOLOGIN role; an existing role is not an error.
func CreateRole(ctx context.Context, q *pgxpool.Pool, role string) error {
	_, err := q.Exec(ctx, "CREATE ROLE "+Ident(role)+" NOLOGIN")
	if err = Classify(err); err != nil && !errors.Is(err, ErrDuplicate) {
		return fmt.Errorf("create role %s: %w", role, err)
	}
	return nil
}

// ExecLockBounded runs sql in a transaction of its own whose every lock
// wait ends after lockTimeout (then ErrLockNotAvailable): how the control
// plane changes a tenant's role, whose row the tenant holds with an
// uncommitted ALTER ROLE of its own. The error is classified.
func ExecLockBounded(ctx context.Context, db interface {
	Begin(context.Context) (pgx.Tx, error)
}, lockTimeout time.Duration, sql string) error {
	return Classify(pgx.BeginFunc(ctx, db, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, "SET LOCAL lock_timeout = "+Literal(fmt.Sprintf("%dms", lockTimeout.Milliseconds()))); err != nil {
			return err
		}
		_, err := tx.Exec(ctx, sql)
		return err
	}))
}

// DropRoles drops roles that exist. DROP OWNED first, in the maintenance
// database, removes their grants there and on shared objects; what they
// own in other databases (DropOwned) must be gone before.
func DropRoles(ctx context.Context, q *pgxpool.Pool, roles ...string) error {
	if err := DropOwned(ctx, q, roles...); err != nil {
		return err
	}
	for _, role := range roles {
		if _, err := q.Exec(ctx, "DROP ROLE IF EXISTS "+Ident(role)); err != nil {
			return fmt.Errorf("drop role %s: %w", role, Classify(err))
		}
	}
	return nil
}

// DropOwned runs DROP OWNED BY (RESTRICT) for the roles that exist, in the
// database q is connected to: their objects there (large objects, objects
// made in schemas they were allowed into), default privileges and grants.
// Objects of other roles that depend on theirs make it fail with
// ErrDependents, naming them; nothing of another role is dropped.
func DropOwned(ctx context.Context, q interface {
	Execer
	Querier
}, roles ...string) error {
	var existing []string
	if err := q.QueryRow(ctx, `SELECT coalesce(pg_catalog.array_agg(rolname::text), '{}') FROM pg_catalog.pg_roles WHERE rolname = ANY($1)`,
		roles).Scan(&existing); err != nil {
		return Classify(err)
	}
	if len(existing) == 0 {
		return nil
	}
	var ids []string
	for _, r := range existing {
		ids = append(ids, Ident(r))
	}
	if _, err := q.Exec(ctx, "DROP OWNED BY "+strings.Join(ids, ", ")+" RESTRICT"); err != nil {
		err = Classify(err)
		var pgErr *pgconn.PgError
		if errors.Is(err, ErrDependents) && errors.As(err, &pgErr) && pgErr.Detail != "" {
			return fmt.Errorf("drop what %s own: %w: %s", strings.Join(existing, " and "), err, strings.ReplaceAll(pgErr.Detail, "\n", "; "))
		}
		return fmt.Errorf("drop what %s own: %w", strings.Join(existing, " and "), err)
	}
	return nil
}

// DatabaseExists reports whether a database exists.
func DatabaseExists(ctx context.Context, q *pgxpool.Pool, name string) (bool, error) {
	var ok bool
	err := q.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM pg_database WHERE datname = $1)`, name).Scan(&ok)
	return ok, Classify(err)
}

// Strategy of CREATE DATABASE (PostgreSQL 15+).
const (
	WALLog   = "WAL_LOG"   // copies block by block through the WAL: WAL ≈ template size, no checkpoint
	FileCopy = "FILE_COPY" // copies files: tiny WAL, but a checkpoint before and after
)

// Execer runs a statement: a pool, a connection or a transaction.
type Execer interface {
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
}

// CreateDatabase runs CREATE DATABASE. An existing database is ErrDuplicate.
// strategy "" leaves the server's default; on servers before 15 it is ignored.
func CreateDatabase(ctx context.Context, q Execer, name, template, owner, strategy string) error {
	sql := "CREATE DATABASE " + Ident(name) + " TEMPLATE " + Ident(template)
	if owner != "" {
		sql += " OWNER " + Ident(owner)
	}
	if strategy != "" {
		sql += " STRATEGY " + strategy
	}
	if _, err := q.Exec(ctx, sql); err != nil {
		return fmt.Errorf("create database %s from %s: %w", name, template, Classify(err))
	}
	return nil
}

// DropDatabase drops a database if it exists, ending its sessions. A
// template database cannot be dropped: IS_TEMPLATE is cleared first
// (pgtenant's template databases, or anything that set it).
func DropDatabase(ctx context.Context, q *pgxpool.Pool, name string) error {
	_, err := q.Exec(ctx, fmt.Sprintf(`DO $$ BEGIN
		IF EXISTS (SELECT 1 FROM pg_catalog.pg_database WHERE datname = %[1]s AND datistemplate) THEN
			ALTER DATABASE %[2]s IS_TEMPLATE false;
		END IF;
	END $$`, Literal(name), Ident(name)))
	if err != nil {
		return fmt.Errorf("drop database %s: clear IS_TEMPLATE: %w", name, Classify(err))
	}
	if _, err := q.Exec(ctx, "DROP DATABASE IF EXISTS "+Ident(name)+" WITH (FORCE)"); err != nil {
		return fmt.Errorf("drop database %s: %w", name, Classify(err))
	}
	return nil
}

// TerminateSessions ends the sessions of a role (all databases).
func TerminateSessions(ctx context.Context, q *pgxpool.Pool, role string) error {
	_, err := q.Exec(ctx, `SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE usename = $1 AND pid <> pg_backend_pid()`, role)
	return Classify(err)
}

// CountUserRelations counts relations outside the system schemas of the
// database conn is connected to (optionally only in one schema).
func CountUserRelations(ctx context.Context, conn *pgx.Conn, schema string) (int, error) {
	var n int
	err := conn.QueryRow(ctx, `SELECT pg_catalog.count(*) FROM pg_catalog.pg_class c JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace
		WHERE n.nspname NOT IN ('pg_catalog', 'information_schema', 'pg_toast') AND n.nspname NOT LIKE 'pg_temp%'
		  AND n.nspname NOT LIKE 'pg_toast_temp%' AND ($1 = '' OR n.nspname = $1)`, schema).Scan(&n)
	return n, Classify(err)
}

// relationKinds maps pg_class.relkind to the ALTER command for its owner.
var relationKinds = map[string]string{"r": "TABLE", "p": "TABLE", "v": "VIEW", "m": "MATERIALIZED VIEW", "S": "SEQUENCE", "f": "FOREIGN TABLE"}

// ReassignOwned gives every object of role from in conn's database to role
// to. Relations go over one by one in transactions holding at most
// lockBudget locks (ALTER … OWNER locks a table with its indexes and owned
// sequences), so a template of tens of thousands of relations works at the
// default max_locks_per_transaction; REASSIGN OWNED then moves the rest
// (functions, types, schemas) in a last small transaction.
func ReassignOwned(ctx context.Context, conn *pgx.Conn, from, to string, lockBudget int) error {
	for {
		rows, err := conn.Query(ctx, `
			SELECT c.oid::regclass::text, c.relkind::text FROM pg_class c
			WHERE c.relowner = (SELECT oid FROM pg_roles WHERE rolname = $1)
			  AND c.relkind IN ('r', 'p', 'v', 'm', 'S', 'f')
			  AND NOT EXISTS (SELECT 1 FROM pg_depend d WHERE d.classid = 'pg_class'::regclass AND d.objid = c.oid
			                  AND d.refclassid = 'pg_class'::regclass AND d.deptype IN ('a', 'i'))
			  AND NOT EXISTS (SELECT 1 FROM pg_inherits i WHERE i.inhrelid = c.oid)
			LIMIT 1000`, from)
		if err != nil {
			return Classify(err)
		}
		type rel struct{ name, kind string }
		rels, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (rel, error) {
			var x rel
			return x, r.Scan(&x.name, &x.kind)
		})
		if err != nil {
			return Classify(err)
		}
		if len(rels) == 0 {
			break
		}
		if err := pgx.BeginFunc(ctx, conn, func(tx pgx.Tx) error {
			for _, r := range rels {
				if _, err := tx.Exec(ctx, "ALTER "+relationKinds[r.kind]+" "+r.name+" OWNER TO "+Ident(to)); err != nil {
					return fmt.Errorf("alter owner of %s: %w", r.name, Classify(err))
				}
				var locks int
				if err := tx.QueryRow(ctx, `SELECT pg_catalog.count(*) FROM pg_catalog.pg_locks WHERE pid = pg_catalog.pg_backend_pid()`).Scan(&locks); err != nil {
					return Classify(err)
				}
				if locks >= lockBudget {
					return nil // commit this batch; the next query finds the rest
				}
			}
			return nil
		}); err != nil {
			return err
		}
	}
	if _, err := conn.Exec(ctx, "REASSIGN OWNED BY "+Ident(from)+" TO "+Ident(to)); err != nil {
		return fmt.Errorf("reassign owned by %s: %w", from, Classify(err))
	}
	return nil
}

// ErrOutsideDependents is returned by DropSchemaBatched when objects outside
// the schema depend on it: dropping with CASCADE would touch them.
var ErrOutsideDependents = errors.New("objects outside the schema depend on it")

// DropSchemaBatched drops a schema and everything in it in transactions of
// at most about batchRelations relations each (a table counts with its
// indexes, TOAST table and owned sequences), so that no transaction exceeds
// the lock table and no commit record grows large for the standby to replay.
// between is called after each committed batch (for pacing and progress)
// with the relations dropped so far and the total at the start. Interrupted,
// it can simply be called again.
func DropSchemaBatched(ctx context.Context, conn *pgx.Conn, schema string, batchRelations int,
	between func(ctx context.Context, dropped, total int) error) error {
	var exists bool
	if err := conn.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM pg_namespace WHERE nspname = $1)`, schema).Scan(&exists); err != nil {
		return Classify(err)
	}
	if !exists {
		return nil
	}
	if err := checkOutsideDependents(ctx, conn, schema); err != nil {
		return err
	}
	total := -1
	dropped := 0
	for {
		// Relations with the weight of what dropping them takes along
		// (found through what depends on the schema, by pg_depend's index:
		// pg_class has none on the namespace alone), newest first: what depends on a relation was nearly always made
		// after it, so its dependents are gone before CASCADE could reach
		// them. Oldest first, dropping `wide`'s first table (whose serial
		// sequences the T copies' column defaults use) cascaded into every
		// copy's defaults: 20,000+ locks and a 1.3 MB commit in one batch.
		rows, err := conn.Query(ctx, `
			SELECT c.oid::regclass::text, c.relkind::text,
			       1 + (SELECT pg_catalog.count(*) FROM pg_catalog.pg_index i WHERE i.indrelid = c.oid)
			         + (CASE WHEN c.reltoastrelid <> 0 THEN 2 ELSE 0 END)
			         + (SELECT pg_catalog.count(*) FROM pg_catalog.pg_depend d WHERE d.refclassid = 'pg_catalog.pg_class'::pg_catalog.regclass AND d.refobjid = c.oid
			              AND d.classid = 'pg_class'::regclass AND d.deptype IN ('a', 'i')) AS weight,
			       pg_catalog.sum(1) OVER () AS remaining
			FROM pg_catalog.pg_namespace n
			JOIN pg_catalog.pg_depend nd ON nd.refclassid = 'pg_catalog.pg_namespace'::pg_catalog.regclass AND nd.refobjid = n.oid
			  AND nd.refobjsubid = 0 AND nd.classid = 'pg_catalog.pg_class'::pg_catalog.regclass
			JOIN pg_catalog.pg_class c ON c.oid = nd.objid AND c.relnamespace = n.oid
			WHERE n.nspname = $1 AND c.relkind IN ('r', 'p', 'v', 'm', 'S', 'f')
			  AND NOT EXISTS (SELECT 1 FROM pg_depend d WHERE d.classid = 'pg_class'::regclass AND d.objid = c.oid
			                  AND d.refclassid = 'pg_class'::regclass AND d.deptype IN ('a', 'i'))
			  AND NOT EXISTS (SELECT 1 FROM pg_inherits i WHERE i.inhrelid = c.oid)
			ORDER BY c.oid DESC LIMIT 2000`, schema)
		if err != nil {
			return Classify(err)
		}
		type rel struct {
			name, kind string
			weight     int
			remaining  int64
		}
		rels, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (rel, error) {
			var x rel
			return x, r.Scan(&x.name, &x.kind, &x.weight, &x.remaining)
		})
		if err != nil {
			return Classify(err)
		}
		if len(rels) == 0 {
			break
		}
		if total < 0 {
			total = 0
			for _, r := range rels {
				total += r.weight
			}
			if rels[0].remaining > int64(len(rels)) {
				total = total * int(rels[0].remaining) / len(rels) // estimate beyond the first page
			}
		}
		byKind := map[string][]string{}
		weight, n := 0, 0
		for _, r := range rels {
			if n > 0 && weight+r.weight > batchRelations {
				break
			}
			byKind[r.kind] = append(byKind[r.kind], r.name)
			weight += r.weight
			n++
		}
		// One implicit transaction per batch (a multi-statement query);
		// CASCADE takes along views and foreign keys, all inside the schema
		// (checked above); IF EXISTS skips what an earlier CASCADE took.
		var sql strings.Builder
		for kind, names := range byKind {
			fmt.Fprintf(&sql, "DROP %s IF EXISTS %s CASCADE;\n", relationKinds[kind], strings.Join(names, ", "))
		}
		if _, err := conn.Exec(ctx, sql.String()); err != nil {
			return fmt.Errorf("drop a batch of %d relations of schema %s: %w", weight, schema, Classify(err))
		}
		dropped += weight
		if between != nil {
			if err := between(ctx, dropped, max(total, dropped)); err != nil {
				return err
			}
		}
	}
	// The last CASCADE takes types, functions and the rest: checked again
	// in its own transaction, since objects outside may have come to
	// depend on them while the batches ran.
	return pgx.BeginFunc(ctx, conn, func(tx pgx.Tx) error {
		if err := checkOutsideDependents(ctx, tx, schema); err != nil {
			return err
		}
		if _, err := tx.Exec(ctx, "DROP SCHEMA IF EXISTS "+Ident(schema)+" CASCADE"); err != nil {
			return fmt.Errorf("drop schema %s: %w", schema, Classify(err))
		}
		return nil
	})
}

// schemaObjectsSQL finds schema $1's objects, as mine (classid, objid), for
// a query that follows it. They are found through pg_depend's index on
// what is referenced, not by scanning the catalogs for their namespace
// (in a shared database of 10,000 tenants, sequential scans of pg_class,
// pg_type, pg_proc and pg_constraint at every check): what depends on the
// schema itself (every relation, type, function, operator, … records it),
// then what those own (deptype auto or internal: indexes, TOAST,
// constraints, row and array types), kept when their own namespace is the
// schema.
const schemaObjectsSQL = `
WITH RECURSIVE s AS (SELECT oid, nspname FROM pg_catalog.pg_namespace WHERE nspname = $1),
owned (classid, objid) AS (
	SELECT d.classid, d.objid FROM pg_catalog.pg_depend d, s
	WHERE d.refclassid = 'pg_catalog.pg_namespace'::pg_catalog.regclass AND d.refobjid = s.oid AND d.refobjsubid = 0
	UNION
	SELECT d.classid, d.objid FROM pg_catalog.pg_depend d JOIN owned o ON d.refclassid = o.classid AND d.refobjid = o.objid
	WHERE d.deptype IN ('a', 'i')
),
mine (classid, objid) AS (
	SELECT o.classid, o.objid FROM owned o, s WHERE s.oid = CASE o.classid
		WHEN 'pg_catalog.pg_class'::pg_catalog.regclass THEN (SELECT x.relnamespace FROM pg_catalog.pg_class x WHERE x.oid = o.objid)
		WHEN 'pg_catalog.pg_type'::pg_catalog.regclass THEN (SELECT x.typnamespace FROM pg_catalog.pg_type x WHERE x.oid = o.objid)
		WHEN 'pg_catalog.pg_proc'::pg_catalog.regclass THEN (SELECT x.pronamespace FROM pg_catalog.pg_proc x WHERE x.oid = o.objid)
		WHEN 'pg_catalog.pg_operator'::pg_catalog.regclass THEN (SELECT x.oprnamespace FROM pg_catalog.pg_operator x WHERE x.oid = o.objid)
		WHEN 'pg_catalog.pg_collation'::pg_catalog.regclass THEN (SELECT x.collnamespace FROM pg_catalog.pg_collation x WHERE x.oid = o.objid)
		WHEN 'pg_catalog.pg_conversion'::pg_catalog.regclass THEN (SELECT x.connamespace FROM pg_catalog.pg_conversion x WHERE x.oid = o.objid)
		WHEN 'pg_catalog.pg_opclass'::pg_catalog.regclass THEN (SELECT x.opcnamespace FROM pg_catalog.pg_opclass x WHERE x.oid = o.objid)
		WHEN 'pg_catalog.pg_opfamily'::pg_catalog.regclass THEN (SELECT x.opfnamespace FROM pg_catalog.pg_opfamily x WHERE x.oid = o.objid)
		WHEN 'pg_catalog.pg_ts_config'::pg_catalog.regclass THEN (SELECT x.cfgnamespace FROM pg_catalog.pg_ts_config x WHERE x.oid = o.objid)
		WHEN 'pg_catalog.pg_ts_dict'::pg_catalog.regclass THEN (SELECT x.dictnamespace FROM pg_catalog.pg_ts_dict x WHERE x.oid = o.objid)
		WHEN 'pg_catalog.pg_statistic_ext'::pg_catalog.regclass THEN (SELECT x.stxnamespace FROM pg_catalog.pg_statistic_ext x WHERE x.oid = o.objid)
		WHEN 'pg_catalog.pg_constraint'::pg_catalog.regclass THEN (SELECT x.connamespace FROM pg_catalog.pg_constraint x WHERE x.oid = o.objid)
	END
)`

// outsideDependentsSQL lists (up to 20) objects outside schema $1 that
// depend on an object in it: what DROP … CASCADE would take along beyond
// the schema, e.g. another tenant's column of this tenant's enum type, or
// its view of this tenant's table. Sub-objects count where their table is
// (defaults, rules, triggers, policies); a cast counts as outside when it
// involves a type of another schema (other than a built-in one).
const outsideDependentsSQL = schemaObjectsSQL + `
SELECT DISTINCT pg_catalog.pg_describe_object(d.classid, d.objid, d.objsubid)
FROM pg_catalog.pg_depend d
JOIN mine m ON d.refclassid = m.classid AND d.refobjid = m.objid
CROSS JOIN s
LEFT JOIN pg_catalog.pg_class dc ON d.classid = 'pg_catalog.pg_class'::pg_catalog.regclass AND dc.oid = d.objid
LEFT JOIN pg_catalog.pg_type dt ON d.classid = 'pg_catalog.pg_type'::pg_catalog.regclass AND dt.oid = d.objid
LEFT JOIN pg_catalog.pg_proc dp ON d.classid = 'pg_catalog.pg_proc'::pg_catalog.regclass AND dp.oid = d.objid
LEFT JOIN pg_catalog.pg_constraint dk ON d.classid = 'pg_catalog.pg_constraint'::pg_catalog.regclass AND dk.oid = d.objid
LEFT JOIN pg_catalog.pg_attrdef ad ON d.classid = 'pg_catalog.pg_attrdef'::pg_catalog.regclass AND ad.oid = d.objid
LEFT JOIN pg_catalog.pg_rewrite rw ON d.classid = 'pg_catalog.pg_rewrite'::pg_catalog.regclass AND rw.oid = d.objid
LEFT JOIN pg_catalog.pg_trigger tg ON d.classid = 'pg_catalog.pg_trigger'::pg_catalog.regclass AND tg.oid = d.objid
LEFT JOIN pg_catalog.pg_policy po ON d.classid = 'pg_catalog.pg_policy'::pg_catalog.regclass AND po.oid = d.objid
LEFT JOIN pg_catalog.pg_class tbl ON tbl.oid = coalesce(ad.adrelid, rw.ev_class, tg.tgrelid, po.polrelid)
LEFT JOIN pg_catalog.pg_cast ca ON d.classid = 'pg_catalog.pg_cast'::pg_catalog.regclass AND ca.oid = d.objid
LEFT JOIN pg_catalog.pg_transform tr ON d.classid = 'pg_catalog.pg_transform'::pg_catalog.regclass AND tr.oid = d.objid
WHERE d.deptype IN ('n', 'a')
  AND CASE
	WHEN dc.oid IS NOT NULL THEN dc.relnamespace <> s.oid
	WHEN dt.oid IS NOT NULL THEN dt.typnamespace <> s.oid
	WHEN dp.oid IS NOT NULL THEN dp.pronamespace <> s.oid
	WHEN dk.oid IS NOT NULL THEN dk.connamespace <> s.oid
	WHEN tbl.oid IS NOT NULL THEN tbl.relnamespace <> s.oid
	WHEN ca.oid IS NOT NULL THEN EXISTS (SELECT 1 FROM pg_catalog.pg_type ty WHERE ty.oid IN (ca.castsource, ca.casttarget)
		AND ty.oid >= 16384 AND ty.typnamespace <> s.oid)
	WHEN tr.oid IS NOT NULL THEN false
	ELSE (pg_catalog.pg_identify_object(d.classid, d.objid, d.objsubid)).schema IS DISTINCT FROM s.nspname
  END
LIMIT 20`

// checkOutsideDependents fails with ErrOutsideDependents, naming them, when
// objects outside the schema depend on objects in it.
func checkOutsideDependents(ctx context.Context, q interface {
	Query(context.Context, string, ...any) (pgx.Rows, error)
}, schema string) error {
	rows, err := q.Query(ctx, outsideDependentsSQL, schema)
	if err != nil {
		return Classify(err)
	}
	outside, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		return Classify(err)
	}
	if len(outside) > 0 {
		return fmt.Errorf("drop schema %s: %w: %s", schema, ErrOutsideDependents, strings.Join(outside, "; "))
	}
	return nil
}

// RevokePublicConnect takes CONNECT (and TEMP) on databases away from PUBLIC.
func RevokePublicConnect(ctx context.Context, cl *Cluster, databases ...string) error {
	admin, err := cl.Admin(ctx)
	if err != nil {
		return err
	}
	for _, db := range databases {
		if _, err := admin.Exec(ctx, "REVOKE CONNECT, TEMPORARY ON DATABASE "+Ident(db)+" FROM PUBLIC"); err != nil {
			return fmt.Errorf("revoke public access to %s on %s: %w", db, cl.Name(), Classify(err))
		}
	}
	return nil
}

// CreateExtension installs an extension in the maintenance database if it
// is missing (InstallExtension).
func CreateExtension(ctx context.Context, cl *Cluster, name string) error {
	admin, err := cl.Admin(ctx)
	if err != nil {
		return err
	}
	return InstallExtension(ctx, admin, name, cl.Name())
}

// InstallExtension runs createExtensionSQL in q's session, a maintenance
// database's; where names it in an error (ExtensionError). Each run
// rewrites the schema's row (its REVOKE), so of two sessions that install
// extensions at the same moment (a daemon's start, another daemon's
// collector or prewarm capture) the later fails with "tuple concurrently
// updated" and nothing of its statement is done: it is run again, after a
// random pause that grows with the attempts, so that sessions that keep
// colliding fall out of step.
func InstallExtension(ctx context.Context, q Execer, name, where string) error {
	for attempt := 1; ; attempt++ {
		_, err := q.Exec(ctx, createExtensionSQL(name))
		if err == nil {
			return nil
		}
		if attempt == 10 || !concurrentlyUpdated(err) {
			return ExtensionError(name, where, err)
		}
		select {
		case <-ctx.Done():
			return ExtensionError(name, where, err)
		case <-time.After(time.Duration(1+rand.IntN(5*attempt)) * time.Millisecond):
		}
	}
}

// concurrentlyUpdated: the statement lost a race to update a catalog row
// (an internal error, XX000, whose message is all that tells it apart).
func concurrentlyUpdated(err error) bool {
	var pgErr *pgconn.PgError
	return errors.As(err, &pgErr) && pgErr.Code == "XX000" && strings.Contains(pgErr.Message, "concurrently updated")
}

// ExtensionError explains a failed CREATE EXTENSION: the contrib package is
// suggested only when the server has no such extension (58P01: no control
// file); a concurrent creation (another worker or daemon) is no error.
func ExtensionError(name, where string, err error) error {
	switch sqlState(err) {
	case "23505", "42710": // created at the same moment by someone else
		return nil
	case "58P01":
		return fmt.Errorf("create extension %s on %s: %w (the server has no %s: install the PostgreSQL contrib package on it)", name, where, Classify(err), name)
	}
	return fmt.Errorf("create extension %s on %s: %w", name, where, Classify(err))
}

// ExtensionSchemaName is where pgtenant installs the extensions it uses in a
// maintenance database: a schema of the admin role that nobody else may
// use. Admin sessions resolve unqualified names in pg_catalog only
// (PinnedSettings), so what they use from it they qualify.
const ExtensionSchemaName = "pgtenant"

// createExtensionSQL installs an extension, if missing, in ExtensionSchemaName.
func createExtensionSQL(name string) string {
	return fmt.Sprintf(`CREATE SCHEMA IF NOT EXISTS %[1]s; REVOKE ALL ON SCHEMA %[1]s FROM PUBLIC;
		CREATE EXTENSION IF NOT EXISTS %[2]s SCHEMA %[1]s`, Ident(ExtensionSchemaName), Ident(name))
}

// Querier runs a query returning one row: a pool, a connection or a transaction.
type Querier interface {
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}

// ExtensionTrust reports, for each of names the server has installed
// (pg_available_extension_versions), whether a version of it is trusted:
// one a role without superuser may create. A name it has not got is absent.
func ExtensionTrust(ctx context.Context, q *pgxpool.Pool, names []string) (map[string]bool, error) {
	rows, err := q.Query(ctx, `SELECT name::text, pg_catalog.bool_or(trusted) FROM pg_catalog.pg_available_extension_versions
		WHERE name = ANY($1) GROUP BY name`, names)
	if err != nil {
		return nil, Classify(err)
	}
	out := map[string]bool{}
	for rows.Next() {
		var name string
		var trusted bool
		if err := rows.Scan(&name, &trusted); err != nil {
			return nil, Classify(err)
		}
		out[name] = trusted
	}
	return out, Classify(rows.Err())
}

// ExtensionSchema returns the quoted schema an extension is installed in, in
// the database q is connected to, for qualifying its objects (admin
// sessions resolve unqualified names in pg_catalog only). ErrNotFound: it is
// not installed there.
func ExtensionSchema(ctx context.Context, q Querier, name string) (string, error) {
	var schema string
	err := q.QueryRow(ctx, `SELECT n.nspname FROM pg_catalog.pg_extension e
		JOIN pg_catalog.pg_namespace n ON n.oid = e.extnamespace WHERE e.extname = $1`, name).Scan(&schema)
	if errors.Is(err, pgx.ErrNoRows) {
		return "", fmt.Errorf("extension %s: %w", name, ErrNotFound)
	}
	if err != nil {
		return "", Classify(err)
	}
	return Ident(schema), nil
}
