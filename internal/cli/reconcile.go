package cli

import (
	"fmt"
	"io"
	"sort"
	"strings"

	"github.com/spf13/cobra"

	"github.com/pgtenant/pgtenant/internal/api"
	"github.com/pgtenant/pgtenant/internal/reconcile"
)

func newReconcileCmd(g *globals) *cobra.Command {
	var req api.ReconcileRequest
	cmd := &cobra.Command{
		Use:   "reconcile",
		Short: "Compare the catalog with the clusters; --fix repairs what interrupted jobs left",
		Long: `Compare the catalog with every cluster (or --cluster): databases, schemas and
roles named t_<id>, template and scratch databases. Reports objects without a
catalog row (orphans) and rows without their objects (missing). With --fix it
finishes or rolls back what an interrupted job left; it never drops an object it
cannot attribute to pgtenant's own jobs, it lists it instead. The daemon also
runs it periodically (reconcile.interval) with --fix.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := g.client()
			if err != nil {
				return err
			}
			rep, err := c.Reconcile(cmd.Context(), req)
			if err != nil {
				return err
			}
			return g.print(rep, func(w io.Writer) {
				fmt.Fprintln(w, reconcileSummary(rep))
				if len(rep.Findings) > 0 {
					row(w, "CLUSTER", "KIND", "OBJECT", "DETAIL", "ACTION", "FIXED")
				}
				for _, f := range rep.Findings {
					fixed := fmt.Sprint(f.Fixed)
					if f.Error != "" {
						fixed = "error: " + f.Error
					}
					row(w, f.Cluster, f.Kind, f.Object, f.Detail, f.Action, fixed)
				}
				for _, e := range rep.Errors {
					fmt.Fprintln(w, "could not check:", e)
				}
			})
		},
	}
	cmd.Flags().StringVar(&req.Cluster, "cluster", "", "only this cluster")
	cmd.Flags().BoolVar(&req.Fix, "fix", false, "repair what can be attributed to interrupted jobs")
	return cmd
}

// reconcileSummary is the report's first line: what was looked at, by
// kind in name order, on which clusters, and how many findings.
func reconcileSummary(rep reconcile.Report) string {
	kinds := make([]string, 0, len(rep.Checked))
	for k := range rep.Checked {
		kinds = append(kinds, k)
	}
	sort.Strings(kinds)
	checked := make([]string, len(kinds))
	for i, k := range kinds {
		checked[i] = fmt.Sprintf("%d %s", rep.Checked[k], k)
	}
	what := strings.Join(checked, ", ")
	if what == "" {
		what = "nothing"
	}
	clusters := strings.Join(rep.Clusters, ", ")
	if clusters == "" {
		clusters = "no cluster"
	}
	return fmt.Sprintf("checked %s on %s: %d finding(s)", what, clusters, len(rep.Findings))
}
