// Package templates owns template versions (SQL files stored immutably in
// the catalog; a version is current once built on every cluster, failed if a
// build failed) and their materialisation on clusters: a template database
// per (version, cluster), built in lock-bounded batches by a durable job, and
// a shared database per (template, cluster) that holds schema-mode tenants;
// and the delete job that removes a template without tenants. It also
// applies template files to a connection (Apply), for the builders of spares
// and for migrations. It never touches a claimed tenant: a deleted
// template's spares go through the purge job (SparePurger).
package templates

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"regexp"
	"sort"
	"strconv"
	"strings"

	"github.com/pgtenant/pgtenant/internal/catalog"
	"github.com/pgtenant/pgtenant/internal/cluster"
	"github.com/pgtenant/pgtenant/internal/config"
	"github.com/pgtenant/pgtenant/internal/jobs"
)

// Physical names of template objects on a cluster.
const (
	// OwnerRole owns the objects of template databases; a tenant's copy gets
	// them reassigned to the tenant's role. It owns no database, so
	// REASSIGN OWNED in a tenant database touches that database only.
	OwnerRole = "pgt_template_owner"
	// prefix of every database pgtenant makes that is not a tenant.
	dbPrefix = "pgt_"
)

// DatabaseName is the template database of a version.
func DatabaseName(template string, version int) string {
	return fmt.Sprintf("%stpl_%s_v%d", dbPrefix, template, version)
}

// SharedDatabase holds a template's schema-mode tenants on a cluster.
func SharedDatabase(template string) string { return dbPrefix + "shared_" + template }

// ParseDatabaseName returns the template (and, for a template database,
// the version) a template or shared database's name carries; ok is false
// for other names.
func ParseDatabaseName(db string) (template string, version int, ok bool) {
	if m := templateDBRE.FindStringSubmatch(db); m != nil {
		v, err := strconv.Atoi(m[2])
		return m[1], v, err == nil && v > 0 && ValidName(m[1]) == nil
	}
	if name, found := strings.CutPrefix(db, SharedDatabase("")); found && ValidName(name) == nil {
		return name, 0, true
	}
	return "", 0, false
}

// templateDBRE matches DatabaseName: the version is the last _v<N>.
var templateDBRE = regexp.MustCompile(`^pgt_tpl_([a-z][a-z0-9_]*)_v([0-9]+)$`)

// BuildDatabase is the scratch database a build job fills before it is
// renamed to the template database; a failed build is dropped, never used.
func BuildDatabase(jobID int64) string { return fmt.Sprintf("%sbuild_%d", dbPrefix, jobID) }

var nameRE = regexp.MustCompile(`^[a-z][a-z0-9_]{0,30}$`)

// ValidName checks a template name.
func ValidName(name string) error {
	if !nameRE.MatchString(name) {
		return fmt.Errorf("template name %q: use lowercase letters, digits and _, starting with a letter, at most 31 characters", name)
	}
	return nil
}

// Service manages templates.
type Service struct {
	Store    *catalog.Store
	Clusters *cluster.Registry
	Runner   *jobs.Runner
	// Provision: builds take its batch lock budget.
	Provision config.ProvisionConfig
	Logger    *slog.Logger
	// Spares purges a deleted template's spares (purge.Service).
	Spares SparePurger
}

// Upload is a set of files as a client sends them.
type Upload struct {
	Name string `json:"name"`
	Body string `json:"body"`
}

// ParseUpload validates and parses uploaded files: names like 0001_init.sql,
// sorted by name.
func ParseUpload(files []Upload) ([]File, error) {
	if len(files) == 0 {
		return nil, fmt.Errorf("no .sql files: a template version is an ordered set of files such as 0001_init.sql")
	}
	sort.Slice(files, func(i, j int) bool { return files[i].Name < files[j].Name })
	out := make([]File, 0, len(files))
	for i, u := range files {
		if !strings.HasSuffix(u.Name, ".sql") || strings.ContainsAny(u.Name, "/\\\x00") {
			return nil, fmt.Errorf("file %q: template files are .sql files in one directory", u.Name)
		}
		if i > 0 && files[i-1].Name == u.Name {
			return nil, fmt.Errorf("file %q given twice", u.Name)
		}
		f, err := ParseFile(u.Name, u.Body)
		if err != nil {
			return nil, err
		}
		if len(f.Statements) == 0 {
			return nil, fmt.Errorf("file %q has no statements in its Up section", u.Name)
		}
		out = append(out, f)
	}
	return out, nil
}

func toCatalog(files []File) []catalog.TemplateFile {
	out := make([]catalog.TemplateFile, len(files))
	for i, f := range files {
		out[i] = catalog.TemplateFile{Seq: i + 1, Name: f.Name, Body: f.Body, Checksum: f.Checksum, NoTransaction: f.NoTransaction}
	}
	return out
}

// FromCatalog parses stored files.
func FromCatalog(files []catalog.TemplateFile) ([]File, error) {
	out := make([]File, len(files))
	for i, cf := range files {
		f, err := ParseFile(cf.Name, cf.Body)
		if err != nil {
			return nil, err
		}
		out[i] = f
	}
	return out, nil
}

// Added is the answer to Create and Push.
type Added struct {
	Template  string     `json:"template"`
	Version   int        `json:"version"`
	BuildJobs []jobs.Job `json:"build_jobs"`
}

// Create stores version 1 of a new template and starts building it on every cluster.
func (s *Service) Create(ctx context.Context, name string, upload []Upload) (Added, error) {
	return s.add(ctx, name, upload, true)
}

// Push stores the next version of a template. The current version's files
// (the last version built on every cluster) must all be there unchanged: a
// version is immutable, and changes are new files. A version that failed to
// build is never the base: its files may be replaced. Something must be new.
func (s *Service) Push(ctx context.Context, name string, upload []Upload) (Added, error) {
	return s.add(ctx, name, upload, false)
}

// ErrInvalid wraps input errors (bad files, immutability violations).
var ErrInvalid = fmt.Errorf("invalid template")

func (s *Service) add(ctx context.Context, name string, upload []Upload, create bool) (Added, error) {
	if err := ValidName(name); err != nil {
		return Added{}, fmt.Errorf("%w: %v", ErrInvalid, err)
	}
	files, err := ParseUpload(upload)
	if err != nil {
		return Added{}, fmt.Errorf("%w: %v", ErrInvalid, err)
	}
	base := 0
	if !create {
		if base, err = s.checkAppendOnly(ctx, name, files); err != nil {
			return Added{}, err
		}
	}
	tx, err := s.Store.Begin(ctx)
	if err != nil {
		return Added{}, err
	}
	defer tx.Rollback(context.WithoutCancel(ctx))
	version, err := s.Store.AddTemplateVersion(ctx, tx, name, toCatalog(files), create, base)
	if err != nil {
		return Added{}, err
	}
	out := Added{Template: name, Version: version}
	for _, cl := range s.Clusters.All() {
		j, err := s.enqueueBuild(ctx, tx, name, version, cl.Name())
		if err != nil {
			return Added{}, err
		}
		out.BuildJobs = append(out.BuildJobs, j)
	}
	if err := tx.Commit(ctx); err != nil {
		return Added{}, err
	}
	s.Runner.Poke()
	return out, nil
}

// checkAppendOnly checks pushed files against the template's current
// version and returns that version (0 when no version has built yet: then
// any files will do, as for a create).
func (s *Service) checkAppendOnly(ctx context.Context, name string, files []File) (int, error) {
	t, err := s.Store.GetTemplate(ctx, name)
	if err != nil {
		return 0, err
	}
	base := t.CurrentVersion
	if base == 0 {
		return 0, nil
	}
	prev, err := s.Store.TemplateFiles(ctx, name, base, false)
	if err != nil {
		return 0, err
	}
	byName := map[string]File{}
	for _, f := range files {
		byName[f.Name] = f
	}
	for _, p := range prev {
		f, ok := byName[p.Name]
		switch {
		case !ok:
			return 0, fmt.Errorf("%w: %s of version %d (the current version) is missing; versions only add files", ErrInvalid, p.Name, base)
		case f.Checksum != p.Checksum:
			return 0, fmt.Errorf("%w: %s changed since version %d (the current version); a version is immutable: add a new file (e.g. %04d_change.sql) instead",
				ErrInvalid, p.Name, base, len(prev)+1)
		}
	}
	if len(files) == len(prev) {
		return 0, fmt.Errorf("%w: nothing new since version %d (the current version)", catalog.ErrConflict, base)
	}
	last := prev[len(prev)-1].Name
	for _, f := range files[len(prev):] {
		if f.Name <= last {
			return 0, fmt.Errorf("%w: new file %s sorts before %s of version %d (the current version); name new files so they sort last",
				ErrInvalid, f.Name, last, base)
		}
	}
	return base, nil
}

// errDeleting refuses work on a template that is being deleted.
func errDeleting(name string) error {
	return fmt.Errorf("%w: template %s is being deleted", catalog.ErrConflict, name)
}

// EnsureBuild starts the build of a version on a cluster unless it is
// ready, failed (an operator retries the failed job) or being built. It
// returns whether a job was started. A template being deleted is refused.
func (s *Service) EnsureBuild(ctx context.Context, template string, version int, clusterName string) (bool, error) {
	b, err := s.Store.GetBuild(ctx, template, version, clusterName)
	if err == nil && (b.State == catalog.BuildReady || b.State == catalog.BuildFailed) {
		return false, nil
	}
	if err != nil && !errors.Is(err, catalog.ErrNotFound) {
		return false, err
	}
	if t, err := s.Store.GetTemplate(ctx, template); err != nil {
		return false, err
	} else if t.Deleting {
		return false, errDeleting(template)
	}
	_, err = s.enqueueBuild(ctx, s.Store.Pool(), template, version, clusterName)
	return err == nil, err
}

// Rebuild forgets a build and starts it again (its template database is gone).
func (s *Service) Rebuild(ctx context.Context, template string, version int, clusterName string) error {
	if t, err := s.Store.GetTemplate(ctx, template); err != nil {
		return err
	} else if t.Deleting {
		return errDeleting(template)
	}
	if err := s.Store.DeleteBuild(ctx, template, version, clusterName); err != nil {
		return err
	}
	_, err := s.enqueueBuild(ctx, s.Store.Pool(), template, version, clusterName)
	return err
}

func (s *Service) enqueueBuild(ctx context.Context, q catalog.Querier, template string, version int, clusterName string) (jobs.Job, error) {
	return s.Runner.Enqueue(ctx, q, jobs.Spec{
		Type: jobs.TemplateBuild, Key: fmt.Sprintf("build:%s:%d:%s", template, version, clusterName),
		TargetKind: "template", Target: template, Cluster: clusterName,
		Args: buildArgs{Template: template, Version: version, Cluster: clusterName},
	})
}

// ProvisionVersion is the version new tenants of a template get on a
// cluster: the newest version built on every cluster (the current one, or
// an older one while the current one is being built on this cluster). A
// version that failed anywhere is never handed out. ErrNotFound if none is
// materialised here yet.
func (s *Service) ProvisionVersion(ctx context.Context, template, clusterName string) (int, error) {
	v, err := s.Store.NewestReadyVersion(ctx, template, clusterName)
	if err != nil {
		return 0, err
	}
	if v == nil {
		return 0, fmt.Errorf("template %s has no version materialised on cluster %s yet: %w", template, clusterName, catalog.ErrNotFound)
	}
	return *v, nil
}

// Wanted is the version a cluster must build so that new tenants can be
// made: the current version, or, before any version has built everywhere,
// the newest one. When that one failed, the error says why (ErrConflict,
// with the build's error and what to do).
func (s *Service) Wanted(ctx context.Context, template string) (int, error) {
	t, err := s.Store.GetTemplate(ctx, template)
	if err != nil {
		return 0, err
	}
	if t.Deleting {
		return 0, errDeleting(template)
	}
	if t.CurrentVersion > 0 {
		return t.CurrentVersion, nil
	}
	return t.LatestVersion, s.Failed(ctx, template, t.LatestVersion)
}

// Failed returns an error carrying the build error of a version that
// failed (ErrConflict), nil for one that did not.
func (s *Service) Failed(ctx context.Context, template string, version int) error {
	v, err := s.Store.GetVersion(ctx, template, version)
	if err != nil || v.State != catalog.VersionFailed {
		return err
	}
	return fmt.Errorf("%w: template %s version %d failed to build on %s (fix the files and push a new version: `pgtenant template push %s --from DIR`; `pgtenant template show %s` lists failed versions)",
		catalog.ErrConflict, template, version, v.Error, template, template)
}

// Files returns the parsed files of a version.
func (s *Service) Files(ctx context.Context, template string, version int) ([]File, error) {
	cf, err := s.Store.TemplateFiles(ctx, template, version, true)
	if err != nil {
		return nil, err
	}
	return FromCatalog(cf)
}
