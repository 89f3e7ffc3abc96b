package bench

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strconv"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pgtenant/pgtenant/internal/api"
	"github.com/pgtenant/pgtenant/internal/backup"
	"github.com/pgtenant/pgtenant/internal/config"
	"github.com/pgtenant/pgtenant/internal/daemon"
	"github.com/pgtenant/pgtenant/internal/fleet"
	"github.com/pgtenant/pgtenant/internal/jobs"
	"github.com/pgtenant/pgtenant/internal/provision"
	"github.com/pgtenant/pgtenant/internal/templates"
	"github.com/pgtenant/pgtenant/internal/tenant"
)

// RestoreOptions size bench restore.
type RestoreOptions struct {
	Tenants  int         // small tenants (the neighbours)
	TenantMB int         // each small tenant's data
	BigMB    int         // the big tenant's data (the one rewound and forked)
	Mode     tenant.Mode // of every tenant
	Writers  int         // small tenants written during the run (each by Clients clients), besides the big one
	Clients  int         // clients per written tenant
	Rate     int         // inserts per second of each paced client
	Ago      time.Duration
	// TPSDuration is each of the primary throughput runs (archiving on,
	// on with a backup running, off).
	TPSDuration time.Duration
	TPSClients  int
}

// Latency is a set of write latencies.
type Latency struct {
	N   int           `json:"n"`
	P50 time.Duration `json:"p50_ns"`
	P95 time.Duration `json:"p95_ns"`
}

// ManualRecipe is what a user does by hand today: the whole cluster
// restored as of TIME into a scratch instance, the tenant dumped out of
// it into a new database on the live cluster.
type ManualRecipe struct {
	Restore time.Duration `json:"restore_ns"` // pgbackrest restore (whole cluster) + start, recovery to TIME
	Copy    time.Duration `json:"copy_ns"`    // pg_dump -Fc | pg_restore into a new database
	Cleanup time.Duration `json:"cleanup_ns"` // stop the scratch instance, remove its files
	Total   time.Duration `json:"total_ns"`
}

// TPSRun is one primary throughput run.
type TPSRun struct {
	Name     string        `json:"name"`
	Txns     int64         `json:"transactions"`
	Duration time.Duration `json:"duration_ns"`
	TPS      float64       `json:"tps"`
}

// RestoreResult is what bench restore measured.
type RestoreResult struct {
	Mode          string        `json:"mode"`
	BigBytes      int64         `json:"big_tenant_bytes"`
	ClusterBytes  int64         `json:"cluster_bytes"` // every database on the primary
	Backup        time.Duration `json:"full_backup_ns"`
	Target        time.Time     `json:"target"`
	Rewind        time.Duration `json:"rewind_ns"`
	RewindSteps   string        `json:"rewind_steps"`
	Manual        ManualRecipe  `json:"manual"`
	ForkNow       time.Duration `json:"fork_now_ns"`
	ForkNowPause  time.Duration `json:"fork_now_source_pause_ns"`
	ForkAt        time.Duration `json:"fork_at_ns"`
	ForkAtPause   time.Duration `json:"fork_at_source_pause_ns"`
	Before        Latency       `json:"neighbours_before"`
	During        Latency       `json:"neighbours_during_rewind"`
	NeighbourErrs int64         `json:"neighbour_errors"`
	SourceErrs    int64         `json:"source_errors"` // the big tenant's writer (its sessions end at the rewind's swap)
	ArchiveLagMax int64         `json:"archive_lag_max_bytes"`
	ArchiveLagP50 int64         `json:"archive_lag_p50_bytes"`
	RPOMax        time.Duration `json:"rpo_max_ns"` // the oldest unarchived write's age, at worst
	LagSamples    int           `json:"archive_lag_samples"`
	TPS           []TPSRun      `json:"tps"`
}

var restoreTemplate = []templates.Upload{{Name: "0001_init.sql", Body: `CREATE TABLE items (id bigint PRIMARY KEY, filler text NOT NULL);
CREATE TABLE events (id bigserial PRIMARY KEY, client int NOT NULL, at timestamptz NOT NULL DEFAULT now(), note text);
`}}

// write is one insert of a writing client.
type write struct {
	tenant int // 0: the big tenant; 1..: the neighbours
	start  time.Time
	took   time.Duration
	ok     bool
}

// lagSample is the primary's WAL position and the end of the newest
// archived segment at one instant.
type lagSample struct {
	at       time.Time
	lsn      int64
	archived int64 // end of the newest archived segment; 0: none yet
}

// Restore runs bench restore: on one backed-up cluster (primary +
// streaming standby, archiving on, a full backup taken), small tenants
// and a big one, writes running on several: a rewind of the big tenant to
// Ago ago against the manual recipe (whole-cluster pgbackrest restore,
// then pg_dump | pg_restore), forks of it now and at that time with the
// source's pause, the neighbours' latency before and during the rewind,
// the archive lag under the writes, and the primary's tps with archiving
// and a backup against neither.
func (e *Env) Restore(ctx context.Context, o RestoreOptions) (RestoreResult, Table, error) {
	res := RestoreResult{Mode: string(o.Mode)}
	if _, err := backup.Find(); err != nil {
		return res, Table{}, err
	}
	fc, st, stopFleet, err := e.backedUpFleet(ctx, "restore", map[string]string{"shared_buffers": "128MB", "max_connections": "100", "logging_collector": "off"}, true)
	if err != nil {
		return res, Table{}, err
	}
	defer stopFleet()
	// Whatever scratch instance is left (the manual recipe's, or a job's
	// the daemon was stopped in) is stopped and removed, after the daemon.
	defer removeScratches(st)
	dir, removeDir, err := e.daemonDir("restore-daemon")
	if err != nil {
		return res, Table{}, err
	}
	defer removeDir()
	cfg := benchConfig(fc, dir)
	// One full backup when the daemon starts, the bench's own after the
	// load, and no scheduled one in between.
	cfg.Backups.FullEvery = config.Duration(1000 * time.Hour)
	cfg.Backups.DiffEvery = 0
	d, err := e.startDaemonInProcess(ctx, fc, cfg, func(do *daemon.Options) {
		do.Backups = map[string]*backup.Stanza{fc.Name(): st}
	})
	if err != nil {
		return res, Table{}, err
	}
	defer d.Stop()
	e.logf("restore: waiting for the first backup")
	if err := waitBackup(ctx, st); err != nil {
		return res, Table{}, err
	}
	if err := d.createTemplate(ctx, "restore", restoreTemplate); err != nil {
		return res, Table{}, err
	}

	// The tenants: the big one first, then the neighbours.
	var ts []api.CreateTenantResponse
	for i := range o.Tenants + 1 {
		r, err := d.client.CreateTenant(ctx, provision.Request{Template: "restore", Mode: o.Mode})
		if err != nil {
			return res, Table{}, fmt.Errorf("create tenant %d: %w", i, err)
		}
		if r.Job != nil {
			if j, err := d.waitJob(ctx, r.Job.ID); err != nil || j.State != jobs.Succeeded {
				return res, Table{}, fmt.Errorf("create tenant %d: %v %s %s", i, err, j.State, j.LastError)
			}
		}
		mb := o.TenantMB
		if i == 0 {
			mb = o.BigMB
		}
		e.logf("restore: loading %d MB into %s tenant %s", mb, o.Mode, r.Tenant.ID)
		if err := loadItems(ctx, r.DirectDSN, mb); err != nil {
			return res, Table{}, fmt.Errorf("load tenant %s: %w", r.Tenant.ID, err)
		}
		ts = append(ts, r)
	}
	big := ts[0]
	if res.BigBytes, res.ClusterBytes, err = tenantSizes(ctx, fc, big); err != nil {
		return res, Table{}, err
	}

	e.logf("restore: full backup of %s (%s in all)", fc.Name(), kb(res.ClusterBytes))
	began := time.Now()
	js, err := d.client.BackupNow(ctx, api.BackupRequest{Cluster: fc.Name(), Type: backup.Full})
	if err != nil {
		return res, Table{}, err
	}
	for _, j := range js {
		if j, err := d.waitJob(ctx, j.ID); err != nil || j.State != jobs.Succeeded {
			return res, Table{}, fmt.Errorf("full backup: %v %s %s", err, j.State, j.LastError)
		}
	}
	res.Backup = time.Since(began)
	e.logf("restore: full backup took %s", res.Backup.Round(time.Millisecond))

	// The writers: Clients paced clients on each of Writers neighbours and
	// one on the big tenant; the archive lag sampled meanwhile.
	wctx, stopWrites := context.WithCancel(ctx)
	var wg sync.WaitGroup
	defer func() { stopWrites(); wg.Wait() }()
	var mu sync.Mutex
	var writes []write
	record := func(w write) { mu.Lock(); writes = append(writes, w); mu.Unlock() }
	pace := time.Second / time.Duration(max(o.Rate, 1))
	writer := func(idx, client int, dsn string) {
		defer wg.Done()
		var conn *pgx.Conn
		defer func() {
			if conn != nil {
				conn.Close(context.Background())
			}
		}()
		tick := time.NewTicker(pace)
		defer tick.Stop()
		for {
			select {
			case <-wctx.Done():
				return
			case <-tick.C:
			}
			start := time.Now()
			var err error
			if conn == nil {
				conn, err = connectSimple(wctx, dsn)
			}
			if err == nil {
				_, err = conn.Exec(wctx, `INSERT INTO events (client, note) VALUES ($1, 'bench restore')`, client)
			}
			if wctx.Err() != nil {
				return
			}
			if err != nil && conn != nil {
				conn.Close(context.Background())
				conn = nil
			}
			record(write{tenant: idx, start: start, took: time.Since(start), ok: err == nil})
		}
	}
	for i := 1; i <= min(o.Writers, o.Tenants); i++ {
		for c := range o.Clients {
			wg.Add(1)
			go writer(i, c, ts[i].DSN)
		}
	}
	wg.Add(1)
	go writer(0, 0, big.DSN)
	var lagMu sync.Mutex
	var lags []lagSample
	wg.Add(1)
	go func() {
		defer wg.Done()
		conn, err := pgx.Connect(wctx, fc.PrimaryDSN("postgres"))
		if err != nil {
			return
		}
		defer conn.Close(context.Background())
		for wctx.Err() == nil {
			var seg string
			var s lagSample
			var segSize int64
			err := conn.QueryRow(wctx, `SELECT coalesce(last_archived_wal, ''), (pg_current_wal_lsn() - '0/0')::bigint,
					(SELECT setting::bigint FROM pg_settings WHERE name = 'wal_segment_size') FROM pg_stat_archiver`).Scan(&seg, &s.lsn, &segSize)
			if err == nil {
				s.at = time.Now()
				s.archived, _ = backup.SegmentEnd(seg, segSize)
				lagMu.Lock()
				lags = append(lags, s)
				lagMu.Unlock()
			}
			select {
			case <-wctx.Done():
			case <-time.After(500 * time.Millisecond):
			}
		}
	}()

	// TIME, then Ago of writes: the rewind and the manual recipe take the
	// big tenant back over them.
	if err := sleepCtx(ctx, 3*time.Second); err != nil {
		return res, Table{}, err
	}
	res.Target = time.Now()
	e.logf("restore: TIME is %s; writing for %s", res.Target.Format(time.RFC3339Nano), o.Ago)
	if err := sleepCtx(ctx, o.Ago); err != nil {
		return res, Table{}, err
	}

	// (1) The rewind, through the API, waited for.
	e.logf("restore: rewind of %s (%s) to TIME", big.Tenant.ID, kb(res.BigBytes))
	rewindStart := time.Now()
	j, err := d.client.RewindTenant(ctx, big.Tenant.ID, res.Target)
	if err != nil {
		return res, Table{}, fmt.Errorf("rewind: %w", err)
	}
	if j, err = d.waitJob(ctx, j.ID); err != nil || j.State != jobs.Succeeded {
		return res, Table{}, fmt.Errorf("rewind: %v %s %s", err, j.State, j.LastError)
	}
	rewindEnd := time.Now()
	res.Rewind = rewindEnd.Sub(rewindStart)
	res.RewindSteps = stepTimes(j)
	var phases string
	if err := d.catalog.QueryRow(ctx, `SELECT coalesce(data->>'phases', '') FROM jobs WHERE id = $1`, j.ID).Scan(&phases); err == nil && phases != "" {
		res.RewindSteps += "; copy: " + phases
	}
	e.logf("restore: rewind took %s (%s)", res.Rewind.Round(time.Millisecond), res.RewindSteps)

	// (2) The manual recipe, to the same TIME.
	e.logf("restore: manual recipe: pgbackrest restore of the whole cluster, then pg_dump | pg_restore")
	if res.Manual, err = manualRecipe(ctx, fc, st, big, res.Target); err != nil {
		return res, Table{}, fmt.Errorf("manual recipe: %w", err)
	}
	e.logf("restore: manual recipe took %s (restore %s, copy %s, cleanup %s)", res.Manual.Total.Round(time.Millisecond),
		res.Manual.Restore.Round(time.Millisecond), res.Manual.Copy.Round(time.Millisecond), res.Manual.Cleanup.Round(time.Millisecond))

	// (3), (4) Forks of the big tenant, now and at TIME.
	fork := func(at *time.Time) (time.Duration, time.Duration, error) {
		start := time.Now()
		r, err := d.client.ForkTenant(ctx, big.Tenant.ID, api.ForkTenantRequest{At: at})
		if err != nil {
			return 0, 0, err
		}
		if r.Job != nil {
			if j, err := d.waitJob(ctx, r.Job.ID); err != nil || j.State != jobs.Succeeded {
				return 0, 0, fmt.Errorf("%v %s %s", err, j.State, j.LastError)
			}
		}
		end := time.Now()
		var done []time.Time
		mu.Lock()
		for _, w := range writes {
			if w.tenant == 0 && w.ok {
				done = append(done, w.start.Add(w.took))
			}
		}
		mu.Unlock()
		return end.Sub(start), maxGap(done, start, end), nil
	}
	e.logf("restore: fork of %s as of now", big.Tenant.ID)
	if res.ForkNow, res.ForkNowPause, err = fork(nil); err != nil {
		return res, Table{}, fmt.Errorf("fork (now): %w", err)
	}
	e.logf("restore: fork (now) took %s, longest gap between the source's writes %s", res.ForkNow.Round(time.Millisecond), ms(res.ForkNowPause))
	at := res.Target
	if res.ForkAt, res.ForkAtPause, err = fork(&at); err != nil {
		return res, Table{}, fmt.Errorf("fork (at TIME): %w", err)
	}
	e.logf("restore: fork (at TIME) took %s, longest gap between the source's writes %s", res.ForkAt.Round(time.Millisecond), ms(res.ForkAtPause))
	stopWrites()
	wg.Wait()

	// (5) The neighbours' latency, (6) the archive lag under the writes.
	var before, during []time.Duration
	for _, w := range writes {
		switch {
		case w.tenant == 0:
			if !w.ok {
				res.SourceErrs++
			}
		case !w.ok:
			res.NeighbourErrs++
		case w.start.Before(rewindStart):
			before = append(before, w.took)
		case w.start.Before(rewindEnd):
			during = append(during, w.took)
		}
	}
	res.Before = Latency{N: len(before), P50: percentile(before, 50), P95: percentile(before, 95)}
	res.During = Latency{N: len(during), P50: percentile(during, 50), P95: percentile(during, 95)}
	res.ArchiveLagMax, res.ArchiveLagP50, res.RPOMax = archiveLag(lags)
	res.LagSamples = len(lags)

	// (6) The primary's tps: archiving on, on with a full backup running,
	// and off (archive_command = 'true'), in that order.
	if res.TPS, err = e.tpsRuns(ctx, fc, st, ts[min(1, o.Tenants)].DirectDSN, o); err != nil {
		return res, Table{}, err
	}
	return res, restoreTable(res, o), nil
}

// backedUpFleet starts a primary with one streaming standby under
// dir/name that archives from its creation, with its stanza set up, as
// `pgtenant up` makes one (fleetFor's settings and fast).
func (e *Env) backedUpFleet(ctx context.Context, name string, settings map[string]string, fast bool) (*fleet.Cluster, *backup.Stanza, func(), error) {
	made := e.Dir == ""
	if made {
		d, err := os.MkdirTemp("", "pgtenant-bench-")
		if err != nil {
			return nil, nil, nil, err
		}
		e.Dir = d
	}
	if err := os.MkdirAll(e.Dir, 0o755); err != nil {
		return nil, nil, nil, err
	}
	// The postgres OS user (when we are root) must traverse it.
	if err := os.Chmod(e.Dir, 0o755); err != nil {
		return nil, nil, nil, err
	}
	dir := filepath.Join(e.Dir, name)
	fc, err := fleet.Open(fleet.Options{Dir: dir, Name: name, Standbys: 1, Fast: fast, Backups: true, Logger: e.Logger, Settings: settings})
	if err != nil {
		return nil, nil, nil, err
	}
	stop := func() {
		sctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
		defer cancel()
		_ = fc.Stop(sctx)
		if !e.Keep {
			os.RemoveAll(dir)
			if made {
				os.Remove(e.Dir) // empty by now: the daemon's dir is removed before
			}
		}
	}
	st, err := backup.ForCluster(fc, true)
	if err != nil {
		return nil, nil, nil, err
	}
	// The config is there before the archiver first needs it.
	if err := st.Prepare(); err != nil {
		return nil, nil, nil, err
	}
	e.logf("starting fleet %s (PostgreSQL %s, primary + 1 standby, archiving with pgBackRest) in %s", name, fc.Binaries().Version, dir)
	if err := fc.Start(ctx); err != nil {
		stop()
		return nil, nil, nil, err
	}
	// Backups are read from the standby, as up does.
	if st, err = backup.ForCluster(fc, true); err == nil {
		err = st.Setup(ctx)
	}
	if err != nil {
		stop()
		return nil, nil, nil, fmt.Errorf("stanza: %w", err)
	}
	return fc, st, stop, nil
}

// removeScratches stops and removes every scratch instance of a stanza.
func removeScratches(st *backup.Stanza) {
	dirs, _ := filepath.Glob(st.ScratchDir("*"))
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	for _, d := range dirs {
		if filepath.Ext(d) == ".spool" || filepath.Ext(d) == ".lock" {
			continue
		}
		_ = st.ScratchFor(filepath.Base(d)).Remove(ctx)
	}
}

func waitBackup(ctx context.Context, st *backup.Stanza) error {
	for {
		info, err := st.Info(ctx)
		if err == nil && len(info.Backups) > 0 && !info.Running {
			return nil
		}
		if err := sleepCtx(ctx, 500*time.Millisecond); err != nil {
			return err
		}
	}
}

func sleepCtx(ctx context.Context, d time.Duration) error {
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-time.After(d):
		return nil
	}
}

// loadItems writes about mb MB of rows into a tenant's items table.
func loadItems(ctx context.Context, dsn string, mb int) error {
	conn, err := pgx.Connect(ctx, dsn)
	if err != nil {
		return err
	}
	defer conn.Close(context.Background())
	rows := int64(mb) * (1 << 20) / 600
	for from := int64(1); from <= rows; from += 50000 {
		if _, err := conn.Exec(ctx, `INSERT INTO items (id, filler) SELECT i, repeat('x', 500) FROM generate_series($1::bigint, $2::bigint) i`,
			from, min(from+49999, rows)); err != nil {
			return err
		}
	}
	return nil
}

// tenantSizes reads the big tenant's size (its database, or its schema's
// relations) and every database's on the primary.
func tenantSizes(ctx context.Context, fc *fleet.Cluster, t api.CreateTenantResponse) (tenantBytes, all int64, err error) {
	conn, err := pgx.Connect(ctx, fc.PrimaryDSN(t.Tenant.Database))
	if err != nil {
		return 0, 0, err
	}
	defer conn.Close(context.Background())
	if t.Tenant.Mode == tenant.ModeSchema {
		err = conn.QueryRow(ctx, `SELECT coalesce(sum(pg_total_relation_size(c.oid)), 0)::bigint FROM pg_class c
			JOIN pg_namespace n ON n.oid = c.relnamespace WHERE n.nspname = $1 AND c.relkind IN ('r', 'm')`, tenant.PhysicalName(t.Tenant.ID)).Scan(&tenantBytes)
	} else {
		err = conn.QueryRow(ctx, `SELECT pg_database_size(current_database())`).Scan(&tenantBytes)
	}
	if err != nil {
		return 0, 0, err
	}
	err = conn.QueryRow(ctx, `SELECT sum(pg_database_size(oid))::bigint FROM pg_database`).Scan(&all)
	return tenantBytes, all, err
}

// stepTimes is a job's steps and their times, "restore 12.3s, copy 4.5s".
func stepTimes(j jobs.Job) string {
	s := ""
	for _, st := range j.Steps {
		if st.FinishedAt.IsZero() {
			continue
		}
		if s != "" {
			s += ", "
		}
		s += fmt.Sprintf("%s %s", st.Step, st.FinishedAt.Sub(st.StartedAt).Round(100*time.Millisecond))
	}
	return s
}

// manualRecipe does what a user does by hand today, timed as one: the
// whole cluster restored by pgBackRest as of target into a scratch
// directory and started on a free port (no --db-include), the tenant
// dumped out of it (pg_dump -Fc, its schema only in schema mode) and piped
// into pg_restore, as the tenant's role, into a new database it owns on
// the live cluster, then the
// scratch instance stopped and removed.
func manualRecipe(ctx context.Context, fc *fleet.Cluster, st *backup.Stanza, t api.CreateTenantResponse, target time.Time) (ManualRecipe, error) {
	var m ManualRecipe
	start := time.Now()
	sc, err := st.RestoreScratch(ctx, "bench-manual", target, nil)
	if err != nil {
		return m, err
	}
	defer sc.Remove(context.WithoutCancel(ctx))
	m.Restore = time.Since(start)
	copyStart := time.Now()
	newDB := "manual_" + t.Tenant.ID
	admin, err := pgx.Connect(ctx, fc.PrimaryDSN("postgres"))
	if err != nil {
		return m, err
	}
	// The copy is restored as the tenant's own role, into a database it
	// owns: pg_restore replays the tenant's functions, defaults, CHECKs and
	// index expressions, which must never run in a superuser's session.
	role := tenant.PhysicalName(t.Tenant.ID)
	_, err = admin.Exec(ctx, "CREATE DATABASE "+pgx.Identifier{newDB}.Sanitize()+" OWNER "+pgx.Identifier{role}.Sanitize())
	admin.Close(context.Background())
	if err != nil {
		return m, err
	}
	into, err := url.Parse(t.DirectDSN)
	if err != nil {
		return m, fmt.Errorf("the tenant's direct DSN: %w", err)
	}
	into.Path = "/" + newDB
	// Extensions other than plpgsql are the admin's, not the tenant's to make.
	dumpArgs := []string{"-Fc", "--extension=plpgsql", "-d", sc.DSN(t.Tenant.Database)}
	if t.Tenant.Mode == tenant.ModeSchema {
		dumpArgs = append(dumpArgs, "-n", tenant.PhysicalName(t.Tenant.ID))
	}
	dump := exec.CommandContext(ctx, fc.Binaries().Path("pg_dump"), dumpArgs...)
	restore := exec.CommandContext(ctx, fc.Binaries().Path("pg_restore"), "--no-owner", "--no-acl", "--exit-on-error", "-d", into.String())
	pipe, err := dump.StdoutPipe()
	if err != nil {
		return m, err
	}
	restore.Stdin = pipe
	var dumpErr, restoreErr limitedBuffer
	dump.Stderr, restore.Stderr = &dumpErr, &restoreErr
	if err := restore.Start(); err != nil {
		return m, err
	}
	if err := dump.Start(); err != nil {
		_ = restore.Process.Kill()
		_ = restore.Wait()
		return m, err
	}
	derr := dump.Wait()
	rerr := restore.Wait()
	if derr != nil || rerr != nil {
		return m, fmt.Errorf("pg_dump | pg_restore: %w", errors.Join(
			wrapOut("pg_dump", derr, dumpErr.String()), wrapOut("pg_restore", rerr, restoreErr.String())))
	}
	m.Copy = time.Since(copyStart)
	cleanStart := time.Now()
	if err := sc.Remove(ctx); err != nil {
		return m, err
	}
	m.Cleanup = time.Since(cleanStart)
	m.Total = time.Since(start)
	return m, nil
}

func wrapOut(what string, err error, out string) error {
	if err == nil {
		return nil
	}
	return fmt.Errorf("%s: %w: %s", what, err, out)
}

// limitedBuffer keeps the first 4 KB written to it (a tool's stderr).
type limitedBuffer struct {
	mu  sync.Mutex
	buf []byte
}

func (b *limitedBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if room := 4096 - len(b.buf); room > 0 {
		b.buf = append(b.buf, p[:min(room, len(p))]...)
	}
	return len(p), nil
}

func (b *limitedBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return string(b.buf)
}

// tpsRuns runs the same unpaced insert loop (TPSClients clients on one
// tenant, TPSDuration each) with archiving on, with archiving on and a
// full backup running (from the standby, as scheduled ones are; the run
// ends early if the backup does), and with archive_command = 'true'.
func (e *Env) tpsRuns(ctx context.Context, fc *fleet.Cluster, st *backup.Stanza, dsn string, o RestoreOptions) ([]TPSRun, error) {
	var out []TPSRun
	run := func(name string, stop <-chan struct{}) error {
		r, err := insertLoop(ctx, dsn, o.TPSClients, o.TPSDuration, stop)
		if err != nil {
			return fmt.Errorf("tps (%s): %w", name, err)
		}
		r.Name = name
		e.logf("restore: tps %s: %.0f (%d in %s)", name, r.TPS, r.Txns, r.Duration.Round(time.Millisecond))
		out = append(out, r)
		return nil
	}
	if err := run("archiving on, no backup", nil); err != nil {
		return nil, err
	}

	bctx, cancel := context.WithCancel(ctx)
	started := make(chan struct{})
	done := make(chan struct{})
	var berr error
	go func() {
		defer close(done)
		berr = st.BackupStarted(bctx, backup.Full, func() { close(started) })
	}()
	select {
	case <-started:
	case <-done:
		cancel()
		return nil, fmt.Errorf("full backup for the tps run: %w", berr)
	case <-ctx.Done():
		cancel()
		<-done
		return nil, ctx.Err()
	}
	err := run("archiving on + full backup running", done)
	select {
	case <-done:
		// It ended within the run: on its own, and it must have worked.
		if err == nil && berr != nil {
			err = fmt.Errorf("full backup for the tps run: %w", berr)
		}
	default:
		// The backup is not what is measured past the run: stop it.
		cancel()
		<-done
	}
	cancel()
	if err != nil {
		return nil, err
	}

	admin, err := pgx.Connect(ctx, fc.PrimaryDSN("postgres"))
	if err != nil {
		return nil, err
	}
	defer admin.Close(context.Background())
	if _, err := admin.Exec(ctx, `ALTER SYSTEM SET archive_command = 'true'`); err != nil {
		return nil, err
	}
	if _, err := admin.Exec(ctx, `SELECT pg_reload_conf()`); err != nil {
		return nil, err
	}
	// The archiver reads its new command at its next loop.
	if err := sleepCtx(ctx, time.Second); err != nil {
		return nil, err
	}
	err = run("archiving off (archive_command = true)", nil)
	// Back as it was: nothing reads the archive after this run, but the
	// cluster's own config is left as fleet wrote it.
	_, _ = admin.Exec(context.WithoutCancel(ctx), `ALTER SYSTEM RESET archive_command`)
	_, _ = admin.Exec(context.WithoutCancel(ctx), `SELECT pg_reload_conf()`)
	return out, err
}

// insertLoop runs clients unpaced single-row inserts for d (or until stop
// is closed) and counts those that committed.
func insertLoop(ctx context.Context, dsn string, clients int, d time.Duration, stop <-chan struct{}) (TPSRun, error) {
	conns := make([]*pgx.Conn, clients)
	defer func() {
		for _, c := range conns {
			if c != nil {
				c.Close(context.Background())
			}
		}
	}()
	for i := range conns {
		c, err := pgx.Connect(ctx, dsn)
		if err != nil {
			return TPSRun{}, err
		}
		conns[i] = c
	}
	lctx, cancel := context.WithTimeout(ctx, d)
	defer cancel()
	if stop != nil {
		go func() {
			select {
			case <-stop:
				cancel()
			case <-lctx.Done():
			}
		}()
	}
	var mu sync.Mutex
	var n int64
	var firstErr error
	var wg sync.WaitGroup
	start := time.Now()
	for i, c := range conns {
		wg.Add(1)
		go func() {
			defer wg.Done()
			var k int64
			for lctx.Err() == nil {
				if _, err := c.Exec(lctx, `INSERT INTO events (client, note) VALUES ($1, 'tps')`, 1000+i); err != nil {
					if lctx.Err() == nil {
						mu.Lock()
						firstErr = cmpErr(firstErr, err)
						mu.Unlock()
					}
					break
				}
				k++
			}
			mu.Lock()
			n += k
			mu.Unlock()
		}()
	}
	wg.Wait()
	took := time.Since(start)
	if firstErr != nil {
		return TPSRun{}, firstErr
	}
	return TPSRun{Txns: n, Duration: took, TPS: float64(n) / took.Seconds()}, nil
}

func cmpErr(a, b error) error {
	if a != nil {
		return a
	}
	return b
}

// maxGap is the longest time within [from, to] without a successful write
// (done holds the writes' completion times): from the start to the first,
// between two, from the last to the end.
func maxGap(done []time.Time, from, to time.Time) time.Duration {
	in := make([]time.Time, 0, len(done))
	for _, t := range done {
		if !t.Before(from) && !t.After(to) {
			in = append(in, t)
		}
	}
	sort.Slice(in, func(i, j int) bool { return in[i].Before(in[j]) })
	var gap time.Duration
	prev := from
	for _, t := range in {
		gap = max(gap, t.Sub(prev))
		prev = t
	}
	return max(gap, to.Sub(prev))
}

// archiveLag summarizes samples of the archive: the largest and median
// lag in bytes (WAL written past the end of the newest archived segment),
// and the RPO, the largest age of the oldest write not archived yet: at
// each sample, the time since the WAL position first passed the archive's
// end (the last earlier sample still at or below it).
func archiveLag(s []lagSample) (maxBytes, p50Bytes int64, rpo time.Duration) {
	var bytes []int64
	for i, x := range s {
		if x.archived == 0 {
			continue
		}
		lag := max(x.lsn-x.archived, 0)
		bytes = append(bytes, lag)
		maxBytes = max(maxBytes, lag)
		if lag == 0 {
			continue
		}
		// The newest earlier sample whose position the archive covered:
		// writes after it are at risk, the oldest since then.
		var since time.Time
		for j := i - 1; j >= 0; j-- {
			if s[j].lsn <= x.archived {
				since = s[j].at
				break
			}
		}
		if since.IsZero() {
			since = s[0].at
		}
		rpo = max(rpo, x.at.Sub(since))
	}
	if len(bytes) > 0 {
		sort.Slice(bytes, func(i, j int) bool { return bytes[i] < bytes[j] })
		p50Bytes = bytes[(len(bytes)-1)/2]
	}
	return maxBytes, p50Bytes, rpo
}

// ratio is a/b, or 0 when b is 0.
func ratio(a, b time.Duration) float64 {
	if b <= 0 {
		return 0
	}
	return float64(a) / float64(b)
}

// tpsCost is the share of tps the loaded run lost against the bare one
// (negative: it was faster).
func tpsCost(loaded, bare float64) float64 {
	if bare <= 0 {
		return 0
	}
	return 1 - loaded/bare
}

func restoreTable(res RestoreResult, o RestoreOptions) Table {
	t := Table{Title: fmt.Sprintf("bench restore: %d %s tenants of %d MB and one of %d MB (%s), primary + standby, archiving on, %d clients on %d neighbours + 1 on the big tenant at %d inserts/s each, TIME %s before the rewind",
		o.Tenants, o.Mode, o.TenantMB, o.BigMB, kb(res.BigBytes), o.Clients, min(o.Writers, o.Tenants), o.Rate, o.Ago),
		Columns: []string{"what", "time", "detail"},
		Data:    map[string]any{"result": res, "options": o}}
	sec := func(d time.Duration) string { return d.Round(10 * time.Millisecond).String() }
	rw := ratio(res.Rewind, res.Manual.Total)
	var tpsOn, tpsBackup, tpsOff float64
	for _, r := range res.TPS {
		switch {
		case r.Name == "archiving on, no backup":
			tpsOn = r.TPS
		case r.Name == "archiving on + full backup running":
			tpsBackup = r.TPS
		default:
			tpsOff = r.TPS
		}
	}
	cost := tpsCost(tpsBackup, tpsOff)
	t.Rows = append(t.Rows,
		[]string{"rewind / manual recipe", fmt.Sprintf("%.2f", rw), "time of (1) over (2)"},
		[]string{"neighbours p95 during / before", fmt.Sprintf("%.2f", ratio(res.During.P95, res.Before.P95)), "(5)"},
		[]string{"tps lost to archiving + backup", fmt.Sprintf("%.1f %%", 100*cost), "(6) vs archive_command = true"},
		[]string{"tps lost to archiving alone", fmt.Sprintf("%.1f %%", 100*tpsCost(tpsOn, tpsOff)), "(6) vs archive_command = true"},
		[]string{"(1) tenant rewind --wait", sec(res.Rewind), res.RewindSteps},
		[]string{"(2) manual recipe", sec(res.Manual.Total), ""},
		[]string{"  pgbackrest restore (whole cluster) + start", sec(res.Manual.Restore), "recovery to TIME, promoted"},
		[]string{"  pg_dump -Fc | pg_restore", sec(res.Manual.Copy), "into a new database on the live cluster"},
		[]string{"  stop + remove the scratch dir", sec(res.Manual.Cleanup), ""},
		[]string{"(3) tenant fork (now)", sec(res.ForkNow), "source pause " + ms(res.ForkNowPause)},
		[]string{"(4) tenant fork --at TIME", sec(res.ForkAt), "source pause " + ms(res.ForkAtPause)},
		[]string{"(5) neighbours before the rewind", ms(res.Before.P50) + " p50", fmt.Sprintf("%s p95, %d writes", ms(res.Before.P95), res.Before.N)},
		[]string{"(5) neighbours during the rewind", ms(res.During.P50) + " p50", fmt.Sprintf("%s p95, %d writes", ms(res.During.P95), res.During.N)},
		[]string{"(6) archive lag (RPO)", sec(res.RPOMax) + " max", fmt.Sprintf("%s max, %s p50, %d samples", kb(res.ArchiveLagMax), kb(res.ArchiveLagP50), res.LagSamples)},
	)
	for _, r := range res.TPS {
		t.Rows = append(t.Rows, []string{"(6) tps: " + r.Name, fmt.Sprintf("%.0f tps", r.TPS), fmt.Sprintf("%d in %s", r.Txns, sec(r.Duration))})
	}
	t.Notes = append(t.Notes,
		fmt.Sprintf("full backup after the load: %s; cluster %s in all", sec(res.Backup), kb(res.ClusterBytes)),
		"the rewind and the forks restore only the database that holds the tenant (pgBackRest --db-include; in schema mode the template's shared database, with every schema tenant of it); the manual recipe restores every database",
		"all of it on one host: the backup is read from the standby, but the standby, pgBackRest's compression and the scratch instances share the primary's cores",
		"source pause: the longest time between two successful writes of a client writing to the fork's source (paced at the rate above) during the fork",
		fmt.Sprintf("errors: neighbours %d; the big tenant's writer %d (its sessions end at the rewind's swap)", res.NeighbourErrs, res.SourceErrs),
		fmt.Sprintf("tps: %d unpaced clients of single-row inserts on one tenant, %s each; archiving on without a backup: %.0f tps", o.TPSClients, o.TPSDuration, tpsOn))
	pause := max(res.ForkNowPause, res.ForkAtPause)
	t.Checks = append(t.Checks,
		Check{Target: "rewind <= 50 % of the manual recipe", Got: fmt.Sprintf("%.0f %%", 100*rw), Met: res.Manual.Total > 0 && rw <= 0.5},
		Check{Target: "fork's source pause <= 1 s", Got: ms(pause), Met: pause <= time.Second},
		Check{Target: "neighbours' p95 during a rewind <= 120 % of before", Got: fmt.Sprintf("%s vs %s", ms(res.During.P95), ms(res.Before.P95)),
			Met: res.Before.N > 0 && res.During.N > 0 && float64(res.During.P95) <= 1.2*float64(res.Before.P95)},
		Check{Target: "zero neighbour errors", Got: strconv.FormatInt(res.NeighbourErrs, 10), Met: res.NeighbourErrs == 0},
		Check{Target: "archiving + backup cost <= 5 % of primary tps", Got: fmt.Sprintf("%.1f %%", 100*cost), Met: tpsOff > 0 && cost <= 0.05},
		Check{Target: "archive lag (RPO) <= 60 s", Got: sec(res.RPOMax), Met: res.LagSamples > 0 && res.RPOMax <= time.Minute},
	)
	return t
}
