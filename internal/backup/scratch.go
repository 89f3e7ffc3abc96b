package backup

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pgtenant/pgtenant/internal/cluster"
	"github.com/pgtenant/pgtenant/internal/config"
	"github.com/pgtenant/pgtenant/internal/fleet"
)

// Scratch is a throwaway PostgreSQL instance restored from a stanza's
// repository to a point in time, on a free loopback port: what a rewind
// or a fork reads a tenant's past from. It never archives (its WAL would
// go into the cluster's own archive as a new timeline) and nothing but
// pgtenant connects to it. Remove stops it and deletes its files.
type Scratch struct {
	Dir  string
	Port int

	password string
	role     string // the superuser the instance is entered as
	user     fleet.OSUser
	pgctl    string
}

// ScratchDir is where the scratch instance named name lives: beside the
// repository, on the same disk; for an external stanza, in the daemon's
// scratch root (ForExternal), named after the cluster too.
func (s *Stanza) ScratchDir(name string) string {
	if s.External {
		return filepath.Join(s.scratchRoot, s.cluster+"-"+name)
	}
	return filepath.Join(filepath.Dir(s.Dir), "scratch", name)
}

// scratch is the scratch instance named name.
func (s *Stanza) scratch(name string, pgctl string) *Scratch {
	return &Scratch{Dir: s.ScratchDir(name), password: s.password, role: s.superuser, user: s.user, pgctl: pgctl}
}

// ErrNoRoom is a scratch restore the disk has not room for.
var ErrNoRoom = errors.New("not enough free disk")

// scratchMargin is the free space a scratch restore needs beyond its
// database: the system databases, the WAL its recovery replays and the
// copy's temporary files.
const scratchMargin = 1 << 30

// ScratchRoom refuses a scratch restore (name) of a database of about size
// bytes where the disk that would hold it has not that much free and
// scratchMargin: what a rewind or a fork checks before it starts.
func (s *Stanza) ScratchRoom(name string, size int64) error {
	dir := s.ScratchDir(name)
	for { // the nearest directory that exists: the disk it will be on
		if _, err := os.Stat(dir); err == nil || filepath.Dir(dir) == dir {
			break
		}
		dir = filepath.Dir(dir)
	}
	d, err := DiskOf(dir)
	if err != nil {
		return err
	}
	if need := size + scratchMargin; need > d.Free {
		return fmt.Errorf("%w: the scratch instance needs about %s free in %s (the database, %s now, and %s for the system databases and the WAL its recovery replays), which has %s: free some first",
			ErrNoRoom, config.ByteSize(need).Human(), dir, config.ByteSize(size).Human(), config.ByteSize(scratchMargin).Human(), config.ByteSize(d.Free).Human())
	}
	return nil
}

// ErrTargetNotReached is a restore whose archive ends before its target.
var ErrTargetNotReached = errors.New("the archive ends before the time asked for")

// Check makes the WAL written so far restorable: pgbackrest check switches
// to a new segment and waits until the archive has the old one.
func (s *Stanza) Check(ctx context.Context) error {
	_, err := s.run(ctx, "check")
	return err
}

// RestoreScratch restores the cluster as it was at target into the
// scratch instance name (what an earlier attempt left there is removed
// first), starts it and waits until recovery has reached target and the
// instance is promoted. The WAL written up to now is archived (Check)
// while the backup's files are restored: the recovery stops at the first
// commit after target, and fails when the archive holds none. databases,
// when not empty, are the only ones restored in full (pgBackRest's
// --db-include: the others are left as empty files the instance cannot
// open, so only they may be read); when the backup predates one of them,
// everything is restored.
func (s *Stanza) RestoreScratch(ctx context.Context, name string, target time.Time, databases []string) (*Scratch, error) {
	bin, err := fleet.FindBinaries(15)
	if err != nil {
		return nil, err
	}
	sc := s.scratch(name, bin.Path("pg_ctl"))
	if err := sc.Remove(ctx); err != nil {
		return nil, err
	}
	// Its own spool and lock paths: a restore empties the spool's archive
	// queue, where the live cluster's async archive-push writes the status
	// of each segment it pushed (its archive_command then waited for a
	// status that was gone, for archive-timeout, at every segment).
	args := []string{"--pg1-path=" + sc.Dir, "--spool-path=" + sc.Dir + ".spool", "--lock-path=" + sc.Dir + ".lock", "--type=time", "--target=" + targetTime(target),
		"--target-action=promote", "--archive-mode=off", "--log-level-console=warn"}
	args = append(args, s.onThisHost()...)
	restore := func(include []string) error {
		if err := sc.mkdir(); err != nil {
			return err
		}
		a := append([]string(nil), args...)
		for _, db := range include {
			a = append(a, "--db-include="+db)
		}
		_, err := s.run(ctx, append(a, "restore")...)
		return err
	}
	cctx, stopCheck := context.WithCancel(ctx) // a failed restore stops it
	defer stopCheck()
	archived := make(chan error, 1)
	go func() { archived <- s.Check(cctx) }()
	err = restore(databases)
	if err != nil && len(databases) > 0 && strings.Contains(err.Error(), "does not exist") {
		// A database made after the backup: pgBackRest refuses to include
		// what the backup does not have; the WAL replay makes it.
		if rerr := sc.Remove(ctx); rerr != nil {
			return nil, rerr
		}
		err = restore(nil)
	}
	if err == nil {
		err = <-archived
	}
	if err != nil {
		return nil, errors.Join(err, sc.Remove(context.WithoutCancel(ctx)))
	}
	// archive-get without async: an async one takes the stanza's archive
	// lock, which the live cluster's async archive-push holds while it
	// pushes, and waited up to archive-timeout (a minute) at each segment
	// the recovery asked for.
	get := fmt.Sprintf("%s --config=%s --stanza=%s --pg1-path=%s --no-archive-async %sarchive-get %%f \"%%p\"", s.Program, s.ConfigPath(), s.Name, sc.Dir,
		strings.Join(append(append(s.externalArgs(), s.onThisHost()...), ""), " "))
	if err := sc.start(ctx, get); err != nil {
		return nil, errors.Join(err, sc.Remove(context.WithoutCancel(ctx)))
	}
	return sc, nil
}

func (sc *Scratch) mkdir() error {
	if err := os.MkdirAll(filepath.Dir(sc.Dir), 0o750); err != nil {
		return err
	}
	if err := sc.user.Own(filepath.Dir(sc.Dir)); err != nil {
		return err
	}
	if err := os.Mkdir(sc.Dir, 0o700); err != nil {
		return err
	}
	return sc.user.Own(sc.Dir)
}

// start gives the restored data dir its own port and settings and starts
// it; pg_ctl returns once recovery is over (hot_standby off: the instance
// takes connections only once promoted).
func (sc *Scratch) start(ctx context.Context, restoreCommand string) error {
	port, err := fleet.FreePort()
	if err != nil {
		return err
	}
	sc.Port = port
	// Its own pg_hba.conf, and a postgresql.conf when the data dir had
	// none: a cluster may keep both outside its data dir (Debian's
	// /etc/postgresql), where an external cluster's restore does not
	// bring them. md5 takes a SCRAM secret too. ssl off: the certificate
	// files of the cluster may not be on this host, and nothing but
	// pgtenant, over the loopback, connects.
	hba := filepath.Join(sc.Dir, "pgtenant_scratch_hba.conf")
	files := map[string]string{hba: "host all all 127.0.0.1/32 md5\n"}
	if _, err := os.Stat(filepath.Join(sc.Dir, "postgresql.conf")); errors.Is(err, os.ErrNotExist) {
		files[filepath.Join(sc.Dir, "postgresql.conf")] = "# pgtenant scratch instance: its settings are in postgresql.auto.conf.\n"
	}
	for path, body := range files {
		if err := os.WriteFile(path, []byte(body), 0o600); err != nil {
			return fmt.Errorf("scratch config: %w", err)
		}
		if err := sc.user.Own(path); err != nil {
			return fmt.Errorf("scratch config: %w", err)
		}
	}
	extra := fmt.Sprintf(`
# pgtenant scratch instance: a restore read by a rewind or a fork, then removed.
port = %d
listen_addresses = '127.0.0.1'
unix_socket_directories = ''
hba_file = '%s'
ssl = off
hot_standby = off
archive_mode = off
# No standby: a restored primary of a synchronous cluster (Patroni) would wait for one at each commit.
synchronous_standby_names = ''
synchronous_commit = local
shared_buffers = '128MB'
cluster_name = 'pgtenant-scratch'
shared_preload_libraries = ''
restore_command = '%s'
`, port, strings.ReplaceAll(hba, "'", "''"), strings.ReplaceAll(restoreCommand, "'", "''"))
	auto := filepath.Join(sc.Dir, "postgresql.auto.conf")
	f, err := os.OpenFile(auto, os.O_APPEND|os.O_WRONLY, 0o600)
	if err != nil {
		return fmt.Errorf("scratch config: %w", err)
	}
	_, err = f.WriteString(extra)
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return fmt.Errorf("scratch config: %w", err)
	}
	// Restored from a standby's backup: not a standby here.
	_ = os.Remove(filepath.Join(sc.Dir, "standby.signal"))
	logFile := filepath.Join(sc.Dir, "startup.log")
	cmd := sc.user.Command(sc.pgctl, "start", "-D", sc.Dir, "-l", logFile, "-w", "-t", "3600")
	out, err := cmd.CombinedOutput()
	if err != nil {
		tail := tail(logFile)
		if strings.Contains(tail, "before configured recovery target was reached") {
			return fmt.Errorf("start the scratch instance: %w: %s", ErrTargetNotReached, tail)
		}
		return fmt.Errorf("start the scratch instance: %w: %s\n%s", err, strings.TrimSpace(string(out)), tail)
	}
	for {
		conn, err := sc.Connect(ctx, "postgres")
		if err == nil {
			var recovering bool
			err = conn.QueryRow(ctx, "SELECT pg_catalog.pg_is_in_recovery()").Scan(&recovering)
			conn.Close(context.WithoutCancel(ctx))
			if err == nil && !recovering {
				return nil
			}
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(200 * time.Millisecond):
		}
	}
}

func tail(path string) string {
	b, _ := os.ReadFile(path)
	if len(b) > 2048 {
		b = b[len(b)-2048:]
	}
	return strings.TrimSpace(string(b))
}

// DSN is a superuser's connection string to database on the instance.
func (sc *Scratch) DSN(database string) string {
	return fmt.Sprintf("host=127.0.0.1 port=%d user=%s password=%s dbname=%s sslmode=disable application_name=pgtenant-scratch",
		sc.Port, quoteValue(sc.role), quoteValue(sc.password), quoteValue(database))
}

// Connect opens a superuser session on database of the instance, with the
// settings every pgtenant session pins (cluster.PinnedSettings): the
// restored databases carry what their tenants set on them and on their
// roles, and nothing of it may change how pgtenant's SQL resolves there.
func (sc *Scratch) Connect(ctx context.Context, database string) (*pgx.Conn, error) {
	return cluster.ConnectDSN(ctx, sc.DSN(database), "")
}

func quoteValue(v string) string {
	return "'" + strings.NewReplacer(`\`, `\\`, `'`, `\'`).Replace(v) + "'"
}

// Remove stops the instance (immediate: nothing of it is kept) and
// deletes its directory. Removing what is not there is not an error.
func (sc *Scratch) Remove(ctx context.Context) error {
	if _, err := os.Stat(filepath.Join(sc.Dir, "postmaster.pid")); err == nil {
		cmd := sc.user.Command(sc.pgctl, "stop", "-D", sc.Dir, "-m", "immediate", "-w", "-t", "60")
		if out, err := cmd.CombinedOutput(); err != nil && !strings.Contains(string(out), "is not running") &&
			!strings.Contains(string(out), "does not exist") {
			return fmt.Errorf("stop the scratch instance in %s: %w: %s", sc.Dir, err, strings.TrimSpace(string(out)))
		}
	}
	for _, d := range []string{sc.Dir, sc.Dir + ".spool", sc.Dir + ".lock"} {
		if err := os.RemoveAll(d); err != nil {
			return fmt.Errorf("remove the scratch instance: %w", err)
		}
	}
	return nil
}

// ScratchFor is the scratch instance name of a stanza, to remove what a
// daemon killed during a restore left behind.
func (s *Stanza) ScratchFor(name string) *Scratch {
	bin, _ := fleet.FindBinaries(15)
	return s.scratch(name, bin.Path("pg_ctl"))
}
