-- +goose Up
-- Columnar analytics mirrors (internal/analytics): one row per tenant with
-- a mirror. The daemon that holds the lease (owner, lease_expires) runs
-- the mirror: its slot's stream and its DuckDB file. The file holds the
-- applied LSN with the data; applied_lsn here is what the owner last
-- reported, for status and metrics.
CREATE TABLE analytics (
    tenant        text PRIMARY KEY REFERENCES tenants (id) ON DELETE CASCADE,
    tables        text[] NOT NULL DEFAULT '{}', -- empty: every table of the tenant
    state         text NOT NULL DEFAULT 'copying', -- copying | streaming | disabling
    error         text NOT NULL DEFAULT '',        -- the mirror's last failure, '' once it works again
    owner         text,                            -- the daemon running the mirror
    owner_addr    text NOT NULL DEFAULT '',        -- that daemon's analytics address
    lease_expires timestamptz,
    applied_lsn   text NOT NULL DEFAULT '',
    applied_rows  bigint NOT NULL DEFAULT 0,
    lag_bytes     bigint NOT NULL DEFAULT 0,
    reported_at   timestamptz,
    created_at    timestamptz NOT NULL DEFAULT now()
);

-- +goose Down
DROP TABLE analytics;
