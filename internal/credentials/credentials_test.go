package credentials_test

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/url"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/pgtenant/pgtenant/internal/api"
	"github.com/pgtenant/pgtenant/internal/catalog"
	"github.com/pgtenant/pgtenant/internal/cli"
	"github.com/pgtenant/pgtenant/internal/config"
	"github.com/pgtenant/pgtenant/internal/credentials"
	"github.com/pgtenant/pgtenant/internal/daemon/daemontest"
	"github.com/pgtenant/pgtenant/internal/jobs"
	"github.com/pgtenant/pgtenant/internal/pgtest"
	"github.com/pgtenant/pgtenant/internal/provision"
	"github.com/pgtenant/pgtenant/internal/templates"
	"github.com/pgtenant/pgtenant/internal/tenant"
)

var pg *pgtest.Cluster

// Rotation must hold on the standby: the package's cluster has one.
func TestMain(m *testing.M) { pgtest.Main(m, pgtest.Options{Standbys: 1}, &pg) }

// fixture is a daemon configuration on a private catalog whose daemons log
// into one buffer. When the test ends (its daemons stopped), it checks that
// no password the test saw was logged, or stored in clear anywhere in the
// catalog or in PostgreSQL's roles.
type fixture struct {
	t         *testing.T
	cfg       config.Config
	catalogDB string
	log       pgtest.LogBuffer

	mu        sync.Mutex
	passwords []string
}

// newFixture configures daemons with pools of one spare per mode of the
// template tiny and none of any other template (those go cold).
func newFixture(t *testing.T) *fixture {
	t.Helper()
	cfg := daemontest.Config(t, pg)
	cfg.Provision.DefaultPoolSize = 0
	cfg.Provision.PoolInterval = config.Duration(200 * time.Millisecond)
	cfg.Pools = []config.PoolConfig{{Template: "tiny", Mode: "database", Size: 1}, {Template: "tiny", Mode: "schema", Size: 1}}
	f := &fixture{t: t, cfg: cfg, catalogDB: daemontest.CatalogDB(t, cfg)}
	t.Cleanup(f.checkNoPlaintext) // registered first: runs after the daemons have stopped
	return f
}

// start runs a daemon with cfg, logging to the test and to the fixture.
func (f *fixture) start(cfg config.Config) (*api.Client, func()) {
	f.t.Helper()
	log := slog.New(slog.NewMultiHandler(pgtest.Logger(f.t).Handler(),
		slog.NewTextHandler(&f.log, &slog.HandlerOptions{Level: slog.LevelDebug})))
	return daemontest.StartLogged(f.t, pg, cfg, log)
}

// saw records passwords the test was given, for checkNoPlaintext.
func (f *fixture) saw(passwords ...string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	for _, p := range passwords {
		if p != "" {
			f.passwords = append(f.passwords, p)
		}
	}
}

// checkNoPlaintext: no password the test saw is in the daemons' log, in any
// table of the catalog (as text, hex or base64), or in a role's stored
// password (only SCRAM verifiers reach PostgreSQL).
func (f *fixture) checkNoPlaintext() {
	t := f.t
	ctx := context.Background()
	cat := pg.Conn(t, f.catalogDB)
	tables, err := cat.Query(ctx, `SELECT format('%I', tablename) FROM pg_tables WHERE schemaname = 'public'`)
	if err != nil {
		t.Fatal(err)
	}
	names, err := pgx.CollectRows(tables, pgx.RowTo[string])
	if err != nil {
		t.Fatal(err)
	}
	var dump strings.Builder
	for _, n := range names {
		var rows string
		if err := cat.QueryRow(ctx, `SELECT coalesce(string_agg(t::text, E'\n'), '') FROM `+n+` t`).Scan(&rows); err != nil {
			t.Fatal(err)
		}
		dump.WriteString(rows)
	}
	var verifiers string
	if err := pg.Conn(t, "postgres").QueryRow(ctx, `SELECT coalesce(string_agg(rolpassword, E'\n'), '') FROM pg_authid WHERE rolname LIKE 't\_%'`).Scan(&verifiers); err != nil {
		t.Fatal(err)
	}
	logged := f.log.String()
	f.mu.Lock()
	defer f.mu.Unlock()
	for _, p := range f.passwords {
		if strings.Contains(logged, p) {
			t.Errorf("the daemon logged a tenant's password")
		}
		for _, enc := range []string{p, hex.EncodeToString([]byte(p)), base64.StdEncoding.EncodeToString([]byte(p)), base64.RawStdEncoding.EncodeToString([]byte(p))} {
			if strings.Contains(dump.String(), enc) {
				t.Errorf("the catalog holds a tenant's password in clear (%d bytes as %q)", len(p), enc[:4]+"…")
			}
		}
		if strings.Contains(verifiers, p) {
			t.Errorf("a role's stored password contains a tenant's plaintext password")
		}
	}
	for _, v := range strings.Fields(verifiers) {
		if !strings.HasPrefix(v, "SCRAM-SHA-256$") {
			t.Errorf("a tenant role's stored password is not a SCRAM verifier: %.14s…", v)
		}
	}
}

// keyID is the id of the key in a key file.
func keyID(t *testing.T, path string) string {
	t.Helper()
	k, _, err := credentials.LoadOrCreateKey(path)
	if err != nil {
		t.Fatal(err)
	}
	return k.ID()
}

// defaultKeyFile is where a daemon of cfg keeps its key without credentials.key_file.
func defaultKeyFile(cfg config.Config) string {
	return filepath.Join(filepath.Dir(cfg.TokenFile), "credentials.key")
}

// createTemplate creates a template of one table (and, slow, a build that
// sleeps: cold schema builds then take seconds) and waits until it is built.
func createTemplate(t *testing.T, c *api.Client, name string, slow bool) {
	t.Helper()
	body := "CREATE TABLE t (x int);"
	if slow {
		body += "\nSELECT pg_sleep(3);"
	}
	daemontest.CreateTemplate(t, c, name, []templates.Upload{{Name: "0001_init.sql", Body: body}})
}

// waitSpare waits until the pool of tiny in mode holds a ready spare.
func (f *fixture) waitSpare(mode string) {
	f.t.Helper()
	f.waitCatalog(`SELECT count(*) > 0 FROM tenants WHERE template = 'tiny' AND mode = $1 AND state = 'spare'`, mode)
}

// waitCatalog waits until query (one boolean) answers true in the catalog.
func (f *fixture) waitCatalog(query string, args ...any) {
	f.t.Helper()
	ctx := pgtest.Context(f.t)
	cat := pg.Conn(f.t, f.catalogDB)
	for deadline := time.Now().Add(30 * time.Second); ; {
		var ok bool
		if err := cat.QueryRow(ctx, query, args...).Scan(&ok); err != nil {
			f.t.Fatal(err)
		}
		if ok {
			return
		}
		if time.Now().After(deadline) {
			f.t.Fatalf("still false after 30s: %s %v", query, args)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// credentialCount counts the kept passwords of a tenant.
func (f *fixture) credentialCount(id string) int {
	f.t.Helper()
	var n int
	if err := pg.Conn(f.t, f.catalogDB).QueryRow(pgtest.Context(f.t), `SELECT count(*) FROM credentials WHERE tenant = $1`, id).Scan(&n); err != nil {
		f.t.Fatal(err)
	}
	return n
}

// connect logs in with dsn; the session is closed when the test ends.
func connect(t *testing.T, dsn string) (*pgx.Conn, error) {
	t.Helper()
	conn, err := pgx.Connect(pgtest.Context(t), dsn)
	if err == nil {
		t.Cleanup(func() { conn.Close(context.Background()) })
	}
	return conn, err
}

// mustLogin wants dsn to log in, waiting (up to 10s) for a standby to
// replay the tenant's activation.
func mustLogin(t *testing.T, where, dsn string) *pgx.Conn {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); ; {
		conn, err := connect(t, dsn)
		if err == nil {
			return conn
		}
		if time.Now().After(deadline) {
			t.Fatalf("login on %s: %v; want it accepted", where, err)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// refusedLogin wants dsn refused at once with SQLSTATE code (28P01: wrong
// password; 28000: NOLOGIN).
func refusedLogin(t *testing.T, where, dsn, code string) {
	t.Helper()
	conn, err := connect(t, dsn)
	var pgErr *pgconn.PgError
	if err == nil {
		conn.Close(context.Background())
	}
	if !errors.As(err, &pgErr) || pgErr.Code != code {
		t.Errorf("login on %s: %v; want it refused with SQLSTATE %s", where, err, code)
	}
}

// ended wants a session terminated: its next statement fails (at once, or
// within 5s while the server gets to the signal).
func ended(t *testing.T, where string, conn *pgx.Conn) {
	t.Helper()
	for deadline := time.Now().Add(5 * time.Second); time.Now().Before(deadline); time.Sleep(50 * time.Millisecond) {
		if _, err := conn.Exec(context.Background(), "SELECT 1"); err != nil {
			return
		}
	}
	t.Errorf("session on %s still runs statements; want it ended", where)
}

// alive wants a session still open.
func alive(t *testing.T, where string, conn *pgx.Conn) {
	t.Helper()
	if _, err := conn.Exec(context.Background(), "SELECT 1"); err != nil {
		t.Errorf("session on %s: %v; want it kept", where, err)
	}
}

// hangUp sends a create and closes the connection at once, without reading
// a byte of the answer: the client of a lost response.
func hangUp(t *testing.T, c *api.Client, req provision.Request) {
	t.Helper()
	u, err := url.Parse(c.BaseURL)
	if err != nil {
		t.Fatal(err)
	}
	body, err := json.Marshal(req)
	if err != nil {
		t.Fatal(err)
	}
	conn, err := net.Dial("tcp", u.Host)
	if err != nil {
		t.Fatal(err)
	}
	_, err = fmt.Fprintf(conn, "POST /v1/tenants HTTP/1.1\r\nHost: %s\r\nAuthorization: Bearer %s\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s",
		u.Host, c.Token, len(body), body)
	conn.Close()
	if err != nil {
		t.Fatal(err)
	}
}

// answerDropper is a TCP proxy to the daemon that forwards requests and
// drops the answers: at the first byte of an answer it closes the client's
// connection. The daemon has done all its work; the client never hears of it.
func answerDropper(t *testing.T, c *api.Client) *api.Client {
	t.Helper()
	u, err := url.Parse(c.BaseURL)
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	go func() {
		for {
			client, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer client.Close()
				server, err := net.Dial("tcp", u.Host)
				if err != nil {
					return
				}
				defer server.Close()
				go io.Copy(server, client)
				server.Read(make([]byte, 1)) // the answer starts: drop it
			}()
		}
	}()
	return api.NewClient("http://"+ln.Addr().String(), c.Token)
}

// TestCreate_CutOffThenRetried: creates whose answers never reach the
// client — one whose answer is dropped on the way, one whose client hangs
// up right after sending, one cut off while its cold build runs — are
// retried by external id and get passwords that log in, from the same
// daemon and from a new daemon started on the same catalog after the first
// was stopped under the build.
func TestCreate_CutOffThenRetried(t *testing.T) {
	f := newFixture(t)
	ctx := pgtest.Context(t)
	c, stop := f.start(f.cfg)
	createTemplate(t, c, "tiny", false)
	createTemplate(t, c, "slow", true)
	f.waitSpare("database")

	// From the pool: the answer is lost on the way back.
	pooled := provision.Request{Template: "tiny", Mode: "database", ExternalID: "cut-pool"}
	if lost, err := answerDropper(t, c).CreateTenant(ctx, pooled); err == nil {
		t.Fatalf("the create through the answer dropper got its answer (%s); want it lost", lost.Tenant.ID)
	}
	first, err := c.CreateTenant(ctx, pooled)
	if err != nil {
		t.Fatal(err)
	}
	f.saw(first.Password)
	if !first.Existing || first.Password == "" {
		t.Fatalf("retry of a create whose answer was lost: existing %v, password set %v, note %q; want the tenant with its password",
			first.Existing, first.Password != "", first.Note)
	}
	mustLogin(t, "primary", first.DSN)

	// From the pool: the client hangs up as soon as the request is sent.
	f.waitSpare("database")
	hungUp := provision.Request{Template: "tiny", Mode: "database", ExternalID: "cut-hang-up"}
	hangUp(t, c, hungUp)
	time.Sleep(time.Second) // whatever the daemon made of it, it has made it
	var made bool
	if err := pg.Conn(t, f.catalogDB).QueryRow(ctx, `SELECT count(*) > 0 FROM tenants WHERE external_id = 'cut-hang-up'`).Scan(&made); err != nil {
		t.Fatal(err)
	}
	hung, err := c.CreateTenant(ctx, hungUp)
	if err != nil {
		t.Fatal(err)
	}
	f.saw(hung.Password)
	t.Logf("the create whose client hung up made the tenant: %v", made)
	if hung.Password == "" || hung.Existing != made {
		t.Fatalf("retry of a create whose client hung up: existing %v (made before: %v), password set %v, note %q; want its password",
			hung.Existing, made, hung.Password != "", hung.Note)
	}
	mustLogin(t, "primary", hung.DSN)

	// Cold: the client gives up while the build runs (the template sleeps).
	cold := provision.Request{Template: "slow", Mode: "schema", ExternalID: "cut-cold"}
	cctx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() {
		_, err := c.CreateTenant(cctx, cold)
		done <- err
	}()
	f.waitCatalog(`SELECT count(*) > 0 FROM tenants WHERE external_id = 'cut-cold'`)
	cancel()
	if err := <-done; err == nil {
		t.Fatalf("the cut-off cold create got its answer; want it cut off during the build")
	}
	// The daemon stops under the build; another starts on the same catalog
	// (same key file) and finishes it.
	stop()
	c2, _ := f.start(f.cfg)
	retried, err := c2.CreateTenant(ctx, cold)
	if err != nil {
		t.Fatal(err)
	}
	f.saw(retried.Password)
	if !retried.Existing || retried.Password == "" || !strings.Contains(retried.DSN, retried.Password) {
		t.Fatalf("retry through the new daemon = existing %v, password set %v, note %q; want the tenant with its password",
			retried.Existing, retried.Password != "", retried.Note)
	}
	if retried.Job != nil {
		if j, err := c2.WaitJob(ctx, retried.Job.ID, nil); err != nil || j.State != jobs.Succeeded {
			t.Fatalf("build job after the restart: %s %v: %s", j.State, err, j.LastError)
		}
	}
	conn := mustLogin(t, "primary", retried.DSN)
	if _, err := conn.Exec(ctx, "INSERT INTO t VALUES (1)"); err != nil {
		t.Errorf("the cold tenant cannot use its schema: %v", err)
	}
	again, err := c2.CreateTenant(ctx, pooled)
	if err != nil {
		t.Fatal(err)
	}
	if !again.Existing || again.Password != first.Password || again.Tenant.ID != first.Tenant.ID {
		t.Errorf("retry of the pooled create through the new daemon: existing %v, same password %v; want the same answer",
			again.Existing, again.Password == first.Password)
	}
	mustLogin(t, "standby", pg.OnStandby(t, again.DSN))
}

// TestRetry_WindowEnds: a kept password is answered within
// credentials.retry_window only; then a retry answers without it, saying
// why, and the row is gone (at once for a retried tenant, by the sweep for
// the others). Creates without an external id keep nothing. The password
// itself still works: only the copy is gone.
func TestRetry_WindowEnds(t *testing.T) {
	f := newFixture(t)
	ctx := pgtest.Context(t)
	window := 4 * time.Second
	f.cfg.Credentials.RetryWindow = config.Duration(window)
	c, _ := f.start(f.cfg)
	createTemplate(t, c, "tiny", false)
	f.waitSpare("database")
	f.waitSpare("schema")

	req := provision.Request{Template: "tiny", Mode: "database", ExternalID: "win-x"}
	x, err := c.CreateTenant(ctx, req)
	if err != nil {
		t.Fatal(err)
	}
	created := time.Now()
	f.saw(x.Password)
	retried, err := c.CreateTenant(ctx, req)
	if err != nil {
		t.Fatal(err)
	}
	if time.Since(created) < window && (!retried.Existing || retried.Password != x.Password) {
		t.Errorf("retry within the window: existing %v, same password %v; want the first answer's password", retried.Existing, retried.Password == x.Password)
	}
	y, err := c.CreateTenant(ctx, provision.Request{Template: "tiny", Mode: "schema", ExternalID: "win-y"})
	if err != nil {
		t.Fatal(err)
	}
	z, err := c.CreateTenant(ctx, provision.Request{Template: "tiny", Mode: "database"})
	if err != nil {
		t.Fatal(err)
	}
	f.saw(y.Password, z.Password)
	if got := f.credentialCount(z.Tenant.ID); got != 0 {
		t.Errorf("a create without an external id kept %d passwords, want none (nothing can retry it)", got)
	}

	time.Sleep(time.Until(created.Add(window + 100*time.Millisecond)))
	late, err := c.CreateTenant(ctx, req)
	if err != nil {
		t.Fatal(err)
	}
	if !late.Existing || late.Password != "" || strings.Contains(late.DSN, x.Password) || !strings.Contains(late.Note, "credentials.retry_window") {
		t.Errorf("retry after the window: existing %v, password set %v, note %q; want the tenant without its password and a note naming credentials.retry_window",
			late.Existing, late.Password != "", late.Note)
	}
	if got := f.credentialCount(x.Tenant.ID); got != 0 {
		t.Errorf("%d kept passwords of the retried tenant after its window, want none", got)
	}
	f.waitCatalog(`SELECT count(*) = 0 FROM credentials WHERE tenant = $1`, y.Tenant.ID) // the sweep
	mustLogin(t, "primary", x.DSN)
}

// TestRotate_OldRefusedNewAccepted: in both modes, a rotation refuses the
// old password at once on the primary and on the standby and accepts the
// new one on both; by default the tenant's sessions are ended on both,
// with --keep-sessions (through the CLI, -o json) they stay. A retry of the
// create then answers with the current password.
func TestRotate_OldRefusedNewAccepted(t *testing.T) {
	f := newFixture(t)
	c, _ := f.start(f.cfg)
	createTemplate(t, c, "tiny", false)
	for _, mode := range []string{"database", "schema"} {
		t.Run(mode, func(t *testing.T) {
			ctx := pgtest.Context(t)
			f.waitSpare(mode)
			req := provision.Request{Template: "tiny", Mode: tenant.Mode(mode), ExternalID: "rot-" + mode}
			created, err := c.CreateTenant(ctx, req)
			if err != nil {
				t.Fatal(err)
			}
			f.saw(created.Password)
			primary := mustLogin(t, "primary", created.DSN)
			standby := mustLogin(t, "standby", pg.OnStandby(t, created.DSN))

			rotated, err := c.RotatePassword(ctx, created.Tenant.ID, false)
			if err != nil {
				t.Fatal(err)
			}
			f.saw(rotated.Password)
			if rotated.Password == "" || rotated.Password == created.Password || !strings.Contains(rotated.DSN, rotated.Password) {
				t.Fatalf("rotate = %+v; want a new password in the DSN", rotated.Tenant.ID)
			}
			if rotated.SessionsEnded < 2 || rotated.Note != "" {
				t.Errorf("rotate ended %d sessions (note %q); want both of the tenant's (primary and standby)", rotated.SessionsEnded, rotated.Note)
			}
			ended(t, "primary", primary)
			ended(t, "standby", standby)
			refusedLogin(t, "primary", created.DSN, "28P01")
			refusedLogin(t, "standby", pg.OnStandby(t, created.DSN), "28P01")
			primary = mustLogin(t, "primary", rotated.DSN)
			standby = mustLogin(t, "standby", pg.OnStandby(t, rotated.DSN))

			// --keep-sessions, through the CLI.
			t.Setenv("PGTENANT_TOKEN", c.Token)
			var stdout, stderr bytes.Buffer
			if err := cli.Run(ctx, []string{"tenant", "password", created.Tenant.ID, "--keep-sessions", "-o", "json", "--server", c.BaseURL}, &stdout, &stderr); err != nil {
				t.Fatalf("pgtenant tenant password: %v\n%s", err, stderr.String())
			}
			var out struct {
				DSN           string `json:"dsn"`
				Password      string `json:"password"`
				SessionsEnded int    `json:"sessions_ended"`
			}
			if err := json.Unmarshal(stdout.Bytes(), &out); err != nil {
				t.Fatalf("pgtenant tenant password -o json: %v\n%s", err, stdout.String())
			}
			f.saw(out.Password)
			if out.Password == "" || out.Password == rotated.Password || !strings.Contains(out.DSN, out.Password) || out.SessionsEnded != 0 {
				t.Fatalf("CLI rotate: new password %v, in the DSN %v, sessions ended %d; want a new password in .dsn and none ended",
					out.Password != rotated.Password, strings.Contains(out.DSN, out.Password), out.SessionsEnded)
			}
			alive(t, "primary", primary)
			alive(t, "standby", standby)
			refusedLogin(t, "primary", rotated.DSN, "28P01")
			refusedLogin(t, "standby", pg.OnStandby(t, rotated.DSN), "28P01")
			mustLogin(t, "primary", out.DSN)
			mustLogin(t, "standby", pg.OnStandby(t, out.DSN))

			retried, err := c.CreateTenant(ctx, req)
			if err != nil {
				t.Fatal(err)
			}
			if retried.Password != out.Password {
				t.Errorf("retry of the create after rotations: current password %v (old one %v); want the current one",
					retried.Password == out.Password, retried.Password == created.Password)
			}
			shown, err := c.Tenant(ctx, created.Tenant.ID)
			if err != nil {
				t.Fatal(err)
			}
			n := 0
			for _, e := range shown.Events {
				if e.Kind == "password_rotated" {
					n++
				}
			}
			if n != 2 {
				t.Errorf("%d password_rotated events, want 2", n)
			}
		})
	}
}

// TestRotate_States: a suspended tenant can be rotated (and still cannot
// log in until resumed, then only with the new password); provisioning and
// dropped tenants are 409 with what to do; unknown ids are 404.
func TestRotate_States(t *testing.T) {
	f := newFixture(t)
	ctx := pgtest.Context(t)
	c, _ := f.start(f.cfg)
	createTemplate(t, c, "tiny", false)
	f.waitSpare("database")
	created, err := c.CreateTenant(ctx, provision.Request{Template: "tiny", Mode: "database"})
	if err != nil {
		t.Fatal(err)
	}
	id := created.Tenant.ID
	f.saw(created.Password)

	if _, err := c.TenantAction(ctx, id, "suspend"); err != nil {
		t.Fatal(err)
	}
	rotated, err := c.RotatePassword(ctx, id, false)
	if err != nil {
		t.Fatalf("rotate a suspended tenant: %v", err)
	}
	f.saw(rotated.Password)
	if rotated.Tenant.State != catalog.StateSuspended {
		t.Errorf("rotated tenant is %s, want still suspended", rotated.Tenant.State)
	}
	refusedLogin(t, "primary (suspended)", rotated.DSN, "28000")
	if _, err := c.TenantAction(ctx, id, "resume"); err != nil {
		t.Fatal(err)
	}
	mustLogin(t, "primary", rotated.DSN)
	refusedLogin(t, "primary", created.DSN, "28P01")

	cat := pg.Conn(t, f.catalogDB)
	if _, err := cat.Exec(ctx, `UPDATE tenants SET state = 'provisioning' WHERE id = $1`, id); err != nil {
		t.Fatal(err)
	}
	_, err = c.RotatePassword(ctx, id, false)
	wantStatus(t, "rotate while provisioning", err, http.StatusConflict, "provisioned")
	if _, err := cat.Exec(ctx, `UPDATE tenants SET state = 'active' WHERE id = $1`, id); err != nil {
		t.Fatal(err)
	}
	if _, err := c.DropTenant(ctx, id, false); err != nil {
		t.Fatal(err)
	}
	_, err = c.RotatePassword(ctx, id, false)
	wantStatus(t, "rotate a dropped tenant", err, http.StatusConflict, "restore it first")
	for _, bad := range []string{"aaaaaaaaaaaa", "not-an-id", "../jobs"} {
		_, err = c.RotatePassword(ctx, bad, false)
		wantStatus(t, "rotate "+bad, err, http.StatusNotFound, "")
	}
}

func wantStatus(t *testing.T, what string, err error, status int, msg string) {
	t.Helper()
	var apiErr *api.Error
	if !errors.As(err, &apiErr) || apiErr.Status != status || !strings.Contains(apiErr.Message, msg) {
		t.Errorf("%s: %v; want %d containing %q", what, err, status, msg)
	}
}

// TestRotate_TenantHoldsItsRole: a tenant keeps its own ALTER ROLE open
// (holding its role's row). A rotation that keeps sessions cannot end it:
// it answers 409 within its lock timeout, never hangs; a rotation that
// ends sessions gets through, and the tenant's own password never commits.
func TestRotate_TenantHoldsItsRole(t *testing.T) {
	f := newFixture(t)
	ctx := pgtest.Context(t)
	c, _ := f.start(f.cfg)
	createTemplate(t, c, "tiny", false)
	f.waitSpare("schema")
	created, err := c.CreateTenant(ctx, provision.Request{Template: "tiny", Mode: "schema"})
	if err != nil {
		t.Fatal(err)
	}
	f.saw(created.Password)
	hostile := mustLogin(t, "primary", created.DSN)
	const mine = "the-tenants-own-choice"
	if _, err := hostile.Exec(ctx, "BEGIN; ALTER ROLE CURRENT_USER PASSWORD '"+mine+"'"); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	_, err = c.RotatePassword(ctx, created.Tenant.ID, true)
	wantStatus(t, "rotate --keep-sessions while the tenant holds its role", err, http.StatusConflict, "keep-sessions")
	if took := time.Since(start); took > 8*time.Second {
		t.Errorf("refusal took %v, want it within the lock timeout (3s)", took)
	}
	rotated, err := c.RotatePassword(ctx, created.Tenant.ID, false)
	if err != nil {
		t.Fatalf("rotate (ending sessions) while the tenant holds its role: %v", err)
	}
	f.saw(rotated.Password)
	ended(t, "primary", hostile)
	mustLogin(t, "primary", rotated.DSN)
	u, _ := url.Parse(created.DSN)
	u.User = url.UserPassword(u.User.Username(), mine)
	refusedLogin(t, "primary", u.String(), "28P01")
}

// TestRetry_OtherKey: a daemon whose credentials key is not the one that
// kept a password says so at start, and answers a retry with the tenant, no
// password and a note naming both keys; it keeps serving. The daemon with
// the right key still answers with the password.
func TestRetry_OtherKey(t *testing.T) {
	f := newFixture(t)
	ctx := pgtest.Context(t)
	c, _ := f.start(f.cfg)
	createTemplate(t, c, "tiny", false)
	f.waitSpare("database")
	req := provision.Request{Template: "tiny", Mode: "database", ExternalID: "other-key"}
	created, err := c.CreateTenant(ctx, req)
	if err != nil {
		t.Fatal(err)
	}
	f.saw(created.Password)

	other := f.cfg
	other.Credentials.KeyFile = filepath.Join(t.TempDir(), "other.key")
	c2, _ := f.start(other)
	if !strings.Contains(f.log.String(), "other credentials keys") {
		t.Errorf("the daemon with another key did not warn at start that the catalog holds passwords of other keys")
	}
	got, err := c2.CreateTenant(ctx, req)
	if err != nil {
		t.Fatalf("retry through the daemon with another key: %v", err)
	}
	mine, theirs := keyID(t, defaultKeyFile(f.cfg)), keyID(t, other.Credentials.KeyFile)
	if !got.Existing || got.Password != "" || got.Tenant.ID != created.Tenant.ID ||
		!strings.Contains(got.Note, mine) || !strings.Contains(got.Note, theirs) || !strings.Contains(got.Note, "credentials.key_file") {
		t.Errorf("retry through the daemon with another key = existing %v, password set %v, note %q; want the tenant, no password, a note naming keys %s and %s",
			got.Existing, got.Password != "", got.Note, mine, theirs)
	}
	if _, err := c2.Tenants(ctx, url.Values{}); err != nil {
		t.Errorf("the daemon with another key stopped serving: %v", err)
	}
	if again, err := c.CreateTenant(ctx, req); err != nil || again.Password != created.Password {
		t.Errorf("retry through the daemon with the key: same password %v, %v; want it", again.Password == created.Password, err)
	}
}

// TestCredentials_SealedNotInClear: the kept row holds neither the
// password nor anything but its sealed form and the key's fingerprint; a
// sealed password copied to another tenant's row does not open there (the
// tenant id is authenticated), and that retry answers without a password.
// (Every test's fixture also checks the log, the catalog and the roles.)
func TestCredentials_SealedNotInClear(t *testing.T) {
	f := newFixture(t)
	ctx := pgtest.Context(t)
	c, _ := f.start(f.cfg)
	createTemplate(t, c, "tiny", false)
	f.waitSpare("database")
	a, err := c.CreateTenant(ctx, provision.Request{Template: "tiny", Mode: "database", ExternalID: "sealed-a"})
	if err != nil {
		t.Fatal(err)
	}
	f.waitSpare("database")
	bReq := provision.Request{Template: "tiny", Mode: "database", ExternalID: "sealed-b"}
	b, err := c.CreateTenant(ctx, bReq)
	if err != nil {
		t.Fatal(err)
	}
	f.saw(a.Password, b.Password)
	cat := pg.Conn(t, f.catalogDB)
	var sealed []byte
	var key string
	if err := cat.QueryRow(ctx, `SELECT sealed, key_id FROM credentials WHERE tenant = $1`, a.Tenant.ID).Scan(&sealed, &key); err != nil {
		t.Fatal(err)
	}
	if bytes.Contains(sealed, []byte(a.Password)) || len(sealed) != 12+len(a.Password)+16 || key != keyID(t, defaultKeyFile(f.cfg)) {
		t.Errorf("kept row: %d bytes (want nonce, ciphertext and tag: %d), key id %q; want no plaintext", len(sealed), 12+len(a.Password)+16, key)
	}
	if _, err := cat.Exec(ctx, `UPDATE credentials SET sealed = $2 WHERE tenant = $1`, b.Tenant.ID, sealed); err != nil {
		t.Fatal(err)
	}
	got, err := c.CreateTenant(ctx, bReq)
	if err != nil {
		t.Fatal(err)
	}
	if got.Password != "" || !strings.Contains(got.Note, "another tenant") {
		t.Errorf("retry of b with a's sealed password copied in: password set %v (a's: %v), note %q; want no password and a note",
			got.Password != "", got.Password == a.Password, got.Note)
	}
}

// TestCredentials_GoneWithTenant: purging a tenant deletes its kept
// password (the row cascades with the tenant's).
func TestCredentials_GoneWithTenant(t *testing.T) {
	f := newFixture(t)
	ctx := pgtest.Context(t)
	c, _ := f.start(f.cfg)
	createTemplate(t, c, "tiny", false)
	f.waitSpare("database")
	created, err := c.CreateTenant(ctx, provision.Request{Template: "tiny", Mode: "database", ExternalID: "purged"})
	if err != nil {
		t.Fatal(err)
	}
	f.saw(created.Password)
	if got := f.credentialCount(created.Tenant.ID); got != 1 {
		t.Fatalf("kept passwords = %d, want 1", got)
	}
	res, err := c.DropTenant(ctx, created.Tenant.ID, true)
	if err != nil || res.Job == nil {
		t.Fatalf("drop --purge-now: %+v, %v", res, err)
	}
	if j, err := c.WaitJob(ctx, res.Job.ID, nil); err != nil || j.State != jobs.Succeeded {
		t.Fatalf("purge: %s %v: %s", j.State, err, j.LastError)
	}
	if got := f.credentialCount(created.Tenant.ID); got != 0 {
		t.Errorf("kept passwords after the purge = %d, want 0", got)
	}
}
