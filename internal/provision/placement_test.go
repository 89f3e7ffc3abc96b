package provision_test

import (
	"errors"
	"testing"
	"time"

	"github.com/pgtenant/pgtenant/internal/catalog"
	"github.com/pgtenant/pgtenant/internal/cluster"
	"github.com/pgtenant/pgtenant/internal/config"
	"github.com/pgtenant/pgtenant/internal/pgtest"
	"github.com/pgtenant/pgtenant/internal/provision"
)

// TestPlacement_ReadsTheFleetInTheBackground: placement keeps the fleet
// it read and reads it again once that is older than its TTL, in the
// background: the create that finds it stale places by the fleet it has
// (it never waits for the read, 149–227 ms at a million tenants), the
// creates after the read by the new one. Here another daemon drains the
// only cluster; Invalidate makes the next create read at once.
func TestPlacement_ReadsTheFleetInTheBackground(t *testing.T) {
	ctx := pgtest.Context(t)
	logger := pgtest.Logger(t)
	store, err := catalog.Open(ctx, pg.PrimaryDSN(pg.NewDatabase(t)), logger)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(store.Close)
	drain := func(on bool) {
		t.Helper()
		if _, err := store.Pool().Exec(ctx, `UPDATE clusters SET draining = $1 WHERE name = 'c1'`, on); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := store.Pool().Exec(ctx, `INSERT INTO clusters (name, kind, dsn) VALUES ('c1', 'external', $1)`, pg.PrimaryDSN("postgres")); err != nil {
		t.Fatal(err)
	}
	cl, err := cluster.New("c1", pg.PrimaryDSN("postgres"), nil, logger)
	if err != nil {
		t.Fatal(err)
	}
	reg := cluster.NewRegistry()
	reg.Put(cl)
	t.Cleanup(reg.Close)
	defaults := config.Default()
	s := &provision.Service{Store: store, Clusters: reg, Provision: defaults.Provision, Tiers: defaults.Tiers, Logger: logger}
	placed := func(want string) {
		t.Helper()
		got, err := s.Place(ctx, "default")
		switch {
		case want == "" && !errors.Is(err, provision.ErrNoCapacity):
			t.Fatalf("placed on %q (%v), want no capacity: the cluster drains", got, err)
		case want != "" && (err != nil || got != want):
			t.Fatalf("placed on %q (%v), want %s", got, err, want)
		}
	}

	s.SetPlacementTTL(time.Hour)
	placed("c1") // the first create reads the fleet
	drain(true)
	placed("c1") // the fleet it read: fresh
	if s.PlacementReloading() {
		t.Fatal("a fresh fleet is read again")
	}
	read := func() {
		t.Helper()
		for s.PlacementReloading() {
			select {
			case <-ctx.Done():
				t.Fatal("the fleet's background read did not end")
			case <-time.After(10 * time.Millisecond):
			}
		}
	}
	s.SetPlacementTTL(time.Nanosecond)
	placed("c1") // stale: placed by it while it is read again
	read()
	placed("") // the new fleet: c1 drains

	s.SetPlacementTTL(time.Hour)
	read() // the one the last create started
	drain(false)
	placed("") // the fleet read in the background, fresh for an hour
	s.Invalidate()
	placed("c1")
}
