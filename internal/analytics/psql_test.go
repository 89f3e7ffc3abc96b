package analytics_test

import (
	"net/url"
	osexec "os/exec"
	"strings"
	"testing"

	"github.com/pgtenant/pgtenant/internal/daemon/daemontest"
	"github.com/pgtenant/pgtenant/internal/pgtest"
	"github.com/pgtenant/pgtenant/internal/tenant"
)

// TestWire_PsqlLists: psql's \dt, \d and \dn list the mirror's tables and
// schemas on the analytics port, owned by the tenant, without the
// mirror's own state schema; \d TABLE describes a table's columns, and
// \l the session's one database.
func TestWire_PsqlLists(t *testing.T) {
	psql, err := osexec.LookPath("psql")
	if err != nil {
		t.Skip("no psql")
	}
	ctx := pgtest.Context(t)
	_, c := daemontest.Start(t, pg, testConfig(t))
	template(t, c)
	for _, mode := range []string{"schema", "database"} {
		m := mirroredTenant(t, c, mode)
		u, err := url.Parse(m.dsn)
		if err != nil {
			t.Fatal(err)
		}
		u.User = url.UserPassword(u.User.Username(), m.r.Password)
		role := tenant.PhysicalName(m.r.Tenant.ID)
		for cmd, want := range map[string][]string{
			`\l`:       {"List of databases", "UTF8", role},
			`\dt`:      {"List of relations", "items", "table", role},
			`\d`:       {"List of relations", "items", role},
			`\dn`:      {"List of schemas", role},
			`\d items`: {`Table "`, `.items"`, "Column", "id", "bigint", "qty", "integer", "price", "decimal(10,2)"},
		} {
			out, err := osexec.CommandContext(ctx, psql, "-X", "-d", u.String(), "-c", cmd).CombinedOutput()
			if err != nil {
				t.Errorf("%s: psql %s: %v: %s", mode, cmd, err, out)
				continue
			}
			for _, w := range want {
				if !strings.Contains(string(out), w) {
					t.Errorf("%s: psql %s does not say %q:\n%s", mode, cmd, w, out)
				}
			}
			if strings.Contains(string(out), "_pgtenant_mirror") {
				t.Errorf("%s: psql %s lists the mirror's state schema:\n%s", mode, cmd, out)
			}
		}
	}
}
