package analytics

import (
	"context"
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"crypto/tls"
	"crypto/x509"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgproto3"
)

// Forwarding: any daemon's analytics port answers for any tenant. The
// daemon that accepted a session checks the tenant's password itself
// (SCRAM, as for a mirror it serves); when another live daemon owns the
// mirror, it opens the session on the owner's port with a proof of its own
// instead of the password, and pipes bytes both ways from then on.
//
// The proof is a startup parameter: v1.<expiry unix>.<nonce>.<mac>, the
// mac an HMAC-SHA256 under a secret every daemon of the fleet shares
// through the catalog, over the tenant, the owner's address, the expiry and
// the nonce. The owner refuses a session carrying the parameter unless the
// mac matches (constant-time), the expiry is near (forwardTTL) and not
// past, and the nonce has not been used: a tenant cannot forge one, nor use
// one made for another tenant or another daemon, nor replay one.
//
// The client's bytes after its last login message go through the pipe; a
// client that sent more before ReadyForQuery (no driver we know of does)
// would have them held in the login's reader and lost.

const (
	// forwardParam is the startup parameter carrying a daemon's proof.
	forwardParam = "pgtenant_forward"
	// forwardSecret names the fleet's shared key in the catalog.
	forwardSecret = "analytics_forward"
	// forwardTTL is how long a proof is valid: one dial and one startup.
	forwardTTL = 15 * time.Second
	// forwardDial and forwardHandshake bound the forwarder's wait for the
	// owner: a dead owner is a retry for the client, not a hang.
	forwardDial      = 3 * time.Second
	forwardHandshake = 10 * time.Second
	// maxGreeting bounds what the owner may send before ReadyForQuery.
	maxGreeting = 64 << 10
)

// errMoving is the answer when the tenant's mirror has no live owner to
// forward to.
var errMoving = &pgError{"57P03", "the analytics mirror of this tenant is moving between daemons (or its owner does not answer): retry in a few seconds"}

// errBadProof refuses a forward parameter, whatever is wrong with it.
var errBadProof = &pgError{"28000", "invalid forwarding proof"}

// forwardKey is the fleet's shared key, read (or made, by the first daemon
// to need it) from the catalog once.
func (s *Service) forwardKey(ctx context.Context) ([]byte, error) {
	s.fwdMu.Lock()
	defer s.fwdMu.Unlock()
	if s.fwdKey != nil {
		return s.fwdKey, nil
	}
	k, err := s.Store.Secret(ctx, forwardSecret)
	if err != nil {
		return nil, err
	}
	s.fwdKey = k
	return k, nil
}

// forwardMAC is the proof's mac.
func forwardMAC(key []byte, id, addr string, exp int64, nonce string) []byte {
	h := hmac.New(sha256.New, key)
	for _, part := range []string{"pgtenant analytics forward v1", id, addr, strconv.FormatInt(exp, 10), nonce} {
		var n [4]byte
		binary.BigEndian.PutUint32(n[:], uint32(len(part)))
		h.Write(n[:])
		h.Write([]byte(part))
	}
	return h.Sum(nil)
}

func forwardToken(key []byte, id, addr string, exp time.Time) string {
	b := make([]byte, 16)
	_, _ = rand.Read(b)
	nonce := hex.EncodeToString(b)
	return fmt.Sprintf("v1.%d.%s.%s", exp.Unix(), nonce, hex.EncodeToString(forwardMAC(key, id, addr, exp.Unix(), nonce)))
}

// checkForward verifies a proof for tenant id presented to this daemon.
func (s *Service) checkForward(ctx context.Context, id, token string) error {
	parts := strings.Split(token, ".")
	if len(parts) != 4 || parts[0] != "v1" || len(parts[2]) != 32 {
		return errBadProof
	}
	exp, err := strconv.ParseInt(parts[1], 10, 64)
	if err != nil {
		return errBadProof
	}
	mac, err := hex.DecodeString(parts[3])
	if err != nil {
		return errBadProof
	}
	key, err := s.forwardKey(ctx)
	if err != nil {
		s.Logger.Warn("analytics forward: read the fleet's key", "err", err)
		return errBadProof
	}
	if !hmac.Equal(mac, forwardMAC(key, id, s.addr, exp, parts[2])) {
		return errBadProof
	}
	now := time.Now()
	// Clocks of the fleet differ a little: a proof may be up to a minute
	// in the future, never past.
	if e := time.Unix(exp, 0); !e.After(now) || e.After(now.Add(forwardTTL+time.Minute)) {
		return errBadProof
	}
	s.fwdMu.Lock()
	defer s.fwdMu.Unlock()
	if s.nonces == nil {
		s.nonces = map[string]time.Time{}
	}
	for n, e := range s.nonces {
		if !e.After(now) {
			delete(s.nonces, n)
		}
	}
	if _, used := s.nonces[parts[2]]; used {
		return errBadProof
	}
	s.nonces[parts[2]] = time.Unix(exp, 0)
	return nil
}

// ownerOf is where tenant id's sessions go: "" to serve them here (this
// daemon owns or runs the mirror, or there is none: queries then say why),
// else the owner's analytics address; errMoving when the mirror has no
// live owner.
func (s *Service) ownerOf(ctx context.Context, id string) (string, error) {
	if s.running(id) {
		return "", nil
	}
	var owner, addr *string
	var live bool
	err := s.Store.Pool().QueryRow(ctx, `SELECT owner, owner_addr, coalesce(lease_expires > now(), false) FROM analytics WHERE tenant = $1`, id).Scan(&owner, &addr, &live)
	switch {
	case errors.Is(err, pgx.ErrNoRows):
		return "", nil
	case err != nil:
		return "", fmt.Errorf("read the mirror's owner: %w", err)
	case owner != nil && *owner == s.owner:
		return "", nil
	case owner == nil || !live:
		return "", errMoving
	case addr == nil || *addr == "":
		return "", &pgError{"57P03", "the daemon running this tenant's analytics mirror has no analytics port (analytics.listen)"}
	case *addr == s.addr:
		return "", nil
	}
	return *addr, nil
}

// dialOwner opens tenant id's session on the owner's port with a proof and
// reads the owner's greeting (AuthenticationOk … ReadyForQuery), returned
// as bytes to pass on to the client. An error the owner sends is returned
// as is.
func (s *Service) dialOwner(ctx context.Context, id, addr string, startup *pgproto3.StartupMessage) (net.Conn, []byte, error) {
	key, err := s.forwardKey(ctx)
	if err != nil {
		return nil, nil, err
	}
	oc, err := (&net.Dialer{Timeout: forwardDial}).DialContext(ctx, "tcp", addr)
	if err != nil {
		return nil, nil, err
	}
	ok := false
	defer func() {
		if !ok {
			oc.Close()
		}
	}()
	_ = oc.SetDeadline(time.Now().Add(forwardHandshake))
	sc, err := s.secureToOwner(oc, addr)
	if err != nil {
		return nil, nil, err
	}
	oc = sc
	params := map[string]string{"user": startup.Parameters["user"], forwardParam: forwardToken(key, id, addr, time.Now().Add(forwardTTL))}
	if db := startup.Parameters["database"]; db != "" {
		params["database"] = db
	}
	msg, err := (&pgproto3.StartupMessage{ProtocolVersion: pgproto3.ProtocolVersionNumber, Parameters: params}).Encode(nil)
	if err != nil {
		return nil, nil, err
	}
	if _, err := oc.Write(msg); err != nil {
		return nil, nil, err
	}
	// Read message by message, straight from the connection (no buffer
	// that could hold the client's bytes back from the pipe).
	var greeting []byte
	for {
		var head [5]byte
		if _, err := io.ReadFull(oc, head[:]); err != nil {
			return nil, nil, err
		}
		n := int(binary.BigEndian.Uint32(head[1:])) - 4
		if n < 0 || len(greeting)+5+n > maxGreeting {
			return nil, nil, errors.New("the owner's greeting is malformed or too long")
		}
		body := make([]byte, n)
		if _, err := io.ReadFull(oc, body); err != nil {
			return nil, nil, err
		}
		switch head[0] {
		case 'E':
			var e pgproto3.ErrorResponse
			if err := e.Decode(body); err != nil {
				return nil, nil, err
			}
			return nil, nil, &pgError{e.Code, e.Message}
		case 'R': // only AuthenticationOk: the owner must not ask for more
			if n != 4 || binary.BigEndian.Uint32(body) != 0 {
				return nil, nil, errors.New("the owner did not accept the forwarding proof")
			}
		case 'S', 'K', 'N':
		case 'Z':
			if len(greeting) == 0 {
				return nil, nil, errors.New("the owner sent ReadyForQuery before AuthenticationOk")
			}
		default:
			return nil, nil, fmt.Errorf("unexpected message %q from the owner", head[0])
		}
		greeting = append(append(greeting, head[:]...), body...)
		if head[0] == 'Z' {
			ok = true
			_ = oc.SetDeadline(time.Time{})
			return oc, greeting, nil
		}
	}
}

// secureToOwner asks the owner for TLS (an SSLRequest) when this daemon
// serves TLS itself (the daemons of a fleet share their configuration; one
// without a certificate forwards in clear text, as before TLS) and returns
// the connection to go on with: TLS when the owner offers it, verified against
// analytics.tls_ca_file when set (the owner's advertised host must be in
// its certificate), else encrypted without verification (as sslmode=require);
// clear text when it does not, unless this daemon's analytics.require_tls
// forbids it. The tenant's bytes go through this connection.
func (s *Service) secureToOwner(oc net.Conn, addr string) (net.Conn, error) {
	if s.TLS == nil {
		return oc, nil
	}
	req, err := (&pgproto3.SSLRequest{}).Encode(nil)
	if err != nil {
		return nil, err
	}
	if _, err := oc.Write(req); err != nil {
		return nil, err
	}
	var answer [1]byte
	if _, err := io.ReadFull(oc, answer[:]); err != nil {
		return nil, err
	}
	switch answer[0] {
	case 'N':
		if s.Config.RequireTLS {
			return nil, fmt.Errorf("the owner's analytics port (%s) serves no TLS, and analytics.require_tls forbids forwarding a session in clear text: give every daemon of the fleet a certificate", addr)
		}
		return oc, nil
	case 'S':
	default:
		return nil, fmt.Errorf("the owner answered %q to an SSLRequest", answer[0])
	}
	cfg := &tls.Config{MinVersion: tls.VersionTLS12}
	if s.Config.TLSCAFile != "" {
		b, err := os.ReadFile(s.Config.TLSCAFile)
		if err != nil {
			return nil, fmt.Errorf("analytics.tls_ca_file: %w", err)
		}
		pool := x509.NewCertPool()
		pool.AppendCertsFromPEM(b)
		host, _, _ := net.SplitHostPort(addr)
		cfg.RootCAs, cfg.ServerName = pool, host
	} else {
		cfg.InsecureSkipVerify = true // encrypted, not verified: no CA to verify with
	}
	tc := tls.Client(oc, cfg)
	if err := tc.Handshake(); err != nil {
		return nil, fmt.Errorf("TLS with the owner's analytics port %s: %w", addr, err)
	}
	return tc, nil
}

// pipe copies bytes both ways between the client and the owner until
// either side closes (or ctx ends: the session closes the client).
func pipe(c, oc net.Conn) {
	done := make(chan struct{}, 2)
	go func() { _, _ = io.Copy(oc, c); done <- struct{}{} }()
	go func() { _, _ = io.Copy(c, oc); done <- struct{}{} }()
	<-done
	c.Close()
	oc.Close()
	<-done
}
