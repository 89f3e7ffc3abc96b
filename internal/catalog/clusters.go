package catalog

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
)

// Cluster is a registered cluster.
type Cluster struct {
	Name        string    `json:"name"`
	Kind        string    `json:"kind"` // managed or external
	DSN         string    `json:"-"`    // secret
	StandbyDSNs []string  `json:"-"`
	CreatedAt   time.Time `json:"created_at"`
	Placement
}

// clusterColumns are what Clusters and GetCluster read.
const clusterColumns = `name, kind, dsn, standby_dsns, created_at, coalesce(max_tenants, 0), coalesce(max_size_bytes, 0), labels, draining`

func scanCluster(row pgx.Row) (Cluster, error) {
	var c Cluster
	err := row.Scan(&c.Name, &c.Kind, &c.DSN, &c.StandbyDSNs, &c.CreatedAt, &c.MaxTenants, &c.MaxSizeBytes, &c.Labels, &c.Draining)
	if c.Labels == nil {
		c.Labels = map[string]string{}
	}
	return c, err
}

// UpsertCluster registers a cluster or updates its DSNs. An existing
// cluster keeps its kind: a `serve` daemon listing a cluster that `up`
// manages (or the other way round) does not take it over.
func (s *Store) UpsertCluster(ctx context.Context, c Cluster) error {
	if c.StandbyDSNs == nil {
		c.StandbyDSNs = []string{}
	}
	_, err := s.pool.Exec(ctx, `
		INSERT INTO clusters (name, kind, dsn, standby_dsns) VALUES ($1, $2, $3, $4)
		ON CONFLICT (name) DO UPDATE SET dsn = $3, standby_dsns = $4, updated_at = now()`,
		c.Name, c.Kind, c.DSN, c.StandbyDSNs)
	if err != nil {
		return fmt.Errorf("register cluster %s: %w", c.Name, err)
	}
	return nil
}

// Clusters lists registered clusters by name.
func (s *Store) Clusters(ctx context.Context) ([]Cluster, error) {
	rows, err := s.pool.Query(ctx, `SELECT `+clusterColumns+` FROM clusters ORDER BY name`)
	if err != nil {
		return nil, err
	}
	return pgx.CollectRows(rows, func(r pgx.CollectableRow) (Cluster, error) { return scanCluster(r) })
}

// GetCluster returns one cluster.
func (s *Store) GetCluster(ctx context.Context, name string) (Cluster, error) {
	c, err := scanCluster(s.pool.QueryRow(ctx, `SELECT `+clusterColumns+` FROM clusters WHERE name = $1`, name))
	return c, notFound(err, "cluster "+name)
}
