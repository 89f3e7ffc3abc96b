package cli

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"github.com/pgtenant/pgtenant/internal/fleet"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"github.com/pgtenant/pgtenant/internal/api"
	"github.com/pgtenant/pgtenant/internal/daemon"
	"github.com/pgtenant/pgtenant/internal/daemon/daemontest"
	"github.com/pgtenant/pgtenant/internal/pgtest"
)

var pg *pgtest.Cluster

func TestMain(m *testing.M) { pgtest.Main(m, pgtest.Options{}, &pg) }

// cliEnv is a daemon and the data dir whose token the CLI reads.
type cliEnv struct {
	d       *daemon.Daemon
	dataDir string
}

func startCLI(t *testing.T) cliEnv {
	t.Helper()
	cfg := daemontest.Config(t, pg)
	cfg.Provision.DefaultPoolSize = 0
	d, _ := daemontest.Start(t, pg, cfg)
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "token"), []byte(d.Token()), 0o600); err != nil {
		t.Fatal(err)
	}
	t.Setenv("PGTENANT_TOKEN", "")
	return cliEnv{d: d, dataDir: dir}
}

// run runs the command line against the daemon, with no terminal to
// confirm on; stdout and stderr go to one buffer, in the order they are
// written.
func (e cliEnv) run(t *testing.T, args ...string) (string, error) {
	t.Helper()
	return e.runOn(t, nil, args...)
}

// runOn runs the command line with terminal as the terminal on stdin
// (what the operator types there).
func (e cliEnv) runOn(t *testing.T, terminal io.Reader, args ...string) (string, error) {
	t.Helper()
	var out bytes.Buffer
	all := append([]string{"--server", e.d.URL(), "--data-dir", e.dataDir}, args...)
	err := run(pgtest.Context(t), all, &globals{stdout: &out, stderr: &out, terminal: terminal})
	return out.String(), err
}

// TestFlags_HelpNamesAreWords: every flag's help shows a one-word value
// name (pflag takes the first `quoted` word of the usage as the name: a
// quoted phrase garbles the help).
func TestFlags_HelpNamesAreWords(t *testing.T) {
	word := regexp.MustCompile(`^[A-Za-z0-9_.|-]*$`)
	var walk func(c *cobra.Command)
	walk = func(c *cobra.Command) {
		check := func(f *pflag.Flag) {
			if name, _ := pflag.UnquoteUsage(f); !word.MatchString(name) {
				t.Errorf("%s --%s: help shows the value name %q, want one word", c.CommandPath(), f.Name, name)
			}
		}
		c.LocalFlags().VisitAll(check)
		for _, sub := range c.Commands() {
			walk(sub)
		}
	}
	root := newRoot(&bytes.Buffer{}, &bytes.Buffer{})
	walk(root)
	var help bytes.Buffer
	root.SetOut(&help)
	root.SetArgs([]string{"--help"})
	if err := root.Execute(); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(help.String(), "--data-dir DIR ") {
		t.Errorf("root help does not show --data-dir DIR:\n%s", help.String())
	}
}

// TestMakeRun_TakesArgs: `make run ARGS="…"` hands its flags to `up`.
func TestMakeRun_TakesArgs(t *testing.T) {
	if _, err := exec.LookPath("make"); err != nil {
		t.Skip("make not installed")
	}
	out, err := exec.Command("make", "-n", "-C", "../..", "run", "ARGS=--listen 127.0.0.1:9090 --data-dir /tmp/fleet").CombinedOutput()
	if err != nil {
		t.Fatalf("make -n run: %v\n%s", err, out)
	}
	if want := "bin/pgtenant up --listen 127.0.0.1:9090 --data-dir /tmp/fleet"; !strings.Contains(string(out), want) {
		t.Errorf("make -n run prints\n%s\nwant a line running %q", out, want)
	}
}

// TestCLI_FiltersValidated: a filter with a value that cannot match is an
// error naming the valid values (the command exits non-zero), and a job
// target as job lists print it (KIND:ID) finds its jobs.
func TestCLI_FiltersValidated(t *testing.T) {
	e := startCLI(t)
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"tenant", "list", "--state", "bogus"}, "provisioning, active, suspended, dropped, purging, purged, failed"},
		{[]string{"tenant", "list", "--mode", "bogus"}, "one of database, schema"},
		{[]string{"job", "list", "--state", "bogus"}, "queued, running, waiting, paused, succeeded, failed, cancelled, active"},
		{[]string{"job", "list", "--type", "tenant.bogus"}, "tenant.build, tenant.purge, tenant.move"},
	} {
		out, err := e.run(t, c.args...)
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%v: %v (printed %q), want an error naming %s", c.args, err, out, c.want)
		}
	}
	// The daemon checks them too, for every client.
	c := api.NewClient(e.d.URL(), e.d.Token())
	if _, err := c.Tenants(pgtest.Context(t), url.Values{"state": {"bogus"}}); !errors.Is(err, api.ErrInvalid) || !strings.Contains(err.Error(), "purged") {
		t.Errorf("GET /v1/tenants?state=bogus: %v, want invalid naming the states", err)
	}
	if _, err := c.Jobs(pgtest.Context(t), url.Values{"state": {"bogus"}}); !errors.Is(err, api.ErrInvalid) || !strings.Contains(err.Error(), "cancelled") {
		t.Errorf("GET /v1/jobs?state=bogus: %v, want invalid naming the states", err)
	}
	if _, err := c.Jobs(pgtest.Context(t), url.Values{"type": {"bogus"}}); !errors.Is(err, api.ErrInvalid) || !strings.Contains(err.Error(), "cluster.prewarm") {
		t.Errorf("GET /v1/jobs?type=bogus: %v, want invalid naming the types", err)
	}
	if _, err := e.run(t, "template", "create", "saas", "--from", "../../examples/templates/saas", "--wait"); err != nil {
		t.Fatal(err)
	}
	out, err := e.run(t, "job", "list", "--target", "template:saas")
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(out, "template.build") {
		t.Errorf("job list --target template:saas:\n%s\nwant the template's build job", out)
	}

	// The daemon's answers set the exit status, and -o json prints its
	// error body: an unknown tenant, an external id asked with other
	// parameters.
	if _, err := e.run(t, "tenant", "create", "--template", "saas", "--external-id", "cust-1"); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		args   []string
		status int
		code   string
		want   string
	}{
		{[]string{"tenant", "show", "nosuchtenant"}, ExitNotFound, "not_found", "nosuchtenant"},
		{[]string{"tenant", "create", "--template", "saas", "--external-id", "cust-1", "--mode", "schema"}, ExitConflict, "conflict",
			`mode "database" (this request: "schema")`},
		{[]string{"tenant", "create", "--template", "saas", "--tier", "nosuchtier"}, ExitUsage, "invalid", "nosuchtier"},
	} {
		out, err := e.run(t, append([]string{"-o", "json"}, c.args...)...)
		var body api.ErrorBody
		if jerr := json.Unmarshal([]byte(out), &body); jerr != nil || body.Error.Code != c.code || !strings.Contains(body.Error.Message, c.want) ||
			ExitCode(err) != c.status || !Printed(err) {
			t.Errorf("%v -o json: status %d, printed\n%s\nwant status %d and an error body with code %s naming %s", c.args, ExitCode(err), out, c.status, c.code, c.want)
		}
	}
}

// TestCLI_ErrorsAsJSON: with -o json a failure prints the API's error body
// on stdout, whatever failed (the command line, the daemon's answer, no
// daemon at all), and the exit status says which; without -o json nothing
// is printed on stdout (main prints the error on stderr).
func TestCLI_ErrorsAsJSON(t *testing.T) {
	answer := map[string]int{"/v1/tenants/gone": http.StatusNotFound, "/v1/tenants/busy/suspend": http.StatusConflict,
		"/v1/tenants/slow": http.StatusGatewayTimeout, "/v1/tenants/broken": http.StatusInternalServerError}
	fake := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		status, ok := answer[r.URL.Path]
		if !ok {
			status = http.StatusNotFound
		}
		w.WriteHeader(status)
		json.NewEncoder(w).Encode(api.ErrorBody{Error: api.ErrorDetail{Code: "code" + strconv.Itoa(status), Message: "answered " + http.StatusText(status)}})
	}))
	defer fake.Close()
	t.Setenv("PGTENANT_TOKEN", "x")
	for _, c := range []struct {
		server string
		args   []string
		status int
		code   string
		want   string
	}{
		{"http://127.0.0.1:1", []string{"tenant", "list", "-o", "json"}, ExitUnavailable, "unavailable", "pgtenant server unreachable"},
		{"http://127.0.0.1:1", []string{"tenant", "list", "--bogus", "-o", "json"}, ExitUsage, "invalid", "unknown flag: --bogus"},
		{"http://127.0.0.1:1", []string{"-o", "json", "tenant", "show"}, ExitUsage, "invalid", "accepts 1 arg(s)"},
		{"http://127.0.0.1:1", []string{"-ojson", "tenant", "nosuchverb"}, ExitUsage, "invalid", ""},
		{"http://127.0.0.1:1", []string{"-o", "json", "tenant", "list", "--state", "bogus"}, ExitUsage, "invalid", "one of provisioning"},
		{"http://127.0.0.1:1", []string{"-o", "json", "template", "delete", "saas"}, ExitUsage, "invalid", "add --yes"},
		{"http://127.0.0.1:1", []string{"-o", "json", "tenant", "drop", "x", "--purge-now"}, ExitUsage, "invalid", "add --yes"},
		{fake.URL, []string{"-o", "json", "tenant", "show", "gone"}, ExitNotFound, "code404", "answered Not Found"},
		{fake.URL, []string{"-o", "json", "tenant", "suspend", "busy"}, ExitConflict, "code409", "answered Conflict"},
		{fake.URL, []string{"-o", "json", "tenant", "show", "slow"}, ExitUnavailable, "code504", "answered Gateway Timeout"},
		{fake.URL, []string{"-o", "json", "tenant", "show", "broken"}, ExitError, "code500", "answered Internal Server Error"},
	} {
		var stdout, stderr bytes.Buffer
		err := run(context.Background(), append([]string{"--server", c.server}, c.args...), &globals{stdout: &stdout, stderr: &stderr})
		var body api.ErrorBody
		if jerr := json.Unmarshal(stdout.Bytes(), &body); jerr != nil || body.Error.Code != c.code || !strings.Contains(body.Error.Message, c.want) {
			t.Errorf("%v: stdout %q (%v); want an error body with code %s naming %q", c.args, stdout.String(), jerr, c.code, c.want)
		}
		if got := ExitCode(err); got != c.status || !Printed(err) || stderr.Len() != 0 {
			t.Errorf("%v: %v, status %d, printed %v, stderr %q; want status %d, printed, nothing on stderr", c.args, err, got, Printed(err), stderr.String(), c.status)
		}
		// The same without -o json: the error for main to print, nothing on stdout.
		var plain []string
		for _, a := range c.args {
			if a != "-o" && a != "json" && a != "-ojson" {
				plain = append(plain, a)
			}
		}
		stdout.Reset()
		err = run(context.Background(), append([]string{"--server", c.server}, plain...), &globals{stdout: &stdout, stderr: &stderr})
		if got := ExitCode(err); got != c.status || Printed(err) || stdout.Len() != 0 {
			t.Errorf("%v: %v, status %d, stdout %q; want status %d and nothing printed", plain, err, got, stdout.String(), c.status)
		}
	}
}

// TestCLI_ReadableOutput: what reconcile, template create --wait and
// template show print reads as text (no Go map syntax; the header before
// the progress; the files' checksums).
func TestCLI_ReadableOutput(t *testing.T) {
	e := startCLI(t)
	out, err := e.run(t, "template", "create", "saas", "--from", "../../examples/templates/saas", "--wait")
	if err != nil {
		t.Fatal(err)
	}
	progress := -1
	if loc := regexp.MustCompile(`(?m)^job \d+ (queued|running|waiting|succeeded)`).FindStringIndex(out); loc != nil {
		progress = loc[0]
	}
	stored, built := strings.Index(out, "version 1 stored"), strings.Index(out, "built on every cluster")
	if stored < 0 || progress < 0 || built < 0 || !(stored < progress && progress < built) {
		t.Errorf("template create --wait printed\n%s\nwant the header, then the progress, then the outcome", out)
	}

	out, err = e.run(t, "template", "show", "saas")
	if err != nil {
		t.Fatal(err)
	}
	body, err := os.ReadFile("../../examples/templates/saas/0001_init.sql")
	if err != nil {
		t.Fatal(err)
	}
	sum := sha256.Sum256(body)
	if want := `0001_init.sql +sha256 ` + hex.EncodeToString(sum[:])[:16]; !regexp.MustCompile(want).MatchString(out) {
		t.Errorf("template show:\n%s\nwant the file's checksum (%s)", out, want)
	}
	if !regexp.MustCompile(`spare pool local/database +v1, \d+ ready, \d+ building of target \d+ \(size \d+\)`).MatchString(out) || !strings.Contains(out, "spare pool local/schema") {
		t.Errorf("template show:\n%s\nwant the spare pools of both modes on local", out)
	}

	// drop --purge-now --wait shows the tenant as the purge left it.
	out, err = e.run(t, "-o", "json", "tenant", "create", "--template", "saas")
	if err != nil {
		t.Fatal(err)
	}
	id := regexp.MustCompile(`"id": "([a-z0-9]+)"`).FindStringSubmatch(out)
	if id == nil {
		t.Fatalf("tenant create printed no id:\n%s", out)
	}
	// A purge cannot be undone: off a terminal it needs --yes, on one the
	// tenant's id typed back.
	if out, err := e.run(t, "tenant", "drop", id[1], "--purge-now"); ExitCode(err) != ExitUsage || !strings.Contains(fmt.Sprint(err), "add --yes") {
		t.Errorf("tenant drop --purge-now off a terminal: %v (status %d)\n%s\nwant a usage error asking for --yes", err, ExitCode(err), out)
	}
	if out, err := e.runOn(t, strings.NewReader("nope\n"), "tenant", "drop", id[1], "--purge-now"); ExitCode(err) != ExitError || !strings.Contains(out, "Type "+id[1]+" to confirm") ||
		!strings.Contains(fmt.Sprint(err), `not confirmed: typed "nope"`) {
		t.Errorf("tenant drop --purge-now with the wrong id typed: %v\n%s\nwant a prompt and not confirmed", err, out)
	}
	if out, err := e.run(t, "tenant", "show", id[1]); err != nil || !regexp.MustCompile(`(?m)^state +active$`).MatchString(out) {
		t.Errorf("tenant show after refused drops: %v\n%s\nwant it still active", err, out)
	}
	out, err = e.run(t, "tenant", "drop", id[1], "--purge-now", "--wait", "--yes")
	if err != nil {
		t.Fatal(err)
	}
	if !regexp.MustCompile(`(?m)^state +purged$`).MatchString(out) || !regexp.MustCompile(`(?m)^purge job +\d+ \(succeeded\)$`).MatchString(out) ||
		!regexp.MustCompile(`(?m)^event [0-9: -]+ +purged job=\d+ reason=`).MatchString(out) {
		t.Errorf("tenant drop --purge-now --wait printed\n%s\nwant state purged, the purge job succeeded and the purged event's job=… reason=…", out)
	}

	// On a terminal, template delete goes ahead once its name is typed.
	out, err = e.runOn(t, strings.NewReader("saas\n"), "template", "delete", "saas", "--wait")
	if err != nil || !strings.Contains(out, "Type saas to confirm") || !strings.Contains(out, "template saas deleted") {
		t.Errorf("template delete with its name typed: %v\n%s\nwant a prompt and the template deleted", err, out)
	}

	out, err = e.run(t, "reconcile")
	if err != nil {
		t.Fatal(err)
	}
	first, _, _ := strings.Cut(out, "\n")
	if strings.Contains(first, "map[") || !regexp.MustCompile(`^checked \d+ [a-z_ ]+(, \d+ [a-z_ ]+)* on local: \d+ finding\(s\)$`).MatchString(first) {
		t.Errorf("reconcile's summary = %q, want checked N kind, … on local: N finding(s)", first)
	}
}

// TestCLI_Hints: a prewarm with nothing captured says why it did nothing;
// a daemon that does not answer is named as such, not as a cluster.
func TestCLI_Hints(t *testing.T) {
	e := startCLI(t)
	out, err := e.run(t, "prewarm", "--all", "--wait")
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(out, "nothing to prewarm") {
		t.Errorf("prewarm --all --wait before any capture:\n%s\nwant a hint that nothing was captured", out)
	}

	var buf bytes.Buffer
	err = Run(context.Background(), []string{"--server", "http://127.0.0.1:1", "--data-dir", e.dataDir, "tenant", "list"}, &buf, &buf)
	if err == nil || !strings.Contains(err.Error(), "pgtenant server unreachable") || strings.Contains(err.Error(), "cluster") {
		t.Errorf("tenant list with no daemon: %v, want the server named unreachable", err)
	}
}

// TestPrintUp_NextSteps: a new fleet is told to create the example
// template; a restarted one, which has templates, is not.
func TestPrintUp_NextSteps(t *testing.T) {
	var fresh, restarted bytes.Buffer
	printUp(&fresh, upInfo{URL: "http://x"})
	printUp(&restarted, upInfo{URL: "http://x", Templates: []string{"billing", "saas"}})
	if !strings.Contains(fresh.String(), "template create saas") {
		t.Errorf("new fleet:\n%s\nwant template create saas", fresh.String())
	}
	if s := restarted.String(); strings.Contains(s, "template create") || !strings.Contains(s, "tenant create --template saas") {
		t.Errorf("restarted fleet:\n%s\nwant no template create, and a tenant create of its template", s)
	}
}

// TestDocs_MetricsExist: every series the README and the pages under docs/
// name is one the daemon (or up's supervisor) exports; a name ending in _ or
// _* is a prefix some series has, and docs/metrics.md's per-tenant list names
// pgtenant_tenant_<name>. The pages about internals, security and the
// benches name roles and schemas (pgtenant_pooler, pgtenant_move), not series.
func TestDocs_MetricsExist(t *testing.T) {
	pages, err := filepath.Glob("../../docs/*.md")
	if err != nil {
		t.Fatal(err)
	}
	ops, _ := filepath.Glob("../../docs/operations/*.md")
	var docs []byte
	for _, p := range append(append([]string{"../../README.md"}, pages...), ops...) {
		switch filepath.Base(p) {
		case "ARCHITECTURE.md", "SECURITY.md", "BENCHMARKS.md", cliDocFile:
			continue
		}
		b, err := os.ReadFile(p)
		if err != nil {
			t.Fatal(err)
		}
		docs = append(docs, b...)
	}
	e := startCLI(t)
	exported := map[string]bool{}
	descs := make(chan *prometheus.Desc)
	go func() {
		e.d.Metrics().Describe(descs)
		restartCounter([]fleet.Supervised{pg.Cluster}).Describe(descs)
		close(descs)
	}()
	fqName := regexp.MustCompile(`fqName: "([a-z_]+)"`)
	for d := range descs {
		if m := fqName.FindStringSubmatch(d.String()); m != nil {
			exported[m[1]] = true
		}
	}
	hasPrefix := func(p string) bool {
		for n := range exported {
			if strings.HasPrefix(n, p) {
				return true
			}
		}
		return false
	}
	notMetrics := map[string]bool{"pgtenant_session": true} // the console's cookie
	named := 0
	for _, m := range regexp.MustCompile(`\bpgtenant_[a-z_]+\*?`).FindAllString(string(docs), -1) {
		if notMetrics[m] {
			continue
		}
		named++
		if p := strings.TrimSuffix(m, "*"); strings.HasSuffix(p, "_") {
			if !hasPrefix(p) {
				t.Errorf("the docs name series %s…, none is exported", p)
			}
		} else if !exported[m] {
			t.Errorf("the docs name %s, which is not exported", m)
		}
	}
	// Per-tenant series: "`pgtenant_tenant_*{…}` (`size_bytes`, `connections{state}`, …) exist only".
	metrics, err := os.ReadFile("../../docs/metrics.md")
	if err != nil {
		t.Fatal(err)
	}
	s := string(metrics)
	i := strings.Index(s, "Per-tenant series `pgtenant_tenant_*")
	j := strings.Index(s[max(i, 0):], "exist only")
	if i < 0 || j < 0 {
		t.Fatal("docs/metrics.md has no list of per-tenant series")
	}
	for _, m := range regexp.MustCompile("`([a-z_]+)(\\{[^}]*\\})?`").FindAllStringSubmatch(s[i:i+j], -1) {
		if m[1] == "pgtenant_tenant_" {
			continue
		}
		named++
		if !exported["pgtenant_tenant_"+m[1]] {
			t.Errorf("docs/metrics.md's per-tenant series %s: pgtenant_tenant_%s is not exported", m[1], m[1])
		}
	}
	if named < 30 {
		t.Errorf("found %d metric names in the docs, want the whole list (30+)", named)
	}
}

// TestCLI_ClusterPlacement: `cluster set` parses sizes and labels and
// `cluster list` shows them with the tenant count; `rebalance --dry-run`
// on one cluster has nothing to move, in a table and in JSON.
func TestCLI_ClusterPlacement(t *testing.T) {
	e := startCLI(t)
	out, err := e.run(t, "cluster", "set", "local", "--max-tenants", "50", "--max-size", "500GB", "--label", "disk=ssd")
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(out, "max_tenants=50,max_size=500.0 GiB,disk=ssd") {
		t.Errorf("cluster set printed\n%s\nwant its placement", out)
	}
	if _, err := e.run(t, "cluster", "set", "local", "--label", "Bad"); err == nil {
		t.Error("cluster set --label Bad was accepted")
	}
	out, err = e.run(t, "-o", "json", "cluster", "list")
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{`"max_tenants": 50`, `"max_size_bytes": 536870912000`, `"disk": "ssd"`, `"draining": false`, `"tenants": 0`} {
		if !strings.Contains(out, want) {
			t.Errorf("cluster list -o json lacks %s:\n%s", want, out)
		}
	}
	if out, err = e.run(t, "cluster", "set", "local", "--max-size", "0", "--remove-label", "disk"); err != nil || !regexp.MustCompile(`(?m)^local .* max_tenants=50 `).MatchString(out) {
		t.Errorf("cluster set --max-size 0 --remove-label disk: %v\n%s", err, out)
	}
	out, err = e.run(t, "rebalance", "--dry-run")
	if err != nil || !strings.Contains(out, "balanced: nothing to move") {
		t.Errorf("rebalance --dry-run on one cluster: %v\n%s", err, out)
	}
	out, err = e.run(t, "-o", "json", "rebalance", "--dry-run")
	if err != nil || !strings.Contains(out, `"moves": []`) {
		t.Errorf("rebalance --dry-run -o json: %v\n%s", err, out)
	}
}

// TestCLI_LifecycleJSONIsTheTenant: with -o json, suspend, resume and
// restore print the tenant as tenant show does (one shape per resource),
// not the API's envelope around it.
func TestCLI_LifecycleJSONIsTheTenant(t *testing.T) {
	fake := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		var tn api.Tenant
		tn.ID, tn.State = "t1", "suspended"
		if strings.HasSuffix(r.URL.Path, "/t1") { // show
			json.NewEncoder(w).Encode(tn)
			return
		}
		json.NewEncoder(w).Encode(api.LifecycleResponse{Tenant: tn})
	}))
	defer fake.Close()
	t.Setenv("PGTENANT_TOKEN", "x")
	var shown map[string]any
	for _, verb := range []string{"show", "suspend", "resume", "restore"} {
		var stdout, stderr bytes.Buffer
		if err := run(context.Background(), []string{"--server", fake.URL, "-o", "json", "tenant", verb, "t1"}, &globals{stdout: &stdout, stderr: &stderr}); err != nil {
			t.Fatalf("tenant %s: %v %s", verb, err, stderr.String())
		}
		var got map[string]any
		if err := json.Unmarshal(stdout.Bytes(), &got); err != nil {
			t.Fatalf("tenant %s: %v: %s", verb, err, stdout.String())
		}
		if verb == "show" {
			shown = got
			continue
		}
		if got["id"] != "t1" || got["tenant"] != nil || len(got) != len(shown) {
			t.Errorf("tenant %s -o json = %v, want the tenant as tenant show prints it (%v)", verb, got, shown)
		}
	}
}

// TestCLI_AnalyticsWaitEndsOnFailure: `analytics enable --wait` of a
// mirror that keeps failing ends with its error and what to do, instead of
// waiting for ever while the mirror retries.
func TestCLI_AnalyticsWaitEndsOnFailure(t *testing.T) {
	e := startCLI(t)
	if _, err := e.run(t, "template", "create", "saas", "--from", "../../examples/templates/saas", "--wait"); err != nil {
		t.Fatal(err)
	}
	out, err := e.run(t, "-o", "json", "tenant", "create", "--template", "saas")
	if err != nil {
		t.Fatal(err)
	}
	id := regexp.MustCompile(`"id": "([a-z0-9]+)"`).FindStringSubmatch(out)
	if id == nil {
		t.Fatalf("tenant create printed no id:\n%s", out)
	}
	// The mirror's file is a directory with a file in it: the mirror can
	// neither open it nor remove it, and fails at every attempt.
	if err := os.MkdirAll(filepath.Join(e.d.Analytics().File(id[1]), "in-the-way"), 0o700); err != nil {
		t.Fatal(err)
	}
	out, err = e.run(t, "analytics", "enable", id[1], "--wait")
	if err == nil || ExitCode(err) != ExitError || !strings.Contains(err.Error(), "the mirror of tenant "+id[1]+" failed") ||
		!strings.Contains(err.Error(), "pgtenant analytics disable "+id[1]) {
		t.Fatalf("analytics enable --wait of a failing mirror: %v (exit %d)\n%s\nwant its failure and what to do", err, ExitCode(err), out)
	}
	if _, err := e.run(t, "analytics", "disable", id[1]); err != nil {
		t.Fatal(err)
	}
}
