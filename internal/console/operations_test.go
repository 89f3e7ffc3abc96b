package console

import (
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/pgtenant/pgtenant/internal/api"
	"github.com/pgtenant/pgtenant/internal/backup"
	"github.com/pgtenant/pgtenant/internal/catalog"
	"github.com/pgtenant/pgtenant/internal/doctor"
	"github.com/pgtenant/pgtenant/internal/jobs"
	"github.com/pgtenant/pgtenant/internal/migrate"
	"github.com/pgtenant/pgtenant/internal/reconcile"
)

// render executes one page's template with the layout's fields and
// returns it, failing the test on a template error.
func render(t *testing.T, name string, v view) string {
	t.Helper()
	v["LoggedIn"], v["CSRF"], v["Who"] = true, "tok", api.Principal{Actor: "admin token", Scope: api.ScopeAdmin}
	var b strings.Builder
	if err := pages.ExecuteTemplate(&b, name, v); err != nil {
		t.Fatalf("%s: %v", name, err)
	}
	return b.String()
}

func contains(t *testing.T, page, name string, want ...string) {
	t.Helper()
	for _, w := range want {
		if !strings.Contains(page, w) {
			t.Errorf("%s lacks %q:\n%s", name, w, page)
		}
	}
}

// TestPages_RenderOperations renders the pages of the operator's actions
// with representative data: a template error is a test failure, names
// are escaped, and each page shows what it is for (the live and browser
// tests render them from a real daemon).
func TestPages_RenderOperations(t *testing.T) {
	now := time.Now()
	name := "<b>Acme</b>"
	created := api.CreateTenantResponse{Tenant: api.Tenant{Tenant: catalog.Tenant{ID: "t_abc", Name: name, State: catalog.StateActive}},
		DSN: "postgres://t_abc:s3cret@db:6432/t_abc", DirectDSN: "postgres://t_abc:s3cret@db:5432/t_abc", Password: "s3cret"}
	page := render(t, "created.html", view{"Created": created, "PageTitle": "Tenant created"})
	contains(t, page, "created.html", `<pre id="dsn-uri">postgres://t_abc:s3cret@db:6432/t_abc</pre>`, `data-copy="dsn-uri"`,
		`<pre id="dsn-psql">psql 'postgres://t_abc:s3cret@db:6432/t_abc'</pre>`, "DATABASE_URL=", "DIRECT_URL=", `id="dsn-direct"`,
		"Shown once", "&lt;b&gt;Acme&lt;/b&gt;", `<script src="/static/console.js" defer></script>`, "<title>Tenant created · pgtenant</title>")
	created.Password, created.Note = "", "the retry window has ended"
	contains(t, render(t, "created.html", view{"Created": created}), "created.html without a password", `id="no-password"`, "the retry window has ended")

	rows := []templateRow{{TemplateDetail: api.TemplateDetail{TemplateSummary: api.TemplateSummary{Name: "saas", CurrentVersion: 1, LatestVersion: 2, CreatedAt: now}},
		Latest: "building", Builds: map[string]int{"ready": 1, "building": 1}, TenantCount: 12, Rollout: "paused", RolloutID: 4}}
	contains(t, render(t, "templates.html", view{"Templates": rows}), "templates.html", `<a href="/templates/saas"><b>saas</b></a>`,
		`<span class="badge run">building</span>`, `<span class="badge ok">1 ready</span>`, `<a href="/rollouts/4">4</a> <span class="badge warn">paused</span>`)

	rep := doctor.Report{At: now, Status: doctor.Warn, Clusters: []doctor.ClusterReport{{Cluster: "local", Status: doctor.Warn,
		Checks: []doctor.Check{{Name: "wal_level", Status: doctor.Warn, Got: "replica", Want: "logical", Why: "analytics mirrors", Fix: "ALTER SYSTEM SET wal_level = logical"}}}}}
	contains(t, render(t, "doctor.html", view{"Report": rep}), "doctor.html", `id="doctor-status">warn`, `id="doctor-local"`,
		`<td class="check-warn">warn</td>`, "<code>ALTER SYSTEM SET wal_level = logical</code>")

	rc := reconcile.Report{At: now, Clusters: []string{"local"}, Checked: map[string]int{"databases": 3},
		Findings: []reconcile.Finding{{Cluster: "local", Kind: "orphan_database", Object: "database t_x", Tenant: "t_x", Action: "dropped"}}}
	page = render(t, "reconcile.html", view{"Report": rc, "CanFix": true})
	contains(t, page, "reconcile.html", `<span class="badge">3 databases</span>`, `<a href="/tenants/t_x">t_x</a>`, `id="action-fix" href="/reconcile/fix"`, "fix would")
	rc.Findings = nil
	contains(t, render(t, "reconcile.html", view{"Report": rc, "CanFix": true}), "clean reconcile.html", `id="clean"`)
	if strings.Contains(render(t, "reconcile.html", view{"Report": rc, "CanFix": true}), `id="action-fix"`) {
		t.Error("reconcile offers a fix with nothing to fix")
	}

	bs := []backup.ClusterBackups{{Cluster: "local", Info: backup.Info{Stanza: "local", Status: "ok",
		Backups: []backup.Backup{{Label: "20250101-000000F", Type: "full", Start: now, Stop: now, Size: 3 << 30, RepoSize: 1 << 30}},
		Window:  &backup.Window{Earliest: now.Add(-time.Hour), Latest: now}}}}
	contains(t, render(t, "backups.html", view{"Backups": bs, "CanBackup": true}), "backups.html", "20250101-000000F", "3.0 GiB", "1.0 GiB", `id="backup-now"`)
	contains(t, render(t, "backups.html", view{"Refused": "backups are not configured"}), "backups.html refused", `id="error">backups are not configured`)

	st := migrate.Status{Rollout: catalog.Rollout{ID: 9, Template: "saas", TargetVersion: 2, State: catalog.RolloutPaused, Canary: 1},
		Tenants:       []catalog.RolloutTenant{{Tenant: "t_a", State: catalog.RolloutTenantDone}, {Tenant: "t_b", State: catalog.RolloutTenantPending}},
		CanaryTenants: []catalog.RolloutTenant{{Tenant: "t_a", State: catalog.RolloutTenantDone}}}
	page = render(t, "rollout.html", view{"Rollout": st, "Canary": map[string]bool{"t_a": true}})
	contains(t, page, "rollout.html", `id="canary-tenants"`, `<code>t_a</code></a> <span class="badge warn">canary</span>`)
	if strings.Count(page, "canary</span>") != 1 {
		t.Errorf("rollout page marks %d tenants as the canary, want 1", strings.Count(page, "canary</span>"))
	}

	page = render(t, "jobs.html", view{"Jobs": []jobs.Job{{ID: 3, Type: jobs.TenantMove, State: jobs.Failed, CreatedAt: now}}, "Filters": url.Values{"state": {"failed"}},
		"Types": jobs.Types, "HiddenBuilds": 5, "ShowBuilds": "/jobs?builds=1&state=failed", "Next": "/jobs?page=1&state=failed", "States": []jobs.State{jobs.Failed}})
	contains(t, page, "jobs.html", `id="hidden-builds">5 background builds`, `<option selected>failed</option>`, `href="/jobs?page=1&amp;state=failed" id="next"`,
		`<span class="badge bad job-failed">failed</span>`)

	contains(t, render(t, "templates.html", view{"Path": "/templates"}), "the layout", `<span class="active"><a href="/templates">Templates</a></span>`, `<a href="/jobs">Jobs</a>`)
}

// TestFitWindow: a tenant's charts default to the shortest window that
// holds its whole life.
func TestFitWindow(t *testing.T) {
	for _, tc := range []struct {
		age  time.Duration
		want string
	}{{time.Minute, "1h"}, {time.Hour, "1h"}, {2 * time.Hour, "6h"}, {23 * time.Hour, "24h"}, {30 * 24 * time.Hour, "7d"}} {
		if got := fitWindow(tc.age); got != tc.want {
			t.Errorf("fitWindow(%s) = %s, want %s", tc.age, got, tc.want)
		}
	}
}

// TestStatic_Script: the copy buttons' script is served, as a file the
// CSP allows (no inline script anywhere).
func TestStatic_Script(t *testing.T) {
	c := &Console{}
	for path, want := range map[string]string{"/static/console.js": "data-copy", "/static/console.css": "--ok"} {
		w := httptest.NewRecorder()
		c.ServeHTTP(w, httptest.NewRequest(http.MethodGet, path, nil))
		if w.Code != 200 || !strings.Contains(w.Body.String(), want) {
			t.Errorf("GET %s: %d, lacks %q", path, w.Code, want)
		}
	}
}

// TestBadgeClass: a state's word has one colour on every page.
func TestBadgeClass(t *testing.T) {
	for state, want := range map[any]string{catalog.StateActive: "ok", jobs.Succeeded: "ok", catalog.StateSuspended: "warn",
		catalog.RolloutPaused: "warn", "grace": "warn", jobs.Failed: "bad", catalog.StateDropped: "bad", "down": "bad",
		jobs.Running: "run", catalog.BuildBuilding: "run", jobs.Cancelled: "idle", "": "idle"} {
		if got := badgeClass(state); got != want {
			t.Errorf("badgeClass(%q) = %s, want %s", state, got, want)
		}
	}
}
