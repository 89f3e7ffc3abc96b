package cli

import (
	"fmt"
	"io"
	"time"

	"github.com/spf13/cobra"

	"github.com/pgtenant/pgtenant/internal/api"
	"github.com/pgtenant/pgtenant/internal/backup"
)

func newBackupCmd(g *globals) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "backup",
		Short: "List and take the managed clusters' pgBackRest backups",
		Long: `The clusters 'pgtenant up' makes when pgbackrest is installed archive their WAL
with pgBackRest (archive-push, async) from their creation, into a repository under
DATA_DIR/<cluster>/backup/repo (stanza = cluster name), and get a full backup when
they are made. Backups are read from the cluster's first standby when it has one.
A cluster without backups (made before pgbackrest was installed, or registered from
outside) answers with an error saying so.`,
	}
	var cluster string
	list := &cobra.Command{
		Use:   "list",
		Short: "List backups, the WAL archive and the recovery window of each cluster",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := g.client()
			if err != nil {
				return err
			}
			out, err := c.Backups(cmd.Context(), cluster)
			if err != nil {
				return err
			}
			return g.print(out, func(w io.Writer) { backupTable(w, out) })
		},
	}
	list.Flags().StringVar(&cluster, "cluster", "", "only this cluster")

	var req api.BackupRequest
	var wait bool
	now := &cobra.Command{
		Use:   "now",
		Short: "Take a backup now (a job): full, diff or incr",
		Long: `Start a backup job of a cluster (every backed-up cluster without --cluster).
A diff or incr backup with no full backup to build on is taken as a full one by
pgBackRest. A second backup of a cluster while one is queued or running is
refused, naming the job to wait for. With --wait, a progress line until it ends.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			if err := oneOf("--type", req.Type, backup.Full, backup.Diff, backup.Incr); err != nil {
				return err
			}
			c, err := g.client()
			if err != nil {
				return err
			}
			js, err := c.BackupNow(cmd.Context(), req)
			if err != nil {
				return err
			}
			if wait {
				if js, err = g.waitJobs(cmd.Context(), c, js); err != nil {
					return err
				}
			}
			return g.print(js, func(w io.Writer) { jobTable(w, js) })
		},
	}
	now.Flags().StringVar(&req.Cluster, "cluster", "", "only this cluster")
	now.Flags().StringVar(&req.Type, "type", backup.Full, "backup type: full, diff or incr")
	now.Flags().BoolVar(&wait, "wait", false, "wait for the backup with a progress line")
	cmd.AddCommand(list, now)
	return cmd
}

func backupTable(w io.Writer, out []backup.ClusterBackups) {
	row(w, "CLUSTER", "LABEL", "TYPE", "START", "TOOK", "SIZE", "COPIED", "STORED", "WAL")
	for _, cb := range out {
		for _, b := range cb.Backups {
			row(w, cb.Cluster, b.Label, b.Type, b.Start.Local().Format(time.DateTime), b.Stop.Sub(b.Start).Round(time.Second),
				humanBytes(b.Size), humanBytes(b.Delta), humanBytes(b.RepoDelta), b.WALStart+".."+b.WALStop)
		}
	}
	for _, cb := range out {
		fmt.Fprintf(w, "\ncluster %s: %s", cb.Cluster, cb.Status)
		if cb.Running {
			fmt.Fprint(w, ", a backup is running")
		}
		if cb.FromStandby {
			fmt.Fprint(w, ", backups from the standby")
		}
		if cb.ArchiveMax != "" {
			fmt.Fprintf(w, "\n  archive: %s .. %s", cb.ArchiveMin, cb.ArchiveMax)
			if cb.ArchivedAt != nil {
				fmt.Fprintf(w, " (newest archived %s ago)", time.Since(*cb.ArchivedAt).Round(time.Second))
			}
		}
		fmt.Fprintf(w, "\n  recovery window: %s", recoveryWindow(cb))
		fmt.Fprintln(w)
	}
}

// recoveryWindow is a cluster's recovery window in a line.
func recoveryWindow(cb backup.ClusterBackups) string {
	if cb.Window == nil {
		return "none yet (no complete backup)"
	}
	return cb.Window.Earliest.Local().Format(time.DateTime) + " .. " + cb.Window.Latest.Local().Format(time.DateTime)
}
