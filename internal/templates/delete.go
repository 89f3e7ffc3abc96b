package templates

import (
	"context"
	"errors"
	"fmt"
	"regexp"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pgtenant/pgtenant/internal/catalog"
	"github.com/pgtenant/pgtenant/internal/cluster"
	"github.com/pgtenant/pgtenant/internal/jobs"
)

type deleteArgs struct {
	Template string `json:"template"`
}

// SparePurger purges a template's unclaimed tenants (spares, and tenants
// whose build failed) with the purge job; the daemon wires purge.Service.
type SparePurger interface {
	PurgeSpare(ctx context.Context, t catalog.Tenant, reason string) error
}

// Deleted is the answer to Delete.
type Deleted struct {
	Template string   `json:"template"`
	Job      jobs.Job `json:"job"`
}

// Delete starts removing a template that has no tenants (ErrConflict
// naming them otherwise): from now on it takes no new tenant, version or
// build, and a durable job removes its spares, its template databases, its
// shared database and connect role on every cluster, then its catalog rows.
// Deleting a template being deleted returns the job at work (or, if that
// one failed, a new one).
func (s *Service) Delete(ctx context.Context, name string) (Deleted, error) {
	if err := ValidName(name); err != nil {
		return Deleted{}, fmt.Errorf("%w: %v", ErrInvalid, err)
	}
	tx, err := s.Store.Begin(ctx)
	if err != nil {
		return Deleted{}, err
	}
	defer tx.Rollback(context.WithoutCancel(ctx))
	if err := s.Store.MarkTemplateDeleting(ctx, tx, name); err != nil {
		return Deleted{}, err
	}
	j, err := s.Runner.Enqueue(ctx, tx, jobs.Spec{Type: jobs.TemplateDelete, Key: "template-delete:" + name, TargetKind: "template", Target: name,
		Args: deleteArgs{Template: name}})
	if err != nil {
		return Deleted{}, err
	}
	if err := tx.Commit(ctx); err != nil {
		return Deleted{}, err
	}
	s.Runner.Poke()
	return Deleted{Template: name, Job: j}, nil
}

// DeleteHandler is the job handler of jobs.TemplateDelete. Its steps, each idempotent:
// stop the template's other jobs (builds, rollouts), purge its spares
// (purge jobs, waited for), drop its template and scratch build databases
// on every cluster (paced: each DROP DATABASE forces a checkpoint), drop
// its shared database and connect role on every cluster, then delete its
// catalog rows. A failure leaves the template being deleted: retry the job.
func (s *Service) DeleteHandler() jobs.Handler {
	return jobs.Handler{Steps: func(j *jobs.Job) ([]jobs.Step, error) {
		var a deleteArgs
		if err := j.DecodeArgs(&a); err != nil {
			return nil, err
		}
		d := &deleter{s: s, name: a.Template, jobID: j.ID}
		return []jobs.Step{
			{Name: "stop-jobs", Run: d.stopJobs, Doing: "stopping the template's builds and rollouts"},
			{Name: "spares", Run: d.spares, Doing: "purging the template's spares"},
			{Name: "template-databases", Run: d.templateDatabases, Doing: "dropping the template databases"},
			{Name: "shared-database", Run: d.sharedDatabase, Doing: "dropping the shared database and its connect role"},
			{Name: "catalog", Run: d.catalog, Doing: "deleting the template's catalog rows"},
		}, nil
	}}
}

type deleter struct {
	s     *Service
	name  string
	jobID int64
}

// deletePoll is how often the delete job looks at the jobs it waits for.
const deletePoll = 200 * time.Millisecond

func (d *deleter) sleep(ctx context.Context) error {
	select {
	case <-ctx.Done():
		return context.Cause(ctx)
	case <-time.After(deletePoll):
		return nil
	}
}

// stopJobs cancels the template's unfinished jobs but this one (builds,
// rollouts) and waits until they have ended and cleaned up.
func (d *deleter) stopJobs(ctx context.Context, r *jobs.Run) error {
	for {
		active, err := jobs.List(ctx, d.s.Store.Pool(), jobs.Filter{State: jobs.Active, TargetKind: "template", Target: d.name, Limit: 1000})
		if err != nil {
			return err
		}
		n := 0
		for _, j := range active {
			if j.ID == d.jobID {
				continue
			}
			n++
			if !j.CancelRequested {
				if _, err := jobs.Cancel(ctx, d.s.Store.Pool(), j.ID); err != nil && !errors.Is(err, jobs.ErrWrongState) {
					return err
				}
			}
		}
		if n == 0 {
			return nil
		}
		r.Progress(ctx, 0, 0, fmt.Sprintf("deleting template %s: waiting for %d of its jobs to stop", d.name, n))
		if err := d.sleep(ctx); err != nil {
			return err
		}
	}
}

// spares purges the template's spares and waits until no tenant row of the
// template is left. A spare being built has its build cancelled (its
// cleanup purges it). A tenant (claimed meanwhile) stops the delete; so
// does a purge that failed.
func (d *deleter) spares(ctx context.Context, r *jobs.Run) error {
	if d.s.Spares == nil {
		return jobs.Permanent(errors.New("template delete: no spare purger wired"))
	}
	total := -1
	for {
		ts, err := d.s.Store.TemplateTenants(ctx, d.name)
		if err != nil {
			return err
		}
		if total < 0 {
			total = len(ts)
		}
		if len(ts) == 0 {
			return nil
		}
		for _, t := range ts {
			if err := d.spare(ctx, t); err != nil {
				return err
			}
		}
		r.Progress(ctx, int64(max(total-len(ts), 0)), int64(total), fmt.Sprintf("deleting template %s: purging its spares (%d left)", d.name, len(ts)))
		if err := d.sleep(ctx); err != nil {
			return err
		}
	}
}

// spare moves one tenant row of the template towards its purge.
func (d *deleter) spare(ctx context.Context, t catalog.Tenant) error {
	last, err := jobs.List(ctx, d.s.Store.Pool(), jobs.Filter{TargetKind: "tenant", Target: t.ID, Limit: 1})
	if err != nil {
		return err
	}
	busy := len(last) == 1 && !jobs.Finished(last[0].State)
	switch t.State {
	case catalog.StateSpare:
		if busy {
			return nil // a claim or refill is done with it; look again
		}
		err := d.s.Spares.PurgeSpare(ctx, t, "template "+d.name+" deleted")
		if errors.Is(err, catalog.ErrConflict) {
			return nil // claimed meanwhile: the next pass sees a tenant
		}
		return err
	case catalog.StateBuilding:
		if busy && !last[0].CancelRequested {
			if _, err := jobs.Cancel(ctx, d.s.Store.Pool(), last[0].ID); err != nil && !errors.Is(err, jobs.ErrWrongState) {
				return err
			}
		}
		return nil // its build's cleanup enqueues its purge
	case catalog.StatePurging, catalog.StateFailed:
		if busy {
			return nil
		}
		if err := d.s.Spares.PurgeSpare(ctx, t, "template "+d.name+" deleted"); err != nil {
			return fmt.Errorf("template %s: %w; then retry this job", d.name, err)
		}
		return nil
	}
	return jobs.Permanent(fmt.Errorf("%w: template %s got tenant %s (%s) while being deleted: drop and purge it (`pgtenant tenant drop %s --purge-now`), then retry this job",
		catalog.ErrConflict, d.name, t.ID, t.State, t.ID))
}

// templateDatabases drops, on every cluster, the template databases of the
// template's versions and the scratch databases its build jobs left, then
// forgets its builds there.
func (d *deleter) templateDatabases(ctx context.Context, r *jobs.Run) error {
	builds, err := jobs.List(ctx, d.s.Store.Pool(), jobs.Filter{Type: jobs.TemplateBuild, TargetKind: "template", Target: d.name, Limit: 10000})
	if err != nil {
		return err
	}
	scratch := make([]string, len(builds))
	for i, j := range builds {
		scratch[i] = BuildDatabase(j.ID)
	}
	tplRE := "^" + regexp.QuoteMeta(dbPrefix+"tpl_"+d.name+"_v") + "[0-9]+$" // pgt_tpl_<name>_v<N>
	for _, cl := range d.s.Clusters.All() {
		admin, err := cl.Admin(ctx)
		if err != nil {
			return err
		}
		rows, err := admin.Query(ctx, `SELECT datname FROM pg_catalog.pg_database WHERE datname ~ $1 OR datname = ANY($2) ORDER BY datname`, tplRE, scratch)
		if err != nil {
			return cluster.Classify(err)
		}
		dbs, err := pgx.CollectRows(rows, pgx.RowTo[string])
		if err != nil {
			return cluster.Classify(err)
		}
		for i, db := range dbs {
			r.Progress(ctx, int64(i), int64(len(dbs)), fmt.Sprintf("deleting template %s: dropping %s on %s", d.name, db, cl.Name()))
			if err := d.drop(ctx, r, cl, db); err != nil {
				return err
			}
		}
		if err := d.s.Store.DeleteBuilds(ctx, d.name, cl.Name()); err != nil {
			return err
		}
	}
	return nil
}

// sharedDatabase drops, on every cluster, the template's shared database
// (its schema spares are purged already) and, on a cluster that still has
// one from an earlier release, its connect role.
func (d *deleter) sharedDatabase(ctx context.Context, r *jobs.Run) error {
	for _, cl := range d.s.Clusters.All() {
		r.Progress(ctx, 0, 0, fmt.Sprintf("deleting template %s: dropping %s on %s", d.name, SharedDatabase(d.name), cl.Name()))
		if err := d.drop(ctx, r, cl, SharedDatabase(d.name)); err != nil {
			return err
		}
		admin, err := cl.Admin(ctx)
		if err != nil {
			return err
		}
		if err := cluster.DropRoles(ctx, admin, ConnectRole(d.name)); err != nil {
			return err
		}
	}
	return nil
}

// drop drops a database that exists, paced: DROP DATABASE forces a checkpoint.
func (d *deleter) drop(ctx context.Context, r *jobs.Run, cl *cluster.Cluster, db string) error {
	admin, err := cl.Admin(ctx)
	if err != nil {
		return err
	}
	exists, err := cluster.DatabaseExists(ctx, admin, db)
	if err != nil || !exists {
		return err
	}
	release, err := r.Pace(ctx, cl.Name(), jobs.Heavy)
	if err != nil {
		return err
	}
	defer release()
	cl.ClosePool(db)
	return cluster.DropDatabase(ctx, admin, db)
}

// catalog deletes the template's rows. A spare the pool made just before
// the template was marked (its pass had read the template list earlier)
// is purged first: the rows of its tenants must be gone.
func (d *deleter) catalog(ctx context.Context, r *jobs.Run) error {
	if err := d.spares(ctx, r); err != nil {
		return err
	}
	return d.s.Store.DeleteTemplate(ctx, d.name)
}
