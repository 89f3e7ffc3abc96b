package doctor

import (
	"crypto/x509"
	"encoding/pem"
	"fmt"
	"os"
	"strings"
	"time"

	"github.com/pgtenant/pgtenant/internal/config"
)

// CertFacts is one TLS certificate a tenant's connections meet.
type CertFacts struct {
	What     string    // "front door", "analytics port", "API"
	Path     string    // its PEM file
	NotAfter time.Time // when it expires (zero when unreadable)
	Err      string    // the file could not be read or parsed
}

// certWarn is how long before its expiry a certificate is a warning.
const certWarn = 30 * 24 * time.Hour

// certFacts reads the certificates of a cluster's front door (frontCert,
// "" without one) and of the daemon's analytics port and API, where
// configured.
func certFacts(cfg config.Config, frontCert string) []CertFacts {
	var out []CertFacts
	add := func(what, path string) {
		if path == "" {
			return
		}
		f := CertFacts{What: what, Path: path}
		f.NotAfter, f.Err = readCertExpiry(path)
		out = append(out, f)
	}
	add("front door", frontCert)
	cert, _ := cfg.AnalyticsTLSPair()
	add("analytics port", cert)
	if cfg.TLSCertFile != cert {
		add("API", cfg.TLSCertFile)
	}
	return out
}

// readCertExpiry is the NotAfter of the first certificate of a PEM file
// (the leaf, as servers send it first).
func readCertExpiry(path string) (time.Time, string) {
	b, err := os.ReadFile(path)
	if err != nil {
		return time.Time{}, err.Error()
	}
	for rest := b; ; {
		var block *pem.Block
		if block, rest = pem.Decode(rest); block == nil {
			return time.Time{}, "no PEM certificate in it"
		}
		if block.Type == "CERTIFICATE" {
			c, err := x509.ParseCertificate(block.Bytes)
			if err != nil {
				return time.Time{}, err.Error()
			}
			return c.NotAfter, ""
		}
	}
}

// certificates: the TLS certificates tenants' connections meet are
// readable and not about to expire (an expired one fails every
// verify-full login, and PgBouncer refuses to reload a broken one).
func certificates(now time.Time, certs []CertFacts) Check {
	c := Check{Name: "certificates", Status: OK, Want: "each readable, expiring in more than 30 days",
		Why: "Tenants' drivers with sslmode=verify-full refuse an expired certificate: every login through that port fails " +
			"at once (docs/connections.md#tls).",
		Fix: "Put a renewed certificate and key at the same paths and restart what serves them (PgBouncer, the daemon); " +
			"`pgtenant up` renews its own 30 days ahead when it starts."}
	var got []string
	for _, f := range certs {
		left := f.NotAfter.Sub(now)
		switch {
		case f.Err != "":
			c.Status = Fail
			got = append(got, fmt.Sprintf("%s %s: %s", f.What, f.Path, f.Err))
		case left <= 0:
			c.Status = Fail
			got = append(got, fmt.Sprintf("%s %s expired %s", f.What, f.Path, f.NotAfter.UTC().Format(time.DateOnly)))
		case left < certWarn:
			if c.Status == OK {
				c.Status = Warn
			}
			got = append(got, fmt.Sprintf("%s %s expires %s (in %d days)", f.What, f.Path, f.NotAfter.UTC().Format(time.DateOnly), int(left.Hours()/24)))
		default:
			got = append(got, fmt.Sprintf("%s until %s", f.What, f.NotAfter.UTC().Format(time.DateOnly)))
		}
	}
	c.Got = strings.Join(got, "; ")
	if c.Status == OK {
		c.Fix = ""
	}
	return c
}
