-- +goose Up
-- A purged tenant is remembered: its row moves to purged_tenants and its
-- events stay, for drop.purged_retention, so that `tenant show` and
-- `tenant list --state purged` still answer for it. Spares (never claimed)
-- leave nothing. tenant_events loses its foreign key to tenants for this:
-- the purge deletes a tenant's events itself when it keeps no tombstone, and
-- the retention sweep deletes a tombstone's events with it.
CREATE TABLE purged_tenants (
    id          text PRIMARY KEY,
    name        text NOT NULL DEFAULT '',
    external_id text, -- free again for a new tenant: no unique index here
    mode        text NOT NULL,
    cluster     text NOT NULL,
    template    text NOT NULL,
    version     int NOT NULL,
    tier        text NOT NULL,
    database    text NOT NULL,
    created_at  timestamptz NOT NULL,
    claimed_at  timestamptz,
    dropped_at  timestamptz,
    purged_at   timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX purged_tenants_purged_at ON purged_tenants (purged_at);

ALTER TABLE tenant_events DROP CONSTRAINT tenant_events_tenant_fkey;

-- The state a dropped tenant had before its drop (active or suspended):
-- what restore brings back.
ALTER TABLE tenants ADD COLUMN dropped_from text;

-- +goose Down
ALTER TABLE tenants DROP COLUMN dropped_from;
DELETE FROM tenant_events e WHERE NOT EXISTS (SELECT 1 FROM tenants t WHERE t.id = e.tenant);
ALTER TABLE tenant_events ADD CONSTRAINT tenant_events_tenant_fkey FOREIGN KEY (tenant) REFERENCES tenants (id) ON DELETE CASCADE;
DROP TABLE purged_tenants;
