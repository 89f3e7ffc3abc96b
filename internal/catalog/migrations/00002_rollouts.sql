-- +goose Up
-- Rollouts: one job that brings every tenant of a template to a target
-- version, one transaction per tenant per version (internal/migrate).

CREATE TABLE rollouts (
    id                bigserial PRIMARY KEY,
    template          text NOT NULL,
    target_version    int NOT NULL,
    canary            int NOT NULL DEFAULT 0 CHECK (canary >= 0), -- pause after this many tenants (0: no canary)
    canary_passed     boolean NOT NULL DEFAULT false,             -- an operator (or auto-continue) let it go on
    parallel          int NOT NULL CHECK (parallel > 0),          -- tenants in flight at once, over all clusters
    cluster           text NOT NULL DEFAULT '',                   -- only this cluster's tenants ('' = every cluster)
    -- queued, building, migrating, paused, succeeded, failed, cancelled; the
    -- job's state is authoritative once it is paused or finished.
    state             text NOT NULL DEFAULT 'queued'
                      CHECK (state IN ('queued', 'building', 'migrating', 'paused', 'succeeded', 'failed', 'cancelled')),
    job_id            bigint, -- the template.rollout job (jobs.id)
    already_at_target int NOT NULL DEFAULT 0, -- tenants at or past the target when it was created: never connected to
    created_at        timestamptz NOT NULL DEFAULT now(),
    updated_at        timestamptz NOT NULL DEFAULT now(),
    FOREIGN KEY (template, target_version) REFERENCES template_versions ON DELETE CASCADE
);
CREATE INDEX rollouts_template ON rollouts (template, id);

-- One row per tenant a rollout has to move. No foreign key to tenants: a
-- tenant purged during the rollout keeps its row here (skipped), as history.
CREATE TABLE rollout_tenants (
    rollout      bigint NOT NULL REFERENCES rollouts (id) ON DELETE CASCADE,
    tenant       text NOT NULL,
    cluster      text NOT NULL,
    mode         text NOT NULL,
    from_version int NOT NULL, -- the catalog version when the tenant joined the rollout
    version      int NOT NULL, -- the version it has reached (committed inside the tenant)
    state        text NOT NULL DEFAULT 'pending'
                 CHECK (state IN ('pending', 'running', 'done', 'failed', 'skipped')),
    error        text NOT NULL DEFAULT '',
    attempts     int NOT NULL DEFAULT 0, -- transactions tried (lock timeouts retried count too)
    started_at   timestamptz,
    finished_at  timestamptz,
    PRIMARY KEY (rollout, tenant)
);
CREATE INDEX rollout_tenants_state ON rollout_tenants (rollout, state);
