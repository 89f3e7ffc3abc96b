package metrics

import (
	"context"
	"fmt"
	"slices"
	"sort"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgtenant/pgtenant/internal/catalog"
	"github.com/pgtenant/pgtenant/internal/cluster"
	"github.com/pgtenant/pgtenant/internal/tenant"
)

// sampleResult is what one pass read from a cluster, by tenant id.
type sampleResult struct {
	counters map[string]counters
	conns    map[string]Connections
	sizes    map[string]int64
	files    *int64 // relation files, when sampled
	queries  int
	// statistics and sizing: the time the counters' and the sizes' queries took.
	statistics, sizing time.Duration
}

// The statistics queries. Each reads one cluster-wide (or shared-database-
// wide) view in shared memory: their cost grows with the databases and the
// relations of the shared databases, never with a round trip per tenant.
const (
	// Every database; tenants are picked out in Go. tup_returned is what
	// scans returned; written rows are inserts, updates and deletes.
	databaseStatsSQL = `
		SELECT datname, xact_commit, xact_rollback, tup_returned, tup_inserted + tup_updated + tup_deleted,
		       blks_hit, blks_read, temp_bytes, deadlocks, sessions, (active_time * 1000)::bigint
		FROM pg_stat_database WHERE datname LIKE 't\_%'`
	// Per-schema sums over the relations of one shared database, as
	// pg_stat_user_tables and pg_statio_user_tables count them (rows read
	// by scans and fetched through indexes, rows written; blocks of the
	// tables, their indexes and TOAST) but read straight from the
	// statistics functions: those views' joins cost a third more at 2,000
	// schema tenants (222k relations), for the same figures.
	schemaStatsSQL = `
		SELECT n.nspname,
		       pg_catalog.sum(CASE WHEN c.relkind IN ('r', 'm', 'p') THEN pg_catalog.pg_stat_get_tuples_returned(c.oid) + pg_catalog.pg_stat_get_tuples_fetched(c.oid)
		                           ELSE pg_catalog.pg_stat_get_tuples_fetched(c.oid) END)::bigint,
		       pg_catalog.sum(CASE WHEN c.relkind IN ('r', 'm', 'p') THEN pg_catalog.pg_stat_get_tuples_inserted(c.oid) + pg_catalog.pg_stat_get_tuples_updated(c.oid)
		                           + pg_catalog.pg_stat_get_tuples_deleted(c.oid) ELSE 0 END)::bigint,
		       pg_catalog.sum(pg_catalog.pg_stat_get_blocks_hit(c.oid)
		                      + coalesce(pg_catalog.pg_stat_get_blocks_hit(x.toast) + pg_catalog.pg_stat_get_blocks_hit(x.tidx), 0))::bigint,
		       pg_catalog.sum(pg_catalog.pg_stat_get_blocks_fetched(c.oid) - pg_catalog.pg_stat_get_blocks_hit(c.oid)
		                      + coalesce(pg_catalog.pg_stat_get_blocks_fetched(x.toast) - pg_catalog.pg_stat_get_blocks_hit(x.toast)
		                                 + pg_catalog.pg_stat_get_blocks_fetched(x.tidx) - pg_catalog.pg_stat_get_blocks_hit(x.tidx), 0))::bigint
		FROM pg_catalog.pg_class c JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace
		LEFT JOIN LATERAL (SELECT c.reltoastrelid AS toast, i.indexrelid AS tidx FROM pg_catalog.pg_index i
		                   WHERE i.indrelid = c.reltoastrelid) x ON c.reltoastrelid <> 0
		WHERE n.nspname = ANY($1) AND c.relkind IN ('r', 'm', 'p', 'i')
		GROUP BY n.nspname`
	// Client sessions of tenant roles, by role and state: bounded by
	// max_connections, not by the number of tenants.
	sessionsSQL = `
		SELECT usename, state, count(*)::int FROM pg_stat_activity
		WHERE backend_type = 'client backend' AND usename LIKE 't\_%' AND state IS NOT NULL
		GROUP BY usename, state`
	// Sizes stat every file of a database: only the tenants whose turn it is.
	// A tenant's role settings (ALTER ROLE <self> SET, up to 1 GB each) live
	// in a shared catalog, outside any database: they count too.
	databaseSizesSQL = `
		SELECT d.datname, pg_catalog.pg_database_size(d.oid) + coalesce((SELECT pg_catalog.sum(pg_catalog.pg_column_size(s.*))
			FROM pg_catalog.pg_db_role_setting s JOIN pg_catalog.pg_roles r ON r.oid = s.setrole WHERE r.rolname = d.datname), 0)::bigint
		FROM pg_catalog.pg_database d WHERE d.datname = ANY($1)`
	// Relation files under base/ (superuser or pg_read_server_files).
	relationFilesSQL = `SELECT count(*) FROM pg_database d, pg_ls_dir('base/' || d.oid, true, false) f`
)

// schemaSizesSQL is a schema tenant's size: the files of its relations, its
// catalog rows and its large objects (the database's size counts all of
// these for a database tenant).
//
// Files: main fork and segments, free space and visibility maps, init
// forks, TOAST and indexes (what pg_total_relation_size adds up; only the
// forks a relation can have: forks), of the relations in its
// schema and of the temporary relations its sessions made (by owner: they
// live in pg_temp_N), stat'ed without opening the relations:
// pg_total_relation_size takes ACCESS SHARE on each, and a tenant holding
// ACCESS EXCLUSIVE on its own table would keep its size, and so its quota,
// from ever being measured.
//
// Catalog: every row that a tenant's DDL makes and whose size it controls,
// in the catalogs where it can be large or numerous — its relations and
// their columns, defaults, indexes, rules and views, triggers, policies,
// statistics (ANALYZE's pg_statistic grows with its columns and statistics
// target), constraints, routines (bodies and settings), types and enum
// labels, operators, text search dictionaries, and the comments on all of
// them — each as pg_column_size of the row plus 40 bytes (its line pointer
// and index entries, roughly); an empty table with 1,600 columns has no
// data file but about 250 kB of catalog. Large objects: those it owns
// (pg_largeobject is per database, outside its schema). Role settings, as
// for database tenants. Nothing takes a lock.
//
// The schema's objects are reached through the catalogs' indexes, never by
// a scan of a catalog by namespace (no catalog index leads with it, and a
// shared database of 3,000 schema tenants has 480k pg_class rows): what
// records a dependency on the schema in pg_depend (relations, routines,
// types, operators, dictionaries) and, from those, what hangs on them
// (indexes, TOAST, row and array types, multiranges, constraints, enum
// labels), each checked to be in the schema; temporary relations through
// their owner's pg_shdepend rows. schemaObjectsByScan, in the tests, is
// the same set by namespace and owner: both give the same sizes.
var schemaSizesSQL = schemaSizes(schemaObjectsByDependency)

// schemaSizes is the size query over a definition of a schema tenant's
// objects: CTEs relations (name, oid, relkind, relpersistence), its
// relations, TOAST and indexes included, and owned (name, classid, objid,
// bytes), its other catalog rows, given tenants (name, nsp, role).
func schemaSizes(objects string) string {
	return `
		WITH RECURSIVE tenants AS (
			SELECT n.nspname AS name, n.oid AS nsp, coalesce((SELECT r.oid FROM pg_catalog.pg_roles r WHERE r.rolname = n.nspname), 0) AS role
			FROM pg_catalog.pg_namespace n WHERE n.nspname = ANY($1)
		),` + objects + `,
		files (name, path, seg, size) AS (
			SELECT r.name, p.path || f.suffix, 0, (pg_catalog.pg_stat_file(p.path || f.suffix, true)).size
			FROM relations r, LATERAL (SELECT pg_catalog.pg_relation_filepath(r.oid) AS path) p, (VALUES (''), ('_fsm'), ('_vm'), ('_init')) f (suffix)
			WHERE r.relkind IN ('r', 'm', 'S', 'i', 't') AND p.path IS NOT NULL` + forks + `
			UNION ALL
			SELECT name, path, seg + 1, (pg_catalog.pg_stat_file(path || '.' || (seg + 1), true)).size
			FROM files WHERE size >= 1073741824
		),
		objects (name, classid, objid, bytes) AS (
			SELECT r.name, 'pg_catalog.pg_class'::pg_catalog.regclass, c.oid, pg_catalog.pg_column_size(c.*) FROM relations r JOIN pg_catalog.pg_class c ON c.oid = r.oid
			UNION ALL SELECT r.name, 0, 0, pg_catalog.pg_column_size(a.*) FROM relations r JOIN pg_catalog.pg_attribute a ON a.attrelid = r.oid
			UNION ALL SELECT r.name, 0, 0, pg_catalog.pg_column_size(d.*) FROM relations r JOIN pg_catalog.pg_attrdef d ON d.adrelid = r.oid
			UNION ALL SELECT r.name, 0, 0, pg_catalog.pg_column_size(i.*) FROM relations r JOIN pg_catalog.pg_index i ON i.indexrelid = r.oid
			UNION ALL SELECT r.name, 'pg_catalog.pg_rewrite'::pg_catalog.regclass, w.oid, pg_catalog.pg_column_size(w.*) FROM relations r JOIN pg_catalog.pg_rewrite w ON w.ev_class = r.oid
			UNION ALL SELECT r.name, 'pg_catalog.pg_trigger'::pg_catalog.regclass, g.oid, pg_catalog.pg_column_size(g.*) FROM relations r JOIN pg_catalog.pg_trigger g ON g.tgrelid = r.oid
			UNION ALL SELECT r.name, 'pg_catalog.pg_policy'::pg_catalog.regclass, p.oid, pg_catalog.pg_column_size(p.*) FROM relations r JOIN pg_catalog.pg_policy p ON p.polrelid = r.oid
			UNION ALL SELECT r.name, 0, 0, pg_catalog.pg_column_size(s.*) FROM relations r JOIN pg_catalog.pg_statistic s ON s.starelid = r.oid
			UNION ALL SELECT r.name, 'pg_catalog.pg_statistic_ext'::pg_catalog.regclass, x.oid, pg_catalog.pg_column_size(x.*)
				+ coalesce((SELECT pg_catalog.sum(pg_catalog.pg_column_size(xd.*)) FROM pg_catalog.pg_statistic_ext_data xd WHERE xd.stxoid = x.oid), 0)::int
			FROM relations r JOIN pg_catalog.pg_statistic_ext x ON x.stxrelid = r.oid
			UNION ALL SELECT t.name, 'pg_catalog.pg_namespace'::pg_catalog.regclass, t.nsp, 0 FROM tenants t
			UNION ALL SELECT name, classid, objid, bytes FROM owned
			UNION ALL SELECT t.name, 'pg_catalog.pg_largeobject'::pg_catalog.regclass, m.oid, pg_catalog.pg_column_size(m.*)
				+ coalesce((SELECT pg_catalog.sum(pg_catalog.pg_column_size(l.*) + 40) FROM pg_catalog.pg_largeobject l WHERE l.loid = m.oid), 0)::int
			FROM tenants t JOIN pg_catalog.pg_largeobject_metadata m ON m.lomowner = t.role
		),
		catalog (name, bytes) AS (
			SELECT o.name, o.bytes + CASE WHEN o.bytes > 0 THEN 40 ELSE 0 END FROM objects o
			UNION ALL
			SELECT o.name, pg_catalog.pg_column_size(d.*) + 40 FROM objects o JOIN pg_catalog.pg_description d ON d.classoid = o.classid AND d.objoid = o.objid
			WHERE o.objid <> 0
			UNION ALL
			SELECT t.name, pg_catalog.pg_column_size(s.*) + 40 FROM tenants t JOIN pg_catalog.pg_db_role_setting s ON s.setrole = t.role
		)
		SELECT t.name, (coalesce(f.bytes, 0) + coalesce(c.bytes, 0))::bigint
		FROM tenants t
		LEFT JOIN (SELECT name, pg_catalog.sum(size) AS bytes FROM files GROUP BY name) f ON f.name = t.name
		LEFT JOIN (SELECT name, pg_catalog.sum(bytes) AS bytes FROM catalog GROUP BY name) c ON c.name = t.name`
}

// forks leaves out the forks a relation cannot have, a third of the files
// to stat: a sequence has neither free space nor visibility map, an index
// no visibility map, and only an unlogged relation has an init fork.
const forks = `
				AND (f.suffix = '' OR (f.suffix = '_fsm' AND r.relkind <> 'S') OR (f.suffix = '_vm' AND r.relkind IN ('r', 'm', 't'))
					OR (f.suffix = '_init' AND r.relpersistence = 'u'))`

// schemaObjectsByDependency: see schemaSizesSQL.
const schemaObjectsByDependency = `
		depends AS (
			SELECT DISTINCT t.name, t.nsp, d.classid, d.objid FROM tenants t
			JOIN pg_catalog.pg_depend d ON d.refclassid = 'pg_catalog.pg_namespace'::pg_catalog.regclass AND d.refobjid = t.nsp AND d.refobjsubid = 0
		),
		tables AS (
			SELECT o.name, o.nsp, c.oid, c.reltype, c.relkind, c.relpersistence, c.reltoastrelid FROM depends o
			JOIN pg_catalog.pg_class c ON c.oid = o.objid AND c.relnamespace = o.nsp
			WHERE o.classid = 'pg_catalog.pg_class'::pg_catalog.regclass
		),
		temps AS (
			SELECT DISTINCT t.name, c.oid, c.relkind, c.relpersistence, c.reltoastrelid FROM tenants t
			JOIN pg_catalog.pg_shdepend s ON s.refclassid = 'pg_catalog.pg_authid'::pg_catalog.regclass AND s.refobjid = t.role
				AND s.classid = 'pg_catalog.pg_class'::pg_catalog.regclass AND s.deptype = 'o'
				AND s.dbid = (SELECT oid FROM pg_catalog.pg_database WHERE datname = pg_catalog.current_database())
			JOIN pg_catalog.pg_class c ON c.oid = s.objid AND c.relowner = t.role AND c.relpersistence = 't'
		),
		heaps (name, oid, relkind, relpersistence, reltoastrelid) AS (
			SELECT name, oid, relkind, relpersistence, reltoastrelid FROM tables
			UNION ALL SELECT name, oid, relkind, relpersistence, reltoastrelid FROM temps
			UNION ALL SELECT y.name, c.oid, c.relkind, c.relpersistence, c.reltoastrelid FROM types y
			JOIN pg_catalog.pg_type t ON t.oid = y.oid JOIN pg_catalog.pg_class c ON c.oid = t.typrelid
			WHERE c.relkind = 'c' AND c.relnamespace = y.nsp
		),
		relations (name, oid, relkind, relpersistence) AS (
			SELECT name, oid, relkind, relpersistence FROM heaps
			UNION
			SELECT h.name, x.oid, x.relkind, x.relpersistence FROM heaps h JOIN pg_catalog.pg_index i ON i.indrelid = h.oid JOIN pg_catalog.pg_class x ON x.oid = i.indexrelid
			UNION
			SELECT h.name, x.oid, x.relkind, x.relpersistence FROM heaps h JOIN pg_catalog.pg_class x ON x.oid = h.reltoastrelid
			UNION
			SELECT h.name, x.oid, x.relkind, x.relpersistence FROM heaps h
			JOIN pg_catalog.pg_index i ON i.indrelid = h.reltoastrelid JOIN pg_catalog.pg_class x ON x.oid = i.indexrelid
			WHERE h.reltoastrelid <> 0
		),
		bases (name, nsp, oid) AS (
			SELECT name, nsp, objid FROM depends WHERE classid = 'pg_catalog.pg_type'::pg_catalog.regclass
			UNION SELECT name, nsp, reltype FROM tables WHERE reltype <> 0
		),
		ranges (name, nsp, oid) AS (
			SELECT name, nsp, oid FROM bases
			UNION SELECT b.name, b.nsp, g.rngmultitypid FROM bases b JOIN pg_catalog.pg_range g ON g.rngtypid = b.oid
		),
		types (name, nsp, oid) AS (
			SELECT y.name, y.nsp, t.oid FROM ranges y JOIN pg_catalog.pg_type t ON t.oid = y.oid AND t.typnamespace = y.nsp
			UNION SELECT y.name, y.nsp, a.oid FROM ranges y JOIN pg_catalog.pg_type t ON t.oid = y.oid
			JOIN pg_catalog.pg_type a ON a.oid = t.typarray AND a.typnamespace = y.nsp
		),
		owned (name, classid, objid, bytes) AS (
			SELECT y.name, 'pg_catalog.pg_type'::pg_catalog.regclass, t.oid, pg_catalog.pg_column_size(t.*) FROM types y JOIN pg_catalog.pg_type t ON t.oid = y.oid
			UNION ALL SELECT y.name, 0, 0, pg_catalog.pg_column_size(e.*) FROM types y JOIN pg_catalog.pg_enum e ON e.enumtypid = y.oid
			UNION ALL SELECT k.name, 'pg_catalog.pg_constraint'::pg_catalog.regclass, k.oid, k.bytes FROM (
				SELECT r.name, c.oid, pg_catalog.pg_column_size(c.*) AS bytes FROM tables r JOIN pg_catalog.pg_constraint c ON c.conrelid = r.oid AND c.connamespace = r.nsp
				UNION SELECT y.name, c.oid, pg_catalog.pg_column_size(c.*) FROM types y JOIN pg_catalog.pg_constraint c ON c.conrelid = 0 AND c.contypid = y.oid AND c.connamespace = y.nsp) k
			UNION ALL SELECT o.name, o.classid, p.oid, pg_catalog.pg_column_size(p.*) FROM depends o JOIN pg_catalog.pg_proc p ON p.oid = o.objid AND p.pronamespace = o.nsp
			WHERE o.classid = 'pg_catalog.pg_proc'::pg_catalog.regclass
			UNION ALL SELECT o.name, o.classid, x.oid, pg_catalog.pg_column_size(x.*) FROM depends o JOIN pg_catalog.pg_operator x ON x.oid = o.objid AND x.oprnamespace = o.nsp
			WHERE o.classid = 'pg_catalog.pg_operator'::pg_catalog.regclass
			UNION ALL SELECT o.name, o.classid, x.oid, pg_catalog.pg_column_size(x.*) FROM depends o JOIN pg_catalog.pg_ts_dict x ON x.oid = o.objid AND x.dictnamespace = o.nsp
			WHERE o.classid = 'pg_catalog.pg_ts_dict'::pg_catalog.regclass
		)`

// statisticsShare is how many schema tenants of a shared database have
// their activity counters read in one pass: the statistics functions run
// for each of their relations (about 0.2 ms a schema tenant of the saas
// template). A shared database with more has them read in turns, a share
// a pass: each tenant's every few passes, its rates over that longer span.
const statisticsShare = 1000

// sample reads the statistics of every tenant of a cluster (of the schema
// tenants of a large shared database, pass's share: statisticsShare) and
// the sizes of the tenants in sizeTurn.
func sample(ctx context.Context, cl *cluster.Cluster, rows []catalog.MetricTenant, sizeTurn []catalog.MetricTenant, withFiles bool, pass int) (sampleResult, error) {
	res := sampleResult{counters: map[string]counters{}, conns: map[string]Connections{}, sizes: map[string]int64{}}
	admin, err := cl.Admin(ctx)
	if err != nil {
		return res, err
	}
	byPhysical := map[string]catalog.MetricTenant{}
	shared := map[string][]catalog.MetricTenant{} // shared database → its schema tenants
	for _, r := range rows {
		if !measured(r.State) {
			continue
		}
		byPhysical[tenant.PhysicalName(r.ID)] = r
		if r.Mode == tenant.ModeSchema {
			shared[r.Database] = append(shared[r.Database], r)
		}
	}

	// Database tenants: one query over pg_stat_database.
	began := time.Now()
	res.queries++
	statsSQL := databaseStatsSQL
	if h, _ := cl.LastProbeResult(); h.VersionNum > 0 && h.VersionNum < 140000 {
		// No session statistics before 14: client activity is seen only in writes.
		statsSQL = strings.Replace(statsSQL, "sessions, (active_time * 1000)::bigint", "0::bigint, 0::bigint", 1)
	}
	dbRows, err := admin.Query(ctx, statsSQL)
	if err != nil {
		return res, fmt.Errorf("read pg_stat_database of %s: %w", cl.Name(), cluster.Classify(err))
	}
	for dbRows.Next() {
		var name string
		var k counters
		if err := dbRows.Scan(&name, &k.Commits, &k.Rollbacks, &k.RowsRead, &k.RowsWritten, &k.BlksHit, &k.BlksRead, &k.TempBytes, &k.Deadlocks, &k.Sessions, &k.ActiveMicros); err != nil {
			dbRows.Close()
			return res, err
		}
		if t, ok := byPhysical[name]; ok && t.Mode == tenant.ModeDatabase && t.Database == name {
			res.counters[t.ID] = k
		}
	}
	if err := dbRows.Err(); err != nil {
		return res, cluster.Classify(err)
	}

	// Sessions: one query over pg_stat_activity.
	res.queries++
	sRows, err := admin.Query(ctx, sessionsSQL)
	if err != nil {
		return res, fmt.Errorf("read pg_stat_activity of %s: %w", cl.Name(), cluster.Classify(err))
	}
	for sRows.Next() {
		var role, state string
		var n int
		if err := sRows.Scan(&role, &state, &n); err != nil {
			sRows.Close()
			return res, err
		}
		t, ok := byPhysical[tenant.TenantRole(role)] // its own login or one of its extra ones
		if !ok {
			continue
		}
		c := res.conns[t.ID]
		switch state {
		case "active", "fastpath function call":
			c.Active += n
		case "idle in transaction", "idle in transaction (aborted)":
			c.IdleInTransaction += n
		default:
			c.Idle += n
		}
		res.conns[t.ID] = c
	}
	if err := sRows.Err(); err != nil {
		return res, cluster.Classify(err)
	}

	// Schema tenants: one statistics query per shared database.
	names := make([]string, 0, len(shared))
	for db := range shared {
		names = append(names, db)
	}
	sort.Strings(names)
	for _, db := range names {
		pool, err := cl.Pool(ctx, db)
		if err != nil {
			return res, err
		}
		turn := statisticsTurn(shared[db], pass)
		schemas := make([]string, len(turn))
		for i, t := range turn {
			schemas[i] = tenant.PhysicalName(t.ID)
		}
		res.queries++
		if err := schemaStats(ctx, pool, schemas, byPhysical, res.counters); err != nil {
			return res, fmt.Errorf("read table statistics of %s/%s: %w", cl.Name(), db, err)
		}
		for _, t := range turn {
			if _, ok := res.counters[t.ID]; !ok {
				res.counters[t.ID] = counters{} // a schema without tables has no statistics rows
			}
		}
	}

	res.statistics = time.Since(began)

	// Sizes of this pass's turn: one query for the databases, one per shared database.
	began = time.Now()
	var dbNames []string
	schemas := map[string][]string{}
	for _, t := range sizeTurn {
		if t.Mode == tenant.ModeSchema {
			schemas[t.Database] = append(schemas[t.Database], tenant.PhysicalName(t.ID))
		} else {
			dbNames = append(dbNames, t.Database)
		}
	}
	if len(dbNames) > 0 {
		res.queries++
		if err := sizes(ctx, admin, databaseSizesSQL, dbNames, byPhysical, res.sizes); err != nil {
			return res, fmt.Errorf("database sizes on %s: %w", cl.Name(), err)
		}
	}
	for _, db := range names {
		if len(schemas[db]) == 0 {
			continue
		}
		pool, err := cl.Pool(ctx, db)
		if err != nil {
			return res, err
		}
		res.queries++
		if err := sizes(ctx, pool, schemaSizesSQL, schemas[db], byPhysical, res.sizes); err != nil {
			return res, fmt.Errorf("schema sizes in %s/%s: %w", cl.Name(), db, err)
		}
	}
	res.sizing = time.Since(began)
	if withFiles {
		res.queries++
		var n int64
		if err := admin.QueryRow(ctx, relationFilesSQL).Scan(&n); err != nil {
			n = -1 // not superuser: unknown
		}
		res.files = &n
	}
	return res, nil
}

// statisticsTurn is the share of a shared database's schema tenants whose
// counters pass reads: all of them up to statisticsShare, else every n-th
// by id, n the number of shares, starting at pass's.
func statisticsTurn(tenants []catalog.MetricTenant, pass int) []catalog.MetricTenant {
	n := (len(tenants) + statisticsShare - 1) / statisticsShare
	if n <= 1 {
		return tenants
	}
	sorted := slices.SortedFunc(slices.Values(tenants), func(a, b catalog.MetricTenant) int { return strings.Compare(a.ID, b.ID) })
	var turn []catalog.MetricTenant
	for i := pass % n; i < len(sorted); i += n {
		turn = append(turn, sorted[i])
	}
	return turn
}

func schemaStats(ctx context.Context, pool *pgxpool.Pool, schemas []string, byPhysical map[string]catalog.MetricTenant, out map[string]counters) error {
	// Planned for its schemas on each pass (QueryExecModeExec: an unnamed
	// statement). A prepared statement turns generic after five passes, and
	// the generic plan, which guesses a few schemas for any array, sorts the
	// relations for the GROUP BY: at 1,000 schema tenants that sort spilled
	// 3.7 MB to temp files on every pass, with parallel workers, where the
	// plan for the real array aggregates 1,000 groups in memory.
	rows, err := pool.Query(ctx, schemaStatsSQL, pgx.QueryExecModeExec, schemas)
	if err != nil {
		return cluster.Classify(err)
	}
	defer rows.Close()
	for rows.Next() {
		var schema string
		var k counters
		if err := rows.Scan(&schema, &k.RowsRead, &k.RowsWritten, &k.BlksHit, &k.BlksRead); err != nil {
			return err
		}
		if t, ok := byPhysical[schema]; ok && t.Mode == tenant.ModeSchema {
			out[t.ID] = k
		}
	}
	return cluster.Classify(rows.Err())
}

// sizes runs a (name, bytes) query over names and maps the names to tenants.
// A database dropped between the catalog read and the query is just absent.
// If the batch fails (a database dropped mid-query), each name is retried
// alone and the failing ones are skipped.
func sizes(ctx context.Context, pool *pgxpool.Pool, sql string, names []string, byPhysical map[string]catalog.MetricTenant, out map[string]int64) error {
	err := sizeBatch(ctx, pool, sql, names, byPhysical, out)
	if err == nil || len(names) == 1 || ctx.Err() != nil {
		return err
	}
	for _, n := range names {
		_ = sizeBatch(ctx, pool, sql, []string{n}, byPhysical, out)
	}
	return ctx.Err()
}

// sizeTimeout bounds one size query: a batch that takes longer is retried
// tenant by tenant (sizes), so that whatever one tenant does makes only its
// own size stale, never the pass fail.
const sizeTimeout = 10 * time.Second

// sizeWorkMem is the size query's work_mem. It reads each tenant's catalog
// rows twice (sizes, then comments), so PostgreSQL keeps them in a
// tuplestore: about 100 bytes for each of a schema tenant's ~1,000 rows
// (its columns, mostly). Under the server's default 4 MB, a batch of 50
// tenants wrote that store to a temp file on every pass (4.4 MB at 25
// tables a tenant).
const sizeWorkMem = 64 << 20

func sizeBatch(ctx context.Context, pool *pgxpool.Pool, sql string, names []string, byPhysical map[string]catalog.MetricTenant, out map[string]int64) error {
	got := map[string]int64{}
	err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		// The plan for catalogs in memory: the tenants' few thousand rows
		// probed through the catalogs' indexes, not merge joins that read
		// whole indexes of a shared database's hundreds of thousands of
		// relations (a third of the query's time at 2,000 schema tenants).
		// The catalog rows it sums are kept in memory too (sizeWorkMem).
		if _, err := tx.Exec(ctx, fmt.Sprintf("SET LOCAL statement_timeout = %d; SET LOCAL enable_mergejoin = off; SET LOCAL random_page_cost = 1.1; SET LOCAL work_mem = '%dkB'",
			sizeTimeout.Milliseconds(), sizeWorkMem>>10)); err != nil {
			return err
		}
		rows, err := tx.Query(ctx, sql, names)
		if err != nil {
			return err
		}
		defer rows.Close()
		for rows.Next() {
			var name string
			var n *int64
			if err := rows.Scan(&name, &n); err != nil {
				return err
			}
			if t, ok := byPhysical[name]; ok && n != nil {
				got[t.ID] = *n
			}
		}
		return rows.Err()
	})
	if err != nil {
		return cluster.Classify(err)
	}
	for id, n := range got {
		out[id] = n
	}
	return nil
}
