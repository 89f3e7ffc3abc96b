package main

import (
	"context"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"

	examples "github.com/pgtenant/pgtenant/examples/templates"
	"github.com/pgtenant/pgtenant/internal/api"
	"github.com/pgtenant/pgtenant/internal/jobs"
	"github.com/pgtenant/pgtenant/internal/pgtest"
	"github.com/pgtenant/pgtenant/internal/provision"
)

// TestUp_RemembersItsClusters is issue 24's new user: a data dir made with
// `up --clusters 2`, a tenant of local2 fronted by local's pooler (as a move
// leaves it), then `up` again. Plain `up` starts both clusters; a smaller
// --clusters is refused, naming local2 and the flags; --allow-fewer starts
// local alone, whose front door serves and whose creates answer DSNs that
// work.
func TestUp_RemembersItsClusters(t *testing.T) {
	if testing.Short() {
		t.Skip("end-to-end")
	}
	ctx := pgtest.Context(t)
	dataDir := filepath.Join(pgtest.TempDir(t), "data")
	p := startUp(t, dataDir, "--patroni=false", "--clusters", "2", "--standbys", "0")
	c := api.NewClient(p.info.URL, p.info.Token)
	added, err := c.CreateTemplate(ctx, "saas", examples.Saas())
	if err != nil {
		p.stop(t)
		t.Fatal(err)
	}
	for _, j := range added.BuildJobs {
		if j, err := c.WaitJob(ctx, j.ID, nil); err != nil || j.State != jobs.Succeeded {
			p.stop(t)
			t.Fatalf("build %d: %v %s", j.ID, err, j.LastError)
		}
	}
	moved, err := c.CreateTenant(ctx, provision.Request{Template: "saas", Cluster: "local2"})
	if err != nil {
		p.stop(t)
		t.Fatal(err)
	}
	// The catalog, as local's superuser: the tenant's front door is local's pooler.
	password, err := os.ReadFile(filepath.Join(dataDir, "local", "superuser.password"))
	if err != nil {
		p.stop(t)
		t.Fatal(err)
	}
	u, _ := url.Parse(p.info.Clusters[0].Nodes[0].DSN)
	u.User, u.Path = url.UserPassword(u.User.Username(), strings.TrimSpace(string(password))), "/pgtenant"
	catalogConn, err := pgx.Connect(ctx, u.String())
	if err == nil {
		_, err = catalogConn.Exec(ctx, `UPDATE tenants SET front = 'local' WHERE id = $1`, moved.Tenant.ID)
		catalogConn.Close(ctx)
	}
	p.stop(t)
	if err != nil {
		t.Fatal(err)
	}

	out, err := exec.Command(binary, "up", "--data-dir", dataDir, "--listen", "127.0.0.1:0", "--clusters", "1").CombinedOutput()
	if err == nil || !strings.Contains(string(out), "--clusters 1 would leave local2 down") || !strings.Contains(string(out), "--allow-fewer") {
		t.Errorf("up --clusters 1 on a data dir of 2: err=%v out=%s; want a refusal naming local2 and --allow-fewer", err, out)
	}

	p = startUp(t, dataDir, "--standbys", "0")
	if len(p.info.Clusters) != 2 || !strings.Contains(p.stderr.String(), "this data dir has 2 clusters (local, local2): starting them all") {
		t.Errorf("plain up started %+v; want local and local2, with a line saying so\nstderr:\n%s", p.info.Clusters, p.stderr)
	}
	p.stop(t)

	p = startUp(t, dataDir, "--standbys", "0", "--clusters", "1", "--allow-fewer")
	defer p.stop(t)
	if len(p.info.Clusters) != 1 || !strings.Contains(p.stderr.String(), "leaving local2 down") {
		t.Errorf("up --clusters 1 --allow-fewer started %+v; want local alone, with a line naming local2\nstderr:\n%s", p.info.Clusters, p.stderr)
	}
	if strings.Contains(p.stderr.String(), "pooler of local:") {
		t.Errorf("local's pooler did not come up with local2 down:\n%s", p.stderr)
	}
	c = api.NewClient(p.info.URL, p.info.Token)
	r, err := c.CreateTenant(ctx, provision.Request{Template: "saas", Cluster: "local"})
	if err != nil {
		t.Fatalf("create on local with local2 down: %v", err)
	}
	if du, _ := url.Parse(r.DSN); du == nil || du.Host != p.info.Clusters[0].Pooler {
		t.Errorf("create answered DSN %q, want local's pooler %s", r.DSN, p.info.Clusters[0].Pooler)
	}
	conn, err := pgx.Connect(ctx, r.DSN)
	if err != nil {
		t.Fatalf("the created tenant's DSN does not work: %v", err)
	}
	conn.Close(context.Background())
}
