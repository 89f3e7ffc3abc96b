package api

import (
	"net/http"
	"sort"
	"time"

	"github.com/pgtenant/pgtenant/internal/catalog"
	"github.com/pgtenant/pgtenant/internal/config"
	"github.com/pgtenant/pgtenant/internal/metrics"
	"github.com/pgtenant/pgtenant/internal/quota"
)

// TenantMetrics is a tenant's measurements: the collector's current figures,
// its storage quota state and, on request, its minute history.
type TenantMetrics struct {
	Tenant  string           `json:"tenant"`
	Figures *metrics.Figures `json:"figures,omitempty"`
	Note    string           `json:"note,omitempty"` // why figures are missing
	Quota   *quota.View      `json:"quota,omitempty"`
	History []catalog.Rollup `json:"history,omitempty"`
}

// MetricsExportRequest opts a tenant in to (or out of) per-tenant series on /metrics.
type MetricsExportRequest struct {
	Export bool `json:"export"`
}

// metricsRoutes registers the metrics routes (called by NewServer).
func (s *Server) metricsRoutes() {
	s.handle("GET /v1/tenants/{id}/metrics", s.tenantMetricsHandler)
	s.handle("PUT /v1/tenants/{id}/metrics/export", s.setMetricsExport)
	s.handle("GET /v1/doctor", s.doctor)
}

// GET /v1/tenants/{id}/metrics?history=1h
func (s *Server) tenantMetricsHandler(w http.ResponseWriter, r *http.Request) error {
	t, err := s.tenantFromPath(r)
	if err != nil {
		return err
	}
	var window time.Duration
	if h := r.URL.Query().Get("history"); h != "" {
		if window, err = config.ParseDuration(h); err != nil || window < 0 {
			return invalid("history %q: a duration such as 1h or 7d", h)
		}
	}
	m, err := s.tenantMetrics(r, t, window)
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusOK, m)
	return nil
}

// tenantMetrics assembles a tenant's metrics; history covers the last window (0: none).
func (s *Server) tenantMetrics(r *http.Request, t catalog.Tenant, window time.Duration) (*TenantMetrics, error) {
	m := &TenantMetrics{Tenant: t.ID}
	if s.Metrics == nil {
		m.Note = "the metrics collector is not running in this daemon"
	} else if f, err := s.Metrics.Tenant(t.ID); err == nil {
		m.Figures = &f
	} else {
		m.Note = "not measured yet: the collector measures tenants every metrics.interval (off when 0)"
	}
	if s.Quota != nil {
		v, err := s.Quota.View(r.Context(), t.ID, t.Tier)
		if err != nil {
			return nil, err
		}
		m.Quota = &v
	}
	if window > 0 {
		h, err := s.Store.Rollups(r.Context(), t.ID, time.Now().Add(-window))
		if err != nil {
			return nil, err
		}
		m.History = h
	}
	return m, nil
}

// PUT /v1/tenants/{id}/metrics/export {"export": true}
func (s *Server) setMetricsExport(w http.ResponseWriter, r *http.Request) error {
	t, err := s.tenantFromPath(r)
	if err != nil {
		return err
	}
	var req MetricsExportRequest
	if err := decode(r, &req); err != nil {
		return err
	}
	if err := s.Store.SetMetricsExport(r.Context(), t.ID, req.Export); err != nil {
		return err
	}
	m, err := s.tenantMetrics(r, t, 0)
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusOK, m)
	return nil
}

// attachFigures adds the collector's figures (no quota, no history) to listed tenants.
func (s *Server) attachFigures(ts []Tenant) {
	if s.Metrics == nil {
		return
	}
	all := s.Metrics.All()
	for i := range ts {
		// A purged tenant's last figures may still be the collector's:
		// it stores nothing and does nothing any more.
		if f, ok := all[ts[i].ID]; ok && ts[i].State != catalog.StatePurged {
			ts[i].Metrics = &TenantMetrics{Tenant: ts[i].ID, Figures: &f}
		}
	}
}

// sortTenants orders listed tenants by size or activity, largest first;
// tenants not measured yet go last, by id.
func sortTenants(ts []Tenant, by string) error {
	key := func(t Tenant) (float64, bool) {
		if t.Metrics == nil || t.Metrics.Figures == nil {
			return 0, false
		}
		f := t.Metrics.Figures
		if by == "size" {
			if f.SizeBytes == nil {
				return 0, false
			}
			return float64(*f.SizeBytes), true
		}
		return f.Activity, true
	}
	switch by {
	case "":
		return nil
	case "size", "activity":
	default:
		return invalid("sort %q: size or activity", by)
	}
	sort.SliceStable(ts, func(i, j int) bool {
		a, aok := key(ts[i])
		b, bok := key(ts[j])
		if aok != bok {
			return aok
		}
		if a != b {
			return a > b
		}
		return ts[i].ID < ts[j].ID
	})
	return nil
}
