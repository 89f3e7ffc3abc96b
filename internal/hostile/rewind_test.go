package hostile_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pgtenant/pgtenant/internal/api"
	"github.com/pgtenant/pgtenant/internal/backup"
	"github.com/pgtenant/pgtenant/internal/backup/backuptest"
	"github.com/pgtenant/pgtenant/internal/cluster"
	"github.com/pgtenant/pgtenant/internal/config"
	"github.com/pgtenant/pgtenant/internal/jobs"
	"github.com/pgtenant/pgtenant/internal/provision"
	"github.com/pgtenant/pgtenant/internal/templates"
	"github.com/pgtenant/pgtenant/internal/tenant"
)

// plantRestorePayload is what a tenant plants for a restore to replay: a
// CHECK constraint (and, in database mode, an index expression) that call
// pwn, which records who ran it in its table's schema's tripwire and tries
// every way to more privilege (RESET ROLE, SET SESSION AUTHORIZATION, ALTER
// ROLE … SUPERUSER, the server-file roles), then sets back the role it
// found, whatever that is (a fork runs it as another tenant's role). pwn
// finds the tripwire through the table it is called for (tableoid): a
// fork's copy of a schema tenant has another schema name, and a body that
// names the source's schema reaches the source, where the copy has no
// rights. zz_guarded is copied after tripwire (the copy goes in name
// order), so the trips of its CHECK land in the copy.
func plantRestorePayload(t *testing.T, ctx context.Context, dsn string, mode tenant.Mode, schema, role string) {
	t.Helper()
	s, r := cluster.Ident(schema), cluster.Ident(role)
	index := ""
	if mode == tenant.ModeDatabase {
		index = fmt.Sprintf(`
		-- An index expression must be immutable: a wrapper that says so.
		CREATE FUNCTION %[1]s.pwn_indexed(v int) RETURNS boolean LANGUAGE plpgsql IMMUTABLE AS $f$
			BEGIN RETURN %[1]s.pwn('index ' || v, '%[1]s.zz_guarded'::pg_catalog.regclass); END $f$;
		CREATE INDEX zz_guarded_pwn ON %[1]s.zz_guarded ((%[1]s.pwn_indexed(v)));`, s)
	}
	backuptest.Exec(t, ctx, dsn, fmt.Sprintf(`
		CREATE TABLE %[1]s.tripwire (what text, session_role text, current_role_name text, privileged bool);
		CREATE FUNCTION %[1]s.pwn(what text, rel pg_catalog.regclass) RETURNS boolean LANGUAGE plpgsql AS $f$
		DECLARE su boolean; me text := current_user; schema text;
		BEGIN
			SELECT rolsuper OR rolcreaterole INTO su FROM pg_catalog.pg_roles WHERE rolname OPERATOR(pg_catalog.=) session_user;
			SELECT relnamespace::pg_catalog.regnamespace::text INTO schema FROM pg_catalog.pg_class WHERE oid OPERATOR(pg_catalog.=) rel;
			EXECUTE pg_catalog.format('INSERT INTO %%s.tripwire VALUES ($1, $2, $3, $4)', schema) USING what, session_user, current_user, coalesce(su, false);
			BEGIN EXECUTE 'RESET ROLE'; EXCEPTION WHEN OTHERS THEN NULL; END;
			BEGIN EXECUTE 'SET SESSION AUTHORIZATION DEFAULT'; EXCEPTION WHEN OTHERS THEN NULL; END;
			BEGIN EXECUTE 'ALTER ROLE %[2]s SUPERUSER'; EXCEPTION WHEN OTHERS THEN NULL; END;
			BEGIN EXECUTE 'ALTER ROLE %[2]s CREATEROLE CREATEDB BYPASSRLS REPLICATION'; EXCEPTION WHEN OTHERS THEN NULL; END;
			BEGIN EXECUTE 'GRANT pg_execute_server_program, pg_read_server_files, pg_write_server_files TO %[2]s'; EXCEPTION WHEN OTHERS THEN NULL; END;
			BEGIN EXECUTE pg_catalog.format('SET ROLE %%I', me); EXCEPTION WHEN OTHERS THEN NULL; END;
			RETURN true;
		END $f$;
		CREATE TABLE %[1]s.zz_guarded (id int PRIMARY KEY, v int CHECK (%[1]s.pwn('check', tableoid)));
		INSERT INTO %[1]s.zz_guarded SELECT g, g FROM pg_catalog.generate_series(1, 3) g;%[3]s
		DELETE FROM %[1]s.tripwire`, s, r, index))
}

// restoreTrips reads the tripwire of the tenant whose schema is schema in
// database db of the cluster.
func restoreTrips(t *testing.T, ctx context.Context, dsn, schema string) []trip {
	t.Helper()
	conn, err := pgx.Connect(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	rows, err := conn.Query(ctx, fmt.Sprintf(`SELECT what, session_role, current_role_name, privileged FROM %s.tripwire`, cluster.Ident(schema)))
	if err != nil {
		t.Fatal(err)
	}
	out, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (trip, error) {
		var x trip
		return x, r.Scan(&x.What, &x.SessionRole, &x.CurrentRole, &x.Privileged)
	})
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// TestRewindForkImport_ReplayTenantCodeAsTheTenant: a rewind, a fork and
// an import of an export replay a tenant's definitions, and its CHECK (and
// index expression) run during the copy. They run in the new tenant's
// agent session only (session user pgt_agent_<new tenant>, never a
// privileged one: the scratch instance's superuser only dumps; an import's
// scratch load runs as a role without privilege), every escalation pwn
// tries fails, and no tenant or agent role holds a privilege a tenant may
// not have afterwards.
func TestRewindForkImport_ReplayTenantCodeAsTheTenant(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 8*time.Minute)
	defer cancel()
	fc, st := backuptest.Cluster(t, ctx, 0)
	backuptest.Exec(t, ctx, fc.PrimaryDSN("postgres"), `CREATE DATABASE catalog`)
	c, _ := backuptest.Daemon(t, fc, "catalog", map[string]*backup.Stanza{fc.Name(): st}, func(cfg *config.Config) {
		cfg.Provision.ReservedConnections = 5
		cfg.Provision.ConnectionOvercommit = 100
	})
	for {
		info, err := st.Info(ctx)
		if err == nil && len(info.Backups) > 0 && !info.Running {
			break
		}
		select {
		case <-ctx.Done():
			t.Fatal("no first backup")
		case <-time.After(200 * time.Millisecond):
		}
	}
	added, err := c.CreateTemplate(ctx, "shop", []templates.Upload{{Name: "0001_init.sql", Body: "CREATE TABLE settings (k text PRIMARY KEY, v text);"}})
	if err != nil {
		t.Fatal(err)
	}
	for _, j := range added.BuildJobs {
		if j, err := c.WaitJob(ctx, j.ID, nil); err != nil || j.State != jobs.Succeeded {
			t.Fatalf("build: %v %s", err, j.LastError)
		}
	}
	for _, mode := range []tenant.Mode{tenant.ModeDatabase, tenant.ModeSchema} {
		r, err := c.CreateTenant(ctx, provision.Request{Template: "shop", Mode: mode})
		if err != nil {
			t.Fatal(err)
		}
		role := tenant.PhysicalName(r.Tenant.ID)
		schema := "public"
		if mode == tenant.ModeSchema {
			schema = role
		}
		plantRestorePayload(t, ctx, r.DSN, mode, schema, role)
		time.Sleep(1100 * time.Millisecond)
		at := time.Now()
		time.Sleep(1100 * time.Millisecond)

		j, err := c.RewindTenant(ctx, r.Tenant.ID, at)
		if err != nil {
			t.Fatal(err)
		}
		if j, err = c.WaitJob(ctx, j.ID, nil); err != nil || j.State != jobs.Succeeded {
			t.Fatalf("%s rewind: %v %s %s", mode, err, j.State, j.LastError)
		}
		shown, err := c.Tenant(ctx, r.Tenant.ID)
		if err != nil {
			t.Fatal(err)
		}
		var kept string
		for _, e := range shown.Events {
			if e.Kind == "rewound" {
				var d struct {
					KeptAs string `json:"kept_as"`
				}
				_ = json.Unmarshal(e.Detail, &d)
				kept = d.KeptAs
			}
		}
		checkTrips(t, mode, "rewind", restoreTrips(t, ctx, r.DSN, schema), kept)

		fork, err := c.ForkTenant(ctx, r.Tenant.ID, api.ForkTenantRequest{At: &at})
		if err != nil {
			t.Fatal(err)
		}
		if j, err := c.WaitJob(ctx, fork.Job.ID, nil); err != nil || j.State != jobs.Succeeded {
			t.Fatalf("%s fork: %v %s %s", mode, err, j.State, j.LastError)
		}
		forkSchema := "public"
		if mode == tenant.ModeSchema {
			forkSchema = tenant.PhysicalName(fork.Tenant.ID)
		}
		checkTrips(t, mode, "fork", restoreTrips(t, ctx, fork.DSN, forkSchema), fork.Tenant.ID)

		// An import loads the archive into a scratch instance as a role
		// without privilege ("tenant" there), then copies it as a fork does.
		backuptest.Exec(t, ctx, r.DSN, fmt.Sprintf(`DELETE FROM %s.tripwire`, cluster.Ident(schema)))
		var archive bytes.Buffer
		if _, err := c.ExportTenant(ctx, r.Tenant.ID, &archive, nil); err != nil {
			t.Fatal(err)
		}
		// The export (pg_dump in an admin session) read the tenant and ran
		// none of its code: the source's tripwire is still empty.
		if trips := restoreTrips(t, ctx, r.DSN, schema); len(trips) > 0 {
			t.Errorf("%s export: tenant code ran during it: %v", mode, trips)
		}
		imp, err := c.ImportTenant(ctx, &archive, api.ImportTenantQuery{})
		if err != nil {
			t.Fatal(err)
		}
		if j, err := c.WaitJob(ctx, imp.Job.ID, nil); err != nil || j.State != jobs.Succeeded {
			t.Fatalf("%s import: %v %s %s", mode, err, j.State, j.LastError)
		}
		impSchema := "public"
		if mode == tenant.ModeSchema {
			impSchema = tenant.PhysicalName(imp.Tenant.ID)
		}
		var loaded, copied []trip
		for _, tr := range restoreTrips(t, ctx, imp.DSN, impSchema) {
			if tr.SessionRole == "tenant" && !tr.Privileged {
				loaded = append(loaded, tr)
			} else {
				copied = append(copied, tr)
			}
		}
		if len(loaded) < 3 {
			t.Errorf("%s import: the archive's CHECK ran %d times in the scratch load, want 3 (as its unprivileged loader): %v", mode, len(loaded), loaded)
		}
		checkTrips(t, mode, "import", copied, imp.Tenant.ID)
	}
	if p := gainedPrivilege(t, ctx, fc.PrimaryDSN("postgres")); len(p) > 0 {
		t.Errorf("roles with privileges no tenant may have: %s", strings.Join(p, "; "))
	}
}

// checkTrips wants the planted code to have run during the copy (its
// CHECK for each row, its index expression), each time in the agent
// session of the tenant the copy went into, never in a privileged one.
func checkTrips(t *testing.T, mode tenant.Mode, what string, got []trip, into string) {
	t.Helper()
	var check, index int
	for _, tr := range got {
		if tr.Privileged || tr.SessionRole != tenant.AgentRole(into) {
			t.Errorf("%s %s: tenant code ran in a session of %s, want only %s's agent: %s", mode, what, tr.SessionRole, into, tr)
		}
		switch {
		case tr.What == "check":
			check++
		case strings.HasPrefix(tr.What, "index "):
			index++
		}
	}
	wantIndex := 3
	if mode == tenant.ModeSchema {
		wantIndex = 0 // not planted
	}
	if check < 3 || index < wantIndex {
		t.Errorf("%s %s: the copy ran the CHECK %d and the index expression %d times, want 3 and %d (trips %v)", mode, what, check, index, wantIndex, got)
	}
}

// gainedPrivilege lists tenant and agent roles holding a privilege or a
// membership no tenant may have.
func gainedPrivilege(t *testing.T, ctx context.Context, dsn string) []string {
	t.Helper()
	conn, err := pgx.Connect(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	rows, err := conn.Query(ctx, `SELECT r.rolname FROM pg_roles r
		WHERE (r.rolname LIKE 't\_%' OR r.rolname LIKE 'pgt\_%')
		  AND (r.rolsuper OR r.rolcreaterole OR r.rolcreatedb OR r.rolreplication OR r.rolbypassrls
		       OR EXISTS (SELECT 1 FROM pg_auth_members m JOIN pg_roles g ON g.oid = m.roleid
		                  WHERE m.member = r.oid AND (g.rolname LIKE 'pg\_%' OR g.rolsuper OR g.rolcreaterole)))`)
	if err != nil {
		t.Fatal(err)
	}
	out, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		t.Fatal(err)
	}
	return out
}
