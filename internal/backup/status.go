package backup

import (
	"context"
	"fmt"
	"io/fs"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"
)

// Archiver is what a cluster's primary says about its WAL archiving
// (pg_stat_archiver), with its current WAL position.
type Archiver struct {
	ArchivedCount   int64      `json:"archived_count"`
	FailedCount     int64      `json:"failed_count"`
	LastArchivedWAL string     `json:"last_archived_wal,omitempty"`
	LastArchivedAt  *time.Time `json:"last_archived_at,omitempty"`
	LastFailedWAL   string     `json:"last_failed_wal,omitempty"`
	LastFailedAt    *time.Time `json:"last_failed_at,omitempty"`
	// CurrentLSN is pg_current_wal_lsn() in bytes; SegmentSize is
	// wal_segment_size.
	CurrentLSN  int64 `json:"current_lsn"`
	SegmentSize int64 `json:"segment_size"`
}

// Failing reports whether the archiver's latest attempt failed: its last
// failure is newer than its last success. PostgreSQL retries the segment
// until archive_command succeeds, and WAL piles up in pg_wal meanwhile.
func (a Archiver) Failing() bool {
	return a.LastFailedAt != nil && (a.LastArchivedAt == nil || a.LastFailedAt.After(*a.LastArchivedAt))
}

// Archiver reads pg_stat_archiver and the current WAL position on a
// cluster's primary.
func (s *Service) Archiver(ctx context.Context, clusterName string) (Archiver, error) {
	if s.Clusters == nil {
		return Archiver{}, fmt.Errorf("cluster %s: no cluster registry", clusterName)
	}
	cl, err := s.Clusters.Get(clusterName)
	if err != nil {
		return Archiver{}, err
	}
	admin, err := cl.Admin(ctx)
	if err != nil {
		return Archiver{}, err
	}
	var a Archiver
	err = admin.QueryRow(ctx, `SELECT archived_count, failed_count, coalesce(last_archived_wal, ''), last_archived_time,
			coalesce(last_failed_wal, ''), last_failed_time, (pg_current_wal_lsn() - '0/0')::bigint,
			(SELECT setting::bigint FROM pg_settings WHERE name = 'wal_segment_size')
		FROM pg_stat_archiver`).Scan(&a.ArchivedCount, &a.FailedCount, &a.LastArchivedWAL, &a.LastArchivedAt,
		&a.LastFailedWAL, &a.LastFailedAt, &a.CurrentLSN, &a.SegmentSize)
	if err != nil {
		return Archiver{}, fmt.Errorf("cluster %s: read pg_stat_archiver: %w", clusterName, err)
	}
	return a, nil
}

// SegmentEnd is the WAL position (bytes) where segment (a WAL file name,
// timeline + log + segment in hex) ends, for segments of segSize bytes.
func SegmentEnd(segment string, segSize int64) (int64, bool) {
	if len(segment) != 24 || segSize <= 0 {
		return 0, false
	}
	log, err1 := strconv.ParseUint(segment[8:16], 16, 32)
	seg, err2 := strconv.ParseUint(segment[16:24], 16, 32)
	if err1 != nil || err2 != nil {
		return 0, false
	}
	return int64(log)<<32 + (int64(seg)+1)*segSize, true
}

// ArchiveLag is the WAL written on the primary past the end of the newest
// segment in the repository, in bytes: what a loss of the primary's disk
// would lose now. A healthy cluster shows up to one segment (the one being
// written; archive_timeout closes it within 30 s) and 0 when idle.
// false when nothing was archived yet.
func ArchiveLag(info Info, a Archiver) (int64, bool) {
	end, ok := SegmentEnd(info.ArchiveMax, a.SegmentSize)
	if !ok {
		return 0, false
	}
	return max(a.CurrentLSN-end, 0), true
}

// Disk is the free and total space of the file system holding a
// repository.
type Disk struct {
	Free  int64 `json:"free"`
	Total int64 `json:"total"`
}

// RepoDisk reads the file system of the stanza's repository (statfs; the
// space a non-root user may use counts as free).
func (s *Stanza) RepoDisk() (Disk, error) {
	if s.RepoPath() == "" {
		return Disk{}, ErrRepoNotLocal
	}
	return DiskOf(s.RepoPath())
}

// DiskOf reads the file system dir is on (statfs; the space a non-root
// user may use counts as free).
func DiskOf(dir string) (Disk, error) {
	var st syscall.Statfs_t
	if err := syscall.Statfs(dir, &st); err != nil {
		return Disk{}, fmt.Errorf("statfs %s: %w", dir, err)
	}
	return Disk{Free: int64(st.Bavail) * st.Bsize, Total: int64(st.Blocks) * st.Bsize}, nil
}

// RepoSize adds up the files under the repository: backups and archived
// WAL, as they take space (compressed).
func (s *Stanza) RepoSize() (int64, error) {
	if s.RepoPath() == "" {
		return 0, ErrRepoNotLocal
	}
	var n int64
	err := filepath.WalkDir(s.RepoPath(), func(_ string, d fs.DirEntry, err error) error {
		if err != nil {
			if d != nil && d.IsDir() {
				return fs.SkipDir // a directory pgBackRest is removing
			}
			return nil
		}
		if d.Type().IsRegular() {
			if fi, err := d.Info(); err == nil {
				n += fi.Size()
			}
		}
		return nil
	})
	return n, err
}

// sizeCache keeps each repository's size for a while: walking a
// repository stats every backup file and WAL segment (a week of WAL is
// thousands of files), too much for every scrape. A new or expired backup
// (the backups' labels change) walks it again at once; archived WAL alone
// shows within sizeTTL.
type sizeCache struct {
	mu sync.Mutex
	m  map[string]sizeAt
}

type sizeAt struct {
	size    int64
	at      time.Time
	backups string
}

// sizeTTL is how old a repository size on /metrics may be.
const sizeTTL = time.Minute

func (c *sizeCache) get(st *Stanza, info Info) (int64, error) {
	var labels strings.Builder
	for _, b := range info.Backups {
		labels.WriteString(b.Label + " ")
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if v, ok := c.m[st.cluster]; ok && time.Since(v.at) < sizeTTL && v.backups == labels.String() {
		return v.size, nil
	}
	n, err := st.RepoSize()
	if err != nil {
		return 0, err
	}
	if c.m == nil {
		c.m = map[string]sizeAt{}
	}
	c.m[st.cluster] = sizeAt{n, time.Now(), labels.String()}
	return n, nil
}
