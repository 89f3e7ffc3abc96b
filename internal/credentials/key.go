package credentials

import (
	"bytes"
	"crypto/aes"
	"crypto/cipher"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"path/filepath"
)

// KeySize is the size of a credentials key: AES-256.
const KeySize = 32

// Key seals kept passwords with AES-256-GCM. It is the operator's: read
// from credentials.key_file, never stored in the catalog, never logged
// (its ID, a fingerprint, may be).
type Key struct {
	aead cipher.AEAD
	id   string
}

// NewKey makes a Key of 32 raw bytes.
func NewKey(raw []byte) (*Key, error) {
	if len(raw) != KeySize {
		return nil, fmt.Errorf("credentials key: %d bytes, want %d", len(raw), KeySize)
	}
	block, err := aes.NewCipher(raw)
	if err != nil {
		return nil, fmt.Errorf("credentials key: %w", err)
	}
	aead, err := cipher.NewGCM(block)
	if err != nil {
		return nil, fmt.Errorf("credentials key: %w", err)
	}
	// The id says which key sealed a row, so that a daemon with another key
	// can say so. A hash of the key under a label of its own: it tells
	// nothing of the key (256 random bits).
	sum := sha256.Sum256(append([]byte("pgtenant credentials key id\x00"), raw...))
	return &Key{aead: aead, id: hex.EncodeToString(sum[:6])}, nil
}

// ParseKey reads a key file's contents: 32 bytes written as base64 or hex,
// surrounding whitespace ignored.
func ParseKey(text []byte) (*Key, error) {
	s := string(bytes.TrimSpace(text))
	if raw, err := hex.DecodeString(s); err == nil && len(raw) == KeySize {
		return NewKey(raw)
	}
	if raw, err := base64.StdEncoding.DecodeString(s); err == nil && len(raw) == KeySize {
		return NewKey(raw)
	}
	return nil, errors.New("want 32 random bytes written as base64 or hex, e.g. the output of `head -c 32 /dev/urandom | base64`")
}

// LoadOrCreateKey reads the key in path, or, when there is no such file,
// generates one and writes it there (base64, 0600). created says which.
func LoadOrCreateKey(path string) (key *Key, created bool, err error) {
	text, err := os.ReadFile(path)
	if errors.Is(err, os.ErrNotExist) {
		switch err := create(path); {
		case err == nil:
			created = true
		case errors.Is(err, os.ErrExist): // made by a daemon starting beside this one
		default:
			return nil, false, fmt.Errorf("credentials key file %s: %w", path, err)
		}
		text, err = os.ReadFile(path)
	}
	if err != nil {
		return nil, false, fmt.Errorf("credentials key file %s: %w", path, err)
	}
	key, err = ParseKey(text)
	if err != nil {
		return nil, false, fmt.Errorf("credentials key file %s: %w", path, err)
	}
	return key, created, nil
}

// create writes a new random key to path, failing with os.ErrExist if the
// file exists. The key is written to a temporary file first and linked into
// place, so that a daemon starting beside this one never reads half a key.
func create(path string) error {
	raw := make([]byte, KeySize)
	if _, err := rand.Read(raw); err != nil {
		return err
	}
	if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
		return err
	}
	f, err := os.CreateTemp(filepath.Dir(path), filepath.Base(path)+".new-*") // 0600
	if err != nil {
		return err
	}
	defer os.Remove(f.Name())
	if _, err := f.WriteString(base64.StdEncoding.EncodeToString(raw) + "\n"); err != nil {
		f.Close()
		return err
	}
	if err := f.Close(); err != nil {
		return err
	}
	return os.Link(f.Name(), path)
}

// ID is the key's fingerprint, stored beside each row it seals.
func (k *Key) ID() string { return k.id }

// Seal encrypts a tenant's password: a random nonce, then the ciphertext
// and its tag. The tenant id is authenticated with it, so that a sealed
// password copied to another tenant's row does not open there.
func (k *Key) Seal(tenantID, password string) ([]byte, error) {
	nonce := make([]byte, k.aead.NonceSize(), k.aead.NonceSize()+len(password)+k.aead.Overhead())
	if _, err := rand.Read(nonce); err != nil {
		return nil, err
	}
	return k.aead.Seal(nonce, nonce, []byte(password), []byte(tenantID)), nil
}

// errOpen: the sealed bytes do not open with this key for this tenant.
var errOpen = errors.New("does not open")

// Open decrypts what Seal sealed for the same tenant.
func (k *Key) Open(tenantID string, sealed []byte) (string, error) {
	n := k.aead.NonceSize()
	if len(sealed) < n+k.aead.Overhead() {
		return "", errOpen
	}
	plain, err := k.aead.Open(nil, sealed[:n], sealed[n:], []byte(tenantID))
	if err != nil {
		return "", errOpen
	}
	return string(plain), nil
}
