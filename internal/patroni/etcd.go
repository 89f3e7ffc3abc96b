package patroni

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/pgtenant/pgtenant/internal/fleet"
)

// EtcdOptions describe one etcd member, part of the store Patroni keeps its
// leader lock and the cluster's state in.
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

// Etcd is a running etcd member, a child process of the caller.
type Etcd struct {
	opts EtcdOptions
	// initialCluster and token are the flags of its bootstrap (every
	// member's name=peer URL), given again at each start.
	initialCluster, token string
	proc                  *process
	log                   *slog.Logger
}

// StartEtcd starts a one-member etcd and waits until it answers its health
// endpoint. Only the v3 API is served: Patroni's `etcd3:` section talks to
// the v3 gRPC gateway (JSON over HTTP), so etcd 3.4's v2 API (off by
// default, --enable-v2) is not needed.
func StartEtcd(ctx context.Context, opts EtcdOptions) (*Etcd, error) {
	e, err := newEtcd(opts)
	if err != nil {
		return nil, err
	}
	e.initialCluster, e.token = e.opts.Name+"="+e.peerURL(), e.opts.Name
	if err := e.start(); err != nil {
		return nil, err
	}
	if err := e.waitHealthy(ctx); err != nil {
		e.kill()
		return nil, err
	}
	return e, nil
}

// newEtcd settles the member's ports (kept in Dir/ports.json) and makes
// its dir. It starts nothing.
func newEtcd(opts EtcdOptions) (*Etcd, error) {
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
		if opts.ClientPort, err = fleet.FreePort(); err != nil {
			return nil, err
		}
	}
	if opts.PeerPort == 0 {
		if opts.PeerPort, err = fleet.FreePort(); err != nil {
			return nil, err
		}
	}
	if err := os.MkdirAll(opts.Dir, 0o755); err != nil {
		return nil, fmt.Errorf("create etcd dir: %w", err)
	}
	if b, err := json.Marshal(etcdPorts{Client: opts.ClientPort, Peer: opts.PeerPort}); err == nil {
		if err := os.WriteFile(portsPath, b, 0o644); err != nil {
			return nil, fmt.Errorf("etcd: %w", err)
		}
	}
	return &Etcd{opts: opts, log: cmp.Or(opts.Logger, slog.New(slog.DiscardHandler)).With("component", "etcd", "member", opts.Name)}, nil
}

func (e *Etcd) peerURL() string { return "http://127.0.0.1:" + strconv.Itoa(e.opts.PeerPort) }

// start starts the member's process; it does not wait for it to serve. The
// initial cluster is etcd's bootstrap: "new" the first time, "existing"
// once the member's data dir holds its membership (etcd then reads the
// members from there and ignores the flag, but a member made again from
// an empty data dir must not bootstrap a cluster of its own).
func (e *Etcd) start() error {
	if e.proc != nil && !e.proc.exited() {
		return fmt.Errorf("start etcd %s: already running", e.opts.Name)
	}
	program, err := exec.LookPath("etcd")
	if err != nil {
		return fmt.Errorf("etcd is not installed (apt-get install etcd-server): %w", err)
	}
	state := "new"
	if _, err := os.Stat(filepath.Join(e.opts.Dir, "data", "member")); err == nil {
		state = "existing"
	}
	client := "http://" + e.Endpoint()
	cmd := exec.Command(program,
		"--name", e.opts.Name,
		"--data-dir", filepath.Join(e.opts.Dir, "data"),
		"--listen-client-urls", client,
		"--advertise-client-urls", client,
		"--listen-peer-urls", e.peerURL(),
		"--initial-advertise-peer-urls", e.peerURL(),
		"--initial-cluster", e.initialCluster,
		"--initial-cluster-state", state,
		"--initial-cluster-token", e.token,
	)
	// A stable environment: no inherited ETCD* variables override the flags.
	cmd.Env = []string{"PATH=/usr/bin:/bin", "LC_ALL=C", "LANG=C"}
	proc, err := startProcess(cmd, e.LogPath())
	if err != nil {
		return fmt.Errorf("start etcd %s: %w", e.opts.Name, err)
	}
	e.proc = proc
	e.log.Info("etcd started", "endpoint", e.Endpoint(), "pid", cmd.Process.Pid)
	return nil
}

// waitHealthy polls GET /health until etcd says {"health":"true"}: the
// member serves, and its cluster has a leader (a quorum of members).
func (e *Etcd) waitHealthy(ctx context.Context) error {
	hc := &http.Client{Timeout: 2 * time.Second}
	for {
		if e.proc.exited() {
			return fmt.Errorf("etcd %s exited: %v: %s", e.opts.Name, e.proc.err, e.proc.tail())
		}
		if healthy(ctx, hc, "http://"+e.Endpoint()+"/health") {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("wait for etcd %s to be healthy: %w: %s", e.opts.Name, ctx.Err(), e.proc.tail())
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

// LogPath is the member's log, Dir/etcd.log.
func (e *Etcd) LogPath() string { return filepath.Join(e.opts.Dir, "etcd.log") }

// Done is closed when the etcd process has exited, asked to or not: a
// supervisor restarts it (same options, same data dir).
func (e *Etcd) Done() <-chan struct{} { return e.proc.done }

// Stop asks etcd to exit (SIGTERM) and waits; when ctx ends first it kills
// it. Stopping an exited etcd is a no-op.
func (e *Etcd) Stop(ctx context.Context) error {
	if e.proc == nil || e.proc.exited() {
		return nil
	}
	if err := e.proc.stop(ctx, syscall.SIGTERM); err != nil {
		return fmt.Errorf("stop etcd %s: %w", e.opts.Name, err)
	}
	e.log.Info("etcd stopped")
	return nil
}

// kill stops a member that did not come up, within 10 s.
func (e *Etcd) kill() {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	_ = e.Stop(ctx)
}

// EtcdClusterOptions describe the etcd of one data dir: 1 or 3 members on
// loopback ports.
type EtcdClusterOptions struct {
	// Dir holds the members and Dir/members.json, their count. One member
	// lives in Dir itself (Dir/data, Dir/ports.json, Dir/etcd.log: the
	// layout of the one-member etcd made before members.json), three in
	// Dir/e1, Dir/e2 and Dir/e3.
	Dir string
	// Members is 1 or 3; 0 takes what Dir has (1 for a new Dir). A Dir
	// made with another count is refused: etcd fixes its members when
	// it bootstraps.
	Members int
	Logger  *slog.Logger
}

// etcdMembersFile is Dir/members.json.
type etcdMembersFile struct {
	Members int `json:"members"`
}

// EtcdMembers is how many members the etcd in dir has: its members.json,
// 1 for a one-member etcd made before it, 0 when dir holds none yet.
func EtcdMembers(dir string) (int, error) {
	b, err := os.ReadFile(filepath.Join(dir, "members.json"))
	switch {
	case err == nil:
		var m etcdMembersFile
		if err := json.Unmarshal(b, &m); err != nil || (m.Members != 1 && m.Members != 3) {
			return 0, fmt.Errorf("etcd: %s: want {\"members\": 1} or 3 (%v)", filepath.Join(dir, "members.json"), err)
		}
		return m.Members, nil
	case !errors.Is(err, os.ErrNotExist):
		return 0, fmt.Errorf("etcd: %w", err)
	}
	if _, err := os.Stat(filepath.Join(dir, "ports.json")); err == nil {
		return 1, nil
	}
	return 0, nil
}

// EtcdCluster is the running members of one data dir's etcd.
type EtcdCluster struct {
	Members []*Etcd
}

// StartEtcdCluster starts the members (made the first time, with an
// initial cluster of them all) and waits until each answers its health
// endpoint, which it does once a quorum of members has a leader: all are
// started before any is waited for.
func StartEtcdCluster(ctx context.Context, opts EtcdClusterOptions) (*EtcdCluster, error) {
	have, err := EtcdMembers(opts.Dir)
	if err != nil {
		return nil, err
	}
	n := cmp.Or(opts.Members, have, 1)
	switch {
	case n != 1 && n != 3:
		return nil, fmt.Errorf("etcd: %d members: want 1 or 3", n)
	case have != 0 && have != n:
		return nil, fmt.Errorf("etcd in %s has %d members, not %d: a member count is fixed when the etcd is made", opts.Dir, have, n)
	}
	for attempt := 1; ; attempt++ {
		c, err := startEtcdMembers(ctx, opts, n)
		if err == nil || have != 0 || attempt == 3 || !strings.Contains(err.Error(), "address already in use") {
			return c, err
		}
		// A port found free was taken by another process before etcd bound
		// it. The etcd is new (nothing in it yet): made again on other ports.
		if opts.Logger != nil {
			opts.Logger.Warn("etcd: a port was taken before etcd bound it; making it again on other ports", "err", err)
		}
		if err := os.RemoveAll(opts.Dir); err != nil {
			return nil, fmt.Errorf("etcd: %w", err)
		}
	}
}

// startEtcdMembers starts the n members of the etcd in opts.Dir.
func startEtcdMembers(ctx context.Context, opts EtcdClusterOptions, n int) (*EtcdCluster, error) {
	if err := os.MkdirAll(opts.Dir, 0o755); err != nil {
		return nil, fmt.Errorf("create etcd dir: %w", err)
	}
	if b, err := json.Marshal(etcdMembersFile{Members: n}); err == nil {
		if err := os.WriteFile(filepath.Join(opts.Dir, "members.json"), b, 0o644); err != nil {
			return nil, fmt.Errorf("etcd: %w", err)
		}
	}
	c := &EtcdCluster{}
	var peers []string
	for i := range n {
		mo := EtcdOptions{Dir: opts.Dir, Name: "etcd", Logger: opts.Logger}
		if n > 1 {
			mo.Name = "e" + strconv.Itoa(i+1)
			mo.Dir = filepath.Join(opts.Dir, mo.Name)
		}
		e, err := newEtcd(mo)
		if err != nil {
			return nil, err
		}
		c.Members = append(c.Members, e)
		peers = append(peers, e.opts.Name+"="+e.peerURL())
	}
	for _, e := range c.Members {
		// The token of the one-member etcd of before is its name, "etcd":
		// the same for every count.
		e.initialCluster, e.token = strings.Join(peers, ","), "etcd"
		if err := e.start(); err != nil {
			c.kill()
			return nil, err
		}
	}
	for _, e := range c.Members {
		if err := e.waitHealthy(ctx); err != nil {
			c.kill()
			return nil, err
		}
	}
	return c, nil
}

// Endpoints are the members' client endpoints, host:port, as Patroni's
// `etcd3.hosts` takes them.
func (c *EtcdCluster) Endpoints() []string {
	out := make([]string, len(c.Members))
	for i, e := range c.Members {
		out[i] = e.Endpoint()
	}
	return out
}

// Stop stops the members one after the other, each in a few ms. (Not all
// at once: a leader asked to stop first hands its leadership to a follower,
// and one that is stopping too keeps it waiting several seconds; 7 s for
// three members here.)
func (c *EtcdCluster) Stop(ctx context.Context) error {
	var errs []error
	for _, e := range c.Members {
		errs = append(errs, e.Stop(ctx))
	}
	return errors.Join(errs...)
}

// kill stops members that did not come up, within 10 s.
func (c *EtcdCluster) kill() {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	_ = c.Stop(ctx)
}

// member is the member called name, nil when there is none.
func (c *EtcdCluster) member(name string) *Etcd {
	for _, e := range c.Members {
		if e.opts.Name == name {
			return e
		}
	}
	return nil
}

// Name, SupervisedNodes, Running, StartNode and LogHint let a
// fleet.Supervisor keep the members running, as it keeps the Patroni
// nodes: a member that died is started again on its data dir, and
// rejoins the others.
func (c *EtcdCluster) Name() string { return "etcd" }

func (c *EtcdCluster) SupervisedNodes() []string {
	names := make([]string, len(c.Members))
	for i, e := range c.Members {
		names[i] = e.opts.Name
	}
	return names
}

// Running reports whether the member's process runs.
func (c *EtcdCluster) Running(name string) bool {
	e := c.member(name)
	return e != nil && e.proc != nil && !e.proc.exited()
}

// StartNode starts the member again and waits (a minute at most) until it
// is healthy; one that is not then is stopped, for a later attempt.
func (c *EtcdCluster) StartNode(ctx context.Context, name string) error {
	e := c.member(name)
	if e == nil {
		return fmt.Errorf("etcd has no member %s", name)
	}
	if err := e.start(); err != nil {
		return err
	}
	wctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	if err := e.waitHealthy(wctx); err != nil {
		e.kill()
		return err
	}
	return nil
}

// LogHint names the member's log.
func (c *EtcdCluster) LogHint(name string) string {
	if e := c.member(name); e != nil {
		return e.LogPath()
	}
	return name
}

// DeletePrefix deletes every key under prefix from the store at endpoints
// (etcd client endpoints, host:port; the first that answers), through
// etcd's v3 JSON gateway, and returns how many it deleted.
func DeletePrefix(ctx context.Context, endpoints []string, prefix string) (int64, error) {
	if prefix == "" {
		return 0, errors.New("etcd: refusing to delete every key (empty prefix)")
	}
	// The range [prefix, prefix with its last byte + 1) is every key that
	// starts with prefix.
	end := []byte(prefix)
	end[len(end)-1]++
	body, err := json.Marshal(map[string][]byte{"key": []byte(prefix), "range_end": end})
	if err != nil {
		return 0, err
	}
	hc := &http.Client{Timeout: 5 * time.Second}
	var errs []error
	for _, ep := range endpoints {
		req, err := http.NewRequestWithContext(ctx, http.MethodPost, "http://"+ep+"/v3/kv/deleterange", strings.NewReader(string(body)))
		if err != nil {
			return 0, err
		}
		resp, err := hc.Do(req)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		var out struct {
			Deleted string `json:"deleted"` // int64s are strings in the gateway's JSON
			Error   string `json:"error"`
		}
		err = json.NewDecoder(resp.Body).Decode(&out)
		resp.Body.Close()
		if err == nil && resp.StatusCode != http.StatusOK {
			err = fmt.Errorf("%s: %s", resp.Status, out.Error)
		}
		if err != nil {
			errs = append(errs, fmt.Errorf("etcd %s: delete %s: %w", ep, prefix, err))
			continue
		}
		n, _ := strconv.ParseInt(cmp.Or(out.Deleted, "0"), 10, 64)
		return n, nil
	}
	return 0, errors.Join(errs...)
}
