package credentials_test

import (
	"context"
	"errors"
	"net/http"
	"net/url"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/pgtenant/pgtenant/internal/api"
	"github.com/pgtenant/pgtenant/internal/daemon/daemontest"
	"github.com/pgtenant/pgtenant/internal/jobs"
	"github.com/pgtenant/pgtenant/internal/pgtest"
	"github.com/pgtenant/pgtenant/internal/provision"
	"github.com/pgtenant/pgtenant/internal/tenant"
)

// TestLogins_Kinds gives a tenant of each mode a read-only, a read-write
// and a replica login: the read-only one reads the tenant's tables (one
// made after it too) and can write nothing, even with
// default_transaction_read_only off; the read-write one acts as the
// tenant's role (what it makes is the tenant's); the replica one reads on
// the standby. None reaches another tenant. Each is rotated and revoked on
// its own, locked out with its tenant, and purged with it; bad names and
// duplicates are clear errors.
func TestLogins_Kinds(t *testing.T) {
	f := newFixture(t)
	c, _ := f.start(f.cfg)
	createTemplate(t, c, "tiny", false)
	for _, mode := range []string{"database", "schema"} {
		t.Run(mode, func(t *testing.T) {
			ctx := pgtest.Context(t)
			f.waitSpare(mode)
			mk := func() provision.Created {
				t.Helper()
				r, err := c.CreateTenant(ctx, provision.Request{Template: "tiny", Mode: tenant.Mode(mode)})
				if err != nil {
					t.Fatal(err)
				}
				f.saw(r.Password)
				return provision.Created{DSN: r.DSN, Password: r.Password, Tenant: r.Tenant.Tenant}
			}
			own, other := mk(), mk()
			id := own.Tenant.ID
			tconn := mustLogin(t, "primary", own.DSN)
			exec(t, tconn, "INSERT INTO t VALUES (1)")
			oconn := mustLogin(t, "primary", other.DSN)
			exec(t, oconn, "CREATE TABLE secret (x int); INSERT INTO secret VALUES (42)")

			newLogin := func(req api.CreateCredentialRequest) api.CredentialResponse {
				t.Helper()
				out, err := c.CreateCredential(ctx, id, req)
				if err != nil {
					t.Fatalf("credential %s: %v", req.Name, err)
				}
				f.saw(out.Password)
				if out.User != tenant.LoginRole(id, req.Name) || !strings.Contains(out.DSN, out.Password) {
					t.Fatalf("credential %s: user %s, password in the DSN %v", req.Name, out.User, strings.Contains(out.DSN, out.Password))
				}
				return out
			}

			// Read-only.
			ro := newLogin(api.CreateCredentialRequest{Name: "reporting", ReadOnly: true})
			rconn := mustLogin(t, "primary", ro.DSN)
			if n := count(t, rconn, "SELECT count(*) FROM t"); n != 1 {
				t.Errorf("read-only login reads %d rows of t, want 1", n)
			}
			wantCode(t, rconn, "INSERT INTO t VALUES (2)", "25006")
			exec(t, rconn, "SET default_transaction_read_only = off")
			wantCode(t, rconn, "INSERT INTO t VALUES (2)", "42501")
			wantCode(t, rconn, "CREATE TABLE mine (x int)", "42501")
			exec(t, tconn, "CREATE TABLE later (x int); INSERT INTO later VALUES (7)")
			if n := count(t, rconn, "SELECT count(*) FROM later"); n != 1 {
				t.Errorf("read-only login reads %d rows of a table made after it, want 1", n)
			}
			// Another tenant's rows: out of reach.
			if mode == "schema" {
				wantCode(t, rconn, "SELECT * FROM "+tenant.PhysicalName(other.Tenant.ID)+".secret", "42501")
			} else {
				u, _ := url.Parse(ro.DSN)
				u.Path = "/" + other.Tenant.Database
				refusedLogin(t, "another tenant's database", u.String(), "42501")
			}

			// Read-write: the tenant's role.
			rw := newLogin(api.CreateCredentialRequest{Name: "app"})
			wconn := mustLogin(t, "primary", rw.DSN)
			var who string
			if err := wconn.QueryRow(ctx, "SELECT current_user").Scan(&who); err != nil || who != tenant.PhysicalName(id) {
				t.Errorf("read-write login acts as %q (%v), want the tenant's role", who, err)
			}
			exec(t, wconn, "INSERT INTO t VALUES (3); CREATE TABLE made (x int)")
			var owner string
			if err := wconn.QueryRow(ctx, "SELECT tableowner FROM pg_tables WHERE tablename = 'made'").Scan(&owner); err != nil || owner != tenant.PhysicalName(id) {
				t.Errorf("a table the read-write login made belongs to %q (%v), want the tenant's role", owner, err)
			}
			if n := count(t, rconn, "SELECT count(*) FROM made"); n != 0 {
				t.Errorf("read-only login reads %d rows of the read-write login's table, want 0 (and no error)", n)
			}
			// RESET ROLE comes back to the tenant's role (the login's
			// default); SET ROLE NONE leaves the login with nothing.
			schema := "public"
			if mode == "schema" {
				schema = tenant.PhysicalName(id)
			}
			exec(t, wconn, "SET ROLE NONE")
			wantCode(t, wconn, "INSERT INTO "+schema+".t VALUES (4)", "42501")
			wantCode(t, wconn, "CREATE TABLE "+schema+".escaped (x int)", "42501")
			exec(t, wconn, "RESET ROLE")

			// Replica: a standby's.
			rep := newLogin(api.CreateCredentialRequest{Name: "replica", Replica: true})
			if !rep.Credential.ReadOnly {
				t.Error("a replica credential is not read-only")
			}
			pconn := mustLogin(t, "standby", rep.DSN)
			var inRecovery bool
			if err := pconn.QueryRow(ctx, "SELECT pg_is_in_recovery()").Scan(&inRecovery); err != nil || !inRecovery {
				t.Errorf("replica login on a server in recovery: %v (%v), want a standby", inRecovery, err)
			}

			// Bad input.
			var apiErr *api.Error
			for _, name := range []string{"Bad", "x'; DROP ROLE postgres; --", "a_b", strings.Repeat("a", 21)} {
				if _, err := c.CreateCredential(ctx, id, api.CreateCredentialRequest{Name: name}); !errors.As(err, &apiErr) || apiErr.Status != http.StatusBadRequest {
					t.Errorf("credential name %q: %v, want 400", name, err)
				}
			}
			if _, err := c.CreateCredential(ctx, id, api.CreateCredentialRequest{Name: "app"}); !errors.As(err, &apiErr) || apiErr.Status != http.StatusConflict {
				t.Errorf("a second credential app: %v, want 409", err)
			}
			if _, err := c.CreateCredential(ctx, "nosuchtenant", api.CreateCredentialRequest{Name: "x"}); !errors.As(err, &apiErr) || apiErr.Status != http.StatusNotFound {
				t.Errorf("credential of an unknown tenant: %v, want 404", err)
			}

			// Rotation of one: its old password refused, the others untouched.
			rot, err := c.RotateCredential(ctx, id, "reporting")
			if err != nil {
				t.Fatal(err)
			}
			f.saw(rot.Password)
			ended(t, "primary", rconn)
			refusedLogin(t, "primary", ro.DSN, "28P01")
			rconn = mustLogin(t, "primary", rot.DSN)
			alive(t, "primary", wconn)

			// Revocation: its session ended, its role gone; again: no error.
			left, err := c.RevokeCredential(ctx, id, "app")
			if err != nil {
				t.Fatal(err)
			}
			if len(left) != 2 {
				t.Errorf("%d credentials left after a revoke, want 2", len(left))
			}
			ended(t, "primary", wconn)
			refusedLogin(t, "primary", rw.DSN, "28P01")
			if _, err := c.RevokeCredential(ctx, id, "app"); err != nil {
				t.Errorf("revoke again: %v, want no error", err)
			}

			// Locked out with the tenant, back with it.
			if _, err := c.TenantAction(ctx, id, "suspend"); err != nil {
				t.Fatal(err)
			}
			ended(t, "primary", rconn)
			refusedLogin(t, "primary", rot.DSN, "28000")
			if _, err := c.TenantAction(ctx, id, "resume"); err != nil {
				t.Fatal(err)
			}
			mustLogin(t, "primary", rot.DSN)

			// Purged with the tenant.
			dropped, err := c.DropTenant(ctx, id, true)
			if err != nil {
				t.Fatal(err)
			}
			if j, err := c.WaitJob(ctx, dropped.Job.ID, nil); err != nil || j.State != jobs.Succeeded {
				t.Fatalf("purge: %v %s", err, j.LastError)
			}
			admin := pg.Conn(t, "postgres")
			var roles int
			if err := admin.QueryRow(ctx, `SELECT count(*) FROM pg_roles WHERE rolname LIKE $1`, tenant.PhysicalName(id)+`\_%`).Scan(&roles); err != nil || roles != 0 {
				t.Errorf("%d login roles left after the purge (%v), want 0", roles, err)
			}
		})
	}
}

func exec(t *testing.T, conn *pgx.Conn, sql string) {
	t.Helper()
	if _, err := conn.Exec(context.Background(), sql); err != nil {
		t.Fatalf("%s: %v", sql, err)
	}
}

func count(t *testing.T, conn *pgx.Conn, sql string) int {
	t.Helper()
	var n int
	if err := conn.QueryRow(context.Background(), sql).Scan(&n); err != nil {
		t.Errorf("%s: %v", sql, err)
		return -1
	}
	return n
}

func wantCode(t *testing.T, conn *pgx.Conn, sql, code string) {
	t.Helper()
	_, err := conn.Exec(context.Background(), sql)
	var pgErr *pgconn.PgError
	if !errors.As(err, &pgErr) || pgErr.Code != code {
		t.Errorf("%s: %v, want SQLSTATE %s", sql, err, code)
	}
}

// TestLogins_ThroughTheFrontDoor: with a pooler in front of the cluster, a
// tenant's logins get the front door's DSN: the read-only one reaches the
// tenant's entry (and no other tenant's), the replica one the entry of the
// standby; a revoked login is "login rejected" there at once. The
// tenant's allowlist holds every one of its logins to the networks it
// names: an address outside it is rejected, one inside (or any, once the
// list is lifted) logs in; a malformed network is a 400.
func TestLogins_ThroughTheFrontDoor(t *testing.T) {
	ctx := pgtest.Context(t)
	cfg := daemontest.Config(t, pg)
	cfg.Provision.DefaultPoolSize = 0
	cfg.Metrics.Interval = 0
	d, c := daemontest.StartPooled(t, pg, cfg)
	createTemplate(t, c, "tiny", false)
	front := d.Poolers().Get("local").PublicAddr()
	mk := func() api.CreateTenantResponse {
		t.Helper()
		r, err := c.CreateTenant(ctx, provision.Request{Template: "tiny", Mode: tenant.ModeDatabase})
		if err != nil {
			t.Fatal(err)
		}
		if r.Job != nil {
			if j, err := c.WaitJob(ctx, r.Job.ID, nil); err != nil || j.State != jobs.Succeeded {
				t.Fatalf("cold create: %v %s", err, j.LastError)
			}
		}
		return r
	}
	own, other := mk(), mk()
	id := own.Tenant.ID
	exec(t, mustLogin(t, "the front door", own.DSN), "INSERT INTO t VALUES (1)")

	ro, err := c.CreateCredential(ctx, id, api.CreateCredentialRequest{Name: "reports", ReadOnly: true})
	if err != nil {
		t.Fatal(err)
	}
	rep, err := c.CreateCredential(ctx, id, api.CreateCredentialRequest{Name: "dash", Replica: true})
	if err != nil {
		t.Fatal(err)
	}
	for _, dsn := range []string{ro.DSN, rep.DSN} {
		if u, _ := url.Parse(dsn); u.Host != front {
			t.Errorf("a login's DSN %s is not the front door's (%s)", u.Redacted(), front)
		}
	}
	rconn := mustLogin(t, "the front door", ro.DSN)
	if n := count(t, rconn, "SELECT count(*) FROM t"); n != 1 {
		t.Errorf("read-only login through the front door reads %d rows, want 1", n)
	}
	pconn := mustLogin(t, "the standby entry", rep.DSN)
	var inRecovery bool
	if err := pconn.QueryRow(ctx, "SELECT pg_is_in_recovery()").Scan(&inRecovery); err != nil || !inRecovery {
		t.Errorf("replica login through the front door on a server in recovery: %v (%v), want the standby", inRecovery, err)
	}
	onEntry := func(dsn, entry string) string {
		u, _ := url.Parse(dsn)
		u.Path = "/" + entry
		return u.String()
	}
	rejected := func(what, dsn string) {
		t.Helper()
		conn, err := connect(t, dsn)
		if err == nil {
			conn.Close(ctx)
		}
		if err == nil || !strings.Contains(err.Error(), "login rejected") {
			t.Errorf("%s: %v, want login rejected", what, err)
		}
	}
	rejected("the read-only login on another tenant's entry", onEntry(ro.DSN, tenant.PhysicalName(other.Tenant.ID)))
	rejected("the read-only login on the standby entry", onEntry(ro.DSN, tenant.StandbyEntry(id)))
	rejected("the tenant's own user on its standby entry", onEntry(own.DSN, tenant.StandbyEntry(id)))

	// The allowlist: 127.0.0.1 is outside 10.9.8.7/32.
	var apiErr *api.Error
	if _, err := c.SetTenant(ctx, id, api.SetTenantRequest{Allow: &[]string{"10.0.0.0/33"}}); !errors.As(err, &apiErr) || apiErr.Status != http.StatusBadRequest {
		t.Errorf("a malformed network: %v, want 400", err)
	}
	set, err := c.SetTenant(ctx, id, api.SetTenantRequest{Allow: &[]string{"10.9.8.7", "10.9.8.7/32"}})
	if err != nil {
		t.Fatal(err)
	}
	if len(set.Tenant.Allow) != 1 || set.Tenant.Allow[0] != "10.9.8.7/32" {
		t.Errorf("allow as recorded: %v, want [10.9.8.7/32]", set.Tenant.Allow)
	}
	rejected("the tenant from outside its allowlist", own.DSN)
	rejected("its read-only login from outside its allowlist", ro.DSN)
	rejected("its replica login from outside its allowlist", rep.DSN)
	mustLogin(t, "another tenant's entry, no allowlist", other.DSN)
	if _, err := c.SetTenant(ctx, id, api.SetTenantRequest{Allow: &[]string{"127.0.0.0/8", "::1/128"}}); err != nil {
		t.Fatal(err)
	}
	mustLogin(t, "the front door, inside the allowlist", own.DSN)
	mustLogin(t, "the front door, inside the allowlist", ro.DSN)
	if _, err := c.SetTenant(ctx, id, api.SetTenantRequest{Allow: &[]string{}}); err != nil {
		t.Fatal(err)
	}
	mustLogin(t, "the front door, allowlist lifted", rep.DSN)

	if _, err := c.RevokeCredential(ctx, id, "reports"); err != nil {
		t.Fatal(err)
	}
	rejected("a revoked login", ro.DSN)
}
