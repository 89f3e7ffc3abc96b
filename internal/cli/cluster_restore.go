package cli

import (
	"context"
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
	"github.com/pgtenant/pgtenant/internal/patroni"
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
there are moved aside (NAME/<node>.lost-<time>, never deleted; under Patroni
NAME/<node>/data.lost-<time>); restoring over one that still holds a data dir asks
for confirmation (--yes). Under Patroni the data dir's etcd runs meanwhile: the
lost cluster's state is deleted from it, and Patroni's first node bootstraps from
the repository (pgBackRest's restore, then recovery) while the others are made its
standbys. Afterwards run 'pgtenant up', then 'pgtenant reconcile': tenants the
catalog has that the cluster lost (made after the time restored to, when the
catalog lives on another cluster) are reported missing. The runbook:
docs/operations/backups.md, "Disaster recovery".`,
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
			unlock, err := lockDir(dir)
			if err != nil {
				return err
			}
			defer unlock()
			log := slog.New(slog.NewTextHandler(g.stderr, &slog.HandlerOptions{Level: slog.LevelInfo}))
			restore := restoreFleetCluster
			if _, err := os.Stat(filepath.Join(dir, name, "patroni.json")); err == nil {
				restore = restorePatroniCluster
			}
			out, err := restore(cmd.Context(), g, dir, name, at, yes, log)
			if err != nil {
				return err
			}
			when := restoredTo(at)
			if !at.IsZero() {
				out.To = &at
			}
			out.Cluster = name
			out.Next = "run `pgtenant up`, then `pgtenant reconcile`: tenants the cluster lost are reported missing"
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

// restoreFleetCluster restores cluster name of data dir dir, which up runs
// itself, to at (zero: the end of its archive).
func restoreFleetCluster(ctx context.Context, g *globals, dir, name string, at time.Time, yes bool, log *slog.Logger) (clusterRestored, error) {
	fc, err := fleet.Open(fleet.Options{Dir: filepath.Join(dir, name), Name: name, Logger: log})
	if err != nil {
		return clusterRestored{}, err
	}
	if !fc.Backups() {
		return clusterRestored{}, noRepository(name)
	}
	nodes := append([]fleet.Node{fc.Primary()}, fc.Standbys()...)
	var dirs []string
	for _, n := range nodes {
		dirs = append(dirs, fc.DataDir(n.Name))
	}
	st, err := backup.ForCluster(fc, false)
	if err != nil {
		return clusterRestored{}, err
	}
	if err := readyRestore(g, st, name, dirs, at, yes); err != nil {
		return clusterRestored{}, err
	}
	if err := st.RestoreCluster(ctx, fc, at); err != nil {
		return clusterRestored{}, err
	}
	fmt.Fprintf(g.stderr, "making its standbys anew\n")
	if err := fc.Start(ctx); err != nil {
		return clusterRestored{}, err
	}
	if err := fc.Stop(ctx); err != nil {
		return clusterRestored{}, err
	}
	out := clusterRestored{Primary: newNodeInfo(fc.Primary().Name, fleet.Superuser, fc.Primary().Port), Standbys: []nodeInfo{}, MovedAside: movedAside(dirs)}
	for _, s := range fc.Standbys() {
		out.Standbys = append(out.Standbys, newNodeInfo(s.Name, fleet.Superuser, s.Port))
	}
	return out, nil
}

// restorePatroniCluster restores cluster name of data dir dir, which runs
// under Patroni, to at (zero: the end of its archive): the data dir's etcd
// runs meanwhile (the lost cluster's state is deleted from it), the first
// node bootstraps from the repository and the others are made its
// standbys.
func restorePatroniCluster(ctx context.Context, g *globals, dir, name string, at time.Time, yes bool, log *slog.Logger) (clusterRestored, error) {
	prog, err := backup.Find()
	if err != nil {
		return clusterRestored{}, err
	}
	members, err := patroni.EtcdMembers(filepath.Join(dir, "etcd"))
	if err != nil {
		return clusterRestored{}, err
	}
	etcd, err := startUpEtcd(ctx, g, dir, max(members, 1), log)
	if err != nil {
		return clusterRestored{}, err
	}
	defer func() {
		sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 30*time.Second)
		defer cancel()
		_ = etcd.Stop(sctx)
	}()
	pc, err := newPatroniCluster(dir, name, 1, etcd.Endpoints(), prog, log)
	if err != nil {
		return clusterRestored{}, err
	}
	if !pc.Backups() {
		return clusterRestored{}, noRepository(name)
	}
	var dirs []string
	for _, n := range pc.Nodes {
		dirs = append(dirs, n.DataDir())
	}
	st, err := backup.ForPatroni(pc)
	if err != nil {
		return clusterRestored{}, err
	}
	if err := readyRestore(g, st, name, dirs, at, yes); err != nil {
		return clusterRestored{}, err
	}
	if err := st.RestorePatroni(ctx, pc, at); err != nil {
		return clusterRestored{}, err
	}
	out := clusterRestored{Standbys: []nodeInfo{}, MovedAside: movedAside(dirs)}
	for i, n := range pc.Nodes {
		info := newNodeInfo(n.Name(), patroni.SuperuserName, n.Port())
		if i == 0 {
			out.Primary = info
		} else {
			out.Standbys = append(out.Standbys, info)
		}
	}
	return out, nil
}

func noRepository(name string) error {
	return fmt.Errorf("cluster %s was made without backups (pgbackrest was not installed then): it has no repository to restore from", name)
}

// readyRestore asks before restoring over those of the node dirs dirs
// that still hold a data dir (they are moved aside), writes the stanza's
// config as up writes it, and says on stderr what is restored from where.
func readyRestore(g *globals, st *backup.Stanza, name string, dirs []string, at time.Time, yes bool) error {
	var left []string
	for _, d := range dirs {
		if _, err := os.Stat(filepath.Join(d, "PG_VERSION")); err == nil {
			left = append(left, d)
		}
	}
	if len(left) > 0 {
		if err := g.confirm(yes, fmt.Sprintf("Restoring cluster %s over its data dirs %s (moved aside, not deleted)", name, strings.Join(left, ", ")), name); err != nil {
			return err
		}
	}
	if err := st.Prepare(); err != nil {
		return err
	}
	fmt.Fprintf(g.stderr, "restoring cluster %s from its repository (%s) to %s\n", name, st.RepoPath(), restoredTo(at))
	return nil
}

// restoredTo says what a restore to at restores to.
func restoredTo(at time.Time) string {
	if at.IsZero() {
		return "the end of its archive"
	}
	return at.UTC().Format(time.RFC3339)
}

// movedAside are the dirs a restore moved aside (DIR.lost-TIME).
func movedAside(dirs []string) []string {
	var out []string
	for _, d := range dirs {
		aside, _ := filepath.Glob(d + ".lost-*")
		out = append(out, aside...)
	}
	return out
}
