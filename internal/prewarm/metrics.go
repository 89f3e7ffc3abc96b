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
	counts, err := c.s.Store.PrewarmCounts(ctx)
	if err != nil {
		ch <- prometheus.MustNewConstMetric(c.up, prometheus.GaugeValue, 0)
		return
	}
	type nodeKey struct{ cluster, node string }
	buffer, os := map[nodeKey]int64{}, map[nodeKey]int64{}
	for _, n := range counts {
		k := nodeKey{n.Cluster, n.Node}
		ch <- prometheus.MustNewConstMetric(c.tenants, prometheus.GaugeValue, float64(n.Tenants), k.cluster, k.node, n.State)
		buffer[k] += n.BlocksBuffer
		os[k] += n.BlocksOS
	}
	for k, n := range buffer {
		ch <- prometheus.MustNewConstMetric(c.blocks, prometheus.GaugeValue, float64(n), k.cluster, k.node, "buffer")
		ch <- prometheus.MustNewConstMetric(c.blocks, prometheus.GaugeValue, float64(os[k]), k.cluster, k.node, "os")
	}
	ch <- prometheus.MustNewConstMetric(c.up, prometheus.GaugeValue, 1)
}
