package analytics

import (
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/base64"
	"errors"
	"fmt"
	"strconv"
	"strings"
)

// verifier is a parsed SCRAM-SHA-256 verifier as PostgreSQL stores it:
// SCRAM-SHA-256$<iterations>:<salt>$<StoredKey>:<ServerKey>.
type verifier struct {
	iterations           int
	salt                 []byte
	storedKey, serverKey []byte
}

var errNotSCRAM = errors.New("the role has no SCRAM-SHA-256 password")

func parseVerifier(s string) (verifier, error) {
	var v verifier
	rest, ok := strings.CutPrefix(s, "SCRAM-SHA-256$")
	if !ok {
		return v, errNotSCRAM
	}
	iterSalt, keys, ok := strings.Cut(rest, "$")
	if !ok {
		return v, errNotSCRAM
	}
	iter, salt, ok1 := strings.Cut(iterSalt, ":")
	stored, server, ok2 := strings.Cut(keys, ":")
	if !ok1 || !ok2 {
		return v, errNotSCRAM
	}
	var err error
	if v.iterations, err = strconv.Atoi(iter); err != nil {
		return v, errNotSCRAM
	}
	dec := base64.StdEncoding.DecodeString
	if v.salt, err = dec(salt); err != nil {
		return v, errNotSCRAM
	}
	if v.storedKey, err = dec(stored); err != nil {
		return v, errNotSCRAM
	}
	if v.serverKey, err = dec(server); err != nil {
		return v, errNotSCRAM
	}
	return v, nil
}

// decoyVerifier is used for a role that does not exist or cannot log in,
// so that the exchange looks the same and fails only at the proof.
func decoyVerifier() verifier {
	salt := make([]byte, 16)
	key := make([]byte, 32)
	_, _ = rand.Read(salt)
	_, _ = rand.Read(key)
	return verifier{iterations: 4096, salt: salt, storedKey: key, serverKey: key}
}

// scramServer is the server side of one SCRAM-SHA-256 exchange (RFC 5802,
// 7677), without channel binding (the analytics port is plain TCP).
type scramServer struct {
	v                                   verifier
	clientFirstBare, serverFirst, nonce string
}

// first takes the client-first-message and returns the server-first.
func (s *scramServer) first(msg string) (string, error) {
	if !strings.HasPrefix(msg, "n,,") && !strings.HasPrefix(msg, "y,,") {
		return "", errors.New("SCRAM: channel binding is not supported")
	}
	s.clientFirstBare = msg[3:]
	var cnonce string
	for _, attr := range strings.Split(s.clientFirstBare, ",") {
		if v, ok := strings.CutPrefix(attr, "r="); ok {
			cnonce = v
		}
	}
	if cnonce == "" {
		return "", errors.New("SCRAM: no client nonce")
	}
	b := make([]byte, 18)
	_, _ = rand.Read(b)
	s.nonce = cnonce + base64.RawStdEncoding.EncodeToString(b)
	s.serverFirst = fmt.Sprintf("r=%s,s=%s,i=%d", s.nonce, base64.StdEncoding.EncodeToString(s.v.salt), s.v.iterations)
	return s.serverFirst, nil
}

// final checks the client-final-message's proof and returns the
// server-final (its signature); an error means the password is wrong.
func (s *scramServer) final(msg string) (string, error) {
	withoutProof, proof64, ok := strings.Cut(msg, ",p=")
	if !ok {
		return "", errors.New("SCRAM: no proof")
	}
	var nonce, binding string
	for _, attr := range strings.Split(withoutProof, ",") {
		if v, ok := strings.CutPrefix(attr, "r="); ok {
			nonce = v
		}
		if v, ok := strings.CutPrefix(attr, "c="); ok {
			binding = v
		}
	}
	if nonce != s.nonce || (binding != "biws" && binding != "eSws") {
		return "", errors.New("SCRAM: nonce or channel binding mismatch")
	}
	proof, err := base64.StdEncoding.DecodeString(proof64)
	if err != nil || len(proof) != sha256.Size {
		return "", errors.New("SCRAM: bad proof")
	}
	authMessage := s.clientFirstBare + "," + s.serverFirst + "," + withoutProof
	sig := hmacSHA256(s.v.storedKey, authMessage)
	clientKey := make([]byte, len(proof))
	for i := range proof {
		clientKey[i] = proof[i] ^ sig[i]
	}
	stored := sha256.Sum256(clientKey)
	if subtle.ConstantTimeCompare(stored[:], s.v.storedKey) != 1 {
		return "", errors.New("SCRAM: wrong password")
	}
	return "v=" + base64.StdEncoding.EncodeToString(hmacSHA256(s.v.serverKey, authMessage)), nil
}

func hmacSHA256(key []byte, msg string) []byte {
	h := hmac.New(sha256.New, key)
	h.Write([]byte(msg))
	return h.Sum(nil)
}
