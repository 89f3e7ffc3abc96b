-- +goose Up
-- A tenant's extra logins (`pgtenant tenant credential create`): each a
-- role t_<id>_<name> on the tenant's cluster, read-write (it acts as the
-- tenant's role) or read-only (SELECT on the tenant's tables, new ones
-- included), served by the primary or, replica, by a standby. Their
-- passwords are never kept: shown once, at create and at rotation.
CREATE TABLE tenant_logins (
    tenant     text NOT NULL REFERENCES tenants (id) ON DELETE CASCADE,
    name       text NOT NULL CHECK (name ~ '^[a-z][a-z0-9]{0,19}$'),
    read_only  boolean NOT NULL,
    replica    boolean NOT NULL CHECK (read_only OR NOT replica),
    created_at timestamptz NOT NULL DEFAULT now(),
    rotated_at timestamptz,
    PRIMARY KEY (tenant, name)
);

-- +goose Down
DROP TABLE tenant_logins;
