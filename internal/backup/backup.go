// Package backup owns pgBackRest for the managed clusters that `pgtenant up`
// makes: per cluster a stanza named after it, its config file, a posix
// repository under the cluster directory, WAL archiving (archive-push,
// async) and full, differential and incremental backups, and what
// `pgbackrest info` says about them. It never reconfigures PostgreSQL
// itself: internal/fleet writes archive_command (Options.Backups) so that a
// cluster archives from its creation, pointing at ConfigPath.
//
// An external cluster's stanza (its config's backup block, ForExternal) is
// its operator's: it is read and restored from, the same way, but nothing
// of it is ever written and no backup of it is ever taken here.
package backup

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/pgtenant/pgtenant/internal/fleet"
)

// InstallHint says how to get pgBackRest.
const InstallHint = "apt-get install -y pgbackrest"

// ErrNoPgBackRest is returned when the pgbackrest program is not found.
var ErrNoPgBackRest = errors.New("pgbackrest is not installed (" + InstallHint + ")")

// ErrNotConfigured is returned for a cluster that pgtenant does not back
// up: one that `pgtenant up` made before pgbackrest was installed, or one
// registered from outside.
var ErrNotConfigured = errors.New("no backups configured: pgtenant backs up the clusters `pgtenant up` makes " +
	"when pgbackrest is installed (" + InstallHint + ", then run up again); a cluster made before that, or " +
	"registered with `cluster add`, has none")

// Find returns the path of the pgbackrest program.
func Find() (string, error) {
	p, err := exec.LookPath("pgbackrest")
	if err != nil {
		return "", ErrNoPgBackRest
	}
	return p, nil
}

// Types of backup, as pgBackRest names them.
const (
	Full = "full"
	Diff = "diff"
	Incr = "incr"
)

// ValidType reports whether t is a backup type.
func ValidType(t string) bool { return t == Full || t == Diff || t == Incr }

// Stanza is pgBackRest set up for one managed cluster. Every file under Dir
// belongs to the servers' OS user: the archiver runs archive-push as it.
type Stanza struct {
	Name    string // the stanza, the cluster's name
	Dir     string // <cluster dir>/backup: config, repo, log, spool, lock
	Program string // the pgbackrest program
	Primary Node
	Standby *Node // backups are taken from it when set
	// Retention is the recovery window kept, whole days (backups.retention;
	// 0: RetentionDays).
	Retention time.Duration
	// External: the stanza is an external cluster's own (ForExternal). Dir,
	// Primary and Standby are then unset: its config says where things are.
	External bool

	configPath string
	password   string
	user       fleet.OSUser
	// superuser is the role scratch instances are entered as: the managed
	// clusters' superuser, or the external cluster DSN's user.
	superuser string
	// cluster is the cluster's name (Name is the operator's stanza for an
	// external one); scratchRoot and repoPath are an external stanza's
	// (external.go).
	cluster     string
	scratchRoot string
	repoPath    string
	// infoRuns counts its `info` commands; changes its other commands
	// (backups, expires, stanza changes), after which a cached info is stale.
	infoRuns, changes atomic.Int64
}

// Node is one server pgBackRest reads: its data dir and port.
type Node struct {
	Path string
	Port int
}

// ConfigPath is the stanza's pgbackrest.conf. It is absolute: pgBackRest
// resolves a relative --config against its own working directory, which is
// the data dir when the archiver runs it.
func (s *Stanza) ConfigPath() string { return s.configPath }

// RepoPath is the posix repository; for an external stanza the one its
// config names, "" when that is not a directory on this host (ErrRepoNotLocal).
func (s *Stanza) RepoPath() string {
	if s.External {
		return s.repoPath
	}
	return filepath.Join(s.Dir, "repo")
}

// ForCluster describes the stanza of a managed cluster that archives
// (fleet.Options.Backups), taking backups from its first standby when it
// has one and fromStandby. Nothing is written; Setup does.
func ForCluster(fc *fleet.Cluster, fromStandby bool) (*Stanza, error) {
	if !fc.Backups() {
		return nil, fmt.Errorf("cluster %s: %w", fc.Name(), ErrNotConfigured)
	}
	s, err := ownStanza(fc.Name(), fc.BackupDir(), fc.BackupConfigPath(), fleet.Superuser, fc.Password())
	if err != nil {
		return nil, err
	}
	s.Primary = Node{Path: fc.DataDir(fc.Primary().Name), Port: fc.Primary().Port}
	if sbs := fc.Standbys(); fromStandby && len(sbs) > 0 && sbs[0].Ready {
		s.Standby = &Node{Path: fc.DataDir(sbs[0].Name), Port: sbs[0].Port}
	}
	return s, nil
}

// ownStanza is the stanza of a cluster pgtenant runs (up's, itself or
// under Patroni): its files in dir, config at configPath, its servers
// reached as superuser with password; its nodes are the caller's to set.
func ownStanza(name, dir, configPath, superuser, password string) (*Stanza, error) {
	prog, err := Find()
	if err != nil {
		return nil, err
	}
	user, err := fleet.ServerUser()
	if err != nil {
		return nil, err
	}
	return &Stanza{Name: name, Dir: dir, Program: prog, configPath: configPath, password: password, user: user,
		superuser: superuser, cluster: name}, nil
}

// config is pgbackrest.conf. Retention is by time: full backups (and the
// WAL they need) are expired once a newer full backup is older than
// RetentionDays(), so the recovery window always covers that many days.
func (s *Stanza) config() string {
	var b strings.Builder
	b.WriteString("# Written by pgtenant (internal/backup); overwritten on every start.\n[global]\n")
	kv := func(k, v string) { fmt.Fprintf(&b, "%s=%s\n", k, v) }
	kv("repo1-path", s.RepoPath())
	kv("repo1-retention-full-type", "time")
	kv("repo1-retention-full", strconv.Itoa(s.RetentionDays()))
	kv("log-path", filepath.Join(s.Dir, "log"))
	kv("lock-path", filepath.Join(s.Dir, "lock"))
	kv("spool-path", filepath.Join(s.Dir, "spool"))
	// Async: the archiver hands segments to a background pgbackrest that
	// pushes several at once, so archive_command returns fast under load.
	kv("archive-async", "y")
	kv("compress-type", "lz4")
	// Small files bundled into a few repository files (and empty ones
	// kept in the manifest only): a tenant fleet is mostly small relation
	// files, and a backup of one file per file spends its time creating
	// and syncing them (bench density --backup: 3–6× faster bundled).
	kv("repo1-bundle", "y")
	kv("start-fast", "y") // an asked-for backup starts now, not at the next checkpoint
	kv("log-level-console", "warn")
	kv("log-level-file", "info")
	fmt.Fprintf(&b, "\n[%s]\n", s.Name)
	kv("pg1-path", s.Primary.Path)
	if s.Primary.Port != 0 { // 0: a cluster not made yet
		kv("pg1-port", strconv.Itoa(s.Primary.Port))
	}
	kv("pg1-user", s.superuser)
	if s.Standby != nil {
		kv("pg2-path", s.Standby.Path)
		kv("pg2-port", strconv.Itoa(s.Standby.Port))
		kv("pg2-user", s.superuser)
		kv("backup-standby", "y")
	}
	return b.String()
}

// RetentionDays is the default recovery window the repository keeps, in days.
const RetentionDays = 7

// RetentionDays is how many days of recovery window the repository keeps:
// Retention rounded up to whole days (pgBackRest counts time-based
// retention in days), RetentionDays when unset.
func (s *Stanza) RetentionDays() int {
	if s.Retention <= 0 {
		return RetentionDays
	}
	day := 24 * time.Hour
	return int((s.Retention + day - 1) / day)
}

// Prepare writes the config, the passfile and the directories, all owned
// by the servers' OS user. `up` runs it before it starts a cluster being
// made, so that the archiver finds the config from the first segment on
// (ports are not known yet; archive-push does not need them), and Setup
// again once it runs. An external stanza's config is its operator's:
// nothing is written.
func (s *Stanza) Prepare() error {
	if s.External {
		return nil
	}
	for _, d := range []string{s.Dir, s.RepoPath(), filepath.Join(s.Dir, "log"), filepath.Join(s.Dir, "lock"), filepath.Join(s.Dir, "spool")} {
		if _, err := os.Stat(d); err == nil {
			continue // owned when made; not walked again (the repository grows large)
		}
		if err := os.MkdirAll(d, 0o750); err != nil {
			return fmt.Errorf("backup dirs: %w", err)
		}
		if err := s.user.Own(d); err != nil {
			return fmt.Errorf("give %s to the server user: %w", d, err)
		}
	}
	// libpq reads the password from the passfile; PGPASSWORD would show in
	// the process's environment.
	pass := fmt.Sprintf("127.0.0.1:*:*:%s:%s\n", s.superuser, s.password)
	for path, body := range map[string]string{s.ConfigPath(): s.config(), s.passFile(): pass} {
		if err := os.WriteFile(path, []byte(body), 0o600); err != nil {
			return fmt.Errorf("write %s: %w", path, err)
		}
		if err := s.user.Own(path); err != nil {
			return fmt.Errorf("give %s to the server user: %w", path, err)
		}
	}
	return nil
}

// Setup runs Prepare and creates the stanza once: a repository that has
// it already is left as it is (stanza-create would take the archive lock,
// which the archiver's async archive-push holds while it pushes what
// piled up during a restart). An external stanza exists already, made by
// its operator: nothing is run.
func (s *Stanza) Setup(ctx context.Context) error {
	if s.External {
		return nil
	}
	if err := s.Prepare(); err != nil {
		return err
	}
	if s.created() {
		return nil
	}
	return s.createStanza(ctx)
}

// createStanza runs stanza-create, again while it finds the archive lock
// taken (pgBackRest's error 50): a new cluster archives from its first
// segments, and the archiver's async archive-push holds that lock for a
// moment, even while its push fails for want of the stanza.
func (s *Stanza) createStanza(ctx context.Context) error {
	deadline := time.Now().Add(lockWait)
	for {
		_, err := s.run(ctx, "stanza-create")
		var exit *exec.ExitError
		if err == nil || !errors.As(err, &exit) || exit.ExitCode() != lockBusy || time.Now().After(deadline) {
			return err
		}
		select {
		case <-ctx.Done():
			return err
		case <-time.After(250 * time.Millisecond):
		}
	}
}

// lockBusy is pgBackRest's exit code when a lock it needs is held
// (LockAcquireError); lockWait is how long stanza-create waits for one.
const (
	lockBusy = 50
	lockWait = 30 * time.Second
)

// created reports whether the repository holds the stanza (its archive
// and backup info files, which stanza-create writes).
func (s *Stanza) created() bool {
	for _, f := range []string{filepath.Join(s.RepoPath(), "archive", s.Name, "archive.info"), filepath.Join(s.RepoPath(), "backup", s.Name, "backup.info")} {
		if _, err := os.Stat(f); err != nil {
			return false
		}
	}
	return true
}

func (s *Stanza) passFile() string { return filepath.Join(s.Dir, "pgpass") }

// Backup takes a backup of type typ (full, diff, incr) and returns once
// pgBackRest has finished it (and expired what retention lets go).
func (s *Stanza) Backup(ctx context.Context, typ string) error {
	return s.BackupStarted(ctx, typ, nil)
}

// startedLine is what pgBackRest (2.45) logs at info once the backup's
// start (pg_backup_start, with its immediate checkpoint) has returned.
const startedLine = "backup start archive = "

// BackupStarted is Backup that calls started (when not nil) once the
// backup's start checkpoint on the primary is done and pgBackRest copies
// files; at the latest when the backup ends. Options (pgBackRest's, such
// as --no-repo1-bundle) override the stanza's config for this backup.
func (s *Stanza) BackupStarted(ctx context.Context, typ string, started func(), options ...string) error {
	if !ValidType(typ) {
		return fmt.Errorf("backup type %q: want full, diff or incr", typ)
	}
	if s.External {
		return s.externalError()
	}
	var once sync.Once
	call := func() {
		if started != nil {
			once.Do(started)
		}
	}
	defer call()
	backup := func(args ...string) error {
		_, err := s.runLines(ctx, func(line string) {
			if strings.Contains(line, startedLine) {
				call()
			}
		}, append(args, "--log-level-console=info", "--type="+typ, "backup")...)
		return err
	}
	err := backup(options...)
	if s.Standby != nil && noStandby(err) {
		// The standby is down or not streaming yet (a node restarting
		// after a failover): the backup is taken from the primary.
		err = backup(append(options, "--no-backup-standby")...)
	}
	return err
}

// noStandby reports whether pgBackRest ended with its "unable to find
// standby cluster" (exit code 56): backup-standby found none running.
func noStandby(err error) bool {
	var exit *exec.ExitError
	return errors.As(err, &exit) && exit.ExitCode() == 56
}

// run runs a pgbackrest command as the servers' OS user. pgBackRest
// reaches PostgreSQL through libpq: the managed servers listen on TCP only,
// so PGHOST points it at the loopback address (pg1-socket-path takes a
// directory, not a host).
func (s *Stanza) run(ctx context.Context, args ...string) ([]byte, error) {
	return s.runLines(ctx, nil, args...)
}

// runLines is run calling onLine (when not nil) with each line of
// standard output as it comes.
func (s *Stanza) runLines(ctx context.Context, onLine func(string), args ...string) ([]byte, error) {
	all := append([]string{"--config=" + s.ConfigPath(), "--stanza=" + s.Name}, s.externalArgs()...)
	all = append(all, args...)
	cmd := s.user.Command(s.Program, all...)
	if args[len(args)-1] == "info" {
		s.infoRuns.Add(1)
	} else {
		defer s.changes.Add(1)
	}
	if s.External {
		// pgBackRest reaches the servers as the operator's config says
		// (pg1-socket-path, pg1-port, pg1-user, pg1-host), with the OS
		// user's own credentials, as the operator's pgbackrest does.
		cmd.Dir = "/"
	} else {
		cmd.Dir = s.Dir
		cmd.Env = append(cmd.Env, "PGHOST=127.0.0.1", "PGPASSFILE="+s.passFile(), "PGSSLMODE=disable")
	}
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	if onLine != nil {
		cmd.Stdout = &lineWriter{buf: &out, fn: onLine}
	}
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("pgbackrest %s: %w", args[len(args)-1], err)
	}
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	var err error
	select {
	case err = <-done:
	case <-ctx.Done():
		// SIGTERM lets pgBackRest stop its local processes and release its
		// lock; a backup it leaves half-made is resumed or cleaned by the next.
		_ = cmd.Process.Signal(os.Interrupt)
		select {
		case err = <-done:
		case <-time.After(10 * time.Second):
			_ = cmd.Process.Kill()
			err = <-done
		}
		if err == nil {
			err = ctx.Err()
		}
	}
	if err != nil {
		msg := strings.TrimSpace(errb.String() + "\n" + out.String())
		return out.Bytes(), fmt.Errorf("pgbackrest %s: %w: %s", args[len(args)-1], err, msg)
	}
	return out.Bytes(), nil
}

// lineWriter keeps what is written in buf and calls fn with each complete
// line. exec.Cmd copies a pipe into it from one goroutine.
type lineWriter struct {
	buf  *bytes.Buffer
	fn   func(string)
	part []byte
}

func (w *lineWriter) Write(p []byte) (int, error) {
	w.buf.Write(p)
	w.part = append(w.part, p...)
	for {
		i := bytes.IndexByte(w.part, '\n')
		if i < 0 {
			return len(p), nil
		}
		w.fn(string(w.part[:i]))
		w.part = w.part[i+1:]
	}
}
