package fleet

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"sort"
	"strconv"
	"strings"
)

// Binaries is one installation of the PostgreSQL server programs.
type Binaries struct {
	Dir     string // directory holding postgres, initdb, pg_ctl, pg_basebackup
	Major   int    // e.g. 15
	Version string // e.g. "15.18"
}

// Path returns the full path of one program of this installation.
func (b Binaries) Path(program string) string { return filepath.Join(b.Dir, program) }

// ErrNoBinaries is returned when no PostgreSQL server installation is found.
var ErrNoBinaries = errors.New("no PostgreSQL server binaries found (need postgres, initdb, pg_ctl, pg_basebackup); " +
	"install them, e.g. on Debian/Ubuntu: apt-get install -y postgresql-15, or put their directory on PATH")

var versionRE = regexp.MustCompile(`\(PostgreSQL\) (\d+)(?:\.(\d+))?`)

// required lists the programs a managed cluster needs.
var required = []string{"postgres", "initdb", "pg_ctl", "pg_basebackup"}

// FindBinaries looks for server binaries in PATH, `pg_config --bindir`,
// /usr/lib/postgresql/<major>/bin and /usr/pgsql-<major>/bin, and returns the
// newest. With wantMajor > 0 only that major version is accepted, so that an
// existing data directory is never opened by another major version.
func FindBinaries(wantMajor int) (Binaries, error) {
	var found []Binaries
	seen := map[string]bool{}
	for _, dir := range candidateDirs() {
		dir = filepath.Clean(dir)
		if seen[dir] {
			continue
		}
		seen[dir] = true
		b, ok := probe(dir)
		if !ok || (wantMajor > 0 && b.Major != wantMajor) {
			continue
		}
		found = append(found, b)
	}
	if len(found) == 0 {
		if wantMajor > 0 {
			return Binaries{}, fmt.Errorf("no PostgreSQL %d server binaries found: this data directory was made by PostgreSQL %d; "+
				"install them (Debian/Ubuntu: apt-get install -y postgresql-%d) or use another --data-dir", wantMajor, wantMajor, wantMajor)
		}
		return Binaries{}, ErrNoBinaries
	}
	sort.SliceStable(found, func(i, j int) bool { return found[i].Major > found[j].Major })
	return found[0], nil
}

func candidateDirs() []string {
	var dirs []string
	if p, err := exec.LookPath("postgres"); err == nil {
		dirs = append(dirs, filepath.Dir(p))
	}
	if out, err := exec.Command("pg_config", "--bindir").Output(); err == nil {
		dirs = append(dirs, strings.TrimSpace(string(out)))
	}
	for _, pattern := range []string{"/usr/lib/postgresql/*/bin", "/usr/pgsql-*/bin", "/usr/local/pgsql/bin"} {
		m, _ := filepath.Glob(pattern)
		dirs = append(dirs, m...)
	}
	return dirs
}

func probe(dir string) (Binaries, bool) {
	for _, p := range required {
		if fi, err := os.Stat(filepath.Join(dir, p)); err != nil || fi.IsDir() {
			return Binaries{}, false
		}
	}
	out, err := exec.Command(filepath.Join(dir, "postgres"), "--version").Output()
	if err != nil {
		return Binaries{}, false
	}
	m := versionRE.FindStringSubmatch(string(out))
	if m == nil {
		return Binaries{}, false
	}
	major, _ := strconv.Atoi(m[1])
	v := m[1]
	if m[2] != "" {
		v += "." + m[2]
	}
	return Binaries{Dir: dir, Major: major, Version: v}, true
}
