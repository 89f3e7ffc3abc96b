package api

import (
	"fmt"
	"net/http"
	"strconv"
	"strings"

	"github.com/pgtenant/pgtenant/internal/catalog"
	"github.com/pgtenant/pgtenant/internal/migrate"
)

// rolloutID reads the {id} path value; a malformed id names no rollout.
func rolloutID(r *http.Request) (int64, error) {
	id, err := strconv.ParseInt(r.PathValue("id"), 10, 64)
	if err != nil {
		return 0, fmt.Errorf("rollout %q: %w", r.PathValue("id"), catalog.ErrNotFound)
	}
	return id, nil
}

// startRollout answers 201 with the plan and the rollout, or 200 with the
// plan alone for a dry run.
func (s *Server) startRollout(w http.ResponseWriter, r *http.Request) error {
	var req migrate.Request
	if err := decode(r, &req); err != nil {
		return err
	}
	req.Template = r.PathValue("name")
	out, err := s.Migrate.Start(r.Context(), req)
	if err != nil {
		return err
	}
	status := http.StatusCreated
	if out.Rollout == nil {
		status = http.StatusOK
	}
	writeJSON(w, status, out)
	return nil
}

func (s *Server) listRollouts(w http.ResponseWriter, r *http.Request) error {
	q := r.URL.Query()
	limit := 0
	if l := q.Get("limit"); l != "" {
		n, err := strconv.Atoi(l)
		if err != nil || n < 1 {
			return invalid("limit %q: a positive number", l)
		}
		limit = n
	}
	out, err := s.Migrate.List(r.Context(), q.Get("template"), limit)
	if err != nil {
		return err
	}
	if out == nil {
		out = []migrate.Status{}
	}
	writeJSON(w, http.StatusOK, out)
	return nil
}

// showRollout lists the rollout's tenants in ?state=a,b (default: every
// state but done), at most ?limit= (default 1000).
func (s *Server) showRollout(w http.ResponseWriter, r *http.Request) error {
	id, err := rolloutID(r)
	if err != nil {
		return err
	}
	q := r.URL.Query()
	var states []catalog.RolloutTenantState
	if v := q.Get("state"); v != "" {
		for _, v := range strings.Split(v, ",") {
			switch st := catalog.RolloutTenantState(v); st {
			case "all":
				states = []catalog.RolloutTenantState{}
			case catalog.RolloutTenantPending, catalog.RolloutTenantRunning, catalog.RolloutTenantDone,
				catalog.RolloutTenantFailed, catalog.RolloutTenantSkipped:
				states = append(states, st)
			default:
				return invalid("state %q: pending, running, done, failed, skipped or all", st)
			}
		}
	}
	limit := 0
	if l := q.Get("limit"); l != "" {
		n, err := strconv.Atoi(l)
		if err != nil || n < 1 {
			return invalid("limit %q: a positive number", l)
		}
		limit = n
	}
	out, err := s.Migrate.Get(r.Context(), id, states, limit)
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusOK, out)
	return nil
}

func (s *Server) continueRollout(w http.ResponseWriter, r *http.Request) error {
	id, err := rolloutID(r)
	if err != nil {
		return err
	}
	out, err := s.Migrate.Continue(r.Context(), id)
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusOK, out)
	return nil
}

func (s *Server) retryRollout(w http.ResponseWriter, r *http.Request) error {
	id, err := rolloutID(r)
	if err != nil {
		return err
	}
	var req RetryRolloutRequest
	if r.ContentLength != 0 {
		if err := decode(r, &req); err != nil {
			return err
		}
	}
	out, err := s.Migrate.Retry(r.Context(), id, req.Tenant)
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusOK, out)
	return nil
}
