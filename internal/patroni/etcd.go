package patroni

import (
	"cmp"
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"syscall"
	"time"
)

// EtcdOptions describe a one-member etcd, the store Patroni keeps its leader
// lock and the cluster's state in.
type EtcdOptions struct {
	// Dir holds the member's data dir (Dir/data) and its log (Dir/etcd.log).
	Dir string
	// Name is the member's name; default "etcd".
	Name string
	// ClientPort and PeerPort are loopback ports; 0 takes the ones the
	// member had (Dir/ports.json: its data dir records its peer address),
	// or picks free ones the first time.
	ClientPort, PeerPort int
	Logger               *slog.Logger
}

// etcdPorts is Dir/ports.json.
type etcdPorts struct {
	Client int `json:"client"`
	Peer   int `json:"peer"`
}

// Etcd is a running one-member etcd, a child process of the caller.
type Etcd struct {
	opts EtcdOptions
	proc *process
	log  *slog.Logger
}

// StartEtcd starts a one-member etcd and waits until it answers its health
// endpoint. Only the v3 API is served: Patroni's `etcd3:` section talks to
// the v3 gRPC gateway (JSON over HTTP), so etcd 3.4's v2 API (off by
// default, --enable-v2) is not needed.
func StartEtcd(ctx context.Context, opts EtcdOptions) (*Etcd, error) {
	opts.Name = cmp.Or(opts.Name, "etcd")
	portsPath := filepath.Join(opts.Dir, "ports.json")
	if opts.ClientPort == 0 && opts.PeerPort == 0 {
		if b, err := os.ReadFile(portsPath); err == nil {
			var kept etcdPorts
			if json.Unmarshal(b, &kept) == nil {
				opts.ClientPort, opts.PeerPort = kept.Client, kept.Peer
			}
		}
	}
	var err error
	if opts.ClientPort == 0 {
		if opts.ClientPort, err = freePort(); err != nil {
			return nil, err
		}
	}
	if opts.PeerPort == 0 {
		if opts.PeerPort, err = freePort(); err != nil {
			return nil, err
		}
	}
	program, err := exec.LookPath("etcd")
	if err != nil {
		return nil, fmt.Errorf("etcd is not installed (apt-get install etcd-server): %w", err)
	}
	if err := os.MkdirAll(opts.Dir, 0o755); err != nil {
		return nil, fmt.Errorf("create etcd dir: %w", err)
	}
	if b, err := json.Marshal(etcdPorts{Client: opts.ClientPort, Peer: opts.PeerPort}); err == nil {
		if err := os.WriteFile(portsPath, b, 0o644); err != nil {
			return nil, fmt.Errorf("etcd: %w", err)
		}
	}
	client := "http://127.0.0.1:" + strconv.Itoa(opts.ClientPort)
	peer := "http://127.0.0.1:" + strconv.Itoa(opts.PeerPort)
	cmd := exec.Command(program,
		"--name", opts.Name,
		"--data-dir", filepath.Join(opts.Dir, "data"),
		"--listen-client-urls", client,
		"--advertise-client-urls", client,
		"--listen-peer-urls", peer,
		"--initial-advertise-peer-urls", peer,
		"--initial-cluster", opts.Name+"="+peer,
		"--initial-cluster-state", "new",
		"--initial-cluster-token", opts.Name,
	)
	// A stable environment: no inherited ETCD* variables override the flags.
	cmd.Env = []string{"PATH=/usr/bin:/bin", "LC_ALL=C", "LANG=C"}
	proc, err := startProcess(cmd, filepath.Join(opts.Dir, "etcd.log"))
	if err != nil {
		return nil, fmt.Errorf("start etcd: %w", err)
	}
	e := &Etcd{opts: opts, proc: proc, log: cmp.Or(opts.Logger, slog.New(slog.DiscardHandler)).With("component", "etcd")}
	if err := e.waitHealthy(ctx); err != nil {
		stopCtx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_ = e.Stop(stopCtx)
		return nil, err
	}
	e.log.Info("etcd started", "endpoint", e.Endpoint(), "pid", cmd.Process.Pid)
	return e, nil
}

// waitHealthy polls GET /health until etcd says {"health":"true"}.
func (e *Etcd) waitHealthy(ctx context.Context) error {
	hc := &http.Client{Timeout: 2 * time.Second}
	for {
		if e.proc.exited() {
			return fmt.Errorf("etcd exited: %v: %s", e.proc.err, e.proc.tail())
		}
		if healthy(ctx, hc, "http://"+e.Endpoint()+"/health") {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("wait for etcd to be healthy: %w: %s", ctx.Err(), e.proc.tail())
		case <-time.After(100 * time.Millisecond):
		}
	}
}

func healthy(ctx context.Context, hc *http.Client, url string) bool {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return false
	}
	resp, err := hc.Do(req)
	if err != nil {
		return false
	}
	defer resp.Body.Close()
	var h struct {
		Health string `json:"health"`
	}
	return resp.StatusCode == http.StatusOK && json.NewDecoder(resp.Body).Decode(&h) == nil && h.Health == "true"
}

// Endpoint is the client endpoint, host:port, as Patroni's `etcd3.hosts`
// takes it.
func (e *Etcd) Endpoint() string { return "127.0.0.1:" + strconv.Itoa(e.opts.ClientPort) }

// Done is closed when the etcd process has exited, asked to or not: a
// supervisor restarts it (same options, same data dir).
func (e *Etcd) Done() <-chan struct{} { return e.proc.done }

// Stop asks etcd to exit (SIGTERM) and waits; when ctx ends first it kills
// it. Stopping an exited etcd is a no-op.
func (e *Etcd) Stop(ctx context.Context) error {
	if e.proc.exited() {
		return nil
	}
	if err := e.proc.stop(ctx, syscall.SIGTERM); err != nil {
		return fmt.Errorf("stop etcd: %w", err)
	}
	e.log.Info("etcd stopped")
	return nil
}
