package analytics

import (
	"bufio"
	"context"
	"database/sql"
	"database/sql/driver"
	"errors"
	"fmt"
	"io"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/duckdb/duckdb-go/v2"
	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgproto3"

	"github.com/pgtenant/pgtenant/internal/catalog"
	"github.com/pgtenant/pgtenant/internal/cluster"
	"github.com/pgtenant/pgtenant/internal/tenant"
)

// stateSchema holds the mirror's own table in its DuckDB file: the applied
// LSN, committed with the data it covers. A tenant schema of that name is
// not mirrored.
const stateSchema = "_pgtenant_mirror"

// mirror is one tenant's mirror run by this daemon.
type mirror struct {
	s      *Service
	id     string
	tables []string
	cancel context.CancelFunc
	done   chan struct{}
	log    interface {
		Info(string, ...any)
		Warn(string, ...any)
	}

	hurry atomic.Bool // a session waits for an LSN: the pending batch is applied without waiting for flush_interval

	mu       sync.Mutex
	source   string            // the cluster/database the mirror reads ("" until it runs)
	db       *sql.DB           // open while the mirror runs; sessions borrow it
	conns    *duckdb.Connector // db's: each tenant statement gets a DuckDB connection of its own
	opened   *duckdb.Connector // the connector of the file open() opened last (the mirror's goroutine only)
	sessions sync.WaitGroup
	applied  pglogrepl.LSN // the file's LSN
	caughtUp pglogrepl.LSN // the mirror holds every change of the tenant up to here (≥ applied)
	lagBytes int64         // received but not yet applied
	pending  time.Time     // commit time of the oldest change not yet applied (zero: none)
	rows     int64
}

// errRecopy: the mirror is made again (its slot is gone, or its tenant
// moved); the error's text says why.
var errRecopy = errors.New("copying again")

// loop runs the mirror until ctx is done, retrying after failures.
func (m *mirror) loop(ctx context.Context) {
	defer close(m.done)
	backoff := 500 * time.Millisecond
	for {
		err := m.run(ctx)
		if ctx.Err() != nil {
			return
		}
		if errors.Is(err, errRecopy) {
			m.log.Warn("analytics mirror copied again", "err", err)
			_ = m.s.Store.AddEvent(ctx, m.s.Store.Pool(), m.id, "analytics", err.Error())
			continue
		}
		m.log.Warn("analytics mirror failed; retrying", "err", err, "backoff", backoff)
		m.report(ctx, StateCopying, m.applied.String(), m.rows, 0, err.Error())
		select {
		case <-ctx.Done():
			return
		case <-time.After(backoff):
		}
		backoff = min(2*backoff, 30*time.Second)
	}
}

// neutralHome is the home directory DuckDB is told: its defaults
// (extension and secret directories) and its error messages would show the
// daemon's own to tenants otherwise.
const neutralHome = "/nonexistent"

// open opens the tenant's DuckDB file with its limits: no external access
// (files, ATTACH, extensions), no extension autoload, no persistent
// secrets, a neutral home directory, the configuration locked so that a
// session cannot lift them.
func (m *mirror) open() (*sql.DB, error) {
	c := m.s.Config
	// storage_compatibility_version=latest: a new file gets DuckDB's
	// current storage format (DICT_FSST strings, …) instead of the v0.10
	// one kept for older readers: no other DuckDB reads these files, and
	// the bench's mirror is less than half the size with it, its string
	// group-bys several times faster. checkpoint_threshold: see
	// checkpointWAL.
	dsn := fmt.Sprintf("%s?threads=%d&memory_limit=%dMB&storage_compatibility_version=latest&checkpoint_threshold=%s&enable_external_access=false&autoload_known_extensions=false&autoinstall_known_extensions=false&allow_community_extensions=false&allow_persistent_secrets=false&home_directory=%s&lock_configuration=true",
		m.s.File(m.id), c.Threads, int64(c.MemoryLimit)>>20, checkpointWAL, neutralHome)
	conn, err := duckdb.NewConnector(dsn, nil)
	if err != nil {
		return nil, fmt.Errorf("open mirror file: %w", err)
	}
	db := sql.OpenDB(conn)
	m.opened = conn
	if _, err := db.Exec(`CREATE SCHEMA IF NOT EXISTS ` + stateSchema + `;
		CREATE TABLE IF NOT EXISTS ` + stateSchema + `.state (lsn UBIGINT NOT NULL, copied BOOLEAN NOT NULL, applied_rows BIGINT NOT NULL, applied_at TIMESTAMPTZ);
		ALTER TABLE ` + stateSchema + `.state ADD COLUMN IF NOT EXISTS source VARCHAR;
		CREATE TABLE IF NOT EXISTS ` + stateSchema + `.resync (tbl VARCHAR NOT NULL, pg_schema VARCHAR NOT NULL, pg_table VARCHAR NOT NULL, until UBIGINT NOT NULL)`); err != nil {
		db.Close()
		return nil, fmt.Errorf("mirror state table: %w", err)
	}
	return db, nil
}

// setDB publishes the open file to sessions (nil: closing; waits for them).
func (m *mirror) setDB(db *sql.DB) {
	m.mu.Lock()
	m.db, m.conns = db, nil
	if db != nil {
		m.conns = m.opened
	}
	m.mu.Unlock()
}

// borrow returns the open file for a session, which calls release when done.
func (m *mirror) borrow() (*sql.DB, func(), bool) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.db == nil {
		return nil, nil, false
	}
	m.sessions.Add(1)
	return m.db, m.sessions.Done, true
}

// connect opens a DuckDB connection of its own on the open file for one
// tenant statement, closed by release: whatever a statement leaves on its
// connection (a transaction, temporary objects, variables, a search path)
// goes with it, and never reaches another statement or the apply.
func (m *mirror) connect(ctx context.Context) (*duckdb.Conn, func(), error) {
	m.mu.Lock()
	if m.db == nil || m.conns == nil {
		m.mu.Unlock()
		return nil, nil, ErrNotHere
	}
	m.sessions.Add(1)
	conns := m.conns
	m.mu.Unlock()
	c, err := conns.Connect(ctx)
	if err != nil {
		m.sessions.Done()
		return nil, nil, err
	}
	return c.(*duckdb.Conn), func() { c.Close(); m.sessions.Done() }, nil
}

func (m *mirror) closeDB(db *sql.DB) {
	m.setDB(nil)
	m.sessions.Wait() // sessions end with the mirror's context (Serve cancels them)
	db.Close()
}

// fileState is what a mirror's file says of itself.
type fileState struct {
	lsn    pglogrepl.LSN // the changes it holds end here
	copied bool          // past its initial copy
	rows   int64
	source string // the cluster/database it was copied from ("": a file of an earlier release)
}

func readState(ctx context.Context, db *sql.DB) (fileState, error) {
	var st fileState
	var l uint64
	var source sql.NullString
	err := db.QueryRowContext(ctx, `SELECT lsn, copied, applied_rows, source FROM `+stateSchema+`.state`).Scan(&l, &st.copied, &st.rows, &source)
	if errors.Is(err, sql.ErrNoRows) {
		return fileState{}, nil
	}
	st.lsn, st.source = pglogrepl.LSN(l), source.String
	return st, err
}

// sourceOf is where a tenant's mirror reads from: its cluster and database.
func sourceOf(t catalog.Tenant) string { return t.Cluster + "/" + t.Database }

// openState opens the file and reads its state. A file DuckDB cannot open
// or whose state it cannot read (corrupt, truncated, another version) is
// removed, with an event, and an empty one made: the mirror is copied
// again. A file held by another process (its lock) is left alone.
func (m *mirror) openState(ctx context.Context) (*sql.DB, fileState, error) {
	db, err := m.open()
	if err == nil {
		st, rerr := readState(ctx, db)
		if rerr == nil {
			return db, st, nil
		}
		db.Close()
		err = fmt.Errorf("read mirror state: %w", rerr)
	}
	if ctx.Err() != nil || strings.Contains(err.Error(), "Could not set lock") {
		return nil, fileState{}, err
	}
	m.log.Warn("analytics mirror file unreadable: copying again", "err", err)
	_ = m.s.Store.AddEvent(ctx, m.s.Store.Pool(), m.id, "analytics", "mirror file unreadable, copying again: "+err.Error())
	if err := m.s.removeFile(m.id); err != nil {
		return nil, fileState{}, err
	}
	db, err = m.open()
	return db, fileState{}, err
}

// moved reports whether the mirror reads from elsewhere than source,
// where its tenant is now.
func (m *mirror) moved(source string) bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.source != "" && source != "" && m.source != source
}

// recopyMoved: the tenant left the cluster and database the file was copied
// from (a move): the slot there goes (a reconcile drops it if that
// cluster cannot be reached now) and the mirror is copied again from
// where the tenant is.
func (m *mirror) recopyMoved(ctx context.Context, from string, t catalog.Tenant) error {
	name, _, _ := strings.Cut(from, "/")
	if old, err := m.s.Clusters.Get(name); err == nil {
		if err := DropSlot(ctx, old, SlotName(m.id)); err != nil {
			m.log.Warn("drop the mirror's slot on the tenant's former cluster", "cluster", name, "err", err)
		}
	}
	if err := m.s.removeFile(m.id); err != nil {
		return err
	}
	return fmt.Errorf("the tenant moved from %s to %s: %w", from, sourceOf(t), errRecopy)
}

// run makes (or resumes) the mirror and streams until an error or ctx.
func (m *mirror) run(ctx context.Context) error {
	t, cl, err := m.s.tenantOf(ctx, m.id)
	if err != nil {
		return err
	}
	m.mu.Lock()
	m.source = sourceOf(t)
	m.mu.Unlock()
	db, st, err := m.openState(ctx)
	if err != nil {
		return err
	}
	lsn, copied, rows := st.lsn, st.copied, st.rows
	if copied && st.source != "" && st.source != sourceOf(t) {
		db.Close()
		return m.recopyMoved(ctx, st.source, t)
	}
	if copied && st.source == "" { // a file of an earlier release: it is the tenant's as it is now
		if _, err := db.ExecContext(ctx, `UPDATE `+stateSchema+`.state SET source = ?`, sourceOf(t)); err != nil {
			db.Close()
			return err
		}
	}
	if copied {
		lost, err := slotLost(ctx, cl, SlotName(m.id))
		if err != nil {
			db.Close()
			return err
		}
		if lost {
			db.Close()
			if err := dropServerSide(ctx, cl, t); err != nil {
				return err
			}
			if err := m.s.removeFile(m.id); err != nil {
				return err
			}
			return fmt.Errorf("the mirror's slot is gone or invalidated: %w", errRecopy)
		}
	} else {
		// A copy that did not finish: start from nothing.
		db.Close()
		if err := DropSlot(ctx, cl, SlotName(m.id)); err != nil {
			return err
		}
		if err := m.s.removeFile(m.id); err != nil {
			return err
		}
		if db, err = m.open(); err != nil {
			return err
		}
	}
	defer m.closeDB(db)
	conn, err := db.Conn(ctx)
	if err != nil {
		return err
	}
	defer conn.Close()
	w := newWriter(conn)

	repl, err := cl.ConnectReplication(ctx, t.Database, paced)
	if err != nil {
		return err
	}
	defer func() { repl.Close(context.WithoutCancel(ctx)) }()
	if !copied {
		if err := m.publication(ctx, cl, t); err != nil {
			return err
		}
		m.report(ctx, StateCopying, "", 0, 0, "")
		res, err := m.s.createSlot(ctx, cl, repl, SlotName(m.id), "the analytics mirror of tenant "+m.id,
			pglogrepl.CreateReplicationSlotOptions{SnapshotAction: "EXPORT_SNAPSHOT", Mode: pglogrepl.LogicalReplication})
		if err != nil {
			return err
		}
		if lsn, err = pglogrepl.ParseLSN(res.ConsistentPoint); err != nil {
			return err
		}
		if rows, err = m.copyAll(ctx, w, cl, t, res.SnapshotName, lsn); err != nil {
			return fmt.Errorf("initial copy: %w", err)
		}
		m.log.Info("analytics mirror copied", "rows", rows, "lsn", lsn)
	}
	m.mu.Lock()
	m.applied, m.rows = lsn, rows
	m.mu.Unlock()
	m.setDB(db)
	m.report(ctx, StateStreaming, lsn.String(), rows, 0, "")
	for {
		err := m.stream(ctx, w, cl, repl, t, lsn)
		if !errors.Is(err, errRestream) {
			return err
		}
		repl.Close(context.WithoutCancel(ctx))
		if repl, err = cl.ConnectReplication(ctx, t.Database, paced); err != nil {
			return err
		}
		if st, err = readState(ctx, db); err != nil {
			return err
		}
		lsn = st.lsn
	}
}

// slotLost reports whether the mirror's slot is missing or invalidated
// (max_slot_wal_keep_size removed WAL it needed).
func slotLost(ctx context.Context, cl *cluster.Cluster, slot string) (bool, error) {
	admin, err := cl.Admin(ctx)
	if err != nil {
		return false, err
	}
	var status string
	err = admin.QueryRow(ctx, `SELECT coalesce(wal_status, '') FROM pg_catalog.pg_replication_slots WHERE slot_name = $1`, slot).Scan(&status)
	if errors.Is(err, pgx.ErrNoRows) {
		return true, nil
	}
	if err != nil {
		return false, fmt.Errorf("read slot %s: %w", slot, cluster.Classify(err))
	}
	return status == "lost", nil
}

// publication makes the tenant's publication: database mode every table
// of its database (or the tables asked for), schema mode its schema.
func (m *mirror) publication(ctx context.Context, cl *cluster.Cluster, t catalog.Tenant) error {
	conn, err := cl.Connect(ctx, t.Database)
	if err != nil {
		return err
	}
	defer conn.Close(context.WithoutCancel(ctx))
	name := SlotName(t.ID)
	var n int
	if err := conn.QueryRow(ctx, `SELECT count(*) FROM pg_catalog.pg_publication WHERE pubname = $1`, name).Scan(&n); err != nil {
		return cluster.Classify(err)
	}
	if n > 0 {
		return nil
	}
	var what string
	switch {
	case len(m.tables) > 0:
		var names []string
		for _, tb := range m.tables {
			parts := strings.SplitN(tb, ".", 2)
			switch {
			case t.Mode == tenant.ModeSchema:
				parts = []string{tenant.PhysicalName(t.ID), tb}
			case len(parts) == 1:
				// As the tenant names it: its own session finds it in
				// public. The admin session's search_path is pg_catalog.
				parts = []string{"public", tb}
			}
			names = append(names, pgx.Identifier(parts).Sanitize())
		}
		what = "FOR TABLE " + strings.Join(names, ", ")
	case t.Mode == tenant.ModeSchema:
		what = "FOR TABLES IN SCHEMA " + cluster.Ident(tenant.PhysicalName(t.ID))
	default:
		what = "FOR ALL TABLES"
	}
	if _, err := conn.Exec(ctx, "CREATE PUBLICATION "+cluster.Ident(name)+" "+what); err != nil {
		return fmt.Errorf("create publication %s: %w", name, cluster.Classify(err))
	}
	return nil
}

// duckSchema is the DuckDB schema of a PostgreSQL one: the tenant's own
// (its schema in schema mode, public in database mode) is DuckDB's main,
// so that the tenant's queries name tables as they do on PostgreSQL.
func duckSchema(t catalog.Tenant, schema string) (string, bool) {
	switch {
	case schema == stateSchema:
		return "", false
	case t.Mode == tenant.ModeSchema && schema == tenant.PhysicalName(t.ID), t.Mode != tenant.ModeSchema && schema == "public":
		return "main", true
	}
	return schema, true
}

type column struct {
	name string
	typ  string // DuckDB type
	key  bool
}

// tableCols is a DuckDB table's columns and their types as DuckDB names
// them (empty: no such table), from the writer's cache when it has them.
func (w *writer) tableCols(ctx context.Context, schema, table string) (map[string]string, error) {
	qt := quoteDuck(schema) + "." + quoteDuck(table)
	if have, ok := w.seen[qt]; ok && have != nil {
		return have, nil
	} else if !ok && w.cols[qt] != nil {
		return w.cols[qt], nil
	}
	rows, err := w.c.QueryContext(ctx, `SELECT column_name, data_type FROM duckdb_columns() WHERE schema_name = ? AND table_name = ? AND database_name = current_database()`, schema, table)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	have := map[string]string{}
	for rows.Next() {
		var c, typ string
		if err := rows.Scan(&c, &typ); err != nil {
			return nil, err
		}
		have[c] = typ
	}
	if err := rows.Err(); err != nil {
		return nil, err
	}
	if w.seen != nil && len(have) > 0 {
		w.seen[qt] = have
	}
	return have, nil
}

// forget drops the writer's cache of a table it changes.
func (w *writer) forget(qt string) {
	if w.seen != nil {
		w.seen[qt] = nil
	}
}

// canon is a DuckDB type as duckdb_columns() names it (REAL is FLOAT …).
func (w *writer) canon(ctx context.Context, typ string) (string, error) {
	if c, ok := w.canons[typ]; ok {
		return c, nil
	}
	var c string
	if err := w.c.QueryRowContext(ctx, "SELECT typeof(CAST(NULL AS "+typ+"))").Scan(&c); err != nil {
		return "", err
	}
	w.canons[typ] = c
	return c, nil
}

// ensureTable creates the table, or adds the columns it lacks.
func ensureTable(ctx context.Context, w *writer, schema, table string, cols []column) error {
	qt := quoteDuck(schema) + "." + quoteDuck(table)
	have, err := w.tableCols(ctx, schema, table)
	if err != nil {
		return err
	}
	missing := false
	for _, c := range cols {
		_, ok := have[c.name]
		missing = missing || !ok
	}
	if !missing {
		return nil
	}
	if schema != "main" {
		if _, err := w.c.ExecContext(ctx, "CREATE SCHEMA IF NOT EXISTS "+quoteDuck(schema)); err != nil {
			return err
		}
	}
	if len(have) == 0 {
		var defs []string
		for _, c := range cols {
			defs = append(defs, quoteDuck(c.name)+" "+c.typ)
		}
		if _, err := w.c.ExecContext(ctx, "CREATE TABLE IF NOT EXISTS "+qt+" ("+strings.Join(defs, ", ")+")"); err != nil {
			return err
		}
	} else {
		for _, c := range cols {
			if _, ok := have[c.name]; !ok {
				if _, err := w.c.ExecContext(ctx, "ALTER TABLE "+qt+" ADD COLUMN "+quoteDuck(c.name)+" "+c.typ); err != nil {
					return err
				}
			}
		}
	}
	w.forget(qt)
	return nil
}

// schemaChanged compares a table as PostgreSQL describes it now with the
// mirror's. Columns dropped on PostgreSQL are dropped here; any other
// difference (a column renamed, retyped or added: an ALTER … TYPE … USING
// or an ADD COLUMN … DEFAULT changes existing rows without a change in
// the stream) reports true: the table is copied again. A table the mirror
// does not have yet is not changed (it is created).
func schemaChanged(ctx context.Context, w *writer, rel *relation, earlier []column) (bool, error) {
	if len(earlier) > 0 {
		return true, nil // the relation changed within the batch
	}
	have, err := w.tableCols(ctx, rel.schema, rel.name)
	if err != nil || len(have) == 0 {
		return false, err
	}
	now := map[string]bool{}
	for _, c := range rel.cols {
		now[c.name] = true
		typ, ok := have[c.name]
		if !ok {
			return true, nil
		}
		want, err := w.canon(ctx, c.typ)
		if err != nil {
			return false, err
		}
		if want != typ {
			return true, nil
		}
	}
	for name := range have {
		if !now[name] {
			if _, err := w.c.ExecContext(ctx, "ALTER TABLE "+rel.quoted()+" DROP COLUMN "+quoteDuck(name)); err != nil {
				return false, err
			}
			w.forget(rel.quoted())
		}
	}
	return false, nil
}

// insertValues inserts rows given as lines of COPY's text format without
// escapes (plainLine) and as text values (nil = NULL): lines, and the rows
// whose values hold no tab, newline or backslash, as one line each
// (insertLines: one value appended per row instead of one per column),
// the others with insertRows.
func insertValues(ctx context.Context, w *writer, schema, table string, cols []column, lines []string, rows [][]*string) error {
	var others [][]*string
	var b strings.Builder
	for _, r := range rows {
		b.Reset()
		plain := len(r) == len(cols)
		for i := 0; plain && i < len(r); i++ {
			if i > 0 {
				b.WriteByte('\t')
			}
			switch {
			case r[i] == nil:
				b.WriteString(`\N`)
			case strings.ContainsAny(*r[i], "\t\n\\"):
				plain = false
			default:
				b.WriteString(*r[i])
			}
		}
		if plain {
			lines = append(lines, b.String())
		} else {
			others = append(others, r)
		}
	}
	if err := insertLines(ctx, w, schema, table, cols, lines); err != nil {
		return err
	}
	return insertRows(ctx, w, quoteDuck(schema)+"."+quoteDuck(table), cols, others)
}

// insertRows inserts rows (text values, nil = NULL) into a DuckDB table:
// appended to a staging table of text columns, then one INSERT … SELECT
// that CASTs each to its column's type.
func insertRows(ctx context.Context, w *writer, qt string, cols []column, rows [][]*string) error {
	if len(rows) == 0 {
		return nil
	}
	stage, err := w.stage(ctx, len(cols), len(rows), textRows(rows))
	if err != nil {
		return err
	}
	names := make([]string, len(cols))
	casts := make([]string, len(cols))
	for i, c := range cols {
		names[i] = quoteDuck(c.name)
		casts[i] = fmt.Sprintf("CAST(c%d AS %s)", i, c.typ)
	}
	_, err = w.c.ExecContext(ctx, "INSERT INTO "+qt+" ("+strings.Join(names, ", ")+") SELECT "+strings.Join(casts, ", ")+" FROM "+stage)
	return err
}

// writer is a mirror's one writing connection: its transactions (explicit,
// so that the appender's rows belong to them) and its staging tables.
type writer struct {
	c      *sql.Conn
	cols   map[string]map[string]string // tables' columns (name → DuckDB type) as of the last commit
	seen   map[string]map[string]string // … and as this transaction left them (nil: changed, read again)
	canons map[string]string            // DuckDB type → its name in duckdb_columns()
	inTxn  bool                         // begun, neither committed nor rolled back
}

func newWriter(c *sql.Conn) *writer {
	return &writer{c: c, cols: map[string]map[string]string{}, canons: map[string]string{}}
}

func (w *writer) begin(ctx context.Context) error {
	w.seen = map[string]map[string]string{}
	_, err := w.c.ExecContext(ctx, "BEGIN TRANSACTION")
	w.inTxn = err == nil
	return err
}

func (w *writer) commit(ctx context.Context) error {
	_, err := w.c.ExecContext(ctx, "COMMIT")
	w.inTxn = err != nil // a COMMIT that failed: rollback makes sure
	if err == nil {
		for qt, cols := range w.seen {
			if cols == nil {
				delete(w.cols, qt)
			} else {
				w.cols[qt] = cols
			}
		}
	}
	return err
}

// rollback ends a transaction that did not commit (after a commit there
// is none to end).
func (w *writer) rollback() {
	if w.inTxn {
		w.inTxn = false
		_, _ = w.c.ExecContext(context.Background(), "ROLLBACK")
	}
}

// textRows fills a staging row from rows of text values (nil = NULL).
func textRows(rows [][]*string) func(int, []driver.Value) {
	return func(i int, vals []driver.Value) {
		r := rows[i]
		for j := range vals {
			vals[j] = nil
			if j < len(r) && r[j] != nil {
				vals[j] = *r[j]
			}
		}
	}
}

// stage makes the staging table of width text columns (c0, c1, …) anew
// and appends n rows to it, each filled by row, in the writer's
// transaction.
func (w *writer) stage(ctx context.Context, width, n int, row func(i int, vals []driver.Value)) (string, error) {
	// Temporary tables live in memory, outside the file and its WAL:
	// staged rows cost nothing at commit. Replacing the table costs less
	// than deleting its rows (3–5 ms of CPU a batch of 1,000 changes:
	// BenchmarkApply).
	name := fmt.Sprintf("pgtenant_stage_%d", width)
	qualified := "temp.main." + name
	defs := make([]string, width)
	for i := range defs {
		defs[i] = fmt.Sprintf("c%d VARCHAR", i)
	}
	if _, err := w.c.ExecContext(ctx, "CREATE OR REPLACE TEMP TABLE "+name+" ("+strings.Join(defs, ", ")+")"); err != nil {
		return "", err
	}
	err := w.c.Raw(func(dc any) error {
		a, err := duckdb.NewAppender(dc.(driver.Conn), "temp", "main", name)
		if err != nil {
			return err
		}
		vals := make([]driver.Value, width)
		for i := range n {
			row(i, vals)
			if err := a.AppendRow(vals...); err != nil {
				a.Close()
				return err
			}
		}
		return a.Close()
	})
	return qualified, err
}

// copyAll copies the publication's tables as of the slot's snapshot into
// the file, one DuckDB transaction per table, and last records the slot's
// consistent point as applied: a crash before that starts again.
func (m *mirror) copyAll(ctx context.Context, w *writer, cl *cluster.Cluster, t catalog.Tenant, snapshot string, lsn pglogrepl.LSN) (int64, error) {
	conn, err := cl.Connect(ctx, t.Database)
	if err != nil {
		return 0, err
	}
	defer conn.Close(context.WithoutCancel(ctx))
	if _, err := conn.Exec(ctx, "BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY"); err != nil {
		return 0, cluster.Classify(err)
	}
	if _, err := conn.Exec(ctx, "SET TRANSACTION SNAPSHOT "+cluster.Literal(snapshot)); err != nil {
		return 0, fmt.Errorf("import the slot's snapshot: %w", cluster.Classify(err))
	}
	type rel struct{ schema, name string }
	relRows, err := conn.Query(ctx, `SELECT schemaname::text, tablename::text FROM pg_catalog.pg_publication_tables WHERE pubname = $1 ORDER BY 1, 2`, SlotName(t.ID))
	if err != nil {
		return 0, fmt.Errorf("list the publication's tables: %w", cluster.Classify(err))
	}
	rels, err := pgx.CollectRows(relRows,
		func(r pgx.CollectableRow) (rel, error) {
			var x rel
			return x, r.Scan(&x.schema, &x.name)
		})
	if err != nil {
		return 0, fmt.Errorf("list the publication's tables: %w", cluster.Classify(err))
	}
	var total int64
	for _, r := range rels {
		schema, ok := duckSchema(t, r.schema)
		if !ok {
			continue
		}
		cols, err := tableColumns(ctx, conn, r.schema, r.name)
		if err != nil {
			return 0, err
		}
		release, err := m.s.pace(ctx, t.Cluster)
		if err != nil {
			return 0, err
		}
		n, err := copyTable(ctx, w, conn, schema, r.schema, r.name, cols)
		release()
		if err != nil {
			return 0, fmt.Errorf("copy %s.%s: %w", r.schema, r.name, err)
		}
		total += n
	}
	if _, err := conn.Exec(ctx, "COMMIT"); err != nil {
		return 0, cluster.Classify(err)
	}
	if err := w.begin(ctx); err != nil {
		return 0, err
	}
	defer w.rollback()
	if _, err := w.c.ExecContext(ctx, `DELETE FROM `+stateSchema+`.state`); err != nil {
		return 0, err
	}
	if _, err := w.c.ExecContext(ctx, `INSERT INTO `+stateSchema+`.state (lsn, copied, applied_rows, applied_at, source) VALUES (?, true, ?, now(), ?)`, uint64(lsn), total, sourceOf(t)); err != nil {
		return 0, err
	}
	if err := w.commit(ctx); err != nil {
		return 0, err
	}
	// The copy is in the file, compressed, and its WAL folded in.
	if _, err := w.c.ExecContext(ctx, "CHECKPOINT"); err != nil {
		return 0, fmt.Errorf("checkpoint the copy: %w", err)
	}
	return total, nil
}

// tableColumns is a table's columns as PostgreSQL has them (in the
// session's snapshot), with their DuckDB types; none: no such table.
func tableColumns(ctx context.Context, conn *pgx.Conn, schema, table string) ([]column, error) {
	colRows, err := conn.Query(ctx, `SELECT a.attname::text, a.atttypid::int8, a.atttypmod FROM pg_catalog.pg_attribute a
		JOIN pg_catalog.pg_class c ON c.oid = a.attrelid JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace
		WHERE n.nspname = $1 AND c.relname = $2 AND a.attnum > 0 AND NOT a.attisdropped AND a.attgenerated = '' ORDER BY a.attnum`, schema, table)
	if err != nil {
		return nil, fmt.Errorf("columns of %s.%s: %w", schema, table, cluster.Classify(err))
	}
	cols, err := pgx.CollectRows(colRows,
		func(row pgx.CollectableRow) (column, error) {
			var c column
			var oid int64
			var mod int32
			err := row.Scan(&c.name, &oid, &mod)
			c.typ = duckType(uint32(oid), mod)
			return c, err
		})
	if err != nil {
		return nil, fmt.Errorf("columns of %s.%s: %w", schema, table, cluster.Classify(err))
	}
	return cols, nil
}

// copyTable copies one table in a DuckDB transaction of its own.
func copyTable(ctx context.Context, w *writer, conn *pgx.Conn, duckSch, schema, table string, cols []column) (int64, error) {
	if err := w.begin(ctx); err != nil {
		return 0, err
	}
	defer w.rollback()
	n, err := copyRows(ctx, w, conn, duckSch, schema, table, cols)
	if err != nil {
		return 0, err
	}
	return n, w.commit(ctx)
}

// copyRows streams one table out with COPY … TO STDOUT (type output
// functions only: no cast a tenant could have defined runs) into DuckDB,
// in the writer's transaction.
func copyRows(ctx context.Context, w *writer, conn *pgx.Conn, duckSch, schema, table string, cols []column) (int64, error) {
	if err := ensureTable(ctx, w, duckSch, table, cols); err != nil {
		return 0, err
	}
	if len(cols) == 0 {
		return 0, nil
	}
	names := make([]string, len(cols))
	for i, c := range cols {
		names[i] = cluster.Ident(c.name)
	}
	pr, copyErr := cluster.CopyOut(ctx, conn.PgConn(), "COPY "+pgx.Identifier{schema, table}.Sanitize()+" ("+strings.Join(names, ", ")+") TO STDOUT", nil)
	qt := quoteDuck(duckSch) + "." + quoteDuck(table)
	// One goroutine reads and sorts the lines while this one inserts the
	// previous batch: the two halves of the copy use both cores. A line
	// without escapes (most) is appended as it is (insertLines);
	// one with escapes is parsed here.
	type copyBatch struct {
		lines []string    // plain
		rows  [][]*string // parsed
	}
	batches := make(chan copyBatch, 1)
	parseErr := make(chan error, 1)
	go func() {
		defer close(batches)
		br := bufio.NewReaderSize(pr, 1<<20)
		var b copyBatch
		for {
			line, err := br.ReadString('\n')
			if err == io.EOF && line == "" {
				break
			}
			if err != nil {
				if err == io.EOF {
					err = io.ErrUnexpectedEOF
				}
				pr.CloseWithError(err) // COPY stops writing
				parseErr <- err
				return
			}
			line = line[:len(line)-1]
			if plainLine(line) {
				b.lines = append(b.lines, line)
			} else {
				b.rows = append(b.rows, parseCopyLine(line))
			}
			if len(b.lines)+len(b.rows) == copyBatchRows {
				select {
				case batches <- b:
				case <-ctx.Done():
					pr.CloseWithError(ctx.Err())
					parseErr <- ctx.Err()
					return
				}
				b = copyBatch{}
			}
		}
		if len(b.lines)+len(b.rows) > 0 {
			batches <- b
		}
		parseErr <- nil
	}()
	var n int64
	var insertErr error
	for b := range batches {
		if insertErr != nil {
			continue // drain: the reader ends with the pipe
		}
		insertErr = insertLines(ctx, w, duckSch, table, cols, b.lines)
		if insertErr == nil {
			insertErr = insertRows(ctx, w, qt, cols, b.rows)
		}
		if insertErr != nil {
			pr.CloseWithError(insertErr)
			continue
		}
		n += int64(len(b.lines) + len(b.rows))
	}
	err := <-parseErr
	cErr := <-copyErr
	switch {
	case insertErr != nil:
		return 0, insertErr
	case cErr != nil:
		return 0, cErr
	case err != nil:
		return 0, err
	}
	return n, nil
}

// insertLines inserts lines of COPY's text format that have no escapes
// (plainLine). Where every column's type has a converter, the lines whose
// fields all convert are appended to the table as they are (appendLines);
// the others are cast by DuckDB (castLines).
func insertLines(ctx context.Context, w *writer, schema, table string, cols []column, lines []string) error {
	if conv := converters(cols); conv != nil && len(lines) > 0 {
		var err error
		if lines, err = appendLines(ctx, w, schema, table, cols, conv, lines); err != nil {
			return err
		}
	}
	return castLines(ctx, w, schema, table, cols, lines)
}

// castLines inserts plain lines through a staging table of one column: in
// DuckDB, each is split on tabs and each field cast to its column's type.
func castLines(ctx context.Context, w *writer, schema, table string, cols []column, lines []string) error {
	if len(lines) == 0 {
		return nil
	}
	stage, err := w.stage(ctx, 1, len(lines), func(i int, vals []driver.Value) { vals[0] = lines[i] })
	if err != nil {
		return err
	}
	names := make([]string, len(cols))
	casts := make([]string, len(cols))
	for i, c := range cols {
		names[i] = quoteDuck(c.name)
		casts[i] = fmt.Sprintf(`CAST(nullif(l[%d], '\N') AS %s)`, i+1, c.typ)
	}
	_, err = w.c.ExecContext(ctx, "INSERT INTO "+quoteDuck(schema)+"."+quoteDuck(table)+" ("+strings.Join(names, ", ")+") SELECT "+strings.Join(casts, ", ")+
		" FROM (SELECT string_split(c0, chr(9)) AS l FROM "+stage+")")
	return err
}

// appendLines appends the lines whose fields all convert (convertLine) to
// the table through DuckDB's appender, in the writer's transaction, and
// returns the others. At 1,000 changes a batch this takes 3.5–4 µs of CPU
// per change off the staged INSERT's (BenchmarkApply).
func appendLines(ctx context.Context, w *writer, schema, table string, cols []column, conv []converter, lines []string) ([]string, error) {
	names := make([]string, len(cols))
	for i, c := range cols {
		names[i] = c.name
	}
	var rest []string
	err := w.c.Raw(func(dc any) error {
		a, err := duckdb.NewAppenderWithColumns(dc.(driver.Conn), "", schema, table, names)
		if err != nil {
			return err
		}
		vals := make([]driver.Value, len(cols))
		for _, l := range lines {
			if !convertLine(l, conv, vals) {
				rest = append(rest, l)
				continue
			}
			if err := a.AppendRow(vals...); err != nil {
				a.Close()
				return err
			}
		}
		return a.Close()
	})
	return rest, err
}

// copyBatchRows is how many rows the copy inserts at a time.
const copyBatchRows = 50000

// markResync records, in the batch's transaction, that tables are to be
// copied again (until 0: not yet): a crash before the copy does it at
// the next start.
func markResync(ctx context.Context, w *writer, rels []*relation) error {
	for _, r := range rels {
		if _, err := w.c.ExecContext(ctx, `DELETE FROM `+stateSchema+`.resync WHERE tbl = ?`, r.quoted()); err != nil {
			return err
		}
		if _, err := w.c.ExecContext(ctx, `INSERT INTO `+stateSchema+`.resync VALUES (?, ?, ?, 0)`, r.quoted(), r.pgSchema, r.name); err != nil {
			return err
		}
	}
	return nil
}

// resyncs reads the tables to skip changes of (until > 0) and those
// waiting for their copy (until 0).
func resyncs(ctx context.Context, w *writer) (skip map[string]pglogrepl.LSN, pending [][2]string, err error) {
	rows, err := w.c.QueryContext(ctx, `SELECT tbl, pg_schema, pg_table, until FROM `+stateSchema+`.resync`)
	if err != nil {
		return nil, nil, err
	}
	defer rows.Close()
	skip = map[string]pglogrepl.LSN{}
	for rows.Next() {
		var tbl, sch, name string
		var until uint64
		if err := rows.Scan(&tbl, &sch, &name, &until); err != nil {
			return nil, nil, err
		}
		if until == 0 {
			pending = append(pending, [2]string{sch, name})
		} else {
			skip[tbl] = pglogrepl.LSN(until)
		}
	}
	return skip, pending, rows.Err()
}

// resync copies one table again, whole, at the snapshot of a temporary
// slot made now, replacing the mirror's in one DuckDB transaction that
// also records the slot's LSN: the stream then skips the table's changes
// that committed before it (the copy has them) and applies the later
// ones. A table gone from PostgreSQL is dropped from the mirror.
func (m *mirror) resync(ctx context.Context, w *writer, cl *cluster.Cluster, t catalog.Tenant, pgSchema, table string) (pglogrepl.LSN, error) {
	release, err := m.s.pace(ctx, t.Cluster)
	if err != nil {
		return 0, err
	}
	defer release()
	repl, err := cl.ConnectReplication(ctx, t.Database, nil)
	if err != nil {
		return 0, err
	}
	defer repl.Close(context.WithoutCancel(ctx))
	res, err := m.s.createSlot(ctx, cl, repl, "pgt_resync_"+t.ID, "the analytics mirror's copy of "+pgSchema+"."+table+" of tenant "+t.ID,
		pglogrepl.CreateReplicationSlotOptions{Temporary: true, SnapshotAction: "EXPORT_SNAPSHOT", Mode: pglogrepl.LogicalReplication})
	if err != nil {
		return 0, err
	}
	lsn, err := pglogrepl.ParseLSN(res.ConsistentPoint)
	if err != nil {
		return 0, err
	}
	conn, err := cl.Connect(ctx, t.Database)
	if err != nil {
		return 0, err
	}
	defer conn.Close(context.WithoutCancel(ctx))
	if _, err := conn.Exec(ctx, "BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY"); err != nil {
		return 0, cluster.Classify(err)
	}
	if _, err := conn.Exec(ctx, "SET TRANSACTION SNAPSHOT "+cluster.Literal(res.SnapshotName)); err != nil {
		return 0, fmt.Errorf("import the slot's snapshot: %w", cluster.Classify(err))
	}
	cols, err := tableColumns(ctx, conn, pgSchema, table)
	if err != nil {
		return 0, err
	}
	duckSch, _ := duckSchema(t, pgSchema)
	qt := quoteDuck(duckSch) + "." + quoteDuck(table)
	if err := w.begin(ctx); err != nil {
		return 0, err
	}
	defer w.rollback()
	if _, err := w.c.ExecContext(ctx, "DROP TABLE IF EXISTS "+qt); err != nil {
		return 0, err
	}
	w.forget(qt)
	var n int64
	if len(cols) > 0 {
		if n, err = copyRows(ctx, w, conn, duckSch, pgSchema, table, cols); err != nil {
			return 0, fmt.Errorf("copy %s.%s again: %w", pgSchema, table, err)
		}
	}
	if _, err := w.c.ExecContext(ctx, `UPDATE `+stateSchema+`.resync SET until = ? WHERE tbl = ?`, uint64(lsn), qt); err != nil {
		return 0, err
	}
	if err := w.commit(ctx); err != nil {
		return 0, err
	}
	_, _ = conn.Exec(ctx, "COMMIT")
	m.log.Info("analytics table copied again after a change of its definition", "table", qt, "rows", n, "lsn", lsn)
	return lsn, nil
}

// checkpointWAL is the size of DuckDB's WAL at which a commit checkpoints
// the file (DuckDB's default is 16MB). A checkpoint compresses what was
// appended since the last one (about 5 µs of CPU per upsert of the bench's
// 22-column table) and rewrites the row groups whose rows were deleted
// (about 1.4 s at 1 M rows, whatever the number of changes): at 64MB the
// apply cost 28 µs per change, at 256MB 19 (BenchmarkApply, 1 M changes).
// The WAL is replayed after a crash (a few seconds at this size), and
// the stream checkpoints when it is idle (idleCheckpoint).
const checkpointWAL = "256MB"

// idleCheckpoint: a mirror that applied changes and then had none for
// this long checkpoints its file, so that the WAL a crash would replay and
// the memory its uncompressed rows take stay small when the tenant rests.
const idleCheckpoint = 5 * time.Second

// keepalive is how often the stream reports its position to the primary.
const keepalive = 5 * time.Second

// errRestream: a batch found tables to copy again (their definition
// changed); the stream starts again from the file's LSN, which copies them
// first, and drops what it had read ahead.
var errRestream = errors.New("tables to copy again")

// streamPace: once a read of the replication stream has emptied the
// socket, the next one waits this long first, so that a stream of small
// transactions wakes the daemon once per pace rather than once per
// transaction. A wake-up (the poller, the scheduler, a read) costs more
// CPU than decoding a change on a busy machine (bench analytics); a batch
// gathers for the flush interval anyway, so the pace adds at most its own
// length to the mirror's lag.
const streamPace = 5 * time.Millisecond

// pacedConn is a replication connection's socket read at streamPace.
type pacedConn struct {
	net.Conn
	drained bool
}

func paced(c net.Conn) net.Conn { return &pacedConn{Conn: c} }

func (c *pacedConn) Read(p []byte) (int, error) {
	if c.drained {
		time.Sleep(streamPace)
	}
	n, err := c.Conn.Read(p)
	c.drained = n < len(p)
	return n, err
}

// receive reads the next replication message, waiting until deadline.
// It sets the connection's read deadline instead of passing a context,
// which would cost a goroutine and a timer per message; a message cut
// off by the deadline is read on at the next call.
func receive(repl *pgconn.PgConn, deadline time.Time) (pgproto3.BackendMessage, error) {
	if err := repl.Conn().SetReadDeadline(deadline); err != nil {
		return nil, err
	}
	return repl.ReceiveMessage(context.Background())
}

// applyResult is what a batch's apply reports to the stream.
type applyResult struct {
	rows int64
	err  error
}

// stream applies the slot's changes from lsn on, a batch of whole
// transactions per DuckDB transaction (with the batch's end LSN), and
// confirms to the primary only what is committed in the file. A batch
// applies while the next one is read: it gathers for the flush interval,
// or for as long as the previous batch takes to apply (larger batches
// share each batch's fixed cost, a scan of the table's keys per
// DELETE … USING and a commit, among more changes).
func (m *mirror) stream(ctx context.Context, w *writer, cl *cluster.Cluster, repl *pgconn.PgConn, t catalog.Tenant, lsn pglogrepl.LSN) error {
	slot := SlotName(t.ID)
	skipUntil, pending, err := resyncs(ctx, w)
	if err != nil {
		return fmt.Errorf("read the tables copied again: %w", err)
	}
	for _, p := range pending { // marked by a batch, not copied yet
		until, err := m.resync(ctx, w, cl, t, p[0], p[1])
		if err != nil {
			return err
		}
		duckSch, _ := duckSchema(t, p[0])
		skipUntil[quoteDuck(duckSch)+"."+quoteDuck(p[1])] = until
	}
	err = pglogrepl.StartReplication(ctx, repl, slot, lsn, pglogrepl.StartReplicationOptions{
		PluginArgs: []string{"proto_version '1'", "publication_names " + cluster.Literal(slot)}})
	if err != nil {
		return fmt.Errorf("start replication: %w", cluster.Classify(err))
	}
	cfg := m.s.Config
	// A cancel ends the wait for the next message at once.
	defer context.AfterFunc(ctx, func() { _ = repl.Conn().SetReadDeadline(time.Now()) })()
	var inflight *batch           // the batch being applied
	var applying chan applyResult // its result; nil while none applies
	defer func() {
		if applying != nil { // it writes with w, which the caller closes
			<-applying
		}
	}()

	rels := map[uint32]*relation{}
	var dec rowDecoder
	b := newBatch(t, rels, skipUntil)
	applied := lsn
	// confirmed is what the primary may forget: applied, or, while
	// nothing is pending, the position its keepalives say it has decoded
	// up to (so that an idle tenant's slot does not hold back the WAL of
	// the whole cluster).
	confirmed := lsn
	var received pglogrepl.LSN // the last change received
	var firstPending time.Time // when b's first transaction arrived
	var uncheckpointed bool    // changes applied since the last idle checkpoint
	var lastApply time.Time    // when the last batch was applied
	nextStatus := time.Now().Add(keepalive)
	publish := func() {
		m.mu.Lock()
		defer m.mu.Unlock()
		m.applied = applied
		m.caughtUp = max(m.caughtUp, confirmed)
		m.lagBytes, m.pending = 0, time.Time{}
		oldest := b
		if inflight != nil {
			oldest = inflight
		}
		if inflight != nil || b.txns > 0 || b.inTxn {
			m.lagBytes = int64(max(received, applied) - applied)
			m.pending = oldest.firstCommit
		}
	}
	status := func() error {
		nextStatus = time.Now().Add(keepalive)
		err := pglogrepl.SendStandbyStatusUpdate(ctx, repl, pglogrepl.StandbyStatusUpdate{WALWritePosition: confirmed, WALFlushPosition: confirmed, WALApplyPosition: confirmed})
		m.mu.Lock()
		lag := m.lagBytes
		m.mu.Unlock()
		m.report(ctx, StateStreaming, applied.String(), m.rowsNow(), lag, "")
		return err
	}
	done := func(res applyResult) error {
		applying = nil
		if res.err != nil {
			return fmt.Errorf("apply changes up to %s: %w", inflight.end, res.err)
		}
		applied = inflight.end
		confirmed = max(confirmed, applied)
		uncheckpointed, lastApply = uncheckpointed || res.rows > 0, time.Now()
		m.mu.Lock()
		m.rows += res.rows
		m.mu.Unlock()
		if len(inflight.resync) > 0 {
			return errRestream
		}
		inflight = nil
		publish()
		return status()
	}
	for {
		if applying != nil {
			select {
			case res := <-applying:
				if err := done(res); err != nil {
					return err
				}
			default:
			}
		}
		// A batch ends only between transactions: the file never holds
		// part of one.
		if applying == nil && b.txns > 0 && !b.inTxn && (b.rows >= cfg.BatchRows || time.Since(firstPending) >= cfg.FlushInterval.D() || m.hurry.Swap(false)) {
			inflight, b, firstPending = b, newBatch(t, rels, skipUntil), time.Time{}
			applying = make(chan applyResult, 1)
			go func(bb *batch, out chan<- applyResult) {
				n, err := bb.apply(ctx, w)
				out <- applyResult{n, err}
			}(inflight, applying)
		}
		if time.Now().After(nextStatus) {
			if err := status(); err != nil {
				return err
			}
		}
		if applying == nil && b.txns == 0 && !b.inTxn && uncheckpointed && time.Since(lastApply) >= idleCheckpoint {
			// A checkpoint fails while a session's query runs: the next
			// idle period tries again.
			if _, err := w.c.ExecContext(ctx, "CHECKPOINT"); err != nil {
				m.log.Info("analytics mirror idle checkpoint: trying again later", "err", err)
				lastApply = time.Now()
			} else {
				uncheckpointed = false
			}
		}
		if err := ctx.Err(); err != nil {
			return err
		}
		if applying != nil && b.rows >= cfg.BatchRows {
			// The next batch is full: the walsender waits for this one.
			select {
			case res := <-applying:
				if err := done(res); err != nil {
					return err
				}
			case <-time.After(time.Until(nextStatus)):
			case <-ctx.Done():
				return ctx.Err()
			}
			continue
		}
		// Wait for the next message until the next status, the end of the
		// batch's window or, while a batch applies, briefly: its end is
		// not a message.
		wait := time.Until(nextStatus)
		switch {
		case applying != nil:
			wait = min(wait, applyPoll)
		case b.txns > 0 && !b.inTxn: // and look for a session's hurry now and then
			wait = min(wait, time.Until(firstPending.Add(cfg.FlushInterval.D())), hurryPoll)
		}
		deadline := time.Now().Add(max(wait, time.Millisecond))
		msg, err := receive(repl, deadline)
		if err != nil {
			if ctx.Err() != nil {
				return ctx.Err()
			}
			if pgconn.Timeout(err) {
				continue
			}
			return fmt.Errorf("receive: %w", err)
		}
		switch msg := msg.(type) {
		case *pgproto3.ErrorResponse:
			return fmt.Errorf("replication: %w", pgconn.ErrorResponseToPgError(msg))
		case *pgproto3.CopyData:
			switch msg.Data[0] {
			case pglogrepl.PrimaryKeepaliveMessageByteID:
				k, err := pglogrepl.ParsePrimaryKeepaliveMessage(msg.Data[1:])
				if err != nil {
					return err
				}
				if applying == nil && b.txns == 0 && !b.inTxn {
					confirmed = max(confirmed, k.ServerWALEnd)
				}
				publish()
				if k.ReplyRequested {
					if err := status(); err != nil {
						return err
					}
				}
			case pglogrepl.XLogDataByteID:
				x, err := pglogrepl.ParseXLogData(msg.Data[1:])
				if err != nil {
					return err
				}
				received = max(received, x.WALStart)
				committed, err := b.addMessage(x.WALData, applied, &dec)
				if err != nil {
					return err
				}
				if committed && firstPending.IsZero() && b.txns > 0 {
					firstPending = time.Now()
					publish()
				}
			}
		}
	}
}

// applyPoll is how often the stream looks for the end of a batch's apply
// while no message comes; hurryPoll, while a batch waits for
// flush_interval, for a session waiting for an LSN (mirror.hurry).
const applyPoll, hurryPoll = 5 * time.Millisecond, 20 * time.Millisecond

func (m *mirror) rowsNow() int64 {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.rows
}
