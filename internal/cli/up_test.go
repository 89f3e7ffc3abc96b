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

// TestUp_UnderPatroniIsTheDataDirs: a data dir made under Patroni is run
// so without the flag; one made without it refuses --patroni, naming the
// way out; a new one follows the flag.
func TestUp_UnderPatroniIsTheDataDirs(t *testing.T) {
	for _, p := range []string{"patroni", "etcd"} {
		if _, err := exec.LookPath(p); err != nil {
			t.Skipf("%s not installed (make test installs it)", p)
		}
	}
	made := func(state string) string {
		dir := t.TempDir()
		if state != "" {
			if err := os.MkdirAll(filepath.Join(dir, "local"), 0o700); err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(filepath.Join(dir, "local", state), []byte("{}"), 0o600); err != nil {
				t.Fatal(err)
			}
		}
		return dir
	}
	for _, c := range []struct {
		name, state string
		asked, want bool
		fail        string
	}{
		{"new, plain", "", false, false, ""},
		{"new, --patroni", "", true, true, ""},
		{"made under Patroni, plain", "patroni.json", false, true, ""},
		{"made under Patroni, --patroni", "patroni.json", true, true, ""},
		{"made without, plain", "cluster.json", false, false, ""},
		{"made without, --patroni", "cluster.json", true, false, "was made without Patroni"},
	} {
		got, err := upUnderPatroni(made(c.state), c.asked)
		if got != c.want || (err != nil) != (c.fail != "") || (err != nil && !strings.Contains(err.Error(), c.fail)) {
			t.Errorf("%s: %v, %v; want %v, error %q", c.name, got, err, c.want, c.fail)
		}
	}
}
