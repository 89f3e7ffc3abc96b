package pooler

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/pgtenant/pgtenant/internal/fleet"
	"github.com/pgtenant/pgtenant/internal/tenant"
)

// FindBinary returns the pgbouncer program: on PATH, else where Debian
// puts it.
func FindBinary() (string, error) {
	if p, err := exec.LookPath("pgbouncer"); err == nil {
		return p, nil
	}
	for _, p := range []string{"/usr/sbin/pgbouncer", "/usr/bin/pgbouncer", "/usr/local/bin/pgbouncer"} {
		if fi, err := os.Stat(p); err == nil && !fi.IsDir() {
			return p, nil
		}
	}
	return "", errors.New("pgbouncer not found (on PATH, /usr/sbin, /usr/bin): install it (apt-get install -y pgbouncer); " +
		"the Debian service it comes with is not needed: pgtenant runs its own")
}

// Process is one PgBouncer that pgtenant runs, with its files in Dir (made
// 0700 and owned by the OS user that runs it).
type Process struct {
	Dir  string
	Bin  string
	User fleet.OSUser
}

// NewProcess prepares dir (created if missing) for a PgBouncer run as the
// servers' OS user.
func NewProcess(dir string) (*Process, error) {
	bin, err := FindBinary()
	if err != nil {
		return nil, err
	}
	user, err := fleet.ServerUser()
	if err != nil {
		return nil, err
	}
	dir, err = filepath.Abs(dir)
	if err != nil {
		return nil, err
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("create pooler dir: %w", err)
	}
	if err := user.CheckTraversable(dir); err != nil {
		return nil, err
	}
	if err := user.Own(dir); err != nil {
		return nil, err
	}
	return &Process{Dir: dir, Bin: bin, User: user}, nil
}

func (p *Process) path(name string) string { return filepath.Join(p.Dir, name) }

// LogPath is PgBouncer's log file.
func (p *Process) LogPath() string { return p.path(logFile) }

// ConfigPath is the pgbouncer.ini pgtenant writes.
func (p *Process) ConfigPath() string { return p.path(configFile) }

// AdminPassword returns the admin console's password, made (random, 0600,
// readable by pgtenant only: PgBouncer gets its verifier) on first use.
func (p *Process) AdminPassword() (string, error) {
	return fleet.PasswordFile(p.path(adminFile), "the pooler's admin password")
}

// AdminVerifier is the SCRAM verifier of password with a salt derived from
// the pooler dir, so that the auth file stays the same from one sync to the
// next (a changed file costs a RELOAD).
func AdminVerifier(password, dir string) string {
	salt := []byte(("pgtenant pooler salt " + dir + "                ")[:16])
	return tenant.SCRAMVerifier(password, salt, 4096)
}

// Write writes the files that differ from what is on disk, each atomically
// (a temp file renamed over it), auth and HBA files before the config. It
// reports whether any changed.
func (p *Process) Write(f Files) (bool, error) {
	changed := false
	for _, w := range []struct {
		name string
		b    []byte
	}{{authFile, f.Auth}, {hbaFile, f.HBA}, {configFile, f.Config}} {
		cur, err := os.ReadFile(p.path(w.name))
		if err == nil && bytes.Equal(cur, w.b) {
			continue
		}
		tmp := p.path("." + w.name + ".tmp")
		if err := os.WriteFile(tmp, w.b, 0o600); err != nil {
			return changed, fmt.Errorf("write %s: %w", w.name, err)
		}
		if err := p.User.Own(tmp); err != nil {
			return changed, err
		}
		if err := os.Rename(tmp, p.path(w.name)); err != nil {
			return changed, fmt.Errorf("write %s: %w", w.name, err)
		}
		changed = true
	}
	return changed, nil
}

// Read returns the files on disk.
func (p *Process) Read() (Files, error) {
	var f Files
	var err error
	if f.Config, err = os.ReadFile(p.path(configFile)); err != nil {
		return f, err
	}
	if f.Auth, err = os.ReadFile(p.path(authFile)); err != nil {
		return f, err
	}
	f.HBA, err = os.ReadFile(p.path(hbaFile))
	return f, err
}

// PID returns the pid of the PgBouncer running on Dir, or 0: the pid file's
// process must be alive and be a pgbouncer.
func (p *Process) PID() int {
	b, err := os.ReadFile(p.path(pidFile))
	if err != nil {
		return 0
	}
	pid, err := strconv.Atoi(strings.TrimSpace(string(b)))
	if err != nil || pid <= 0 {
		return 0
	}
	cmd, err := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
	if err != nil || !bytes.Contains(cmd, []byte("pgbouncer")) || !bytes.Contains(cmd, []byte(p.path(configFile))) {
		return 0
	}
	return pid
}

// Running reports whether the PgBouncer of Dir runs.
func (p *Process) Running() bool { return p.PID() != 0 }

// Start starts PgBouncer on the files in Dir (written first by the caller)
// unless it runs already, and waits until it accepts connections on addr.
func (p *Process) Start(ctx context.Context, addr string) error {
	if p.Running() {
		return nil
	}
	if l, err := net.Listen("tcp", addr); err != nil {
		return fmt.Errorf("start pgbouncer: %s is taken by another process: %w", addr, err)
	} else {
		l.Close()
	}
	_ = os.Remove(p.path(pidFile)) // left by a killed pgbouncer; -d refuses to start over it
	logStart := fileSize(p.LogPath())
	cmd := p.User.Command(p.Bin, "-d", p.path(configFile))
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Run(); err != nil {
		return fmt.Errorf("start pgbouncer: %w: %s%s", err, strings.TrimSpace(out.String()), p.logSince(logStart))
	}
	deadline := time.Now().Add(10 * time.Second)
	for {
		if ctx.Err() != nil {
			return errors.Join(ctx.Err(), p.undoStart())
		}
		if p.Running() {
			if c, err := net.DialTimeout("tcp", addr, time.Second); err == nil {
				c.Close()
				return nil
			}
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("start pgbouncer: not accepting connections on %s after 10 s%s", addr, p.logSince(logStart))
		}
		select {
		case <-ctx.Done():
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// undoStart stops a PgBouncer whose start was given up (its caller is
// stopping): pgbouncer -d forks and the child writes its pid file a moment
// later, so a Stop right away would find no pid and leave it running,
// listening, with nobody to stop it.
func (p *Process) undoStart() error {
	for i := 0; i < 40 && !p.Running(); i++ {
		time.Sleep(50 * time.Millisecond)
	}
	return p.Stop()
}

// Stop stops the PgBouncer of Dir (SIGTERM: immediate shutdown, clients
// disconnected), waiting at most 10 s before SIGKILL.
func (p *Process) Stop() error {
	pid := p.PID()
	if pid == 0 {
		return nil
	}
	if err := syscall.Kill(pid, syscall.SIGTERM); err != nil {
		return fmt.Errorf("stop pgbouncer (pid %d): %w", pid, err)
	}
	for i := 0; i < 200; i++ {
		if p.PID() == 0 || syscall.Kill(pid, 0) != nil {
			return nil
		}
		time.Sleep(50 * time.Millisecond)
	}
	_ = syscall.Kill(pid, syscall.SIGKILL)
	return nil
}

func fileSize(path string) int64 {
	fi, err := os.Stat(path)
	if err != nil {
		return 0
	}
	return fi.Size()
}

// logSince returns what PgBouncer logged since offset (at most 2 KB).
func (p *Process) logSince(offset int64) string {
	b, err := os.ReadFile(p.LogPath())
	if err != nil || int64(len(b)) <= offset {
		return ""
	}
	b = b[offset:]
	if len(b) > 2048 {
		b = b[len(b)-2048:]
	}
	return "\n" + strings.TrimSpace(string(b))
}

// localState is what a pooler pgtenant runs for `up` keeps in its dir.
type localState struct {
	Port int `json:"port"`
}

// LocalPort returns the port recorded in dir, or picks a free loopback
// port and records it: `up` gives its pooler the same port on every start.
func LocalPort(dir string) (int, error) {
	path := filepath.Join(dir, stateFile)
	var st localState
	if b, err := os.ReadFile(path); err == nil {
		if err := json.Unmarshal(b, &st); err != nil {
			return 0, fmt.Errorf("read %s: %w", path, err)
		}
		if st.Port > 0 {
			return st.Port, nil
		}
	}
	port, err := fleet.FreePort()
	if err != nil {
		return 0, err
	}
	st.Port = port
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return 0, err
	}
	b, _ := json.Marshal(st)
	if err := os.WriteFile(path, b, 0o600); err != nil {
		return 0, err
	}
	return st.Port, nil
}
