package api

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"slices"
	"strings"

	"github.com/pgtenant/pgtenant/internal/analytics"
	"github.com/pgtenant/pgtenant/internal/catalog"
	"github.com/pgtenant/pgtenant/internal/cluster"
	"github.com/pgtenant/pgtenant/internal/credentials"
	"github.com/pgtenant/pgtenant/internal/failover"
	"github.com/pgtenant/pgtenant/internal/jobs"
	"github.com/pgtenant/pgtenant/internal/migrate"
	"github.com/pgtenant/pgtenant/internal/pooler"
	"github.com/pgtenant/pgtenant/internal/provision"
	"github.com/pgtenant/pgtenant/internal/templates"
)

// Errors a handler returns to choose a status; everything else maps through
// statusOf from the domain errors of the packages below.
var (
	ErrInvalid      = errors.New("invalid request")
	ErrUnauthorized = errors.New("unauthorized")
	// ErrForbidden is a valid token without the scope a route needs.
	ErrForbidden = errors.New("forbidden")
)

// invalid returns a 400 error with a message naming the bad input.
func invalid(format string, args ...any) error {
	return fmt.Errorf("%w: %s", ErrInvalid, fmt.Sprintf(format, args...))
}

// notOneOf returns nil for "" or one of valid, else a 400 error naming the
// query parameter and every valid value.
func notOneOf[S ~string](param string, v S, valid []S) error {
	if v == "" || slices.Contains(valid, v) {
		return nil
	}
	names := make([]string, len(valid))
	for i, s := range valid {
		names[i] = string(s)
	}
	return invalid("%s %q: one of %s", param, v, strings.Join(names, ", "))
}

// statusOf maps domain errors to HTTP status codes and error codes. It is the
// one place that does.
func statusOf(err error) (int, string) {
	if _, ok := cluster.Unreachable(err); ok {
		return http.StatusServiceUnavailable, "unavailable"
	}
	switch {
	case errors.Is(err, ErrInvalid), errors.Is(err, provision.ErrInvalid), errors.Is(err, templates.ErrInvalid),
		errors.Is(err, migrate.ErrInvalid), errors.Is(err, analytics.ErrInvalid), errors.Is(err, failover.ErrInvalid),
		errors.Is(err, credentials.ErrInvalid):
		return http.StatusBadRequest, "invalid"
	case errors.Is(err, ErrUnauthorized):
		return http.StatusUnauthorized, "unauthorized"
	case errors.Is(err, ErrForbidden):
		return http.StatusForbidden, "forbidden"
	case errors.Is(err, catalog.ErrNotFound), errors.Is(err, cluster.ErrUnknownCluster), errors.Is(err, jobs.ErrNotFound),
		errors.Is(err, analytics.ErrDisabled):
		return http.StatusNotFound, "not_found"
	case errors.Is(err, catalog.ErrConflict), errors.Is(err, jobs.ErrWrongState):
		return http.StatusConflict, "conflict"
	case errors.Is(err, cluster.ErrUnavailable), errors.Is(err, pooler.ErrFrontDoorDown):
		return http.StatusServiceUnavailable, "unavailable"
	case errors.Is(err, provision.ErrNoCapacity):
		return http.StatusServiceUnavailable, "no_capacity"
	case errors.Is(err, context.DeadlineExceeded):
		return http.StatusGatewayTimeout, "timeout"
	}
	return http.StatusInternalServerError, "internal"
}

// Error is an error response as the client sees it.
type Error struct {
	Status  int
	Code    string
	Message string
}

func (e *Error) Error() string { return e.Message }

// Is lets callers match client errors against the same sentinels the server uses.
func (e *Error) Is(target error) bool {
	switch target {
	case catalog.ErrNotFound:
		return e.Code == "not_found"
	case catalog.ErrConflict:
		return e.Code == "conflict"
	case ErrInvalid:
		return e.Code == "invalid"
	case ErrUnauthorized:
		return e.Code == "unauthorized"
	case ErrForbidden:
		return e.Code == "forbidden"
	case cluster.ErrUnavailable:
		return e.Code == "unavailable"
	case provision.ErrNoCapacity:
		return e.Code == "no_capacity"
	}
	return false
}
