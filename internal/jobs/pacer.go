package jobs

import (
	"context"
	"fmt"
	"hash/fnv"
	"log/slog"
	"slices"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/pgtenant/pgtenant/internal/cluster"
	"github.com/pgtenant/pgtenant/internal/config"
)

// Kind is how much budget a step needs.
type Kind int

const (
	// Light steps (a batch of DDL, a migration) wait only for standby replay lag.
	Light Kind = iota
	// Heavy steps (CREATE DATABASE … FILE_COPY, DROP DATABASE) force a
	// checkpoint: they also wait (at most pacer.max_checkpoint_wait) while a
	// forced checkpoint runs, and take one of the cluster's heavy DDL slots
	// (pacer.heavy_ddl_slots), so that their checkpoints do not pile up. A
	// timed checkpoint, which runs most of the time on a busy cluster, is not
	// waited for.
	Heavy
	// HeavyNoCheckpoint steps (CREATE DATABASE … STRATEGY WAL_LOG) force no
	// checkpoint: they send the template through the WAL instead. They do not
	// wait for a running checkpoint (pacer.wait_for_checkpoint is about steps
	// that force another, and a spread checkpoint is in progress most of the
	// time, 0.9 × 5 min by default, on a cluster with any writes) and do not
	// take a heavy DDL slot: several run at once, up to pacer.wal_log_slots,
	// and only while the WAL of those in flight fits the replay lag budget
	// (AcquireWALLog).
	HeavyNoCheckpoint
)

// Pacer holds heavy steps while their cluster is over budget: a standby
// replaying too far behind, a checkpoint running, too many heavy DDL steps
// or WAL_LOG copies in flight. Slots are session advisory locks in the
// catalog, so the limits hold across every daemon sharing the catalog, and a
// daemon that dies gives its slots back with its connection.
type Pacer struct {
	clusters *cluster.Registry
	budget   func(cluster string) config.PacerConfig
	catalog  *pgxpool.Pool
	log      *slog.Logger

	waitSeconds *prometheus.CounterVec
	waiting     *prometheus.GaugeVec
}

// NewPacer returns a pacer. budget gives each cluster's limits.
func NewPacer(clusters *cluster.Registry, budget func(string) config.PacerConfig, catalog *pgxpool.Pool,
	logger *slog.Logger, reg prometheus.Registerer) *Pacer {
	p := &Pacer{
		clusters: clusters, budget: budget, catalog: catalog, log: logger.With("component", "pacer"),
		waitSeconds: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "pgtenant_pacer_wait_seconds_total", Help: "Time job steps spent waiting for a cluster's budget, by reason.",
		}, []string{"cluster", "reason"}),
		waiting: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "pgtenant_pacer_waiting_steps", Help: "Job steps waiting for a cluster's budget now.",
		}, []string{"cluster"}),
	}
	if reg != nil {
		reg.MustRegister(p.waitSeconds, p.waiting)
	}
	return p
}

// Advisory lock key spaces of the pacer (the first key of two): heavy DDL
// slots ("pgt\x01"), WAL_LOG copy slots ("pgt\x04"), and the guard that
// makes counting the copies in flight and taking a slot one step across
// daemons ("pgt\x05"). The second key is the cluster's base (slotBase) plus
// the slot number.
const (
	slotKeySpace     = 0x70677401
	walLogKeySpace   = 0x70677404
	walLogGuardSpace = 0x70677405
)

// MaxSlots is the most slots of one kind a cluster can have: each cluster's
// keys are 16 apart.
const MaxSlots = 16

// slotBase is a cluster's first slot key.
func slotBase(clusterName string) int32 {
	h := fnv.New32a()
	h.Write([]byte(clusterName))
	return int32(h.Sum32() & 0x00ffffff << 4)
}

// Acquire waits until the cluster has budget for a step of this kind and
// returns the function that releases it. report is called with the reason
// whenever the reason for waiting changes. Acquire never waits forever on a
// standby that is down unless the cluster's budget says standby_down: wait.
func (p *Pacer) Acquire(ctx context.Context, clusterName string, kind Kind, report func(reason string)) (func(), error) {
	return p.acquire(ctx, clusterName, kind, 0, report)
}

// AcquireWALLog is Acquire for a CREATE DATABASE … STRATEGY WAL_LOG that
// will write about wal bytes of WAL (the template's size): it takes one of
// the cluster's pacer.wal_log_slots, and, when other copies are in flight,
// only while the replay lag plus their WAL and its own, wal each, stays
// within pacer.max_replay_lag. A copy alone always goes once the lag is
// within budget: one copy is bounded by provision.wal_log_max_size.
func (p *Pacer) AcquireWALLog(ctx context.Context, clusterName string, wal int64, report func(reason string)) (func(), error) {
	return p.acquire(ctx, clusterName, HeavyNoCheckpoint, max(wal, 0), report)
}

// SlotWait is how long making a logical slot on a cluster may wait on
// other sessions' transactions (pacer.slot_wait; 0 without a pacer: the
// caller's default, cluster.DefaultSlotWait).
func (p *Pacer) SlotWait(clusterName string) time.Duration {
	if p == nil {
		return 0
	}
	return p.budget(clusterName).SlotWait.D()
}

func (p *Pacer) acquire(ctx context.Context, clusterName string, kind Kind, wal int64, report func(reason string)) (func(), error) {
	cl, err := p.clusters.Get(clusterName)
	if err != nil {
		return nil, err
	}
	b := p.budget(clusterName)
	var lastReason, lastKind string
	var waitedSince, checkpointSince time.Time
	defer func() {
		if !waitedSince.IsZero() {
			p.waiting.WithLabelValues(clusterName).Dec()
		}
	}()
	for {
		reasonKind, reason, lag, err := p.overBudget(ctx, cl, b, kind)
		if err != nil {
			return nil, err
		}
		if reasonKind == "checkpoint" {
			if checkpointSince.IsZero() {
				checkpointSince = time.Now()
			}
			if time.Since(checkpointSince) >= b.MaxCheckpointWait.D() {
				// Bounded: a step that forces a checkpoint queues behind
				// the running one in the checkpointer anyway.
				p.log.Info("checkpoint still running; proceeding (pacer.max_checkpoint_wait)", "cluster", clusterName)
				reasonKind, reason = "", ""
			}
		}
		if reason == "" && kind != Light {
			var release func()
			var err error
			if kind == Heavy {
				release, reasonKind, reason, err = p.takeSlot(ctx, clusterName, b.HeavyDDLSlots)
			} else {
				release, reasonKind, reason, err = p.takeWALLogSlot(ctx, clusterName, b, lag, wal)
			}
			if err != nil {
				return nil, err
			}
			if release != nil {
				p.account(clusterName, lastKind, waitedSince)
				return release, nil
			}
		}
		if reason == "" {
			p.account(clusterName, lastKind, waitedSince)
			return func() {}, nil
		}
		if waitedSince.IsZero() {
			waitedSince = time.Now()
			p.waiting.WithLabelValues(clusterName).Inc()
		} else if lastKind != reasonKind {
			p.account(clusterName, lastKind, waitedSince)
			waitedSince = time.Now()
		}
		if reason != lastReason {
			p.log.Info("step waiting for budget", "cluster", clusterName, "reason", reason)
			if report != nil {
				report(reason)
			}
			lastReason, lastKind = reason, reasonKind
		}
		select {
		case <-ctx.Done():
			p.account(clusterName, lastKind, waitedSince)
			return nil, ctx.Err()
		case <-time.After(b.PollInterval.D()):
		}
	}
}

func (p *Pacer) account(clusterName, reasonKind string, since time.Time) {
	if !since.IsZero() && reasonKind != "" {
		p.waitSeconds.WithLabelValues(clusterName, reasonKind).Add(time.Since(since).Seconds())
	}
}

// overBudget probes the cluster and says why a step must wait, or "", with
// the standby replay lag it saw.
func (p *Pacer) overBudget(ctx context.Context, cl *cluster.Cluster, b config.PacerConfig, kind Kind) (string, string, int64, error) {
	h, err := cl.Probe(ctx)
	if err != nil {
		return "", "", 0, fmt.Errorf("pacer: %w", err)
	}
	lag, down := h.MaxReplayLag()
	if down && b.StandbyDown == "wait" {
		return "standby_down", "a standby of cluster " + cl.Name() + " is down (pacer.standby_down: wait)", lag, nil
	}
	if down {
		p.log.Warn("a standby is down; proceeding (pacer.standby_down: proceed)", "cluster", cl.Name())
	}
	if lag > int64(b.MaxReplayLag) {
		return "replay_lag", fmt.Sprintf("standby replay lag %s > %s", mb(lag), mb(int64(b.MaxReplayLag))), lag, nil
	}
	if kind == Heavy && b.WaitForCheckpoint && h.CheckpointUnpaced {
		return "checkpoint", "a forced checkpoint is running on cluster " + cl.Name(), lag, nil
	}
	return "", "", lag, nil
}

func mb(n int64) string { return fmt.Sprintf("%d MB", n>>20) }

// takeSlot tries each of the cluster's heavy DDL slots. Without a free one
// it returns no release and the reason to wait.
func (p *Pacer) takeSlot(ctx context.Context, clusterName string, slots int) (func(), string, string, error) {
	conn, err := p.catalog.Acquire(ctx)
	if err != nil {
		return nil, "", "", err
	}
	base := slotBase(clusterName)
	for i := 0; i < slots; i++ {
		key := base + int32(i)
		var ok bool
		if err := conn.QueryRow(ctx, `SELECT pg_try_advisory_lock($1, $2)`, int32(slotKeySpace), key).Scan(&ok); err != nil {
			conn.Release()
			return nil, "", "", err
		}
		if ok {
			return releaser(conn, slotKeySpace, key), "", "", nil
		}
	}
	conn.Release()
	return nil, "ddl_slots", fmt.Sprintf("%d heavy DDL step(s) already in flight on cluster %s", slots, clusterName), nil
}

// takeWALLogSlot takes one of the cluster's WAL_LOG copy slots if one is
// free and the copies in flight leave room in the lag budget: with n in
// flight, lag + (n+1) × wal must stay within max_replay_lag (the WAL of
// those in flight is not all in lag yet). Counting the slots held and
// taking one happen under a transaction lock of the cluster, so that two
// daemons do not both take the last room.
func (p *Pacer) takeWALLogSlot(ctx context.Context, clusterName string, b config.PacerConfig, lag, wal int64) (func(), string, string, error) {
	conn, err := p.catalog.Acquire(ctx)
	if err != nil {
		return nil, "", "", err
	}
	base := slotBase(clusterName)
	release, kind, reason, err := func() (func(), string, string, error) {
		tx, err := conn.Begin(ctx)
		if err != nil {
			return nil, "", "", err
		}
		defer tx.Rollback(context.WithoutCancel(ctx))
		if _, err := tx.Exec(ctx, `SELECT pg_advisory_xact_lock($1, $2)`, int32(walLogGuardSpace), base); err != nil {
			return nil, "", "", err
		}
		// Advisory locks on two int4 keys show as classid, objid and
		// objsubid 2 in pg_locks, per database.
		var held []int64
		rows, err := tx.Query(ctx, `SELECT objid::int8 FROM pg_catalog.pg_locks
			WHERE locktype = 'advisory' AND granted AND objsubid = 2 AND classid::int8 = $1
			  AND objid::int8 >= $2 AND objid::int8 < $3
			  AND database = (SELECT oid FROM pg_catalog.pg_database WHERE datname = pg_catalog.current_database())`,
			int64(walLogKeySpace), int64(base), int64(base)+MaxSlots)
		if err != nil {
			return nil, "", "", err
		}
		if held, err = pgx.CollectRows(rows, pgx.RowTo[int64]); err != nil {
			return nil, "", "", err
		}
		n := int64(len(held))
		if n >= int64(b.WALLogSlots) {
			return nil, "wal_log_slots", fmt.Sprintf("%d WAL_LOG copies already in flight on cluster %s (pacer.wal_log_slots)", n, clusterName), nil
		}
		if n > 0 && lag+(n+1)*wal > int64(b.MaxReplayLag) {
			return nil, "replay_lag", fmt.Sprintf("%d WAL_LOG copies of about %s in flight: another would put standby replay lag (%s now) over %s",
				n, mb(wal), mb(lag), mb(int64(b.MaxReplayLag))), nil
		}
		for i := 0; i < b.WALLogSlots; i++ {
			key := base + int32(i)
			if slices.Contains(held, int64(key)) {
				continue
			}
			var ok bool
			if err := tx.QueryRow(ctx, `SELECT pg_try_advisory_lock($1, $2)`, int32(walLogKeySpace), key).Scan(&ok); err != nil {
				return nil, "", "", err
			}
			if !ok {
				continue
			}
			// A session lock outlives the transaction, committed or not.
			if err := tx.Commit(ctx); err != nil {
				_ = conn.Conn().Close(context.WithoutCancel(ctx)) // never keep a slot nobody will release
				return nil, "", "", err
			}
			return releaser(conn, walLogKeySpace, key), "", "", nil
		}
		return nil, "wal_log_slots", fmt.Sprintf("%d WAL_LOG copies already in flight on cluster %s (pacer.wal_log_slots)", n, clusterName), nil
	}()
	if release == nil {
		conn.Release()
	}
	return release, kind, reason, err
}

// releaser returns the function that gives a slot back and the connection
// that holds it to the pool.
func releaser(conn *pgxpool.Conn, space int32, key int32) func() {
	return func() {
		uctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		if _, err := conn.Exec(uctx, `SELECT pg_advisory_unlock($1, $2)`, space, key); err != nil {
			// Never return a connection that may still hold the lock.
			_ = conn.Conn().Close(uctx)
		}
		conn.Release()
	}
}
