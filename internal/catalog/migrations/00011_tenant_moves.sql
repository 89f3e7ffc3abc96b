-- +goose Up
-- A tenant moved to another cluster keeps its DSN: the pooler it connected
-- through (its front door) keeps its entry, pointed at the cluster the
-- tenant lives on now. front is that pooler's cluster; NULL is the tenant's
-- own cluster (every tenant that never moved).
ALTER TABLE tenants ADD COLUMN front text REFERENCES clusters (name);

-- +goose Down
ALTER TABLE tenants DROP COLUMN front;
