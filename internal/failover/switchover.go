package failover

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"net/http"
	"slices"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pgtenant/pgtenant/internal/background"
	"github.com/pgtenant/pgtenant/internal/catalog"
	"github.com/pgtenant/pgtenant/internal/cluster"
	"github.com/pgtenant/pgtenant/internal/jobs"
	"github.com/pgtenant/pgtenant/internal/patroni"
)

// ErrInvalid is a switchover or failover that cannot be asked for: the
// cluster is not run by Patroni, or the node named cannot take over.
var ErrInvalid = errors.New("invalid switchover")

// Bounds of a switchover's steps.
const (
	// holdWait bounds the wait for the transactions in flight in the
	// front door's transaction-mode pools to end once it is paused (the
	// clients of session-mode pools keep their server connection: they
	// lose it when the leader stops, and wait on reconnecting). The
	// switchover goes on after it: a transaction still running then is
	// cut too.
	holdWait = 5 * time.Second
	// switchTimeout bounds Patroni's answer to the request and the new
	// leader's first answer as primary.
	switchTimeout = time.Minute
)

// switchoverArgs are a cluster.switchover job's.
type switchoverArgs struct {
	Cluster string `json:"cluster"`
	To      string `json:"to,omitempty"`
	// Force: a failover (Patroni promotes To even with a healthy leader,
	// or none), not a switchover.
	Force bool `json:"force,omitempty"`
}

// switchoverData is what a switchover job records: the leader it started
// from (a resumed job whose cluster has another leader already only
// follows it), then what it did.
type switchoverData struct {
	From     string `json:"from,omitempty"`
	To       string `json:"to,omitempty"`
	PausedMS int64  `json:"paused_ms,omitempty"` // how long the front door held the clients
	// Drained: the front door's PAUSE completed before the switch (no
	// client held a server connection); false: sessions were cut.
	Drained bool `json:"drained,omitempty"`
}

// Switchover checks that the cluster's leader can be changed to the
// member named to ("" lets Patroni choose, a failover must name one) and
// starts the cluster.switchover job that does it, or returns the one
// running for the cluster.
func (f *Follower) Switchover(ctx context.Context, name, to string, force bool) (jobs.Job, error) {
	c, err := f.Store.GetCluster(ctx, name)
	if err != nil {
		return jobs.Job{}, err
	}
	if len(c.PatroniURLs) == 0 {
		return jobs.Job{}, fmt.Errorf("%w: cluster %s is not run by Patroni (it was not registered with --patroni): "+
			"pgtenant cannot change its primary; promote a standby with your own tooling and `pgtenant cluster add %s --dsn …` again", ErrInvalid, name, name)
	}
	if force && to == "" {
		return jobs.Job{}, fmt.Errorf("%w: a failover promotes the member --to names (`pgtenant cluster show %s` lists them); "+
			"without one, `pgtenant cluster switchover %s` lets Patroni choose", ErrInvalid, name, name)
	}
	ms, err := f.patroni(c).Members(ctx)
	if err != nil {
		return jobs.Job{}, fmt.Errorf("cluster %s: %w", name, err)
	}
	if _, err := candidate(ms, to, force); err != nil {
		return jobs.Job{}, fmt.Errorf("cluster %s: %w", name, err)
	}
	return f.Runner.Enqueue(ctx, f.Store.Pool(), jobs.Spec{Type: jobs.ClusterSwitchover, Key: "switchover:" + name,
		TargetKind: "cluster", Target: name, Cluster: name, MaxAttempts: 1,
		Args: switchoverArgs{Cluster: name, To: to, Force: force}})
}

// candidate returns the member to promote: to, checked, or for a
// switchover without one the synchronous standby, else the running
// replica of least lag.
func candidate(ms []patroni.Member, to string, force bool) (patroni.Member, error) {
	leader, hasLeader := patroni.LeaderOf(ms)
	if !hasLeader && !force {
		return patroni.Member{}, fmt.Errorf("%w: no leader: Patroni is electing one (a failover under way?); "+
			"wait for `pgtenant cluster show` to list a leader, or force one with `cluster failover --to NODE`", ErrInvalid)
	}
	names := make([]string, 0, len(ms))
	for _, m := range ms {
		names = append(names, m.Name)
	}
	if to != "" {
		i := slices.IndexFunc(ms, func(m patroni.Member) bool { return m.Name == to })
		switch {
		case i < 0:
			return patroni.Member{}, fmt.Errorf("%w: no member %q (members: %s)", ErrInvalid, to, strings.Join(names, ", "))
		case hasLeader && ms[i].Name == leader.Name:
			return patroni.Member{}, fmt.Errorf("%w: %s is the leader already", ErrInvalid, to)
		case !runningReplica(ms[i]):
			return patroni.Member{}, fmt.Errorf("%w: member %s is %s, not a running replica: it cannot take over", ErrInvalid, to, ms[i].State)
		}
		return ms[i], nil
	}
	var best patroni.Member
	for _, m := range ms {
		if m.Name == leader.Name || !runningReplica(m) {
			continue
		}
		switch {
		case best.Name == "",
			m.Role == patroni.RoleSyncStandby && best.Role != patroni.RoleSyncStandby,
			m.Role == best.Role && m.Lag >= 0 && (best.Lag < 0 || m.Lag < best.Lag):
			best = m
		}
	}
	if best.Name == "" {
		return patroni.Member{}, fmt.Errorf("%w: no running replica can take over (members: %s)", ErrInvalid, strings.Join(names, ", "))
	}
	return best, nil
}

// runningReplica: a member that streams from the leader.
func runningReplica(m patroni.Member) bool {
	return m.Role != patroni.RoleLeader && m.Running() && m.Host != ""
}

// SwitchoverHandler runs cluster.switchover jobs.
func (f *Follower) SwitchoverHandler() jobs.Handler {
	return jobs.Handler{Steps: func(j *jobs.Job) ([]jobs.Step, error) {
		var a switchoverArgs
		if err := j.DecodeArgs(&a); err != nil {
			return nil, err
		}
		return []jobs.Step{{Name: "switch", Doing: "checking cluster " + a.Cluster + "'s members",
			Run: func(ctx context.Context, r *jobs.Run) error { return f.switchover(ctx, r, a) }}}, nil
	}}
}

// switchover pauses the cluster's front door, has Patroni change the
// leader, waits for the new one to answer as primary, follows it (the
// catalog, the registry, the front door re-pointed) and resumes the front
// door: its clients wait, they see no error. The door is resumed whatever
// happens. Run again after a crash, it only follows the leader the
// cluster has (the first run's request went through or not).
func (f *Follower) switchover(ctx context.Context, r *jobs.Run, a switchoverArgs) error {
	c, err := f.Store.GetCluster(ctx, a.Cluster)
	if err != nil {
		return err
	}
	pc := f.patroni(c)
	var d switchoverData
	if err := r.LoadData(&d); err != nil {
		return err
	}
	ms, err := pc.Members(ctx)
	if err != nil {
		return err
	}
	leader, _ := patroni.LeaderOf(ms)
	if d.From != "" && leader.Name != "" && leader.Name != d.From {
		// Resumed after the switch: only the following is left, and the
		// front door the earlier attempt may have left paused.
		r.Note(ctx, "following the new leader "+leader.Name)
		r.Result(fmt.Sprintf("%s leads (was %s)", leader.Name, d.From))
		if err := f.follow(ctx, c); err != nil {
			return err
		}
		if front := f.Poolers.Get(c.Name); front != nil {
			return front.Release(ctx)
		}
		return nil
	}
	to, err := candidate(ms, a.To, a.Force)
	if err != nil {
		return jobs.Permanent(err)
	}
	d = switchoverData{From: leader.Name, To: to.Name}
	if err := r.SaveData(ctx, d); err != nil {
		return err
	}

	// The old leader's shutdown checkpoint is most of the pause: one
	// taken before it leaves that one little to write.
	r.Note(ctx, "checkpoint on "+leader.Name+" before the pause")
	if err := checkpoint(ctx, c.DSN); err != nil && leader.Name != "" {
		f.Logger.Warn("checkpoint before a switchover failed; going on", "cluster", c.Name, "err", err)
	}
	front := f.Poolers.Get(c.Name)
	var paused time.Time
	if front != nil {
		// Only a switchover pauses the whole front door, and one runs per
		// cluster: a pause found now is an earlier attempt's whose daemon
		// died before resuming it (its clients wait). Resumed first.
		if err := front.Release(ctx); err != nil {
			return fmt.Errorf("resume the front door of cluster %s before pausing it: %w", c.Name, err)
		}
		r.Note(ctx, fmt.Sprintf("pausing the front door (waiting up to %v for the transactions in flight)", holdWait))
		paused = time.Now()
		if d.Drained, err = front.Hold(ctx, holdWait); err != nil {
			return jobs.Permanent(fmt.Errorf("pause the front door of cluster %s: %w (nothing was switched)", c.Name, err))
		}
		defer func() {
			rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
			defer cancel()
			if err := front.Release(rctx); err != nil {
				f.Logger.Error("front door not resumed after a switchover: its clients wait; the job's next attempt resumes it",
					"cluster", c.Name, "err", err)
			}
		}()
	}
	r.Note(ctx, fmt.Sprintf("asking Patroni to make %s the leader", to.Name))
	// Patroni answers the request on a whole second (it checks the result
	// once a second): the new leader's own answer as primary comes first,
	// and ends the pause. The request runs to its end meanwhile.
	asked := make(chan error, 1)
	go func() {
		actx, cancel := context.WithTimeout(context.WithoutCancel(ctx), switchTimeout)
		defer cancel()
		if a.Force {
			asked <- pc.Failover(actx, to.Name)
		} else {
			asked <- pc.Switchover(actx, leader.Name, to.Name)
		}
	}()
	sctx, cancel := context.WithTimeout(ctx, switchTimeout)
	defer cancel()
	primary := make(chan error, 1)
	go func() { primary <- waitPrimary(sctx, pc, to, c.DSN) }()
	select {
	case err := <-asked:
		if err != nil {
			cancel()
			<-primary
			return jobs.Permanent(err)
		}
		if err := <-primary; err != nil {
			return err
		}
	case err := <-primary:
		if err != nil {
			return err
		}
	}
	r.Note(ctx, "re-pointing pgtenant and the front door at "+to.Name)
	if err := f.follow(ctx, c); err != nil {
		return err
	}
	select {
	case err := <-asked:
		if err != nil {
			f.Logger.Warn("Patroni answered the switchover with an error, but its candidate leads", "cluster", c.Name, "leader", to.Name, "err", err)
		}
	default: // still waiting for its whole second
	}
	done := fmt.Sprintf("%s leads (was %s)", to.Name, leader.Name)
	if !paused.IsZero() {
		d.PausedMS = time.Since(paused).Milliseconds()
		done += fmt.Sprintf("; the front door held its clients %.1fs", time.Since(paused).Seconds())
		if !d.Drained {
			done += " (the server connections of session-mode clients were cut once)"
		}
	}
	if err := r.SaveData(ctx, d); err != nil {
		return err
	}
	r.Result(done)
	return nil
}

// waitPrimary polls until m answers as primary: Patroni says so (it does
// from the promote on), and PostgreSQL, through dsn pointed at m, has
// left recovery (writes sent before would fail as read-only).
func waitPrimary(ctx context.Context, pc *patroni.Client, m patroni.Member, dsn string) error {
	dsn, err := cluster.WithHostPort(dsn, m.Host, m.Port)
	if err != nil {
		return err
	}
	err = background.Until(ctx, 100*time.Millisecond, func(ctx context.Context) error {
		if ok, err := pc.Check(ctx, m.BaseURL(), patroni.CheckPrimary); !ok {
			return cmp.Or(err, errors.New("not primary in Patroni's answer"))
		}
		return writable(ctx, dsn)
	})
	if err != nil {
		return fmt.Errorf("%s does not answer as primary: %w", m.Name, err)
	}
	return nil
}

// checkpoint runs CHECKPOINT on the server at dsn (the leader).
func checkpoint(ctx context.Context, dsn string) error {
	return onServer(ctx, dsn, 5*time.Minute, func(ctx context.Context, conn *pgx.Conn) error {
		_, err := conn.Exec(ctx, "CHECKPOINT")
		return err
	})
}

// writable reports (nil) that the server at dsn is out of recovery.
func writable(ctx context.Context, dsn string) error {
	return onServer(ctx, dsn, 2*time.Second, func(ctx context.Context, conn *pgx.Conn) error {
		var recovering bool
		if err := conn.QueryRow(ctx, `SELECT pg_catalog.pg_is_in_recovery()`).Scan(&recovering); err != nil {
			return err
		}
		if recovering {
			return errors.New("still in recovery")
		}
		return nil
	})
}

// onServer runs fn in an admin session (pinned settings) on the server at
// dsn, all of it within bound.
func onServer(ctx context.Context, dsn string, bound time.Duration, fn func(context.Context, *pgx.Conn) error) error {
	ctx, cancel := context.WithTimeout(ctx, bound)
	defer cancel()
	conn, err := cluster.ConnectDSN(ctx, dsn, "")
	if err != nil {
		return err
	}
	defer conn.Close(context.WithoutCancel(ctx))
	return fn(ctx, conn)
}

// follow runs one check of the cluster now: the registry, the catalog and
// the front door follow its leader.
func (f *Follower) follow(ctx context.Context, c catalog.Cluster) error {
	st := f.tracked(c.Name)
	st.mu.Lock()
	defer st.mu.Unlock()
	return f.check(ctx, c, st)
}

// patroni is a client of the cluster's REST APIs; a switchover answers
// only once done, so it waits longer than the checks.
func (f *Follower) patroni(c catalog.Cluster) *patroni.Client {
	return patroni.NewClient(c.PatroniURLs, &http.Client{Timeout: switchTimeout})
}
