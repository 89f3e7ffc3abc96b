package fleet

import (
	"cmp"
	"context"
	"fmt"
	"log/slog"
	"path/filepath"
	"sync"
	"time"

	"github.com/pgtenant/pgtenant/internal/background"
)

// Outcomes of a RestartEvent.
const (
	OutcomeRestarted = "restarted" // the attempt started the node
	OutcomeFailed    = "failed"    // the attempt failed; another follows after a backoff
	OutcomeGaveUp    = "gave_up"   // MaxRestarts attempts in a row failed; the node stays down
)

// RestartEvent is one restart attempt of a node found down, or the
// supervisor giving up on it.
type RestartEvent struct {
	Cluster string
	Node    string
	Attempt int    // 1 for the first attempt since the node was found down
	Outcome string // OutcomeRestarted, OutcomeFailed or OutcomeGaveUp
	Err     error  // why the start failed; nil when restarted
}

// Supervised is a cluster whose nodes a Supervisor keeps running: a
// *Cluster (its servers, checked with pg_ctl status), or the Patroni nodes
// of a cluster under Patroni (internal/patroni: the Patroni processes,
// which run their servers).
type Supervised interface {
	Name() string
	// SupervisedNodes are the nodes to watch.
	SupervisedNodes() []string
	Running(node string) bool
	StartNode(ctx context.Context, node string) error
	// LogHint says where to read why a node does not start.
	LogHint(node string) string
}

// SupervisedNodes are the cluster's ready nodes (a half-made one only
// Start can finish).
func (c *Cluster) SupervisedNodes() []string {
	var out []string
	for _, n := range append([]Node{c.Primary()}, c.Standbys()...) {
		if n.Ready {
			out = append(out, n.Name)
		}
	}
	return out
}

// Running reports whether the node's server runs (pg_ctl status).
func (c *Cluster) Running(node string) bool { return c.running(c.nodeDir(node)) }

// LogHint names the node's startup log and log dir.
func (c *Cluster) LogHint(node string) string {
	dir := c.nodeDir(node)
	return filepath.Join(dir, "startup.log") + " and the newest file of " + filepath.Join(dir, "log")
}

// Supervisor keeps the nodes of a started managed cluster running: every
// Interval it checks each node (Supervised.Running) and restarts one found
// down, waiting MinBackoff after a failed attempt, doubling up to MaxBackoff,
// and giving up on that node after MaxRestarts failed attempts in a row (it
// keeps supervising the others, and takes a node back once it runs again).
//
// The supervisor is the only thing that starts nodes while it runs: the
// cluster must not be started, stopped or promoted until Run has returned.
// An operator who wants a node down stops whoever runs the supervisor first
// (`pgtenant up`): a node stopped under it is restarted.
type Supervisor struct {
	Cluster Supervised
	// Interval between two checks of a node; default 2 s.
	Interval time.Duration
	// MinBackoff is the wait after the first failed attempt, doubled after
	// each further one up to MaxBackoff; defaults 1 s and 1 min.
	MinBackoff, MaxBackoff time.Duration
	// MaxRestarts is how many attempts in a row may fail before the
	// supervisor gives up on a node; default 5. A successful restart resets
	// the count.
	MaxRestarts int
	Logger      *slog.Logger
	// OnEvent, when set, is called after each attempt and when the supervisor
	// gives up, from the goroutine supervising that node.
	OnEvent func(RestartEvent)
}

// Run supervises until ctx is cancelled, one goroutine per node so that a
// slow start (crash recovery) of one delays no other. An attempt in progress
// when ctx is cancelled runs to its end (pg_ctl's own timeout): stopping it
// halfway could leave a server starting after Run has returned, behind the
// back of whoever stops the cluster next. Run never fails on its own; it
// returns nil.
func (s *Supervisor) Run(ctx context.Context) error {
	c := s.Cluster
	log := cmp.Or(s.Logger, slog.New(slog.DiscardHandler)).With("component", "supervisor", "cluster", c.Name())
	var wg sync.WaitGroup
	for _, n := range c.SupervisedNodes() {
		wg.Go(func() { s.watch(ctx, log, n) })
	}
	wg.Wait()
	return nil
}

// nodeWatch is what the supervisor knows of one node.
type nodeWatch struct {
	down        bool          // found down and not restarted yet
	failures    int           // failed attempts in a row
	delay       time.Duration // backoff: the wait after the last attempt
	next        time.Time     // no attempt before
	restartedAt time.Time     // last successful restart
	gaveUp      bool
}

func (s *Supervisor) watch(ctx context.Context, log *slog.Logger, n string) {
	var w nodeWatch
	background.EveryAfter(ctx, cmp.Or(s.Interval, 2*time.Second), func(ctx context.Context) { s.check(ctx, log, n, &w) })
}

func (s *Supervisor) check(ctx context.Context, log *slog.Logger, n string, w *nodeWatch) {
	c := s.Cluster
	minBackoff, maxBackoff := cmp.Or(s.MinBackoff, time.Second), cmp.Or(s.MaxBackoff, time.Minute)
	if c.Running(n) {
		if w.gaveUp || w.down {
			// Started by someone else (the operator, after fixing what
			// made us give up): supervise it again from scratch.
			log.Info("node runs again; supervising it", "node", n)
			*w = nodeWatch{}
		}
		// The backoff starts over only once a restarted node has stayed up
		// for a while: a node that dies right after each restart is
		// restarted ever more slowly instead of every Interval.
		if w.delay > 0 && time.Since(w.restartedAt) >= maxBackoff {
			w.delay = 0
		}
		return
	}
	if w.gaveUp || ctx.Err() != nil {
		return
	}
	if !w.down {
		w.down = true
		w.next = time.Now().Add(w.delay)
		log.Warn("node is down; restarting it", "node", n)
	}
	if time.Now().Before(w.next) {
		return
	}

	attempt := w.failures + 1
	err := c.StartNode(context.WithoutCancel(ctx), n)
	if w.delay == 0 {
		w.delay = minBackoff
	} else {
		w.delay = min(2*w.delay, maxBackoff)
	}
	ev := RestartEvent{Cluster: c.Name(), Node: n, Attempt: attempt, Err: err}
	if err == nil {
		w.down, w.failures, w.restartedAt = false, 0, time.Now()
		log.Info("node restarted", "node", n, "attempt", attempt, "outcome", OutcomeRestarted)
		ev.Outcome = OutcomeRestarted
		s.emit(ev)
		return
	}
	w.failures++
	w.next = time.Now().Add(w.delay)
	log.Warn("node restart failed", "node", n, "attempt", attempt, "outcome", OutcomeFailed, "retry_in", w.delay, "err", err)
	ev.Outcome = OutcomeFailed
	s.emit(ev)
	if w.failures < cmp.Or(s.MaxRestarts, 5) {
		return
	}
	w.gaveUp = true
	log.Error(fmt.Sprintf("gave up restarting %s after %d failed attempts; it stays down. "+
		"Read why in %s, fix it, then stop `pgtenant up` (Ctrl-C) and run it again; "+
		"a node started again by other means is supervised again", n, w.failures, c.LogHint(n)),
		"node", n, "attempt", attempt, "outcome", OutcomeGaveUp, "err", err)
	ev.Outcome = OutcomeGaveUp
	s.emit(ev)
}

func (s *Supervisor) emit(ev RestartEvent) {
	if s.OnEvent != nil {
		s.OnEvent(ev)
	}
}
