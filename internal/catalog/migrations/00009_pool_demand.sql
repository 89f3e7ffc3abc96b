-- +goose Up
-- Spare pools follow demand: each pool pass reads the creates of every
-- pool (claimed_at: a pool claim, or the request of a cold create) over the
-- last provision.pool_idle_after, in one query: only recent rows are read.
CREATE INDEX tenants_claimed_at ON tenants (claimed_at) WHERE claimed_at IS NOT NULL;

-- +goose Down
DROP INDEX tenants_claimed_at;
