-- +goose Up
-- Usage: the statements a tenant ran on the analytics port in the hour
-- (counted by the daemon that served them, written with the hour's other
-- figures by the collector of the tenant's cluster).
ALTER TABLE usage_hours ADD COLUMN analytics_queries bigint NOT NULL DEFAULT 0;

-- +goose Down
ALTER TABLE usage_hours DROP COLUMN analytics_queries;
