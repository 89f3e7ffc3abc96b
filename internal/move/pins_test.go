package move_test

import (
	"errors"
	"net/http"
	"slices"
	"strings"
	"testing"

	"github.com/pgtenant/pgtenant/internal/api"
	"github.com/pgtenant/pgtenant/internal/catalog"
	"github.com/pgtenant/pgtenant/internal/jobs"
	"github.com/pgtenant/pgtenant/internal/pgtest"
	"github.com/pgtenant/pgtenant/internal/provision"
)

// TestLabels_PinTenantsToClusters pins tenants to the clusters labelled
// region=eu (data residency): created pinned, they are placed on local2
// whichever cluster is emptier; a rebalance does not take them off it, an
// explicit move to local is refused naming the label; an unpinned tenant
// on local that is pinned later is moved online to local2; unpinned again,
// it stays. A label no cluster has, and a malformed one, are clear errors.
func TestLabels_PinTenantsToClusters(t *testing.T) {
	ctx := pgtest.Context(t)
	_, c := fleet(t)
	if _, err := c.SetCluster(ctx, "local2", catalog.PlacementChange{Labels: map[string]string{"region": "eu"}}); err != nil {
		t.Fatal(err)
	}
	eu := []string{"region=eu"}
	var pinned []string
	for range 3 {
		r, err := c.CreateTenant(ctx, provision.Request{Template: "saas", Mode: "database", Labels: eu})
		if err != nil {
			t.Fatal(err)
		}
		if r.Tenant.Cluster != "local2" || !slices.Equal(r.Tenant.Pins, eu) {
			t.Fatalf("a tenant created pinned to region=eu: on %s with labels %v, want local2 and region=eu", r.Tenant.Cluster, r.Tenant.Pins)
		}
		pinned = append(pinned, r.Tenant.ID)
	}
	var apiErr *api.Error
	if _, err := c.CreateTenant(ctx, provision.Request{Template: "saas", Labels: []string{"region=us"}}); err == nil ||
		!strings.Contains(err.Error(), "lacks label region=us that the tenant is pinned to") {
		t.Errorf("a label no cluster has: %v, want refused naming it", err)
	}
	if _, err := c.CreateTenant(ctx, provision.Request{Template: "saas", Labels: []string{"region'; DROP TABLE tenants; --"}}); !errors.As(err, &apiErr) ||
		apiErr.Status != http.StatusBadRequest {
		t.Errorf("a malformed label: %v, want 400", err)
	}

	// local has none of the three, local2 all: a rebalance would even
	// them out, but not with tenants pinned to local2.
	plan, err := c.Rebalance(ctx, api.RebalanceRequest{DryRun: true})
	if err != nil {
		t.Fatal(err)
	}
	if len(plan.Moves) != 0 {
		t.Errorf("rebalance plan %+v: moves pinned tenants off the only cluster with their label", plan.Moves)
	}
	if _, err := c.MoveTenant(ctx, pinned[0], "local"); !errors.As(err, &apiErr) || apiErr.Status != http.StatusConflict ||
		!strings.Contains(err.Error(), "pinned to clusters labelled region=eu") {
		t.Errorf("a pinned tenant moved to a cluster without its label: %v, want 409", err)
	}

	// Pinned later: moved online to a cluster with the label.
	r, err := c.CreateTenant(ctx, provision.Request{Template: "saas", Mode: "database", Cluster: "local"})
	if err != nil {
		t.Fatal(err)
	}
	id := r.Tenant.ID
	out, err := c.SetTenant(ctx, id, api.SetTenantRequest{Labels: &eu})
	if err != nil {
		t.Fatal(err)
	}
	if out.Job == nil || out.Job.Cluster != "local2" {
		t.Fatalf("pinning a tenant on local to region=eu: job %+v, want a move to local2", out.Job)
	}
	if j, err := c.WaitJob(ctx, out.Job.ID, nil); err != nil || j.State != jobs.Succeeded {
		t.Fatalf("the pin's move: %v %s", err, j.LastError)
	}
	v, err := c.Tenant(ctx, id)
	if err != nil {
		t.Fatal(err)
	}
	if v.Cluster != "local2" || !slices.Equal(v.Pins, eu) || !slices.ContainsFunc(v.Events, func(e catalog.Event) bool { return e.Kind == provision.EventLabelsChanged }) {
		t.Errorf("after the pin's move: on %s, labels %v, want local2, region=eu and a %s event", v.Cluster, v.Pins, provision.EventLabelsChanged)
	}
	if _, err := c.SetTenant(ctx, id, api.SetTenantRequest{Tier: "default", Labels: &eu}); !errors.As(err, &apiErr) || apiErr.Status != http.StatusBadRequest {
		t.Errorf("tier and labels at once: %v, want 400", err)
	}

	// Unpinned: no move, and it may go anywhere again.
	out, err = c.SetTenant(ctx, id, api.SetTenantRequest{Labels: &[]string{}})
	if err != nil {
		t.Fatal(err)
	}
	if out.Job != nil || out.Tenant.Cluster != "local2" || len(out.Tenant.Pins) != 0 {
		t.Errorf("unpinned: job %v on %s labels %v, want no move, local2, none", out.Job, out.Tenant.Cluster, out.Tenant.Pins)
	}
}
