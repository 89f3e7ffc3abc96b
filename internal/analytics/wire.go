package analytics

import (
	"cmp"
	"context"
	"crypto/tls"
	"database/sql/driver"
	"errors"
	"fmt"
	"io"
	"math/big"
	"net"
	"regexp"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/duckdb/duckdb-go/v2"
	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5/pgproto3"
	"github.com/jackc/pgx/v5/pgtype"

	"github.com/pgtenant/pgtenant/internal/catalog"
	"github.com/pgtenant/pgtenant/internal/cluster"
	"github.com/pgtenant/pgtenant/internal/tenant"
)

// Listen binds the analytics port (Config.Listen); Run serves it. The
// tenants' analytics DSNs name Config.Advertise, or else the address bound,
// and other daemons forward sessions there.
func (s *Service) Listen(addr string) (net.Listener, error) {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("analytics.listen: listen on %s: %w", addr, err)
	}
	s.ln, s.addr = ln, cmp.Or(s.Config.Advertise, ln.Addr().String())
	return ln, nil
}

// Addr is the analytics port's address, "" without one.
func (s *Service) Addr() string { return s.addr }

// serve accepts tenants' sessions until ctx is done.
func (s *Service) serve(ctx context.Context) error {
	go func() {
		<-ctx.Done()
		s.ln.Close()
	}()
	for {
		c, err := s.ln.Accept()
		if err != nil {
			if ctx.Err() != nil {
				return nil
			}
			var ne net.Error
			if errors.As(err, &ne) && ne.Timeout() {
				continue
			}
			return fmt.Errorf("analytics port: %w", err)
		}
		go s.session(ctx, c)
	}
}

// pgError is an error a session sends to its client.
type pgError struct{ code, msg string }

func (e *pgError) Error() string { return e.msg }

func sendError(be *pgproto3.Backend, severity string, err error) {
	var pe *pgError
	code := "XX000"
	if errors.As(err, &pe) {
		code = pe.code
	}
	be.Send(&pgproto3.ErrorResponse{Severity: severity, SeverityUnlocalized: severity, Code: code, Message: err.Error()})
}

// session is one client of the analytics port: the tenant's own login
// (SCRAM-SHA-256 against its role's verifier), then its queries, on its
// own mirror only, read-only.
func (s *Service) session(ctx context.Context, raw net.Conn) {
	defer raw.Close()
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	go func() {
		<-ctx.Done()
		raw.Close()
	}()
	_ = raw.SetDeadline(time.Now().Add(30 * time.Second)) // the login
	// c is the session's connection: raw, or TLS over it.
	c, be, startup, err := s.startup(raw)
	if err != nil {
		if be != nil {
			sendError(be, "FATAL", err)
			_ = be.Flush()
		}
		return
	}
	l, oc, err := s.login(ctx, be, c, startup)
	if err != nil {
		sendError(be, "FATAL", err)
		_ = be.Flush()
		return
	}
	_ = c.SetDeadline(time.Time{})
	if oc != nil { // another daemon serves the mirror: pipe to it
		go func() {
			<-ctx.Done()
			oc.Close()
		}()
		pipe(c, oc)
		return
	}
	qctx, stop := context.WithCancel(ctx)
	defer stop()
	ss := &sqlSession{s: s, id: l.id, limit: l.limit, at: l.at, c: c, be: be, stmts: map[string]string{}, oids: map[string][]uint32{}, portals: map[string]portal{}}
	ss.credential.Store(l.credential)
	ss.stop = func() {
		stop()                                 // a running statement
		_ = c.SetReadDeadline(time.Unix(1, 0)) // a wait for the next message
	}
	release, err := s.admit(ss)
	if err != nil {
		sendError(be, "FATAL", err)
		_ = be.Flush()
		return
	}
	defer release()
	if err := s.welcome(be); err != nil {
		return
	}
	ss.run(qctx)
	if v := ss.ended.Load(); v != nil {
		sendError(be, "FATAL", v)
		_ = be.Flush()
	}
}

var errLogin = &pgError{"28P01", "password authentication failed"}

// errClearText refuses a clear-text startup when analytics.require_tls is on.
var (
	errClearText     = &pgError{"28000", "the analytics port requires TLS: connect with sslmode=require (or sslmode=verify-full with sslrootcert naming the CA that signed the port's certificate)"}
	errTierClearText = &pgError{"28000", "this tenant's tier requires TLS: connect with sslmode=require (or sslmode=verify-full with sslrootcert naming the CA that signed the port's certificate)"}
)

// startup reads the client's startup message. An SSLRequest is answered
// 'S' when the port has a certificate (Service.TLS), and the session goes
// on over TLS: the connection and backend returned are then the TLS ones;
// otherwise 'N' (clear text). A GSSEncRequest is always answered 'N'.
// With require_tls, a startup in clear text is refused. The backend
// returned is nil when nothing can be sent back.
func (s *Service) startup(c net.Conn) (net.Conn, *pgproto3.Backend, *pgproto3.StartupMessage, error) {
	be := pgproto3.NewBackend(c, c)
	be.SetMaxBodyLen(maxMessage)
	secure := false
	for {
		msg, err := be.ReceiveStartupMessage()
		if err != nil {
			return c, nil, nil, err
		}
		switch msg := msg.(type) {
		case *pgproto3.SSLRequest:
			if secure {
				return c, be, nil, &pgError{"08P01", "SSLRequest over TLS"}
			}
			if s.TLS == nil {
				if _, err := c.Write([]byte("N")); err != nil {
					return c, nil, nil, err
				}
				continue
			}
			if _, err := c.Write([]byte("S")); err != nil {
				return c, nil, nil, err
			}
			// The client sends nothing more before its TLS handshake, so
			// the clear-text backend holds no byte of the session: a new
			// one reads from the TLS connection.
			tc := tls.Server(c, s.TLS)
			if err := tc.Handshake(); err != nil {
				return c, nil, nil, err
			}
			c, secure = tc, true
			be = pgproto3.NewBackend(c, c)
			be.SetMaxBodyLen(maxMessage)
		case *pgproto3.GSSEncRequest:
			if _, err := c.Write([]byte("N")); err != nil { // no GSSAPI
				return c, nil, nil, err
			}
		case *pgproto3.StartupMessage:
			if !secure && s.Config.RequireTLS {
				return c, be, nil, errClearText
			}
			return c, be, msg, nil
		default:
			return c, be, nil, &pgError{"08P01", "unsupported startup message"}
		}
	}
}

// login authenticates the tenant of the startup message (read by
// startup): its password, or another daemon's forwarding proof
// (forward.go). A session
// to serve here is returned not yet greeted (the session counts it in the
// tenant's limit first). When another daemon owns the mirror, it returns
// the session opened there (greeted: the client has had AuthenticationOk …
// ReadyForQuery from the owner).
func (s *Service) login(ctx context.Context, be *pgproto3.Backend, c net.Conn, startup *pgproto3.StartupMessage) (login, net.Conn, error) {
	user, database := startup.Parameters["user"], startup.Parameters["database"]
	id, ok := strings.CutPrefix(user, tenant.Prefix)
	if token, forwarded := startup.Parameters[forwardParam]; forwarded {
		// Another daemon's proof in place of the password, never with it.
		l, err := s.acceptForward(ctx, id, ok && (database == "" || database == user), token)
		return l, nil, err
	}
	v := decoyVerifier()
	l := login{id: id, at: time.Now()}
	known := ok && tenant.ValidID(id) && (database == "" || database == user)
	var t catalog.Tenant
	if known {
		var err error
		if t, err = s.Store.GetTenant(ctx, nil, id); err != nil || t.State != catalog.StateActive {
			known = false
		}
	}
	if known {
		got, credential, limit, err := s.verifier(ctx, t)
		if err != nil {
			s.Logger.Warn("analytics login: read the tenant's verifier", "tenant", id, "err", err)
			known = false
		} else {
			v, l.credential, l.limit = got, credential, limit
		}
	}
	be.Send(&pgproto3.AuthenticationSASL{AuthMechanisms: []string{"SCRAM-SHA-256"}})
	if err := be.Flush(); err != nil {
		return login{}, nil, err
	}
	if err := be.SetAuthType(pgproto3.AuthTypeSASL); err != nil {
		return login{}, nil, err
	}
	msg, err := be.Receive()
	if err != nil {
		return login{}, nil, err
	}
	initial, ok := msg.(*pgproto3.SASLInitialResponse)
	if !ok || initial.AuthMechanism != "SCRAM-SHA-256" {
		return login{}, nil, &pgError{"28000", "SCRAM-SHA-256 authentication is required"}
	}
	sc := &scramServer{v: v}
	first, err := sc.first(string(initial.Data))
	if err != nil {
		return login{}, nil, &pgError{"08P01", err.Error()}
	}
	be.Send(&pgproto3.AuthenticationSASLContinue{Data: []byte(first)})
	if err := be.Flush(); err != nil {
		return login{}, nil, err
	}
	if err := be.SetAuthType(pgproto3.AuthTypeSASLContinue); err != nil {
		return login{}, nil, err
	}
	if msg, err = be.Receive(); err != nil {
		return login{}, nil, err
	}
	resp, ok := msg.(*pgproto3.SASLResponse)
	if !ok {
		return login{}, nil, &pgError{"08P01", "expected a SASL response"}
	}
	final, err := sc.final(string(resp.Data))
	if err != nil || !known {
		return login{}, nil, errLogin
	}
	// A tier's require_tls, judged once the password is: no one learns
	// a tenant's tier without it.
	if _, secure := c.(*tls.Conn); !secure && s.Tiers[t.Tier].RequireTLS {
		return login{}, nil, errTierClearText
	}
	addr, err := s.ownerOf(ctx, id)
	if err != nil {
		return login{}, nil, err
	}
	if addr == "" {
		be.Send(&pgproto3.AuthenticationSASLFinal{Data: []byte(final)})
		return l, nil, nil
	}
	// The owner accepts first: the client gets AuthenticationOk from it,
	// never from here before.
	oc, greeting, err := s.dialOwner(ctx, id, addr, startup)
	if err != nil {
		s.Logger.Warn("analytics login: forward to the mirror's owner", "tenant", id, "owner", addr, "err", err)
		var pe *pgError
		if errors.As(err, &pe) {
			return login{}, nil, err
		}
		return login{}, nil, errMoving
	}
	be.Send(&pgproto3.AuthenticationSASLFinal{Data: []byte(final)})
	if err := be.Flush(); err != nil {
		oc.Close()
		return login{}, nil, err
	}
	if _, err := c.Write(greeting); err != nil {
		oc.Close()
		return login{}, nil, err
	}
	return l, oc, nil
}

// acceptForward opens a session another daemon forwards: its proof (not
// the tenant's password) is checked; the session is then served as after
// a login. Its credential is the verifier read here, a moment (at most
// forwardTTL) after the other daemon checked the password against it.
func (s *Service) acceptForward(ctx context.Context, id string, wellFormed bool, token string) (login, error) {
	if !wellFormed || !tenant.ValidID(id) {
		return login{}, errBadProof
	}
	if err := s.checkForward(ctx, id, token); err != nil {
		return login{}, err
	}
	t, err := s.Store.GetTenant(ctx, nil, id)
	if err != nil || t.State != catalog.StateActive {
		return login{}, errBadProof
	}
	l := login{id: id, at: time.Now()}
	if _, l.credential, l.limit, err = s.verifier(ctx, t); err != nil {
		s.Logger.Warn("analytics forward: read the tenant's verifier", "tenant", id, "err", err)
		return login{}, errBadProof
	}
	return l, nil
}

// welcome ends a login: AuthenticationOk, the session's parameters,
// ReadyForQuery.
func (s *Service) welcome(be *pgproto3.Backend) error {
	be.Send(&pgproto3.AuthenticationOk{})
	for k, v := range map[string]string{"server_version": "15.0 (pgtenant analytics, DuckDB)", "client_encoding": "UTF8", "server_encoding": "UTF8",
		"DateStyle": "ISO, MDY", "TimeZone": "UTC", "integer_datetimes": "on", "standard_conforming_strings": "on", "default_transaction_read_only": "on"} {
		be.Send(&pgproto3.ParameterStatus{Name: k, Value: v})
	}
	be.Send(&pgproto3.BackendKeyData{ProcessID: 0, SecretKey: []byte{0, 0, 0, 0}})
	be.Send(&pgproto3.ReadyForQuery{TxStatus: 'I'})
	return be.Flush()
}

// verifier reads the tenant role's SCRAM verifier from pg_authid on its
// cluster: the same password logs in to the heap and to the mirror, and a
// rotation reaches both. With it come its fingerprint (sessions are
// checked against it: sessions.go) and the role's connection limit, the
// tier's connection_limit as provisioning applied it (-1: none).
func (s *Service) verifier(ctx context.Context, t catalog.Tenant) (v verifier, credential string, limit int, err error) {
	cl, err := s.Clusters.Get(t.Cluster)
	if err != nil {
		return verifier{}, "", 0, err
	}
	admin, err := cl.Admin(ctx)
	if err != nil {
		return verifier{}, "", 0, err
	}
	var pw string
	var canLogin bool
	err = admin.QueryRow(ctx, `SELECT coalesce(rolpassword, ''), rolcanlogin AND (rolvaliduntil IS NULL OR rolvaliduntil > now()), rolconnlimit
		FROM pg_catalog.pg_authid WHERE rolname = $1`, tenant.PhysicalName(t.ID)).Scan(&pw, &canLogin, &limit)
	if err != nil {
		return verifier{}, "", 0, cluster.Classify(err)
	}
	if !canLogin {
		return verifier{}, "", 0, errors.New("the role cannot log in")
	}
	v, err = parseVerifier(pw)
	return v, fingerprint(pw), limit, err
}

type portal struct {
	query   string
	params  []any
	formats []int16
	size    int // its parameters' bytes, as sent
}

// sqlSession runs one logged-in tenant's queries.
type sqlSession struct {
	s          *Service
	id         string
	limit      int          // the tenant's connection limit (-1: none)
	at         time.Time    // its login
	credential atomic.Value // string: the fingerprint of the verifier it is authorised by
	sessionState

	c       net.Conn
	be      *pgproto3.Backend
	stmts   map[string]string
	oids    map[string][]uint32 // statements' parameter types, as described
	portals map[string]portal
	held    int             // bytes of the statements' text and the portals' parameters
	warned  map[string]bool // refusals logged already (once per reason and session)
	failed  bool            // an error in an extended-protocol batch: skip to Sync
}

func (ss *sqlSession) run(ctx context.Context) {
	for {
		msg, err := ss.be.Receive()
		if ss.ended.Load() != nil {
			return
		}
		var long *pgproto3.ExceededMaxBodyLenErr
		if errors.As(err, &long) {
			// The rest of the message is not read: the session cannot go on.
			ss.refuse(refusedMessage, maxMessage)
			sendError(ss.be, "FATAL", &pgError{"54000", fmt.Sprintf("message of %d bytes: the analytics port takes messages of up to %d", long.ActualBodyLen, maxMessage)})
			_ = ss.be.Flush()
			// Read what the client still sends for a moment (at most the
			// announced body, never kept): closing on unread bytes would
			// reset the connection before the client reads the error.
			_ = ss.c.SetReadDeadline(time.Now().Add(time.Second))
			_, _ = io.CopyN(io.Discard, ss.c, int64(min(long.ActualBodyLen, 16*maxMessage)))
			return
		}
		if err != nil {
			return
		}
		if ss.failed {
			if _, ok := msg.(*pgproto3.Sync); !ok {
				continue
			}
		}
		switch msg.(type) {
		case *pgproto3.Query, *pgproto3.Describe, *pgproto3.Execute:
			// Each statement first checks that the tenant may still use
			// the port (sessions.go): a suspend, a drop or a new
			// password ends the session.
			v, err := ss.recheck(ctx)
			if v != nil {
				ss.end(v)
				return
			}
			if err != nil {
				if _, simple := msg.(*pgproto3.Query); simple {
					sendError(ss.be, "ERROR", &pgError{"57P03", "the analytics port cannot check the tenant's standing now: retry"})
					ss.be.Send(&pgproto3.ReadyForQuery{TxStatus: 'I'})
				} else {
					ss.fail(&pgError{"57P03", "the analytics port cannot check the tenant's standing now: retry"})
				}
				if err := ss.be.Flush(); err != nil {
					return
				}
				continue
			}
		}
		switch msg := msg.(type) {
		case *pgproto3.Terminate:
			return
		case *pgproto3.Query:
			if strings.TrimSpace(strings.Trim(msg.String, "; \n\t")) == "" {
				ss.be.Send(&pgproto3.EmptyQueryResponse{})
			} else if err := ss.query(ctx, msg.String, nil, nil, true); err != nil {
				if ss.ended.Load() != nil {
					return
				}
				sendError(ss.be, "ERROR", err)
			}
			ss.be.Send(&pgproto3.ReadyForQuery{TxStatus: 'I'})
		case *pgproto3.Parse:
			if err := ss.keepStatement(msg.Name, msg.Query); err != nil {
				ss.fail(err)
				continue
			}
			ss.be.Send(&pgproto3.ParseComplete{})
		case *pgproto3.Bind:
			q, ok := ss.stmts[msg.PreparedStatement]
			params, err := decodeParams(msg, ss.oids[msg.PreparedStatement])
			if err != nil {
				ss.fail(err)
				continue
			}
			if !ok {
				if !ss.failed {
					ss.fail(&pgError{"26000", "unknown prepared statement"})
				}
				continue
			}
			if err := ss.keepPortal(msg.DestinationPortal, portal{query: q, params: params, formats: msg.ResultFormatCodes}, msg.Parameters); err != nil {
				ss.fail(err)
				continue
			}
			ss.be.Send(&pgproto3.BindComplete{})
		case *pgproto3.Describe:
			q, ok := ss.stmts[msg.Name]
			var formats []int16
			if msg.ObjectType == 'P' {
				p, okp := ss.portals[msg.Name]
				q, ok, formats = p.query, okp, p.formats
			}
			if !ok {
				ss.fail(&pgError{"26000", "unknown statement or portal"})
				continue
			}
			if err := ss.describe(ctx, msg.Name, q, msg.ObjectType == 'S', formats); err != nil {
				ss.fail(err)
			}
		case *pgproto3.Execute:
			p, ok := ss.portals[msg.Portal]
			if !ok {
				ss.fail(&pgError{"34000", "unknown portal"})
				continue
			}
			if err := ss.query(ctx, p.query, p.params, p.formats, false); err != nil {
				ss.fail(err)
			}
		case *pgproto3.Close:
			if msg.ObjectType == 'S' {
				ss.dropStatement(msg.Name)
			} else {
				ss.dropPortal(msg.Name)
			}
			ss.be.Send(&pgproto3.CloseComplete{})
		case *pgproto3.Sync:
			ss.failed = false
			ss.be.Send(&pgproto3.ReadyForQuery{TxStatus: 'I'})
		case *pgproto3.Flush:
		default:
			ss.fail(&pgError{"0A000", fmt.Sprintf("message %T is not supported", msg)})
		}
		if ss.ended.Load() != nil {
			return
		}
		if err := ss.be.Flush(); err != nil {
			return
		}
	}
}

// keepStatement keeps a prepared statement (a new one under a name in use
// replaces it), within the session's limits.
func (ss *sqlSession) keepStatement(name, q string) error {
	old, replaces := ss.stmts[name]
	if !replaces && name != "" && len(ss.stmts) >= maxStatements {
		ss.refuse(refusedStatements, maxStatements)
		return &pgError{"54000", fmt.Sprintf("too many prepared statements in this session (the analytics port keeps %d): close some", maxStatements)}
	}
	if ss.held-len(old)+len(q) > maxHeld {
		ss.refuse(refusedHeld, maxHeld)
		return &pgError{"54000", fmt.Sprintf("this session's prepared statements and portals would hold more than %d MB: close some", maxHeld>>20)}
	}
	ss.held += len(q) - len(old)
	ss.stmts[name] = q
	delete(ss.oids, name)
	return nil
}

func (ss *sqlSession) dropStatement(name string) {
	ss.held -= len(ss.stmts[name])
	delete(ss.stmts, name)
	delete(ss.oids, name)
}

// keepPortal keeps a bound portal, within the session's limits; raw is
// its parameters as sent (what it holds, counted).
func (ss *sqlSession) keepPortal(name string, p portal, raw [][]byte) error {
	n := 0
	for _, b := range raw {
		n += len(b)
	}
	old, replaces := ss.portals[name]
	if !replaces && name != "" && len(ss.portals) >= maxPortals {
		ss.refuse(refusedPortals, maxPortals)
		return &pgError{"54000", fmt.Sprintf("too many portals in this session (the analytics port keeps %d): close some", maxPortals)}
	}
	if ss.held-old.size+n > maxHeld {
		ss.refuse(refusedHeld, maxHeld)
		return &pgError{"54000", fmt.Sprintf("this session's prepared statements and portals would hold more than %d MB: close some", maxHeld>>20)}
	}
	p.size = n
	ss.held += n - old.size
	ss.portals[name] = p
	return nil
}

func (ss *sqlSession) dropPortal(name string) {
	ss.held -= ss.portals[name].size
	delete(ss.portals, name)
}

// refuse counts a refusal; the log has the first of each reason in a
// session (a client that goes on would fill it).
func (ss *sqlSession) refuse(reason string, limit int) {
	if ss.warned == nil {
		ss.warned = map[string]bool{}
	}
	if ss.warned[reason] {
		if ss.s.refusals != nil {
			ss.s.refusals.WithLabelValues(reason).Inc()
		}
		return
	}
	ss.warned[reason] = true
	ss.s.refused(reason, ss.id, "session limit", limit)
}

func (ss *sqlSession) fail(err error) {
	sendError(ss.be, "ERROR", err)
	ss.failed = true
}

func format(codes []int16, i int) int16 {
	switch len(codes) {
	case 0:
		return 0
	case 1:
		return codes[0]
	}
	if i < len(codes) {
		return codes[i]
	}
	return 0
}

var waitRE = regexp.MustCompile(`(?is)^\s*wait\s+for\s+lsn\s+'([0-9a-f]+/[0-9a-f]+)'\s*;?\s*$`)

// withStmt prepares q (one statement) on the tenant's mirror and runs f
// with it, within the statement timeout: on a DuckDB connection of its
// own, in a read-only transaction, a SELECT or an EXPLAIN of one only
// (readonly.go). The connection goes after f, and whatever q did to it.
func (ss *sqlSession) withStmt(ctx context.Context, q string, f func(ctx context.Context, st *duckdb.Stmt) error) error {
	ctx, cancel := context.WithTimeout(ctx, ss.s.Config.StatementTimeout.D())
	defer cancel()
	err := ss.s.withConn(ctx, ss.id, func(c *duckdb.Conn) error {
		if _, err := c.ExecContext(ctx, "BEGIN TRANSACTION READ ONLY", nil); err != nil {
			return err
		}
		defer func() { _, _ = c.ExecContext(context.WithoutCancel(ctx), "ROLLBACK", nil) }()
		st, err := prepareReadOnly(ctx, c, catalogCompat(q, ss.id))
		if err != nil {
			return err
		}
		defer st.Close()
		return f(ctx, st)
	})
	switch {
	case errors.Is(err, ErrNotHere):
		return &pgError{"57P03", "the analytics mirror of this tenant is not ready on this server (not enabled, still copying, or served by another daemon: see `pgtenant analytics status`)"}
	case errors.Is(ctx.Err(), context.DeadlineExceeded):
		return &pgError{"57014", fmt.Sprintf("canceling statement due to statement timeout (%s)", ss.s.Config.StatementTimeout.D())}
	case ss.ended.Load() != nil:
		return ss.ended.Load()
	}
	return ss.s.redact(err)
}

// redact takes the analytics directory out of an error a tenant is sent
// (DuckDB names its files in some, a failed spill for one).
func (s *Service) redact(err error) error {
	if err == nil || s.Dir == "" || !strings.Contains(err.Error(), s.Dir) {
		return err
	}
	code := "XX000"
	var pe *pgError
	if errors.As(err, &pe) {
		code = pe.code
	}
	return &pgError{code, strings.ReplaceAll(err.Error(), s.Dir, "<analytics dir>")}
}

// describe sends a statement's (or portal's) row description.
func (ss *sqlSession) describe(ctx context.Context, name, q string, stmt bool, formats []int16) error {
	if waitRE.MatchString(q) {
		if stmt {
			ss.be.Send(&pgproto3.ParameterDescription{})
		}
		ss.be.Send(&pgproto3.RowDescription{Fields: []pgproto3.FieldDescription{{Name: []byte("applied_lsn"), DataTypeOID: pgtype.TextOID, DataTypeSize: -1, TypeModifier: -1}}})
		return nil
	}
	return ss.withStmt(ctx, q, func(ctx context.Context, st *duckdb.Stmt) error {
		if stmt {
			params := make([]uint32, st.NumInput())
			for i := range params {
				t, _ := st.ParamType(i + 1)
				params[i] = oidOfType(t)
			}
			ss.oids[name] = params
			ss.be.Send(&pgproto3.ParameterDescription{ParameterOIDs: params})
		}
		n, err := st.ColumnCount()
		if err != nil {
			return err
		}
		if n == 0 {
			ss.be.Send(&pgproto3.NoData{})
			return nil
		}
		fields := make([]pgproto3.FieldDescription, n)
		for i := range fields {
			name, _ := st.ColumnName(i)
			t, _ := st.ColumnType(i)
			fields[i] = pgproto3.FieldDescription{Name: []byte(name), DataTypeOID: oidOfType(t), DataTypeSize: -1, TypeModifier: -1, Format: format(formats, i)}
		}
		ss.be.Send(&pgproto3.RowDescription{Fields: fields})
		return nil
	})
}

// query runs one statement and streams its rows; simple sends the row
// description first (the simple protocol), the extended one has sent it
// with Describe.
func (ss *sqlSession) query(ctx context.Context, q string, params []any, formats []int16, simple bool) error {
	if m := waitRE.FindStringSubmatch(q); m != nil {
		return ss.waitLSN(ctx, m[1], simple)
	}
	ss.s.countQuery(ss.id)
	return ss.withStmt(ctx, q, func(ctx context.Context, st *duckdb.Stmt) error {
		args := make([]driver.NamedValue, len(params))
		for i, p := range params {
			args[i] = driver.NamedValue{Ordinal: i + 1, Value: p}
		}
		rows, err := st.QueryContext(ctx, args)
		if err != nil {
			return &pgError{"42000", err.Error()}
		}
		defer rows.Close()
		cols := rows.Columns()
		oids := make([]uint32, len(cols))
		typed, _ := rows.(driver.RowsColumnTypeDatabaseTypeName)
		for i := range cols {
			oids[i] = pgtype.TextOID
			if typed != nil {
				oids[i] = oidOf(typed.ColumnTypeDatabaseTypeName(i))
			}
		}
		if simple {
			fields := make([]pgproto3.FieldDescription, len(cols))
			for i, c := range cols {
				fields[i] = pgproto3.FieldDescription{Name: []byte(c), DataTypeOID: oids[i], DataTypeSize: -1, TypeModifier: -1}
			}
			ss.be.Send(&pgproto3.RowDescription{Fields: fields})
		}
		m := pgtype.NewMap()
		vals := make([]driver.Value, len(cols))
		var n int
		for {
			err := rows.Next(vals)
			if err == io.EOF {
				break
			}
			if err != nil {
				if ctx.Err() != nil {
					return ctx.Err()
				}
				return &pgError{"42000", err.Error()}
			}
			out := make([][]byte, len(cols))
			for i, v := range vals {
				if out[i], err = encode(m, oids[i], format(formats, i), v); err != nil {
					return &pgError{"22000", fmt.Sprintf("column %s: %v", cols[i], err)}
				}
			}
			ss.be.Send(&pgproto3.DataRow{Values: out})
			n++
			if n%1000 == 0 { // stream: a large result is not held in memory
				if err := ss.be.Flush(); err != nil {
					return err
				}
			}
		}
		ss.be.Send(&pgproto3.CommandComplete{CommandTag: []byte("SELECT " + strconv.Itoa(n))})
		return nil
	})
}

// waitLSN answers `WAIT FOR LSN 'X/Y'` once the mirror has applied the
// primary's changes up to that LSN (read-your-writes after a write on the
// primary: SELECT pg_current_wal_lsn() there), within the statement timeout.
func (ss *sqlSession) waitLSN(ctx context.Context, text string, simple bool) error {
	want, err := pglogrepl.ParseLSN(text)
	if err != nil {
		return &pgError{"22023", err.Error()}
	}
	ctx, cancel := context.WithTimeout(ctx, ss.s.Config.StatementTimeout.D())
	defer cancel()
	for {
		applied, caughtUp, ok := ss.s.position(ss.id, want)
		// The mirror has every change of the tenant up to caughtUp: what
		// it applied, or what the primary decoded with nothing pending.
		if ok && caughtUp >= want {
			if simple {
				ss.be.Send(&pgproto3.RowDescription{Fields: []pgproto3.FieldDescription{{Name: []byte("applied_lsn"), DataTypeOID: pgtype.TextOID, DataTypeSize: -1, TypeModifier: -1}}})
			}
			ss.be.Send(&pgproto3.DataRow{Values: [][]byte{[]byte(applied.String())}})
			ss.be.Send(&pgproto3.CommandComplete{CommandTag: []byte("SELECT 1")})
			return nil
		}
		select {
		case <-ctx.Done():
			return &pgError{"57014", fmt.Sprintf("the mirror has not reached %s within the statement timeout", want)}
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// position is what the tenant's mirror has applied and the LSN up to which
// it holds every change of the tenant; short of want, the mirror applies
// what it has gathered without waiting for the rest of flush_interval.
func (s *Service) position(id string, want pglogrepl.LSN) (applied, caughtUp pglogrepl.LSN, ok bool) {
	m := s.mirror(id)
	if m == nil {
		return 0, 0, false
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	applied, caughtUp = m.applied, max(m.applied, m.caughtUp)
	if caughtUp < want {
		m.hurry.Store(true)
	}
	return applied, caughtUp, m.db != nil
}

// decodeParams turns a Bind's parameters (text, or binary of the types
// Describe announced) into values DuckDB binds.
func decodeParams(b *pgproto3.Bind, oids []uint32) ([]any, error) {
	m := pgtype.NewMap()
	out := make([]any, len(b.Parameters))
	for i, p := range b.Parameters {
		if p == nil {
			continue
		}
		f := format(b.ParameterFormatCodes, i)
		if f == 0 {
			out[i] = string(p)
			continue
		}
		if i >= len(oids) {
			return nil, &pgError{"08P01", "a binary parameter of unknown type"}
		}
		typ, ok := m.TypeForOID(oids[i])
		if !ok {
			return nil, &pgError{"08P01", "a binary parameter of unknown type"}
		}
		v, err := typ.Codec.DecodeValue(m, oids[i], f, p)
		if err != nil {
			return nil, &pgError{"22P03", fmt.Sprintf("parameter $%d: %v", i+1, err)}
		}
		switch x := v.(type) {
		case pgtype.Numeric:
			t, _ := x.Value()
			v = t
		case [16]uint8:
			v = pgtype.UUID{Bytes: x, Valid: true}.String()
		}
		out[i] = v
	}
	return out, nil
}

// oidOfType is the PostgreSQL type a DuckDB column is described as.
func oidOfType(t duckdb.Type) uint32 {
	switch t {
	case duckdb.TYPE_BOOLEAN:
		return pgtype.BoolOID
	case duckdb.TYPE_TINYINT, duckdb.TYPE_SMALLINT, duckdb.TYPE_UTINYINT:
		return pgtype.Int2OID
	case duckdb.TYPE_INTEGER, duckdb.TYPE_USMALLINT:
		return pgtype.Int4OID
	case duckdb.TYPE_BIGINT, duckdb.TYPE_UINTEGER:
		return pgtype.Int8OID
	case duckdb.TYPE_UBIGINT, duckdb.TYPE_HUGEINT, duckdb.TYPE_UHUGEINT, duckdb.TYPE_DECIMAL:
		return pgtype.NumericOID
	case duckdb.TYPE_FLOAT:
		return pgtype.Float4OID
	case duckdb.TYPE_DOUBLE:
		return pgtype.Float8OID
	case duckdb.TYPE_DATE:
		return pgtype.DateOID
	case duckdb.TYPE_TIMESTAMP, duckdb.TYPE_TIMESTAMP_S, duckdb.TYPE_TIMESTAMP_MS, duckdb.TYPE_TIMESTAMP_NS:
		return pgtype.TimestampOID
	case duckdb.TYPE_TIMESTAMP_TZ:
		return pgtype.TimestamptzOID
	case duckdb.TYPE_UUID:
		return pgtype.UUIDOID
	case duckdb.TYPE_BLOB:
		return pgtype.ByteaOID
	}
	return pgtype.TextOID
}

// oidOf maps a DuckDB type name (of a result column) to a PostgreSQL type.
func oidOf(name string) uint32 {
	switch {
	case name == "BOOLEAN":
		return pgtype.BoolOID
	case name == "TINYINT", name == "SMALLINT", name == "UTINYINT":
		return pgtype.Int2OID
	case name == "INTEGER", name == "USMALLINT":
		return pgtype.Int4OID
	case name == "BIGINT", name == "UINTEGER":
		return pgtype.Int8OID
	case name == "UBIGINT", name == "HUGEINT", name == "UHUGEINT", strings.HasPrefix(name, "DECIMAL"):
		return pgtype.NumericOID
	case name == "FLOAT":
		return pgtype.Float4OID
	case name == "DOUBLE":
		return pgtype.Float8OID
	case name == "DATE":
		return pgtype.DateOID
	case name == "TIMESTAMP", name == "TIMESTAMP_S", name == "TIMESTAMP_MS", name == "TIMESTAMP_NS":
		return pgtype.TimestampOID
	case name == "TIMESTAMPTZ", name == "TIMESTAMP WITH TIME ZONE":
		return pgtype.TimestamptzOID
	case name == "UUID":
		return pgtype.UUIDOID
	case name == "BLOB":
		return pgtype.ByteaOID
	}
	return pgtype.TextOID
}

// encode writes one value in the client's format for its column's type.
func encode(m *pgtype.Map, oid uint32, fmtCode int16, v driver.Value) ([]byte, error) {
	if v == nil {
		return nil, nil
	}
	switch x := v.(type) {
	case int8:
		v = int64(x)
	case int16:
		v = int64(x)
	case int32:
		v = int64(x)
	case uint8:
		v = int64(x)
	case uint16:
		v = int64(x)
	case uint32:
		v = int64(x)
	case uint64:
		v = pgtype.Numeric{Int: new(big.Int).SetUint64(x), Valid: true}
	case *big.Int:
		v = pgtype.Numeric{Int: x, Valid: true}
	case duckdb.Decimal:
		v = pgtype.Numeric{Int: x.Value, Exp: -int32(x.Scale), Valid: true}
	case []byte:
		if oid == pgtype.UUIDOID && len(x) == 16 {
			var u [16]byte
			copy(u[:], x)
			v = pgtype.UUID{Bytes: u, Valid: true}
		}
	case duckdb.UUID:
		v = pgtype.UUID{Bytes: x, Valid: true}
	case *duckdb.UUID:
		v = pgtype.UUID{Bytes: *x, Valid: true}
	case time.Time:
		if oid == pgtype.TextOID {
			v = x.Format("15:04:05.999999")
		}
	}
	if oid == pgtype.TextOID {
		if _, ok := v.(string); !ok {
			v = fmt.Sprint(v)
		}
	}
	// The commonest values in text format without the type map's plans
	// (a group-by's rows are mostly these).
	if fmtCode == pgtype.TextFormatCode {
		switch x := v.(type) {
		case string:
			if oid == pgtype.TextOID {
				return []byte(x), nil
			}
		case int64:
			if oid == pgtype.Int2OID || oid == pgtype.Int4OID || oid == pgtype.Int8OID {
				return strconv.AppendInt(nil, x, 10), nil
			}
		}
	}
	buf, err := m.Encode(oid, fmtCode, v, nil)
	if err != nil {
		return nil, err
	}
	if buf == nil {
		buf = []byte{}
	}
	return buf, nil
}
