// Package migrate runs rollouts: a durable job that brings every tenant of a
// template (both modes, all clusters, or one) from its version to a target
// version, applying each pending version's new files in order, one
// transaction per tenant per version. Tenants are migrated in parallel under
// a global and a per-cluster limit (each in-flight tenant holds one
// connection), paced by the standby's replay lag; a failing tenant is rolled
// back, recorded with its error and skipped while the others go on; a canary
// pauses the rollout after its first tenants; and a rollout interrupted at
// any point resumes without applying a version to a tenant twice, because
// each tenant records its version inside itself (tenant.Marker) in the same
// transaction as the version's files.
//
// It owns the version markers and the meaning of the rollouts and
// rollout_tenants tables, whose queries live in catalog (rollouts.go). It
// never creates or drops tenants, and it changes nothing in a tenant but the
// template's files and the marker.
package migrate

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"sort"
	"strconv"

	"github.com/jackc/pgx/v5"

	"github.com/pgtenant/pgtenant/internal/catalog"
	"github.com/pgtenant/pgtenant/internal/cluster"
	"github.com/pgtenant/pgtenant/internal/config"
	"github.com/pgtenant/pgtenant/internal/jobs"
	"github.com/pgtenant/pgtenant/internal/sandbox"
	"github.com/pgtenant/pgtenant/internal/templates"
)

// ErrInvalid wraps errors in a rollout request.
var ErrInvalid = errors.New("invalid rollout request")

func invalid(format string, args ...any) error {
	return fmt.Errorf("%w: %s", ErrInvalid, fmt.Sprintf(format, args...))
}

// Poker is the spare pool manager: poked once the target version is
// materialised, so that it retires the old version's spares and refills.
type Poker interface{ Poke() }

// Service starts and runs rollouts.
type Service struct {
	Store     *catalog.Store
	Clusters  *cluster.Registry
	Runner    *jobs.Runner
	Templates *templates.Service
	Agents    *sandbox.Agents // tenants are migrated in sessions of their agent roles
	Migrate   config.MigrateConfig
	// Provision: a rollout waits up to its cold_wait for tenants still
	// being provisioned at the version it leaves.
	Provision config.ProvisionConfig
	Logger    *slog.Logger
	Pool      Poker // may be nil
}

// Request asks for a rollout of a template.
type Request struct {
	Template string `json:"-"`                  // from the URL
	To       int    `json:"to,omitempty"`       // target version; 0: the newest one that has not failed
	Canary   int    `json:"canary,omitempty"`   // pause after this many tenants (0: no canary)
	Parallel int    `json:"parallel,omitempty"` // tenants in flight at once (0: migrate.parallel)
	Cluster  string `json:"cluster,omitempty"`  // only this cluster's tenants
	DryRun   bool   `json:"dry_run,omitempty"`  // say what would happen, change nothing
}

// Plan is what a rollout does, computed from the catalog alone.
type Plan struct {
	Template        string         `json:"template"`
	To              int            `json:"to"`
	Cluster         string         `json:"cluster,omitempty"`
	Tenants         int            `json:"tenants"`    // to migrate
	ByVersion       map[string]int `json:"by_version"` // tenants to migrate, by their version now
	ByCluster       map[string]int `json:"by_cluster"`
	AlreadyAtTarget int            `json:"already_at_target"` // at or past the target: not connected to
	Versions        []PlanVersion  `json:"versions"`          // what each version brings, in order
	BuildsNeeded    []string       `json:"builds_needed"`     // clusters where the target is not materialised yet
}

// PlanVersion is one version's new files.
type PlanVersion struct {
	Version       int      `json:"version"`
	Files         []string `json:"files"`
	NoTransaction []string `json:"no_transaction,omitempty"` // run outside the version's transaction
}

// Started answers a rollout request: the plan, and the rollout unless it was a dry run.
type Started struct {
	Plan    Plan    `json:"plan"`
	Rollout *Status `json:"rollout,omitempty"`
}

// Status is a rollout as shown: its row, its job and (for one rollout) its
// tenants and its canary's. CanaryPassed (canary_passed) says that the
// rollout was let go on past its canary (`rollout continue`, or
// canary_auto_continue); CanarySucceeded that every canary tenant was
// migrated.
type Status struct {
	catalog.Rollout
	Job     *jobs.Job               `json:"job,omitempty"`
	Error   string                  `json:"error,omitempty"` // why the job failed
	Tenants []catalog.RolloutTenant `json:"tenants,omitempty"`
	// CanaryTenants are the tenants the canary tried, as they ended then
	// (failed first): the ones to check before `rollout continue`.
	CanaryTenants []catalog.RolloutTenant `json:"canary_tenants,omitempty"`
	// CanarySucceeded is set with CanaryTenants (not in lists).
	CanarySucceeded *bool `json:"canary_succeeded,omitempty"`
}

type jobArgs struct {
	Rollout int64 `json:"rollout"`
}

// Start validates a request, computes its plan and, unless it is a dry run,
// records the rollout with the tenants it has to move and enqueues its job,
// in one catalog transaction. A template has at most one unfinished rollout.
func (s *Service) Start(ctx context.Context, req Request) (Started, error) {
	if err := templates.ValidName(req.Template); err != nil {
		return Started{}, invalid("%v", err)
	}
	tpl, err := s.Store.GetTemplate(ctx, req.Template)
	if err != nil {
		return Started{}, err
	}
	if tpl.Deleting {
		return Started{}, fmt.Errorf("%w: template %s is being deleted", catalog.ErrConflict, tpl.Name)
	}
	if req.To == 0 {
		// The newest version not known to be broken: the current one, or a
		// newer one still being built (the rollout waits for its builds).
		req.To = tpl.CurrentVersion
		if tpl.LatestVersion > tpl.CurrentVersion && s.Templates.Failed(ctx, tpl.Name, tpl.LatestVersion) == nil {
			req.To = tpl.LatestVersion
		}
		if req.To == 0 {
			return Started{}, fmt.Errorf("%w: template %s has no version built yet", catalog.ErrConflict, tpl.Name)
		}
	}
	if req.To < 1 || req.To > tpl.LatestVersion {
		return Started{}, invalid("version %d: template %s has versions 1 to %d (push a new one with `pgtenant template push`)",
			req.To, tpl.Name, tpl.LatestVersion)
	}
	if err := s.Templates.Failed(ctx, tpl.Name, req.To); err != nil {
		return Started{}, err
	}
	if req.Canary < 0 {
		return Started{}, invalid("canary %d: a number of tenants, 0 for none", req.Canary)
	}
	if req.Parallel == 0 {
		req.Parallel = s.Migrate.Parallel
	}
	if req.Parallel < 1 || req.Parallel > 1000 {
		return Started{}, invalid("parallel %d: between 1 and 1000", req.Parallel)
	}
	if req.Cluster != "" {
		if _, err := s.Clusters.Get(req.Cluster); err != nil {
			return Started{}, err
		}
	}
	plan, err := s.plan(ctx, tpl.Name, req.To, req.Cluster)
	if err != nil {
		return Started{}, err
	}
	if req.DryRun {
		return Started{Plan: plan}, nil
	}
	tx, err := s.Store.Begin(ctx)
	if err != nil {
		return Started{}, err
	}
	defer tx.Rollback(context.WithoutCancel(ctx))
	id, err := s.Store.InsertRollout(ctx, tx, catalog.Rollout{Template: tpl.Name, TargetVersion: req.To, Canary: req.Canary,
		Parallel: req.Parallel, Cluster: req.Cluster, AlreadyAtTarget: plan.AlreadyAtTarget})
	if err != nil {
		return Started{}, err
	}
	if _, err := s.Store.AddRolloutTenants(ctx, tx, id); err != nil {
		return Started{}, err
	}
	j, err := s.Runner.Enqueue(ctx, tx, jobs.Spec{Type: jobs.Rollout, Key: "rollout:" + tpl.Name, TargetKind: "template", Target: tpl.Name,
		Cluster: req.Cluster, Args: jobArgs{Rollout: id}})
	if err != nil {
		return Started{}, err
	}
	var a jobArgs
	if err := j.DecodeArgs(&a); err != nil || a.Rollout != id {
		return Started{}, fmt.Errorf("%w: rollout %d of template %s is not finished (job %d is %s): wait for it, or cancel it with `pgtenant job cancel %d`",
			catalog.ErrConflict, a.Rollout, tpl.Name, j.ID, j.State, j.ID)
	}
	if err := s.Store.SetRolloutJob(ctx, tx, id, j.ID); err != nil {
		return Started{}, err
	}
	if err := tx.Commit(ctx); err != nil {
		return Started{}, err
	}
	s.Runner.Poke()
	st, err := s.Get(ctx, id, nil, 0)
	if err != nil {
		return Started{}, err
	}
	return Started{Plan: plan, Rollout: &st}, nil
}

// plan computes what a rollout of template to version to would do.
func (s *Service) plan(ctx context.Context, template string, to int, clusterName string) (Plan, error) {
	p := Plan{Template: template, To: to, Cluster: clusterName, ByVersion: map[string]int{}, ByCluster: map[string]int{},
		Versions: []PlanVersion{}, BuildsNeeded: []string{}}
	counts, err := s.Store.MigratableVersions(ctx, template, clusterName)
	if err != nil {
		return p, err
	}
	lowest := to
	for _, c := range counts {
		if c.Version >= to {
			p.AlreadyAtTarget += c.Tenants
			continue
		}
		p.Tenants += c.Tenants
		p.ByVersion[strconv.Itoa(c.Version)] += c.Tenants
		p.ByCluster[c.Cluster] += c.Tenants
		lowest = min(lowest, c.Version)
	}
	if p.Tenants > 0 {
		vs, err := s.Store.TemplateVersions(ctx, template, false)
		if err != nil {
			return p, err
		}
		prev := 0
		for _, v := range vs {
			if v.State == catalog.VersionFailed {
				continue // never applied: the next version extends the one before it
			}
			if v.Version > lowest && v.Version <= to {
				pv := PlanVersion{Version: v.Version}
				for _, f := range v.Files[prev:] {
					pv.Files = append(pv.Files, f.Name)
					if f.NoTransaction {
						pv.NoTransaction = append(pv.NoTransaction, f.Name)
					}
				}
				p.Versions = append(p.Versions, pv)
			}
			prev = len(v.Files)
		}
	}
	for _, name := range s.scope(clusterName) {
		if v, err := s.Templates.ProvisionVersion(ctx, template, name); err != nil || v < to {
			p.BuildsNeeded = append(p.BuildsNeeded, name)
		}
	}
	return p, nil
}

// scope lists the clusters a rollout covers, by name.
func (s *Service) scope(clusterName string) []string {
	if clusterName != "" {
		return []string{clusterName}
	}
	var out []string
	for _, c := range s.Clusters.All() {
		out = append(out, c.Name())
	}
	sort.Strings(out)
	return out
}

// Get returns a rollout with its job, its tenants in the given states (with
// no states: every tenant not done, up to limit) and, once its canary is
// done, the canary's tenants whatever their state.
func (s *Service) Get(ctx context.Context, id int64, states []catalog.RolloutTenantState, limit int) (Status, error) {
	r, err := s.Store.GetRollout(ctx, nil, id)
	if err != nil {
		return Status{}, err
	}
	st := Status{Rollout: r}
	if r.JobID != 0 {
		j, err := jobs.Get(ctx, s.Store.Pool(), r.JobID)
		if err != nil && !errors.Is(err, jobs.ErrNotFound) {
			return Status{}, err
		}
		if err == nil {
			st.Job = &j
			switch j.State {
			case jobs.Paused, jobs.Succeeded, jobs.Failed, jobs.Cancelled:
				st.State = catalog.RolloutState(j.State) // the same words
			}
			if j.State == jobs.Failed {
				st.Error = j.LastError
			}
			var data jobData
			if r.Canary > 0 && len(j.Data) > 0 {
				if err := json.Unmarshal(j.Data, &data); err != nil {
					return Status{}, fmt.Errorf("rollout %d: the canary recorded on job %d: %w", id, j.ID, err)
				}
				if len(data.Canary) > 0 {
					succeeded := true
					for _, t := range data.Canary {
						succeeded = succeeded && t.State == catalog.RolloutTenantDone
					}
					st.CanaryTenants, st.CanarySucceeded = data.Canary, &succeeded
				}
			}
		}
	}
	if states == nil {
		states = []catalog.RolloutTenantState{catalog.RolloutTenantFailed, catalog.RolloutTenantRunning, catalog.RolloutTenantPending, catalog.RolloutTenantSkipped}
	}
	if st.Tenants, err = s.Store.RolloutTenants(ctx, id, states, limit); err != nil {
		return Status{}, err
	}
	return st, nil
}

// List returns rollouts, newest first.
func (s *Service) List(ctx context.Context, template string, limit int) ([]Status, error) {
	rs, err := s.Store.ListRollouts(ctx, template, limit)
	if err != nil {
		return nil, err
	}
	out := make([]Status, len(rs))
	for i, r := range rs {
		out[i] = Status{Rollout: r}
	}
	return out, nil
}

// Continue lets a rollout paused after its canary go on.
func (s *Service) Continue(ctx context.Context, id int64) (Status, error) {
	err := pgx.BeginFunc(ctx, s.Store.Pool(), func(tx pgx.Tx) error {
		r, err := s.Store.LockRollout(ctx, tx, id)
		if err != nil {
			return err
		}
		if err := jobs.Resume(ctx, tx, r.JobID); err != nil {
			if errors.Is(err, jobs.ErrWrongState) {
				return fmt.Errorf("%w: rollout %d is %s, not paused", catalog.ErrConflict, id, r.State)
			}
			return err
		}
		if err := s.Store.PassCanary(ctx, tx, id); err != nil {
			return err
		}
		return s.Store.SetRolloutState(ctx, tx, id, catalog.RolloutMigrating)
	})
	if err != nil {
		return Status{}, err
	}
	s.Runner.Poke()
	return s.Get(ctx, id, nil, 0)
}

// Retry sets a rollout's failed tenants (or only tenant) back to pending and,
// when the rollout has ended failed or cancelled, requeues its job; the job
// resumes where it was (tenants already done are not touched again). A
// running rollout picks the tenants up before it ends; a paused one after
// `rollout continue`.
func (s *Service) Retry(ctx context.Context, id int64, tenant string) (Status, error) {
	err := pgx.BeginFunc(ctx, s.Store.Pool(), func(tx pgx.Tx) error {
		r, err := s.Store.LockRollout(ctx, tx, id)
		if err != nil {
			return err
		}
		j, err := jobs.Get(ctx, tx, r.JobID)
		if err != nil {
			return err
		}
		n, err := s.Store.RetryRolloutTenants(ctx, tx, id, tenant)
		if err != nil {
			return err
		}
		switch {
		case j.State == jobs.Failed || j.State == jobs.Cancelled:
			if _, err := jobs.Retry(ctx, tx, j.ID); err != nil {
				if errors.Is(cluster.Classify(err), cluster.ErrUniqueViolation) {
					return fmt.Errorf("%w: another rollout of template %s is running; retry this one when it ends", catalog.ErrConflict, r.Template)
				}
				return err
			}
			return s.Store.SetRolloutState(ctx, tx, id, catalog.RolloutQueued)
		case j.State == jobs.Succeeded:
			return fmt.Errorf("%w: rollout %d succeeded: no tenant to retry", catalog.ErrConflict, id)
		case r.State == catalog.RolloutFailed || r.State == catalog.RolloutSucceeded:
			return fmt.Errorf("%w: rollout %d is finishing; retry it in a moment", catalog.ErrConflict, id)
		case n == 0 && tenant != "":
			return fmt.Errorf("%w: tenant %s has not failed in rollout %d", catalog.ErrConflict, tenant, id)
		case n == 0:
			return fmt.Errorf("%w: rollout %d has no failed tenants (it is %s)", catalog.ErrConflict, id, r.State)
		}
		return nil
	})
	if err != nil {
		return Status{}, err
	}
	s.Runner.Poke()
	return s.Get(ctx, id, nil, 0)
}
