package api

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/url"

	"github.com/pgtenant/pgtenant/internal/backup"
	"github.com/pgtenant/pgtenant/internal/catalog"
	"github.com/pgtenant/pgtenant/internal/jobs"
)

// BackupRequest starts a backup of one cluster, or of every cluster backed
// up when Cluster is empty.
type BackupRequest struct {
	Cluster string `json:"cluster,omitempty"`
	Type    string `json:"type,omitempty"` // full (default), diff or incr
}

func (s *Server) listBackups(w http.ResponseWriter, r *http.Request) error {
	name := r.URL.Query().Get("cluster")
	if err := s.backupCluster(name); err != nil {
		return err
	}
	out, err := s.Backups.List(r.Context(), name)
	if err != nil {
		return backupError(err)
	}
	writeJSON(w, http.StatusOK, out)
	return nil
}

func (s *Server) startBackup(w http.ResponseWriter, r *http.Request) error {
	var req BackupRequest
	if err := decode(r, &req); err != nil {
		return err
	}
	if req.Type == "" {
		req.Type = backup.Full
	}
	if !backup.ValidType(req.Type) {
		return invalid("type %q: one of full, diff, incr", req.Type)
	}
	if err := s.backupCluster(req.Cluster); err != nil {
		return err
	}
	out, err := s.Backups.Now(r.Context(), req.Cluster, req.Type)
	if err != nil {
		return backupError(err)
	}
	writeJSON(w, http.StatusAccepted, out)
	return nil
}

// backupCluster checks that a named cluster exists and that backups are
// wired at all.
func (s *Server) backupCluster(name string) error {
	if name != "" {
		if _, err := s.Clusters.Get(name); err != nil {
			return err
		}
	}
	if s.Backups == nil {
		return backupError(backup.ErrNotConfigured)
	}
	return nil
}

// backupError answers a cluster without backups, or one whose backup is
// already running, with 409: the request is fine, the cluster's state
// refuses it.
func backupError(err error) error {
	if errors.Is(err, backup.ErrNotConfigured) || errors.Is(err, backup.ErrBusy) {
		return fmt.Errorf("%w: %w", catalog.ErrConflict, err)
	}
	return err
}

// Backups lists the backups and recovery window of one cluster, or of every
// cluster backed up when cluster is "".
func (c *Client) Backups(ctx context.Context, cluster string) ([]backup.ClusterBackups, error) {
	q := url.Values{}
	if cluster != "" {
		q.Set("cluster", cluster)
	}
	path := "/v1/backups"
	if len(q) > 0 {
		path += "?" + q.Encode()
	}
	var out []backup.ClusterBackups
	return out, c.Do(ctx, http.MethodGet, path, nil, &out)
}

// BackupNow starts backup jobs.
func (c *Client) BackupNow(ctx context.Context, req BackupRequest) ([]jobs.Job, error) {
	var out []jobs.Job
	return out, c.Do(ctx, http.MethodPost, "/v1/backups", req, &out)
}
