-- +goose Up
-- Prewarm: the hot set of each tenant on each node, captured from
-- pg_buffercache, and what pgtenant last saw of each node (to notice
-- restarts and failovers).

-- A tenant's hot set on one node: block ranges of its relations, hottest
-- first. A capture replaces a node's hot sets in one transaction, so a
-- partial capture never overwrites a complete one.
CREATE TABLE hot_sets (
    tenant      text NOT NULL REFERENCES tenants (id) ON DELETE CASCADE,
    cluster     text NOT NULL,
    node        text NOT NULL,
    captured_at timestamptz NOT NULL,
    blocks      bigint NOT NULL,  -- blocks in the ranges
    usage       bigint NOT NULL,  -- sum of their usage counts: how hot
    counter     bigint NOT NULL DEFAULT 0, -- the tenant's blocks hit + read (statistics), at capture
    activity    bigint NOT NULL DEFAULT 0, -- blocks hit + read since the previous capture: how recently busy
    ranges      jsonb NOT NULL,   -- [{"f": relfilenode, "k": fork, "a": first, "b": last, "u": usage}]
    PRIMARY KEY (tenant, node)
);
CREATE INDEX hot_sets_cluster ON hot_sets (cluster, node);

-- One row per node: its identity as last seen, and the last capture.
CREATE TABLE prewarm_nodes (
    cluster          text NOT NULL,
    node             text NOT NULL,
    postmaster_start timestamptz,
    timeline         int,
    captured_at      timestamptz, -- last complete capture
    captured_tenants int NOT NULL DEFAULT 0,
    captured_blocks  bigint NOT NULL DEFAULT 0,
    updated_at       timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (cluster, node)
);

-- The last prewarm of each tenant on each node.
CREATE TABLE prewarm_tenants (
    tenant        text NOT NULL REFERENCES tenants (id) ON DELETE CASCADE,
    node          text NOT NULL,
    job_id        bigint,
    state         text NOT NULL, -- done, skipped, failed
    blocks_buffer bigint NOT NULL DEFAULT 0, -- loaded into shared_buffers
    blocks_os     bigint NOT NULL DEFAULT 0, -- prefetched into the OS cache
    error         text NOT NULL DEFAULT '',
    at            timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (tenant, node)
);
