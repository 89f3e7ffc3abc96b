-- +goose Up
-- Per-tenant metrics history and storage quota state (internal/metrics,
-- internal/quota). Counters live in the daemon's memory; only minute rollups
-- of tenants whose counters changed are written here, in one multi-row
-- INSERT per minute, so an idle fleet writes nothing.

CREATE TABLE tenant_metrics (
    tenant       text NOT NULL REFERENCES tenants (id) ON DELETE CASCADE,
    minute       timestamptz NOT NULL, -- start of the minute
    size_bytes   bigint,               -- last size sampled (NULL: not sampled yet)
    connections  int NOT NULL DEFAULT 0, -- most sessions seen in the minute
    -- Deltas over the minute. Schema-mode tenants have no per-schema
    -- transaction, temp-file or deadlock statistics: those stay NULL.
    commits      bigint,
    rollbacks    bigint,
    rows_read    bigint NOT NULL DEFAULT 0,
    rows_written bigint NOT NULL DEFAULT 0,
    blks_hit     bigint NOT NULL DEFAULT 0,
    blks_read    bigint NOT NULL DEFAULT 0,
    temp_bytes   bigint,
    deadlocks    bigint,
    PRIMARY KEY (tenant, minute)
);
CREATE INDEX tenant_metrics_minute ON tenant_metrics (minute);

-- One row per tenant whose storage ever crossed a threshold of its tier.
-- Written only on transitions (ok → warning → grace → enforced → ok).
CREATE TABLE tenant_quota (
    tenant      text PRIMARY KEY REFERENCES tenants (id) ON DELETE CASCADE,
    state       text NOT NULL CHECK (state IN ('ok', 'warning', 'grace', 'enforced')),
    since       timestamptz NOT NULL DEFAULT now(), -- entered this state
    over_since  timestamptz,                        -- first seen over the quota (grace start)
    size_bytes  bigint NOT NULL DEFAULT 0,          -- size at the last transition
    -- What enforcement changed beyond ownership (write grants to PUBLIC it
    -- revoked, large-object functions), so that restoring undoes exactly that.
    enforcement jsonb NOT NULL DEFAULT '{}',
    updated_at  timestamptz NOT NULL DEFAULT now()
);

-- Tenants whose per-tenant series are always on /metrics, whatever their
-- activity (the others are exported only while among the most active).
CREATE TABLE tenant_metrics_export (
    tenant     text PRIMARY KEY REFERENCES tenants (id) ON DELETE CASCADE,
    created_at timestamptz NOT NULL DEFAULT now()
);

-- +goose Down
DROP TABLE tenant_metrics_export;
DROP TABLE tenant_quota;
DROP TABLE tenant_metrics;
