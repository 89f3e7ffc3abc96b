-- +goose Up
-- What bench density showed growing with the catalog (docs/operations/capacity.md).
--
-- A tenant's last sampled size on its row: placement's loads (every
-- cluster's tenants and bytes, per tier) are one scan of tenants instead of
-- a probe of tenant_metrics per tenant (571 ms at a million tenants).
ALTER TABLE tenants ADD COLUMN size_bytes bigint;
UPDATE tenants t SET size_bytes = z.size_bytes
FROM (SELECT DISTINCT ON (tenant) tenant, size_bytes FROM tenant_metrics
      WHERE size_bytes IS NOT NULL ORDER BY tenant, minute DESC) z
WHERE z.tenant = t.id;

-- A cluster's tenants in id order: its page of the list (35 ms at a
-- million tenants through the state index and a sort), reconcile's and the
-- pooler's reads of one cluster.
CREATE INDEX tenants_cluster_id ON tenants (cluster, id);

-- Search by part of a name or external id: trigram indexes where pg_trgm
-- can be created (a trusted extension: the catalog database's owner may);
-- without it a search scans the tenants (327 ms at a million).
-- +goose StatementBegin
DO $$
BEGIN
    CREATE EXTENSION IF NOT EXISTS pg_trgm;
    CREATE INDEX tenants_name_trgm ON tenants USING gin (name gin_trgm_ops);
    CREATE INDEX tenants_external_id_trgm ON tenants USING gin (external_id gin_trgm_ops);
EXCEPTION WHEN OTHERS THEN
    RAISE WARNING 'pg_trgm is not available (%): tenant search scans the catalog', SQLERRM;
END
$$;
-- +goose StatementEnd

-- +goose Down
DROP INDEX tenants_cluster_id;
DROP INDEX IF EXISTS tenants_external_id_trgm;
DROP INDEX IF EXISTS tenants_name_trgm;
ALTER TABLE tenants DROP COLUMN size_bytes;
