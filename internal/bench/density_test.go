package bench

import (
	"slices"
	"strings"
	"testing"
	"time"
)

// TestDensitySteps: the scale points are a hundredth, a tenth and all of
// the tenants, none below 1,000.
func TestDensitySteps(t *testing.T) {
	for n, want := range map[int][]int{1000000: {10000, 100000, 1000000}, 50000: {5000, 50000}, 5000: {5000}, 1000: {1000}} {
		if got := densitySteps(n); !slices.Equal(got, want) {
			t.Errorf("densitySteps(%d) = %v, want %v", n, got, want)
		}
	}
}

// TestDensityTable: one column per scale point, and a note per watched
// figure saying whether it grows with the catalog.
func TestDensityTable(t *testing.T) {
	ps := []DensityPoint{{Tenants: 10000, SearchP95: 2 * time.Millisecond, ShowP95: time.Millisecond, ClusterLoads: 10 * time.Millisecond, ListFirstP95: time.Millisecond},
		{Tenants: 1000000, SearchP95: 900 * time.Millisecond, ShowP95: time.Millisecond, ClusterLoads: 10 * time.Millisecond, ListFirstP95: time.Millisecond}}
	tb := densityTable(ps, DensityOptions{SimulateTenants: 1000000, Clusters: 200, Jobs: 10})
	if !slices.Equal(tb.Columns, []string{"measure", "10000", "1000000"}) {
		t.Errorf("columns %v", tb.Columns)
	}
	notes := strings.Join(tb.Notes, "\n")
	for _, want := range []string{"search p95: ×450.0 for ×100 tenants (2.0 ms → 900.0 ms): grows with the catalog", "show p95: ×1.0 for ×100 tenants (1.0 ms → 1.0 ms): flat"} {
		if !strings.Contains(notes, want) {
			t.Errorf("notes lack %q:\n%s", want, notes)
		}
	}
}
