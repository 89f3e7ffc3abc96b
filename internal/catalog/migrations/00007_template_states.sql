-- +goose Up
-- A template version is current only once it is built on every cluster; a
-- version whose build failed is recorded failed, with its error, and is never
-- current nor the base of the next push. A template being deleted takes no
-- new tenants, versions or builds.
ALTER TABLE template_versions
    ADD COLUMN state text NOT NULL DEFAULT 'ready' CHECK (state IN ('building', 'ready', 'failed')),
    ADD COLUMN error text NOT NULL DEFAULT ''; -- why it failed: "cluster C: …"
ALTER TABLE template_versions ALTER COLUMN state SET DEFAULT 'building';
ALTER TABLE templates ADD COLUMN deleting boolean NOT NULL DEFAULT false;
COMMENT ON COLUMN templates.current_version IS
    'the newest version built on every cluster: what new tenants get (0: none yet)';

-- Catalogs from before moved current_version to every pushed version, built
-- or not. A version with a failed build that no tenant was built from is
-- failed; current_version goes back to the newest version that is not.
UPDATE template_versions v SET state = 'failed',
    error = (SELECT 'cluster ' || b.cluster || ': ' || b.error FROM template_builds b
             WHERE b.template = v.template AND b.version = v.version AND b.state = 'failed'
             ORDER BY b.cluster LIMIT 1)
WHERE EXISTS (SELECT FROM template_builds b WHERE b.template = v.template AND b.version = v.version AND b.state = 'failed')
  AND NOT EXISTS (SELECT FROM tenants t WHERE t.template = v.template AND t.version = v.version);
UPDATE templates t SET current_version = coalesce(
    (SELECT max(v.version) FROM template_versions v WHERE v.template = t.name AND v.state = 'ready'), 0);
