package hostile_test

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"net/url"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	examples "github.com/pgtenant/pgtenant/examples/templates"
	"github.com/pgtenant/pgtenant/internal/api"
	"github.com/pgtenant/pgtenant/internal/catalog"
	"github.com/pgtenant/pgtenant/internal/cluster"
	"github.com/pgtenant/pgtenant/internal/config"
	"github.com/pgtenant/pgtenant/internal/daemon"
	"github.com/pgtenant/pgtenant/internal/daemon/daemontest"
	"github.com/pgtenant/pgtenant/internal/jobs"
	"github.com/pgtenant/pgtenant/internal/migrate"
	"github.com/pgtenant/pgtenant/internal/pgtest"
	"github.com/pgtenant/pgtenant/internal/pooler"
	"github.com/pgtenant/pgtenant/internal/provision"
	"github.com/pgtenant/pgtenant/internal/templates"
	"github.com/pgtenant/pgtenant/internal/tenant"
)

var pg *pgtest.Cluster

// server is what the suite needs of the cluster its tenants live on.
type server interface {
	// Conn is a superuser session on the primary, in database db, closed
	// at the end of the test.
	Conn(t testing.TB, db string) *pgx.Conn
	// PrimaryDSN is the superuser's DSN of database db on the primary.
	PrimaryDSN(db string) string
	// OnStandby is dsn pointed at a standby.
	OnStandby(t testing.TB, dsn string) string
	// Restart restarts the primary in place and waits until it takes
	// writes and a standby streams from it again.
	Restart(ctx context.Context) error
	// Name is the cluster's name in the catalog; Registry holds it alone
	// (its primary), closed at the end of the test.
	Name() string
	Registry(t testing.TB) *cluster.Registry
}

// srv is the cluster of the running test's tenants: pg, or the Patroni
// cluster of TestHostile_AfterAFailover while it runs.
var srv server = pgServer{}

// pgServer is pg as a server.
type pgServer struct{}

func (pgServer) Conn(t testing.TB, db string) *pgx.Conn    { return pg.Conn(t, db) }
func (pgServer) PrimaryDSN(db string) string               { return pg.PrimaryDSN(db) }
func (pgServer) OnStandby(t testing.TB, dsn string) string { return pg.OnStandby(t, dsn) }
func (pgServer) Name() string                              { return pg.Name() }
func (pgServer) Registry(t testing.TB) *cluster.Registry   { return pg.Registry(t, false) }
func (pgServer) Restart(ctx context.Context) error {
	if err := pg.StopNode(ctx, "primary", "fast"); err != nil {
		return err
	}
	if err := pg.StartNode(ctx, "primary"); err != nil {
		return err
	}
	return pg.WaitStreaming(ctx, 1)
}

// The suite's cluster: a primary and a streaming standby (tenants read
// there too), and pg_stat_statements, from which the suite learns which
// functions and operators the control plane calls in tenant databases.
func TestMain(m *testing.M) {
	pgtest.Main(m, pgtest.Options{Standbys: 1, Settings: map[string]string{
		"shared_preload_libraries":       "'pg_prewarm,pg_stat_statements'",
		"pg_stat_statements.track":       "all",
		"pg_stat_statements.max":         "10000",
		"track_functions":                "all",
		"max_locks_per_transaction":      "256",
		"superuser_reserved_connections": "3",
	}}, &pg)
}

// env is a running daemon with the saas template built.
type env struct {
	c     *api.Client
	store *catalog.Store
	cfg   config.Config
	extra []templates.Upload // files pushed after version 1, in order
	// pooler is the cluster's PgBouncer (startWith pooled), else nil.
	pooler *pooler.Front
	// cluster is where tenants are made ("": where placement puts them);
	// direct: tenants log in at the primary, not through a pooler.
	cluster string
	direct  bool
}

// hostileTier is the tier hostile tenants get: small limits, so that the
// suite can reach them.
const hostileTier = "hostile"

func start(t *testing.T, mutate func(*config.Config)) *env {
	t.Helper()
	return startWith(t, mutate, false)
}

// startWith is start, with a PgBouncer in front of the cluster when pooled
// (its front is e.pooler).
func startWith(t *testing.T, mutate func(*config.Config), pooled bool) *env {
	t.Helper()
	return startOn(t, mutate, pooled, nil)
}

// startOn is startWith with more clusters beside pg (local2, … for moves).
func startOn(t *testing.T, mutate func(*config.Config), pooled bool, more []*pgtest.Cluster) *env {
	t.Helper()
	cfg := suiteDaemonConfig(t, mutate)
	var d *daemon.Daemon
	var c *api.Client
	switch {
	case len(more) > 0:
		d, c, _ = daemontest.StartClusters(t, append([]*pgtest.Cluster{pg}, more...), cfg, pooled)
	case pooled:
		d, c = daemontest.StartPooled(t, pg, cfg)
	default:
		d, c = daemontest.Start(t, pg, cfg)
	}
	daemontest.CreateTemplate(t, c, "saas", examples.Saas())
	return &env{c: c, store: d.Store(), cfg: cfg, pooler: d.Poolers().Get("local")}
}

// suiteDaemonConfig is the config of the daemons the tests start, its
// catalog on pg: quick retries, no spares, no background passes, then
// mutate.
func suiteDaemonConfig(t *testing.T, mutate func(*config.Config)) config.Config {
	t.Helper()
	cfg := daemontest.Config(t, pg)
	cfg.Provision.DefaultPoolSize = 0
	cfg.Metrics.Interval = 0
	cfg.Prewarm.CaptureInterval = 0
	cfg.Prewarm.WatchInterval = 0
	cfg.Migrate.LockTimeout = config.Duration(500 * time.Millisecond)
	cfg.Migrate.NoTransactionLockTimeout = config.Duration(2 * time.Second)
	cfg.Migrate.Retries = 2
	cfg.Migrate.RetryBackoff = config.Duration(50 * time.Millisecond)
	cfg.Jobs.MaxAttempts = 2
	cfg.Tiers[hostileTier] = config.Tier{ConnectionLimit: 4, StatementTimeout: config.Duration(30 * time.Second),
		IdleInTransactionSessionTimeout: config.Duration(time.Minute), WorkMem: 4 << 20, TempFileLimit: 64 << 20, Extensions: []string{"hstore"}}
	if mutate != nil {
		mutate(&cfg)
	}
	return cfg
}

// waitJob waits for a job to end and wants it in state want.
func waitJob(t *testing.T, c *api.Client, id int64, want jobs.State) jobs.Job {
	t.Helper()
	return waitJobFor(t, c, id, want, 2*time.Minute)
}

// waitJobFor is waitJob with its own limit (a move's copy and apply are
// slow on a loaded machine).
func waitJobFor(t *testing.T, c *api.Client, id int64, want jobs.State, limit time.Duration) jobs.Job {
	t.Helper()
	ctx, cancel := context.WithTimeout(pgtest.Context(t), limit)
	defer cancel()
	j, err := c.WaitJob(ctx, id, nil)
	if err != nil {
		t.Fatalf("job %d: %v", id, err)
	}
	if j.State != want {
		t.Fatalf("job %d (%s) ended %s, want %s: %s", id, j.Type, j.State, want, j.LastError)
	}
	return j
}

// waitStep waits until the job has finished step, and fails if the job
// ends first.
func waitStep(t *testing.T, c *api.Client, id int64, step string) {
	t.Helper()
	ctx := pgtest.Context(t)
	for {
		j, err := c.Job(ctx, id)
		if err != nil {
			t.Fatalf("job %d: %v", id, err)
		}
		for _, s := range j.Steps {
			if s.Step == step && !s.FinishedAt.IsZero() {
				return
			}
		}
		if jobs.Finished(j.State) {
			t.Fatalf("job %d (%s) ended %s before step %s: %s", id, j.Type, j.State, step, j.LastError)
		}
		select {
		case <-ctx.Done():
			t.Fatalf("job %d: step %s not done: %v", id, step, ctx.Err())
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// login is a tenant as its customer knows it.
type login struct {
	ID, Mode, Database, DSN, Tier string
	Role                          string // t_<id>
	Schema                        string // where it puts its objects: its schema, or public
}

func (e *env) tenant(t *testing.T, mode, tier string) login {
	t.Helper()
	return e.tenantOn(t, mode, tier, "")
}

// tenantOn is tenant on a cluster ("": e.cluster).
func (e *env) tenantOn(t *testing.T, mode, tier, cluster string) login {
	t.Helper()
	r, err := e.c.CreateTenant(pgtest.Context(t), provision.Request{Template: "saas", Mode: tenant.Mode(mode), Tier: tier, Cluster: cmp.Or(cluster, e.cluster)})
	if err != nil {
		t.Fatal(err)
	}
	l := login{ID: r.Tenant.ID, Mode: mode, Database: r.Tenant.Database, DSN: e.dsn(r.DSN, r.DirectDSN), Tier: tier, Role: "t_" + r.Tenant.ID, Schema: "public"}
	if mode == "schema" {
		l.Schema = l.Role
	}
	return l
}

// dsn is the DSN of a tenant's the suite uses, of its two (through its
// pooler, when it has one, and direct).
func (e *env) dsn(dsn, direct string) string {
	if e.direct && direct != "" {
		return direct
	}
	return dsn
}

// connect logs in with a DSN (the tenant's own), closed at the end of the test.
func connect(t *testing.T, dsn string) *pgx.Conn {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	conn, err := pgx.Connect(ctx, dsn)
	if err != nil {
		t.Fatalf("log in: %v", err)
	}
	t.Cleanup(func() { conn.Close(context.Background()) })
	return conn
}

func mustExec(t *testing.T, conn *pgx.Conn, sql string, args ...any) {
	t.Helper()
	if _, err := conn.Exec(pgtest.Context(t), sql, args...); err != nil {
		t.Fatalf("%s: %v", abbreviate(sql), err)
	}
}

// refused runs sql and wants it refused with SQLSTATE code.
func refused(t *testing.T, conn *pgx.Conn, code, sql string) {
	t.Helper()
	_, err := conn.Exec(pgtest.Context(t), sql)
	var pgErr *pgconn.PgError
	if !errors.As(err, &pgErr) || pgErr.Code != code {
		t.Errorf("%s: err = %v, want SQLSTATE %s", abbreviate(sql), err, code)
	}
}

func abbreviate(s string) string {
	s = strings.Join(strings.Fields(s), " ")
	if len(s) > 100 {
		s = s[:97] + "..."
	}
	return s
}

// plantPayload creates, in the tenant's schema, the table where every piece
// of planted code records who ran it (tripwire) and pwn, the body of every
// piece of planted code: it records its caller, then tries every way back
// to more privilege (RESET ROLE, SET SESSION AUTHORIZATION, ALTER ROLE …
// SUPERUSER, granting itself the server-file roles), each in its own
// subtransaction so that a refusal does not stop the others, and sets its
// role back so that whatever called it goes on.
func plantPayload(t *testing.T, conn *pgx.Conn, l login) {
	t.Helper()
	s, r := cluster.Ident(l.Schema), cluster.Ident(l.Role)
	mustExec(t, conn, fmt.Sprintf(`
		CREATE TABLE IF NOT EXISTS %[1]s.tripwire (what text, session_role text, current_role_name text, privileged bool);
		GRANT ALL ON %[1]s.tripwire TO PUBLIC;
		CREATE OR REPLACE FUNCTION %[1]s.pwn(what text) RETURNS void LANGUAGE plpgsql AS $f$
		DECLARE su boolean;
		BEGIN
			SELECT rolsuper OR rolcreaterole INTO su FROM pg_catalog.pg_roles WHERE rolname OPERATOR(pg_catalog.=) session_user;
			INSERT INTO %[1]s.tripwire VALUES (what, session_user, current_user, coalesce(su, false));
			BEGIN EXECUTE 'RESET ROLE'; EXCEPTION WHEN OTHERS THEN NULL; END;
			BEGIN EXECUTE 'SET SESSION AUTHORIZATION DEFAULT'; EXCEPTION WHEN OTHERS THEN NULL; END;
			BEGIN EXECUTE 'ALTER ROLE %[2]s SUPERUSER'; EXCEPTION WHEN OTHERS THEN NULL; END;
			BEGIN EXECUTE 'ALTER ROLE %[2]s CREATEROLE CREATEDB BYPASSRLS REPLICATION'; EXCEPTION WHEN OTHERS THEN NULL; END;
			BEGIN EXECUTE 'GRANT pg_execute_server_program, pg_read_server_files, pg_write_server_files TO %[2]s'; EXCEPTION WHEN OTHERS THEN NULL; END;
			BEGIN EXECUTE 'SET ROLE %[2]s'; EXCEPTION WHEN OTHERS THEN NULL; END;
		END $f$;
		GRANT EXECUTE ON FUNCTION %[1]s.pwn(text) TO PUBLIC`, s, r))
}

// trip is a row of a tenant's tripwire: planted code that ran.
type trip struct {
	What, SessionRole, CurrentRole string
	Privileged                     bool
}

func (tr trip) String() string {
	return fmt.Sprintf("%s (session %s, current %s, privileged %v)", tr.What, tr.SessionRole, tr.CurrentRole, tr.Privileged)
}

// trips reads a tenant's tripwire (empty if the tenant is gone).
func trips(t *testing.T, l login) []trip {
	t.Helper()
	ctx := pgtest.Context(t)
	conn, err := pgx.Connect(ctx, srv.PrimaryDSN(l.Database))
	if err != nil {
		return nil // purged
	}
	defer conn.Close(ctx)
	rows, err := conn.Query(ctx, fmt.Sprintf(`SELECT what, session_role, current_role_name, privileged FROM %s.tripwire`, cluster.Ident(l.Schema)))
	if err != nil {
		if errors.Is(cluster.Classify(err), cluster.ErrNotFound) {
			return nil
		}
		t.Fatal(err)
	}
	out, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (trip, error) {
		var x trip
		return x, r.Scan(&x.What, &x.SessionRole, &x.CurrentRole, &x.Privileged)
	})
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// noPrivilegedTrips fails on planted code that ran in a session whose
// session user was privileged (an admin session), or, for what, ran in any
// session but the tenant's own (the control plane's SQL).
func noPrivilegedTrips(t *testing.T, l login, neverRun func(what string) bool) {
	t.Helper()
	for _, tr := range trips(t, l) {
		if tr.Privileged {
			t.Errorf("tenant %s's code ran in a privileged session: %s", l.ID, tr)
		} else if neverRun != nil && neverRun(tr.What) && tr.SessionRole != l.Role {
			t.Errorf("tenant %s's shadowing object ran in the control plane's SQL: %s", l.ID, tr)
		}
	}
}

// privileged lists every role but the server's own superuser that holds a
// privilege no tenant may have, or a membership in a role that grants one:
// a tenant (or its agent) that gained any shows here.
func privileged(t *testing.T) []string {
	t.Helper()
	return privilegedOn(t, pg)
}

// privilegedOn is privileged on another cluster of a test.
func privilegedOn(t *testing.T, on *pgtest.Cluster) []string {
	t.Helper()
	ctx := pgtest.Context(t)
	conn := on.Conn(t, "postgres")
	rows, err := conn.Query(ctx, `
		SELECT r.rolname || ': ' || concat_ws(' ', CASE WHEN r.rolsuper THEN 'SUPERUSER' END, CASE WHEN r.rolcreaterole THEN 'CREATEROLE' END,
			CASE WHEN r.rolcreatedb THEN 'CREATEDB' END, CASE WHEN r.rolreplication THEN 'REPLICATION' END,
			CASE WHEN r.rolbypassrls THEN 'BYPASSRLS' END,
			(SELECT string_agg('member of ' || g.rolname, ' ') FROM pg_auth_members m JOIN pg_roles g ON g.oid = m.roleid
			 WHERE m.member = r.oid AND (g.rolname LIKE 'pg\_%' OR g.rolsuper OR g.rolcreaterole)))
		FROM pg_roles r
		WHERE r.rolname NOT LIKE 'pg\_%' AND r.oid <> 10 AND r.rolname <> current_user
		  AND (r.rolsuper OR r.rolcreaterole OR r.rolcreatedb OR r.rolreplication OR r.rolbypassrls
		       OR EXISTS (SELECT 1 FROM pg_auth_members m JOIN pg_roles g ON g.oid = m.roleid
		                  WHERE m.member = r.oid AND (g.rolname LIKE 'pg\_%' OR g.rolsuper OR g.rolcreaterole)))
		ORDER BY 1`)
	if err != nil {
		t.Fatal(err)
	}
	out, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// noneGainedPrivilege fails if any role holds a privilege no tenant may have.
func noneGainedPrivilege(t *testing.T) {
	t.Helper()
	if p := privileged(t); len(p) > 0 {
		t.Errorf("roles with privileges no tenant may have: %s", strings.Join(p, "; "))
	}
}

// pushVersion adds a version to saas: the files of the last one plus
// extra, and waits for its builds.
func (e *env) pushVersion(t *testing.T, extra ...templates.Upload) int {
	t.Helper()
	e.extra = append(e.extra, extra...)
	added, err := e.c.PushTemplate(pgtest.Context(t), "saas", append(examples.Saas(), e.extra...))
	if err != nil {
		t.Fatal(err)
	}
	for _, j := range added.BuildJobs {
		waitJob(t, e.c, j.ID, jobs.Succeeded)
	}
	return added.Version
}

// rollout migrates saas's tenants to version to and returns the rollout
// when it has ended (its job succeeded or failed).
func (e *env) rollout(t *testing.T, to int) migrate.Status {
	t.Helper()
	ctx := pgtest.Context(t)
	st, err := e.c.StartRollout(ctx, migrate.Request{Template: "saas", To: to})
	if err != nil {
		t.Fatal(err)
	}
	wctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	if _, err := e.c.WaitJob(wctx, st.Rollout.Job.ID, nil); err != nil {
		t.Fatalf("rollout %d: %v", st.Rollout.ID, err)
	}
	out, err := e.c.Rollout(ctx, st.Rollout.ID, url.Values{"state": {"all"}})
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// tenantOutcome is one tenant's state in a rollout.
func tenantOutcome(st migrate.Status, id string) catalog.RolloutTenant {
	for _, rt := range st.Tenants {
		if rt.Tenant == id {
			return rt
		}
	}
	return catalog.RolloutTenant{}
}

// purge drops a tenant at once and waits for its purge job to end in want.
func (e *env) purge(t *testing.T, id string, want jobs.State) jobs.Job {
	t.Helper()
	r, err := e.c.DropTenant(pgtest.Context(t), id, true)
	if err != nil {
		t.Fatal(err)
	}
	if r.Job == nil {
		t.Fatalf("drop %s --purge-now: no purge job", id)
	}
	return waitJob(t, e.c, r.Job.ID, want)
}

// leftBehind lists what of a tenant is still on the cluster: database,
// schema, roles, large objects.
func leftBehind(t *testing.T, l login) []string {
	t.Helper()
	ctx := pgtest.Context(t)
	admin := srv.Conn(t, "postgres")
	var out []string
	rows, err := admin.Query(ctx, `SELECT 'role ' || rolname FROM pg_roles WHERE rolname IN ($1, $2)
		UNION ALL SELECT 'database ' || datname FROM pg_database WHERE datname = $1`, l.Role, "pgt_agent_"+l.ID)
	if err != nil {
		t.Fatal(err)
	}
	got, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		t.Fatal(err)
	}
	out = append(out, got...)
	if l.Mode == "schema" {
		conn := srv.Conn(t, l.Database)
		var n int
		if err := conn.QueryRow(ctx, `SELECT count(*) FROM pg_namespace WHERE nspname = $1`, l.Role).Scan(&n); err != nil {
			t.Fatal(err)
		}
		if n > 0 {
			out = append(out, "schema "+l.Role)
		}
		// Large objects whose owner is gone are owned by nobody: count
		// those the tenant wrote, by content.
		if err := conn.QueryRow(ctx, `SELECT count(*) FROM pg_largeobject WHERE position($1::bytea IN data) > 0`,
			[]byte("secret of "+l.ID)).Scan(&n); err != nil {
			t.Fatal(err)
		}
		if n > 0 {
			out = append(out, fmt.Sprintf("%d large object page(s) of the tenant", n))
		}
	}
	sort.Strings(out)
	return out
}

// neighbourWorks checks that a tenant can log in, read and write.
func neighbourWorks(t *testing.T, l login) {
	t.Helper()
	ctx, cancel := context.WithTimeout(pgtest.Context(t), 15*time.Second)
	defer cancel()
	conn, err := pgx.Connect(ctx, l.DSN)
	if err != nil {
		t.Errorf("neighbour %s cannot log in: %v", l.ID, err)
		return
	}
	defer conn.Close(context.Background())
	slug := "n-" + pgtest.RandomSuffix()
	if _, err := conn.Exec(ctx, `INSERT INTO organizations (name, slug) VALUES ('neighbour', $1)`, slug); err != nil {
		t.Errorf("neighbour %s cannot write: %v", l.ID, err)
		return
	}
	var n int
	if err := conn.QueryRow(ctx, `SELECT count(*) FROM organizations WHERE slug = $1`, slug).Scan(&n); err != nil || n != 1 {
		t.Errorf("neighbour %s cannot read its write: %d rows, %v", l.ID, n, err)
	}
}
