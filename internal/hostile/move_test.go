package hostile_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pgtenant/pgtenant/internal/cluster"
	"github.com/pgtenant/pgtenant/internal/jobs"
	"github.com/pgtenant/pgtenant/internal/move"
	"github.com/pgtenant/pgtenant/internal/pgtest"
	"github.com/pgtenant/pgtenant/internal/provision"
	"github.com/pgtenant/pgtenant/internal/tenant"
)

// TestFinding12_MoveRunsNoTenantCodeWithPrivilege: a tenant moved to
// another cluster while it writes plants what the move's copy and logical
// replication set off on the target — an ENABLE ALWAYS, an ENABLE REPLICA
// and an ordinary trigger, a CHECK constraint calling its function — each
// trying to escalate. The rows there before the move are copied by
// pgtenant's COPY, in the tenant's agent session with
// session_replication_role = replica; the rows written during the move
// are applied by the apply worker, which in PostgreSQL 15 runs as its
// subscription's owner, which must have been a superuser to create it:
// the move's owner is not one any more when it applies. The ALWAYS and
// REPLICA triggers are disabled until the cut-over, the ordinary one never
// fires on the target, and nothing gains privilege on either cluster. The
// planted CHECK ran in both (the fixture bites): in the copy as the agent,
// in the apply worker as the move's unprivileged role; the triggers are
// ALWAYS and REPLICA again on the target afterwards, and the agent no
// longer holds the copy's setting. A database tenant's extension (hstore,
// which its tier allows, made among its plants) is recreated on the
// target by the restore as the tenant: owned by its role, its column's
// values there.
func TestFinding12_MoveRunsNoTenantCodeWithPrivilege(t *testing.T) {
	ctx := pgtest.Context(t)
	pg2, err := pgtest.Start(ctx, pgtest.Options{Name: "local2"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pg2.Close)
	e := startOn(t, nil, false, []*pgtest.Cluster{pg2})
	for _, mode := range []string{"database", "schema"} {
		t.Run(mode, func(t *testing.T) {
			ctx := pgtest.Context(t)
			// On local: placement would put the second on local2.
			r, err := e.c.CreateTenant(ctx, provision.Request{Template: "saas", Mode: tenant.Mode(mode), Tier: hostileTier, Cluster: "local"})
			if err != nil {
				t.Fatal(err)
			}
			l := login{ID: r.Tenant.ID, Mode: mode, Database: r.Tenant.Database, DSN: r.DSN, Tier: hostileTier, Role: "t_" + r.Tenant.ID, Schema: "public"}
			if mode == "schema" {
				l.Schema = l.Role
			}
			conn := connect(t, l.DSN)
			plantPayload(t, conn, l)
			s := cluster.Ident(l.Schema)
			mustExec(t, conn, fmt.Sprintf(`
				ALTER TABLE %[1]s.tripwire REPLICA IDENTITY FULL;
				CREATE FUNCTION %[1]s.on_row() RETURNS trigger LANGUAGE plpgsql AS $f$
				BEGIN PERFORM %[1]s.pwn(TG_ARGV[0]); RETURN NEW; END $f$;
				CREATE FUNCTION %[1]s.check_row(v text) RETURNS boolean LANGUAGE plpgsql AS $f$
				BEGIN PERFORM %[1]s.pwn('check');
					-- Keep what the copy's session may set for later sessions.
					BEGIN EXECUTE 'RESET ROLE'; EXECUTE 'ALTER ROLE ' || session_user || ' SET session_replication_role = replica';
					EXCEPTION WHEN OTHERS THEN NULL; END;
					RETURN true; END $f$;
				CREATE TABLE %[1]s.victim (id bigserial PRIMARY KEY, v text CHECK (%[1]s.check_row(v)));
				CREATE TRIGGER always_trg BEFORE INSERT ON %[1]s.victim FOR EACH ROW EXECUTE FUNCTION %[1]s.on_row('always');
				CREATE TRIGGER replica_trg BEFORE INSERT ON %[1]s.victim FOR EACH ROW EXECUTE FUNCTION %[1]s.on_row('replica');
				CREATE TRIGGER origin_trg BEFORE INSERT ON %[1]s.victim FOR EACH ROW EXECUTE FUNCTION %[1]s.on_row('origin');
				ALTER TABLE %[1]s.victim ENABLE ALWAYS TRIGGER always_trg;
				ALTER TABLE %[1]s.victim ENABLE REPLICA TRIGGER replica_trg;
				INSERT INTO %[1]s.victim (v) SELECT 'before' FROM generate_series(1, 20)`, s))
			if mode == "database" {
				// An extension its tier allows, made among its plants: the
				// move recreates it on the target as the tenant.
				mustExec(t, conn, fmt.Sprintf(`CREATE EXTENSION hstore SCHEMA %[1]s;
					CREATE TABLE %[1]s.attrs (id int PRIMARY KEY, a %[1]s.hstore);
					INSERT INTO %[1]s.attrs VALUES (1, 'k => v')`, s))
			}
			// Writes during the move reach the target through the apply
			// worker: the writer goes on until a second after the copy's
			// snapshot, then stops so that the cut-over finds no backlog
			// (a writer to the end keeps it waiting for a minute without
			// progress, longer than a loaded machine leaves this test).
			stop := make(chan struct{})
			done := make(chan struct{})
			go func() {
				defer close(done)
				for {
					select {
					case <-stop:
						return
					default:
					}
					if _, err := conn.Exec(ctx, fmt.Sprintf(`INSERT INTO %s.victim (v) VALUES ('during')`, s)); err != nil {
						return
					}
					time.Sleep(20 * time.Millisecond)
				}
			}()
			j, err := e.c.MoveTenant(ctx, l.ID, "local2")
			if err != nil {
				t.Fatal(err)
			}
			waitStep(t, e.c, j.ID, "copy")
			time.Sleep(time.Second)
			close(stop)
			<-done
			waitJobFor(t, e.c, j.ID, jobs.Succeeded, 3*time.Minute)

			if p := append(privileged(t), privilegedOn(t, pg2)...); len(p) > 0 {
				t.Errorf("roles with privileges no tenant may have after the move: %v", p)
			}
			dst, err := pgx.Connect(ctx, pg2.PrimaryDSN(l.Database))
			if err != nil {
				t.Fatal(err)
			}
			defer dst.Close(context.Background())
			rows, err := dst.Query(ctx, fmt.Sprintf(`SELECT what, session_role, privileged FROM %s.tripwire`, s))
			if err != nil {
				t.Fatal(err)
			}
			type row struct {
				what, session string
				privileged    bool
			}
			got, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (row, error) {
				var x row
				return x, r.Scan(&x.what, &x.session, &x.privileged)
			})
			if err != nil {
				t.Fatal(err)
			}
			applied, copied := 0, 0
			agent := "pgt_agent_" + l.ID
			for _, r := range got {
				switch {
				case r.privileged:
					t.Errorf("tenant code ran with privilege on the target: %+v", r)
				case (r.session == move.Name(l.ID) || r.session == agent) && r.what != "check":
					t.Errorf("the tenant's %s trigger fired in the move's session of %s: %+v", r.what, r.session, r)
				case r.session == move.Name(l.ID):
					applied++
				case r.session == agent:
					copied++
				case r.session != l.Role:
					t.Errorf("tenant code ran in a session of %s: %+v", r.session, r)
				}
			}
			if applied == 0 {
				t.Errorf("the planted CHECK never ran in the apply worker (tripwire %+v): the fixture does not bite", got)
			}
			if copied == 0 {
				t.Errorf("the planted CHECK never ran in the copy (tripwire %+v): the fixture does not bite", got)
			}
			var granted bool
			if err := dst.QueryRow(ctx, `SELECT has_parameter_privilege($1, 'session_replication_role', 'SET')`, agent).Scan(&granted); err != nil {
				t.Fatal(err)
			}
			var kept int
			if err := dst.QueryRow(ctx, `SELECT count(*) FROM pg_db_role_setting s JOIN pg_roles r ON r.oid = s.setrole
				WHERE r.rolname = $1 AND array_to_string(s.setconfig, ',') LIKE '%session_replication_role%'`, agent).Scan(&kept); err != nil {
				t.Fatal(err)
			}
			if granted || kept != 0 {
				t.Errorf("the agent %s may still set session_replication_role after the move (%v), or has it in %d role settings", agent, granted, kept)
			}
			if mode == "database" {
				var owner, v string
				if err := dst.QueryRow(ctx, `SELECT r.rolname FROM pg_extension e JOIN pg_roles r ON r.oid = e.extowner WHERE e.extname = 'hstore'`).Scan(&owner); err != nil || owner != l.Role {
					t.Errorf("hstore on the target: owner %q (%v), want the tenant's role %s (restored as the tenant)", owner, err, l.Role)
				}
				if err := dst.QueryRow(ctx, fmt.Sprintf(`SELECT a -> 'k' FROM %s.attrs WHERE id = 1`, s)).Scan(&v); err != nil || v != "v" {
					t.Errorf("the hstore column on the target: %q, %v; want v", v, err)
				}
			}
			var enabled string
			if err := dst.QueryRow(ctx, `SELECT string_agg(tgname || '=' || tgenabled::text, ',' ORDER BY tgname) FROM pg_trigger
				WHERE tgrelid = $1::regclass`, l.Schema+".victim").Scan(&enabled); err != nil {
				t.Fatal(err)
			}
			if enabled != "always_trg=A,origin_trg=O,replica_trg=R" {
				t.Errorf("triggers on the target: %s, want always_trg=A,origin_trg=O,replica_trg=R", enabled)
			}
		})
	}
}
