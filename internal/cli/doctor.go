package cli

import (
	"fmt"
	"io"
	"strings"

	"github.com/spf13/cobra"

	"github.com/pgtenant/pgtenant/internal/doctor"
)

func newDoctorCmd(g *globals) *cobra.Command {
	var clusterName string
	cmd := &cobra.Command{
		Use:   "doctor",
		Short: "Check each cluster against what a tenant fleet needs, and say why and what to set",
		Long: `Check every cluster (or --cluster C): the lock table against the largest template
and pgtenant's build and purge batches, standbys' settings against their primary's,
max_files_per_process and the open-file limit against relation files, wal_level and
standbys, pg_prewarm/pg_buffercache, autovacuum with many databases, forced
checkpoints from FILE_COPY creates and database drops, disk free against the last
day's growth (when the server runs on this machine), and, before PostgreSQL 15,
stats_temp_directory on tmpfs. Each check says what it saw, what is wanted, why,
and what to set. Exits non-zero when a check fails.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := g.client()
			if err != nil {
				return err
			}
			rep, err := c.Doctor(cmd.Context(), clusterName)
			if err != nil {
				return err
			}
			if err := g.print(rep, func(w io.Writer) { writeDoctor(w, rep) }); err != nil {
				return err
			}
			failed := 0
			for _, cr := range rep.Clusters {
				for _, ch := range cr.Checks {
					if ch.Status == doctor.Fail {
						failed++
					}
				}
				if cr.Error != "" {
					failed++
				}
			}
			if failed > 0 {
				return fmt.Errorf("doctor: %d check(s) failed", failed)
			}
			return nil
		},
	}
	cmd.Flags().StringVar(&clusterName, "cluster", "", "only this cluster")
	return cmd
}

func writeDoctor(w io.Writer, rep doctor.Report) {
	for i, cr := range rep.Clusters {
		if i > 0 {
			fmt.Fprintln(w)
		}
		fmt.Fprintf(w, "cluster %s (PostgreSQL %s): %s\n", cr.Cluster, cr.Version, strings.ToUpper(cr.Status))
		if cr.Error != "" {
			fmt.Fprintf(w, "  cannot check: %s\n", cr.Error)
			continue
		}
		for _, c := range cr.Checks {
			fmt.Fprintf(w, "  %-7s %s: %s\n", strings.ToUpper(c.Status), c.Name, c.Got)
			if c.Status == doctor.OK {
				continue
			}
			if c.Want != "" {
				fmt.Fprintf(w, "          want: %s\n", c.Want)
			}
			fmt.Fprintf(w, "          why:  %s\n", c.Why)
			if c.Fix != "" {
				fmt.Fprintf(w, "          fix:  %s\n", c.Fix)
			}
		}
	}
}
