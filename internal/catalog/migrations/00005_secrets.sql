-- +goose Up
-- Secrets of the control plane, generated once per catalog, so that every
-- daemon sharing the catalog derives the same values from them (the
-- passwords of tenant agent roles: docs/SECURITY.md). Readable only by the
-- catalog's owner, like every table here.
CREATE TABLE secrets (
    name       text PRIMARY KEY,
    value      bytea NOT NULL,
    created_at timestamptz NOT NULL DEFAULT now()
);
