package pooler

import (
	"github.com/prometheus/client_golang/prometheus"
)

// Collector exports each pooler's health on /metrics from its last sync
// (a scrape reads memory only). Per-tenant pool series are the tenant
// collector's, under its top-N guard (internal/metrics).
type Collector struct {
	set                                           *Set
	up, entries, skipped, drift, clients, servers *prometheus.Desc
	reloads, restarts, lastSync                   *prometheus.Desc
}

// NewCollector exports the poolers of set.
func NewCollector(set *Set) *Collector {
	c := []string{"cluster"}
	return &Collector{set: set,
		up:       prometheus.NewDesc("pgtenant_pooler_up", "1 when the cluster's PgBouncer answered its last sync.", c, nil),
		entries:  prometheus.NewDesc("pgtenant_pooler_entries", "Tenant entries in the cluster's PgBouncer (spares built with their password included).", c, nil),
		skipped:  prometheus.NewDesc("pgtenant_pooler_skipped_tenants", "Active or suspended tenants left out of the pooler (no SCRAM verifier on their role, or the cluster they live on did not answer).", c, nil),
		drift:    prometheus.NewDesc("pgtenant_pooler_drift", "Differences between the pooler's databases and the catalog after the last sync (want 0).", c, nil),
		clients:  prometheus.NewDesc("pgtenant_pooler_clients", "Clients of every tenant pool by state (active, waiting).", append(c, "state"), nil),
		servers:  prometheus.NewDesc("pgtenant_pooler_server_connections", "Server connections of every tenant pool by state (active, idle).", append(c, "state"), nil),
		reloads:  prometheus.NewDesc("pgtenant_pooler_reloads_total", "RELOADs sent to the cluster's PgBouncer by this daemon.", c, nil),
		restarts: prometheus.NewDesc("pgtenant_pooler_restarts_total", "Times this daemon restarted the cluster's PgBouncer after finding it down.", c, nil),
		lastSync: prometheus.NewDesc("pgtenant_pooler_last_sync_timestamp_seconds", "When the last successful sync of the cluster's PgBouncer ended.", c, nil),
	}
}

// Describe implements prometheus.Collector.
func (c *Collector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{c.up, c.entries, c.skipped, c.drift, c.clients, c.servers, c.reloads, c.restarts, c.lastSync} {
		ch <- d
	}
}

// Collect implements prometheus.Collector.
func (c *Collector) Collect(ch chan<- prometheus.Metric) {
	g := func(d *prometheus.Desc, v float64, l ...string) {
		ch <- prometheus.MustNewConstMetric(d, prometheus.GaugeValue, v, l...)
	}
	for _, f := range c.set.All() {
		s, name := f.Snapshot(), f.Cluster
		up := 0.0
		if s.Up {
			up = 1
		}
		g(c.up, up, name)
		g(c.entries, float64(s.Entries), name)
		g(c.skipped, float64(len(s.Skipped)), name)
		g(c.drift, float64(len(s.Drift)), name)
		var ca, cw, sa, si int
		for _, p := range s.Pools {
			ca, cw, sa, si = ca+p.ClientActive, cw+p.ClientWaiting, sa+p.ServerActive, si+p.ServerIdle
		}
		g(c.clients, float64(ca), name, "active")
		g(c.clients, float64(cw), name, "waiting")
		g(c.servers, float64(sa), name, "active")
		g(c.servers, float64(si), name, "idle")
		ch <- prometheus.MustNewConstMetric(c.reloads, prometheus.CounterValue, float64(s.Reloads), name)
		ch <- prometheus.MustNewConstMetric(c.restarts, prometheus.CounterValue, float64(s.Restarts), name)
		if !s.At.IsZero() {
			g(c.lastSync, float64(s.At.UnixNano())/1e9, name)
		}
	}
}

// TenantPool returns a tenant's pool figures (role: t_<id>) from its
// cluster's pooler's last sync.
func (s *Set) TenantPool(cluster, role string) (Pool, bool) {
	// A moved tenant's pool is in the pooler of its front door, which
	// may be another cluster's.
	fronts := append([]*Front{s.Get(cluster)}, s.All()...)
	for _, f := range fronts {
		if f == nil {
			continue
		}
		f.mu.Lock()
		p, ok := f.snap.Pools[role]
		f.mu.Unlock()
		if ok {
			return p, true
		}
	}
	return Pool{}, false
}
