-- +goose Up
-- Reconcile reads the jobs of the tenants it judges and the jobs at work,
-- not the whole history: at a month of jobs in a million-tenant catalog,
-- reading every tenant's jobs twice made a reconcile of one cluster take
-- 8–13 s, and one of all 200 clusters read them 200 times (bench density).
--
-- The jobs not yet finished: what is busy now.
CREATE INDEX jobs_unfinished ON jobs (target) WHERE state IN ('queued', 'running', 'waiting', 'paused');
-- The tenants a job makes besides its target: a fork's or an import's new
-- tenant (args.into), a rewind's copy (data.into).
CREATE INDEX jobs_args_into ON jobs ((args->>'into')) WHERE target_kind = 'tenant';
CREATE INDEX jobs_data_into ON jobs ((data->>'into')) WHERE target_kind = 'tenant';

-- +goose Down
DROP INDEX jobs_data_into;
DROP INDEX jobs_args_into;
DROP INDEX jobs_unfinished;
