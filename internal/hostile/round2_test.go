package hostile_test

import (
	"errors"
	"fmt"
	"net/url"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/pgtenant/pgtenant/internal/api"
	"github.com/pgtenant/pgtenant/internal/cluster"
	"github.com/pgtenant/pgtenant/internal/config"
	"github.com/pgtenant/pgtenant/internal/jobs"
	"github.com/pgtenant/pgtenant/internal/pgtest"
	"github.com/pgtenant/pgtenant/internal/provision"
	"github.com/pgtenant/pgtenant/internal/tenant"
)

// The second red-team run's findings 3 and 9 (docs/SECURITY.md, "Databases,
// markers and what a tenant owns"); the other findings of that run have
// tests of their own beside this file and in internal/analytics.

// reachableRoles lists the roles other than its own that a tenant's role
// can act as (SET ROLE, hand objects to, DROP OWNED BY): the roles it is a
// member of, directly or not.
func reachableRoles(t *testing.T, role string) []string {
	t.Helper()
	ctx := pgtest.Context(t)
	admin := srv.Conn(t, "postgres")
	defer admin.Close(ctx)
	rows, err := admin.Query(ctx, `SELECT rolname::text FROM pg_roles
		WHERE rolname <> $1 AND pg_has_role($1, oid, 'MEMBER') ORDER BY 1`, role)
	if err != nil {
		t.Fatal(err)
	}
	got, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		t.Fatal(err)
	}
	return got
}

// TestR2Finding3_NoRoleIsSharedByTwoTenants: every schema tenant of a
// template was a member of pgt_connect_<template>, so a tenant could hand
// its tables to that role (and write past its quota), SET ROLE to it, and
// DROP OWNED BY it, dropping what its neighbours had handed to it. Now a
// tenant can act as no role but its own, still reaches its shared
// database, and a tenant of the other mode cannot.
func TestR2Finding3_NoRoleIsSharedByTwoTenants(t *testing.T) {
	e := start(t, nil)
	ctx := pgtest.Context(t)
	a := e.tenant(t, "schema", "default")
	b := e.tenant(t, "schema", "default")
	d := e.tenant(t, "database", "default")
	for _, l := range []login{a, b, d} {
		if got := reachableRoles(t, l.Role); len(got) > 0 {
			t.Errorf("%s (%s mode) can act as %v, want no role but its own", l.Role, l.Mode, got)
		}
	}
	ca := connect(t, a.DSN)
	admin := srv.Conn(t, "postgres")
	defer admin.Close(ctx)
	rows, err := admin.Query(ctx, `SELECT rolname::text FROM pg_roles WHERE rolname LIKE 'pgt\_%' OR rolname LIKE 't\_%' ORDER BY 1`)
	if err != nil {
		t.Fatal(err)
	}
	roles, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range roles {
		if r == a.Role {
			continue
		}
		refused(t, ca, "42501", "SET ROLE "+cluster.Ident(r))
		if _, err := ca.Exec(ctx, fmt.Sprintf("ALTER TABLE %s.organizations OWNER TO %s", cluster.Ident(a.Schema), cluster.Ident(r))); err == nil {
			t.Errorf("tenant handed its table to %s", r)
		}
	}

	// CONNECT on the shared database: the schema tenants only.
	cb := connect(t, b.DSN)
	for _, c := range []*pgx.Conn{ca, cb} {
		var one int
		if err := c.QueryRow(ctx, `SELECT 1`).Scan(&one); err != nil {
			t.Errorf("schema tenant cannot use its shared database: %v", err)
		}
	}
	u, err := url.Parse(d.DSN)
	if err != nil {
		t.Fatal(err)
	}
	u.Path = "/" + a.Database
	if c, err := pgx.Connect(ctx, u.String()); err == nil {
		c.Close(ctx)
		t.Errorf("database tenant %s logged in to the shared database %s", d.ID, a.Database)
	} else if pgErr := (*pgconn.PgError)(nil); !errors.As(err, &pgErr) || pgErr.Code != "42501" {
		t.Errorf("database tenant logging in to the shared database: err = %v, want SQLSTATE 42501", err)
	}
}

// TestR2Finding9_LargeObjectsStayTheTenants: a schema tenant's large object
// lives outside its schema. It cannot be handed to a role its neighbours
// reach, a neighbour cannot read it, and the tenant's purge removes it.
func TestR2Finding9_LargeObjectsStayTheTenants(t *testing.T) {
	e := start(t, nil)
	ctx := pgtest.Context(t)
	a := e.tenant(t, "schema", "default")
	b := e.tenant(t, "schema", "default")
	ca, cb := connect(t, a.DSN), connect(t, b.DSN)
	var lo uint32
	if err := ca.QueryRow(ctx, `SELECT lo_from_bytea(0, 'secret of a')`).Scan(&lo); err != nil {
		t.Fatal(err)
	}
	// Handed to a role the neighbours reach, it would outlive the purge.
	for _, r := range append(reachableRoles(t, a.Role), b.Role) {
		if _, err := ca.Exec(ctx, fmt.Sprintf("ALTER LARGE OBJECT %d OWNER TO %s", lo, cluster.Ident(r))); err == nil {
			t.Errorf("tenant handed its large object to role %s", r)
		}
	}
	refused(t, cb, "42501", fmt.Sprintf("SELECT lo_get(%d)", lo))
	refused(t, cb, "42501", fmt.Sprintf("SELECT lo_put(%d, 0, 'x')", lo))

	e.purge(t, a.ID, jobs.Succeeded)
	admin := srv.Conn(t, a.Database)
	defer admin.Close(ctx)
	var left bool
	if err := admin.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM pg_largeobject_metadata WHERE oid = $1)`, lo).Scan(&left); err != nil {
		t.Fatal(err)
	}
	if left {
		t.Errorf("large object %d of purged tenant %s survived its purge", lo, a.ID)
	}
	neighbourWorks(t, b)
}

// TestR2Finding3_ConcurrentClaimsEachGetConnect: each claim grants CONNECT
// on the shared database's one row, under a lock; claims of spares at once
// must not fail with "tuple concurrently updated", and each tenant can log
// in.
func TestR2Finding3_ConcurrentClaimsEachGetConnect(t *testing.T) {
	const n = 8
	e := start(t, func(c *config.Config) {
		c.Pools = []config.PoolConfig{{Template: "saas", Mode: "schema", Size: n}}
	})
	ctx := pgtest.Context(t)
	for spares := 0; spares < n; {
		if err := e.store.Pool().QueryRow(ctx, `SELECT count(*) FROM tenants WHERE state = 'spare' AND mode = 'schema'`).Scan(&spares); err != nil {
			t.Fatal(err)
		}
		if ctx.Err() != nil {
			t.Fatalf("%d schema spares, want %d", spares, n)
		}
		time.Sleep(100 * time.Millisecond)
	}
	var wg sync.WaitGroup
	out := make([]api.CreateTenantResponse, n)
	errs := make([]error, n)
	for i := range n {
		wg.Go(func() {
			out[i], errs[i] = e.c.CreateTenant(ctx, provision.Request{Template: "saas", Mode: tenant.ModeSchema})
		})
	}
	wg.Wait()
	for i := range n {
		if errs[i] != nil {
			t.Errorf("create %d: %v", i, errs[i])
			continue
		}
		c := connect(t, out[i].DSN)
		var who string
		if err := c.QueryRow(ctx, `SELECT current_user`).Scan(&who); err != nil || who != "t_"+out[i].Tenant.ID {
			t.Errorf("tenant %s: current_user = %q, %v", out[i].Tenant.ID, who, err)
		}
	}
}

// TestR2Finding3_LegacyConnectRoleDissolved: on a fleet made by an earlier
// release the schema tenants are members of pgt_connect_<template>;
// reconcile's fix gives each CONNECT of its own, takes the memberships
// away and drops the role, and the tenants go on logging in.
func TestR2Finding3_LegacyConnectRoleDissolved(t *testing.T) {
	e := start(t, nil)
	ctx := pgtest.Context(t)
	a := e.tenant(t, "schema", "default")
	b := e.tenant(t, "schema", "default")
	admin := srv.Conn(t, "postgres")
	defer admin.Close(ctx)
	mustExec(t, admin, fmt.Sprintf(`CREATE ROLE pgt_connect_saas NOLOGIN;
		GRANT CONNECT ON DATABASE %[1]s TO pgt_connect_saas;
		REVOKE CONNECT ON DATABASE %[1]s FROM %[2]s, %[3]s;
		GRANT pgt_connect_saas TO %[2]s, %[3]s`, cluster.Ident(a.Database), cluster.Ident(a.Role), cluster.Ident(b.Role)))
	if got := reachableRoles(t, a.Role); len(got) != 1 {
		t.Fatalf("legacy fleet not set up: %s reaches %v", a.Role, got)
	}

	rep, err := e.c.Reconcile(ctx, api.ReconcileRequest{Fix: true})
	if err != nil {
		t.Fatal(err)
	}
	found := false
	for _, f := range rep.Findings {
		if f.Object == "role pgt_connect_saas" {
			found = true
			if !f.Fixed {
				t.Errorf("legacy connect role not fixed: %+v", f)
			}
		}
	}
	if !found {
		t.Errorf("reconcile did not report the legacy connect role: %+v", rep.Findings)
	}
	var exists bool
	if err := admin.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = 'pgt_connect_saas')`).Scan(&exists); err != nil {
		t.Fatal(err)
	}
	if exists {
		t.Errorf("role pgt_connect_saas is still there")
	}
	for _, l := range []login{a, b} {
		if got := reachableRoles(t, l.Role); len(got) > 0 {
			t.Errorf("%s still reaches %v", l.Role, got)
		}
		neighbourWorks(t, l)
	}
}
