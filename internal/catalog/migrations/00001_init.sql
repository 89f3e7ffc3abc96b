-- +goose Up
-- pgtenant's catalog: clusters, templates, tenants and durable jobs.

CREATE TABLE clusters (
    name         text PRIMARY KEY,
    kind         text NOT NULL CHECK (kind IN ('managed', 'external')),
    dsn          text NOT NULL, -- admin DSN of the primary; holds a secret, never shown
    standby_dsns text[] NOT NULL DEFAULT '{}',
    created_at   timestamptz NOT NULL DEFAULT now(),
    updated_at   timestamptz NOT NULL DEFAULT now()
);

CREATE TABLE templates (
    name            text PRIMARY KEY,
    current_version int NOT NULL, -- the version new tenants get
    created_at      timestamptz NOT NULL DEFAULT now()
);

-- A version is immutable: its files and checksums never change once stored.
CREATE TABLE template_versions (
    template   text NOT NULL REFERENCES templates (name) ON DELETE CASCADE,
    version    int NOT NULL CHECK (version > 0),
    checksum   text NOT NULL, -- over the files' names and checksums
    created_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (template, version)
);

CREATE TABLE template_files (
    template       text NOT NULL,
    version        int NOT NULL,
    seq            int NOT NULL,
    name           text NOT NULL,
    body           text NOT NULL, -- the Up section only
    checksum       text NOT NULL, -- sha256 of the whole file
    no_transaction boolean NOT NULL DEFAULT false,
    PRIMARY KEY (template, version, seq),
    FOREIGN KEY (template, version) REFERENCES template_versions ON DELETE CASCADE
);

-- A template version materialised on a cluster as a template database.
CREATE TABLE template_builds (
    template   text NOT NULL,
    version    int NOT NULL,
    cluster    text NOT NULL REFERENCES clusters (name) ON DELETE CASCADE,
    state      text NOT NULL CHECK (state IN ('building', 'ready', 'failed', 'retired')),
    database   text NOT NULL,
    relations  int NOT NULL DEFAULT 0,
    size_bytes bigint NOT NULL DEFAULT 0,
    error      text NOT NULL DEFAULT '',
    updated_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (template, version, cluster),
    FOREIGN KEY (template, version) REFERENCES template_versions ON DELETE CASCADE
);

-- Tenants, spares included (state building/spare). Physical names are t_<id>;
-- the display name and external id live only here.
CREATE TABLE tenants (
    id          text PRIMARY KEY,
    name        text NOT NULL DEFAULT '',
    external_id text,
    mode        text NOT NULL CHECK (mode IN ('database', 'schema')),
    cluster     text NOT NULL REFERENCES clusters (name),
    template    text NOT NULL REFERENCES templates (name),
    version     int NOT NULL,
    tier        text NOT NULL DEFAULT 'default',
    state       text NOT NULL CHECK (state IN ('building', 'spare', 'provisioning', 'active', 'suspended',
                                              'dropped', 'purging', 'failed')),
    database    text NOT NULL, -- where it lives: its own database, or the template's shared database
    created_at  timestamptz NOT NULL DEFAULT now(),
    updated_at  timestamptz NOT NULL DEFAULT now(),
    claimed_at  timestamptz,
    dropped_at  timestamptz,
    purge_after timestamptz
);
CREATE UNIQUE INDEX tenants_external_id ON tenants (external_id) WHERE external_id IS NOT NULL;
CREATE INDEX tenants_spares ON tenants (cluster, template, version, mode, created_at) WHERE state = 'spare';
CREATE INDEX tenants_state ON tenants (state, cluster);

CREATE TABLE tenant_events (
    id     bigserial PRIMARY KEY,
    tenant text NOT NULL REFERENCES tenants (id) ON DELETE CASCADE,
    at     timestamptz NOT NULL DEFAULT now(),
    kind   text NOT NULL,
    detail jsonb NOT NULL DEFAULT '{}'
);
CREATE INDEX tenant_events_tenant ON tenant_events (tenant, at);

-- Durable jobs. A worker holds a lease while it runs a job; a job whose lease
-- expired is resumed by any daemon from its last completed step.
CREATE TABLE jobs (
    id               bigserial PRIMARY KEY,
    type             text NOT NULL,
    key              text, -- at most one unfinished job per key (e.g. purge:<tenant>)
    target_kind      text NOT NULL DEFAULT '',
    target           text NOT NULL DEFAULT '',
    cluster          text,
    args             jsonb NOT NULL DEFAULT '{}',
    data             jsonb NOT NULL DEFAULT '{}', -- the job's own state between steps (cursors, ids)
    state            text NOT NULL DEFAULT 'queued'
                     CHECK (state IN ('queued', 'running', 'waiting', 'paused', 'succeeded', 'failed', 'cancelled')),
    attempts         int NOT NULL DEFAULT 0,
    max_attempts     int NOT NULL DEFAULT 5,
    run_after        timestamptz NOT NULL DEFAULT now(),
    lease_owner      text,
    lease_expires    timestamptz,
    cancel_requested boolean NOT NULL DEFAULT false,
    progress_done    bigint NOT NULL DEFAULT 0,
    progress_total   bigint NOT NULL DEFAULT 0,
    progress_msg     text NOT NULL DEFAULT '',
    last_error       text NOT NULL DEFAULT '',
    created_at       timestamptz NOT NULL DEFAULT now(),
    updated_at       timestamptz NOT NULL DEFAULT now(),
    started_at       timestamptz,
    finished_at      timestamptz
);
CREATE UNIQUE INDEX jobs_key ON jobs (key) WHERE key IS NOT NULL AND state IN ('queued', 'running', 'waiting', 'paused');
CREATE INDEX jobs_runnable ON jobs (run_after) WHERE state IN ('queued', 'running', 'waiting');
CREATE INDEX jobs_target ON jobs (target_kind, target);

-- One row per completed step: the primary key is what guarantees that no step
-- of a job completes twice, even with several daemons.
CREATE TABLE job_steps (
    job_id      bigint NOT NULL REFERENCES jobs (id) ON DELETE CASCADE,
    step        text NOT NULL,
    worker      text NOT NULL,
    attempt     int NOT NULL,
    started_at  timestamptz NOT NULL,
    finished_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (job_id, step)
);
