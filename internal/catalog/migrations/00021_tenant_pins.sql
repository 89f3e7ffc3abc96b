-- +goose Up
-- A tenant's placement pins: labels (k=v) its cluster must carry, for data
-- residency; placement, drains, rebalances and moves keep it on such
-- clusters. Empty: anywhere its tier admits.
ALTER TABLE tenants ADD COLUMN pins text[] NOT NULL DEFAULT '{}';

-- +goose Down
ALTER TABLE tenants DROP COLUMN pins;
