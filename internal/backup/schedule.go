package backup

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/pgtenant/pgtenant/internal/background"
	"github.com/pgtenant/pgtenant/internal/jobs"
)

// Due says which backup a repository needs at now: a full one when it holds
// no full backup or its newest full stopped fullEvery ago or more, else a
// differential one when its newest backup of any type stopped diffEvery ago
// or more (diffEvery 0: never), else none (""). Ages count from a backup's
// stop: what it restores is the cluster as of then.
func Due(info Info, now time.Time, fullEvery, diffEvery time.Duration) string {
	full, last := newest(info, Full), newest(info, "")
	switch {
	case full == nil || now.Sub(full.Stop) >= fullEvery:
		return Full
	case diffEvery > 0 && now.Sub(last.Stop) >= diffEvery:
		return Diff
	}
	return ""
}

// newest is the backup of type typ ("" any) that stopped last, nil when
// there is none.
func newest(info Info, typ string) *Backup {
	var b *Backup
	for i := range info.Backups {
		c := &info.Backups[i]
		if (typ == "" || c.Type == typ) && (b == nil || c.Stop.After(b.Stop)) {
			b = c
		}
	}
	return b
}

// Scheduler takes the backups the schedule asks for (backups.full_every,
// backups.diff_every), looking at every backed-up cluster each
// backups.check_interval. A cluster whose backup is queued or running is
// left alone until it ends: the job's key allows one at a time (ErrBusy),
// and a backup holding pgBackRest's lock (Info.Running) is waited for too.
// Only the daemon that holds the stanzas runs it, as for the job handler.
// External clusters are never looked at: their operator schedules them.
type Scheduler struct {
	S *Service
}

// Run checks the schedule until ctx ends; without stanzas to back up (none,
// or only external ones) it only waits.
func (sc *Scheduler) Run(ctx context.Context) error {
	if !sc.S.TakesBackups() {
		<-ctx.Done()
		return nil
	}
	background.Every(ctx, sc.S.Schedule.CheckInterval.D(), func(ctx context.Context) {
		if _, err := sc.Round(ctx); err != nil && ctx.Err() == nil && sc.S.Logger != nil {
			sc.S.Logger.Warn("backup schedule", "err", err)
		}
	})
	return nil
}

// Round enqueues the backups due now and returns their jobs.
func (sc *Scheduler) Round(ctx context.Context) ([]jobs.Job, error) {
	var out []jobs.Job
	var errs []error
	now := time.Now()
	for _, n := range sc.S.managed() {
		info, err := sc.S.Stanzas[n].Info(ctx)
		if err != nil {
			errs = append(errs, fmt.Errorf("cluster %s: %w", n, err))
			continue
		}
		typ := Due(info, now, sc.S.Schedule.FullEvery.D(), sc.S.Schedule.DiffEvery.D())
		if typ == "" || info.Running {
			continue
		}
		j, err := sc.S.enqueue(ctx, Args{Cluster: n, Type: typ})
		if errors.Is(err, ErrBusy) {
			continue
		}
		if err != nil {
			errs = append(errs, fmt.Errorf("cluster %s: %w", n, err))
			continue
		}
		if sc.S.Logger != nil {
			sc.S.Logger.Info("scheduled backup", "cluster", n, "type", typ, "job", j.ID)
		}
		out = append(out, j)
	}
	return out, errors.Join(errs...)
}
