package api

import (
	"net/http"

	"github.com/pgtenant/pgtenant/internal/catalog"
	"github.com/pgtenant/pgtenant/internal/config"
	"github.com/pgtenant/pgtenant/internal/jobs"
	"github.com/pgtenant/pgtenant/internal/placement"
)

// RebalanceRequest plans (dry_run) or starts a rebalance.
type RebalanceRequest struct {
	DryRun   bool `json:"dry_run"`
	MaxMoves int  `json:"max_moves,omitempty"` // 0: 10
}

// RebalanceResponse is the plan and, unless dry_run (or nothing to move),
// the job that runs it.
type RebalanceResponse struct {
	placement.Plan
	Job *jobs.Job `json:"job,omitempty"`
}

// setCluster changes a cluster's placement caps and labels.
func (s *Server) setCluster(w http.ResponseWriter, r *http.Request) error {
	var req catalog.PlacementChange
	if err := decode(r, &req); err != nil {
		return err
	}
	if req.MaxTenants != nil && *req.MaxTenants < 0 {
		return invalid("max_tenants must be 0 (no cap) or more")
	}
	if req.MaxSizeBytes != nil && *req.MaxSizeBytes < 0 {
		return invalid("max_size_bytes must be 0 (no cap) or more")
	}
	for k, v := range req.Labels {
		if _, _, err := config.ParseLabel(k + "=" + v); err != nil {
			return invalid("%v", err)
		}
	}
	name := r.PathValue("name")
	if err := s.Store.SetPlacement(r.Context(), name, req); err != nil {
		return err
	}
	s.Provision.Invalidate()
	return s.writeCluster(w, r, name, http.StatusOK)
}

func (s *Server) writeCluster(w http.ResponseWriter, r *http.Request, name string, status int) error {
	c, err := s.Store.GetCluster(r.Context(), name)
	if err != nil {
		return err
	}
	loads, err := s.Store.ClusterLoads(r.Context())
	if err != nil {
		return err
	}
	writeJSON(w, status, s.clusterView(r.Context(), c, loads))
	return nil
}

// drainCluster marks a cluster draining and starts (or returns) its drain job.
func (s *Server) drainCluster(w http.ResponseWriter, r *http.Request) error {
	j, err := s.Placement.Drain(r.Context(), r.PathValue("name"))
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusAccepted, j)
	return nil
}

// undrainCluster places tenants on a cluster again.
func (s *Server) undrainCluster(w http.ResponseWriter, r *http.Request) error {
	name := r.PathValue("name")
	if err := s.Placement.Undrain(r.Context(), name); err != nil {
		return err
	}
	return s.writeCluster(w, r, name, http.StatusOK)
}

// rebalance plans moves that even out the clusters and, unless dry_run,
// starts them.
func (s *Server) rebalance(w http.ResponseWriter, r *http.Request) error {
	var req RebalanceRequest
	if err := decode(r, &req); err != nil {
		return err
	}
	if req.MaxMoves < 0 {
		return invalid("max_moves must be 0 (the default, 10) or more")
	}
	p, j, err := s.Placement.Rebalance(r.Context(), req.DryRun, req.MaxMoves)
	if err != nil {
		return err
	}
	status := http.StatusOK
	if j != nil {
		status = http.StatusAccepted
	}
	writeJSON(w, status, RebalanceResponse{Plan: p, Job: j})
	return nil
}
