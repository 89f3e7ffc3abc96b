package cli

import (
	"fmt"
	"io"

	"github.com/spf13/cobra"

	"github.com/pgtenant/pgtenant/internal/api"
	"github.com/pgtenant/pgtenant/internal/jobs"
)

func newPrewarmCmd(g *globals) *cobra.Command {
	var req api.PrewarmRequest
	var wait bool
	cmd := &cobra.Command{
		Use:   "prewarm [ID | --cluster C | --all]",
		Short: "Load tenants' hot sets back into the cache, hottest tenants first",
		Long: `Prewarm loads the hot blocks captured from pg_buffercache (see 'prewarm capture')
back with pg_prewarm: tenants in priority order (tier priority, then activity),
into free shared buffers only (so a colder tenant never evicts a hotter one's
blocks) and beyond that into the OS cache (prewarm.beyond), at most
prewarm.rate_limit per second, on the primary and, with prewarm.standbys, the
standbys. The daemon does this by itself after a restart, a failover or a resume.`,
		Args: cobra.MaximumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if len(args) == 1 {
				req.Tenant = args[0]
			}
			c, err := g.client()
			if err != nil {
				return err
			}
			js, err := c.Prewarm(cmd.Context(), req)
			if err != nil {
				return err
			}
			if wait {
				if js, err = g.waitJobs(cmd.Context(), c, js); err != nil {
					return err
				}
			}
			return g.print(js, func(w io.Writer) {
				jobTable(w, js)
				if hint := prewarmHint(js, wait); hint != "" {
					fmt.Fprintln(w, hint)
				}
			})
		},
	}
	cmd.Flags().StringVar(&req.Cluster, "cluster", "", "every tenant of this cluster")
	cmd.Flags().BoolVar(&req.All, "all", false, "every tenant of every cluster")
	cmd.Flags().BoolVar(&wait, "wait", false, "wait for the prewarm with a progress bar")

	var capture api.CaptureRequest
	capCmd := &cobra.Command{
		Use:   "capture",
		Short: "Capture every tenant's hot set now (e.g. before a planned restart)",
		Long: `Read pg_buffercache on each primary and standby and store, per tenant, the block
ranges it has in the cache. The daemon does this every prewarm.capture_interval;
a capture replaces the previous hot sets only once it is complete, and is skipped
while a prewarm of the cluster runs or on a node that restarted and has not been
prewarmed yet.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := g.client()
			if err != nil {
				return err
			}
			out, err := c.Capture(cmd.Context(), capture)
			if err != nil {
				return err
			}
			return g.print(out, func(w io.Writer) {
				row(w, "CLUSTER", "NODE", "TENANTS", "BLOCKS", "SKIPPED")
				for _, r := range out {
					row(w, r.Cluster, r.Node, r.Tenants, r.Blocks, r.Skipped)
				}
			})
		},
	}
	capCmd.Flags().StringVar(&capture.Cluster, "cluster", "", "only this cluster")
	cmd.AddCommand(capCmd)
	return cmd
}

// prewarmHint explains a prewarm that had nothing to load (every job done
// with 0 blocks planned): no hot set was captured yet.
func prewarmHint(js []jobs.Job, waited bool) string {
	if len(js) == 0 {
		return "nothing to prewarm: no tenant matched"
	}
	if !waited {
		return ""
	}
	for _, j := range js {
		if j.State != jobs.Succeeded || j.ProgressTotal > 0 {
			return ""
		}
	}
	return "nothing to prewarm: no hot set has been captured yet (the daemon captures every prewarm.capture_interval; `pgtenant prewarm capture` captures now)"
}

func jobTable(w io.Writer, js []jobs.Job) {
	row(w, "JOB", "TYPE", "TARGET", "CLUSTER", "STATE", "PROGRESS")
	for _, j := range js {
		row(w, j.ID, j.Type, j.TargetKind+":"+j.Target, j.Cluster, j.State, fmt.Sprintf("%d/%d %s", j.ProgressDone, j.ProgressTotal, j.ProgressMsg))
	}
}
