// Package metrics exports pgtenant's Prometheus metrics. Cluster series come
// from the monitor's last probe, so a scrape does no I/O against the clusters.
package metrics

import (
	"github.com/prometheus/client_golang/prometheus"

	"github.com/pgtenant/pgtenant/internal/cluster"
)

// ClusterCollector exports each cluster's last health probe.
type ClusterCollector struct {
	clusters *cluster.Registry

	up, lagBytes, lagSeconds, walRate, walLSN, checkpoints, inCheckpoint, databases *prometheus.Desc
}

// NewClusterCollector returns a collector over the registry's clusters.
func NewClusterCollector(clusters *cluster.Registry) *ClusterCollector {
	l := []string{"cluster"}
	return &ClusterCollector{
		clusters:     clusters,
		up:           prometheus.NewDesc("pgtenant_cluster_up", "1 if the last probe of the cluster's primary succeeded.", l, nil),
		lagBytes:     prometheus.NewDesc("pgtenant_cluster_replay_lag_bytes", "Standby replay lag behind the primary, in bytes.", []string{"cluster", "standby", "state"}, nil),
		lagSeconds:   prometheus.NewDesc("pgtenant_cluster_replay_lag_seconds", "Standby replay lag behind the primary, in seconds.", []string{"cluster", "standby", "state"}, nil),
		walRate:      prometheus.NewDesc("pgtenant_cluster_wal_bytes_per_second", "WAL written per second between the last two probes.", l, nil),
		walLSN:       prometheus.NewDesc("pgtenant_cluster_wal_lsn_bytes", "WAL insert position of the primary.", l, nil),
		checkpoints:  prometheus.NewDesc("pgtenant_cluster_checkpoints_total", "Checkpoints since statistics reset, by kind (timed or requested).", []string{"cluster", "kind"}, nil),
		inCheckpoint: prometheus.NewDesc("pgtenant_cluster_checkpoint_in_progress", "1 while the checkpointer is writing or syncing.", l, nil),
		databases:    prometheus.NewDesc("pgtenant_cluster_databases", "Databases on the cluster.", l, nil),
	}
}

// Describe implements prometheus.Collector.
func (c *ClusterCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{c.up, c.lagBytes, c.lagSeconds, c.walRate, c.walLSN, c.checkpoints, c.inCheckpoint, c.databases} {
		ch <- d
	}
}

// Collect implements prometheus.Collector.
func (c *ClusterCollector) Collect(ch chan<- prometheus.Metric) {
	for _, cl := range c.clusters.All() {
		h, err := cl.LastProbeResult()
		name := cl.Name()
		if err != nil || h.At.IsZero() {
			ch <- prometheus.MustNewConstMetric(c.up, prometheus.GaugeValue, 0, name)
			continue
		}
		ch <- prometheus.MustNewConstMetric(c.up, prometheus.GaugeValue, 1, name)
		for _, s := range h.Standbys {
			ch <- prometheus.MustNewConstMetric(c.lagBytes, prometheus.GaugeValue, float64(s.ReplayLagBytes), name, s.Name, s.State)
			ch <- prometheus.MustNewConstMetric(c.lagSeconds, prometheus.GaugeValue, s.ReplayLagSeconds, name, s.Name, s.State)
		}
		ch <- prometheus.MustNewConstMetric(c.walRate, prometheus.GaugeValue, h.WALBytesPerSec, name)
		ch <- prometheus.MustNewConstMetric(c.walLSN, prometheus.GaugeValue, float64(h.WALLSN), name)
		ch <- prometheus.MustNewConstMetric(c.checkpoints, prometheus.CounterValue, float64(h.CheckpointsTimed), name, "timed")
		ch <- prometheus.MustNewConstMetric(c.checkpoints, prometheus.CounterValue, float64(h.CheckpointsRequested), name, "requested")
		ch <- prometheus.MustNewConstMetric(c.inCheckpoint, prometheus.GaugeValue, b2f(h.CheckpointInProgress), name)
		ch <- prometheus.MustNewConstMetric(c.databases, prometheus.GaugeValue, float64(h.Databases), name)
	}
}

func b2f(b bool) float64 {
	if b {
		return 1
	}
	return 0
}
