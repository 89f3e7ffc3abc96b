package cluster_test

import (
	"strings"
	"sync"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/pgtenant/pgtenant/internal/cluster"
	"github.com/pgtenant/pgtenant/internal/fleet"
	"github.com/pgtenant/pgtenant/internal/pgtest"
)

var pg *pgtest.Cluster

func TestMain(m *testing.M) {
	pgtest.Main(m, pgtest.Options{}, &pg)
}

// TestConnect_PinnedSettingsBeatDatabaseAndRoleSettings: whatever the
// owner of a database or a role set as their defaults (ALTER DATABASE …
// SET, ALTER ROLE … SET), pgtenant's sessions start with its own: admin
// sessions, and sessions as another role (a tenant's agent).
func TestConnect_PinnedSettingsBeatDatabaseAndRoleSettings(t *testing.T) {
	ctx := pgtest.Context(t)
	db := pg.NewDatabase(t)
	admin := pg.Conn(t, "postgres")
	role := "pinned_" + pgtest.RandomSuffix()
	for _, sql := range []string{
		"CREATE ROLE " + role + " LOGIN PASSWORD 'secret-pinned'",
		"GRANT CONNECT ON DATABASE " + db + " TO " + role,
		"ALTER ROLE " + role + " SET search_path = public, pg_catalog",
		"ALTER ROLE " + role + " SET default_transaction_read_only = on",
		"ALTER DATABASE " + db + " SET search_path = public, pg_catalog",
		"ALTER DATABASE " + db + " SET default_transaction_read_only = on",
		"ALTER DATABASE " + db + " SET statement_timeout = 1",
		"ALTER DATABASE " + db + " SET lock_timeout = 1",
		"ALTER DATABASE " + db + " SET standard_conforming_strings = off",
		"ALTER DATABASE " + db + " SET exit_on_error = on",
		"ALTER DATABASE " + db + " SET jit = on",
		"ALTER DATABASE " + db + " SET jit_above_cost = 0",
		"ALTER DATABASE " + db + " SET role = " + role,
	} {
		if _, err := admin.Exec(ctx, sql); err != nil {
			t.Fatalf("%s: %v", sql, err)
		}
	}
	t.Cleanup(func() {
		_, _ = admin.Exec(ctx, "DROP DATABASE IF EXISTS "+db+" WITH (FORCE)")
		_, _ = admin.Exec(ctx, "DROP ROLE "+role)
	})
	cl := pg.Admin(t)

	as, err := cl.ConnectAs(ctx, db, role, "secret-pinned", "pgtenant test")
	if err != nil {
		t.Fatal(err)
	}
	defer as.Close(ctx)
	adminConn, err := cl.Connect(ctx, db)
	if err != nil {
		t.Fatal(err)
	}
	defer adminConn.Close(ctx)
	for _, c := range []struct {
		who  string
		user string
		run  func(string) (string, error)
	}{
		{"admin", fleet.Superuser, func(q string) (s string, err error) { err = adminConn.QueryRow(ctx, q).Scan(&s); return }},
		{"as another role", role, func(q string) (s string, err error) { err = as.QueryRow(ctx, q).Scan(&s); return }},
	} {
		for setting, want := range map[string]string{
			"search_path": "pg_catalog, pg_temp", "default_transaction_read_only": "off", "statement_timeout": "0",
			"lock_timeout": "10s", "standard_conforming_strings": "on", "exit_on_error": "off", "jit": "off",
		} {
			got, err := c.run("SHOW " + setting)
			if err != nil || got != want {
				t.Errorf("%s: %s = %q (%v), want %q", c.who, setting, got, err, want)
			}
		}
		if got, err := c.run("SELECT current_user::text"); err != nil || got != c.user {
			t.Errorf("%s: current_user = %q (%v), want %s: ALTER DATABASE … SET role reached the session", c.who, got, err, c.user)
		}
	}
}

// TestInstallExtension_SessionsAtOnce: sessions that install extensions in
// one database at the same moment (two daemons' starts, a collector, a
// prewarm capture) all succeed: each run rewrites the schema's row, and the
// loser of that race ("tuple concurrently updated") runs again.
func TestInstallExtension_SessionsAtOnce(t *testing.T) {
	ctx := pgtest.Context(t)
	db := pg.NewDatabase(t)
	const sessions, runs = 4, 15
	conns := make([]*pgx.Conn, sessions)
	for i := range conns {
		conns[i] = pg.Conn(t, db)
	}
	start := make(chan struct{})
	errs := make(chan error, sessions*runs)
	var wg sync.WaitGroup
	for i, conn := range conns {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			for j := range runs {
				errs <- cluster.InstallExtension(ctx, conn, []string{"pg_buffercache", "pg_prewarm"}[(i+j)%2], db)
			}
		}()
	}
	close(start)
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Fatal(err)
		}
	}
	var n int
	if err := conns[0].QueryRow(ctx, `SELECT count(*) FROM pg_extension e JOIN pg_namespace n ON n.oid = e.extnamespace
		WHERE n.nspname = $1 AND e.extname IN ('pg_buffercache', 'pg_prewarm')`, cluster.ExtensionSchemaName).Scan(&n); err != nil || n != 2 {
		t.Errorf("extensions in %s: %d, %v; want both", cluster.ExtensionSchemaName, n, err)
	}
}

// TestExtensionError: a concurrent CREATE EXTENSION is no error, and the
// contrib package is suggested only when the server lacks the extension.
func TestExtensionError(t *testing.T) {
	for _, tc := range []struct {
		code, want string
	}{
		{"23505", ""},
		{"42710", ""},
		{"58P01", "install the PostgreSQL contrib package"},
		{"42501", "permission denied"},
	} {
		err := cluster.ExtensionError("pg_prewarm", "local", &pgconn.PgError{Code: tc.code, Message: "permission denied"})
		switch {
		case tc.want == "" && err != nil:
			t.Errorf("%s: %v, want no error", tc.code, err)
		case tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want)):
			t.Errorf("%s: %v, want an error containing %q", tc.code, err, tc.want)
		case tc.code == "42501" && strings.Contains(err.Error(), "contrib"):
			t.Errorf("%s: %v suggests the contrib package", tc.code, err)
		}
	}
}
