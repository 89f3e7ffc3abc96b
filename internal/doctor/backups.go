package doctor

import (
	"context"
	"time"

	"github.com/pgtenant/pgtenant/internal/backup"
)

// backupFacts reads a backed-up cluster's repository, archiver and
// repository disk; nil when pgtenant does not back the cluster up here.
func backupFacts(ctx context.Context, s *backup.Service, clusterName string) *BackupFacts {
	if s == nil {
		return nil
	}
	st, err := s.Stanza(clusterName)
	if err != nil {
		return nil
	}
	b := &BackupFacts{Now: time.Now(), RepoPath: st.RepoPath(), FullEvery: s.Schedule.FullEvery.D(), DiffEvery: s.Schedule.DiffEvery.D()}
	if info, err := st.Info(ctx); err != nil {
		b.InfoErr = err.Error()
	} else {
		b.Backups, b.Running = len(info.Backups), info.Running
		for _, x := range info.Backups {
			if x.Stop.After(b.Newest) {
				b.Newest = x.Stop
			}
		}
	}
	if a, err := s.Archiver(ctx, clusterName); err != nil {
		b.ArchiverErr = err.Error()
	} else {
		b.ArchiveFailing, b.FailedCount, b.LastFailedWAL = a.Failing(), a.FailedCount, a.LastFailedWAL
		if a.LastFailedAt != nil {
			b.LastFailedAt = *a.LastFailedAt
		}
		if a.LastArchivedAt != nil {
			b.LastArchivedAt = *a.LastArchivedAt
		}
	}
	if d, err := st.RepoDisk(); err != nil {
		b.DiskErr = err.Error()
	} else {
		b.DiskFree, b.DiskTotal = d.Free, d.Total
	}
	return b
}
