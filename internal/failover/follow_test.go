package failover_test

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pgtenant/pgtenant/internal/api"
	"github.com/pgtenant/pgtenant/internal/catalog"
	"github.com/pgtenant/pgtenant/internal/config"
	"github.com/pgtenant/pgtenant/internal/daemon"
	"github.com/pgtenant/pgtenant/internal/daemon/daemontest"
	"github.com/pgtenant/pgtenant/internal/patroni"
	"github.com/pgtenant/pgtenant/internal/patroni/patronitest"
	"github.com/pgtenant/pgtenant/internal/pgtest"
	"github.com/pgtenant/pgtenant/internal/provision"
	"github.com/pgtenant/pgtenant/internal/templates"
)

// pg holds the catalog: it must outlive the Patroni cluster's failover.
var pg *pgtest.Cluster

func TestMain(m *testing.M) { pgtest.Main(m, pgtest.Options{}, &pg) }

// TestFollow_NodeLossThroughPooler registers a cluster that Patroni runs
// (etcd and two nodes) with `cluster add --patroni`, gives it a PgBouncer,
// and has a client write through a tenant's DSN while the leader's node
// dies (Patroni and PostgreSQL SIGKILLed): the daemon re-points the
// catalog, its pools and the PgBouncer at the new leader, the client
// writes again through the same DSN, a tenant create works, the old
// node's return as a standby shows in the cluster's standby DSNs, and the
// failover is counted once.
func TestFollow_NodeLossThroughPooler(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	t.Cleanup(cancel)
	// Started before the daemons, so stopped after them (cleanups run last
	// first). The daemon's pools and the PgBouncer want more connections
	// than the harness's small servers allow.
	pc := patronitest.Start(t, ctx, patronitest.Options{Scope: "pc1",
		Parameters: map[string]string{"max_connections": "60"}, Programs: []string{"pgbouncer"}})
	leader, standby := pc.WaitLeaderAndSyncStandby(t, ctx, "")

	// A first daemon registers the cluster as `cluster add` does; the
	// daemon the test uses is started again with a pooler for it (a
	// pooler block is read at start).
	cfg := daemontest.Config(t, pg)
	local := daemontest.Managed(pg)
	_, c, stop := daemontest.StartOptions(t, daemon.Options{Config: cfg, Managed: []catalog.Cluster{local}})
	// The DSN's host and port are nobody's: the leader's replace them.
	dsn := fmt.Sprintf("host=192.0.2.1 port=1 user=%s password=%s dbname=postgres sslmode=disable connect_timeout=2",
		patroni.SuperuserName, pc.Passwords.Superuser)
	for _, bad := range []api.AddClusterRequest{
		{Name: "pc1", DSN: dsn, Patroni: []string{"127.0.0.1:8008"}},        // not a URL
		{Name: "pc1", DSN: dsn, Patroni: []string{"http://127.0.0.1:1"}},    // nothing answers
		{Name: "pc1", DSN: dsn, Patroni: pc.URLs, Standbys: []string{dsn}},  // standbys are Patroni's
		{Name: "pc1", DSN: dsn, Patroni: []string{pc.URLs[0] + "/cluster"}}, // not the base URL
	} {
		var apiErr *api.Error
		if _, err := c.AddCluster(ctx, bad); !errors.As(err, &apiErr) || apiErr.Status != http.StatusBadRequest {
			t.Errorf("cluster add --patroni %v (standbys %d): got %v, want 400", bad.Patroni, len(bad.Standbys), err)
		}
	}
	added, err := c.AddCluster(ctx, api.AddClusterRequest{Name: "pc1", DSN: dsn, Patroni: pc.URLs})
	if err != nil {
		t.Fatal(err)
	}
	if added.Status != "up" || len(added.Patroni) != 2 || !strings.Contains(added.DSN, fmt.Sprintf("port=%d", pc.Node(leader.Name).Port())) {
		t.Fatalf("cluster add --patroni: got %+v, want up, 2 endpoints, the DSN at %s's port %d", added, leader.Name, pc.Node(leader.Name).Port())
	}
	stop()

	d, c, _ := daemontest.StartOptions(t, daemon.Options{Config: cfg, Managed: []catalog.Cluster{local},
		Poolers: map[string]config.PoolerConfig{"pc1": daemontest.Pooler(t)}})
	daemontest.CreateTemplate(t, c, "w", []templates.Upload{{Name: "0001_init.sql", Body: `CREATE TABLE writes (id int NOT NULL);`}})
	created, err := c.CreateTenant(ctx, provision.Request{Template: "w", Cluster: "pc1"})
	if err != nil {
		t.Fatal(err)
	}
	front := d.Poolers().Get("pc1").PublicAddr()
	if !strings.Contains(created.DSN, front) {
		t.Fatalf("tenant DSN %s: want the pooler's %s", created.DSN, front)
	}

	w := patronitest.StartWriter(t, ctx, created.DSN)
	w.WaitAcks(t, ctx, 30, "30 writes through the pooler before the kill")

	killed := time.Now()
	pc.Node(leader.Name).Kill()
	t.Logf("killed %s (leader, timeline %d): patroni and postgres", leader.Name, leader.Timeline)

	var detail api.ClusterDetail
	newPort := fmt.Sprintf("port=%d", pc.Node(standby.Name).Port())
	patronitest.WaitFor(t, ctx, 90*time.Second, "the daemon to re-point pc1 at "+standby.Name, func() bool {
		detail, err = c.Cluster(ctx, "pc1")
		return err == nil && strings.Contains(detail.DSN, newPort) && failovers(t, d, "pc1") == 1
	}, func() string {
		return fmt.Sprintf("dsn %s, %v failovers, err %v", detail.DSN, failovers(t, d, "pc1"), err)
	})
	repointed := time.Since(killed)
	first := w.WaitAckOn(t, ctx, pc.Node(standby.Name).Port(), killed, 60*time.Second)
	w.WaitAcks(t, ctx, len(w.Acks())+20, "20 writes through the pooler on the new leader")
	t.Logf("node loss: daemon re-pointed pc1 (catalog, pools, pooler) %.1fs after the kill (pgtenant_failover_seconds %.1fs from the first failed check), "+
		"first write through the same tenant DSN %.1fs after the kill, longest pause %.1fs",
		repointed.Seconds(), failoverSeconds(t, d, "pc1"), first.Sub(killed).Seconds(), w.LongestPause(killed).Seconds())

	start := time.Now()
	again, err := c.CreateTenant(ctx, provision.Request{Template: "w", Cluster: "pc1"})
	if err != nil {
		t.Fatalf("tenant create after the failover: %v", err)
	}
	conn, err := pgx.Connect(ctx, again.DSN)
	if err != nil {
		t.Fatalf("connect through the new tenant's DSN: %v", err)
	}
	var port int
	err = conn.QueryRow(ctx, `INSERT INTO writes VALUES (1) RETURNING current_setting('port')::int`).Scan(&port)
	conn.Close(ctx)
	if err != nil || port != pc.Node(standby.Name).Port() {
		t.Fatalf("write through the new tenant's DSN: server port %d, %v; want %d", port, err, pc.Node(standby.Name).Port())
	}
	t.Logf("tenant create (path %s) and a write through its DSN after the failover: %.1fs", again.Path, time.Since(start).Seconds())

	// The old leader comes back (rewound by Patroni) as a standby: the
	// cluster's standby DSNs follow, and no failover is counted.
	old := pc.Node(leader.Name)
	if err := old.Start(ctx); err != nil {
		t.Fatal(err)
	}
	rejoin := time.Now()
	cat := daemontest.CatalogConn(t, pg, cfg)
	oldPort := fmt.Sprintf("port=%d", old.Port())
	var standbys []string
	patronitest.WaitFor(t, ctx, 90*time.Second, "pc1's standby DSNs to name "+leader.Name, func() bool {
		err = cat.QueryRow(ctx, `SELECT standby_dsns FROM clusters WHERE name = 'pc1'`).Scan(&standbys)
		return err == nil && len(standbys) == 1 && strings.Contains(standbys[0], oldPort)
	}, func() string { return fmt.Sprintf("%d standby DSNs, err %v", len(standbys), err) })
	t.Logf("old leader %s back as a standby in pc1's DSNs %.1fs after its restart", leader.Name, time.Since(rejoin).Seconds())

	acked := w.Stop()
	t.Logf("writer: %d acknowledged writes, %d errors", len(acked), w.Errors())
	// Through the tenant's DSN: the pooler's, now at the new leader.
	patronitest.CheckRows(t, ctx, created.DSN, "through the pooler", acked)
	if got := failovers(t, d, "pc1"); got != 1 {
		t.Errorf("pgtenant_failovers_total{cluster=pc1}: got %v, want 1", got)
	}
}

// failovers is the daemon's pgtenant_failovers_total of clusterName.
func failovers(t *testing.T, d *daemon.Daemon, clusterName string) float64 {
	v, _ := sample(t, d, "pgtenant_failovers_total", clusterName)
	return v
}

// failoverSeconds is the sum of the daemon's pgtenant_failover_seconds of
// clusterName.
func failoverSeconds(t *testing.T, d *daemon.Daemon, clusterName string) float64 {
	_, v := sample(t, d, "pgtenant_failover_seconds", clusterName)
	return v
}

func sample(t *testing.T, d *daemon.Daemon, name, clusterName string) (counter, histogramSum float64) {
	t.Helper()
	families, err := d.Metrics().Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range families {
		if f.GetName() != name {
			continue
		}
		for _, m := range f.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == "cluster" && l.GetValue() == clusterName {
					return m.GetCounter().GetValue(), m.GetHistogram().GetSampleSum()
				}
			}
		}
	}
	return 0, 0
}
