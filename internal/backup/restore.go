package backup

import (
	"context"
	"fmt"
	"strings"
	"time"

	"github.com/pgtenant/pgtenant/internal/fleet"
	"github.com/pgtenant/pgtenant/internal/patroni"
)

// RestoreCluster rebuilds managed cluster fc from its repository once it
// lost its nodes (fleet.Cluster.Restore): its primary is restored as of to
// (the zero time: the end of the archive, the newest WAL archived) and
// recovers there; its standbys are made anew by the next Start. The
// cluster goes on archiving into the same stanza, on a new timeline.
func (s *Stanza) RestoreCluster(ctx context.Context, fc *fleet.Cluster, to time.Time) error {
	if err := s.restorable(ctx, fc.Name(), to); err != nil {
		return err
	}
	return fc.Restore(ctx, func(ctx context.Context, dir string) error {
		if _, err := s.run(ctx, append(restoreArgs(dir, to), "restore")...); err != nil {
			return fmt.Errorf("cluster %s: pgbackrest restore: %w", fc.Name(), err)
		}
		return nil
	})
}

// RestorePatroni rebuilds cluster pc, run by Patroni, from its repository
// once its nodes are lost (patroni.Cluster.Restore): its first node
// bootstraps from the repository as of to (the zero time: the end of the
// archive), pgBackRest's restore run by Patroni, and recovers there on a
// new timeline; the other nodes are made its standbys. The cluster goes on
// archiving into the same stanza.
func (s *Stanza) RestorePatroni(ctx context.Context, pc *patroni.Cluster, to time.Time) error {
	if err := s.restorable(ctx, pc.Name(), to); err != nil {
		return err
	}
	dir := pc.Nodes[0].DataDir()
	cmd := func(args ...string) string {
		all := append([]string{s.Program, "--config=" + s.ConfigPath(), "--stanza=" + s.Name}, args...)
		for i, a := range all {
			all[i] = fleet.ShellQuote(a)
		}
		return strings.Join(all, " ")
	}
	conf := map[string]string{
		"restore_command":          cmd("--pg1-path="+dir, "archive-get", "%f") + ` "%p"`,
		"recovery_target_timeline": "latest",
	}
	if !to.IsZero() {
		conf["recovery_target_time"] = targetTime(to)
		conf["recovery_target_action"] = "promote"
	}
	return pc.Restore(ctx, patroni.Bootstrap{Command: cmd(append(restoreArgs(dir, to), "restore")...), RecoveryConf: conf})
}

// restorable checks that the repository can restore cluster name as of to.
func (s *Stanza) restorable(ctx context.Context, name string, to time.Time) error {
	if s.External {
		return s.externalError()
	}
	info, err := s.Info(ctx)
	if err != nil {
		return fmt.Errorf("cluster %s: read its repository: %w", name, err)
	}
	if len(info.Backups) == 0 {
		return fmt.Errorf("cluster %s: its repository (%s) holds no backup: nothing to restore from", name, s.RepoPath())
	}
	if w := window(info); !to.IsZero() && w != nil && to.Before(w.Earliest) {
		return fmt.Errorf("%w: %s is before cluster %s's oldest backup (%s)", ErrTargetNotReached, to.UTC().Format(time.RFC3339), name, w.Earliest.UTC().Format(time.RFC3339))
	}
	return nil
}

// restoreArgs are pgbackrest restore's options restoring into dir as of to
// (the zero time: the end of the archive).
func restoreArgs(dir string, to time.Time) []string {
	if to.IsZero() {
		return []string{"--pg1-path=" + dir, "--log-level-console=warn", "--type=default"}
	}
	return []string{"--pg1-path=" + dir, "--log-level-console=warn", "--type=time", "--target=" + targetTime(to), "--target-action=promote"}
}

// targetTime is to as pgBackRest's --target and recovery_target_time take it.
func targetTime(to time.Time) string { return to.UTC().Format("2006-01-02 15:04:05.999999+00") }
