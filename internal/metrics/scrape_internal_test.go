package metrics

import (
	"fmt"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/pgtenant/pgtenant/internal/catalog"
)

// fakeFleet fills a collector's memory with n measured tenants, as passes would.
func fakeFleet(n int) *Collector {
	c := &Collector{clusters: map[string]*clusterState{}}
	st := &clusterState{name: "c1", tenants: map[string]*tenantState{}, files: 300000, filesAt: time.Now(),
		byState: map[[2]string]int{{"active", "database"}: n}, lastPass: PassStats{At: time.Now(), Queries: 6}}
	for i := 0; i < n; i++ {
		id := fmt.Sprintf("t%011d", i)
		st.tenants[id] = &tenantState{meta: catalog.MetricTenant{ID: id, Mode: "database", State: "active", Quota: "ok"},
			hasCur: true, hasSize: true, size: int64(i) << 20, activity: float64(i % 97),
			cur: counters{Commits: int64(i), RowsRead: int64(i) * 10}}
	}
	c.clusters["c1"] = st
	return c
}

func BenchmarkScrape(b *testing.B) {
	for _, tc := range []struct{ tenants, topN int }{{10000, 100}, {10000, 1 << 30}} {
		b.Run(fmt.Sprintf("tenants=%d/top=%d", tc.tenants, tc.topN), func(b *testing.B) {
			reg := prometheus.NewRegistry()
			reg.MustRegister(NewTenantCollector(fakeFleet(tc.tenants), tc.topN))
			h := promhttp.HandlerFor(reg, promhttp.HandlerOpts{})
			for i := 0; i < b.N; i++ {
				rec := httptest.NewRecorder()
				h.ServeHTTP(rec, httptest.NewRequest("GET", "/metrics", nil))
			}
		})
	}
}
