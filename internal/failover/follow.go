// Package failover follows the leader of each cluster that Patroni runs
// (registered with its REST endpoints, `cluster add NAME --patroni URL,…`):
// it reads the cluster's members from Patroni and, when the leader is not
// where pgtenant connects, re-points pgtenant at it: the catalog's DSNs,
// the registry's cluster (its pools closed; new ones reach the new
// primary) and the cluster's PgBouncer (its entries' host and port, a
// reload, a RECONNECT), so that tenants go on through the same DSN.
//
// Patroni elects and promotes; this package asks it to only for an
// operator's switchover or failover (cluster.switchover jobs), which
// pause the cluster's PgBouncer while the leader changes. It does not
// touch the tenants' databases, jobs or the pacer: they reach the cluster
// through the registry, and so the new primary, on their next connection.
// A new primary is prewarmed (Prewarm).
package failover

import (
	"cmp"
	"context"
	"fmt"
	"log/slog"
	"net/http"
	"slices"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/pgtenant/pgtenant/internal/background"
	"github.com/pgtenant/pgtenant/internal/catalog"
	"github.com/pgtenant/pgtenant/internal/cluster"
	"github.com/pgtenant/pgtenant/internal/jobs"
	"github.com/pgtenant/pgtenant/internal/patroni"
	"github.com/pgtenant/pgtenant/internal/pooler"
)

// Follower re-points pgtenant at the leader of every cluster registered
// with Patroni endpoints.
type Follower struct {
	Store    *catalog.Store
	Clusters *cluster.Registry
	Poolers  *pooler.Set // nil: no cluster has a pooler
	// Interval between two checks of each cluster (failover.check_interval);
	// 0: Run only waits.
	Interval time.Duration
	Logger   *slog.Logger
	// HTTP asks Patroni; nil: each request times out after 2 s, so that a
	// node that hangs delays a check by that much at most.
	HTTP *http.Client
	// Runner runs the cluster.switchover jobs Switchover starts.
	Runner *jobs.Runner
	// Prewarm, if set, starts the prewarm of a cluster's new primary once
	// the follower has gone to it.
	Prewarm func(ctx context.Context, cluster string) error

	failovers    *prometheus.CounterVec
	seconds      *prometheus.HistogramVec
	syncStandbys *prometheus.GaugeVec

	mu    sync.Mutex
	known []catalog.Cluster   // the clusters last read from the catalog
	state map[string]*tracked // by cluster name
}

// tracked is what the follower remembers of one cluster between checks;
// only that cluster's check (or switchover) touches it, holding mu.
type tracked struct {
	mu sync.Mutex
	// suspect is the first failed check of the current leader (it did not
	// answer as primary, or Patroni had no leader), zero while it answers:
	// the start of the time a failover is measured over.
	suspect time.Time
	// leader is the name of the leader last followed or seen answering.
	leader string
	down   cluster.Outage
	// syncStandbys is how many running synchronous standbys the last check
	// saw, -1 before the first; unsynced: the last check warned that the
	// cluster runs in synchronous mode without one.
	syncStandbys int
	unsynced     bool
}

// New returns a follower; its metrics are in Collectors.
func New(store *catalog.Store, clusters *cluster.Registry, poolers *pooler.Set, interval time.Duration, log *slog.Logger) *Follower {
	return &Follower{Store: store, Clusters: clusters, Poolers: poolers, Interval: interval,
		Logger: cmp.Or(log, slog.New(slog.DiscardHandler)).With("component", "failover"),
		failovers: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "pgtenant_failovers_total", Help: "Leader changes of Patroni clusters this daemon followed, by cluster.",
		}, []string{"cluster"}),
		seconds: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name: "pgtenant_failover_seconds",
			Help: "Time from the first failed check of a Patroni cluster's leader to its front door serving the new one, by cluster.",
			// Patroni's ttl (20 s by default) is most of a node loss; a
			// switchover takes a few seconds.
			Buckets: []float64{1, 2, 5, 10, 15, 20, 25, 30, 45, 60, 120},
		}, []string{"cluster"}),
		syncStandbys: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "pgtenant_cluster_sync_standbys",
			Help: "Running synchronous standbys of a Patroni cluster, as its last check saw them; 0 in synchronous mode: commits are acknowledged unreplicated.",
		}, []string{"cluster"}),
		state: map[string]*tracked{},
	}
}

// Collectors are the follower's metrics, for the daemon's registry.
func (f *Follower) Collectors() []prometheus.Collector {
	return []prometheus.Collector{f.failovers, f.seconds, f.syncStandbys}
}

// Run checks every Patroni cluster each Interval until ctx ends.
func (f *Follower) Run(ctx context.Context) error {
	if f.Interval <= 0 {
		<-ctx.Done()
		return nil
	}
	if f.HTTP == nil {
		f.HTTP = &http.Client{Timeout: 2 * time.Second}
	}
	background.Every(ctx, f.Interval, f.checkAll)
	return nil
}

// checkAll checks the clusters at once: one whose Patroni does not answer
// delays the others by nothing.
func (f *Follower) checkAll(ctx context.Context) {
	all, err := f.Store.Clusters(ctx)
	f.mu.Lock()
	if err == nil {
		f.known = all
	} else {
		// The catalog may be down: the clusters last read are still
		// followed (their re-pointing waits for the catalog, see repoint).
		all = f.known
	}
	var wg sync.WaitGroup
	for _, c := range all {
		if len(c.PatroniURLs) == 0 {
			continue
		}
		st := f.trackedLocked(c.Name)
		wg.Go(func() {
			st.mu.Lock()
			defer st.mu.Unlock()
			err := f.check(ctx, c, st)
			if ctx.Err() == nil {
				st.down.Report(f.Logger, err, "cluster", c.Name)
			}
		})
	}
	f.mu.Unlock()
	wg.Wait()
}

// tracked returns what the follower remembers of a cluster.
func (f *Follower) tracked(name string) *tracked {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.trackedLocked(name)
}

func (f *Follower) trackedLocked(name string) *tracked {
	st := f.state[name]
	if st == nil {
		st = &tracked{down: cluster.Outage{What: "follow the Patroni leader"}, syncStandbys: -1}
		f.state[name] = st
	}
	return st
}

// check compares the cluster's leader with where the registry connects,
// and re-points on a difference.
func (f *Follower) check(ctx context.Context, c catalog.Cluster, st *tracked) error {
	cl, err := f.Clusters.Get(c.Name)
	if err != nil {
		return err // not loaded yet: the daemon's cluster sync does it
	}
	pc := patroni.NewClient(c.PatroniURLs, f.HTTP)
	suspect := func(err error) error {
		if st.suspect.IsZero() {
			st.suspect = time.Now()
		}
		return err
	}
	ms, err := pc.Members(ctx)
	if err != nil {
		return suspect(err)
	}
	leader, ok := patroni.LeaderOf(ms)
	if !ok {
		return suspect(fmt.Errorf("cluster %s: %w", c.Name, patroni.ErrNoLeader))
	}
	f.checkSync(ctx, c, pc, ms, st)
	standbys, err := standbyDSNs(c.DSN, ms, leader)
	if err != nil {
		return err
	}
	if leader.Host != cl.Host() || leader.Port != int(cl.Port()) {
		return f.failover(ctx, c, leader, standbys, st)
	}
	// Patroni goes on naming a lost leader until its lock expires (ttl):
	// the leader's own answer tells of the loss at once.
	if ok, err := pc.Check(ctx, leader.BaseURL(), patroni.CheckPrimary); err != nil || !ok {
		return suspect(cmp.Or(err, fmt.Errorf("cluster %s: leader %s does not answer as primary", c.Name, leader.Name)))
	}
	st.suspect, st.leader = time.Time{}, leader.Name
	if !slices.Equal(standbys, cl.StandbyDSNs()) {
		// A standby joined or left (an old leader rewound and back): the
		// probe and the pacer watch the running ones.
		if err := f.repoint(ctx, c, c.DSN, standbys); err != nil {
			return err
		}
		f.Logger.Info("cluster standbys follow Patroni's replicas", "cluster", c.Name, "standbys", len(standbys))
	}
	return nil
}

// failover re-points the catalog, the registry and the pooler at leader,
// then counts and logs the change with the time it took.
func (f *Follower) failover(ctx context.Context, c catalog.Cluster, leader patroni.Member, standbys []string, st *tracked) error {
	if st.suspect.IsZero() {
		// Noticed at its first check: a switchover (the old leader answered
		// until it handed over), or a change while this daemon was down.
		st.suspect = time.Now()
	}
	primary, err := cluster.WithHostPort(c.DSN, leader.Host, leader.Port)
	if err != nil {
		return fmt.Errorf("cluster %s: %w", c.Name, err)
	}
	// Patroni names the new leader (and its /primary answers) once it has
	// asked PostgreSQL to promote, before the promotion is done: sessions
	// re-pointed then would meet a read-only server (a move's cut-over
	// failed on "cannot execute DELETE in a read-only transaction").
	if err := writable(ctx, primary); err != nil {
		return fmt.Errorf("cluster %s: new leader %s takes no writes yet: %w", c.Name, leader.Name, err)
	}
	if err := f.repoint(ctx, c, primary, standbys); err != nil {
		return err
	}
	if leader.Name == st.leader {
		// The leader this follower already went to: the daemon's cluster
		// sync, reading the catalog just before repoint wrote it, put the
		// registry back. Not a new failover; the pooler is there already.
		f.Logger.Info("cluster re-pointed at its leader again", "cluster", c.Name, "leader", leader.Name)
		return nil
	}
	var poolerErr error
	if front := f.Poolers.Get(c.Name); front != nil {
		pctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		// On an error the pooler has the new server in its settings
		// already: its next sync (pooler.sync_interval) renders it.
		if _, err := front.Repoint(pctx, leader.Host, leader.Port); err != nil {
			poolerErr = fmt.Errorf("re-point the pooler of cluster %s: %w", c.Name, err)
		}
		cancel()
	}
	// Tenants moved here keep the entries of their first cluster's pooler,
	// which read this cluster's primary from the registry at their sync.
	for _, other := range f.Poolers.All() {
		if other.Cluster != c.Name {
			other.Poke()
		}
	}
	took := time.Since(st.suspect)
	st.suspect, st.leader = time.Time{}, leader.Name
	f.failovers.WithLabelValues(c.Name).Inc()
	f.seconds.WithLabelValues(c.Name).Observe(took.Seconds())
	if f.Prewarm != nil {
		if err := f.Prewarm(ctx, c.Name); err != nil {
			f.Logger.Warn("new primary not prewarmed", "cluster", c.Name, "err", err)
		}
	}
	// Warn: a failover is worth an operator's look even when it worked
	// (why did the leader go?).
	f.Logger.Warn("cluster failed over: pgtenant follows Patroni's new leader", "cluster", c.Name, "leader", leader.Name,
		"primary", fmt.Sprintf("%s:%d", leader.Host, leader.Port), "standbys", len(standbys),
		"took", took.Round(time.Millisecond), "pooler_err", poolerErr)
	return poolerErr
}

// repoint writes the cluster's new DSNs to the catalog, then replaces the
// registry's cluster (closing its pools). The catalog comes first: the
// daemons' cluster sync makes the registry follow the catalog, so a
// registry ahead of it would be put back; with the catalog down the
// cluster is not followed until it answers.
func (f *Follower) repoint(ctx context.Context, c catalog.Cluster, primary string, standbys []string) error {
	next, err := cluster.New(c.Name, primary, standbys, f.Logger)
	if err != nil {
		return err
	}
	changed, err := f.Store.RepointCluster(ctx, c.Name, c.DSN, primary, standbys)
	if err != nil {
		return err
	}
	if !changed {
		return fmt.Errorf("cluster %s: its DSN changed in the catalog meanwhile; the next check reads it again", c.Name)
	}
	f.Clusters.Put(next)
	return nil
}

// checkSync counts the running synchronous standbys of ms and, when there
// are none, asks Patroni whether the cluster runs in synchronous mode: an
// event (a warning, then one line when a standby is back) and the gauge
// tell that commits are acknowledged unreplicated meanwhile.
func (f *Follower) checkSync(ctx context.Context, c catalog.Cluster, pc *patroni.Client, ms []patroni.Member, st *tracked) {
	n := 0
	for _, m := range ms {
		if m.Role == patroni.RoleSyncStandby && runningReplica(m) {
			n++
		}
	}
	f.syncStandbys.WithLabelValues(c.Name).Set(float64(n))
	if n == st.syncStandbys {
		return
	}
	st.syncStandbys = n
	if n > 0 {
		if st.unsynced {
			st.unsynced = false
			f.Logger.Info("cluster has a synchronous standby again: commits are replicated before they are acknowledged", "cluster", c.Name)
		}
		return
	}
	sync, err := pc.SynchronousMode(ctx)
	switch {
	case err != nil:
		st.syncStandbys = -1 // asked again at the next check
	case sync:
		st.unsynced = true
		f.Logger.Warn("cluster runs in synchronous mode without a synchronous standby: commits are acknowledged unreplicated, "+
			"and a failover now may lose them; `pgtenant cluster show` lists its members", "cluster", c.Name)
	}
}

// Members returns the members of a cluster Patroni runs, as Patroni sees
// them, and whether it runs in synchronous mode.
func (f *Follower) Members(ctx context.Context, c catalog.Cluster) ([]patroni.Member, bool, error) {
	pc := patroni.NewClient(c.PatroniURLs, f.HTTP)
	ms, err := pc.Members(ctx)
	if err != nil {
		return nil, false, err
	}
	slices.SortFunc(ms, func(a, b patroni.Member) int { return cmp.Compare(a.Name, b.Name) })
	sync, err := pc.SynchronousMode(ctx)
	return ms, sync, err
}

// standbyDSNs are dsn pointed at each running replica of ms (by name):
// a member that is stopped, starting or lost is no standby to watch.
func standbyDSNs(dsn string, ms []patroni.Member, leader patroni.Member) ([]string, error) {
	ms = slices.Clone(ms)
	slices.SortFunc(ms, func(a, b patroni.Member) int { return cmp.Compare(a.Name, b.Name) })
	var out []string
	for _, m := range ms {
		if m.Name == leader.Name || !m.Running() || m.Host == "" {
			continue
		}
		s, err := cluster.WithHostPort(dsn, m.Host, m.Port)
		if err != nil {
			return nil, fmt.Errorf("replica %s: %w", m.Name, err)
		}
		out = append(out, s)
	}
	return out, nil
}

// Topology is where a cluster registered with Patroni endpoints connects
// now: dsn (for its credentials, database and options) pointed at the
// running leader, and at each running replica. `cluster add --patroni`
// registers it with these.
func Topology(ctx context.Context, urls []string, dsn string, hc *http.Client) (primary string, standbys []string, err error) {
	ms, err := patroni.NewClient(urls, cmp.Or(hc, &http.Client{Timeout: 5 * time.Second})).Members(ctx)
	if err != nil {
		return "", nil, err
	}
	leader, ok := patroni.LeaderOf(ms)
	if !ok {
		return "", nil, patroni.ErrNoLeader
	}
	if primary, err = cluster.WithHostPort(dsn, leader.Host, leader.Port); err != nil {
		return "", nil, err
	}
	standbys, err = standbyDSNs(dsn, ms, leader)
	return primary, standbys, err
}
