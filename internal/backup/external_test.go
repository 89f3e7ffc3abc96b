package backup_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net/http"
	"os"
	"os/user"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pgtenant/pgtenant/internal/api"
	"github.com/pgtenant/pgtenant/internal/backup"
	"github.com/pgtenant/pgtenant/internal/backup/backuptest"
	"github.com/pgtenant/pgtenant/internal/catalog"
	"github.com/pgtenant/pgtenant/internal/config"
	"github.com/pgtenant/pgtenant/internal/daemon"
	"github.com/pgtenant/pgtenant/internal/daemon/daemontest"
	"github.com/pgtenant/pgtenant/internal/doctor"
	"github.com/pgtenant/pgtenant/internal/fleet"
	"github.com/pgtenant/pgtenant/internal/jobs"
	"github.com/pgtenant/pgtenant/internal/pgtest"
	"github.com/pgtenant/pgtenant/internal/provision"
	"github.com/pgtenant/pgtenant/internal/templates"
	"github.com/pgtenant/pgtenant/internal/tenant"
)

// opsStanza is the stanza the operator of the external test cluster runs.
const opsStanza = "ops-main"

// external is a cluster pgtenant did not make, archiving and backed up
// by its operator with pgBackRest: the files the operator owns are under
// ops, and the block that registers its stanza is block.
type external struct {
	pg    *pgtest.Cluster
	ops   string // the operator's directory: pgbackrest.conf, repo, log, lock, socket
	block config.ClusterBackupConfig
	prog  string
	user  fleet.OSUser
}

// startExternal starts a cluster and sets up pgBackRest on it as an
// operator would, with none of pgtenant's code: a config of their own, a
// socket the servers' OS user reaches by peer authentication (mapped to
// pgtenant's superuser), stanza-create, archive_command by ALTER SYSTEM,
// one full backup.
func startExternal(t *testing.T, ctx context.Context) *external {
	t.Helper()
	prog, err := backup.Find()
	if err != nil {
		t.Skip(err)
	}
	osUser, err := fleet.ServerUser()
	if err != nil {
		t.Fatal(err)
	}
	ops, err := os.MkdirTemp("", "pgtest-ops-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(ops) })
	for _, d := range []string{ops, filepath.Join(ops, "repo"), filepath.Join(ops, "log"), filepath.Join(ops, "lock"), filepath.Join(ops, "sock")} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	if err := osUser.Own(ops); err != nil {
		t.Fatal(err)
	}
	// Archiving on from the start (archive_mode needs a restart), with no
	// command yet: segments wait in pg_wal until the stanza exists.
	pg, err := pgtest.Start(ctx, pgtest.Options{Name: "ext", Settings: map[string]string{
		"archive_mode": "on", "archive_command": "''", "unix_socket_directories": "'" + filepath.Join(ops, "sock") + "'"}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pg.Close)
	data := pg.DataDir(pg.Primary().Name)
	osName := "postgres"
	if !osUser.IsOther() {
		u, err := user.Current()
		if err != nil {
			t.Fatal(err)
		}
		osName = u.Username
	}
	// pgBackRest connects over the socket as the OS user, mapped to the
	// superuser: no password anywhere.
	prepend(t, filepath.Join(data, "pg_hba.conf"), "local all "+fleet.Superuser+" peer map=ops\n")
	appendFile(t, filepath.Join(data, "pg_ident.conf"), "ops "+osName+" "+fleet.Superuser+"\n")
	conf := filepath.Join(ops, "pgbackrest.conf")
	body := fmt.Sprintf(`# The operator's own: pgtenant must never write it.
[global]
repo1-path=%s
repo1-retention-full=2
log-path=%s
lock-path=%s
start-fast=y
log-level-console=warn

[%s]
pg1-path=%s
pg1-port=%d
pg1-socket-path=%s
pg1-user=%s
`, filepath.Join(ops, "repo"), filepath.Join(ops, "log"), filepath.Join(ops, "lock"), opsStanza, data, pg.Primary().Port,
		filepath.Join(ops, "sock"), fleet.Superuser)
	if err := os.WriteFile(conf, []byte(body), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := osUser.Own(ops); err != nil {
		t.Fatal(err)
	}
	e := &external{pg: pg, ops: ops, prog: prog, user: osUser, block: config.ClusterBackupConfig{Stanza: opsStanza, Config: conf}}
	backuptest.Exec(t, ctx, pg.PrimaryDSN("postgres"), `SELECT pg_catalog.pg_reload_conf()`)
	e.operator(t, ctx, "stanza-create")
	cmd := strings.Trim(fleet.ArchiveCommand(prog, conf, opsStanza), "'")
	backuptest.Exec(t, ctx, pg.PrimaryDSN("postgres"), `ALTER SYSTEM SET archive_command = '`+strings.ReplaceAll(cmd, "'", "''")+`'`)
	backuptest.Exec(t, ctx, pg.PrimaryDSN("postgres"), `SELECT pg_catalog.pg_reload_conf()`)
	return e
}

// operator runs pgbackrest as the operator does, on their config.
func (e *external) operator(t *testing.T, ctx context.Context, args ...string) {
	t.Helper()
	all := append([]string{"--config=" + e.block.Config, "--stanza=" + opsStanza}, args...)
	out, err := e.user.Command(e.prog, all...).CombinedOutput()
	if err != nil {
		t.Fatalf("pgbackrest %s: %v: %s", strings.Join(args, " "), err, out)
	}
}

// files is every file of the operator's directory but the repository
// (which archiving writes to), with its bytes: what pgtenant must leave
// as it is. The socket's lock file is left out too: the server rewrites it.
func (e *external) files(t *testing.T) map[string]string {
	t.Helper()
	out := map[string]string{}
	err := filepath.WalkDir(e.ops, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(e.ops, p)
		if rel == "repo" || rel == "sock" {
			return fs.SkipDir
		}
		if d.Type().IsRegular() {
			b, err := os.ReadFile(p)
			if err != nil {
				return err
			}
			out[rel] = string(b)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return out
}

func prepend(t *testing.T, path, line string) {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, append([]byte(line), b...), 0o600); err != nil {
		t.Fatal(err)
	}
}

func appendFile(t *testing.T, path, line string) {
	t.Helper()
	f, err := os.OpenFile(path, os.O_APPEND|os.O_WRONLY, 0o600)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if _, err := f.WriteString(line); err != nil {
		t.Fatal(err)
	}
}

// stateDir is a directory for the daemon's token (and so its scratch
// instances) that the servers' OS user can reach.
func stateDir(t *testing.T) string {
	t.Helper()
	dir, err := os.MkdirTemp("", "pgtest-state-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	if err := os.Chmod(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	return dir
}

// TestExternal_ReadNeverWrite: a cluster registered with a backup block
// naming its operator's stanza. pgtenant lists its backups and recovery
// window, refuses a backup of it (409, naming the operator's schedule),
// queues none by itself, restores a scratch instance from it to a point in
// time (entered with the cluster DSN's user and password), and leaves every
// file of the operator as it was: config, logs, locks.
func TestExternal_ReadNeverWrite(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	e := startExternal(t, ctx)
	dsn := e.pg.PrimaryDSN("postgres")
	backuptest.Exec(t, ctx, dsn, `CREATE DATABASE extdata`)
	backuptest.Exec(t, ctx, e.pg.PrimaryDSN("extdata"), `CREATE TABLE marker (v text); INSERT INTO marker VALUES ('at the backup')`)
	e.operator(t, ctx, "--type=full", "backup")
	before := e.files(t)

	cfg := daemontest.Config(t, e.pg)
	cfg.TokenFile = filepath.Join(stateDir(t), "token")
	cfg.Clusters = []config.ClusterConfig{{Name: "ext", DSN: dsn, Backup: &e.block}}
	d, c, _ := daemontest.StartOptions(t, daemon.Options{Config: cfg})

	// Read: the operator's backup, and a recovery window from it.
	list, err := c.Backups(ctx, "ext")
	if err != nil {
		t.Fatal(err)
	}
	if len(list) != 1 || list[0].Cluster != "ext" || list[0].Stanza != opsStanza || len(list[0].Backups) != 1 || list[0].Backups[0].Type != backup.Full {
		t.Fatalf("backups of ext = %+v, want the operator's one full backup of stanza %s", list, opsStanza)
	}
	if list[0].Window == nil || list[0].ArchivedAt == nil {
		t.Errorf("recovery window of ext = %+v, newest archived at %v; want a window from its full backup to the newest segment in the repository its config names",
			list[0].Window, list[0].ArchivedAt)
	}
	if all, err := c.Backups(ctx, ""); err != nil || len(all) != 1 {
		t.Errorf("backups of every cluster = %+v, %v; want ext's", all, err)
	}

	// The doctor and /metrics read it as they read a managed stanza.
	rep, err := c.Doctor(ctx, "ext")
	if err != nil {
		t.Fatal(err)
	}
	seen := 0
	for _, cr := range rep.Clusters {
		for _, ch := range cr.Checks {
			if ch.Name == "archiving" || ch.Name == "backup_age" || ch.Name == "backup_disk" {
				seen++
				if ch.Status != doctor.OK {
					t.Errorf("doctor check %s of ext: %+v, want ok", ch.Name, ch)
				}
			}
		}
	}
	if seen != 3 {
		t.Errorf("doctor of ext has %d of the checks archiving, backup_age and backup_disk, want all 3", seen)
	}
	resp, err := http.Get("http://" + d.Addr() + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	scrape, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{`pgtenant_backup_up{cluster="ext"} 1`, `pgtenant_backup_last_age_seconds{cluster="ext",type="full"}`,
		`pgtenant_backup_repository_size_bytes{cluster="ext"}`, `pgtenant_backup_archive_failing{cluster="ext"} 0`} {
		if !strings.Contains(string(scrape), want) {
			t.Errorf("/metrics lacks %s", want)
		}
	}

	// Never a backup: asked for, refused with 409 and where to take one.
	for _, req := range []api.BackupRequest{{Cluster: "ext", Type: backup.Full}, {Type: backup.Diff}} {
		_, err := c.BackupNow(ctx, req)
		if !errors.Is(err, catalog.ErrConflict) {
			t.Errorf("backup now %+v: err = %v, want a conflict (409)", req, err)
			continue
		}
		for _, want := range []string{"cluster ext is external", "operator's own schedule", "--config=" + e.block.Config, "--stanza=" + opsStanza} {
			if !strings.Contains(err.Error(), want) {
				t.Errorf("backup now %+v: %q does not say %q", req, err, want)
			}
		}
	}
	js, err := c.Jobs(ctx, map[string][]string{"type": {string(jobs.ClusterBackup)}})
	if err != nil {
		t.Fatal(err)
	}
	if len(js) != 0 {
		t.Errorf("backup jobs = %+v, want none: the operator schedules ext's backups", js)
	}

	// Restore: a scratch instance as of a time between two commits, in
	// pgtenant's own directory, entered as the DSN's user.
	root := filepath.Join(stateDir(t), "scratch")
	st, err := backup.ForExternal("ext", e.block, dsn, root)
	if err != nil {
		t.Fatal(err)
	}
	if err := st.Setup(ctx); err != nil { // nothing to do: the operator made the stanza
		t.Fatal(err)
	}
	if err := st.Backup(ctx, backup.Full); !errors.Is(err, backup.ErrExternal) {
		t.Errorf("Backup of an external stanza: err = %v, want ErrExternal", err)
	}
	// pgBackRest keeps a backup's stop time in whole seconds: a target
	// must be past it.
	time.Sleep(1500 * time.Millisecond)
	backuptest.Exec(t, ctx, e.pg.PrimaryDSN("extdata"), `INSERT INTO marker VALUES ('before')`)
	time.Sleep(300 * time.Millisecond)
	target := time.Now()
	time.Sleep(300 * time.Millisecond)
	backuptest.Exec(t, ctx, e.pg.PrimaryDSN("extdata"), `INSERT INTO marker VALUES ('after')`)
	sc, err := st.RestoreScratch(ctx, "t1", target, []string{"extdata"})
	if err != nil {
		t.Fatal(err)
	}
	defer sc.Remove(context.WithoutCancel(ctx))
	if filepath.Dir(sc.Dir) != root {
		t.Errorf("scratch dir %s, want it in pgtenant's scratch root, not the operator's directory", sc.Dir)
	}
	conn, err := sc.Connect(ctx, "extdata")
	if err != nil {
		t.Fatal(err)
	}
	var got string
	err = conn.QueryRow(ctx, `SELECT string_agg(v, ',' ORDER BY v) FROM public.marker`).Scan(&got)
	conn.Close(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if want := "at the backup,before"; got != want {
		t.Errorf("scratch rows = %q, want %q (as of the target)", got, want)
	}
	if err := sc.Remove(ctx); err != nil {
		t.Fatal(err)
	}

	after := e.files(t)
	if len(after) != len(before) {
		t.Errorf("operator's files: %d before, %d after: %v", len(before), len(after), keys(after))
	}
	for p, b := range before {
		if a, ok := after[p]; !ok || !bytes.Equal([]byte(a), []byte(b)) {
			t.Errorf("operator's file %s changed (%d bytes before, %d after)", p, len(b), len(a))
		}
	}
}

func keys(m map[string]string) []string {
	var out []string
	for k := range m {
		out = append(out, k+" ("+strconv.Itoa(len(m[k]))+" bytes)")
	}
	return out
}

// TestExternal_RewindAndFork: a tenant on an external cluster is rewound
// and forked from its operator's backup and archive: the rewind brings its
// rows back in place, the fork holds them under new credentials, the
// scratch instances (in the daemon's own directory) are gone after, and
// the operator's files are as they were.
func TestExternal_RewindAndFork(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 6*time.Minute)
	defer cancel()
	e := startExternal(t, ctx)
	dsn := e.pg.PrimaryDSN("postgres")
	e.operator(t, ctx, "--type=full", "backup")
	before := e.files(t)

	cfg := daemontest.Config(t, e.pg)
	state := stateDir(t)
	cfg.TokenFile = filepath.Join(state, "token")
	cfg.Provision.DefaultPoolSize = 0
	cfg.Clusters = []config.ClusterConfig{{Name: "ext", DSN: dsn, Backup: &e.block}}
	_, c, _ := daemontest.StartOptions(t, daemon.Options{Config: cfg})
	added, err := c.CreateTemplate(ctx, "shop", []templates.Upload{{Name: "0001_init.sql", Body: "CREATE TABLE settings (k text PRIMARY KEY, v text);"}})
	if err != nil {
		t.Fatal(err)
	}
	for _, j := range added.BuildJobs {
		waitJob(t, ctx, c, j.ID)
	}
	r, err := c.CreateTenant(ctx, provision.Request{Template: "shop", Mode: tenant.ModeDatabase})
	if err != nil {
		t.Fatal(err)
	}
	if r.Job != nil {
		waitJob(t, ctx, c, r.Job.ID)
	}
	rows := func(dsn string) string {
		t.Helper()
		conn, err := pgx.Connect(ctx, dsn)
		if err != nil {
			t.Fatal(err)
		}
		defer conn.Close(ctx)
		var got string
		if err := conn.QueryRow(ctx, `SELECT coalesce(string_agg(k || '=' || v, ',' ORDER BY k), '') FROM settings`).Scan(&got); err != nil {
			t.Fatal(err)
		}
		return got
	}
	backuptest.Exec(t, ctx, r.DSN, `INSERT INTO settings VALUES ('plan', 'gold'), ('seats', '12')`)
	time.Sleep(1100 * time.Millisecond)
	at := time.Now()
	time.Sleep(1100 * time.Millisecond)
	backuptest.Exec(t, ctx, r.DSN, `DELETE FROM settings; INSERT INTO settings VALUES ('oops', 'yes')`)

	j, err := c.RewindTenant(ctx, r.Tenant.ID, at)
	if err != nil {
		t.Fatal(err)
	}
	waitJob(t, ctx, c, j.ID)
	if got, want := rows(r.DSN), "plan=gold,seats=12"; got != want {
		t.Errorf("after the rewind: %q, want %q", got, want)
	}
	fork, err := c.ForkTenant(ctx, r.Tenant.ID, api.ForkTenantRequest{At: &at})
	if err != nil {
		t.Fatal(err)
	}
	if fork.Job == nil {
		t.Fatalf("fork answer without a job: %+v", fork)
	}
	waitJob(t, ctx, c, fork.Job.ID)
	if got, want := rows(fork.DSN), "plan=gold,seats=12"; got != want {
		t.Errorf("the fork: %q, want %q", got, want)
	}
	if left, _ := filepath.Glob(filepath.Join(state, "scratch", "*")); len(left) > 0 {
		t.Errorf("scratch instances left: %v", left)
	}
	after := e.files(t)
	for p, b := range before {
		if a, ok := after[p]; !ok || a != b {
			t.Errorf("operator's file %s changed", p)
		}
	}
	if len(after) != len(before) {
		t.Errorf("operator's files: %d before, %d after: %v", len(before), len(after), keys(after))
	}
}

// TestForExternal_ConfigAndErrors: an external stanza's repository is the
// one its operator's config names (the stanza's section over [global]),
// none when it is not a directory here; a missing config file, a managed
// cluster given a backup block and an unreachable scratch root are refused
// at start, naming what to fix. No server is needed.
func TestForExternal_ConfigAndErrors(t *testing.T) {
	if _, err := backup.Find(); err != nil {
		t.Skip(err)
	}
	dir, root := stateDir(t), filepath.Join(stateDir(t), "scratch")
	const dsn = "postgres://admin:secret@db1:5432/postgres"
	for _, tc := range []struct{ conf, want string }{
		{"[global]\nrepo1-path=/srv/backups\n", "/srv/backups"},
		{"[global]\nrepo1-path = /srv/backups\n\n[main]\nrepo1-path=/srv/main/\npg1-path=/var/lib/postgresql/15/main\n", "/srv/main"},
		{"[other]\nrepo1-path=/srv/other\n", "/var/lib/pgbackrest"},
		{"[global]\nrepo1-type=s3\nrepo1-path=/repo\n", ""},
		{"[global]\nrepo1-host=backup1\n", ""},
		{"[global]\nrepo1-type=cifs\nrepo1-path=/mnt/backups\n", "/mnt/backups"},
	} {
		conf := filepath.Join(dir, "pgbackrest.conf")
		if err := os.WriteFile(conf, []byte(tc.conf), 0o644); err != nil {
			t.Fatal(err)
		}
		st, err := backup.ForExternal("c1", config.ClusterBackupConfig{Stanza: "main", Config: conf}, dsn, root)
		if err != nil {
			t.Fatal(err)
		}
		if got := st.RepoPath(); got != tc.want {
			t.Errorf("config %q: RepoPath = %q, want %q", tc.conf, got, tc.want)
		}
		if !st.External || st.Name != "main" {
			t.Errorf("stanza = %+v, want external stanza main", st)
		}
		if tc.want == "" {
			if _, err := st.RepoDisk(); !errors.Is(err, backup.ErrRepoNotLocal) {
				t.Errorf("config %q: RepoDisk err = %v, want ErrRepoNotLocal", tc.conf, err)
			}
		}
		b, err := os.ReadFile(conf)
		if err != nil || string(b) != tc.conf {
			t.Errorf("config changed: %q, %v", b, err)
		}
	}

	missing := config.ClusterBackupConfig{Stanza: "main", Config: filepath.Join(dir, "nope.conf")}
	if _, err := backup.ForExternal("c1", missing, dsn, root); err == nil || !strings.Contains(err.Error(), "backup.config") {
		t.Errorf("a missing config: err = %v, want one naming backup.config", err)
	}
	conf := filepath.Join(dir, "pgbackrest.conf")
	clusters := []config.ClusterConfig{{Name: "c0", DSN: dsn}, {Name: "c1", DSN: dsn, Backup: &config.ClusterBackupConfig{Stanza: "main", Config: conf}}}
	all, err := backup.WithExternal(nil, clusters, root)
	if err != nil {
		t.Fatal(err)
	}
	if len(all) != 1 || all["c1"] == nil || !all["c1"].External {
		t.Errorf("WithExternal = %v, want c1's external stanza only", all)
	}
	if _, err := backup.WithExternal(map[string]*backup.Stanza{"c1": {}}, clusters, root); err == nil || !strings.Contains(err.Error(), "clusters[1]: cluster c1 is managed") {
		t.Errorf("a managed cluster with a backup block: err = %v, want one naming clusters[1]", err)
	}
	if u, _ := fleet.ServerUser(); u.IsOther() {
		private := t.TempDir() // 0700: the postgres OS user cannot reach inside
		if _, err := backup.ForExternal("c1", *clusters[1].Backup, dsn, filepath.Join(private, "scratch")); err == nil || !strings.Contains(err.Error(), "chmod o+x") {
			t.Errorf("an unreachable scratch root: err = %v, want one saying what to chmod", err)
		}
	}
}
