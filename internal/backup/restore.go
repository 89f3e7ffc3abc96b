package backup

import (
	"context"
	"fmt"
	"time"

	"github.com/pgtenant/pgtenant/internal/fleet"
)

// RestoreCluster rebuilds managed cluster fc from its repository once it
// lost its nodes (fleet.Cluster.Restore): its primary is restored as of to
// (the zero time: the end of the archive, the newest WAL archived) and
// recovers there; its standbys are made anew by the next Start. The
// cluster goes on archiving into the same stanza, on a new timeline.
func (s *Stanza) RestoreCluster(ctx context.Context, fc *fleet.Cluster, to time.Time) error {
	if s.External {
		return s.externalError()
	}
	info, err := s.Info(ctx)
	if err != nil {
		return fmt.Errorf("cluster %s: read its repository: %w", fc.Name(), err)
	}
	if len(info.Backups) == 0 {
		return fmt.Errorf("cluster %s: its repository (%s) holds no backup: nothing to restore from", fc.Name(), s.RepoPath())
	}
	if w := window(info); !to.IsZero() && w != nil && to.Before(w.Earliest) {
		return fmt.Errorf("%w: %s is before cluster %s's oldest backup (%s)", ErrTargetNotReached, to.UTC().Format(time.RFC3339), fc.Name(), w.Earliest.UTC().Format(time.RFC3339))
	}
	return fc.Restore(ctx, func(ctx context.Context, dir string) error {
		args := []string{"--pg1-path=" + dir, "--log-level-console=warn", "--type=default"}
		if !to.IsZero() {
			args = []string{"--pg1-path=" + dir, "--log-level-console=warn", "--type=time",
				"--target=" + to.UTC().Format("2006-01-02 15:04:05.999999+00"), "--target-action=promote"}
		}
		if _, err := s.run(ctx, append(args, "restore")...); err != nil {
			return fmt.Errorf("cluster %s: pgbackrest restore: %w", fc.Name(), err)
		}
		return nil
	})
}
