package analytics_test

import (
	"context"
	"testing"

	"github.com/pgtenant/pgtenant/internal/daemon/daemontest"
	"github.com/pgtenant/pgtenant/internal/provision"
)

// TestMirror_ExtensionTypedColumns: columns of types an extension the
// tier allows makes (hstore, citext) reach the mirror as their text, the
// copy and the changes after it.
func TestMirror_ExtensionTypedColumns(t *testing.T) {
	ctx := context.Background()
	cfg := testConfig(t)
	tier := cfg.Tiers["default"]
	tier.Extensions = []string{"hstore", "citext"}
	cfg.Tiers["default"] = tier
	d, c := daemontest.Start(t, pg, cfg)
	template(t, c)
	r, err := c.CreateTenant(ctx, provision.Request{Template: "an", Mode: "database"})
	if err != nil {
		t.Fatal(err)
	}
	id, dsn := r.Tenant.ID, r.DSN
	exec(t, dsn, `CREATE EXTENSION hstore`, `CREATE EXTENSION citext`,
		`CREATE TABLE attrs (id int PRIMARY KEY, a hstore, e citext)`,
		`INSERT INTO attrs SELECT i, hstore('k' || i, 'v' || i), 'Mail' || i || '@Example.com' FROM generate_series(1, 100) i`)
	if _, err := c.EnableAnalytics(ctx, id, nil); err != nil {
		t.Fatal(err)
	}
	waitSame(t, d, dsn, id, "attrs", "id, a, e")
	exec(t, dsn, `UPDATE attrs SET a = a || hstore('x', 'y'), e = upper(e::text) WHERE id % 3 = 0`, `DELETE FROM attrs WHERE id > 90`)
	waitSame(t, d, dsn, id, "attrs", "id, a, e")
}
