package cluster

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
)

// Execer runs a statement: a pool, a connection or a transaction.
type Execer interface {
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
}

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

// DropRole drops a role if it exists. DROP OWNED first, in the maintenance
// database, removes its grants there (shared objects).
func DropRole(ctx context.Context, q *pgxpool.Pool, role string) error {
	var exists bool
	if err := q.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = $1)`, role).Scan(&exists); err != nil {
		return Classify(err)
	}
	if !exists {
		return nil
	}
	if _, err := q.Exec(ctx, "DROP OWNED BY "+Ident(role)); err != nil {
		return fmt.Errorf("drop owned by %s: %w", role, Classify(err))
	}
	if _, err := q.Exec(ctx, "DROP ROLE IF EXISTS "+Ident(role)); err != nil {
		return fmt.Errorf("drop role %s: %w", role, Classify(err))
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

// CreateDatabase runs CREATE DATABASE. An existing database is ErrDuplicate.
// strategy "" leaves the server's default; on servers before 15 it is ignored.
func CreateDatabase(ctx context.Context, q *pgxpool.Pool, name, template, owner, strategy string) error {
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

// DropDatabase drops a database if it exists, ending its sessions.
func DropDatabase(ctx context.Context, q *pgxpool.Pool, name string) error {
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
	err := conn.QueryRow(ctx, `SELECT count(*) FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
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
				if err := tx.QueryRow(ctx, `SELECT count(*) FROM pg_locks WHERE pid = pg_backend_pid()`).Scan(&locks); err != nil {
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
	var outside []string
	rows, err := conn.Query(ctx, `
		SELECT DISTINCT pg_describe_object(d.classid, d.objid, d.objsubid)
		FROM pg_depend d
		JOIN pg_class rc ON d.refclassid = 'pg_class'::regclass AND rc.oid = d.refobjid
		JOIN pg_namespace rn ON rn.oid = rc.relnamespace AND rn.nspname = $1
		LEFT JOIN pg_class c ON d.classid = 'pg_class'::regclass AND c.oid = d.objid
		LEFT JOIN pg_rewrite w ON d.classid = 'pg_rewrite'::regclass AND w.oid = d.objid
		LEFT JOIN pg_class wc ON wc.oid = w.ev_class
		LEFT JOIN pg_constraint k ON d.classid = 'pg_constraint'::regclass AND k.oid = d.objid
		LEFT JOIN pg_class kc ON kc.oid = k.conrelid
		WHERE coalesce(c.relnamespace, wc.relnamespace, kc.relnamespace) IS NOT NULL
		  AND coalesce(c.relnamespace, wc.relnamespace, kc.relnamespace) NOT IN (rn.oid, 'pg_toast'::regnamespace)
		LIMIT 10`, schema)
	if err != nil {
		return Classify(err)
	}
	if outside, err = pgx.CollectRows(rows, pgx.RowTo[string]); err != nil {
		return Classify(err)
	}
	if len(outside) > 0 {
		return fmt.Errorf("drop schema %s: %w: %v", schema, ErrOutsideDependents, outside)
	}
	total := -1
	dropped := 0
	for {
		// Relations with the weight of what dropping them takes along,
		// newest first: what depends on a relation was nearly always made
		// after it, so its dependents are gone before CASCADE could reach
		// them. Oldest first, dropping `wide`'s first table (whose serial
		// sequences the T copies' column defaults use) cascaded into every
		// copy's defaults: 20,000+ locks and a 1.3 MB commit in one batch.
		rows, err := conn.Query(ctx, `
			SELECT c.oid::regclass::text, c.relkind::text,
			       1 + (SELECT count(*) FROM pg_index i WHERE i.indrelid = c.oid)
			         + (CASE WHEN c.reltoastrelid <> 0 THEN 2 ELSE 0 END)
			         + (SELECT count(*) FROM pg_depend d WHERE d.refclassid = 'pg_class'::regclass AND d.refobjid = c.oid
			              AND d.classid = 'pg_class'::regclass AND d.deptype IN ('a', 'i')) AS weight,
			       sum(1) OVER () AS remaining
			FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
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
	if _, err := conn.Exec(ctx, "DROP SCHEMA IF EXISTS "+Ident(schema)+" CASCADE"); err != nil {
		return fmt.Errorf("drop schema %s: %w", schema, Classify(err))
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

// CreateExtension installs an extension in the maintenance database if it is missing.
func CreateExtension(ctx context.Context, cl *Cluster, name string) error {
	admin, err := cl.Admin(ctx)
	if err != nil {
		return err
	}
	if _, err := admin.Exec(ctx, "CREATE EXTENSION IF NOT EXISTS "+Ident(name)); err != nil {
		return fmt.Errorf("create extension %s on %s: %w (install the PostgreSQL contrib package)", name, cl.Name(), Classify(err))
	}
	return nil
}
