-- +goose Up
-- Scoped API tokens. Only the SHA-256 of a token is kept: the token itself
-- is shown once, in the create answer, and is in no table, log or backup.
-- A token is revoked (revoked_at), never deleted, so that the audit's rows
-- keep naming it.
CREATE TABLE api_tokens (
    id         bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    name       text NOT NULL DEFAULT '',
    scope      text NOT NULL CHECK (scope IN ('read-only', 'tenants', 'templates', 'clusters', 'admin')),
    hash       bytea NOT NULL UNIQUE CHECK (length(hash) = 32),
    created_at timestamptz NOT NULL DEFAULT now(),
    expires_at timestamptz,
    revoked_at timestamptz
);

-- Every mutating API call, allowed or refused: who (actor, and token_id for
-- a scoped token; NULL for the token file's admin token or no valid token),
-- what (method and route pattern), target (the route's path values), when,
-- from where (the peer address), result (HTTP status). Append-only: the
-- daemon only inserts; the trigger below refuses UPDATE, DELETE and
-- TRUNCATE, so that a bug (or a catalog session) cannot rewrite history
-- without first dropping it. A retention sweep, when there is one, will
-- come with a migration that allows deleting old rows only.
CREATE TABLE audit_log (
    id       bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    at       timestamptz NOT NULL DEFAULT now(),
    token_id bigint,
    actor    text NOT NULL,
    method   text NOT NULL,
    route    text NOT NULL,
    target   jsonb NOT NULL DEFAULT '{}',
    remote   text NOT NULL DEFAULT '',
    status   int NOT NULL
);
CREATE INDEX audit_log_at ON audit_log (at);

-- +goose StatementBegin
CREATE FUNCTION audit_log_append_only() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    RAISE EXCEPTION 'audit_log is append-only: % refused', TG_OP;
END
$$;
-- +goose StatementEnd
CREATE TRIGGER audit_log_no_change BEFORE UPDATE OR DELETE ON audit_log
    FOR EACH ROW EXECUTE FUNCTION audit_log_append_only();
CREATE TRIGGER audit_log_no_truncate BEFORE TRUNCATE ON audit_log
    FOR EACH STATEMENT EXECUTE FUNCTION audit_log_append_only();

-- +goose Down
DROP TABLE audit_log;
DROP FUNCTION audit_log_append_only();
DROP TABLE api_tokens;
