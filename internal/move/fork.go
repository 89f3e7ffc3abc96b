package move

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pgtenant/pgtenant/internal/backup"
	"github.com/pgtenant/pgtenant/internal/catalog"
	"github.com/pgtenant/pgtenant/internal/cluster"
	"github.com/pgtenant/pgtenant/internal/credentials"
	"github.com/pgtenant/pgtenant/internal/jobs"
	"github.com/pgtenant/pgtenant/internal/pooler"
	"github.com/pgtenant/pgtenant/internal/provision"
	"github.com/pgtenant/pgtenant/internal/purge"
	"github.com/pgtenant/pgtenant/internal/sandbox"
	"github.com/pgtenant/pgtenant/internal/tenant"
)

// Forks and rewinds read a tenant's past from its cluster's backup: the
// repository is restored to the instant asked for into a scratch instance
// (backup.Scratch), and the tenant is copied from there into a new tenant
// made on the same cluster, in that tenant's agent session as its role
// (pg_dump's definitions before the rows, its indexes, constraints and
// triggers after them, so no tenant trigger fires on the copy). A fork
// ends there: the new tenant is let in. A rewind then swaps the two
// tenants' storage under a pause of the source's pool (renames, and the
// owners exchanged), so that the source, with its id, DSN and password,
// holds its past, and the new tenant, dropped, holds what the rewind
// replaced for the drop retention: restoring it undoes the rewind's loss.

// ErrOutsideWindow is a time a tenant cannot be taken back to.
var ErrOutsideWindow = errors.New("outside the recovery window")

// copyArgs are a fork's or a rewind's.
type copyArgs struct {
	Tenant string    `json:"tenant"` // the source
	At     time.Time `json:"at"`
	Into   string    `json:"into,omitempty"` // a fork's new tenant (a rewind makes its own)
	Rewind bool      `json:"rewind,omitempty"`
}

// copyState is what the job keeps between steps.
type copyState struct {
	Into string `json:"into,omitempty"`
	// Marker is the source's version marker at At.
	Marker string `json:"marker,omitempty"`
	// Restored is the oid of the copy's database or schema, read before
	// the swap: the swap is done when the source's name has it.
	Restored uint32 `json:"restored,omitempty"`
	// ReplacedAt is when the source's writes stopped for the swap: a
	// rewind to it undoes this one.
	ReplacedAt *time.Time `json:"replaced_at,omitempty"`
	PauseMS    int64      `json:"pause_ms,omitempty"`
	// Phases is how long the copy step's parts took, "restore 7s, …,
	// rows 7s (400ms paced), …": where a slow rewind or fork spends its time.
	Phases string `json:"phases,omitempty"`
}

// phases times the parts of a long step one after the other, with the
// job's waits on the pacer during each.
type phases struct {
	r     *jobs.Run
	last  time.Time
	paced time.Duration // the job's waits on the pacer up to last
	list  []string
}

func newPhases(r *jobs.Run) *phases { return &phases{r: r, last: time.Now(), paced: r.Paced()} }

// done ends the part named name (nil: not timed).
func (p *phases) done(name string) {
	if p == nil {
		return
	}
	now := time.Now()
	s := fmt.Sprintf("%s %s", name, now.Sub(p.last).Round(100*time.Millisecond))
	if w := p.r.Paced() - p.paced; w >= 100*time.Millisecond {
		s += fmt.Sprintf(" (%s paced)", w.Round(100*time.Millisecond))
	}
	p.list = append(p.list, s)
	p.last, p.paced = now, p.r.Paced()
}

func (p *phases) String() string { return strings.Join(p.list, ", ") }

// forkSpec is the job of a fork (rewind false) or a rewind.
func forkSpec(t catalog.Tenant, a copyArgs) jobs.Spec {
	typ, key := jobs.TenantFork, "fork:"+a.Into
	if a.Rewind {
		typ, key = jobs.TenantRewind, "rewind:"+t.ID
	}
	return jobs.Spec{Type: typ, Key: key, TargetKind: "tenant", Target: t.ID, Cluster: t.Cluster, Args: a, MaxAttempts: 5}
}

// checkPast refuses what a fork or rewind of t at at cannot do, before
// anything is made: at in the tenant's recovery window (from its creation,
// or the cluster's oldest backup when later, to now).
func (s *Service) checkPast(ctx context.Context, t catalog.Tenant, at time.Time, what string) error {
	if t.State != catalog.StateActive && t.State != catalog.StateSuspended {
		return fmt.Errorf("%w: tenant %s is %s; only active or suspended tenants can be %s", catalog.ErrConflict, t.ID, t.State, what)
	}
	w, err := s.Window(ctx, t)
	if err != nil {
		return fmt.Errorf("%w: %w", catalog.ErrConflict, err)
	}
	if w == nil {
		return fmt.Errorf("%w: cluster %s has no backup yet (`pgtenant backup now --cluster %s --wait`)", catalog.ErrConflict, t.Cluster, t.Cluster)
	}
	// The archive reaches now once a rewind has archived the current WAL.
	now := time.Now()
	if at.Before(w.Earliest) || at.After(now) {
		return fmt.Errorf("%w: %w: %s is not in tenant %s's recovery window, %s to now (%s)", provision.ErrInvalid, ErrOutsideWindow,
			at.UTC().Format(time.RFC3339), t.ID, w.Earliest.UTC().Format(time.RFC3339), now.UTC().Format(time.RFC3339))
	}
	var mirrored bool
	if err := s.Store.Pool().QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM analytics WHERE tenant = $1)`, t.ID).Scan(&mirrored); err != nil {
		return err
	}
	if what != "rewound" {
		return nil
	}
	if mirrored {
		return fmt.Errorf("%w: tenant %s has an analytics mirror, which follows its storage: disable it (`pgtenant analytics disable %s`), rewind, then enable it again", catalog.ErrConflict, t.ID, t.ID)
	}
	// The swap gives the tenant's objects to the copy's role and back: a
	// lock role's would stay behind.
	cl, err := s.Clusters.Get(t.Cluster)
	if err != nil {
		return err
	}
	if why, err := quotaEnforced(ctx, cl, t.ID); err != nil || why != "" {
		if err == nil {
			err = fmt.Errorf("%w: tenant %s cannot be rewound now: %s; a fork (`pgtenant tenant fork %s --at TIME`) reads the same past", catalog.ErrConflict, t.ID, why, t.ID)
		}
		return err
	}
	return nil
}

// Window is the times tenant t can be rewound or forked to: its cluster's
// recovery window from the tenant's creation on (nil before the cluster's
// first backup). Latest is the newest WAL archived; a rewind or fork
// archives the current WAL first, so that it can go up to now.
func (s *Service) Window(ctx context.Context, t catalog.Tenant) (*backup.Window, error) {
	if s.Backups == nil {
		return nil, backup.ErrNotConfigured
	}
	w, err := s.Backups.Window(ctx, t.Cluster)
	if err != nil || w == nil {
		return nil, err
	}
	out := *w
	if t.CreatedAt.After(out.Earliest) {
		out.Earliest = t.CreatedAt
	}
	if out.Latest.Before(out.Earliest) {
		out.Latest = out.Earliest
	}
	return &out, nil
}

// Rewind starts taking tenant id back to at, in place.
func (s *Service) Rewind(ctx context.Context, id string, at time.Time) (jobs.Job, error) {
	t, err := s.Store.GetTenant(ctx, nil, id)
	if err != nil {
		return jobs.Job{}, err
	}
	if err := s.checkPast(ctx, t, at, "rewound"); err != nil {
		return jobs.Job{}, err
	}
	if busy, err := jobs.Unfinished(ctx, s.Store.Pool(), jobs.TenantMove, id); err != nil || busy {
		if err == nil {
			err = fmt.Errorf("%w: tenant %s is moving; rewind it once the move is done", catalog.ErrConflict, id)
		}
		return jobs.Job{}, err
	}
	j, err := s.Runner.Enqueue(ctx, s.Store.Pool(), forkSpec(t, copyArgs{Tenant: id, At: at.UTC(), Rewind: true}))
	if err != nil {
		return j, err
	}
	var a copyArgs
	if err := j.DecodeArgs(&a); err == nil && !a.At.Equal(at.UTC()) {
		return j, fmt.Errorf("%w: tenant %s is being rewound to %s already (job %d)", catalog.ErrConflict, id, a.At.Format(time.RFC3339), j.ID)
	}
	return j, nil
}

// Fork makes a new tenant on the source's cluster, locked until it holds
// the source's data as of at (the zero time: now), and starts the job that
// copies it. The answer carries the new tenant's credentials, as a create's.
func (s *Service) Fork(ctx context.Context, id string, at time.Time, name *string, tier string) (provision.Created, jobs.Job, error) {
	t, err := s.Store.GetTenant(ctx, nil, id)
	if err != nil {
		return provision.Created{}, jobs.Job{}, err
	}
	if at.IsZero() {
		at = time.Now()
	}
	if err := s.checkPast(ctx, t, at, "forked"); err != nil {
		return provision.Created{}, jobs.Job{}, err
	}
	if name == nil {
		n := "fork of " + cmp.Or(t.Name, t.ID)
		name = &n
	}
	c, err := s.createLocked(ctx, provision.Request{Template: t.Template, Mode: t.Mode, Name: name, Tier: cmp.Or(tier, t.Tier), Cluster: t.Cluster})
	if err != nil {
		return c, jobs.Job{}, err
	}
	j, err := s.Runner.Enqueue(ctx, s.Store.Pool(), forkSpec(t, copyArgs{Tenant: id, At: at.UTC(), Into: c.Tenant.ID}))
	if err != nil {
		return c, j, err
	}
	if err := s.Store.AddEvent(ctx, s.Store.Pool(), c.Tenant.ID, "fork_started", map[string]any{"from": id, "at": at.UTC(), "job": j.ID}); err != nil {
		return c, j, err
	}
	c.Tenant, err = s.Store.GetTenant(ctx, nil, c.Tenant.ID)
	return c, j, err
}

// createLocked makes a new tenant as req asks, waits for its build and
// suspends it: it is let in once the job that fills it has succeeded (a
// fork, a rewind's copy, an import).
func (s *Service) createLocked(ctx context.Context, req provision.Request) (provision.Created, error) {
	c, err := s.Provision.Create(ctx, req)
	if err != nil {
		return c, err
	}
	if c.Job != nil {
		if _, err := s.Runner.Wait(ctx, c.Job.ID, nil); err != nil {
			return c, err
		}
	}
	_, err = s.Lifecycle.Suspend(ctx, c.Tenant.ID)
	return c, err
}

// ForkHandler runs forks and rewinds (one handler: a rewind is a fork
// into a new tenant followed by a swap).
func (s *Service) ForkHandler() jobs.Handler {
	return jobs.Handler{
		Steps: func(j *jobs.Job) ([]jobs.Step, error) {
			var a copyArgs
			if err := j.DecodeArgs(&a); err != nil {
				return nil, err
			}
			f := &forker{s: s, a: a}
			steps := []jobs.Step{
				{Name: "target", Run: f.target, Doing: "making the tenant the copy goes into"},
				{Name: "copy", Run: step("copy", f.load, f.copy), Doing: "restoring the backup into a scratch instance"},
			}
			if a.Rewind {
				steps = append(steps, jobs.Step{Name: "swap", Run: step("swap", f.load, f.swap), Doing: "swapping the copy in under a pause"})
			}
			return append(steps, jobs.Step{Name: "finish", Run: step("finish", f.load, f.finish)}), nil
		},
		Cleanup: func(ctx context.Context, r *jobs.Run) error {
			var a copyArgs
			if err := r.Job.DecodeArgs(&a); err != nil {
				return err
			}
			f := &forker{s: s, a: a}
			return f.cleanup(ctx, r)
		},
	}
}

type forker struct {
	s *Service
	a copyArgs
}

// fenv is what the steps after target work with.
type fenv struct {
	src, into catalog.Tenant
	cl        *cluster.Cluster
	st        copyState
}

func (f *forker) scratchName(r *jobs.Run) string { return fmt.Sprintf("job-%d", r.Job.ID) }

func (f *forker) load(ctx context.Context, r *jobs.Run) (*fenv, error) {
	e := &fenv{}
	if err := r.LoadData(&e.st); err != nil {
		return nil, err
	}
	var err error
	if e.src, err = f.s.Store.GetTenant(ctx, nil, f.a.Tenant); err != nil {
		return nil, err
	}
	into := cmp.Or(e.st.Into, f.a.Into)
	if into == "" {
		return nil, jobs.Permanent(fmt.Errorf("tenant %s's copy: no target tenant recorded", f.a.Tenant))
	}
	if e.into, err = f.s.Store.GetTenant(ctx, nil, into); err != nil {
		return nil, err
	}
	e.st.Into = into
	if e.cl, err = f.s.Clusters.Get(e.src.Cluster); err != nil {
		return nil, err
	}
	if e.into.Cluster != e.src.Cluster {
		return nil, jobs.Permanent(fmt.Errorf("tenant %s (cluster %s) and its copy %s (cluster %s) are on different clusters: the source moved", e.src.ID, e.src.Cluster, e.into.ID, e.into.Cluster))
	}
	return e, nil
}

// target makes a rewind's new tenant: on the source's cluster, with its
// template, mode and tier, locked (suspended) from the start. The job's id
// is its external id, so that a step run again finds it.
func (f *forker) target(ctx context.Context, r *jobs.Run) error {
	var st copyState
	if err := r.LoadData(&st); err != nil {
		return err
	}
	if f.a.Into != "" || st.Into != "" {
		return nil
	}
	src, err := f.s.Store.GetTenant(ctx, nil, f.a.Tenant)
	if err != nil {
		return err
	}
	name := fmt.Sprintf("%s before its rewind to %s", cmp.Or(src.Name, src.ID), f.a.At.Format(time.RFC3339))
	c, err := f.s.createLocked(ctx, provision.Request{Template: src.Template, Mode: src.Mode, Name: &name,
		ExternalID: fmt.Sprintf("pgtenant-rewind-%d", r.Job.ID), Tier: src.Tier, Cluster: src.Cluster})
	if err != nil {
		return err
	}
	st.Into = c.Tenant.ID
	return r.SaveData(ctx, st)
}

// copy restores the cluster's backup as of At into a scratch instance and
// copies the source tenant from it into the new tenant (copyScratch). Run
// again, it starts over: the scratch instance and the new tenant's storage
// are made anew.
func (f *forker) copy(ctx context.Context, r *jobs.Run, e *fenv) error {
	st, err := f.s.Backups.Stanza(e.src.Cluster)
	if err != nil {
		return jobs.Permanent(err)
	}
	// A commit after At, archived (RestoreScratch archives the WAL up to
	// now): recovery stops at the first commit after its target, and fails
	// when the archive holds none.
	admin, err := e.cl.Admin(ctx)
	if err != nil {
		return err
	}
	if _, err := admin.Exec(ctx, "SELECT pg_catalog.txid_current()"); err != nil {
		return cluster.Classify(err)
	}
	ph := newPhases(r)
	var size int64 // the database as it is now: the size of its restore, near enough
	if err := admin.QueryRow(ctx, "SELECT coalesce(pg_catalog.pg_database_size(d.oid), 0) FROM pg_catalog.pg_database d WHERE d.datname = $1", e.src.Database).Scan(&size); err != nil && !errors.Is(err, pgx.ErrNoRows) {
		return cluster.Classify(err)
	}
	if err := st.ScratchRoom(f.scratchName(r), size); err != nil {
		return jobs.Permanent(err)
	}
	r.Progress(ctx, 0, 1, fmt.Sprintf("archiving the WAL up to now on %s and restoring %s as of %s into a scratch instance", e.cl.Name(), e.src.Database, f.a.At.Format(time.RFC3339)))
	sc, err := st.RestoreScratch(ctx, f.scratchName(r), f.a.At, []string{e.src.Database})
	if errors.Is(err, backup.ErrTargetNotReached) {
		return jobs.Permanent(err)
	}
	if err != nil {
		return err
	}
	defer sc.Remove(context.WithoutCancel(ctx))
	ph.done("restore")
	if err := crashPoint(ctx, "copy:restored"); err != nil {
		return err
	}
	sconn, err := sc.Connect(ctx, e.src.Database)
	if err != nil {
		return fmt.Errorf("connect to the scratch instance: %w", cluster.Classify(err))
	}
	defer sconn.Close(context.WithoutCancel(ctx))
	marker, err := markerOn(ctx, sconn, e.src)
	if err != nil {
		return err
	}
	if _, ok := tenant.ParseMarker(marker); !ok {
		return jobs.Permanent(fmt.Errorf("tenant %s was not complete at %s (version marker %q): nothing to copy from then", e.src.ID, f.a.At.Format(time.RFC3339), marker))
	}
	e.st.Marker = marker
	if e.src.Mode == tenant.ModeSchema {
		// The copy's objects get the new tenant's schema name here, in the
		// scratch instance, so that the dump names it.
		if err := renameSchema(ctx, sconn, tenant.PhysicalName(e.src.ID), tenant.PhysicalName(e.into.ID)); err != nil {
			return err
		}
	}
	err = f.s.copyScratch(ctx, r, scratchCopy{cl: e.cl, into: e.into, sconn: sconn, dsn: sc.DSN(e.src.Database),
		what: fmt.Sprintf("tenant %s as of %s", e.src.ID, f.a.At.Format(time.RFC3339)), marker: marker, phases: ph})
	if err != nil {
		return err
	}
	e.st.Phases = ph.String()
	return r.SaveData(ctx, e.st)
}

// renameSchema gives a schema of a scratch instance its new name, what was
// there under that name dropped first (a run before this one).
func renameSchema(ctx context.Context, sconn *pgx.Conn, from, to string) error {
	_, err := sconn.Exec(ctx, fmt.Sprintf("DROP SCHEMA IF EXISTS %[2]s CASCADE; ALTER SCHEMA %[1]s RENAME TO %[2]s", cluster.Ident(from), cluster.Ident(to)))
	if err != nil {
		return fmt.Errorf("rename the tenant's schema in the scratch instance: %w", cluster.Classify(err))
	}
	return nil
}

// scratchCopy is one copy of a tenant out of a scratch instance into a new
// tenant's storage. The scratch database holds the tenant's objects named
// as the new tenant's: in schema mode, its schema has the new tenant's
// name already.
type scratchCopy struct {
	cl     *cluster.Cluster // the new tenant's
	into   catalog.Tenant
	sconn  *pgx.Conn // a superuser's session on the scratch database
	dsn    string    // its DSN, for pg_dump
	what   string    // what is copied, "tenant X as of T": for progress and errors
	marker string    // the version marker the copy gets
	// verify, when set, checks the rows copied into each table (by
	// "schema.table") before the commit.
	verify func(rows map[string]int64) error
	phases *phases // times the copy's parts (nil: not timed)
}

// copyScratch makes the new tenant's storage anew and copies c into it, in
// one transaction of the new tenant's agent session as its role: pg_dump's
// definitions, the rows (COPY, paced), the sequences, then its indexes,
// constraints and triggers (so no tenant trigger fires on the copy), and
// the version marker.
func (s *Service) copyScratch(ctx context.Context, r *jobs.Run, c scratchCopy) error {
	intoName := tenant.PhysicalName(c.into.ID)
	schemas := []string{intoName}
	var exts []string
	if c.into.Mode == tenant.ModeDatabase {
		var refused []string
		var err error
		if exts, refused, err = carriedExtensions(ctx, c.sconn, c.cl); err != nil {
			return err
		}
		if len(refused) > 0 {
			return jobs.Permanent(fmt.Errorf("%w: %s: %s", ErrRefused, c.what, strings.Join(refused, "; ")))
		}
		if schemas, err = tenantSchemas(ctx, c.sconn, c.into); err != nil {
			return err
		}
	}
	// The new tenant's storage, empty.
	if err := s.emptyStorage(ctx, r, c.cl, c.into, hasExtension(ctx, c.sconn, "pg_prewarm")); err != nil {
		return err
	}
	c.phases.done("storage")
	r.Progress(ctx, 0, 1, "dumping the tenant's definitions in the scratch instance")
	pre, err := dumpSQL(ctx, c.dsn, c.into.Mode, intoName, exts, "--section=pre-data")
	if err != nil {
		return err
	}
	post, err := dumpSQL(ctx, c.dsn, c.into.Mode, intoName, exts, "--section=post-data")
	if err != nil {
		return err
	}
	sess, err := s.Agents.Open(ctx, c.cl, sandbox.TargetOf(c.into), "pgtenant copy")
	if err != nil {
		return err
	}
	defer sess.Close(context.WithoutCancel(ctx))
	tx, err := sess.Conn().Begin(ctx)
	if err != nil {
		return cluster.Classify(err)
	}
	defer tx.Rollback(context.WithoutCancel(ctx))
	role := cluster.Ident(intoName)
	if _, err := tx.Exec(ctx, "SET LOCAL ROLE "+role+";\n"+pre); err != nil {
		return jobs.Permanent(fmt.Errorf("restore the definitions of %s into tenant %s: %w", c.what, c.into.ID, cluster.Classify(err)))
	}
	c.phases.done("definitions")
	tables, err := copiedTables(ctx, c.sconn, schemas)
	if err != nil {
		return err
	}
	same := major(c.sconn) == major(tx.Conn())
	var total int64
	for i, t := range tables {
		total += t.size
		tables[i].binary = t.binary && same
	}
	p := &pacer{ctx: ctx, r: r, clusters: []string{c.cl.Name()}, total: total}
	copied := map[string]int64{}
	for i, t := range tables {
		p.msg = fmt.Sprintf("copying %s into tenant %s", c.what, c.into.ID)
		p.table = fmt.Sprintf("table %d of %d (%s)", i+1, len(tables), t.ident())
		n, err := copyTable(ctx, c.sconn, tx.Conn(), t, p)
		if err != nil {
			return fmt.Errorf("copy %s: %w", t.ident(), err)
		}
		p.rows += n
		copied[t.schema+"."+t.name] = n
	}
	if err := copySequences(ctx, c.sconn, tx, schemas); err != nil {
		return err
	}
	c.phases.done("rows")
	r.Progress(ctx, p.n, max(p.n, total), "building the copy's indexes, constraints and triggers")
	if _, err := tx.Exec(ctx, "SET LOCAL search_path = pg_catalog, pg_temp; SET LOCAL ROLE "+role+";\n"+post); err != nil {
		return jobs.Permanent(fmt.Errorf("restore the indexes, constraints and triggers of %s into tenant %s: %w", c.what, c.into.ID, cluster.Classify(err)))
	}
	c.phases.done("indexes")
	var mark string
	if c.into.Mode == tenant.ModeDatabase {
		mark = fmt.Sprintf("SET LOCAL search_path = pg_catalog, pg_temp; RESET ROLE; COMMENT ON SCHEMA %s IS %s", cluster.Ident(tenant.MarkerSchema), cluster.Literal(c.marker))
	} else {
		mark = fmt.Sprintf("SET LOCAL search_path = pg_catalog, pg_temp; COMMENT ON SCHEMA %s IS %s", role, cluster.Literal(c.marker))
	}
	if _, err := tx.Exec(ctx, mark); err != nil {
		return cluster.Classify(err)
	}
	if c.verify != nil {
		if err := c.verify(copied); err != nil {
			return jobs.Permanent(err)
		}
	}
	if err := tx.Commit(ctx); err != nil {
		return fmt.Errorf("commit the copy of %s into tenant %s: %w", c.what, c.into.ID, cluster.Classify(err))
	}
	c.phases.done("commit")
	r.Note(ctx, fmt.Sprintf("copied %s (%s) of %s into tenant %s", count(p.rows, "row"), mbs(p.n), c.what, c.into.ID))
	return nil
}

// emptyStorage makes a new tenant's storage anew, empty: its database as a
// move's target makes it, or its schema dropped and made again.
func (s *Service) emptyStorage(ctx context.Context, r *jobs.Run, cl *cluster.Cluster, into catalog.Tenant, prewarm bool) error {
	name := tenant.PhysicalName(into.ID)
	if _, err := purge.EndSessions(ctx, cl, name, tenant.AgentRole(into.ID)); err != nil {
		return err
	}
	if into.Mode == tenant.ModeDatabase {
		admin, err := cl.Admin(ctx)
		if err != nil {
			return err
		}
		cl.ClosePool(name)
		if err := cluster.DropDatabase(ctx, admin, name); err != nil {
			return err
		}
		return makeDatabase(ctx, r, cl, into, s.Provision.Tiers[into.Tier], prewarm)
	}
	conn, err := cl.Connect(ctx, into.Database)
	if err != nil {
		return err
	}
	defer conn.Close(context.WithoutCancel(ctx))
	_, err = conn.Exec(ctx, fmt.Sprintf("DROP SCHEMA IF EXISTS %[1]s CASCADE; CREATE SCHEMA %[1]s AUTHORIZATION %[1]s", cluster.Ident(name)))
	return cluster.Classify(err)
}

// markerOn reads a tenant's version marker in a session on its database.
func markerOn(ctx context.Context, conn *pgx.Conn, t catalog.Tenant) (string, error) {
	schema := tenant.PhysicalName(t.ID)
	if t.Mode == tenant.ModeDatabase {
		schema = tenant.MarkerSchema
	}
	var c *string
	err := conn.QueryRow(ctx, `SELECT pg_catalog.obj_description(oid, 'pg_namespace') FROM pg_catalog.pg_namespace WHERE nspname = $1`, schema).Scan(&c)
	if errors.Is(err, pgx.ErrNoRows) || c == nil {
		return "", nil
	}
	return *c, cluster.Classify(err)
}

func hasExtension(ctx context.Context, conn *pgx.Conn, name string) bool {
	var ok bool
	_ = conn.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM pg_catalog.pg_extension WHERE extname = $1)`, name).Scan(&ok)
	return ok
}

// copiedTables are the tables with rows in schemas: ordinary tables and
// partitions, not an extension's, with their stored columns, and whether
// they can be copied in binary (table.binary: every column's type, and an
// array's element type, built in, below FirstNormalObjectId, with binary
// I/O; aclitem, for one, has none).
func copiedTables(ctx context.Context, conn *pgx.Conn, schemas []string) ([]table, error) {
	rows, err := conn.Query(ctx, `SELECT n.nspname::text, c.relname::text, pg_catalog.pg_table_size(c.oid),
			coalesce((SELECT pg_catalog.array_agg(a.attname::text ORDER BY a.attnum) FROM pg_catalog.pg_attribute a
				WHERE a.attrelid = c.oid AND a.attnum > 0 AND NOT a.attisdropped AND a.attgenerated = ''), '{}'),
			NOT EXISTS (SELECT 1 FROM pg_catalog.pg_attribute a JOIN pg_catalog.pg_type ty ON ty.oid = a.atttypid
				LEFT JOIN pg_catalog.pg_type el ON el.oid = ty.typelem
				WHERE a.attrelid = c.oid AND a.attnum > 0 AND NOT a.attisdropped AND a.attgenerated = ''
				  AND (ty.oid >= 16384 OR ty.typsend = 0 OR ty.typreceive = 0
				    OR el.oid >= 16384 OR el.typsend = 0 OR el.typreceive = 0))
		FROM pg_catalog.pg_class c JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace
		WHERE c.relkind = 'r' AND n.nspname = ANY($1)
		  AND NOT EXISTS (SELECT 1 FROM pg_catalog.pg_depend d WHERE d.classid = 'pg_catalog.pg_class'::pg_catalog.regclass
			AND d.objid = c.oid AND d.deptype = 'e')
		ORDER BY 1, 2`, schemas)
	if err != nil {
		return nil, fmt.Errorf("list the tables to copy: %w", cluster.Classify(err))
	}
	return pgx.CollectRows(rows, func(row pgx.CollectableRow) (table, error) {
		var t table
		return t, row.Scan(&t.schema, &t.name, &t.size, &t.columns, &t.binary)
	})
}

// major is the major version of the server conn is on ("15").
func major(conn *pgx.Conn) string {
	v, _, _ := strings.Cut(conn.PgConn().ParameterStatus("server_version"), ".")
	return v
}

// copySequences sets each sequence of schemas as the source has it.
func copySequences(ctx context.Context, src *pgx.Conn, dst pgx.Tx, schemas []string) error {
	rows, err := src.Query(ctx, `SELECT pg_catalog.quote_ident(schemaname) || '.' || pg_catalog.quote_ident(sequencename), last_value
		FROM pg_catalog.pg_sequences WHERE schemaname = ANY($1) AND last_value IS NOT NULL`, schemas)
	if err != nil {
		return cluster.Classify(err)
	}
	type seq struct {
		name string
		last int64
	}
	seqs, err := pgx.CollectRows(rows, func(row pgx.CollectableRow) (seq, error) {
		var s seq
		return s, row.Scan(&s.name, &s.last)
	})
	if err != nil {
		return cluster.Classify(err)
	}
	for _, s := range seqs {
		if _, err := dst.Exec(ctx, "SELECT pg_catalog.setval($1::pg_catalog.regclass, $2, true)", s.name, s.last); err != nil {
			return fmt.Errorf("set sequence %s: %w", s.name, cluster.Classify(err))
		}
	}
	return nil
}

// storageOID is the oid of the database or schema named name in t's mode
// (0: none).
func storageOID(ctx context.Context, cl *cluster.Cluster, t catalog.Tenant, name string) (uint32, error) {
	var oid uint32
	var err error
	if t.Mode == tenant.ModeDatabase {
		admin, aerr := cl.Admin(ctx)
		if aerr != nil {
			return 0, aerr
		}
		err = admin.QueryRow(ctx, `SELECT oid FROM pg_catalog.pg_database WHERE datname = $1`, name).Scan(&oid)
	} else {
		conn, cerr := cl.Connect(ctx, t.Database)
		if cerr != nil {
			return 0, cerr
		}
		defer conn.Close(context.WithoutCancel(ctx))
		err = conn.QueryRow(ctx, `SELECT oid FROM pg_catalog.pg_namespace WHERE nspname = $1`, name).Scan(&oid)
	}
	if errors.Is(err, pgx.ErrNoRows) {
		return 0, nil
	}
	return oid, cluster.Classify(err)
}

// swap exchanges the source's storage and the copy's, with the source's
// pool paused and its sessions ended: the names (renamed in one
// transaction), then the owners. The source's role, DSN and password then
// reach its past; the new tenant's, what the rewind replaced.
func (f *forker) swap(ctx context.Context, r *jobs.Run, e *fenv) error {
	srcName, intoName := tenant.PhysicalName(e.src.ID), tenant.PhysicalName(e.into.ID)
	front := f.s.Poolers.Get(e.src.FrontCluster())
	// The source's extra logins follow its storage: out during the swap,
	// their grants made on the copy, back in with the tenant.
	logins, err := f.s.Store.Logins(ctx, nil, e.src.ID)
	if err != nil {
		return err
	}
	if e.st.Restored == 0 {
		oid, err := storageOID(ctx, e.cl, e.into, intoName)
		if err != nil {
			return err
		}
		e.st.Restored = oid
		if err := r.SaveData(ctx, e.st); err != nil {
			return err
		}
	}
	have, err := storageOID(ctx, e.cl, e.src, srcName)
	if err != nil {
		return err
	}
	var paused time.Time
	if have != e.st.Restored {
		ended, err := f.s.pause(ctx, front, e.cl, e.src, srcName)
		if err != nil {
			return err
		}
		paused = time.Now()
		resume := func(cause error) error {
			uctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 15*time.Second)
			defer cancel()
			return errors.Join(cause, f.unlock(uctx, e), f.resume(uctx, front, srcName))
		}
		if ended > 0 {
			if err := f.s.Store.AddEvent(ctx, f.s.Store.Pool(), e.src.ID, "rewind_sessions_ended", map[string]any{"sessions": ended, "job": r.Job.ID}); err != nil {
				return resume(err)
			}
		}
		if err := lockOut(ctx, e.cl, append([]string{srcName, tenant.AgentRole(e.src.ID), intoName, tenant.AgentRole(e.into.ID)}, catalog.LoginRoles(logins)...)...); err != nil {
			return resume(err)
		}
		e.st.ReplacedAt = &paused
		if err := f.rename(ctx, e, srcName, intoName); err != nil {
			return resume(err)
		}
		if err := crashPoint(ctx, "swap:renamed"); err != nil {
			return err
		}
	}
	if err := f.exchangeOwners(ctx, e, srcName, intoName); err != nil {
		return err
	}
	for _, l := range logins {
		if err := credentials.GrantLogin(ctx, e.cl, e.src, l); err != nil {
			return err
		}
	}
	if err := f.unlock(ctx, e); err != nil {
		return err
	}
	if err := f.resume(ctx, front, srcName); err != nil {
		return err
	}
	if !paused.IsZero() {
		e.st.PauseMS = time.Since(paused).Milliseconds()
	}
	return r.SaveData(ctx, e.st)
}

// rename swaps the two names in one transaction.
func (f *forker) rename(ctx context.Context, e *fenv, srcName, intoName string) error {
	kept := "pgt_swap_" + e.src.ID
	a, b, k := cluster.Ident(srcName), cluster.Ident(intoName), cluster.Ident(kept)
	if e.src.Mode == tenant.ModeSchema {
		conn, err := e.cl.Connect(ctx, e.src.Database)
		if err != nil {
			return err
		}
		defer conn.Close(context.WithoutCancel(ctx))
		// The owners too, in the same transaction: each tenant's role owns
		// what is in its schema (and, in the shared database, nothing else
		// but its large objects, which go with the replaced state).
		_, err = conn.Exec(ctx, fmt.Sprintf(`BEGIN; SET LOCAL lock_timeout = '10s';
			ALTER SCHEMA %[1]s RENAME TO %[3]s; ALTER SCHEMA %[2]s RENAME TO %[1]s; ALTER SCHEMA %[3]s RENAME TO %[2]s;
			CREATE ROLE %[3]s NOLOGIN;
			REASSIGN OWNED BY %[1]s TO %[3]s; REASSIGN OWNED BY %[2]s TO %[1]s; REASSIGN OWNED BY %[3]s TO %[2]s;
			DROP ROLE %[3]s; COMMIT`, a, b, k))
		if err != nil {
			_, _ = conn.Exec(context.WithoutCancel(ctx), "ROLLBACK")
			return fmt.Errorf("swap schemas %s and %s: %w", srcName, intoName, cluster.Classify(err))
		}
		return nil
	}
	admin, err := e.cl.Admin(ctx)
	if err != nil {
		return err
	}
	e.cl.ClosePool(srcName)
	e.cl.ClosePool(intoName)
	var last error
	for attempt := 0; attempt < 5; attempt++ {
		// Sessions of other roles in the two databases (the daemon's own
		// samplers) end too: a database in use cannot be renamed.
		if _, err := admin.Exec(ctx, `SELECT pg_catalog.pg_terminate_backend(pid) FROM pg_catalog.pg_stat_activity
			WHERE datname = ANY($1) AND pid <> pg_catalog.pg_backend_pid()`, []string{srcName, intoName}); err != nil {
			return cluster.Classify(err)
		}
		_, last = admin.Exec(ctx, fmt.Sprintf(`BEGIN; ALTER DATABASE %[1]s RENAME TO %[3]s; ALTER DATABASE %[2]s RENAME TO %[1]s;
			ALTER DATABASE %[3]s RENAME TO %[2]s; COMMIT`, a, b, k))
		if last == nil {
			return nil
		}
		_, _ = admin.Exec(context.WithoutCancel(ctx), "ROLLBACK")
		time.Sleep(200 * time.Millisecond)
	}
	return fmt.Errorf("swap databases %s and %s: %w", srcName, intoName, cluster.Classify(last))
}

// exchangeOwners gives, in database mode, each database's objects and
// privileges to the tenant whose name it now has (idempotent: run again
// after a crash, it finds them given). In schema mode rename did it.
func (f *forker) exchangeOwners(ctx context.Context, e *fenv, srcName, intoName string) error {
	if e.src.Mode != tenant.ModeDatabase {
		return nil
	}
	admin, err := e.cl.Admin(ctx)
	if err != nil {
		return err
	}
	for _, side := range []struct {
		db       catalog.Tenant // the tenant whose name the database has now
		from, to string
	}{{e.src, e.into.ID, e.src.ID}, {e.into, e.src.ID, e.into.ID}} {
		db := tenant.PhysicalName(side.to)
		conn, err := e.cl.Connect(ctx, db)
		if err != nil {
			return err
		}
		_, err = conn.Exec(ctx, fmt.Sprintf("REASSIGN OWNED BY %s TO %s; REASSIGN OWNED BY %s TO %s",
			cluster.Ident(tenant.PhysicalName(side.from)), cluster.Ident(db),
			cluster.Ident(tenant.AgentRole(side.from)), cluster.Ident(tenant.AgentRole(side.to))))
		conn.Close(context.WithoutCancel(ctx))
		if err != nil {
			return fmt.Errorf("give database %s's objects to its tenant: %w", db, cluster.Classify(err))
		}
		if _, err := admin.Exec(ctx, fmt.Sprintf("REVOKE ALL ON DATABASE %[1]s FROM %[2]s, %[3]s; GRANT ALL ON DATABASE %[1]s TO %[1]s",
			cluster.Ident(db), cluster.Ident(tenant.PhysicalName(side.from)), cluster.Ident(tenant.AgentRole(side.from)))); err != nil {
			return cluster.Classify(err)
		}
		if err := sandbox.GrantConnect(ctx, admin, sandbox.Target{ID: side.to, Mode: tenant.ModeDatabase, Database: db, Template: side.db.Template}); err != nil {
			return err
		}
	}
	e.cl.ClosePool(srcName)
	e.cl.ClosePool(intoName)
	return nil
}

// unlock lets the source's role, agent and extra logins log in again (the
// new tenant's stay out: it is suspended, or dropped).
func (f *forker) unlock(ctx context.Context, e *fenv) error {
	t, err := f.s.Store.GetTenant(ctx, nil, e.src.ID)
	if err != nil || t.State != catalog.StateActive {
		return err
	}
	logins, err := f.s.Store.Logins(ctx, nil, e.src.ID)
	if err != nil {
		return err
	}
	return purge.SetLogin(ctx, e.cl, true, append([]string{tenant.PhysicalName(e.src.ID), tenant.AgentRole(e.src.ID)}, catalog.LoginRoles(logins)...)...)
}

func (f *forker) resume(ctx context.Context, front *pooler.Front, name string) error {
	if front == nil {
		return nil
	}
	return front.Resume(ctx, name)
}

// finish records the outcome. A fork's tenant is let in; after a rewind,
// the source has the version it had then, and the new tenant, which holds
// what the rewind replaced, is dropped: restorable for the drop retention.
func (f *forker) finish(ctx context.Context, r *jobs.Run, e *fenv) error {
	m, _ := tenant.ParseMarker(e.st.Marker)
	if !f.a.Rewind {
		if err := pgx.BeginFunc(ctx, f.s.Store.Pool(), func(tx pgx.Tx) error {
			if err := f.s.Store.SetTenantVersion(ctx, tx, e.into.ID, m.Version); err != nil {
				return err
			}
			if e.into.State != catalog.StateSuspended {
				return nil // recorded already
			}
			detail := map[string]any{"from": e.src.ID, "at": f.a.At, "version": m.Version, "job": r.Job.ID}
			if err := f.s.Store.AddEvent(ctx, tx, e.into.ID, "forked", detail); err != nil {
				return err
			}
			return f.s.Store.AddEvent(ctx, tx, e.src.ID, "fork_made", map[string]any{"into": e.into.ID, "at": f.a.At, "job": r.Job.ID})
		}); err != nil {
			return err
		}
		_, err := f.s.Lifecycle.Resume(ctx, e.into.ID)
		return err
	}
	if e.into.State == catalog.StateSuspended {
		err := pgx.BeginFunc(ctx, f.s.Store.Pool(), func(tx pgx.Tx) error {
			if err := f.s.Store.SetTenantVersion(ctx, tx, e.src.ID, m.Version); err != nil {
				return err
			}
			if err := f.s.Store.SetTenantVersion(ctx, tx, e.into.ID, e.src.Version); err != nil {
				return err
			}
			detail := map[string]any{"to": f.a.At, "kept_as": e.into.ID, "replaced_at": e.st.ReplacedAt, "pause_ms": e.st.PauseMS,
				"version": m.Version, "job": r.Job.ID}
			if err := f.s.Store.AddEvent(ctx, tx, e.src.ID, "rewound", detail); err != nil {
				return err
			}
			return f.s.Store.AddEvent(ctx, tx, e.into.ID, "rewind_replaced", map[string]any{"of": e.src.ID, "replaced_at": e.st.ReplacedAt, "job": r.Job.ID})
		})
		if err != nil {
			return err
		}
	}
	_, err := f.s.Lifecycle.Drop(ctx, e.into.ID, false)
	return err
}

// cleanup, for a job that ends failed or cancelled: the scratch instance
// goes; the source is let in and resumed; the new tenant, unless it holds
// what a swap replaced, is dropped and purged.
func (f *forker) cleanup(ctx context.Context, r *jobs.Run) error {
	var errs []error
	src, err := f.s.Store.GetTenant(ctx, nil, f.a.Tenant)
	if err != nil {
		return err
	}
	if st, err := f.s.Backups.Stanza(src.Cluster); err == nil {
		errs = append(errs, st.ScratchFor(f.scratchName(r)).Remove(ctx))
	}
	e, err := f.load(ctx, r)
	if err != nil {
		if errors.Is(err, catalog.ErrNotFound) || jobs.IsPermanent(err) {
			return errors.Join(errs...)
		}
		return errors.Join(append(errs, err)...)
	}
	swapped := false
	if f.a.Rewind && e.st.Restored != 0 {
		have, err := storageOID(ctx, e.cl, e.src, tenant.PhysicalName(e.src.ID))
		if err != nil {
			return errors.Join(append(errs, err)...)
		}
		swapped = have == e.st.Restored
		if swapped {
			// Past the renames: finish the exchange rather than undo it.
			errs = append(errs, f.exchangeOwners(ctx, e, tenant.PhysicalName(e.src.ID), tenant.PhysicalName(e.into.ID)))
		}
		errs = append(errs, f.unlock(ctx, e), f.resume(ctx, f.s.Poolers.Get(e.src.FrontCluster()), tenant.PhysicalName(e.src.ID)))
	}
	if !swapped {
		_, err := f.s.Lifecycle.Drop(ctx, e.into.ID, true)
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}
