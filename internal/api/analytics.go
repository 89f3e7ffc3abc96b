package api

import (
	"context"
	"fmt"
	"net/http"
	"net/url"

	"github.com/pgtenant/pgtenant/internal/analytics"
	"github.com/pgtenant/pgtenant/internal/cluster"
)

// EnableAnalyticsRequest is the body of POST /v1/tenants/{id}/analytics.
type EnableAnalyticsRequest struct {
	// Tables limits the mirror to these tables (name, or schema.name in
	// database mode); empty: every table of the tenant, new ones included.
	Tables []string `json:"tables,omitempty"`
	// ExcludeTables mirrors every table the tenant has now but these (not
	// with Tables): the tables made later are not mirrored.
	ExcludeTables []string `json:"exclude_tables,omitempty"`
}

// errNoAnalytics answers the analytics routes of a server built without
// the mirrors (tests that wire only part of the daemon).
var errNoAnalytics = fmt.Errorf("%w: this server runs no analytics mirrors", cluster.ErrUnavailable)

func (s *Server) enableAnalytics(w http.ResponseWriter, r *http.Request) error {
	if s.Analytics == nil {
		return errNoAnalytics
	}
	t, err := s.tenantFromPath(r)
	if err != nil {
		return err
	}
	var req EnableAnalyticsRequest
	if r.ContentLength != 0 {
		if err := decode(r, &req); err != nil {
			return err
		}
	}
	if len(req.ExcludeTables) > 0 {
		if len(req.Tables) > 0 {
			return invalid("tables and exclude_tables: give one or the other")
		}
		if req.Tables, err = s.Analytics.TablesExcept(r.Context(), t, req.ExcludeTables); err != nil {
			return err
		}
	}
	st, err := s.Analytics.Enable(r.Context(), t, req.Tables)
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusAccepted, st)
	return nil
}

func (s *Server) disableAnalytics(w http.ResponseWriter, r *http.Request) error {
	if s.Analytics == nil {
		return errNoAnalytics
	}
	t, err := s.tenantFromPath(r)
	if err != nil {
		return err
	}
	st, err := s.Analytics.Disable(r.Context(), t)
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusAccepted, st)
	return nil
}

func (s *Server) analyticsStatus(w http.ResponseWriter, r *http.Request) error {
	if s.Analytics == nil {
		return errNoAnalytics
	}
	t, err := s.tenantFromPath(r)
	if err != nil {
		return err
	}
	st, err := s.Analytics.Status(r.Context(), t)
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusOK, st)
	return nil
}

// EnableAnalytics asks for a tenant's mirror (tables nil: all of them).
func (c *Client) EnableAnalytics(ctx context.Context, id string, tables []string) (analytics.Status, error) {
	return c.EnableAnalyticsRequest(ctx, id, EnableAnalyticsRequest{Tables: tables})
}

// EnableAnalyticsRequest starts a tenant's mirror as req says.
func (c *Client) EnableAnalyticsRequest(ctx context.Context, id string, req EnableAnalyticsRequest) (analytics.Status, error) {
	var out analytics.Status
	return out, c.Do(ctx, http.MethodPost, "/v1/tenants/"+url.PathEscape(id)+"/analytics", req, &out)
}

// DisableAnalytics asks for a tenant's mirror to be dropped.
func (c *Client) DisableAnalytics(ctx context.Context, id string) (analytics.Status, error) {
	var out analytics.Status
	return out, c.Do(ctx, http.MethodDelete, "/v1/tenants/"+url.PathEscape(id)+"/analytics", nil, &out)
}

// AnalyticsStatus shows a tenant's mirror.
func (c *Client) AnalyticsStatus(ctx context.Context, id string) (analytics.Status, error) {
	var out analytics.Status
	return out, c.Do(ctx, http.MethodGet, "/v1/tenants/"+url.PathEscape(id)+"/analytics", nil, &out)
}
