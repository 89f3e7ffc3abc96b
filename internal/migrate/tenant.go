package migrate

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pgtenant/pgtenant/internal/catalog"
	"github.com/pgtenant/pgtenant/internal/cluster"
	"github.com/pgtenant/pgtenant/internal/templates"
	"github.com/pgtenant/pgtenant/internal/tenant"
)

// segment is what one transaction applies: the consecutive transactional
// files of a version, or one NO TRANSACTION file (run outside a transaction
// block, its marker committed right after it). Positions count files from
// the start of the template: a tenant at version v has applied the first
// len(files(v)) files, since a version is its predecessor's files plus new ones.
type segment struct {
	version    int
	start, end int // files [start, end) of the template
	files      []templates.File
	noTx       bool
}

// versions is what a rollout applies, loaded once per run.
type versions struct {
	lowest   int // the lowest version it can move a tenant from
	target   int
	counts   map[int]int       // version → number of files
	segments map[int][]segment // version → its segments, in order
}

// loadVersions reads the file counts of every version of a template and the
// files of the versions above lowest up to target.
func (s *Service) loadVersions(ctx context.Context, template string, lowest, target int) (*versions, error) {
	vs, err := s.Store.TemplateVersions(ctx, template, false)
	if err != nil {
		return nil, err
	}
	out := &versions{lowest: lowest, target: target, counts: map[int]int{}, segments: map[int][]segment{}}
	for _, v := range vs {
		out.counts[v.Version] = len(v.Files)
	}
	for v := lowest + 1; v <= target; v++ {
		files, err := s.Templates.Files(ctx, template, v)
		if err != nil {
			return nil, err
		}
		prev := out.counts[v-1]
		if prev > len(files) {
			return nil, fmt.Errorf("template %s version %d has fewer files than version %d", template, v, v-1)
		}
		var cur *segment
		for i, f := range files[prev:] {
			pos := prev + i
			if f.NoTransaction || cur == nil || cur.noTx {
				out.segments[v] = append(out.segments[v], segment{version: v, start: pos, noTx: f.NoTransaction})
				cur = &out.segments[v][len(out.segments[v])-1]
			}
			cur.files = append(cur.files, f)
			cur.end = pos + 1
		}
	}
	return out, nil
}

// markerAfter is the marker a tenant carries once seg is committed.
func (vs *versions) markerAfter(built int, seg segment) Marker {
	if seg.end == vs.counts[seg.version] {
		return Marker{Built: built, Version: seg.version}
	}
	return Marker{Built: built, Version: seg.version - 1, Extra: seg.end - vs.counts[seg.version-1]}
}

// position is how many of the template's files a marker says are applied.
func (vs *versions) position(m Marker) (int, bool) {
	n, ok := vs.counts[m.Version]
	return n + m.Extra, ok
}

// errApplied says the tenant has the segment already (its marker is past it).
var errApplied = errors.New("already applied")

// errGone says the tenant's schema or database no longer exists.
var errGone = errors.New("tenant storage does not exist")

// ErrMarkerMismatch is a tenant whose own marker disagrees with where the
// rollout expects it to be (restored from an old copy, altered by hand): it
// is never migrated blindly.
var ErrMarkerMismatch = errors.New("tenant's version marker disagrees with the catalog")

// lockSpace is the first key of the advisory lock a tenant's migration holds
// ("pgt\x03"), the second being a hash of the tenant id.
const lockSpace = 0x70677403

// tenantMove migrates one tenant in a rollout.
type tenantMove struct {
	s    *Service
	vs   *versions
	t    catalog.Tenant
	slot *slot // its cluster's connection slot, held while it runs
}

// outcome of a tenant: the version it has committed, its rollout state
// ("" when it is neither done nor failed: stopped, or its storage is gone)
// and why it failed.
type outcome struct {
	tenant   string
	cluster  string
	state    string // done, failed, or ""
	version  int
	err      error
	attempts int
}

// run applies every pending version to the tenant, one transaction per
// version (per segment when a version has NO TRANSACTION files). A failure
// leaves the tenant at the last version it committed. It writes nothing to
// the catalog: the dispatcher records outcomes in batches.
func (m *tenantMove) run(ctx context.Context) outcome {
	out := outcome{tenant: m.t.ID, cluster: m.t.Cluster, version: m.t.Version}
	for v := m.t.Version + 1; v <= m.vs.target; v++ {
		for _, seg := range m.vs.segments[v] {
			n, err := m.segment(ctx, seg)
			out.attempts += n
			if err != nil {
				out.err = fmt.Errorf("version %d: %w", v, err)
				if !errors.Is(err, errGone) && ctx.Err() == nil {
					out.state = catalog.RolloutTenantFailed
				}
				return out
			}
		}
		out.version = v
	}
	out.state = catalog.RolloutTenantDone
	return out
}

// segment applies one segment with retries: lock timeouts, deadlocks and
// lost connections are retried with backoff, anything else fails at once.
func (m *tenantMove) segment(ctx context.Context, seg segment) (attempts int, err error) {
	cfg := m.s.Config.Migrate
	for attempt := 0; ; attempt++ {
		var conn *pgx.Conn
		conn, err = m.slot.conn(ctx, m.t.Database, m.t.Mode == "schema")
		if err == nil {
			if seg.noTx {
				err = m.applyOutside(ctx, conn, seg)
			} else {
				err = m.applyInTx(ctx, conn, seg)
			}
		}
		if errors.Is(err, errApplied) {
			return attempt + 1, nil
		}
		if err != nil && (seg.noTx || errors.Is(err, cluster.ErrUnavailable) || conn == nil || conn.IsClosed()) {
			m.slot.drop() // session state (an advisory lock, SET ROLE) or a broken connection: start afresh
		}
		if err == nil || ctx.Err() != nil || attempt >= cfg.Retries || !retryable(err) {
			return attempt + 1, err
		}
		backoff := cfg.RetryBackoff.D() << min(attempt, 10)
		backoff = backoff/2 + rand.N(backoff/2+1) // jitter: tenants of one cluster do not retry in step
		m.s.Logger.Debug("tenant migration will retry", "component", "migrate", "tenant", m.t.ID, "attempt", attempt+1, "in", backoff, "err", err)
		select {
		case <-ctx.Done():
			return attempt + 1, err
		case <-time.After(backoff):
		}
	}
}

func retryable(err error) bool {
	return errors.Is(err, cluster.ErrLockNotAvailable) || errors.Is(err, cluster.ErrSerialization) || errors.Is(err, cluster.ErrUnavailable)
}

// markerQuery reads the tenant's marker: one row (NULL without a comment),
// or none when its schema does not exist.
func (m *tenantMove) markerQuery() string {
	if m.t.Mode == "schema" {
		return "SELECT obj_description(oid, 'pg_namespace') FROM pg_namespace WHERE nspname = " + cluster.Literal(tenant.PhysicalName(m.t.ID))
	}
	return "SELECT shobj_description(oid, 'pg_database') FROM pg_database WHERE datname = current_database()"
}

// readMarker reads the tenant's marker as it is committed now.
func (m *tenantMove) readMarker(ctx context.Context, conn *pgx.Conn) (Marker, error) {
	var comment *string
	err := conn.QueryRow(ctx, m.markerQuery(), pgx.QueryExecModeSimpleProtocol).Scan(&comment)
	if err != nil && !errors.Is(err, pgx.ErrNoRows) {
		return Marker{}, cluster.Classify(err)
	}
	return m.parseMarker(err == nil, comment)
}

func (m *tenantMove) parseMarker(exists bool, comment *string) (Marker, error) {
	name := tenant.PhysicalName(m.t.ID)
	if !exists {
		return Marker{}, fmt.Errorf("schema %s: %w", name, errGone)
	}
	if comment == nil && m.t.Mode == "database" {
		// Built before databases carried a marker, and never migrated since:
		// at the version the catalog says.
		return Built(m.t.Version), nil
	}
	if comment == nil {
		return Marker{}, fmt.Errorf("%w: schema %s has no pgtenant marker", ErrMarkerMismatch, name)
	}
	mk, ok := ParseMarker(*comment)
	if !ok {
		return Marker{}, fmt.Errorf("%w: the comment of %s is %q, not a pgtenant marker", ErrMarkerMismatch, name, *comment)
	}
	return mk, nil
}

// check compares the tenant's marker with the segment: errApplied if the
// tenant has it already, an error if it is neither there nor just before it.
func (m *tenantMove) check(mk Marker, seg segment) error {
	pos, ok := m.vs.position(mk)
	switch {
	case !ok:
		return fmt.Errorf("%w: the tenant says %q, a version template %s does not have", ErrMarkerMismatch, mk, m.t.Template)
	case pos >= seg.end:
		return errApplied
	case pos != seg.start:
		return fmt.Errorf("%w: the tenant says %q (%d files applied), the rollout expects %d before version %d; inspect it and fix its comment by hand",
			ErrMarkerMismatch, mk, pos, seg.start, seg.version)
	}
	return nil
}

// roleSQL makes what the template's files create belong to the tenant's
// role, in its schema (schema mode).
func (m *tenantMove) roleSQL(local bool) string {
	id := cluster.Ident(tenant.PhysicalName(m.t.ID))
	set := "SET "
	if local {
		set = "SET LOCAL "
	}
	sql := set + "ROLE " + id
	if m.t.Mode == "schema" {
		sql += "; " + set + "search_path = " + id
	}
	return sql
}

// markerSQL sets the tenant's marker.
func (m *tenantMove) markerSQL(mk Marker) string {
	name := cluster.Ident(tenant.PhysicalName(m.t.ID))
	what := "SCHEMA "
	if m.t.Mode == "database" {
		what = "DATABASE "
	}
	return "COMMENT ON " + what + name + " IS " + cluster.Literal(mk.String())
}

// applyInTx applies a transactional segment in one transaction that also
// checks and moves the tenant's marker, under a short lock_timeout. An
// advisory lock on the tenant, taken before the marker is read, makes a
// second migrator of the same tenant (a daemon that lost its lease) wait and
// then find the segment applied. Round trips are few: the set-up and the
// marker read go as one multi-statement query (each statement has its own
// snapshot, so the marker is read after the lock is held; the role is set
// with them), and the marker update goes with the COMMIT.
func (m *tenantMove) applyInTx(ctx context.Context, conn *pgx.Conn, seg segment) (err error) {
	pc := conn.PgConn()
	defer func() {
		if err != nil && pc.TxStatus() != 'I' && !pc.IsClosed() {
			_, _ = conn.Exec(context.WithoutCancel(ctx), "ROLLBACK")
		}
	}()
	results, err := pc.Exec(ctx, fmt.Sprintf("BEGIN; SET LOCAL lock_timeout = %d; SELECT pg_advisory_xact_lock(%d, hashtext(%s)); %s; %s",
		m.s.Config.Migrate.LockTimeout.D().Milliseconds(), lockSpace, cluster.Literal(m.t.ID), m.roleSQL(true), m.markerQuery())).ReadAll()
	if err != nil {
		return cluster.Classify(err)
	}
	last := results[len(results)-1]
	var comment *string
	if len(last.Rows) > 0 && last.Rows[0][0] != nil {
		c := string(last.Rows[0][0])
		comment = &c
	}
	mk, err := m.parseMarker(len(last.Rows) > 0, comment)
	if err != nil {
		return err
	}
	if err := m.check(mk, seg); err != nil {
		return err
	}
	if err := execFiles(ctx, conn, seg.files); err != nil {
		return err
	}
	if _, err := conn.Exec(ctx, "RESET ROLE; "+m.markerSQL(m.vs.markerAfter(mk.Built, seg))+"; COMMIT"); err != nil {
		return fmt.Errorf("commit: %w", cluster.Classify(err))
	}
	return nil
}

// applyOutside runs a NO TRANSACTION file statement by statement, under a
// session advisory lock, then commits the marker. Such files must be
// idempotent (CREATE INDEX CONCURRENTLY IF NOT EXISTS): one interrupted
// before its marker is rerun. No lock_timeout here: CREATE INDEX
// CONCURRENTLY waits for older transactions without blocking the tenant's
// traffic, and a timeout would leave an invalid index behind.
func (m *tenantMove) applyOutside(ctx context.Context, conn *pgx.Conn, seg segment) error {
	if _, err := conn.Exec(ctx, `SELECT pg_advisory_lock($1, hashtext($2))`, pgx.QueryExecModeSimpleProtocol, lockSpace, m.t.ID); err != nil {
		return cluster.Classify(err)
	}
	mk, err := m.readMarker(ctx, conn)
	if err != nil {
		return err
	}
	if err := m.check(mk, seg); err != nil {
		return err
	}
	if _, err := conn.Exec(ctx, m.roleSQL(false)); err != nil {
		return cluster.Classify(err)
	}
	if err := execFiles(ctx, conn, seg.files); err != nil {
		return err
	}
	if _, err := conn.Exec(ctx, "RESET ROLE; RESET search_path"); err != nil {
		return cluster.Classify(err)
	}
	if err := m.checkIndexes(ctx, conn); err != nil {
		return err
	}
	if _, err := conn.Exec(ctx, m.markerSQL(m.vs.markerAfter(mk.Built, seg))+
		fmt.Sprintf("; SELECT pg_advisory_unlock(%d, hashtext(%s))", lockSpace, cluster.Literal(m.t.ID))); err != nil {
		return cluster.Classify(err)
	}
	return nil
}

// checkIndexes fails on an invalid index in the tenant: what an interrupted
// CREATE INDEX CONCURRENTLY leaves, and what IF NOT EXISTS would then keep.
func (m *tenantMove) checkIndexes(ctx context.Context, conn *pgx.Conn) error {
	var invalid *string
	err := conn.QueryRow(ctx, `SELECT string_agg(c.oid::regclass::text, ', ') FROM pg_index i
		JOIN pg_class c ON c.oid = i.indexrelid JOIN pg_namespace n ON n.oid = c.relnamespace
		WHERE NOT i.indisvalid AND CASE WHEN $1 = '' THEN n.nspname NOT IN ('pg_catalog', 'information_schema')
		  AND n.nspname NOT LIKE 'pg\_toast%' ELSE n.nspname = $1 END`, pgx.QueryExecModeSimpleProtocol, m.schemaFilter()).Scan(&invalid)
	if err != nil {
		return cluster.Classify(err)
	}
	if invalid != nil {
		return fmt.Errorf("invalid index %s (left by an interrupted CREATE INDEX CONCURRENTLY): drop it and retry the tenant", *invalid)
	}
	return nil
}

func (m *tenantMove) schemaFilter() string {
	if m.t.Mode == "schema" {
		return tenant.PhysicalName(m.t.ID)
	}
	return ""
}

// execFiles runs the files' statements, naming the failing one.
func execFiles(ctx context.Context, q cluster.Execer, files []templates.File) error {
	for _, f := range files {
		for i, stmt := range f.Statements {
			if _, err := q.Exec(ctx, stmt); err != nil {
				return fmt.Errorf("%s, statement %d (%s): %w", f.Name, i+1, abbreviate(stmt), cluster.Classify(err))
			}
		}
	}
	return nil
}

func abbreviate(stmt string) string {
	s := strings.Join(strings.Fields(stmt), " ")
	if len(s) > 80 {
		s = s[:77] + "..."
	}
	return s
}
