package daemon_test

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"math/big"
	"net"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/pgtenant/pgtenant/internal/daemon"
	"github.com/pgtenant/pgtenant/internal/daemon/daemontest"
	"github.com/pgtenant/pgtenant/internal/pgtest"
)

// selfSigned writes a self-signed certificate for 127.0.0.1 and its key, as
// PEM files in a temp dir, and returns their paths and the certificate pool
// that trusts it.
func selfSigned(t *testing.T) (certFile, keyFile string, roots *x509.CertPool) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber:          big.NewInt(1),
		Subject:               pkix.Name{CommonName: "pgtenant test"},
		NotBefore:             time.Now().Add(-time.Hour),
		NotAfter:              time.Now().Add(time.Hour),
		KeyUsage:              x509.KeyUsageDigitalSignature | x509.KeyUsageCertSign,
		ExtKeyUsage:           []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
		IPAddresses:           []net.IP{net.IPv4(127, 0, 0, 1)},
		BasicConstraintsValid: true,
		IsCA:                  true,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	keyDER, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	certFile, keyFile = filepath.Join(dir, "cert.pem"), filepath.Join(dir, "key.pem")
	certPEM := pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})
	if err := os.WriteFile(certFile, certPEM, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(keyFile, pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: keyDER}), 0o600); err != nil {
		t.Fatal(err)
	}
	roots = x509.NewCertPool()
	roots.AppendCertsFromPEM(certPEM)
	return certFile, keyFile, roots
}

// TestTLS_ServesHTTPS: with tls_cert_file and tls_key_file both listeners
// serve HTTPS only, the CLI's client works over https://, and the console's
// session cookie is Secure.
func TestTLS_ServesHTTPS(t *testing.T) {
	cfg := daemontest.Config(t, pg)
	var roots *x509.CertPool
	cfg.TLSCertFile, cfg.TLSKeyFile, roots = selfSigned(t)
	cfg.MetricsListen = "127.0.0.1:0"
	d, c := daemontest.Start(t, pg, cfg)
	if got, want := d.URL(), "https://"+d.Addr(); got != want {
		t.Errorf("URL = %q, want %q", got, want)
	}
	ctx := context.Background()
	if cs, err := c.Clusters(ctx); err != nil || len(cs) != 1 {
		t.Fatalf("clusters over https: %v, %v", cs, err)
	}

	// Plain HTTP gets nothing but Go's "HTTP request to an HTTPS server".
	resp, err := http.Get("http://" + d.Addr() + "/healthz")
	if err == nil {
		resp.Body.Close()
		if resp.StatusCode != http.StatusBadRequest {
			t.Errorf("plain HTTP to the TLS listener: status %d, want 400", resp.StatusCode)
		}
	}
	// A client that does not trust the certificate is refused by its own TLS check.
	if resp, err := http.Get(d.URL() + "/healthz"); err == nil {
		resp.Body.Close()
		t.Error("https with an untrusted self-signed certificate succeeded")
	}

	tr := &http.Transport{TLSClientConfig: &tls.Config{RootCAs: roots}}
	defer tr.CloseIdleConnections()
	con := newConsole(t, d.URL(), tr)
	ck := con.login(d.Token())
	if !ck.Secure || !ck.HttpOnly || ck.SameSite != http.SameSiteStrictMode {
		t.Errorf("session cookie over TLS %+v: want Secure, HttpOnly, SameSite=Strict", ck)
	}
	if !con.page(ck) {
		t.Error("the session does not open the console over https")
	}
	// Over TLS, a post from the plain-HTTP origin of the same host is another origin.
	if resp := con.post("/login", "http://"+d.Addr(), url.Values{"token": {d.Token()}}); resp.StatusCode != http.StatusForbidden {
		t.Errorf("login over TLS from the http:// origin: status %d, want 403", resp.StatusCode)
	}

	// metrics_listen is HTTPS too.
	hc := &http.Client{Transport: tr}
	resp, err = hc.Get("https://" + d.MetricsAddr() + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK || resp.TLS == nil {
		t.Errorf("metrics_listen over https: status %d, TLS %v; want 200 over TLS", resp.StatusCode, resp.TLS != nil)
	}
}

// TestTLS_BadFilesNamed: a missing or half-given certificate stops the
// daemon at start with the config fields named.
func TestTLS_BadFilesNamed(t *testing.T) {
	certFile, keyFile, _ := selfSigned(t)
	for _, tc := range []struct{ cert, key string }{
		{filepath.Join(t.TempDir(), "missing.pem"), keyFile},
		{certFile, ""},
		{keyFile, certFile}, // swapped
	} {
		cfg := daemontest.Config(t, pg)
		cfg.TLSCertFile, cfg.TLSKeyFile = tc.cert, tc.key
		d, err := daemon.New(context.Background(), daemon.Options{Config: cfg, Logger: pgtest.Logger(t)})
		if err == nil {
			d.Close()
			t.Errorf("cert %q key %q: daemon started, want an error", tc.cert, tc.key)
			continue
		}
		if !strings.Contains(err.Error(), "tls_cert_file") || !strings.Contains(err.Error(), "tls_key_file") {
			t.Errorf("cert %q key %q: error %q does not name tls_cert_file and tls_key_file", tc.cert, tc.key, err)
		}
	}
}
