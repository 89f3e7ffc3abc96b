package prewarm_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pgtenant/pgtenant/internal/api"
	"github.com/pgtenant/pgtenant/internal/config"
	"github.com/pgtenant/pgtenant/internal/jobs"
	"github.com/pgtenant/pgtenant/internal/prewarm"
)

// nodeHotSet is a tenant's hot set on one node.
func nodeHotSet(t *testing.T, e env, id, node string) (prewarm.HotSet, bool) {
	t.Helper()
	hs, err := e.svc.HotSets(context.Background(), id)
	if err != nil {
		t.Fatal(err)
	}
	for _, h := range hs {
		if h.Node == node {
			return h, true
		}
	}
	return prewarm.HotSet{}, false
}

// prewarmJob starts a prewarm of one tenant (on every node) and waits for
// its job on node.
func prewarmJob(t *testing.T, e env, ctx context.Context, id, node string) jobs.Job {
	t.Helper()
	js, err := e.c.Prewarm(ctx, api.PrewarmRequest{Tenant: id})
	if err != nil {
		t.Fatal(err)
	}
	for _, j := range js {
		var a prewarm.Args
		if err := j.DecodeArgs(&a); err != nil {
			t.Fatal(err)
		}
		if a.Node == node {
			if j, err = e.c.WaitJob(ctx, j.ID, nil); err != nil {
				t.Fatal(err)
			}
			return j
		}
	}
	t.Fatalf("prewarm of tenant %s: jobs %+v, none on %s", id, js, node)
	return jobs.Job{}
}

// extensionSchema is where pg_prewarm is in a database of a node ("" if
// nowhere).
func extensionSchema(t *testing.T, dsn string) string {
	t.Helper()
	var schema string
	withConn(t, dsn, func(conn *pgx.Conn) {
		err := conn.QueryRow(context.Background(), `SELECT coalesce((SELECT extnamespace::regnamespace::text FROM pg_extension
			WHERE extname = 'pg_prewarm'), '')`).Scan(&schema)
		if err != nil {
			t.Fatal(err)
		}
	})
	return schema
}

// TestPrewarm_StandbyOfADatabaseTenantFirstTime: the first prewarm of a
// database tenant's standby, whose database has no pg_prewarm yet, creates
// it on the primary (in pg_catalog), waits for the standby to replay it (it
// is slow to here: its replay is paused for a while) and loads the hot set;
// the job succeeded because it did its work.
func TestPrewarm_StandbyOfADatabaseTenantFirstTime(t *testing.T) {
	e := start(t, func(c *config.Config) { c.Prewarm.Standbys = true })
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	r := e.tenant(t, "database", 1)
	primaryDSN := pg.PrimaryDSN(r.Tenant.Database)
	standbyDSN := pg.DSN(pg.Standbys()[0], r.Tenant.Database)
	if s := extensionSchema(t, primaryDSN); s != "" {
		t.Fatalf("the new tenant's database has pg_prewarm in %s already: the test would not test its first prewarm", s)
	}
	// The tenant's reads go to its standby: its hot set there.
	onStandby := pg.OnStandby(t, r.DSN)
	for {
		var n int
		conn, err := pgx.Connect(ctx, onStandby)
		if err == nil {
			err = conn.QueryRow(ctx, `SELECT count(*) FROM kv`).Scan(&n)
			conn.Close(ctx)
		}
		if err == nil && n > 0 {
			break
		}
		select {
		case <-ctx.Done():
			t.Fatalf("the standby did not replay the tenant's rows: %v", err)
		case <-time.After(100 * time.Millisecond):
		}
	}
	read(t, onStandby, 2)
	cl, _ := e.svc.Clusters.Get("local")
	if _, err := e.svc.Capture(ctx, cl, "standby1"); err != nil {
		t.Fatal(err)
	}
	hs, ok := nodeHotSet(t, e, r.Tenant.ID, "standby1")
	if !ok || hs.Blocks == 0 {
		t.Fatalf("no hot set of the tenant on standby1: %+v", hs)
	}

	// Replay paused: pg_prewarm made on the primary reaches the standby
	// only once it is resumed, 2 s after the prewarm starts.
	standby := standbyConn(t)
	if _, err := standby.Exec(ctx, `SELECT pg_wal_replay_pause()`); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _, _ = standby.Exec(context.Background(), `SELECT pg_wal_replay_resume()`) })
	resumed := make(chan error, 1)
	go func() {
		time.Sleep(2 * time.Second)
		_, err := standby.Exec(context.Background(), `SELECT pg_wal_replay_resume()`)
		resumed <- err
	}()
	j := prewarmJob(t, e, ctx, r.Tenant.ID, "standby1")
	if err := <-resumed; err != nil {
		t.Fatal(err)
	}
	if j.State != jobs.Succeeded {
		t.Errorf("standby prewarm job = %s (%s), want succeeded", j.State, j.LastError)
	}
	rs, err := e.svc.Results(ctx, r.Tenant.ID)
	if err != nil {
		t.Fatal(err)
	}
	var got *prewarm.TenantResult
	for i := range rs {
		if rs[i].Node == "standby1" {
			got = &rs[i]
		}
	}
	if got == nil || got.State != prewarm.Done || got.BlocksBuffer+got.BlocksOS != hs.Blocks {
		t.Errorf("the tenant's prewarm on standby1 = %+v, want done with its %d hot blocks", got, hs.Blocks)
	}
	if p, s := extensionSchema(t, primaryDSN), extensionSchema(t, standbyDSN); p != "pg_catalog" || s != "pg_catalog" {
		t.Errorf("pg_prewarm in the tenant's database: in %q on the primary, %q on the standby; want pg_catalog on both", p, s)
	}
}

// standbyConn is a superuser connection to the maintenance
// database of the standby, closed at the end of the test.
func standbyConn(t *testing.T) *pgx.Conn {
	t.Helper()
	conn, err := pgx.Connect(context.Background(), pg.DSN(pg.Standbys()[0], "postgres"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close(context.Background()) })
	return conn
}

// TestPrewarm_TenantNotPrewarmedIsNamed: a tenant whose database cannot be
// connected to is recorded failed while the others are prewarmed, and the
// job's result names it instead of saying "done".
func TestPrewarm_TenantNotPrewarmedIsNamed(t *testing.T) {
	e := start(t, nil)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	ok := e.tenant(t, "database", 1)
	shut := e.tenant(t, "database", 1)
	read(t, ok.DSN, 2)
	read(t, shut.DSN, 2)
	cl, _ := e.svc.Clusters.Get("local")
	if _, err := e.svc.Capture(ctx, cl, "primary"); err != nil {
		t.Fatal(err)
	}
	admin := pg.Conn(t, "postgres")
	if _, err := admin.Exec(ctx, `ALTER DATABASE `+pgx.Identifier{shut.Tenant.Database}.Sanitize()+` ALLOW_CONNECTIONS false`); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_, _ = admin.Exec(context.Background(), `ALTER DATABASE `+pgx.Identifier{shut.Tenant.Database}.Sanitize()+` ALLOW_CONNECTIONS true`)
	})
	js, err := e.c.Prewarm(ctx, api.PrewarmRequest{Cluster: "local"})
	if err != nil || len(js) != 1 {
		t.Fatalf("prewarm of the cluster: jobs %+v, %v; want one", js, err)
	}
	j, err := e.c.WaitJob(ctx, js[0].ID, nil)
	if err != nil {
		t.Fatal(err)
	}
	if j.State != jobs.Succeeded || !strings.Contains(j.ProgressMsg, "1 of 2 tenant(s) not prewarmed") ||
		!strings.Contains(j.ProgressMsg, "tenant "+shut.Tenant.ID+": ") || strings.Contains(j.ProgressMsg, ok.Tenant.ID) {
		t.Errorf("prewarm job = %s (%q), want succeeded, its result naming tenant %s only", j.State, j.ProgressMsg, shut.Tenant.ID)
	}
	// A job for a standby the cluster no longer has (the old leader of a
	// failover, not back yet) ends at once, saying so.
	gone, err := jobs.Enqueue(ctx, e.cat, prewarm.Spec(prewarm.Args{Cluster: "local", Node: "standby7", Reason: "failover"}), 3)
	if err != nil {
		t.Fatal(err)
	}
	if j, err := e.c.WaitJob(ctx, gone.ID, nil); err != nil || j.State != jobs.Succeeded || !strings.Contains(j.ProgressMsg, "local/standby7 is not in the cluster now") {
		t.Errorf("prewarm of a standby that is gone = %s (%q), %v; want succeeded, saying it is gone", j.State, j.ProgressMsg, err)
	}
	for _, c := range []struct {
		id    string
		state prewarm.Outcome
	}{{ok.Tenant.ID, prewarm.Done}, {shut.Tenant.ID, prewarm.Failed}} {
		rs, err := e.svc.Results(ctx, c.id)
		if err != nil || len(rs) != 1 || rs[0].State != c.state {
			t.Errorf("prewarm of tenant %s = %+v, %v; want %s", c.id, rs, err, c.state)
		}
	}
}
