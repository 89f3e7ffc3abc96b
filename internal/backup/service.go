package backup

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"sort"
	"time"

	"github.com/pgtenant/pgtenant/internal/catalog"
	"github.com/pgtenant/pgtenant/internal/cluster"
	"github.com/pgtenant/pgtenant/internal/config"
	"github.com/pgtenant/pgtenant/internal/jobs"
)

// ErrBusy is returned when a backup of the cluster is already queued or
// running: pgBackRest takes one backup of a stanza at a time.
var ErrBusy = errors.New("a backup of this cluster is already in progress")

// BusyError names the job that holds the cluster.
type BusyError struct {
	Cluster string
	Job     jobs.Job
	Type    string
}

func (e *BusyError) Error() string {
	return fmt.Sprintf("cluster %s: a backup (%s) is already %s as job %d; wait for it with `pgtenant job show %d --wait`, then ask again",
		e.Cluster, e.Type, e.Job.State, e.Job.ID, e.Job.ID)
}

func (e *BusyError) Unwrap() error { return ErrBusy }

// Args of a backup job.
type Args struct {
	Cluster string `json:"cluster"`
	Type    string `json:"type"` // full, diff, incr
	// Request tells a new job from one already holding the cluster's key.
	Request string `json:"request"`
}

// Service takes backups as durable jobs and reads the repositories of the
// clusters it backs up (Stanzas, by cluster name).
type Service struct {
	Store   *catalog.Store
	Runner  *jobs.Runner
	Stanzas map[string]*Stanza
	// Clusters reach the primaries (pg_stat_archiver, the current WAL
	// position) for the metrics and doctor; nil: those are not read.
	Clusters *cluster.Registry
	// Schedule is the backups section: the schedule and retention.
	Schedule config.BackupsConfig
	Logger   *slog.Logger
}

// Configure gives every stanza the configured retention and rewrites its
// config (`up` wrote it before the configuration was read). External
// stanzas keep their operator's config and retention: they are not touched.
func (s *Service) Configure() error {
	for _, n := range s.managed() {
		st := s.Stanzas[n]
		st.Retention = s.Schedule.Retention.D()
		if err := st.Prepare(); err != nil {
			return fmt.Errorf("cluster %s: %w", n, err)
		}
	}
	return nil
}

// Stanza returns a cluster's stanza, ErrNotConfigured for a cluster that is
// not backed up.
func (s *Service) Stanza(cluster string) (*Stanza, error) {
	st, ok := s.Stanzas[cluster]
	if !ok {
		return nil, fmt.Errorf("cluster %s: %w", cluster, ErrNotConfigured)
	}
	return st, nil
}

// ClusterBackups is what one cluster's repository holds.
type ClusterBackups struct {
	Cluster string `json:"cluster"`
	// FromStandby: backups are read from a standby.
	FromStandby bool `json:"from_standby"`
	Info
}

// List reads the repository of one cluster, or of every cluster backed up
// when cluster is "".
func (s *Service) List(ctx context.Context, cluster string) ([]ClusterBackups, error) {
	names := []string{cluster}
	if cluster == "" {
		if names = s.clusters(); len(names) == 0 {
			return nil, ErrNotConfigured
		}
	}
	out := []ClusterBackups{}
	for _, n := range names {
		st, err := s.Stanza(n)
		if err != nil {
			return nil, err
		}
		info, err := st.Info(ctx)
		if err != nil {
			return nil, fmt.Errorf("cluster %s: %w", n, err)
		}
		out = append(out, ClusterBackups{Cluster: n, FromStandby: st.Standby != nil, Info: info})
	}
	return out, nil
}

// Window returns a cluster's recovery window (nil before its first backup).
func (s *Service) Window(ctx context.Context, cluster string) (*Window, error) {
	st, err := s.Stanza(cluster)
	if err != nil {
		return nil, err
	}
	info, err := st.Info(ctx)
	if err != nil {
		return nil, err
	}
	return info.Window, nil
}

func (s *Service) clusters() []string {
	names := make([]string, 0, len(s.Stanzas))
	for n := range s.Stanzas {
		names = append(names, n)
	}
	sort.Strings(names)
	return names
}

// managed is clusters without the external ones: those pgtenant backs up.
func (s *Service) managed() []string {
	var names []string
	for _, n := range s.clusters() {
		if !s.Stanzas[n].External {
			names = append(names, n)
		}
	}
	return names
}

// TakesBackups reports whether any stanza is pgtenant's to back up (not
// only external ones): the daemon runs backup jobs only then.
func (s *Service) TakesBackups() bool { return len(s.managed()) > 0 }

// Now starts a backup of one cluster, or of every cluster backed up when
// cluster is "". A cluster whose backup is already queued or running
// answers a *BusyError naming that job: a second backup is refused, not
// queued behind the first. An external cluster answers an *ExternalError:
// its operator's schedule takes its backups ("" leaves it out).
func (s *Service) Now(ctx context.Context, cluster, typ string) ([]jobs.Job, error) {
	if !ValidType(typ) {
		return nil, fmt.Errorf("backup type %q: want full, diff or incr", typ)
	}
	names := []string{cluster}
	if cluster == "" {
		names = s.managed()
		if all := s.clusters(); len(all) == 0 {
			return nil, ErrNotConfigured
		} else if len(names) == 0 {
			return nil, fmt.Errorf("no cluster here is backed up by pgtenant: %w", s.Stanzas[all[0]].externalError())
		}
	}
	var out []jobs.Job
	for _, n := range names {
		st, err := s.Stanza(n)
		if err != nil {
			return out, err
		}
		if st.External {
			return out, st.externalError()
		}
		j, err := s.enqueue(ctx, Args{Cluster: n, Type: typ})
		if err != nil {
			return out, err
		}
		out = append(out, j)
	}
	return out, nil
}

func (s *Service) enqueue(ctx context.Context, a Args) (jobs.Job, error) {
	b := make([]byte, 8)
	_, _ = rand.Read(b)
	a.Request = hex.EncodeToString(b)
	// One key per cluster: at most one unfinished backup job each.
	j, err := s.Runner.Enqueue(ctx, s.Store.Pool(), jobs.Spec{Type: jobs.ClusterBackup, Key: "backup:" + a.Cluster,
		TargetKind: "cluster", Target: a.Cluster, Cluster: a.Cluster, Args: a, MaxAttempts: 3})
	if err != nil {
		return jobs.Job{}, err
	}
	var got Args
	if err := json.Unmarshal(j.Args, &got); err != nil {
		return jobs.Job{}, fmt.Errorf("job %d: %w", j.ID, err)
	}
	if got.Request != a.Request {
		return j, &BusyError{Cluster: a.Cluster, Job: j, Type: got.Type}
	}
	return j, nil
}

// EnsureFirst starts a full backup of each cluster whose repository holds
// none yet (a cluster just made): its recovery window starts there.
// External clusters are left to their operator's schedule.
func (s *Service) EnsureFirst(ctx context.Context) error {
	var errs []error
	for _, n := range s.managed() {
		info, err := s.Stanzas[n].Info(ctx)
		if err != nil {
			errs = append(errs, fmt.Errorf("cluster %s: %w", n, err))
			continue
		}
		if len(info.Backups) > 0 {
			continue
		}
		if _, err := s.enqueue(ctx, Args{Cluster: n, Type: Full}); err != nil && !errors.Is(err, ErrBusy) {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// progressEvery is how often a running backup's job shows it is alive.
const progressEvery = 2 * time.Second

// Handler is the handler of jobs.ClusterBackup: one step that runs pgbackrest backup.
// Run again after a crash, pgBackRest resumes or discards the half-made
// backup it finds.
func (s *Service) Handler() jobs.Handler {
	return jobs.Handler{Steps: func(j *jobs.Job) ([]jobs.Step, error) {
		var a Args
		if err := j.DecodeArgs(&a); err != nil {
			return nil, err
		}
		return []jobs.Step{{Name: "backup", Doing: a.Type + " backup", Run: func(ctx context.Context, r *jobs.Run) error {
			return s.backup(ctx, r, a)
		}}}, nil
	}}
}

func (s *Service) backup(ctx context.Context, r *jobs.Run, a Args) error {
	st, err := s.Stanza(a.Cluster)
	if err != nil {
		return jobs.Permanent(err)
	}
	if st.External {
		return jobs.Permanent(st.externalError())
	}
	from := "primary"
	if st.Standby != nil {
		from = "standby"
	}
	// Paced as a heavy step: the backup's start runs pg_backup_start on the
	// primary with an immediate checkpoint (start-fast), which is what
	// jobs.Heavy is for; it waits while the standby's replay lag is over
	// budget or a forced checkpoint runs, and takes a heavy DDL slot. The
	// slot is given back once that checkpoint is done (pgBackRest says so
	// at info level): holding it for the copy, which can take hours, would
	// stall every FILE_COPY create and DROP DATABASE on the cluster.
	release, err := r.Pace(ctx, a.Cluster, jobs.Heavy)
	if err != nil {
		return err
	}
	start := time.Now()
	done := make(chan error, 1)
	go func() { done <- st.BackupStarted(ctx, a.Type, release) }()
	tick := time.NewTicker(progressEvery)
	defer tick.Stop()
	for {
		select {
		case err := <-done:
			if err != nil {
				return err
			}
			if s.Logger != nil {
				s.Logger.Info("backup done", "cluster", a.Cluster, "type", a.Type, "seconds", time.Since(start).Seconds())
			}
			return nil
		case <-tick.C:
			r.Note(ctx, fmt.Sprintf("%s backup from the %s: %s", a.Type, from, time.Since(start).Round(time.Second)))
		}
	}
}
