package metrics

import (
	"context"
	"strconv"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/pgtenant/pgtenant/internal/catalog"
)

// TemplateCollector exports how many tenants of each template are at each
// version, so that a deploy can gate on "every tenant at version V"
// (pgtenant_template_tenants{template="saas",version!="7"} == 0). It runs one
// catalog query per scrape and never touches a cluster.
type TemplateCollector struct {
	store   *catalog.Store
	tenants *prometheus.Desc
	up      *prometheus.Desc
}

// NewTemplateCollector returns a collector over the catalog's tenants.
func NewTemplateCollector(store *catalog.Store) *TemplateCollector {
	return &TemplateCollector{
		store: store,
		tenants: prometheus.NewDesc("pgtenant_template_tenants",
			"Tenants of a template at a version: active, suspended, dropped (restorable) and being provisioned; spares excluded.",
			[]string{"template", "version"}, nil),
		up: prometheus.NewDesc("pgtenant_template_tenants_up", "1 if the catalog answered the version distribution query.", nil, nil),
	}
}

// Describe implements prometheus.Collector.
func (c *TemplateCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- c.tenants
	ch <- c.up
}

// Collect implements prometheus.Collector.
func (c *TemplateCollector) Collect(ch chan<- prometheus.Metric) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	counts, err := c.store.TenantVersions(ctx)
	if err != nil {
		ch <- prometheus.MustNewConstMetric(c.up, prometheus.GaugeValue, 0)
		return
	}
	ch <- prometheus.MustNewConstMetric(c.up, prometheus.GaugeValue, 1)
	for _, v := range counts {
		ch <- prometheus.MustNewConstMetric(c.tenants, prometheus.GaugeValue, float64(v.Tenants), v.Template, strconv.Itoa(v.Version))
	}
}
