package move_test

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/pgtenant/pgtenant/internal/api"
	"github.com/pgtenant/pgtenant/internal/catalog"
	"github.com/pgtenant/pgtenant/internal/config"
	"github.com/pgtenant/pgtenant/internal/daemon/daemontest"
	"github.com/pgtenant/pgtenant/internal/jobs"
	"github.com/pgtenant/pgtenant/internal/pgtest"
	"github.com/pgtenant/pgtenant/internal/provision"
	"github.com/pgtenant/pgtenant/internal/reconcile"
	"github.com/pgtenant/pgtenant/internal/tenant"
)

// TestTierChange_InPlaceAndByMove changes a tenant's tier three times:
// in place to a bigger tier (role limits, settings and pooler entry follow
// at once, the same tier again changes nothing); in place back down while
// the tenant holds its role's row with an uncommitted ALTER ROLE of its
// own (that session is ended, the limits are set); and to a tier whose
// cluster_label only local2 has, which moves the tenant there and records
// the tier at the switch. Unknown tiers and hostile ids are clear errors.
func TestTierChange_InPlaceAndByMove(t *testing.T) {
	ctx := pgtest.Context(t)
	cfg := testConfig(t)
	cfg.Tiers["big"] = config.Tier{ConnectionLimit: 9, StatementTimeout: config.Duration(time.Minute), WorkMem: 8 << 20,
		PoolMode: "session", PoolSize: 4, MaxDBConnections: 6, Extensions: []string{"hstore"}}
	cfg.Tiers["eu"] = config.Tier{ConnectionLimit: 7, ClusterLabel: "region=eu", Extensions: []string{"citext"}}
	d, c, _ := daemontest.StartClusters(t, pgs, cfg, true)
	buildSaas(t, c)
	r, err := c.CreateTenant(ctx, provision.Request{Template: "saas", Mode: "database", Tier: pooledTier, Cluster: "local"})
	if err != nil {
		t.Fatal(err)
	}
	id, role := r.Tenant.ID, tenant.PhysicalName(r.Tenant.ID)
	login, err := c.CreateCredential(ctx, id, api.CreateCredentialRequest{Name: "reports", ReadOnly: true})
	if err != nil {
		t.Fatal(err)
	}
	roleOn := func(clusterName string, roles ...string) (limit int, settings []string) {
		t.Helper()
		name := role
		if len(roles) > 0 {
			name = roles[0]
		}
		i := slices.IndexFunc(pgs, func(p *pgtest.Cluster) bool { return p.Name() == clusterName })
		pool, err := pgs[i].Admin(t).Admin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if err := pool.QueryRow(ctx, `SELECT r.rolconnlimit, coalesce((SELECT s.setconfig FROM pg_db_role_setting s
			WHERE s.setrole = r.oid AND s.setdatabase = 0), '{}') FROM pg_roles r WHERE r.rolname = $1`, name).Scan(&limit, &settings); err != nil {
			t.Fatal(err)
		}
		slices.Sort(settings)
		return limit, settings
	}
	tierEvents := func() []map[string]any {
		t.Helper()
		v, err := c.Tenant(ctx, id)
		if err != nil {
			t.Fatal(err)
		}
		var out []map[string]any
		for _, e := range v.Events {
			if e.Kind == provision.EventTierChanged {
				var m map[string]any
				if err := json.Unmarshal(e.Detail, &m); err != nil {
					t.Fatal(err)
				}
				out = append(out, m)
			}
		}
		return out
	}

	// 1. In place, up.
	out, err := c.SetTenantTier(ctx, id, "big")
	if err != nil {
		t.Fatal(err)
	}
	if out.Job != nil || out.Tenant.Tier != "big" || out.Tenant.Cluster != "local" {
		t.Fatalf("in place: tier %q cluster %q job %v, want big on local and no job", out.Tenant.Tier, out.Tenant.Cluster, out.Job)
	}
	if limit, settings := roleOn("local"); limit != 9 || !slices.Equal(settings, []string{"statement_timeout=60000ms", "work_mem=8192kB"}) {
		t.Errorf("role after the change: limit %d settings %v, want 9 and the big tier's", limit, settings)
	}
	if limit, settings := roleOn("local", login.User); limit != 9 || !slices.Contains(settings, "work_mem=8192kB") {
		t.Errorf("the tenant's read-only login after the change: limit %d settings %v, want the big tier's", limit, settings)
	}
	front := d.Poolers().Get("local")
	if db := front.Snapshot().Databases[role]; db.PoolMode != "session" || db.PoolSize != 4 || db.MaxConnections != 6 {
		t.Errorf("pooler entry after the change: %+v, want session, pool 4, max 6", db)
	}
	if _, err := c.SetTenantTier(ctx, id, "big"); err != nil {
		t.Fatal(err)
	}
	// The big tier's extension: the tenant makes it and uses it; another
	// is refused, naming what the tier allows.
	asTenant(t, r.DirectDSN, `CREATE EXTENSION hstore; CREATE TABLE attrs (id int PRIMARY KEY, a hstore);
		INSERT INTO attrs VALUES (1, 'k => v')`)
	if err := execTenant(ctx, r.DirectDSN, "CREATE EXTENSION citext"); !refusedExtension(err, "citext", "hstore") {
		t.Errorf("an extension the big tier does not list: %v, want refused", err)
	}
	if evs := tierEvents(); len(evs) != 1 || evs[0]["from"] != pooledTier || evs[0]["to"] != "big" || evs[0]["in_place"] != true {
		t.Errorf("tier events %v, want one in-place pooled → big (the same tier again changes nothing)", evs)
	}

	// 2. In place, down, against a tenant holding its role's row.
	hostile, err := connectDSN(ctx, r.DirectDSN)
	if err != nil {
		t.Fatal(err)
	}
	defer hostile.Close(context.Background())
	if _, err := hostile.Exec(ctx, "BEGIN; ALTER ROLE "+role+" SET work_mem = '1GB'"); err != nil {
		t.Fatal(err)
	}
	if _, err := c.SetTenantTier(ctx, id, pooledTier); err != nil {
		t.Fatalf("a downgrade held off by the tenant's own ALTER ROLE: %v", err)
	}
	if limit, settings := roleOn("local"); limit != 5 || !slices.Equal(settings, []string{"statement_timeout=30000ms"}) {
		t.Errorf("role after the downgrade: limit %d settings %v, want 5 and statement_timeout only", limit, settings)
	}
	if _, err := hostile.Exec(ctx, "COMMIT"); err == nil {
		t.Error("the session holding the tenant's role row still commits: it was not ended")
	}
	if evs := tierEvents(); len(evs) != 2 || evs[1]["sessions_ended"].(float64) < 1 {
		t.Errorf("tier events %v, want the downgrade with sessions_ended ≥ 1", evs)
	}
	// The pooled tier lists none: what the tenant made stays, nothing new.
	if err := execTenant(ctx, r.DirectDSN, "CREATE EXTENSION pg_trgm"); !refusedExtension(err, "pg_trgm", "none") {
		t.Errorf("an extension after the downgrade to a tier that lists none: %v, want refused", err)
	}
	// A database without a guard (made before pgtenant had one):
	// reconcile finds it and installs the guard with the tier's list.
	i := slices.IndexFunc(pgs, func(p *pgtest.Cluster) bool { return p.Name() == "local" })
	tconn, err := pgs[i].Admin(t).Connect(ctx, role)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := tconn.Exec(ctx, "DROP EVENT TRIGGER pgt_extension_guard; ALTER DATABASE "+role+" RESET "+tenant.ExtensionsSetting); err != nil {
		t.Fatal(err)
	}
	tconn.Close(ctx)
	rep, err := c.Reconcile(ctx, api.ReconcileRequest{Cluster: "local", Fix: true})
	if err != nil {
		t.Fatal(err)
	}
	if i := slices.IndexFunc(rep.Findings, func(f reconcile.Finding) bool { return f.Object == "database "+role }); i < 0 ||
		!rep.Findings[i].Fixed || !strings.Contains(rep.Findings[i].Detail, "no extension guard") {
		t.Errorf("reconcile of a database without its guard: %+v, want a fixed finding", rep.Findings)
	}
	if err := execTenant(ctx, r.DirectDSN, "CREATE EXTENSION pg_trgm"); !refusedExtension(err, "pg_trgm", "none") {
		t.Errorf("an extension after reconcile put the guard back: %v, want refused", err)
	}

	// 3. Bad input.
	var apiErr *api.Error
	if _, err := c.SetTenantTier(ctx, id, "platinum"); !errors.As(err, &apiErr) || apiErr.Status != http.StatusBadRequest ||
		!strings.Contains(err.Error(), "big, default") {
		t.Errorf("unknown tier: %v, want 400 naming the tiers", err)
	}
	if _, err := c.SetTenantTier(ctx, "x'; DROP ROLE postgres; --", "big"); !errors.As(err, &apiErr) || apiErr.Status != http.StatusNotFound {
		t.Errorf("hostile id: %v, want 404", err)
	}

	// 4. A tier whose placement needs another cluster: a move.
	if _, err := c.SetTenantTier(ctx, id, "eu"); err == nil || !strings.Contains(err.Error(), "lacks label region=eu") {
		t.Errorf("a tier no cluster admits: %v, want an error naming the label", err)
	}
	if _, err := c.SetCluster(ctx, "local2", catalog.PlacementChange{Labels: map[string]string{"region": "eu"}}); err != nil {
		t.Fatal(err)
	}
	out, err = c.SetTenantTier(ctx, id, "eu")
	if err != nil {
		t.Fatal(err)
	}
	if out.Job == nil || out.Job.Cluster != "local2" || out.Tenant.Tier != pooledTier {
		t.Fatalf("tier needing local2: job %v tier %q, want a move to local2 and the old tier until its switch", out.Job, out.Tenant.Tier)
	}
	if j, err := c.WaitJob(ctx, out.Job.ID, nil); err != nil || j.State != jobs.Succeeded {
		t.Fatalf("the tier's move: %v %s", err, j.LastError)
	}
	v, err := c.Tenant(ctx, id)
	if err != nil {
		t.Fatal(err)
	}
	if v.Tier != "eu" || v.Cluster != "local2" {
		t.Errorf("after the move: tier %q on %q, want eu on local2", v.Tier, v.Cluster)
	}
	if limit, settings := roleOn("local2"); limit != 7 || len(settings) != 0 {
		t.Errorf("role on local2: limit %d settings %v, want the eu tier's (7, none)", limit, settings)
	}
	if limit, settings := roleOn("local2", login.User); limit != 7 || !slices.Equal(settings, []string{"default_transaction_read_only=on"}) {
		t.Errorf("the read-only login on local2: limit %d settings %v, want the eu tier's and read-only", limit, settings)
	}
	if evs := tierEvents(); len(evs) != 3 || evs[2]["moved_to"] != "local2" {
		t.Errorf("tier events %v, want the last one recorded at the move's switch", evs)
	}
	// The move carried the tenant's extension and its data, and the
	// target holds it to the eu tier's list.
	asTenant(t, r.DSN, `CREATE EXTENSION citext`)
	if got := queryTenant(t, r.DSN, `SELECT a -> 'k' FROM attrs WHERE id = 1`); got != "v" {
		t.Errorf("the hstore column after the move: %q, want v", got)
	}
	if err := execTenant(ctx, r.DSN, "CREATE EXTENSION pg_trgm"); !refusedExtension(err, "pg_trgm", "citext") {
		t.Errorf("an extension the eu tier does not list, on local2: %v, want refused", err)
	}
	// The tenant's DSN and its read-only login's (the front door's) reach
	// it on local2: same passwords, the login's grants made there.
	for what, dsn := range map[string]string{"the tenant's DSN": r.DSN, "its read-only login's DSN": login.DSN} {
		conn, err := connectDSN(ctx, dsn)
		if err != nil {
			t.Errorf("%s after the tier's move: %v", what, err)
			continue
		}
		var n int
		if err := conn.QueryRow(ctx, "SELECT count(*) FROM organizations").Scan(&n); err != nil {
			t.Errorf("query through %s after the tier's move: %v", what, err)
		}
		conn.Close(context.Background())
	}
}

// execTenant runs sql in a new session of dsn.
func execTenant(ctx context.Context, dsn, sql string) error {
	conn, err := connectDSN(ctx, dsn)
	if err != nil {
		return err
	}
	defer conn.Close(context.Background())
	_, err = conn.Exec(ctx, sql)
	return err
}

func asTenant(t *testing.T, dsn, sql string) {
	t.Helper()
	if err := execTenant(pgtest.Context(t), dsn, sql); err != nil {
		t.Fatalf("%s: %v", sql, err)
	}
}

func queryTenant(t *testing.T, dsn, sql string) string {
	t.Helper()
	ctx := pgtest.Context(t)
	conn, err := connectDSN(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(context.Background())
	var out string
	if err := conn.QueryRow(ctx, sql).Scan(&out); err != nil {
		t.Fatalf("%s: %v", sql, err)
	}
	return out
}

// refusedExtension says whether err is the extension guard's refusal of
// ext, naming what the tier allows.
func refusedExtension(err error, ext, allows string) bool {
	var pgErr *pgconn.PgError
	return errors.As(err, &pgErr) && pgErr.Code == "42501" && pgErr.Message == "extension "+ext+" is not allowed for this tenant" &&
		pgErr.Detail == "The tenant's tier allows "+allows+"."
}
