-- +goose Up
-- Finished jobs are deleted after jobs.retention (30 days by default): a
-- month of a million tenants' jobs is about 500,000 rows. The daemons find
-- the oldest of them through this index, whatever the table holds.
CREATE INDEX jobs_finished ON jobs (finished_at) WHERE state IN ('succeeded', 'failed', 'cancelled');

-- +goose Down
DROP INDEX jobs_finished;
