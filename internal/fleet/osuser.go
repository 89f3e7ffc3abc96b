package fleet

import (
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"strconv"
	"sync"
	"syscall"
)

// runAs is the OS identity PostgreSQL runs under. PostgreSQL refuses to run as
// root, so when pgtenant runs as root it runs the server programs as the
// `postgres` OS user; otherwise as the current user (zero value).
type runAs struct {
	uid, gid uint32
	name     string
}

func (r runAs) isOther() bool { return r.name != "" }

// serverUser decides who runs PostgreSQL.
func serverUser() (runAs, error) {
	if os.Geteuid() != 0 {
		return runAs{}, nil
	}
	u, err := user.Lookup("postgres")
	if err != nil {
		return runAs{}, fmt.Errorf("running as root: PostgreSQL refuses to run as root and there is no `postgres` OS user to run it as; " +
			"create one (useradd --system --home-dir /var/lib/postgresql postgres) or run pgtenant as a normal user")
	}
	uid, _ := strconv.ParseUint(u.Uid, 10, 32)
	gid, _ := strconv.ParseUint(u.Gid, 10, 32)
	return runAs{uid: uint32(uid), gid: uint32(gid), name: "postgres"}, nil
}

// command builds an exec.Cmd that runs as the server user, in its own process
// group so that a terminal's Ctrl-C reaches pgtenant only (pgtenant stops the
// servers itself, in order).
func (r runAs) command(name string, args ...string) *exec.Cmd {
	raiseFileLimit()
	cmd := exec.Command(name, args...)
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if r.isOther() {
		cmd.SysProcAttr.Credential = &syscall.Credential{Uid: r.uid, Gid: r.gid}
	}
	// A stable environment: no inherited PG* variables, C messages so errors parse.
	cmd.Env = []string{"PATH=/usr/bin:/bin", "LC_ALL=C", "LANG=C"}
	if home, err := os.UserHomeDir(); err == nil && !r.isOther() {
		cmd.Env = append(cmd.Env, "HOME="+home)
	}
	return cmd
}

// own makes path (recursively) owned by the server user and lets it traverse
// every parent up to stop, so that a root-owned data dir works.
func (r runAs) own(path string) error {
	if !r.isOther() {
		return nil
	}
	return filepath.WalkDir(path, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		return os.Lchown(p, int(r.uid), int(r.gid))
	})
}

// checkTraversable makes sure the server user can reach dir: every parent
// must be searchable by others. It does not chmod directories it does not own
// (e.g. /root); it says what to do instead.
func (r runAs) checkTraversable(dir string) error {
	if !r.isOther() {
		return nil
	}
	abs, err := filepath.Abs(dir)
	if err != nil {
		return err
	}
	for p := filepath.Dir(abs); p != "/"; p = filepath.Dir(p) {
		fi, err := os.Stat(p)
		if err != nil {
			return err
		}
		if fi.Mode().Perm()&0o001 == 0 {
			return fmt.Errorf("the postgres OS user cannot reach %s because %s is not searchable by others (mode %v); "+
				"run `chmod o+x %s` or choose a --data-dir outside it", abs, p, fi.Mode().Perm(), p)
		}
	}
	return nil
}

// raiseFileLimit lifts this process's soft limit on open files to its hard
// limit, once, so that the servers it starts inherit it: a tenant fleet
// opens many relation files (up to max_files_per_process per backend), and
// a login session's soft limit is often 1,024. Setting it explicitly also
// stops Go from handing child processes the original soft limit back.
var raiseFileLimit = sync.OnceFunc(func() {
	var l syscall.Rlimit
	if syscall.Getrlimit(syscall.RLIMIT_NOFILE, &l) == nil && l.Cur < l.Max {
		l.Cur = l.Max
		_ = syscall.Setrlimit(syscall.RLIMIT_NOFILE, &l)
	}
})

// OSUser is who runs the programs pgtenant starts next to the servers (the
// PgBouncer of internal/pooler): the postgres OS user when pgtenant runs as
// root (PgBouncer, like PostgreSQL, refuses to run as root), else the
// current user.
type OSUser struct{ r runAs }

// ServerUser returns the OS user the servers run as.
func ServerUser() (OSUser, error) {
	r, err := serverUser()
	return OSUser{r}, err
}

// IsOther reports whether programs run as another user than pgtenant's.
func (u OSUser) IsOther() bool { return u.r.isOther() }

// Command builds an exec.Cmd running as u, in its own process group, with
// the soft open-file limit raised to the hard one and a stable environment.
func (u OSUser) Command(name string, args ...string) *exec.Cmd { return u.r.command(name, args...) }

// Own makes path (recursively) owned by u; a no-op when u is the current user.
func (u OSUser) Own(path string) error { return u.r.own(path) }

// CheckTraversable says what to do when u cannot reach dir.
func (u OSUser) CheckTraversable(dir string) error { return u.r.checkTraversable(dir) }
