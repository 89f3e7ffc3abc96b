package daemon_test

import (
	"context"
	"errors"
	"log/slog"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/pgtenant/pgtenant/internal/api"
	"github.com/pgtenant/pgtenant/internal/catalog"
	"github.com/pgtenant/pgtenant/internal/daemon"
	"github.com/pgtenant/pgtenant/internal/daemon/daemontest"
	"github.com/pgtenant/pgtenant/internal/pgtest"
	"github.com/pgtenant/pgtenant/internal/provision"
)

// TestOutage_CatalogDown: with its catalog down, the daemon answers every
// route 503 unavailable with what does not answer and why (never the
// driver's text), /healthz says the catalog is down, its workers log the
// outage once (not once per poll) and once more when it is over.
func TestOutage_CatalogDown(t *testing.T) {
	ctx := pgtest.Context(t)
	cat, err := pgtest.Start(ctx, pgtest.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(cat.Close)
	cfg := daemontest.Config(t, pg)
	cfg.Catalog.DSN = cat.PrimaryDSN("pgtenant_outage")
	logs := &pgtest.LogBuffer{}
	dctx, cancel := context.WithCancel(context.Background())
	d, err := daemon.New(dctx, daemon.Options{Config: cfg, Logger: slog.New(slog.NewTextHandler(logs, nil)),
		Managed: []catalog.Cluster{{Name: "local", DSN: pg.PrimaryDSN("postgres")}}})
	if err != nil {
		cancel()
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("the daemon's log:\n%s", logs.String())
		}
	})
	done := make(chan error, 1)
	go func() { done <- d.Run(dctx) }()
	t.Cleanup(func() {
		cancel()
		<-done
	})
	c := api.NewClient(d.URL(), d.Token())
	if h, err := c.Health(ctx); err != nil || h.Status != "ok" || h.Clusters["local"] != "ok" {
		t.Fatalf("healthz before the outage: %+v, %v", h, err)
	}

	if err := cat.StopNode(ctx, "primary", "immediate"); err != nil {
		t.Fatal(err)
	}
	calls := map[string]func() error{
		"GET /v1/tenants":   func() error { _, err := c.Tenants(ctx, nil); return err },
		"POST /v1/tenants":  func() error { _, err := c.CreateTenant(ctx, provision.Request{Template: "saas"}); return err },
		"GET /v1/clusters":  func() error { _, err := c.Clusters(ctx); return err },
		"GET /v1/templates": func() error { _, err := c.Templates(ctx); return err },
		"GET /v1/jobs":      func() error { _, err := c.Jobs(ctx, nil); return err },
	}
	for route, call := range calls {
		err := call()
		var apiErr *api.Error
		if !errors.As(err, &apiErr) || apiErr.Status != http.StatusServiceUnavailable || apiErr.Code != "unavailable" {
			t.Errorf("%s with the catalog down: %v, want 503 unavailable", route, err)
			continue
		}
		if !strings.Contains(apiErr.Message, "does not answer") || strings.Contains(apiErr.Message, "failed to connect") ||
			strings.Contains(apiErr.Message, "dial") {
			t.Errorf("%s: message %q, want what does not answer without the driver's text", route, apiErr.Message)
		}
	}
	h, err := c.Health(ctx)
	var apiErr *api.Error
	if !errors.As(err, &apiErr) || apiErr.Status != http.StatusServiceUnavailable {
		t.Errorf("healthz with the catalog down: %+v, %v; want 503", h, err)
	}

	// The workers poll on: no further line after several polls. Count from
	// the outage's first failure logged after the last success: a claim that
	// ran on a backend the immediate shutdown had not killed yet is a
	// success, and the outage after it is logged afresh.
	failing := func() int { return logs.Count("claim jobs failed") }
	for deadline := time.Now().Add(30 * time.Second); failing() <= logs.Count("claim jobs works again"); {
		if time.Now().After(deadline) {
			t.Fatal("no log line about failing claims during the outage")
		}
		time.Sleep(100 * time.Millisecond)
	}
	before := failing()
	time.Sleep(5 * time.Second)
	if n := failing() - before; n != 0 {
		t.Errorf("%d more log lines about failing claims after 5 s of outage, want none", n)
	}
	if err := cat.StartNode(ctx, "primary"); err != nil {
		t.Fatal(err)
	}
	for deadline := time.Now().Add(time.Minute); logs.Count("claim jobs works again") == 0; {
		if time.Now().After(deadline) {
			t.Fatal("no log line when the catalog answered again")
		}
		time.Sleep(100 * time.Millisecond)
	}
	if h, err := c.Health(ctx); err != nil || h.Status != "ok" {
		t.Errorf("healthz after the outage: %+v, %v", h, err)
	}
}
