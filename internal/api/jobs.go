package api

import (
	"fmt"
	"net/http"
	"strconv"
	"strings"

	"github.com/pgtenant/pgtenant/internal/jobs"
)

func jobID(r *http.Request) (int64, error) {
	id, err := strconv.ParseInt(r.PathValue("id"), 10, 64)
	if err != nil {
		return 0, fmt.Errorf("job %q: %w", r.PathValue("id"), jobs.ErrNotFound)
	}
	return id, nil
}

func (s *Server) listJobs(w http.ResponseWriter, r *http.Request) error {
	q := r.URL.Query()
	f := jobs.Filter{State: jobs.State(q.Get("state")), Type: jobs.Type(q.Get("type")), TargetKind: q.Get("target_kind"), Target: q.Get("target")}
	if err := notOneOf("state", f.State, jobs.FilterStates); err != nil {
		return err
	}
	if err := notOneOf("type", f.Type, jobs.Types); err != nil {
		return err
	}
	// target=KIND:ID, as job lists print it, is the same as target_kind=KIND&target=ID.
	if kind, id, ok := strings.Cut(f.Target, ":"); ok && f.TargetKind == "" {
		f.TargetKind, f.Target = kind, id
	}
	if l := q.Get("limit"); l != "" {
		n, err := strconv.Atoi(l)
		if err != nil || n < 1 {
			return invalid("limit %q: a positive number", l)
		}
		f.Limit = n
	}
	js, err := jobs.List(r.Context(), s.Store.Pool(), f)
	if err != nil {
		return err
	}
	if js == nil {
		js = []jobs.Job{}
	}
	writeJSON(w, http.StatusOK, js)
	return nil
}

func (s *Server) showJob(w http.ResponseWriter, r *http.Request) error {
	id, err := jobID(r)
	if err != nil {
		return err
	}
	j, err := jobs.Get(r.Context(), s.Store.Pool(), id)
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusOK, j)
	return nil
}

func (s *Server) cancelJob(w http.ResponseWriter, r *http.Request) error {
	id, err := jobID(r)
	if err != nil {
		return err
	}
	j, err := jobs.Cancel(r.Context(), s.Store.Pool(), id)
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusOK, j)
	return nil
}

func (s *Server) retryJob(w http.ResponseWriter, r *http.Request) error {
	id, err := jobID(r)
	if err != nil {
		return err
	}
	j, err := jobs.Retry(r.Context(), s.Store.Pool(), id)
	if err != nil {
		return err
	}
	s.Runner.Poke()
	writeJSON(w, http.StatusOK, j)
	return nil
}

// ReconcileRequest runs the reconciler.
type ReconcileRequest struct {
	Cluster string `json:"cluster,omitempty"`
	Fix     bool   `json:"fix"`
}

func (s *Server) reconcile(w http.ResponseWriter, r *http.Request) error {
	var req ReconcileRequest
	if err := decode(r, &req); err != nil {
		return err
	}
	rep, err := s.Reconciler.Run(r.Context(), req.Cluster, req.Fix)
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusOK, rep)
	return nil
}
