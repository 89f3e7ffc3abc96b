package hostile_test

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"

	examples "github.com/pgtenant/pgtenant/examples/templates"
	"github.com/pgtenant/pgtenant/internal/cluster"
	"github.com/pgtenant/pgtenant/internal/daemon/daemontest"
	"github.com/pgtenant/pgtenant/internal/patroni"
	"github.com/pgtenant/pgtenant/internal/patroni/patronitest"
	"github.com/pgtenant/pgtenant/internal/pgtest"
)

// TestHostile_AfterAFailover runs the suite once after a failover. A
// Patroni cluster behind its PgBouncer, followed by a daemon whose
// catalog lives on pg, loses its leader's node (Patroni and PostgreSQL
// SIGKILLed together); once the daemon follows the new leader and the old
// one is back as its synchronous standby (pg_rewind), the hostile tenants
// and their neighbours are made on the new leader and every path runs
// against every plant, twice, as in TestHostile_EveryPathAgainstEveryPlant.
// The suite's restart of the primary is Patroni's restart in place.
func TestHostile_AfterAFailover(t *testing.T) {
	if testing.Short() {
		t.Skip("the hostile suite runs every control-plane path twice")
	}
	ctx := pgtest.Context(t)
	pc := patronitest.Start(t, ctx, patronitest.Options{Scope: "hha", Programs: []string{"pgbouncer"}, Parameters: map[string]string{
		"max_connections": "100", "wal_level": "logical", "max_replication_slots": "20", "max_wal_senders": "20",
		"shared_preload_libraries": "pg_prewarm,pg_stat_statements", "pg_stat_statements.track": "all",
		"pg_stat_statements.max": "10000", "track_functions": "all", "max_locks_per_transaction": "256",
		"superuser_reserved_connections": "3"}})
	leader, standby := pc.WaitLeaderAndSyncStandby(t, ctx, "")
	cfg := suiteDaemonConfig(t, suiteConfig)
	d, c := daemontest.Following(t, ctx, cfg, []*pgtest.Cluster{pg}, pc, "hha")
	daemontest.CreateTemplate(t, c, "saas", examples.Saas())

	pc.Node(leader.Name).Kill()
	daemontest.WaitFollows(t, ctx, c, "hha", pc.Node(standby.Name).Port())
	if err := pc.Node(leader.Name).Start(ctx); err != nil {
		t.Fatal(err)
	}
	pc.WaitLeaderAndSyncStandby(t, ctx, standby.Name)

	srv = patroniServer{pc}
	t.Cleanup(func() { srv = pgServer{} })
	runSuite(t, &env{c: c, store: d.Store(), cfg: cfg, pooler: d.Poolers().Get("hha"), cluster: "hha", direct: true})
}

// patroniServer is a Patroni cluster as the suite's server.
type patroniServer struct{ pc *patronitest.Cluster }

func (s patroniServer) Conn(t testing.TB, db string) *pgx.Conn {
	return pgtest.Connect(t, s.pc.PrimaryDSN(db))
}
func (s patroniServer) PrimaryDSN(db string) string { return s.pc.PrimaryDSN(db) }
func (s patroniServer) Name() string                { return s.pc.Name() }
func (s patroniServer) Registry(t testing.TB) *cluster.Registry {
	return pgtest.NewRegistry(t, s.pc.Name(), s.pc.PrimaryDSN("postgres"), nil)
}

// OnStandby points dsn at the cluster's running replica.
func (s patroniServer) OnStandby(t testing.TB, dsn string) string {
	t.Helper()
	ms, err := s.pc.Client.Members(pgtest.Context(t))
	if err != nil {
		t.Fatal(err)
	}
	u, err := url.Parse(dsn)
	if err != nil {
		t.Fatal(err)
	}
	for _, m := range ms {
		if m.Role != patroni.RoleLeader && m.Running() {
			u.Host = "127.0.0.1:" + strconv.Itoa(m.Port)
			return u.String()
		}
	}
	t.Fatalf("no running standby among %+v", ms)
	return ""
}

// Restart restarts the leader's PostgreSQL through Patroni (POST
// /restart: the leader keeps its lock) and waits for its synchronous
// standby.
func (s patroniServer) Restart(ctx context.Context) error {
	l, err := s.pc.Client.Leader(ctx)
	if err != nil {
		return err
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, l.BaseURL()+"/restart", strings.NewReader("{}"))
	if err != nil {
		return err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return err
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("restart %s: %s %s", l.Name, resp.Status, body)
	}
	_, _, err = s.pc.WaitStandby(ctx, l.Name, true)
	return err
}
