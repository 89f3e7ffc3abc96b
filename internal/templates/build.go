package templates

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"github.com/pgtenant/pgtenant/internal/catalog"
	"github.com/pgtenant/pgtenant/internal/cluster"
	"github.com/pgtenant/pgtenant/internal/jobs"
)

type buildArgs struct {
	Template string `json:"template"`
	Version  int    `json:"version"`
	Cluster  string `json:"cluster"`
}

type buildData struct {
	Relations int `json:"relations"`
}

// BuildHandler is the job handler of jobs.TemplateBuild. Its steps: the template owner
// role, the template's shared database (schema mode), the build into a
// scratch database in lock-bounded batches, and finalize (rename to the
// template database, IS_TEMPLATE, no connections). A build that fails is
// dropped and recorded failed with its error, and so is its version (it
// never becomes current); it is never used. The version becomes current
// when its last cluster finalizes.
func (s *Service) BuildHandler() jobs.Handler {
	return jobs.Handler{
		Steps: func(j *jobs.Job) ([]jobs.Step, error) {
			var a buildArgs
			if err := j.DecodeArgs(&a); err != nil {
				return nil, err
			}
			b := &builder{s: s, a: a, jobID: j.ID}
			return []jobs.Step{
				{Name: "owner-role", Run: b.ownerRole, Doing: "creating the template owner role"},
				{Name: "shared-database", Run: b.sharedDatabase, Doing: "creating the shared database of schema tenants"},
				{Name: "build", Run: b.build, Doing: "building the template database"},
				{Name: "finalize", Run: b.finalize, Doing: "recording the build"},
			}, nil
		},
		Cleanup: func(ctx context.Context, r *jobs.Run) error {
			var a buildArgs
			if err := r.Job.DecodeArgs(&a); err != nil {
				return err
			}
			cl, err := s.Clusters.Get(a.Cluster)
			if err != nil {
				return err
			}
			admin, err := cl.Admin(ctx)
			if err != nil {
				return err
			}
			if err := cluster.DropDatabase(ctx, admin, BuildDatabase(r.Job.ID)); err != nil {
				return err
			}
			return s.Store.FailBuild(ctx, catalog.TemplateBuild{Template: a.Template, Version: a.Version, Cluster: a.Cluster,
				Database: DatabaseName(a.Template, a.Version), Error: r.Job.LastError})
		},
	}
}

type builder struct {
	s     *Service
	a     buildArgs
	jobID int64
}

func (b *builder) cluster() (*cluster.Cluster, error) { return b.s.Clusters.Get(b.a.Cluster) }

func (b *builder) ownerRole(ctx context.Context, r *jobs.Run) error {
	cl, err := b.cluster()
	if err != nil {
		return err
	}
	admin, err := cl.Admin(ctx)
	if err != nil {
		return err
	}
	return cluster.CreateRole(ctx, admin, OwnerRole)
}

// sharedDatabase makes the database that holds the template's schema-mode
// tenants: nobody but the admin may connect or create anything; a claimed
// tenant's role connects as a member of the template's connect role.
func (b *builder) sharedDatabase(ctx context.Context, r *jobs.Run) error {
	cl, err := b.cluster()
	if err != nil {
		return err
	}
	admin, err := cl.Admin(ctx)
	if err != nil {
		return err
	}
	name := SharedDatabase(b.a.Template)
	exists, err := cluster.DatabaseExists(ctx, admin, name)
	if err != nil {
		return err
	}
	if !exists {
		release, err := r.Pace(ctx, b.a.Cluster, jobs.Heavy)
		if err != nil {
			return err
		}
		err = cluster.CreateDatabase(ctx, admin, name, "template0", "", "")
		release()
		if err != nil && !errors.Is(err, cluster.ErrDuplicate) {
			return err
		}
	}
	conn, err := cl.Connect(ctx, name)
	if err != nil {
		return err
	}
	defer conn.Close(context.WithoutCancel(ctx))
	// Each schema tenant gets CONNECT of its own when it is claimed
	// (connect.go); the database's row changes under that grant's lock.
	if _, err := admin.Exec(ctx, connectLock(b.a.Template)+fmt.Sprintf("REVOKE ALL ON DATABASE %s FROM PUBLIC; COMMENT ON DATABASE %s IS %s",
		cluster.Ident(name), cluster.Ident(name), cluster.Literal("pgtenant: schema-mode tenants of template "+b.a.Template))); err != nil {
		return cluster.Classify(err)
	}
	_, err = conn.Exec(ctx, fmt.Sprintf(`REVOKE ALL ON SCHEMA public FROM PUBLIC; REVOKE SELECT ON %s FROM PUBLIC`, strings.Join(neighbourViews, ", ")))
	return cluster.Classify(err)
}

// neighbourViews show what PostgreSQL would otherwise let every role of a
// database read about the others: per-table statistics (row counts and
// activity of every schema tenant of a shared database) and every role's
// settings (tiers). pgtenant reads them as the admin; tenants of a shared
// database get no SELECT on them, and a tenant's database inherits the
// revocation of pg_db_role_setting from its template (docs/SECURITY.md).
var neighbourViews = []string{"pg_catalog.pg_db_role_setting",
	"pg_catalog.pg_stat_all_tables", "pg_catalog.pg_stat_user_tables", "pg_catalog.pg_stat_xact_all_tables", "pg_catalog.pg_stat_xact_user_tables",
	"pg_catalog.pg_statio_all_tables", "pg_catalog.pg_statio_user_tables", "pg_catalog.pg_stat_all_indexes", "pg_catalog.pg_stat_user_indexes",
	"pg_catalog.pg_statio_all_indexes", "pg_catalog.pg_statio_user_indexes", "pg_catalog.pg_statio_all_sequences",
	"pg_catalog.pg_statio_user_sequences", "pg_catalog.pg_stat_user_functions", "pg_catalog.pg_stat_xact_user_functions"}

func (b *builder) build(ctx context.Context, r *jobs.Run) error {
	cl, err := b.cluster()
	if err != nil {
		return err
	}
	admin, err := cl.Admin(ctx)
	if err != nil {
		return err
	}
	target := DatabaseName(b.a.Template, b.a.Version)
	if done, err := cluster.DatabaseExists(ctx, admin, target); err != nil || done {
		return err // renamed by an earlier attempt: built
	}
	if err := b.s.Store.UpsertBuild(ctx, catalog.TemplateBuild{Template: b.a.Template, Version: b.a.Version,
		Cluster: b.a.Cluster, State: catalog.BuildBuilding, Database: target}); err != nil {
		return err
	}
	files, err := b.s.Files(ctx, b.a.Template, b.a.Version)
	if err != nil {
		return err
	}
	// A build that was interrupted is discarded, never continued.
	scratch := BuildDatabase(b.jobID)
	release, err := r.Pace(ctx, b.a.Cluster, jobs.Heavy)
	if err != nil {
		return err
	}
	err = cluster.DropDatabase(ctx, admin, scratch)
	if err == nil {
		err = cluster.CreateDatabase(ctx, admin, scratch, "template0", "", cluster.WALLog)
	}
	release()
	if err != nil {
		return err
	}
	conn, err := cl.Connect(ctx, scratch)
	if err != nil {
		return err
	}
	defer conn.Close(context.WithoutCancel(ctx))
	owner := cluster.Ident(OwnerRole)
	// The files run as the template owner with the search path a fresh
	// database has for it ("$user" does not exist): objects go to public.
	if _, err := conn.Exec(ctx, fmt.Sprintf(`GRANT CREATE ON DATABASE %s TO %s; GRANT CREATE ON SCHEMA public TO %s; SET ROLE %s; SET search_path = public`,
		cluster.Ident(scratch), owner, owner, owner)); err != nil {
		return cluster.Classify(err)
	}
	err = Apply(ctx, conn, files, ApplyOptions{
		LockBudget: b.s.Provision.BatchLocks,
		OnBatch: func(ctx context.Context, done, total int) error {
			r.Progress(ctx, int64(done), int64(total), fmt.Sprintf("building %s v%d on %s: %d/%d statements", b.a.Template, b.a.Version, b.a.Cluster, done, total))
			release, err := r.Pace(ctx, b.a.Cluster, jobs.Light)
			if err == nil {
				release()
			}
			return err
		},
	})
	if err != nil {
		return jobs.Permanent(err) // the job names the template and version; the error the file and statement
	}
	if _, err := conn.Exec(ctx, fmt.Sprintf(`RESET ROLE; RESET search_path; REVOKE CREATE ON SCHEMA public FROM %s; REVOKE CREATE ON DATABASE %s FROM %s;
		REVOKE SELECT ON pg_catalog.pg_db_role_setting FROM PUBLIC`,
		owner, cluster.Ident(scratch), owner)); err != nil {
		return cluster.Classify(err)
	}
	n, err := cluster.CountUserRelations(ctx, conn, "")
	if err != nil {
		return err
	}
	// Freeze now so that tenant copies never rewrite these pages to set hint
	// bits or freeze them (each such write is a full-page image in the WAL).
	if _, err := conn.Exec(ctx, `VACUUM (FREEZE)`); err != nil {
		return cluster.Classify(err)
	}
	return r.SaveData(ctx, buildData{Relations: n})
}

func (b *builder) finalize(ctx context.Context, r *jobs.Run) error {
	cl, err := b.cluster()
	if err != nil {
		return err
	}
	admin, err := cl.Admin(ctx)
	if err != nil {
		return err
	}
	target, scratch := DatabaseName(b.a.Template, b.a.Version), BuildDatabase(b.jobID)
	exists, err := cluster.DatabaseExists(ctx, admin, target)
	if err != nil {
		return err
	}
	if !exists {
		_, err := admin.Exec(ctx, `SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = $1`, scratch)
		if err != nil {
			return cluster.Classify(err)
		}
		if _, err := admin.Exec(ctx, "ALTER DATABASE "+cluster.Ident(scratch)+" RENAME TO "+cluster.Ident(target)); err != nil {
			return fmt.Errorf("rename build database: %w", cluster.Classify(err))
		}
	}
	// CREATE DATABASE … TEMPLATE fails after 5 s if anyone is connected to
	// the template, so nobody may connect.
	if _, err := admin.Exec(ctx, "ALTER DATABASE "+cluster.Ident(target)+" WITH IS_TEMPLATE true ALLOW_CONNECTIONS false"); err != nil {
		return cluster.Classify(err)
	}
	var size int64
	if err := admin.QueryRow(ctx, `SELECT pg_database_size($1)`, target).Scan(&size); err != nil {
		return cluster.Classify(err)
	}
	var d buildData
	if err := r.LoadData(&d); err != nil {
		return err
	}
	if prev, err := b.s.Store.GetBuild(ctx, b.a.Template, b.a.Version, b.a.Cluster); err == nil && d.Relations == 0 {
		d.Relations = prev.Relations // built by an earlier job; this one found it done
	}
	current, err := b.s.Store.FinishBuild(ctx, catalog.TemplateBuild{Template: b.a.Template, Version: b.a.Version, Cluster: b.a.Cluster,
		Database: target, Relations: d.Relations, SizeBytes: size})
	if current {
		b.s.Logger.Info("template version is current", "component", "templates", "template", b.a.Template, "version", b.a.Version)
	}
	return err
}
