-- +goose Up
-- `job list --state S` and `job list --type T`, newest first: without these
-- a list of a state or type with few jobs (the failed ones, a rare type)
-- walked every job of the retention period by id, or scanned them all.
CREATE INDEX jobs_state_id ON jobs (state, id);
CREATE INDEX jobs_type_id ON jobs (type, id);

-- +goose Down
DROP INDEX jobs_type_id;
DROP INDEX jobs_state_id;
