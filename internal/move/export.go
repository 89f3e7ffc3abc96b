package move

import (
	"archive/tar"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pgtenant/pgtenant/internal/catalog"
	"github.com/pgtenant/pgtenant/internal/cluster"
	"github.com/pgtenant/pgtenant/internal/provision"
	"github.com/pgtenant/pgtenant/internal/tenant"
)

// An export is a portable archive of one tenant: a tar of manifest.json
// (what the tenant was and what the archive holds, with checksums) and
// tenant.dump (pg_dump's custom format of the tenant's objects and rows,
// as dumpScope bounds them: no owners or privileges; a database tenant's
// extensions, which its import creates as the new tenant where its tier
// allows them). Another installation imports it as a new tenant (import.go).

// ArchiveFormat names the archive's layout; an import refuses any other.
const ArchiveFormat = "pgtenant-tenant-archive/1"

// The archive's two files, in this order.
const (
	manifestFile = "manifest.json"
	dumpFile     = "tenant.dump"
)

// ErrBadArchive is an archive that cannot be imported: not one, damaged,
// or of a tenant this installation cannot take.
var ErrBadArchive = errors.New("bad tenant archive")

// Manifest says what an archive holds.
type Manifest struct {
	Format string `json:"format"`
	// Tenant is the exported tenant's id, Name its name.
	Tenant string      `json:"tenant"`
	Name   string      `json:"name,omitempty"`
	Mode   tenant.Mode `json:"mode"`
	// Template and Version are the tenant's template and the version its
	// schema is at (Marker, its version marker); TemplateChecksum is that
	// version's checksum, which the importing installation's must equal.
	Template         string `json:"template"`
	Version          int    `json:"version"`
	Marker           string `json:"marker"`
	TemplateChecksum string `json:"template_checksum"`
	Tier             string `json:"tier,omitempty"`
	// Extensions are a database tenant's extensions but plpgsql: the dump
	// creates them, and an import refuses a tier that does not allow them.
	Extensions []string `json:"extensions,omitempty"`
	// Cluster and ServerVersion are where it was exported from.
	Cluster       string         `json:"cluster"`
	ServerVersion string         `json:"server_version"`
	ExportedAt    time.Time      `json:"exported_at"`
	Files         []ArchiveFile  `json:"files"`
	Tables        []ArchiveTable `json:"tables"`
}

// ArchiveFile is one file of the archive and its checksum.
type ArchiveFile struct {
	Name   string `json:"name"`
	Bytes  int64  `json:"bytes"`
	SHA256 string `json:"sha256"`
}

// ArchiveTable is one table of the tenant and its rows at the export: an
// import checks that it copied as many.
type ArchiveTable struct {
	Schema string `json:"schema"`
	Name   string `json:"name"`
	Rows   int64  `json:"rows"`
}

// Export is an archive made and ready to be sent (WriteTo); Close removes
// its file.
type Export struct {
	Manifest Manifest
	manifest []byte
	dump     *os.File
	size     int64
}

// Size is the archive's length in bytes.
func (x *Export) Size() int64 {
	return 512 + padded(int64(len(x.manifest))) + 512 + padded(x.size) + 1024
}

func padded(n int64) int64 { return (n + 511) / 512 * 512 }

// WriteTo writes the archive.
func (x *Export) WriteTo(w io.Writer) (int64, error) {
	cw := &countingWriter{w: w}
	tw := tar.NewWriter(cw)
	mod := x.Manifest.ExportedAt.Truncate(time.Second)
	if err := tw.WriteHeader(&tar.Header{Name: manifestFile, Mode: 0o644, Size: int64(len(x.manifest)), ModTime: mod, Format: tar.FormatUSTAR}); err != nil {
		return cw.n, err
	}
	if _, err := tw.Write(x.manifest); err != nil {
		return cw.n, err
	}
	if err := tw.WriteHeader(&tar.Header{Name: dumpFile, Mode: 0o644, Size: x.size, ModTime: mod, Format: tar.FormatUSTAR}); err != nil {
		return cw.n, err
	}
	if _, err := x.dump.Seek(0, io.SeekStart); err != nil {
		return cw.n, err
	}
	if _, err := io.Copy(tw, x.dump); err != nil {
		return cw.n, err
	}
	err := tw.Close()
	return cw.n, err
}

// Close removes the archive's file.
func (x *Export) Close() error {
	x.dump.Close()
	return os.Remove(x.dump.Name())
}

type countingWriter struct {
	w io.Writer
	n int64
}

func (c *countingWriter) Write(b []byte) (int, error) {
	n, err := c.w.Write(b)
	c.n += int64(n)
	return n, err
}

// Export dumps tenant id into a temporary file, consistent as of one
// snapshot: the rows counted for the manifest and pg_dump's are the same
// (pg_dump imports the snapshot of the admin session that counts). The
// tenant keeps working meanwhile; its DDL waits for the dump's end, and a
// lock it holds makes the export fail after 10 s rather than wait.
//
// No tenant code runs: the admin session only counts rows and reads the
// catalog, and pg_dump's COPY runs type output functions only.
func (s *Service) Export(ctx context.Context, id string) (*Export, error) {
	t, err := s.Store.GetTenant(ctx, nil, id)
	if err != nil {
		return nil, err
	}
	if t.State != catalog.StateActive && t.State != catalog.StateSuspended {
		return nil, fmt.Errorf("%w: tenant %s is %s; only active or suspended tenants can be exported", catalog.ErrConflict, t.ID, t.State)
	}
	cl, err := s.Clusters.Get(t.Cluster)
	if err != nil {
		return nil, err
	}
	conn, err := cl.Connect(ctx, t.Database)
	if err != nil {
		return nil, err
	}
	defer conn.Close(context.WithoutCancel(ctx))
	if _, err := conn.Exec(ctx, "BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY; SET LOCAL lock_timeout = '10s'"); err != nil {
		return nil, cluster.Classify(err)
	}
	defer conn.Exec(context.WithoutCancel(ctx), "ROLLBACK")
	m := Manifest{Format: ArchiveFormat, Tenant: t.ID, Name: t.Name, Mode: t.Mode, Template: t.Template, Tier: t.Tier, Cluster: t.Cluster}
	var snapshot string
	if err := conn.QueryRow(ctx, "SELECT pg_catalog.pg_export_snapshot(), pg_catalog.current_setting('server_version')").Scan(&snapshot, &m.ServerVersion); err != nil {
		return nil, cluster.Classify(err)
	}
	m.ExportedAt = time.Now().UTC()
	if m.Marker, err = markerOn(ctx, conn, t); err != nil {
		return nil, err
	}
	mk, ok := tenant.ParseMarker(m.Marker)
	if !ok {
		return nil, fmt.Errorf("%w: tenant %s has no complete version marker (%q): a rollout may be migrating it; export it once that is done", catalog.ErrConflict, t.ID, m.Marker)
	}
	m.Version = mk.Version
	v, err := s.Store.GetVersion(ctx, t.Template, m.Version)
	if err != nil {
		return nil, err
	}
	m.TemplateChecksum = v.Checksum
	if t.Mode == tenant.ModeDatabase {
		if m.Extensions, err = extraExtensions(ctx, conn); err != nil {
			return nil, err
		}
	}
	schemas, err := tenantSchemas(ctx, conn, t)
	if err != nil {
		return nil, err
	}
	tables, err := copiedTables(ctx, conn, schemas)
	if err != nil {
		return nil, err
	}
	for _, tb := range tables {
		var n int64
		if err := conn.QueryRow(ctx, "SELECT pg_catalog.count(*) FROM "+tb.ident()).Scan(&n); err != nil {
			return nil, fmt.Errorf("count the rows of %s: %w", tb.ident(), cluster.Classify(err))
		}
		m.Tables = append(m.Tables, ArchiveTable{Schema: tb.schema, Name: tb.name, Rows: n})
	}
	dsn, err := s.adminConnString(ctx, t.Cluster, t.Database)
	if err != nil {
		return nil, err
	}
	f, err := os.CreateTemp("", "pgtenant-export-"+t.ID+"-*.dump")
	if err != nil {
		return nil, err
	}
	x := &Export{dump: f}
	sum, size, err := dumpArchive(ctx, dsn, t.Mode, tenant.PhysicalName(t.ID), snapshot, m.Extensions, f)
	if err != nil {
		return nil, errors.Join(fmt.Errorf("tenant %s: %w", t.ID, err), x.Close())
	}
	x.size = size
	m.Files = []ArchiveFile{{Name: dumpFile, Bytes: size, SHA256: sum}}
	x.Manifest = m
	if x.manifest, err = json.MarshalIndent(m, "", "  "); err != nil {
		return nil, errors.Join(err, x.Close())
	}
	return x, nil
}

// dumpArchive runs pg_dump's custom format of a tenant in snapshot (with
// its extensions exts) into f and returns its checksum and size.
func dumpArchive(ctx context.Context, dsn string, mode tenant.Mode, schema, snapshot string, exts []string, f *os.File) (string, int64, error) {
	bin, err := pgDump()
	if err != nil {
		return "", 0, err
	}
	argv := append([]string{"--format=custom", "--snapshot=" + snapshot}, dumpScope(mode, schema, exts)...)
	cmd := exec.CommandContext(ctx, bin, append(argv, "--dbname="+dsn)...)
	h := sha256.New()
	cw := &countingWriter{w: io.MultiWriter(f, h)}
	cmd.Stdout = cw
	var stderr strings.Builder
	cmd.Stderr = &stderr
	if err := cmd.Run(); err != nil {
		return "", 0, fmt.Errorf("pg_dump: %w: %s", err, strings.TrimSpace(stderr.String()))
	}
	return hex.EncodeToString(h.Sum(nil)), cw.n, nil
}

// extraExtensions are the extensions of a database but plpgsql and
// pg_prewarm (which pgtenant makes): the tenant's own (its tier's list),
// or its template's.
func extraExtensions(ctx context.Context, conn *pgx.Conn) ([]string, error) {
	var exts []string
	err := conn.QueryRow(ctx, `SELECT coalesce(pg_catalog.array_agg(extname::text ORDER BY extname), '{}') FROM pg_catalog.pg_extension
		WHERE extname NOT IN ('plpgsql', 'pg_prewarm')`).Scan(&exts)
	return exts, cluster.Classify(err)
}

// carriedExtensions are the extensions a copy of the database tenant conn
// is on carries to cluster to (extraExtensions): its restore, as the
// tenant, creates them there, which PostgreSQL allows for a trusted
// extension that cluster has installed. refused says why each other one
// cannot be carried.
func carriedExtensions(ctx context.Context, conn *pgx.Conn, to *cluster.Cluster) (exts, refused []string, err error) {
	if exts, err = extraExtensions(ctx, conn); err != nil || len(exts) == 0 {
		return exts, nil, err
	}
	admin, err := to.Admin(ctx)
	if err != nil {
		return nil, nil, err
	}
	trust, err := cluster.ExtensionTrust(ctx, admin, exts)
	if err != nil {
		return nil, nil, err
	}
	for _, name := range exts {
		switch trusted, ok := trust[name]; {
		case !ok:
			refused = append(refused, fmt.Sprintf("it has extension %s, which cluster %s has not installed: install it there", name, to.Name()))
		case !trusted:
			refused = append(refused, fmt.Sprintf("it has extension %s, which is not trusted: only a superuser may create it, and the copy is restored as the tenant", name))
		}
	}
	return exts, refused, nil
}

// checkManifest refuses a manifest this code cannot import.
func checkManifest(m Manifest) error {
	bad := func(format string, args ...any) error {
		return fmt.Errorf("%w: %w: %s", provision.ErrInvalid, ErrBadArchive, fmt.Sprintf(format, args...))
	}
	switch {
	case m.Format != ArchiveFormat:
		return bad("format %q, want %q (made by another pgtenant release?)", m.Format, ArchiveFormat)
	case !tenant.ValidID(m.Tenant):
		return bad("tenant id %q is not one", m.Tenant)
	case m.Mode != tenant.ModeSchema && m.Mode != tenant.ModeDatabase:
		return bad("mode %q is not schema or database", m.Mode)
	case len(m.Files) != 1 || m.Files[0].Name != dumpFile || len(m.Files[0].SHA256) != 64:
		return bad("files %v: want one %s with its sha256", m.Files, dumpFile)
	}
	mk, ok := tenant.ParseMarker(m.Marker)
	if !ok || mk.Version != m.Version {
		return bad("version marker %q does not say version %d", m.Marker, m.Version)
	}
	return nil
}
