package analytics_test

import (
	"context"
	"crypto/tls"
	"errors"
	"net/url"
	"path/filepath"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/pgtenant/pgtenant/internal/config"
	"github.com/pgtenant/pgtenant/internal/daemon/daemontest"
	"github.com/pgtenant/pgtenant/internal/pgtest"
	"github.com/pgtenant/pgtenant/internal/tlsca"
)

// sslMode is dsn with its sslmode set and its sslrootcert dropped.
func sslMode(t *testing.T, dsn, mode string) string {
	t.Helper()
	u, err := url.Parse(dsn)
	if err != nil {
		t.Fatal(err)
	}
	q := u.Query()
	q.Set("sslmode", mode)
	q.Del("sslrootcert")
	u.RawQuery = q.Encode()
	return u.String()
}

// countOver logs in to an analytics port and counts the mirror's rows,
// reporting whether the session ran over TLS.
func countOver(t *testing.T, dsn, password string) (n int64, secure bool, err error) {
	t.Helper()
	ctx := context.Background()
	conn, err := analyticsConn(t, dsn, password, pgx.QueryExecModeCacheStatement)
	if err != nil {
		return 0, false, err
	}
	defer conn.Close(ctx)
	_, secure = conn.PgConn().Conn().(*tls.Conn)
	err = conn.QueryRow(ctx, `SELECT count(*) FROM items`).Scan(&n)
	return n, secure, err
}

// TestWire_TLS: with a certificate the analytics port answers SSLRequest
// with TLS and hands out verify-full DSNs naming its CA; with require_tls
// a clear-text login is refused with what to do. A daemon that does not
// own the mirror forwards the session over TLS (the owner, which requires
// it, would refuse clear text), and takes clear text from its own clients
// when it does not require TLS.
func TestWire_TLS(t *testing.T) {
	ca, err := tlsca.Ensure(filepath.Join(pgtest.TempDir(t), "tls"))
	if err != nil {
		t.Fatal(err)
	}
	cfg := testConfig(t)
	cfg.Analytics.TLSCertFile, cfg.Analytics.TLSKeyFile, cfg.Analytics.TLSCAFile = ca.Cert, ca.Key, ca.CA
	cfg.Tiers["secure"] = config.Tier{ConnectionLimit: 10, RequireTLS: true}
	cfgA := cfg
	cfgA.Analytics.RequireTLS = true
	_, c := daemontest.Start(t, pg, cfgA)
	template(t, c)
	m := mirroredTenant(t, c, "schema")
	pw := m.r.Password

	u, err := url.Parse(m.dsn)
	if err != nil {
		t.Fatal(err)
	}
	if got, want := u.Query().Get("sslmode"), "verify-full"; got != want {
		t.Errorf("analytics DSN sslmode %q, want %q: %s", got, want, m.dsn)
	}
	if got, want := u.Query().Get("sslrootcert"), ca.CA; got != want {
		t.Errorf("analytics DSN sslrootcert %q, want the CA %q", got, want)
	}

	n, secure, err := countOver(t, m.dsn, pw)
	if err != nil {
		t.Fatalf("verify-full login to the analytics port: %v", err)
	}
	if n != 300 || !secure {
		t.Errorf("verify-full session: %d rows, TLS %v; want 300 over TLS", n, secure)
	}

	_, _, err = countOver(t, sslMode(t, m.dsn, "disable"), pw)
	var pe *pgconn.PgError
	if !errors.As(err, &pe) || pe.Code != "28000" || !strings.Contains(pe.Message, "sslmode=require") || pe.Severity != "FATAL" {
		t.Errorf("clear-text login with require_tls: %v; want FATAL 28000 telling to use sslmode=require", err)
	}

	// B: same certificate, no require_tls, not the owner.
	b, _ := daemontest.Start(t, pg, cfg)
	onB := onPort(t, m.dsn, b.Analytics().Addr())
	if n, secure, err := countOver(t, onB, pw); err != nil || n != 300 || !secure {
		t.Errorf("verify-full login forwarded by B: %d rows, TLS %v, %v; want 300 over TLS", n, secure, err)
	}
	if n, secure, err := countOver(t, sslMode(t, onB, "disable"), pw); err != nil || n != 300 || secure {
		t.Errorf("clear-text login to B (no require_tls), forwarded to the owner over TLS: %d rows, TLS %v, %v; want 300 in clear text", n, secure, err)
	}

	// A tier with require_tls: its tenant logs in to B over TLS only.
	if _, err := c.SetTenantTier(context.Background(), m.r.Tenant.ID, "secure"); err != nil {
		t.Fatal(err)
	}
	_, _, err = countOver(t, sslMode(t, onB, "disable"), pw)
	if !errors.As(err, &pe) || pe.Code != "28000" || !strings.Contains(pe.Message, "tier requires TLS") {
		t.Errorf("clear-text login of a require_tls tier's tenant: %v; want 28000 naming its tier's TLS", err)
	}
	if n, secure, err := countOver(t, onB, pw); err != nil || n != 300 || !secure {
		t.Errorf("verify-full login of a require_tls tier's tenant: %d rows, TLS %v, %v; want 300 over TLS", n, secure, err)
	}
}
