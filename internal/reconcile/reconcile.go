// Package reconcile compares the catalog with what exists on each cluster:
// databases, schemas and roles carrying pgtenant's prefixes, and template
// databases. It reports objects without a catalog row and rows without their
// objects; with fix it finishes or rolls back what an interrupted job left,
// and it never drops anything it cannot attribute to pgtenant's own work: such
// objects are listed, not touched.
package reconcile

import (
	"context"
	"fmt"
	"log/slog"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pgtenant/pgtenant/internal/catalog"
	"github.com/pgtenant/pgtenant/internal/cluster"
	"github.com/pgtenant/pgtenant/internal/config"
	"github.com/pgtenant/pgtenant/internal/jobs"
	"github.com/pgtenant/pgtenant/internal/purge"
	"github.com/pgtenant/pgtenant/internal/templates"
	"github.com/pgtenant/pgtenant/internal/tenant"
)

// Kinds of findings.
const (
	Orphan   = "orphan"   // an object on a cluster without a catalog row
	Missing  = "missing"  // a catalog row whose object is not on its cluster
	Mismatch = "mismatch" // both exist but disagree (a spare that can log in …)
)

// Finding is one discrepancy.
type Finding struct {
	Cluster string `json:"cluster"`
	Kind    string `json:"kind"`
	Object  string `json:"object"` // "database t_…", "role t_…", "schema t_… in pgt_shared_x", "tenant …"
	Tenant  string `json:"tenant,omitempty"`
	Detail  string `json:"detail"`
	// Action is what fix does (or did, when Fixed): dropped, locked out,
	// purge enqueued, rebuild enqueued, or "none: not attributable" for
	// objects pgtenant did not demonstrably make.
	Action string `json:"action"`
	Fixed  bool   `json:"fixed"`
	Error  string `json:"error,omitempty"`
}

// Report is one reconciliation.
type Report struct {
	At       time.Time      `json:"at"`
	Fix      bool           `json:"fix"`
	Clusters []string       `json:"clusters"`
	Checked  map[string]int `json:"checked"` // objects and rows looked at, by kind
	Findings []Finding      `json:"findings"`
	Errors   []string       `json:"errors,omitempty"` // clusters that could not be checked
}

// Reconciler checks clusters against the catalog.
type Reconciler struct {
	Store     *catalog.Store
	Clusters  *cluster.Registry
	Runner    *jobs.Runner
	Templates *templates.Service
	Config    config.Config
	Logger    *slog.Logger
}

// Run reconciles one cluster (or all with clusterName "").
func (r *Reconciler) Run(ctx context.Context, clusterName string, fix bool) (Report, error) {
	rep := Report{At: time.Now(), Fix: fix, Checked: map[string]int{}, Findings: []Finding{}}
	var cls []*cluster.Cluster
	if clusterName != "" {
		cl, err := r.Clusters.Get(clusterName)
		if err != nil {
			return rep, err
		}
		cls = []*cluster.Cluster{cl}
	} else {
		cls = r.Clusters.All()
		sort.Slice(cls, func(i, j int) bool { return cls[i].Name() < cls[j].Name() })
	}
	for _, cl := range cls {
		rep.Clusters = append(rep.Clusters, cl.Name())
		if err := r.cluster(ctx, cl, fix, &rep); err != nil {
			rep.Errors = append(rep.Errors, fmt.Sprintf("%s: %v", cl.Name(), err))
		}
	}
	return rep, nil
}

// observed is what exists on a cluster.
type observed struct {
	databases map[string]bool            // name → is a template
	roles     map[string]bool            // name → can log in
	schemas   map[string]map[string]bool // shared database → schema → fully built (has the marker comment)
}

var buildDBRE = regexp.MustCompile(`^pgt_build_(\d+)$`)

// finding is a Finding with the repair fix would make.
type finding struct {
	Finding
	repair func(ctx context.Context) error
}

func (r *Reconciler) cluster(ctx context.Context, cl *cluster.Cluster, fix bool, rep *Report) error {
	// Read the cluster first, then the catalog: rows are always written
	// before the objects they describe, so an object seen here has its row
	// visible below unless it really is an orphan. Rows created after the
	// scan started are not judged.
	scanStart := time.Now()
	obs, err := r.observe(ctx, cl)
	if err != nil {
		return err
	}
	s := &scan{r: r, cl: cl, obs: obs, scanStart: scanStart, rows: map[string]catalog.Tenant{}}
	rows, err := r.Store.ListTenantsOnCluster(ctx, cl.Name())
	if err != nil {
		return err
	}
	for _, t := range rows {
		s.rows[t.ID] = t
	}
	if s.builds, err = r.Store.Builds(ctx, ""); err != nil {
		return err
	}
	if s.jobs, err = r.jobTargets(ctx); err != nil {
		return err
	}
	rep.Checked["databases"] += len(obs.databases)
	rep.Checked["roles"] += len(obs.roles)
	for _, sc := range obs.schemas {
		rep.Checked["schemas"] += len(sc)
	}
	rep.Checked["tenant_rows"] += len(rows)
	for _, f := range s.compare() {
		f.Cluster = cl.Name()
		if fix && f.repair != nil {
			if err := f.repair(ctx); err != nil {
				f.Error = err.Error()
			} else {
				f.Fixed = true
			}
		}
		rep.Findings = append(rep.Findings, f.Finding)
	}
	return nil
}

func (r *Reconciler) observe(ctx context.Context, cl *cluster.Cluster) (observed, error) {
	obs := observed{databases: map[string]bool{}, roles: map[string]bool{}, schemas: map[string]map[string]bool{}}
	admin, err := cl.Admin(ctx)
	if err != nil {
		return obs, err
	}
	rows, err := admin.Query(ctx, `SELECT datname, datistemplate FROM pg_database WHERE datname LIKE 't\_%' OR datname LIKE 'pgt\_%'`)
	if err != nil {
		return obs, cluster.Classify(err)
	}
	var shared []string
	for rows.Next() {
		var name string
		var isTemplate bool
		if err := rows.Scan(&name, &isTemplate); err != nil {
			return obs, err
		}
		obs.databases[name] = isTemplate
		if strings.HasPrefix(name, templates.SharedDatabase("")) {
			shared = append(shared, name)
		}
	}
	if err := rows.Err(); err != nil {
		return obs, err
	}
	rows, err = admin.Query(ctx, `SELECT rolname, rolcanlogin FROM pg_catalog.pg_roles WHERE rolname LIKE 't\_%' OR rolname LIKE 'pgt\_agent\_%'`)
	if err != nil {
		return obs, cluster.Classify(err)
	}
	for rows.Next() {
		var name string
		var login bool
		if err := rows.Scan(&name, &login); err != nil {
			return obs, err
		}
		obs.roles[name] = login
	}
	if err := rows.Err(); err != nil {
		return obs, err
	}
	for _, db := range shared {
		p, err := cl.Pool(ctx, db)
		if err != nil {
			return obs, err
		}
		rows, err := p.Query(ctx, `SELECT nspname, coalesce(pg_catalog.obj_description(oid, 'pg_namespace'), '') LIKE 'pgtenant: built%'
			FROM pg_catalog.pg_namespace WHERE nspname LIKE 't\_%'`)
		if err != nil {
			return obs, cluster.Classify(err)
		}
		obs.schemas[db] = map[string]bool{}
		for rows.Next() {
			var name string
			var built bool
			if err := rows.Scan(&name, &built); err != nil {
				return obs, err
			}
			obs.schemas[db][name] = built
		}
		if err := rows.Err(); err != nil {
			return obs, err
		}
	}
	return obs, nil
}

// jobRefs says, per job target, whether pgtenant has ever had a job for it,
// whether one is unfinished, and the newest purge job when it failed.
type jobRefs map[string]jobRef

type jobRef struct {
	any, active bool
	failedPurge *int64 // id of the target's newest purge job, when it failed
	purgeError  string
}

func (r *Reconciler) jobTargets(ctx context.Context) (jobRefs, error) {
	rows, err := r.Store.Pool().Query(ctx, `SELECT target, bool_or(state IN ('queued', 'running', 'waiting', 'paused')),
		       (array_agg(id ORDER BY id DESC) FILTER (WHERE type = $1))[1],
		       (array_agg(state ORDER BY id DESC) FILTER (WHERE type = $1))[1],
		       (array_agg(last_error ORDER BY id DESC) FILTER (WHERE type = $1))[1]
		FROM jobs WHERE target <> '' GROUP BY target`, purge.Job)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	out := jobRefs{}
	for rows.Next() {
		var target string
		var ref jobRef
		var purgeID *int64
		var purgeState, purgeErr *string
		if err := rows.Scan(&target, &ref.active, &purgeID, &purgeState, &purgeErr); err != nil {
			return nil, err
		}
		ref.any = true
		if purgeID != nil && *purgeState == "failed" {
			ref.failedPurge, ref.purgeError = purgeID, *purgeErr
		}
		out[target] = ref
	}
	return out, rows.Err()
}

// scan is one cluster's comparison.
type scan struct {
	r         *Reconciler
	cl        *cluster.Cluster
	obs       observed
	rows      map[string]catalog.Tenant
	builds    []catalog.TemplateBuild
	jobs      jobRefs
	scanStart time.Time
}

const notAttributable = "none: not attributable to pgtenant's jobs; inspect it and drop it by hand if it is garbage"

func (s *scan) compare() []finding {
	var out []finding
	out = append(out, s.databases()...)
	out = append(out, s.roles()...)
	out = append(out, s.schemas()...)
	out = append(out, s.tenantRows()...)
	out = append(out, s.templateBuilds()...)
	return out
}

// databases: tenant databases without rows, template and build databases
// nobody uses.
func (s *scan) databases() []finding {
	var out []finding
	names := sortedKeys(s.obs.databases)
	for _, db := range names {
		if id, ok := tenant.IDFromPhysical(db); ok {
			t, has := s.rows[id]
			switch {
			case !has:
				out = append(out, s.orphanTenantObject("database "+db, id, func(ctx context.Context) error {
					admin, err := s.cl.Admin(ctx)
					if err != nil {
						return err
					}
					return cluster.DropDatabase(ctx, admin, db)
				}))
			case t.Mode != "database":
				out = append(out, finding{Finding: Finding{Kind: Mismatch, Object: "database " + db, Tenant: id,
					Detail: "tenant " + id + " is a schema tenant but a database carries its name", Action: notAttributable}})
			}
			continue
		}
		if m := buildDBRE.FindStringSubmatch(db); m != nil {
			if s.jobs[m[1]].active || s.activeBuildJob(m[1]) {
				continue
			}
			out = append(out, finding{Finding: Finding{Kind: Orphan, Object: "database " + db,
				Detail: "scratch database of template build job " + m[1] + ", which is not running", Action: "drop it"},
				repair: s.dropDatabase(db)})
			continue
		}
		if strings.HasPrefix(db, "pgt_tpl_") && !s.buildReady(db) {
			out = append(out, finding{Finding: Finding{Kind: Orphan, Object: "database " + db,
				Detail: "template database without a ready build in the catalog", Action: "drop it (a template holds no tenant data)"},
				repair: s.dropDatabase(db)})
		}
	}
	return out
}

func (s *scan) activeBuildJob(jobID string) bool {
	id, err := strconv.ParseInt(jobID, 10, 64)
	if err != nil {
		return false
	}
	j, err := jobs.Get(context.Background(), s.r.Store.Pool(), id)
	return err == nil && !jobs.Finished(j.State)
}

func (s *scan) buildReady(db string) bool {
	for _, b := range s.builds {
		if b.Cluster == s.cl.Name() && b.Database == db && b.State == "ready" {
			return true
		}
	}
	return false
}

// orphanTenantObject judges an object named after a tenant id without a row:
// dropped when pgtenant's own jobs worked on that id (and none does now),
// listed otherwise.
func (s *scan) orphanTenantObject(object, id string, drop func(context.Context) error) finding {
	f := finding{Finding: Finding{Kind: Orphan, Object: object, Tenant: id, Detail: "no catalog row for tenant " + id}}
	switch refs := s.jobs[id]; {
	case refs.active:
		f.Action = "none: a job is working on it"
	case refs.any:
		f.Action = "drop it (left by an interrupted job of pgtenant's)"
		f.repair = drop
	default:
		f.Action = notAttributable
	}
	return f
}

func (s *scan) roles() []finding {
	var out []finding
	for _, role := range sortedKeys(s.obs.roles) {
		id, ok := tenant.IDFromPhysical(role)
		if !ok {
			id, ok = tenant.IDFromAgent(role)
		}
		if !ok {
			continue
		}
		t, has := s.rows[id]
		if !has {
			out = append(out, s.orphanTenantObject("role "+role, id, func(ctx context.Context) error {
				admin, err := s.cl.Admin(ctx)
				if err != nil {
					return err
				}
				return cluster.DropRoles(ctx, admin, role)
			}))
			continue
		}
		if role != tenant.PhysicalName(id) {
			continue // an agent: it logs in whatever its tenant's state
		}
		canLogin := s.obs.roles[role]
		if canLogin && (t.State == catalog.StateSpare || t.State == catalog.StateBuilding) && !s.jobs[id].active {
			out = append(out, finding{Finding: Finding{Kind: Mismatch, Object: "role " + role, Tenant: id,
				Detail: "a spare's role can log in (a claim was interrupted)", Action: "lock it out"},
				repair: func(ctx context.Context) error { return purge.LockOut(ctx, s.cl, role) }})
		}
	}
	return out
}

func (s *scan) schemas() []finding {
	var out []finding
	for _, db := range sortedKeys(s.obs.schemas) {
		for _, schema := range sortedKeys(s.obs.schemas[db]) {
			id, ok := tenant.IDFromPhysical(schema)
			if !ok {
				continue
			}
			if _, has := s.rows[id]; has {
				continue
			}
			out = append(out, s.orphanTenantObject("schema "+schema+" in "+db, id, func(ctx context.Context) error {
				conn, err := s.cl.Connect(ctx, db)
				if err != nil {
					return err
				}
				defer conn.Close(context.WithoutCancel(ctx))
				return cluster.DropSchemaBatched(ctx, conn, schema, s.r.Config.Drop.BatchRelations, nil)
			}))
		}
	}
	return out
}

// tenantRows: rows whose objects are missing, and rows an interrupted job
// left in a transient state with no job to finish it.
func (s *scan) tenantRows() []finding {
	var out []finding
	for _, id := range sortedKeys(s.rows) {
		t := s.rows[id]
		if t.CreatedAt.After(s.scanStart) || s.jobs[id].active {
			continue
		}
		name := tenant.PhysicalName(id)
		switch ref := s.jobs[id]; {
		case t.State == catalog.StatePurging && ref.failedPurge != nil:
			// Enqueued again, it would fail the same way: the operator decides.
			out = append(out, finding{Finding: Finding{Kind: Mismatch, Object: "tenant " + id, Tenant: id,
				Detail: fmt.Sprintf("its purge (job %d) failed: %s", *ref.failedPurge, ref.purgeError),
				Action: fmt.Sprintf("none: fix what the error names, then `pgtenant job retry %d`", *ref.failedPurge)}})
			continue
		case t.State == catalog.StateBuilding, t.State == catalog.StateProvisioning, t.State == catalog.StatePurging, t.State == catalog.StateFailed:
			out = append(out, finding{Finding: Finding{Kind: Missing, Object: "tenant " + id, Tenant: id,
				Detail: "tenant is " + t.State + " but no job is working on it", Action: "roll back: enqueue its purge"},
				repair: s.enqueuePurge(t)})
			continue
		}
		var gone []string
		if _, ok := s.obs.roles[name]; !ok {
			gone = append(gone, "role")
		}
		if t.Mode == "database" {
			if _, ok := s.obs.databases[name]; !ok {
				gone = append(gone, "database")
			}
		} else if built, ok := s.obs.schemas[t.Database][name]; !ok || !built {
			gone = append(gone, "schema")
		}
		if len(gone) == 0 {
			continue
		}
		f := finding{Finding: Finding{Kind: Missing, Object: "tenant " + id, Tenant: id,
			Detail: fmt.Sprintf("%s tenant's %s not found on the cluster", t.State, strings.Join(gone, " and "))}}
		if t.State == catalog.StateSpare {
			f.Action, f.repair = "purge the broken spare", s.enqueuePurge(t)
		} else {
			f.Action = "none: the tenant's data is gone; restore it from a backup or drop the tenant"
		}
		out = append(out, f)
	}
	return out
}

func (s *scan) templateBuilds() []finding {
	var out []finding
	for _, b := range s.builds {
		if b.Cluster != s.cl.Name() || b.State != "ready" {
			continue
		}
		if _, ok := s.obs.databases[b.Database]; ok {
			continue
		}
		out = append(out, finding{Finding: Finding{Kind: Missing, Object: "database " + b.Database,
			Detail: fmt.Sprintf("template %s v%d is recorded ready but its database is gone", b.Template, b.Version),
			Action: "rebuild it"},
			repair: func(ctx context.Context) error { return s.r.Templates.Rebuild(ctx, b.Template, b.Version, b.Cluster) }})
	}
	return out
}

func (s *scan) enqueuePurge(t catalog.Tenant) func(context.Context) error {
	return func(ctx context.Context) error {
		return pgx.BeginFunc(ctx, s.r.Store.Pool(), func(tx pgx.Tx) error {
			if t.State != catalog.StatePurging {
				if err := s.r.Store.SetTenantState(ctx, tx, t.ID, catalog.StatePurging, t.State); err != nil {
					return err
				}
			}
			_, err := jobs.Enqueue(ctx, tx, purge.Spec(t, "reconcile: rolled back"), s.r.Config.Jobs.MaxAttempts)
			return err
		})
	}
}

func (s *scan) dropDatabase(db string) func(context.Context) error {
	return func(ctx context.Context) error {
		admin, err := s.cl.Admin(ctx)
		if err != nil {
			return err
		}
		return cluster.DropDatabase(ctx, admin, db)
	}
}

func sortedKeys[V any](m map[string]V) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}

// Loop runs the reconciler periodically with fix, logging what it finds.
type Loop struct {
	R        *Reconciler
	Interval time.Duration
}

// Run reconciles every Interval until ctx is done.
func (l *Loop) Run(ctx context.Context) error {
	if l.Interval <= 0 {
		<-ctx.Done()
		return nil
	}
	log := l.R.Logger.With("component", "reconcile")
	down := cluster.Outage{What: "reconcile"}
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-time.After(l.Interval):
		}
		rep, err := l.R.Run(ctx, "", true)
		if ctx.Err() == nil {
			down.Report(log, err)
		}
		if err != nil {
			continue
		}
		for _, f := range rep.Findings {
			log.Warn("reconcile finding", "cluster", f.Cluster, "kind", f.Kind, "object", f.Object, "detail", f.Detail,
				"action", f.Action, "fixed", f.Fixed, "err", f.Error)
		}
		for _, e := range rep.Errors {
			log.Warn("reconcile could not check a cluster", "err", e)
		}
	}
}
