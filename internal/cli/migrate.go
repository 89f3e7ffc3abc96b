package cli

import (
	"context"
	"fmt"
	"io"
	"net/url"
	"sort"
	"strconv"
	"strings"

	"github.com/spf13/cobra"

	"github.com/pgtenant/pgtenant/internal/api"
	"github.com/pgtenant/pgtenant/internal/bench"
	"github.com/pgtenant/pgtenant/internal/catalog"
	"github.com/pgtenant/pgtenant/internal/jobs"
	"github.com/pgtenant/pgtenant/internal/migrate"
)

func newMigrateCmd(g *globals) *cobra.Command {
	var req migrate.Request
	var wait bool
	cmd := &cobra.Command{
		Use:   "migrate TEMPLATE [--to VERSION]",
		Short: "Roll a template version out to every tenant of the template (a resumable rollout)",
		Long: `Start a rollout: a durable job that brings every tenant of TEMPLATE (both modes,
every cluster or --cluster's) from its version to --to (default: the template's
current version), applying each pending version's new files in order, one
transaction per tenant per version, with a short lock_timeout and retries.

First the target version is materialised on every cluster, so that tenants
created from then on start at it. Tenants already at the target are skipped
without being connected to. Active, suspended and dropped (restorable) tenants
are migrated; a tenant whose migration fails is rolled back to its previous
version and reported while the others go on ('pgtenant rollout show ID', then
'pgtenant rollout retry ID' after a fix). With --canary N the rollout pauses
after N tenants until 'pgtenant rollout continue ID'. A rollout interrupted by
a crash resumes where it was; no tenant gets a version twice.`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := g.client()
			if err != nil {
				return err
			}
			req.Template = args[0]
			out, err := c.StartRollout(cmd.Context(), req)
			if err != nil {
				return err
			}
			if out.Rollout == nil || !wait {
				return g.print(out, func(w io.Writer) {
					planTable(w, out.Plan)
					if out.Rollout != nil {
						fmt.Fprintf(w, "\nrollout %d started (job %d): follow it with `pgtenant rollout show %d --wait`\n",
							out.Rollout.ID, out.Rollout.JobID, out.Rollout.ID)
					} else {
						fmt.Fprintln(w, "\ndry run: nothing changed")
					}
				})
			}
			if g.output != "json" {
				planTable(g.stdout, out.Plan)
				fmt.Fprintln(g.stdout)
			}
			return g.followRollout(cmd.Context(), c, out.Rollout.ID)
		},
	}
	f := cmd.Flags()
	f.IntVar(&req.To, "to", 0, "target version (default: the template's current version)")
	f.IntVar(&req.Canary, "canary", 0, "migrate `N` tenants, then pause until pgtenant rollout continue")
	f.IntVar(&req.Parallel, "parallel", 0, "tenants migrated at once over all clusters (default: migrate.parallel; per cluster at most migrate.per_cluster)")
	f.StringVar(&req.Cluster, "cluster", "", "only the tenants of this cluster")
	f.BoolVar(&req.DryRun, "dry-run", false, "show what the rollout would do and change nothing")
	f.BoolVar(&wait, "wait", false, "follow the rollout with a progress bar until it ends or pauses")
	return cmd
}

func newRolloutCmd(g *globals) *cobra.Command {
	cmd := &cobra.Command{Use: "rollout", Short: "Inspect, continue and retry rollouts (see `pgtenant migrate`)"}
	var template string
	var limit int
	list := &cobra.Command{
		Use: "list", Short: "List rollouts, newest first", Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := g.client()
			if err != nil {
				return err
			}
			q := url.Values{"limit": {strconv.Itoa(limit)}}
			if template != "" {
				q.Set("template", template)
			}
			out, err := c.Rollouts(cmd.Context(), q)
			if err != nil {
				return err
			}
			return g.print(out, func(w io.Writer) {
				row(w, "ID", "TEMPLATE", "TO", "STATE", "DONE", "FAILED", "PENDING", "SKIPPED", "AT TARGET", "CLUSTER", "CREATED")
				for _, r := range out {
					cl := r.Cluster
					if cl == "" {
						cl = "all"
					}
					row(w, r.ID, r.Template, r.TargetVersion, r.State, r.Counts[catalog.RolloutTenantDone], r.Counts[catalog.RolloutTenantFailed],
						r.Counts[catalog.RolloutTenantPending]+r.Counts[catalog.RolloutTenantRunning], r.Counts[catalog.RolloutTenantSkipped],
						r.AlreadyAtTarget, cl, r.CreatedAt.Format("2006-01-02 15:04:05"))
				}
			})
		},
	}
	list.Flags().StringVar(&template, "template", "", "only rollouts of this template")
	list.Flags().IntVar(&limit, "limit", 50, "at most this many")

	var states string
	var wait bool
	show := &cobra.Command{
		Use:   "show ID",
		Short: "Show a rollout: counts, and its failed (with errors), running, pending and skipped tenants",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			id, err := parseRolloutID(args[0])
			if err != nil {
				return err
			}
			c, err := g.client()
			if err != nil {
				return err
			}
			if wait {
				return g.followRollout(cmd.Context(), c, id, states)
			}
			return g.showRollout(cmd.Context(), c, id, states)
		},
	}
	show.Flags().StringVar(&states, "state", "", "list the tenants in these states (comma-separated: pending, running, done, failed, skipped, or all); default: all but done")
	show.Flags().BoolVar(&wait, "wait", false, "follow the rollout with a progress bar until it ends or pauses")

	var contWait bool
	cont := &cobra.Command{
		Use: "continue ID", Short: "Let a rollout paused after its canary go on", Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			id, err := parseRolloutID(args[0])
			if err != nil {
				return err
			}
			c, err := g.client()
			if err != nil {
				return err
			}
			st, err := c.ContinueRollout(cmd.Context(), id)
			if err != nil {
				return err
			}
			if contWait {
				return g.followRollout(cmd.Context(), c, id)
			}
			return g.print(st, func(w io.Writer) { rolloutDetail(w, st) })
		},
	}
	cont.Flags().BoolVar(&contWait, "wait", false, "follow the rollout until it ends or pauses")

	var tenantID string
	var retryWait bool
	retry := &cobra.Command{
		Use:   "retry ID [--tenant T]",
		Short: "Rerun a rollout's failed tenants (or one), and resume it if it ended",
		Long: `Set the rollout's failed tenants (or only --tenant) back to pending and, if the
rollout has ended failed or cancelled, resume its job where it was: tenants that
are done are not touched again. Fix what made them fail first (their data, or a
new version of the template and a new rollout).`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			id, err := parseRolloutID(args[0])
			if err != nil {
				return err
			}
			c, err := g.client()
			if err != nil {
				return err
			}
			st, err := c.RetryRollout(cmd.Context(), id, tenantID)
			if err != nil {
				return err
			}
			if retryWait {
				return g.followRollout(cmd.Context(), c, id)
			}
			return g.print(st, func(w io.Writer) { rolloutDetail(w, st) })
		},
	}
	retry.Flags().StringVar(&tenantID, "tenant", "", "retry only this tenant")
	retry.Flags().BoolVar(&retryWait, "wait", false, "follow the rollout until it ends or pauses")

	cmd.AddCommand(list, show, cont, retry)
	return cmd
}

func parseRolloutID(s string) (int64, error) {
	id, err := strconv.ParseInt(s, 10, 64)
	if err != nil {
		return 0, fmt.Errorf("rollout id %q: a number (see `pgtenant rollout list`)", s)
	}
	return id, nil
}

func (g *globals) showRollout(ctx context.Context, c *api.Client, id int64, states string) error {
	q := url.Values{}
	if states != "" {
		q.Set("state", states)
	}
	st, err := c.Rollout(ctx, id, q)
	if err != nil {
		return err
	}
	return g.print(st, func(w io.Writer) { rolloutDetail(w, st) })
}

// followRollout follows a rollout's job with a progress bar, then shows the
// rollout. A rollout that ends failed or cancelled is an error (after it is
// shown); a paused one is not.
func (g *globals) followRollout(ctx context.Context, c *api.Client, id int64, states ...string) error {
	st, err := c.Rollout(ctx, id, url.Values{"limit": {"1"}})
	if err != nil {
		return err
	}
	if st.JobID != 0 {
		p := newProgress(g.stderr)
		_, err = c.WaitJob(ctx, st.JobID, p.update)
		p.done()
		if err != nil {
			return err
		}
	}
	if err := g.showRollout(ctx, c, id, strings.Join(states, ",")); err != nil {
		return err
	}
	if st, err = c.Rollout(ctx, id, url.Values{"limit": {"1"}}); err != nil {
		return err
	}
	switch st.State {
	case catalog.RolloutFailed, catalog.RolloutCancelled:
		return fmt.Errorf("rollout %d %s", id, st.State)
	case catalog.RolloutPaused:
		fmt.Fprintf(g.stderr, "rollout %d is paused after its canary: check the canary tenants above, then `pgtenant rollout continue %d`\n", id, id)
	}
	return nil
}

func planTable(w io.Writer, p migrate.Plan) {
	scope := "every cluster"
	if p.Cluster != "" {
		scope = "cluster " + p.Cluster
	}
	fmt.Fprintf(w, "template %s to version %d on %s: %d tenant(s) to migrate, %d already at or past it\n",
		p.Template, p.To, scope, p.Tenants, p.AlreadyAtTarget)
	versions := make([]string, 0, len(p.ByVersion))
	for v := range p.ByVersion {
		versions = append(versions, v)
	}
	sort.Slice(versions, func(i, j int) bool {
		a, _ := strconv.Atoi(versions[i])
		b, _ := strconv.Atoi(versions[j])
		return a < b
	})
	for _, v := range versions {
		fmt.Fprintf(w, "  at v%s: %d\n", v, p.ByVersion[v])
	}
	clusters := make([]string, 0, len(p.ByCluster))
	for c := range p.ByCluster {
		clusters = append(clusters, c)
	}
	sort.Strings(clusters)
	for _, c := range clusters {
		fmt.Fprintf(w, "  on %s: %d\n", c, p.ByCluster[c])
	}
	for _, v := range p.Versions {
		line := fmt.Sprintf("  v%d applies %s", v.Version, strings.Join(v.Files, ", "))
		if len(v.NoTransaction) > 0 {
			line += fmt.Sprintf(" (outside a transaction: %s)", strings.Join(v.NoTransaction, ", "))
		}
		fmt.Fprintln(w, line)
	}
	if len(p.BuildsNeeded) > 0 {
		fmt.Fprintf(w, "  v%d is first materialised on %s\n", p.To, strings.Join(p.BuildsNeeded, ", "))
	}
}

func rolloutDetail(w io.Writer, st migrate.Status) {
	tw := w
	row(tw, "id", st.ID)
	row(tw, "template", fmt.Sprintf("%s to v%d", st.Template, st.TargetVersion))
	cl := st.Cluster
	if cl == "" {
		cl = "all"
	}
	row(tw, "clusters", cl)
	row(tw, "state", st.State)
	if st.Canary > 0 {
		row(tw, "canary", canaryLine(st))
	}
	row(tw, "parallel", st.Parallel)
	c := st.Counts
	row(tw, "tenants", fmt.Sprintf("%d: %d done, %d failed, %d pending, %d running, %d skipped; %d were already at the target",
		st.Total, c[catalog.RolloutTenantDone], c[catalog.RolloutTenantFailed], c[catalog.RolloutTenantPending],
		c[catalog.RolloutTenantRunning], c[catalog.RolloutTenantSkipped], st.AlreadyAtTarget))
	if st.Job != nil {
		row(tw, "job", fmt.Sprintf("%d %s: %s", st.Job.ID, st.Job.State, st.Job.ProgressMsg))
	}
	if st.Error != "" {
		row(tw, "error", st.Error)
	}
	// The canary's tenants as they ended then: done ones are not in the
	// tenants below by default, and they are what a paused rollout asks to
	// check.
	if len(st.CanaryTenants) > 0 {
		fmt.Fprintln(tw)
		row(tw, "CANARY TENANT", "CLUSTER", "MODE", "STATE", "FROM", "AT", "ATTEMPTS", "ERROR")
		for _, t := range st.CanaryTenants {
			row(tw, t.Tenant, t.Cluster, t.Mode, t.State, t.FromVersion, t.Version, t.Attempts, t.Error)
		}
	}
	if len(st.Tenants) > 0 {
		fmt.Fprintln(tw)
		row(tw, "TENANT", "CLUSTER", "MODE", "STATE", "FROM", "AT", "ATTEMPTS", "ERROR")
		for _, t := range st.Tenants {
			row(tw, t.Tenant, t.Cluster, t.Mode, t.State, t.FromVersion, t.Version, t.Attempts, t.Error)
		}
	}
}

// canaryLine says how a rollout's canary went: passed when every one of its
// tenants was migrated, and whether the rollout was let go on past it.
func canaryLine(st migrate.Status) string {
	if st.CanarySucceeded == nil {
		if st.Job != nil && jobs.Finished(st.Job.State) {
			return fmt.Sprintf("%d tenant(s), none tried", st.Canary)
		}
		return fmt.Sprintf("%d tenant(s), not done yet", st.Canary)
	}
	var done, failed int
	for _, t := range st.CanaryTenants {
		if t.State == catalog.RolloutTenantDone {
			done++
		} else {
			failed++
		}
	}
	line := fmt.Sprintf("%d tenant(s), passed: %v (%d done, %d failed)", st.Canary, *st.CanarySucceeded, done, failed)
	if st.CanaryPassed {
		line += ", continued"
	}
	return line
}

func newBenchMigrateCmd(g *globals, env *bench.Env) *cobra.Command {
	var opts bench.MigrateOptions
	c := &cobra.Command{
		Use:   "migrate",
		Short: "Sequential per-tenant migration (django/Rails style) vs pgtenant's rollout, over schema and database tenants",
		Long: `On one primary with a streaming standby: --schemas schema tenants and --databases
database tenants of saas (claimed from spare pools built first), each with --rows
users. Then one new version (a column with a default, a table with a foreign key,
an index) is applied to every tenant (a) sequentially, one tenant after another
with a new connection each, as django-tenants and the Rails libraries do, and
(b) by pgtenant's rollout; each is then run again with nothing to apply. For each:
total time, tenants/s, the no-op re-run, peak connections, peak standby replay lag
and WAL. Measured with fsync on. Exits non-zero if a target is not met.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			env.Log = g.stderr
			_, table, err := env.Migrate(cmd.Context(), opts)
			if err != nil {
				return err
			}
			if err := g.printTable(table); err != nil {
				return err
			}
			return unmetTargets(table)
		},
	}
	c.Flags().IntVar(&opts.Schemas, "schemas", 1000, "schema tenants of saas")
	c.Flags().IntVar(&opts.Databases, "databases", 200, "database tenants of saas")
	c.Flags().IntVar(&opts.Rows, "rows", 100, "users rows per tenant")
	c.Flags().IntVar(&opts.Parallel, "parallel", 0, "the rollout's parallelism (default: migrate.parallel)")
	c.Flags().IntVar(&opts.PerCluster, "per-cluster", 0, "the rollout's connections per cluster (default: migrate.per_cluster)")
	return c
}
