-- +goose Up
-- The REST endpoints of the Patroni nodes that run a cluster (issue 24):
-- the daemons read its members there and follow its leader. Empty: the
-- cluster is not run by Patroni, and its dsn is where its primary stays.
ALTER TABLE clusters ADD COLUMN patroni_urls text[] NOT NULL DEFAULT '{}';

-- +goose Down
ALTER TABLE clusters DROP COLUMN patroni_urls;
