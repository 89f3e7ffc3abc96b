package config_test

import (
	"strings"
	"testing"

	"github.com/pgtenant/pgtenant/internal/config"
)

func TestValidate_TLSKeys(t *testing.T) {
	const cluster = `
clusters:
  - name: c1
    dsn: postgres://a@db1/postgres
    pooler: {listen: "0.0.0.0:6432", dir: /var/lib/pgtenant/pooler-c1, %s}
`
	for _, c := range []struct{ name, yaml, want string }{
		{"pooler cert without key", strings.Replace(cluster, "%s", "tls_cert_file: /etc/p.crt", 1), "clusters[0].pooler.tls_key_file: required with tls_cert_file"},
		{"pooler key without cert", strings.Replace(cluster, "%s", "tls_key_file: /etc/p.key", 1), "clusters[0].pooler.tls_cert_file: required with tls_key_file"},
		{"pooler relative path", strings.Replace(cluster, "%s", "tls_cert_file: p.crt, tls_key_file: /etc/p.key", 1), "clusters[0].pooler.tls_cert_file: \"p.crt\": an absolute path"},
		{"pooler path with a newline", strings.Replace(cluster, "%s", `tls_cert_file: "/etc/p.crt\nadmin_users = x", tls_key_file: /etc/p.key`, 1), "clusters[0].pooler.tls_cert_file:"},
		{"pooler path with a quote", strings.Replace(cluster, "%s", `tls_cert_file: "/etc/p'.crt", tls_key_file: /etc/p.key`, 1), "clusters[0].pooler.tls_cert_file:"},
		{"pooler require_tls without cert", strings.Replace(cluster, "%s", "require_tls: true", 1), "clusters[0].pooler.require_tls: needs tls_cert_file"},
		{"pooler CA without cert", strings.Replace(cluster, "%s", "tls_ca_file: /etc/ca.crt", 1), "clusters[0].pooler.tls_ca_file: needs tls_cert_file"},
		{"tier require_tls, pooler without cert", strings.Replace(cluster, "%s", "max_client_conn: 10", 1) + "tiers:\n  secure: {require_tls: true}\n", "tiers.secure.require_tls: the pooler of cluster c1"},
		{"analytics cert without key", "analytics: {tls_cert_file: /etc/a.crt}\n", "analytics.tls_cert_file: set both"},
		{"analytics require_tls without any cert", "analytics: {require_tls: true}\n", "analytics.require_tls: needs a certificate"},
	} {
		_, err := config.Parse([]byte(c.yaml))
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: got %v, want an error with %q", c.name, err, c.want)
		}
	}

	// Accepted: a pooler with both files and require_tls, a tier that
	// requires TLS, the analytics port on the daemon's certificate.
	ok := strings.Replace(cluster, "%s", "tls_cert_file: /etc/p.crt, tls_key_file: /etc/p.key, tls_ca_file: /etc/ca.crt, require_tls: true", 1) +
		"tiers:\n  secure: {require_tls: true}\ntls_cert_file: /etc/d.crt\ntls_key_file: /etc/d.key\nanalytics: {require_tls: true}\n"
	cfg, err := config.Parse([]byte(ok))
	if err != nil {
		t.Fatal(err)
	}
	if p := cfg.Clusters[0].Pooler; p.TLSCertFile != "/etc/p.crt" || p.TLSKeyFile != "/etc/p.key" || p.TLSCAFile != "/etc/ca.crt" || !p.RequireTLS {
		t.Errorf("pooler block: %+v", p)
	}
	if !cfg.Tiers["secure"].RequireTLS || !cfg.Analytics.RequireTLS {
		t.Errorf("tier secure %+v, analytics %+v: want require_tls", cfg.Tiers["secure"], cfg.Analytics)
	}
	if cert, key := cfg.AnalyticsTLSPair(); cert != "/etc/d.crt" || key != "/etc/d.key" {
		t.Errorf("analytics pair %s %s, want the daemon's", cert, key)
	}
	// Files are loaded at start, not at parse: missing ones are named then.
	if err := cfg.Clusters[0].Pooler.CheckTLSFiles(); err == nil || !strings.Contains(err.Error(), "tls_cert_file: /etc/p.crt") {
		t.Errorf("CheckTLSFiles of missing files: %v", err)
	}
}
