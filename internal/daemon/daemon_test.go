package daemon_test

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"net/http/cookiejar"
	"net/url"
	"strings"
	"testing"

	"github.com/pgtenant/pgtenant/internal/api"
	"github.com/pgtenant/pgtenant/internal/catalog"
	"github.com/pgtenant/pgtenant/internal/daemon/daemontest"
	"github.com/pgtenant/pgtenant/internal/pgtest"
)

var pg *pgtest.Cluster

func TestMain(m *testing.M) { pgtest.Main(m, pgtest.Options{Standbys: 1}, &pg) }

func TestAPI_TokenRequired(t *testing.T) {
	d, _ := daemontest.Start(t, pg, daemontest.Config(t, pg))
	for _, token := range []string{"", "wrong", d.Token() + "x"} {
		c := api.NewClient(d.Addr(), token)
		_, err := c.Clusters(context.Background())
		var apiErr *api.Error
		if !errors.As(err, &apiErr) || apiErr.Status != http.StatusUnauthorized {
			t.Errorf("token %q: err = %v, want 401", token, err)
		}
	}
	// /healthz and /metrics need no token.
	c := api.NewClient(d.Addr(), "")
	h, err := c.Health(context.Background())
	if err != nil || h.Status != "ok" {
		t.Errorf("healthz = %+v, %v; want ok", h, err)
	}
	resp, err := http.Get("http://" + d.Addr() + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Errorf("/metrics status = %d, want 200", resp.StatusCode)
	}
}

func TestClusters_ListShowsStreamingStandby(t *testing.T) {
	_, c := daemontest.Start(t, pg, daemontest.Config(t, pg))
	ctx := context.Background()
	cs, err := c.Clusters(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if len(cs) != 1 || cs[0].Name != "local" || cs[0].Kind != "managed" || cs[0].Status != "up" {
		t.Fatalf("clusters = %+v, want local managed up", cs)
	}
	if len(cs[0].Standbys) != 1 || cs[0].Standbys[0].State != "streaming" {
		t.Errorf("standbys = %+v, want one streaming", cs[0].Standbys)
	}
	if strings.Contains(cs[0].DSN, pgPassword(t)) {
		t.Errorf("listed DSN %q shows the password", cs[0].DSN)
	}
	d, err := c.Cluster(ctx, "local")
	if err != nil {
		t.Fatal(err)
	}
	if d.Info == nil || d.Info.ServerVersion == "" || d.Info.Settings["max_locks_per_transaction"] == "" ||
		!d.Info.Extensions["pg_prewarm"].Available || d.Info.RelationFiles <= 0 {
		t.Errorf("show local = %+v, want version, settings, pg_prewarm and relation files", d.Info)
	}
	if _, err := c.Cluster(ctx, "nope"); !errors.Is(err, catalog.ErrNotFound) {
		t.Errorf("show nope: err = %v, want not found", err)
	}
}

func TestClusters_AddValidates(t *testing.T) {
	_, c := daemontest.Start(t, pg, daemontest.Config(t, pg))
	ctx := context.Background()
	for _, tc := range []struct {
		name, dsn, want string
	}{
		{"bad name", pg.PrimaryDSN("postgres"), "cluster name"},
		{"c2", "postgres://pgtenant:s3cretpw@127.0.0.1:1/postgres?connect_timeout=2", "cannot reach cluster c2"},
		{"c3", "not a dsn ://", "bad dsn"},
	} {
		_, err := c.AddCluster(ctx, api.AddClusterRequest{Name: tc.name, DSN: tc.dsn})
		var apiErr *api.Error
		if !errors.As(err, &apiErr) || apiErr.Status != http.StatusBadRequest || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("add %q: err = %v, want 400 containing %q", tc.name, err, tc.want)
		}
		if err != nil && strings.Contains(err.Error(), "s3cretpw") {
			t.Errorf("add %q: error shows the password: %v", tc.name, err)
		}
	}
	// A good external DSN registers; the listed DSN hides the password.
	got, err := c.AddCluster(ctx, api.AddClusterRequest{Name: "ext", DSN: pg.PrimaryDSN("postgres")})
	if err != nil {
		t.Fatal(err)
	}
	if got.Status != "up" || strings.Contains(got.DSN, pgPassword(t)) {
		t.Errorf("added = %+v, want up with redacted DSN", got)
	}
	// The managed cluster cannot be replaced.
	if _, err := c.AddCluster(ctx, api.AddClusterRequest{Name: "local", DSN: pg.PrimaryDSN("postgres")}); err == nil {
		t.Error("replacing the managed cluster succeeded, want an error")
	}
}

// TestConsole_AsksForTheToken: the console shows a login form, refuses a
// wrong token, and shows the fleet with the right one.
func TestConsole_AsksForTheToken(t *testing.T) {
	d, _ := daemontest.Start(t, pg, daemontest.Config(t, pg))
	jar, err := cookiejar.New(nil)
	if err != nil {
		t.Fatal(err)
	}
	hc := &http.Client{Jar: jar}
	base := "http://" + d.Addr()
	get := func() string {
		resp, err := hc.Get(base + "/")
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return string(b)
	}
	if page := get(); !strings.Contains(page, `name="token"`) {
		t.Fatalf("console without a token does not ask for one:\n%s", page)
	}
	if _, err := hc.PostForm(base+"/login", url.Values{"token": {"wrong"}}); err != nil {
		t.Fatal(err)
	}
	if page := get(); strings.Contains(page, "Clusters") {
		t.Error("a wrong token opened the console")
	}
	if _, err := hc.PostForm(base+"/login", url.Values{"token": {d.Token()}}); err != nil {
		t.Fatal(err)
	}
	if page := get(); !strings.Contains(page, "Clusters") || !strings.Contains(page, "local") {
		t.Errorf("console with the token does not show the fleet:\n%s", page)
	}
}

// TestAPI_TrailingDataRefused: a JSON body followed by anything but
// whitespace is a 400 "invalid", and nothing is registered.
func TestAPI_TrailingDataRefused(t *testing.T) {
	d, c := daemontest.Start(t, pg, daemontest.Config(t, pg))
	body := `{"name":"ext","dsn":"` + pg.PrimaryDSN("postgres") + `"} garbage`
	req, err := http.NewRequest(http.MethodPost, "http://"+d.Addr()+"/v1/clusters", strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Authorization", "Bearer "+d.Token())
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var eb api.ErrorBody
	if err := json.NewDecoder(resp.Body).Decode(&eb); err != nil {
		t.Fatal(err)
	}
	if resp.StatusCode != http.StatusBadRequest || eb.Error.Code != "invalid" || !strings.Contains(eb.Error.Message, "after the JSON object") {
		t.Errorf("trailing garbage: %d %+v, want 400 invalid naming the trailing data", resp.StatusCode, eb.Error)
	}
	if _, err := c.Cluster(context.Background(), "ext"); !errors.Is(err, catalog.ErrNotFound) {
		t.Errorf("cluster ext after a refused body: err = %v, want not found", err)
	}
}

// TestHTTP_SecurityHeaders: console pages, the stylesheet, the API and
// /healthz all carry the CSP (with frame-ancestors 'none'), no framing, no
// sniffing and no caching of pages with data.
func TestHTTP_SecurityHeaders(t *testing.T) {
	d, _ := daemontest.Start(t, pg, daemontest.Config(t, pg))
	base := "http://" + d.Addr()
	for _, tc := range []struct {
		path, cache, referrer string
	}{
		{"/", "no-store", "same-origin"},
		{"/static/console.css", "max-age=3600", "no-referrer"},
		{"/v1/clusters", "no-store", "no-referrer"},
		{"/healthz", "no-store", "no-referrer"},
		{"/metrics", "no-store", "no-referrer"},
	} {
		req, err := http.NewRequest(http.MethodGet, base+tc.path, nil)
		if err != nil {
			t.Fatal(err)
		}
		req.Header.Set("Authorization", "Bearer "+d.Token())
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			t.Errorf("GET %s: status %d, want 200", tc.path, resp.StatusCode)
		}
		h := resp.Header
		for name, want := range map[string]string{
			"Content-Security-Policy": api.ContentSecurityPolicy,
			"X-Frame-Options":         "DENY",
			"X-Content-Type-Options":  "nosniff",
			"Referrer-Policy":         tc.referrer,
			"Cache-Control":           tc.cache,
		} {
			if got := h.Get(name); got != want {
				t.Errorf("GET %s: %s = %q, want %q", tc.path, name, got, want)
			}
		}
		if csp := h.Get("Content-Security-Policy"); !strings.Contains(csp, "frame-ancestors 'none'") || strings.Contains(csp, "unsafe-inline") {
			t.Errorf("GET %s: CSP %q, want frame-ancestors 'none' and no unsafe-inline", tc.path, csp)
		}
	}
}
