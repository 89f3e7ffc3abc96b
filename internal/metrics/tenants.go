package metrics

import (
	"github.com/prometheus/client_golang/prometheus"

	"github.com/pgtenant/pgtenant/internal/catalog"
	"github.com/pgtenant/pgtenant/internal/pooler"
	"github.com/pgtenant/pgtenant/internal/tenant"
)

// TenantCollector exports the collector's in-memory figures on /metrics: a
// scrape reads memory only. Fleet series (tenants by state and mode,
// relation files, the collector's own passes) cover every tenant; per-tenant
// series are limited to the TopN most active tenants plus the opted-in ones,
// so that a fleet of 10,000 tenants does not become 100,000 series.
type TenantCollector struct {
	c    *Collector
	topN int
	// Pools, when set, adds each exported tenant's pool figures from its
	// cluster's pooler (SHOW POOLS of the pooler's last sync).
	Pools *pooler.Set

	tenants, files, quotaStates, passSeconds, passParts, passQueries, passTime, omitted *prometheus.Desc
	size, conns, xacts, rowsRead, rowsWritten, blksHit, blksRead, temp, deadlocks       *prometheus.Desc
	activity, quota                                                                     *prometheus.Desc
	poolClients, poolServers, poolMaxWait                                               *prometheus.Desc
}

// NewTenantCollector exports c's figures with per-tenant series for the topN
// most active tenants plus the opted-in ones.
func NewTenantCollector(c *Collector, topN int) *TenantCollector {
	tl := []string{"cluster", "tenant", "mode"}
	return &TenantCollector{
		c:           c,
		topN:        topN,
		tenants:     prometheus.NewDesc("pgtenant_tenants", "Tenants by state and mode (spares included as state spare/building).", []string{"cluster", "state", "mode"}, nil),
		files:       prometheus.NewDesc("pgtenant_cluster_relation_files", "Files under base/ of the cluster's primary, sampled once per metrics.size_interval.", []string{"cluster"}, nil),
		quotaStates: prometheus.NewDesc("pgtenant_tenants_quota", "Measured tenants by storage quota state.", []string{"cluster", "state"}, nil),
		passSeconds: prometheus.NewDesc("pgtenant_metrics_pass_duration_seconds", "Duration of the collector's last pass over the cluster.", []string{"cluster"}, nil),
		passParts:   prometheus.NewDesc("pgtenant_metrics_pass_part_seconds", "Time of the collector's last pass over the cluster spent on its statistics and on its sizes.", []string{"cluster", "part"}, nil),
		passQueries: prometheus.NewDesc("pgtenant_metrics_pass_queries", "SQL statements the collector's last pass over the cluster sent (constant in the number of tenants).", []string{"cluster"}, nil),
		passTime:    prometheus.NewDesc("pgtenant_metrics_pass_timestamp_seconds", "When the collector's last pass over the cluster started.", []string{"cluster"}, nil),
		omitted:     prometheus.NewDesc("pgtenant_tenant_series_omitted", "Measured tenants without per-tenant series (outside the top N and not opted in).", []string{"cluster"}, nil),
		size:        prometheus.NewDesc("pgtenant_tenant_size_bytes", "Tenant size (database, or the schema's relations), sampled once per metrics.size_interval.", tl, nil),
		conns:       prometheus.NewDesc("pgtenant_tenant_connections", "Tenant sessions by state.", append(tl, "state"), nil),
		xacts:       prometheus.NewDesc("pgtenant_tenant_transactions_total", "Transactions of a database tenant by result (commit, rollback).", append(tl, "result"), nil),
		rowsRead:    prometheus.NewDesc("pgtenant_tenant_rows_read_total", "Rows read by the tenant's scans.", tl, nil),
		rowsWritten: prometheus.NewDesc("pgtenant_tenant_rows_written_total", "Rows inserted, updated and deleted by the tenant.", tl, nil),
		blksHit:     prometheus.NewDesc("pgtenant_tenant_blocks_hit_total", "Blocks the tenant found in shared buffers.", tl, nil),
		blksRead:    prometheus.NewDesc("pgtenant_tenant_blocks_read_total", "Blocks the tenant read from the OS.", tl, nil),
		temp:        prometheus.NewDesc("pgtenant_tenant_temp_bytes_total", "Bytes a database tenant wrote to temporary files.", tl, nil),
		deadlocks:   prometheus.NewDesc("pgtenant_tenant_deadlocks_total", "Deadlocks detected in a database tenant.", tl, nil),
		activity:    prometheus.NewDesc("pgtenant_tenant_activity", "Smoothed (rows read + written + transactions) per second plus active sessions: what ranks tenants.", tl, nil),
		quota:       prometheus.NewDesc("pgtenant_tenant_quota_state", "1 for the tenant's current storage quota state (ok, warning, grace, enforced).", append(tl, "state"), nil),
		poolClients: prometheus.NewDesc("pgtenant_tenant_pool_clients", "The tenant's clients in its pooler by state: active (cl_active) or waiting for a server connection (cl_waiting).", append(tl, "state"), nil),
		poolServers: prometheus.NewDesc("pgtenant_tenant_pool_server_connections", "The server connections of the tenant's pool by state: active (sv_active) or idle (sv_idle + sv_used).", append(tl, "state"), nil),
		poolMaxWait: prometheus.NewDesc("pgtenant_tenant_pool_maxwait_seconds", "How long the tenant's oldest waiting client has waited for a server connection (maxwait).", tl, nil),
	}
}

// Describe implements prometheus.Collector.
func (t *TenantCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{t.tenants, t.files, t.quotaStates, t.passSeconds, t.passParts, t.passQueries, t.passTime, t.omitted,
		t.size, t.conns, t.xacts, t.rowsRead, t.rowsWritten, t.blksHit, t.blksRead, t.temp, t.deadlocks, t.activity, t.quota,
		t.poolClients, t.poolServers, t.poolMaxWait} {
		ch <- d
	}
}

// Collect implements prometheus.Collector.
func (t *TenantCollector) Collect(ch chan<- prometheus.Metric) {
	c := t.c
	c.mu.RLock()
	defer c.mu.RUnlock()
	gauge := func(d *prometheus.Desc, v float64, l ...string) {
		ch <- prometheus.MustNewConstMetric(d, prometheus.GaugeValue, v, l...)
	}
	counter := func(d *prometheus.Desc, v float64, l ...string) {
		ch <- prometheus.MustNewConstMetric(d, prometheus.CounterValue, v, l...)
	}
	top := topTenants{n: t.topN}
	var exported []ranked
	omitted := map[string]int{}
	for name, st := range c.clusters {
		for k, n := range st.byState {
			gauge(t.tenants, float64(n), name, k[0], k[1])
		}
		if st.files >= 0 && !st.filesAt.IsZero() {
			gauge(t.files, float64(st.files), name)
		}
		if !st.lastPass.At.IsZero() {
			gauge(t.passSeconds, st.lastPass.Duration.Seconds(), name)
			gauge(t.passParts, st.lastPass.Statistics.Seconds(), name, "statistics")
			gauge(t.passParts, st.lastPass.SizesTime.Seconds(), name, "sizes")
			gauge(t.passQueries, float64(st.lastPass.Queries), name)
			gauge(t.passTime, float64(st.lastPass.At.UnixNano())/1e9, name)
		}
		var quotas [4]int // ok, warning, grace, enforced
		for id, ts := range st.tenants {
			switch ts.meta.Quota {
			case catalog.QuotaWarning:
				quotas[1]++
			case catalog.QuotaGrace:
				quotas[2]++
			case catalog.QuotaEnforced:
				quotas[3]++
			default:
				quotas[0]++
			}
			r := ranked{name, id, ts}
			top.offer(r)
			if ts.meta.Export {
				exported = append(exported, r)
			}
		}
		omitted[name] = len(st.tenants)
		for i, q := range []string{catalog.QuotaOK, catalog.QuotaWarning, catalog.QuotaGrace, catalog.QuotaEnforced} {
			gauge(t.quotaStates, float64(quotas[i]), name, q)
		}
	}
	// The guard: the top N by smoothed activity (ties by id, so the choice is
	// stable), plus every opted-in tenant.
	shown := top.items
	for _, r := range exported {
		if !top.holds(r) {
			shown = append(shown, r)
		}
	}
	for _, r := range shown {
		omitted[r.cluster]--
		ts, l := r.ts, []string{r.cluster, r.id, string(r.ts.meta.Mode)}
		if ts.hasSize {
			gauge(t.size, float64(ts.size), l...)
		}
		gauge(t.conns, float64(ts.conns.Active), append(l, "active")...)
		gauge(t.conns, float64(ts.conns.Idle), append(l, "idle")...)
		gauge(t.conns, float64(ts.conns.IdleInTransaction), append(l, "idle_in_transaction")...)
		gauge(t.activity, ts.activity, l...)
		gauge(t.quota, 1, append(l, ts.meta.Quota)...)
		if p, ok := t.Pools.TenantPool(r.cluster, tenant.PhysicalName(r.id)); ok {
			gauge(t.poolClients, float64(p.ClientActive), append(l, "active")...)
			gauge(t.poolClients, float64(p.ClientWaiting), append(l, "waiting")...)
			gauge(t.poolServers, float64(p.ServerActive), append(l, "active")...)
			gauge(t.poolServers, float64(p.ServerIdle), append(l, "idle")...)
			gauge(t.poolMaxWait, p.MaxWait.Seconds(), l...)
		}
		if !ts.hasCur {
			continue
		}
		counter(t.rowsRead, float64(ts.cur.RowsRead), l...)
		counter(t.rowsWritten, float64(ts.cur.RowsWritten), l...)
		counter(t.blksHit, float64(ts.cur.BlksHit), l...)
		counter(t.blksRead, float64(ts.cur.BlksRead), l...)
		if ts.meta.Mode == tenant.ModeDatabase {
			counter(t.xacts, float64(ts.cur.Commits), append(l, "commit")...)
			counter(t.xacts, float64(ts.cur.Rollbacks), append(l, "rollback")...)
			counter(t.temp, float64(ts.cur.TempBytes), l...)
			counter(t.deadlocks, float64(ts.cur.Deadlocks), l...)
		}
	}
	for name, n := range omitted {
		gauge(t.omitted, float64(n), name)
	}
}

// ranked is a measured tenant as the guard ranks it.
type ranked struct {
	cluster, id string
	ts          *tenantState
}

// before says whether a ranks ahead of b: more active, then by id.
func (a ranked) before(b ranked) bool {
	if a.ts.activity != b.ts.activity {
		return a.ts.activity > b.ts.activity
	}
	return a.id < b.id
}

// topTenants keeps the n tenants that rank first of those offered, in a
// heap whose root is the last of them: a scrape of a million measured
// tenants costs their walk and log n per tenant, not a sort of them all
// (1.97 s and 197 MB a scrape).
type topTenants struct {
	n     int
	items []ranked
}

func (h *topTenants) offer(r ranked) {
	switch {
	case h.n <= 0:
	case len(h.items) < h.n:
		h.items = append(h.items, r)
		h.up(len(h.items) - 1)
	case r.before(h.items[0]):
		h.items[0] = r
		h.down(0)
	}
}

// holds says whether r is among the n kept.
func (h *topTenants) holds(r ranked) bool {
	return len(h.items) > 0 && (len(h.items) < h.n || !h.items[0].before(r))
}

// The heap orders by "ranks after": the root is the one to evict first.
func (h *topTenants) after(i, j int) bool { return h.items[j].before(h.items[i]) }

func (h *topTenants) up(i int) {
	for i > 0 {
		p := (i - 1) / 2
		if !h.after(i, p) {
			return
		}
		h.items[i], h.items[p] = h.items[p], h.items[i]
		i = p
	}
}

func (h *topTenants) down(i int) {
	for {
		l, m := 2*i+1, i
		if l < len(h.items) && h.after(l, m) {
			m = l
		}
		if r := l + 1; r < len(h.items) && h.after(r, m) {
			m = r
		}
		if m == i {
			return
		}
		h.items[i], h.items[m] = h.items[m], h.items[i]
		i = m
	}
}
