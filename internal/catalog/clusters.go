package catalog

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
)

// Cluster is a registered cluster.
type Cluster struct {
	Name        string   `json:"name"`
	Kind        string   `json:"kind"` // managed or external
	DSN         string   `json:"-"`    // secret
	StandbyDSNs []string `json:"-"`
	// PatroniURLs are the REST APIs of the Patroni nodes that run the
	// cluster (http://host:port): the daemons follow its leader there, and
	// DSN and StandbyDSNs then name the nodes Patroni last reported.
	PatroniURLs []string  `json:"patroni_urls,omitempty"`
	CreatedAt   time.Time `json:"created_at"`
	Placement
}

// clusterColumns are what Clusters and GetCluster read.
const clusterColumns = `name, kind, dsn, standby_dsns, created_at, coalesce(max_tenants, 0), coalesce(max_size_bytes, 0), labels, draining, patroni_urls`

func scanCluster(row pgx.Row) (Cluster, error) {
	var c Cluster
	err := row.Scan(&c.Name, &c.Kind, &c.DSN, &c.StandbyDSNs, &c.CreatedAt, &c.MaxTenants, &c.MaxSizeBytes, &c.Labels, &c.Draining, &c.PatroniURLs)
	if c.Labels == nil {
		c.Labels = map[string]string{}
	}
	return c, err
}

// UpsertCluster registers a cluster or updates its DSNs and Patroni
// endpoints. An existing
// cluster keeps its kind: a `serve` daemon listing a cluster that `up`
// manages (or the other way round) does not take it over.
func (s *Store) UpsertCluster(ctx context.Context, c Cluster) error {
	if c.StandbyDSNs == nil {
		c.StandbyDSNs = []string{}
	}
	if c.PatroniURLs == nil {
		c.PatroniURLs = []string{}
	}
	_, err := s.pool.Exec(ctx, `
		INSERT INTO clusters (name, kind, dsn, standby_dsns, patroni_urls) VALUES ($1, $2, $3, $4, $5)
		ON CONFLICT (name) DO UPDATE SET dsn = $3, standby_dsns = $4, patroni_urls = $5, updated_at = now()`,
		c.Name, c.Kind, c.DSN, c.StandbyDSNs, c.PatroniURLs)
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

// RepointCluster moves a cluster's DSNs to the nodes its Patroni reports
// (a new leader, other replicas), only if its DSN is still fromDSN: a
// daemon that saw an older view, or an operator's `cluster add` meanwhile,
// is not overwritten. It reports whether the row changed.
func (s *Store) RepointCluster(ctx context.Context, name, fromDSN, toDSN string, standbyDSNs []string) (bool, error) {
	if standbyDSNs == nil {
		standbyDSNs = []string{}
	}
	tag, err := s.pool.Exec(ctx, `
		UPDATE clusters SET dsn = $3, standby_dsns = $4, updated_at = now()
		WHERE name = $1 AND dsn = $2`, name, fromDSN, toDSN, standbyDSNs)
	if err != nil {
		return false, fmt.Errorf("repoint cluster %s: %w", name, err)
	}
	return tag.RowsAffected() == 1, nil
}
