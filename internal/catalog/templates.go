package catalog

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
)

// Template is a named, versioned schema.
type Template struct {
	Name           string    `json:"name"`
	CurrentVersion int       `json:"current_version"`
	CreatedAt      time.Time `json:"created_at"`
}

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
	CreatedAt time.Time      `json:"created_at"`
	Files     []TemplateFile `json:"files,omitempty"`
}

// TemplateBuild is a version materialised on a cluster.
type TemplateBuild struct {
	Template  string    `json:"template"`
	Version   int       `json:"version"`
	Cluster   string    `json:"cluster"`
	State     string    `json:"state"` // building, ready, failed, retired
	Database  string    `json:"database"`
	Relations int       `json:"relations"`
	SizeBytes int64     `json:"size_bytes"`
	Error     string    `json:"error,omitempty"`
	UpdatedAt time.Time `json:"updated_at"`
}

// VersionChecksum is the checksum of a version: over its files' names and checksums, in order.
func VersionChecksum(files []TemplateFile) string {
	h := sha256.New()
	for _, f := range files {
		fmt.Fprintf(h, "%s\x00%s\n", f.Name, f.Checksum)
	}
	return hex.EncodeToString(h.Sum(nil))
}

// AddTemplateVersion stores a new version of a template (version 1 creates
// the template) in tx and makes it current. It returns the new version.
// create=true fails with ErrConflict if the template exists; create=false
// fails with ErrNotFound if it does not.
func (s *Store) AddTemplateVersion(ctx context.Context, tx pgx.Tx, name string, files []TemplateFile, create bool) (int, error) {
	var current int
	err := tx.QueryRow(ctx, `SELECT current_version FROM templates WHERE name = $1 FOR UPDATE`, name).Scan(&current)
	switch {
	case errors.Is(err, pgx.ErrNoRows) && create:
		if _, err := tx.Exec(ctx, `INSERT INTO templates (name, current_version) VALUES ($1, 0)`, name); err != nil {
			return 0, err
		}
	case errors.Is(err, pgx.ErrNoRows):
		return 0, fmt.Errorf("template %s: %w (create it with `pgtenant template create %s --from DIR`)", name, ErrNotFound, name)
	case err != nil:
		return 0, err
	case create:
		return 0, fmt.Errorf("%w: template %s already exists; add a version with `pgtenant template push %s --from DIR`", ErrConflict, name, name)
	}
	version := current + 1
	if _, err := tx.Exec(ctx, `INSERT INTO template_versions (template, version, checksum) VALUES ($1, $2, $3)`,
		name, version, VersionChecksum(files)); err != nil {
		return 0, err
	}
	for i, f := range files {
		if _, err := tx.Exec(ctx, `INSERT INTO template_files (template, version, seq, name, body, checksum, no_transaction)
			VALUES ($1, $2, $3, $4, $5, $6, $7)`, name, version, i+1, f.Name, f.Body, f.Checksum, f.NoTransaction); err != nil {
			return 0, err
		}
	}
	if _, err := tx.Exec(ctx, `UPDATE templates SET current_version = $2 WHERE name = $1`, name, version); err != nil {
		return 0, err
	}
	return version, nil
}

// Templates lists templates.
func (s *Store) Templates(ctx context.Context) ([]Template, error) {
	rows, err := s.pool.Query(ctx, `SELECT name, current_version, created_at FROM templates ORDER BY name`)
	if err != nil {
		return nil, err
	}
	return pgx.CollectRows(rows, func(r pgx.CollectableRow) (Template, error) {
		var t Template
		return t, r.Scan(&t.Name, &t.CurrentVersion, &t.CreatedAt)
	})
}

// GetTemplate returns one template.
func (s *Store) GetTemplate(ctx context.Context, name string) (Template, error) {
	var t Template
	err := s.pool.QueryRow(ctx, `SELECT name, current_version, created_at FROM templates WHERE name = $1`, name).
		Scan(&t.Name, &t.CurrentVersion, &t.CreatedAt)
	if errors.Is(err, pgx.ErrNoRows) {
		return t, fmt.Errorf("template %q: %w (list templates with `pgtenant template list`)", name, ErrNotFound)
	}
	return t, err
}

// TemplateVersions lists a template's versions with their files (bodies
// included when withBodies).
func (s *Store) TemplateVersions(ctx context.Context, name string, withBodies bool) ([]TemplateVersion, error) {
	rows, err := s.pool.Query(ctx, `SELECT template, version, checksum, created_at FROM template_versions
		WHERE template = $1 ORDER BY version`, name)
	if err != nil {
		return nil, err
	}
	vs, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (TemplateVersion, error) {
		var v TemplateVersion
		return v, r.Scan(&v.Template, &v.Version, &v.Checksum, &v.CreatedAt)
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
	_, err := s.pool.Exec(ctx, `
		INSERT INTO template_builds (template, version, cluster, state, database, relations, size_bytes, error)
		VALUES ($1, $2, $3, $4, $5, $6, $7, $8)
		ON CONFLICT (template, version, cluster) DO UPDATE SET state = $4, database = $5, relations = $6,
			size_bytes = $7, error = $8, updated_at = now()`,
		b.Template, b.Version, b.Cluster, b.State, b.Database, b.Relations, b.SizeBytes, b.Error)
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
