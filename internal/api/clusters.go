package api

import (
	"context"
	"net/http"
	"net/url"
	"regexp"
	"strings"

	"github.com/pgtenant/pgtenant/internal/catalog"
	"github.com/pgtenant/pgtenant/internal/cluster"
	"github.com/pgtenant/pgtenant/internal/failover"
)

var clusterNameRE = regexp.MustCompile(`^[a-z][a-z0-9_]{0,30}$`)

func (s *Server) listClusters(w http.ResponseWriter, r *http.Request) error {
	cs, err := s.Store.Clusters(r.Context())
	if err != nil {
		return err
	}
	loads, err := s.Store.ClusterLoads(r.Context())
	if err != nil {
		return err
	}
	out := make([]Cluster, 0, len(cs))
	for _, c := range cs {
		out = append(out, s.clusterView(r.Context(), c, loads))
	}
	writeJSON(w, http.StatusOK, out)
	return nil
}

func (s *Server) showCluster(w http.ResponseWriter, r *http.Request) error {
	c, err := s.Store.GetCluster(r.Context(), r.PathValue("name"))
	if err != nil {
		return err
	}
	loads, err := s.Store.ClusterLoads(r.Context())
	if err != nil {
		return err
	}
	d := ClusterDetail{Cluster: s.clusterView(r.Context(), c, loads)}
	if len(c.PatroniURLs) > 0 && s.Failover != nil {
		ms, sync, err := s.Failover.Members(r.Context(), c)
		if err != nil {
			d.PatroniError = cluster.RedactError(err, c.DSN)
		}
		d.Members, d.SynchronousMode = ms, sync
	}
	if d.Status == "up" {
		cl, err := s.Clusters.Get(c.Name)
		if err != nil {
			return err
		}
		info, err := cl.Info(r.Context())
		if err != nil {
			d.Status, d.Error = "down", err.Error()
		} else {
			d.Info = &info
		}
	}
	writeJSON(w, http.StatusOK, d)
	return nil
}

// addCluster registers an external cluster after checking that pgtenant can
// reach it with the DSN given.
func (s *Server) addCluster(w http.ResponseWriter, r *http.Request) error {
	var req AddClusterRequest
	if err := decode(r, &req); err != nil {
		return err
	}
	if !clusterNameRE.MatchString(req.Name) {
		return invalid("cluster name %q: use lowercase letters, digits and _, starting with a letter, at most 31 characters", req.Name)
	}
	if req.DSN == "" {
		return invalid("dsn is required, e.g. postgres://admin:PASSWORD@host:5432/postgres")
	}
	if existing, err := s.Store.GetCluster(r.Context(), req.Name); err == nil && existing.Kind == "managed" {
		return invalid("cluster %q is managed by pgtenant up; it cannot be replaced by an external DSN", req.Name)
	}
	dsn, standbys := req.DSN, req.Standbys
	if len(req.Patroni) > 0 {
		var err error
		if dsn, standbys, err = s.patroniTopology(r.Context(), &req); err != nil {
			return err
		}
	}
	cl, err := cluster.New(req.Name, dsn, standbys, s.Logger)
	if err != nil {
		return invalid("%v", err)
	}
	if _, err := cl.Probe(r.Context()); err != nil {
		cl.Close()
		return invalid("cannot reach cluster %s with that DSN: %s", req.Name, cluster.RedactError(err, dsn))
	}
	if err := s.Store.UpsertCluster(r.Context(), catalog.Cluster{Name: req.Name, Kind: "external", DSN: dsn, StandbyDSNs: standbys,
		PatroniURLs: req.Patroni}); err != nil {
		cl.Close()
		return err
	}
	s.Clusters.Put(cl)
	c, err := s.Store.GetCluster(r.Context(), req.Name)
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusCreated, s.clusterView(r.Context(), c, nil))
	return nil
}

// patroniTopology checks the Patroni endpoints of req (normalised in
// place) and returns the DSN's leader and replicas: where pgtenant
// connects until the leader changes.
func (s *Server) patroniTopology(ctx context.Context, req *AddClusterRequest) (string, []string, error) {
	if len(req.Standbys) > 0 {
		return "", nil, invalid("standbys and patroni: give one; with patroni, the standbys are Patroni's replicas")
	}
	for i, raw := range req.Patroni {
		u, err := url.Parse(raw)
		if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" || strings.Trim(u.Path, "/") != "" || u.RawQuery != "" || u.User != nil {
			return "", nil, invalid("patroni endpoint %q: want the REST API's base URL, e.g. http://10.0.0.1:8008", raw)
		}
		req.Patroni[i] = u.Scheme + "://" + u.Host
	}
	dsn, standbys, err := failover.Topology(ctx, req.Patroni, req.DSN, nil)
	if err != nil {
		return "", nil, invalid("cannot read the leader of cluster %s from Patroni at %s: %s", req.Name, strings.Join(req.Patroni, ", "),
			cluster.RedactError(err, req.DSN))
	}
	return dsn, standbys, nil
}

// switchoverCluster starts a planned change of a Patroni cluster's leader.
func (s *Server) switchoverCluster(w http.ResponseWriter, r *http.Request) error {
	return s.changeLeader(w, r, false)
}

// failoverCluster starts a forced change of a Patroni cluster's leader.
func (s *Server) failoverCluster(w http.ResponseWriter, r *http.Request) error {
	return s.changeLeader(w, r, true)
}

func (s *Server) changeLeader(w http.ResponseWriter, r *http.Request, force bool) error {
	var req SwitchoverRequest
	if err := decode(r, &req); err != nil {
		return err
	}
	j, err := s.Failover.Switchover(r.Context(), r.PathValue("name"), req.To, force)
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusAccepted, j)
	return nil
}
