package backup

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"time"
)

// Backup is one backup in the repository.
type Backup struct {
	Label string    `json:"label"`
	Type  string    `json:"type"` // full, diff, incr
	Prior string    `json:"prior,omitempty"`
	Start time.Time `json:"start"`
	Stop  time.Time `json:"stop"`
	// Size is the database's size, Delta what this backup copied of it;
	// RepoSize and RepoDelta the same in the repository (compressed).
	Size      int64  `json:"size"`
	Delta     int64  `json:"delta"`
	RepoSize  int64  `json:"repo_size"`
	RepoDelta int64  `json:"repo_delta"`
	LSNStart  string `json:"lsn_start"`
	LSNStop   string `json:"lsn_stop"`
	WALStart  string `json:"wal_start"`
	WALStop   string `json:"wal_stop"`
	// Error: pgBackRest found checksum errors in a page while copying it.
	Error bool `json:"error,omitempty"`
}

// Window is the span of time a restore can reach: from the end of the
// earliest backup to the newest WAL segment in the archive.
type Window struct {
	Earliest time.Time `json:"earliest"`
	Latest   time.Time `json:"latest"`
}

// Info is what the repository holds for a stanza.
type Info struct {
	Stanza string `json:"stanza"`
	// Status is pgBackRest's ("ok", "no valid backups", …).
	Status     string   `json:"status"`
	StatusCode int      `json:"status_code"`
	Backups    []Backup `json:"backups"`
	ArchiveMin string   `json:"archive_min,omitempty"`
	ArchiveMax string   `json:"archive_max,omitempty"`
	// ArchivedAt is when the newest segment reached the repository.
	ArchivedAt *time.Time `json:"archived_at,omitempty"`
	// Window is nil until the first backup is complete.
	Window *Window `json:"window,omitempty"`
	// Running: a backup of the stanza holds pgBackRest's lock now.
	Running bool `json:"running"`
}

// infoJSON is the part of `pgbackrest info --output=json` (2.45) read here.
type infoJSON struct {
	Name    string `json:"name"`
	Archive []struct {
		ID  string `json:"id"`
		Min string `json:"min"`
		Max string `json:"max"`
	} `json:"archive"`
	Backup []struct {
		Label   string `json:"label"`
		Type    string `json:"type"`
		Prior   string `json:"prior"`
		Error   bool   `json:"error"`
		Archive struct {
			Start string `json:"start"`
			Stop  string `json:"stop"`
		} `json:"archive"`
		Info struct {
			Size       int64 `json:"size"`
			Delta      int64 `json:"delta"`
			Repository struct {
				Size  int64 `json:"size"`
				Delta int64 `json:"delta"`
			} `json:"repository"`
		} `json:"info"`
		LSN struct {
			Start string `json:"start"`
			Stop  string `json:"stop"`
		} `json:"lsn"`
		Timestamp struct {
			Start int64 `json:"start"`
			Stop  int64 `json:"stop"`
		} `json:"timestamp"`
	} `json:"backup"`
	Status struct {
		Code    int    `json:"code"`
		Message string `json:"message"`
		Lock    struct {
			Backup struct {
				Held bool `json:"held"`
			} `json:"backup"`
		} `json:"lock"`
	} `json:"status"`
}

// Info reads the repository (pgbackrest info --output=json).
func (s *Stanza) Info(ctx context.Context) (Info, error) {
	out, err := s.run(ctx, "--output=json", "info")
	if err != nil {
		return Info{}, err
	}
	info, err := parseInfo(out)
	if err != nil {
		return Info{}, err
	}
	if info.ArchiveMax != "" {
		info.ArchivedAt = s.archivedAt(info.ArchiveMax)
	}
	info.Window = window(info)
	return info, nil
}

func parseInfo(out []byte) (Info, error) {
	var all []infoJSON
	if err := json.Unmarshal(out, &all); err != nil {
		return Info{}, fmt.Errorf("read pgbackrest info: %w", err)
	}
	if len(all) != 1 {
		return Info{}, fmt.Errorf("read pgbackrest info: %d stanzas, want 1", len(all))
	}
	j := all[0]
	info := Info{Stanza: j.Name, Status: j.Status.Message, StatusCode: j.Status.Code, Running: j.Status.Lock.Backup.Held, Backups: []Backup{}}
	// The newest archive id is the one the cluster writes to now (a
	// stanza-upgrade adds one).
	if n := len(j.Archive); n > 0 {
		info.ArchiveMin, info.ArchiveMax = j.Archive[0].Min, j.Archive[n-1].Max
	}
	for _, b := range j.Backup {
		info.Backups = append(info.Backups, Backup{
			Label: b.Label, Type: b.Type, Prior: b.Prior, Error: b.Error,
			Start: time.Unix(b.Timestamp.Start, 0).UTC(), Stop: time.Unix(b.Timestamp.Stop, 0).UTC(),
			Size: b.Info.Size, Delta: b.Info.Delta, RepoSize: b.Info.Repository.Size, RepoDelta: b.Info.Repository.Delta,
			LSNStart: b.LSN.Start, LSNStop: b.LSN.Stop, WALStart: b.Archive.Start, WALStop: b.Archive.Stop,
		})
	}
	sort.SliceStable(info.Backups, func(a, b int) bool { return info.Backups[a].Start.Before(info.Backups[b].Start) })
	return info, nil
}

// archivedAt is when segment reached the posix repository: its file's
// modification time (archive/<stanza>/<id>/<first 16 chars>/<segment>-<sha1>[.ext]).
// pgBackRest's info does not say; nil when the file is not found.
func (s *Stanza) archivedAt(segment string) *time.Time {
	if len(segment) < 16 || s.RepoPath() == "" {
		return nil
	}
	m, _ := filepath.Glob(filepath.Join(s.RepoPath(), "archive", s.Name, "*", segment[:16], segment+"-*"))
	var newest time.Time
	for _, p := range m {
		if fi, err := os.Stat(p); err == nil && fi.ModTime().After(newest) {
			newest = fi.ModTime()
		}
	}
	if newest.IsZero() {
		return nil
	}
	newest = newest.UTC()
	return &newest
}

// window is the recovery window: from the stop time of the earliest backup
// (a restore can reach no earlier) to the newest archived WAL, or to the
// newest backup's stop when nothing was archived after it.
func window(info Info) *Window {
	if len(info.Backups) == 0 {
		return nil
	}
	w := &Window{Earliest: info.Backups[0].Stop, Latest: info.Backups[0].Stop}
	for _, b := range info.Backups {
		if b.Stop.Before(w.Earliest) {
			w.Earliest = b.Stop
		}
		if b.Stop.After(w.Latest) {
			w.Latest = b.Stop
		}
	}
	if info.ArchivedAt != nil && info.ArchivedAt.After(w.Latest) {
		w.Latest = *info.ArchivedAt
	}
	return w
}
