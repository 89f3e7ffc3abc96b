package catalog

import (
	"context"
	"fmt"

	"github.com/jackc/pgx/v5"
)

// Placement is the policy set on a cluster (docs/operations/placement.md). Caps of
// 0 are none.
type Placement struct {
	MaxTenants   int               `json:"max_tenants,omitempty"`
	MaxSizeBytes int64             `json:"max_size_bytes,omitempty"`
	Labels       map[string]string `json:"labels"`
	Draining     bool              `json:"draining"`
}

// PlacementChange is what `cluster set` changes; nil leaves a cap as it
// is, 0 removes it.
type PlacementChange struct {
	MaxTenants   *int              `json:"max_tenants,omitempty"`
	MaxSizeBytes *int64            `json:"max_size_bytes,omitempty"`
	Labels       map[string]string `json:"labels,omitempty"`        // set
	RemoveLabels []string          `json:"remove_labels,omitempty"` // removed after Labels are set
}

// SetPlacement changes a cluster's caps and labels.
func (s *Store) SetPlacement(ctx context.Context, name string, ch PlacementChange) error {
	labels := ch.Labels
	if labels == nil {
		labels = map[string]string{}
	}
	remove := ch.RemoveLabels
	if remove == nil {
		remove = []string{}
	}
	tag, err := s.pool.Exec(ctx, `UPDATE clusters SET
		max_tenants = CASE WHEN $2::int IS NULL THEN max_tenants ELSE nullif($2::int, 0) END,
		max_size_bytes = CASE WHEN $3::bigint IS NULL THEN max_size_bytes ELSE nullif($3::bigint, 0) END,
		labels = (labels || $4::jsonb) - $5::text[],
		updated_at = now()
		WHERE name = $1`, name, ch.MaxTenants, ch.MaxSizeBytes, labels, remove)
	if err != nil {
		return fmt.Errorf("set placement of cluster %s: %w", name, err)
	}
	if tag.RowsAffected() == 0 {
		return fmt.Errorf("cluster %s: %w", name, ErrNotFound)
	}
	return nil
}

// SetDraining marks a cluster draining or not; changed says whether it was
// not so before.
func (s *Store) SetDraining(ctx context.Context, name string, draining bool) (changed bool, err error) {
	var was bool
	err = s.pool.QueryRow(ctx, `UPDATE clusters c SET draining = $2, updated_at = now()
		FROM (SELECT name, draining FROM clusters WHERE name = $1 FOR UPDATE) old
		WHERE c.name = old.name RETURNING old.draining`, name, draining).Scan(&was)
	if err != nil {
		return false, notFound(err, "cluster "+name)
	}
	return was != draining, nil
}

// Load is what a cluster holds of one tier: tenants (provisioning, active,
// suspended or dropped; not spares) and their sizes as the metrics
// collector last stored them (a tenant not sampled yet counts 0).
type Load struct {
	Tenants   int
	SizeBytes int64
}

// ClusterLoads returns the load of every cluster, by tier.
func (s *Store) ClusterLoads(ctx context.Context) (map[string]map[string]Load, error) {
	rows, err := s.pool.Query(ctx, `
		SELECT cluster, tier, count(*)::int, coalesce(sum(size_bytes), 0)::bigint
		FROM tenants
		WHERE state IN ('provisioning', 'active', 'suspended', 'dropped')
		GROUP BY cluster, tier`)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	out := map[string]map[string]Load{}
	for rows.Next() {
		var c, tier string
		var l Load
		if err := rows.Scan(&c, &tier, &l.Tenants, &l.SizeBytes); err != nil {
			return nil, err
		}
		if out[c] == nil {
			out[c] = map[string]Load{}
		}
		out[c][tier] = l
	}
	return out, rows.Err()
}

// SizedTenant is a tenant with its last stored size, as drain and
// rebalance see it.
type SizedTenant struct {
	ID        string
	Cluster   string
	Tier      string
	State     TenantState
	SizeBytes int64
	Pins      []string // labels its cluster must carry
}

// SizedTenants lists the tenants of a cluster ("" = every cluster) that
// count towards its load, largest first.
func (s *Store) SizedTenants(ctx context.Context, cluster string) ([]SizedTenant, error) {
	rows, err := s.pool.Query(ctx, `
		SELECT id, cluster, tier, state, coalesce(size_bytes, 0), pins
		FROM tenants
		WHERE state IN ('provisioning', 'active', 'suspended', 'dropped') AND ($1 = '' OR cluster = $1)
		ORDER BY 5 DESC, id`, cluster)
	if err != nil {
		return nil, err
	}
	return pgx.CollectRows(rows, func(r pgx.CollectableRow) (SizedTenant, error) {
		var t SizedTenant
		return t, r.Scan(&t.ID, &t.Cluster, &t.Tier, &t.State, &t.SizeBytes, &t.Pins)
	})
}
