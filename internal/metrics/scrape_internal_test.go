package metrics

import (
	"fmt"
	"maps"
	"math/rand/v2"
	"net/http/httptest"
	"slices"
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
	for _, tc := range []struct{ tenants, topN int }{{10000, 100}, {10000, 1 << 30}, {1000000, 100}} {
		b.Run(fmt.Sprintf("tenants=%d/top=%d", tc.tenants, tc.topN), func(b *testing.B) {
			reg := prometheus.NewRegistry()
			reg.MustRegister(NewTenantCollector(fakeFleet(tc.tenants), tc.topN))
			h := promhttp.HandlerFor(reg, promhttp.HandlerOpts{})
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				rec := httptest.NewRecorder()
				h.ServeHTTP(rec, httptest.NewRequest("GET", "/metrics", nil))
			}
		})
	}
}

// TestStatisticsTurn: a shared database of up to statisticsShare schema
// tenants has every tenant's counters read each pass; a larger one in
// turns of at most statisticsShare, each tenant once every n passes.
func TestStatisticsTurn(t *testing.T) {
	mk := func(n int) []catalog.MetricTenant {
		ts := make([]catalog.MetricTenant, n)
		for i := range ts {
			ts[i] = catalog.MetricTenant{ID: fmt.Sprintf("t%05d", (i*7919)%n)}
		}
		return ts
	}
	if got := statisticsTurn(mk(statisticsShare), 3); len(got) != statisticsShare {
		t.Errorf("%d tenants: %d in the turn, want all", statisticsShare, len(got))
	}
	tenants := mk(2*statisticsShare + 1) // 3 turns
	seen := map[string]int{}
	for pass := 10; pass < 13; pass++ {
		turn := statisticsTurn(tenants, pass)
		if len(turn) > statisticsShare {
			t.Errorf("pass %d: %d tenants in the turn, want at most %d", pass, len(turn), statisticsShare)
		}
		for _, m := range turn {
			seen[m.ID]++
		}
	}
	for _, m := range tenants {
		if seen[m.ID] != 1 {
			t.Errorf("tenant %s read %d times in 3 passes, want once", m.ID, seen[m.ID])
			break
		}
	}
	if again := statisticsTurn(tenants, 13); again[0].ID != statisticsTurn(tenants, 10)[0].ID {
		t.Errorf("pass 13 starts at %s, want pass 10's turn again", again[0].ID)
	}
}

// TestTopTenants_AsASortWouldChoose: the heap keeps the n tenants a sort by
// activity (ties by id) would put first, whatever the order offered, and
// says which it holds.
func TestTopTenants_AsASortWouldChoose(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	for _, tc := range []struct{ tenants, n int }{{0, 3}, {5, 0}, {5, 10}, {100, 7}, {1000, 100}, {1000, 1000}} {
		all := make([]ranked, tc.tenants)
		for i := range all {
			all[i] = ranked{cluster: "c1", id: fmt.Sprintf("t%05d", rng.IntN(1_000_000)*1000+i),
				ts: &tenantState{activity: float64(rng.IntN(10))}} // many ties
		}
		top := topTenants{n: tc.n}
		for _, r := range all {
			top.offer(r)
		}
		sorted := slices.Clone(all)
		slices.SortFunc(sorted, func(a, b ranked) int {
			if a.before(b) {
				return -1
			}
			return 1
		})
		want := map[string]bool{}
		for _, r := range sorted[:min(tc.n, len(sorted))] {
			want[r.id] = true
		}
		got := map[string]bool{}
		for _, r := range top.items {
			got[r.id] = true
		}
		if !maps.Equal(got, want) {
			t.Errorf("%d tenants, top %d: kept %d, want the %d a sort puts first", tc.tenants, tc.n, len(got), len(want))
		}
		for _, r := range all {
			if top.holds(r) != want[r.id] {
				t.Errorf("%d tenants, top %d: holds(%s) = %v, want %v", tc.tenants, tc.n, r.id, top.holds(r), want[r.id])
				break
			}
		}
	}
}
