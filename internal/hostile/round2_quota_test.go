package hostile_test

// The second red-team run's storage findings (issue 23, findings 6 and 7)
// and its quota test: after enforcement a tenant's footprint stops growing
// whatever storage path it tries, by the collector's size and by the
// server's own files.

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pgtenant/pgtenant/internal/catalog"
	"github.com/pgtenant/pgtenant/internal/cluster"
	"github.com/pgtenant/pgtenant/internal/pgtest"
	"github.com/pgtenant/pgtenant/internal/quota"
	"github.com/pgtenant/pgtenant/internal/tenant"
)

// bigText is about mb MB of text that does not compress (random hex), as
// a SQL expression.
func bigText(mb int) string {
	return fmt.Sprintf(`(SELECT pg_catalog.string_agg(pg_catalog.md5(pg_catalog.random()::text), '') FROM pg_catalog.generate_series(1, %d))`, mb*32768)
}

// bigRows is about mb MB of rows of random hex, as a query (rows, unlike
// bigText's one value, are neither compressed nor TOASTed).
func bigRows(mb int) string {
	return fmt.Sprintf(`SELECT pg_catalog.md5(pg_catalog.random()::text) || pg_catalog.md5(pg_catalog.random()::text) FROM pg_catalog.generate_series(1, %d)`, mb*10000)
}

// commentSQL comments about mb MB on an object (COMMENT takes a literal
// only: the tenant builds it in a DO block).
func commentSQL(object string, mb int) string {
	return fmt.Sprintf(`DO $d$ BEGIN EXECUTE pg_catalog.format('COMMENT ON %s IS %%L', %s); END $d$`, object, bigText(mb))
}

// size runs a pass (a minute later on the rig's clock) and returns the
// tenant's size as the collector measured it.
func (q *quotaRig) size(t *testing.T) int64 {
	t.Helper()
	q.now = q.now.Add(time.Minute)
	if err := q.col.Pass(pgtest.Context(t), srv.Name()); err != nil {
		t.Logf("pass: %v", err)
	}
	f, err := q.col.Tenant(q.id)
	if err != nil || f.SizeBytes == nil {
		t.Fatalf("no size for %s: %v", q.id, err)
	}
	return *f.SizeBytes
}

// filesSize is the size of the tenant's database (the shared one in schema
// mode) as the server counts its files.
func filesSize(t *testing.T, l login) int64 {
	t.Helper()
	var n int64
	if err := srv.Conn(t, "postgres").QueryRow(pgtest.Context(t), `SELECT pg_database_size($1)`, l.Database).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

// enforcedEvent returns the detail of the tenant's quota_enforced event.
func enforcedEvent(t *testing.T, e *env, id string) map[string]any {
	t.Helper()
	events, err := e.store.Events(pgtest.Context(t), id)
	if err != nil {
		t.Fatal(err)
	}
	for _, ev := range events {
		if ev.Kind == quota.EventEnforced {
			var d map[string]any
			if err := json.Unmarshal(ev.Detail, &d); err != nil {
				t.Fatal(err)
			}
			return d
		}
	}
	t.Fatalf("tenant %s has no %s event", id, quota.EventEnforced)
	return nil
}

// attempt runs sql as the tenant on conn (reconnecting if enforcement ended
// the session) and reports whether it went through.
func attempt(t *testing.T, conn **pgx.Conn, dsn, sql string) error {
	t.Helper()
	if (*conn).IsClosed() {
		*conn = connect(t, dsn)
	}
	ctx, cancel := context.WithTimeout(pgtest.Context(t), 30*time.Second)
	defer cancel()
	_, err := (*conn).Exec(ctx, sql)
	if err != nil && (*conn).IsClosed() {
		*conn = connect(t, dsn)
	}
	return err
}

// TestR2Finding6_TempTablesStopAtEnforcement: a database tenant's sessions
// that made temporary tables before enforcement (one still has its table,
// one dropped it and keeps the right to make more) cannot grow them after:
// enforcement ends them, says so in its event, and the tenant's size, as
// the collector and the server count it, stops growing.
func TestR2Finding6_TempTablesStopAtEnforcement(t *testing.T) {
	e := start(t, nil)
	l := e.tenant(t, "database", "default")
	holder, dropper := connect(t, l.DSN), connect(t, l.DSN)
	// Temporary tables live in the session's temp_buffers until they spill
	// to their files, which is what sizes can see: small buffers make the
	// growth visible at once (the finding's 32 → 76 MB spilled anyway).
	for _, c := range []*pgx.Conn{holder, dropper} {
		mustExec(t, c, `SET temp_buffers = '1MB'`)
	}
	mustExec(t, holder, `CREATE TEMP TABLE scratch (b text)`)
	mustExec(t, dropper, `CREATE TEMP TABLE gone (b text)`)
	mustExec(t, dropper, `DROP TABLE gone`)
	rig := newQuotaRig(t, e, l)
	// Over the quota by its tables too: ending the sessions drops their
	// temporary tables, which alone would bring it back under.
	mustExec(t, holder, grow2MB(l))
	mustExec(t, holder, `INSERT INTO scratch `+bigRows(4))
	if state, err := rig.until(t, catalog.QuotaEnforced); err != nil || state != catalog.QuotaEnforced {
		t.Fatalf("quota = %s, %v; want enforced (temporary tables count in the size)", state, err)
	}
	if d := enforcedEvent(t, e, l.ID); d["sessions_ended"] == nil || d["sessions_ended"].(float64) < 2 {
		t.Errorf("quota_enforced event: sessions_ended = %v, want the 2 sessions", d["sessions_ended"])
	}
	time.Sleep(time.Second) // the ended backends drop their temporary tables on the way out
	before, files := rig.size(t), filesSize(t, l)

	for name, c := range map[string]*pgx.Conn{"holder": holder, "dropper": dropper} {
		sql := `INSERT INTO scratch ` + bigRows(4)
		if name == "dropper" {
			sql = `CREATE TEMP TABLE more AS ` + bigRows(4)
		}
		if _, err := c.Exec(pgtest.Context(t), sql); err == nil {
			t.Errorf("%s: a session opened before enforcement grew its temporary tables after it", name)
		}
	}
	fresh := connect(t, l.DSN)
	refused(t, fresh, "42501", `CREATE TEMP TABLE fresh (b text)`)

	after, filesAfter := rig.size(t), filesSize(t, l)
	if after > before+256<<10 || filesAfter > files+256<<10 {
		t.Errorf("after enforcement the tenant grew: collector %d → %d, files %d → %d", before, after, files, filesAfter)
	}
}

// TestR2Finding7_CatalogStopsAtEnforcement: comments (and other catalog
// rows a tenant sizes itself) count in a schema tenant's size, and after
// enforcement, in both modes, the tenant can neither comment on nor alter
// any object it had: functions, procedures, types, domains, views,
// sequences, schemas, columns.
func TestR2Finding7_CatalogStopsAtEnforcement(t *testing.T) {
	e := start(t, nil)
	for _, mode := range []string{"database", "schema"} {
		t.Run(mode, func(t *testing.T) {
			l := e.tenant(t, mode, "default")
			conn := connect(t, l.DSN)
			s := cluster.Ident(l.Schema)
			mustExec(t, conn, fmt.Sprintf(`
				CREATE FUNCTION %[1]s.f() RETURNS int LANGUAGE sql AS 'SELECT 1';
				CREATE PROCEDURE %[1]s.p() LANGUAGE sql AS 'SELECT 1';
				CREATE TYPE %[1]s.mood AS ENUM ('ok');
				CREATE DOMAIN %[1]s.positive AS int CHECK (VALUE > 0);
				CREATE VIEW %[1]s.v AS SELECT 1 AS one;
				CREATE SEQUENCE %[1]s.s;
				CREATE TABLE %[1]s.notes (body text)`, s))
			rig := newQuotaRig(t, e, l)
			base := rig.size(t)
			mustExec(t, conn, commentSQL("FUNCTION "+s+".f()", 3))
			if grown := rig.size(t) - base; grown < 1<<20 {
				t.Errorf("a 3 MB comment grew the tenant's measured size by %d bytes", grown)
			}
			if state, err := rig.until(t, catalog.QuotaEnforced); err != nil || state != catalog.QuotaEnforced {
				t.Fatalf("quota = %s, %v; want enforced", state, err)
			}
			before, files := rig.size(t), filesSize(t, l)
			conn = connect(t, l.DSN)
			for _, object := range []string{"FUNCTION " + s + ".f()", "PROCEDURE " + s + ".p()", "TYPE " + s + ".mood",
				"DOMAIN " + s + ".positive", "VIEW " + s + ".v", "SEQUENCE " + s + ".s", "SCHEMA " + s,
				"TABLE " + s + ".notes", "COLUMN " + s + ".notes.body"} {
				refused(t, conn, "42501", commentSQL(object, 2))
			}
			for _, sql := range []string{
				`ALTER FUNCTION ` + s + `.f() SET application_name = 'x'`,
				`ALTER TYPE ` + s + `.mood ADD VALUE 'grown'`,
				`ALTER DOMAIN ` + s + `.positive ADD CONSTRAINT more CHECK (VALUE < 100)`,
				`ALTER VIEW ` + s + `.v ALTER COLUMN one SET DEFAULT 2`,
				`ALTER TABLE ` + s + `.notes ALTER COLUMN body SET STATISTICS 10000`,
			} {
				refused(t, conn, "42501", sql)
			}
			mustExec(t, conn, `ANALYZE `+s+`.notes`) // a warning: only the owner analyzes
			after, filesAfter := rig.size(t), filesSize(t, l)
			if after > before+256<<10 || filesAfter > files+256<<10 {
				t.Errorf("after enforcement the tenant grew: collector %d → %d, files %d → %d", before, after, files, filesAfter)
			}
			// Back under: everything is the tenant's again.
			restoreUnder(t, rig, l)
			mustExec(t, conn, `COMMENT ON FUNCTION `+s+`.f() IS 'mine again'`)
			var owner string
			if err := conn.QueryRow(pgtest.Context(t), `SELECT pg_get_userbyid(typowner) FROM pg_type WHERE typname = 'mood'`).Scan(&owner); err != nil || owner != l.Role {
				t.Errorf("mood's owner after restore = %q, %v; want %s", owner, err, l.Role)
			}
		})
	}
	noneGainedPrivilege(t)
}

// restoreUnder brings a tenant back under its quota by raising its tier's
// quota (a comment cannot be emptied while enforced), and checks that its
// lock role went with the restore.
func restoreUnder(t *testing.T, rig *quotaRig, l login) {
	t.Helper()
	for name, tier := range rig.col.Tiers {
		if name == l.Tier {
			tier.StorageQuota *= 4
			rig.col.Tiers[name] = tier
		}
	}
	if state, err := rig.until(t, catalog.QuotaOK); state != catalog.QuotaOK && state != catalog.QuotaWarning {
		t.Fatalf("quota after raising it = %s, %v; want ok", state, err)
	}
	var lockRoles int
	if err := srv.Conn(t, "postgres").QueryRow(pgtest.Context(t), `SELECT count(*) FROM pg_roles WHERE rolname = $1`, tenant.LockRole(l.ID)).Scan(&lockRoles); err != nil || lockRoles != 0 {
		t.Errorf("lock role %s after restore: %d, %v; want dropped", tenant.LockRole(l.ID), lockRoles, err)
	}
}

// TestR2_QuotaHoldsOnEveryStoragePath: in both modes a tenant prepares
// every storage path it has — a table with an index and TOAST, a temporary
// table in a session it keeps, a large object, objects to comment on, a
// sequence, a materialized view, a rule and a SECURITY DEFINER function
// (both run with an owner's rights, which after enforcement is the lock
// role), a write grant to PUBLIC, and tables handed to every role it can
// reach — then grows past its quota. After enforcement it tries them all:
// its footprint, by the collector's size and by the server's files, stops
// growing. (Before finding 3's fix, a schema tenant handed tables to its
// template's connect role, pgt_connect_saas, still tried here: enforcement
// then reported that the tenant could still write.)
func TestR2_QuotaHoldsOnEveryStoragePath(t *testing.T) {
	e := start(t, nil)
	for _, mode := range []string{"database", "schema"} {
		t.Run(mode, func(t *testing.T) {
			ctx := pgtest.Context(t)
			l := e.tenant(t, mode, "default")
			conn := connect(t, l.DSN)
			s := cluster.Ident(l.Schema)
			mustExec(t, conn, fmt.Sprintf(`
				CREATE TABLE %[1]s.hoard (id bigserial, b text);
				CREATE INDEX ON %[1]s.hoard (pg_catalog.md5(b));
				GRANT INSERT, UPDATE ON %[1]s.hoard TO PUBLIC;
				CREATE SEQUENCE %[1]s.counter;
				CREATE MATERIALIZED VIEW %[1]s.summary AS SELECT pg_catalog.count(*) AS n FROM %[1]s.hoard;
				CREATE FUNCTION %[1]s.f() RETURNS int LANGUAGE sql AS 'SELECT 1';
				CREATE TYPE %[1]s.mood AS ENUM ('ok');
				CREATE TABLE %[1]s.sink (b text); -- no default: nothing but the write's own privilege is checked
				CREATE VIEW %[1]s.v AS SELECT b FROM %[1]s.sink;
				CREATE TABLE %[1]s.trap (i int);
				INSERT INTO %[1]s.trap SELECT pg_catalog.generate_series(1, 100);
				CREATE RULE grow AS ON DELETE TO %[1]s.trap DO INSTEAD INSERT INTO %[1]s.sink (b) SELECT %[2]s;
				CREATE FUNCTION %[1]s.grow() RETURNS void LANGUAGE sql SECURITY DEFINER AS $f$ INSERT INTO %[1]s.sink (b) SELECT %[2]s $f$;
				GRANT EXECUTE ON FUNCTION %[1]s.grow() TO PUBLIC`, s, bigText(1)))
			var lo uint32
			if err := conn.QueryRow(ctx, `SELECT lo_from_bytea(0, 'x')`).Scan(&lo); err != nil {
				t.Fatal(err)
			}
			// A session with a temporary table (schema tenants hold no TEMPORARY).
			old := connect(t, l.DSN)
			mustExec(t, old, `SET temp_buffers = '1MB'`) // spilled at once, as TestR2Finding6's
			_, tempErr := old.Exec(ctx, `CREATE TEMP TABLE scratch (b text)`)
			if (tempErr == nil) != (mode == "database") {
				t.Errorf("%s tenant: CREATE TEMP TABLE: %v", mode, tempErr)
			}
			// Tables handed to every role the tenant can reach.
			rows, err := conn.Query(ctx, `SELECT rolname FROM pg_roles WHERE pg_has_role(current_user, oid, 'MEMBER') AND rolname <> current_user
				UNION SELECT 'pgt_connect_saas'`)
			if err != nil {
				t.Fatal(err)
			}
			reach, err := pgx.CollectRows(rows, pgx.RowTo[string])
			if err != nil {
				t.Fatal(err)
			}
			var handed []string
			for i, r := range reach {
				name := fmt.Sprintf("%s.handed_%d", s, i)
				mustExec(t, conn, `CREATE TABLE `+name+` (b text)`)
				// The new owner needs CREATE on the schema: the tenant owns it.
				_, _ = conn.Exec(ctx, `GRANT CREATE ON SCHEMA `+s+` TO `+cluster.Ident(r))
				if _, err := conn.Exec(ctx, `ALTER TABLE `+name+` OWNER TO `+cluster.Ident(r)); err == nil {
					t.Logf("%s tenant handed %s to %s", mode, name, r)
					handed = append(handed, name)
				}
			}

			rig := newQuotaRig(t, e, l)
			mustExec(t, conn, `INSERT INTO `+s+`.hoard (b) SELECT `+bigText(2))
			if state, err := rig.until(t, catalog.QuotaEnforced); err != nil || state != catalog.QuotaEnforced {
				t.Fatalf("quota = %s, %v; want enforced", state, err)
			}
			time.Sleep(time.Second) // ended backends drop their temporary tables on the way out
			before, files := rig.size(t), filesSize(t, l)

			paths := []struct{ name, sql string }{
				{"table", `INSERT INTO ` + s + `.hoard (b) SELECT ` + bigText(2)},
				{"update", `UPDATE ` + s + `.hoard SET b = b || b`},
				{"index", `CREATE INDEX ON ` + s + `.hoard (b)`},
				{"TOAST", `INSERT INTO ` + s + `.hoard (b) SELECT pg_catalog.repeat(` + bigText(1) + `, 2)`},
				{"view", `INSERT INTO ` + s + `.v (b) SELECT ` + bigText(2)},
				{"new table", `CREATE TABLE ` + s + `.more AS SELECT ` + bigText(2) + ` AS b`},
				{"new temporary table", `CREATE TEMP TABLE more AS ` + bigRows(2)},
				{"sequence", `SELECT nextval('` + s + `.counter'); ALTER SEQUENCE ` + s + `.counter CACHE 1000`},
				{"materialized view", `REFRESH MATERIALIZED VIEW ` + s + `.summary`},
				{"new materialized view", `CREATE MATERIALIZED VIEW ` + s + `.more_mv AS SELECT ` + bigText(2) + ` AS b`},
				{"comment on a function", commentSQL("FUNCTION "+s+".f()", 2)},
				{"comment on a type", commentSQL("TYPE "+s+".mood", 2)},
				{"comment on a sequence", commentSQL("SEQUENCE "+s+".counter", 2)},
				{"comment on a column", commentSQL("COLUMN "+s+".hoard.b", 2)},
				{"rule, run as the table's owner", `DELETE FROM ` + s + `.trap WHERE i <= 3`},
				{"SECURITY DEFINER function", `SELECT ` + s + `.grow()`},
				{"existing large object", fmt.Sprintf(`SELECT lo_put(%d, 1, (SELECT pg_catalog.convert_to(%s, 'UTF8')))`, lo, bigText(2))},
			}
			if mode == "database" {
				// New large objects: lo_creat is PUBLIC's, revoked in the
				// tenant's own database only (see the schema-mode note below).
				paths = append(paths, struct{ name, sql string }{"new large object",
					`SELECT lo_from_bytea(0, pg_catalog.convert_to(` + bigText(2) + `, 'UTF8'))`})
			}
			for i, h := range handed {
				paths = append(paths, struct{ name, sql string }{fmt.Sprintf("table handed to a reachable role (%d)", i),
					`INSERT INTO ` + h + ` SELECT ` + bigText(2)})
			}
			if tempErr == nil {
				paths = append(paths, struct{ name, sql string }{"temporary table of an old session", `INSERT INTO scratch ` + bigRows(2)})
			}
			var through []string
			cur := connect(t, l.DSN)
			for _, p := range paths {
				c := cur
				if strings.HasPrefix(p.name, "temporary table of an old") {
					c = old
				}
				if err := attempt(t, &c, l.DSN, p.sql); err == nil {
					through = append(through, p.name)
				} else {
					t.Logf("%s tenant: %s: %v", mode, p.name, err)
				}
				if c != old {
					cur = c
				}
			}
			if len(through) > 0 {
				t.Logf("%s tenant: went through after enforcement (they must not grow it): %s", mode, strings.Join(through, ", "))
			}
			after, filesAfter := rig.size(t), filesSize(t, l)
			if after > before+512<<10 || filesAfter > files+512<<10 {
				t.Errorf("%s tenant grew after enforcement: collector %d → %d, files %d → %d; went through: %s",
					mode, before, after, files, filesAfter, strings.Join(through, ", "))
			}

			if mode == "schema" {
				// Known edge: new large objects in a shared database cannot
				// be refused to one tenant (lo_creat is PUBLIC's there), but
				// they are counted in its size.
				if err := attempt(t, &cur, l.DSN, `SELECT lo_from_bytea(0, pg_catalog.convert_to(`+bigText(2)+`, 'UTF8'))`); err == nil {
					if grown := rig.size(t) - after; grown < 1<<20 {
						t.Errorf("a 2 MB large object grew the schema tenant's measured size by %d bytes", grown)
					}
				}
			}
		})
	}
	noneGainedPrivilege(t)
}
