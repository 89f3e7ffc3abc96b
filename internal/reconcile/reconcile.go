// Package reconcile compares the catalog with what exists on each cluster:
// databases, schemas and roles carrying pgtenant's prefixes, and template
// and shared databases (and connect roles) of templates the catalog knows. It reports objects without a catalog row and rows without their
// objects; with fix it finishes or rolls back what an interrupted job left,
// and it never drops anything it cannot attribute to pgtenant's own work: such
// objects are listed, not touched.
package reconcile

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pgtenant/pgtenant/internal/analytics"
	"github.com/pgtenant/pgtenant/internal/catalog"
	"github.com/pgtenant/pgtenant/internal/cluster"
	"github.com/pgtenant/pgtenant/internal/config"
	"github.com/pgtenant/pgtenant/internal/jobs"
	"github.com/pgtenant/pgtenant/internal/pooler"
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
	// objects pgtenant did not demonstrably make (a shared database of an
	// unknown template that holds what pgtenant did not put there).
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
	Drop      config.DropConfig
	Logger    *slog.Logger
	// Poolers: a cluster's PgBouncer's databases (SHOW DATABASES) are
	// compared with the catalog too; fix syncs it.
	Poolers *pooler.Set
	// Tiers: each database tenant's database lists its tier's extensions
	// (tenant.ExtensionsSetting); fix writes a list that differs (a tier
	// whose list the configuration changed), and installs the extension
	// guard with it where there was no list at all (a database made
	// before pgtenant had a guard).
	Tiers map[string]config.Tier
	// Analytics, if set, lists the analytics slots no mirror of the
	// catalog accounts for (the worst orphans: they retain WAL for ever);
	// fix drops them.
	Analytics *analytics.Service
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
	comments  map[string]string          // database → its comment (pgtenant's shared databases carry one)
	roles     map[string]bool            // name → can log in
	schemas   map[string]map[string]bool // shared database → schema → fully built (has the marker comment)
	others    map[string][]string        // shared database → its schemas that are no tenant's (public and the system's aside)
	public    map[string]int             // shared database → relations in its public schema
	exts      map[string]string          // database → its list of allowed extensions (tenant.ExtensionsSetting), where it has one
}

var buildDBRE = regexp.MustCompile(`^pgt_build_(\d+)$`)

// finding is a Finding with the repair fix would make.
type finding struct {
	Finding
	repair func(ctx context.Context) error
}

func (r *Reconciler) cluster(ctx context.Context, cl *cluster.Cluster, fix bool, rep *Report) error {
	s, err := r.scan(ctx, cl)
	if err != nil {
		return err
	}
	rep.Checked["databases"] += len(s.obs.databases)
	rep.Checked["roles"] += len(s.obs.roles)
	for _, sc := range s.obs.schemas {
		rep.Checked["schemas"] += len(sc)
	}
	rep.Checked["tenant_rows"] += len(s.rows)
	found := s.compare()
	if len(found) > 0 {
		// Jobs work while the scan reads: a purge drops a spare's role and
		// then its row between the two reads, a build ends between the
		// row and the job reads. Only what a second scan sees again is a
		// finding: an object there before the scan started and still
		// there after it, with no job of its tenant at work at any read.
		again, err := r.scan(ctx, cl)
		if err != nil {
			return err
		}
		found = seenTwice(found, again.compare())
	}
	if front := r.Poolers.Get(cl.Name()); front != nil {
		diffs, err := front.Compare(ctx)
		if err != nil {
			return fmt.Errorf("pooler: %w", err)
		}
		n, err := poolerEntries(ctx, front)
		if err != nil {
			return fmt.Errorf("pooler: %w", err)
		}
		rep.Checked["pooler_entries"] += n
		for _, d := range diffs {
			kind := map[string]string{"missing": Missing, "extra": Orphan, "mismatch": Mismatch}[d.Kind]
			id, _ := tenant.IDFromPhysical(d.Name)
			found = append(found, finding{Finding: Finding{Kind: kind, Object: "pooler entry " + d.Name, Tenant: id, Detail: d.Detail,
				Action: "sync the pooler with the catalog"}, repair: front.Sync})
		}
	}
	if r.Analytics != nil {
		orphans, err := r.Analytics.Orphans(ctx, cl)
		if err != nil {
			return fmt.Errorf("analytics slots: %w", err)
		}
		for _, o := range orphans {
			found = append(found, finding{Finding: Finding{Kind: Orphan, Object: "replication slot " + o.Slot, Tenant: o.Tenant,
				Detail: fmt.Sprintf("no analytics mirror in the catalog; it retains %d bytes of WAL (active: %v)", o.RetainedBytes, o.Active),
				Action: "drop the slot"}, repair: func(ctx context.Context) error { return analytics.DropSlot(ctx, cl, o.Slot) }})
		}
	}
	// A job that started on a tenant since it was read owns its objects
	// now: not a finding, and never repaired under it. Read once for all
	// the findings (one read of the jobs per finding was minutes with
	// thousands of findings and a month of jobs: bench density).
	var busy map[string]bool
	if len(found) > 0 {
		var err error
		if busy, err = jobs.AtWork(ctx, r.Store.Pool()); err != nil {
			return err
		}
	}
	for _, f := range found {
		f.Cluster = cl.Name()
		if f.Tenant != "" && busy[f.Tenant] {
			continue
		}
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

// scan reads one cluster and then the catalog. Rows are always written
// before the objects they describe, so an object seen here has its row
// visible below unless it really is an orphan (or a job is at work on its
// tenant: a purge drops the objects before the row, a move makes its copy
// on the target before the row says it lives there). The jobs at work are
// read before the cluster and again after the rows: a tenant with a job at
// work at either read is left to its job. Rows created after the scan
// started are not judged. The history is read last, of the tenants it
// judges only (jobRefs).
func (r *Reconciler) scan(ctx context.Context, cl *cluster.Cluster) (*scan, error) {
	scanStart := time.Now()
	before, err := jobs.AtWork(ctx, r.Store.Pool())
	if err != nil {
		return nil, err
	}
	obs, err := r.observe(ctx, cl)
	if err != nil {
		return nil, err
	}
	s := &scan{r: r, cl: cl, obs: obs, scanStart: scanStart, rows: map[string]catalog.Tenant{}}
	rows, err := r.Store.ListTenantsOnCluster(ctx, cl.Name())
	if err != nil {
		return nil, err
	}
	for _, t := range rows {
		s.rows[t.ID] = t
	}
	if s.builds, err = r.Store.Builds(ctx, ""); err != nil {
		return nil, err
	}
	tpls, err := r.Store.Templates(ctx)
	if err != nil {
		return nil, err
	}
	s.templates = map[string]catalog.Template{}
	for _, t := range tpls {
		s.templates[t.Name] = t
	}
	after, err := jobs.AtWork(ctx, r.Store.Pool())
	if err != nil {
		return nil, err
	}
	if s.jobs, err = r.jobRefs(ctx, s.judged()); err != nil {
		return nil, err
	}
	for _, busy := range []map[string]bool{before, after} {
		for id := range busy {
			ref := s.jobs[id]
			ref.any, ref.active = true, true
			s.jobs[id] = ref
		}
	}
	return s, nil
}

// judged are the tenants whose job history the comparison reads: those
// with objects on the cluster and no row (orphans, attributable when
// pgtenant had a job for them) and the rows being purged (a failed purge
// is the operator's to retry).
func (s *scan) judged() []string {
	ids := map[string]bool{}
	add := func(id string, ok bool) {
		if _, has := s.rows[id]; ok && !has {
			ids[id] = true
		}
	}
	for db := range s.obs.databases {
		add(tenant.IDFromPhysical(db))
	}
	for role := range s.obs.roles {
		add(roleTenant(role))
	}
	for _, schemas := range s.obs.schemas {
		for schema := range schemas {
			add(tenant.IDFromPhysical(schema))
		}
	}
	for id, t := range s.rows {
		if t.State == catalog.StatePurging {
			ids[id] = true
		}
	}
	return sortedKeys(ids)
}

// seenTwice keeps the findings of the second scan that the first one made
// too (same kind, same object).
func seenTwice(first, second []finding) []finding {
	seen := map[[2]string]bool{}
	for _, f := range first {
		seen[[2]string{f.Kind, f.Object}] = true
	}
	var out []finding
	for _, f := range second {
		if seen[[2]string{f.Kind, f.Object}] {
			out = append(out, f)
		}
	}
	return out
}

// poolerEntries counts the entries the cluster's PgBouncer has now (SHOW
// DATABASES, its admin console aside): the figure is the pooler's own, not
// the differences Compare found.
func poolerEntries(ctx context.Context, front *pooler.Front) (int, error) {
	password, err := front.Proc.AdminPassword()
	if err != nil {
		return 0, err
	}
	a, err := pooler.DialAdmin(ctx, front.Addr(), pooler.AdminUser, password)
	if err != nil {
		return 0, err
	}
	defer a.Close()
	dbs, err := a.Databases(ctx)
	return len(dbs), err
}

func (r *Reconciler) observe(ctx context.Context, cl *cluster.Cluster) (observed, error) {
	obs := observed{databases: map[string]bool{}, comments: map[string]string{}, roles: map[string]bool{}, schemas: map[string]map[string]bool{},
		others: map[string][]string{}, public: map[string]int{}, exts: map[string]string{}}
	admin, err := cl.Admin(ctx)
	if err != nil {
		return obs, err
	}
	rows, err := admin.Query(ctx, `SELECT datname, datistemplate, coalesce(pg_catalog.shobj_description(oid, 'pg_database'), '')
		FROM pg_catalog.pg_database WHERE datname LIKE 't\_%' OR datname LIKE 'pgt\_%'`)
	if err != nil {
		return obs, cluster.Classify(err)
	}
	var shared []string
	for rows.Next() {
		var name, comment string
		var isTemplate bool
		if err := rows.Scan(&name, &isTemplate, &comment); err != nil {
			return obs, err
		}
		obs.databases[name] = isTemplate
		obs.comments[name] = comment
		if strings.HasPrefix(name, templates.SharedDatabase("")) {
			shared = append(shared, name)
		}
	}
	if err := rows.Err(); err != nil {
		return obs, err
	}
	rows, err = admin.Query(ctx, `SELECT rolname, rolcanlogin FROM pg_catalog.pg_roles
		WHERE rolname LIKE 't\_%' OR rolname LIKE 'pgt\_agent\_%' OR rolname LIKE 'pgt\_connect\_%' OR rolname LIKE 'pgt\_quota\_lock\_%'`)
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
	prefix := tenant.ExtensionsSetting + "="
	rows, err = admin.Query(ctx, `SELECT d.datname, pg_catalog.substr(c, pg_catalog.length($1) + 1)
		FROM pg_catalog.pg_db_role_setting s JOIN pg_catalog.pg_database d ON d.oid = s.setdatabase, pg_catalog.unnest(s.setconfig) c
		WHERE s.setrole = 0 AND d.datname LIKE 't\_%' AND pg_catalog.starts_with(c, $1)`, prefix)
	if err != nil {
		return obs, cluster.Classify(err)
	}
	for rows.Next() {
		var db, list string
		if err := rows.Scan(&db, &list); err != nil {
			return obs, err
		}
		obs.exts[db] = list
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
			FROM pg_catalog.pg_namespace WHERE nspname NOT LIKE 'pg\_%' AND nspname NOT IN ('information_schema', 'public')`)
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
			if _, ok := tenant.IDFromPhysical(name); ok {
				obs.schemas[db][name] = built
			} else {
				obs.others[db] = append(obs.others[db], name)
			}
		}
		if err := rows.Err(); err != nil {
			return obs, err
		}
		var n int
		if err := p.QueryRow(ctx, `SELECT pg_catalog.count(*) FROM pg_catalog.pg_class c JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace
			WHERE n.nspname = 'public'`).Scan(&n); err != nil {
			return obs, cluster.Classify(err)
		}
		obs.public[db] = n
	}
	return obs, nil
}

// jobRefs says, per tenant, whether pgtenant has ever had a job for it,
// whether one is unfinished, and the newest purge job when it failed.
type jobRefs map[string]jobRef

type jobRef struct {
	any, active bool
	failedPurge *int64 // id of the tenant's newest purge job, when it failed
	purgeError  string
}

// jobRefs reads the job history of ids only: reading every tenant's
// (a month of jobs at a million tenants) made a reconcile of one cluster
// take 8–13 s.
func (r *Reconciler) jobRefs(ctx context.Context, ids []string) (jobRefs, error) {
	history, err := jobs.History(ctx, r.Store.Pool(), jobs.TenantPurge, ids)
	if err != nil {
		return nil, err
	}
	out := make(jobRefs, len(history))
	for id, h := range history {
		ref := jobRef{any: true, active: h.Active}
		if h.Last != 0 && h.LastState == jobs.Failed {
			last := h.Last
			ref.failedPurge, ref.purgeError = &last, h.LastError
		}
		out[id] = ref
	}
	return out, nil
}

// scan is one cluster's comparison.
type scan struct {
	r         *Reconciler
	cl        *cluster.Cluster
	obs       observed
	rows      map[string]catalog.Tenant
	builds    []catalog.TemplateBuild
	templates map[string]catalog.Template
	jobs      jobRefs
	scanStart time.Time
}

const notAttributable = "none: not attributable to pgtenant's jobs; inspect it and drop it by hand if it is garbage"

func (s *scan) compare() []finding {
	var out []finding
	out = append(out, s.databases()...)
	out = append(out, s.extensionLists()...)
	out = append(out, s.roles()...)
	out = append(out, s.schemas()...)
	out = append(out, s.templateObjects()...)
	out = append(out, s.tenantRows()...)
	out = append(out, s.templateBuilds()...)
	return out
}

// databases: tenant databases without rows, build databases nobody uses.
func (s *scan) databases() []finding {
	var out []finding
	names := sortedKeys(s.obs.databases)
	for _, db := range names {
		if id, ok := tenant.IDFromPhysical(db); ok {
			if s.jobs[id].active {
				continue // its job's to finish: a build, purge, move, fork, rewind, import …
			}
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
			case t.Mode != tenant.ModeDatabase:
				out = append(out, finding{Finding: Finding{Kind: Mismatch, Object: "database " + db, Tenant: id,
					Detail: "tenant " + id + " is a schema tenant but a database carries its name", Action: notAttributable}})
			}
			continue
		}
		if m := buildDBRE.FindStringSubmatch(db); m != nil {
			state, known := s.buildJob(m[1])
			if known && !jobs.Finished(state) {
				continue
			}
			detail := "scratch database of template build job " + m[1] + ", which is not running"
			if !known {
				detail = "scratch database of template build job " + m[1] + ", which the catalog does not know"
			}
			out = append(out, finding{Finding: Finding{Kind: Orphan, Object: "database " + db, Detail: detail, Action: "drop it"},
				repair: s.dropDatabase(db)})
		}
	}
	return out
}

// buildJob returns the state of a job by id; known is false when the
// catalog has no such job.
// extensionLists finds the database tenants whose database does not list
// their tier's extensions (tenant.ExtensionsSetting): a tier whose list
// the configuration changed, or a database made before the guard.
func (s *scan) extensionLists() []finding {
	var out []finding
	for _, id := range sortedKeys(s.rows) {
		t := s.rows[id]
		db := tenant.PhysicalName(id)
		tier, known := s.r.Tiers[t.Tier]
		if _, exists := s.obs.databases[db]; !exists || !known || s.jobs[id].active || t.Mode != tenant.ModeDatabase ||
			(t.State != catalog.StateSpare && t.State != catalog.StateActive && t.State != catalog.StateSuspended) {
			continue
		}
		want := strings.Join(tier.Extensions, ",")
		have, listed := s.obs.exts[db]
		if listed && have == want {
			continue
		}
		f := finding{Finding: Finding{Kind: Mismatch, Object: "database " + db, Tenant: id,
			Detail: fmt.Sprintf("it lists the extensions %q, tier %s's are %q", have, t.Tier, want), Action: "write the tier's list"}}
		if !listed {
			f.Detail = "it has no extension guard (made before pgtenant had one): its tenant may create any trusted extension"
			f.Action = "install the extension guard with the tier's list"
		}
		f.repair = func(ctx context.Context) error {
			conn, err := s.cl.Connect(ctx, db)
			if err != nil {
				return err
			}
			defer conn.Close(context.WithoutCancel(ctx))
			_, err = conn.Exec(ctx, tenant.ExtensionGuardSQL+tenant.ExtensionsSQL(db, tier))
			return cluster.Classify(err)
		}
		out = append(out, f)
	}
	return out
}

func (s *scan) buildJob(jobID string) (state jobs.State, known bool) {
	id, err := strconv.ParseInt(jobID, 10, 64)
	if err != nil {
		return "", false
	}
	j, err := jobs.Get(context.Background(), s.r.Store.Pool(), id)
	if err != nil {
		return "", !errors.Is(err, jobs.ErrNotFound) // a catalog error: do not judge
	}
	return j.State, true
}

func (s *scan) buildReady(db string) bool {
	for _, b := range s.builds {
		if b.Cluster == s.cl.Name() && b.Database == db && b.State == catalog.BuildReady {
			return true
		}
	}
	return false
}

// sharedComment is the comment pgtenant's build gives a template's shared
// database: what attributes one whose template the catalog does not know.
func sharedComment(template string) string {
	return "pgtenant: schema-mode tenants of template " + template
}

// templateObjects: template databases (pgt_tpl_<template>_v<N>), shared
// databases (pgt_shared_<template>) and connect roles (pgt_connect_<template>,
// made by earlier releases: dissolved when their template is known)
// whose template or version the catalog does not know (a template deleted,
// or never recorded), and template databases without a ready build. A
// template being deleted, or with a job at work, is left to its jobs.
// Template databases hold no tenant data: dropped. A shared database is
// dropped, with its connect role, only when it is demonstrably pgtenant's
// and empty: its comment is the one pgtenant gives it, and it holds no
// schema and nothing in public; its tenants' schemas are judged on their
// own (schemas), and once they are gone it is dropped.
func (s *scan) templateObjects() []finding {
	var out []finding
	for _, db := range sortedKeys(s.obs.databases) {
		if !strings.HasPrefix(db, "pgt_tpl_") && !strings.HasPrefix(db, templates.SharedDatabase("")) {
			continue
		}
		name, version, ok := templates.ParseDatabaseName(db)
		if !ok {
			out = append(out, finding{Finding: Finding{Kind: Orphan, Object: "database " + db,
				Detail: "named like pgtenant's template databases, but no template name can give it", Action: notAttributable}})
			continue
		}
		t, known := s.templates[name]
		if t.Deleting || s.jobs[name].active {
			continue
		}
		shared := version == 0
		switch {
		case !shared && !known:
			out = append(out, finding{Finding: Finding{Kind: Orphan, Object: "database " + db,
				Detail: fmt.Sprintf("template database of template %s v%d; the catalog has no template %s (deleted, or never recorded)", name, version, name),
				Action: "drop it (a template holds no tenant data)"}, repair: s.dropDatabase(db)})
		case !shared && version > t.LatestVersion:
			out = append(out, finding{Finding: Finding{Kind: Orphan, Object: "database " + db,
				Detail: fmt.Sprintf("template database of template %s v%d; the catalog has no version %d of %s (its latest is %d)", name, version, version, name, t.LatestVersion),
				Action: "drop it (a template holds no tenant data)"}, repair: s.dropDatabase(db)})
		case !shared && !s.buildReady(db):
			out = append(out, finding{Finding: Finding{Kind: Orphan, Object: "database " + db,
				Detail: "template database without a ready build in the catalog", Action: "drop it (a template holds no tenant data)"},
				repair: s.dropDatabase(db)})
		case shared && !known:
			out = append(out, s.orphanShared(db, name))
		}
	}
	for _, role := range sortedKeys(s.obs.roles) {
		name, ok := strings.CutPrefix(role, templates.ConnectRole(""))
		if !ok || templates.ValidName(name) != nil || s.jobs[name].active {
			continue
		}
		if _, known := s.templates[name]; known {
			out = append(out, s.legacyConnectRole(role, name))
			continue
		}
		if _, has := s.obs.databases[templates.SharedDatabase(name)]; has {
			continue // judged with its shared database
		}
		out = append(out, finding{Finding: Finding{Kind: Orphan, Object: "role " + role,
			Detail: fmt.Sprintf("connect role of template %s, which the catalog does not know (deleted, or never recorded)", name),
			Action: "drop it (it only ever held CONNECT on the template's shared database)"},
			repair: s.dropRoles(role)})
	}
	return out
}

// legacyConnectRole: the role every schema tenant of a template was a
// member of before each got CONNECT of its own. A member can hand its
// tables to it, SET ROLE to it and DROP OWNED BY it (docs/SECURITY.md), so
// fix dissolves it: its members get CONNECT directly, lose the membership,
// and the role is dropped unless it owns what a tenant handed to it.
func (s *scan) legacyConnectRole(role, template string) finding {
	return finding{Finding: Finding{Kind: Mismatch, Object: "role " + role,
		Detail: fmt.Sprintf("a role shared by the schema tenants of template %s (made before each tenant got CONNECT of its own): its members can reach each other's objects through it", template),
		Action: "give each member CONNECT on " + templates.SharedDatabase(template) + " directly, revoke the memberships, drop the role if it owns nothing"},
		repair: func(ctx context.Context) error {
			admin, err := s.cl.Admin(ctx)
			if err != nil {
				return err
			}
			_, err = templates.DissolveConnectRole(ctx, admin, template)
			return err
		}}
}

// orphanShared judges the shared database of a template the catalog does not know.
func (s *scan) orphanShared(db, name string) finding {
	f := finding{Finding: Finding{Kind: Orphan, Object: "database " + db,
		Detail: fmt.Sprintf("shared database of template %s, which the catalog does not know (deleted, or never recorded)", name)}}
	tenantSchemas := sortedKeys(s.obs.schemas[db])
	switch {
	case s.obs.comments[db] != sharedComment(name):
		f.Detail += fmt.Sprintf("; its comment is %q, not pgtenant's", s.obs.comments[db])
		f.Action = notAttributable
	case len(s.obs.others[db]) > 0 || s.obs.public[db] > 0:
		f.Detail += fmt.Sprintf("; it holds objects pgtenant did not make (schemas %v, %d relations in public)", s.obs.others[db], s.obs.public[db])
		f.Action = notAttributable
	case len(tenantSchemas) > 0:
		f.Detail += fmt.Sprintf("; it still holds %d tenant schemas (%s), judged on their own", len(tenantSchemas), strings.Join(tenantSchemas, ", "))
		f.Action = "none yet: once its schemas are gone, fix drops it (and role " + templates.ConnectRole(name) + " if an earlier release made it)"
	default:
		f.Action = "drop it (and role " + templates.ConnectRole(name) + " if an earlier release made it; empty: no tenant schema, nothing in public)"
		drop := s.dropDatabase(db)
		roles := s.dropRoles(templates.ConnectRole(name))
		f.repair = func(ctx context.Context) error {
			if err := drop(ctx); err != nil {
				return err
			}
			return roles(ctx)
		}
	}
	return f
}

func (s *scan) dropRoles(roles ...string) func(context.Context) error {
	return func(ctx context.Context) error {
		admin, err := s.cl.Admin(ctx)
		if err != nil {
			return err
		}
		return cluster.DropRoles(ctx, admin, roles...)
	}
}

// orphanTenantObject judges an object named after a tenant id without a row
// and with no job at work on it (callers skip those): dropped when
// pgtenant's own jobs worked on that id, listed otherwise.
func (s *scan) orphanTenantObject(object, id string, drop func(context.Context) error) finding {
	f := finding{Finding: Finding{Kind: Orphan, Object: object, Tenant: id, Detail: "no catalog row for tenant " + id}}
	switch refs := s.jobs[id]; {
	case refs.any:
		f.Action = "drop it (left by an interrupted job of pgtenant's)"
		f.repair = drop
	default:
		f.Action = notAttributable
	}
	return f
}

// roleTenant is the tenant a role is of: its own, its agent, its lock
// role (which owns its objects while its quota is enforced) or one of its
// extra logins.
func roleTenant(role string) (string, bool) {
	if id, ok := tenant.IDFromPhysical(role); ok {
		return id, true
	}
	if id, ok := tenant.IDFromAgent(role); ok {
		return id, true
	}
	if id, ok := tenant.IDFromLockRole(role); ok {
		return id, true
	}
	id, _, ok := tenant.IDFromLogin(role)
	return id, ok
}

func (s *scan) roles() []finding {
	var out []finding
	for _, role := range sortedKeys(s.obs.roles) {
		id, ok := roleTenant(role)
		if !ok || s.jobs[id].active {
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
			continue // an agent (it logs in whatever its tenant's state), a lock role (the quota's) or an extra login
		}
		canLogin := s.obs.roles[role]
		if canLogin && (t.State == catalog.StateSpare || t.State == catalog.StateBuilding) {
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
			if !ok || s.jobs[id].active {
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
				return cluster.DropSchemaBatched(ctx, conn, schema, s.r.Drop.BatchRelations, nil)
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
				Detail: "tenant is " + string(t.State) + " but no job is working on it", Action: "roll back: enqueue its purge"},
				repair: s.enqueuePurge(t)})
			continue
		}
		var gone []string
		if _, ok := s.obs.roles[name]; !ok {
			gone = append(gone, "role")
		}
		if t.Mode == tenant.ModeDatabase {
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
		if b.Cluster != s.cl.Name() || b.State != catalog.BuildReady || s.templates[b.Template].Deleting {
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
			_, err := s.r.Runner.Enqueue(ctx, tx, purge.Spec(t, "reconcile: rolled back"))
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
		s.cl.ClosePool(db) // observe may have opened one (shared databases)
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

// loopLockKey is the advisory lock a periodic round holds in the catalog
// ("pgt\x06"): one daemon of a catalog reconciles at a time, rather than
// each of them every cluster, repairs included.
const loopLockKey = 0x70677406

// round reconciles and repairs every cluster, unless another daemon's round
// holds the lock: then ran is false.
func (l *Loop) round(ctx context.Context) (ran bool, rep Report, err error) {
	ran, err = l.R.Store.Exclusively(ctx, loopLockKey, func(ctx context.Context) error {
		rep, err = l.R.Run(ctx, "", true)
		return err
	})
	return ran, rep, err
}

// Run reconciles every Interval until ctx is done (a round another
// daemon is running is skipped).
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
		ran, rep, err := l.round(ctx)
		if ctx.Err() == nil {
			down.Report(log, err)
		}
		if err != nil || !ran {
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
