package analytics_test

import (
	"bytes"
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"net"
	"net/url"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/pgtenant/pgtenant/internal/analytics"
	"github.com/pgtenant/pgtenant/internal/daemon/daemontest"
	"github.com/pgtenant/pgtenant/internal/provision"
	"github.com/pgtenant/pgtenant/internal/tenant"
)

// onPort is an analytics DSN moved to another daemon's port.
func onPort(t *testing.T, dsn, addr string) string {
	t.Helper()
	u, err := url.Parse(dsn)
	if err != nil {
		t.Fatal(err)
	}
	u.Host = addr
	return u.String()
}

// answers is what a tenant's queries return through an analytics port, in
// both protocols.
func answers(t *testing.T, dsn, password string) (string, error) {
	t.Helper()
	ctx := context.Background()
	var out []string
	for _, mode := range []pgx.QueryExecMode{pgx.QueryExecModeSimpleProtocol, pgx.QueryExecModeCacheStatement} {
		conn, err := analyticsConn(t, dsn, password, mode)
		if err != nil {
			return "", err
		}
		var n, sum int64
		var names, row string
		err = conn.QueryRow(ctx, `SELECT count(*), sum(qty), string_agg(name, ',' ORDER BY id) FROM items`).Scan(&n, &sum, &names)
		if err == nil {
			err = conn.QueryRow(ctx, `SELECT concat_ws('|', id, qty, name, "at", price) FROM items WHERE id = $1`, 30).Scan(&row)
		}
		conn.Close(ctx)
		if err != nil {
			return "", err
		}
		out = append(out, fmt.Sprintf("%v: %d %d %s %s", mode, n, sum, row, names))
	}
	return strings.Join(out, "\n"), nil
}

// Two daemons on one catalog: a tenant reaches its mirror through either
// one's analytics port (the one that does not own it forwards the session
// to the owner); once the owner stops, the other takes the lease over and
// serves it itself, on the same DSN.
func TestForward_AnyDaemonAnswers(t *testing.T) {
	ctx := context.Background()
	cfg := testConfig(t)
	// A listens on every interface and advertises a name: the DSNs and
	// the forwarding use the name.
	cfgA := cfg
	port := freePort(t)
	cfgA.Analytics.Listen, cfgA.Analytics.Advertise = "0.0.0.0:"+port, "localhost:"+port
	ca, stopA := daemontest.StartCancellable(t, pg, cfgA)
	template(t, ca)
	m := mirroredTenant(t, ca, "database")
	id, pw := m.r.Tenant.ID, m.r.Password
	stA, err := ca.AnalyticsStatus(ctx, id)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(stA.DSN, "@localhost:"+port+"/") {
		t.Errorf("analytics DSN %s does not name analytics.advertise localhost:%s", stA.DSN, port)
	}
	b, cb := daemontest.Start(t, pg, cfg)
	onB := onPort(t, m.dsn, b.Analytics().Addr())
	if onB == m.dsn {
		t.Fatalf("both daemons on one port: %s", onB)
	}

	want, err := answers(t, m.dsn, pw)
	if err != nil {
		t.Fatalf("on the owner: %v", err)
	}
	got, err := answers(t, onB, pw)
	if err != nil {
		t.Fatalf("forwarded: %v", err)
	}
	if got != want {
		t.Errorf("forwarded answers differ:\n got %.300s\nwant %.300s", got, want)
	}
	if st, err := cb.AnalyticsStatus(ctx, id); err != nil || st.Owner != stA.Owner {
		t.Fatalf("the mirror moved while forwarding: %+v %v (owner was %s)", st, err, stA.Owner)
	}
	// A wrong password is refused by the forwarder, as by the owner.
	if _, err := analyticsConn(t, onB, "wrong", pgx.QueryExecModeSimpleProtocol); !isCode(err, "28P01") {
		t.Errorf("wrong password through the forwarder: %v", err)
	}

	// Read-your-writes through the forwarder.
	var lsn string
	heap, err := pgx.Connect(ctx, m.r.DSN)
	if err != nil {
		t.Fatal(err)
	}
	exec(t, m.r.DSN, `INSERT INTO items VALUES (5000, 1, 'fresh', NULL, NULL, NULL)`)
	if err := heap.QueryRow(ctx, `SELECT pg_current_wal_lsn()::text`).Scan(&lsn); err != nil { // after the commit
		t.Fatal(err)
	}
	heap.Close(ctx)
	conn, err := analyticsConn(t, onB, pw, pgx.QueryExecModeSimpleProtocol)
	if err != nil {
		t.Fatal(err)
	}
	var n int
	if _, err := conn.Exec(ctx, `WAIT FOR LSN '`+lsn+`'`); err != nil {
		t.Fatal(err)
	}
	if err := conn.QueryRow(ctx, `SELECT count(*) FROM items`).Scan(&n); err != nil || n != 301 {
		t.Errorf("after WAIT FOR LSN through the forwarder: %d rows, %v; want 301", n, err)
	}
	conn.Close(ctx)
	want, err = answers(t, m.dsn, pw)
	if err != nil {
		t.Fatal(err)
	}

	// The owner stops: B takes the lease over and serves the same answers
	// on its own port; meanwhile a login is answered or told to retry.
	stopA()
	var last error
	for i := 0; ; i++ {
		got, last = answers(t, onB, pw)
		if last == nil && got == want {
			break
		}
		if last != nil && !isCode(last, "57P03") {
			t.Fatalf("during the handover: %v", last)
		}
		if i == 300 {
			t.Fatalf("B never served the mirror: %v\n got %.300s\nwant %.300s", last, got, want)
		}
		time.Sleep(100 * time.Millisecond)
	}
	st, err := cb.AnalyticsStatus(ctx, id)
	if err != nil || st.Owner == stA.Owner || !strings.Contains(st.DSN, b.Analytics().Addr()) {
		t.Errorf("after the handover: %+v %v (A was %s)", st, err, stA.Owner)
	}
	if _, ok := b.Analytics().Progress(id); !ok {
		t.Errorf("B answers but does not run the mirror")
	}
}

func isCode(err error, code string) bool {
	var pe *pgconn.PgError
	return errors.As(err, &pe) && pe.Code == code
}

// forwarded logs in with a forwarding proof and no password, as a daemon
// does (or a tenant trying to).
func forwarded(t *testing.T, dsn, user, token string) (*pgx.Conn, error) {
	t.Helper()
	cfg, err := pgx.ParseConfig(dsn)
	if err != nil {
		t.Fatal(err)
	}
	cfg.User, cfg.Database, cfg.Password = user, user, ""
	cfg.RuntimeParams[analytics.ForwardParam] = token
	return pgx.ConnectConfig(context.Background(), cfg)
}

// A tenant cannot use the forwarding parameter: not to skip its password
// (a forged, expired, far-future, other-daemon, other-tenant or replayed
// proof is refused, and so is the parameter with the right password), not
// to reach another tenant's mirror. A genuine proof logs in (the control).
// With the owner unreachable, a login is told to retry.
func TestHostile_ForwardProof(t *testing.T) {
	ctx := context.Background()
	cfg := testConfig(t)
	d, c := daemontest.Start(t, pg, cfg)
	template(t, c)
	m := mirroredTenant(t, c, "database")
	other, err := c.CreateTenant(ctx, provision.Request{Template: "an", Mode: "database"})
	if err != nil {
		t.Fatal(err)
	}
	id, addr := m.r.Tenant.ID, d.Analytics().Addr()
	user := tenant.Prefix + id
	key, err := d.Analytics().Store.Secret(ctx, analytics.ForwardSecret)
	if err != nil {
		t.Fatal(err)
	}
	forged := make([]byte, 32)
	_, _ = rand.Read(forged)
	soon := time.Now().Add(10 * time.Second)

	genuine := analytics.ForwardToken(key, id, addr, soon)
	conn, err := forwarded(t, m.dsn, user, genuine)
	if err != nil {
		t.Fatalf("a genuine proof is refused: %v", err)
	}
	var n int
	if err := conn.QueryRow(ctx, `SELECT count(*) FROM items`).Scan(&n); err != nil || n != 300 {
		t.Errorf("forwarded session: %d rows, %v", n, err)
	}
	conn.Close(ctx)

	for _, c := range []struct{ name, user, token string }{
		{"replayed", user, genuine},
		{"garbage", user, "v1.1.2.3"},
		{"empty", user, ""},
		{"forged key", user, analytics.ForwardToken(forged, id, addr, soon)},
		{"expired", user, analytics.ForwardToken(key, id, addr, time.Now().Add(-time.Second))},
		{"far future", user, analytics.ForwardToken(key, id, addr, time.Now().Add(time.Hour))},
		{"another daemon's", user, analytics.ForwardToken(key, id, "127.0.0.1:1", soon)},
		{"its own, on another tenant's login,", tenant.Prefix + other.Tenant.ID, analytics.ForwardToken(key, id, addr, soon)},
		{"another tenant's, on its login,", user, analytics.ForwardToken(key, other.Tenant.ID, addr, soon)},
	} {
		conn, err := forwarded(t, m.dsn, c.user, c.token)
		if err == nil {
			conn.Close(ctx)
		}
		if !isCode(err, "28000") {
			t.Errorf("%s proof: got %v, want refused (28000)", c.name, err)
		}
	}
	// The parameter with the tenant's own password: refused too.
	pc, err := pgx.ParseConfig(m.dsn)
	if err != nil {
		t.Fatal(err)
	}
	pc.Password = m.r.Password
	pc.RuntimeParams[analytics.ForwardParam] = "v1.1.2.3"
	if conn, err := pgx.ConnectConfig(ctx, pc); !isCode(err, "28000") {
		if err == nil {
			conn.Close(ctx)
		}
		t.Errorf("the parameter with the password: got %v, want refused", err)
	}

	// An owner that does not answer: FATAL, retry.
	cat := daemontest.CatalogConn(t, pg, cfg)
	if _, err := cat.Exec(ctx, `UPDATE analytics SET owner = 'ghost', owner_addr = '127.0.0.1:1', lease_expires = now() + interval '1 hour' WHERE tenant = $1`, id); err != nil {
		t.Fatal(err)
	}
	for i := 0; ; i++ {
		conn, err := analyticsConn(t, m.dsn, m.r.Password, pgx.QueryExecModeSimpleProtocol)
		if err == nil {
			conn.Close(ctx)
		}
		var pe *pgconn.PgError
		if errors.As(err, &pe) && pe.Code == "57P03" && pe.Severity == "FATAL" && strings.Contains(pe.Message, "retry") {
			break
		}
		if i == 100 { // the daemon first notices it lost the lease
			t.Fatalf("login with an unreachable owner: %v", err)
		}
		time.Sleep(100 * time.Millisecond)
	}

	// An "owner" that asks for a password, or says nothing: the forwarder
	// gives up (within its handshake bound) and the client is told to retry,
	// without having been let in.
	for name, answer := range map[string][]byte{"asks for a password": {'R', 0, 0, 0, 8, 0, 0, 0, 3}, "silent": nil} {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		got := make(chan string, 1)
		go func() {
			fc, err := ln.Accept()
			if err != nil {
				return
			}
			defer fc.Close()
			buf := make([]byte, 4096)
			n, _ := fc.Read(buf)
			got <- string(buf[:n])
			if answer != nil {
				_, _ = fc.Write(answer)
			}
			_, _ = fc.Read(buf) // until the forwarder hangs up
		}()
		if _, err := cat.Exec(ctx, `UPDATE analytics SET owner_addr = $2 WHERE tenant = $1`, id, ln.Addr().String()); err != nil {
			t.Fatal(err)
		}
		conn, err := analyticsConn(t, m.dsn, m.r.Password, pgx.QueryExecModeSimpleProtocol)
		if err == nil {
			conn.Close(ctx)
		}
		if !isCode(err, "57P03") {
			t.Errorf("%s owner: got %v, want 57P03", name, err)
		}
		if startup := <-got; !strings.Contains(startup, analytics.ForwardParam) || strings.Contains(startup, m.r.Password) {
			t.Errorf("%s owner got %q: want a proof, never the password", name, startup)
		}
		ln.Close()
	}
}

// Daemons racing to make the fleet's key all get the same one.
func TestForward_SharedKeyRace(t *testing.T) {
	d, _ := daemontest.Start(t, pg, testConfig(t))
	keys := make([][]byte, 8)
	errs := make([]error, 8)
	var wg sync.WaitGroup
	for i := range keys {
		wg.Go(func() { keys[i], errs[i] = d.Analytics().Store.Secret(context.Background(), "race_test") })
	}
	wg.Wait()
	for i := range keys {
		if errs[i] != nil || len(keys[i]) != 32 || !bytes.Equal(keys[i], keys[0]) {
			t.Fatalf("key %d: %x %v (first %x)", i, keys[i], errs[i], keys[0])
		}
	}
}

// freePort is a TCP port free a moment ago.
func freePort(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	_, port, _ := net.SplitHostPort(ln.Addr().String())
	return port
}
