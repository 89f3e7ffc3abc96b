package api

import (
	"time"

	"github.com/pgtenant/pgtenant/internal/cluster"
)

// Wire types shared by the server, the Go client (CLI, tests) and the console.

// ErrorBody is the JSON body of every error response.
type ErrorBody struct {
	Error ErrorDetail `json:"error"`
}

// ErrorDetail says what went wrong and, where it can, what to do.
type ErrorDetail struct {
	Code    string `json:"code"` // not_found, invalid, conflict, unavailable, unauthorized, internal
	Message string `json:"message"`
}

// Cluster is a registered cluster as listed.
type Cluster struct {
	Name      string                 `json:"name"`
	Kind      string                 `json:"kind"`   // managed or external
	DSN       string                 `json:"dsn"`    // password redacted
	Status    string                 `json:"status"` // up, down
	Error     string                 `json:"error,omitempty"`
	Standbys  []cluster.StandbyState `json:"standbys"`
	CreatedAt time.Time              `json:"created_at"`
}

// ClusterDetail is `cluster show`.
type ClusterDetail struct {
	Cluster
	Info *cluster.Info `json:"info,omitempty"`
}

// AddClusterRequest registers an external cluster.
type AddClusterRequest struct {
	Name     string   `json:"name"`
	DSN      string   `json:"dsn"`
	Standbys []string `json:"standbys,omitempty"`
}

// Health is /healthz.
type Health struct {
	Status  string `json:"status"` // ok or degraded
	Catalog string `json:"catalog"`
	Version string `json:"version"`
}
