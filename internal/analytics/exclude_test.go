package analytics_test

import (
	"context"
	"errors"
	"slices"
	"strings"
	"testing"

	"github.com/pgtenant/pgtenant/internal/api"
	"github.com/pgtenant/pgtenant/internal/daemon/daemontest"
	"github.com/pgtenant/pgtenant/internal/provision"
)

// TestMirror_ExcludeTables: --exclude-tables mirrors every table the tenant
// has but those (a table without a primary key left out is no refusal);
// a name it has not got, or both --tables and --exclude-tables, is refused
// naming why, and leaves no mirror.
func TestMirror_ExcludeTables(t *testing.T) {
	ctx := context.Background()
	d, c := daemontest.Start(t, pg, testConfig(t))
	template(t, c)
	r, err := c.CreateTenant(ctx, provision.Request{Template: "an", Mode: "database"})
	if err != nil {
		t.Fatal(err)
	}
	id, dsn := r.Tenant.ID, r.DSN
	exec(t, dsn, `INSERT INTO items SELECT i, i % 7, 'n' || i, timestamp '2024-01-01' + i * interval '1 minute', i / 3.0, NULL FROM generate_series(1, 200) i`,
		`CREATE TABLE nokey (a int, b text)`, `INSERT INTO nokey VALUES (1, 'x')`)
	for _, bad := range []struct {
		req  api.EnableAnalyticsRequest
		says string
	}{
		{api.EnableAnalyticsRequest{ExcludeTables: []string{"nosuch"}}, "no table nosuch"},
		{api.EnableAnalyticsRequest{Tables: []string{"items"}, ExcludeTables: []string{"nokey"}}, "one or the other"},
		{api.EnableAnalyticsRequest{ExcludeTables: []string{"x; drop table items"}}, "want name or schema.name"},
	} {
		if _, err := c.EnableAnalyticsRequest(ctx, id, bad.req); !errors.Is(err, api.ErrInvalid) || !strings.Contains(err.Error(), bad.says) {
			t.Errorf("enable %+v: err = %v, want invalid saying %q", bad.req, err, bad.says)
		}
	}
	if st, err := c.AnalyticsStatus(ctx, id); err != nil || st.Enabled {
		t.Fatalf("a refused enable left a mirror: %+v %v", st, err)
	}
	st, err := c.EnableAnalyticsRequest(ctx, id, api.EnableAnalyticsRequest{ExcludeTables: []string{"nokey"}})
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Contains(st.Tables, "items") || slices.Contains(st.Tables, "nokey") {
		t.Errorf("mirror tables = %v, want items and not nokey", st.Tables)
	}
	waitSame(t, d, dsn, id, "items", itemCols)
}
