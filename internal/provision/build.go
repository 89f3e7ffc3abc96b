package provision

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pgtenant/pgtenant/internal/catalog"
	"github.com/pgtenant/pgtenant/internal/cluster"
	"github.com/pgtenant/pgtenant/internal/jobs"
	"github.com/pgtenant/pgtenant/internal/purge"
	"github.com/pgtenant/pgtenant/internal/sandbox"
	"github.com/pgtenant/pgtenant/internal/templates"
	"github.com/pgtenant/pgtenant/internal/tenant"
)

type buildArgs struct {
	Tenant   string      `json:"tenant"`
	Activate *activation `json:"activate,omitempty"`
}

// activation makes the built tenant usable at once (cold path).
type activation struct {
	Verifier string `json:"verifier"` // SCRAM verifier, never the password
	Tier     string `json:"tier"`
}

func buildSpec(t catalog.Tenant, act *activation) jobs.Spec {
	return jobs.Spec{Type: jobs.TenantBuild, Key: "tenant:" + t.ID, TargetKind: "tenant", Target: t.ID, Cluster: t.Cluster,
		Args: buildArgs{Tenant: t.ID, Activate: act}}
}

// schemaMarker is the comment a schema tenant gets once fully built; a schema
// without it is a half-built one, dropped and built again. It is the
// tenant's version marker (tenant.Marker), which rollouts move on; a
// database tenant carries the same on its database.
func schemaMarker(version int) string { return tenant.BuiltMarker(version).String() }

// BuildHandler is the job handler of jobs.TenantBuild. Steps: the role (NOLOGIN, the
// tier's settings), the storage (a database copied from the template
// database with its objects given to the role, or a schema built from the
// template's files in lock-bounded batches), then ready (spare) or active.
// A build that fails is removed entirely, catalog row included.
func (s *Service) BuildHandler() jobs.Handler {
	return jobs.Handler{
		Steps: func(j *jobs.Job) ([]jobs.Step, error) {
			var a buildArgs
			if err := j.DecodeArgs(&a); err != nil {
				return nil, err
			}
			b := &tenantBuilder{s: s, a: a}
			return []jobs.Step{
				{Name: "role", Run: b.step(b.role), Doing: "creating the tenant's role"},
				{Name: "storage", Run: b.step(b.storage), Doing: "building the tenant's database or schema from the template"},
				{Name: "ready", Run: b.step(b.ready), Doing: "recording the tenant ready"},
			}, nil
		},
		Cleanup: func(ctx context.Context, r *jobs.Run) error {
			var a buildArgs
			if err := r.Job.DecodeArgs(&a); err != nil {
				return err
			}
			t, err := s.Store.GetTenant(ctx, nil, a.Tenant)
			if errors.Is(err, catalog.ErrNotFound) {
				return nil
			}
			if err != nil {
				return err
			}
			if t.State != catalog.StateBuilding && t.State != catalog.StateProvisioning {
				return nil // built after all, and in use: never remove it
			}
			// Remove what was built, catalog row included, with the purge job.
			if err := s.Store.SetTenantState(ctx, s.Store.Pool(), t.ID, catalog.StateFailed, t.State); err != nil {
				return err
			}
			_, err = s.Runner.Enqueue(ctx, s.Store.Pool(), purge.Spec(t, "build failed"))
			return err
		},
	}
}

type tenantBuilder struct {
	s *Service
	a buildArgs
}

// errBuilt says the tenant has moved past building: an earlier run of this
// job finished the step before a crash kept it from recording so, and the
// tenant was claimed, dropped or purged since. Nothing is left to do.
var errBuilt = errors.New("tenant already built")

// load returns the tenant and its cluster, or errBuilt.
func (b *tenantBuilder) load(ctx context.Context) (catalog.Tenant, *cluster.Cluster, error) {
	t, err := b.s.Store.GetTenant(ctx, nil, b.a.Tenant)
	if errors.Is(err, catalog.ErrNotFound) {
		return t, nil, errBuilt
	}
	if err != nil {
		return t, nil, err
	}
	if t.State != catalog.StateBuilding && t.State != catalog.StateProvisioning {
		return t, nil, errBuilt
	}
	cl, err := b.s.Clusters.Get(t.Cluster)
	return t, cl, err
}

// step runs f on the loaded tenant; a tenant already past building is done.
func (b *tenantBuilder) step(f func(context.Context, *jobs.Run, catalog.Tenant, *cluster.Cluster) error) func(context.Context, *jobs.Run) error {
	return func(ctx context.Context, r *jobs.Run) error {
		t, cl, err := b.load(ctx)
		if errors.Is(err, errBuilt) {
			return nil
		}
		if err != nil {
			return err
		}
		return f(ctx, r, t, cl)
	}
}

// tier is the tier the tenant is built with: a cold create's, else the
// default tier (a spare's, until a claim gives it another).
func (b *tenantBuilder) tier() string {
	if b.a.Activate != nil {
		return b.a.Activate.Tier
	}
	return "default"
}

func (b *tenantBuilder) role(ctx context.Context, r *jobs.Run, t catalog.Tenant, cl *cluster.Cluster) error {
	admin, err := cl.Admin(ctx)
	if err != nil {
		return err
	}
	name := tenant.PhysicalName(t.ID)
	if err := cluster.CreateRole(ctx, admin, name); err != nil {
		return err
	}
	sql := b.s.TierSQL(t.ID, b.tier())
	if t.Mode == tenant.ModeSchema {
		sql += fmt.Sprintf("ALTER ROLE %s SET search_path = %s;\n", cluster.Ident(name), cluster.Ident(name))
	}
	if b.a.Activate == nil {
		// A spare gets the password it will be claimed with now (sealed in
		// its row, its role still NOLOGIN): its front door has its entry
		// by the claim, which need not wait for a sync then.
		verifier, ok, err := b.s.Credentials.SealSpare(ctx, t.ID)
		if err != nil {
			return err
		}
		if ok {
			sql += fmt.Sprintf("ALTER ROLE %s PASSWORD %s;\n", cluster.Ident(name), cluster.Literal(verifier))
		}
	}
	if _, err = admin.Exec(ctx, sql); err != nil {
		return cluster.Classify(err)
	}
	return b.s.Agents.EnsureRole(ctx, admin, t.ID)
}

func (b *tenantBuilder) storage(ctx context.Context, r *jobs.Run, t catalog.Tenant, cl *cluster.Cluster) error {
	if t.Mode == tenant.ModeSchema {
		return b.buildSchema(ctx, r, t, cl)
	}
	return b.buildDatabase(ctx, r, t, cl)
}

// buildDatabase copies the template database and gives its objects to the
// tenant's role. The copy has no CONNECT for anyone until it is claimed.
func (b *tenantBuilder) buildDatabase(ctx context.Context, r *jobs.Run, t catalog.Tenant, cl *cluster.Cluster) error {
	admin, err := cl.Admin(ctx)
	if err != nil {
		return err
	}
	build, err := b.s.Store.GetBuild(ctx, t.Template, t.Version, t.Cluster)
	if err != nil {
		return err
	}
	if build.State != catalog.BuildReady {
		return fmt.Errorf("template %s version %d is %s on cluster %s", t.Template, t.Version, build.State, t.Cluster)
	}
	name := tenant.PhysicalName(t.ID)
	exists, err := cluster.DatabaseExists(ctx, admin, name)
	if err != nil {
		return err
	}
	if !exists {
		h, err := cl.Probe(ctx)
		if err != nil {
			return err
		}
		strategy := tenant.CreateStrategy(build.SizeBytes, len(h.Standbys), int64(b.s.Provision.WALLogMaxSize))
		r.Progress(ctx, 0, 2, fmt.Sprintf("copying template %s v%d (%s)", t.Template, t.Version, strategy))
		// FILE_COPY forces two checkpoints: one at a time (a heavy DDL
		// slot). WAL_LOG sends about the template's size through the WAL:
		// several at once, within the replay lag budget.
		var release func()
		if strategy == cluster.WALLog {
			release, err = r.PaceWALLog(ctx, t.Cluster, build.SizeBytes)
		} else {
			release, err = r.Pace(ctx, t.Cluster, jobs.Heavy)
		}
		if err != nil {
			return err
		}
		err = b.copyTemplate(ctx, cl, t, build.Database, strategy)
		release()
		if err != nil && !errors.Is(err, cluster.ErrDuplicate) {
			return err
		}
	}
	// A spare is unusable until claimed: nobody but its agent may connect.
	if _, err := admin.Exec(ctx, "REVOKE ALL ON DATABASE "+cluster.Ident(name)+" FROM PUBLIC"); err != nil {
		return cluster.Classify(err)
	}
	if err := sandbox.GrantConnect(ctx, admin, sandbox.TargetOf(t)); err != nil {
		return err
	}
	r.Progress(ctx, 1, 2, "giving the template's objects to the tenant's role")
	conn, err := cl.Connect(ctx, name)
	if err != nil {
		return err
	}
	defer conn.Close(context.WithoutCancel(ctx))
	if err := cluster.ReassignOwned(ctx, conn, templates.OwnerRole, name, b.s.Provision.BatchLocks); err != nil {
		return err
	}
	// The tenant owns public (as the owner of a database would); its
	// agent owns the schema whose comment is the version marker (a copy
	// does not inherit the template's). The extension guard holds its
	// CREATE EXTENSION to the tier's list, written last.
	role, agent := cluster.Ident(name), cluster.Ident(tenant.AgentRole(t.ID))
	_, err = conn.Exec(ctx, tenant.ExtensionGuardSQL+b.s.ExtensionsSQL(t, b.tier())+fmt.Sprintf(`DO $$ BEGIN
			IF EXISTS (SELECT 1 FROM pg_catalog.pg_namespace WHERE nspname = 'public') THEN
				ALTER SCHEMA public OWNER TO %[1]s;
			END IF;
		END $$;
		CREATE SCHEMA IF NOT EXISTS %[3]s AUTHORIZATION %[2]s;
		REVOKE ALL ON SCHEMA %[3]s FROM PUBLIC;
		COMMENT ON SCHEMA %[3]s IS %[4]s`, role, agent, cluster.Ident(tenant.MarkerSchema), cluster.Literal(schemaMarker(t.Version))))
	return cluster.Classify(err)
}

// copyTemplate runs the tenant's CREATE DATABASE on a session of its own: a
// copy takes from a fraction of a second to minutes, and on the cluster's
// admin pool the copies in flight (pacer.wal_log_slots of them) would hold
// every connection that pool claims need for their few milliseconds.
func (b *tenantBuilder) copyTemplate(ctx context.Context, cl *cluster.Cluster, t catalog.Tenant, template, strategy string) error {
	conn, err := cl.Connect(ctx, cl.MaintenanceDB())
	if err != nil {
		return err
	}
	defer conn.Close(context.WithoutCancel(ctx))
	// Owned by the admin role, never by the tenant: the owner of a
	// database can set its IS_TEMPLATE, ALLOW_CONNECTIONS, CONNECTION
	// LIMIT and the settings every session in it starts with, which
	// would reach the control plane (docs/SECURITY.md).
	from := time.Now()
	if err := cluster.CreateDatabase(ctx, conn, tenant.PhysicalName(t.ID), template, "", strategy); err != nil {
		return err
	}
	b.s.Logger.Debug("template copied", "tenant", t.ID, "cluster", t.Cluster, "strategy", strategy, "from", from, "took", time.Since(from))
	return nil
}

// buildSchema creates the tenant's schema in the shared database and replays
// the template's files in it as the tenant's role, in lock-bounded batches.
func (b *tenantBuilder) buildSchema(ctx context.Context, r *jobs.Run, t catalog.Tenant, cl *cluster.Cluster) error {
	name := tenant.PhysicalName(t.ID)
	conn, err := cl.Connect(ctx, t.Database)
	if err != nil {
		return err
	}
	defer conn.Close(context.WithoutCancel(ctx))
	var comment *string
	var exists bool
	err = conn.QueryRow(ctx, `SELECT true, pg_catalog.obj_description(oid, 'pg_namespace') FROM pg_catalog.pg_namespace WHERE nspname = $1`, name).Scan(&exists, &comment)
	if err != nil && !errors.Is(err, pgx.ErrNoRows) {
		return cluster.Classify(err)
	}
	if exists && comment != nil && *comment == schemaMarker(t.Version) {
		return nil
	}
	pace := func(ctx context.Context, done, total int) error {
		r.Progress(ctx, int64(done), int64(total), fmt.Sprintf("building schema %s: %d/%d", name, done, total))
		release, err := r.Pace(ctx, t.Cluster, jobs.Light)
		if err == nil {
			release()
		}
		return err
	}
	if exists { // half-built by an interrupted attempt
		if err := cluster.DropSchemaBatched(ctx, conn, name, b.s.BatchRelations, pace); err != nil {
			return err
		}
	}
	files, err := b.s.Templates.Files(ctx, t.Template, t.Version)
	if err != nil {
		return err
	}
	admin, err := cl.Admin(ctx)
	if err != nil {
		return err
	}
	if err := sandbox.GrantConnect(ctx, admin, sandbox.TargetOf(t)); err != nil {
		return err
	}
	// The files run in this admin session as the tenant's role: the tenant
	// has never logged in (a spare, or a cold build before its activation),
	// so nothing in its schema is tenant-controlled yet, and with the
	// search path set to its schema (after pg_catalog, searched first)
	// nothing of other tenants can be reached.
	id := cluster.Ident(name)
	if _, err := conn.Exec(ctx, fmt.Sprintf("CREATE SCHEMA %s AUTHORIZATION %s; SET ROLE %s; SET search_path = %s", id, id, id, id)); err != nil {
		return cluster.Classify(err)
	}
	if err := templates.Apply(ctx, conn, files, templates.ApplyOptions{LockBudget: b.s.Provision.BatchLocks, OnBatch: pace}); err != nil {
		return fmt.Errorf("build schema %s from template %s v%d: %w", name, t.Template, t.Version, err)
	}
	_, err = conn.Exec(ctx, fmt.Sprintf("RESET ROLE; RESET search_path; COMMENT ON SCHEMA %s IS %s", id, cluster.Literal(schemaMarker(t.Version))))
	return cluster.Classify(err)
}

func (b *tenantBuilder) ready(ctx context.Context, r *jobs.Run, t catalog.Tenant, cl *cluster.Cluster) error {
	if b.a.Activate == nil {
		if err := b.s.Store.SetTenantState(ctx, b.s.Store.Pool(), t.ID, catalog.StateSpare, catalog.StateBuilding); err != nil {
			return err
		}
		b.s.Pool.Poke() // a build slot of the pool is free: the next one can start
		// Its entry, ahead of its claim (built with its password).
		b.s.Poolers.Poke(t.Cluster)
		return nil
	}
	admin, err := cl.Admin(ctx)
	if err != nil {
		return err
	}
	// The tier was applied with the role; only login and CONNECT are left.
	if _, err := admin.Exec(ctx, b.s.activationSQL(t, b.a.Activate.Verifier, false)); err != nil {
		return cluster.Classify(err)
	}
	if err := b.s.Store.SetTenantState(ctx, b.s.Store.Pool(), t.ID, catalog.StateActive, catalog.StateProvisioning); err != nil {
		return err
	}
	// A create still waiting syncs the pooler itself; one answered 202
	// gets its entry from this.
	b.s.Poolers.Poke(t.Cluster)
	return nil
}
