-- +goose Up
-- Placement policy per cluster (README, "Placement"): caps (NULL: none),
-- labels that tiers can ask for, and draining (no new tenants or spares;
-- `cluster drain` moves its tenants away).
ALTER TABLE clusters
    ADD COLUMN max_tenants    int CHECK (max_tenants > 0),
    ADD COLUMN max_size_bytes bigint CHECK (max_size_bytes > 0),
    ADD COLUMN labels         jsonb NOT NULL DEFAULT '{}',
    ADD COLUMN draining       boolean NOT NULL DEFAULT false;

-- +goose Down
ALTER TABLE clusters DROP COLUMN max_tenants, DROP COLUMN max_size_bytes, DROP COLUMN labels, DROP COLUMN draining;
