package cli

import (
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/pgtenant/pgtenant/internal/backup"
	"github.com/pgtenant/pgtenant/internal/fleet"
)

// clusterRestored is what cluster restore prints.
type clusterRestored struct {
	Cluster string `json:"cluster"`
	// To is the time restored to; nil: the end of the archive.
	To       *time.Time `json:"to,omitempty"`
	Primary  nodeInfo   `json:"primary"`
	Standbys []nodeInfo `json:"standbys"`
	// MovedAside are the node dirs that were still there, renamed.
	MovedAside []string `json:"moved_aside,omitempty"`
	Next       string   `json:"next"`
}

func newClusterRestoreCmd(g *globals) *cobra.Command {
	var to string
	var yes bool
	cmd := &cobra.Command{
		Use:   "restore NAME [--to-time TIME]",
		Short: "Rebuild a managed cluster from its backups once its nodes are lost (disaster recovery)",
		Long: `Rebuild cluster NAME of the data dir (--data-dir) from its pgBackRest repository
when its nodes are lost: the primary is restored to the end of the archive (the
newest WAL archived), or to --to-time, and recovers there; its standbys are made
anew from it; then every node is stopped again for 'pgtenant up' to run. Run it on
the data dir's machine with up stopped (it takes the same lock). Node dirs still
there are moved aside (NAME/<node>.lost-<time>, never deleted); restoring over one
that still holds a data dir asks for confirmation (--yes). Afterwards run
'pgtenant up', then 'pgtenant reconcile': tenants the catalog has that the cluster
lost (made after the time restored to, when the catalog lives on another cluster)
are reported missing. Clusters under Patroni are not restored this way yet. The
runbook: docs/operations/backups.md, "Disaster recovery".`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			var at time.Time
			if to != "" {
				var err error
				if at, err = parseWhen(to); err != nil {
					return usagef("--to-time: %v", err)
				}
			}
			name := args[0]
			dir, err := filepath.Abs(g.dataDir)
			if err != nil {
				return err
			}
			have := dataDirClusters(dir)
			if !slices.Contains(have, name) {
				return usagef("cluster %q: the data dir %s has no such cluster (it has: %s)", name, dir, strings.Join(have, ", "))
			}
			cdir := filepath.Join(dir, name)
			if _, err := os.Stat(filepath.Join(cdir, "patroni.json")); err == nil {
				return fmt.Errorf("cluster %s runs under Patroni: cluster restore does not rebuild Patroni's nodes yet (its backups serve tenant rewind and fork)", name)
			}
			unlock, err := lockDir(dir)
			if err != nil {
				return err
			}
			defer unlock()
			log := slog.New(slog.NewTextHandler(g.stderr, &slog.HandlerOptions{Level: slog.LevelInfo}))
			fc, err := fleet.Open(fleet.Options{Dir: cdir, Name: name, Logger: log})
			if err != nil {
				return err
			}
			if !fc.Backups() {
				return fmt.Errorf("cluster %s was made without backups (pgbackrest was not installed then): it has no repository to restore from", name)
			}
			var left []string
			for _, n := range append([]fleet.Node{fc.Primary()}, fc.Standbys()...) {
				if _, err := os.Stat(filepath.Join(fc.DataDir(n.Name), "PG_VERSION")); err == nil {
					left = append(left, fc.DataDir(n.Name))
				}
			}
			if len(left) > 0 {
				if err := g.confirm(yes, fmt.Sprintf("Restoring cluster %s over its data dirs %s (moved aside, not deleted)", name, strings.Join(left, ", ")), name); err != nil {
					return err
				}
			}
			st, err := backup.ForCluster(fc, false)
			if err != nil {
				return err
			}
			if err := st.Prepare(); err != nil { // the stanza's config, as up writes it
				return err
			}
			when := "the end of its archive"
			if !at.IsZero() {
				when = at.UTC().Format(time.RFC3339)
			}
			fmt.Fprintf(g.stderr, "restoring cluster %s from its repository (%s) to %s\n", name, st.RepoPath(), when)
			if err := st.RestoreCluster(cmd.Context(), fc, at); err != nil {
				return err
			}
			fmt.Fprintf(g.stderr, "making its standbys anew\n")
			if err := fc.Start(cmd.Context()); err != nil {
				return err
			}
			if err := fc.Stop(cmd.Context()); err != nil {
				return err
			}
			out := clusterRestored{Cluster: name, Primary: newNodeInfo(fc.Primary().Name, fleet.Superuser, fc.Primary().Port), Standbys: []nodeInfo{},
				Next: "run `pgtenant up`, then `pgtenant reconcile`: tenants the cluster lost are reported missing"}
			if !at.IsZero() {
				out.To = &at
			}
			for _, s := range fc.Standbys() {
				out.Standbys = append(out.Standbys, newNodeInfo(s.Name, fleet.Superuser, s.Port))
			}
			for _, d := range left {
				aside, _ := filepath.Glob(d + ".lost-*")
				out.MovedAside = append(out.MovedAside, aside...)
			}
			return g.print(out, func(w io.Writer) {
				row(w, "cluster", name)
				row(w, "restored to", when)
				row(w, "primary", out.Primary.DSN)
				for _, s := range out.Standbys {
					row(w, "standby", s.DSN)
				}
				for _, d := range out.MovedAside {
					row(w, "moved aside", d)
				}
				row(w, "next", out.Next)
			})
		},
	}
	cmd.Flags().StringVar(&to, "to-time", "", `restore to this time: RFC 3339, or a duration before now ("1h ago"); the end of the archive when absent`)
	cmd.Flags().BoolVar(&yes, "yes", false, "confirm restoring over node dirs that still hold data (they are moved aside)")
	return cmd
}
