package pooler_test

import (
	"context"
	"errors"
	"net"
	"net/url"
	"strings"
	"testing"
	"time"

	examples "github.com/pgtenant/pgtenant/examples/templates"
	"github.com/pgtenant/pgtenant/internal/api"
	"github.com/pgtenant/pgtenant/internal/cluster"
	"github.com/pgtenant/pgtenant/internal/daemon/daemontest"
	"github.com/pgtenant/pgtenant/internal/pgtest"
	"github.com/pgtenant/pgtenant/internal/provision"
)

// via is dsn with its host:port replaced by addr (a pooler restarted on
// another port in a test).
func via(t *testing.T, dsn, addr string) string {
	t.Helper()
	u, err := url.Parse(dsn)
	if err != nil {
		t.Fatal(err)
	}
	u.Host = addr
	return u.String()
}

// works checks that a client gets a session through dsn.
func works(ctx context.Context, t *testing.T, what, dsn string) {
	t.Helper()
	conn, err := connectDSN(ctx, dsn)
	if err != nil {
		t.Errorf("%s: connect: %v", what, message(err))
		return
	}
	defer conn.Close(ctx)
	var one int
	if err := conn.QueryRow(ctx, "SELECT 1").Scan(&one); err != nil {
		t.Errorf("%s: query: %v", what, err)
	}
}

// TestFrontDoor_AFaultStaysInItsCluster is issue 24's "a fault stays in its
// cluster": two clusters, a tenant living on local2 but fronted by local's
// pooler (a moved tenant), then local2's front door down, then local2
// stopped under a running daemon, then a daemon started with local only
// (`up` after a smaller --clusters). local's front door serves its own
// tenants throughout, creates on local answer working DSNs, and a create on
// local2 never answers success.
func TestFrontDoor_AFaultStaysInItsCluster(t *testing.T) {
	if testing.Short() {
		t.Skip("two clusters")
	}
	ctx := pgtest.Context(t)
	pg2, err := pgtest.Start(ctx, pgtest.Options{Name: "local2"})
	if err != nil {
		t.Fatal(err)
	}
	defer pg2.Close()
	cfg := daemontest.Config(t, pg)
	cfg.Provision.DefaultPoolSize = 0
	cfg.Metrics.Interval = 0
	cfg.Prewarm.CaptureInterval = 0
	cfg.Prewarm.WatchInterval = 0
	d, c, stop := daemontest.StartClusters(t, []*pgtest.Cluster{pg, pg2}, cfg, true)
	daemontest.CreateTemplate(t, c, "saas", examples.Saas())
	create := func(c *api.Client, clusterName string) (api.CreateTenantResponse, error) {
		return c.CreateTenant(ctx, provision.Request{Template: "saas", Mode: "schema", Cluster: clusterName})
	}
	a, err := create(c, "local")
	if err != nil {
		t.Fatal(err)
	}
	m, err := create(c, "local2")
	if err != nil {
		t.Fatal(err)
	}
	// m lives on local2 and is fronted by local's pooler, as a move leaves it.
	if _, err := daemontest.CatalogConn(t, pg, cfg).Exec(ctx, `UPDATE tenants SET front = 'local' WHERE id = $1`, m.Tenant.ID); err != nil {
		t.Fatal(err)
	}
	local, local2 := d.Poolers().Get("local"), d.Poolers().Get("local2")
	if err := local.Sync(ctx); err != nil {
		t.Fatal(err)
	}
	mRole := "t_" + m.Tenant.ID
	works(ctx, t, "a through local's pooler", a.DSN)
	works(ctx, t, "m (on local2) through local's pooler", via(t, m.DSN, local.PublicAddr()))

	t.Run("local2's front door down", func(t *testing.T) {
		// Its PgBouncer stopped, its port held: it cannot come back.
		var hold net.Listener
		for i := 0; hold == nil && i < 50; i++ {
			if err := local2.Proc.Stop(); err != nil {
				t.Fatal(err)
			}
			hold, _ = net.Listen("tcp", local2.Addr())
		}
		if hold == nil {
			t.Fatalf("could not hold %s", local2.Addr())
		}
		defer hold.Close()
		_, err := create(c, "local2")
		var apiErr *api.Error
		if !errors.As(err, &apiErr) || apiErr.Status != 503 || apiErr.Code != "unavailable" ||
			!strings.Contains(apiErr.Message, "PgBouncer of cluster local2") || !strings.Contains(apiErr.Message, "no tenant was created") {
			t.Errorf("create on local2 with its front door down: %v; want 503 unavailable naming local2's PgBouncer", err)
		}
		// Placement goes to the cluster whose front door serves.
		r, err := create(c, "")
		if err != nil || r.Tenant.Cluster != "local" {
			t.Fatalf("unpinned create with local2's front door down: on %q, %v; want on local", r.Tenant.Cluster, err)
		}
		works(ctx, t, "a create placed while local2's front door is down", r.DSN)
		works(ctx, t, "a with local2's front door down", a.DSN)
	})

	t.Run("local2 stopped under a running daemon", func(t *testing.T) {
		if err := pg2.Stop(ctx); err != nil {
			t.Fatal(err)
		}
		if err := local.Sync(ctx); err != nil {
			t.Fatalf("local's pooler sync with local2 stopped: %v", err)
		}
		works(ctx, t, "a with local2 stopped", a.DSN)
		// m keeps its entry (the verifier last read): its clients get the
		// server's error, not "login rejected", and nothing churns.
		if _, ok := local.Snapshot().Databases[mRole]; !ok {
			t.Errorf("m's entry left local's pooler while local2 is down: %v", local.Snapshot().Skipped)
		}
		r, err := create(c, "local")
		if err != nil {
			t.Fatalf("create on local with local2 stopped: %v", err)
		}
		works(ctx, t, "a create on local with local2 stopped", r.DSN)
		if r, err := create(c, "local2"); err == nil || !errors.Is(err, cluster.ErrUnavailable) {
			t.Errorf("create on stopped local2: %+v, %v; want 503 unavailable", r.Tenant, err)
		}
	})

	t.Run("a daemon started with local only", func(t *testing.T) {
		stop()
		d, c, _ := daemontest.StartClusters(t, []*pgtest.Cluster{pg}, cfg, true)
		local := d.Poolers().Get("local")
		wctx, cancel := context.WithTimeout(ctx, 30*time.Second)
		defer cancel()
		if err := local.Sync(wctx); err != nil {
			t.Fatalf("local's pooler with local2 never started: %v", err)
		}
		works(ctx, t, "a through local's pooler, local2 down", via(t, a.DSN, local.PublicAddr()))
		if why := local.Snapshot().Skipped[mRole]; !strings.Contains(why, "local2 did not answer") {
			t.Errorf("m skipped with %q, want local2 named as not answering", why)
		}
		// Once the monitor has seen local2 down, placement avoids it.
		for deadline := time.Now().Add(20 * time.Second); ; time.Sleep(100 * time.Millisecond) {
			cs, err := c.Clusters(ctx)
			if err != nil {
				t.Fatal(err)
			}
			if len(cs) == 2 && cs[1].Name == "local2" && cs[1].Status != "up" {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("clusters %+v: local2 never seen down", cs)
			}
		}
		r, err := create(c, "")
		if err != nil || r.Tenant.Cluster != "local" {
			t.Fatalf("create with local2 down: on %q, %v; want on local", r.Tenant.Cluster, err)
		}
		if u, _ := url.Parse(r.DSN); u == nil || u.Host != local.PublicAddr() {
			t.Errorf("create answered DSN %q, want local's pooler %s", r.DSN, local.PublicAddr())
		}
		works(ctx, t, "a create on local, local2 down", r.DSN)
		if r, err := create(c, "local2"); err == nil || !errors.Is(err, cluster.ErrUnavailable) {
			t.Errorf("create on local2, never started: %+v, %v; want 503 unavailable", r.Tenant, err)
		}
	})
}
