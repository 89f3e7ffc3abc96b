package api

import (
	"net/http"

	"github.com/pgtenant/pgtenant/internal/jobs"
	"github.com/pgtenant/pgtenant/internal/prewarm"
)

// PrewarmRequest starts prewarm jobs: for one tenant, one cluster or all.
type PrewarmRequest struct {
	Tenant  string `json:"tenant,omitempty"`
	Cluster string `json:"cluster,omitempty"`
	All     bool   `json:"all,omitempty"`
}

// CaptureRequest captures hot sets now (e.g. before a planned restart).
type CaptureRequest struct {
	Cluster string `json:"cluster,omitempty"`
}

// TenantPrewarm is a tenant's hot sets and last prewarm, per node.
type TenantPrewarm struct {
	HotSets []prewarm.HotSet       `json:"hot_sets"`
	Last    []prewarm.TenantResult `json:"last_prewarm"`
}

func (s *Server) startPrewarm(w http.ResponseWriter, r *http.Request) error {
	var req PrewarmRequest
	if err := decode(r, &req); err != nil {
		return err
	}
	var out []jobs.Job
	switch {
	case req.Tenant != "":
		r.SetPathValue("id", req.Tenant)
		t, err := s.tenantFromPath(r)
		if err != nil {
			return err
		}
		if out, err = s.Prewarm.PrewarmNodes(r.Context(), t.Cluster, []string{t.ID}, "manual"); err != nil {
			return err
		}
	case req.Cluster != "" || req.All:
		for _, cl := range s.Clusters.All() {
			if req.Cluster != "" && cl.Name() != req.Cluster {
				continue
			}
			js, err := s.Prewarm.PrewarmNodes(r.Context(), cl.Name(), nil, "manual")
			if err != nil {
				return err
			}
			out = append(out, js...)
		}
		if len(out) == 0 {
			_, err := s.Clusters.Get(req.Cluster)
			return err
		}
	default:
		return invalid("say what to prewarm: a tenant id, --cluster C or --all")
	}
	writeJSON(w, http.StatusAccepted, out)
	return nil
}

func (s *Server) prewarmTenant(w http.ResponseWriter, r *http.Request) error {
	t, err := s.tenantFromPath(r)
	if err != nil {
		return err
	}
	out, err := s.Prewarm.PrewarmNodes(r.Context(), t.Cluster, []string{t.ID}, "manual")
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusAccepted, out)
	return nil
}

func (s *Server) capture(w http.ResponseWriter, r *http.Request) error {
	var req CaptureRequest
	if err := decode(r, &req); err != nil {
		return err
	}
	out := []prewarm.CaptureResult{}
	for _, cl := range s.Clusters.All() {
		if req.Cluster != "" && cl.Name() != req.Cluster {
			continue
		}
		for _, node := range cl.Nodes() {
			res, err := s.Prewarm.Capture(r.Context(), cl, node)
			if err != nil {
				return err
			}
			out = append(out, res)
		}
	}
	if len(out) == 0 && req.Cluster != "" {
		if _, err := s.Clusters.Get(req.Cluster); err != nil {
			return err
		}
	}
	writeJSON(w, http.StatusOK, out)
	return nil
}

// tenantPrewarm is the prewarm part of `tenant show`.
func (s *Server) tenantPrewarm(r *http.Request, id string) (*TenantPrewarm, error) {
	hs, err := s.Prewarm.HotSets(r.Context(), id)
	if err != nil {
		return nil, err
	}
	last, err := s.Prewarm.Results(r.Context(), id)
	if err != nil {
		return nil, err
	}
	if hs == nil {
		hs = []prewarm.HotSet{}
	}
	if last == nil {
		last = []prewarm.TenantResult{}
	}
	return &TenantPrewarm{HotSets: hs, Last: last}, nil
}
