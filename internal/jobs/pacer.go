package jobs

import (
	"context"
	"fmt"
	"hash/fnv"
	"log/slog"
	"time"

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
	// Heavy steps (CREATE/DROP DATABASE) also wait (at most
	// pacer.max_checkpoint_wait) while a forced checkpoint runs, and take one
	// of the cluster's heavy DDL slots. A timed checkpoint, which runs most
	// of the time on a busy cluster, is not waited for.
	Heavy
	// HeavyNoCheckpoint steps take a heavy DDL slot but force no checkpoint
	// (CREATE DATABASE … STRATEGY WAL_LOG), so they do not wait for a running
	// one: pacer.wait_for_checkpoint is about steps that force another, and a
	// spread checkpoint is in progress most of the time (0.9 × 5 min by
	// default) on a cluster with any writes.
	HeavyNoCheckpoint
)

// Pacer holds heavy steps while their cluster is over budget: a standby
// replaying too far behind, a checkpoint running, or too many heavy DDL
// steps in flight. Slots are session advisory locks in the catalog, so the
// limit holds across every daemon sharing the catalog, and a daemon that dies
// gives its slots back with its connection.
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

// slotKeySpace is the first key of pgtenant's advisory locks ("pgt\x01").
const slotKeySpace = 0x70677401

// Acquire waits until the cluster has budget for a step of this kind and
// returns the function that releases it. report is called with the reason
// whenever the reason for waiting changes. Acquire never waits forever on a
// standby that is down unless the cluster's budget says standby_down: wait.
func (p *Pacer) Acquire(ctx context.Context, clusterName string, kind Kind, report func(reason string)) (func(), error) {
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
		reasonKind, reason, err := p.overBudget(ctx, cl, b, kind)
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
		if reason == "" && (kind == Heavy || kind == HeavyNoCheckpoint) {
			release, ok, err := p.takeSlot(ctx, clusterName, b.HeavyDDLSlots)
			if err != nil {
				return nil, err
			}
			if ok {
				p.account(clusterName, lastKind, waitedSince)
				return release, nil
			}
			reasonKind, reason = "ddl_slots", fmt.Sprintf("%d heavy DDL step(s) already in flight on cluster %s", b.HeavyDDLSlots, clusterName)
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

// overBudget probes the cluster and says why a step must wait, or "".
func (p *Pacer) overBudget(ctx context.Context, cl *cluster.Cluster, b config.PacerConfig, kind Kind) (string, string, error) {
	h, err := cl.Probe(ctx)
	if err != nil {
		return "", "", fmt.Errorf("pacer: %w", err)
	}
	lag, down := h.MaxReplayLag()
	if down && b.StandbyDown == "wait" {
		return "standby_down", "a standby of cluster " + cl.Name() + " is down (pacer.standby_down: wait)", nil
	}
	if down {
		p.log.Warn("a standby is down; proceeding (pacer.standby_down: proceed)", "cluster", cl.Name())
	}
	if lag > int64(b.MaxReplayLag) {
		return "replay_lag", fmt.Sprintf("standby replay lag %s > %s", mb(lag), mb(int64(b.MaxReplayLag))), nil
	}
	if kind == Heavy && b.WaitForCheckpoint && h.CheckpointUnpaced {
		return "checkpoint", "a forced checkpoint is running on cluster " + cl.Name(), nil
	}
	return "", "", nil
}

func mb(n int64) string { return fmt.Sprintf("%d MB", n>>20) }

// takeSlot tries each of the cluster's heavy DDL slots.
func (p *Pacer) takeSlot(ctx context.Context, clusterName string, slots int) (func(), bool, error) {
	conn, err := p.catalog.Acquire(ctx)
	if err != nil {
		return nil, false, err
	}
	h := fnv.New32a()
	h.Write([]byte(clusterName))
	base := int32(h.Sum32() & 0x00ffffff << 4)
	for i := 0; i < slots; i++ {
		key := base + int32(i)
		var ok bool
		if err := conn.QueryRow(ctx, `SELECT pg_try_advisory_lock($1, $2)`, int32(slotKeySpace), key).Scan(&ok); err != nil {
			conn.Release()
			return nil, false, err
		}
		if ok {
			return func() {
				uctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
				defer cancel()
				if _, err := conn.Exec(uctx, `SELECT pg_advisory_unlock($1, $2)`, int32(slotKeySpace), key); err != nil {
					// Never return a connection that may still hold the lock.
					_ = conn.Conn().Close(uctx)
				}
				conn.Release()
			}, true, nil
		}
	}
	conn.Release()
	return nil, false, nil
}
