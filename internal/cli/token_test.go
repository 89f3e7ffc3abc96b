package cli

import (
	"encoding/json"
	"regexp"
	"strconv"
	"strings"
	"testing"

	"github.com/pgtenant/pgtenant/internal/api"
)

// TestCLI_TokenAndAudit: `token create` prints the token once; a read-only
// token reads but its write is refused naming the scope; `token revoke`
// refuses it at once; `audit list` shows who did what, with what result.
func TestCLI_TokenAndAudit(t *testing.T) {
	e := startCLI(t)
	out, err := e.run(t, "token", "create", "--scope", "read-only", "--name", "ci'; DROP TABLE api_tokens; --", "--expires", "30d")
	if err != nil {
		t.Fatalf("token create: %v\n%s", err, out)
	}
	m := regexp.MustCompile(`(?m)^token: (pgt_[0-9a-f]+)$`).FindStringSubmatch(out)
	if m == nil || !strings.Contains(out, "shown this once") {
		t.Fatalf("token create printed:\n%s\nwant the token, once, and that it is not kept", out)
	}
	if _, err := e.run(t, "token", "create", "--scope", "root"); err == nil || !strings.Contains(err.Error(), "read-only, tenants, templates, clusters, admin") {
		t.Errorf("token create --scope root: %v, want the scopes named", err)
	}

	t.Setenv("PGTENANT_TOKEN", m[1])
	if out, err := e.run(t, "tenant", "list"); err != nil {
		t.Errorf("tenant list with a read-only token: %v\n%s", err, out)
	}
	_, err = e.run(t, "cluster", "drain", "local")
	if err == nil || !strings.Contains(err.Error(), "needs scope clusters") {
		t.Errorf("cluster drain with a read-only token: %v, want 403 naming the clusters scope", err)
	}

	t.Setenv("PGTENANT_TOKEN", "") // the admin token, from the data dir
	out, err = e.run(t, "-o", "json", "token", "list")
	if err != nil {
		t.Fatal(err)
	}
	var ts []api.Token
	if err := json.Unmarshal([]byte(out), &ts); err != nil || len(ts) != 1 {
		t.Fatalf("token list -o json: %v\n%s", err, out)
	}
	if got, want := ts[0].Name, "ci'; DROP TABLE api_tokens; --"; got != want {
		t.Errorf("name = %q, want %q", got, want)
	}
	if out, err := e.run(t, "token", "revoke", strconv.FormatInt(ts[0].ID, 10)); err != nil || !strings.Contains(out, "revoked") {
		t.Errorf("token revoke: %v\n%s", err, out)
	}
	t.Setenv("PGTENANT_TOKEN", m[1])
	if _, err := e.run(t, "tenant", "list"); err == nil || !strings.Contains(err.Error(), "revoked") {
		t.Errorf("tenant list with a revoked token: %v, want 401 saying it is revoked", err)
	}

	t.Setenv("PGTENANT_TOKEN", "")
	out, err = e.run(t, "audit", "list", "--since", "1h")
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"POST /v1/clusters/{name}/drain", "name=local", "403", "admin token", "DELETE /v1/tokens/{id}", "POST /v1/tokens"} {
		if !strings.Contains(out, want) {
			t.Errorf("audit list:\n%s\nlacks %q", out, want)
		}
	}
}
