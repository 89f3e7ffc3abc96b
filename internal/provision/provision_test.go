package provision_test

import (
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	examples "github.com/pgtenant/pgtenant/examples/templates"
	"github.com/pgtenant/pgtenant/internal/api"
	"github.com/pgtenant/pgtenant/internal/catalog"
	"github.com/pgtenant/pgtenant/internal/config"
	"github.com/pgtenant/pgtenant/internal/daemon/daemontest"
	"github.com/pgtenant/pgtenant/internal/jobs"
	"github.com/pgtenant/pgtenant/internal/pgtest"
	"github.com/pgtenant/pgtenant/internal/provision"
	"github.com/pgtenant/pgtenant/internal/templates"
	"github.com/pgtenant/pgtenant/internal/tenant"
)

var pg *pgtest.Cluster

// The whole package runs at PostgreSQL's default max_locks_per_transaction
// (64): provisioning must never need it raised.
func TestMain(m *testing.M) {
	pgtest.Main(m, pgtest.Options{Standbys: 1, Settings: map[string]string{"max_locks_per_transaction": "64"}}, &pg)
}

// waitSpares waits until the pool of a template and mode holds n ready spares.
func waitSpares(t *testing.T, catalogDB, template, mode string, n int) {
	t.Helper()
	conn := pg.Conn(t, catalogDB)
	ctx := pgtest.Context(t)
	for {
		var got int
		if err := conn.QueryRow(ctx, `SELECT count(*) FROM tenants WHERE template = $1 AND mode = $2 AND state = 'spare'`, template, mode).Scan(&got); err != nil {
			t.Fatal(err)
		}
		if got >= n {
			return
		}
		select {
		case <-ctx.Done():
			t.Fatalf("pool %s/%s: %d spares, want %d", template, mode, got, n)
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// startWithCatalog runs a daemon whose pools keep spares spares and returns
// its client and its catalog database.
func startWithCatalog(t testing.TB, spares int) (*api.Client, string) {
	cfg := daemontest.Config(t, pg)
	cfg.Provision.DefaultPoolSize = spares
	cfg.Provision.PoolInterval = config.Duration(200 * time.Millisecond)
	cfg.Tiers["small"] = config.Tier{ConnectionLimit: 3, StatementTimeout: config.Duration(2 * time.Second), WorkMem: 1 << 20}
	_, c := daemontest.Start(t, pg, cfg)
	return c, daemontest.CatalogDB(t, cfg)
}

func name(s string) *string { return &s }

// TestCreate_BothModes: a tenant of each mode, from the pool and from the
// template, gets a DSN that works and a schema it owns.
func TestCreate_BothModes(t *testing.T) {
	c, catDB := startWithCatalog(t, 1)
	ctx := pgtest.Context(t)
	daemontest.CreateTemplate(t, c, "saas", examples.Saas())
	for _, mode := range []string{"database", "schema"} {
		t.Run(mode, func(t *testing.T) {
			waitSpares(t, catDB, "saas", mode, 1)
			pooled, err := c.CreateTenant(ctx, provision.Request{Template: "saas", Mode: tenant.Mode(mode), Name: name("Acme " + mode)})
			if err != nil {
				t.Fatal(err)
			}
			cold, err := c.CreateTenant(ctx, provision.Request{Template: "saas", Mode: tenant.Mode(mode)})
			if err != nil {
				t.Fatal(err)
			}
			if pooled.Path != "pool" {
				t.Errorf("first create path = %q, want pool", pooled.Path)
			}
			for _, got := range []api.CreateTenantResponse{pooled, cold} {
				if got.Tenant.State != catalog.StateActive || got.Password == "" || got.Tenant.Mode != tenant.Mode(mode) {
					t.Fatalf("created = %+v, want an active %s tenant with a password", got.Tenant, mode)
				}
				if strings.Contains(got.Tenant.DSN, got.Password) {
					t.Errorf("tenant view DSN shows the password")
				}
				conn := pgtest.Connect(t, got.DSN)
				var owner string
				if err := conn.QueryRow(ctx, `SELECT pg_get_userbyid(relowner) FROM pg_class WHERE oid = 'issues'::regclass`).Scan(&owner); err != nil {
					t.Fatal(err)
				}
				if want := "t_" + got.Tenant.ID; owner != want {
					t.Errorf("issues owned by %q, want %q", owner, want)
				}
				if _, err := conn.Exec(ctx, `INSERT INTO organizations (name, slug) VALUES ('Acme', 'acme');
					CREATE TABLE mine (x int); INSERT INTO mine VALUES (1)`); err != nil {
					t.Errorf("tenant cannot write its own schema: %v", err)
				}
				var products int
				if err := conn.QueryRow(ctx, `SELECT count(*) FROM products`).Scan(&products); err != nil || products != 3 {
					t.Errorf("template data: %d products, %v; want 3", products, err)
				}
			}
			shown, err := c.Tenant(ctx, pooled.Tenant.ID)
			if err != nil {
				t.Fatal(err)
			}
			if shown.Name != "Acme "+mode || len(shown.Events) == 0 {
				t.Errorf("show = %+v, want the display name and a created event", shown)
			}
		})
	}
}

// TestIsolation: a tenant's role reaches its own database or schema only,
// checked with real logins.
func TestIsolation(t *testing.T) {
	c, catDB := startWithCatalog(t, 0)
	ctx := pgtest.Context(t)
	daemontest.CreateTemplate(t, c, "saas", examples.Saas())
	var db, sc [2]api.CreateTenantResponse
	for i := range 2 {
		var err error
		if db[i], err = c.CreateTenant(ctx, provision.Request{Template: "saas", Mode: "database"}); err != nil {
			t.Fatal(err)
		}
		if sc[i], err = c.CreateTenant(ctx, provision.Request{Template: "saas", Mode: "schema"}); err != nil {
			t.Fatal(err)
		}
	}
	withDB := func(dsn, database string) string {
		u, _ := url.Parse(dsn)
		u.Path = "/" + database
		return u.String()
	}
	// Database tenants: not the other's database, the shared database, the
	// template, postgres, template1 or the catalog.
	for _, other := range []string{db[1].Tenant.Database, sc[0].Tenant.Database, "pgt_tpl_saas_v1", "postgres", "template1", catDB} {
		conn, err := pgx.Connect(ctx, withDB(db[0].DSN, other))
		if err == nil {
			conn.Close(ctx)
			t.Errorf("database tenant %s connected to %s", db[0].Tenant.ID, other)
		}
	}
	// Schema tenants: not the other's schema, not the public schema, no temp tables, no other database.
	a := pgtest.Connect(t, sc[0].DSN)
	for _, sql := range []string{
		`SELECT count(*) FROM t_` + sc[1].Tenant.ID + `.users`,
		`CREATE TABLE public.sneaky (x int)`,
		`CREATE TEMP TABLE sneaky (x int)`,
	} {
		if _, err := a.Exec(ctx, sql); err == nil {
			t.Errorf("schema tenant %s ran %q", sc[0].Tenant.ID, sql)
		}
	}
	var path string
	if err := a.QueryRow(ctx, `SELECT current_schemas(false)::text`).Scan(&path); err != nil || path != "{t_"+sc[0].Tenant.ID+"}" {
		t.Errorf("schema tenant search path = %q, %v; want its own schema only", path, err)
	}
	if conn, err := pgx.Connect(ctx, withDB(sc[0].DSN, db[0].Tenant.Database)); err == nil {
		conn.Close(ctx)
		t.Errorf("schema tenant connected to a database tenant's database")
	}
	// Physical names reveal nothing of the display name.
	if !strings.HasPrefix(db[0].Tenant.Database, "t_") || strings.Contains(db[0].Tenant.Database, "acme") {
		t.Errorf("database name %q is not opaque", db[0].Tenant.Database)
	}
}

// TestSpares_UnusableBeforeClaim: a spare's role cannot log in, even with a
// known password, and has no CONNECT right.
func TestSpares_UnusableBeforeClaim(t *testing.T) {
	c, catDB := startWithCatalog(t, 2)
	ctx := pgtest.Context(t)
	daemontest.CreateTemplate(t, c, "saas", examples.Saas())
	waitSpares(t, catDB, "saas", "database", 2)
	waitSpares(t, catDB, "saas", "schema", 2)
	cat := pg.Conn(t, catDB)
	rows, err := cat.Query(ctx, `SELECT id, database FROM tenants WHERE state = 'spare'`)
	if err != nil {
		t.Fatal(err)
	}
	type spare struct{ id, db string }
	spares, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (spare, error) {
		var s spare
		return s, r.Scan(&s.id, &s.db)
	})
	if err != nil || len(spares) < 4 {
		t.Fatalf("spares = %v, %v; want at least 4", spares, err)
	}
	admin := pg.Conn(t, "postgres")
	for _, s := range spares {
		role := "t_" + s.id
		var canLogin, canConnect bool
		if err := admin.QueryRow(ctx, `SELECT rolcanlogin, has_database_privilege($1, $2, 'CONNECT') FROM pg_roles WHERE rolname = $1`, role, s.db).
			Scan(&canLogin, &canConnect); err != nil {
			t.Fatal(err)
		}
		if canLogin || canConnect {
			t.Errorf("spare %s: login=%v connect=%v, want neither", s.id, canLogin, canConnect)
		}
		// Even knowing a password, the spare cannot log in.
		if _, err := admin.Exec(ctx, `ALTER ROLE `+pgx.Identifier{role}.Sanitize()+` PASSWORD 'known'`); err != nil {
			t.Fatal(err)
		}
		u, _ := url.Parse(pg.PrimaryDSN(s.db))
		u.User = url.UserPassword(role, "known")
		if conn, err := pgx.Connect(ctx, u.String()); err == nil {
			conn.Close(ctx)
			t.Errorf("spare %s logged in before being claimed", s.id)
		}
	}
	// Spares are not tenants: not listed, not shown.
	list, err := c.Tenants(ctx, url.Values{})
	if err != nil {
		t.Fatal(err)
	}
	if len(list) != 0 {
		t.Errorf("tenant list shows %d rows, want no spares listed", len(list))
	}
	if _, err := c.Tenant(ctx, spares[0].id); !errors.Is(err, catalog.ErrNotFound) {
		t.Errorf("show spare: %v, want not found", err)
	}

	// A spare being retired (purging, never claimed, as a pool shrinking
	// leaves it while its purge runs) is no tenant either.
	var retired string
	if err := cat.QueryRow(ctx, `UPDATE tenants SET state = 'purging' WHERE id = (SELECT id FROM tenants
		WHERE state = 'spare' AND mode = 'schema' ORDER BY id LIMIT 1) RETURNING id`).Scan(&retired); err != nil {
		t.Fatal(err)
	}
	for _, q := range []url.Values{{}, {"state": {"purging"}}} {
		if list, err := c.Tenants(ctx, q); err != nil || len(list) != 0 {
			t.Errorf("tenant list %v = %d rows, %v; want a retiring spare not listed", q, len(list), err)
		}
	}
	if _, err := c.Tenant(ctx, retired); !errors.Is(err, catalog.ErrNotFound) {
		t.Errorf("show a retiring spare: %v, want not found", err)
	}

	// A tenant claimed from the pool was created at its claim, not when its
	// spare was built.
	var built time.Time
	if err := cat.QueryRow(ctx, `SELECT max(created_at) FROM tenants WHERE state = 'spare' AND mode = 'database'`).Scan(&built); err != nil {
		t.Fatal(err)
	}
	got, err := c.CreateTenant(ctx, provision.Request{Template: "saas", Mode: "database"})
	if err != nil || got.Path != "pool" {
		t.Fatalf("create = %+v, %v; want from the pool", got, err)
	}
	if tn := got.Tenant; tn.ClaimedAt == nil || !tn.CreatedAt.Equal(*tn.ClaimedAt) || !tn.CreatedAt.After(built) {
		t.Errorf("claimed tenant: created_at %s, claimed_at %v; want its claim, after the spares were built (%s)", tn.CreatedAt, tn.ClaimedAt, built)
	}
}

// TestCreate_RetryByExternalID: retries (sequential and concurrent) with one
// external id make one tenant.
func TestCreate_RetryByExternalID(t *testing.T) {
	c, catDB := startWithCatalog(t, 1)
	ctx := pgtest.Context(t)
	daemontest.CreateTemplate(t, c, "saas", examples.Saas())
	first, err := c.CreateTenant(ctx, provision.Request{Template: "saas", ExternalID: "cust-42"})
	if err != nil {
		t.Fatal(err)
	}
	again, err := c.CreateTenant(ctx, provision.Request{Template: "saas", ExternalID: "cust-42"})
	if err != nil {
		t.Fatal(err)
	}
	if again.Tenant.ID != first.Tenant.ID || !again.Existing || again.Password != first.Password || again.DSN != first.DSN {
		t.Errorf("retry = id %s existing %v; want id %s, existing, with the first answer's password and DSN", again.Tenant.ID, again.Existing, first.Tenant.ID)
	}
	if again.Job != nil {
		t.Errorf("retry of an active tenant carries job %d, want none", again.Job.ID)
	}
	// A retry while the tenant is still being built (its first request timed
	// out, say) gets the build job to follow.
	cat := pg.Conn(t, catDB)
	if _, err := cat.Exec(ctx, `UPDATE tenants SET state = 'provisioning' WHERE id = $1`, first.Tenant.ID); err != nil {
		t.Fatal(err)
	}
	building, err := c.CreateTenant(ctx, provision.Request{Template: "saas", ExternalID: "cust-42"})
	if err != nil || !building.Existing || building.Job == nil || building.Job.Target != first.Tenant.ID || building.Job.Type != jobs.TenantBuild {
		t.Errorf("retry while provisioning = %+v, %v; want the existing tenant with its build job", building, err)
	}
	if _, err := cat.Exec(ctx, `UPDATE tenants SET state = 'active' WHERE id = $1`, first.Tenant.ID); err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	answers := make(chan api.CreateTenantResponse, 6)
	for range 6 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			r, err := c.CreateTenant(ctx, provision.Request{Template: "saas", ExternalID: "cust-race", Mode: "schema"})
			if err != nil {
				t.Error(err)
				return
			}
			answers <- r
		}()
	}
	wg.Wait()
	close(answers)
	seen := map[string]bool{}
	var password string
	for r := range answers {
		seen[r.Tenant.ID] = true
		if password == "" {
			password = r.Password
		}
		if r.Password == "" || r.Password != password {
			t.Errorf("concurrent creates with one external id answered passwords %q and %q, want one", password, r.Password)
		}
	}
	if len(seen) != 1 {
		t.Errorf("concurrent creates with one external id made %d tenants, want 1", len(seen))
	}
	var n int
	if err := pg.Conn(t, catDB).QueryRow(ctx, `SELECT count(*) FROM tenants WHERE external_id = 'cust-race'`).Scan(&n); err != nil || n != 1 {
		t.Errorf("catalog rows for cust-race = %d, %v; want 1", n, err)
	}
}

// TestCreate_RetryWithOtherParameters: a create whose external id names a
// tenant but asks for other parameters is a 409 naming each difference
// with both values and what to do, and changes nothing; a retry that
// repeats the parameters, or leaves some empty, still answers the tenant.
func TestCreate_RetryWithOtherParameters(t *testing.T) {
	c, catDB := startWithCatalog(t, 0)
	ctx := pgtest.Context(t)
	daemontest.CreateTemplate(t, c, "saas", examples.Saas())
	daemontest.CreateTemplate(t, c, "crm", []templates.Upload{{Name: "0001.sql", Body: "CREATE TABLE t (x int);"}})
	first, err := c.CreateTenant(ctx, provision.Request{Template: "saas", Mode: "schema", Name: name("Acme"), ExternalID: "cust-7", Tier: "small", Cluster: "local"})
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		req  provision.Request
		want []string
	}{
		{provision.Request{Template: "crm", ExternalID: "cust-7"}, []string{`template "saas" (this request: "crm")`}},
		{provision.Request{Template: "saas", Mode: "database", Tier: "default", ExternalID: "cust-7"},
			[]string{`mode "schema" (this request: "database")`, `tier "small" (this request: "default")`}},
		{provision.Request{Template: "saas", Name: name("Globex"), ExternalID: "cust-7"}, []string{`name "Acme" (this request: "Globex")`}},
	} {
		_, err := c.CreateTenant(ctx, tc.req)
		var apiErr *api.Error
		if !errors.As(err, &apiErr) || apiErr.Status != http.StatusConflict {
			t.Errorf("create %+v: %v; want 409", tc.req, err)
			continue
		}
		for _, want := range append(tc.want, "external id \"cust-7\" is tenant "+first.Tenant.ID, "use another external id", "repeat the original parameters") {
			if !strings.Contains(apiErr.Message, want) {
				t.Errorf("create %+v: %q; want it to contain %q", tc.req, apiErr.Message, want)
			}
		}
	}
	for _, req := range []provision.Request{
		{Template: "saas", Mode: "schema", Name: name("Acme"), ExternalID: "cust-7", Tier: "small", Cluster: "local"},
		{Template: "saas", ExternalID: "cust-7"},
	} {
		again, err := c.CreateTenant(ctx, req)
		if err != nil || !again.Existing || again.Tenant.ID != first.Tenant.ID {
			t.Errorf("retry %+v = %s existing %v, %v; want the tenant %s", req, again.Tenant.ID, again.Existing, err, first.Tenant.ID)
		}
	}
	var n int
	if err := pg.Conn(t, catDB).QueryRow(ctx, `SELECT count(*) FROM tenants WHERE state NOT IN ('spare', 'building')`).Scan(&n); err != nil || n != 1 {
		t.Errorf("tenants after the retries = %d, %v; want 1", n, err)
	}
}

// TestCreate_BadInput: every bad request is refused with the status and a
// message naming what is wrong, and leaves nothing behind.
func TestCreate_BadInput(t *testing.T) {
	c, catDB := startWithCatalog(t, 0)
	ctx := pgtest.Context(t)
	daemontest.CreateTemplate(t, c, "saas", examples.Saas())
	for _, tc := range []struct {
		req    provision.Request
		status int
		want   string
	}{
		{provision.Request{Template: "nope"}, http.StatusNotFound, `template "nope"`},
		{provision.Request{Template: "saas; DROP DATABASE x"}, http.StatusBadRequest, "template name"},
		{provision.Request{Template: "saas", Cluster: "elsewhere"}, http.StatusNotFound, "elsewhere"},
		{provision.Request{Template: "saas", Tier: "gold"}, http.StatusBadRequest, `unknown tier "gold"`},
		{provision.Request{Template: "saas", Mode: "table"}, http.StatusBadRequest, "mode"},
		{provision.Request{Template: "saas", Name: name("")}, http.StatusBadRequest, "display name: empty"},
		{provision.Request{Template: "saas", Name: name(strings.Repeat("x", 201))}, http.StatusBadRequest, "longer than 200"},
		{provision.Request{Template: "saas", Name: name("evil\x00name")}, http.StatusBadRequest, "control character"},
		{provision.Request{Template: "saas", ExternalID: "tab\there"}, http.StatusBadRequest, "external id"},
	} {
		_, err := c.CreateTenant(ctx, tc.req)
		var apiErr *api.Error
		if !errors.As(err, &apiErr) || apiErr.Status != tc.status || !strings.Contains(apiErr.Message, tc.want) {
			t.Errorf("create %+v: %v; want %d containing %q", tc.req, err, tc.status, tc.want)
		}
	}
	var n int
	if err := pg.Conn(t, catDB).QueryRow(ctx, `SELECT count(*) FROM tenants WHERE state NOT IN ('spare', 'building')`).Scan(&n); err != nil || n != 0 {
		t.Errorf("tenants after bad requests = %d, %v; want 0", n, err)
	}
}

// TestCreate_ClusterDown: a cluster that is down gives 503 and no tenant.
func TestCreate_ClusterDown(t *testing.T) {
	c, catDB := startWithCatalog(t, 0)
	ctx := pgtest.Context(t)
	other, err := pgtest.Start(ctx, pgtest.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer other.Close()
	if _, err := c.AddCluster(ctx, api.AddClusterRequest{Name: "other", DSN: other.PrimaryDSN("postgres")}); err != nil {
		t.Fatal(err)
	}
	daemontest.CreateTemplate(t, c, "saas", examples.Saas())
	if err := other.Stop(ctx); err != nil {
		t.Fatal(err)
	}
	for _, mode := range []string{"database", "schema"} {
		_, err = c.CreateTenant(ctx, provision.Request{Template: "saas", Cluster: "other", Mode: tenant.Mode(mode)})
		var apiErr *api.Error
		if !errors.As(err, &apiErr) || apiErr.Status != http.StatusServiceUnavailable {
			t.Errorf("create on a stopped cluster (%s): %v, want 503", mode, err)
		}
	}
	var n int
	if err := pg.Conn(t, catDB).QueryRow(ctx, `SELECT count(*) FROM tenants WHERE cluster = 'other' AND state NOT IN ('spare', 'building')`).Scan(&n); err != nil || n != 0 {
		t.Errorf("tenants on the stopped cluster = %d, %v; want 0", n, err)
	}
}

// TestCreate_TierApplied: a tier's limits land on the role.
func TestCreate_TierApplied(t *testing.T) {
	c, catDB := startWithCatalog(t, 1)
	ctx := pgtest.Context(t)
	daemontest.CreateTemplate(t, c, "saas", examples.Saas())
	waitSpares(t, catDB, "saas", "database", 1)
	got, err := c.CreateTenant(ctx, provision.Request{Template: "saas", Tier: "small"})
	if err != nil {
		t.Fatal(err)
	}
	conn := pgtest.Connect(t, got.DSN)
	var timeout, workMem string
	if err := conn.QueryRow(ctx, `SELECT current_setting('statement_timeout'), current_setting('work_mem')`).Scan(&timeout, &workMem); err != nil {
		t.Fatal(err)
	}
	if timeout != "2s" || workMem != "1MB" {
		t.Errorf("tier small: statement_timeout=%s work_mem=%s, want 2s and 1MB", timeout, workMem)
	}
	var limit int
	if err := pg.Conn(t, "postgres").QueryRow(ctx, `SELECT rolconnlimit FROM pg_roles WHERE rolname = $1`, "t_"+got.Tenant.ID).Scan(&limit); err != nil || limit != 3 {
		t.Errorf("connection limit = %d, %v; want 3", limit, err)
	}
}

// TestTemplate_ManyRelationsAtDefaultLockLimit: a template of 20,000+
// relations is materialised and provisioned (database mode) with
// max_locks_per_transaction at its default of 64.
func TestTemplate_ManyRelationsAtDefaultLockLimit(t *testing.T) {
	if testing.Short() {
		t.Skip("builds 20,000 relations")
	}
	c, _ := startWithCatalog(t, 0)
	ctx := pgtest.Context(t)
	daemontest.CreateTemplate(t, c, "wide", templates.Wide(200))
	d, err := c.Template(ctx, "wide")
	if err != nil {
		t.Fatal(err)
	}
	if len(d.Builds) != 1 || d.Builds[0].Relations < 20000 {
		t.Fatalf("builds = %+v, want one of at least 20,000 relations", d.Builds)
	}
	got, err := c.CreateTenant(ctx, provision.Request{Template: "wide"})
	if err != nil {
		t.Fatal(err)
	}
	conn := pgtest.Connect(t, got.DSN)
	var notMine int
	if err := conn.QueryRow(ctx, `SELECT count(*) FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
		WHERE n.nspname = 'public' AND pg_get_userbyid(c.relowner) <> current_user`).Scan(&notMine); err != nil || notMine != 0 {
		t.Errorf("relations not owned by the tenant = %d, %v; want 0", notMine, err)
	}
	var locks string
	if err := conn.QueryRow(ctx, `SHOW max_locks_per_transaction`).Scan(&locks); err != nil || locks != "64" {
		t.Errorf("max_locks_per_transaction = %s, want 64", locks)
	}
}

// FuzzCreate_Names sends hostile display names, external ids, template and
// cluster names through the API: each is either refused with 400/404 or
// stored exactly as given, and physical names stay opaque (t_<id>). `go test`
// runs the seeds; `go test -fuzz FuzzCreate_Names ./internal/provision`
// explores further.
func FuzzCreate_Names(f *testing.F) {
	c, catDB := startWithCatalog(f, 0)
	daemontest.CreateTemplate(f, c, "tiny", []templates.Upload{{Name: "0001.sql", Body: "CREATE TABLE t (x int);"}})
	cat := pg.Conn(f, catDB)
	for _, s := range []string{
		"Acme", "'; DROP DATABASE postgres; --", `"; DROP ROLE pgtenant; --`, "Robert'); DROP TABLE tenants;--",
		"$$; SELECT pg_terminate_backend(1); $$", "t_aaaaaaaaaaaa", "\x00", "ünïcødé ☃ 名前", "a\nb", strings.Repeat("é", 200),
	} {
		f.Add(s, s, "tiny")
	}
	f.Add("ok", "", "tiny; DROP DATABASE x")
	f.Add("ok", "", "../../etc")
	f.Fuzz(func(t *testing.T, displayName, externalID, template string) {
		ctx := pgtest.Context(t)
		req := provision.Request{Template: template, Mode: "schema", Name: &displayName, ExternalID: externalID, Cluster: "local"}
		got, err := c.CreateTenant(ctx, req)
		if err != nil {
			var apiErr *api.Error
			t.Logf("refused: %v", err)
			// 409: an external id fuzzed before, with another name.
			if !errors.As(err, &apiErr) || (apiErr.Status != http.StatusBadRequest && apiErr.Status != http.StatusNotFound &&
				(apiErr.Status != http.StatusConflict || externalID == "")) {
				t.Fatalf("create %q/%q/%q: %v, want 400 or 404 (or 409 with an external id)", displayName, externalID, template, err)
			}
			return
		}
		if got.Existing {
			return // the same external id was fuzzed before
		}
		var stored, storedExt string
		if err := cat.QueryRow(ctx, `SELECT name, coalesce(external_id, '') FROM tenants WHERE id = $1`, got.Tenant.ID).Scan(&stored, &storedExt); err != nil {
			t.Fatal(err)
		}
		if stored != displayName || storedExt != externalID {
			t.Errorf("stored %q/%q, want %q/%q", stored, storedExt, displayName, externalID)
		}
		if got.Tenant.Database != "pgt_shared_tiny" || !strings.HasPrefix(got.DSN, "postgres://t_"+got.Tenant.ID+":") {
			t.Errorf("physical names not opaque: database %q dsn %q", got.Tenant.Database, got.DSN)
		}
	})
}

// TestCreate_ConcurrentClaims: many sign-ups at once each get their own
// spare, in both modes (claims must not collide on shared catalog rows).
func TestCreate_ConcurrentClaims(t *testing.T) {
	c, catDB := startWithCatalog(t, 4)
	ctx := pgtest.Context(t)
	daemontest.CreateTemplate(t, c, "saas", examples.Saas())
	waitSpares(t, catDB, "saas", "database", 4)
	waitSpares(t, catDB, "saas", "schema", 4)
	var wg sync.WaitGroup
	paths := make(chan string, 8)
	for i := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			mode := []string{"database", "schema"}[i%2]
			r, err := c.CreateTenant(ctx, provision.Request{Template: "saas", Mode: tenant.Mode(mode)})
			if err != nil {
				t.Errorf("concurrent %s claim: %v", mode, err)
				return
			}
			paths <- r.Path
		}()
	}
	wg.Wait()
	close(paths)
	n := 0
	for p := range paths {
		n++
		if p != "pool" {
			t.Errorf("a concurrent create took the %s path, want pool", p)
		}
	}
	if n != 8 {
		t.Errorf("%d of 8 concurrent creates succeeded", n)
	}
}

// TestCreate_BurstWithRetriesOneTenantEach: a burst of concurrent creates
// in both modes, each external id sent several times at once (the pool
// holds far fewer spares), makes exactly one tenant per external id, and
// every answer for an id carries that tenant and its password.
func TestCreate_BurstWithRetriesOneTenantEach(t *testing.T) {
	c, catDB := startWithCatalog(t, 2)
	ctx := pgtest.Context(t)
	daemontest.CreateTemplate(t, c, "tiny", tiny())
	waitSpares(t, catDB, "tiny", "database", 2)
	waitSpares(t, catDB, "tiny", "schema", 2)

	type answer struct {
		ext string
		r   api.CreateTenantResponse
	}
	const ids, sends = 12, 3
	answers := make(chan answer, ids*sends)
	var wg sync.WaitGroup
	for i := range ids * sends {
		wg.Add(1)
		go func() {
			defer wg.Done()
			ext := fmt.Sprintf("burst-%d", i%ids)
			mode := []string{"database", "schema"}[i%ids%2]
			r, err := c.CreateTenant(ctx, provision.Request{Template: "tiny", Mode: tenant.Mode(mode), ExternalID: ext})
			if err != nil {
				t.Errorf("create %s: %v", ext, err)
				return
			}
			if r.Job != nil { // answered before its build ended: follow it, as the CLI does
				j, err := c.WaitJob(ctx, r.Job.ID, nil)
				if err != nil || j.State != "succeeded" {
					t.Errorf("create %s: build job %d %s %v: %s", ext, j.ID, j.State, err, j.LastError)
				}
			}
			answers <- answer{ext, r}
		}()
	}
	wg.Wait()
	close(answers)
	byExt := map[string][]api.CreateTenantResponse{}
	for a := range answers {
		byExt[a.ext] = append(byExt[a.ext], a.r)
	}
	if len(byExt) != ids {
		t.Fatalf("answers for %d external ids, want %d", len(byExt), ids)
	}
	for ext, rs := range byExt {
		made := 0
		for _, r := range rs {
			if !r.Existing {
				made++
			}
			if r.Tenant.ID != rs[0].Tenant.ID || r.Password == "" || r.Password != rs[0].Password {
				t.Errorf("%s: answers name tenants %s and %s (passwords equal: %v), want one tenant and its password",
					ext, rs[0].Tenant.ID, r.Tenant.ID, r.Password == rs[0].Password)
			}
		}
		if made != 1 {
			t.Errorf("%s: %d of %d answers say they made the tenant, want 1", ext, made, len(rs))
		}
		conn := pgtest.Connect(t, rs[0].DSN)
		var user string
		if err := conn.QueryRow(ctx, `SELECT current_user`).Scan(&user); err != nil || user != "t_"+rs[0].Tenant.ID {
			t.Errorf("%s: log in with the answered DSN: %q, %v", ext, user, err)
		}
	}
	var dup, rows int
	if err := pg.Conn(t, catDB).QueryRow(ctx, `SELECT count(*) - count(DISTINCT external_id), count(*) FROM tenants
		WHERE external_id LIKE 'burst-%'`).Scan(&dup, &rows); err != nil {
		t.Fatal(err)
	}
	if dup != 0 || rows != ids {
		t.Errorf("catalog: %d tenants for %d external ids (%d duplicates), want one each", rows, ids, dup)
	}
}

// TestCreate_ColdWaitEndsWithTheJob: a cold create still building when
// provision.cold_wait ends is answered with its build job, which the
// caller follows to the end.
func TestCreate_ColdWaitEndsWithTheJob(t *testing.T) {
	cfg := daemontest.Config(t, pg)
	cfg.Provision.DefaultPoolSize = 0
	cfg.Provision.ColdWait = 1 // ends during the first read of the job
	_, c := daemontest.Start(t, pg, cfg)
	ctx := pgtest.Context(t)
	daemontest.CreateTemplate(t, c, "tiny", tiny())
	r, err := c.CreateTenant(ctx, provision.Request{Template: "tiny", ExternalID: "slow-1"})
	if err != nil {
		t.Fatal(err)
	}
	if r.Job == nil || r.Job.ID == 0 || r.Job.Target != r.Tenant.ID || r.Password == "" {
		t.Fatalf("answer = %+v, want the tenant with its password and its build job", r)
	}
	j, err := c.WaitJob(ctx, r.Job.ID, nil)
	if err != nil || j.State != jobs.Succeeded {
		t.Fatalf("build job %d: %s %v: %s", r.Job.ID, j.State, err, j.LastError)
	}
	var user string
	if err := pgtest.Connect(t, r.DSN).QueryRow(ctx, `SELECT current_user`).Scan(&user); err != nil || user != "t_"+r.Tenant.ID {
		t.Errorf("log in with the answered DSN: %q, %v", user, err)
	}
}
