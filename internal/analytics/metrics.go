package analytics

import (
	"context"
	"os"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/prometheus/client_golang/prometheus"
)

// Collector exports the mirrors this daemon runs (lag, applied rows, file
// size), every analytics slot's retained WAL (one query per cluster) and
// what the analytics port refused.
type Collector struct {
	s                                          *Service
	lagBytes, lagSeconds, rows, size, retained *prometheus.Desc
}

// NewCollector returns the mirrors' collector.
func NewCollector(s *Service) *Collector {
	return &Collector{s: s,
		lagBytes:   prometheus.NewDesc("pgtenant_analytics_lag_bytes", "WAL of the tenant received by its mirror and not yet applied.", []string{"tenant"}, nil),
		lagSeconds: prometheus.NewDesc("pgtenant_analytics_lag_seconds", "Age of the oldest commit of the tenant not yet in its mirror (0: caught up).", []string{"tenant"}, nil),
		rows:       prometheus.NewDesc("pgtenant_analytics_applied_rows_total", "Rows copied and changes applied to the tenant's mirror (rate: applied rows/s).", []string{"tenant"}, nil),
		size:       prometheus.NewDesc("pgtenant_analytics_mirror_bytes", "Size of the tenant's DuckDB file (and its WAL).", []string{"tenant"}, nil),
		retained:   prometheus.NewDesc("pgtenant_analytics_slot_retained_wal_bytes", "WAL the primary keeps for a mirror's slot.", []string{"cluster", "slot", "wal_status"}, nil),
	}
}

// Describe implements prometheus.Collector.
func (c *Collector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{c.lagBytes, c.lagSeconds, c.rows, c.size, c.retained} {
		ch <- d
	}
	if c.s.refusals != nil {
		c.s.refusals.Describe(ch)
	}
}

// Collect implements prometheus.Collector.
func (c *Collector) Collect(ch chan<- prometheus.Metric) {
	s := c.s
	if s.refusals != nil {
		s.refusals.Collect(ch)
	}
	s.mu.Lock()
	mirrors := make(map[string]*mirror, len(s.mirrors))
	for id, m := range s.mirrors {
		mirrors[id] = m
	}
	s.mu.Unlock()
	for id := range mirrors {
		p, _ := s.Progress(id)
		lag, secs, rows := p.LagBytes, p.LagSeconds, p.Rows
		var size int64
		for _, p := range []string{s.File(id), s.File(id) + ".wal"} {
			if fi, err := os.Stat(p); err == nil {
				size += fi.Size()
			}
		}
		ch <- prometheus.MustNewConstMetric(c.lagBytes, prometheus.GaugeValue, float64(lag), id)
		ch <- prometheus.MustNewConstMetric(c.lagSeconds, prometheus.GaugeValue, secs, id)
		ch <- prometheus.MustNewConstMetric(c.rows, prometheus.CounterValue, float64(rows), id)
		ch <- prometheus.MustNewConstMetric(c.size, prometheus.GaugeValue, float64(size), id)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	for _, cl := range s.Clusters.All() {
		// Not a cluster whose last probe failed: the scrape would wait on
		// each (199 refused connections were ~450 ms of every scrape in
		// bench density's simulated fleet; a host that drops packets
		// would take the whole timeout). The cluster collector says it is down.
		if !cl.Answering() {
			continue
		}
		admin, err := cl.Admin(ctx)
		if err != nil {
			continue
		}
		rows, err := admin.Query(ctx, `SELECT slot_name::text, coalesce(wal_status, ''),
			coalesce(pg_catalog.pg_wal_lsn_diff(pg_catalog.pg_current_wal_lsn(), restart_lsn), 0)::int8
			FROM pg_catalog.pg_replication_slots WHERE slot_name LIKE 'pgt\_analytics\_%'`)
		if err != nil {
			continue
		}
		var slot, status string
		var bytes int64
		_, _ = pgx.ForEachRow(rows, []any{&slot, &status, &bytes}, func() error {
			ch <- prometheus.MustNewConstMetric(c.retained, prometheus.GaugeValue, float64(bytes), cl.Name(), slot, status)
			return nil
		})
	}
}
