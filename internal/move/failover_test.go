package move_test

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/pgtenant/pgtenant/internal/analytics"
	"github.com/pgtenant/pgtenant/internal/api"
	"github.com/pgtenant/pgtenant/internal/daemon/daemontest"
	"github.com/pgtenant/pgtenant/internal/move"
	"github.com/pgtenant/pgtenant/internal/patroni/patronitest"
	"github.com/pgtenant/pgtenant/internal/pgtest"
	"github.com/pgtenant/pgtenant/internal/provision"
)

// TestMove_SourceFailsOver: the leader of a Patroni cluster dies (its
// Patroni and PostgreSQL SIGKILLed together) while a tenant moves from it
// to local, between the move's copy and its cut-over, and while a
// neighbour on it has an analytics mirror. PostgreSQL 15's logical slots
// do not survive a promotion: the daemon follows the new leader, the move
// copies again from it and finishes with every row the tenant wrote
// before the kill (also those written after the copy) on local, the
// mirror copies again with an event saying why and then equals the
// heap. The old leader rejoins as a standby without the slots it had, and
// reconcile finds nothing on either cluster.
func TestMove_SourceFailsOver(t *testing.T) {
	ctx, cancel := context.WithTimeout(pgtest.Context(t), 5*time.Minute)
	t.Cleanup(cancel)
	pc := patronitest.Start(t, ctx, patronitest.Options{Scope: "pcm", Programs: []string{"pgbouncer"}, Parameters: map[string]string{
		"max_connections": "60", "wal_level": "logical", "max_replication_slots": "20", "max_wal_senders": "20"}})
	leader, standby := pc.WaitLeaderAndSyncStandby(t, ctx, "")
	d, c := daemontest.Following(t, ctx, testConfig(t), pgs[:1], pc, "pcm")
	buildSaas(t, c)
	tenantOn := func() api.CreateTenantResponse {
		t.Helper()
		r, err := c.CreateTenant(ctx, provision.Request{Template: "saas", Mode: "database", Cluster: "pcm"})
		if err != nil {
			t.Fatal(err)
		}
		return r
	}
	moving, mirrored := tenantOn(), tenantOn()
	writeFacts(t, ctx, moving.DSN, 1, 100)
	writeFacts(t, ctx, mirrored.DSN, 1, 100)
	if _, err := c.EnableAnalytics(ctx, mirrored.Tenant.ID, nil); err != nil {
		t.Fatal(err)
	}
	mirrorEqualsHeap(t, ctx, d, c, mirrored.Tenant.ID, mirrored.DSN, "before the failover")

	// The move waits before its cut-over until the leader is dead and
	// the daemon follows the new one.
	reached, release := make(chan struct{}), make(chan struct{})
	var once sync.Once
	move.SetCrashHook(func(ctx context.Context, p string) error {
		if p == "cutover" {
			once.Do(func() { close(reached) })
			select {
			case <-release:
			case <-ctx.Done():
			}
		}
		return nil
	})
	t.Cleanup(func() { move.SetCrashHook(nil) })
	j, err := c.MoveTenant(ctx, moving.Tenant.ID, "local")
	if err != nil {
		t.Fatal(err)
	}
	select {
	case <-reached:
	case <-ctx.Done():
		t.Fatal("the move never reached its cut-over")
	}
	writeFacts(t, ctx, moving.DSN, 101, 150) // after the copy: in the move's slot only
	var want string
	if err := pgtest.Connect(t, pc.Cluster.DSN(pc.Node(leader.Name).Port(), moving.Tenant.Database)).QueryRow(ctx, factsDigest).Scan(&want); err != nil {
		t.Fatal(err)
	}

	pc.Node(leader.Name).Kill()
	daemontest.WaitFollows(t, ctx, c, "pcm", pc.Node(standby.Name).Port())
	close(release)
	waitJob(t, ctx, c, j.ID)
	if n := events(t, ctx, c, moving.Tenant.ID, "move_copied_again", "slot is gone"); n != 1 {
		t.Errorf("%d move_copied_again events, want 1", n)
	}
	var got string
	if err := pgs[0].Conn(t, moving.Tenant.Database).QueryRow(ctx, factsDigest).Scan(&got); err != nil {
		t.Fatal(err)
	}
	if got != want {
		t.Errorf("the moved tenant's rows on local differ from the source's before the kill:\n got  %.200s\n want %.200s", got, want)
	}

	writeFacts(t, ctx, mirrored.DSN, 101, 200) // through its pooler, now at the new leader
	mirrorEqualsHeap(t, ctx, d, c, mirrored.Tenant.ID, mirrored.DSN, "after the failover")
	if n := events(t, ctx, c, mirrored.Tenant.ID, "analytics", "slot is gone"); n != 1 {
		t.Errorf("%d analytics events saying the mirror's slot is gone, want 1", n)
	}

	// The old leader comes back as the standby, without the slots it had
	// as the primary.
	if err := pc.Node(leader.Name).Start(ctx); err != nil {
		t.Fatal(err)
	}
	pc.WaitLeaderAndSyncStandby(t, ctx, standby.Name)
	var slots []string
	if err := pgtest.Connect(t, pc.NodeDSN(leader.Name)).QueryRow(ctx,
		`SELECT coalesce(array_agg(slot_name::text), '{}') FROM pg_replication_slots WHERE slot_type = 'logical'`).Scan(&slots); err != nil {
		t.Fatal(err)
	}
	if len(slots) != 0 {
		t.Errorf("the old leader, now a standby, keeps logical slots %v", slots)
	}
	if st, err := c.AnalyticsStatus(ctx, mirrored.Tenant.ID); err != nil || st.State != analytics.StateStreaming {
		t.Errorf("mirror status after the failover: %+v, %v; want streaming", st, err)
	}
	// local is shared with the package's other tests, whose tenants are
	// not in this catalog: only findings about this test's tenants count.
	for _, name := range []string{"pcm", "local"} {
		rep, err := c.Reconcile(ctx, api.ReconcileRequest{Cluster: name})
		if err != nil || len(rep.Errors) != 0 {
			t.Errorf("reconcile of %s after the failover: %+v, %v", name, rep, err)
		}
		for _, f := range rep.Findings {
			if name == "pcm" || f.Tenant == moving.Tenant.ID || f.Tenant == mirrored.Tenant.ID {
				t.Errorf("reconcile of %s after the failover found %+v; want nothing", name, f)
			}
		}
	}
}
