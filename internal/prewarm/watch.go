package prewarm

import (
	"context"
	"errors"
	"time"

	"github.com/pgtenant/pgtenant/internal/catalog"
	"github.com/pgtenant/pgtenant/internal/cluster"
)

// Watcher notices restarts (pg_postmaster_start_time changed) and failovers
// (the primary's timeline changed: a standby was promoted) of every node and
// starts a prewarm of that node; between those it captures hot sets every
// CaptureInterval.
type Watcher struct {
	S *Service
}

// Run watches until ctx is done.
func (w *Watcher) Run(ctx context.Context) error {
	cfg := w.S.Config.Prewarm
	if cfg.WatchInterval.D() <= 0 && cfg.CaptureInterval.D() <= 0 {
		<-ctx.Done()
		return nil
	}
	log := w.S.Logger.With("component", "prewarm")
	tick := cfg.WatchInterval.D()
	if tick <= 0 || (cfg.CaptureInterval.D() > 0 && cfg.CaptureInterval.D() < tick) {
		tick = cfg.CaptureInterval.D()
	}
	var lastCapture time.Time
	for {
		capture := cfg.CaptureInterval.D() > 0 && time.Since(lastCapture) >= cfg.CaptureInterval.D()
		for _, cl := range w.S.Clusters.All() {
			for _, node := range w.nodes(cl) {
				if cfg.WatchInterval.D() > 0 {
					if err := w.S.Check(ctx, cl, node); err != nil && ctx.Err() == nil {
						log.Warn("restart check failed", "cluster", cl.Name(), "node", node, "err", err)
					}
				}
				if capture {
					if res, err := w.S.Capture(ctx, cl, node); err != nil && ctx.Err() == nil {
						log.Warn("hot-set capture failed", "cluster", cl.Name(), "node", node, "err", err)
					} else if res.Skipped != "" {
						log.Info("hot-set capture skipped", "cluster", cl.Name(), "node", node, "why", res.Skipped)
					}
				}
			}
		}
		if capture {
			lastCapture = time.Now()
		}
		select {
		case <-ctx.Done():
			return nil
		case <-time.After(tick):
		}
	}
}

func (w *Watcher) nodes(cl *cluster.Cluster) []string {
	if w.S.Config.Prewarm.Standbys {
		return cl.Nodes()
	}
	return []string{"primary"}
}

// Check compares a node's identity with what pgtenant last saw and, if it
// restarted or was promoted, records the new identity and starts a prewarm.
// The first sight of a node only records it.
func (s *Service) Check(ctx context.Context, cl *cluster.Cluster, node string) error {
	conn, err := cl.ConnectNode(ctx, node, cl.MaintenanceDB())
	if err != nil {
		return err
	}
	id, err := identity(ctx, conn)
	conn.Close(context.WithoutCancel(ctx))
	if err != nil {
		return err
	}
	seen, err := s.nodeState(ctx, cl.Name(), node)
	first := errors.Is(err, catalog.ErrNotFound)
	if err != nil && !first {
		return err
	}
	reason := ""
	switch {
	case first || seen.PostmasterStart == nil:
	case seen.Timeline != nil && *seen.Timeline != id.timeline:
		reason = "failover"
	case !seen.PostmasterStart.Equal(id.start):
		reason = "restart"
	default:
		return nil
	}
	if _, err := s.Store.Pool().Exec(ctx, `INSERT INTO prewarm_nodes (cluster, node, postmaster_start, timeline) VALUES ($1, $2, $3, $4)
		ON CONFLICT (cluster, node) DO UPDATE SET postmaster_start = $3, timeline = $4, updated_at = now()`,
		cl.Name(), node, id.start, id.timeline); err != nil {
		return err
	}
	if reason == "" {
		return nil
	}
	s.Logger.Info("node restarted; prewarming its hot tenants", "component", "prewarm", "cluster", cl.Name(), "node", node, "reason", reason)
	_, err = s.Enqueue(ctx, Args{Cluster: cl.Name(), Node: node, Reason: reason})
	return err
}
