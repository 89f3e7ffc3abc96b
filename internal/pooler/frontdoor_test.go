package pooler_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	examples "github.com/pgtenant/pgtenant/examples/templates"
	"github.com/pgtenant/pgtenant/internal/api"
	"github.com/pgtenant/pgtenant/internal/config"
	"github.com/pgtenant/pgtenant/internal/daemon"
	"github.com/pgtenant/pgtenant/internal/daemon/daemontest"
	"github.com/pgtenant/pgtenant/internal/jobs"
	"github.com/pgtenant/pgtenant/internal/pgtest"
	"github.com/pgtenant/pgtenant/internal/pooler"
	"github.com/pgtenant/pgtenant/internal/provision"
	"github.com/pgtenant/pgtenant/internal/tenant"
)

// pooledTier is a transaction-mode tier with one server connection per
// tenant: many clients forced onto one backend.
const pooledTier = "pooled"

// daemonWithPooler runs a daemon with a PgBouncer in front of the test
// cluster and the saas template built.
func daemonWithPooler(t *testing.T, mutate ...func(*config.Config)) (*daemon.Daemon, *api.Client) {
	t.Helper()
	cfg := daemontest.Config(t, pg)
	cfg.Provision.DefaultPoolSize = 1
	cfg.Metrics.Interval = 0
	cfg.Prewarm.CaptureInterval = 0
	cfg.Prewarm.WatchInterval = 0
	cfg.Tiers[pooledTier] = config.Tier{ConnectionLimit: 3, StatementTimeout: config.Duration(30 * time.Second),
		PoolMode: "transaction", PoolSize: 1, MaxDBConnections: 1}
	for _, m := range mutate {
		m(&cfg)
	}
	d, c := daemontest.StartPooled(t, pg, cfg)
	daemontest.CreateTemplate(t, c, "saas", examples.Saas())
	return d, c
}

func connectDSN(ctx context.Context, dsn string) (*pgx.Conn, error) {
	cfg, err := pgx.ParseConfig(dsn)
	if err != nil {
		return nil, err
	}
	// Behind a transaction pool PgBouncer 1.18 cannot carry named
	// prepared statements: clients use the simple protocol (docs/connections.md).
	cfg.DefaultQueryExecMode = pgx.QueryExecModeSimpleProtocol
	cfg.ConnectTimeout = 5 * time.Second
	return pgx.ConnectConfig(ctx, cfg)
}

func TestFrontDoor_BothModesConnectThroughThePooler(t *testing.T) {
	ctx := pgtest.Context(t)
	d, c := daemonWithPooler(t)
	front := d.Poolers().Get("local")
	for _, mode := range []string{"database", "schema"} {
		r, err := c.CreateTenant(ctx, provision.Request{Template: "saas", Mode: tenant.Mode(mode)})
		if err != nil {
			t.Fatal(err)
		}
		role := "t_" + r.Tenant.ID
		u, _ := url.Parse(r.DSN)
		if got, want := u.Host, front.PublicAddr(); got != want {
			t.Errorf("%s: DSN host %s, want the pooler's %s", mode, got, want)
		}
		if got, want := u.Path, "/"+role; got != want {
			t.Errorf("%s: DSN database %s, want the tenant's entry %s", mode, got, want)
		}
		if d, _ := url.Parse(r.DirectDSN); d == nil || d.Host == front.PublicAddr() || d.Path != "/"+r.Tenant.Database {
			t.Errorf("%s: direct DSN %q, want the primary's with database %s", mode, r.DirectDSN, r.Tenant.Database)
		}
		conn, err := connectDSN(ctx, r.DSN)
		if err != nil {
			t.Fatalf("%s: connect through the pooler at once after create: %v", mode, err)
		}
		var user, db, path string
		var overSocket bool
		if err := conn.QueryRow(ctx, "SELECT current_user, current_database(), current_setting('search_path'), inet_client_addr() IS NULL").Scan(&user, &db, &path, &overSocket); err != nil {
			t.Fatal(err)
		}
		conn.Close(ctx)
		if user != role || db != r.Tenant.Database {
			t.Errorf("%s: session %s in %s, want %s in %s", mode, user, db, role, r.Tenant.Database)
		}
		// The pooler reaches the server through its Unix socket, as up
		// configures it (pooler.server_socket_dir).
		if !overSocket {
			t.Errorf("%s: the pooler's server session came over TCP, want the server's Unix socket in %s", mode, pg.SocketDir())
		}
		if mode == "schema" && path != role {
			t.Errorf("schema tenant's search_path %q, want its schema %s (from its role)", path, role)
		}
		show, err := c.Tenant(ctx, r.Tenant.ID)
		if err != nil {
			t.Fatal(err)
		}
		if !strings.Contains(show.DSN, front.PublicAddr()) || show.DirectDSN == "" || strings.Contains(show.DirectDSN, front.PublicAddr()) {
			t.Errorf("%s: tenant show dsn %q direct %q", mode, show.DSN, show.DirectDSN)
		}

		// psql and pgbench, as a customer would.
		if psql, err := exec.LookPath("psql"); err == nil {
			out, err := exec.CommandContext(ctx, psql, "-X", "-At", "-d", r.DSN, "-c", "SELECT current_user").CombinedOutput()
			if err != nil || strings.TrimSpace(string(out)) != role {
				t.Errorf("%s: psql through the pooler: %v: %s", mode, err, out)
			}
		}
		pgbench := "/usr/lib/postgresql/15/bin/pgbench"
		if _, err := os.Stat(pgbench); err == nil {
			script := filepath.Join(t.TempDir(), "select.sql")
			if err := os.WriteFile(script, []byte("SELECT count(*) FROM pg_class;\n"), 0o600); err != nil {
				t.Fatal(err)
			}
			out, err := exec.CommandContext(ctx, pgbench, "-n", "-c", "4", "-t", "25", "-f", script, r.DSN).CombinedOutput()
			if err != nil || !strings.Contains(string(out), "number of transactions actually processed: 100/100") {
				t.Errorf("%s: pgbench through the pooler: %v: %s", mode, err, out)
			}
		}
	}
}

func TestFrontDoor_LifecycleReachesThePoolerAtOnce(t *testing.T) {
	ctx := pgtest.Context(t)
	_, c := daemonWithPooler(t)
	r, err := c.CreateTenant(ctx, provision.Request{Template: "saas", Mode: "schema", Tier: pooledTier})
	if err != nil {
		t.Fatal(err)
	}
	id := r.Tenant.ID
	login := func(dsn string) (string, error) {
		conn, err := connectDSN(ctx, dsn)
		if err != nil {
			return message(err), err
		}
		defer conn.Close(ctx)
		_, err = conn.Exec(ctx, "SELECT 1")
		return message(err), err
	}
	if _, err := login(r.DSN); err != nil {
		t.Fatalf("new tenant: %v", err)
	}
	withPassword := func(dsn, pw string) string {
		u, _ := url.Parse(dsn)
		u.User = url.UserPassword(u.User.Username(), pw)
		return u.String()
	}
	if msg, err := login(withPassword(r.DSN, "wrong")); err == nil || !strings.Contains(msg, "SASL authentication failed") {
		t.Errorf("wrong password: %q, want SASL authentication failed", msg)
	}
	unknown := strings.Replace(r.DSN, "t_"+id, "t_aaaaaaaaaaaa", -1)
	if msg, err := login(unknown); err == nil || !strings.Contains(msg, "login rejected") {
		t.Errorf("unknown tenant: %q, want login rejected", msg)
	}

	// A session open through the pooler is cut off by suspend, and new
	// logins are refused with a clear error until resume.
	open, err := connectDSN(ctx, r.DSN)
	if err != nil {
		t.Fatal(err)
	}
	defer open.Close(ctx)
	if _, err := c.TenantAction(ctx, id, "suspend"); err != nil {
		t.Fatal(err)
	}
	if _, err := open.Exec(ctx, "SELECT 1"); err == nil {
		t.Error("a session through the pooler outlived suspend")
	}
	if msg, err := login(r.DSN); err == nil || !strings.Contains(msg, "is disabled") {
		t.Errorf("suspended tenant: %q, want 'database … is disabled'", msg)
	}
	if _, err := c.TenantAction(ctx, id, "resume"); err != nil {
		t.Fatal(err)
	}
	if _, err := login(r.DSN); err != nil {
		t.Errorf("resumed tenant through the pooler: %v", err)
	}

	// A rotated password works through the pooler at once; the old one does not.
	rot, err := c.RotatePassword(ctx, id, false)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := login(rot.DSN); err != nil {
		t.Errorf("rotated password through the pooler at once: %v", err)
	}
	if msg, err := login(r.DSN); err == nil {
		t.Error("the old password still logs in through the pooler")
	} else if !strings.Contains(msg, "SASL authentication failed") {
		t.Errorf("old password: %q", msg)
	}

	// Drop: sessions cut off, logins refused; restore lets it in again.
	open2, err := connectDSN(ctx, rot.DSN)
	if err != nil {
		t.Fatal(err)
	}
	defer open2.Close(ctx)
	if _, err := c.DropTenant(ctx, id, false); err != nil {
		t.Fatal(err)
	}
	if _, err := open2.Exec(ctx, "SELECT 1"); err == nil {
		t.Error("a session through the pooler outlived drop")
	}
	if msg, err := login(rot.DSN); err == nil || !strings.Contains(msg, "login rejected") {
		t.Errorf("dropped tenant: %q, want login rejected", msg)
	}
	if _, err := c.TenantAction(ctx, id, "restore"); err != nil {
		t.Fatal(err)
	}
	if _, err := login(rot.DSN); err != nil {
		t.Errorf("restored tenant through the pooler: %v", err)
	}
	// Purge: the entry is gone for good.
	res, err := c.DropTenant(ctx, id, true)
	if err != nil {
		t.Fatal(err)
	}
	if res.Job != nil {
		if j, err := c.WaitJob(ctx, res.Job.ID, nil); err != nil || j.State != jobs.Succeeded {
			t.Fatalf("purge: %v %s", err, j.LastError)
		}
	}
	if _, err := login(rot.DSN); err == nil {
		t.Error("a purged tenant logs in through the pooler")
	}
}

// The apartment gem's leak (PR #470): behind a transaction pooler, a
// tenant relying on SET search_path read another tenant's rows. Here every
// tenant has a pool of its own with one server connection, its many
// clients SET, RESET and DISCARD between queries, and no query ever runs
// as, or reads the rows of, another tenant.
func TestFrontDoor_TransactionModeLeaksNothingBetweenTenants(t *testing.T) {
	ctx := pgtest.Context(t)
	_, c := daemonWithPooler(t)
	const tenants, clients, rounds = 3, 6, 150
	type tnt struct{ role, dsn string }
	var ts []tnt
	for i := 0; i < tenants; i++ {
		r, err := c.CreateTenant(ctx, provision.Request{Template: "saas", Mode: "schema", Tier: pooledTier})
		if err != nil {
			t.Fatal(err)
		}
		tn := tnt{role: "t_" + r.Tenant.ID, dsn: r.DSN}
		conn, err := connectDSN(ctx, tn.dsn)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := conn.Exec(ctx, "CREATE TABLE mine (owner text); INSERT INTO mine SELECT current_user FROM generate_series(1, 5)"); err != nil {
			t.Fatal(err)
		}
		conn.Close(ctx)
		ts = append(ts, tn)
	}
	var mu sync.Mutex
	var txns, foreign, wrongUser, errs int
	var firstErr string
	var wg sync.WaitGroup
	for i, tn := range ts {
		other := ts[(i+1)%len(ts)].role
		for k := 0; k < clients; k++ {
			wg.Go(func() {
				conn, err := connectDSN(ctx, tn.dsn)
				if err != nil {
					t.Error(err)
					return
				}
				defer conn.Close(ctx)
				rng := rand.New(rand.NewPCG(uint64(k), uint64(i)))
				for n := 0; n < rounds; n++ {
					var pre string
					switch rng.IntN(6) {
					case 0:
						pre = "SET search_path = " + other
					case 1:
						pre = "SET search_path = " + tn.role + ", " + other
					case 2:
						pre = "RESET ALL"
					case 3:
						pre = "DISCARD ALL"
					case 4:
						pre = "SET search_path = public"
					}
					if pre != "" {
						_, _ = conn.Exec(ctx, pre)
					}
					rows, err := conn.Query(ctx, "SELECT owner, current_user::text FROM mine")
					var owners []string
					var user string
					if err == nil {
						for rows.Next() {
							var o string
							if err := rows.Scan(&o, &user); err == nil {
								owners = append(owners, o)
							}
						}
						rows.Close()
						err = rows.Err()
					}
					mu.Lock()
					txns++
					if err != nil {
						errs++
						if firstErr == "" {
							firstErr = err.Error()
						}
					}
					for _, o := range owners {
						if o != tn.role {
							foreign++
						}
					}
					if user != "" && user != tn.role {
						wrongUser++
					}
					mu.Unlock()
				}
			})
		}
	}
	wg.Wait()
	t.Logf("%d transactions by %d clients of %d tenants on one server connection each: %d read another tenant's rows, %d ran as another role, %d failed (a search_path set to another tenant's schema: %s)",
		txns, tenants*clients, tenants, foreign, wrongUser, errs, firstErr)
	if foreign != 0 || wrongUser != 0 {
		t.Errorf("%d rows of another tenant read, %d queries ran as another tenant; want 0 and 0", foreign, wrongUser)
	}
	if txns != tenants*clients*rounds {
		t.Errorf("%d transactions, want %d", txns, tenants*clients*rounds)
	}
	if errs == txns {
		t.Error("every query failed: the test shows nothing")
	}
}

// A pooler entry per tenant is in SHOW DATABASES after a restart of the
// daemon's pooler, and the pool figures reach /metrics.
func TestFrontDoor_PoolerStateAndMetrics(t *testing.T) {
	ctx := pgtest.Context(t)
	d, c := daemonWithPooler(t, func(cfg *config.Config) { cfg.Metrics.Interval = config.Duration(500 * time.Millisecond) })
	r, err := c.CreateTenant(ctx, provision.Request{Template: "saas", Mode: "database", Tier: pooledTier})
	if err != nil {
		t.Fatal(err)
	}
	front := d.Poolers().Get("local")
	s := front.Snapshot()
	if db, ok := s.Databases["t_"+r.Tenant.ID]; !ok || db.PoolMode != "transaction" || db.MaxConnections != 1 || db.Database != r.Tenant.Database {
		t.Errorf("SHOW DATABASES entry %+v (present %v), want transaction, max 1, database %s", db, ok, r.Tenant.Database)
	}
	conn, err := connectDSN(ctx, r.DSN)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	if _, err := conn.Exec(ctx, "SELECT 1"); err != nil {
		t.Fatal(err)
	}
	var body string
	for deadline := time.Now().Add(20 * time.Second); ; {
		if err := front.Sync(ctx); err != nil {
			t.Fatal(err)
		}
		body = scrape(t, d)
		if strings.Contains(body, `pgtenant_tenant_pool_clients{cluster="local"`) || time.Now().After(deadline) {
			break
		}
		time.Sleep(200 * time.Millisecond)
	}
	for _, want := range []string{
		`pgtenant_pooler_up{cluster="local"} 1`,
		`pgtenant_pooler_drift{cluster="local"} 0`,
		fmt.Sprintf(`pgtenant_tenant_pool_clients{cluster="local",mode="database",state="active",tenant="%s"} 1`, r.Tenant.ID),
	} {
		if !strings.Contains(body, want) {
			t.Errorf("/metrics lacks %s", want)
		}
	}
}

// reconcile finds a pooler entry that differs from the catalog and fixes
// it; doctor's pooler check passes on a pooler in sync.
func TestFrontDoor_ReconcileAndDoctor(t *testing.T) {
	ctx := pgtest.Context(t)
	d, c := daemonWithPooler(t)
	r, err := c.CreateTenant(ctx, provision.Request{Template: "saas", Mode: "schema"})
	if err != nil {
		t.Fatal(err)
	}
	role := "t_" + r.Tenant.ID
	front := d.Poolers().Get("local")
	rep, err := c.Doctor(ctx, "local")
	if err != nil {
		t.Fatal(err)
	}
	var found bool
	for _, ch := range rep.Clusters[0].Checks {
		if ch.Name == "pooler" {
			found = true
			if ch.Status != "ok" {
				t.Errorf("doctor's pooler check: %s: %s (%s)", ch.Status, ch.Got, ch.Fix)
			}
		}
	}
	if !found {
		t.Error("doctor has no pooler check")
	}
	password, err := front.Proc.AdminPassword()
	if err != nil {
		t.Fatal(err)
	}
	// Tamper behind the daemon's back (its own syncs may repair it first:
	// then tamper again).
	var finding *struct{ kind, object string }
	for attempt := 0; attempt < 5 && finding == nil; attempt++ {
		admin, err := pooler.DialAdmin(ctx, front.Addr(), pooler.AdminUser, password)
		if err != nil {
			t.Fatal(err)
		}
		err = admin.Command(ctx, "DISABLE", role)
		admin.Close()
		if err != nil {
			t.Fatal(err)
		}
		got, err := c.Reconcile(ctx, api.ReconcileRequest{Cluster: "local"})
		if err != nil {
			t.Fatal(err)
		}
		for _, f := range got.Findings {
			if f.Object == "pooler entry "+role {
				finding = &struct{ kind, object string }{f.Kind, f.Object}
			}
		}
	}
	if finding == nil || finding.kind != "mismatch" {
		t.Fatalf("reconcile did not report the disabled entry of an active tenant (%+v)", finding)
	}
	fixed, err := c.Reconcile(ctx, api.ReconcileRequest{Cluster: "local", Fix: true})
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range fixed.Findings {
		if f.Object == "pooler entry "+role && !f.Fixed {
			t.Errorf("not fixed: %+v", f)
		}
	}
	if _, err := connectDSN(ctx, r.DSN); err != nil {
		t.Errorf("after reconcile --fix: %v", err)
	}
}

func scrape(t *testing.T, d *daemon.Daemon) string {
	t.Helper()
	resp, err := http.Get(d.URL() + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// TestFrontDoor_SpareRegisteredBeforeItsClaim: a spare is built with the
// password it will be claimed with (sealed in its row, its role's
// verifier set, still NOLOGIN), so its front door serves its entry before
// the claim; the claim hands that password out and turns LOGIN on, its
// verifier unchanged, and the DSN works at once. A spare whose sealed
// password does not open is claimed with a new one, as before.
func TestFrontDoor_SpareRegisteredBeforeItsClaim(t *testing.T) {
	ctx := pgtest.Context(t)
	var cfg config.Config
	d, c := daemonWithPooler(t, func(c *config.Config) { cfg = *c })
	cat := daemontest.CatalogConn(t, pg, cfg)
	admin := pg.Conn(t, "postgres")
	front := d.Poolers().Get("local")
	verifier := func(role string) string {
		var v string
		if err := admin.QueryRow(ctx, `SELECT coalesce(rolpassword, '') FROM pg_authid WHERE rolname = $1`, role).Scan(&v); err != nil {
			t.Fatal(err)
		}
		return v
	}
	spare := func() string {
		for deadline := time.Now().Add(2 * time.Minute); time.Now().Before(deadline); time.Sleep(200 * time.Millisecond) {
			var id string
			err := cat.QueryRow(ctx, `SELECT id FROM tenants WHERE state = 'spare' AND template = 'saas' AND mode = 'schema' AND spare_sealed IS NOT NULL`).Scan(&id)
			if err == nil {
				return id
			}
			if !errors.Is(err, pgx.ErrNoRows) {
				t.Fatal(err)
			}
		}
		t.Fatal("no schema spare of saas with a sealed password within 2 minutes")
		return ""
	}

	id := spare()
	role := tenant.PhysicalName(id)
	var login bool
	if err := admin.QueryRow(ctx, `SELECT rolcanlogin FROM pg_roles WHERE rolname = $1`, role).Scan(&login); err != nil || login {
		t.Fatalf("spare's role %s: can log in %v (%v), want NOLOGIN until its claim", role, login, err)
	}
	before := verifier(role)
	if !pooler.ValidVerifier(before) {
		t.Fatalf("spare's role %s has no SCRAM verifier: %q", role, before)
	}
	if err := front.Sync(ctx); err != nil {
		t.Fatal(err)
	}
	if _, ok := front.Snapshot().Databases[role]; !ok || !front.Serves(role, before) {
		t.Fatalf("the front door does not serve the spare's entry %s before its claim", role)
	}
	r, err := c.CreateTenant(ctx, provision.Request{Template: "saas", Mode: tenant.ModeSchema})
	if err != nil {
		t.Fatal(err)
	}
	if r.Tenant.ID != id || r.Path != "pool" || r.Note != "" {
		t.Fatalf("create: tenant %s by %s (note %q), want the spare %s claimed, no note", r.Tenant.ID, r.Path, r.Note, id)
	}
	if after := verifier(role); after != before {
		t.Errorf("the claim changed the role's verifier: the spare's entry no longer matches it")
	}
	conn, err := connectDSN(ctx, r.DSN)
	if err != nil {
		t.Fatalf("connect through the pooler right after the claim: %v", err)
	}
	conn.Close(ctx)
	var left int
	if err := cat.QueryRow(ctx, `SELECT count(*) FROM tenants WHERE id = $1 AND (spare_sealed IS NOT NULL OR spare_key_id IS NOT NULL)`, id).Scan(&left); err != nil || left != 0 {
		t.Errorf("the claimed tenant's row keeps its sealed password (%d, %v)", left, err)
	}

	// A sealed password that does not open (altered, or sealed by another
	// key): the claim makes a new one and waits for the front door.
	id = spare()
	role = tenant.PhysicalName(id)
	before = verifier(role)
	if _, err := cat.Exec(ctx, `UPDATE tenants SET spare_sealed = '\x000102030405060708090a0b0c0d0e0f101112131415161718191a1b1c1d1e1f'::bytea WHERE id = $1`, id); err != nil {
		t.Fatal(err)
	}
	r, err = c.CreateTenant(ctx, provision.Request{Template: "saas", Mode: tenant.ModeSchema})
	if err != nil {
		t.Fatal(err)
	}
	if r.Tenant.ID != id || r.Path != "pool" || r.Note != "" {
		t.Fatalf("create: tenant %s by %s (note %q), want the spare %s claimed, no note", r.Tenant.ID, r.Path, r.Note, id)
	}
	if verifier(role) == before {
		t.Errorf("a spare whose sealed password does not open kept its verifier: its tenant got a password that is not its role's")
	}
	if conn, err = connectDSN(ctx, r.DSN); err != nil {
		t.Fatalf("connect through the pooler after a claim with a new password: %v", err)
	}
	conn.Close(ctx)
}
