package move_test

import (
	"archive/tar"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/pgtenant/pgtenant/internal/api"
	"github.com/pgtenant/pgtenant/internal/backup/backuptest"
	"github.com/pgtenant/pgtenant/internal/catalog"
	"github.com/pgtenant/pgtenant/internal/config"
	"github.com/pgtenant/pgtenant/internal/daemon/daemontest"
	"github.com/pgtenant/pgtenant/internal/jobs"
	"github.com/pgtenant/pgtenant/internal/move"
	"github.com/pgtenant/pgtenant/internal/pgtest"
	"github.com/pgtenant/pgtenant/internal/provision"
	"github.com/pgtenant/pgtenant/internal/tenant"
)

// installations are two pgtenant installations, each with its own catalog
// and cluster: a on local, b on local2.
func installations(t *testing.T) (a *api.Client, cfgB config.Config) {
	t.Helper()
	_, a = daemontest.Start(t, pgs[0], testConfig(t))
	buildSaas(t, a)
	cfgB = daemontest.Config(t, pgs[1])
	cfgB.Provision.DefaultPoolSize = 0
	cfgB.Metrics.Interval = 0
	cfgB.Prewarm.CaptureInterval = 0
	cfgB.Prewarm.WatchInterval = 0
	cfgB.Drop.Retention = config.Duration(time.Second)
	return a, cfgB
}

// exportTo writes tenant id's archive to a file in dir.
func exportTo(t *testing.T, ctx context.Context, c *api.Client, id, dir string) string {
	t.Helper()
	path := filepath.Join(dir, id+".tar")
	f, err := os.Create(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var last, total int64
	if _, err := c.ExportTenant(ctx, id, f, func(done, all int64) { last, total = done, all }); err != nil {
		t.Fatal(err)
	}
	if total <= 0 || last != total {
		t.Errorf("export progress ended at %d of %d bytes", last, total)
	}
	return path
}

func importFrom(t *testing.T, ctx context.Context, c *api.Client, path string) api.CreateTenantResponse {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	res, err := c.ImportTenant(ctx, f, api.ImportTenantQuery{})
	if err != nil {
		t.Fatal(err)
	}
	if res.Job == nil || res.Password == "" {
		t.Fatalf("import answered no job or no password: %+v", res)
	}
	return res
}

// scratchLeft lists the import scratch instances on this machine.
func scratchLeft() []string {
	dirs, _ := filepath.Glob(filepath.Join(os.TempDir(), "pgtenant-scratch", "import-*"))
	return dirs
}

// TestExportImport_BothModes: a tenant with a sequence, a trigger, and a
// CHECK and an index expression calling its own functions (which refuse
// to run in a superuser's session) is exported on one installation and
// imported into another, and into its own: every table equals the state
// at the export (checksums over every column; the source changed since),
// sequences are not behind, the new tenant has new credentials, its
// template version and an "imported" event, and no scratch instance is
// left. A damaged archive, something that is not one, one whose dump the
// disk has not room for, and an archive of a template version the
// installation has not got are refused before any tenant is made.
func TestExportImport_BothModes(t *testing.T) {
	ctx, cancel := context.WithTimeout(pgtest.Context(t), 6*time.Minute)
	defer cancel()
	a, cfgB := installations(t)
	cfgB.Tiers["tiny"] = config.Tier{ConnectionLimit: 5, StorageQuota: 1 << 10}
	_, b := daemontest.Start(t, pgs[1], cfgB)
	buildSaas(t, b)
	var archive string
	dir := t.TempDir()
	for _, mode := range []tenant.Mode{tenant.ModeSchema, tenant.ModeDatabase} {
		t.Run(string(mode), func(t *testing.T) {
			r, err := a.CreateTenant(ctx, provision.Request{Template: "saas", Mode: mode})
			if err != nil {
				t.Fatal(err)
			}
			if r.Job != nil {
				waitJob(t, ctx, a, r.Job.ID)
			}
			backuptest.Exec(t, ctx, r.DSN, tenantSetup)
			want := checksums(t, ctx, r.DSN)
			path := exportTo(t, ctx, a, r.Tenant.ID, dir)
			archive = path
			backuptest.Exec(t, ctx, r.DSN, destroy) // after the export: not in the archive
			for _, into := range []struct {
				name string
				c    *api.Client
			}{{"another installation", b}, {"the same installation", a}} {
				res := importFrom(t, ctx, into.c, path)
				if res.Tenant.ID == r.Tenant.ID || res.Tenant.Mode != mode {
					t.Errorf("%s: imported tenant %s (%s), want a new id in mode %s", into.name, res.Tenant.ID, res.Tenant.Mode, mode)
				}
				waitJob(t, ctx, into.c, res.Job.ID)
				sameSums(t, "imported into "+into.name, checksums(t, ctx, res.DSN), want)
				conn, err := connectDSN(ctx, res.DSN)
				if err != nil {
					t.Fatal(err)
				}
				var id int64
				err = conn.QueryRow(ctx, `INSERT INTO orders (amount) VALUES (5) RETURNING id`).Scan(&id)
				conn.Close(ctx)
				if err != nil || id <= 200 {
					t.Errorf("%s: a new order got id %d (%v), want above 200: the sequence is behind", into.name, id, err)
				}
				got, err := into.c.Tenant(ctx, res.Tenant.ID)
				if err != nil {
					t.Fatal(err)
				}
				if got.State != catalog.StateActive || got.Version != r.Tenant.Version {
					t.Errorf("%s: imported tenant is %s at version %d, want active at %d", into.name, got.State, got.Version, r.Tenant.Version)
				}
				if !hasEvent(got.Events, "imported") {
					t.Errorf("%s: imported tenant has no imported event: %+v", into.name, got.Events)
				}
			}
		})
	}
	if left := scratchLeft(); len(left) > 0 {
		t.Errorf("scratch instances left: %v", left)
	}
	if archive == "" {
		t.FailNow()
	}
	before, err := b.Tenants(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	body, err := os.ReadFile(archive)
	if err != nil {
		t.Fatal(err)
	}
	damaged := bytes.Clone(body)
	damaged[len(damaged)-2048] ^= 0xff // inside the dump: the last 1024 bytes are the tar's end
	for _, tc := range []struct {
		name string
		body []byte
		want error
		says string
		tier string
	}{
		{"damaged", damaged, api.ErrInvalid, "the archive is damaged", ""},
		{"not an archive", []byte("SELECT 1;\n"), api.ErrInvalid, "made by `pgtenant tenant export`", ""},
		{"a template version not here", rewriteManifest(t, body, func(m *move.Manifest) { m.Version = 99; m.Marker = tenant.BuiltMarker(99).String() }), catalog.ErrConflict, "push the template's versions up to 99", ""},
		{"a dump larger than the disk", rewriteManifest(t, body, func(m *move.Manifest) { m.Files[0].Bytes = 1 << 50 }), catalog.ErrConflict, "a scratch instance that loads it", ""},
		{"a dump larger than its tier's storage quota", body, catalog.ErrConflict, "more than the storage quota of the tier it would go into (1.0 KiB)", "tiny"},
	} {
		_, err := b.ImportTenant(ctx, bytes.NewReader(tc.body), api.ImportTenantQuery{Tier: tc.tier})
		if !errors.Is(err, tc.want) || err == nil || !strings.Contains(err.Error(), tc.says) {
			t.Errorf("import of %s: err = %v, want %v saying %q", tc.name, err, tc.want, tc.says)
		}
	}
	after, err := b.Tenants(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	if len(after) != len(before) {
		t.Errorf("refused imports made tenants: %d before, %d after", len(before), len(after))
	}
}

func hasEvent(events []catalog.Event, kind string) bool {
	for _, e := range events {
		if e.Kind == kind {
			return true
		}
	}
	return false
}

// rewriteManifest is an archive with its manifest changed by mod.
func rewriteManifest(t *testing.T, archive []byte, mod func(*move.Manifest)) []byte {
	t.Helper()
	tr := tar.NewReader(bytes.NewReader(archive))
	var out bytes.Buffer
	tw := tar.NewWriter(&out)
	for {
		h, err := tr.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		b, err := io.ReadAll(tr)
		if err != nil {
			t.Fatal(err)
		}
		if h.Name == "manifest.json" {
			var m move.Manifest
			if err := json.Unmarshal(b, &m); err != nil {
				t.Fatal(err)
			}
			mod(&m)
			if b, err = json.Marshal(m); err != nil {
				t.Fatal(err)
			}
			h.Size = int64(len(b))
		}
		if err := tw.WriteHeader(h); err != nil {
			t.Fatal(err)
		}
		if _, err := tw.Write(b); err != nil {
			t.Fatal(err)
		}
	}
	if err := tw.Close(); err != nil {
		t.Fatal(err)
	}
	return out.Bytes()
}

// TestImport_StopsAndResumes: the daemon running an import is stopped once
// the archive is loaded into the scratch instance, and another on the same
// catalog finishes it with the archive's data; an import cancelled there
// leaves its tenant dropped, the archive gone from the catalog and no
// scratch instance.
func TestImport_StopsAndResumes(t *testing.T) {
	ctx, cancel := context.WithTimeout(pgtest.Context(t), 6*time.Minute)
	defer cancel()
	a, cfgB := installations(t)
	b, stop := daemontest.StartCancellable(t, pgs[1], cfgB)
	buildSaas(t, b)
	r, err := a.CreateTenant(ctx, provision.Request{Template: "saas", Mode: tenant.ModeSchema})
	if err != nil {
		t.Fatal(err)
	}
	if r.Job != nil {
		waitJob(t, ctx, a, r.Job.ID)
	}
	backuptest.Exec(t, ctx, r.DSN, tenantSetup)
	want := checksums(t, ctx, r.DSN)
	path := exportTo(t, ctx, a, r.Tenant.ID, t.TempDir())
	defer move.SetCrashHook(nil)
	for _, cancelIt := range []bool{false, true} {
		hit := make(chan struct{})
		var once sync.Once
		move.SetCrashHook(func(ctx context.Context, p string) error {
			if p != "import:loaded" {
				return nil
			}
			once.Do(func() { close(hit) })
			<-ctx.Done() // the daemon stops (or the job is cancelled) here
			return ctx.Err()
		})
		res := importFrom(t, ctx, b, path)
		select {
		case <-hit:
		case <-ctx.Done():
			t.Fatal("the import never loaded its scratch instance")
		}
		move.SetCrashHook(nil)
		if !cancelIt {
			stop()
			b, stop = daemontest.StartCancellable(t, pgs[1], cfgB)
			waitJob(t, ctx, b, res.Job.ID)
			sameSums(t, "after the resumed import", checksums(t, ctx, res.DSN), want)
			continue
		}
		if _, err := b.CancelJob(ctx, res.Job.ID); err != nil {
			t.Fatal(err)
		}
		if j, err := b.WaitJob(ctx, res.Job.ID, nil); err != nil || j.State != jobs.Cancelled {
			t.Fatalf("cancelled import: %v %s", err, j.State)
		}
		got, err := b.Tenant(ctx, res.Tenant.ID)
		if err != nil {
			t.Fatal(err)
		}
		if got.State == catalog.StateActive || got.State == catalog.StateSuspended {
			t.Errorf("the cancelled import's tenant is %s, want dropped or purged", got.State)
		}
		conn := daemontest.CatalogConn(t, pgs[1], cfgB)
		var objects int
		if err := conn.QueryRow(ctx, `SELECT count(*) FROM pg_largeobject_metadata`).Scan(&objects); err != nil {
			t.Fatal(err)
		}
		if objects != 0 {
			t.Errorf("%d archives left in the catalog after the imports ended", objects)
		}
	}
	if left := scratchLeft(); len(left) > 0 {
		t.Errorf("scratch instances left: %v", left)
	}
}

// TestExportImport_Extensions: a database tenant with an hstore column is
// exported with its extension (named in the manifest); an import under a
// tier that does not allow hstore is refused naming it, before any tenant
// is made, and so is an archive whose manifest hides it (the dump's own
// extensions are checked once loaded); under a tier that does, the new
// tenant has hstore, made by its own role, and the column's values.
func TestExportImport_Extensions(t *testing.T) {
	ctx, cancel := context.WithTimeout(pgtest.Context(t), 4*time.Minute)
	defer cancel()
	cfg := testConfig(t)
	cfg.Tiers["ext"] = config.Tier{ConnectionLimit: 5, Extensions: []string{"hstore"}}
	_, c := daemontest.Start(t, pgs[0], cfg)
	buildSaas(t, c)
	r, err := c.CreateTenant(ctx, provision.Request{Template: "saas", Mode: tenant.ModeDatabase, Tier: "ext"})
	if err != nil {
		t.Fatal(err)
	}
	if r.Job != nil {
		waitJob(t, ctx, c, r.Job.ID)
	}
	const attrs = `SELECT string_agg(id || ':' || (a -> 'k'), ',' ORDER BY id) FROM attrs`
	backuptest.Exec(t, ctx, r.DSN, `CREATE EXTENSION hstore; CREATE TABLE attrs (id int PRIMARY KEY, a hstore);
		INSERT INTO attrs SELECT g, hstore('k', 'v' || g) FROM generate_series(1, 50) g`)
	path := exportTo(t, ctx, c, r.Tenant.ID, t.TempDir())
	m, f, err := move.ReadArchive(mustOpen(t, path), 0)
	if err != nil {
		t.Fatal(err)
	}
	f.Close()
	os.Remove(f.Name())
	if !slices.Equal(m.Extensions, []string{"hstore"}) {
		t.Errorf("manifest extensions %v, want [hstore]", m.Extensions)
	}

	before, err := c.Tenants(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	_, err = c.ImportTenant(ctx, mustOpen(t, path), api.ImportTenantQuery{})
	var apiErr *api.Error
	if !errors.As(err, &apiErr) || apiErr.Status != 409 || !strings.Contains(err.Error(), "hstore") || !strings.Contains(err.Error(), "tier default does not allow") {
		t.Errorf("import under the default tier: %v; want 409 naming hstore and the tier", err)
	}
	if after, err := c.Tenants(ctx, nil); err != nil || len(after) != len(before) {
		t.Errorf("the refused import made a tenant: %d tenants before, %d after (%v)", len(before), len(after), err)
	}

	// A manifest that hides the extension: the dump's own is refused once
	// loaded, and the job fails without a tenant.
	body, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	hidden := rewriteManifest(t, body, func(m *move.Manifest) { m.Extensions = nil })
	lying, err := c.ImportTenant(ctx, bytes.NewReader(hidden), api.ImportTenantQuery{})
	if err != nil {
		t.Fatal(err)
	}
	if j, err := c.WaitJob(ctx, lying.Job.ID, nil); err != nil || j.State != jobs.Failed || !strings.Contains(j.LastError, "hstore") || !strings.Contains(j.LastError, "tier default does not allow") {
		t.Errorf("import of an archive whose manifest hides hstore: %s %q (%v); want failed naming hstore and the tier", j.State, j.LastError, err)
	}

	res, err := c.ImportTenant(ctx, mustOpen(t, path), api.ImportTenantQuery{Tier: "ext"})
	if err != nil {
		t.Fatal(err)
	}
	waitJob(t, ctx, c, res.Job.ID)
	conn, err := connectDSN(ctx, res.DSN)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	var got, want, owner string
	if err := conn.QueryRow(ctx, attrs).Scan(&got); err != nil {
		t.Fatal(err)
	}
	src, err := connectDSN(ctx, r.DSN)
	if err != nil {
		t.Fatal(err)
	}
	defer src.Close(ctx)
	if err := src.QueryRow(ctx, attrs).Scan(&want); err != nil {
		t.Fatal(err)
	}
	if got != want {
		t.Errorf("imported hstore column: %.80s, want %.80s", got, want)
	}
	if err := conn.QueryRow(ctx, `SELECT extowner::regrole::text FROM pg_extension WHERE extname = 'hstore'`).Scan(&owner); err != nil || owner != tenant.PhysicalName(res.Tenant.ID) {
		t.Errorf("hstore in the imported tenant is owned by %q (%v), want its role %s", owner, err, tenant.PhysicalName(res.Tenant.ID))
	}
}

func mustOpen(t *testing.T, path string) *os.File {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { f.Close() })
	return f
}
