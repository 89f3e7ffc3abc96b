package move

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"slices"
	"strings"
	"time"

	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5"

	"github.com/pgtenant/pgtenant/internal/cluster"
	"github.com/pgtenant/pgtenant/internal/config"
	"github.com/pgtenant/pgtenant/internal/jobs"
	"github.com/pgtenant/pgtenant/internal/sandbox"
	"github.com/pgtenant/pgtenant/internal/tenant"
)

// paceEvery is how much COPY data goes between two asks to the pacer: the
// WAL it makes on the target (heap, indexes, TOAST: about two to three
// times as much) is what a standby may fall behind by before the next ask.
const paceEvery = 4 << 20

// copyParameter is what the target's copy session sets that the agent may
// not set by itself: granted to the agent for the copy only.
const copyParameter = "session_replication_role"

// copy copies the tenant's rows to the target itself, paced, then
// subscribes the target from the point they were copied at. A
// subscription's own initial copy (table-sync workers) cannot be paced:
// it wrote the whole tenant as fast as the disks went, and the target's
// standbys fell gigabytes behind.
//
// The slot is made over a replication connection with an exported
// snapshot; each published table is read with COPY … TO STDOUT in that
// snapshot on the source (an admin session: only type output functions
// run) and written with COPY … FROM STDIN on the target, every paceEvery
// bytes after the pacer let it on both clusters (the target's standbys
// replay the copy, the source's carry the tenant's writes). The
// replication connection stays open, idle, until the copy ends: the
// snapshot lives as long as it does. Then the subscription is made on
// that slot without a copy of its own.
//
// The target's COPY sets off tenant code (CHECKs, defaults, generated
// columns, index expressions): it runs in the tenant's agent session as
// the tenant's role, with session_replication_role = replica (the
// tenant's ordinary triggers and foreign keys do not fire; its ALWAYS and
// REPLICA triggers are disabled since the schema step), like the apply
// worker that follows it.
//
// Not resumable halfway: the rows go in one transaction, and an attempt
// that starts again (a daemon killed mid-copy, a lost connection) drops
// what an earlier one left — subscription, slot — and copies again.
func (m *mover) copy(ctx context.Context, r *jobs.Run, e *env) error {
	if e.switched {
		return nil
	}
	ctx, cancel := context.WithTimeout(ctx, cmp.Or(m.s.CopyTimeout, 6*time.Hour))
	defer cancel()
	name := Name(e.t.ID)
	dconn, err := e.dst.Connect(ctx, e.t.Database)
	if err != nil {
		return err
	}
	defer dconn.Close(context.WithoutCancel(ctx))
	if err := dropSubscription(ctx, dconn, name); err != nil {
		return err
	}
	if err := dropSlot(ctx, e.src, name); err != nil {
		return err
	}
	// The sentinel is not copied: empty on both sides at the snapshot.
	sentinel := cluster.Ident(SentinelSchema) + "." + cluster.Ident(e.role)
	if _, err := dconn.Exec(ctx, "TRUNCATE "+sentinel); err != nil {
		return cluster.Classify(err)
	}
	sconn, err := e.src.Connect(ctx, e.t.Database)
	if err != nil {
		return err
	}
	defer sconn.Close(context.WithoutCancel(ctx))
	if _, err := sconn.Exec(ctx, "DELETE FROM "+sentinel); err != nil {
		return cluster.Classify(err)
	}

	repl, err := e.src.ConnectReplication(ctx, e.t.Database, nil)
	if err != nil {
		return err
	}
	defer repl.Close(context.WithoutCancel(ctx))
	// Making the slot waits for the source's running transactions
	// (anyone's): past pacer.slot_wait, the tenants' sessions that hold it
	// up are ended, and any other blocker sends the job back to the queue
	// (jobs.Later: a wait on the operator, not one of its attempts).
	r.Note(ctx, "making slot "+name+" on "+e.src.Name()+" (it waits for the transactions running there)")
	slot, err := e.src.CreateSlot(ctx, repl, name,
		pglogrepl.CreateReplicationSlotOptions{SnapshotAction: "EXPORT_SNAPSHOT", Mode: pglogrepl.LogicalReplication},
		cluster.SlotWait{Bound: r.SlotWait(e.src.Name()), For: "the move of tenant " + e.t.ID, TenantOf: tenant.IDFromPhysical,
			Record: m.record})
	var blocked *cluster.SlotBlockedError
	if errors.As(err, &blocked) {
		return jobs.Later(err)
	}
	if err != nil {
		return err
	}
	began := time.Now()
	rows, bytes, err := m.copyRows(ctx, r, e, sconn, slot.SnapshotName)
	if err != nil {
		return err
	}
	// The snapshot is no longer needed; the slot stays for the subscription.
	repl.Close(ctx)
	took := time.Since(began)
	r.Note(ctx, fmt.Sprintf("copied %s (%s) of tenant %s in %s; subscribing %s from %s", count(rows, "row"), mbs(bytes), e.t.ID, took.Round(time.Millisecond), e.dst.Name(), slot.ConsistentPoint))
	if err := m.createSubscription(ctx, e, dconn); err != nil {
		return err
	}
	m.s.Logger.Info("tenant copied", "component", "move", "tenant", e.t.ID, "from", e.src.Name(), "to", e.dst.Name(),
		"rows", rows, "bytes", bytes, "took", took, "lsn", slot.ConsistentPoint)
	return nil
}

type table struct {
	schema, name string
	size         int64
	columns      []string
	// binary: the COPY may be in binary format, cheaper to write and read
	// than text: every column is of a built-in type with binary I/O, and
	// both ends run the same PostgreSQL (a scratch instance restored from
	// the cluster it is copied into). A type made in the database has
	// another oid on the other end, which arrays and composites carry.
	binary bool
}

func (t table) ident() string { return cluster.Ident(t.schema) + "." + cluster.Ident(t.name) }

func (t table) columnList() string {
	var b strings.Builder
	for i, c := range t.columns {
		if i > 0 {
			b.WriteString(", ")
		}
		b.WriteString(cluster.Ident(c))
	}
	return b.String()
}

// copyRows copies every table of the move's publication from the source
// (sconn, which imports the slot's snapshot) to the target in one
// transaction of the tenant's agent session. It returns the rows and the
// bytes of COPY data copied.
func (m *mover) copyRows(ctx context.Context, r *jobs.Run, e *env, sconn *pgx.Conn, snapshot string) (int64, int64, error) {
	if _, err := sconn.Exec(ctx, "BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY"); err != nil {
		return 0, 0, cluster.Classify(err)
	}
	defer sconn.Exec(context.WithoutCancel(ctx), "ROLLBACK")
	if _, err := sconn.Exec(ctx, "SET TRANSACTION SNAPSHOT "+cluster.Literal(snapshot)); err != nil {
		return 0, 0, fmt.Errorf("import the slot's snapshot: %w", cluster.Classify(err))
	}
	rows, err := sconn.Query(ctx, `SELECT n.nspname::text, c.relname::text, pg_catalog.pg_table_size(c.oid),
			coalesce((SELECT pg_catalog.array_agg(a.attname::text ORDER BY a.attnum) FROM pg_catalog.pg_attribute a
				WHERE a.attrelid = c.oid AND a.attnum > 0 AND NOT a.attisdropped AND a.attgenerated = ''), '{}')
		FROM pg_catalog.pg_publication_tables t
		JOIN pg_catalog.pg_namespace n ON n.nspname = t.schemaname
		JOIN pg_catalog.pg_class c ON c.relnamespace = n.oid AND c.relname = t.tablename
		WHERE t.pubname = $1 AND t.schemaname <> $2 ORDER BY 1, 2`, Name(e.t.ID), SentinelSchema)
	if err != nil {
		return 0, 0, fmt.Errorf("list the tables to copy: %w", cluster.Classify(err))
	}
	tables, err := pgx.CollectRows(rows, func(row pgx.CollectableRow) (table, error) {
		var t table
		return t, row.Scan(&t.schema, &t.name, &t.size, &t.columns)
	})
	if err != nil {
		return 0, 0, fmt.Errorf("list the tables to copy: %w", cluster.Classify(err))
	}
	var total int64
	for _, t := range tables {
		total += t.size
	}
	if err := missingOnTarget(ctx, e, tables); err != nil {
		return 0, 0, err
	}

	dadmin, err := e.dst.Admin(ctx)
	if err != nil {
		return 0, 0, err
	}
	agent := cluster.Ident(tenant.AgentRole(e.t.ID))
	if _, err := dadmin.Exec(ctx, "GRANT SET ON PARAMETER "+copyParameter+" TO "+agent); err != nil {
		return 0, 0, cluster.Classify(err)
	}
	defer revokeCopyParameter(context.WithoutCancel(ctx), dadmin, e.t.ID, e.t.Database)
	sess, err := m.s.Agents.Open(ctx, e.dst, sandbox.TargetOf(e.t), "pgtenant move copy")
	if err != nil {
		return 0, 0, err
	}
	defer sess.Close(context.WithoutCancel(ctx))
	tx, err := sess.Conn().Begin(ctx)
	if err != nil {
		return 0, 0, cluster.Classify(err)
	}
	defer tx.Rollback(context.WithoutCancel(ctx))
	// The setting before the role: the agent holds the grant, not the tenant.
	setup := "SET LOCAL " + copyParameter + " = replica; SET LOCAL ROLE " + cluster.Ident(e.role)
	if len(tables) > 0 {
		// What an earlier attempt's subscription may have applied goes,
		// and the COPYs below may FREEZE (a table truncated in their
		// transaction).
		idents := make([]string, len(tables))
		for i, t := range tables {
			idents[i] = t.ident()
		}
		setup += "; TRUNCATE ONLY " + strings.Join(idents, ", ")
	}
	if _, err := tx.Exec(ctx, setup); err != nil {
		return 0, 0, fmt.Errorf("prepare the copy of tenant %s on %s: %w", e.t.ID, e.dst.Name(), cluster.Classify(err))
	}
	p := &pacer{ctx: ctx, r: r, clusters: []string{e.src.Name(), e.dst.Name()}, total: total}
	var copied int64
	for i, t := range tables {
		p.msg = fmt.Sprintf("copying tenant %s from %s to %s", e.t.ID, e.src.Name(), e.dst.Name())
		p.table = fmt.Sprintf("table %d of %d (%s)", i+1, len(tables), t.ident())
		n, err := copyTable(ctx, sconn, tx.Conn(), t, p)
		if err != nil {
			return 0, 0, fmt.Errorf("copy %s of tenant %s from %s to %s: %w", t.ident(), e.t.ID, e.src.Name(), e.dst.Name(), err)
		}
		copied += n
		p.rows = copied
	}
	if err := crashPoint(ctx, "copy:rows"); err != nil {
		return 0, 0, err
	}
	if err := tx.Commit(ctx); err != nil {
		return 0, 0, fmt.Errorf("commit the copy of tenant %s on %s: %w", e.t.ID, e.dst.Name(), cluster.Classify(err))
	}
	if _, err := sconn.Exec(ctx, "COMMIT"); err != nil {
		return 0, 0, cluster.Classify(err)
	}
	return copied, p.n, nil
}

// missingOnTarget refuses the move, for good, when a table or a column the
// copy would carry is not on the target: the tenant changed its tables
// after the schema step (a retry would fail the same way). Moving it again
// dumps the schema again.
func missingOnTarget(ctx context.Context, e *env, tables []table) error {
	dconn, err := e.dst.Connect(ctx, e.t.Database)
	if err != nil {
		return err
	}
	defer dconn.Close(context.WithoutCancel(ctx))
	var missing []string
	for _, t := range tables {
		var have []string
		if err := dconn.QueryRow(ctx, `SELECT coalesce(pg_catalog.array_agg(a.attname::text), '{}')
			FROM pg_catalog.pg_attribute a JOIN pg_catalog.pg_class c ON c.oid = a.attrelid
			JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace
			WHERE n.nspname = $1 AND c.relname = $2 AND a.attnum > 0 AND NOT a.attisdropped`, t.schema, t.name).Scan(&have); err != nil {
			return cluster.Classify(err)
		}
		if len(have) == 0 {
			missing = append(missing, t.ident())
			continue
		}
		for _, col := range t.columns {
			if !slices.Contains(have, col) {
				missing = append(missing, t.ident()+"."+cluster.Ident(col))
			}
		}
	}
	if len(missing) == 0 {
		return nil
	}
	return jobs.Permanent(fmt.Errorf("%w: tenant %s changed its tables during the move (%s not on %s); move it again once its schema holds still",
		ErrRefused, e.t.ID, strings.Join(missing, ", "), e.dst.Name()))
}

// copyTable pipes one table's COPY out of the source into the target's COPY.
func copyTable(ctx context.Context, src, dst *pgx.Conn, t table, p *pacer) (int64, error) {
	cols := t.columnList()
	to, from := "", " WITH (FREEZE)"
	if t.binary {
		to, from = " WITH (FORMAT binary)", " WITH (FORMAT binary, FREEZE)"
	}
	pr, done := cluster.CopyOut(ctx, src.PgConn(), fmt.Sprintf("COPY %s (%s) TO STDOUT%s", t.ident(), cols, to),
		func(w io.Writer) io.Writer { p.w = w; return p })
	// FREEZE (the table was truncated in this transaction): the rows go in
	// frozen and the pages all-visible. Without it, the first reads after
	// the commit (the apply worker's, the tenant's, autovacuum's) set hint
	// bits on every page, and with data checksums each of those writes a
	// full page to the WAL: the whole copy again, unpaced.
	tag, err := dst.PgConn().CopyFrom(ctx, pr, fmt.Sprintf("COPY %s (%s) FROM STDIN%s", t.ident(), cols, from))
	pr.CloseWithError(errors.New("the target's COPY ended")) // a writer still blocked gives up
	srcErr := <-done
	// The target's error first: when the source failed, the target's COPY
	// ends with the source's error; when the target failed (a CHECK, a
	// type), the source only says that the target stopped reading.
	if err != nil {
		return 0, fmt.Errorf("write to the target: %w", cluster.Classify(err))
	}
	if srcErr != nil {
		return 0, fmt.Errorf("read from the source: %w", srcErr)
	}
	return tag.RowsAffected(), nil
}

// pacer is the writer between the two COPYs: every paceEvery bytes it
// waits for the pacer's budget on both clusters and records the progress.
type pacer struct {
	ctx      context.Context
	r        *jobs.Run
	clusters []string
	w        io.Writer
	n, next  int64  // bytes written; when to ask next
	total    int64  // the tables' size on the source: an estimate
	rows     int64  // rows of the tables done (for the note at the end)
	msg      string // what is copied: "copying tenant … to …"
	table    string // the table being copied: "table 2 of 3 (s.t)"
}

func (p *pacer) Write(b []byte) (int, error) {
	if p.n >= p.next {
		for _, c := range p.clusters {
			release, err := p.r.Pace(p.ctx, c, jobs.Light)
			if err != nil {
				return 0, err
			}
			release()
		}
		p.next = p.n + paceEvery
		total := max(p.total, p.n)
		p.r.Progress(p.ctx, p.n, total, copyProgress(p.msg, p.n, total, p.table))
	}
	n, err := p.w.Write(b)
	p.n += int64(n)
	return n, err
}

// copyProgress is the copy's progress line: the COPY data written so far
// against the tables' size on the source (an estimate: the COPY text is
// larger or smaller than the pages), and the table being copied. It counts
// bytes, not rows: the rows of a table are known only once it is done.
func copyProgress(msg string, copied, total int64, table string) string {
	return fmt.Sprintf("%s: %s of about %s copied, %s", msg, mbs(copied), mbs(total), table)
}

func mbs(n int64) string { return config.ByteSize(n).Human() }

// count says n things: "1 row", "45 rows".
func count(n int64, thing string) string {
	if n == 1 {
		return "1 " + thing
	}
	return fmt.Sprintf("%d %ss", n, thing)
}

// revokeCopyParameter takes back from the tenant's agent the setting the
// copy needed, and the role settings tenant code in the copy's session
// could have made of it while it held it (idempotent; nothing to do
// without the agent).
func revokeCopyParameter(ctx context.Context, admin cluster.Execer, id, database string) error {
	agent := tenant.AgentRole(id)
	_, err := admin.Exec(ctx, fmt.Sprintf(`DO $$ BEGIN
			IF EXISTS (SELECT 1 FROM pg_catalog.pg_roles WHERE rolname = %[1]s) THEN
				REVOKE SET ON PARAMETER %[2]s FROM %[3]s;
				ALTER ROLE %[3]s RESET %[2]s;
				IF EXISTS (SELECT 1 FROM pg_catalog.pg_database WHERE datname = %[4]s) THEN
					ALTER ROLE %[3]s IN DATABASE %[5]s RESET %[2]s;
				END IF;
			END IF;
		END $$`, cluster.Literal(agent), copyParameter, cluster.Ident(agent), cluster.Literal(database), cluster.Ident(database)))
	return cluster.Classify(err)
}

// dropSubscription drops the move's subscription on the target, if there
// is one, without touching the source (its slot is dropSlot's).
func dropSubscription(ctx context.Context, dconn *pgx.Conn, name string) error {
	var exists bool
	if err := dconn.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM pg_catalog.pg_subscription WHERE subname = $1)`, name).Scan(&exists); err != nil {
		return cluster.Classify(err)
	}
	if !exists {
		return nil
	}
	id := cluster.Ident(name)
	for _, stmt := range []string{"ALTER SUBSCRIPTION " + id + " DISABLE", "ALTER SUBSCRIPTION " + id + " SET (slot_name = NONE)", "DROP SUBSCRIPTION " + id} {
		if _, err := dconn.Exec(ctx, stmt); err != nil {
			return fmt.Errorf("drop subscription %s: %w", name, cluster.Classify(err))
		}
	}
	return nil
}

// dropSlot drops the move's slot on the source. A slot still in use (by
// the walsender of a connection that an interrupted attempt left, or of a
// subscription just disabled) has its walsender ended first.
func dropSlot(ctx context.Context, cl *cluster.Cluster, name string) error {
	admin, err := cl.Admin(ctx)
	if err != nil {
		return err
	}
	for range 100 {
		var active bool
		err := admin.QueryRow(ctx, `SELECT active FROM pg_catalog.pg_replication_slots WHERE slot_name = $1`, name).Scan(&active)
		if errors.Is(err, pgx.ErrNoRows) {
			return nil
		}
		if err != nil {
			return fmt.Errorf("read slot %s on %s: %w", name, cl.Name(), cluster.Classify(err))
		}
		if active {
			_, err = admin.Exec(ctx, `SELECT pg_catalog.pg_terminate_backend(active_pid) FROM pg_catalog.pg_replication_slots WHERE slot_name = $1 AND active_pid IS NOT NULL`, name)
		} else {
			_, err = admin.Exec(ctx, `SELECT pg_catalog.pg_drop_replication_slot($1)`, name)
		}
		if err != nil && !strings.Contains(err.Error(), "does not exist") && !strings.Contains(err.Error(), "is active") {
			return fmt.Errorf("drop slot %s on %s: %w", name, cl.Name(), cluster.Classify(err))
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(50 * time.Millisecond):
		}
	}
	return fmt.Errorf("slot %s on %s is still in use", name, cl.Name())
}

// record adds an event to a tenant's history: a session of another tenant
// that the slot's wait ended (cluster.CreateSlot).
func (m *mover) record(ctx context.Context, id, kind string, detail map[string]any) error {
	return m.s.Store.AddEvent(ctx, m.s.Store.Pool(), id, kind, detail)
}
