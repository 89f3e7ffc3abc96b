-- +goose Up
-- A tenant's hot set is kept per cluster and node: node names ("primary",
-- "standby1") repeat across clusters, and during and after a move a tenant
-- has a copy on two clusters until the source's leftover is purged. Keyed by
-- (tenant, node) alone, the target's capture failed on the source's row.
ALTER TABLE hot_sets DROP CONSTRAINT hot_sets_pkey, ADD PRIMARY KEY (tenant, cluster, node);

-- +goose Down
DELETE FROM hot_sets h WHERE EXISTS (SELECT 1 FROM tenants t WHERE t.id = h.tenant AND t.cluster <> h.cluster);
ALTER TABLE hot_sets DROP CONSTRAINT hot_sets_pkey, ADD PRIMARY KEY (tenant, node);
