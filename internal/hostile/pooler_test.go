package hostile_test

import (
	"errors"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/pgtenant/pgtenant/internal/config"
	"github.com/pgtenant/pgtenant/internal/pgtest"
)

// TestFinding11_PoolerReachesOnlyTheTenantsOwnPool: through the pooler a
// tenant reaches its own entry and nothing else, whatever name, user,
// password or startup parameter it tries: not another tenant's pool, not
// the admin console, not a database without an entry (the maintenance
// database, the shared database by its own name, a template). A tenant
// that puts an md5 password on its own role is left out of the auth file
// (never a secret of another kind in it) and hurts nobody else.
func TestFinding11_PoolerReachesOnlyTheTenantsOwnPool(t *testing.T) {
	ctx := pgtest.Context(t)
	e := startWith(t, nil, true)
	a := e.tenant(t, "database", hostileTier)
	b := e.tenant(t, "schema", hostileTier)
	c := e.tenant(t, "schema", hostileTier)
	pw := func(dsn string) string {
		u, _ := url.Parse(dsn)
		p, _ := u.User.Password()
		return p
	}
	addr := e.pooler.PublicAddr()
	try := func(db, user, password string, params map[string]string) error {
		cfg, err := pgx.ParseConfig("postgres://" + addr + "/" + db + "?sslmode=disable")
		if err != nil {
			t.Fatal(err)
		}
		cfg.User, cfg.Password, cfg.ConnectTimeout = user, password, 5*time.Second
		for k, v := range params {
			cfg.RuntimeParams[k] = v
		}
		conn, err := pgx.ConnectConfig(ctx, cfg)
		if err == nil {
			_, err = conn.Exec(ctx, "SELECT 1")
			conn.Close(ctx)
		}
		return err
	}
	if err := try(a.Role, a.Role, pw(a.DSN), nil); err != nil {
		t.Fatalf("the tenant's own entry: %v", err)
	}
	for _, x := range []struct {
		what, db, user, password string
		params                   map[string]string
	}{
		{"another tenant's entry with its own password", b.Role, a.Role, pw(a.DSN), nil},
		{"another tenant's entry as that tenant, with its own password", b.Role, b.Role, pw(a.DSN), nil},
		{"the admin console", "pgbouncer", a.Role, pw(a.DSN), nil},
		{"the maintenance database", "postgres", a.Role, pw(a.DSN), nil},
		{"template1", "template1", a.Role, pw(a.DSN), nil},
		{"the shared database by its name", b.Database, b.Role, pw(b.DSN), nil},
		{"another tenant's database by its name", a.Database, b.Role, pw(b.DSN), nil},
		{"the pooler's admin user", "pgbouncer", "pgtenant_pooler", pw(a.DSN), nil},
		{"an agent role", b.Role, "pgt_agent_" + b.ID, pw(b.DSN), nil},
		{"a search_path as a startup parameter", b.Role, b.Role, pw(b.DSN), map[string]string{"search_path": c.Role}},
		{"options as a startup parameter", b.Role, b.Role, pw(b.DSN), map[string]string{"options": "-c search_path=" + c.Role}},
	} {
		err := try(x.db, x.user, x.password, x.params)
		var pe *pgconn.PgError
		if err == nil || !errors.As(err, &pe) {
			t.Errorf("%s: err = %v, want a refusal from the pooler", x.what, err)
		}
	}

	// An md5 password set by the tenant on its own role never reaches the
	// auth file; the others go on.
	own := connect(t, c.DSN)
	mustExec(t, own, "SET password_encryption = 'md5'")
	mustExec(t, own, "ALTER ROLE "+c.Role+" PASSWORD 'chosen-by-the-tenant'")
	if err := e.pooler.Sync(ctx); err != nil {
		t.Fatal(err)
	}
	auth, err := os.ReadFile(filepath.Join(e.pooler.Proc.Dir, "users.txt"))
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(strings.TrimSpace(string(auth)), "\n") {
		if !strings.Contains(line, `"SCRAM-SHA-256$`) {
			t.Errorf("auth file line %q is not a SCRAM verifier", line)
		}
	}
	if strings.Contains(string(auth), `"`+c.Role+`"`) {
		t.Error("the tenant with an md5 password is still in the auth file")
	}
	if why := e.pooler.Snapshot().Skipped[c.Role]; why == "" {
		t.Error("the tenant left out is not reported")
	}
	if err := try(b.Role, b.Role, pw(b.DSN), nil); err != nil {
		t.Errorf("a neighbour after another tenant's md5 password: %v", err)
	}
}

// TestFinding7_PooledAdmissionCountsThePool: with a pooler, admission counts
// what a tenant's pool may open on the server (max_db_connections), and
// however many clients a tenant opens through the pooler, it holds no more
// backends than that.
func TestFinding7_PooledAdmissionCountsThePool(t *testing.T) {
	// 100 connections − 3 superuser-reserved − 20 reserved − 4 for rollouts:
	// 73: three tenants of connection_limit 30 would not fit, three pools
	// of 2 do.
	e := startWith(t, func(c *config.Config) {
		c.Provision.ConnectionOvercommit = 1
		c.Provision.ReservedConnections = 20
		c.Tiers["thirty"] = config.Tier{ConnectionLimit: 30, PoolMode: "transaction", PoolSize: 2, MaxDBConnections: 2}
	}, true)
	ctx := pgtest.Context(t)
	var ls []login
	for i := 0; i < 3; i++ {
		ls = append(ls, e.tenant(t, "schema", "thirty"))
	}
	l := ls[0]
	var wg sync.WaitGroup
	for i := 0; i < 12; i++ {
		wg.Go(func() {
			cfg, err := pgx.ParseConfig(l.DSN)
			if err != nil {
				t.Error(err)
				return
			}
			cfg.DefaultQueryExecMode = pgx.QueryExecModeSimpleProtocol
			conn, err := pgx.ConnectConfig(ctx, cfg)
			if err != nil {
				t.Error(err)
				return
			}
			defer conn.Close(ctx)
			for k := 0; k < 20; k++ {
				if _, err := conn.Exec(ctx, "SELECT pg_catalog.pg_sleep(0.01)"); err != nil {
					t.Error(err)
					return
				}
			}
		})
	}
	stop := make(chan struct{})
	peak := 0
	done := make(chan struct{})
	go func() {
		defer close(done)
		admin := srv.Conn(t, "postgres")
		for {
			var n int
			if err := admin.QueryRow(ctx, "SELECT count(*) FROM pg_stat_activity WHERE usename = $1", l.Role).Scan(&n); err == nil && n > peak {
				peak = n
			}
			select {
			case <-stop:
				return
			case <-time.After(5 * time.Millisecond):
			}
		}
	}()
	wg.Wait()
	close(stop)
	<-done
	if peak > 2 || peak == 0 {
		t.Errorf("12 clients through a pool of 2: %d backends at the peak, want 1 or 2", peak)
	}
}
