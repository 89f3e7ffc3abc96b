package patroni

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pgtenant/pgtenant/internal/background"
	"github.com/pgtenant/pgtenant/internal/fleet"
)

// ClusterOptions describe the Patroni nodes of one cluster on this
// machine, on an etcd already running.
type ClusterOptions struct {
	Scope string // Patroni's scope: the cluster's name
	// Dir holds the cluster's state file (Dir/patroni.json: its passwords
	// and its nodes' ports, kept so that a restart finds the same servers
	// at the same addresses) and a dir per node (Dir/n1, Dir/n2, …).
	Dir      string
	Nodes    int      // nodes to run, named n1, n2, …; nodes the state has beyond it are run too
	Etcd     []string // etcd client endpoints, host:port
	Settings Settings
	// PgBackRest, when set, is the pgbackrest program: a cluster being
	// made archives its WAL with it from its creation (archive_mode needs
	// a restart to turn on), each node's archive_command running
	// archive-push with the config at BackupConfigPath, which
	// internal/backup writes. It is recorded in the state: an existing
	// cluster keeps what it was made with.
	PgBackRest string
	Logger     *slog.Logger
}

// Cluster is the Patroni nodes of one cluster on this machine.
type Cluster struct {
	opts      ClusterOptions
	backups   bool
	Passwords Passwords
	Nodes     []*Node
	URLs      []string // the nodes' REST APIs, as Nodes
	Client    *Client
}

// clusterState is Dir/patroni.json.
type clusterState struct {
	Passwords Passwords   `json:"passwords"`
	Nodes     []nodePorts `json:"nodes"`
	// Backups: the cluster was made archiving (ClusterOptions.Archive).
	Backups bool `json:"backups,omitempty"`
}

type nodePorts struct {
	Name     string `json:"name"`
	Port     int    `json:"port"`
	RESTPort int    `json:"rest_port"`
}

// NewCluster prepares the cluster's nodes: the state in Dir, made the
// first time (new passwords, free ports), and each node's config. It
// starts nothing.
func NewCluster(opts ClusterOptions) (*Cluster, error) {
	if opts.Nodes < 1 {
		return nil, errors.New("patroni cluster: at least one node")
	}
	if err := os.MkdirAll(opts.Dir, 0o711); err != nil {
		return nil, fmt.Errorf("patroni cluster %s: %w", opts.Scope, err)
	}
	path := filepath.Join(opts.Dir, "patroni.json")
	var st clusterState
	switch b, err := os.ReadFile(path); {
	case err == nil:
		if err := json.Unmarshal(b, &st); err != nil {
			return nil, fmt.Errorf("patroni cluster %s: %s: %w", opts.Scope, path, err)
		}
	case errors.Is(err, os.ErrNotExist):
		if st.Passwords, err = NewPasswords(); err != nil {
			return nil, err
		}
		st.Backups = opts.PgBackRest != ""
	default:
		return nil, err
	}
	if st.Backups && opts.PgBackRest == "" {
		return nil, fmt.Errorf("patroni cluster %s archives its WAL with pgbackrest, which is not installed: "+
			"apt-get install -y pgbackrest (without it the WAL piles up in the data dirs)", opts.Scope)
	}
	c := &Cluster{opts: opts, Passwords: st.Passwords, backups: st.Backups}
	for i := range max(opts.Nodes, len(st.Nodes)) {
		if i == len(st.Nodes) {
			st.Nodes = append(st.Nodes, nodePorts{Name: "n" + strconv.Itoa(i+1)})
		}
		np := &st.Nodes[i]
		no := NodeOptions{Cluster: opts.Scope, Name: np.Name, Dir: filepath.Join(opts.Dir, np.Name), Etcd: opts.Etcd,
			Port: np.Port, RESTPort: np.RESTPort, Settings: opts.Settings, Passwords: st.Passwords, Logger: opts.Logger,
			SocketDir: c.SocketDir()}
		if st.Backups {
			no.Archive = fleet.ArchivePush(opts.PgBackRest, backupConfigPath(opts.Dir), opts.Scope, dataDir(no.Dir))
		}
		n, err := NewNode(no)
		if err != nil {
			return nil, err
		}
		np.Port, np.RESTPort = n.Port(), n.opts.RESTPort
		c.Nodes = append(c.Nodes, n)
		c.URLs = append(c.URLs, n.APIURL())
	}
	b, err := json.MarshalIndent(st, "", "  ")
	if err != nil {
		return nil, err
	}
	if err := os.WriteFile(path, b, 0o600); err != nil {
		return nil, fmt.Errorf("patroni cluster %s: write %s: %w", opts.Scope, path, err)
	}
	c.Client = NewClient(c.URLs, nil)
	return c, nil
}

// Start starts the nodes and waits for a leader. A new cluster's first
// node bootstraps (initdb) before the others start, so that they make
// standbys instead of racing for the store's initialize key; an existing
// one's nodes all start at once (in synchronous mode only the
// synchronous standby of before may lead, whichever node that was).
func (c *Cluster) Start(ctx context.Context) error {
	made := false
	for _, n := range c.Nodes {
		if _, err := os.Stat(filepath.Join(n.DataDir(), "PG_VERSION")); err == nil {
			made = true
		}
	}
	first := c.Nodes
	if !made {
		first = c.Nodes[:1]
	}
	for _, n := range first {
		if err := n.Start(ctx); err != nil {
			return err
		}
	}
	wctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	if _, err := c.Client.WaitLeader(wctx); err != nil {
		return fmt.Errorf("patroni cluster %s: %w; %s", c.opts.Scope, err, c.logTails())
	}
	if !made {
		for _, n := range c.Nodes[1:] {
			if err := n.Start(ctx); err != nil {
				return err
			}
		}
	}
	// Patroni names a leader from the store before its PostgreSQL takes
	// writes (a restart's crash recovery, a promotion): Start returns once
	// it does.
	if err := background.Until(wctx, 200*time.Millisecond, c.writable); err != nil {
		return fmt.Errorf("patroni cluster %s: no node takes writes: %w; %s", c.opts.Scope, err, c.logTails())
	}
	return nil
}

// writable checks that the leader takes a read-write session.
func (c *Cluster) writable(ctx context.Context) error {
	cctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	conn, err := pgx.Connect(cctx, c.PrimaryDSN("postgres"))
	if err != nil {
		return err
	}
	defer conn.Close(context.WithoutCancel(ctx))
	_, err = conn.Exec(cctx, "SELECT 1")
	return err
}

// logTails are the last lines of each node's Patroni log, for an error.
func (c *Cluster) logTails() string {
	var parts []string
	for _, n := range c.Nodes {
		parts = append(parts, fmt.Sprintf("%s's %s ends: %s", n.Name(), n.LogPath(), strings.TrimSpace(tailFile(n.LogPath(), 600))))
	}
	return strings.Join(parts, "; ")
}

// Stop stops the nodes at once. (Not the replicas first: a leader whose
// replicas are gone waits for them to receive its shutdown checkpoint,
// up to the end of ctx.)
func (c *Cluster) Stop(ctx context.Context) error {
	errs := make([]error, len(c.Nodes))
	var wg sync.WaitGroup
	for i, n := range c.Nodes {
		wg.Go(func() { errs[i] = n.Stop(ctx) })
	}
	wg.Wait()
	return errors.Join(errs...)
}

// WaitStandby waits until the cluster has a running leader (leader, when
// not "") and a running standby streaming from it less than 1 MiB behind
// (Patroni samples the positions once per loop): synchronous when sync
// (Patroni's sync_standby, the one promoted after a node loss), else
// asynchronous. Patroni's view comes from the store; PostgreSQL's own
// (pg_stat_replication on the leader) must agree.
func (c *Cluster) WaitStandby(ctx context.Context, leader string, sync bool) (l, s Member, err error) {
	role, state := RoleReplica, "async"
	if sync {
		role, state = RoleSyncStandby, "sync"
	}
	err = background.Until(ctx, 200*time.Millisecond, func(ctx context.Context) error {
		ms, err := c.Client.Members(ctx)
		if err != nil {
			return err
		}
		l, s = Member{}, Member{}
		for _, m := range ms {
			switch {
			case m.Role == RoleLeader && m.Running():
				l = m
			case m.Role == role && m.Running() && m.Lag >= 0 && m.Lag < 1<<20:
				s = m
			}
		}
		if l.Name == "" || s.Name == "" || (leader != "" && l.Name != leader) {
			return fmt.Errorf("members %+v", ms)
		}
		cctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		defer cancel()
		conn, err := pgx.Connect(cctx, c.DSN(l.Port, "postgres"))
		if err != nil {
			return err
		}
		defer conn.Close(context.WithoutCancel(ctx))
		var n int
		if err := conn.QueryRow(cctx, `SELECT count(*) FROM pg_stat_replication WHERE application_name = $1 AND state = 'streaming' AND sync_state = $2`,
			s.Name, state).Scan(&n); err != nil {
			return err
		}
		if n != 1 {
			return fmt.Errorf("%s does not stream from %s in %s mode yet", s.Name, l.Name, state)
		}
		return nil
	})
	if err != nil {
		return l, s, fmt.Errorf("patroni cluster %s: wait for a leader and a streaming %s standby: %w", c.opts.Scope, state, err)
	}
	return l, s, nil
}

// Node is the node called name, nil when the cluster has none.
func (c *Cluster) Node(name string) *Node {
	for _, n := range c.Nodes {
		if n.Name() == name {
			return n
		}
	}
	return nil
}

// DSN is a DSN of the superuser to database on the node at port.
func (c *Cluster) DSN(port int, database string) string {
	return fmt.Sprintf("host=127.0.0.1 port=%d user=%s password=%s dbname=%s sslmode=disable connect_timeout=2",
		port, SuperuserName, c.Passwords.Superuser, database)
}

// PrimaryDSN is a multi-host DSN of the superuser to database that
// connects to whichever node is read-write: it follows the leader.
func (c *Cluster) PrimaryDSN(database string) string {
	var hosts, ports []string
	for _, n := range c.Nodes {
		hosts = append(hosts, "127.0.0.1")
		ports = append(ports, strconv.Itoa(n.Port()))
	}
	return fmt.Sprintf("host=%s port=%s user=%s password=%s dbname=%s sslmode=disable connect_timeout=2 target_session_attrs=read-write",
		strings.Join(hosts, ","), strings.Join(ports, ","), SuperuserName, c.Passwords.Superuser, database)
}

// Settings are the cluster's Patroni settings.
func (c *Cluster) Settings() Settings { return c.opts.Settings }

// Name is the cluster's name (Patroni's scope).
func (c *Cluster) Name() string { return c.opts.Scope }

// Backups reports whether the cluster archives its WAL with pgBackRest: it
// was made with ClusterOptions.PgBackRest.
func (c *Cluster) Backups() bool { return c.backups }

// BackupDir holds the cluster's pgBackRest files (internal/backup), as a
// cluster of internal/fleet has them; BackupConfigPath is the config its
// nodes' archive_command names.
func (c *Cluster) BackupDir() string { return backupDir(c.opts.Dir) }

func (c *Cluster) BackupConfigPath() string { return backupConfigPath(c.opts.Dir) }

// SocketDir is the directory of every node's Unix socket, each at its
// own port (fleet.SocketDirIn): a PgBouncer on this host follows the
// leader there. "": each node's socket is in its own dir.
func (c *Cluster) SocketDir() string { return fleet.SocketDirIn(c.opts.Dir) }

func backupDir(dir string) string        { return filepath.Join(dir, "backup") }
func backupConfigPath(dir string) string { return filepath.Join(backupDir(dir), "pgbackrest.conf") }

// SupervisedNodes, Running, StartNode and LogHint let a fleet.Supervisor
// keep the nodes' Patroni processes running (Patroni keeps its
// PostgreSQL running).
func (c *Cluster) SupervisedNodes() []string {
	names := make([]string, len(c.Nodes))
	for i, n := range c.Nodes {
		names[i] = n.Name()
	}
	return names
}

// Running reports whether the node's Patroni runs.
func (c *Cluster) Running(node string) bool {
	n := c.Node(node)
	return n != nil && n.proc != nil && !n.proc.exited()
}

// StartNode starts the node's Patroni again.
func (c *Cluster) StartNode(ctx context.Context, node string) error {
	n := c.Node(node)
	if n == nil {
		return fmt.Errorf("patroni cluster %s has no node %s", c.opts.Scope, node)
	}
	return n.Start(ctx)
}

// LogHint names the node's Patroni log.
func (c *Cluster) LogHint(node string) string {
	if n := c.Node(node); n != nil {
		return n.LogPath()
	}
	return c.opts.Dir
}

// Restore makes the cluster again once its nodes are lost, its first node
// bootstrapping with b (for example a restore from a backup repository),
// the others made its standbys. Every node must be stopped. The store's
// state of the lost cluster (its leader, members, timeline history,
// synchronous standby and last position, which would keep the restored
// node from leading) is deleted first, and each node's data dir still
// there is moved aside (Dir/nX/data.lost-TIME, never deleted). Restore
// returns once a standby streams from the restored node, with every node
// stopped again.
func (c *Cluster) Restore(ctx context.Context, b Bootstrap) error {
	for _, n := range c.Nodes {
		if n.PostmasterPID() != 0 || n.proc != nil && !n.proc.exited() {
			return fmt.Errorf("cluster %s: node %s is running; stop it (stop `pgtenant up`, which supervises it) before a restore", c.opts.Scope, n.Name())
		}
	}
	log := cmp.Or(c.opts.Logger, slog.New(slog.DiscardHandler))
	// Patroni's keys: /service/<scope>/… (its default namespace).
	deleted, err := DeletePrefix(ctx, c.opts.Etcd, "/service/"+c.opts.Scope+"/")
	if err != nil {
		return fmt.Errorf("cluster %s: clear its state in the store: %w", c.opts.Scope, err)
	}
	log.Info("deleted the lost cluster's state from the store", "cluster", c.opts.Scope, "keys", deleted)
	stamp := time.Now().UTC().Format("20060102T150405")
	for _, n := range c.Nodes {
		dir := n.DataDir()
		if _, err := os.Stat(dir); errors.Is(err, os.ErrNotExist) {
			continue
		}
		aside := dir + ".lost-" + stamp
		log.Warn("moving a node's data dir aside for the restore", "dir", dir, "moved_to", aside)
		if err := os.Rename(dir, aside); err != nil {
			return err
		}
	}
	first := c.Nodes[0]
	if err := os.Mkdir(first.DataDir(), 0o700); err != nil {
		return err
	}
	if err := first.user.Own(first.DataDir()); err != nil {
		return err
	}
	first.opts.Bootstrap = &b
	defer func() { // the next start's config is the usual one
		first.opts.Bootstrap = nil
		_ = first.writeConfig()
	}()
	if err := first.writeConfig(); err != nil {
		return err
	}
	stop := func(err error) error {
		sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), time.Minute)
		defer cancel()
		return errors.Join(err, c.Stop(sctx))
	}
	if err := first.Start(ctx); err != nil {
		return stop(err)
	}
	// The bootstrap takes as long as the restore and the recovery: no
	// bound but ctx. A failed one ends the node's Patroni.
	for {
		if m, err := c.Client.Leader(ctx); err == nil && m.Name == first.Name() {
			break
		}
		select {
		case <-first.Done():
			return stop(fmt.Errorf("cluster %s: the restore failed; %s", c.opts.Scope, c.logTails()))
		case <-ctx.Done():
			return stop(fmt.Errorf("cluster %s: the restored node does not lead yet: %w; %s", c.opts.Scope, ctx.Err(), c.logTails()))
		case <-time.After(time.Second):
		}
	}
	if err := background.Until(ctx, 200*time.Millisecond, c.writable); err != nil {
		return stop(fmt.Errorf("cluster %s: the restored node takes no writes: %w; %s", c.opts.Scope, err, c.logTails()))
	}
	for _, n := range c.Nodes[1:] {
		if err := n.Start(ctx); err != nil {
			return stop(err)
		}
	}
	if len(c.Nodes) > 1 {
		if _, _, err := c.WaitStandby(ctx, first.Name(), c.opts.Settings.SynchronousMode); err != nil {
			return stop(fmt.Errorf("cluster %s: no standby of the restored node: %w; %s", c.opts.Scope, err, c.logTails()))
		}
	}
	return stop(nil)
}
