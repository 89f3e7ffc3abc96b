package cluster

import (
	"context"
	"fmt"
	"log/slog"
	"time"

	"github.com/pgtenant/pgtenant/internal/background"
)

// Health is one probe of a cluster's primary: what the pacer, the metrics
// collector and `cluster show` need. It costs two small queries.
type Health struct {
	At                   time.Time      `json:"at"`
	ServerVersion        string         `json:"server_version"`
	VersionNum           int            `json:"server_version_num"`
	InRecovery           bool           `json:"in_recovery"` // the DSN points at a standby
	PostmasterStart      time.Time      `json:"postmaster_start"`
	WALLSN               int64          `json:"wal_lsn"`                // insert LSN (replay LSN on a standby), bytes
	WALBytesPerSec       float64        `json:"wal_bytes_per_sec"`      // since the previous probe; 0 on the first
	CheckpointsTimed     int64          `json:"checkpoints_timed"`      // since statistics reset
	CheckpointsRequested int64          `json:"checkpoints_requested"`  // forced ones: CREATE DATABASE FILE_COPY, DROP DATABASE, …
	CheckpointInProgress bool           `json:"checkpoint_in_progress"` // the checkpointer is writing or syncing
	CheckpointUnpaced    bool           `json:"checkpoint_unpaced"`     // ... and not pacing itself: a forced checkpoint, or the end of a timed one
	Databases            int            `json:"databases"`
	Standbys             []StandbyState `json:"standbys"`
	MissingStandbys      int            `json:"missing_standbys,omitempty"` // configured standby DSNs without a replication connection
}

// StandbyDown is the State of a standby of which only its replication slot
// is left (PostgreSQL's own states are those of pg_stat_replication).
const StandbyDown = "down"

// StandbyState is one standby as the primary sees it.
type StandbyState struct {
	Name             string  `json:"name"`  // application_name, or the slot of a standby that is down
	State            string  `json:"state"` // streaming, catchup, startup, backup, stopping; StandbyDown if only its slot is left
	ClientAddr       string  `json:"client_addr,omitempty"`
	Slot             string  `json:"slot,omitempty"`
	ReplayLagBytes   int64   `json:"replay_lag_bytes"`
	ReplayLagSeconds float64 `json:"replay_lag_seconds"`
}

// MaxReplayLag returns the largest replay lag over standbys that are up, and
// whether any standby is down.
func (h Health) MaxReplayLag() (bytes int64, anyDown bool) {
	for _, s := range h.Standbys {
		if s.State == StandbyDown {
			anyDown = true
			continue
		}
		bytes = max(bytes, s.ReplayLagBytes)
	}
	return bytes, anyDown || h.MissingStandbys > 0
}

// Probe reads the cluster's health from its primary.
func (c *Cluster) Probe(ctx context.Context) (Health, error) {
	p, err := c.Admin(ctx)
	if err != nil {
		return Health{}, err
	}
	var h Health
	var ckptWait string
	err = p.QueryRow(ctx, `
		SELECT current_setting('server_version'), current_setting('server_version_num')::int,
		       pg_is_in_recovery(), pg_postmaster_start_time(),
		       pg_wal_lsn_diff(CASE WHEN pg_is_in_recovery() THEN coalesce(pg_last_wal_replay_lsn(), '0/0')
		                            ELSE pg_current_wal_insert_lsn() END, '0/0')::bigint,
		       b.checkpoints_timed, b.checkpoints_req,
		       coalesce((SELECT wait_event FROM pg_stat_activity WHERE backend_type = 'checkpointer'), ''),
		       (SELECT count(*) FROM pg_database)::int
		FROM pg_stat_bgwriter b`).Scan(&h.ServerVersion, &h.VersionNum, &h.InRecovery, &h.PostmasterStart,
		&h.WALLSN, &h.CheckpointsTimed, &h.CheckpointsRequested, &ckptWait, &h.Databases)
	if err != nil {
		err = fmt.Errorf("probe %s: %w", c.name, Classify(err))
		c.probeMu.Lock()
		c.lastErr = err
		c.probeMu.Unlock()
		return Health{}, err
	}
	h.At = time.Now()
	// The checkpointer waits on CheckpointerMain between checkpoints; any other
	// wait (CheckpointWriteDelay, DataFileSync, …) or none means it is working.
	h.CheckpointInProgress = ckptWait != "CheckpointerMain"
	// A timed checkpoint spreads its writes, sleeping in CheckpointWriteDelay
	// between them; a forced one (CREATE DATABASE … FILE_COPY, DROP DATABASE,
	// CHECKPOINT) writes at full speed. A forced checkpoint requested while a
	// timed one runs makes the checkpointer finish that one at full speed
	// first, so only an unpaced checkpoint is worth waiting for.
	h.CheckpointUnpaced = h.CheckpointInProgress && ckptWait != "CheckpointWriteDelay"
	if !h.InRecovery {
		rows, err := p.Query(ctx, `
			SELECT coalesce(r.application_name, s.slot_name, ''), coalesce(r.state, 'down'),
			       coalesce(host(r.client_addr), ''), coalesce(s.slot_name, ''),
			       coalesce(pg_wal_lsn_diff(pg_current_wal_lsn(), coalesce(r.replay_lsn, s.restart_lsn)), 0)::bigint,
			       coalesce(extract(epoch FROM r.replay_lag), 0)::float8
			FROM pg_stat_replication r
			FULL JOIN (SELECT * FROM pg_replication_slots WHERE slot_type = 'physical') s ON s.active_pid = r.pid
			-- Logical walsenders (a move's subscription and its table
			-- syncs, analytics mirrors) are connected to a database; a
			-- standby's is not. They are not standbys: several share a
			-- name, and their lag is not replay lag.
			WHERE r.pid IS NULL OR NOT EXISTS (SELECT FROM pg_stat_activity a WHERE a.pid = r.pid AND a.datid IS NOT NULL)
			ORDER BY 1`)
		if err != nil {
			return Health{}, fmt.Errorf("probe %s standbys: %w", c.name, Classify(err))
		}
		for rows.Next() {
			var s StandbyState
			if err := rows.Scan(&s.Name, &s.State, &s.ClientAddr, &s.Slot, &s.ReplayLagBytes, &s.ReplayLagSeconds); err != nil {
				return Health{}, err
			}
			h.Standbys = append(h.Standbys, s)
		}
		if err := rows.Err(); err != nil {
			return Health{}, Classify(err)
		}
		up := 0
		for _, s := range h.Standbys {
			if s.State != StandbyDown {
				up++
			}
		}
		h.MissingStandbys = max(len(c.standbyDSNs)-up, 0)
	}
	c.probeMu.Lock()
	if prev := c.lastProbe; !prev.At.IsZero() && h.PostmasterStart.Equal(prev.PostmasterStart) {
		if dt := h.At.Sub(prev.At).Seconds(); dt > 0 {
			h.WALBytesPerSec = float64(h.WALLSN-prev.WALLSN) / dt
		}
	}
	c.lastProbe, c.lastErr = h, nil
	c.probeMu.Unlock()
	return h, nil
}

// LastProbeResult returns the most recent successful probe and the error of
// the most recent probe (nil if it succeeded).
func (c *Cluster) LastProbeResult() (Health, error) {
	c.probeMu.Lock()
	defer c.probeMu.Unlock()
	return c.lastProbe, c.lastErr
}

// Answering says whether the cluster's last probe succeeded, or none has
// run yet: work that can pass over a cluster that is down (a scrape,
// placement) does not wait on one that did not answer.
func (c *Cluster) Answering() bool {
	_, err := c.LastProbeResult()
	return err == nil
}

// Monitor probes every cluster of a registry periodically so that metrics and
// the console read fresh health without touching the clusters themselves.
type Monitor struct {
	Clusters *Registry
	Interval time.Duration
	Logger   *slog.Logger
}

// Run probes until ctx is done.
func (m *Monitor) Run(ctx context.Context) error {
	down := map[string]*Outage{}
	log := m.Logger.With("component", "monitor")
	background.Every(ctx, m.Interval, func(ctx context.Context) {
		for _, c := range m.Clusters.All() {
			pctx, cancel := context.WithTimeout(ctx, m.Interval)
			_, err := c.Probe(pctx)
			cancel()
			if ctx.Err() != nil {
				break
			}
			if down[c.Name()] == nil {
				down[c.Name()] = &Outage{What: "probe cluster " + c.Name()}
			}
			down[c.Name()].Report(log, err, "cluster", c.Name())
		}
	})
	return nil
}
