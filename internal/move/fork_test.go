package move_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/url"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pgtenant/pgtenant/internal/api"
	"github.com/pgtenant/pgtenant/internal/backup"
	"github.com/pgtenant/pgtenant/internal/backup/backuptest"
	"github.com/pgtenant/pgtenant/internal/catalog"
	"github.com/pgtenant/pgtenant/internal/cluster"
	"github.com/pgtenant/pgtenant/internal/config"
	managed "github.com/pgtenant/pgtenant/internal/fleet"
	"github.com/pgtenant/pgtenant/internal/jobs"
	"github.com/pgtenant/pgtenant/internal/move"
	"github.com/pgtenant/pgtenant/internal/provision"
	"github.com/pgtenant/pgtenant/internal/templates"
	"github.com/pgtenant/pgtenant/internal/tenant"
)

// tenantSetup is what each tenant of the rewind tests makes as its own
// role: tables with a sequence, a dropped-later column, an index, a
// trigger, and a CHECK constraint and an index expression that call the
// tenant's functions, which refuse to run in a superuser's session (a
// restore that ran tenant code with privilege would fail on them).
const tenantSetup = `
CREATE FUNCTION guard(v int) RETURNS boolean LANGUAGE plpgsql IMMUTABLE AS $$
BEGIN
	IF (SELECT rolsuper FROM pg_catalog.pg_roles WHERE rolname = session_user) THEN
		RAISE EXCEPTION 'tenant code ran in a superuser session (%)', session_user;
	END IF;
	RETURN v >= 0;
END $$;
CREATE TABLE orders (id bigserial PRIMARY KEY, note text, amount int CHECK (guard(amount)), touched timestamptz);
CREATE INDEX orders_guarded ON orders ((guard(amount)));
CREATE FUNCTION touch() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN NEW.touched := now(); RETURN NEW; END $$;
CREATE TRIGGER orders_touch BEFORE INSERT OR UPDATE ON orders FOR EACH ROW EXECUTE FUNCTION touch();
CREATE TABLE lines (order_id bigint REFERENCES orders, qty int);
INSERT INTO orders (note, amount) SELECT 'order ' || g, g FROM generate_series(1, 200) g;
INSERT INTO lines SELECT id, id % 7 FROM orders;
-- Types made in the database, in arrays and composites, and a built-in
-- type without binary I/O: copied as text (the other tables in binary).
CREATE TYPE mood AS ENUM ('sad', 'ok', 'happy');
CREATE DOMAIN positive AS int CHECK (VALUE > 0);
CREATE TYPE pair AS (m mood, n numeric);
CREATE TABLE kinds (id int PRIMARY KEY, m mood, ms mood[], p positive, pr pair, acl aclitem, tags text[], j jsonb);
INSERT INTO kinds SELECT g, 'ok', '{sad,happy}', g, ('happy', g / 3.0)::pair, '=r/pg_database_owner', ARRAY['a', 'b' || g],
	jsonb_build_object('g', g) FROM generate_series(1, 20) g;
`

// destroy is a tenant's bad day.
const destroy = `DELETE FROM kinds WHERE id > 10; DELETE FROM lines; DROP TABLE lines; DELETE FROM orders WHERE id > 50; ALTER TABLE orders DROP COLUMN note;
	INSERT INTO orders (amount) SELECT g FROM generate_series(1, 30) g; TRUNCATE orders CASCADE; INSERT INTO orders (amount) VALUES (1)`

// checksums are md5s over every column of every row of each table (absent: "").
func checksums(t *testing.T, ctx context.Context, dsn string) map[string]string {
	t.Helper()
	conn, err := pgx.Connect(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	out := map[string]string{}
	for _, q := range []struct{ table, sql string }{
		{"orders", `SELECT coalesce(md5(string_agg(o::text, '|' ORDER BY id)), '') FROM orders o`},
		{"lines", `SELECT coalesce(md5(string_agg(l::text, '|' ORDER BY order_id)), '') FROM lines l`},
		{"kinds", `SELECT coalesce(md5(string_agg(k::text, '|' ORDER BY id)), '') FROM kinds k`},
	} {
		var sum string
		if err := conn.QueryRow(ctx, q.sql).Scan(&sum); err != nil {
			sum = "error: " + err.Error()
		}
		out[q.table] = sum
	}
	return out
}

func sameSums(t *testing.T, what string, got, want map[string]string) {
	t.Helper()
	for k, w := range want {
		if got[k] != w {
			t.Errorf("%s: table %s checksum %q, want %q (the state at the time asked for)", what, k, got[k], w)
		}
	}
}

// TestRewindFork_BothModes: a tenant writes, notes TIME, then destroys its
// data (DELETE, DROP TABLE, a dropped column, TRUNCATE). A rewind to TIME
// brings every table back as it was (checksums over every column), in
// place (same pooler DSN and password: its pool paused for the swap),
// sequences not behind, while a neighbour writing meanwhile through the
// pooler loses nothing and sees no error; what the rewind
// replaced is kept as a dropped tenant; a fork at TIME holds the same data
// under new credentials; a TIME outside the tenant's window is refused
// with the window named; no scratch instance is left. The tenant's own
// guards prove none of its code ran in a privileged session.
func TestRewindFork_BothModes(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 8*time.Minute)
	defer cancel()
	fc, st, c, _ := backedUpDaemon(t, ctx, true)
	added, err := c.CreateTemplate(ctx, "shop", []templates.Upload{{Name: "0001_init.sql", Body: "CREATE TABLE settings (k text PRIMARY KEY, v text);"}})
	if err != nil {
		t.Fatal(err)
	}
	for _, j := range added.BuildJobs {
		waitJob(t, ctx, c, j.ID)
	}
	for _, mode := range []tenant.Mode{tenant.ModeSchema, tenant.ModeDatabase} {
		t.Run(string(mode), func(t *testing.T) {
			rewindAndFork(t, ctx, c, fc, st, mode)
		})
	}
}

func rewindAndFork(t *testing.T, ctx context.Context, c *api.Client, fc *managed.Cluster, st *backup.Stanza, mode tenant.Mode) {
	mk := func() api.CreateTenantResponse {
		r, err := c.CreateTenant(ctx, provision.Request{Template: "shop", Mode: mode})
		if err != nil {
			t.Fatal(err)
		}
		if r.Job != nil {
			waitJob(t, ctx, c, r.Job.ID)
		}
		return r
	}
	victim, neighbour := mk(), mk()
	backuptest.Exec(t, ctx, victim.DSN, tenantSetup)
	// An extension the tier allows, made by the tenant: database mode
	// only (a schema tenant's database is its neighbours' too).
	const withHstore = `CREATE EXTENSION hstore; CREATE TABLE attrs (id int PRIMARY KEY, a hstore); INSERT INTO attrs VALUES (1, 'k => v')`
	if mode == tenant.ModeDatabase {
		backuptest.Exec(t, ctx, victim.DSN, withHstore)
	} else if err := execTenant(ctx, victim.DSN, withHstore); err == nil || !strings.Contains(err.Error(), "permission denied to create extension") {
		t.Errorf("a schema tenant's CREATE EXTENSION: %v, want refused", err)
	}
	backuptest.Exec(t, ctx, neighbour.DSN, `CREATE TABLE events (id bigserial PRIMARY KEY, at timestamptz DEFAULT now())`)
	want := checksums(t, ctx, victim.DSN)
	// A read-only login of the victim: it reads the rewound data after.
	reports, err := c.CreateCredential(ctx, victim.Tenant.ID, api.CreateCredentialRequest{Name: "reports", ReadOnly: true})
	if err != nil {
		t.Fatal(err)
	}
	time.Sleep(1100 * time.Millisecond)
	at := time.Now()
	time.Sleep(1100 * time.Millisecond)
	backuptest.Exec(t, ctx, victim.DSN, destroy)
	destroyed := checksums(t, ctx, victim.DSN)

	// Outside the window: before the tenant existed, or in the future.
	for _, bad := range []time.Time{victim.Tenant.CreatedAt.Add(-time.Hour), time.Now().Add(time.Hour)} {
		_, err := c.RewindTenant(ctx, victim.Tenant.ID, bad)
		if !errors.Is(err, api.ErrInvalid) || !strings.Contains(err.Error(), "recovery window") {
			t.Errorf("rewind to %s: err = %v, want invalid naming the recovery window", bad, err)
		}
	}
	// While its storage quota is enforced (its objects owned by its lock
	// role, which the swap would leave behind): refused, saying so.
	lock := cluster.Ident(tenant.LockRole(victim.Tenant.ID))
	backuptest.Exec(t, ctx, fc.PrimaryDSN("postgres"), "CREATE ROLE "+lock+" NOLOGIN")
	if _, err := c.RewindTenant(ctx, victim.Tenant.ID, at); !errors.Is(err, catalog.ErrConflict) || !strings.Contains(err.Error(), "quota is enforced") {
		t.Errorf("rewind of an enforced tenant: err = %v, want a conflict saying its quota is enforced", err)
	}
	backuptest.Exec(t, ctx, fc.PrimaryDSN("postgres"), "DROP ROLE "+lock)

	// The neighbour writes all along.
	var wrote, failed atomic.Int64
	var firstErr atomic.Value
	stop := make(chan struct{})
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		conn, err := pgx.Connect(ctx, neighbour.DSN)
		if err != nil {
			firstErr.Store(err.Error())
			failed.Add(1)
			return
		}
		defer conn.Close(context.Background())
		for {
			select {
			case <-stop:
				return
			case <-time.After(20 * time.Millisecond):
			}
			if _, err := conn.Exec(ctx, `INSERT INTO events DEFAULT VALUES`); err != nil {
				firstErr.CompareAndSwap(nil, err.Error())
				failed.Add(1)
				continue
			}
			wrote.Add(1)
		}
	}()

	j, err := c.RewindTenant(ctx, victim.Tenant.ID, at)
	if err != nil {
		t.Fatal(err)
	}
	logSteps(t, "rewind", waitJob(t, ctx, c, j.ID))
	close(stop)
	wg.Wait()
	if failed.Load() > 0 {
		t.Errorf("the neighbour got %d errors during the rewind (first: %v)", failed.Load(), firstErr.Load())
	}
	var rows int64
	nconn, err := pgx.Connect(ctx, neighbour.DSN)
	if err != nil {
		t.Fatal(err)
	}
	if err := nconn.QueryRow(ctx, `SELECT count(*) FROM events`).Scan(&rows); err != nil || rows != wrote.Load() || rows == 0 {
		t.Errorf("neighbour has %d rows (%v), wrote %d", rows, err, wrote.Load())
	}
	nconn.Close(ctx)

	// In place: the same DSN and password reach the data as it was, and
	// so does the tenant's read-only login.
	sameSums(t, "after the rewind", checksums(t, ctx, victim.DSN), want)
	sameSums(t, "the read-only login after the rewind", checksums(t, ctx, reports.DSN), want)
	conn, err := pgx.Connect(ctx, victim.DSN)
	if err != nil {
		t.Fatalf("the tenant's own DSN after the rewind: %v", err)
	}
	var id int64
	var touched *time.Time
	if err := conn.QueryRow(ctx, `INSERT INTO orders (note, amount) VALUES ('after', 5) RETURNING id, touched`).Scan(&id, &touched); err != nil {
		t.Errorf("insert after the rewind (sequence behind? trigger gone?): %v", err)
	} else if id <= 200 || touched == nil {
		t.Errorf("insert after the rewind: id %d touched %v, want an id past 200 and the trigger's timestamp", id, touched)
	}
	conn.Close(ctx)

	// The rewind is recorded, and what it replaced is a dropped tenant.
	shown, err := c.Tenant(ctx, victim.Tenant.ID)
	if err != nil {
		t.Fatal(err)
	}
	if rw := shown.RecoveryWindow; rw == nil || rw.Earliest.Before(shown.CreatedAt) || at.Before(rw.Earliest) || rw.Latest.Before(at) {
		t.Errorf("tenant show's recovery window %+v: want from the tenant's creation (%s) to past %s", rw, shown.CreatedAt, at)
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
	if kept == "" {
		t.Fatalf("no rewound event naming the kept state: %+v", shown.Events)
	}
	keptT, err := c.Tenant(ctx, kept)
	if err != nil || keptT.State != catalog.StateDropped {
		t.Fatalf("the replaced state %s: %v %s, want dropped", kept, err, keptT.State)
	}
	keptDSN := fc.PrimaryDSN(keptT.Database)
	if mode == tenant.ModeSchema {
		keptDSN += "&options=" + strings.ReplaceAll(url.QueryEscape("-c search_path="+tenant.PhysicalName(kept)), "+", "%20")
	}
	sameSums(t, "the kept state", checksums(t, ctx, keptDSN), destroyed)

	// A fork at TIME: the same data, new credentials, an active tenant.
	fork, err := c.ForkTenant(ctx, victim.Tenant.ID, api.ForkTenantRequest{At: &at})
	if err != nil {
		t.Fatal(err)
	}
	if fork.Password == "" || fork.Tenant.ID == victim.Tenant.ID || fork.Job == nil {
		t.Fatalf("fork answer: %+v", fork)
	}
	logSteps(t, "fork", waitJob(t, ctx, c, fork.Job.ID))
	forked, err := c.Tenant(ctx, fork.Tenant.ID)
	if err != nil || forked.State != catalog.StateActive {
		t.Fatalf("forked tenant: %v %s, want active", err, forked.State)
	}
	sameSums(t, "the fork at TIME", checksums(t, ctx, fork.DSN), want)
	if mode == tenant.ModeDatabase {
		for what, dsn := range map[string]string{"the rewound tenant": victim.DSN, "the fork": fork.DSN} {
			if got := queryTenant(t, dsn, `SELECT a -> 'k' FROM attrs WHERE id = 1`); got != "v" {
				t.Errorf("%s's hstore column: %q, want v (the extension carried)", what, got)
			}
		}
	}
	if scratch, _ := filepath.Glob(st.ScratchDir("*")); len(scratch) > 0 {
		t.Errorf("scratch instances left: %v", scratch)
	}
	if sup := superusers(t, ctx, fc); sup != managed.Superuser {
		t.Errorf("superusers after the rewind and fork: %s, want only %s", sup, managed.Superuser)
	}
}

// backedUpDaemon starts a cluster that archives, with a standby, and a
// daemon over it holding its stanza (with a PgBouncer in front when
// pooled), once its first full backup is done.
func backedUpDaemon(t *testing.T, ctx context.Context, pooled bool) (*managed.Cluster, *backup.Stanza, *api.Client, func()) {
	t.Helper()
	fc, st := backuptest.Cluster(t, ctx, 1)
	backuptest.Exec(t, ctx, fc.PrimaryDSN("postgres"), `CREATE DATABASE catalog`)
	start := backuptest.Daemon
	if pooled {
		start = backuptest.DaemonPooled
	}
	c, stop := start(t, fc, "catalog", map[string]*backup.Stanza{fc.Name(): st}, smallServer)
	waitFor(t, ctx, func() bool {
		info, err := st.Info(ctx)
		return err == nil && len(info.Backups) > 0 && !info.Running
	})
	return fc, st, c, stop
}

// smallServer lets tenants' connection limits add up past a small test
// server's; the default tier allows hstore.
func smallServer(cfg *config.Config) {
	cfg.Provision.ReservedConnections = 5
	cfg.Provision.ConnectionOvercommit = 100
	tier := cfg.Tiers["default"]
	tier.Extensions = []string{"hstore"}
	cfg.Tiers["default"] = tier
}

func waitFor(t *testing.T, ctx context.Context, cond func() bool) {
	t.Helper()
	for !cond() {
		select {
		case <-ctx.Done():
			t.Fatal("timed out waiting")
		case <-time.After(200 * time.Millisecond):
		}
	}
}

func waitJob(t *testing.T, ctx context.Context, c *api.Client, id int64) jobs.Job {
	t.Helper()
	j, err := c.WaitJob(ctx, id, nil)
	if err != nil {
		t.Fatal(err)
	}
	if j.State != jobs.Succeeded {
		t.Fatalf("job %d %s: %s", j.ID, j.State, j.LastError)
	}
	return j
}

// logSteps records how long each step of a job took.
func logSteps(t *testing.T, what string, j jobs.Job) {
	t.Helper()
	var b strings.Builder
	for _, s := range j.Steps {
		fmt.Fprintf(&b, " %s %s (attempt %d)", s.Step, s.FinishedAt.Sub(s.StartedAt).Round(time.Millisecond), s.Attempt)
	}
	t.Logf("%s: job %d:%s", what, j.ID, b.String())
}

func superusers(t *testing.T, ctx context.Context, fc *managed.Cluster) string {
	t.Helper()
	conn, err := pgx.Connect(ctx, fc.PrimaryDSN("postgres"))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	var s string
	if err := conn.QueryRow(ctx, `SELECT string_agg(rolname, ',' ORDER BY rolname) FROM pg_roles WHERE rolsuper`).Scan(&s); err != nil {
		t.Fatal(err)
	}
	return s
}

// TestRewind_StopsAndResumes stops the daemon at points of a rewind (the
// scratch instance restored; the swap's renames done, the owners not yet
// exchanged) and starts another on the same catalog: the rewind finishes
// with the data as it was at TIME. A rewind cancelled halfway leaves the
// tenant as it was, the new tenant dropped, and no scratch instance.
func TestRewind_StopsAndResumes(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 8*time.Minute)
	defer cancel()
	fc, st, c, stop := backedUpDaemon(t, ctx, false)
	added, err := c.CreateTemplate(ctx, "shop", []templates.Upload{{Name: "0001_init.sql", Body: "CREATE TABLE settings (k text PRIMARY KEY, v text);"}})
	if err != nil {
		t.Fatal(err)
	}
	for _, j := range added.BuildJobs {
		waitJob(t, ctx, c, j.ID)
	}
	defer move.SetCrashHook(nil)
	parent := t
	for _, tc := range []struct {
		point  string
		mode   tenant.Mode
		cancel bool
	}{
		{"copy:restored", tenant.ModeDatabase, false},
		{"swap:renamed", tenant.ModeDatabase, false},
		{"swap:renamed", tenant.ModeSchema, false},
		{"copy:restored", tenant.ModeSchema, true},
	} {
		name := tc.point + "/" + string(tc.mode)
		if tc.cancel {
			name = "cancel at " + name
		}
		t.Run(name, func(t *testing.T) {
			r, err := c.CreateTenant(ctx, provision.Request{Template: "shop", Mode: tc.mode})
			if err != nil {
				t.Fatal(err)
			}
			if r.Job != nil {
				waitJob(t, ctx, c, r.Job.ID)
			}
			backuptest.Exec(t, ctx, r.DSN, tenantSetup)
			want := checksums(t, ctx, r.DSN)
			time.Sleep(1100 * time.Millisecond)
			at := time.Now()
			time.Sleep(1100 * time.Millisecond)
			backuptest.Exec(t, ctx, r.DSN, destroy)
			destroyed := checksums(t, ctx, r.DSN)

			hit := make(chan struct{})
			var once sync.Once
			move.SetCrashHook(func(ctx context.Context, p string) error {
				if p != tc.point {
					return nil
				}
				once.Do(func() { close(hit) })
				<-ctx.Done() // the daemon stops (or the job is cancelled) here
				return ctx.Err()
			})
			j, err := c.RewindTenant(ctx, r.Tenant.ID, at)
			if err != nil {
				t.Fatal(err)
			}
			select {
			case <-hit:
			case <-ctx.Done():
				t.Fatalf("the rewind never reached %s", tc.point)
			}
			move.SetCrashHook(nil)
			if tc.cancel {
				if _, err := c.CancelJob(ctx, j.ID); err != nil {
					t.Fatal(err)
				}
				if j, err = c.WaitJob(ctx, j.ID, nil); err != nil || j.State != jobs.Cancelled {
					t.Fatalf("cancelled rewind: %v %s", err, j.State)
				}
				sameSums(t, "after a cancelled rewind", checksums(t, ctx, r.DSN), destroyed)
				all, err := c.Tenants(ctx, url.Values{"q": {"before its rewind"}})
				if err != nil {
					t.Fatal(err)
				}
				for _, x := range all {
					if x.State == catalog.StateActive || x.State == catalog.StateSuspended {
						t.Errorf("the cancelled rewind's new tenant %s is %s, want dropped or purged", x.ID, x.State)
					}
				}
			} else {
				stop()
				c, stop = backuptest.Daemon(parent, fc, "catalog", map[string]*backup.Stanza{fc.Name(): st}, smallServer)
				logSteps(t, "rewind resumed", waitJob(t, ctx, c, j.ID))
				sameSums(t, "after the resumed rewind", checksums(t, ctx, r.DSN), want)
				backuptest.Exec(t, ctx, r.DSN, `INSERT INTO orders (amount) VALUES (7)`)
			}
			if scratch, _ := filepath.Glob(st.ScratchDir("*")); len(scratch) > 0 {
				t.Errorf("scratch instances left: %v", scratch)
			}
		})
	}
}
