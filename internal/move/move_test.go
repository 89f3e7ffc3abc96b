package move_test

import (
	"context"
	"fmt"
	"net/url"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	examples "github.com/pgtenant/pgtenant/examples/templates"
	"github.com/pgtenant/pgtenant/internal/api"
	"github.com/pgtenant/pgtenant/internal/catalog"
	"github.com/pgtenant/pgtenant/internal/cluster"
	"github.com/pgtenant/pgtenant/internal/config"
	"github.com/pgtenant/pgtenant/internal/daemon"
	"github.com/pgtenant/pgtenant/internal/daemon/daemontest"
	"github.com/pgtenant/pgtenant/internal/jobs"
	"github.com/pgtenant/pgtenant/internal/move"
	"github.com/pgtenant/pgtenant/internal/pgtest"
	"github.com/pgtenant/pgtenant/internal/provision"
	"github.com/pgtenant/pgtenant/internal/tenant"
)

// pgs are two clusters, local and local2: tenants move between them.
var pgs []*pgtest.Cluster

func TestMain(m *testing.M) {
	os.Exit(pgtest.MainClusters(m, []pgtest.Options{{Name: "local"}, {Name: "local2"}}, &pgs))
}

const pooledTier = "pooled"

// fleet runs a daemon over both clusters, each with its PgBouncer, and the
// saas template built on both.
func fleet(t *testing.T) (*daemon.Daemon, *api.Client) {
	t.Helper()
	d, c, _ := daemontest.StartClusters(t, pgs, testConfig(t), true)
	buildSaas(t, c)
	return d, c
}

func testConfig(t *testing.T) config.Config {
	cfg := daemontest.Config(t, pgs[0])
	cfg.Provision.DefaultPoolSize = 0
	cfg.Metrics.Interval = 0
	cfg.Prewarm.CaptureInterval = 0
	cfg.Prewarm.WatchInterval = 0
	cfg.Drop.Retention = config.Duration(time.Second)
	cfg.Tiers[pooledTier] = config.Tier{ConnectionLimit: 5, StatementTimeout: config.Duration(30 * time.Second),
		PoolMode: "transaction", PoolSize: 2, MaxDBConnections: 2}
	return cfg
}

func buildSaas(t *testing.T, c *api.Client) {
	t.Helper()
	ctx := pgtest.Context(t)
	added, err := c.CreateTemplate(ctx, "saas", examples.Saas())
	if err != nil {
		t.Fatal(err)
	}
	for _, j := range added.BuildJobs {
		if j, err := c.WaitJob(ctx, j.ID, nil); err != nil || j.State != jobs.Succeeded {
			t.Fatalf("build: %v %s", err, j.LastError)
		}
	}
}

func connectDSN(ctx context.Context, dsn string) (*pgx.Conn, error) {
	cfg, err := pgx.ParseConfig(dsn)
	if err != nil {
		return nil, err
	}
	// Behind a transaction pool: the simple protocol (docs/connections.md).
	cfg.DefaultQueryExecMode = pgx.QueryExecModeSimpleProtocol
	return pgx.ConnectConfig(ctx, cfg)
}

// writer inserts rows numbered 1, 2, … through the tenant's DSN, one
// transaction each, and keeps the numbers it was told were committed.
type writer struct {
	mu    sync.Mutex
	acked []int
	errs  []error
	stop  chan struct{}
	done  chan struct{}
}

func startWriter(t *testing.T, ctx context.Context, dsn string) *writer {
	t.Helper()
	conn, err := connectDSN(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	w := &writer{stop: make(chan struct{}), done: make(chan struct{})}
	go func() {
		defer close(w.done)
		defer conn.Close(context.Background())
		for n := 1; ; n++ {
			select {
			case <-w.stop:
				return
			default:
			}
			// The sequence's default and a row of the template's own table
			// in one transaction.
			_, err := conn.Exec(ctx, fmt.Sprintf(`BEGIN; INSERT INTO w (n) VALUES (%d); INSERT INTO organizations (name, slug) VALUES ('o%d', 's%d'); COMMIT`, n, n, n))
			w.mu.Lock()
			if err != nil {
				w.errs = append(w.errs, err)
				w.mu.Unlock()
				return
			}
			w.acked = append(w.acked, n)
			w.mu.Unlock()
		}
	}()
	return w
}

func (w *writer) count() int {
	w.mu.Lock()
	defer w.mu.Unlock()
	return len(w.acked)
}

// waitFor waits until the writer has acknowledged n more rows (or failed).
func (w *writer) waitFor(t *testing.T, n int) {
	t.Helper()
	want := w.count() + n
	for w.count() < want {
		select {
		case <-w.done:
			return
		case <-time.After(5 * time.Millisecond):
		}
	}
}

func (w *writer) finish() ([]int, []error) {
	close(w.stop)
	<-w.done
	return w.acked, w.errs
}

// TestMove_OnlineWhileWriting moves a database tenant and a schema tenant
// from local to local2 while a client writes through the pooler: the
// client sees no error, every acknowledged row is on the target exactly
// once, sequences are ahead of every used value, the DSN is the same, the
// pause is in the tenant's events, the replication objects are gone, and
// the source copy is locked, then purged after the retention.
func TestMove_OnlineWhileWriting(t *testing.T) {
	ctx := pgtest.Context(t)
	_, c := fleet(t)
	for _, mode := range []string{"database", "schema"} {
		t.Run(mode, func(t *testing.T) {
			r, err := c.CreateTenant(ctx, provision.Request{Template: "saas", Mode: tenant.Mode(mode), Tier: pooledTier, Cluster: "local"})
			if err != nil {
				t.Fatal(err)
			}
			id := r.Tenant.ID
			role := "t_" + id
			setup, err := connectDSN(ctx, r.DSN)
			if err != nil {
				t.Fatal(err)
			}
			// Row-level security (not forced): its owner, and the move's
			// roles that are members of it, are not subject to it.
			if _, err := setup.Exec(ctx, `CREATE TABLE w (id bigserial PRIMARY KEY, n int NOT NULL UNIQUE, at timestamptz NOT NULL DEFAULT now());
				ALTER TABLE w ENABLE ROW LEVEL SECURITY`); err != nil {
				t.Fatal(err)
			}
			setup.Close(ctx)
			before, err := c.Tenant(ctx, id)
			if err != nil {
				t.Fatal(err)
			}

			wr := startWriter(t, ctx, r.DSN)
			wr.waitFor(t, 50)
			j, err := c.MoveTenant(ctx, id, "local2")
			if err != nil {
				t.Fatal(err)
			}
			j, err = c.WaitJob(ctx, j.ID, nil)
			if err != nil || j.State != jobs.Succeeded {
				t.Fatalf("move: %v %s %s", err, j.State, j.LastError)
			}
			wr.waitFor(t, 50) // writes go on, on the target
			acked, errs := wr.finish()
			if len(errs) > 0 {
				t.Errorf("the client saw %d errors, want none: %v", len(errs), errs[0])
			}

			after, err := c.Tenant(ctx, id)
			if err != nil {
				t.Fatal(err)
			}
			if after.Cluster != "local2" || after.DSN != before.DSN {
				t.Errorf("after the move: cluster %s dsn %s; want local2 and the same dsn %s", after.Cluster, after.DSN, before.DSN)
			}
			var pauses int
			for _, e := range after.Events {
				if e.Kind == "move_pause" {
					pauses++
				}
			}
			if pauses != 1 {
				t.Errorf("move_pause events = %d, want 1 (events %+v)", pauses, after.Events)
			}

			// Every acknowledged row on the target exactly once, and
			// nothing else; sequences ahead of every used value.
			db := after.Database
			dst := pgs[1].Conn(t, db)
			schema := "public"
			if mode == "schema" {
				schema = role
			}
			var rows, distinct, maxN int
			var maxID, seq, orgs int64
			if err := dst.QueryRow(ctx, fmt.Sprintf(`SELECT count(*), count(DISTINCT n), coalesce(max(n), 0), coalesce(max(id), 0),
				(SELECT last_value FROM %[1]s.w_id_seq), (SELECT count(*) FROM %[1]s.organizations) FROM %[1]s.w`, schema)).Scan(&rows, &distinct, &maxN, &maxID, &seq, &orgs); err != nil {
				t.Fatal(err)
			}
			if rows != len(acked) || distinct != len(acked) || maxN != acked[len(acked)-1] || orgs != int64(len(acked)) {
				t.Errorf("on the target: %d rows, %d distinct, max n %d, %d organizations; want %d acknowledged rows up to %d, once each",
					rows, distinct, maxN, orgs, len(acked), acked[len(acked)-1])
			}
			if seq < maxID {
				t.Errorf("sequence w_id_seq at %d, behind the largest id %d", seq, maxID)
			}

			// The move's replication objects are gone from both sides.
			var subs, slots, pubs int
			if err := dst.QueryRow(ctx, `SELECT count(*) FROM pg_subscription WHERE subname = $1`, move.Name(id)).Scan(&subs); err != nil {
				t.Fatal(err)
			}
			src := pgs[0].Conn(t, "postgres")
			if err := src.QueryRow(ctx, `SELECT count(*) FROM pg_replication_slots WHERE slot_name = $1`, move.Name(id)).Scan(&slots); err != nil {
				t.Fatal(err)
			}
			if subs+slots != 0 {
				t.Errorf("%d subscriptions on local2 and %d slots on local left, want none", subs, slots)
			}
			if mode == "database" {
				srcDB := pgs[0].Conn(t, db)
				if err := srcDB.QueryRow(ctx, `SELECT count(*) FROM pg_publication`).Scan(&pubs); err != nil {
					t.Fatal(err)
				}
				if pubs != 0 {
					t.Errorf("%d publications left in the source database", pubs)
				}
			}

			// The source copy is purged once the retention (1 s) ends.
			purged := false
			for !purged && ctx.Err() == nil {
				var roles int
				if err := src.QueryRow(ctx, `SELECT count(*) FROM pg_roles WHERE rolname = $1`, role).Scan(&roles); err != nil {
					t.Fatal(err)
				}
				purged = roles == 0
				time.Sleep(50 * time.Millisecond)
			}
			var dbs int
			if err := src.QueryRow(ctx, `SELECT count(*) FROM pg_database WHERE datname = $1`, role).Scan(&dbs); err != nil {
				t.Fatal(err)
			}
			if !purged || dbs != 0 {
				t.Errorf("the source copy is still on local: role purged %v, databases %d", purged, dbs)
			}
			// reconcile finds nothing of the tenant on either cluster
			// (its pooler entry included).
			reconcileClean(t, c, id)
			// And the tenant is still served on local2.
			conn, err := connectDSN(ctx, r.DSN)
			if err != nil {
				t.Fatalf("connect after the purge of the source copy: %v", err)
			}
			var n int
			if err := conn.QueryRow(ctx, `SELECT count(*) FROM w`).Scan(&n); err != nil || n != len(acked) {
				t.Errorf("through the DSN after the purge: %d rows, err %v; want %d", n, err, len(acked))
			}
			conn.Close(ctx)
		})
	}
}

// TestMove_RefusedBeforeAnythingIsCopied: a tenant with a table without a
// primary key, a table under FORCE ROW LEVEL SECURITY and a large object is refused, with the reasons, before the
// target gets anything; it stays on its cluster and serves.
func TestMove_RefusedBeforeAnythingIsCopied(t *testing.T) {
	ctx := pgtest.Context(t)
	c, r, conn := tenantOnLocal(t)
	if _, err := conn.Exec(ctx, `CREATE TABLE nokey (v text); INSERT INTO nokey VALUES ('x'); SELECT lo_from_bytea(0, 'blob');
		CREATE TABLE forced (id int PRIMARY KEY); ALTER TABLE forced ENABLE ROW LEVEL SECURITY; ALTER TABLE forced FORCE ROW LEVEL SECURITY`); err != nil {
		t.Fatal(err)
	}
	j, err := c.MoveTenant(ctx, r.Tenant.ID, "local2")
	if err != nil {
		t.Fatal(err)
	}
	j, err = c.WaitJob(ctx, j.ID, nil)
	if err != nil {
		t.Fatal(err)
	}
	if j.State != jobs.Failed || !strings.Contains(j.LastError, "move refused") || !strings.Contains(j.LastError, "nokey has no primary key or replica identity") ||
		!strings.Contains(j.LastError, "large objects") || !strings.Contains(j.LastError, "forced is under FORCE ROW LEVEL SECURITY") {
		t.Errorf("move: %s %q; want failed, refused naming the tables and the large objects", j.State, j.LastError)
	}
	if len(j.Steps) != 0 {
		t.Errorf("steps done: %+v; want none (refused at check)", j.Steps)
	}
	var roles, dbs int
	dst := pgs[1].Conn(t, "postgres")
	if err := dst.QueryRow(ctx, `SELECT (SELECT count(*) FROM pg_roles WHERE rolname LIKE '%' || $1), (SELECT count(*) FROM pg_database WHERE datname = $2)`,
		r.Tenant.ID, "t_"+r.Tenant.ID).Scan(&roles, &dbs); err != nil {
		t.Fatal(err)
	}
	if roles+dbs != 0 {
		t.Errorf("local2 has %d roles and %d databases of the refused tenant, want none", roles, dbs)
	}
	stillServedOnLocal(t, c, conn, r.Tenant.ID, "nokey")
	js, err := c.Jobs(ctx, url.Values{"type": {string(jobs.TenantMove)}, "target": {r.Tenant.ID}})
	if err != nil || len(js) != 1 {
		t.Errorf("move jobs of the tenant: %d %v; want 1", len(js), err)
	}
}

// TestMove_RefusedWhenTablesChangeMidMove: a table the tenant creates after
// the schema step is not on the target; the copy refuses the move for good
// (no retries), naming it, and the tenant stays where it was, serving,
// with nothing of it left on the target.
func TestMove_RefusedWhenTablesChangeMidMove(t *testing.T) {
	ctx := pgtest.Context(t)
	c, r, conn := tenantOnLocal(t)
	defer move.SetCrashHook(nil)
	var once sync.Once
	move.SetCrashHook(func(ctx context.Context, p string) error {
		if p != "copy" {
			return nil
		}
		var err error
		once.Do(func() { _, err = conn.Exec(ctx, `CREATE TABLE late (id int PRIMARY KEY); INSERT INTO late VALUES (1)`) })
		return err
	})
	j, err := c.MoveTenant(ctx, r.Tenant.ID, "local2")
	if err != nil {
		t.Fatal(err)
	}
	if j, err = c.WaitJob(ctx, j.ID, nil); err != nil {
		t.Fatal(err)
	}
	if j.State != jobs.Failed || !strings.Contains(j.LastError, "move refused") || !strings.Contains(j.LastError, "late") || j.Attempts != 1 {
		t.Errorf("move: %s after %d attempts: %q; want failed at once, refused naming the new table", j.State, j.Attempts, j.LastError)
	}
	stillServedOnLocal(t, c, conn, r.Tenant.ID, "late")
	var dbs int
	if err := pgs[1].Conn(t, "postgres").QueryRow(ctx, `SELECT count(*) FROM pg_database WHERE datname = $1`, "t_"+r.Tenant.ID).Scan(&dbs); err != nil || dbs != 0 {
		t.Errorf("local2 keeps %d databases of the tenant (%v), want none", dbs, err)
	}
}

// tenantOnLocal starts the two-cluster fleet and creates a database tenant
// on local: the client, the tenant, and a connection as the tenant.
func tenantOnLocal(t *testing.T) (*api.Client, api.CreateTenantResponse, *pgx.Conn) {
	t.Helper()
	ctx := pgtest.Context(t)
	_, c := fleet(t)
	r, err := c.CreateTenant(ctx, provision.Request{Template: "saas", Mode: "database", Cluster: "local"})
	if err != nil {
		t.Fatal(err)
	}
	conn, err := connectDSN(ctx, r.DSN)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close(context.Background()) })
	return c, r, conn
}

// stillServedOnLocal checks that a tenant whose move was refused is active
// on local and that its table (one row) still answers.
func stillServedOnLocal(t *testing.T, c *api.Client, conn *pgx.Conn, id, table string) {
	t.Helper()
	ctx := pgtest.Context(t)
	after, err := c.Tenant(ctx, id)
	if err != nil || after.Cluster != "local" || after.State != "active" {
		t.Errorf("after the refusal: %+v %v; want active on local", after.Tenant, err)
	}
	var n int
	if err := conn.QueryRow(ctx, `SELECT count(*) FROM `+table).Scan(&n); err != nil || n != 1 {
		t.Errorf("the tenant no longer serves: %d %v", n, err)
	}
}

// waitStep waits until a job has recorded step (or ended).
func waitStep(t *testing.T, c *api.Client, id int64, step string) jobs.Job {
	t.Helper()
	ctx := pgtest.Context(t)
	for {
		j, err := c.Job(ctx, id)
		if err != nil {
			t.Fatal(err)
		}
		for _, s := range j.Steps {
			if s.Step == step {
				return j
			}
		}
		if jobs.Finished(j.State) {
			t.Fatalf("job %d ended %s before step %s: %s", id, j.State, step, j.LastError)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// TestMove_ResumesAfterTheDaemonStops stops the daemon once the
// subscription is made and starts another on the same catalog: it resumes
// the move from its next step and finishes it, every row on the target.
// Then a move cancelled during the copy leaves its tenant on its cluster,
// serving, and nothing of it on the target.
func TestMove_ResumesAfterTheDaemonStops(t *testing.T) {
	ctx := pgtest.Context(t)
	cfg := testConfig(t)
	_, c, stop := daemontest.StartClusters(t, pgs, cfg, false)
	buildSaas(t, c)
	r, err := c.CreateTenant(ctx, provision.Request{Template: "saas", Mode: "database", Cluster: "local"})
	if err != nil {
		t.Fatal(err)
	}
	conn, err := connectDSN(ctx, r.DSN)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := conn.Exec(ctx, `INSERT INTO organizations (name, slug) SELECT 'o' || i, 's' || i FROM generate_series(1, 500) i`); err != nil {
		t.Fatal(err)
	}
	conn.Close(ctx)
	j, err := c.MoveTenant(ctx, r.Tenant.ID, "local2")
	if err != nil {
		t.Fatal(err)
	}
	waitStep(t, c, j.ID, "subscribe")
	stop()

	_, c, _ = daemontest.StartClusters(t, pgs, cfg, false)
	j, err = c.WaitJob(ctx, j.ID, nil)
	if err != nil || j.State != jobs.Succeeded {
		t.Fatalf("move after the restart: %v %s %s", err, j.State, j.LastError)
	}
	workers := map[string]string{}
	for _, s := range j.Steps {
		workers[s.Step] = s.Worker
	}
	if workers["subscribe"] == workers["finish"] {
		t.Errorf("steps %+v: want subscribe and finish done by two daemons", j.Steps)
	}
	var orgs int
	if err := pgs[1].Conn(t, r.Tenant.Database).QueryRow(ctx, `SELECT count(*) FROM public.organizations`).Scan(&orgs); err != nil || orgs != 500 {
		t.Errorf("organizations on the target: %d %v, want 500", orgs, err)
	}

	// A cancelled move.
	s, err := c.CreateTenant(ctx, provision.Request{Template: "saas", Mode: "schema", Cluster: "local"})
	if err != nil {
		t.Fatal(err)
	}
	id := s.Tenant.ID
	j, err = c.MoveTenant(ctx, id, "local2")
	if err != nil {
		t.Fatal(err)
	}
	waitStep(t, c, j.ID, "subscribe")
	if _, err := c.CancelJob(ctx, j.ID); err != nil {
		t.Fatal(err)
	}
	if j, err = c.WaitJob(ctx, j.ID, nil); err != nil || j.State != jobs.Cancelled {
		t.Fatalf("cancelled move: %v %s %s", err, j.State, j.LastError)
	}
	after, err := c.Tenant(ctx, id)
	if err != nil || after.Cluster != "local" || after.State != "active" {
		t.Fatalf("after the cancel: %+v %v; want active on local", after.Tenant, err)
	}
	tc, err := connectDSN(ctx, s.DSN)
	if err != nil {
		t.Fatalf("the tenant cannot log in after the cancel: %v", err)
	}
	if _, err := tc.Exec(ctx, `INSERT INTO organizations (name, slug) VALUES ('after', 'after')`); err != nil {
		t.Errorf("the tenant cannot write after the cancel: %v", err)
	}
	tc.Close(ctx)
	var left int
	if err := pgs[1].Conn(t, s.Tenant.Database).QueryRow(ctx, `SELECT
			(SELECT count(*) FROM pg_roles WHERE rolname IN ($1, $2, $3))
			+ (SELECT count(*) FROM pg_namespace WHERE nspname = $1)
			+ (SELECT count(*) FROM pg_subscription WHERE subname = $3)`,
		"t_"+id, "pgt_agent_"+id, move.Name(id)).Scan(&left); err != nil {
		t.Fatal(err)
	}
	var slots int
	if err := pgs[0].Conn(t, "postgres").QueryRow(ctx, `SELECT count(*) FROM pg_replication_slots WHERE slot_name = $1`, move.Name(id)).Scan(&slots); err != nil {
		t.Fatal(err)
	}
	if left+slots != 0 {
		t.Errorf("after the cancel: %d of the tenant's roles, schema or subscription on local2 and %d slots on local, want none", left, slots)
	}
}

// startKeeping runs a daemon over both clusters whose PgBouncers (given,
// keep_running) outlive it, as a daemon killed with kill -9 leaves them:
// the tenants' clients stay connected across its restart. stop stops the
// daemon (a job in progress goes back to the queue).
func startKeeping(t *testing.T, cfg config.Config, poolers map[string]config.PoolerConfig) (*api.Client, func()) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	opts := daemon.Options{Config: cfg, Logger: pgtest.Logger(t), Poolers: poolers}
	for _, pg := range pgs {
		m := catalog.Cluster{Name: pg.Name(), DSN: pg.PrimaryDSN("postgres")}
		for _, s := range pg.Standbys() {
			m.StandbyDSNs = append(m.StandbyDSNs, pg.DSN(s, "postgres"))
		}
		opts.Managed = append(opts.Managed, m)
	}
	d, err := daemon.New(ctx, opts)
	if err != nil {
		cancel()
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- d.Run(ctx) }()
	var once sync.Once
	stop := func() {
		once.Do(func() {
			cancel()
			if err := <-done; err != nil {
				t.Errorf("daemon: %v", err)
			}
		})
	}
	t.Cleanup(stop)
	return api.NewClient(d.URL(), d.Token()), stop
}

// TestMove_KilledAtEachPoint kills the daemon at each point of a move —
// before each step, with the rows copied but not committed, paused at the
// pooler with the source locked out before the switch, switched but not
// resumed, with the replication objects dropped but the source's purge not
// queued — while a client writes through the tenant's pooler DSN, and
// starts another daemon on the same catalog (the PgBouncers keep running,
// as they do when a daemon is killed): the move resumes and ends with the
// tenant on the target, every acknowledged row there exactly once, the
// client without an error, no subscription, slot or publication left, and
// reconcile clean (the pooler's entry is where the catalog says). A move
// cancelled at the copy or while paused leaves the tenant on its cluster,
// serving, and nothing of it on the target.
func TestMove_KilledAtEachPoint(t *testing.T) {
	if testing.Short() {
		t.Skip("a move per point")
	}
	ctx := pgtest.Context(t)
	cfg := testConfig(t)
	poolers := map[string]config.PoolerConfig{}
	keep := true
	for _, pg := range pgs {
		pc := daemontest.Pooler(t)
		pc.KeepRunning = &keep
		poolers[pg.Name()] = pc
	}
	c, stop := startKeeping(t, cfg, poolers)
	t.Cleanup(func() {
		// The last daemon stops the PgBouncers.
		for name, pc := range poolers {
			no := false
			pc.KeepRunning = &no
			poolers[name] = pc
		}
		_, stop := startKeeping(t, cfg, poolers)
		stop()
	})
	buildSaas(t, c)
	defer move.SetCrashHook(nil)
	parent := t

	cases := []struct {
		point  string
		cancel bool // cancel the job there instead of killing the daemon
	}{
		{point: "schema"}, {point: "subscribe"}, {point: "copy"}, {point: "copy:rows"}, {point: "cutover"},
		{point: "cutover:paused"}, {point: "cutover:switched"}, {point: "finish"}, {point: "finish:dropped"},
		{point: "copy:rows", cancel: true}, {point: "cutover:paused", cancel: true},
	}
	for i, tc := range cases {
		mode := tenant.Modes[i%2]
		name := tc.point + "/" + string(mode)
		if tc.cancel {
			name = "cancel at " + name
		}
		t.Run(name, func(t *testing.T) {
			r, err := c.CreateTenant(ctx, provision.Request{Template: "saas", Mode: mode, Tier: pooledTier, Cluster: "local"})
			if err != nil {
				t.Fatal(err)
			}
			id := r.Tenant.ID
			setup, err := connectDSN(ctx, r.DSN)
			if err != nil {
				t.Fatal(err)
			}
			if _, err := setup.Exec(ctx, `CREATE TABLE w (id bigserial PRIMARY KEY, n int NOT NULL UNIQUE, at timestamptz NOT NULL DEFAULT now())`); err != nil {
				t.Fatal(err)
			}
			setup.Close(ctx)
			wr := startWriter(t, ctx, r.DSN)
			wr.waitFor(t, 30)

			hit := make(chan struct{})
			var once sync.Once
			move.SetCrashHook(func(ctx context.Context, p string) error {
				if p != tc.point {
					return nil
				}
				once.Do(func() { close(hit) })
				<-ctx.Done() // the daemon stops (or the job is cancelled) here
				return ctx.Err()
			})
			j, err := c.MoveTenant(ctx, id, "local2")
			if err != nil {
				t.Fatal(err)
			}
			select {
			case <-hit:
			case <-ctx.Done():
				t.Fatalf("the move never reached %s", tc.point)
			}
			move.SetCrashHook(nil)
			want, wantState := "local2", jobs.Succeeded
			if tc.cancel {
				if _, err := c.CancelJob(ctx, j.ID); err != nil {
					t.Fatal(err)
				}
				want, wantState = "local", jobs.Cancelled
			} else {
				stop()
				c, stop = startKeeping(parent, cfg, poolers) // lives past this subtest
			}
			if j, err = c.WaitJob(ctx, j.ID, nil); err != nil || j.State != wantState {
				t.Fatalf("move: %v %s %s; want %s", err, j.State, j.LastError, wantState)
			}
			wr.waitFor(t, 30) // writes go on, where the tenant is
			acked, errs := wr.finish()
			if len(errs) > 0 {
				t.Errorf("the client saw %d errors, want none: %v", len(errs), errs[0])
			}
			after, err := c.Tenant(ctx, id)
			if err != nil {
				t.Fatal(err)
			}
			if after.Cluster != want || after.State != "active" {
				t.Fatalf("after the move: %s on %s, want active on %s", after.State, after.Cluster, want)
			}
			on := pgs[0]
			if want == "local2" {
				on = pgs[1]
			}
			// Every acknowledged row exactly once where the tenant is.
			schema := "public"
			if mode == "schema" {
				schema = "t_" + id
			}
			var rows, distinct, orgs int
			var sum int64
			if err := on.Conn(t, after.Database).QueryRow(ctx, fmt.Sprintf(`SELECT count(*), count(DISTINCT n), coalesce(sum(n), 0),
				(SELECT count(*) FROM %[1]s.organizations) FROM %[1]s.w`, cluster.Ident(schema))).Scan(&rows, &distinct, &sum, &orgs); err != nil {
				t.Fatal(err)
			}
			var wantSum int64
			for _, n := range acked {
				wantSum += int64(n)
			}
			if rows != len(acked) || distinct != len(acked) || sum != wantSum || orgs != len(acked) {
				t.Errorf("on %s: %d rows, %d distinct, sum %d, %d organizations; want the %d acknowledged rows once each (sum %d)",
					want, rows, distinct, sum, orgs, len(acked), wantSum)
			}
			// No replication object of the move left on either side.
			var left int
			for _, pg := range pgs {
				var n int
				if err := pg.Conn(t, "postgres").QueryRow(ctx, `SELECT (SELECT count(*) FROM pg_replication_slots WHERE slot_name = $1)
					+ (SELECT count(*) FROM pg_subscription WHERE subname = $1)`, move.Name(id)).Scan(&n); err != nil {
					t.Fatal(err)
				}
				left += n
			}
			if conn, err := pgx.Connect(ctx, pgs[0].PrimaryDSN(after.Database)); err == nil { // purged already, or not
				var n int
				if err := conn.QueryRow(ctx, `SELECT count(*) FROM pg_publication WHERE pubname = $1`, move.Name(id)).Scan(&n); err == nil {
					left += n
				}
				conn.Close(ctx)
			}
			if left != 0 {
				t.Errorf("%d slots, subscriptions or publications of the move left, want none", left)
			}
			if tc.cancel {
				var n int
				if err := pgs[1].Conn(t, "postgres").QueryRow(ctx, `SELECT (SELECT count(*) FROM pg_roles WHERE rolname IN ($1, $2, $3))
					+ (SELECT count(*) FROM pg_database WHERE datname = $1)`, "t_"+id, "pgt_agent_"+id, move.Name(id)).Scan(&n); err != nil {
					t.Fatal(err)
				}
				if n != 0 {
					t.Errorf("after the cancel: %d of the tenant's roles or database on local2, want none", n)
				}
			}
			if !tc.cancel {
				// The source copy is purged once the retention (1 s) ends.
				src := pgs[0].Conn(t, "postgres")
				for roles := 1; roles != 0 && ctx.Err() == nil; time.Sleep(50 * time.Millisecond) {
					if err := src.QueryRow(ctx, `SELECT count(*) FROM pg_roles WHERE rolname = $1`, "t_"+id).Scan(&roles); err != nil {
						t.Fatal(err)
					}
				}
			}
			// The pooler's entry is where the catalog says: reconcile finds
			// nothing of the tenant.
			reconcileClean(t, c, id)
			conn, err := connectDSN(ctx, r.DSN)
			if err != nil {
				t.Fatal(err)
			}
			var port string
			if err := conn.QueryRow(ctx, `SHOW port`).Scan(&port); err != nil {
				t.Fatal(err)
			}
			conn.Close(ctx)
			if !strings.Contains(on.PrimaryDSN("postgres"), port) {
				t.Errorf("the DSN reaches the server on port %s, want %s's (%s)", port, want, on.PrimaryDSN("postgres"))
			}
		})
	}
}

// TestMove_FailsWhenTheTargetCannotKeepUp: a tenant whose rows take the
// target's apply worker far longer to apply than the tenant takes to write
// them (a CHECK that sleeps in the apply worker's session only) cannot be
// cut over: after the catch-up time (shortened here) the move pauses, the
// paused catch-up does not end within the switch timeout, and the move
// fails, saying why, without switching: the tenant stays on its cluster
// (no pause is recorded as a move's), its client waited but saw no error,
// and nothing of it is left on the target.
func TestMove_FailsWhenTheTargetCannotKeepUp(t *testing.T) {
	if testing.Short() {
		t.Skip("waits for the switch timeout")
	}
	ctx := pgtest.Context(t)
	move.SetCatchUpTimeout(5 * time.Second)
	defer move.SetCatchUpTimeout(10 * time.Minute)
	_, c := fleet(t)
	r, err := c.CreateTenant(ctx, provision.Request{Template: "saas", Mode: "database", Tier: pooledTier, Cluster: "local"})
	if err != nil {
		t.Fatal(err)
	}
	id := r.Tenant.ID
	setup, err := connectDSN(ctx, r.DSN)
	if err != nil {
		t.Fatal(err)
	}
	// Each row costs the apply worker 10 s: even a loaded machine's writer
	// leaves a backlog no sentinel gets through within half the switch
	// timeout, so the move fails before it pauses anyone.
	if _, err := setup.Exec(ctx, `CREATE FUNCTION slow(v int) RETURNS boolean LANGUAGE plpgsql AS $$
		BEGIN IF session_user::text LIKE 'pgt\_move\_%' THEN PERFORM pg_sleep(10); END IF; RETURN true; END $$;
		CREATE TABLE w (id bigserial PRIMARY KEY, n int NOT NULL UNIQUE CHECK (slow(n)), at timestamptz NOT NULL DEFAULT now())`); err != nil {
		t.Fatal(err)
	}
	setup.Close(ctx)
	wr := startWriter(t, ctx, r.DSN)
	wr.waitFor(t, 20)
	j, err := c.MoveTenant(ctx, id, "local2")
	if err != nil {
		t.Fatal(err)
	}
	j, err = c.WaitJob(ctx, j.ID, nil)
	if err != nil || j.State != jobs.Failed || !strings.Contains(j.LastError, move.ErrBehind.Error()) || !strings.Contains(j.LastError, "does not keep up") {
		t.Fatalf("move: %v %s %q; want failed, saying the target cannot keep up", err, j.State, j.LastError)
	}
	wr.waitFor(t, 20)
	acked, errs := wr.finish()
	if len(errs) > 0 {
		t.Errorf("the client saw %d errors, want none: %v", len(errs), errs[0])
	}
	after, err := c.Tenant(ctx, id)
	if err != nil {
		t.Fatal(err)
	}
	if after.Cluster != "local" || after.State != "active" {
		t.Errorf("after the failed move: %s on %s, want active on local", after.State, after.Cluster)
	}
	for _, e := range after.Events {
		if e.Kind == "move_pause" {
			t.Errorf("the failed move paused the tenant: %+v", e)
		}
	}
	var rows int
	if err := pgs[0].Conn(t, after.Database).QueryRow(ctx, `SELECT count(DISTINCT n) FROM public.w`).Scan(&rows); err != nil || rows != len(acked) {
		t.Errorf("on local: %d rows (%v), want the %d acknowledged", rows, err, len(acked))
	}
	var left int
	if err := pgs[1].Conn(t, "postgres").QueryRow(ctx, `SELECT (SELECT count(*) FROM pg_roles WHERE rolname IN ($1, $2, $3))
		+ (SELECT count(*) FROM pg_database WHERE datname = $1)`, "t_"+id, "pgt_agent_"+id, move.Name(id)).Scan(&left); err != nil {
		t.Fatal(err)
	}
	var slots int
	if err := pgs[0].Conn(t, "postgres").QueryRow(ctx, `SELECT count(*) FROM pg_replication_slots WHERE slot_name = $1`, move.Name(id)).Scan(&slots); err != nil {
		t.Fatal(err)
	}
	if left+slots != 0 {
		t.Errorf("after the failed move: %d of the tenant's roles or database on local2, %d slots on local; want none", left, slots)
	}
}

// reconcileClean checks that reconcile finds nothing of tenant id on any
// cluster (its pooler entry included).
func reconcileClean(t *testing.T, c *api.Client, id string) {
	t.Helper()
	rep, err := c.Reconcile(pgtest.Context(t), api.ReconcileRequest{})
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range rep.Findings {
		if f.Tenant == id || strings.Contains(f.Object, id) {
			t.Errorf("reconcile: %+v", f)
		}
	}
}
