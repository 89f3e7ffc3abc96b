package catalog

import (
	"context"
	"fmt"
	"time"
)

// Cluster is a registered cluster.
type Cluster struct {
	Name        string    `json:"name"`
	Kind        string    `json:"kind"` // managed or external
	DSN         string    `json:"-"`    // secret
	StandbyDSNs []string  `json:"-"`
	CreatedAt   time.Time `json:"created_at"`
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
	rows, err := s.pool.Query(ctx, `SELECT name, kind, dsn, standby_dsns, created_at FROM clusters ORDER BY name`)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var out []Cluster
	for rows.Next() {
		var c Cluster
		if err := rows.Scan(&c.Name, &c.Kind, &c.DSN, &c.StandbyDSNs, &c.CreatedAt); err != nil {
			return nil, err
		}
		out = append(out, c)
	}
	return out, rows.Err()
}

// GetCluster returns one cluster.
func (s *Store) GetCluster(ctx context.Context, name string) (Cluster, error) {
	var c Cluster
	err := s.pool.QueryRow(ctx, `SELECT name, kind, dsn, standby_dsns, created_at FROM clusters WHERE name = $1`, name).
		Scan(&c.Name, &c.Kind, &c.DSN, &c.StandbyDSNs, &c.CreatedAt)
	return c, notFound(err, "cluster "+name)
}
