package prewarm

import (
	"context"
	"errors"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pgtenant/pgtenant/internal/background"
	"github.com/pgtenant/pgtenant/internal/catalog"
	"github.com/pgtenant/pgtenant/internal/cluster"
)

// Watcher notices restarts (pg_postmaster_start_time changed) and failovers
// (the node's timeline changed: a standby was promoted) of every node and
// starts a prewarm of that node; between those it captures hot sets every
// CaptureInterval.
//
// Each node is watched on a connection of its own, polled every
// WatchInterval with one cheap query: a restart breaks the connection, so
// the node is seen again (and prewarmed) as soon as it accepts connections,
// before its clients have warmed the cache by themselves. The catalog is
// read only when what the node says changes.
type Watcher struct {
	S *Service
}

// discoverEvery is how often the watcher looks for new clusters and nodes
// and for hot sets due for a capture.
const discoverEvery = 10 * time.Second

// Run watches until ctx is done.
func (w *Watcher) Run(ctx context.Context) error {
	cfg := w.S.Prewarm
	log := w.S.Logger.With("component", "prewarm")
	tick := discoverEvery
	if c := cfg.CaptureInterval.D(); c > 0 && c < tick {
		tick = c
	}
	var wg sync.WaitGroup
	defer wg.Wait()
	watched := map[string]bool{}
	tried := map[string]time.Time{} // last capture attempt per node, by this daemon
	background.Every(ctx, tick, func(ctx context.Context) {
		for _, cl := range w.S.Clusters.All() {
			for _, node := range w.nodes(cl) {
				key := cl.Name() + "/" + node
				if cfg.WatchInterval.D() > 0 && !watched[key] {
					watched[key] = true
					wg.Add(1)
					go func() {
						defer wg.Done()
						w.watchNode(ctx, cl, node)
					}()
				}
				if !w.captureDue(ctx, cl.Name(), node, tried[key]) {
					continue
				}
				tried[key] = time.Now()
				if res, err := w.S.Capture(ctx, cl, node); err != nil && ctx.Err() == nil {
					log.Warn("hot-set capture failed", "cluster", cl.Name(), "node", node, "err", err)
				} else if res.Skipped != "" {
					log.Info("hot-set capture skipped", "cluster", cl.Name(), "node", node, "why", res.Skipped)
				}
			}
		}
	})
	return nil
}

// watchNode polls one node's identity until ctx is done, reconnecting when
// the connection breaks, and checks it against the catalog when it changes.
func (w *Watcher) watchNode(ctx context.Context, cl *cluster.Cluster, node string) {
	every := w.S.Prewarm.WatchInterval.D()
	log := w.S.Logger.With("component", "prewarm", "cluster", cl.Name(), "node", node)
	var conn *pgx.Conn
	defer func() {
		if conn != nil {
			conn.Close(context.WithoutCancel(ctx))
		}
	}()
	var last nodeID
	down := cluster.Outage{What: "restart check"}
	background.Every(ctx, every, func(ctx context.Context) {
		if conn == nil {
			if c, err := cl.ConnectNode(ctx, node, cl.MaintenanceDB()); err == nil {
				conn = c
			}
		}
		if conn != nil {
			id, err := identity(ctx, conn)
			switch {
			case err != nil:
				conn.Close(context.WithoutCancel(ctx))
				conn = nil
			case !id.start.Equal(last.start) || id.timeline != last.timeline:
				err := w.S.check(ctx, cl, node, id)
				if ctx.Err() == nil {
					down.Report(log, err)
				}
				if err == nil {
					last = id
				}
			}
		}
	})
}

// captureDue says whether a node's hot sets are older than CaptureInterval.
// The age is the catalog's, so that a restarted daemon does not capture
// again at once and several daemons sharing the catalog capture once per
// interval between them, not once each; tried (this daemon's last attempt)
// keeps a failing capture from being retried every tick.
func (w *Watcher) captureDue(ctx context.Context, clusterName, node string, tried time.Time) bool {
	every := w.S.Prewarm.CaptureInterval.D()
	if every <= 0 || time.Since(tried) < every {
		return false
	}
	n, err := w.S.Store.GetPrewarmNode(ctx, clusterName, node)
	return err != nil || n.CapturedAt == nil || time.Since(*n.CapturedAt) >= every
}

func (w *Watcher) nodes(cl *cluster.Cluster) []string {
	if w.S.Prewarm.Standbys {
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
	return s.check(ctx, cl, node, id)
}

func (s *Service) check(ctx context.Context, cl *cluster.Cluster, node string, id nodeID) error {
	seen, err := s.Store.GetPrewarmNode(ctx, cl.Name(), node)
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
	if err := s.Store.SeePrewarmNode(ctx, cl.Name(), node, id.start, id.timeline); err != nil {
		return err
	}
	if reason == "" {
		return nil
	}
	s.Logger.Info("node restarted; prewarming its hot tenants", "component", "prewarm", "cluster", cl.Name(), "node", node, "reason", reason)
	_, err = s.Enqueue(ctx, Args{Cluster: cl.Name(), Node: node, Reason: reason})
	return err
}
