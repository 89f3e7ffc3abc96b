package prewarm_test

import (
	"context"
	"testing"
	"time"

	"github.com/pgtenant/pgtenant/internal/catalog"
)

// TestR2Finding8_CaptureAfterAMove: node names repeat across clusters, and a
// moved tenant's leftover copy stays on its old cluster until it is purged.
// The new cluster's capture of the tenant's hot set must not fail on the old
// cluster's row (it failed with a duplicate key on hot_sets_pkey, and every
// tenant on that node stopped getting fresh hot sets), and the old cluster's
// next capture no longer keeps a hot set for a tenant that lives elsewhere.
func TestR2Finding8_CaptureAfterAMove(t *testing.T) {
	e := start(t, nil)
	ctx := context.Background()
	moved := e.tenant(t, "database", 1)
	stays := e.tenant(t, "database", 1)
	read(t, moved.DSN, 1)
	read(t, stays.DSN, 1)
	cl, _ := e.svc.Clusters.Get("local")
	if _, err := e.svc.Capture(ctx, cl, "primary"); err != nil {
		t.Fatal(err)
	}
	if _, ok := hotSet(t, e, moved.Tenant.ID); !ok {
		t.Fatal("no hot set captured for the tenant before its move")
	}

	// The move's cut-over: the catalog says local2; the copy on local stays
	// (and stays warm) until its purge. local2 is registered only: the
	// target's capture is what its prewarm.Capture would store.
	if err := e.svc.Store.UpsertCluster(ctx, catalog.Cluster{Name: "local2", Kind: "external", DSN: "host=/nonexistent"}); err != nil {
		t.Fatal(err)
	}
	if _, err := e.cat.Exec(ctx, `UPDATE tenants SET cluster = 'local2' WHERE id = $1`, moved.Tenant.ID); err != nil {
		t.Fatal(err)
	}
	// local2's primary captures the tenant there, as its capture would.
	target := []catalog.HotSet{{Tenant: moved.Tenant.ID, Blocks: 10, Usage: 10, Ranges: []catalog.BlockRange{}}}
	kept, err := e.svc.Store.ReplaceHotSets(ctx, "local2", "primary", time.Now(), 1, time.Now(), target)
	if err != nil {
		t.Fatalf("capture on the move's target node: %v", err)
	}
	if kept != 1 {
		t.Errorf("hot sets kept on the target node = %d, want 1", kept)
	}

	// local's next capture still reads the leftover's blocks from its cache.
	res, err := e.svc.Capture(ctx, cl, "primary")
	if err != nil {
		t.Fatal(err)
	}
	sets, err := e.svc.Store.HotSets(ctx, moved.Tenant.ID)
	if err != nil {
		t.Fatal(err)
	}
	if len(sets) != 1 || sets[0].Cluster != "local2" {
		t.Errorf("moved tenant's hot sets = %+v, want only local2's", sets)
	}
	if _, ok := hotSet(t, e, stays.Tenant.ID); !ok || res.Tenants == 0 {
		t.Errorf("the tenant that stayed lost its hot set (capture kept %d)", res.Tenants)
	}
}
