package prewarm

import (
	"context"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// Collector exports the prewarm state of the fleet: tenants by the result of
// their last prewarm on each node, and the blocks those prewarms loaded. One
// catalog query per scrape, aggregated per cluster and node (per-tenant
// figures are in `tenant show` and the API).
type Collector struct {
	s       *Service
	tenants *prometheus.Desc
	blocks  *prometheus.Desc
	up      *prometheus.Desc
}

// NewCollector returns the prewarm collector of s.
func NewCollector(s *Service) *Collector {
	return &Collector{
		s: s,
		tenants: prometheus.NewDesc("pgtenant_prewarm_tenants",
			"Tenants by the result of their last prewarm on a node (done, skipped, failed).",
			[]string{"cluster", "node", "state"}, nil),
		blocks: prometheus.NewDesc("pgtenant_prewarm_blocks",
			"Blocks the last prewarm of each tenant loaded, into shared_buffers (target buffer) or the OS cache (target os).",
			[]string{"cluster", "node", "target"}, nil),
		up: prometheus.NewDesc("pgtenant_prewarm_up", "1 if the catalog answered the prewarm state query.", nil, nil),
	}
}

// Describe implements prometheus.Collector.
func (c *Collector) Describe(ch chan<- *prometheus.Desc) {
	ch <- c.tenants
	ch <- c.blocks
	ch <- c.up
}

// Collect implements prometheus.Collector.
func (c *Collector) Collect(ch chan<- prometheus.Metric) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	rows, err := c.s.Store.Pool().Query(ctx, `SELECT t.cluster, p.node, p.state, count(*), sum(p.blocks_buffer), sum(p.blocks_os)
		FROM prewarm_tenants p JOIN tenants t ON t.id = p.tenant GROUP BY 1, 2, 3`)
	if err != nil {
		ch <- prometheus.MustNewConstMetric(c.up, prometheus.GaugeValue, 0)
		return
	}
	defer rows.Close()
	type nodeKey struct{ cluster, node string }
	buffer, os := map[nodeKey]int64{}, map[nodeKey]int64{}
	for rows.Next() {
		var k nodeKey
		var state string
		var n, inBuffer, inOS int64
		if err := rows.Scan(&k.cluster, &k.node, &state, &n, &inBuffer, &inOS); err != nil {
			ch <- prometheus.MustNewConstMetric(c.up, prometheus.GaugeValue, 0)
			return
		}
		ch <- prometheus.MustNewConstMetric(c.tenants, prometheus.GaugeValue, float64(n), k.cluster, k.node, state)
		buffer[k] += inBuffer
		os[k] += inOS
	}
	if rows.Err() != nil {
		ch <- prometheus.MustNewConstMetric(c.up, prometheus.GaugeValue, 0)
		return
	}
	for k, n := range buffer {
		ch <- prometheus.MustNewConstMetric(c.blocks, prometheus.GaugeValue, float64(n), k.cluster, k.node, "buffer")
		ch <- prometheus.MustNewConstMetric(c.blocks, prometheus.GaugeValue, float64(os[k]), k.cluster, k.node, "os")
	}
	ch <- prometheus.MustNewConstMetric(c.up, prometheus.GaugeValue, 1)
}
