package main

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/pgtenant/pgtenant/internal/api"
	"github.com/pgtenant/pgtenant/internal/pgtest"
	"github.com/pgtenant/pgtenant/internal/templates"
)

// binary is the pgtenant binary built once for the end-to-end tests here.
var binary string

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "pgtenant-bin-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	binary = filepath.Join(dir, "pgtenant")
	if out, err := exec.Command("go", "build", "-o", binary, ".").CombinedOutput(); err != nil {
		fmt.Fprintf(os.Stderr, "build pgtenant: %v\n%s", err, out)
		os.Exit(1)
	}
	code := m.Run()
	os.RemoveAll(dir)
	os.Exit(code)
}

// upProcess is a running `pgtenant up`.
type upProcess struct {
	cmd  *exec.Cmd
	info struct {
		Error *api.ErrorDetail `json:"error"` // up failed: its error, printed as JSON
		URL   string           `json:"url"`
		Token string           `json:"token"`
		Nodes []struct {
			Name string `json:"name"`
			DSN  string `json:"dsn"`
		} `json:"nodes"`
		Pooler    string   `json:"pooler"`
		Templates []string `json:"templates"`
		Clusters  []struct {
			Name    string   `json:"name"`
			Pooler  string   `json:"pooler"`
			Patroni []string `json:"patroni"`
			Nodes   []struct {
				Name string `json:"name"`
				DSN  string `json:"dsn"`
			} `json:"nodes"`
		} `json:"clusters"`
	}
	stderr *strings.Builder
}

// startUp runs `pgtenant up -o json` and waits for it to print its info.
func startUp(t *testing.T, dataDir string, extra ...string) *upProcess {
	t.Helper()
	args := append([]string{"up", "-o", "json", "--data-dir", dataDir, "--listen", "127.0.0.1:0"}, extra...)
	p := &upProcess{cmd: exec.Command(binary, args...), stderr: &strings.Builder{}}
	p.cmd.Stderr = p.stderr
	stdout, err := p.cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := p.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	dec := json.NewDecoder(bufio.NewReader(stdout))
	decoded := make(chan error, 1)
	go func() { decoded <- dec.Decode(&p.info) }()
	select {
	case err := <-decoded:
		if err != nil || p.info.Error != nil {
			p.cmd.Process.Kill()
			p.cmd.Wait()
			if err == nil {
				err = fmt.Errorf("%s: %s", p.info.Error.Code, p.info.Error.Message)
			}
			t.Fatalf("up printed no info: %v\nstderr:\n%s", err, p.stderr)
		}
	case <-time.After(3 * time.Minute):
		p.cmd.Process.Kill()
		t.Fatalf("up did not come up\nstderr:\n%s", p.stderr)
	}
	return p
}

// stop sends SIGINT (Ctrl-C) and waits for a clean exit.
func (p *upProcess) stop(t *testing.T) {
	t.Helper()
	if err := p.cmd.Process.Signal(syscall.SIGINT); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- p.cmd.Wait() }()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("up exited with %v\nstderr:\n%s", err, p.stderr)
		}
	case <-time.After(2 * time.Minute):
		p.cmd.Process.Kill()
		t.Fatalf("up did not stop\nstderr:\n%s", p.stderr)
	}
}

// TestUp_StartStopRestart is the newcomer's path: up brings a primary, a
// streaming standby and the API; Ctrl-C leaves no server behind; up again
// restarts the same fleet on the same ports.
func TestUp_StartStopRestart(t *testing.T) {
	if testing.Short() {
		t.Skip("end-to-end")
	}
	dataDir := filepath.Join(pgtest.TempDir(t), "data")
	ctx := context.Background()

	p := startUp(t, dataDir, "--patroni=false")
	c := api.NewClient(p.info.URL, p.info.Token)
	cs, err := c.Clusters(ctx)
	if err != nil {
		t.Errorf("cluster list right after up: %v", err) // before stop, which may fail too
		p.stop(t)
		t.FailNow()
	}
	if len(cs) != 1 || cs[0].Name != "local" || len(cs[0].Standbys) != 1 || cs[0].Standbys[0].State != "streaming" {
		p.stop(t)
		t.Fatalf("clusters = %+v, want local with one streaming standby", cs)
	}
	firstNodes, firstPooler := p.info.Nodes, p.info.Pooler
	if firstPooler == "" {
		t.Error("up printed no pooler address")
	} else if conn, err := net.DialTimeout("tcp", firstPooler, 2*time.Second); err != nil {
		t.Errorf("the pooler does not accept connections on %s: %v", firstPooler, err)
	} else {
		conn.Close()
	}
	// up writes what doctor asks for a tenant fleet (its files check).
	if d, err := c.Cluster(ctx, "local"); err != nil || d.Info == nil || d.Info.Settings["max_files_per_process"] == "1000" {
		t.Errorf("cluster show local: %v; want max_files_per_process above PostgreSQL's default of 1000", err)
	}
	if len(p.info.Templates) != 0 {
		t.Errorf("a new fleet printed templates %v, want none", p.info.Templates)
	}
	files, err := os.ReadFile("../../examples/templates/saas/0001_init.sql")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.CreateTemplate(ctx, "saas", []templates.Upload{{Name: "0001_init.sql", Body: string(files)}}); err != nil {
		t.Errorf("template create: %v", err)
	}
	// A second up on the same data dir is refused while the first runs.
	out, err := exec.Command(binary, "up", "--data-dir", dataDir, "--listen", "127.0.0.1:0").CombinedOutput()
	if err == nil || !strings.Contains(string(out), "another `pgtenant up`") {
		t.Errorf("second concurrent up: err=%v out=%s; want a refusal", err, out)
	}
	p.stop(t)

	for _, n := range []string{"primary", "standby1"} {
		if _, err := os.Stat(filepath.Join(dataDir, "local", n, "postmaster.pid")); !os.IsNotExist(err) {
			t.Errorf("%s: postmaster.pid still there after Ctrl-C (err=%v)", n, err)
		}
	}
	if conn, err := net.DialTimeout("tcp", firstPooler, time.Second); err == nil {
		conn.Close()
		t.Errorf("the pooler still accepts connections on %s after Ctrl-C", firstPooler)
	}

	p = startUp(t, dataDir)
	defer p.stop(t)
	if got, want := fmt.Sprint(p.info.Nodes), fmt.Sprint(firstNodes); got != want {
		t.Errorf("restarted nodes = %s, want the same %s", got, want)
	}
	if p.info.Pooler != firstPooler {
		t.Errorf("restarted pooler on %s, want the same %s", p.info.Pooler, firstPooler)
	}
	// Its next steps use the template it has, not a template create.
	if fmt.Sprint(p.info.Templates) != "[saas]" {
		t.Errorf("restarted fleet printed templates %v, want [saas]", p.info.Templates)
	}
	c = api.NewClient(p.info.URL, p.info.Token)
	if _, err := c.Clusters(ctx); err != nil {
		t.Errorf("after restart: %v", err)
	}
}

// TestUp_Clusters runs `up --clusters 2`: local and local2, each with its
// own primary and pooler, both listed by `cluster list`.
func TestUp_Clusters(t *testing.T) {
	if testing.Short() {
		t.Skip("end-to-end")
	}
	dataDir := filepath.Join(pgtest.TempDir(t), "data")
	p := startUp(t, dataDir, "--patroni=false", "--clusters", "2", "--standbys", "0")
	defer p.stop(t)
	if len(p.info.Clusters) != 2 || p.info.Clusters[0].Name != "local" || p.info.Clusters[1].Name != "local2" {
		t.Fatalf("up printed clusters %+v, want local and local2", p.info.Clusters)
	}
	if a, b := p.info.Clusters[0], p.info.Clusters[1]; a.Pooler == "" || a.Pooler == b.Pooler || a.Nodes[0].DSN == b.Nodes[0].DSN {
		t.Errorf("clusters %+v: want a primary and a pooler of its own each", p.info.Clusters)
	}
	cmd := exec.Command(binary, "cluster", "list", "-o", "json")
	cmd.Env = append(os.Environ(), "PGTENANT_SERVER="+p.info.URL, "PGTENANT_TOKEN="+p.info.Token)
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("cluster list: %v\n%s", err, out)
	}
	var cs []api.Cluster
	if err := json.Unmarshal(out, &cs); err != nil {
		t.Fatalf("cluster list -o json: %v\n%s", err, out)
	}
	var names []string
	for _, c := range cs {
		names = append(names, c.Name+":"+c.Kind+":"+c.Status)
	}
	if got, want := strings.Join(names, ","), "local:managed:up,local2:managed:up"; got != want {
		t.Errorf("cluster list = %s, want %s", got, want)
	}
}

// TestUp_RestartsKilledPrimary kills -9 the primary's postmaster under a
// running up: up's supervisor restarts it, the API answers from the catalog
// again, /metrics counts the restart and the log has its line.
func TestUp_RestartsKilledPrimary(t *testing.T) {
	if testing.Short() {
		t.Skip("end-to-end")
	}
	dataDir := filepath.Join(pgtest.TempDir(t), "data")
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	p := startUp(t, dataDir, "--patroni=false", "--standbys", "0")
	stopped := false
	defer func() {
		if !stopped {
			p.stop(t)
		}
	}()

	pidFile := filepath.Join(dataDir, "local", "primary", "postmaster.pid")
	b, err := os.ReadFile(pidFile)
	if err != nil {
		t.Fatal(err)
	}
	first, _, _ := strings.Cut(string(b), "\n")
	pid, err := strconv.Atoi(strings.TrimSpace(first))
	if err != nil {
		t.Fatalf("postmaster.pid: %v", err)
	}
	if err := syscall.Kill(pid, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}

	const restarted = `pgtenant_managed_restarts_total{cluster="local",node="primary",outcome="restarted"} 1`
	c := api.NewClient(p.info.URL, p.info.Token)
	for {
		metrics := scrape(p.info.URL + "/metrics")
		if _, err := c.Clusters(ctx); err == nil && strings.Contains(metrics, restarted) {
			break
		}
		select {
		case <-ctx.Done():
			t.Fatalf("primary not restarted: want %s in /metrics and the API answering; /metrics has:\n%s", restarted, grepLines(metrics, "pgtenant_managed_restarts_total"))
		case <-time.After(200 * time.Millisecond):
		}
	}
	p.stop(t)
	stopped = true
	for _, want := range []string{"component=supervisor", "node=primary", "attempt=1", "outcome=restarted"} {
		if !strings.Contains(grepLines(p.stderr.String(), `msg="node restarted"`), want) {
			t.Errorf("up's log has no restart line with %q:\n%s", want, p.stderr)
		}
	}
	if _, err := os.Stat(pidFile); !os.IsNotExist(err) {
		t.Errorf("postmaster.pid still there after Ctrl-C (err=%v): the restarted primary was not stopped", err)
	}
}

// scrape returns the body of GET url, "" on any error.
func scrape(url string) string {
	resp, err := http.Get(url)
	if err != nil {
		return ""
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return string(b)
}

// grepLines returns the lines of s that contain sub.
func grepLines(s, sub string) string {
	var out []string
	for _, l := range strings.Split(s, "\n") {
		if strings.Contains(l, sub) {
			out = append(out, l)
		}
	}
	return strings.Join(out, "\n")
}

// TestCLI_WrongUsageExitsNonZero: a command line that cannot work, an
// answer of the daemon that is an error, or a daemon that does not answer,
// is an error on stderr naming the fix, with the exit status of its kind
// (cli.ExitCode); nothing is printed as if it had worked. With -o json the
// error is the API's error body on stdout instead.
func TestCLI_WrongUsageExitsNonZero(t *testing.T) {
	// A daemon that answers every request with the error its path names.
	fake := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		status, code := http.StatusNotFound, "not_found"
		switch {
		case strings.HasSuffix(r.URL.Path, "/suspend"):
			status, code = http.StatusConflict, "conflict"
		case r.Method == http.MethodPost && r.URL.Path == "/v1/tenants":
			status, code = http.StatusServiceUnavailable, "no_capacity"
		}
		w.WriteHeader(status)
		json.NewEncoder(w).Encode(api.ErrorBody{Error: api.ErrorDetail{Code: code, Message: "the daemon says " + code}})
	}))
	defer fake.Close()
	const down = "http://127.0.0.1:1" // nothing listens there
	for _, tc := range []struct {
		server string
		args   []string
		status int
		want   string
	}{
		{down, []string{"tenant", "list", "--state", "bogus"}, 2, "one of provisioning, active, suspended, dropped, purging, purged, failed"},
		{down, []string{"job", "list", "--state", "bogus"}, 2, "one of queued, running, waiting, paused, succeeded, failed, cancelled, active"},
		{down, []string{"tenant", "show"}, 2, "accepts 1 arg(s), received 0"},
		{down, []string{"tenant", "lsit"}, 2, `unknown command "lsit" for "pgtenant tenant": did you mean list or set?`},
		{down, []string{"tenant", "list", "--bogus"}, 2, "unknown flag: --bogus"},
		{down, []string{"tenant", "drop", "t1", "--purge-now"}, 2, "add --yes"},
		{down, []string{"template", "delete", "saas"}, 2, "add --yes"},
		{down, []string{"tenant", "list"}, 5, "pgtenant server unreachable at http://127.0.0.1:1"},
		{fake.URL, []string{"tenant", "show", "t1"}, 3, "the daemon says not_found"},
		{fake.URL, []string{"tenant", "suspend", "t1"}, 4, "the daemon says conflict"},
		{fake.URL, []string{"tenant", "create", "--template", "saas"}, 5, "the daemon says no_capacity"},
	} {
		for _, asJSON := range []bool{false, true} {
			args := append([]string{"--server", tc.server}, tc.args...)
			if asJSON {
				args = append(args, "-o", "json")
			}
			cmd := exec.Command(binary, args...)
			cmd.Env = append(os.Environ(), "PGTENANT_TOKEN=x")
			var stdout, stderr strings.Builder
			cmd.Stdout, cmd.Stderr = &stdout, &stderr
			err := cmd.Run()
			var exit *exec.ExitError
			if !errors.As(err, &exit) || exit.ExitCode() != tc.status {
				t.Errorf("%v: %v, want exit status %d", args, err, tc.status)
			}
			if !asJSON {
				if !strings.Contains(stderr.String(), tc.want) || stdout.Len() != 0 {
					t.Errorf("%v: stdout %q, stderr %q; want nothing on stdout and %q on stderr", args, stdout.String(), stderr.String(), tc.want)
				}
				continue
			}
			var body api.ErrorBody
			if err := json.Unmarshal([]byte(stdout.String()), &body); err != nil || body.Error.Code == "" || !strings.Contains(body.Error.Message, tc.want) || stderr.Len() != 0 {
				t.Errorf("%v: stdout %q, stderr %q; want an error body naming %q on stdout, nothing on stderr", args, stdout.String(), stderr.String(), tc.want)
			}
		}
	}
}
