// Package fleet runs local managed PostgreSQL clusters: it finds the server
// binaries, runs initdb, and starts and stops a primary with its streaming
// standbys (made with pg_basebackup -R) on loopback ports, and its
// Supervisor restarts a node that dies. It owns the files under a cluster
// directory; it never looks inside the databases beyond the replication slot
// its standbys use.
package fleet

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"net"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pgtenant/pgtenant/internal/config"
)

// Superuser is the PostgreSQL superuser of a managed cluster.
const Superuser = "pgtenant"

// Options describe a managed cluster.
type Options struct {
	Dir      string            // cluster directory; created if missing
	Name     string            // cluster name, e.g. "local"
	Standbys int               // streaming standbys to keep (existing extra ones are kept too)
	Settings map[string]string // postgresql.conf settings over DefaultSettings
	// Fast trades durability for speed (initdb --no-sync, fsync=off): for tests only.
	Fast bool
	// Backups makes a cluster being made archive its WAL with pgBackRest
	// from its creation (archive_mode needs a restart to turn on):
	// archive_command runs archive-push with the stanza config at
	// BackupConfigPath, which internal/backup writes. It is recorded in the
	// cluster's state: an existing cluster keeps what it was made with.
	// Off by default (tests ask for it).
	Backups bool
	// Metering loads pg_stat_statements and pg_stat_kcache (WithMetering)
	// when the server has pg_stat_kcache's library: `up` asks for it.
	Metering bool
	Logger   *slog.Logger
}

// Node is one server of the cluster.
type Node struct {
	Name  string `json:"name"` // "primary", "standby1", …
	Port  int    `json:"port"`
	Ready bool   `json:"ready"` // fully made; a node that is not ready is half-made
}

type state struct {
	Name     string `json:"name"`
	Major    int    `json:"major"`
	Primary  Node   `json:"primary"`
	Standbys []Node `json:"standbys"`
	// Backups: the cluster was made archiving (Options.Backups); kept so
	// that its standbys, made later, and its next starts agree.
	Backups bool `json:"backups,omitempty"`
}

// Cluster is a managed cluster on disk.
type Cluster struct {
	opts     Options
	bin      Binaries
	user     runAs
	st       state
	password string
	log      *slog.Logger
	// pgbackrest is the program archive_command runs (Options.Backups).
	pgbackrest string
}

// maxFilesPerProcess is the max_files_per_process of a managed cluster:
// 10,000 (doctor's files check asks for a quarter more than the files of
// one tenant of the largest template: 10,000 covers tenants of about 6,000
// relations, the shipped wide template is 2,221), within the open-file
// limit the servers get (raiseFileLimit lifts their soft limit to the hard
// one) less 100 for everything else a backend opens, and at least
// PostgreSQL's default of 1,000.
func maxFilesPerProcess() int {
	want := uint64(10000)
	var l syscall.Rlimit
	if syscall.Getrlimit(syscall.RLIMIT_NOFILE, &l) == nil && l.Max < want+100 {
		want = max(1000, (l.Max-min(l.Max, 100))/1000*1000)
	}
	return int(want)
}

// DefaultSettings are the settings of a managed cluster, suited to a tenant
// fleet. Callers override them with Options.Settings.
func DefaultSettings() map[string]string {
	return map[string]string{
		"listen_addresses": "'127.0.0.1'",
		// No socket in /var/run/postgresql (shared, maybe not writable):
		// writeConf puts the nodes' sockets in the cluster's SocketDir.
		"unix_socket_directories": "''",
		// Admission (provision.connection_overcommit) gives each tenant its
		// tier's whole connection limit: room for about 46 tenants of the
		// default tier (docs/connections.md). The superuser reserve keeps pgtenant's admin sessions in
		// when tenants use every other slot.
		"max_connections":                "500",
		"superuser_reserved_connections": "10",
		"shared_buffers":                 "128MB",
		// logical: a tenant moves to another cluster by logical
		// replication (internal/move), and tenants' analytics mirrors
		// (internal/analytics) decode it; each move in flight and each
		// mirror holds a slot and a WAL sender, beside the standbys' own.
		"wal_level":             "logical",
		"max_wal_senders":       "20",
		"max_replication_slots": "20",
		// A lagging or dead analytics mirror's slot is invalidated (and
		// copied again) before it fills the disk.
		"max_slot_wal_keep_size":       "4GB",
		"hot_standby":                  "on",
		"hot_standby_feedback":         "on",
		"wal_receiver_status_interval": "1s",
		// Templates of many relations are materialised in batches, so the
		// default of 64 would work; 256 leaves room for tenants' own DDL.
		"max_locks_per_transaction": "256",
		// Crash recovery first syncs the data dir: file by file it took
		// 68 s before replay at 1 M relation files (bench density, 4,000
		// schema and 800 database tenants of saas); syncfs is one call per
		// file system (Linux; errors of other file systems' files are not
		// its concern).
		"recovery_init_sync_method": "syncfs",
		"max_files_per_process":     strconv.Itoa(maxFilesPerProcess()),
		"shared_preload_libraries":  "'pg_prewarm'",
		// pgtenant prewarms by tenant priority itself; autoprewarm's
		// database-order reload is what it replaces.
		"pg_prewarm.autoprewarm":   "off",
		"track_io_timing":          "on",
		"logging_collector":        "on",
		"log_directory":            "'log'",
		"log_filename":             "'postgresql-%a.log'",
		"log_truncate_on_rotation": "on",
		"log_rotation_age":         "1d",
		"log_line_prefix":          "'%m [%p] %q%u@%d '",
		"log_checkpoints":          "on",
	}
}

// Open loads the cluster in opts.Dir, or prepares a new one. It does not start
// anything; Start does.
func Open(opts Options) (*Cluster, error) {
	if opts.Name == "" {
		opts.Name = "local"
	}
	if opts.Logger == nil {
		opts.Logger = slog.New(slog.DiscardHandler)
	}
	dir, err := filepath.Abs(opts.Dir)
	if err != nil {
		return nil, err
	}
	opts.Dir = dir
	c := &Cluster{opts: opts, log: opts.Logger.With("component", "fleet", "cluster", opts.Name)}
	if c.user, err = serverUser(); err != nil {
		return nil, err
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("create cluster dir: %w", err)
	}
	if c.user.isOther() {
		// The postgres user must traverse (not list) the dir to reach its data dirs.
		if err := os.Chmod(dir, 0o711); err != nil {
			return nil, err
		}
		if err := c.user.checkTraversable(dir); err != nil {
			return nil, err
		}
	}
	if err := c.loadState(); err != nil {
		return nil, err
	}
	if c.password, err = c.loadPassword(); err != nil {
		return nil, err
	}
	major := c.st.Major
	if v, err := os.ReadFile(filepath.Join(c.nodeDir("primary"), "PG_VERSION")); err == nil {
		major, _ = strconv.Atoi(strings.TrimSpace(string(v)))
	}
	if c.bin, err = FindBinaries(major); err != nil {
		return nil, err
	}
	c.st.Name, c.st.Major = opts.Name, c.bin.Major
	if !c.st.Primary.Ready {
		// Only a cluster being made takes the option: archive_mode needs a
		// restart, and an archiving cluster must not stop archiving silently.
		c.st.Backups = opts.Backups
	}
	if c.st.Backups {
		if c.pgbackrest, err = exec.LookPath("pgbackrest"); err != nil {
			return nil, fmt.Errorf("cluster %s archives its WAL with pgbackrest, which is not installed: "+
				"apt-get install -y pgbackrest (without it the WAL piles up in the data dir)", opts.Name)
		}
	}
	return c, nil
}

// BackupDir holds the cluster's pgBackRest files (internal/backup): config,
// repository, logs, spool and locks.
func (c *Cluster) BackupDir() string { return filepath.Join(c.opts.Dir, "backup") }

// BackupConfigPath is the pgBackRest config archive_command names.
func (c *Cluster) BackupConfigPath() string { return filepath.Join(c.BackupDir(), "pgbackrest.conf") }

// Backups reports whether the cluster archives its WAL with pgBackRest: it
// was made with Options.Backups.
func (c *Cluster) Backups() bool { return c.st.Backups }

// Password is the superuser's password.
func (c *Cluster) Password() string { return c.password }

// ArchiveTimeout is the archive_timeout of a cluster that archives: a
// quiet cluster still ships its WAL within it, so the most a restore of
// both nodes lost loses (RPO) is about this plus the push. 30 s, not the
// common 60 s: bench restore measured an RPO of 60.24 s at worst with 60 s
// (the target is ≤ 60 s); a segment switched early is a full 16 MB file,
// but pgBackRest compresses its zeroed tail to almost nothing.
const ArchiveTimeout = "30s"

// ArchiveCommand is an archive_command running pgBackRest's archive-push,
// quoted for postgresql.conf (unquoted, the spaces in it end the value)
// and its paths for the shell that runs it. The config path must be
// absolute: the archiver runs it from the data dir.
func ArchiveCommand(program, config, stanza string) string {
	return "'" + strings.ReplaceAll(ArchivePush(program, config, stanza, ""), "'", "''") + "'"
}

// ArchivePush is the shell command of an archive_command running
// pgBackRest's archive-push, its paths quoted for the shell; pgPath, when
// set, is the data dir of the server that runs it (pgBackRest reads %p
// relative to it): for a node whose data dir is not the config's pg1-path.
func ArchivePush(program, config, stanza, pgPath string) string {
	pg := ""
	if pgPath != "" {
		pg = " --pg1-path=" + ShellQuote(pgPath)
	}
	return fmt.Sprintf("%s --config=%s --stanza=%s%s archive-push %%p", ShellQuote(program), ShellQuote(config), ShellQuote(stanza), pg)
}

// ShellQuote quotes s for /bin/sh unless it is made of characters the
// shell takes literally.
func ShellQuote(s string) string {
	if s != "" && strings.Trim(s, "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789/._-=") == "" {
		return s
	}
	return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'"
}

// Name returns the cluster name.
func (c *Cluster) Name() string { return c.opts.Name }

// Binaries returns the server installation the cluster runs on.
func (c *Cluster) Binaries() Binaries { return c.bin }

// RunsAsPostgres reports whether the servers run as the postgres OS user
// (because pgtenant runs as root).
func (c *Cluster) RunsAsPostgres() bool { return c.user.isOther() }

// Primary returns the primary node.
func (c *Cluster) Primary() Node { return c.st.Primary }

// Standbys returns the standby nodes.
func (c *Cluster) Standbys() []Node { return append([]Node(nil), c.st.Standbys...) }

// DataDir returns a node's PGDATA.
func (c *Cluster) DataDir(node string) string { return c.nodeDir(node) }

// DSN returns the superuser connection string of a node for a database.
func (c *Cluster) DSN(node Node, database string) string {
	u := url.URL{
		Scheme:   "postgres",
		User:     url.UserPassword(Superuser, c.password),
		Host:     net.JoinHostPort("127.0.0.1", strconv.Itoa(node.Port)),
		Path:     "/" + database,
		RawQuery: "sslmode=disable",
	}
	return u.String()
}

// PrimaryDSN is DSN(Primary(), database).
func (c *Cluster) PrimaryDSN(database string) string { return c.DSN(c.st.Primary, database) }

// Start makes whatever is missing (initdb, standbys) and starts every node
// that is not running. It is idempotent: a second Start on a running cluster
// does nothing; on a stopped one it restarts what is there.
func (c *Cluster) Start(ctx context.Context) error {
	if err := c.ensurePrimary(ctx); err != nil {
		return err
	}
	for i := len(c.st.Standbys); i < c.opts.Standbys; i++ {
		c.st.Standbys = append(c.st.Standbys, Node{Name: "standby" + strconv.Itoa(i+1)})
	}
	for i := range c.st.Standbys {
		if err := c.ensureStandby(ctx, &c.st.Standbys[i]); err != nil {
			return err
		}
	}
	return nil
}

// Stop stops the primary, then the standbys (so that they receive the
// primary's shutdown checkpoint), with fast shutdown.
func (c *Cluster) Stop(ctx context.Context) error {
	var errs []error
	for _, n := range append([]Node{c.st.Primary}, c.st.Standbys...) {
		if err := c.StopNode(ctx, n.Name, "fast"); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// StopNode stops one node; mode is smart, fast or immediate.
func (c *Cluster) StopNode(ctx context.Context, name, mode string) error {
	dir := c.nodeDir(name)
	if !c.running(dir) {
		return nil
	}
	if err := c.run(ctx, c.bin.Path("pg_ctl"), "stop", "-D", dir, "-m", mode, "-w", "-t", "120"); err != nil {
		return fmt.Errorf("stop %s: %w", name, err)
	}
	c.log.Info("stopped", "node", name)
	return nil
}

// StartNode starts one ready node that is not running.
func (c *Cluster) StartNode(ctx context.Context, name string) error {
	n, ok := c.node(name)
	if !ok {
		return fmt.Errorf("cluster %s has no node %q", c.opts.Name, name)
	}
	return c.startNode(ctx, n)
}

// Promote turns a standby into the primary (pg_ctl promote) and records it
// so. The old primary must be stopped first; it is recorded as a standby that
// is not ready, so the next Start rebuilds it from the new primary.
func (c *Cluster) Promote(ctx context.Context, name string) error {
	idx := -1
	for i, s := range c.st.Standbys {
		if s.Name == name {
			idx = i
		}
	}
	if idx < 0 {
		return fmt.Errorf("cluster %s has no standby %q", c.opts.Name, name)
	}
	if c.running(c.nodeDir(c.st.Primary.Name)) {
		return fmt.Errorf("promote %s: stop the primary first", name)
	}
	if err := c.run(ctx, c.bin.Path("pg_ctl"), "promote", "-D", c.nodeDir(name), "-w", "-t", "120"); err != nil {
		return fmt.Errorf("promote %s: %w", name, err)
	}
	old := c.st.Primary
	old.Ready = false
	c.st.Primary, c.st.Standbys[idx] = c.st.Standbys[idx], old
	return c.saveState()
}

// Restore makes the cluster anew from a backup once it lost its nodes: each
// node's dir still there is moved aside (to NAME.lost-TIME, never deleted:
// it may hold what the operator wants to look at), fill writes the
// primary's data dir (a pgBackRest restore, its recovery settings with
// it), the primary gets its settings and port back, starts and recovers;
// Restore returns once its recovery is over and it takes writes. Its
// standbys are recorded as not ready: the next Start makes them anew from
// it. No node may be running (`up` supervises them: stop it first).
func (c *Cluster) Restore(ctx context.Context, fill func(ctx context.Context, dir string) error) error {
	nodes := append([]Node{c.st.Primary}, c.st.Standbys...)
	for _, n := range nodes {
		if c.running(c.nodeDir(n.Name)) {
			return fmt.Errorf("cluster %s: node %s is running; stop it (stop `pgtenant up`, which supervises it) before a restore", c.opts.Name, n.Name)
		}
	}
	stamp := time.Now().UTC().Format("20060102T150405")
	for _, n := range nodes {
		dir := c.nodeDir(n.Name)
		if _, err := os.Stat(dir); errors.Is(err, os.ErrNotExist) {
			continue
		}
		aside := dir + ".lost-" + stamp
		c.log.Warn("moving a node's directory aside for the restore", "dir", dir, "moved_to", aside)
		if err := os.Rename(dir, aside); err != nil {
			return err
		}
	}
	for i := range c.st.Standbys {
		c.st.Standbys[i].Ready = false
	}
	if err := c.saveState(); err != nil {
		return err
	}
	p := c.st.Primary
	dir := c.nodeDir(p.Name)
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return err
	}
	if err := c.user.own(dir); err != nil {
		return err
	}
	if err := fill(ctx, dir); err != nil {
		return err
	}
	// A backup read from a standby brings its standby.signal when there
	// was one: this node is the primary.
	_ = os.Remove(filepath.Join(dir, "standby.signal"))
	if err := c.writeConf(dir, p.Port); err != nil {
		return err
	}
	if err := c.startNode(ctx, p); err != nil {
		return err
	}
	for {
		conn, err := pgx.Connect(ctx, c.PrimaryDSN("postgres"))
		if err == nil {
			var recovering bool
			err = conn.QueryRow(ctx, "SELECT pg_catalog.pg_is_in_recovery()").Scan(&recovering)
			if err == nil && !recovering {
				err = resetRecovery(ctx, conn)
				conn.Close(context.WithoutCancel(ctx))
				if err != nil {
					return fmt.Errorf("cluster %s: the restored primary: %w", c.opts.Name, err)
				}
				c.log.Info("restored", "node", p.Name, "port", p.Port)
				return nil
			}
			conn.Close(context.WithoutCancel(ctx))
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("cluster %s: the restored primary is still recovering: %w (its log: %s)", c.opts.Name, ctx.Err(), filepath.Join(dir, "log"))
		case <-time.After(200 * time.Millisecond):
		}
	}
}

// recoverySettings are what a restore writes into postgresql.auto.conf.
var recoverySettings = []string{"restore_command", "recovery_target", "recovery_target_time", "recovery_target_xid",
	"recovery_target_lsn", "recovery_target_name", "recovery_target_inclusive", "recovery_target_timeline", "recovery_target_action"}

// resetRecovery removes a finished recovery's settings from
// postgresql.auto.conf: a standby made from this node copies the file, and
// with a recovery_target_time in the past it would stop there and promote
// itself instead of following the primary.
func resetRecovery(ctx context.Context, conn *pgx.Conn) error {
	for _, name := range recoverySettings {
		if _, err := conn.Exec(ctx, "ALTER SYSTEM RESET "+name); err != nil {
			return fmt.Errorf("reset %s: %w", name, err)
		}
	}
	return nil
}

func (c *Cluster) node(name string) (Node, bool) {
	if name == c.st.Primary.Name {
		return c.st.Primary, true
	}
	for _, s := range c.st.Standbys {
		if s.Name == name {
			return s, true
		}
	}
	return Node{}, false
}

func (c *Cluster) nodeDir(name string) string { return filepath.Join(c.opts.Dir, name) }

func (c *Cluster) statePath() string { return filepath.Join(c.opts.Dir, "cluster.json") }

func (c *Cluster) loadState() error {
	b, err := os.ReadFile(c.statePath())
	if errors.Is(err, os.ErrNotExist) {
		c.st = state{Primary: Node{Name: "primary"}}
		return nil
	}
	if err != nil {
		return err
	}
	if err := json.Unmarshal(b, &c.st); err != nil {
		return fmt.Errorf("read %s: %w (the file is damaged; restore it or move the directory aside)", c.statePath(), err)
	}
	return nil
}

func (c *Cluster) saveState() error {
	b, err := json.MarshalIndent(c.st, "", "  ")
	if err != nil {
		return err
	}
	tmp := c.statePath() + ".tmp"
	if err := os.WriteFile(tmp, b, 0o600); err != nil {
		return err
	}
	return os.Rename(tmp, c.statePath())
}

func (c *Cluster) loadPassword() (string, error) {
	return PasswordFile(filepath.Join(c.opts.Dir, "superuser.password"), "superuser password")
}

// PasswordFile returns the password kept in path, made (random, 0600) on
// first use; what names it in the error.
func PasswordFile(path, what string) (string, error) {
	if b, err := os.ReadFile(path); err == nil {
		return strings.TrimSpace(string(b)), nil
	}
	buf := make([]byte, 18)
	if _, err := rand.Read(buf); err != nil {
		return "", err
	}
	pw := hex.EncodeToString(buf)
	if err := os.WriteFile(path, []byte(pw+"\n"), 0o600); err != nil {
		return "", fmt.Errorf("store %s: %w", what, err)
	}
	return pw, nil
}

// ensurePrimary initialises the primary if needed and starts it.
func (c *Cluster) ensurePrimary(ctx context.Context) error {
	p := &c.st.Primary
	dir := c.nodeDir(p.Name)
	if !p.Ready {
		if err := c.moveAside(dir); err != nil {
			return err
		}
		if err := c.initdb(ctx, dir); err != nil {
			return err
		}
		if err := c.startOnFreePort(ctx, dir, p); err != nil {
			return err
		}
		p.Ready = true
		return c.saveState()
	}
	return c.startNode(ctx, *p)
}

func (c *Cluster) ensureStandby(ctx context.Context, s *Node) error {
	dir := c.nodeDir(s.Name)
	if !s.Ready {
		if err := c.moveAside(dir); err != nil {
			return err
		}
		if err := c.basebackup(ctx, dir, s.Name); err != nil {
			return err
		}
		if err := c.startOnFreePort(ctx, dir, s); err != nil {
			return err
		}
		s.Ready = true
		return c.saveState()
	}
	return c.startNode(ctx, *s)
}

// startOnFreePort starts a node made just now on a free port. A port is
// picked, not reserved: when another process binds it before the server
// does (tests start fleets side by side), another is picked, up to three
// times. A node that was made before keeps its recorded port (startNode).
func (c *Cluster) startOnFreePort(ctx context.Context, dir string, n *Node) error {
	for attempt := 0; ; attempt++ {
		port, err := FreePort()
		if err != nil {
			return err
		}
		n.Port = port
		if err := c.writeConf(dir, port); err != nil {
			return err
		}
		if err := c.saveState(); err != nil {
			return err
		}
		err = c.startNode(ctx, *n)
		if err == nil || attempt == 2 || !errors.Is(err, errPortInUse) {
			return err
		}
		c.log.Warn("the port picked for a new node was taken before it started; picking another", "node", n.Name, "port", port)
	}
}

// moveAside renames a half-made node directory out of the way, never deleting
// it: it may hold something the operator wants to look at.
func (c *Cluster) moveAside(dir string) error {
	if _, err := os.Stat(dir); errors.Is(err, os.ErrNotExist) {
		return nil
	}
	aside := fmt.Sprintf("%s.incomplete-%s", dir, time.Now().UTC().Format("20060102T150405"))
	c.log.Warn("found a half-made node directory; moving it aside and making it again", "dir", dir, "moved_to", aside)
	return os.Rename(dir, aside)
}

func (c *Cluster) initdb(ctx context.Context, dir string) error {
	// initdb runs as the server user, which cannot create entries in the
	// cluster dir: make the (empty) data dir and the password file for it.
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return err
	}
	pwfile := filepath.Join(c.opts.Dir, ".pwfile")
	if err := os.WriteFile(pwfile, []byte(c.password+"\n"), 0o600); err != nil {
		return err
	}
	defer os.Remove(pwfile)
	if err := c.user.own(dir); err != nil {
		return err
	}
	if err := c.user.own(pwfile); err != nil {
		return err
	}
	args := []string{"-D", dir, "-U", Superuser, "--pwfile=" + pwfile, "--auth=scram-sha-256",
		"--data-checksums", "--encoding=UTF8", "--locale=C"}
	if c.opts.Fast {
		args = append(args, "--no-sync")
	}
	c.log.Info("initdb", "dir", dir, "as_postgres_user", c.user.isOther())
	if err := c.run(ctx, c.bin.Path("initdb"), args...); err != nil {
		return fmt.Errorf("initdb: %w", err)
	}
	return nil
}

// SocketDir is the directory of the cluster's Unix sockets (SocketDirIn).
func (c *Cluster) SocketDir() string { return SocketDirIn(c.opts.Dir) }

// SocketDirIn is the directory of the Unix sockets of the cluster whose
// files are in dir: every node's socket, each at its own port, reached by
// the server OS user only (0700). A PgBouncer on this host reaches the
// primary there (pooler.server_socket_dir), which costs less CPU per
// query than TCP. "": dir is too long for a socket's path, or not a path
// pgbouncer.ini takes: TCP only.
func SocketDirIn(dir string) string {
	d := filepath.Join(dir, "sock")
	if config.CheckSocketDir(d) != nil {
		return ""
	}
	return d
}

// writeConf writes pgtenant.conf (our settings) and includes it from
// postgresql.conf, leaving postgresql.auto.conf to ALTER SYSTEM.
func (c *Cluster) writeConf(dir string, port int) error {
	settings := DefaultSettings()
	// cluster_name names the node in ps and, on a standby, becomes the
	// application_name the primary shows in pg_stat_replication.
	settings["cluster_name"] = "'" + c.opts.Name + "/" + filepath.Base(dir) + "'"
	if sd := c.SocketDir(); sd != "" {
		if err := os.MkdirAll(sd, 0o700); err != nil {
			return err
		}
		if err := c.user.own(sd); err != nil {
			return err
		}
		settings["unix_socket_directories"] = "'" + sd + "'"
	}
	for k, v := range c.opts.Settings {
		settings[k] = v
	}
	if c.opts.Metering {
		settings = WithMetering(settings, c.bin)
	}
	if c.opts.Fast {
		settings["fsync"] = "off"
	}
	if c.st.Backups {
		// On a standby archive_mode=on archives nothing until it is promoted.
		settings["archive_mode"] = "on"
		settings["archive_command"] = ArchiveCommand(c.pgbackrest, c.BackupConfigPath(), c.opts.Name)
		settings["archive_timeout"] = ArchiveTimeout
	}
	settings["port"] = strconv.Itoa(port)
	keys := make([]string, 0, len(settings))
	for k := range settings {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	var b strings.Builder
	b.WriteString("# Written by pgtenant; overwritten on every start. Use ALTER SYSTEM for local changes.\n")
	for _, k := range keys {
		fmt.Fprintf(&b, "%s = %s\n", k, settings[k])
	}
	if err := os.WriteFile(filepath.Join(dir, "pgtenant.conf"), []byte(b.String()), 0o600); err != nil {
		return err
	}
	main := filepath.Join(dir, "postgresql.conf")
	conf, err := os.ReadFile(main)
	if err != nil {
		return err
	}
	const include = "include_if_exists = 'pgtenant.conf'"
	if !strings.Contains(string(conf), include) {
		conf = append(conf, []byte("\n"+include+"\n")...)
		if err := os.WriteFile(main, conf, 0o600); err != nil {
			return err
		}
	}
	return c.user.own(dir)
}

func (c *Cluster) basebackup(ctx context.Context, dir, name string) error {
	slot := "pgt_" + name
	if err := c.ensureSlot(ctx, slot); err != nil {
		return err
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return err
	}
	if err := c.user.own(dir); err != nil {
		return err
	}
	args := []string{"-h", "127.0.0.1", "-p", strconv.Itoa(c.st.Primary.Port), "-U", Superuser,
		"-D", dir, "-R", "-X", "stream", "-c", "fast", "-S", slot}
	if c.opts.Fast {
		args = append(args, "--no-sync")
	}
	c.log.Info("pg_basebackup", "standby", name)
	cmd := c.user.command(c.bin.Path("pg_basebackup"), args...)
	cmd.Env = append(cmd.Env, "PGPASSWORD="+c.password)
	if out, err := runCmd(ctx, cmd); err != nil {
		return fmt.Errorf("pg_basebackup for %s: %w: %s", name, err, out)
	}
	return nil
}

// ensureSlot creates the standby's physical replication slot on the primary,
// reserving WAL immediately, so the standby never misses WAL it needs.
func (c *Cluster) ensureSlot(ctx context.Context, slot string) error {
	conn, err := pgx.Connect(ctx, c.PrimaryDSN("postgres"))
	if err != nil {
		return fmt.Errorf("connect to primary: %w", err)
	}
	defer conn.Close(ctx)
	_, err = conn.Exec(ctx, `SELECT pg_create_physical_replication_slot($1, true)
		WHERE NOT EXISTS (SELECT 1 FROM pg_replication_slots WHERE slot_name = $1)`, slot)
	if err != nil {
		return fmt.Errorf("create replication slot %s: %w", slot, err)
	}
	return nil
}

var errPortInUse = errors.New("port in use")

func (c *Cluster) startNode(ctx context.Context, n Node) error {
	dir := c.nodeDir(n.Name)
	if c.running(dir) {
		return nil
	}
	if !portFree(n.Port) {
		return fmt.Errorf("start %s: %w: port %d (recorded in %s) is taken by another process; stop that process and run again",
			n.Name, errPortInUse, n.Port, c.statePath())
	}
	logFile := filepath.Join(dir, "startup.log")
	err := c.run(ctx, c.bin.Path("pg_ctl"), "start", "-D", dir, "-l", logFile, "-w", "-t", "300")
	if err != nil {
		tail := tailFile(logFile, 2048) + tailNewestLog(filepath.Join(dir, "log"), 2048)
		if strings.Contains(tail, "Address already in use") || strings.Contains(tail, "could not bind") {
			return fmt.Errorf("start %s: %w: port %d", n.Name, errPortInUse, n.Port)
		}
		return fmt.Errorf("start %s: %w\n%s", n.Name, err, tail)
	}
	c.log.Info("started", "node", n.Name, "port", n.Port)
	return nil
}

// running reports whether a postmaster runs on the data dir (pg_ctl status).
func (c *Cluster) running(dir string) bool {
	if _, err := os.Stat(filepath.Join(dir, "postmaster.pid")); err != nil {
		return false
	}
	cmd := c.user.command(c.bin.Path("pg_ctl"), "status", "-D", dir)
	return cmd.Run() == nil
}

func (c *Cluster) run(ctx context.Context, name string, args ...string) error {
	out, err := runCmd(ctx, c.user.command(name, args...))
	if err != nil {
		return fmt.Errorf("%s: %w: %s", filepath.Base(name), err, strings.TrimSpace(out))
	}
	return nil
}

// WithMetering returns settings with pg_stat_statements and pg_stat_kcache
// added to shared_preload_libraries when b's server has pg_stat_kcache's
// library (Debian: postgresql-15-pg-stat-kcache): usage metering reads each
// tenant's CPU seconds from it (docs/operations/usage.md). Without the
// library settings are returned as they are, CPU is not measured, and the
// server starts as before. Loading a library takes a restart.
func WithMetering(settings map[string]string, b Binaries) map[string]string {
	if _, err := os.Stat(filepath.Join(b.Dir, "..", "lib", "pg_stat_kcache.so")); err != nil {
		return settings
	}
	cur := strings.Trim(settings["shared_preload_libraries"], "'")
	libs := []string{}
	for _, l := range strings.Split(cur, ",") {
		if l = strings.TrimSpace(l); l != "" {
			libs = append(libs, l)
		}
	}
	for _, want := range []string{"pg_stat_statements", "pg_stat_kcache"} {
		if !slices.Contains(libs, want) {
			libs = append(libs, want)
		}
	}
	out := maps.Clone(settings)
	out["shared_preload_libraries"] = "'" + strings.Join(libs, ",") + "'"
	return out
}
