package patroni

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// process is a supervised child (etcd or Patroni) in its own process group,
// its output appended to a log file.
type process struct {
	cmd     *exec.Cmd
	logPath string
	done    chan struct{}
	err     error // why it exited; read only after done is closed
}

// startProcess starts cmd with its stdout and stderr appended to logPath.
// cmd must run in its own process group (Setpgid) so that stop and kill
// reach the whole group and a terminal's Ctrl-C reaches pgtenant only.
func startProcess(cmd *exec.Cmd, logPath string) (*process, error) {
	f, err := os.OpenFile(logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return nil, err
	}
	cmd.Stdout, cmd.Stderr = f, f
	if cmd.SysProcAttr == nil {
		cmd.SysProcAttr = &syscall.SysProcAttr{}
	}
	cmd.SysProcAttr.Setpgid = true
	if err := cmd.Start(); err != nil {
		f.Close()
		return nil, err
	}
	p := &process{cmd: cmd, logPath: logPath, done: make(chan struct{})}
	go func() {
		p.err = cmd.Wait()
		f.Close()
		close(p.done)
	}()
	return p, nil
}

// exited reports whether the process has ended.
func (p *process) exited() bool {
	select {
	case <-p.done:
		return true
	default:
		return false
	}
}

// signal sends sig to the process's group.
func (p *process) signal(sig syscall.Signal) {
	_ = syscall.Kill(-p.cmd.Process.Pid, sig)
}

// stop sends sig and waits for the exit; when ctx ends first, it kills the
// group and waits for that.
func (p *process) stop(ctx context.Context, sig syscall.Signal) error {
	p.signal(sig)
	select {
	case <-p.done:
		return nil
	case <-ctx.Done():
		p.kill()
		return fmt.Errorf("did not exit in time, killed: %w", ctx.Err())
	}
}

// kill sends SIGKILL to the group and waits for the exit.
func (p *process) kill() {
	p.signal(syscall.SIGKILL)
	<-p.done
}

// tail is the end of the process's log, for an error message.
func (p *process) tail() string { return tailFile(p.logPath, 2000) }

func tailFile(path string, n int64) string {
	b, err := os.ReadFile(path)
	if err != nil {
		return ""
	}
	if int64(len(b)) > n {
		b = b[int64(len(b))-n:]
	}
	return strings.TrimSpace(string(b))
}

// postmasterPID is the pid of the postmaster running on dataDir, or 0 when
// none runs (no postmaster.pid, or a stale one left by a killed server).
func postmasterPID(dataDir string) int {
	b, err := os.ReadFile(filepath.Join(dataDir, "postmaster.pid"))
	if err != nil {
		return 0
	}
	first, _, _ := strings.Cut(string(b), "\n")
	pid, err := strconv.Atoi(strings.TrimSpace(first))
	if err != nil || pid <= 0 {
		return 0
	}
	// A stale file may name a pid reused by another program: check that it
	// is a postgres process.
	cmdline, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/cmdline")
	if err != nil || !strings.Contains(string(cmdline), "postgres") {
		return 0
	}
	return pid
}

// waitGone waits until pid no longer exists or ctx ends.
func waitGone(ctx context.Context, pid int) error {
	for {
		if err := syscall.Kill(pid, 0); errors.Is(err, syscall.ESRCH) {
			return nil
		}
		// A zombie (the postmaster is Patroni's grandchild, reaped by init)
		// still answers kill 0; its /proc state says Z.
		if st, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat"); err != nil || zombie(string(st)) {
			return nil
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// zombie reports whether a /proc/PID/stat line is of a zombie process.
func zombie(stat string) bool {
	i := strings.LastIndexByte(stat, ')')
	return i >= 0 && len(stat) > i+2 && stat[i+2] == 'Z'
}
