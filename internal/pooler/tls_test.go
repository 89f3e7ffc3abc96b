package pooler_test

import (
	"context"
	"crypto/tls"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	examples "github.com/pgtenant/pgtenant/examples/templates"
	"github.com/pgtenant/pgtenant/internal/catalog"
	"github.com/pgtenant/pgtenant/internal/config"
	"github.com/pgtenant/pgtenant/internal/daemon"
	"github.com/pgtenant/pgtenant/internal/daemon/daemontest"
	"github.com/pgtenant/pgtenant/internal/pgtest"
	"github.com/pgtenant/pgtenant/internal/pooler"
	"github.com/pgtenant/pgtenant/internal/provision"
	"github.com/pgtenant/pgtenant/internal/tlsca"
)

// secureTier requires TLS through the front door.
const secureTier = "secure"

// withSSLMode is dsn with its sslmode (and sslrootcert) replaced.
func withSSLMode(t *testing.T, dsn, mode, rootCert string) string {
	t.Helper()
	u, err := url.Parse(dsn)
	if err != nil {
		t.Fatal(err)
	}
	q := u.Query()
	q.Set("sslmode", mode)
	q.Del("sslrootcert")
	if rootCert != "" {
		q.Set("sslrootcert", rootCert)
	}
	u.RawQuery = q.Encode()
	return u.String()
}

// overTLS logs in with dsn and reports whether the session is TLS (pgx's
// connection is a *tls.Conn), and who it is.
func overTLS(ctx context.Context, dsn string) (bool, string, error) {
	conn, err := connectDSN(ctx, dsn)
	if err != nil {
		return false, "", err
	}
	defer conn.Close(ctx)
	var user string
	if err := conn.QueryRow(ctx, "SELECT current_user").Scan(&user); err != nil {
		return false, "", err
	}
	_, secure := conn.PgConn().Conn().(*tls.Conn)
	return secure, user, nil
}

// TestFrontDoor_TLS: a front door with a certificate hands out
// verify-full DSNs naming its CA, which libpq (psql) and pgx log in with
// over TLS; a tenant of a tier without require_tls may still use clear
// text, one of a require_tls tier may not; a client trusting another CA
// is refused the server.
func TestFrontDoor_TLS(t *testing.T) {
	ctx := pgtest.Context(t)
	ca, err := tlsca.Ensure(filepath.Join(pgtest.TempDir(t), "tls"))
	if err != nil {
		t.Fatal(err)
	}
	cfg := daemontest.Config(t, pg)
	cfg.Provision.DefaultPoolSize = 0
	cfg.Metrics.Interval = 0
	cfg.Prewarm.CaptureInterval, cfg.Prewarm.WatchInterval = 0, 0
	cfg.Tiers[secureTier] = config.Tier{ConnectionLimit: 3, StatementTimeout: config.Duration(30 * time.Second), RequireTLS: true}
	pc := daemontest.Pooler(t)
	pc.TLSCertFile, pc.TLSKeyFile, pc.TLSCAFile = ca.Cert, ca.Key, ca.CA
	// The server serves TLS with the same CA's certificate, and PgBouncer
	// verifies it (as it would on another host).
	pc.ServerTLSSSLMode, pc.ServerTLSCAFile = "verify-full", ca.CA
	serverTLS(t, ca)
	d, c, _ := daemontest.StartOptions(t, daemon.Options{Config: cfg, Managed: []catalog.Cluster{daemontest.Managed(pg)},
		Poolers: map[string]config.PoolerConfig{"local": pc}})
	daemontest.CreateTemplate(t, c, "saas", examples.Saas())
	front := d.Poolers().Get("local")

	conf, err := front.Proc.Read()
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"client_tls_sslmode = prefer", "client_tls_cert_file = " + ca.Cert, "client_tls_key_file = " + ca.Key, "client_tls_ca_file = " + ca.CA,
		"server_tls_sslmode = verify-full", "server_tls_ca_file = " + ca.CA} {
		if !strings.Contains(string(conf.Config), want+"\n") {
			t.Errorf("pgbouncer.ini lacks %q", want)
		}
	}

	plain, err := c.CreateTenant(ctx, provision.Request{Template: "saas", Mode: "database"})
	if err != nil {
		t.Fatal(err)
	}
	secure, err := c.CreateTenant(ctx, provision.Request{Template: "saas", Mode: "schema", Tier: secureTier})
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range []struct {
		name, dsn, role string
	}{{"default tier", plain.DSN, "t_" + plain.Tenant.ID}, {"require_tls tier", secure.DSN, "t_" + secure.Tenant.ID}} {
		u, err := url.Parse(r.dsn)
		if err != nil {
			t.Fatal(err)
		}
		if got, want := u.Query().Get("sslmode"), "verify-full"; got != want {
			t.Errorf("%s: DSN sslmode %q, want %q: %s", r.name, got, want, r.dsn)
		}
		if got, want := u.Query().Get("sslrootcert"), ca.CA; got != want {
			t.Errorf("%s: DSN sslrootcert %q, want the CA %q", r.name, got, want)
		}
		// pgx, verify-full as handed out.
		tlsOn, user, err := overTLS(ctx, r.dsn)
		if err != nil {
			t.Fatalf("%s: login with the DSN handed out (verify-full): %v", r.name, err)
		}
		if !tlsOn || user != r.role {
			t.Errorf("%s: verify-full session: TLS %v as %s, want TLS as %s", r.name, tlsOn, user, r.role)
		}
		// libpq, as a customer would.
		if psql, err := exec.LookPath("psql"); err == nil {
			out, err := exec.CommandContext(ctx, psql, "-X", "-d", r.dsn, "-c", `\conninfo`).CombinedOutput()
			if err != nil || !strings.Contains(string(out), "SSL connection (protocol: TLS") {
				t.Errorf("%s: psql with sslmode=verify-full: %v: %s", r.name, err, out)
			}
		}
	}

	// doctor reads the front door's certificate.
	rep, err := c.Doctor(ctx, "local")
	if err != nil {
		t.Fatal(err)
	}
	var certs string
	for _, ch := range rep.Clusters[0].Checks {
		if ch.Name == "certificates" {
			certs = ch.Status + ": " + ch.Got
		}
	}
	if !strings.HasPrefix(certs, "ok: front door until ") {
		t.Errorf("doctor's certificates check: %q, want ok naming the front door", certs)
	}

	// PgBouncer's own session to the server is TLS, verified.
	if conn, err := connectDSN(ctx, plain.DSN); err != nil {
		t.Fatal(err)
	} else {
		var ssl bool
		if err := conn.QueryRow(ctx, `SELECT ssl FROM pg_stat_ssl WHERE pid = pg_backend_pid()`).Scan(&ssl); err != nil || !ssl {
			t.Errorf("the pooler's server connection: ssl %v, %v; want TLS (server_tls_sslmode verify-full)", ssl, err)
		}
		conn.Close(ctx)
	}

	// Clear text: the default tier's tenant may, the secure tier's may not.
	tlsOn, _, err := overTLS(ctx, withSSLMode(t, plain.DSN, "disable", ""))
	if err != nil || tlsOn {
		t.Errorf("default tier, sslmode=disable: TLS %v, %v; want a clear-text session", tlsOn, err)
	}
	_, _, err = overTLS(ctx, withSSLMode(t, secure.DSN, "disable", ""))
	if err == nil {
		t.Fatal("require_tls tier, sslmode=disable: logged in in clear text")
	}
	if got := message(err); !strings.Contains(got, "login rejected") {
		t.Errorf("require_tls tier, sslmode=disable: %q, want PgBouncer's login rejected", got)
	}
	files, err := front.Proc.Read()
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"hostssl t_" + secure.Tenant.ID + " t_" + secure.Tenant.ID + " 0.0.0.0/0", "host t_" + plain.Tenant.ID + " t_" + plain.Tenant.ID + " 0.0.0.0/0"} {
		if !strings.Contains(string(files.HBA), want) {
			t.Errorf("HBA file lacks %q:\n%s", want, files.HBA)
		}
	}
	// sslmode=require (no verification) is TLS too, and admitted.
	if tlsOn, _, err := overTLS(ctx, withSSLMode(t, secure.DSN, "require", "")); err != nil || !tlsOn {
		t.Errorf("require_tls tier, sslmode=require: TLS %v, %v", tlsOn, err)
	}

	// A client that trusts another CA refuses the front door.
	other, err := tlsca.Ensure(filepath.Join(pgtest.TempDir(t), "other"))
	if err != nil {
		t.Fatal(err)
	}
	if _, _, err := overTLS(ctx, withSSLMode(t, plain.DSN, "verify-full", other.CA)); err == nil || !strings.Contains(err.Error(), "certificate") {
		t.Errorf("verify-full against another CA: %v, want a certificate error", err)
	}

	// A certificate renewed in place (same paths, pgbouncer.ini unchanged)
	// reaches PgBouncer at the next sync: a RELOAD, which re-reads the files.
	// Written into the existing files, which keep their owner and mode.
	before := front.Snapshot().Reloads
	for from, to := range map[string]string{other.Cert: ca.Cert, other.Key: ca.Key} {
		b, err := os.ReadFile(from)
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(to, b, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	if err := front.Sync(ctx); err != nil {
		t.Fatal(err)
	}
	if got := front.Snapshot().Reloads - before; got < 1 {
		t.Errorf("reloads after the certificate changed: %d, want one at least", got)
	}
	if tlsOn, _, err := overTLS(ctx, withSSLMode(t, plain.DSN, "verify-full", other.CA)); err != nil || !tlsOn {
		t.Errorf("after the renewal, verify-full against the new certificate's CA: TLS %v, %v", tlsOn, err)
	}
}

func TestRender_TLS(t *testing.T) {
	s := pooler.Settings{ListenHost: "127.0.0.1", ListenPort: 6432, ServerHost: "127.0.0.1", ServerPort: 5432, MaxClientConn: 10,
		ServerIdleTimeout: time.Second, QueryWaitTimeout: time.Second, AdminVerifier: pooler.AdminVerifier("pw", "/x")}
	e := pooler.Entry{Name: "t_a", Database: "t_a", Verifier: pooler.AdminVerifier("pw", "/y"), PoolMode: pooler.ModeSession, PoolSize: 1, MaxDBConnections: 1}
	secure := e
	secure.Name, secure.Database, secure.RequireTLS = "t_b", "t_b", true

	plain, err := pooler.Render("/d", s, []pooler.Entry{e})
	if err != nil {
		t.Fatal(err)
	}
	if strings.Contains(string(plain.Config), "client_tls") {
		t.Errorf("no certificate, yet TLS settings:\n%s", plain.Config)
	}

	s.TLSCertFile, s.TLSKeyFile, s.TLSCAFile = "/tls/server.crt", "/tls/server.key", "/tls/ca.crt"
	f, err := pooler.Render("/d", s, []pooler.Entry{e, secure})
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"client_tls_sslmode = prefer\n", "client_tls_cert_file = /tls/server.crt\n", "client_tls_key_file = /tls/server.key\n", "client_tls_ca_file = /tls/ca.crt\n"} {
		if !strings.Contains(string(f.Config), want) {
			t.Errorf("config lacks %q", want)
		}
	}
	for _, want := range []string{"host t_a t_a 0.0.0.0/0 scram-sha-256\n", "host t_a t_a ::/0 scram-sha-256\n",
		"hostssl t_b t_b 0.0.0.0/0 scram-sha-256\n", "hostssl t_b t_b ::/0 scram-sha-256\n",
		"host pgbouncer " + pooler.AdminUser + " 127.0.0.1/32 scram-sha-256\n"} {
		if !strings.Contains(string(f.HBA), want) {
			t.Errorf("HBA lacks %q:\n%s", want, f.HBA)
		}
	}

	// The pooler's require_tls: every entry hostssl, the console still host.
	s.RequireTLS = true
	f, err = pooler.Render("/d", s, []pooler.Entry{e, secure})
	if err != nil {
		t.Fatal(err)
	}
	if strings.Contains(string(f.HBA), "host t_") || !strings.Contains(string(f.HBA), "hostssl t_a t_a 0.0.0.0/0") ||
		!strings.Contains(string(f.HBA), "host pgbouncer ") {
		t.Errorf("pooler require_tls: want every entry hostssl, the console host:\n%s", f.HBA)
	}

	// What reaches pgbouncer.ini is a plain absolute path.
	for _, bad := range []string{"/tls/a\nadmin_users = t_a", "tls/relative.crt", "/tls/a b.crt", "/tls/'q'.crt", "/tls/a;b.crt"} {
		s2 := s
		s2.TLSCertFile = bad
		if _, err := pooler.Render("/d", s2, []pooler.Entry{e}); err == nil {
			t.Errorf("certificate path %q accepted", bad)
		}
	}
	s2 := s
	s2.TLSKeyFile = ""
	if _, err := pooler.Render("/d", s2, []pooler.Entry{e}); err == nil {
		t.Error("a certificate without its key accepted")
	}

	for _, c := range []struct {
		tls      bool
		ca, want string
	}{{false, "", "sslmode=disable"}, {true, "", "sslmode=require"}, {true, "/var/lib/pg+t/ca.crt", "sslmode=verify-full&sslrootcert=/var/lib/pg%2Bt/ca.crt"}} {
		if got := pooler.SSLQuery(c.tls, c.ca); got != c.want {
			t.Errorf("SSLQuery(%v, %q) = %q, want %q", c.tls, c.ca, got, c.want)
		}
		if q, err := url.ParseQuery(pooler.SSLQuery(c.tls, c.ca)); err != nil || (c.ca != "" && q.Get("sslrootcert") != c.ca) {
			t.Errorf("SSLQuery(%v, %q) parses to %v, %v", c.tls, c.ca, q, err)
		}
	}
}

// serverTLS turns TLS on in the package's server with ca's certificate
// (ssl is reloadable), off again when the test ends.
func serverTLS(t *testing.T, ca tlsca.Files) {
	t.Helper()
	ctx := pgtest.Context(t)
	admin, err := pg.Admin(t).Admin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	set := func(sqls ...string) {
		for _, sql := range sqls {
			if _, err := admin.Exec(ctx, sql); err != nil {
				t.Fatalf("%s: %v", sql, err)
			}
		}
	}
	set("ALTER SYSTEM SET ssl_cert_file = '"+ca.Cert+"'", "ALTER SYSTEM SET ssl_key_file = '"+ca.Key+"'", "ALTER SYSTEM SET ssl = on",
		"SELECT pg_reload_conf()")
	t.Cleanup(func() {
		set("ALTER SYSTEM RESET ssl", "ALTER SYSTEM RESET ssl_cert_file", "ALTER SYSTEM RESET ssl_key_file", "SELECT pg_reload_conf()")
	})
}
