package cli

import (
	"fmt"
	"io"
	"sort"
	"strings"

	"github.com/spf13/cobra"

	"github.com/pgtenant/pgtenant/internal/api"
	"github.com/pgtenant/pgtenant/internal/catalog"
	"github.com/pgtenant/pgtenant/internal/config"
)

// newClusterSetCmd is `cluster set`: a cluster's placement caps and labels.
func newClusterSetCmd(g *globals) *cobra.Command {
	var maxTenants int
	var maxSize string
	var labels, remove []string
	cmd := &cobra.Command{
		Use:   "set NAME [--max-tenants N] [--max-size SIZE] [--label k=v] [--remove-label k]",
		Short: "Set a cluster's placement caps and labels (docs/operations/placement.md)",
		Long: `Set the placement policy of a cluster, stored in the catalog for every daemon:
--max-tenants and --max-size (e.g. 500GB, from the sizes the metrics collector
stores) cap what placement and moves put there (0 removes a cap); --label k=v
sets a label that tiers can ask for (tiers.NAME.cluster_label), --remove-label k
removes one. Flags not given leave the setting as it is.`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			var req catalog.PlacementChange
			if cmd.Flags().Changed("max-tenants") {
				req.MaxTenants = &maxTenants
			}
			if cmd.Flags().Changed("max-size") {
				n := int64(0)
				if maxSize != "0" {
					var err error
					if n, err = config.ParseByteSize(maxSize); err != nil {
						return usagef("--max-size: %w, or 0 for no cap", err)
					}
				}
				req.MaxSizeBytes = &n
			}
			for _, l := range labels {
				k, v, err := config.ParseLabel(l)
				if err != nil {
					return usagef("--label: %w", err)
				}
				if req.Labels == nil {
					req.Labels = map[string]string{}
				}
				req.Labels[k] = v
			}
			req.RemoveLabels = remove
			c, err := g.client()
			if err != nil {
				return err
			}
			out, err := c.SetCluster(cmd.Context(), args[0], req)
			if err != nil {
				return err
			}
			return g.print(out, func(w io.Writer) { clusterTable(w, []api.Cluster{out}) })
		},
	}
	cmd.Flags().IntVar(&maxTenants, "max-tenants", 0, "most tenants placed on the cluster (0: no cap)")
	cmd.Flags().StringVar(&maxSize, "max-size", "", "most bytes its tenants may add up to, e.g. 500GB (0: no cap)")
	cmd.Flags().StringSliceVar(&labels, "label", nil, "a label k=v (repeatable)")
	cmd.Flags().StringSliceVar(&remove, "remove-label", nil, "remove the label with this key (repeatable)")
	return cmd
}

func newClusterDrainCmd(g *globals) *cobra.Command {
	var wait bool
	cmd := &cobra.Command{
		Use:   "drain NAME",
		Short: "Stop placing tenants on a cluster and move its tenants away (a job)",
		Long: `Mark the cluster draining: no new tenant or spare is placed there and its
spares are retired; then a job moves its active tenants, largest first, to the
clusters the placement policy chooses, at most move.max_concurrent_per_cluster
moves into or out of a cluster at a time. Draining again returns the same job.
Tenants that cannot move (suspended, dropped, refused by the move, no cluster
admits them) are named when the job ends. --wait follows it with a progress bar.
` + "`pgtenant cluster undrain NAME`" + ` places tenants there again (moves in flight finish).`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := g.client()
			if err != nil {
				return err
			}
			j, err := c.DrainCluster(cmd.Context(), args[0])
			if err != nil {
				return err
			}
			return g.printJob(cmd.Context(), c, j, wait)
		},
	}
	cmd.Flags().BoolVar(&wait, "wait", false, "wait for the drain with a progress bar")
	return cmd
}

func newClusterUndrainCmd(g *globals) *cobra.Command {
	return &cobra.Command{
		Use:   "undrain NAME",
		Short: "Place tenants on a drained cluster again",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := g.client()
			if err != nil {
				return err
			}
			out, err := c.UndrainCluster(cmd.Context(), args[0])
			if err != nil {
				return err
			}
			return g.print(out, func(w io.Writer) { clusterTable(w, []api.Cluster{out}) })
		},
	}
}

func newRebalanceCmd(g *globals) *cobra.Command {
	var dryRun, wait bool
	var maxMoves int
	cmd := &cobra.Command{
		Use:   "rebalance [--dry-run] [--max-moves N] [--wait]",
		Short: "Plan moves that even out the clusters, and start them",
		Long: `Plan moves that even out the clusters that are not draining by the placement
policy: first the number of tenants (the largest tenants of the most loaded
cluster, while it is above the mean and a move narrows the gap), then their sizes.
Caps, labels and dedicated tiers are respected; tenants of dedicated tiers stay.
The plan is printed (tenant, from, to, size, reason); without --dry-run its moves
start as one job (at most move.max_concurrent_per_cluster moves into or out of a
cluster at a time), which --wait follows.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := g.client()
			if err != nil {
				return err
			}
			out, err := c.Rebalance(cmd.Context(), api.RebalanceRequest{DryRun: dryRun, MaxMoves: maxMoves})
			if err != nil {
				return err
			}
			if wait && out.Job != nil {
				j, err := g.waitJob(cmd.Context(), c, out.Job.ID)
				out.Job = &j
				if err != nil {
					return err
				}
			}
			return g.print(out, func(w io.Writer) { rebalanceTable(w, out, dryRun) })
		},
	}
	cmd.Flags().BoolVar(&dryRun, "dry-run", false, "print the plan only")
	cmd.Flags().IntVar(&maxMoves, "max-moves", 10, "plan at most this many moves")
	cmd.Flags().BoolVar(&wait, "wait", false, "wait for the moves with a progress bar")
	return cmd
}

func rebalanceTable(w io.Writer, out api.RebalanceResponse, dryRun bool) {
	if len(out.Moves) == 0 {
		row(w, "balanced: nothing to move")
		return
	}
	row(w, "TENANT", "FROM", "TO", "SIZE", "REASON")
	for _, m := range out.Moves {
		row(w, m.Tenant, m.From, m.To, humanBytes(m.SizeBytes), m.Reason)
	}
	switch {
	case out.Job != nil:
		row(w, fmt.Sprintf("job %d %s: %s", out.Job.ID, out.Job.State, out.Job.ProgressMsg))
	case dryRun:
		row(w, "dry run: nothing started")
	}
}

// placementCell shows a cluster's policy in `cluster list`.
func placementCell(c api.Cluster) string {
	var p []string
	if c.MaxTenants > 0 {
		p = append(p, fmt.Sprintf("max_tenants=%d", c.MaxTenants))
	}
	if c.MaxSizeBytes > 0 {
		p = append(p, "max_size="+humanBytes(c.MaxSizeBytes))
	}
	keys := make([]string, 0, len(c.Labels))
	for k := range c.Labels {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		p = append(p, k+"="+c.Labels[k])
	}
	if len(p) == 0 {
		return "-"
	}
	return strings.Join(p, ",")
}
