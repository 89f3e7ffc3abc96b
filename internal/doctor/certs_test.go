package doctor

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/pgtenant/pgtenant/internal/config"
	"github.com/pgtenant/pgtenant/internal/tlsca"
)

// TestCertFacts_ReadsTheFilesConfigured: the front door's certificate,
// the analytics port's and the API's once when they are the same file;
// each file's leaf expiry as up makes it, and a file that is no
// certificate named as such.
func TestCertFacts_ReadsTheFilesConfigured(t *testing.T) {
	dir := t.TempDir()
	// As root, up's CA lets the postgres OS user (PgBouncer) read the key.
	if err := os.Chmod(filepath.Dir(dir), 0o711); err != nil {
		t.Fatal(err)
	}
	files, err := tlsca.Ensure(dir)
	if err != nil {
		t.Fatal(err)
	}
	junk := filepath.Join(dir, "junk.crt")
	if err := os.WriteFile(junk, []byte("not a certificate"), 0o600); err != nil {
		t.Fatal(err)
	}
	cfg := config.Config{TLSCertFile: files.Cert, TLSKeyFile: files.Key}
	got := certFacts(cfg, files.Cert)
	if len(got) != 2 || got[0].What != "front door" || got[1].What != "analytics port" {
		t.Fatalf("certificates of cluster a: %+v, want its front door's and the analytics port's (the API's is the same file)", got)
	}
	want := time.Now().Add(tlsca.ServerLifetime)
	if d := got[0].NotAfter.Sub(want); got[0].Err != "" || d < -time.Hour || d > time.Hour {
		t.Errorf("expiry read %s (%s), want about %s", got[0].NotAfter, got[0].Err, want)
	}
	if b := certFacts(cfg, junk); len(b) != 2 || !strings.Contains(b[0].Err, "no PEM certificate") {
		t.Errorf("a junk front door certificate: %+v, want an error saying it holds none", b)
	}
	if c := certificates(time.Now(), certFacts(cfg, junk)); c.Status != Fail || !strings.Contains(c.Got, junk) {
		t.Errorf("check over a junk certificate: %+v, want fail naming the file", c)
	}
}
