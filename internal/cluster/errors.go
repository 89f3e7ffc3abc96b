package cluster

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"

	"github.com/jackc/pgx/v5/pgconn"
)

// Domain errors callers branch on. Classify maps PostgreSQL errors onto
// them: it is the one place that reads SQLSTATEs (ExtensionError, beside
// it, the one other).
var (
	ErrUnavailable      = errors.New("cluster unavailable")               // cannot connect, server shutting down
	ErrDuplicate        = errors.New("object already exists")             // 42P04, 42P06, 42710, 42P07
	ErrUniqueViolation  = errors.New("unique violation")                  // 23505
	ErrNotFound         = errors.New("object does not exist")             // 3D000, 3F000, 42704, 42P01
	ErrObjectInUse      = errors.New("object in use")                     // 55006: e.g. someone is connected to a template
	ErrLockNotAvailable = errors.New("lock not available")                // 55P03: lock_timeout
	ErrOutOfLocks       = errors.New("out of shared memory (lock table)") // 53200: raise max_locks_per_transaction or batch smaller
	ErrTooManyConns     = errors.New("too many connections")              // 53300
	ErrCanceled         = errors.New("statement canceled")                // 57014
	ErrDataViolation    = errors.New("data violates a constraint")        // class 23 other than 23505
	ErrSerialization    = errors.New("serialization failure or deadlock") // 40001, 40P01
	ErrAuthFailed       = errors.New("authentication failed")             // 28P01, 28000: wrong password, no such role, NOLOGIN
	ErrReadOnly         = errors.New("read-only transaction")             // 25006
	ErrDependents       = errors.New("other objects depend on it")        // 2BP01
)

// Error is a PostgreSQL error classified as one of the sentinels above.
// errors.Is matches the sentinel; errors.As still finds the *pgconn.PgError.
type Error struct {
	Kind error
	Err  error
}

func (e *Error) Error() string   { return e.Err.Error() }
func (e *Error) Unwrap() []error { return []error{e.Kind, e.Err} }

var sqlstates = map[string]error{
	"42P04": ErrDuplicate, "42P06": ErrDuplicate, "42710": ErrDuplicate, "42P07": ErrDuplicate,
	"23505": ErrUniqueViolation,
	"3D000": ErrNotFound, "3F000": ErrNotFound, "42704": ErrNotFound, "42P01": ErrNotFound,
	"55006": ErrObjectInUse,
	"55P03": ErrLockNotAvailable,
	"53200": ErrOutOfLocks,
	"53300": ErrTooManyConns,
	"57014": ErrCanceled,
	"40001": ErrSerialization, "40P01": ErrSerialization,
	"28P01": ErrAuthFailed, "28000": ErrAuthFailed,
	"25006": ErrReadOnly,
	"2BP01": ErrDependents,
	"57P01": ErrUnavailable, "57P02": ErrUnavailable, "57P03": ErrUnavailable, // admin/crash shutdown, cannot connect now
}

// Classify wraps err with its domain error, or returns it unchanged when it is
// not a PostgreSQL or connection error we know.
func Classify(err error) error {
	if err == nil {
		return nil
	}
	var ce *Error
	if errors.As(err, &ce) {
		return err
	}
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) {
		if kind, ok := sqlstates[pgErr.Code]; ok {
			return &Error{Kind: kind, Err: err}
		}
		if len(pgErr.Code) == 5 && pgErr.Code[:2] == "23" {
			return &Error{Kind: ErrDataViolation, Err: err}
		}
		return err
	}
	var connErr *pgconn.ConnectError
	var netErr net.Error
	if errors.As(err, &connErr) || errors.As(err, &netErr) || pgconn.SafeToRetry(err) ||
		errors.Is(err, pgconn.ErrConnClosed) || errors.Is(err, io.ErrUnexpectedEOF) || errors.Is(err, io.EOF) {
		// A connection lost under a query ends in EOF: the server went away.
		return &Error{Kind: ErrUnavailable, Err: err}
	}
	return err
}

// sqlState returns the SQLSTATE of err, or "".
func sqlState(err error) string {
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) {
		return pgErr.Code
	}
	return ""
}

// Unreachable describes a connection-level failure (ErrUnavailable from a
// failed connection, a refused or reset socket, a server shutting down or
// starting up) for an operator, without the driver's internals:
// "127.0.0.1:5432/pgtenant: connection refused". ok is false for any other
// error.
func Unreachable(err error) (string, bool) {
	if !errors.Is(Classify(err), ErrUnavailable) {
		return "", false
	}
	where := ""
	var ce *pgconn.ConnectError
	if errors.As(err, &ce) && ce.Config != nil {
		where = fmt.Sprintf("%s:%d/%s: ", ce.Config.Host, ce.Config.Port, ce.Config.Database)
	}
	var pgErr *pgconn.PgError
	var sysErr *os.SyscallError
	var opErr *net.OpError
	switch {
	case errors.As(err, &pgErr):
		return where + pgErr.Message, true
	case errors.As(err, &sysErr):
		return where + sysErr.Err.Error(), true
	case errors.As(err, &opErr) && opErr.Timeout():
		return where + "timed out", true
	case errors.Is(err, context.DeadlineExceeded):
		return where + "timed out", true
	case errors.Is(err, io.ErrUnexpectedEOF), errors.Is(err, io.EOF), errors.Is(err, pgconn.ErrConnClosed):
		return where + "connection lost", true
	}
	return where + "not reachable", true
}
