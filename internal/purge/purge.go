// Package purge removes tenants for good: it locks the tenant out, drops its
// database (one at a time per cluster: each DROP DATABASE forces a
// checkpoint) or its schema's relations in small batches paced by the
// standby's replay lag, then its role, and turns its catalog row into a
// tombstone (kept for drop.purged_retention). It touches nothing outside the
// tenant. Soft delete, restore and retention live here too.
package purge

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgtenant/pgtenant/internal/catalog"
	"github.com/pgtenant/pgtenant/internal/cluster"
	"github.com/pgtenant/pgtenant/internal/config"
	"github.com/pgtenant/pgtenant/internal/jobs"
	"github.com/pgtenant/pgtenant/internal/pooler"
	"github.com/pgtenant/pgtenant/internal/templates"
	"github.com/pgtenant/pgtenant/internal/tenant"
)

type args struct {
	Tenant string `json:"tenant"`
	Reason string `json:"reason,omitempty"`
	// Leftover: the copy a move left on Cluster (the tenant lives
	// elsewhere now), with its mode and database.
	Leftover *catalog.Tenant `json:"leftover,omitempty"`
}

// LeftoverSpec is the job that purges the copy of a tenant that a move left
// on left.Cluster: locked out, dropped and its roles removed like a purged
// tenant's, its catalog row untouched. It does nothing if the tenant lives
// on that cluster again by then.
func LeftoverSpec(left catalog.Tenant, reason string) jobs.Spec {
	l := catalog.Tenant{ID: left.ID, Mode: left.Mode, Cluster: left.Cluster, Database: left.Database, Template: left.Template}
	return jobs.Spec{Type: jobs.TenantPurge, Key: LeftoverKey(left.ID, left.Cluster), TargetKind: "tenant", Target: left.ID, Cluster: left.Cluster,
		Args: args{Tenant: left.ID, Reason: reason, Leftover: &l}}
}

// LeftoverKey is the key of the job of LeftoverSpec that purges the copy of
// tenant id left on cluster clusterName.
func LeftoverKey(id, clusterName string) string { return "purge-leftover:" + id + ":" + clusterName }

// PurgeLeftover runs now, as a part of the caller's job r, what j (a job of
// LeftoverSpec, which the caller has cancelled and which runs no more)
// would have run at the end of the retention: the copy is locked out,
// dropped and its roles removed. A tenant that moves back to the cluster
// of its leftover runs it (internal/move). Like j, it does nothing if the
// tenant lives on that cluster; run again, it finds done what was done.
func (s *Service) PurgeLeftover(ctx context.Context, r *jobs.Run, j jobs.Job) error {
	var a args
	if err := j.DecodeArgs(&a); err != nil {
		return err
	}
	if j.Type != jobs.TenantPurge || a.Leftover == nil {
		return fmt.Errorf("job %d purges no leftover of a move", j.ID)
	}
	p := &purger{s: s, id: a.Tenant, reason: a.Reason, leftover: a.Leftover}
	for _, step := range []func(context.Context, *jobs.Run) error{p.lockOut, p.analytics, p.storage, p.role, p.catalog} {
		if err := step(ctx, r); err != nil {
			return err
		}
	}
	return nil
}

// Spec is the job that purges a tenant.
func Spec(t catalog.Tenant, reason string) jobs.Spec {
	return jobs.Spec{Type: jobs.TenantPurge, Key: "purge:" + t.ID, TargetKind: "tenant", Target: t.ID, Cluster: t.Cluster,
		Args: args{Tenant: t.ID, Reason: reason}}
}

// Service purges tenants.
type Service struct {
	Store    *catalog.Store
	Clusters *cluster.Registry
	Runner   *jobs.Runner
	Config   config.DropConfig // its section: drop
	Logger   *slog.Logger
	// OnResume, if set, runs after a tenant is resumed or restored (the
	// daemon prewarms it). Its error is logged, not returned.
	OnResume func(ctx context.Context, t catalog.Tenant) error
	// Poolers take each change before it is answered: a dropped tenant's
	// entry goes (its clients cut off), a suspended one's is disabled and
	// its clients killed, a resumed or restored one is let in again.
	Poolers *pooler.Set
	// Analytics, if set, drops the tenant's columnar mirror (its slot,
	// publication and file) before its storage: a database with a logical
	// slot cannot be dropped, and an orphaned slot retains WAL for ever.
	Analytics interface {
		Purge(ctx context.Context, t catalog.Tenant) error
	}
}

// Handler is the job handler of Job.
func (s *Service) Handler() jobs.Handler {
	return jobs.Handler{Steps: func(j *jobs.Job) ([]jobs.Step, error) {
		var a args
		if err := j.DecodeArgs(&a); err != nil {
			return nil, err
		}
		p := &purger{s: s, id: a.Tenant, reason: a.Reason, leftover: a.Leftover}
		return []jobs.Step{
			{Name: "lock-out", Run: p.lockOut, Doing: "locking the tenant out: NOLOGIN and its sessions ended on the primary"},
			{Name: "analytics", Run: p.analytics, Doing: "dropping the tenant's analytics mirror"},
			{Name: "storage", Run: p.storage, Doing: "dropping the tenant's storage"},
			{Name: "role", Run: p.role, Doing: "dropping the tenant's roles"},
			{Name: "catalog", Run: p.catalog, Doing: "recording the purge in the catalog"},
		}, nil
	}}
}

type purger struct {
	s        *Service
	id       string
	reason   string // why it is purged: retention ended, purge now, a spare retired …
	leftover *catalog.Tenant
}

// errLive stops a leftover's purge: the tenant lives on that cluster again.
var errLive = errors.New("the tenant lives there")

// load returns the tenant and its cluster (a leftover: the copy and the
// cluster it is on).
func (p *purger) load(ctx context.Context) (catalog.Tenant, *cluster.Cluster, error) {
	t, err := p.s.Store.GetTenant(ctx, nil, p.id)
	if p.leftover != nil {
		if err == nil && t.Cluster == p.leftover.Cluster {
			return t, nil, errLive
		}
		if err != nil && !errors.Is(err, catalog.ErrNotFound) {
			return t, nil, err
		}
		t = *p.leftover
		cl, err := p.s.Clusters.Get(t.Cluster)
		return t, cl, err
	}
	if err != nil {
		return t, nil, err
	}
	cl, err := p.s.Clusters.Get(t.Cluster)
	return t, cl, err
}

func (p *purger) run(ctx context.Context, f func(context.Context, catalog.Tenant, *cluster.Cluster) error) error {
	t, cl, err := p.load(ctx)
	if errors.Is(err, catalog.ErrNotFound) || errors.Is(err, errLive) {
		return nil // the catalog step ran before a crash let it record so; or a leftover that is live again
	}
	if err != nil {
		return err
	}
	return f(ctx, t, cl)
}

func (p *purger) lockOut(ctx context.Context, r *jobs.Run) error {
	return p.run(ctx, func(ctx context.Context, t catalog.Tenant, cl *cluster.Cluster) error {
		if p.leftover == nil && t.State != catalog.StatePurging {
			if err := p.s.Store.SetTenantState(ctx, p.s.Store.Pool(), t.ID, catalog.StatePurging, t.State); err != nil {
				return err
			}
		}
		logins, err := LoginRoles(ctx, cl, t.ID)
		if err != nil {
			return err
		}
		return lockOut(ctx, cl, r.Note, append([]string{tenant.PhysicalName(t.ID), tenant.AgentRole(t.ID)}, logins...)...)
	})
}

// LoginRoles lists the roles of a tenant's extra logins on a cluster
// (tenant.LoginRole), as the cluster has them: a purge finds them there
// whatever the catalog still says.
func LoginRoles(ctx context.Context, cl *cluster.Cluster, id string) ([]string, error) {
	admin, err := cl.Admin(ctx)
	if err != nil {
		return nil, err
	}
	rows, err := admin.Query(ctx, `SELECT rolname FROM pg_catalog.pg_roles WHERE rolname LIKE $1 ORDER BY 1`, tenant.PhysicalName(id)+`\_%`)
	if err != nil {
		return nil, cluster.Classify(err)
	}
	roles, err := pgx.CollectRows(rows, pgx.RowTo[string])
	return slices.DeleteFunc(roles, func(r string) bool { lid, _, ok := tenant.IDFromLogin(r); return !ok || lid != id }), cluster.Classify(err)
}

// ReplayWait bounds how long OnStandbys waits for a standby to replay the
// primary's latest change before it goes on anyway.
const ReplayWait = 10 * time.Second

// LockOut stops roles from logging in and ends their sessions, on the
// primary and on every standby (a standby serves the tenant's read-only
// sessions; NOLOGIN reaches it by replication). Sessions are ended before
// ALTER ROLE too: a tenant's open transaction that changed its own role
// (ALTER ROLE … PASSWORD) holds that row, and ALTER ROLE would wait on it.
// A role that does not exist is locked out already; a standby that does
// not answer has no sessions to end.
func LockOut(ctx context.Context, cl *cluster.Cluster, roles ...string) error {
	return lockOut(ctx, cl, nil, roles...)
}

// lockOut is LockOut telling report (when not nil) what it waits for.
func lockOut(ctx context.Context, cl *cluster.Cluster, report func(context.Context, string), roles ...string) error {
	admin, err := cl.Admin(ctx)
	if err != nil {
		return err
	}
	if _, err := EndSessions(ctx, cl, roles...); err != nil {
		return err
	}
	var sql strings.Builder
	for _, role := range roles {
		fmt.Fprintf(&sql, `DO $$ BEGIN
			IF EXISTS (SELECT 1 FROM pg_catalog.pg_roles WHERE rolname = %[1]s) THEN
				EXECUTE pg_catalog.format('ALTER ROLE %%I NOLOGIN', %[1]s);
			END IF;
		END $$;`, cluster.Literal(role))
	}
	if _, err := admin.Exec(ctx, sql.String()); err != nil {
		return cluster.Classify(err)
	}
	if _, err := EndSessions(ctx, cl, roles...); err != nil { // logged in meanwhile
		return err
	}
	_, _, err = onStandbys(ctx, cl, true, report, roles)
	return err
}

// terminateSQL ends the sessions of the roles in $1 (but not the caller's)
// and counts them.
const terminateSQL = `SELECT pg_catalog.count(*) FILTER (WHERE pg_catalog.pg_terminate_backend(pid))
	FROM pg_catalog.pg_stat_activity WHERE usename = ANY($1) AND pid <> pg_catalog.pg_backend_pid()`

// EndSessions ends every session of roles on the primary and returns how
// many it ended. LockOut and password rotation use it; OnStandbys does the
// same on standbys once they have replayed.
func EndSessions(ctx context.Context, cl *cluster.Cluster, roles ...string) (int, error) {
	admin, err := cl.Admin(ctx)
	if err != nil {
		return 0, err
	}
	var n int
	if err := admin.QueryRow(ctx, terminateSQL, roles).Scan(&n); err != nil {
		return 0, cluster.Classify(err)
	}
	return n, nil
}

// OnStandbys makes what the primary has done so far hold on every standby:
// it waits (up to ReplayWait each) until the standby has replayed the
// primary's current WAL position and then, with end, ends the roles'
// sessions there. It returns the sessions ended and the standbys that had
// not replayed within the wait (their sessions are ended all the same). A
// standby that does not answer is skipped: it serves no sessions.
func OnStandbys(ctx context.Context, cl *cluster.Cluster, end bool, roles ...string) (ended int, late []string, err error) {
	return onStandbys(ctx, cl, end, nil, roles)
}

func onStandbys(ctx context.Context, cl *cluster.Cluster, end bool, report func(context.Context, string), roles []string) (ended int, late []string, err error) {
	admin, err := cl.Admin(ctx)
	if err != nil {
		return 0, nil, err
	}
	var lsn string
	if err := admin.QueryRow(ctx, `SELECT pg_catalog.pg_current_wal_lsn()::text`).Scan(&lsn); err != nil {
		return 0, nil, cluster.Classify(err)
	}
	for _, node := range cl.Nodes()[1:] {
		if report != nil {
			report(ctx, fmt.Sprintf("waiting for standby %s/%s to replay the change (at most %s; a standby that does not answer is skipped)",
				cl.Name(), node, ReplayWait))
		}
		n, replayed, err := onStandby(ctx, cl, node, lsn, end, roles)
		if err != nil {
			return ended, late, err
		}
		ended += n
		if !replayed {
			late = append(late, node)
		}
	}
	return ended, late, nil
}

// onStandby waits (up to ReplayWait) until the standby has replayed lsn,
// then, with end, ends the roles' sessions there. A standby that does not
// answer counts as replayed: nobody can log in to it.
func onStandby(ctx context.Context, cl *cluster.Cluster, node, lsn string, end bool, roles []string) (ended int, replayed bool, err error) {
	pool, err := cl.NodeAdmin(ctx, node)
	if err != nil {
		return 0, false, err
	}
	for deadline := time.Now().Add(ReplayWait); ; {
		err := pool.QueryRow(ctx, `SELECT coalesce(pg_catalog.pg_last_wal_replay_lsn() >= $1::pg_lsn, true)`, lsn).Scan(&replayed)
		if errors.Is(cluster.Classify(err), cluster.ErrUnavailable) && ctx.Err() == nil {
			return 0, true, nil
		}
		if err != nil {
			return 0, false, fmt.Errorf("wait for replay on %s/%s: %w", cl.Name(), node, cluster.Classify(err))
		}
		if replayed || time.Now().After(deadline) {
			break
		}
		select {
		case <-ctx.Done():
			return 0, false, ctx.Err()
		case <-time.After(20 * time.Millisecond):
		}
	}
	if !end {
		return 0, replayed, nil
	}
	if err := pool.QueryRow(ctx, terminateSQL, roles).Scan(&ended); err != nil {
		return 0, replayed, fmt.Errorf("end sessions on %s/%s: %w", cl.Name(), node, cluster.Classify(err))
	}
	return ended, replayed, nil
}

func (p *purger) analytics(ctx context.Context, r *jobs.Run) error {
	if p.s.Analytics == nil {
		return nil
	}
	return p.run(ctx, func(ctx context.Context, t catalog.Tenant, cl *cluster.Cluster) error {
		return p.s.Analytics.Purge(ctx, t)
	})
}

func (p *purger) storage(ctx context.Context, r *jobs.Run) error {
	return p.run(ctx, func(ctx context.Context, t catalog.Tenant, cl *cluster.Cluster) error {
		name := tenant.PhysicalName(t.ID)
		if t.Mode == tenant.ModeDatabase {
			admin, err := cl.Admin(ctx)
			if err != nil {
				return err
			}
			exists, err := cluster.DatabaseExists(ctx, admin, name)
			if err != nil || !exists {
				return err
			}
			release, err := r.Pace(ctx, t.Cluster, jobs.Heavy)
			if err != nil {
				return err
			}
			defer release()
			cl.ClosePool(name)
			r.Note(ctx, fmt.Sprintf("dropping database %s: DROP DATABASE forces a checkpoint (and a scan of shared_buffers on the primary and each standby)", name))
			return cluster.DropDatabase(ctx, admin, name)
		}
		r.Note(ctx, fmt.Sprintf("dropping schema %s in %s in batches of at most %d relations", name, t.Database, p.s.Config.BatchRelations))
		conn, err := cl.Connect(ctx, t.Database)
		if errors.Is(err, cluster.ErrNotFound) {
			return nil // the shared database is gone: nothing of the tenant is left in it
		}
		if err != nil {
			return err
		}
		defer conn.Close(context.WithoutCancel(ctx))
		return dependentsHelp(cluster.DropSchemaBatched(ctx, conn, name, p.s.Config.BatchRelations, func(ctx context.Context, done, total int) error {
			r.Progress(ctx, int64(done), int64(total), fmt.Sprintf("dropped %d of ~%d relations of schema %s", done, total, name))
			release, err := r.Pace(ctx, t.Cluster, jobs.Light)
			if err == nil {
				release()
			}
			return err
		}), t)
	})
}

// role drops the tenant's role, its agent role and, if its quota was
// enforced when it was dropped, its lock role (which owns its objects
// then): in schema mode, first what they own in the shared database beside
// the schema (large objects, default privileges, grants), refusing with
// the dependent objects named if another tenant's objects depend on them.
func (p *purger) role(ctx context.Context, r *jobs.Run) error {
	return p.run(ctx, func(ctx context.Context, t catalog.Tenant, cl *cluster.Cluster) error {
		logins, err := LoginRoles(ctx, cl, t.ID)
		if err != nil {
			return err
		}
		roles := append([]string{tenant.PhysicalName(t.ID), tenant.AgentRole(t.ID), tenant.LockRole(t.ID)}, logins...)
		admin, err := cl.Admin(ctx)
		if err != nil {
			return err
		}
		if t.Mode == tenant.ModeSchema {
			// Their CONNECT on the shared database first, under its lock
			// (templates.ConnectSQL): DROP OWNED would change the database's
			// row without it, and fail beside a claim.
			if err := revokeConnect(ctx, admin, t, roles); err != nil {
				return err
			}
			conn, err := cl.Connect(ctx, t.Database)
			if err != nil && !errors.Is(err, cluster.ErrNotFound) {
				return err
			}
			if err == nil {
				err = cluster.DropOwned(ctx, conn, roles...)
				conn.Close(context.WithoutCancel(ctx))
				if err != nil {
					return dependentsHelp(err, t)
				}
			}
		}
		return dependentsHelp(cluster.DropRoles(ctx, admin, roles...), t)
	})
}

// revokeConnect takes CONNECT on a schema tenant's shared database from
// those of roles that exist and hold it.
func revokeConnect(ctx context.Context, admin *pgxpool.Pool, t catalog.Tenant, roles []string) error {
	var holders []string
	if err := admin.QueryRow(ctx, `SELECT coalesce(pg_catalog.array_agg(r.rolname::text), '{}')
		FROM pg_catalog.pg_database d, pg_catalog.aclexplode(d.datacl) a JOIN pg_catalog.pg_roles r ON r.oid = a.grantee
		WHERE d.datname = $1 AND r.rolname = ANY($2)`, t.Database, roles).Scan(&holders); err != nil {
		return cluster.Classify(err)
	}
	if len(holders) == 0 {
		return nil
	}
	if _, err := admin.Exec(ctx, templates.ConnectSQL(false, t.Template, holders...)); err != nil {
		return fmt.Errorf("revoke CONNECT on %s from tenant %s: %w", t.Database, t.ID, cluster.Classify(err))
	}
	return nil
}

// dependentsHelp says what to do when other objects depend on a purged
// tenant's: the purge stops rather than drop them.
func dependentsHelp(err error, t catalog.Tenant) error {
	if errors.Is(err, cluster.ErrDependents) || errors.Is(err, cluster.ErrOutsideDependents) {
		return jobs.Permanent(fmt.Errorf("tenant %s: %w; these are not the tenant's (another tenant's, or made by hand) and a purge never drops them: "+
			"drop them, or purge the tenant that owns them first, then retry this purge job (`pgtenant job retry`)", t.ID, err))
	}
	return err
}

// catalog forgets the tenant: a claimed tenant's row becomes its tombstone
// (state purged, with its events, for drop.purged_retention); a spare
// leaves nothing.
func (p *purger) catalog(ctx context.Context, r *jobs.Run) error {
	if p.leftover != nil {
		return nil // the tenant's row is the live copy's
	}
	keep := p.s.Config.PurgedRetention.D() > 0
	return p.s.Store.ForgetTenant(ctx, p.id, keep, map[string]any{"job": r.Job.ID, "reason": p.reason})
}
