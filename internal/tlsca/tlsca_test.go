package tlsca

import (
	"bytes"
	"crypto/tls"
	"crypto/x509"
	"encoding/pem"
	"os"
	"os/user"
	"path/filepath"
	"strconv"
	"syscall"
	"testing"
	"time"
)

func read(t *testing.T, path string) []byte {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func leaf(t *testing.T, f Files) *x509.Certificate {
	t.Helper()
	block, _ := pem.Decode(read(t, f.Cert))
	if block == nil {
		t.Fatalf("%s holds no PEM block", f.Cert)
	}
	c, err := x509.ParseCertificate(block.Bytes)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// tempDir is a directory the postgres OS user can reach when the test
// runs as root (t.TempDir's parent is 0700).
func tempDir(t *testing.T) string {
	t.Helper()
	dir, err := os.MkdirTemp("/tmp", "tlsca-test-")
	if err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(dir, 0o711); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	return filepath.Join(dir, "tls")
}

func TestEnsure_MakesAVerifiableServerCertificate(t *testing.T) {
	f, err := Ensure(tempDir(t), "db.example.internal", "10.1.2.3")
	if err != nil {
		t.Fatal(err)
	}
	pool, err := f.Pool()
	if err != nil {
		t.Fatal(err)
	}
	cert := leaf(t, f)
	for _, host := range []string{"localhost", "127.0.0.1", "::1", "db.example.internal", "10.1.2.3"} {
		if _, err := cert.Verify(x509.VerifyOptions{DNSName: host, Roots: pool, KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}}); err != nil {
			t.Errorf("verify for %s: %v", host, err)
		}
	}
	if _, err := cert.Verify(x509.VerifyOptions{DNSName: "other.example", Roots: pool}); err == nil {
		t.Error("the certificate verifies for a host it was not made for")
	}
	if _, err := tls.LoadX509KeyPair(f.Cert, f.Key); err != nil {
		t.Errorf("certificate and key do not pair: %v", err)
	}
	modes := map[string]os.FileMode{f.CA: 0o644, f.Cert: 0o644, f.Key: 0o600, filepath.Join(f.Dir, CAKey): 0o600}
	for path, want := range modes {
		fi, err := os.Stat(path)
		if err != nil {
			t.Fatal(err)
		}
		if got := fi.Mode().Perm(); got != want {
			t.Errorf("%s: mode %v, want %v", filepath.Base(path), got, want)
		}
	}
	if os.Geteuid() == 0 {
		pg, err := user.Lookup("postgres")
		if err != nil {
			t.Skip("no postgres OS user")
		}
		fi, _ := os.Stat(f.Key)
		if got, want := strconv.Itoa(int(fi.Sys().(*syscall.Stat_t).Uid)), pg.Uid; got != want {
			t.Errorf("server.key owned by uid %s, want postgres (%s): PgBouncer runs as postgres", got, want)
		}
		fi, _ = os.Stat(filepath.Join(f.Dir, CAKey))
		if got := fi.Sys().(*syscall.Stat_t).Uid; got != 0 {
			t.Errorf("ca.key owned by uid %d, want root's only", got)
		}
	}
}

func TestEnsure_KeepsGoodFilesAndRenews(t *testing.T) {
	dir := tempDir(t)
	f, err := Ensure(dir)
	if err != nil {
		t.Fatal(err)
	}
	ca, cert, key := read(t, f.CA), read(t, f.Cert), read(t, f.Key)

	// Again: nothing changes.
	if _, err := Ensure(dir); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(read(t, f.CA), ca) || !bytes.Equal(read(t, f.Cert), cert) || !bytes.Equal(read(t, f.Key), key) {
		t.Fatal("a second Ensure changed good files")
	}

	// A host more: a new server certificate from the same CA.
	if _, err := Ensure(dir, "pooler.internal"); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(read(t, f.CA), ca) {
		t.Error("the CA changed for a new host: clients' sslrootcert would break")
	}
	if bytes.Equal(read(t, f.Cert), cert) {
		t.Error("the certificate was kept though it does not cover pooler.internal")
	}
	if err := leaf(t, f).VerifyHostname("pooler.internal"); err != nil {
		t.Error(err)
	}

	// A certificate that expires in 10 days is renewed, the CA kept.
	caCert, caKey, err := loadCA(f.CA, filepath.Join(dir, CAKey), time.Now())
	if err != nil {
		t.Fatal(err)
	}
	hosts := append(append([]string(nil), DefaultHosts...), "pooler.internal")
	if err := makeServer(f, caCert, caKey, hosts, time.Now().Add(10*24*time.Hour-ServerLifetime)); err != nil {
		t.Fatal(err)
	}
	if left := time.Until(leaf(t, f).NotAfter); left > 11*24*time.Hour {
		t.Fatalf("arranged certificate has %s left", left)
	}
	if _, err := Ensure(dir, "pooler.internal"); err != nil {
		t.Fatal(err)
	}
	if left := time.Until(leaf(t, f).NotAfter); left < ServerLifetime-2*time.Hour {
		t.Errorf("expiring certificate not renewed: %s left", left)
	}
	if !bytes.Equal(read(t, f.CA), ca) {
		t.Error("renewing the server certificate changed the CA")
	}

	// A broken key: both made again, and they pair.
	if err := os.WriteFile(f.Key, []byte("junk"), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := Ensure(dir); err != nil {
		t.Fatal(err)
	}
	if _, err := tls.LoadX509KeyPair(f.Cert, f.Key); err != nil {
		t.Errorf("after a broken key: %v", err)
	}
}

func TestEnsure_RefusesABadHost(t *testing.T) {
	if _, err := Ensure(tempDir(t), "bad host\n"); err == nil {
		t.Fatal("a host with a space and a newline was accepted")
	}
}
