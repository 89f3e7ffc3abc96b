package console

import (
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/pgtenant/pgtenant/internal/catalog"
	"github.com/pgtenant/pgtenant/internal/cluster"
)

// TestPages_Render renders both pages with representative data, so a
// template error is a test failure, not a blank page in production.
func TestPages_Render(t *testing.T) {
	var b strings.Builder
	if err := pages.ExecuteTemplate(&b, "login.html", map[string]any{"Failed": true}); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(b.String(), "not right") {
		t.Errorf("login page does not say the token was wrong")
	}
	b.Reset()
	data := map[string]any{
		"Now": time.Now(),
		"Clusters": []clusterRow{{Name: "local", Kind: "managed", Status: "up", Health: cluster.Health{ServerVersion: "15.18",
			WALBytesPerSec: 2048, Standbys: []cluster.StandbyState{{Name: "local/standby1", State: "streaming", ReplayLagBytes: 3 << 20}}}}},
		"Templates": []catalog.Template{{Name: "saas", CurrentVersion: 2, CreatedAt: time.Now()}},
		"Tenants":   []catalog.Tenant{{ID: "abcdefghijkl", Name: "<script>alert(1)</script>", Mode: "schema", Template: "saas", Version: 2}},
		"Jobs":      nil,
	}
	if err := pages.ExecuteTemplate(&b, "overview.html", data); err != nil {
		t.Fatal(err)
	}
	out := b.String()
	for _, want := range []string{"local/standby1", "3.0 MB", "2.0 kB/s", "saas v2", "&lt;script&gt;"} {
		if !strings.Contains(out, want) {
			t.Errorf("overview lacks %q", want)
		}
	}
	if strings.Contains(out, "<script>alert") {
		t.Error("a tenant's display name reached the page unescaped")
	}
}

// inlineRE finds what the Content-Security-Policy blocks in a page: inline
// styles and scripts, javascript: URLs and event handler attributes.
var inlineRE = regexp.MustCompile(`(?i)<style|\sstyle=|<script|javascript:|\son[a-z]+=`)

// TestPages_NoInlineStyleOrScript: the CSP allows no inline style or
// script, so a page with one would render broken.
func TestPages_NoInlineStyleOrScript(t *testing.T) {
	entries, err := files.ReadDir("templates")
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range entries {
		b, err := files.ReadFile("templates/" + e.Name())
		if err != nil {
			t.Fatal(err)
		}
		if m := inlineRE.Find(b); m != nil {
			t.Errorf("%s has %q, which the CSP blocks; put styles in static/console.css", e.Name(), m)
		}
	}
}
