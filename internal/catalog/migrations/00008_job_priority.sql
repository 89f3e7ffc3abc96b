-- +goose Up
-- Jobs someone waits for (a cold create's build) are claimed before
-- background ones (spare builds, retirements) queued earlier.
ALTER TABLE jobs ADD COLUMN priority int NOT NULL DEFAULT 0;

-- +goose Down
ALTER TABLE jobs DROP COLUMN priority;
