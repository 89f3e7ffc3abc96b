package bench

import (
	"bufio"
	"context"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"time"

	"github.com/pgtenant/pgtenant/internal/api"
)

// daemonProc is a `pgtenant serve` process.
type daemonProc struct {
	cmd    *exec.Cmd
	addr   string
	client *api.Client
	done   chan error
}

// startDaemon runs `binary serve --config cfg` and waits for it to listen.
func startDaemon(ctx context.Context, binary, cfgPath, tokenFile, logPath string) (*daemonProc, error) {
	logf, err := os.OpenFile(logPath, os.O_CREATE|os.O_APPEND|os.O_WRONLY, 0o600)
	if err != nil {
		return nil, err
	}
	cmd := exec.Command(binary, "serve", "--config", cfgPath)
	cmd.Stderr = logf
	out, err := cmd.StdoutPipe()
	if err != nil {
		logf.Close()
		return nil, err
	}
	if err := cmd.Start(); err != nil {
		logf.Close()
		return nil, err
	}
	p := &daemonProc{cmd: cmd, done: make(chan error, 1)}
	lines := make(chan string, 1)
	go func() {
		sc := bufio.NewScanner(out)
		if sc.Scan() {
			lines <- sc.Text()
		}
		close(lines)
		for sc.Scan() {
		}
	}()
	go func() { p.done <- cmd.Wait(); logf.Close() }()
	select {
	case line, ok := <-lines:
		addr, found := strings.CutPrefix(line, "pgtenant serving on ")
		if !ok || !found {
			p.kill()
			return nil, fmt.Errorf("daemon did not start (see %s): %q", logPath, line)
		}
		p.addr = strings.Fields(addr)[0]
	case <-time.After(time.Minute):
		p.kill()
		return nil, fmt.Errorf("daemon did not start within a minute (see %s)", logPath)
	case <-ctx.Done():
		p.kill()
		return nil, ctx.Err()
	}
	tok, err := os.ReadFile(tokenFile)
	if err != nil {
		p.kill()
		return nil, err
	}
	p.client = api.NewClient(p.addr, strings.TrimSpace(string(tok)))
	p.client.HTTP.Timeout = 30 * time.Second
	return p, nil
}

// kill sends SIGKILL and waits for the process to end.
func (p *daemonProc) kill() {
	_ = p.cmd.Process.Signal(syscall.SIGKILL)
	<-p.done
}

// stop sends SIGTERM and waits.
func (p *daemonProc) stop() error {
	_ = p.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case err := <-p.done:
		return err
	case <-time.After(time.Minute):
		p.kill()
		return fmt.Errorf("daemon did not stop on SIGTERM")
	}
}
