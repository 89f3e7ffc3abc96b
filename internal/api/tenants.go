package api

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/pgtenant/pgtenant/internal/catalog"
	"github.com/pgtenant/pgtenant/internal/move"
	"github.com/pgtenant/pgtenant/internal/provision"
	"github.com/pgtenant/pgtenant/internal/purge"
	"github.com/pgtenant/pgtenant/internal/tenant"
)

func (s *Server) createTenant(w http.ResponseWriter, r *http.Request) error {
	var req provision.Request
	if err := decode(r, &req); err != nil {
		return err
	}
	c, err := s.Provision.Create(r.Context(), req)
	if err != nil {
		return err
	}
	status := http.StatusCreated
	switch {
	case c.Existing:
		status = http.StatusOK
	case c.Job != nil:
		status = http.StatusAccepted
	}
	return s.writeCreated(w, status, c)
}

// writeCreated answers with a new tenant, its credentials and the job that
// makes or fills it.
func (s *Server) writeCreated(w http.ResponseWriter, status int, c provision.Created) error {
	dsn, direct, err := s.Provision.DSNs(c.Tenant)
	if err != nil {
		return err
	}
	writeJSON(w, status, CreateTenantResponse{Tenant: Tenant{Tenant: c.Tenant, DSN: dsn, DirectDSN: direct}, DSN: c.DSN, DirectDSN: c.Direct,
		Password: c.Password, Existing: c.Existing, Path: c.Path, Note: c.Note, Job: c.Job})
	return nil
}

// tenantFromPath loads the tenant named by the {id} path value. A malformed
// id is simply not found: it cannot name a tenant.
func (s *Server) tenantFromPath(r *http.Request) (catalog.Tenant, error) {
	id := r.PathValue("id")
	if !tenant.ValidID(id) {
		return catalog.Tenant{}, fmt.Errorf("tenant %q: %w", id, catalog.ErrNotFound)
	}
	t, err := s.Store.GetTenant(r.Context(), nil, id)
	if err == nil && t.IsSpare() {
		return catalog.Tenant{}, fmt.Errorf("tenant %q: %w", id, catalog.ErrNotFound) // spares are invisible
	}
	return t, err
}

func (s *Server) showTenant(w http.ResponseWriter, r *http.Request) error {
	t, err := s.tenantFromPath(r)
	if errors.Is(err, catalog.ErrNotFound) && tenant.ValidID(r.PathValue("id")) {
		// A purged tenant is remembered (drop.purged_retention): its row
		// and its history, nothing else.
		p, perr := s.Store.GetPurged(r.Context(), r.PathValue("id"))
		if perr != nil {
			return err
		}
		view := Tenant{Tenant: p}
		if view.Events, err = s.Store.Events(r.Context(), p.ID); err != nil {
			return err
		}
		writeJSON(w, http.StatusOK, view)
		return nil
	}
	if err != nil {
		return err
	}
	view, err := s.tenantView(t)
	if err != nil {
		return err
	}
	if view.Events, err = s.Store.Events(r.Context(), t.ID); err != nil {
		return err
	}
	if view.Prewarm, err = s.tenantPrewarm(r, t.ID); err != nil {
		return err
	}
	if view.Metrics, err = s.tenantMetrics(r, t, 0); err != nil {
		return err
	}
	if s.Analytics != nil {
		st, err := s.Analytics.Status(r.Context(), t)
		if err != nil {
			return err
		}
		view.Analytics = &st
	}
	if rw, err := s.Move.Window(r.Context(), t); err == nil {
		view.RecoveryWindow = rw // a cluster without backups has none: not an error
	}
	writeJSON(w, http.StatusOK, view)
	return nil
}

func (s *Server) tenantView(t catalog.Tenant) (Tenant, error) {
	if t.State == catalog.StatePurged {
		return Tenant{Tenant: t}, nil // no DSN: nothing is left to connect to
	}
	dsn, direct, err := s.Provision.DSNs(t)
	if err != nil {
		dsn, direct = "", "" // its cluster was removed; the row is still worth showing
	}
	return Tenant{Tenant: t, DSN: dsn, DirectDSN: direct}, nil
}

func (s *Server) listTenants(w http.ResponseWriter, r *http.Request) error {
	q := r.URL.Query()
	f := catalog.TenantFilter{State: catalog.TenantState(q.Get("state")), Cluster: q.Get("cluster"), Template: q.Get("template"),
		Mode: tenant.Mode(q.Get("mode")), Tier: q.Get("tier"), Search: strings.TrimSpace(q.Get("q")), After: q.Get("after")}
	if l := q.Get("limit"); l != "" {
		n, err := strconv.Atoi(l)
		if err != nil || n < 1 {
			return invalid("limit %q: a positive number", l)
		}
		f.Limit = n
	}
	if f.State == catalog.StateSpare || f.State == catalog.StateBuilding {
		return invalid("spares are not tenants; see the pool with `pgtenant template show`")
	}
	if err := notOneOf("state", f.State, catalog.ListedStates); err != nil {
		return err
	}
	if f.Mode != "" && !f.Mode.Valid() {
		return invalid("mode %q: database or schema", f.Mode)
	}
	// sort=size|activity orders by the collector's figures: over every match, then cut to limit.
	sortBy, limit := q.Get("sort"), f.Limit
	if err := sortTenants(nil, sortBy); err != nil {
		return err
	}
	if sortBy != "" {
		if f.After != "" {
			return invalid("after cannot be combined with sort: sorted lists are not paged")
		}
		f.Limit = 100000
	}
	ts, err := s.Store.ListTenants(r.Context(), f)
	if err != nil {
		return err
	}
	out := make([]Tenant, 0, len(ts))
	for _, t := range ts {
		v, err := s.tenantView(t)
		if err != nil {
			return err
		}
		out = append(out, v)
	}
	s.attachFigures(out)
	if sortBy != "" {
		_ = sortTenants(out, sortBy)
		if limit <= 0 {
			limit = 1000
		}
		out = out[:min(limit, len(out))]
	}
	writeJSON(w, http.StatusOK, out)
	return nil
}

func (s *Server) dropTenant(w http.ResponseWriter, r *http.Request) error {
	purgeNow := false
	if v := r.URL.Query().Get("purge_now"); v != "" {
		b, err := strconv.ParseBool(v)
		if err != nil {
			return invalid("purge_now %q: true or false", v)
		}
		purgeNow = b
	}
	res, err := s.Purge.Drop(r.Context(), r.PathValue("id"), purgeNow)
	if err != nil {
		return err
	}
	return s.writeLifecycle(w, res, http.StatusOK)
}

// lifecycle adapts a restore/suspend/resume call to a handler.
func (s *Server) lifecycle(f func(context.Context, string) (purge.Result, error)) func(http.ResponseWriter, *http.Request) error {
	return func(w http.ResponseWriter, r *http.Request) error {
		res, err := f(r.Context(), r.PathValue("id"))
		if err != nil {
			return err
		}
		return s.writeLifecycle(w, res, http.StatusOK)
	}
}

func (s *Server) writeLifecycle(w http.ResponseWriter, res purge.Result, status int) error {
	out := LifecycleResponse{Job: res.Job}
	if res.Tenant.ID != "" {
		v, err := s.tenantView(res.Tenant)
		if err != nil {
			return err
		}
		out.Tenant = v
	}
	writeJSON(w, status, out)
	return nil
}

// setTenant changes a tenant's tier (PATCH /v1/tenants/{id}).
func (s *Server) setTenant(w http.ResponseWriter, r *http.Request) error {
	var req SetTenantRequest
	if err := decode(r, &req); err != nil {
		return err
	}
	switch {
	case req.Tier == "" && req.Allow == nil && req.Labels == nil:
		return invalid("say what to change: tier, labels, allow")
	case req.Tier != "" && req.Labels != nil:
		return invalid("tier and labels: change one at a time (either may move the tenant)")
	}
	id := r.PathValue("id")
	var ch provision.TierChange
	if req.Allow != nil {
		t, err := s.Provision.SetAllow(r.Context(), id, *req.Allow)
		if err != nil {
			return err
		}
		ch.Tenant = t
	}
	var err error
	switch {
	case req.Tier != "":
		ch, err = s.Provision.SetTier(r.Context(), id, req.Tier)
	case req.Labels != nil:
		ch, err = s.Provision.SetPins(r.Context(), id, *req.Labels)
	}
	if err != nil {
		return err
	}
	out := purge.Result{Tenant: ch.Tenant}
	status := http.StatusOK
	if ch.MoveTo != "" {
		j, err := s.Move.StartTierChange(r.Context(), ch.Tenant.ID, ch.MoveTo, req.Tier)
		if err != nil {
			return err
		}
		out.Job, status = &j, http.StatusAccepted
	}
	return s.writeLifecycle(w, out, status)
}

// rotatePassword gives a tenant a new password (POST /v1/tenants/{id}/password).
func (s *Server) rotatePassword(w http.ResponseWriter, r *http.Request) error {
	var req RotatePasswordRequest
	if r.ContentLength != 0 {
		if err := decode(r, &req); err != nil {
			return err
		}
	}
	res, err := s.Credentials.Rotate(r.Context(), r.PathValue("id"), req.KeepSessions)
	if err != nil {
		return err
	}
	view, err := s.tenantView(res.Tenant)
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusOK, RotatePasswordResponse{Tenant: view, DSN: res.DSN, DirectDSN: res.Direct, Password: res.Password,
		SessionsEnded: res.SessionsEnded, Note: res.Note})
	return nil
}

func (s *Server) rewindTenant(w http.ResponseWriter, r *http.Request) error {
	var req RewindTenantRequest
	if err := decode(r, &req); err != nil {
		return err
	}
	if req.To.IsZero() {
		return invalid("to: the time to take the tenant back to is required (RFC 3339)")
	}
	t, err := s.tenantFromPath(r)
	if err != nil {
		return err
	}
	j, err := s.Move.Rewind(r.Context(), t.ID, req.To)
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusAccepted, j)
	return nil
}

func (s *Server) forkTenant(w http.ResponseWriter, r *http.Request) error {
	var req ForkTenantRequest
	if err := decode(r, &req); err != nil {
		return err
	}
	t, err := s.tenantFromPath(r)
	if err != nil {
		return err
	}
	var at time.Time
	if req.At != nil {
		at = *req.At
	}
	c, j, err := s.Move.Fork(r.Context(), t.ID, at, req.Name, req.Tier)
	if err != nil {
		return err
	}
	c.Job = &j
	return s.writeCreated(w, http.StatusAccepted, c)
}

// exportTenant answers with the tenant's archive (application/x-tar): its
// length is known before the first byte, as the dump is made first.
func (s *Server) exportTenant(w http.ResponseWriter, r *http.Request) error {
	t, err := s.tenantFromPath(r)
	if err != nil {
		return err
	}
	x, err := s.Move.Export(r.Context(), t.ID)
	if err != nil {
		return err
	}
	defer x.Close()
	w.Header().Set("Content-Type", ArchiveType)
	w.Header().Set("Content-Length", strconv.FormatInt(x.Size(), 10))
	w.Header().Set("Content-Disposition", fmt.Sprintf("attachment; filename=%q", "tenant-"+t.ID+".tar"))
	w.WriteHeader(http.StatusOK)
	if _, err := x.WriteTo(w); err != nil {
		s.log.Warn("export cut short", "tenant", t.ID, "err", err)
	}
	return nil
}

// importTenant reads an archive (the body) and makes a new tenant of it.
func (s *Server) importTenant(w http.ResponseWriter, r *http.Request) error {
	q := r.URL.Query()
	req := move.ImportRequest{Cluster: q.Get("cluster"), Tier: q.Get("tier")}
	if q.Has("name") {
		name := q.Get("name")
		req.Name = &name
	}
	if ct := r.Header.Get("Content-Type"); ct != ArchiveType {
		return invalid("request body: Content-Type %q; this route takes an archive of `pgtenant tenant export` as %s", ct, ArchiveType)
	}
	c, j, err := s.Move.Import(r.Context(), r.Body, req)
	if err != nil {
		return err
	}
	c.Job = &j
	return s.writeCreated(w, http.StatusAccepted, c)
}

func (s *Server) moveTenant(w http.ResponseWriter, r *http.Request) error {
	var req MoveTenantRequest
	if err := decode(r, &req); err != nil {
		return err
	}
	if req.To == "" {
		return invalid("to: the cluster to move the tenant to is required")
	}
	// A drained cluster takes no tenant, moved or new (docs/operations/placement.md).
	if c, err := s.Store.GetCluster(r.Context(), req.To); err == nil && c.Draining {
		return fmt.Errorf("%w: cluster %s is draining; undrain it first (`pgtenant cluster undrain %s`)", catalog.ErrConflict, req.To, req.To)
	}
	j, err := s.Move.Start(r.Context(), r.PathValue("id"), req.To)
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusAccepted, j)
	return nil
}
