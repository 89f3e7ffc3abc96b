package metrics

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"sort"
	"sync"
	"time"

	"golang.org/x/sync/errgroup"

	"github.com/pgtenant/pgtenant/internal/background"
	"github.com/pgtenant/pgtenant/internal/catalog"
	"github.com/pgtenant/pgtenant/internal/cluster"
	"github.com/pgtenant/pgtenant/internal/config"
	"github.com/pgtenant/pgtenant/internal/pooler"
	"github.com/pgtenant/pgtenant/internal/tenant"
)

// QuotaChecker is told, after each pass over a cluster, the storage usage
// of its tenants (internal/quota implements it).
type QuotaChecker interface {
	CheckQuotas(ctx context.Context, cluster string, usage []Usage) error
}

// Usage is one tenant's last known size with its tier and quota state.
type Usage struct {
	Tenant     string
	Mode       tenant.Mode
	Database   string
	Tier       string
	SizeBytes  int64
	SizeAt     time.Time
	Quota      string // ok, warning, grace, enforced
	QuotaSince *time.Time
	OverSince  *time.Time
}

// Collector measures every tenant of every cluster from cluster-wide views:
// per pass and cluster one catalog query, pg_stat_database, pg_stat_activity,
// and one statistics query per shared database; sizes are sampled in small
// staggered batches. It never connects to a tenant's own database, and
// between minute flushes it writes nothing.
type Collector struct {
	Store    *catalog.Store
	Clusters *cluster.Registry
	Metrics  config.MetricsConfig
	Tiers    map[string]config.Tier // tenants near their tier's storage warning are sized every pass
	Logger   *slog.Logger
	Quota    QuotaChecker // may be nil
	// Poolers are the clusters' PgBouncers: usage counts the bytes
	// through each tenant's front door from their SHOW STATS. May be nil.
	Poolers *pooler.Set
	// Analytics counts the statements tenants run on this daemon's
	// analytics port, for usage. May be nil.
	Analytics QueryCounter
	// Now is the clock (tests may replace it).
	Now func() time.Time

	mu       sync.RWMutex
	clusters map[string]*clusterState
	lastGC   time.Time
}

// activityTau smooths the activity figure (used to sort and to choose the
// exported tenants) so that the top N does not churn on every pass.
const activityTau = 5 * time.Minute

// pendingMax bounds the rollups kept in memory while the catalog is down.
const pendingMax = 100_000

type clusterState struct {
	name     string
	tenants  map[string]*tenantState
	order    []string // ids in a stable order, for the size round robin
	cursor   int
	byState  map[[2]string]int // (state, mode) → tenants
	files    int64             // relation files, -1 unknown
	filesAt  time.Time
	seeded   bool // last sizes loaded from the catalog
	pending  []catalog.Rollup
	passes   int // passes applied
	lastPass PassStats
	meter    meter // usage metering (usage.go)
}

// PassStats describes the last pass over a cluster.
type PassStats struct {
	At       time.Time     `json:"at"`
	Duration time.Duration `json:"duration_ns"`
	Queries  int           `json:"queries"` // SQL statements the pass sent (catalog included)
	// UsageQueries: those of usage metering (CPU, size changes, ended
	// hours; constant in the number of tenants too), besides Queries.
	UsageQueries int    `json:"usage_queries"`
	Tenants      int    `json:"tenants"`       // tenants measured
	Sizes        int    `json:"sizes_sampled"` // sizes sampled in this pass
	Rollups      int    `json:"rollups_written"`
	Err          string `json:"error,omitempty"`
	// Statistics and SizesTime are the parts of Duration spent reading the
	// activity counters (every tenant's) and the sizes (this pass's turn).
	Statistics time.Duration `json:"statistics_ns"`
	SizesTime  time.Duration `json:"sizes_ns"`
}

// counters are a tenant's cumulative statistics. Sessions and ActiveMicros
// (database mode) count client sessions and the time they spent running
// statements: unlike the others, autovacuum's visits do not move them.
type counters struct {
	Commits, Rollbacks, RowsRead, RowsWritten, BlksHit, BlksRead, TempBytes, Deadlocks int64
	Sessions, ActiveMicros                                                             int64
}

func (a counters) sub(b counters) counters {
	d := func(x, y int64) int64 { return max(x-y, 0) } // a reset or a dropped table: no negative activity
	return counters{d(a.Commits, b.Commits), d(a.Rollbacks, b.Rollbacks), d(a.RowsRead, b.RowsRead),
		d(a.RowsWritten, b.RowsWritten), d(a.BlksHit, b.BlksHit), d(a.BlksRead, b.BlksRead),
		d(a.TempBytes, b.TempBytes), d(a.Deadlocks, b.Deadlocks), d(a.Sessions, b.Sessions), d(a.ActiveMicros, b.ActiveMicros)}
}

// clientActivity says whether a delta comes from the tenant's clients.
// Autovacuum visits every database that ever had activity once per
// autovacuum_naptime and its catalog scans and transactions count in
// pg_stat_database (and its vacuums in the table I/O counters): that
// background must neither rank a tenant as active nor write history.
func clientActivity(mode tenant.Mode, d counters) bool {
	if mode == tenant.ModeDatabase {
		return d.Sessions > 0 || d.ActiveMicros > 0 || d.RowsWritten > 0
	}
	return d.RowsRead > 0 || d.RowsWritten > 0
}

type tenantState struct {
	meta       catalog.MetricTenant
	seen       bool // present in the last pass's statistics
	cur, prev  counters
	curAt      time.Time
	prevAt     time.Time
	hasCur     bool
	conns      Connections
	size       int64
	sizeAt     time.Time
	hasSize    bool
	activity   float64
	rates      rates
	minute     time.Time // minute of the last pass
	base       counters  // counters at the end of the previous rollup
	hasBase    bool
	minConns   int   // most sessions seen in the current minute
	minActive  bool  // the tenant's clients did something in the current minute
	written    int64 // size in the last rollup written
	hasWritten bool
	// passWritten: rows written since the previous pass (usage).
	passWritten int64
	// stirred: its clients did something since its size was taken (or
	// that is not known: a size from the catalog, read at a restart).
	stirred bool
}

type rates struct {
	commits, rollbacks, rowsRead, rowsWritten float64
}

// Connections counts a tenant's sessions by state.
type Connections struct {
	Active            int `json:"active"`
	Idle              int `json:"idle"`
	IdleInTransaction int `json:"idle_in_transaction"`
}

// Total is every session.
func (c Connections) Total() int { return c.Active + c.Idle + c.IdleInTransaction }

// Figures are one tenant's current metrics, as the API and the CLI show them.
// Rates are over the last pass interval; totals are since the server's
// statistics reset. Pointers are nil where the figure does not exist for the
// tenant's mode (PostgreSQL keeps transactions, temp files and deadlocks per
// database, not per schema) or is not known yet.
type Figures struct {
	Tenant            string              `json:"tenant"`
	Cluster           string              `json:"cluster"`
	Mode              tenant.Mode         `json:"mode"`
	State             catalog.TenantState `json:"state"`
	At                time.Time           `json:"at"` // the pass that measured it
	SizeBytes         *int64              `json:"size_bytes,omitempty"`
	SizeAt            *time.Time          `json:"size_at,omitempty"`
	Connections       Connections         `json:"connections"`
	CommitsPerSec     *float64            `json:"commits_per_sec,omitempty"`
	RollbacksPerSec   *float64            `json:"rollbacks_per_sec,omitempty"`
	RowsReadPerSec    float64             `json:"rows_read_per_sec"`
	RowsWrittenPerSec float64             `json:"rows_written_per_sec"`
	Commits           *int64              `json:"commits,omitempty"`
	Rollbacks         *int64              `json:"rollbacks,omitempty"`
	RowsRead          int64               `json:"rows_read"`
	RowsWritten       int64               `json:"rows_written"`
	BlocksHit         int64               `json:"blocks_hit"`
	BlocksRead        int64               `json:"blocks_read"`
	HitRatio          *float64            `json:"hit_ratio,omitempty"` // blocks hit / (hit + read)
	TempBytes         *int64              `json:"temp_bytes,omitempty"`
	Deadlocks         *int64              `json:"deadlocks,omitempty"`
	Activity          float64             `json:"activity"` // smoothed (rows read + written + transactions)/s + active sessions
	Quota             string              `json:"quota_state"`
	Export            bool                `json:"export"` // always on /metrics
}

func (c *Collector) now() time.Time {
	if c.Now != nil {
		return c.Now()
	}
	return time.Now()
}

func (c *Collector) log() *slog.Logger {
	if c.Logger == nil {
		return slog.New(slog.DiscardHandler)
	}
	return c.Logger.With("component", "metrics")
}

// Run passes over every cluster each metrics.interval until ctx is done. An
// interval of 0 turns the collector off.
func (c *Collector) Run(ctx context.Context) error {
	interval := c.Metrics.Interval.D()
	if interval <= 0 {
		<-ctx.Done()
		return nil
	}
	down := map[string]*cluster.Outage{}
	defer func() {
		fctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
		defer cancel()
		c.flushUsage(fctx)
	}()
	background.Every(ctx, interval, func(ctx context.Context) {
		all := c.Clusters.All()
		errs := c.round(ctx, all, max(interval, 10*time.Second))
		if ctx.Err() != nil {
			return
		}
		for i, cl := range all {
			if down[cl.Name()] == nil {
				down[cl.Name()] = &cluster.Outage{What: "metrics pass"}
			}
			down[cl.Name()].Report(c.log(), errs[i], "cluster", cl.Name())
		}
		c.retention(ctx)
	})
	return nil
}

// passParallel is how many clusters a round passes over at once. A pass
// mostly waits for its cluster's server (0.5 s at 10,000 tenants): one
// cluster after another, a daemon with 100 such clusters took 50 s for a
// round of metrics.interval (15 s), and one cluster slow to answer held
// up every cluster after it. Each pass holds at most one catalog
// connection at a time.
const passParallel = 8

// round passes over the clusters, passParallel at a time, each within
// timeout, and returns each one's error. A cluster whose last health probe
// failed is not measured: its pass would read its tenants from the
// catalog for nothing.
func (c *Collector) round(ctx context.Context, clusters []*cluster.Cluster, timeout time.Duration) []error {
	errs := make([]error, len(clusters))
	var g errgroup.Group
	g.SetLimit(passParallel)
	for i, cl := range clusters {
		if !cl.Answering() {
			errs[i] = fmt.Errorf("cluster %s did not answer its last health probe: not measured", cl.Name())
			continue
		}
		g.Go(func() error {
			pctx, cancel := context.WithTimeout(ctx, timeout)
			defer cancel()
			errs[i] = c.Pass(pctx, cl.Name())
			return nil
		})
	}
	_ = g.Wait()
	return errs
}

// retention deletes old history once an hour (a DELETE that finds nothing
// writes nothing).
func (c *Collector) retention(ctx context.Context) {
	now := c.now()
	if now.Sub(c.lastGC) < time.Hour {
		return
	}
	c.lastGC = now
	if n, err := c.Store.DeleteRollupsBefore(ctx, now.Add(-c.Metrics.HistoryRetention.D())); err != nil {
		c.log().Warn("delete old metrics history", "err", err)
	} else if n > 0 {
		c.log().Info("deleted old metrics history", "rows", n)
	}
	if n, err := c.Store.DeleteUsageBefore(ctx, now.Add(-catalog.UsageRetention)); err != nil {
		c.log().Warn("delete old usage", "err", err)
	} else if n > 0 {
		c.log().Info("deleted old usage", "rows", n)
	}
}

// Pass measures one cluster once: statistics of every tenant, sizes of the
// tenants whose turn it is (and of those near or over their quota), then the
// quota check and, when a minute has ended, one INSERT of the rollups of the
// tenants whose counters changed.
func (c *Collector) Pass(ctx context.Context, clusterName string) error {
	start, began := c.now(), time.Now()
	cl, err := c.Clusters.Get(clusterName)
	if err != nil {
		return err
	}
	st := c.state(clusterName)
	stats := PassStats{At: start}
	defer func() {
		stats.Duration = time.Since(began)
		c.mu.Lock()
		st.lastPass = stats
		c.mu.Unlock()
	}()
	fail := func(err error) error {
		stats.Err = err.Error()
		return err
	}

	rows, err := c.Store.MetricTenants(ctx, clusterName)
	stats.Queries++
	if err != nil {
		return fail(fmt.Errorf("list tenants of %s: %w", clusterName, err))
	}
	var seed map[string]catalog.SizeSample
	if !st.seeded {
		if seed, err = c.Store.LastSizes(ctx, clusterName); err != nil {
			return fail(fmt.Errorf("load last sizes of %s: %w", clusterName, err))
		}
		stats.Queries++
	}

	s, err := sample(ctx, cl, rows, c.sizeTurn(st, rows, start), c.filesDue(st, start), st.passes)
	stats.Queries += s.queries
	if err != nil {
		return fail(err)
	}
	stats.Tenants, stats.Sizes = len(s.counters), len(s.sizes)
	stats.Statistics, stats.SizesTime = s.statistics, s.sizing
	// Usage is a measured tenant's only: a spare's build (its template's
	// files run as its role) is no tenant's CPU.
	byPhysical := make(map[string]string, len(rows))
	for _, r := range rows {
		if measured(r.State) {
			byPhysical[tenant.PhysicalName(r.ID)] = r.ID
		}
	}
	x, q, err := c.readUsage(ctx, cl, st, byPhysical, start)
	stats.UsageQueries += q
	if err != nil {
		return fail(err)
	}

	c.mu.Lock()
	rollups := c.apply(st, rows, s, seed, start)
	c.meterPass(st, rows, s, x, start)
	st.pending = append(st.pending, rollups...)
	if len(st.pending) > pendingMax {
		st.pending = st.pending[len(st.pending)-pendingMax:]
	}
	pending := st.pending
	usage := c.usage(st)
	c.mu.Unlock()

	if len(pending) > 0 {
		stats.Queries++
		if err := c.Store.InsertRollups(ctx, pending); err != nil {
			return fail(fmt.Errorf("write metrics history: %w", err))
		}
		stats.Rollups = len(pending)
		c.mu.Lock()
		st.pending = st.pending[len(pending):]
		c.mu.Unlock()
	}
	q, err = c.writeUsage(ctx, st)
	stats.UsageQueries += q
	if err != nil {
		return fail(err)
	}
	if c.Quota != nil && len(usage) > 0 {
		if err := c.Quota.CheckQuotas(ctx, clusterName, usage); err != nil {
			return fail(fmt.Errorf("quotas on %s: %w", clusterName, err))
		}
	}
	return nil
}

func (c *Collector) state(name string) *clusterState {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.clusters == nil {
		c.clusters = map[string]*clusterState{}
	}
	st, ok := c.clusters[name]
	if !ok {
		st = &clusterState{name: name, tenants: map[string]*tenantState{}, files: -1}
		c.clusters[name] = st
	}
	return st
}

// measured says whether a tenant's data exists and is worth measuring:
// spares and builds are not tenants yet, purging ones are going away.
func measured(state catalog.TenantState) bool {
	switch state {
	case catalog.StateActive, catalog.StateSuspended, catalog.StateDropped:
		return true
	}
	return false
}

// sizeTurn chooses the tenants whose size is sampled in this pass: the next
// ceil(n × interval / size_interval) in a stable round robin, so that each
// tenant's turn comes once per size interval (an idle one, untouched since
// its last size, is passed over until idle_size_interval has gone by since
// it: quiet), plus every tenant whose quota
// state is not ok or whose last size is near its tier's thresholds (they are
// few, and a tenant that deletes its way back under its quota must get its
// rights back within one pass).
func (c *Collector) sizeTurn(st *clusterState, rows []catalog.MetricTenant, now time.Time) []catalog.MetricTenant {
	c.mu.Lock()
	defer c.mu.Unlock()
	var ids []string
	byID := map[string]catalog.MetricTenant{}
	for _, r := range rows {
		if measured(r.State) {
			ids = append(ids, r.ID)
			byID[r.ID] = r
		}
	}
	sort.Strings(ids)
	st.order = ids
	if len(ids) == 0 {
		return nil
	}
	per := 1
	if iv, siv := c.Metrics.Interval.D(), c.Metrics.SizeInterval.D(); iv > 0 && siv > 0 {
		per = int(math.Ceil(float64(len(ids)) * float64(iv) / float64(siv)))
	}
	per = min(max(per, 1), len(ids))
	chosen := map[string]bool{}
	var out []catalog.MetricTenant
	take := func(id string) {
		if !chosen[id] {
			chosen[id] = true
			out = append(out, byID[id])
		}
	}
	start := st.cursor % len(ids)
	for i := 0; i < per; i++ {
		if id := ids[(start+i)%len(ids)]; !c.quiet(st.tenants[id], now) {
			take(id)
		}
	}
	st.cursor = (start + per) % len(ids)
	for _, id := range ids {
		r := byID[id]
		ts := st.tenants[id]
		switch {
		case r.Quota != catalog.QuotaOK:
			take(id)
		case ts == nil:
			// New since the last pass: measured at once. On the first pass
			// every tenant is new; the round robin (and the sizes the catalog
			// remembers) spreads them instead.
			if st.passes > 0 {
				take(id)
			}
		case c.nearThreshold(r.Tier, ts.size):
			take(id)
		}
	}
	return out
}

// quiet: sized, and nothing its clients did shows since (no session open
// at a pass, no client activity in its counters: clientActivity), less
// than idle_size_interval ago. A delta of
// counters read long after the size (a shared database's schema tenants
// are read in turns) counts as activity since it: too often, never too
// rarely.
func (c *Collector) quiet(ts *tenantState, now time.Time) bool {
	idle := c.Metrics.IdleSizeInterval.D()
	return idle > 0 && ts != nil && ts.hasSize && !ts.stirred && now.Sub(ts.sizeAt) < idle
}

// nearThreshold: within 90% of the tier's warning (or quota) size.
func (c *Collector) nearThreshold(tier string, size int64) bool {
	t, ok := c.Tiers[tier]
	if !ok {
		return false
	}
	limit := t.StorageWarn
	if limit <= 0 || (t.StorageQuota > 0 && t.StorageQuota < limit) {
		limit = t.StorageQuota
	}
	return limit > 0 && float64(size) >= 0.9*float64(limit)
}

func (c *Collector) filesDue(st *clusterState, now time.Time) bool {
	c.mu.RLock()
	defer c.mu.RUnlock()
	return st.filesAt.IsZero() || now.Sub(st.filesAt) >= c.Metrics.SizeInterval.D()
}

// apply folds a sample into the in-memory state and returns the rollups of
// the minute that ended (tenants whose counters or size changed only).
// Called with c.mu held.
func (c *Collector) apply(st *clusterState, rows []catalog.MetricTenant, s sampleResult, seed map[string]catalog.SizeSample, now time.Time) []catalog.Rollup {
	if seed != nil {
		st.seeded = true
	}
	st.passes++
	if s.files != nil {
		st.files, st.filesAt = *s.files, now
	}
	minute := now.Truncate(time.Minute)
	byState := map[[2]string]int{}
	live := map[string]bool{}
	var out []catalog.Rollup
	for _, r := range rows {
		byState[[2]string{string(r.State), string(r.Mode)}]++
		if !measured(r.State) {
			continue
		}
		live[r.ID] = true
		ts := st.tenants[r.ID]
		if ts == nil {
			ts = &tenantState{}
			st.tenants[r.ID] = ts
			if sz, ok := seed[r.ID]; ok {
				ts.size, ts.sizeAt, ts.hasSize = sz.Bytes, sz.At, true
				ts.written, ts.hasWritten = sz.Bytes, true
				ts.stirred = true
			}
		}
		ts.meta = r
		ts.conns = s.conns[r.ID]
		ts.passWritten = 0
		// The size is taken after the counters: what they show of this
		// pass's interval is in it; a session open now may change it after.
		_, sized := s.sizes[r.ID]
		if sized {
			ts.size, ts.sizeAt, ts.hasSize = s.sizes[r.ID], now, true
			ts.stirred = false
		}
		ts.stirred = ts.stirred || ts.conns.Total() > 0
		cur, ok := s.counters[r.ID]
		ts.seen = ok
		if !ok || (ts.hasCur && !now.After(ts.curAt)) {
			continue // no statistics, or no time passed since the last sample
		}
		// Rates over the pass interval and the smoothed activity; an interval
		// without client activity counts as idle.
		active := ts.conns.Active > 0
		if ts.hasCur {
			d := cur.sub(ts.cur)
			ts.passWritten = d.RowsWritten
			active = active || clientActivity(r.Mode, d)
			ts.stirred = ts.stirred || (!sized && active)
			if dt := now.Sub(ts.curAt).Seconds(); dt > 0 {
				ts.rates = rates{}
				if active {
					ts.rates = rates{float64(d.Commits) / dt, float64(d.Rollbacks) / dt, float64(d.RowsRead) / dt, float64(d.RowsWritten) / dt}
				}
				inst := ts.rates.commits + ts.rates.rollbacks + ts.rates.rowsRead + ts.rates.rowsWritten + float64(ts.conns.Active)
				a := 1 - math.Exp(-dt/activityTau.Seconds())
				ts.activity += a * (inst - ts.activity)
			}
		}
		// Minute rollups: the activity between the last pass of the previous
		// minute and the last pass of this one, written when the next begins,
		// only if the tenant's clients did something, or its size moved from
		// the one in its history. A tenant that was always idle has no
		// history: its size is known in memory (and sampled again after a
		// restart), so an idle fleet writes nothing at all.
		if ts.hasCur && minute.After(ts.minute) {
			if ts.hasBase {
				sizeMoved := ts.hasSize && ts.hasWritten && ts.size != ts.written
				if ts.minActive || sizeMoved {
					out = append(out, rollup(r, ts.minute, ts.cur.sub(ts.base), ts))
					if ts.hasSize {
						ts.written, ts.hasWritten = ts.size, true
					}
				}
			}
			ts.base, ts.hasBase = ts.cur, true
			ts.minConns, ts.minActive = 0, false
		}
		if !ts.hasCur {
			ts.base, ts.hasBase = cur, true
		}
		ts.minActive = ts.minActive || active
		ts.prev, ts.prevAt = ts.cur, ts.curAt
		ts.cur, ts.curAt, ts.hasCur = cur, now, true
		ts.minute = minute
		ts.minConns = max(ts.minConns, ts.conns.Total())
	}
	for id := range st.tenants {
		if !live[id] {
			delete(st.tenants, id) // purged or gone: forget it
		}
	}
	st.byState = byState
	return out
}

func rollup(r catalog.MetricTenant, minute time.Time, d counters, ts *tenantState) catalog.Rollup {
	x := catalog.Rollup{Tenant: r.ID, Minute: minute, Connections: ts.minConns, RowsRead: d.RowsRead,
		RowsWritten: d.RowsWritten, BlksHit: d.BlksHit, BlksRead: d.BlksRead}
	if ts.hasSize {
		v := ts.size
		x.SizeBytes = &v
	}
	if r.Mode == tenant.ModeDatabase {
		x.Commits, x.Rollbacks, x.TempBytes, x.Deadlocks = ptr(d.Commits), ptr(d.Rollbacks), ptr(d.TempBytes), ptr(d.Deadlocks)
	}
	return x
}

func ptr[T any](v T) *T { return &v }

// usage lists the sized tenants for the quota check. Called with c.mu held.
func (c *Collector) usage(st *clusterState) []Usage {
	out := make([]Usage, 0, len(st.tenants))
	for id, ts := range st.tenants {
		if !ts.hasSize || ts.meta.State != catalog.StateActive {
			continue
		}
		out = append(out, Usage{Tenant: id, Mode: ts.meta.Mode, Database: ts.meta.Database, Tier: ts.meta.Tier,
			SizeBytes: ts.size, SizeAt: ts.sizeAt, Quota: ts.meta.Quota, QuotaSince: ts.meta.QuotaSince, OverSince: ts.meta.OverSince})
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Tenant < out[j].Tenant })
	return out
}

// ErrNoFigures is returned by Tenant when no pass has measured the tenant
// (the collector is off, or the tenant is new, a spare or purged).
var ErrNoFigures = errors.New("no metrics for this tenant yet")

// Tenant returns the current figures of one tenant.
func (c *Collector) Tenant(id string) (Figures, error) {
	c.mu.RLock()
	defer c.mu.RUnlock()
	for name, st := range c.clusters {
		if ts, ok := st.tenants[id]; ok {
			return figures(name, id, ts), nil
		}
	}
	return Figures{}, ErrNoFigures
}

// All returns the figures of every measured tenant.
func (c *Collector) All() map[string]Figures {
	c.mu.RLock()
	defer c.mu.RUnlock()
	out := map[string]Figures{}
	for name, st := range c.clusters {
		for id, ts := range st.tenants {
			out[id] = figures(name, id, ts)
		}
	}
	return out
}

// LastPass returns the last pass over each cluster.
func (c *Collector) LastPass() map[string]PassStats {
	c.mu.RLock()
	defer c.mu.RUnlock()
	out := map[string]PassStats{}
	for name, st := range c.clusters {
		out[name] = st.lastPass
	}
	return out
}

func figures(clusterName, id string, ts *tenantState) Figures {
	f := Figures{Tenant: id, Cluster: clusterName, Mode: ts.meta.Mode, State: ts.meta.State, At: ts.curAt,
		Connections: ts.conns, Activity: ts.activity, Quota: ts.meta.Quota, Export: ts.meta.Export,
		RowsReadPerSec: ts.rates.rowsRead, RowsWrittenPerSec: ts.rates.rowsWritten,
		RowsRead: ts.cur.RowsRead, RowsWritten: ts.cur.RowsWritten, BlocksHit: ts.cur.BlksHit, BlocksRead: ts.cur.BlksRead}
	if ts.hasSize {
		f.SizeBytes, f.SizeAt = ptr(ts.size), ptr(ts.sizeAt)
	}
	if ts.meta.Mode == tenant.ModeDatabase && ts.hasCur {
		f.CommitsPerSec, f.RollbacksPerSec = ptr(ts.rates.commits), ptr(ts.rates.rollbacks)
		f.Commits, f.Rollbacks, f.TempBytes, f.Deadlocks = ptr(ts.cur.Commits), ptr(ts.cur.Rollbacks), ptr(ts.cur.TempBytes), ptr(ts.cur.Deadlocks)
	}
	if total := ts.cur.BlksHit + ts.cur.BlksRead; total > 0 {
		f.HitRatio = ptr(float64(ts.cur.BlksHit) / float64(total))
	}
	return f
}
