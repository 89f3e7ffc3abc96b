package credentials_test

import (
	"bytes"
	"encoding/base64"
	"encoding/hex"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"github.com/pgtenant/pgtenant/internal/credentials"
)

func testKey(t *testing.T, fill byte) *credentials.Key {
	t.Helper()
	k, err := credentials.NewKey(bytes.Repeat([]byte{fill}, credentials.KeySize))
	if err != nil {
		t.Fatal(err)
	}
	return k
}

// TestKey_SealOpen: a sealed password opens with the same key for the same
// tenant only, never shows the password, and never seals twice alike.
func TestKey_SealOpen(t *testing.T) {
	k, other := testKey(t, 1), testKey(t, 2)
	const password = "s3cret-password-of-tenant"
	a, err := k.Seal("aaaaaaaaaaaa", password)
	if err != nil {
		t.Fatal(err)
	}
	b, err := k.Seal("aaaaaaaaaaaa", password)
	if err != nil {
		t.Fatal(err)
	}
	if bytes.Equal(a, b) {
		t.Errorf("two seals of one password are equal: the nonce is not random")
	}
	for _, enc := range [][]byte{[]byte(password), []byte(hex.EncodeToString([]byte(password))), []byte(base64.StdEncoding.EncodeToString([]byte(password)))} {
		if bytes.Contains(a, enc) {
			t.Errorf("sealed bytes contain the password (%q)", enc)
		}
	}
	if got, err := k.Open("aaaaaaaaaaaa", a); err != nil || got != password {
		t.Errorf("Open = %q, %v; want the password", got, err)
	}
	tampered := bytes.Clone(a)
	tampered[len(tampered)-1] ^= 1
	for name, open := range map[string]func() (string, error){
		"another key":    func() (string, error) { return other.Open("aaaaaaaaaaaa", a) },
		"another tenant": func() (string, error) { return k.Open("bbbbbbbbbbbb", a) },
		"altered":        func() (string, error) { return k.Open("aaaaaaaaaaaa", tampered) },
		"truncated":      func() (string, error) { return k.Open("aaaaaaaaaaaa", a[:10]) },
	} {
		if got, err := open(); err == nil || got != "" {
			t.Errorf("%s: Open = %q, %v; want an error", name, got, err)
		}
	}
	if k.ID() == other.ID() || len(k.ID()) != 12 {
		t.Errorf("key ids %q and %q: want distinct 12-character fingerprints", k.ID(), other.ID())
	}
}

// TestLoadOrCreateKey: a missing key file is generated once (0600, base64)
// and read back as the same key; hex works too; anything else is refused
// with what to write.
func TestLoadOrCreateKey(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "sub", "credentials.key")
	var wg sync.WaitGroup
	keys := make([]*credentials.Key, 4)
	created := make([]bool, 4)
	for i := range keys {
		wg.Add(1)
		go func() {
			defer wg.Done()
			var err error
			if keys[i], created[i], err = credentials.LoadOrCreateKey(path); err != nil {
				t.Error(err)
			}
		}()
	}
	wg.Wait()
	if t.Failed() {
		return
	}
	n := 0
	for i, k := range keys {
		if created[i] {
			n++
		}
		if k.ID() != keys[0].ID() {
			t.Errorf("daemons starting together got keys %s and %s, want one", keys[0].ID(), k.ID())
		}
	}
	if n != 1 {
		t.Errorf("key created %d times, want once", n)
	}
	fi, err := os.Stat(path)
	if err != nil {
		t.Fatal(err)
	}
	if got, want := fi.Mode().Perm(), os.FileMode(0o600); got != want {
		t.Errorf("key file mode = %v, want %v", got, want)
	}
	text, _ := os.ReadFile(path)
	raw, err := base64.StdEncoding.DecodeString(strings.TrimSpace(string(text)))
	if err != nil || len(raw) != credentials.KeySize {
		t.Errorf("key file = %q: want 32 bytes in base64", text)
	}
	entries, _ := os.ReadDir(filepath.Dir(path))
	if len(entries) != 1 {
		t.Errorf("key dir holds %d files, want the key alone (no temporary files left)", len(entries))
	}

	hexPath := filepath.Join(dir, "hex.key")
	if err := os.WriteFile(hexPath, []byte(hex.EncodeToString(raw)+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if k, created, err := credentials.LoadOrCreateKey(hexPath); err != nil || created || k.ID() != keys[0].ID() {
		t.Errorf("the same key in hex: %v, created %v, %v; want the same key", k, created, err)
	}
	for _, bad := range []string{"", "short", hex.EncodeToString(raw[:16]), base64.StdEncoding.EncodeToString(append(raw, 1))} {
		p := filepath.Join(dir, "bad.key")
		if err := os.WriteFile(p, []byte(bad), 0o600); err != nil {
			t.Fatal(err)
		}
		if _, _, err := credentials.LoadOrCreateKey(p); err == nil || !strings.Contains(err.Error(), p) || !strings.Contains(err.Error(), "32 random bytes") {
			t.Errorf("key file %q: %v; want an error naming the file and what to write", bad, err)
		}
	}
}
