package move

import (
	"archive/tar"
	"cmp"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"

	"github.com/jackc/pgx/v5"

	"github.com/pgtenant/pgtenant/internal/backup"
	"github.com/pgtenant/pgtenant/internal/catalog"
	"github.com/pgtenant/pgtenant/internal/cluster"
	"github.com/pgtenant/pgtenant/internal/config"
	"github.com/pgtenant/pgtenant/internal/fleet"
	"github.com/pgtenant/pgtenant/internal/jobs"
	"github.com/pgtenant/pgtenant/internal/provision"
	"github.com/pgtenant/pgtenant/internal/tenant"
)

// An import makes a new tenant from an archive (export.go). The request
// checks the archive (its manifest, the dump's checksum, the template
// version it needs), makes the tenant, locked, and keeps the dump in the
// catalog as a large object, so that whichever daemon claims the job
// reads it. The job then loads the dump into a scratch instance of its
// own (initdb'd, on a free loopback port) as an unprivileged role that
// owns the scratch database: the archive comes from outside, and every
// statement in it, a tenant's function included, runs there without
// privilege. From that scratch instance the tenant is copied into the new
// tenant as a fork is (copyScratch: in the new tenant's agent session as
// its role), and the rows copied are checked against the manifest's
// before the commit.

// ImportRequest says where an import goes.
type ImportRequest struct {
	Cluster string  // "": placement chooses
	Tier    string  // "": the default tier
	Name    *string // nil: the archive's tenant's name
}

// importArgs are an import job's.
type importArgs struct {
	Into string `json:"into"`
	// Object is the large object in the catalog that holds the dump.
	Object   uint32   `json:"object"`
	Manifest Manifest `json:"manifest"`
}

// maxManifest bounds the manifest an import reads.
const maxManifest = 16 << 20

// ReadArchive reads an archive from r: its manifest, checked, and its dump
// into a temporary file (the caller removes it) whose checksum is checked.
// A dump of more than maxDump bytes (0: no bound but the disk) is refused
// before it is read.
func ReadArchive(r io.Reader, maxDump int64) (Manifest, *os.File, error) {
	bad := func(format string, args ...any) error {
		return fmt.Errorf("%w: %w: %s", provision.ErrInvalid, ErrBadArchive, fmt.Sprintf(format, args...))
	}
	var m Manifest
	tr := tar.NewReader(r)
	h, err := tr.Next()
	if err != nil || h.Name != manifestFile {
		return m, nil, bad("it does not start with %s (made by `pgtenant tenant export`?)", manifestFile)
	}
	b, err := io.ReadAll(io.LimitReader(tr, maxManifest))
	if err != nil {
		return m, nil, bad("read %s: %v", manifestFile, err)
	}
	if err := json.Unmarshal(b, &m); err != nil {
		return m, nil, bad("%s: %v", manifestFile, err)
	}
	if err := checkManifest(m); err != nil {
		return m, nil, err
	}
	if h, err = tr.Next(); err != nil || h.Name != dumpFile {
		return m, nil, bad("its second file is not %s", dumpFile)
	}
	if maxDump > 0 && m.Files[0].Bytes > maxDump {
		return m, nil, fmt.Errorf("%w: the archive's dump has %s, more than the storage quota of the tier it would go into (%s): the tenant would be over its quota at once; import it into a tier with a larger storage_quota (--tier)",
			catalog.ErrConflict, config.ByteSize(m.Files[0].Bytes).Human(), config.ByteSize(maxDump).Human())
	}
	if err := roomFor(m.Files[0].Bytes); err != nil {
		return m, nil, err
	}
	f, err := os.CreateTemp("", "pgtenant-import-*.dump")
	if err != nil {
		return m, nil, err
	}
	sum := sha256.New()
	// No more than the manifest says: a longer dump is a damaged archive,
	// not a way to fill the disk.
	n, err := io.Copy(io.MultiWriter(f, sum), io.LimitReader(tr, m.Files[0].Bytes+1))
	if err == nil {
		if got := hex.EncodeToString(sum.Sum(nil)); n != m.Files[0].Bytes || got != m.Files[0].SHA256 {
			err = bad("%s has %d bytes with sha256 %s; the manifest says %d bytes with sha256 %s: the archive is damaged",
				dumpFile, n, got, m.Files[0].Bytes, m.Files[0].SHA256)
		}
	}
	if err != nil {
		f.Close()
		return m, nil, errors.Join(err, os.Remove(f.Name()))
	}
	return m, f, nil
}

// Import checks an archive read from r, makes its new tenant, locked until
// the job it starts has copied the archive into it, and returns the new
// tenant's credentials, as a create does.
func (s *Service) Import(ctx context.Context, r io.Reader, req ImportRequest) (provision.Created, jobs.Job, error) {
	req.Tier = cmp.Or(req.Tier, "default")
	// The upload's bound: the dump, compressed, is no larger than the
	// tenant it makes, which the tier's quota (when set) caps.
	m, f, err := ReadArchive(r, int64(s.Provision.Tiers[req.Tier].StorageQuota))
	if err != nil {
		return provision.Created{}, jobs.Job{}, err
	}
	defer os.Remove(f.Name())
	defer f.Close()
	v, err := s.Store.GetVersion(ctx, m.Template, m.Version)
	if errors.Is(err, catalog.ErrNotFound) {
		return provision.Created{}, jobs.Job{}, fmt.Errorf("%w: the archive's tenant is at version %d of template %s, which this installation has not got: push the template's versions up to %d first (`pgtenant template push %s DIR`)",
			catalog.ErrConflict, m.Version, m.Template, m.Version, m.Template)
	}
	if err != nil {
		return provision.Created{}, jobs.Job{}, err
	}
	if v.Checksum != m.TemplateChecksum {
		return provision.Created{}, jobs.Job{}, fmt.Errorf("%w: version %d of template %s differs here from the archive's (checksum %s, the archive's %s): its rollouts would not fit the tenant; import into an installation whose template has the same versions",
			catalog.ErrConflict, m.Version, m.Template, v.Checksum, m.TemplateChecksum)
	}
	if err := s.extensionsAllowed(m.Extensions, req.Tier); err != nil {
		return provision.Created{}, jobs.Job{}, err
	}
	name := req.Name
	if name == nil && m.Name != "" {
		name = &m.Name
	}
	c, err := s.createLocked(ctx, provision.Request{Template: m.Template, Mode: m.Mode, Name: name, Tier: req.Tier, Cluster: req.Cluster})
	if err != nil {
		return c, jobs.Job{}, err
	}
	var j jobs.Job
	err = pgx.BeginFunc(ctx, s.Store.Pool(), func(tx pgx.Tx) error {
		lo := tx.LargeObjects()
		oid, err := lo.Create(ctx, 0)
		if err != nil {
			return err
		}
		obj, err := lo.Open(ctx, oid, pgx.LargeObjectModeWrite)
		if err != nil {
			return err
		}
		if _, err := f.Seek(0, io.SeekStart); err != nil {
			return err
		}
		if _, err := io.Copy(obj, f); err != nil {
			return fmt.Errorf("keep the archive in the catalog: %w", err)
		}
		a := importArgs{Into: c.Tenant.ID, Object: oid, Manifest: m}
		j, err = s.Runner.Enqueue(ctx, tx, jobs.Spec{Type: jobs.TenantImport, Key: "import:" + c.Tenant.ID, TargetKind: "tenant",
			Target: c.Tenant.ID, Cluster: c.Tenant.Cluster, Args: a, MaxAttempts: 5})
		if err != nil {
			return err
		}
		return s.Store.AddEvent(ctx, tx, c.Tenant.ID, "import_started", map[string]any{"from": m.Tenant, "exported_at": m.ExportedAt,
			"source_cluster": m.Cluster, "version": m.Version, "job": j.ID})
	})
	if err != nil {
		return c, j, err
	}
	c.Tenant, err = s.Store.GetTenant(ctx, nil, c.Tenant.ID)
	return c, j, err
}

// ImportHandler runs imports.
func (s *Service) ImportHandler() jobs.Handler {
	im := func(j *jobs.Job) (*importer, error) {
		var a importArgs
		if err := j.DecodeArgs(&a); err != nil {
			return nil, err
		}
		return &importer{s: s, a: a}, nil
	}
	return jobs.Handler{
		Steps: func(j *jobs.Job) ([]jobs.Step, error) {
			i, err := im(j)
			if err != nil {
				return nil, err
			}
			return []jobs.Step{
				{Name: "copy", Run: step("copy", i.load, i.copy), Doing: "loading the archive into a scratch instance and copying it"},
				{Name: "finish", Run: step("finish", i.load, i.finish)},
			}, nil
		},
		Cleanup: func(ctx context.Context, r *jobs.Run) error {
			i, err := im(r.Job)
			if err != nil {
				return err
			}
			return i.cleanup(ctx, r)
		},
	}
}

type importer struct {
	s *Service
	a importArgs
}

type ienv struct {
	into catalog.Tenant
	cl   *cluster.Cluster
}

func (i *importer) load(ctx context.Context, _ *jobs.Run) (*ienv, error) {
	e := &ienv{}
	var err error
	if e.into, err = i.s.Store.GetTenant(ctx, nil, i.a.Into); err != nil {
		return nil, err
	}
	if e.cl, err = i.s.Clusters.Get(e.into.Cluster); err != nil {
		return nil, err
	}
	return e, nil
}

// scratchDir is where an import's scratch instance lives: under the
// system's temporary directory ($TMPDIR), which the servers' OS user
// can traverse.
func (i *importer) scratchDir(r *jobs.Run) string {
	return filepath.Join(os.TempDir(), "pgtenant-scratch", fmt.Sprintf("import-%d", r.Job.ID))
}

// copy reads the dump out of the catalog, loads it into a scratch
// instance as an unprivileged role, and copies it from there into the new
// tenant. Run again, it starts over.
func (i *importer) copy(ctx context.Context, r *jobs.Run, e *ienv) error {
	m := i.a.Manifest
	r.Progress(ctx, 0, 1, "reading the archive out of the catalog")
	f, err := i.readObject(ctx)
	if err != nil {
		return err
	}
	defer os.Remove(f.Name())
	defer f.Close()
	dir := i.scratchDir(r)
	if err := removeScratch(ctx, dir); err != nil {
		return err
	}
	defer removeScratch(context.WithoutCancel(ctx), dir)
	r.Progress(ctx, 0, 1, "making a scratch instance")
	sc, err := loadScratch(ctx, dir, f.Name())
	if err != nil {
		return err
	}
	if err := crashPoint(ctx, "import:loaded"); err != nil {
		return err
	}
	sconn, err := cluster.ConnectDSN(ctx, sc.PrimaryDSN(scratchDB), "")
	if err != nil {
		return fmt.Errorf("connect to the scratch instance: %w", cluster.Classify(err))
	}
	defer sconn.Close(context.WithoutCancel(ctx))
	if m.Mode == tenant.ModeDatabase {
		exts, err := extraExtensions(ctx, sconn)
		if err != nil {
			return err
		}
		if err := i.s.extensionsAllowed(exts, e.into.Tier); err != nil {
			return jobs.Permanent(fmt.Errorf("%w: %w", ErrBadArchive, err))
		}
	}
	from, to := tenant.PhysicalName(m.Tenant), tenant.PhysicalName(e.into.ID)
	if m.Mode == tenant.ModeSchema {
		if err := renameSchema(ctx, sconn, from, to); err != nil {
			return err
		}
	}
	// Each table of the manifest holds at least its rows: the tenant's
	// own code (a CHECK, an index expression that writes) may have added
	// some while the scratch load ran it, but a dump that lost rows or a
	// table is refused.
	verify := func(rows map[string]int64) error {
		var errs []error
		for _, t := range m.Tables {
			schema := t.Schema
			if m.Mode == tenant.ModeSchema && schema == from {
				schema = to
			}
			if got, ok := rows[schema+"."+t.Name]; !ok || got < t.Rows {
				errs = append(errs, fmt.Errorf("table %s.%s: %d rows copied, the manifest says %d", t.Schema, t.Name, got, t.Rows))
			}
		}
		if err := errors.Join(errs...); err != nil {
			return fmt.Errorf("%w: the archive's dump does not hold what its manifest says: %w", ErrBadArchive, err)
		}
		return nil
	}
	return i.s.copyScratch(ctx, r, scratchCopy{cl: e.cl, into: e.into, sconn: sconn, dsn: sc.PrimaryDSN(scratchDB),
		what: "the archive of tenant " + m.Tenant, marker: m.Marker, verify: verify})
}

// extensionsAllowed refuses an archive whose tenant has extensions exts
// the new tenant's tier does not allow (tiers.X.extensions): its restore
// runs in the tenant's agent session, which the extension guard lets
// through. The manifest's list is checked before the tenant is made, the
// dump's own once it is loaded (a manifest may say less than its dump);
// whether the cluster has them installed is checked by the copy.
func (s *Service) extensionsAllowed(exts []string, tier string) error {
	tier = cmp.Or(tier, "default")
	allowed := map[string]bool{}
	for _, e := range s.Provision.Tiers[tier].Extensions {
		allowed[e] = true
	}
	var refused []string
	for _, e := range exts {
		if !allowed[e] {
			refused = append(refused, e)
		}
	}
	if len(refused) == 0 {
		return nil
	}
	return fmt.Errorf("%w: the archive's tenant has extension(s) %s, which tier %s does not allow: import it with a tier whose tiers.<name>.extensions lists them (--tier)",
		catalog.ErrConflict, strings.Join(refused, ", "), tier)
}

// importRoom is how many times its dump an import needs free in the
// temporary directory: the dump read out of the request, its copy read
// back out of the catalog for the job, and the scratch instance that
// loads it (a custom-format dump is compressed: the tables and their
// indexes take more than it).
const importRoom = 4

// roomFor refuses an archive whose dump of size bytes the temporary
// directory has not room for (importRoom).
func roomFor(size int64) error {
	d, err := backup.DiskOf(os.TempDir())
	if err != nil {
		return err
	}
	if need := importRoom * size; need > d.Free {
		return fmt.Errorf("%w: the archive's dump has %s: importing it needs about %s free in %s (the dump, its copy and a scratch instance that loads it), which has %s free: free some, or point TMPDIR of the daemon elsewhere",
			catalog.ErrConflict, config.ByteSize(size).Human(), config.ByteSize(need).Human(), os.TempDir(), config.ByteSize(d.Free).Human())
	}
	return nil
}

// readObject copies the archive's dump out of the catalog into a temporary
// file and checks its checksum again.
func (i *importer) readObject(ctx context.Context) (*os.File, error) {
	f, err := os.CreateTemp("", "pgtenant-import-*.dump")
	if err != nil {
		return nil, err
	}
	fail := func(err error) (*os.File, error) {
		f.Close()
		return nil, errors.Join(err, os.Remove(f.Name()))
	}
	sum := sha256.New()
	err = pgx.BeginFunc(ctx, i.s.Store.Pool(), func(tx pgx.Tx) error {
		lo := tx.LargeObjects()
		obj, err := lo.Open(ctx, i.a.Object, pgx.LargeObjectModeRead)
		if err != nil {
			return jobs.Permanent(fmt.Errorf("the archive (large object %d) is gone from the catalog: import it again: %w", i.a.Object, err))
		}
		_, err = io.Copy(io.MultiWriter(f, sum), obj)
		return err
	})
	if err != nil {
		return fail(err)
	}
	if got := hex.EncodeToString(sum.Sum(nil)); got != i.a.Manifest.Files[0].SHA256 {
		return fail(jobs.Permanent(fmt.Errorf("%w: the archive kept in the catalog has sha256 %s, not %s", ErrBadArchive, got, i.a.Manifest.Files[0].SHA256)))
	}
	if _, err := f.Seek(0, io.SeekStart); err != nil {
		return fail(err)
	}
	return f, nil
}

// scratchDB and scratchRole are the database the archive is loaded into
// in the scratch instance and its owner, the role that loads it.
const (
	scratchDB   = "tenant"
	scratchRole = "tenant"
)

// loadScratch makes a scratch instance in dir and loads the dump at path
// into its database scratchDB, connected as scratchRole: a role without
// privilege that owns that database (it makes the dump's schemas).
func loadScratch(ctx context.Context, dir, path string) (*fleet.Cluster, error) {
	if err := os.MkdirAll(filepath.Dir(dir), 0o711); err != nil {
		return nil, err
	}
	if err := os.Chmod(filepath.Dir(dir), 0o711); err != nil {
		return nil, err
	}
	sc, err := fleet.Open(fleet.Options{Dir: dir, Name: "scratch", Fast: true, Settings: map[string]string{
		"shared_buffers": "32MB", "max_connections": "20", "logging_collector": "off", "shared_preload_libraries": "''"}})
	if err != nil {
		return nil, err
	}
	if err := sc.Start(ctx); err != nil {
		return nil, fmt.Errorf("start a scratch instance in %s: %w", dir, err)
	}
	pw := make([]byte, 18)
	if _, err := rand.Read(pw); err != nil {
		return nil, err
	}
	password := hex.EncodeToString(pw)
	admin, err := cluster.ConnectDSN(ctx, sc.PrimaryDSN("postgres"), "")
	if err != nil {
		return nil, cluster.Classify(err)
	}
	defer admin.Close(context.WithoutCancel(ctx))
	for _, q := range []string{
		fmt.Sprintf("CREATE ROLE %s LOGIN PASSWORD %s", cluster.Ident(scratchRole), cluster.Literal(password)),
		fmt.Sprintf("CREATE DATABASE %s OWNER %s", cluster.Ident(scratchDB), cluster.Ident(scratchRole)),
	} {
		if _, err := admin.Exec(ctx, q); err != nil {
			return nil, cluster.Classify(err)
		}
	}
	bin, err := pgClient("pg_restore")
	if err != nil {
		return nil, err
	}
	port := sc.Primary().Port
	dsn := fmt.Sprintf("host=127.0.0.1 port=%d user=%s password=%s dbname=%s sslmode=disable application_name=pgtenant-import",
		port, scratchRole, password, scratchDB)
	cmd := exec.CommandContext(ctx, bin, "--no-owner", "--no-privileges", "--exit-on-error", "--single-transaction", "--dbname="+dsn, path)
	var stderr strings.Builder
	cmd.Stderr = &stderr
	if err := cmd.Run(); err != nil {
		return nil, jobs.Permanent(fmt.Errorf("%w: pg_restore of the archive's dump (as a role without privilege, in a scratch instance): %v: %s",
			ErrBadArchive, err, strings.TrimSpace(stderr.String())))
	}
	return sc, nil
}

// removeScratch stops a scratch instance (immediate: nothing of it is
// kept) and removes its files; what is not there is not an error.
func removeScratch(ctx context.Context, dir string) error {
	if _, err := os.Stat(dir); errors.Is(err, os.ErrNotExist) {
		return nil
	}
	sc, err := fleet.Open(fleet.Options{Dir: dir, Name: "scratch"})
	if err == nil {
		err = sc.StopNode(ctx, "primary", "immediate")
	}
	return errors.Join(err, os.RemoveAll(dir))
}

// finish records the import and lets the new tenant in; the archive leaves
// the catalog.
func (i *importer) finish(ctx context.Context, r *jobs.Run, e *ienv) error {
	m := i.a.Manifest
	if e.into.State == catalog.StateSuspended {
		err := pgx.BeginFunc(ctx, i.s.Store.Pool(), func(tx pgx.Tx) error {
			if err := i.s.Store.SetTenantVersion(ctx, tx, e.into.ID, m.Version); err != nil {
				return err
			}
			return i.s.Store.AddEvent(ctx, tx, e.into.ID, "imported", map[string]any{"from": m.Tenant, "exported_at": m.ExportedAt,
				"source_cluster": m.Cluster, "version": m.Version, "tables": len(m.Tables), "job": r.Job.ID})
		})
		if err != nil {
			return err
		}
		if _, err := i.s.Lifecycle.Resume(ctx, e.into.ID); err != nil {
			return err
		}
	}
	return i.unlinkObject(ctx)
}

func (i *importer) unlinkObject(ctx context.Context) error {
	_, err := i.s.Store.Pool().Exec(ctx, `SELECT pg_catalog.lo_unlink(oid) FROM pg_catalog.pg_largeobject_metadata WHERE oid = $1`, i.a.Object)
	return err
}

// cleanup, for an import that ends failed or cancelled: the scratch
// instance and the archive go, and the new tenant is dropped and purged.
func (i *importer) cleanup(ctx context.Context, r *jobs.Run) error {
	errs := []error{removeScratch(ctx, i.scratchDir(r)), i.unlinkObject(ctx)}
	t, err := i.s.Store.GetTenant(ctx, nil, i.a.Into)
	if errors.Is(err, catalog.ErrNotFound) {
		return errors.Join(errs...)
	}
	if err == nil && t.State == catalog.StateSuspended {
		_, err = i.s.Lifecycle.Drop(ctx, t.ID, true)
	}
	return errors.Join(append(errs, err)...)
}
