package cli

import (
	"fmt"
	"io"

	"github.com/spf13/cobra"

	"github.com/pgtenant/pgtenant/internal/api"
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
				fmt.Fprintf(w, "checked %v on %v: %d finding(s)\n", rep.Checked, rep.Clusters, len(rep.Findings))
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
