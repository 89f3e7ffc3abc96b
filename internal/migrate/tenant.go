package migrate

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pgtenant/pgtenant/internal/catalog"
	"github.com/pgtenant/pgtenant/internal/cluster"
	"github.com/pgtenant/pgtenant/internal/jobs"
	"github.com/pgtenant/pgtenant/internal/sandbox"
	"github.com/pgtenant/pgtenant/internal/templates"
	"github.com/pgtenant/pgtenant/internal/tenant"
)

// segment is what one transaction applies: the consecutive transactional
// files of a version, or one NO TRANSACTION file (run outside a transaction
// block, its marker committed right after it). Positions count files from
// the start of the template: a tenant at version v has applied the first
// len(files(v)) files, since a version is the files of the version before
// it plus new ones. Failed versions are not in that chain: the next push
// extends the last version that built (templates.Push), so a rollout skips
// them.
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
	chain    []int             // the versions that did not fail, in order
	prev     map[int]int       // version → the version before it in chain (0 for the first)
	counts   map[int]int       // version → number of files
	segments map[int][]segment // version → its segments, in order
}

// loadVersions reads the file counts of every version of a template and the
// files of the versions above lowest up to target, failed ones left out.
func (s *Service) loadVersions(ctx context.Context, template string, lowest, target int) (*versions, error) {
	vs, err := s.Store.TemplateVersions(ctx, template, false)
	if err != nil {
		return nil, err
	}
	out := &versions{lowest: lowest, target: target, prev: map[int]int{}, counts: map[int]int{}, segments: map[int][]segment{}}
	last := 0
	for _, v := range vs {
		out.counts[v.Version] = len(v.Files)
		if v.State == catalog.VersionFailed {
			continue
		}
		out.chain = append(out.chain, v.Version)
		out.prev[v.Version] = last
		last = v.Version
	}
	for _, v := range out.chain {
		if v <= lowest || v > target {
			continue
		}
		files, err := s.Templates.Files(ctx, template, v)
		if err != nil {
			return nil, err
		}
		prev := out.counts[out.prev[v]]
		if prev > len(files) {
			return nil, fmt.Errorf("template %s version %d has fewer files than version %d", template, v, out.prev[v])
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

// after lists the versions of the chain above from, up to the target.
func (vs *versions) after(from int) []int {
	var out []int
	for _, v := range vs.chain {
		if v > from && v <= vs.target {
			out = append(out, v)
		}
	}
	return out
}

// markerAfter is the marker a tenant carries once seg is committed.
func (vs *versions) markerAfter(built int, seg segment) tenant.Marker {
	if seg.end == vs.counts[seg.version] {
		return tenant.Marker{Built: built, Version: seg.version}
	}
	prev := vs.prev[seg.version]
	return tenant.Marker{Built: built, Version: prev, Extra: seg.end - vs.counts[prev], Next: seg.version}
}

// position is how many of the template's files a marker says are applied.
func (vs *versions) position(m tenant.Marker) (int, bool) {
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

// lockSpace is the first key of the advisory lock (in the catalog) a
// tenant's migration holds ("pgt\x03"), the second being a hash of the
// tenant id.
const lockSpace = 0x70677403

// TenantLockSpace is lockSpace for the move of a tenant (internal/move),
// which takes the same lock while it enqueues its job.
const TenantLockSpace = lockSpace

// errMoving says the tenant is being moved to another cluster: a rollout
// leaves it alone until the move is done (retry the rollout's tenant).
var errMoving = fmt.Errorf("%w: the tenant is moving to another cluster; retry once its move is done", cluster.ErrLockNotAvailable)

// tenantMove migrates one tenant in a rollout.
type tenantMove struct {
	s     *Service
	vs    *versions
	t     catalog.Tenant
	slot  *slot // its cluster's connection slot, held while it runs
	locks *tenantLocks
}

// errBusy says another migrator holds the tenant's lock.
var errBusy = fmt.Errorf("%w: another migrator is working on this tenant", cluster.ErrLockNotAvailable)

// outcome of a tenant: the version it has committed, its rollout state
// ("" when it is neither done nor failed: stopped, or its storage is gone)
// and why it failed.
type outcome struct {
	tenant   string
	cluster  string
	state    catalog.RolloutTenantState // done, failed, or ""
	version  int
	err      error
	attempts int
}

// run applies every pending version to the tenant, one transaction per
// version (per segment when a version has NO TRANSACTION files). A failure
// leaves the tenant at the last version it committed. It writes nothing to
// the catalog: the dispatcher records outcomes in batches.
//
// Its attempts are 1 plus the retries of any of its steps: the tenant's lock
// and each segment are retried on their own, and counting each step's first
// try would make a tenant migrated at its first attempt show 2 (the lock,
// then its version), or more with several versions.
func (m *tenantMove) run(ctx context.Context) outcome {
	out := outcome{tenant: m.t.ID, cluster: m.t.Cluster, version: m.t.Version, attempts: 1}
	n, err := m.retry(ctx, func() error {
		ok, err := m.locks.try(ctx, m.t.ID)
		if err == nil && !ok {
			err = errBusy
		}
		return err
	})
	out.attempts += n - 1
	if err != nil {
		out.err = err
		if ctx.Err() == nil {
			out.state = catalog.RolloutTenantFailed
		}
		return out
	}
	defer m.locks.release(m.t.ID)
	if moving, err := jobs.Unfinished(ctx, m.s.Store.Pool(), jobs.TenantMove, m.t.ID); err != nil || moving {
		out.err = cmp.Or(err, errMoving)
		if ctx.Err() == nil {
			out.state = catalog.RolloutTenantFailed
		}
		return out
	}
	for _, v := range m.vs.after(m.t.Version) {
		for _, seg := range m.vs.segments[v] {
			n, err := m.segment(ctx, seg)
			out.attempts += n - 1
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
	attempts, err = m.retry(ctx, func() error {
		sess, err := m.slot.session(ctx, m.t)
		if err == nil {
			if seg.noTx {
				err = m.applyOutside(ctx, sess, seg)
			} else {
				err = m.applyInTx(ctx, sess, seg)
			}
		}
		if err != nil && (seg.noTx || errors.Is(err, cluster.ErrUnavailable) || sess == nil || sess.Conn().IsClosed()) {
			m.slot.drop() // session state (SET ROLE) or a broken connection: start afresh
		}
		return err
	})
	if errors.Is(err, errApplied) {
		return attempts, nil
	}
	return attempts, err
}

// retry runs f until it succeeds, fails with an error that is not
// retryable, or has been retried migrate.retries times, with jittered
// exponential backoff.
func (m *tenantMove) retry(ctx context.Context, f func() error) (attempts int, err error) {
	cfg := m.s.Migrate
	for attempt := 0; ; attempt++ {
		err = f()
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
// or none when its schema (schema mode) or its marker schema (database
// mode) does not exist.
func (m *tenantMove) markerQuery() string {
	return "SELECT pg_catalog.obj_description(oid, 'pg_namespace') FROM pg_catalog.pg_namespace WHERE nspname = " +
		cluster.Literal(m.markerSchema())
}

// markerSchema is the schema whose comment is the tenant's marker.
func (m *tenantMove) markerSchema() string {
	if m.t.Mode == tenant.ModeSchema {
		return tenant.PhysicalName(m.t.ID)
	}
	return tenant.MarkerSchema
}

// readMarker reads the tenant's marker as it is committed now.
func (m *tenantMove) readMarker(ctx context.Context, conn *pgx.Conn) (tenant.Marker, error) {
	var comment *string
	err := conn.QueryRow(ctx, m.markerQuery(), pgx.QueryExecModeSimpleProtocol).Scan(&comment)
	if err != nil && !errors.Is(err, pgx.ErrNoRows) {
		return tenant.Marker{}, cluster.Classify(err)
	}
	return m.parseMarker(err == nil, comment)
}

func (m *tenantMove) parseMarker(exists bool, comment *string) (tenant.Marker, error) {
	schema := m.markerSchema()
	switch {
	case !exists && m.t.Mode == tenant.ModeSchema:
		return tenant.Marker{}, fmt.Errorf("schema %s: %w", schema, errGone)
	case !exists:
		return tenant.Marker{}, fmt.Errorf("%w: database %s has no schema %s holding its marker", ErrMarkerMismatch, m.t.Database, schema)
	case comment == nil:
		return tenant.Marker{}, fmt.Errorf("%w: schema %s has no pgtenant marker", ErrMarkerMismatch, schema)
	}
	mk, ok := tenant.ParseMarker(*comment)
	if !ok {
		return tenant.Marker{}, fmt.Errorf("%w: the comment of schema %s is %q, not a pgtenant marker", ErrMarkerMismatch, schema, *comment)
	}
	return mk, nil
}

// check compares the tenant's marker with the segment: errApplied if the
// tenant has it already, an error if it is neither there nor just before it.
func (m *tenantMove) check(mk tenant.Marker, seg segment) error {
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
// role, in its schema (schema mode) or in public (database mode, where the
// template's files were built).
func (m *tenantMove) roleSQL(local bool) string {
	set := "SET "
	if local {
		set = "SET LOCAL "
	}
	path := "public"
	if m.t.Mode == tenant.ModeSchema {
		path = cluster.Ident(tenant.PhysicalName(m.t.ID))
	}
	return set + "ROLE " + cluster.Ident(tenant.PhysicalName(m.t.ID)) + "; " + set + "search_path = " + path
}

// markerSQL sets the tenant's marker. The agent may: it is a member of the
// tenant's role (schema mode) and owns the marker schema (database mode).
func (m *tenantMove) markerSQL(mk tenant.Marker) string {
	return "COMMENT ON SCHEMA " + cluster.Ident(m.markerSchema()) + " IS " + cluster.Literal(mk.String())
}

// applyInTx applies a transactional segment in one transaction of the
// tenant's agent session that also checks and moves the tenant's marker,
// under a short lock_timeout (the tenant's lock in the catalog is held by
// run). Tenant code the files set off (triggers, defaults, deferred
// constraint triggers at COMMIT) runs in the agent's session: whatever it
// does, RESET ROLE included, it has the tenant's rights and no more. Round
// trips are few: the set-up and the marker read go as one multi-statement
// query, and the marker update goes with the COMMIT.
func (m *tenantMove) applyInTx(ctx context.Context, sess *sandbox.Session, seg segment) (err error) {
	conn := sess.Conn()
	pc := conn.PgConn()
	defer func() {
		if err != nil && pc.TxStatus() != 'I' && !pc.IsClosed() {
			_, _ = conn.Exec(context.WithoutCancel(ctx), "ROLLBACK")
		}
	}()
	// The marker is read before the search path moves to the tenant's
	// schema, where its own operators are.
	results, err := pc.Exec(ctx, fmt.Sprintf("BEGIN; SET LOCAL lock_timeout = %d; %s; %s",
		m.s.Migrate.LockTimeout.D().Milliseconds(), m.markerQuery(), m.roleSQL(true))).ReadAll()
	if err != nil {
		return cluster.Classify(err)
	}
	last := results[2]
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

// applyOutside runs a NO TRANSACTION file statement by statement in the
// tenant's agent session, then commits the marker. Such files must be
// idempotent (CREATE INDEX CONCURRENTLY IF NOT EXISTS): one interrupted
// before its marker is rerun. Their lock waits (CREATE INDEX CONCURRENTLY
// waits for every older transaction of the database, a neighbour's too in
// a shared database) are bounded by migrate.no_transaction_lock_timeout: a
// timeout leaves an invalid index, which checkIndexes reports.
func (m *tenantMove) applyOutside(ctx context.Context, sess *sandbox.Session, seg segment) error {
	conn := sess.Conn()
	mk, err := m.readMarker(ctx, conn)
	if err != nil {
		return err
	}
	if err := m.check(mk, seg); err != nil {
		return err
	}
	if _, err := conn.Exec(ctx, fmt.Sprintf("SET lock_timeout = %d; %s",
		m.s.Migrate.NoTransactionLockTimeout.D().Milliseconds(), m.roleSQL(false))); err != nil {
		return cluster.Classify(err)
	}
	if err := execFiles(ctx, conn, seg.files); err != nil {
		return err
	}
	if _, err := conn.Exec(ctx, "RESET ROLE; RESET search_path; RESET lock_timeout"); err != nil {
		return cluster.Classify(err)
	}
	if err := m.checkIndexes(ctx, conn); err != nil {
		return err
	}
	if _, err := conn.Exec(ctx, m.markerSQL(m.vs.markerAfter(mk.Built, seg))); err != nil {
		return cluster.Classify(err)
	}
	return nil
}

// checkIndexes fails on an invalid index in the tenant: what an interrupted
// CREATE INDEX CONCURRENTLY leaves, and what IF NOT EXISTS would then keep.
func (m *tenantMove) checkIndexes(ctx context.Context, conn *pgx.Conn) error {
	var invalid *string
	err := conn.QueryRow(ctx, `SELECT pg_catalog.string_agg(c.oid::regclass::text, ', ') FROM pg_catalog.pg_index i
		JOIN pg_catalog.pg_class c ON c.oid = i.indexrelid JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace
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
	if m.t.Mode == tenant.ModeSchema {
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
