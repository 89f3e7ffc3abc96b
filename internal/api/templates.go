package api

import (
	"net/http"
	"strconv"

	"github.com/pgtenant/pgtenant/internal/provision"
)

func (s *Server) listTemplates(w http.ResponseWriter, r *http.Request) error {
	ts, err := s.Store.Templates(r.Context())
	if err != nil {
		return err
	}
	out := make([]TemplateSummary, 0, len(ts))
	for _, t := range ts {
		out = append(out, templateSummary(t))
	}
	writeJSON(w, http.StatusOK, out)
	return nil
}

func (s *Server) createTemplate(w http.ResponseWriter, r *http.Request) error {
	var req CreateTemplateRequest
	if err := decode(r, &req); err != nil {
		return err
	}
	added, err := s.Templates.Create(r.Context(), req.Name, req.Files)
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusCreated, added)
	return nil
}

func (s *Server) pushTemplate(w http.ResponseWriter, r *http.Request) error {
	var req CreateTemplateRequest
	if err := decode(r, &req); err != nil {
		return err
	}
	added, err := s.Templates.Push(r.Context(), r.PathValue("name"), req.Files)
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusCreated, added)
	return nil
}

// deleteTemplate starts a template's delete job: 202 with the job.
func (s *Server) deleteTemplate(w http.ResponseWriter, r *http.Request) error {
	deleted, err := s.Templates.Delete(r.Context(), r.PathValue("name"))
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusAccepted, deleted)
	return nil
}

func (s *Server) showTemplate(w http.ResponseWriter, r *http.Request) error {
	ctx := r.Context()
	t, err := s.Store.GetTemplate(ctx, r.PathValue("name"))
	if err != nil {
		return err
	}
	d := TemplateDetail{TemplateSummary: templateSummary(t),
		Tenants: map[string]int{}}
	if d.Versions, err = s.Store.TemplateVersions(ctx, t.Name, false); err != nil {
		return err
	}
	if d.Builds, err = s.Store.Builds(ctx, t.Name); err != nil {
		return err
	}
	dist, err := s.Store.VersionDistribution(ctx, t.Name)
	if err != nil {
		return err
	}
	for v, n := range dist {
		d.Tenants[strconv.Itoa(v)] = n
	}
	if s.Provision != nil {
		if d.Pools, err = s.Provision.Pool.Status(ctx, t.Name); err != nil {
			return err
		}
	}
	if d.Pools == nil {
		d.Pools = []provision.PoolStatus{}
	}
	writeJSON(w, http.StatusOK, d)
	return nil
}
