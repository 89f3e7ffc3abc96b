package bench

import (
	"math/rand/v2"
	"testing"
	"time"

	"github.com/pgtenant/pgtenant/internal/tenant"
)

// TestBurstPlan: 40% of the creates retry an external id sent earlier in
// the burst, in its mode; the new ones are split between the modes.
func TestBurstPlan(t *testing.T) {
	plan := burstPlan(200, 0.4, 0.5, "b", rand.New(rand.NewPCG(1, 2)))
	if len(plan) != 200 || plan[0].retry {
		t.Fatalf("plan of %d, first a retry: %v; want 200 starting with a new id", len(plan), plan[0].retry)
	}
	seen := map[string]tenant.Mode{} // external id → mode
	retries, schema := 0, 0
	for i, r := range plan {
		mode, ok := seen[r.ext]
		switch {
		case r.retry && !ok:
			t.Errorf("request %d retries %s, not sent before", i, r.ext)
		case r.retry && mode != r.mode:
			t.Errorf("request %d retries %s in mode %s, sent in %s", i, r.ext, r.mode, mode)
		case !r.retry && ok:
			t.Errorf("request %d sends %s again without being a retry", i, r.ext)
		}
		if r.retry {
			retries++
			continue
		}
		seen[r.ext] = r.mode
		if r.mode == tenant.ModeSchema {
			schema++
		}
	}
	if retries != 80 || len(seen) != 120 || schema != 60 {
		t.Errorf("%d retries, %d external ids, %d of them schema; want 80, 120, 60", retries, len(seen), schema)
	}
}

func TestPoolLine(t *testing.T) {
	var s []PoolSample
	for i := range 10 {
		s = append(s, PoolSample{At: time.Duration(i) * 700 * time.Millisecond, Database: i})
	}
	if got, want := poolLine(s, 2*time.Second), "0 3 6 9"; got != want {
		t.Errorf("poolLine = %q, want %q", got, want)
	}
}
