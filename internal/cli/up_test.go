package cli

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// TestUp_NeverDropsAClusterSilently: a data dir remembers its clusters;
// plain up starts them all, a smaller --clusters is refused naming them and
// the flags, and --allow-fewer leaves them down with a line saying so.
func TestUp_NeverDropsAClusterSilently(t *testing.T) {
	dir := t.TempDir()
	if got := dataDirClusters(dir); len(got) != 0 {
		t.Fatalf("a new data dir has clusters %v", got)
	}
	for _, name := range []string{"local", "local2", "local3"} {
		if err := os.MkdirAll(filepath.Join(dir, name), 0o700); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, name, "cluster.json"), []byte("{}"), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	// A directory without a cluster in it is no cluster.
	if err := os.MkdirAll(filepath.Join(dir, "local5"), 0o700); err != nil {
		t.Fatal(err)
	}
	have := dataDirClusters(dir)
	if got, want := strings.Join(have, ","), "local,local2,local3"; got != want {
		t.Fatalf("clusters = %s, want %s", got, want)
	}
	for _, c := range []struct {
		name       string
		o          upOptions
		n          int
		note, fail []string
	}{
		{"plain up starts them all", upOptions{clusters: 1}, 3, []string{"has 3 clusters (local, local2, local3): starting them all"}, nil},
		{"more than it has", upOptions{clusters: 4, clustersSet: true}, 4, nil, nil},
		{"as many", upOptions{clusters: 3, clustersSet: true}, 3, nil, nil},
		{"fewer is refused", upOptions{clusters: 2, clustersSet: true}, 0, nil,
			[]string{"has 3 clusters", "--clusters 2 would leave local3 down", "`pgtenant up --clusters 3`", "--allow-fewer"}},
		{"fewer on purpose", upOptions{clusters: 1, clustersSet: true, allowFewer: true}, 1, []string{"leaving local2, local3 down"}, nil},
	} {
		n, note, err := clusterCount(dir, have, c.o)
		if n != c.n {
			t.Errorf("%s: %d clusters, want %d", c.name, n, c.n)
		}
		if (err != nil) != (c.fail != nil) {
			t.Errorf("%s: err %v", c.name, err)
		}
		for _, w := range c.fail {
			if err != nil && !strings.Contains(err.Error(), w) {
				t.Errorf("%s: error %q, want it to say %q", c.name, err, w)
			}
		}
		if (note != "") != (c.note != nil) {
			t.Errorf("%s: note %q", c.name, note)
		}
		for _, w := range c.note {
			if !strings.Contains(note, w) {
				t.Errorf("%s: note %q, want it to say %q", c.name, note, w)
			}
		}
	}
}

// TestUp_UnderPatroniIsTheDataDirs: a new data dir runs under Patroni
// unless --patroni=false, or unless patroni and etcd are missing and the
// flags did not ask for it (a note says what to install); a data dir made
// under Patroni is run so without the flag, with its etcd's member count,
// and refuses --patroni=false and another --etcd; one made without it
// refuses --patroni and --etcd, naming the way out.
func TestUp_UnderPatroniIsTheDataDirs(t *testing.T) {
	installed := true
	for _, p := range []string{"patroni", "etcd"} {
		if _, err := exec.LookPath(p); err != nil {
			installed = false
		}
	}
	// made is a data dir with local made so (state: its state file, none
	// for a new data dir) and an etcd of etcd members ("old": the one
	// member of before members.json).
	made := func(state, etcd string) string {
		dir := t.TempDir()
		files := map[string]string{}
		if state != "" {
			files[filepath.Join("local", state)] = "{}"
		}
		switch etcd {
		case "old":
			files[filepath.Join("etcd", "ports.json")] = `{"client": 1, "peer": 2}`
		case "1", "3":
			files[filepath.Join("etcd", "members.json")] = `{"members": ` + etcd + `}`
		}
		for name, body := range files {
			if err := os.MkdirAll(filepath.Dir(filepath.Join(dir, name)), 0o700); err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(filepath.Join(dir, name), []byte(body), 0o600); err != nil {
				t.Fatal(err)
			}
		}
		return dir
	}
	// The flags as cobra gives them: plain, --patroni, --patroni=false,
	// --etcd N.
	plain := upOptions{patroni: true, etcd: 1}
	flags := func(patroni string, etcd int) upOptions {
		o := plain
		if patroni != "" {
			o.patroni, o.patroniSet = patroni == "true", true
		}
		if etcd != 0 {
			o.etcd, o.etcdSet = etcd, true
		}
		return o
	}
	for _, c := range []struct {
		name, state, etcd string
		o                 upOptions
		// missing: run with neither patroni nor etcd in PATH.
		missing    bool
		want       int // etcd members; 0: up runs the clusters itself
		note, fail string
	}{
		{name: "new, plain", o: plain, want: 1},
		{name: "new, --patroni", o: flags("true", 0), want: 1},
		{name: "new, --patroni=false", o: flags("false", 0), want: 0, note: "WARNING: no failover"},
		{name: "new, --etcd 3", o: flags("", 3), want: 3},
		{name: "new, --patroni=false --etcd 3", o: flags("false", 3), fail: "--etcd 3: etcd is Patroni's store"},
		{name: "new, plain, not installed", o: plain, missing: true,
			fail: "clusters under Patroni need patroni and etcd-server: apt-get install -y patroni etcd-server python3-etcd (make run and make test install them as root; or run this fleet's clusters without failover: pgtenant up --patroni=false)"},
		{name: "new, --patroni, not installed", o: flags("true", 0), missing: true, fail: "clusters under Patroni need patroni and etcd-server"},
		{name: "new, --etcd 3, not installed", o: flags("", 3), missing: true, fail: "clusters under Patroni need"},
		{name: "made under Patroni, plain", state: "patroni.json", etcd: "old", o: plain, want: 1},
		{name: "made under Patroni, --patroni", state: "patroni.json", etcd: "1", o: flags("true", 0), want: 1},
		{name: "made under Patroni, --patroni=false", state: "patroni.json", etcd: "1", o: flags("false", 0),
			fail: "was made under Patroni: its clusters always run under it (run `pgtenant up` without --patroni=false)"},
		{name: "made under Patroni with 3 members, plain", state: "patroni.json", etcd: "3", o: plain, want: 3},
		{name: "made under Patroni with 3 members, --etcd 3", state: "patroni.json", etcd: "3", o: flags("", 3), want: 3},
		{name: "made under Patroni with 3 members, --etcd 1", state: "patroni.json", etcd: "3", o: flags("", 1),
			fail: "--etcd 1: " + "%s has 3 etcd member(s), fixed when it was made: run `pgtenant up` without --etcd"},
		{name: "made under Patroni with 1 member, --etcd 3", state: "patroni.json", etcd: "old", o: flags("", 3), missing: true,
			fail: "has 1 etcd member(s)"},
		{name: "made under Patroni, not installed", state: "patroni.json", etcd: "1", o: plain, missing: true, fail: "clusters under Patroni need"},
		{name: "made without, plain", state: "cluster.json", o: plain, want: 0, note: "WARNING: no failover"},
		{name: "made without, plain, not installed", state: "cluster.json", o: plain, missing: true, want: 0, note: "WARNING: no failover"},
		{name: "made without, --patroni=false", state: "cluster.json", o: flags("false", 0), want: 0, note: "WARNING: no failover"},
		{name: "made without, --patroni", state: "cluster.json", o: flags("true", 0), fail: "was made without Patroni"},
		{name: "made without, --etcd 3", state: "cluster.json", o: flags("", 3), fail: "was made without Patroni"},
	} {
		t.Run(c.name, func(t *testing.T) {
			if c.missing {
				t.Setenv("PATH", t.TempDir())
			} else if !installed && c.fail == "" && c.want > 0 {
				t.Skip("patroni or etcd not installed (make test installs them)")
			}
			dir := made(c.state, c.etcd)
			got, note, err := upUnderPatroni(dir, c.o)
			fail := strings.ReplaceAll(c.fail, "%s", dir)
			if got != c.want || (err != nil) != (fail != "") || (err != nil && !strings.Contains(err.Error(), fail)) {
				t.Errorf("%d members, %v; want %d, error %q", got, err, c.want, fail)
			}
			// Only what is missing from the machine is no usage error.
			if err != nil && !strings.Contains(fail, "clusters under Patroni need") && ExitCode(err) != ExitUsage {
				t.Errorf("%v: status %d; want a usage error (%d)", err, ExitCode(err), ExitUsage)
			}
			if (note != "") != (c.note != "") || !strings.Contains(note, c.note) {
				t.Errorf("note %q; want one saying %q", note, c.note)
			}
		})
	}
}
