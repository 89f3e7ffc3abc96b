-- +goose Up
-- A tenant's allowlist: the client networks (CIDR) its logins may come
-- from through the front door (the pooler's HBA lines). Empty: any.
ALTER TABLE tenants ADD COLUMN allow_cidrs text[] NOT NULL DEFAULT '{}';

-- +goose Down
ALTER TABLE tenants DROP COLUMN allow_cidrs;
