package metrics

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgtenant/pgtenant/internal/catalog"
	"github.com/pgtenant/pgtenant/internal/cluster"
	"github.com/pgtenant/pgtenant/internal/pooler"
	"github.com/pgtenant/pgtenant/internal/tenant"
)

// Usage metering (docs/operations/usage.md). Each pass adds what it saw
// since the previous one to the current hour of each tenant, in memory:
// rows written (the same deltas as the rollups), connection-seconds
// (sessions seen × seconds since the previous pass), CPU seconds
// (pg_stat_kcache, per role) and the front door's bytes (PgBouncer's SHOW
// STATS, per entry). When an hour has ended, the tenants that did something
// in it are written in one INSERT; the others cost nothing. Sizes are
// written only when a sampled size differs from the last one written:
// byte-hours are computed from those steps when usage is read.

// kcacheRecheck: a cluster without pg_stat_kcache is looked at again this
// often (the operator may install it and restart the server).
const kcacheRecheck = time.Hour

// meter is one cluster's usage state.
type meter struct {
	io sync.Mutex // held by the pass that reads the cluster's usage sources

	// Read by readUsage (under io).
	kcacheFn      string // schema-qualified pg_stat_kcache(), "" when absent
	kcacheChecked time.Time
	admin         *pooler.Admin // the pooler's console, kept between passes
	warned        map[string]bool

	// Under the collector's mu.
	hour      time.Time // the hour being accumulated
	lastAt    time.Time // the previous pass
	acc       map[string]*catalog.UsageActivity
	cpuSeen   bool // pg_stat_kcache was read this hour
	frontSeen bool // the front door was read this hour
	cpu       map[string]float64
	front     map[string][2]int64 // entry → total_received, total_sent
	lastSize  map[string]int64    // last size written, by tenant
	seeded    bool
	hours     []catalog.UsageActivity // to write
	sizes     []catalog.UsageSize
	ended     []string
	endedAt   time.Time
}

// QueryCounter hands over, and forgets, the statements tenants ran on the
// analytics port (analytics.Service).
type QueryCounter interface {
	TakeQueries(ids []string) map[string]int64
}

// usageSample is what one pass read from the usage sources: nil maps for
// a source that was not read.
type usageSample struct {
	cpu       map[string]float64  // tenant → cumulative CPU seconds
	front     map[string][2]int64 // pooler entry → cumulative bytes in, out
	seed      map[string]int64    // last sizes written, on the first pass
	analytics map[string]int64    // tenant → analytics statements since the previous pass
}

// readUsage reads CPU (pg_stat_kcache) and the front door's bytes (SHOW
// STATS) of one cluster. A source that fails is left out of this pass
// (logged once): the pass itself goes on.
func (c *Collector) readUsage(ctx context.Context, cl *cluster.Cluster, st *clusterState, byPhysical map[string]string, now time.Time) (usageSample, int, error) {
	m := &st.meter
	m.io.Lock()
	defer m.io.Unlock()
	var x usageSample
	queries := 0
	c.mu.RLock()
	seeded := m.seeded
	c.mu.RUnlock()
	if !seeded {
		seed, err := c.Store.LastUsageSizes(ctx, cl.Name())
		queries++
		if err != nil {
			return x, queries, fmt.Errorf("load last usage sizes of %s: %w", cl.Name(), err)
		}
		x.seed = seed
	}
	admin, err := cl.Admin(ctx)
	if err != nil {
		return x, queries, err
	}
	if m.kcacheFn == "" && (m.kcacheChecked.IsZero() || now.Sub(m.kcacheChecked) >= kcacheRecheck) {
		m.kcacheChecked = now
		fn, q, err := findKcache(ctx, admin)
		queries += q
		if err != nil {
			c.warnOnce(m, "kcache", "pg_stat_kcache: CPU seconds not measured", "cluster", cl.Name(), "err", err)
		}
		m.kcacheFn = fn
	}
	if m.kcacheFn != "" {
		queries++
		if x.cpu, err = readKcache(ctx, admin, m.kcacheFn, byPhysical); err != nil {
			c.warnOnce(m, "kcache-read", "read pg_stat_kcache: CPU seconds not measured", "cluster", cl.Name(), "err", err)
			m.kcacheFn, x.cpu = "", nil
		}
	}
	if c.Analytics != nil {
		ids := make([]string, 0, len(byPhysical))
		for _, id := range byPhysical {
			ids = append(ids, id)
		}
		x.analytics = c.Analytics.TakeQueries(ids)
	}
	if f := c.Poolers.Get(cl.Name()); f != nil {
		if x.front, err = m.readFront(ctx, f); err != nil {
			c.warnOnce(m, "front", "pooler SHOW STATS: front door bytes not measured", "cluster", cl.Name(), "err", err)
		}
	}
	return x, queries, nil
}

func (c *Collector) warnOnce(m *meter, what, msg string, args ...any) {
	if m.warned == nil {
		m.warned = map[string]bool{}
	}
	if !m.warned[what] {
		m.warned[what] = true
		c.log().Warn(msg, args...)
	}
}

// findKcache finds pg_stat_kcache in the admin (maintenance) database,
// creating it there, with pg_stat_statements which it needs, in
// pgtenant's own schema that nobody else may use (the maintenance
// database is no tenant's either) when the server has loaded its library
// but the extension is not created yet: once per cluster. "" when the
// server cannot measure CPU (the library is not loaded).
func findKcache(ctx context.Context, admin *pgxpool.Pool) (string, int, error) {
	schema, err := cluster.ExtensionSchema(ctx, admin, "pg_stat_kcache")
	if err == nil {
		return schema + ".pg_stat_kcache", 1, nil
	}
	if !errors.Is(err, cluster.ErrNotFound) {
		return "", 1, err
	}
	var loaded bool
	if err := admin.QueryRow(ctx, `SELECT 'pg_stat_kcache' = ANY(pg_catalog.string_to_array(pg_catalog.replace(
		pg_catalog.current_setting('shared_preload_libraries'), ' ', ''), ','))`).Scan(&loaded); err != nil {
		return "", 2, cluster.Classify(err)
	}
	if !loaded {
		return "", 2, nil
	}
	for _, ext := range []string{"pg_stat_statements", "pg_stat_kcache"} {
		if err := cluster.InstallExtension(ctx, admin, ext, "the maintenance database"); err != nil {
			return "", 4, err
		}
	}
	if schema, err = cluster.ExtensionSchema(ctx, admin, "pg_stat_kcache"); err != nil {
		return "", 5, err
	}
	return schema + ".pg_stat_kcache", 5, nil
}

// readKcache sums each tenant role's CPU time (user + system, planning and
// execution) over pg_stat_kcache's entries: one query over a view in
// shared memory, bounded by pg_stat_statements.max, not by the tenants.
// Only top-level statements: a nested one's time is in its caller's.
func readKcache(ctx context.Context, admin *pgxpool.Pool, fn string, byPhysical map[string]string) (map[string]float64, error) {
	rows, err := admin.Query(ctx, `
		SELECT r.rolname, pg_catalog.sum(k.exec_user_time + k.exec_system_time
			+ coalesce(k.plan_user_time, 0) + coalesce(k.plan_system_time, 0))::float8
		FROM `+fn+`() k JOIN pg_catalog.pg_roles r ON r.oid = k.userid
		WHERE k.top AND r.rolname LIKE 't\_%'
		GROUP BY r.rolname`)
	if err != nil {
		return nil, cluster.Classify(err)
	}
	defer rows.Close()
	out := map[string]float64{}
	for rows.Next() {
		var role string
		var secs float64
		if err := rows.Scan(&role, &secs); err != nil {
			return nil, err
		}
		if id, ok := byPhysical[tenant.TenantRole(role)]; ok {
			out[id] += secs // its own role's and its extra logins'
		}
	}
	return out, cluster.Classify(rows.Err())
}

// readFront reads SHOW STATS on the cluster's pooler over a console
// session kept between passes (dialled again after a failure).
func (m *meter) readFront(ctx context.Context, f *pooler.Front) (map[string][2]int64, error) {
	if m.admin == nil {
		pw, err := f.Proc.AdminPassword()
		if err != nil {
			return nil, err
		}
		if m.admin, err = pooler.DialAdmin(ctx, f.Addr(), pooler.AdminUser, pw); err != nil {
			return nil, err
		}
	}
	rows, err := m.admin.Show(ctx, "STATS")
	if err != nil {
		m.admin.Close()
		m.admin = nil
		return nil, err
	}
	out := make(map[string][2]int64, len(rows))
	for _, r := range rows {
		if !strings.HasPrefix(r["database"], tenant.Prefix) {
			continue // the console itself
		}
		in, err1 := strconv.ParseInt(r["total_received"], 10, 64)
		sent, err2 := strconv.ParseInt(r["total_sent"], 10, 64)
		if err1 == nil && err2 == nil {
			out[r["database"]] = [2]int64{in, sent}
		}
	}
	return out, nil
}

func (m *meter) close() {
	m.io.Lock()
	defer m.io.Unlock()
	if m.admin != nil {
		m.admin.Close()
		m.admin = nil
	}
}

// meterPass folds a pass into the cluster's current hour, and queues the
// hour that ended (if one did) and the sizes that changed for writing.
// Called with c.mu held, after apply.
func (c *Collector) meterPass(st *clusterState, rows []catalog.MetricTenant, s sampleResult, x usageSample, now time.Time) {
	m := &st.meter
	if x.seed != nil {
		m.lastSize, m.seeded = x.seed, true
	}
	if m.lastSize == nil {
		m.lastSize = map[string]int64{}
	}
	hour := now.Truncate(time.Hour)
	if !m.hour.IsZero() && hour.After(m.hour) {
		m.hours = append(m.hours, m.ended1(st.name)...)
	}
	if m.hour.IsZero() || hour.After(m.hour) {
		m.hour = hour
	}
	var dt float64
	if !m.lastAt.IsZero() && now.After(m.lastAt) {
		dt = now.Sub(m.lastAt).Seconds()
	}
	m.lastAt = now
	if m.acc == nil {
		m.acc = map[string]*catalog.UsageActivity{}
	}
	acc := func(id string) *catalog.UsageActivity {
		a := m.acc[id]
		if a == nil {
			a = &catalog.UsageActivity{Tenant: id, Cluster: st.name}
			m.acc[id] = a
		}
		return a
	}

	live := map[string]bool{}
	for _, r := range rows {
		ts := st.tenants[r.ID]
		if ts == nil || !measured(r.State) {
			continue
		}
		live[r.ID] = true
		if ts.passWritten > 0 || ts.conns.Total() > 0 {
			a := acc(r.ID)
			a.RowsWritten += ts.passWritten
			a.ConnectionSeconds += float64(ts.conns.Total()) * dt
		}
		if sz, ok := s.sizes[r.ID]; ok {
			if last, had := m.lastSize[r.ID]; !had || last != sz {
				m.sizes = append(m.sizes, catalog.UsageSize{Tenant: r.ID, At: now, Bytes: sz})
				m.lastSize[r.ID] = sz
			}
		}
	}
	// Tenants gone from this cluster whose size was recorded: purged (a
	// 0 is written for them) or moved (EndUsageSizes leaves those alone).
	for id, sz := range m.lastSize {
		if !live[id] {
			if sz != 0 {
				m.ended = append(m.ended, id)
				m.endedAt = now
			}
			delete(m.lastSize, id)
		}
	}

	if x.cpu != nil {
		m.cpuSeen = true
		for id, cur := range x.cpu {
			if prev, ok := m.cpu[id]; ok && cur > prev {
				acc(id).CPUSeconds = ptr(value(acc(id).CPUSeconds) + cur - prev)
			}
		}
		m.cpu = x.cpu
	}
	for id, n := range x.analytics {
		acc(id).AnalyticsQueries += n
	}
	if x.front != nil {
		m.frontSeen = true
		for entry, cur := range x.front {
			// PgBouncer lists a database in SHOW STATS once it has a pool
			// (its first client): an entry that appears after the first
			// read counts from 0; on the first read, totals are the baseline.
			prev, ok := m.front[entry]
			if !ok && m.front == nil {
				continue
			}
			var d [2]int64
			for i := range d {
				d[i] = cur[i] - prev[i]
				if d[i] < 0 {
					d[i] = cur[i] // the pooler restarted: its totals began again
				}
			}
			if id, ok := tenant.IDFromEntry(entry); ok && (d[0] > 0 || d[1] > 0) {
				a := acc(id)
				a.BytesIn, a.BytesOut = ptr(value(a.BytesIn)+d[0]), ptr(value(a.BytesOut)+d[1])
			}
		}
		m.front = x.front
	}
}

// ended1 returns the accumulated hour's rows (tenants that did something
// only) and starts a new hour. Called with the collector's mu held.
func (m *meter) ended1(clusterName string) []catalog.UsageActivity {
	var out []catalog.UsageActivity
	for _, a := range m.acc {
		if a.Zero() {
			continue
		}
		x := *a
		x.Hour, x.Cluster = m.hour, clusterName
		// Measured this hour, nothing seen: 0, not unknown.
		if m.cpuSeen && x.CPUSeconds == nil {
			x.CPUSeconds = ptr(0.0)
		}
		if m.frontSeen && x.BytesIn == nil {
			x.BytesIn, x.BytesOut = ptr(int64(0)), ptr(int64(0))
		}
		out = append(out, x)
	}
	m.acc = map[string]*catalog.UsageActivity{}
	m.cpuSeen, m.frontSeen = false, false
	return out
}

func value[T int64 | float64](p *T) T {
	if p == nil {
		return 0
	}
	return *p
}

// writeUsage writes what meterPass queued: ended hours, size changes and
// purges. What fails stays queued for the next pass (bounded, like the
// rollups).
func (c *Collector) writeUsage(ctx context.Context, st *clusterState) (int, error) {
	m := &st.meter
	c.mu.Lock()
	hours, sizes, ended, endedAt := m.hours, m.sizes, m.ended, m.endedAt
	c.mu.Unlock()
	queries := 0
	if len(hours) > 0 {
		queries++
		if err := c.Store.InsertUsageActivity(ctx, hours); err != nil {
			return queries, fmt.Errorf("write usage hours: %w", err)
		}
	}
	if len(sizes) > 0 {
		queries++
		if err := c.Store.InsertUsageSizes(ctx, sizes); err != nil {
			return queries, fmt.Errorf("write usage sizes: %w", err)
		}
	}
	if len(ended) > 0 {
		queries++
		if err := c.Store.EndUsageSizes(ctx, ended, endedAt); err != nil {
			return queries, fmt.Errorf("end usage sizes: %w", err)
		}
	}
	c.mu.Lock()
	m.hours, m.sizes, m.ended = trimQueued(m.hours, len(hours)), trimQueued(m.sizes, len(sizes)), trimQueued(m.ended, len(ended))
	c.mu.Unlock()
	return queries, nil
}

// trimQueued drops the n written items of a queue and bounds what is
// left while the catalog does not answer.
func trimQueued[T any](q []T, n int) []T {
	q = q[n:]
	if len(q) > pendingMax {
		q = q[len(q)-pendingMax:]
	}
	if len(q) == 0 {
		return nil
	}
	return q
}

// flushUsage writes every cluster's current, unfinished hour (when the
// collector stops): a daemon started again in the same hour writes its
// own part of it later, and of the two the larger figures are kept.
func (c *Collector) flushUsage(ctx context.Context) {
	c.mu.Lock()
	var sts []*clusterState
	for _, st := range c.clusters {
		st.meter.hours = append(st.meter.hours, st.meter.ended1(st.name)...)
		sts = append(sts, st)
	}
	c.mu.Unlock()
	for _, st := range sts {
		if _, err := c.writeUsage(ctx, st); err != nil {
			c.log().Warn("write usage at stop", "cluster", st.name, "err", err)
		}
		st.meter.close()
	}
}
