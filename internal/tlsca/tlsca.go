// Package tlsca makes the local certificate authority and the server
// certificate that `pgtenant up` serves TLS with (its PgBouncer front doors
// and its analytics port): an ECDSA P-256 CA and a certificate it signs for
// localhost, 127.0.0.1, ::1 and any hosts asked for. Clients verify the
// servers with the CA (sslmode=verify-full sslrootcert=ca.crt).
//
// It owns the four files of its directory and nothing else. It is
// idempotent: files that are still good are kept (a client's copy of
// ca.crt keeps working), a certificate that expires within RenewBefore, or
// that does not cover a host asked for, is made again.
package tlsca

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"fmt"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"regexp"
	"time"

	"github.com/pgtenant/pgtenant/internal/fleet"
)

// File names in the directory.
const (
	CAFile   = "ca.crt"     // the CA's certificate: what clients trust (sslrootcert)
	CAKey    = "ca.key"     // the CA's key: read by pgtenant only, to renew the server certificate
	CertFile = "server.crt" // the servers' certificate
	KeyFile  = "server.key" // its key: readable by the servers' OS user (PgBouncer runs as postgres under root)
)

// Lifetimes, and how long before its end a certificate is made again.
const (
	CALifetime     = 10 * 365 * 24 * time.Hour
	ServerLifetime = 397 * 24 * time.Hour
	RenewBefore    = 30 * 24 * time.Hour
)

// Files are the paths of a directory's certificate files.
type Files struct {
	Dir  string
	CA   string // ca.crt
	Cert string // server.crt
	Key  string // server.key
}

// DefaultHosts are the names every server certificate covers.
var DefaultHosts = []string{"localhost", "127.0.0.1", "::1"}

var dnsRE = regexp.MustCompile(`^[A-Za-z0-9*]([A-Za-z0-9.-]{0,252})$`)

// Ensure makes (or keeps) the CA and the server certificate in dir for
// DefaultHosts and hosts. The server key is made 0600 and, when pgtenant
// runs as root, owned by the postgres OS user, which runs PgBouncer; the
// CA's key stays pgtenant's own (0600); the certificates are 0644, since
// clients need to read ca.crt.
func Ensure(dir string, hosts ...string) (Files, error) {
	dir, err := filepath.Abs(dir)
	if err != nil {
		return Files{}, err
	}
	all := append(append([]string(nil), DefaultHosts...), hosts...)
	for _, h := range all {
		if net.ParseIP(h) == nil && !dnsRE.MatchString(h) {
			return Files{}, fmt.Errorf("tls: %q is neither an IP address nor a DNS name", h)
		}
	}
	user, err := fleet.ServerUser()
	if err != nil {
		return Files{}, err
	}
	if err := os.MkdirAll(dir, 0o711); err != nil {
		return Files{}, fmt.Errorf("tls: create %s: %w", dir, err)
	}
	if err := user.CheckTraversable(dir); err != nil {
		return Files{}, err
	}
	f := Files{Dir: dir, CA: filepath.Join(dir, CAFile), Cert: filepath.Join(dir, CertFile), Key: filepath.Join(dir, KeyFile)}
	now := time.Now()
	ca, caKey, err := loadCA(f.CA, filepath.Join(dir, CAKey), now)
	newCA := err != nil
	if newCA {
		if ca, caKey, err = makeCA(f.CA, filepath.Join(dir, CAKey), now); err != nil {
			return Files{}, err
		}
	}
	if newCA || !serverGood(f, ca, all, now) {
		if err := makeServer(f, ca, caKey, all, now); err != nil {
			return Files{}, err
		}
	}
	// Kept or made, the key belongs to the servers' OS user (a fleet first
	// made without root keeps working once run as root).
	if err := user.Own(f.Key); err != nil {
		return Files{}, fmt.Errorf("tls: give %s to the servers' OS user: %w", f.Key, err)
	}
	return f, nil
}

// loadCA reads the CA; an error when it is missing, unreadable, not a CA,
// its key not its own, or it expires within RenewBefore.
func loadCA(certPath, keyPath string, now time.Time) (*x509.Certificate, *ecdsa.PrivateKey, error) {
	pair, err := tls.LoadX509KeyPair(certPath, keyPath)
	if err != nil {
		return nil, nil, err
	}
	cert, err := x509.ParseCertificate(pair.Certificate[0])
	if err != nil {
		return nil, nil, err
	}
	key, ok := pair.PrivateKey.(*ecdsa.PrivateKey)
	if !ok || !cert.IsCA || now.Add(RenewBefore).After(cert.NotAfter) {
		return nil, nil, errors.New("the CA must be made again")
	}
	return cert, key, nil
}

// serverGood reports whether the server certificate can be kept: its key
// matches, the CA signed it, it covers every host and it does not expire
// within RenewBefore.
func serverGood(f Files, ca *x509.Certificate, hosts []string, now time.Time) bool {
	pair, err := tls.LoadX509KeyPair(f.Cert, f.Key)
	if err != nil {
		return false
	}
	cert, err := x509.ParseCertificate(pair.Certificate[0])
	if err != nil || cert.CheckSignatureFrom(ca) != nil || now.Add(RenewBefore).After(cert.NotAfter) {
		return false
	}
	for _, h := range hosts {
		if cert.VerifyHostname(h) != nil {
			return false
		}
	}
	return true
}

func serial() (*big.Int, error) {
	return rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 127))
}

func makeCA(certPath, keyPath string, now time.Time) (*x509.Certificate, *ecdsa.PrivateKey, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, nil, err
	}
	sn, err := serial()
	if err != nil {
		return nil, nil, err
	}
	host, _ := os.Hostname()
	tmpl := &x509.Certificate{
		SerialNumber:          sn,
		Subject:               pkix.Name{Organization: []string{"pgtenant"}, CommonName: "pgtenant local CA (" + host + ")"},
		NotBefore:             now.Add(-time.Hour),
		NotAfter:              now.Add(CALifetime),
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageCRLSign,
		BasicConstraintsValid: true,
		IsCA:                  true,
		MaxPathLenZero:        true,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		return nil, nil, fmt.Errorf("tls: make the CA: %w", err)
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		return nil, nil, err
	}
	if err := writeKey(keyPath, key); err != nil {
		return nil, nil, err
	}
	if err := writePEM(certPath, "CERTIFICATE", der, 0o644); err != nil {
		return nil, nil, err
	}
	return cert, key, nil
}

func makeServer(f Files, ca *x509.Certificate, caKey *ecdsa.PrivateKey, hosts []string, now time.Time) error {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return err
	}
	sn, err := serial()
	if err != nil {
		return err
	}
	tmpl := &x509.Certificate{
		SerialNumber: sn,
		Subject:      pkix.Name{Organization: []string{"pgtenant"}, CommonName: hosts[0]},
		NotBefore:    now.Add(-time.Hour),
		NotAfter:     now.Add(ServerLifetime),
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	}
	for _, h := range hosts {
		if ip := net.ParseIP(h); ip != nil {
			tmpl.IPAddresses = append(tmpl.IPAddresses, ip)
		} else {
			tmpl.DNSNames = append(tmpl.DNSNames, h)
		}
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca, &key.PublicKey, caKey)
	if err != nil {
		return fmt.Errorf("tls: make the server certificate: %w", err)
	}
	// The key first: a certificate never sits beside a key not its own
	// for longer than the two renames.
	if err := writeKey(f.Key, key); err != nil {
		return err
	}
	return writePEM(f.Cert, "CERTIFICATE", der, 0o644)
}

func writeKey(path string, key *ecdsa.PrivateKey) error {
	der, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		return err
	}
	return writePEM(path, "PRIVATE KEY", der, 0o600)
}

// writePEM writes atomically: a temp file renamed over path.
func writePEM(path, kind string, der []byte, mode os.FileMode) error {
	tmp := path + ".tmp"
	b := pem.EncodeToMemory(&pem.Block{Type: kind, Bytes: der})
	if err := os.WriteFile(tmp, b, mode); err != nil {
		return fmt.Errorf("tls: write %s: %w", path, err)
	}
	if err := os.Chmod(tmp, mode); err != nil { // an old temp file keeps its mode
		return fmt.Errorf("tls: write %s: %w", path, err)
	}
	if err := os.Rename(tmp, path); err != nil {
		return fmt.Errorf("tls: write %s: %w", path, err)
	}
	return nil
}

// Pool is a certificate pool holding the CA of f (for clients and tests).
func (f Files) Pool() (*x509.CertPool, error) {
	b, err := os.ReadFile(f.CA)
	if err != nil {
		return nil, err
	}
	p := x509.NewCertPool()
	if !p.AppendCertsFromPEM(b) {
		return nil, fmt.Errorf("tls: %s holds no certificate", f.CA)
	}
	return p, nil
}
