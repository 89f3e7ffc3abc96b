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
// left. A damaged archive, something that is not one and an archive of a
// template version the installation has not got are refused before any
// tenant is made.
func TestExportImport_BothModes(t *testing.T) {
	ctx, cancel := context.WithTimeout(pgtest.Context(t), 6*time.Minute)
	defer cancel()
	a, cfgB := installations(t)
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
	}{
		{"damaged", damaged, api.ErrInvalid, "the archive is damaged"},
		{"not an archive", []byte("SELECT 1;\n"), api.ErrInvalid, "made by `pgtenant tenant export`"},
		{"a template version not here", rewriteManifest(t, body, func(m *move.Manifest) { m.Version = 99; m.Marker = tenant.BuiltMarker(99).String() }), catalog.ErrConflict, "push the template's versions up to 99"},
	} {
		_, err := b.ImportTenant(ctx, bytes.NewReader(tc.body), api.ImportTenantQuery{})
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
