package prewarm_test

import (
	"context"
	"errors"
	"maps"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/pgtenant/pgtenant/internal/api"
	"github.com/pgtenant/pgtenant/internal/catalog"
	"github.com/pgtenant/pgtenant/internal/config"
	"github.com/pgtenant/pgtenant/internal/daemon/daemontest"
	"github.com/pgtenant/pgtenant/internal/jobs"
	"github.com/pgtenant/pgtenant/internal/pgtest"
	"github.com/pgtenant/pgtenant/internal/prewarm"
	"github.com/pgtenant/pgtenant/internal/provision"
	"github.com/pgtenant/pgtenant/internal/templates"
	"github.com/pgtenant/pgtenant/internal/tenant"
)

var pg *pgtest.Cluster

// shared_buffers is 32MB (4096 buffers) in test clusters.
func TestMain(m *testing.M) { pgtest.Main(m, pgtest.Options{Standbys: 1}, &pg) }

type env struct {
	c   *api.Client
	svc *prewarm.Service
	cat *pgx.Conn
}

// start runs a daemon (which runs prewarm jobs and watches for restarts)
// and a prewarm.Service of the test's own on the same catalog.
func start(t *testing.T, mutate func(*config.Config)) env {
	cfg := daemontest.Config(t, pg)
	cfg.Provision.DefaultPoolSize = 0
	cfg.Prewarm.CaptureInterval = 0
	cfg.Prewarm.WatchInterval = config.Duration(200 * time.Millisecond)
	cfg.Prewarm.Standbys = false
	if mutate != nil {
		mutate(&cfg)
	}
	_, c := daemontest.Start(t, pg, cfg)
	ctx := context.Background()
	store, err := catalog.Open(ctx, cfg.Catalog.DSN, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(store.Close)
	reg := pg.Registry(t, true)
	svc := &prewarm.Service{Store: store, Clusters: reg, Prewarm: cfg.Prewarm, Tiers: cfg.Tiers, Logger: pgtest.Logger(t)}
	daemontest.CreateTemplate(t, c, "kv", []templates.Upload{{Name: "0001.sql", Body: `CREATE TABLE kv (k int PRIMARY KEY, v text);`}})
	return env{c: c, svc: svc, cat: daemontest.CatalogConn(t, pg, cfg)}
}

// tenant creates a tenant whose kv table holds about mb megabytes.
func (e env) tenant(t *testing.T, mode string, mb int) api.CreateTenantResponse {
	t.Helper()
	ctx := context.Background()
	r, err := e.c.CreateTenant(ctx, provision.Request{Template: "kv", Mode: tenant.Mode(mode)})
	if err != nil {
		t.Fatal(err)
	}
	// ~100 rows of ~80 bytes per 8 kB page: 128 pages per MB.
	withConn(t, r.DSN, func(conn *pgx.Conn) {
		if _, err := conn.Exec(ctx, `INSERT INTO kv SELECT i, repeat('x', 60) FROM generate_series(1, $1) i`, mb*128*100); err != nil {
			t.Fatal(err)
		}
		if _, err := conn.Exec(ctx, `ANALYZE kv`); err != nil {
			t.Fatal(err)
		}
	})
	return r
}

// read reads a tenant's whole table n times through its index. An index
// scan puts every page in shared_buffers; a sequential scan of a table
// larger than shared_buffers/4 would go through a small ring and warm
// nothing (the source document's finding).
func read(t *testing.T, dsn string, n int) {
	t.Helper()
	withConn(t, dsn, func(conn *pgx.Conn) {
		for range n {
			if _, err := conn.Exec(context.Background(), `SET enable_seqscan = off; SET enable_bitmapscan = off;
				SELECT count(v) FROM kv WHERE k > 0`); err != nil {
				t.Fatal(err)
			}
		}
	})
}

// withConn runs f on a short-lived tenant connection (tenants have a
// connection limit).
func withConn(t *testing.T, dsn string, f func(*pgx.Conn)) {
	t.Helper()
	conn, err := pgx.Connect(context.Background(), dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(context.Background())
	f(conn)
}

// filenode returns the file of a tenant's kv table.
func filenode(t *testing.T, r api.CreateTenantResponse) uint32 {
	t.Helper()
	var f uint32
	withConn(t, r.DSN, func(conn *pgx.Conn) {
		if err := conn.QueryRow(context.Background(), `SELECT pg_relation_filenode('kv')`).Scan(&f); err != nil {
			t.Fatal(err)
		}
	})
	return f
}

// cached counts a relation's blocks in shared_buffers.
func cached(t *testing.T, database string, filenode uint32) int {
	t.Helper()
	var n int
	err := pg.Conn(t, "postgres").QueryRow(context.Background(), `SELECT count(*) FROM pg_buffercache b
		JOIN pg_database d ON d.oid = b.reldatabase WHERE d.datname = $1 AND b.relfilenode = $2`, database, filenode).Scan(&n)
	if err != nil {
		t.Fatal(err)
	}
	return n
}

func hotSet(t *testing.T, e env, id string) (prewarm.HotSet, bool) {
	t.Helper()
	hs, err := e.svc.HotSets(context.Background(), id)
	if err != nil {
		t.Fatal(err)
	}
	for _, h := range hs {
		if h.Node == "primary" {
			return h, true
		}
	}
	return prewarm.HotSet{}, false
}

// TestCapture_AttributesBothModes: blocks in the cache are attributed to the
// tenant they belong to, by database and by schema.
func TestCapture_AttributesBothModes(t *testing.T) {
	e := start(t, nil)
	ctx := context.Background()
	db := e.tenant(t, "database", 1)
	s1 := e.tenant(t, "schema", 1)
	s2 := e.tenant(t, "schema", 1)
	read(t, db.DSN, 2)
	read(t, s1.DSN, 2)
	read(t, s2.DSN, 2)
	cl, _ := e.svc.Clusters.Get("local")
	for _, node := range []string{"primary", "standby1"} {
		res, err := e.svc.Capture(ctx, cl, node)
		if err != nil || res.Skipped != "" || res.Tenants < 3 {
			t.Fatalf("capture %s = %+v, %v; want 3 tenants", node, res, err)
		}
	}
	for _, r := range []api.CreateTenantResponse{db, s1, s2} {
		h, ok := hotSet(t, e, r.Tenant.ID)
		if !ok || h.Blocks < 100 {
			t.Fatalf("%s tenant %s: hot set %+v, want at least 100 blocks", r.Tenant.Mode, r.Tenant.ID, h)
		}
		mine := filenode(t, r)
		found := false
		for _, rg := range h.Ranges {
			if rg.Filenode == mine && rg.Fork == 0 {
				found = true
			}
		}
		if !found {
			t.Errorf("%s tenant %s: its table's file %d is not in its hot set", r.Tenant.Mode, r.Tenant.ID, mine)
		}
		// Nothing of the other schema tenant is attributed to it.
		other := s2
		if r.Tenant.ID == s2.Tenant.ID {
			other = s1
		}
		for _, rg := range h.Ranges {
			if rg.Filenode == filenode(t, other) && r.Tenant.Mode == tenant.ModeSchema {
				t.Errorf("schema tenant %s has schema tenant %s's blocks", r.Tenant.ID, other.Tenant.ID)
			}
		}
	}
	// Shown in tenant show.
	shown, err := e.c.Tenant(ctx, db.Tenant.ID)
	if err != nil {
		t.Fatal(err)
	}
	if shown.Prewarm == nil || len(shown.Prewarm.HotSets) != 2 {
		t.Errorf("tenant show prewarm = %+v, want hot sets on both nodes", shown.Prewarm)
	}
}

// TestCapture_InterruptedKeepsPrevious: a capture that fails before storing
// leaves the previous hot sets as they were.
func TestCapture_InterruptedKeepsPrevious(t *testing.T) {
	e := start(t, nil)
	ctx := context.Background()
	r := e.tenant(t, "database", 1)
	read(t, r.DSN, 1)
	cl, _ := e.svc.Clusters.Get("local")
	if _, err := e.svc.Capture(ctx, cl, "primary"); err != nil {
		t.Fatal(err)
	}
	before, _ := hotSet(t, e, r.Tenant.ID)
	prewarm.SetBeforeStore(e.svc, func(context.Context) error { return errors.New("killed") })
	if _, err := e.svc.Capture(ctx, cl, "primary"); err == nil {
		t.Fatal("interrupted capture reported success")
	}
	prewarm.SetBeforeStore(e.svc, nil)
	after, ok := hotSet(t, e, r.Tenant.ID)
	if !ok || !after.CapturedAt.Equal(before.CapturedAt) || after.Blocks != before.Blocks {
		t.Errorf("hot set after an interrupted capture = %+v, want the previous %+v", after, before)
	}
}

// TestPrewarm_AfterRestartHottestFirst: after a restart the daemon prewarms
// by itself; the hot tenant's blocks fill the shared buffers first, the
// colder tenant gets only what is left, and a tenant dropped since the
// capture is skipped without failing the job.
func TestPrewarm_AfterRestartHottestFirst(t *testing.T) {
	// About 2,000 of the 4,096 free buffers after a restart: room for the
	// hot tenant's ~1,600 hot blocks, not for both tenants'.
	e := start(t, func(c *config.Config) { c.Prewarm.BufferFraction = 0.5 })
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	hot := e.tenant(t, "database", 8)  // ~1,000 blocks
	cold := e.tenant(t, "schema", 8)   // ~1,000 blocks
	gone := e.tenant(t, "database", 1) // dropped after the capture
	read(t, cold.DSN, 1)
	read(t, gone.DSN, 1)
	read(t, hot.DSN, 6)
	cl, _ := e.svc.Clusters.Get("local")
	if err := e.svc.Check(ctx, cl, "primary"); err != nil { // first sight: recorded, no prewarm
		t.Fatal(err)
	}
	if _, err := e.svc.Capture(ctx, cl, "primary"); err != nil {
		t.Fatal(err)
	}
	hh, _ := hotSet(t, e, hot.Tenant.ID)
	ch, _ := hotSet(t, e, cold.Tenant.ID)
	if hh.Activity <= ch.Activity {
		t.Fatalf("hot tenant activity %d <= cold tenant activity %d; the workload did not make it busier", hh.Activity, ch.Activity)
	}
	if _, err := e.c.DropTenant(ctx, gone.Tenant.ID, false); err != nil {
		t.Fatal(err)
	}

	if err := pg.StopNode(ctx, "primary", "fast"); err != nil {
		t.Fatal(err)
	}
	if err := pg.StartNode(ctx, "primary"); err != nil {
		t.Fatal(err)
	}
	e.svc.Store.Pool().Reset() // the test's own pool: its connections died with the restart
	// The daemon notices the restart and prewarms.
	var job jobs.Job
	for {
		js, err := e.c.Jobs(ctx, url.Values{"type": {string(jobs.Prewarm)}})
		if err == nil && len(js) > 0 {
			if job, err = e.c.WaitJob(ctx, js[0].ID, nil); err != nil {
				t.Fatal(err)
			}
			break
		}
		select {
		case <-ctx.Done():
			t.Fatal("no prewarm after the restart")
		case <-time.After(100 * time.Millisecond):
		}
	}
	if job.State != jobs.Succeeded || !strings.Contains(string(job.Args), "restart") {
		t.Fatalf("prewarm job = %s %s (%s), want succeeded after a restart", job.State, job.LastError, job.Args)
	}
	results := map[string]prewarm.TenantResult{}
	for _, r := range []api.CreateTenantResponse{hot, cold, gone} {
		rs, err := e.svc.Results(ctx, r.Tenant.ID)
		if err != nil || len(rs) != 1 {
			t.Fatalf("results of %s: %+v, %v", r.Tenant.ID, rs, err)
		}
		results[r.Tenant.ID] = rs[0]
	}
	if r := results[hot.Tenant.ID]; r.State != "done" || r.BlocksBuffer != hh.Blocks || r.BlocksOS != 0 {
		t.Errorf("hot tenant: %+v, want all %d blocks into shared_buffers", r, hh.Blocks)
	}
	if r := results[cold.Tenant.ID]; r.State != "done" || r.BlocksOS == 0 || r.BlocksBuffer+r.BlocksOS != ch.Blocks {
		t.Errorf("cold tenant: %+v, want what is left of the budget in shared_buffers and the rest in the OS cache", r)
	}
	if r := results[gone.Tenant.ID]; r.State != "skipped" {
		t.Errorf("dropped tenant: %+v, want skipped", r)
	}
	// /metrics has the same, per cluster and node.
	reg := prometheus.NewPedanticRegistry()
	reg.MustRegister(prewarm.NewCollector(e.svc))
	fams, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	states := map[string]float64{}
	for _, f := range fams {
		for _, m := range f.GetMetric() {
			if f.GetName() == "pgtenant_prewarm_tenants" {
				labels := map[string]string{}
				for _, l := range m.GetLabel() {
					labels[l.GetName()] = l.GetValue()
				}
				states[labels["cluster"]+"/"+labels["node"]+"/"+labels["state"]] = m.GetGauge().GetValue()
			}
		}
	}
	if want := map[string]float64{"local/primary/done": 2, "local/primary/skipped": 1}; !maps.Equal(states, want) {
		t.Errorf("pgtenant_prewarm_tenants = %v, want %v", states, want)
	}
	// The cache holds all of the hot tenant's table, checked through pg_buffercache.
	heapBlocks := func(r api.CreateTenantResponse) int {
		var n int
		withConn(t, r.DSN, func(conn *pgx.Conn) {
			if err := conn.QueryRow(ctx, `SELECT pg_relation_size('kv') / 8192`).Scan(&n); err != nil {
				t.Fatal(err)
			}
		})
		return n
	}
	if got, want := cached(t, hot.Tenant.Database, filenode(t, hot)), heapBlocks(hot); got < want {
		t.Errorf("hot tenant's table: %d of %d blocks in shared_buffers after prewarm", got, want)
	}
	if got, all := cached(t, cold.Tenant.Database, filenode(t, cold)), heapBlocks(cold); got >= all {
		t.Errorf("cold tenant's table: %d of %d blocks in shared_buffers; the budget should have left it partly out", got, all)
	}
}

// TestPrewarm_ResumeTriggers: resuming a suspended tenant prewarms it.
func TestPrewarm_ResumeTriggers(t *testing.T) {
	e := start(t, nil)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	r := e.tenant(t, "database", 1)
	read(t, r.DSN, 2)
	cl, _ := e.svc.Clusters.Get("local")
	if _, err := e.svc.Capture(ctx, cl, "primary"); err != nil {
		t.Fatal(err)
	}
	if _, err := e.c.TenantAction(ctx, r.Tenant.ID, "suspend"); err != nil {
		t.Fatal(err)
	}
	if _, err := e.c.TenantAction(ctx, r.Tenant.ID, "resume"); err != nil {
		t.Fatal(err)
	}
	for {
		js, err := e.c.Jobs(ctx, url.Values{"type": {string(jobs.Prewarm)}, "target": {r.Tenant.ID}})
		if err != nil {
			t.Fatal(err)
		}
		if len(js) == 1 && js[0].State == jobs.Succeeded {
			break
		}
		select {
		case <-ctx.Done():
			t.Fatalf("no successful prewarm after resume: %+v", js)
		case <-time.After(100 * time.Millisecond):
		}
	}
	rs, err := e.svc.Results(ctx, r.Tenant.ID)
	h, _ := hotSet(t, e, r.Tenant.ID)
	if err != nil || len(rs) != 1 || rs[0].State != "done" || rs[0].BlocksBuffer+rs[0].BlocksOS != h.Blocks {
		t.Errorf("prewarm after resume = %+v, %v; want its %d hot blocks loaded", rs, err, h.Blocks)
	}
}
