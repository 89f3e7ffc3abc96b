package catalog

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pgtenant/pgtenant/internal/cluster"
)

// Template is a named, versioned schema.
type Template struct {
	Name string `json:"name"`
	// CurrentVersion is the newest version built on every cluster: what new
	// tenants get and what the next push is compared with (0: none yet).
	CurrentVersion int `json:"current_version"`
	// LatestVersion is the newest version stored, built or not.
	LatestVersion int `json:"latest_version"`
	// Deleting: a delete job is removing it; it takes no new tenants,
	// versions or builds.
	Deleting  bool      `json:"deleting,omitempty"`
	CreatedAt time.Time `json:"created_at"`
}

// VersionState is where a template version is: template_versions.state.
type VersionState string

// States of a template version.
const (
	VersionBuilding VersionState = "building" // not yet built on every cluster
	VersionReady    VersionState = "ready"    // built on every cluster: it is, or was, current
	VersionFailed   VersionState = "failed"   // a build failed: never current, never the base of a push
)

// BuildState is where a version's build on one cluster is:
// template_builds.state.
type BuildState string

// States of a template build.
const (
	BuildBuilding BuildState = "building"
	BuildReady    BuildState = "ready"
	BuildFailed   BuildState = "failed"
)

// TemplateFile is one stored file of a version.
type TemplateFile struct {
	Seq           int    `json:"seq"`
	Name          string `json:"name"`
	Body          string `json:"body,omitempty"`
	Checksum      string `json:"checksum"`
	NoTransaction bool   `json:"no_transaction"`
}

// TemplateVersion is one immutable version.
type TemplateVersion struct {
	Template  string         `json:"template"`
	Version   int            `json:"version"`
	Checksum  string         `json:"checksum"`
	State     VersionState   `json:"state"`
	Error     string         `json:"error,omitempty"` // why it failed: "cluster C: …"
	CreatedAt time.Time      `json:"created_at"`
	Files     []TemplateFile `json:"files,omitempty"`
}

// TemplateBuild is a version materialised on a cluster.
type TemplateBuild struct {
	Template  string     `json:"template"`
	Version   int        `json:"version"`
	Cluster   string     `json:"cluster"`
	State     BuildState `json:"state"`
	Database  string     `json:"database"`
	Relations int        `json:"relations"`
	SizeBytes int64      `json:"size_bytes"`
	Error     string     `json:"error,omitempty"`
	UpdatedAt time.Time  `json:"updated_at"`
}

// VersionChecksum is the checksum of a version: over its files' names and checksums, in order.
func VersionChecksum(files []TemplateFile) string {
	h := sha256.New()
	for _, f := range files {
		fmt.Fprintf(h, "%s\x00%s\n", f.Name, f.Checksum)
	}
	return hex.EncodeToString(h.Sum(nil))
}

// lockTemplate reads a template's versions FOR UPDATE in tx, which
// serialises pushes, deletes and the moves of its current version. The wait
// is bounded: the lock is only ever held by short catalog transactions.
func lockTemplate(ctx context.Context, tx pgx.Tx, name string) (Template, VersionState, error) {
	if _, err := tx.Exec(ctx, `SET LOCAL lock_timeout = '10s'`); err != nil {
		return Template{}, "", err
	}
	var t Template
	var latestState VersionState
	err := tx.QueryRow(ctx, `SELECT name, current_version, deleting, created_at,
			coalesce((SELECT max(version) FROM template_versions WHERE template = $1), 0),
			coalesce((SELECT state FROM template_versions WHERE template = $1 ORDER BY version DESC LIMIT 1), '')
		FROM templates WHERE name = $1 FOR UPDATE`, name).
		Scan(&t.Name, &t.CurrentVersion, &t.Deleting, &t.CreatedAt, &t.LatestVersion, &latestState)
	return t, latestState, err
}

// AddTemplateVersion stores a new version of a template (version 1 creates
// the template) in tx, as building: it becomes current once built on every
// cluster (FinishBuild). base is the version the files were checked against
// (the current one; 0 for none): if another version became current
// meanwhile, it fails with ErrConflict. So does a push while the newest
// version is still being built (the next version must extend it, or, if it
// fails, the current one), or while the template is being deleted.
// create=true fails with ErrConflict if the template exists; create=false
// fails with ErrNotFound if it does not. It returns the new version.
func (s *Store) AddTemplateVersion(ctx context.Context, tx pgx.Tx, name string, files []TemplateFile, create bool, base int) (int, error) {
	t, latestState, err := lockTemplate(ctx, tx, name)
	switch {
	case errors.Is(err, pgx.ErrNoRows) && create:
		if _, err := tx.Exec(ctx, `INSERT INTO templates (name, current_version) VALUES ($1, 0)`, name); err != nil {
			if errors.Is(cluster.Classify(err), cluster.ErrUniqueViolation) {
				return 0, fmt.Errorf("%w: template %s was just created by another request", ErrConflict, name)
			}
			return 0, err
		}
	case errors.Is(err, pgx.ErrNoRows):
		return 0, fmt.Errorf("template %s: %w (create it with `pgtenant template create %s --from DIR`)", name, ErrNotFound, name)
	case err != nil:
		return 0, err
	case t.Deleting:
		return 0, fmt.Errorf("%w: template %s is being deleted (`pgtenant job list --type template.delete --target %s`)", ErrConflict, name, name)
	case create && t.CurrentVersion == 0:
		return 0, fmt.Errorf("%w: template %s already exists, with no version built yet: push a fixed version with `pgtenant template push %s --from DIR`, or delete it with `pgtenant template delete %s`",
			ErrConflict, name, name, name)
	case create:
		return 0, fmt.Errorf("%w: template %s already exists; add a version with `pgtenant template push %s --from DIR`", ErrConflict, name, name)
	case latestState == VersionBuilding:
		return 0, fmt.Errorf("%w: template %s version %d is still being built: wait until it is built or has failed (`pgtenant template show %s`), then push",
			ErrConflict, name, t.LatestVersion, name)
	case t.CurrentVersion != base:
		return 0, fmt.Errorf("%w: template %s version %d became current meanwhile: push again", ErrConflict, name, t.CurrentVersion)
	}
	version := t.LatestVersion + 1
	if _, err := tx.Exec(ctx, `INSERT INTO template_versions (template, version, checksum, state) VALUES ($1, $2, $3, 'building')`,
		name, version, VersionChecksum(files)); err != nil {
		return 0, err
	}
	for i, f := range files {
		if _, err := tx.Exec(ctx, `INSERT INTO template_files (template, version, seq, name, body, checksum, no_transaction)
			VALUES ($1, $2, $3, $4, $5, $6, $7)`, name, version, i+1, f.Name, f.Body, f.Checksum, f.NoTransaction); err != nil {
			return 0, err
		}
	}
	return version, nil
}

const templateColumns = `name, current_version,
	coalesce((SELECT max(v.version) FROM template_versions v WHERE v.template = templates.name), 0), deleting, created_at`

func scanTemplate(row pgx.Row) (Template, error) {
	var t Template
	return t, row.Scan(&t.Name, &t.CurrentVersion, &t.LatestVersion, &t.Deleting, &t.CreatedAt)
}

// MarkTemplateDeleting marks a template as being deleted, in tx, if it has
// no tenants: spares do not count (they go with it), tenants being purged
// neither (their purge ends them), every other state does (provisioning,
// active, suspended and dropped, which may be restored). With tenants it
// fails with ErrConflict naming how many and in which states. Marking a
// template being deleted again is not an error.
func (s *Store) MarkTemplateDeleting(ctx context.Context, tx pgx.Tx, name string) error {
	_, _, err := lockTemplate(ctx, tx, name)
	if errors.Is(err, pgx.ErrNoRows) {
		return fmt.Errorf("template %q: %w (list templates with `pgtenant template list`)", name, ErrNotFound)
	}
	if err != nil {
		return err
	}
	rows, err := tx.Query(ctx, `SELECT state, count(*) FROM tenants
		WHERE template = $1 AND state IN ('provisioning', 'active', 'suspended', 'dropped') GROUP BY state ORDER BY state`, name)
	if err != nil {
		return err
	}
	var n int
	var states []string
	for rows.Next() {
		var state string
		var c int
		if err := rows.Scan(&state, &c); err != nil {
			rows.Close()
			return err
		}
		n += c
		states = append(states, fmt.Sprintf("%d %s", c, state))
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return err
	}
	if n > 0 {
		plural, them := "s", "them"
		if n == 1 {
			plural, them = "", "it"
		}
		return fmt.Errorf("%w: template %s has %d tenant%s (%s): drop and purge %s first (`pgtenant tenant list --template %s`, `pgtenant tenant drop ID --purge-now`)",
			ErrConflict, name, n, plural, strings.Join(states, ", "), them, name)
	}
	_, err = tx.Exec(ctx, `UPDATE templates SET deleting = true WHERE name = $1`, name)
	return err
}

// TemplateTenants lists every tenant row of a template, spares included.
func (s *Store) TemplateTenants(ctx context.Context, template string) ([]Tenant, error) {
	rows, err := s.pool.Query(ctx, `SELECT `+tenantColumns+` FROM tenants WHERE template = $1 ORDER BY id`, template)
	if err != nil {
		return nil, err
	}
	return pgx.CollectRows(rows, func(r pgx.CollectableRow) (Tenant, error) { return scanTenant(r) })
}

// DeleteTemplate removes a template's rows: its versions, files, builds and
// rollouts go with it. Its tenants must be gone (the foreign key says so).
func (s *Store) DeleteTemplate(ctx context.Context, name string) error {
	_, err := s.pool.Exec(ctx, `DELETE FROM templates WHERE name = $1`, name)
	return err
}

// Templates lists templates.
func (s *Store) Templates(ctx context.Context) ([]Template, error) {
	rows, err := s.pool.Query(ctx, `SELECT `+templateColumns+` FROM templates ORDER BY name`)
	if err != nil {
		return nil, err
	}
	return pgx.CollectRows(rows, func(r pgx.CollectableRow) (Template, error) { return scanTemplate(r) })
}

// GetTemplate returns one template.
func (s *Store) GetTemplate(ctx context.Context, name string) (Template, error) {
	t, err := scanTemplate(s.pool.QueryRow(ctx, `SELECT `+templateColumns+` FROM templates WHERE name = $1`, name))
	if errors.Is(err, pgx.ErrNoRows) {
		return t, fmt.Errorf("template %q: %w (list templates with `pgtenant template list`)", name, ErrNotFound)
	}
	return t, err
}

// TemplateVersions lists a template's versions with their files (bodies
// included when withBodies).
func (s *Store) TemplateVersions(ctx context.Context, name string, withBodies bool) ([]TemplateVersion, error) {
	rows, err := s.pool.Query(ctx, `SELECT template, version, checksum, state, error, created_at FROM template_versions
		WHERE template = $1 ORDER BY version`, name)
	if err != nil {
		return nil, err
	}
	vs, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (TemplateVersion, error) {
		var v TemplateVersion
		return v, r.Scan(&v.Template, &v.Version, &v.Checksum, &v.State, &v.Error, &v.CreatedAt)
	})
	if err != nil {
		return nil, err
	}
	for i := range vs {
		if vs[i].Files, err = s.TemplateFiles(ctx, name, vs[i].Version, withBodies); err != nil {
			return nil, err
		}
	}
	return vs, nil
}

// GetVersion returns one version, without its files.
func (s *Store) GetVersion(ctx context.Context, template string, version int) (TemplateVersion, error) {
	var v TemplateVersion
	err := s.pool.QueryRow(ctx, `SELECT template, version, checksum, state, error, created_at FROM template_versions
		WHERE template = $1 AND version = $2`, template, version).
		Scan(&v.Template, &v.Version, &v.Checksum, &v.State, &v.Error, &v.CreatedAt)
	return v, notFound(err, fmt.Sprintf("template %s version %d", template, version))
}

// TemplateFiles returns the files of one version, in order.
func (s *Store) TemplateFiles(ctx context.Context, name string, version int, withBodies bool) ([]TemplateFile, error) {
	rows, err := s.pool.Query(ctx, `SELECT seq, name, CASE WHEN $3 THEN body ELSE '' END, checksum, no_transaction
		FROM template_files WHERE template = $1 AND version = $2 ORDER BY seq`, name, version, withBodies)
	if err != nil {
		return nil, err
	}
	files, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (TemplateFile, error) {
		var f TemplateFile
		return f, r.Scan(&f.Seq, &f.Name, &f.Body, &f.Checksum, &f.NoTransaction)
	})
	if err == nil && len(files) == 0 {
		return nil, fmt.Errorf("template %s version %d: %w", name, version, ErrNotFound)
	}
	return files, err
}

// UpsertBuild records the state of a template build.
func (s *Store) UpsertBuild(ctx context.Context, b TemplateBuild) error {
	return upsertBuild(ctx, s.pool, b)
}

func upsertBuild(ctx context.Context, q Querier, b TemplateBuild) error {
	_, err := q.Exec(ctx, `
		INSERT INTO template_builds (template, version, cluster, state, database, relations, size_bytes, error)
		VALUES ($1, $2, $3, $4, $5, $6, $7, $8)
		ON CONFLICT (template, version, cluster) DO UPDATE SET state = $4, database = $5, relations = $6,
			size_bytes = $7, error = $8, updated_at = now()`,
		b.Template, b.Version, b.Cluster, b.State, b.Database, b.Relations, b.SizeBytes, b.Error)
	return err
}

// FinishBuild records a version built on a cluster (state ready) and, in
// the same transaction, makes the version current when it is now built on
// every registered cluster and is the template's newest version (a failed
// version superseded by a later push never becomes current, even if a retry
// of its build succeeds). It reports whether the version became current.
func (s *Store) FinishBuild(ctx context.Context, b TemplateBuild) (current bool, err error) {
	b.State = BuildReady
	err = pgx.BeginFunc(ctx, s.pool, func(tx pgx.Tx) error {
		t, _, err := lockTemplate(ctx, tx, b.Template)
		if errors.Is(err, pgx.ErrNoRows) {
			return fmt.Errorf("template %s: %w", b.Template, ErrNotFound)
		}
		if err != nil {
			return err
		}
		if err := upsertBuild(ctx, tx, b); err != nil {
			return err
		}
		if b.Version <= t.CurrentVersion || b.Version != t.LatestVersion {
			return nil
		}
		var everywhere bool
		if err := tx.QueryRow(ctx, `SELECT NOT EXISTS (SELECT FROM clusters c WHERE NOT EXISTS (
				SELECT FROM template_builds b WHERE b.template = $1 AND b.version = $2 AND b.cluster = c.name AND b.state = 'ready'))`,
			b.Template, b.Version).Scan(&everywhere); err != nil || !everywhere {
			return err
		}
		if _, err := tx.Exec(ctx, `UPDATE template_versions SET state = 'ready', error = '' WHERE template = $1 AND version = $2`,
			b.Template, b.Version); err != nil {
			return err
		}
		_, err = tx.Exec(ctx, `UPDATE templates SET current_version = $2 WHERE name = $1`, b.Template, b.Version)
		current = err == nil
		return err
	})
	return current, err
}

// FailBuild records a failed build with its error and, when its version
// was still being built, marks the version failed with the same error
// (prefixed with the cluster). A version that is (or was) current stays
// ready: only its build on that cluster failed. A template that is gone has
// nothing to record.
func (s *Store) FailBuild(ctx context.Context, b TemplateBuild) error {
	b.State = BuildFailed
	return pgx.BeginFunc(ctx, s.pool, func(tx pgx.Tx) error {
		if _, _, err := lockTemplate(ctx, tx, b.Template); errors.Is(err, pgx.ErrNoRows) {
			return nil
		} else if err != nil {
			return err
		}
		var exists bool
		if err := tx.QueryRow(ctx, `SELECT EXISTS (SELECT FROM template_versions WHERE template = $1 AND version = $2)`,
			b.Template, b.Version).Scan(&exists); err != nil || !exists {
			return err
		}
		if err := upsertBuild(ctx, tx, b); err != nil {
			return err
		}
		_, err := tx.Exec(ctx, `UPDATE template_versions SET state = 'failed', error = $3
			WHERE template = $1 AND version = $2 AND state = 'building'`, b.Template, b.Version, "cluster "+b.Cluster+": "+b.Error)
		return err
	})
}

// DeleteBuilds forgets every build of a template on a cluster.
func (s *Store) DeleteBuilds(ctx context.Context, template, cluster string) error {
	_, err := s.pool.Exec(ctx, `DELETE FROM template_builds WHERE template = $1 AND cluster = $2`, template, cluster)
	return err
}

// DeleteBuild forgets the build of a version on a cluster.
func (s *Store) DeleteBuild(ctx context.Context, template string, version int, cluster string) error {
	_, err := s.pool.Exec(ctx, `DELETE FROM template_builds WHERE template = $1 AND version = $2 AND cluster = $3`, template, version, cluster)
	return err
}

// GetBuild returns the build of a version on a cluster.
func (s *Store) GetBuild(ctx context.Context, template string, version int, cluster string) (TemplateBuild, error) {
	var b TemplateBuild
	err := s.pool.QueryRow(ctx, `SELECT template, version, cluster, state, database, relations, size_bytes, error, updated_at
		FROM template_builds WHERE template = $1 AND version = $2 AND cluster = $3`, template, version, cluster).
		Scan(&b.Template, &b.Version, &b.Cluster, &b.State, &b.Database, &b.Relations, &b.SizeBytes, &b.Error, &b.UpdatedAt)
	return b, notFound(err, fmt.Sprintf("template %s version %d on cluster %s", template, version, cluster))
}

// NewestReadyVersion is the newest version of a template that is ready
// (built on every cluster) and whose build on cluster is ready; nil if
// none is.
func (s *Store) NewestReadyVersion(ctx context.Context, template, cluster string) (*int, error) {
	var v *int
	err := s.pool.QueryRow(ctx, `SELECT max(b.version) FROM template_builds b
		JOIN template_versions v ON v.template = b.template AND v.version = b.version
		WHERE b.template = $1 AND b.cluster = $2 AND b.state = 'ready' AND v.state = 'ready'`, template, cluster).Scan(&v)
	return v, err
}

// Builds lists builds, optionally of one template.
func (s *Store) Builds(ctx context.Context, template string) ([]TemplateBuild, error) {
	rows, err := s.pool.Query(ctx, `SELECT template, version, cluster, state, database, relations, size_bytes, error, updated_at
		FROM template_builds WHERE $1 = '' OR template = $1 ORDER BY template, version, cluster`, template)
	if err != nil {
		return nil, err
	}
	return pgx.CollectRows(rows, func(r pgx.CollectableRow) (TemplateBuild, error) {
		var b TemplateBuild
		return b, r.Scan(&b.Template, &b.Version, &b.Cluster, &b.State, &b.Database, &b.Relations, &b.SizeBytes, &b.Error, &b.UpdatedAt)
	})
}

// Begin starts a catalog transaction.
func (s *Store) Begin(ctx context.Context) (pgx.Tx, error) { return s.pool.Begin(ctx) }
