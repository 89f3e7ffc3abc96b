-- +goose Up
-- Usage metering (docs/operations/usage.md): what a tenant used, per hour,
-- kept for billing long after the minute rollups (tenant_metrics) are gone.
--
-- Neither table refers to tenants: a purged tenant's usage is still billed,
-- and its tenants row is gone by then.

-- Activity per tenant, hour and measuring cluster. A row is written once,
-- when the hour has ended, and only for a tenant that did something in it:
-- an idle tenant costs no row. The cluster is where the figures were read
-- (a tenant that moves in an hour has a row from each cluster, summed when
-- read; its front-door bytes come from the pooler that serves its entry).
-- Two daemons that measure the same cluster write the same key: the larger
-- figure of each is kept, not their sum.
CREATE TABLE usage_hours (
    tenant             text NOT NULL,
    hour               timestamptz NOT NULL, -- start of the hour
    cluster            text NOT NULL,
    rows_written       bigint NOT NULL DEFAULT 0,            -- inserts + updates + deletes
    connection_seconds double precision NOT NULL DEFAULT 0,  -- server sessions × seconds
    cpu_seconds        double precision, -- user + system, pg_stat_kcache; NULL: not measured
    bytes_in           bigint,           -- received by the front door (PgBouncer); NULL: none
    bytes_out          bigint,           -- sent by the front door
    PRIMARY KEY (tenant, hour, cluster)
);
CREATE INDEX usage_hours_hour ON usage_hours (hour);

-- Storage: a row only when a sampled size differs from the tenant's
-- previous row (and a 0 when the tenant is purged). The size holds from
-- `at` until the next row; byte-hours are computed from these steps when
-- usage is read, so holding bytes while idle costs no write at all.
CREATE TABLE usage_sizes (
    tenant     text NOT NULL,
    at         timestamptz NOT NULL,
    size_bytes bigint NOT NULL,
    PRIMARY KEY (tenant, at)
);
CREATE INDEX usage_sizes_at ON usage_sizes (at); -- reads of a span, the retention sweep

-- +goose Down
DROP TABLE usage_sizes;
DROP TABLE usage_hours;
