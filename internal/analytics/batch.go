package analytics

import (
	"context"
	"fmt"
	"strings"
	"time"

	"github.com/jackc/pglogrepl"

	"github.com/pgtenant/pgtenant/internal/catalog"
)

// relation is a table as the latest Relation message describes it.
type relation struct {
	schema, name string // DuckDB's
	pgSchema     string // PostgreSQL's
	skip         bool   // not mirrored (the state schema)
	cols         []column
	keyCols      []column // cols' key columns
}

// keyless: the table has no key narrower than the whole row (REPLICA
// IDENTITY FULL, where every column is flagged, or no identity at all,
// where none is and only inserts can come). Its changes are applied in
// order, one row at a time for deletes: two equal rows stay two rows.
func (r *relation) keyless() bool {
	keys := 0
	for _, c := range r.cols {
		if c.key {
			keys++
		}
	}
	return keys == 0 || keys == len(r.cols)
}

func (r *relation) quoted() string { return quoteDuck(r.schema) + "." + quoteDuck(r.name) }

// entry is the net effect of a batch on one key of one table.
type entry struct {
	kind  int // upsert, remove, patch
	cols  []column
	vals  []*string
	line  string    // an upsert whose values hold no tab, newline or backslash: them as one line of COPY's text format (vals nil)
	key   []column  // the key columns and values the row had in the file
	keyV  []*string //
	known []bool    // patch: the columns whose values are known ('u' = unchanged TOAST is not)
	// fresh: the batch's first change of the key inserted it, so the file
	// has no row of it: nothing to delete. (A key's row is in the file
	// exactly when it was in the table at the file's LSN, and the batch
	// starts there.)
	fresh bool
}

const (
	upsert = iota
	remove
	patch
)

// tableBatch is a batch's changes to one table.
type tableBatch struct {
	rel       *relation
	allCols   map[string]column // every column any change of the batch carries
	truncated bool              // a TRUNCATE came: all rows before it go
	entries   map[string]*entry
	order     []string
	ops       []op // keyless tables: the changes in stream order
}

// op is one change to a keyless table: a row inserted or deleted (an
// update is both).
type op struct {
	del  bool
	cols []column
	vals []*string
}

// batch gathers whole transactions; apply writes them in one DuckDB
// transaction with the end LSN of the last.
type batch struct {
	t      catalog.Tenant
	rels   map[uint32]*relation
	tables map[uint32]*tableBatch
	order  []uint32
	txns   int
	rows   int
	end    pglogrepl.LSN
	inTxn  bool
	skip   bool          // a transaction the file holds already
	txnLSN pglogrepl.LSN // the commit LSN of the transaction being read
	// skipUntil: per DuckDB table, changes of transactions that committed
	// before this LSN are in the table already (it was copied again at a
	// snapshot of that LSN). It outlives batches.
	skipUntil map[string]pglogrepl.LSN
	// resync: tables whose PostgreSQL definition changed in a way the
	// mirror cannot follow change by change; apply leaves them out and
	// the stream copies them again.
	resync []*relation
	// firstCommit is the commit time of the batch's first transaction.
	firstCommit time.Time
}

// newBatch starts a batch; rels are the stream's relations (they outlive
// batches: a Relation message comes once per relation per stream, and
// again only when it changes).
func newBatch(t catalog.Tenant, rels map[uint32]*relation, skipUntil map[string]pglogrepl.LSN) *batch {
	return &batch{t: t, rels: rels, tables: map[uint32]*tableBatch{}, skipUntil: skipUntil}
}

// skipped: the change belongs to a transaction that a later copy of the
// table holds already.
func (b *batch) skipped(rel *relation) bool {
	until, ok := b.skipUntil[rel.quoted()]
	return ok && b.txnLSN < until
}

func (b *batch) table(id uint32) (*tableBatch, error) {
	rel, ok := b.rels[id]
	if !ok {
		return nil, fmt.Errorf("change to relation %d before its Relation message", id)
	}
	tb, ok := b.tables[id]
	if !ok {
		tb = &tableBatch{allCols: map[string]column{}, entries: map[string]*entry{}}
		b.tables[id] = tb
		b.order = append(b.order, id)
	}
	if tb.rel != rel {
		tb.rel = rel
		for _, c := range rel.cols {
			tb.allCols[c.name] = c
		}
	}
	return tb, nil
}

// add takes one pgoutput message; it reports a commit.
func (b *batch) add(msg pglogrepl.Message, applied pglogrepl.LSN) (bool, error) {
	switch msg := msg.(type) {
	case *pglogrepl.BeginMessage:
		b.inTxn = true
		b.txnLSN = msg.FinalLSN
		b.skip = msg.FinalLSN < applied // committed before the file's LSN: applied already
		if !b.skip && b.txns == 0 {
			b.firstCommit = msg.CommitTime
		}
	case *pglogrepl.CommitMessage:
		b.inTxn = false
		if !b.skip {
			b.txns++
			b.end = msg.TransactionEndLSN
		}
		return !b.skip, nil
	case *pglogrepl.RelationMessage:
		schema, ok := duckSchema(b.t, msg.Namespace)
		r := &relation{schema: schema, name: msg.RelationName, pgSchema: msg.Namespace, skip: !ok}
		for _, c := range msg.Columns {
			r.cols = append(r.cols, column{name: c.Name, typ: duckType(c.DataType, c.TypeModifier), key: c.Flags&1 == 1})
			if c.Flags&1 == 1 {
				r.keyCols = append(r.keyCols, r.cols[len(r.cols)-1])
			}
		}
		b.rels[msg.RelationID] = r
	case *pglogrepl.InsertMessage:
		return false, b.row('I', msg.RelationID, nil, msg.Tuple)
	case *pglogrepl.UpdateMessage:
		return false, b.row('U', msg.RelationID, msg.OldTuple, msg.NewTuple)
	case *pglogrepl.DeleteMessage:
		return false, b.row('D', msg.RelationID, msg.OldTuple, nil)
	case *pglogrepl.TruncateMessage:
		if b.skip {
			return false, nil
		}
		for _, id := range msg.RelationIDs {
			if rel, ok := b.rels[id]; ok && b.skipped(rel) {
				continue
			}
			tb, err := b.table(id)
			if err != nil {
				return false, err
			}
			tb.truncated, tb.entries, tb.order, tb.ops = true, map[string]*entry{}, nil, nil
		}
	}
	return false, nil
}

// addMessage takes one pgoutput message as it came from the stream; it
// reports a commit. Row messages, most of a stream, are decoded by d
// without a copy of each value.
func (b *batch) addMessage(data []byte, applied pglogrepl.LSN, d *rowDecoder) (bool, error) {
	if len(data) > 0 && (data[0] == 'I' || data[0] == 'U' || data[0] == 'D') {
		rel, old, new, err := d.decode(data)
		if err != nil {
			return false, fmt.Errorf("decode pgoutput: %w", err)
		}
		return false, b.row(data[0], rel, old, new)
	}
	msg, err := pglogrepl.Parse(data)
	if err != nil {
		return false, fmt.Errorf("decode pgoutput: %w", err)
	}
	return b.add(msg, applied)
}

// row takes an Insert, Update or Delete (kind I, U, D) of a relation.
func (b *batch) row(kind byte, relID uint32, old, new *pglogrepl.TupleData) error {
	if kind == 'U' && old == nil {
		if rel, ok := b.rels[relID]; ok && rel.keyless() {
			old = new // every column is the key, and none changed
		}
	}
	return b.change(relID, kind == 'I', old, new)
}

func values(t *pglogrepl.TupleData) (vals []*string, known []bool) {
	if t == nil {
		return nil, nil
	}
	vals, known = make([]*string, len(t.Columns)), make([]bool, len(t.Columns))
	for i, c := range t.Columns {
		switch c.DataType {
		case 't':
			v := string(c.Data)
			vals[i], known[i] = &v, true
		case 'n':
			known[i] = true
		}
	}
	return vals, known
}

// keyOf is the key of a row: its key columns' values (NULL for those
// the tuple lacks), and as one string.
func (r *relation) keyOf(t *pglogrepl.TupleData) (string, []*string) {
	var b strings.Builder
	kv := make([]*string, 0, len(r.keyCols))
	for i, c := range r.cols {
		if !c.key {
			continue
		}
		var v *string
		if i < len(t.Columns) && t.Columns[i].DataType == 't' {
			s := string(t.Columns[i].Data)
			v = &s
		}
		kv = append(kv, v)
		if v == nil {
			b.WriteString("\x01")
		} else {
			b.WriteString(*v)
		}
		b.WriteString("\x00")
	}
	return b.String(), kv
}

// tupleLine is a whole row as one line of COPY's text format, when none
// of its values holds a tab, newline or backslash (insertLines); whole
// reports that no value is an unchanged TOAST one.
func tupleLine(t *pglogrepl.TupleData) (line string, plain, whole bool) {
	n := 0
	for _, c := range t.Columns {
		n += len(c.Data) + 2
	}
	buf := make([]byte, 0, n)
	plain, whole = true, true
	for i, c := range t.Columns {
		if i > 0 {
			buf = append(buf, '\t')
		}
		switch c.DataType {
		case 'n':
			buf = append(buf, `\N`...)
		case 't':
			for _, ch := range c.Data {
				plain = plain && ch != '\t' && ch != '\n' && ch != '\\'
			}
			buf = append(buf, c.Data...)
		default: // 'u': unchanged TOAST
			plain, whole = false, false
		}
	}
	if !plain {
		return "", false, whole
	}
	return string(buf), true, true
}

// values is an entry's values, from its line if it has one.
func (e *entry) values() []*string {
	if e.vals == nil && e.line != "" {
		return parseCopyLine(e.line)
	}
	return e.vals
}

func (b *batch) change(relID uint32, insert bool, old, new *pglogrepl.TupleData) error {
	if b.skip {
		return nil
	}
	tb, err := b.table(relID)
	if err != nil {
		return err
	}
	if tb.rel.skip || b.skipped(tb.rel) {
		return nil
	}
	b.rows++
	cols := tb.rel.cols
	if tb.rel.keyless() {
		oldV, _ := values(old)
		newV, known := values(new)
		if old != nil {
			tb.ops = append(tb.ops, op{del: true, cols: cols, vals: oldV})
		}
		if new != nil {
			for i := range newV { // unchanged TOAST: the old image has it (FULL logs it whole)
				if !known[i] && i < len(oldV) {
					newV[i] = oldV[i]
				}
			}
			tb.ops = append(tb.ops, op{cols: cols, vals: newV})
		}
		return nil
	}
	set := func(k string, e *entry) {
		if prev, ok := tb.entries[k]; ok {
			e.fresh = prev.fresh
		} else {
			tb.order = append(tb.order, k)
			e.fresh = insert
		}
		tb.entries[k] = e
	}
	if new == nil { // delete
		k, kv := tb.rel.keyOf(old)
		set(k, &entry{kind: remove, key: tb.rel.keyCols, keyV: kv})
		return nil
	}
	k, kv := tb.rel.keyOf(new)
	kc := tb.rel.keyCols
	if old != nil {
		if ok, okv := tb.rel.keyOf(old); ok != k {
			set(ok, &entry{kind: remove, key: kc, keyV: okv}) // the key changed: the old row goes
		}
	}
	// Most changes are whole rows of plain values: one line each, not a
	// string per value.
	line, plain, whole := tupleLine(new)
	if plain && len(new.Columns) == len(cols) {
		set(k, &entry{kind: upsert, cols: cols, line: line, key: kc, keyV: kv})
		return nil
	}
	newV, known := values(new)
	prev := tb.entries[k]
	switch {
	case whole:
		set(k, &entry{kind: upsert, cols: cols, vals: newV, key: kc, keyV: kv})
	case prev != nil && prev.kind != remove: // merge what changed into the earlier image
		merged := &entry{kind: prev.kind, cols: cols, vals: make([]*string, len(cols)), known: make([]bool, len(cols)), key: prev.key, keyV: prev.keyV}
		byName := map[string]int{}
		for i, c := range prev.cols {
			byName[c.name] = i
		}
		prevV := prev.values()
		for i, c := range cols {
			if known[i] {
				merged.vals[i], merged.known[i] = newV[i], true
			} else if j, ok := byName[c.name]; ok && (prev.kind == upsert || prev.known[j]) {
				merged.vals[i], merged.known[i] = prevV[j], true
			}
		}
		set(k, merged)
	default: // unchanged TOAST values stay as the file has them
		set(k, &entry{kind: patch, cols: cols, vals: newV, known: known, key: kc, keyV: kv})
	}
	return nil
}

// apply writes the batch and its end LSN in one DuckDB transaction and
// returns the rows it changed.
func (b *batch) apply(ctx context.Context, w *writer) (int64, error) {
	if err := w.begin(ctx); err != nil {
		return 0, err
	}
	defer w.rollback()
	var n int64
	for _, id := range b.order {
		tb := b.tables[id]
		if tb.rel.skip {
			continue
		}
		var cols, earlier []column
		for _, c := range tb.rel.cols {
			cols = append(cols, c)
			delete(tb.allCols, c.name)
		}
		for _, c := range tb.allCols { // columns of earlier images in the batch
			earlier = append(earlier, c)
		}
		changed, err := schemaChanged(ctx, w, tb.rel, earlier)
		if err != nil {
			return 0, fmt.Errorf("table %s: %w", tb.rel.quoted(), err)
		}
		if changed {
			b.resync = append(b.resync, tb.rel)
			continue
		}
		if err := ensureTable(ctx, w, tb.rel.schema, tb.rel.name, cols); err != nil {
			return 0, fmt.Errorf("table %s: %w", tb.rel.quoted(), err)
		}
		qt := tb.rel.quoted()
		if tb.truncated {
			if _, err := w.c.ExecContext(ctx, "DELETE FROM "+qt); err != nil {
				return 0, fmt.Errorf("truncate %s: %w", qt, err)
			}
		}
		if len(tb.ops) > 0 {
			k, err := applyOps(ctx, w, tb.rel, tb.ops)
			if err != nil {
				return 0, fmt.Errorf("table %s: %w", qt, err)
			}
			n += k
			continue
		}
		// Every key the batch touched goes first (by its key columns), but
		// those it inserted (fresh: a batch of inserts deletes nothing),
		// then the new images are inserted, then patches update in place.
		// Entries share their relation's column slices: their shapes are
		// worked out once per slice.
		type slice struct {
			first *column
			n     int
		}
		memo := map[slice]string{}
		shapeOf := func(cols []column) string {
			if len(cols) == 0 {
				return ""
			}
			k := slice{&cols[0], len(cols)}
			sh, ok := memo[k]
			if !ok {
				sh = colShape(cols)
				memo[k] = sh
			}
			return sh
		}
		byShape := map[string][]*entry{}
		var shapes []string
		for _, k := range tb.order {
			e := tb.entries[k]
			if e.kind == patch || e.fresh {
				continue
			}
			shape := shapeOf(e.key)
			if _, ok := byShape[shape]; !ok {
				shapes = append(shapes, shape)
			}
			byShape[shape] = append(byShape[shape], e)
		}
		for _, shape := range shapes {
			if err := deleteKeys(ctx, w, qt, byShape[shape]); err != nil {
				return 0, fmt.Errorf("delete from %s: %w", qt, err)
			}
		}
		inserts := map[string][][]*string{}
		lines := map[string][]string{}
		insertCols := map[string][]column{}
		shapes = shapes[:0]
		for _, k := range tb.order {
			e := tb.entries[k]
			n++
			switch e.kind {
			case upsert:
				shape := shapeOf(e.cols)
				if _, ok := insertCols[shape]; !ok {
					shapes = append(shapes, shape)
					insertCols[shape] = e.cols
				}
				if e.line != "" {
					lines[shape] = append(lines[shape], e.line)
				} else {
					inserts[shape] = append(inserts[shape], e.vals)
				}
			case patch:
				if err := patchRow(ctx, w, qt, e); err != nil {
					return 0, fmt.Errorf("update %s: %w", qt, err)
				}
			}
		}
		for _, shape := range shapes {
			if err := insertValues(ctx, w, tb.rel.schema, tb.rel.name, insertCols[shape], lines[shape], inserts[shape]); err != nil {
				return 0, fmt.Errorf("insert into %s: %w", qt, err)
			}
		}
	}
	if err := markResync(ctx, w, b.resync); err != nil {
		return 0, fmt.Errorf("record the tables to copy again: %w", err)
	}
	if _, err := w.c.ExecContext(ctx, `UPDATE `+stateSchema+`.state SET lsn = ?, applied_rows = applied_rows + ?, applied_at = now()`, uint64(b.end), n); err != nil {
		return 0, fmt.Errorf("record the applied LSN: %w", err)
	}
	return n, w.commit(ctx)
}

func colShape(cols []column) string {
	var b strings.Builder
	for _, c := range cols {
		b.WriteString(c.name)
		b.WriteString("\x00")
		b.WriteString(c.typ)
		b.WriteString("\x00")
	}
	return b.String()
}

// deleteKeys deletes the rows of the entries' keys (all of one shape):
// the keys are appended to a staging table, then one DELETE … USING.
func deleteKeys(ctx context.Context, w *writer, qt string, es []*entry) error {
	key := es[0].key
	if len(key) == 0 {
		return fmt.Errorf("no key columns: give the table a primary key or REPLICA IDENTITY FULL")
	}
	keys := make([][]*string, len(es))
	nulls := false
	for i, e := range es {
		keys[i] = e.keyV
		for _, v := range e.keyV {
			nulls = nulls || v == nil
		}
	}
	// = lets DuckDB hash-join the keys; a NULL in a key (REPLICA IDENTITY
	// FULL) needs IS NOT DISTINCT FROM.
	eq := "="
	if nulls {
		eq = "IS NOT DISTINCT FROM"
	}
	stage, err := w.stage(ctx, len(key), len(keys), textRows(keys))
	if err != nil {
		return err
	}
	casts := make([]string, len(key))
	conds := make([]string, len(key))
	for i, c := range key {
		casts[i] = fmt.Sprintf("CAST(c%d AS %s) AS k%d", i, c.typ, i)
		conds[i] = fmt.Sprintf("t.%s %s v.k%d", quoteDuck(c.name), eq, i)
	}
	_, err = w.c.ExecContext(ctx, "DELETE FROM "+qt+" AS t USING (SELECT "+strings.Join(casts, ", ")+" FROM "+stage+") AS v WHERE "+strings.Join(conds, " AND "))
	return err
}

// applyOps applies a keyless table's changes in order: runs of inserts
// appended together, each delete removing one row equal to the old image
// (of two equal rows, one goes).
func applyOps(ctx context.Context, w *writer, rel *relation, ops []op) (int64, error) {
	qt := rel.quoted()
	var run [][]*string
	var runCols []column
	flush := func() error {
		err := insertValues(ctx, w, rel.schema, rel.name, runCols, nil, run)
		run, runCols = nil, nil
		return err
	}
	for _, o := range ops {
		if !o.del {
			if runCols != nil && colShape(runCols) != colShape(o.cols) {
				if err := flush(); err != nil {
					return 0, err
				}
			}
			runCols, run = o.cols, append(run, o.vals)
			continue
		}
		if err := flush(); err != nil {
			return 0, err
		}
		var conds []string
		var args []any
		for i, c := range o.cols {
			if i < len(o.vals) {
				conds = append(conds, quoteDuck(c.name)+" IS NOT DISTINCT FROM CAST(? AS "+c.typ+")")
				args = append(args, strOrNil(o.vals[i]))
			}
		}
		if _, err := w.c.ExecContext(ctx, "DELETE FROM "+qt+" WHERE rowid = (SELECT min(rowid) FROM "+qt+" WHERE "+strings.Join(conds, " AND ")+")", args...); err != nil {
			return 0, err
		}
	}
	return int64(len(ops)), flush()
}

// patchRow updates the known columns of one row in place.
func patchRow(ctx context.Context, w *writer, qt string, e *entry) error {
	var sets, conds []string
	var args []any
	for i, c := range e.cols {
		if e.known[i] {
			sets = append(sets, quoteDuck(c.name)+" = CAST(? AS "+c.typ+")")
			args = append(args, strOrNil(e.vals[i]))
		}
	}
	if len(sets) == 0 {
		return nil
	}
	for i, c := range e.key {
		conds = append(conds, quoteDuck(c.name)+" IS NOT DISTINCT FROM CAST(? AS "+c.typ+")")
		args = append(args, strOrNil(e.keyV[i]))
	}
	_, err := w.c.ExecContext(ctx, "UPDATE "+qt+" SET "+strings.Join(sets, ", ")+" WHERE "+strings.Join(conds, " AND "), args...)
	return err
}

func strOrNil(v *string) any {
	if v == nil {
		return nil
	}
	return *v
}
