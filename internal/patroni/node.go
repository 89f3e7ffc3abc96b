package patroni

import (
	"cmp"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"syscall"
	"time"

	"go.yaml.in/yaml/v3"

	"github.com/pgtenant/pgtenant/internal/fleet"
)

// DefaultBinDir holds the PostgreSQL 15 server programs on Debian.
const DefaultBinDir = "/usr/lib/postgresql/15/bin"

// Settings are what every node of one cluster shares, written to the store
// once at bootstrap (Patroni's bootstrap.dcs).
type Settings struct {
	// TTL is how long the leader lock lives without renewal: after a node
	// loss the standby takes over once it expires, so it bounds the failover
	// time from below. Default 20 s.
	TTL time.Duration
	// LoopWait is the pause between two runs of Patroni's HA loop: the
	// leader renews its lock, a standby notices an expired one, once per
	// loop. Default 2 s, so that a standby notices an expired lock within
	// 2 s (Patroni's own default is 10 s).
	LoopWait time.Duration
	// RetryTimeout is how long Patroni retries the store and PostgreSQL
	// before giving up the leader role (demoting itself): default 5 s, long
	// enough for a brief stall of etcd or of the machine on a shared 2-core
	// box, short enough to fit Patroni's rule with TTL 20 s.
	RetryTimeout time.Duration
	// SynchronousMode has a commit acknowledged only once the synchronous
	// standby has it, and Patroni promotes only that standby: no
	// acknowledged write is lost by a failover. Default true. With the only
	// standby down the primary goes on accepting writes, unreplicated (see
	// docs/operations/failover.md) unless SynchronousModeStrict.
	SynchronousMode bool
	// SynchronousModeStrict keeps synchronous replication on with no
	// standby: writes then block until one is back. Default false.
	SynchronousModeStrict bool
	// Parameters are postgresql.conf settings over Patroni's, the same on
	// every node.
	Parameters map[string]string
}

// DefaultSettings are the settings for the fastest failover that is still
// safe on a shared machine (see the fields).
func DefaultSettings() Settings {
	return Settings{
		TTL:             20 * time.Second,
		LoopWait:        2 * time.Second,
		RetryTimeout:    5 * time.Second,
		SynchronousMode: true,
	}
}

// Validate checks Patroni's rule loop_wait + 2 × retry_timeout ≤ ttl: a
// leader that cannot reach the store must give up (after retry_timeout,
// twice: once for the store, once for PostgreSQL) within one loop before
// its lock expires and a standby is promoted, or two primaries could run.
func (s Settings) Validate() error {
	for _, f := range []struct {
		name string
		d    time.Duration
	}{{"ttl", s.TTL}, {"loop_wait", s.LoopWait}, {"retry_timeout", s.RetryTimeout}} {
		if f.d < time.Second || f.d%time.Second != 0 {
			return fmt.Errorf("patroni settings: %s must be a whole number of seconds ≥ 1s, not %v", f.name, f.d)
		}
	}
	if s.LoopWait+2*s.RetryTimeout > s.TTL {
		return fmt.Errorf("patroni settings: loop_wait (%v) + 2 × retry_timeout (%v) must not exceed ttl (%v)", s.LoopWait, s.RetryTimeout, s.TTL)
	}
	if s.SynchronousModeStrict && !s.SynchronousMode {
		return errors.New("patroni settings: synchronous_mode_strict needs synchronous_mode")
	}
	return nil
}

// Passwords are the cluster's PostgreSQL roles' passwords, the same on
// every node: Patroni creates the roles at bootstrap and uses them to
// manage, replicate and rewind.
type Passwords struct {
	Superuser   string // role postgres
	Replication string // role replicator: the standbys' streaming and pg_basebackup
	Rewind      string // role rewind: pg_rewind of an old primary
}

// NewPasswords generates random passwords.
func NewPasswords() (Passwords, error) {
	var p Passwords
	for _, s := range []*string{&p.Superuser, &p.Replication, &p.Rewind} {
		b := make([]byte, 16)
		if _, err := rand.Read(b); err != nil {
			return Passwords{}, fmt.Errorf("generate password: %w", err)
		}
		*s = hex.EncodeToString(b)
	}
	return p, nil
}

// Role names of Passwords.
const (
	SuperuserName   = "postgres"
	ReplicationName = "replicator"
	RewindName      = "rewind"
)

// NodeOptions describe one Patroni node of a cluster.
type NodeOptions struct {
	Cluster string // Patroni's scope: the same on every node of the cluster
	Name    string // the node's name, unique in the cluster
	// Dir holds the node's config (Dir/patroni.yml), its log
	// (Dir/patroni.log), its pgpass and its data dir (Dir/data). The
	// postgres OS user owns it when pgtenant runs as root.
	Dir  string
	Etcd []string // etcd client endpoints, host:port
	// Port is PostgreSQL's port and RESTPort Patroni's REST API's, both on
	// 127.0.0.1; 0 picks a free one when the node is made.
	Port, RESTPort int
	BinDir         string // default DefaultBinDir
	Settings       Settings
	// Archive is the node's archive_command (unquoted; "": no archiving).
	Archive string
	// SocketDir is the directory of the node's Unix socket, shared by the
	// nodes of a cluster (each at its own port) so that a PgBouncer
	// follows the leader there; default Dir.
	SocketDir string
	Passwords Passwords
	// Bootstrap, when set, makes the node's data dir with it instead of
	// initdb, should the node bootstrap the cluster (Cluster.Restore).
	Bootstrap *Bootstrap
	Logger    *slog.Logger
}

// Bootstrap is Patroni's custom bootstrap: instead of initdb, Command (run
// by Patroni, as the server user, split as a POSIX shell would) fills the
// empty data dir, PostgreSQL starts with RecoveryConf (restore_command,
// recovery targets) and, once it has left recovery, leads the cluster.
// Patroni takes the recovery settings out of postgresql.auto.conf again,
// so that the standbys made from it follow it instead of stopping at its
// target.
type Bootstrap struct {
	Command      string
	RecoveryConf map[string]string
}

// Node is one Patroni node: Patroni, started as a child process, runs
// initdb or pg_basebackup, then starts, stops, promotes, demotes and
// rewinds its PostgreSQL.
type Node struct {
	opts NodeOptions
	user fleet.OSUser
	log  *slog.Logger
	proc *process // nil until started
}

// NewNode checks opts, picks the free ports and writes the node's config.
// It starts nothing.
func NewNode(opts NodeOptions) (*Node, error) {
	if opts.Cluster == "" || opts.Name == "" || opts.Dir == "" {
		return nil, errors.New("patroni node: cluster, name and dir are required")
	}
	if len(opts.Etcd) == 0 {
		return nil, errors.New("patroni node: no etcd endpoint")
	}
	if opts.Passwords == (Passwords{}) {
		return nil, errors.New("patroni node: no passwords")
	}
	if err := opts.Settings.Validate(); err != nil {
		return nil, err
	}
	opts.BinDir = cmp.Or(opts.BinDir, DefaultBinDir)
	var err error
	for _, p := range []*int{&opts.Port, &opts.RESTPort} {
		if *p == 0 {
			if *p, err = fleet.FreePort(); err != nil {
				return nil, err
			}
		}
	}
	user, err := fleet.ServerUser()
	if err != nil {
		return nil, err
	}
	n := &Node{opts: opts, user: user, log: cmp.Or(opts.Logger, slog.New(slog.DiscardHandler)).With("component", "patroni", "cluster", opts.Cluster, "node", opts.Name)}
	if err := n.writeConfig(); err != nil {
		return nil, fmt.Errorf("patroni node %s: %w", opts.Name, err)
	}
	return n, nil
}

// Name is the node's name.
func (n *Node) Name() string { return n.opts.Name }

// Port is PostgreSQL's port on 127.0.0.1.
func (n *Node) Port() int { return n.opts.Port }

// APIURL is the base URL of the node's REST API.
func (n *Node) APIURL() string { return "http://127.0.0.1:" + strconv.Itoa(n.opts.RESTPort) }

// DataDir is the node's PostgreSQL data dir.
func (n *Node) DataDir() string { return dataDir(n.opts.Dir) }

// dataDir is the data dir of the node whose dir is dir.
func dataDir(dir string) string { return filepath.Join(dir, "data") }

// ConfigPath is the node's Patroni config file.
func (n *Node) ConfigPath() string { return filepath.Join(n.opts.Dir, "patroni.yml") }

// PostmasterPID is the pid of the node's running postmaster, 0 when none
// runs: what a test or a bench kills for a crash of PostgreSQL alone.
func (n *Node) PostmasterPID() int { return postmasterPID(n.DataDir()) }

// LogPath is the file Patroni's output goes to.
func (n *Node) LogPath() string { return filepath.Join(n.opts.Dir, "patroni.log") }

// Start starts Patroni and waits until its REST API answers. Patroni then
// bootstraps the cluster (initdb) when it wins the store's initialize key,
// or makes a standby (pg_basebackup) of the leader, or starts the existing
// data dir, rewinding it when it forked from the leader's timeline: wait
// for that with a Client.
func (n *Node) Start(ctx context.Context) error {
	if n.proc != nil && !n.proc.exited() {
		return fmt.Errorf("start patroni %s: already running", n.opts.Name)
	}
	program, err := exec.LookPath("patroni")
	if err != nil {
		return fmt.Errorf("patroni is not installed (apt-get install patroni): %w", err)
	}
	// PostgreSQL and Patroni refuse to run as root: as root, Patroni runs
	// as the postgres OS user, which then owns the node's dir.
	cmd := n.user.Command(program, n.ConfigPath())
	proc, err := startProcess(cmd, n.LogPath())
	if err != nil {
		return fmt.Errorf("start patroni %s: %w", n.opts.Name, err)
	}
	n.proc = proc
	hc := &http.Client{Timeout: 2 * time.Second}
	for {
		if proc.exited() {
			return fmt.Errorf("patroni %s exited: %v: %s", n.opts.Name, proc.err, proc.tail())
		}
		if answers(ctx, hc, n.APIURL()+"/liveness") {
			break
		}
		select {
		case <-ctx.Done():
			n.Kill()
			return fmt.Errorf("wait for patroni %s's REST API: %w: %s", n.opts.Name, ctx.Err(), proc.tail())
		case <-time.After(100 * time.Millisecond):
		}
	}
	n.log.Info("patroni started", "pid", cmd.Process.Pid, "api", n.APIURL(), "port", n.opts.Port)
	return nil
}

// answers reports whether url answers at all (any status).
func answers(ctx context.Context, hc *http.Client, url string) bool {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return false
	}
	resp, err := hc.Do(req)
	if err != nil {
		return false
	}
	resp.Body.Close()
	return true
}

// Done is closed when the node's Patroni has exited (nil channel, never
// closed, before Start): a supervisor restarts it with Start.
func (n *Node) Done() <-chan struct{} {
	if n.proc == nil {
		return nil
	}
	return n.proc.done
}

// Stop asks Patroni to exit (SIGTERM): it stops PostgreSQL (fast shutdown)
// and, on the leader, releases the leader lock so that a standby takes over
// at once. When ctx ends first, Patroni and PostgreSQL are killed. A
// PostgreSQL left running by a Patroni that died on its own gets an
// immediate shutdown: no server outlives its node.
func (n *Node) Stop(ctx context.Context) error {
	var err error
	if n.proc != nil && !n.proc.exited() {
		if err = n.proc.stop(ctx, syscall.SIGTERM); err != nil {
			err = fmt.Errorf("stop patroni %s: %w", n.opts.Name, err)
		}
	}
	if pid := postmasterPID(n.DataDir()); pid != 0 {
		// SIGQUIT is PostgreSQL's immediate shutdown; ctx may be over
		// already (Patroni did not stop in time): a few seconds of their own.
		_ = syscall.Kill(pid, syscall.SIGQUIT)
		wctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
		if waitGone(wctx, pid) != nil {
			_ = syscall.Kill(-pid, syscall.SIGKILL)
			_ = syscall.Kill(pid, syscall.SIGKILL)
		}
		cancel()
	}
	if err == nil {
		n.log.Info("patroni stopped")
	}
	return err
}

// Kill is a node loss: Patroni and its PostgreSQL (the postmaster's whole
// process group: Patroni starts it in a session of its own) get SIGKILL, at
// once, and Kill waits until they are gone. The leader lock stays in the
// store until its TTL expires.
func (n *Node) Kill() {
	pg := postmasterPID(n.DataDir())
	if n.proc != nil {
		n.proc.signal(syscall.SIGKILL)
	}
	if pg != 0 {
		_ = syscall.Kill(-pg, syscall.SIGKILL)
		_ = syscall.Kill(pg, syscall.SIGKILL)
	}
	if n.proc != nil {
		<-n.proc.done
	}
	if pg != 0 {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_ = waitGone(ctx, pg)
	}
	n.log.Info("patroni and postgres killed")
}

// config is the part of Patroni's YAML config that pgtenant writes.
type config struct {
	Scope string `yaml:"scope"`
	Name  string `yaml:"name"`
	Log   struct {
		Level string `yaml:"level"`
	} `yaml:"log"`
	RESTAPI struct {
		Listen         string `yaml:"listen"`
		ConnectAddress string `yaml:"connect_address"`
	} `yaml:"restapi"`
	Etcd3 struct {
		Hosts []string `yaml:"hosts"`
	} `yaml:"etcd3"`
	Bootstrap struct {
		DCS struct {
			TTL                   int  `yaml:"ttl"`
			LoopWait              int  `yaml:"loop_wait"`
			RetryTimeout          int  `yaml:"retry_timeout"`
			SynchronousMode       bool `yaml:"synchronous_mode"`
			SynchronousModeStrict bool `yaml:"synchronous_mode_strict"`
			PostgreSQL            struct {
				UsePgRewind bool              `yaml:"use_pg_rewind"`
				UseSlots    bool              `yaml:"use_slots"`
				Parameters  map[string]string `yaml:"parameters,omitempty"`
			} `yaml:"postgresql"`
		} `yaml:"dcs"`
		InitDB []any `yaml:"initdb"`
		// Method and Restore: a custom bootstrap (NodeOptions.Bootstrap).
		Method  string           `yaml:"method,omitempty"`
		Restore *customBootstrap `yaml:"pgtenant_restore,omitempty"`
	} `yaml:"bootstrap"`
	PostgreSQL struct {
		Listen         string            `yaml:"listen"`
		ConnectAddress string            `yaml:"connect_address"`
		DataDir        string            `yaml:"data_dir"`
		BinDir         string            `yaml:"bin_dir"`
		PGPass         string            `yaml:"pgpass"`
		Authentication map[string]role   `yaml:"authentication"`
		Parameters     map[string]string `yaml:"parameters"`
		PGHBA          []string          `yaml:"pg_hba"`
	} `yaml:"postgresql"`
	Watchdog struct {
		Mode string `yaml:"mode"`
	} `yaml:"watchdog"`
}

// customBootstrap is a method of Patroni's `bootstrap:` section.
type customBootstrap struct {
	Command      string            `yaml:"command"`
	NoParams     bool              `yaml:"no_params"`
	RecoveryConf map[string]string `yaml:"recovery_conf,omitempty"`
}

type role struct {
	Username string `yaml:"username"`
	Password string `yaml:"password"`
}

// writeConfig writes Dir/patroni.yml (mode 0600: it holds the passwords)
// and hands Dir to the server user.
func (n *Node) writeConfig() error {
	o := n.opts
	var c config
	c.Scope, c.Name = o.Cluster, o.Name
	c.Log.Level = "INFO"
	api := "127.0.0.1:" + strconv.Itoa(o.RESTPort)
	c.RESTAPI.Listen, c.RESTAPI.ConnectAddress = api, api
	c.Etcd3.Hosts = o.Etcd
	dcs := &c.Bootstrap.DCS
	dcs.TTL = int(o.Settings.TTL / time.Second)
	dcs.LoopWait = int(o.Settings.LoopWait / time.Second)
	dcs.RetryTimeout = int(o.Settings.RetryTimeout / time.Second)
	dcs.SynchronousMode = o.Settings.SynchronousMode
	dcs.SynchronousModeStrict = o.Settings.SynchronousModeStrict
	// pg_rewind brings an old primary back as a standby of the new one
	// instead of leaving it out with a forked timeline (Patroni turns
	// wal_log_hints on for it). Slots keep the WAL a standby still needs.
	dcs.PostgreSQL.UsePgRewind = true
	dcs.PostgreSQL.UseSlots = true
	dcs.PostgreSQL.Parameters = o.Settings.Parameters
	c.Bootstrap.InitDB = []any{map[string]string{"encoding": "UTF8"}, map[string]string{"locale": "C.UTF-8"}}
	if b := o.Bootstrap; b != nil {
		c.Bootstrap.Method = "pgtenant_restore"
		c.Bootstrap.Restore = &customBootstrap{Command: b.Command, NoParams: true, RecoveryConf: b.RecoveryConf}
	}
	pg := &c.PostgreSQL
	addr := "127.0.0.1:" + strconv.Itoa(o.Port)
	pg.Listen, pg.ConnectAddress = addr, addr
	pg.DataDir = n.DataDir()
	pg.BinDir = o.BinDir
	// Patroni writes the passwords of the connections it makes (basebackup,
	// rewind, streaming) there; the default is in $HOME, which the server
	// user may not have.
	pg.PGPass = filepath.Join(o.Dir, "pgpass")
	pg.Authentication = map[string]role{
		"superuser":   {SuperuserName, o.Passwords.Superuser},
		"replication": {ReplicationName, o.Passwords.Replication},
		"rewind":      {RewindName, o.Passwords.Rewind},
	}
	pg.Parameters = map[string]string{
		// Not /var/run/postgresql: it may be missing or not writable by
		// the server user. Nodes may share a socket dir: each has its port.
		"unix_socket_directories": cmp.Or(o.SocketDir, o.Dir),
	}
	if o.Archive != "" {
		// On a replica archive_mode=on archives nothing until it leads.
		pg.Parameters["archive_mode"] = "on"
		pg.Parameters["archive_command"] = o.Archive
		pg.Parameters["archive_timeout"] = fleet.ArchiveTimeout
	}
	// Loopback only, passwords everywhere (SCRAM, PostgreSQL 15's default
	// password_encryption).
	pg.PGHBA = []string{
		"local all all scram-sha-256",
		"host all all 127.0.0.1/32 scram-sha-256",
		"host replication " + ReplicationName + " 127.0.0.1/32 scram-sha-256",
	}
	// No /dev/watchdog on a developer machine or a container; with one, a
	// hung Patroni's machine would be reset before its lock expires.
	c.Watchdog.Mode = "off"
	b, err := yaml.Marshal(&c)
	if err != nil {
		return fmt.Errorf("encode config: %w", err)
	}
	if err := os.MkdirAll(o.Dir, 0o700); err != nil {
		return fmt.Errorf("create node dir: %w", err)
	}
	if err := os.WriteFile(n.ConfigPath(), b, 0o600); err != nil {
		return fmt.Errorf("write config: %w", err)
	}
	if err := n.user.CheckTraversable(o.Dir); err != nil {
		return err
	}
	if err := n.user.Own(o.Dir); err != nil {
		return fmt.Errorf("hand node dir to the server user: %w", err)
	}
	if o.SocketDir != "" {
		if err := os.MkdirAll(o.SocketDir, 0o700); err != nil {
			return fmt.Errorf("create socket dir: %w", err)
		}
		if err := n.user.Own(o.SocketDir); err != nil {
			return fmt.Errorf("hand socket dir to the server user: %w", err)
		}
	}
	return nil
}
