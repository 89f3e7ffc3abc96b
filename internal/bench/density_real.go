package bench

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"math/rand/v2"
	"net/url"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"golang.org/x/sync/errgroup"

	examples "github.com/pgtenant/pgtenant/examples/templates"
	"github.com/pgtenant/pgtenant/internal/backup"
	"github.com/pgtenant/pgtenant/internal/config"
	"github.com/pgtenant/pgtenant/internal/daemon"
	"github.com/pgtenant/pgtenant/internal/fleet"
	"github.com/pgtenant/pgtenant/internal/jobs"
	"github.com/pgtenant/pgtenant/internal/metrics"
	"github.com/pgtenant/pgtenant/internal/provision"
	"github.com/pgtenant/pgtenant/internal/quota"
	"github.com/pgtenant/pgtenant/internal/templates"
	"github.com/pgtenant/pgtenant/internal/tenant"
)

// DensityRealOptions size bench density's real run: a cluster grown to
// SchemaTenants and DatabaseTenants of saas, measured at each of Steps
// (schema tenants; database tenants grow in proportion).
type DensityRealOptions struct {
	SchemaTenants, DatabaseTenants int
	Steps                          []int
	Claims                         int // claims (and purges) per mode and step
	Requests                       int // API calls per measure and step
	// Settle bounds the waits, before the claims and before idle WAL
	// is measured, for the server's own work after the bench's bursts of
	// builds (autovacuum's workers) to end.
	Settle time.Duration
	// Backup: the cluster archives its WAL with pgBackRest from its
	// creation, as up makes one, and each step ends with two full backups
	// (read from the standby), bundled and one file per file, timed.
	Backup bool
}

// DensityRealPoint is what the cluster cost at one step.
type DensityRealPoint struct {
	Schema        int              `json:"schema_tenants"`
	Database      int              `json:"database_tenants"`
	ClaimSchema   [2]time.Duration `json:"claim_schema_p50_p95"`
	ClaimDatabase [2]time.Duration `json:"claim_database_p50_p95"`
	// A create that finds no spare: built cold from the template in a
	// job, through the API (the pool empty).
	ColdSchema        time.Duration `json:"cold_build_schema"`
	ColdDatabase      time.Duration `json:"cold_build_database"`
	PurgeSchema       time.Duration `json:"purge_schema"`
	PurgeDatabase     time.Duration `json:"purge_database"`
	Passes            ScaleTiming   `json:"collector"`
	Scrape            time.Duration `json:"scrape"`
	ScrapeBytes       int           `json:"scrape_bytes"`
	FrontSync         time.Duration `json:"front_door_sync"` // p50 of 5, isolated
	Reconcile         time.Duration `json:"reconcile"`
	ReconcileFindings int           `json:"reconcile_findings"`
	ShowP95, ListP95  time.Duration
	SearchP95         time.Duration
	HeapBytes         uint64 `json:"heap_bytes"`
	RSSBytes          int64  `json:"rss_bytes"` // the bench's process, its daemon's included
	// What a server backend's own memory (its anonymous pages, from
	// /proc/<pid>/smaps_rollup) comes to: one of the pooler's that served
	// one schema tenant (a query on each of its tables), and a superuser
	// session in the shared database that read a table of every schema.
	PooledSessionBytes int64 `json:"pooled_session_bytes"`
	AdminSessionBytes  int64 `json:"admin_session_bytes"`
	AdminSchemas       int   `json:"admin_session_schemas"`
	Files              int   `json:"relation_files"`
	DiskBytes          int64 `json:"disk_bytes"`
	SharedClassRows    int64 `json:"shared_db_pg_class_rows"`
	SharedAttrRows     int64 `json:"shared_db_pg_attribute_rows"`
	SharedCatalogBytes int64 `json:"shared_db_catalog_bytes"`
	ShmemBytes         int64 `json:"shared_memory_bytes"`
	// The collector's first round of sizes after growth and the rollout:
	// the WAL its first reads wrote (hint bits), and how long it took.
	RoundWAL         int64         `json:"first_round_wal_bytes"`
	RoundImages      int64         `json:"first_round_page_images"`
	RoundTook        time.Duration `json:"first_round_took"`
	RoundWALWhat     string        `json:"first_round_wal_what"`                   // by kind of record and database (pg_waldump)
	IdleWALPerSec    float64       `json:"idle_wal_bytes_per_second"`              // the last of three 10 s windows
	IdleWALFirst     float64       `json:"idle_wal_first_window_bytes_per_second"` // the first
	IdleImagesFirst  int64         `json:"idle_page_images_first_window"`          // full-page images in the first window
	IdleImages       int64         `json:"idle_page_images"`                       // and in the last
	IdleWritesPerSec float64       `json:"idle_write_bytes_per_second"`            // the primary's processes, the last window (/proc/<pid>/io)
	IdleWALWhat      string        `json:"idle_wal_what"`                          // the last window's WAL by kind of record and database (pg_waldump)
	IdleWriters      string        `json:"idle_writers"`                           // the last window's writes by process (treeWriters), the largest first
	// IdleSettle is how long autovacuum kept working after growth
	// before the idle WAL was measured (Settle at most).
	IdleSettle    time.Duration `json:"idle_settle"`
	IdleSettled   bool          `json:"idle_settled"` // no autovacuum worker ran when the measure began
	Restart       time.Duration `json:"restart"`
	CrashRecovery time.Duration `json:"crash_recovery"`
	// Rollout: every tenant moved to a new version of one statement,
	// then the same rollout again with nothing to do (its NoOp).
	Rollout MigrateRow `json:"rollout"`
	// ConnectsPerSec: new connections a second to the primary, 4 at a
	// time, each closed again at once (as pgbench -C, with no statement):
	// what this machine's process start allows the rollout, whose every
	// tenant's migration opens a session of its own.
	ConnectsPerSec float64 `json:"connects_per_sec"`
	// The statement capper: one check of the primary's sessions (p50),
	// one pass over every tenant's role settings.
	CapperCheck    time.Duration `json:"capper_check"`
	CapperSettings time.Duration `json:"capper_settings_pass"`
	// With --backup, two full backups side by side: bundled (repo-bundle,
	// pgtenant's stanzas' default), then each file of the cluster a file
	// of the repository (pgBackRest's default).
	Backup        fullBackup `json:"backup"`
	BackupBundled fullBackup `json:"backup_bundled"`
}

// fullBackup is one full backup: how long pgBackRest took, the cluster's
// size it read, what the repository got (compressed) and in how many files.
type fullBackup struct {
	Took      time.Duration `json:"took"`
	Size      int64         `json:"size"`
	RepoSize  int64         `json:"repo_size"`
	RepoFiles int           `json:"repo_files"`
}

// DensityReal runs bench density's real mode.
func (e *Env) DensityReal(ctx context.Context, o DensityRealOptions) ([]DensityRealPoint, Table, error) {
	if err := e.roomFor(o.SchemaTenants, o.DatabaseTenants, o.Backup); err != nil {
		return nil, Table{}, err
	}
	raiseOpenFiles()
	var fc *fleet.Cluster
	var st *backup.Stanza // with --backup
	var stop func()
	var err error
	if o.Backup {
		if _, err := backup.Find(); err != nil {
			return nil, Table{}, err
		}
		fc, st, stop, err = e.backedUpFleet(ctx, "density", nil, false)
	} else {
		fc, stop, err = e.fleetFor(ctx, "density", nil, false)
	}
	if err != nil {
		return nil, Table{}, err
	}
	defer stop()
	dir, removeDir, err := e.daemonDir("density-daemon")
	if err != nil {
		return nil, Table{}, err
	}
	defer removeDir()
	var points []DensityRealPoint
	haveS, haveD := 0, 0
	for _, step := range o.Steps {
		wantD := step * o.DatabaseTenants / max(o.SchemaTenants, 1)
		// The step's claims and purges come from spares built with the rest.
		if err := e.growTenants(ctx, fc, dir, "density", wantD-haveD, step-haveS); err != nil {
			return nil, Table{}, err
		}
		haveS, haveD = step, wantD
		p, err := e.densityRealPoint(ctx, fc, st, dir, o, haveS, haveD, len(points)+1)
		if err != nil {
			return nil, Table{}, err
		}
		e.logf("density: %d schema + %d database tenants: claim p95 %s / %s, collector pass %s, reconcile %s, %d files",
			haveS, haveD, ms(p.ClaimSchema[1]), ms(p.ClaimDatabase[1]), ms(p.Passes.Pass), ms(p.Reconcile), p.Files)
		points = append(points, p)
	}
	return points, densityRealTable(points, o), nil
}

// What a grown tenant takes on each of the fleet's two servers, from bench
// density's own runs (docs/operations/capacity.md): a schema tenant of
// saas, its relations (0.66 MB) and its rows in the shared database's
// catalogs (0.6 MB at 10,000: pg_attribute, pg_depend, pg_class,
// pg_trigger, pg_constraint and their indexes); a database tenant, the
// catalogs copied with it. WAL and checkpoints take a fifth more.
const (
	diskPerSchemaTenant   = 1300 << 10
	diskPerDatabaseTenant = 9500 << 10
)

// densityDisk is the disk a run to that many tenants needs on its primary
// and standby together, and with backups their repository: two full
// backups at each of up to four steps (an eighth of the cluster each, lz4)
// and the archived WAL of the growth (bench density --backup's own runs).
func densityDisk(schema, database int, backups bool) int64 {
	node := int64(schema)*diskPerSchemaTenant + int64(database)*diskPerDatabaseTenant
	need := node * 2 * 6 / 5
	if backups {
		need += node * 3
	}
	return need
}

// roomFor refuses a run the disk cannot hold: a full disk PANICs the
// primary halfway and leaves nothing to report.
func (e *Env) roomFor(schema, database int, backups bool) error {
	dir := e.Dir
	if dir == "" {
		dir = os.TempDir()
	}
	d, err := backup.DiskOf(dir)
	for errors.Is(err, fs.ErrNotExist) && dir != filepath.Dir(dir) {
		dir = filepath.Dir(dir) // a --dir to be made: the disk it will be on
		d, err = backup.DiskOf(dir)
	}
	if err != nil {
		return err
	}
	if need := densityDisk(schema, database, backups); need > d.Free {
		return fmt.Errorf("%d schema + %d database tenants need about %s of disk on a primary and its standby, and %s has %s free: pass fewer (--schema-tenants, --database-tenants) or a --dir on a larger disk",
			schema, database, config.ByteSize(need).Human(), dir, config.ByteSize(d.Free).Human())
	}
	return nil
}

// densityRealPoint measures one step: claims and a purge of each mode
// (their tenants built cold then dropped again, so the counts stay), the
// collector, /metrics, reconcile and the API through a daemon, the
// server's files, catalog and memory, its idle WAL, a restart and a crash
// recovery; and a rollout of every tenant to a version of one statement
// more (the step-th). With st (--backup), two full backups at the end.
func (e *Env) densityRealPoint(ctx context.Context, fc *fleet.Cluster, st *backup.Stanza, dir string, o DensityRealOptions, schema, database, step int) (DensityRealPoint, error) {
	p := DensityRealPoint{Schema: schema, Database: database}
	cfg := idleConfig(fc, dir, true)
	cfg.Provision.DefaultPoolSize = 0
	// Claims come through the API of a daemon with the cluster's front
	// door, as `up` runs it: a claim answers once PgBouncer has its entry.
	pc, err := benchPooler(filepath.Join(dir, "pgbouncer"))
	if err != nil {
		return p, err
	}
	pc.ServerSocketDir = fc.SocketDir()
	pooled := func(do *daemon.Options) { do.Poolers = map[string]config.PoolerConfig{fc.Name(): pc} }
	d, err := e.startDaemonInProcess(ctx, fc, cfg, pooled)
	if err != nil {
		return p, err
	}
	defer func() {
		if d != nil {
			d.Stop()
		}
	}()
	// Claims: a pool of Requests spares per mode is built first.
	for _, m := range []struct {
		mode tenant.Mode
		out  *[2]time.Duration
		cold *time.Duration
	}{{tenant.ModeSchema, &p.ClaimSchema, &p.ColdSchema}, {tenant.ModeDatabase, &p.ClaimDatabase, &p.ColdDatabase}} {
		c, err := e.timedClaims(ctx, fc, dir, d, m.mode, o.Claims, o.Settle)
		if err != nil {
			return p, err
		}
		m.out[0], m.out[1], *m.cold = percentile(c.lat, 50), percentile(c.lat, 95), c.cold
		if m.mode == tenant.ModeSchema {
			// The pooled session's memory, while its tenant is there.
			if p.PooledSessionBytes, err = pooledSessionMemory(ctx, c.dsn); err != nil {
				return p, err
			}
		}
		// One purged (timed), the rest dropped and purged too: the
		// step's counts stay what was grown.
		for i, id := range c.ids {
			begin := time.Now()
			r, err := d.client.DropTenant(ctx, id, true)
			if err == nil && r.Job != nil {
				var j jobs.Job
				if j, err = d.waitJob(ctx, r.Job.ID); err == nil && j.State != jobs.Succeeded {
					err = fmt.Errorf("purge of %s: %s: %s", id, j.State, j.LastError)
				}
			}
			if err != nil {
				return p, err
			}
			if i == 0 && m.mode == tenant.ModeSchema {
				p.PurgeSchema = time.Since(begin)
			} else if i == 0 {
				p.PurgeDatabase = time.Since(begin)
			}
		}
	}

	// The front door's sync alone, isolated (the purges' syncs widened
	// the front door's window: spaced enough for it to start over):
	// the cluster's tenants and their verifiers read, the files written,
	// PgBouncer reloaded.
	var syncs []time.Duration
	for range 5 {
		time.Sleep(syncSpacing)
		b := time.Now()
		if err := d.d.Poolers().Await(ctx, fc.Name()); err != nil {
			return p, err
		}
		syncs = append(syncs, time.Since(b))
	}
	p.FrontSync = percentile(syncs, 50)

	// The API, on tenants sampled at random.
	var sample []string
	if err := d.catalog.QueryRow(ctx, `SELECT array_agg(id) FROM (SELECT id FROM tenants WHERE state = 'active' ORDER BY random() LIMIT $1) s`, o.Requests).Scan(&sample); err != nil || len(sample) == 0 {
		return p, fmt.Errorf("density: sample tenants: %v", err)
	}
	pick := func() string { return sample[rand.IntN(len(sample))] }
	p95 := func(f func() error) (time.Duration, error) {
		_, p95, err := timeCalls(o.Requests, f)
		return p95, err
	}
	if p.ShowP95, err = p95(func() error { _, err := d.client.Tenant(ctx, pick()); return err }); err != nil {
		return p, err
	}
	if p.ListP95, err = p95(func() error {
		_, err := d.client.Tenants(ctx, url.Values{"limit": {"100"}, "after": {pick()}})
		return err
	}); err != nil {
		return p, err
	}
	if p.SearchP95, err = p95(func() error { _, err := d.client.Tenants(ctx, url.Values{"q": {pick()[:6]}}); return err }); err != nil {
		return p, err
	}
	if p.ConnectsPerSec, err = connectRate(ctx, fc.PrimaryDSN("postgres")); err != nil {
		return p, err
	}
	if p.Rollout, err = e.densityRollout(ctx, fc, d, schema+database, step); err != nil {
		return p, err
	}
	if p.Reconcile, p.ReconcileFindings, err = timeReconcile(ctx, d, fc.Name()); err != nil {
		return p, err
	}
	body, took, err := scrape(ctx, d.client.BaseURL+"/metrics")
	if err != nil {
		return p, err
	}
	p.Scrape, p.ScrapeBytes = took, len(body)
	runtime.GC()
	var mem runtime.MemStats
	runtime.ReadMemStats(&mem)
	p.HeapBytes = mem.HeapInuse
	if p.RSSBytes, err = procValue("/proc/self/status", "VmRSS:"); err != nil {
		return p, err
	}

	// No job left (the spares left over from the claims are being
	// retired), then the server's disk, memory, catalog and files.
	for wait := time.Now(); time.Since(wait) < 2*time.Minute; time.Sleep(time.Second) {
		var busy int
		if err := d.catalog.QueryRow(ctx, `SELECT count(*) FROM jobs WHERE state IN ('queued', 'running', 'waiting')`).Scan(&busy); err != nil {
			return p, err
		}
		if busy == 0 {
			break
		}
	}
	var shared string
	if err := d.catalog.QueryRow(ctx, `SELECT database FROM tenants WHERE mode = 'schema' LIMIT 1`).Scan(&shared); err != nil {
		return p, err
	}
	d.Stop()
	d = nil
	admin, err := pgx.Connect(ctx, fc.PrimaryDSN("postgres"))
	if err != nil {
		return p, err
	}
	defer admin.Close(ctx)
	if err := admin.QueryRow(ctx, `SELECT (SELECT sum(pg_database_size(oid)) FROM pg_database)::bigint,
		(SELECT sum(allocated_size) FROM pg_shmem_allocations)::bigint`).Scan(&p.DiskBytes, &p.ShmemBytes); err != nil {
		return p, err
	}
	if err := sharedCatalog(ctx, fc, shared, &p); err != nil {
		return p, err
	}
	if p.AdminSessionBytes, p.AdminSchemas, err = adminSessionMemory(ctx, fc.PrimaryDSN(shared)); err != nil {
		return p, err
	}
	p.Files = relationFiles(filepath.Join(fc.DataDir("primary"), "base"))

	// The collector's passes, with the daemon stopped: a first round of
	// sizes (every tenant, as after a restart), whose first reads of what
	// growth and the rollout wrote set hint bits (each page's image in
	// the WAL, data checksums being on), then passes at rest; then the
	// capper's two passes, as its daemon runs them: a node's check (every
	// second), the role settings of all tenants (every 30 s).
	before, err := walNow(ctx, admin)
	if err != nil {
		return p, err
	}
	b := time.Now()
	col, done, err := timePasses(ctx, fc, cfg, &p.Passes, true)
	if err != nil {
		return p, err
	}
	p.RoundTook = time.Since(b)
	after, err := walNow(ctx, admin)
	if err == nil {
		p.RoundWAL, p.RoundImages = after.bytes-before.bytes, after.images-before.images
		p.RoundWALWhat, err = walWhat(ctx, fc, admin, before.lsn, after.lsn)
	}
	if err == nil {
		err = timeCapper(ctx, col, cfg, fc.Name(), &p)
	}
	done()
	if err != nil {
		return p, err
	}

	// The idle fleet: a daemon running again (its collector, capper,
	// pools and front door), once autovacuum is done with what growth
	// left (new tables' first analyze, the catalogs' vacuum), WAL in
	// three windows of 10 s.
	if d, err = e.startDaemonInProcess(ctx, fc, cfg, pooled); err != nil {
		return p, err
	}
	if p.IdleSettle, p.IdleSettled, err = settleAutovacuum(ctx, admin, o.Settle, 0); err != nil {
		return p, err
	}
	// What growth, the rollout and autovacuum left dirty in shared
	// buffers is written now, not by a spread checkpoint in the windows.
	if _, err := admin.Exec(ctx, "CHECKPOINT"); err != nil {
		return p, err
	}
	primary, _, err := postmasters(fc)
	if err != nil {
		return p, err
	}
	var windows [3]walPoint
	var from walPoint // the last window's start
	var written int64 // by the primary's processes in the last window
	for i := range windows {
		if from, err = walNow(ctx, admin); err != nil {
			return p, err
		}
		before := treeWriters(primary)
		time.Sleep(10 * time.Second)
		if windows[i], err = walNow(ctx, admin); err != nil {
			return p, err
		}
		after := treeWriters(primary)
		written, p.IdleWriters = total(after)-total(before), topWriters(before, after, 3)
		windows[i].bytes, windows[i].images = windows[i].bytes-from.bytes, windows[i].images-from.images
	}
	first, last := windows[0], windows[len(windows)-1]
	p.IdleWALFirst, p.IdleWALPerSec, p.IdleWritesPerSec = float64(first.bytes)/10, float64(last.bytes)/10, float64(written)/10
	p.IdleImagesFirst, p.IdleImages = first.images, last.images
	if p.IdleWALWhat, err = walWhat(ctx, fc, admin, from.lsn, last.lsn); err != nil {
		return p, err
	}
	d.Stop()
	d = nil

	// A restart (fast shutdown, start) and a crash recovery (immediate
	// shutdown, start): until the primary answers.
	for _, r := range []struct {
		mode string
		out  *time.Duration
	}{{"fast", &p.Restart}, {"immediate", &p.CrashRecovery}} {
		b := time.Now()
		if err := fc.StopNode(ctx, "primary", r.mode); err != nil {
			return p, err
		}
		if err := fc.StartNode(ctx, "primary"); err != nil {
			return p, err
		}
		*r.out = time.Since(b)
	}
	if st != nil {
		for _, r := range []struct {
			out    *fullBackup
			option string
		}{{&p.BackupBundled, "--repo1-bundle"}, {&p.Backup, "--no-repo1-bundle"}} {
			if *r.out, err = timeFullBackup(ctx, st, r.option); err != nil {
				return p, err
			}
		}
	}
	return p, nil
}

// timeFullBackup takes a full backup with a pgBackRest option.
func timeFullBackup(ctx context.Context, st *backup.Stanza, option string) (fullBackup, error) {
	b := time.Now()
	if err := st.BackupStarted(ctx, backup.Full, nil, option); err != nil {
		return fullBackup{}, fmt.Errorf("full backup (%s): %w", option, err)
	}
	took := time.Since(b)
	info, err := st.Info(ctx)
	if err != nil || len(info.Backups) == 0 {
		return fullBackup{}, fmt.Errorf("full backup (%s): no backup in pgbackrest info: %v", option, err)
	}
	last := info.Backups[len(info.Backups)-1]
	files := 0
	err = filepath.WalkDir(filepath.Join(st.RepoPath(), "backup", st.Name, last.Label), func(_ string, d fs.DirEntry, err error) error {
		if err == nil && !d.IsDir() {
			files++
		}
		return err
	})
	return fullBackup{Took: took, Size: last.Size, RepoSize: last.RepoSize, RepoFiles: files}, err
}

// claims are a step's creates of one mode: the claims' latencies, the
// cold build's, every tenant made (to be dropped again) and the first
// one's DSN (through the pooler, with its password).
type claims struct {
	lat  []time.Duration
	cold time.Duration
	ids  []string
	dsn  string
}

// timedClaims builds n spares of mode with a daemon of its own, then claims
// them one at a time through d, then creates until one is built cold (the
// pool empty).
func (e *Env) timedClaims(ctx context.Context, fc *fleet.Cluster, dir string, d *benchDaemon, mode tenant.Mode, n int, settle time.Duration) (claims, error) {
	var c claims
	// The spares: built by pools while d is idle (d has none).
	cfg := benchConfig(fc, dir)
	cfg.TokenFile = filepath.Join(dir, "token-pools")
	cfg.Provision.PoolInterval = cfg.Provision.PoolInterval / 2
	// Two more than claimed: d, which has no pools, shrinks them a spare
	// per pass while the claims run.
	cfg.Pools = []config.PoolConfig{{Template: "saas", Mode: string(mode), Size: n + 2}}
	pools, err := e.startDaemonInProcess(ctx, fc, cfg)
	if err != nil {
		return c, err
	}
	err = waitPool(ctx, pools, "saas", mode, n+2)
	pools.Stop()
	if err != nil {
		return c, err
	}
	// Those spares were built in a burst that leaves autovacuum work
	// behind, which a cluster whose spares come one by one has not: the
	// claims are timed once it is done (bounded by settle).
	admin, err := pgx.Connect(ctx, fc.PrimaryDSN("postgres"))
	if err != nil {
		return c, err
	}
	took, settled, err := settleAutovacuum(ctx, admin, settle, 3*time.Second)
	admin.Close(ctx)
	if err != nil {
		return c, err
	}
	if !settled {
		e.logf("density: autovacuum still works after %s (--settle): the %s claims are timed meanwhile", ms(took), mode)
	}
	// The spares' entries in d's front door (another daemon built them):
	// as a spare that has waited in its pool has them.
	if err := d.d.Poolers().Await(ctx, fc.Name()); err != nil {
		return c, err
	}
	for range n {
		time.Sleep(claimSpacing)
		b := time.Now()
		r, err := d.client.CreateTenant(ctx, provision.Request{Template: "saas", Mode: mode})
		if err == nil && r.Path != "pool" {
			err = fmt.Errorf("a %s tenant was built cold, not claimed", mode)
		}
		if err != nil {
			return c, err
		}
		c.lat = append(c.lat, time.Since(b))
		c.ids = append(c.ids, r.Tenant.ID)
		if c.dsn == "" {
			c.dsn = r.DSN
		}
	}
	// The spares left (d shrinks the pool a spare per pass) are claimed
	// too, until a create finds none and builds its tenant cold.
	var left int
	if err := d.catalog.QueryRow(ctx, `SELECT count(*) FROM tenants WHERE template = 'saas' AND mode = $1 AND state IN ('spare', 'building')`, string(mode)).Scan(&left); err != nil {
		return c, err
	}
	for range left + 3 {
		b := time.Now()
		r, err := d.client.CreateTenant(ctx, provision.Request{Template: "saas", Mode: mode})
		if err == nil && r.Job != nil { // longer than the create waits: its job's end
			var j jobs.Job
			if j, err = d.waitJob(ctx, r.Job.ID); err == nil && j.State != jobs.Succeeded {
				err = fmt.Errorf("cold build of a %s tenant: %s: %s", mode, j.State, j.LastError)
			}
		}
		if err != nil {
			return c, err
		}
		c.ids = append(c.ids, r.Tenant.ID)
		if r.Path == "cold" {
			c.cold = time.Since(b)
			return c, nil
		}
	}
	return c, fmt.Errorf("no %s create was built cold after the pool's last spares", mode)
}

// claimSpacing is the time between two timed claims: more than twice the
// front door's least time between syncs (pooler.coalesce, 100 ms), so each
// claim is one that comes alone, not one of a burst whose syncs the front
// door batches (each of those waits up to 8 × that).
const claimSpacing = 300 * time.Millisecond

// syncSpacing is more than twice the front door's widest window between
// syncs (8 × pooler.coalesce): a sync asked after it is served at once.
const syncSpacing = 2 * time.Second

// walWhat reads the primary's WAL from..to with pg_waldump: the kinds
// of record and the databases that wrote most of it.
func walWhat(ctx context.Context, fc *fleet.Cluster, admin *pgx.Conn, from, to string) (string, error) {
	if from == to {
		return "nothing written", nil
	}
	sum, err := readWAL(ctx, fc.Binaries().Path("pg_waldump"), filepath.Join(fc.DataDir("primary"), "pg_wal"), from, to)
	if err != nil {
		return "pg_waldump: " + err.Error(), nil
	}
	rows, err := admin.Query(ctx, `SELECT oid::int8, datname FROM pg_catalog.pg_database`)
	if err != nil {
		return "", err
	}
	names := map[uint32]string{}
	for rows.Next() {
		var oid int64
		var name string
		if err := rows.Scan(&oid, &name); err != nil {
			rows.Close()
			return "", err
		}
		names[uint32(oid)] = name
	}
	if err := rows.Err(); err != nil {
		return "", err
	}
	return sum.top(3, names), nil
}

// sharedCatalog measures the catalog of a shared database of schema tenants.
func sharedCatalog(ctx context.Context, fc *fleet.Cluster, shared string, p *DensityRealPoint) error {
	conn, err := pgx.Connect(ctx, fc.PrimaryDSN(shared))
	if err != nil {
		return err
	}
	defer conn.Close(ctx)
	return conn.QueryRow(ctx, `SELECT (SELECT count(*) FROM pg_class), (SELECT count(*) FROM pg_attribute),
		pg_total_relation_size('pg_class') + pg_total_relation_size('pg_attribute')`).Scan(&p.SharedClassRows, &p.SharedAttrRows, &p.SharedCatalogBytes)
}

// walPoint is the primary's WAL position (lsn, and in bytes) and the
// full-page images written since its statistics were reset; or, between
// two points, what was written.
type walPoint struct {
	lsn           string
	bytes, images int64
}

func walNow(ctx context.Context, admin *pgx.Conn) (walPoint, error) {
	var w walPoint
	err := admin.QueryRow(ctx, `SELECT pg_current_wal_lsn()::text, pg_current_wal_lsn() - '0/0', wal_fpi FROM pg_catalog.pg_stat_wal`).Scan(&w.lsn, &w.bytes, &w.images)
	return w, err
}

// timeCapper times the statement capper on the collector's clusters: p50
// of 20 checks of the primary's sessions, and one pass over every
// tenant's role settings.
func timeCapper(ctx context.Context, col *metrics.Collector, cfg config.Config, name string, p *DensityRealPoint) error {
	cl, err := col.Clusters.Get(name)
	if err != nil {
		return err
	}
	c := &quota.Capper{Store: col.Store, Clusters: col.Clusters, Metrics: cfg.Metrics, Tiers: cfg.Tiers}
	if p.CapperCheck, _, err = timeCalls(20, func() error { _, err := c.CheckNode(ctx, cl, "primary"); return err }); err != nil {
		return err
	}
	b := time.Now()
	if _, err := c.RestoreSettings(ctx, cl); err != nil {
		return err
	}
	p.CapperSettings = time.Since(b)
	return nil
}

// relationFiles counts the files under a data dir's base directory.
func relationFiles(base string) int {
	n := 0
	dbs, _ := os.ReadDir(base)
	for _, db := range dbs {
		fs, _ := os.ReadDir(filepath.Join(base, db.Name()))
		n += len(fs)
	}
	return n
}

func densityRealTable(ps []DensityRealPoint, o DensityRealOptions) Table {
	t := Table{Title: "pgtenant bench density: one primary + streaming standby grown to schema and database tenants of saas",
		Columns: []string{"measure"}, Data: map[string]any{"points": ps}}
	row := pointRows(&t, ps, func(p DensityRealPoint) string { return fmt.Sprintf("%d+%d", p.Schema, p.Database) })
	d := inMs[DensityRealPoint]
	n := func(f func(DensityRealPoint) int64) func(DensityRealPoint) string {
		return func(p DensityRealPoint) string { return strconv.FormatInt(f(p), 10) }
	}
	row("claim, schema, p50", d(func(p DensityRealPoint) time.Duration { return p.ClaimSchema[0] }))
	row("claim, schema, p95", d(func(p DensityRealPoint) time.Duration { return p.ClaimSchema[1] }))
	row("claim, database, p50", d(func(p DensityRealPoint) time.Duration { return p.ClaimDatabase[0] }))
	row("claim, database, p95", d(func(p DensityRealPoint) time.Duration { return p.ClaimDatabase[1] }))
	row("cold build, schema (no spare left; through the API)", d(func(p DensityRealPoint) time.Duration { return p.ColdSchema }))
	row("cold build, database (no spare left; through the API)", d(func(p DensityRealPoint) time.Duration { return p.ColdDatabase }))
	row("drop + purge, schema", d(func(p DensityRealPoint) time.Duration { return p.PurgeSchema }))
	row("drop + purge, database", d(func(p DensityRealPoint) time.Duration { return p.PurgeDatabase }))
	row("collector: first pass", d(func(p DensityRealPoint) time.Duration { return p.Passes.FirstPass }))
	row("collector: pass p50, first round of sizes", d(func(p DensityRealPoint) time.Duration { return p.Passes.Pass }))
	row("collector: statistics of the pass", d(func(p DensityRealPoint) time.Duration { return p.Passes.Statistics }))
	row("collector: sizes of the pass", d(func(p DensityRealPoint) time.Duration { return p.Passes.Sizes }))
	row("collector: sizes per pass", n(func(p DensityRealPoint) int64 { return int64(p.Passes.SizesPerPass) }))
	row("collector: pass p50, after a round", d(func(p DensityRealPoint) time.Duration { return p.Passes.SteadyPass }))
	row("collector: sizes of that pass", d(func(p DensityRealPoint) time.Duration { return p.Passes.SteadySizes }))
	row("collector: sizes per pass after a round", n(func(p DensityRealPoint) int64 { return int64(p.Passes.SteadySizesCount) }))
	row("collector: statements per pass", n(func(p DensityRealPoint) int64 { return int64(p.Passes.Queries) }))
	row("collector: WAL of the first round of sizes (once, after growth and rollout)", func(p DensityRealPoint) string {
		return fmt.Sprintf("%s (%d page images) in %s", kb(p.RoundWAL), p.RoundImages, ms(p.RoundTook))
	})
	row("capper: check of the primary's sessions p50", d(func(p DensityRealPoint) time.Duration { return p.CapperCheck }))
	row("capper: pass over every tenant's role settings", d(func(p DensityRealPoint) time.Duration { return p.CapperSettings }))
	row("/metrics scrape", d(func(p DensityRealPoint) time.Duration { return p.Scrape }))
	row("/metrics size", func(p DensityRealPoint) string { return kb(int64(p.ScrapeBytes)) })
	row("front door: one sync (tenants, verifiers, files, RELOAD)", d(func(p DensityRealPoint) time.Duration { return p.FrontSync }))
	row("rollout of every tenant, one statement (tenants/s)", func(p DensityRealPoint) string { return fmt.Sprintf("%.0f", p.Rollout.PerSec) })
	row("new connections per second, 4 at a time (this machine's process start)", func(p DensityRealPoint) string { return fmt.Sprintf("%.0f", p.ConnectsPerSec) })
	row("rollout: failed tenants", n(func(p DensityRealPoint) int64 { return int64(p.Rollout.Failed) }))
	row("rollout again, nothing to do", func(p DensityRealPoint) string {
		if p.Rollout.NoOp <= 0 {
			return "-"
		}
		return fmt.Sprintf("%s (%.0f tenants/s)", ms(p.Rollout.NoOp), float64(p.Schema+p.Database)/p.Rollout.NoOp.Seconds())
	})
	row("rollout: peak standby replay lag", func(p DensityRealPoint) string { return kb(p.Rollout.Cost.PeakLagBytes) })
	row(fmt.Sprintf("reconcile of the cluster, p50 of %d", reconciles), d(func(p DensityRealPoint) time.Duration { return p.Reconcile }))
	row("reconcile findings", n(func(p DensityRealPoint) int64 { return int64(p.ReconcileFindings) }))
	row("API show p95", d(func(p DensityRealPoint) time.Duration { return p.ShowP95 }))
	row("API list (page of 100) p95", d(func(p DensityRealPoint) time.Duration { return p.ListP95 }))
	row("API search p95", d(func(p DensityRealPoint) time.Duration { return p.SearchP95 }))
	row("Go heap in use (bench and daemon)", func(p DensityRealPoint) string { return kb(int64(p.HeapBytes)) })
	row("process RSS (bench and daemon)", func(p DensityRealPoint) string { return kb(p.RSSBytes) })
	row("backend memory: a pooled session that served one schema tenant", func(p DensityRealPoint) string { return kb(p.PooledSessionBytes) })
	row("backend memory: a superuser session that read a table of every schema", func(p DensityRealPoint) string {
		return fmt.Sprintf("%s (%d schemas)", kb(p.AdminSessionBytes), p.AdminSchemas)
	})
	row("relation files (primary)", n(func(p DensityRealPoint) int64 { return int64(p.Files) }))
	row("disk (all databases)", func(p DensityRealPoint) string { return kb(p.DiskBytes) })
	row("shared database: pg_class rows", n(func(p DensityRealPoint) int64 { return p.SharedClassRows }))
	row("shared database: pg_attribute rows", n(func(p DensityRealPoint) int64 { return p.SharedAttrRows }))
	row("shared database: pg_class + pg_attribute", func(p DensityRealPoint) string { return kb(p.SharedCatalogBytes) })
	row("shared memory allocated", func(p DensityRealPoint) string { return kb(p.ShmemBytes) })
	row("idle WAL per second, first 10 s (daemon running)", func(p DensityRealPoint) string {
		return fmt.Sprintf("%s (%d page images)", kb(int64(p.IdleWALFirst)), p.IdleImagesFirst)
	})
	row("idle WAL per second, 20 s later", func(p DensityRealPoint) string {
		return fmt.Sprintf("%s (%d page images)", kb(int64(p.IdleWALPerSec)), p.IdleImages)
	})
	row("idle writes per second, 20 s later (the primary's processes)", func(p DensityRealPoint) string { return kb(int64(p.IdleWritesPerSec)) })
	row("autovacuum's work after growth (before the idle WAL)", func(p DensityRealPoint) string {
		if !p.IdleSettled {
			return "> " + ms(p.IdleSettle)
		}
		return ms(p.IdleSettle)
	})
	row("restart (fast shutdown, start)", d(func(p DensityRealPoint) time.Duration { return p.Restart }))
	row("crash recovery (immediate shutdown, start)", d(func(p DensityRealPoint) time.Duration { return p.CrashRecovery }))
	if o.Backup {
		full := func(f func(DensityRealPoint) fullBackup) func(DensityRealPoint) string {
			return func(p DensityRealPoint) string {
				b := f(p)
				return fmt.Sprintf("%s: %s read, %s in %d files", ms(b.Took), kb(b.Size), kb(b.RepoSize), b.RepoFiles)
			}
		}
		row("full backup, files bundled (repo-bundle: pgtenant's default)", full(func(p DensityRealPoint) fullBackup { return p.BackupBundled }))
		row("full backup, a repository file per file (pgBackRest's default)", full(func(p DensityRealPoint) fullBackup { return p.Backup }))
	}
	t.Notes = []string{
		fmt.Sprintf("tenants of the shipped saas template (111 relations), grown through pgtenant's pools and claims; columns are schema+database tenants; each step's %d claims per mode are of spares built for them (claimed 300 ms apart, through a daemon with the cluster's PgBouncer, once autovacuum is done with them, --settle, and the front door has their entries, as spares that waited in their pool have; a claim answers once PgBouncer has the tenant's entry), and those tenants are dropped and purged again (the purge row is the first's).", o.Claims),
		"cold builds: after the claims, creates until the pool has no spare left, the first built from the template in a job timed through the API (the create waits for it); they are dropped and purged with the claimed ones.",
		"backend memory: a server process's own (anonymous) memory, Pss_Anon of /proc/<pid>/smaps_rollup: its caches and work memory, not shared buffers; the pooled session read each table of one schema tenant in a transaction through PgBouncer, the superuser session the users table of every schema of the shared database, 100 a statement. Process RSS: VmRSS of the bench's process, which runs the daemon.",
		"idle writes: /proc/<pid>/io write_bytes less cancelled_write_bytes (a temp file deleted before it was written back reaches no disk) over the primary's postmaster and its children in the last idle window (bytes handed to the OS; PostgreSQL 15 keeps its statistics in shared memory, so seed 002's statistics-file storm has no file to write); the windows begin after a CHECKPOINT, so that what earlier work left dirty is not counted.",
		"the collector's passes run with the daemon stopped, a collector of their own: the first round of sizes sizes every tenant (as after a restart), the passes after it only the tenants whose clients did something (none here) and those idle for metrics.idle_size_interval; the restart and crash rows end when the primary accepts connections again.",
		fmt.Sprintf("idle WAL is measured with a daemon running again after the collector's round, in three windows of 10 s once no job is left and no autovacuum worker has worked on a table for autovacuum_naptime and 5 s, so that every database's turn came and what growth left is done (waited for %s at most, --settle; a figure after '>' is one where autovacuum still ran); the round's WAL has its own row: its first reads of the catalog rows growth and the rollout wrote set their hint bits, each page's image in the WAL once with data checksums on, which a daemon's collector does once over metrics.size_interval after such a change; the target is checked on the last window.", o.Settle),
	}
	if o.Backup {
		t.Notes = append(t.Notes, fmt.Sprintf("with --backup the cluster archives its WAL (pgBackRest, async): archive_timeout (%s) ends a segment that has any WAL in it, and the rest of that segment (up to 16 MB, XLOG/SWITCH in the WAL notes) counts in the window it falls in; the two full backups of a step run one after the other, from the standby (the bundled one first, so that the other's reads are not the colder), with a stanza as up makes it otherwise (one process, lz4).", fleet.ArchiveTimeout))
	}
	for _, p := range ps {
		t.Notes = append(t.Notes, fmt.Sprintf("WAL at %d+%d by kind of record and database (pg_waldump): the collector's first round %s; idle, the last window %s; its writes by process: %s", p.Schema, p.Database, p.RoundWALWhat, p.IdleWALWhat, p.IdleWriters))
	}
	if len(ps) > 0 {
		l := ps[len(ps)-1]
		at := fmt.Sprintf("at %d+%d tenants: ", l.Schema, l.Database)
		claims := max(l.ClaimSchema[1], l.ClaimDatabase[1])
		t.Checks = append(t.Checks,
			Check{Target: at + "claim p50 <= 15 ms and p95 <= 50 ms in both modes", Got: fmt.Sprintf("schema %s / %s, database %s / %s",
				ms(l.ClaimSchema[0]), ms(l.ClaimSchema[1]), ms(l.ClaimDatabase[0]), ms(l.ClaimDatabase[1])),
				Met: max(l.ClaimSchema[0], l.ClaimDatabase[0]) <= 15*time.Millisecond && claims <= 50*time.Millisecond},
			Check{Target: at + "a metrics pass <= 1 s", Got: fmt.Sprintf("%s after a round of sizes, %s in the first (%d statements)", ms(l.Passes.SteadyPass), ms(l.Passes.Pass), l.Passes.Queries),
				Met: l.Passes.SteadyPass <= time.Second},
			Check{Target: at + "the idle fleet writes <= 64 KB/s of WAL", Got: kb(int64(l.IdleWALPerSec)) + "/s", Met: l.IdleWALPerSec <= 64<<10},
			Check{Target: at + "a rollout of every tenant keeps >= 50 tenants/s", Got: fmt.Sprintf("%.0f tenants/s (%d failed; this machine opened %.0f new connections/s, and each tenant's migration opens one)", l.Rollout.PerSec, l.Rollout.Failed, l.ConnectsPerSec),
				Met: l.Rollout.PerSec >= 50 && l.Rollout.Failed == 0},
			Check{Target: at + "reconcile of the cluster <= 30 s", Got: ms(l.Reconcile), Met: l.Reconcile <= 30*time.Second},
			Check{Target: at + "the daemon's memory <= 512 MB", Got: fmt.Sprintf("%s resident (bench and daemon; %s of Go heap in use)", kb(l.RSSBytes), kb(int64(l.HeapBytes))), Met: l.RSSBytes <= 512<<20})
	}
	if len(ps) >= 2 {
		first, last := ps[0], ps[len(ps)-1]
		grow := float64(last.Schema+last.Database) / float64(max(first.Schema+first.Database, 1))
		perTenant := func(p DensityRealPoint) time.Duration { // the rollout's time per tenant
			if p.Rollout.PerSec <= 0 {
				return 0
			}
			return time.Duration(float64(time.Second) / p.Rollout.PerSec)
		}
		cases := []growthCase{
			timeGrowth("schema claim p95", "waits for the front door's sync, which renders every tenant's entry", first.ClaimSchema[1], last.ClaimSchema[1]),
			timeGrowth("database claim p95", "waits for the front door's sync, which renders every tenant's entry", first.ClaimDatabase[1], last.ClaimDatabase[1]),
			timeGrowth("schema cold build", "creates the template's relations in the shared database, whose catalogs grow with its tenants", first.ColdSchema, last.ColdSchema),
			timeGrowth("database cold build", "CREATE DATABASE copies the template and checkpoints", first.ColdDatabase, last.ColdDatabase),
			timeGrowth("schema drop + purge", "finds the schema's objects in the shared database's pg_depend", first.PurgeSchema, last.PurgeSchema),
			timeGrowth("collector pass", "its first round sizes every tenant: linear by design, once per metrics.size_interval", first.Passes.Pass, last.Passes.Pass),
			timeGrowth("collector pass after a round", "reads every database's statistics in one statement", first.Passes.SteadyPass, last.Passes.SteadyPass),
			timeGrowth("reconcile", "lists every tenant's database, schema and role on the server and in the catalog: linear by design", first.Reconcile, last.Reconcile),
			timeGrowth("rollout, time per tenant", "each tenant's migration opens its own session", perTenant(first), perTenant(last)),
			timeGrowth("front door sync", "renders every tenant's entry and verifier: linear by design, batched under bursts", first.FrontSync, last.FrontSync),
			timeGrowth("/metrics scrape", "series of the tenants above the cardinality guard", first.Scrape, last.Scrape),
			timeGrowth("capper check", "", first.CapperCheck, last.CapperCheck),
			timeGrowth("capper settings pass", "reads every tenant role's settings: linear by design, every 30 s", first.CapperSettings, last.CapperSettings),
			timeGrowth("API list p95", "", first.ListP95, last.ListP95), timeGrowth("API search p95", "", first.SearchP95, last.SearchP95),
			timeGrowth("restart", "the shutdown checkpoint writes what the step dirtied", first.Restart, last.Restart),
			timeGrowth("crash recovery", "replays the WAL since the last checkpoint and syncs every file of the data directory", first.CrashRecovery, last.CrashRecovery),
			sizeGrowth("shared catalogs (pg_class + pg_attribute)", "every schema tenant's relations and columns are rows of one database's catalogs", first.SharedCatalogBytes, last.SharedCatalogBytes),
			countGrowth("relation files", "each relation of each tenant has its files", int64(first.Files), int64(last.Files)),
			sizeGrowth("process RSS (bench and daemon)", "", first.RSSBytes, last.RSSBytes),
			sizeGrowth("pooled session's memory", "", first.PooledSessionBytes, last.PooledSessionBytes),
			sizeGrowth("admin session's memory", "its relation cache holds every table it opened: linear in what it touches", first.AdminSessionBytes, last.AdminSessionBytes),
		}
		if o.Backup {
			cases = append(cases, timeGrowth("full backup", "copies every file", first.Backup.Took, last.Backup.Took),
				timeGrowth("full backup bundled", "copies every file", first.BackupBundled.Took, last.BackupBundled.Took))
		}
		t.Notes = append(t.Notes, growthNotes(grow, fmt.Sprintf("%.1f", grow), cases)...)
	}
	return t
}

// connectRate opens and closes connections to dsn, 4 at a time, for a
// second, and returns how many a second it opened.
func connectRate(ctx context.Context, dsn string) (float64, error) {
	const at, window = 4, time.Second
	var opened atomic.Int64
	start := time.Now()
	g, gctx := errgroup.WithContext(ctx)
	for range at {
		g.Go(func() error {
			for time.Since(start) < window {
				conn, err := pgx.Connect(gctx, dsn)
				if err != nil {
					return fmt.Errorf("connect: %w", err)
				}
				opened.Add(1)
				if err := conn.Close(gctx); err != nil {
					return err
				}
			}
			return nil
		})
	}
	err := g.Wait()
	return float64(opened.Load()) / time.Since(start).Seconds(), err
}

// densityRollout pushes the step-th version of saas, one statement more
// (a column without a default, no table rewrite), and rolls every tenant
// out to it (the migrate bench's rollout row: tenants/s, then the same
// rollout with nothing to do).
func (e *Env) densityRollout(ctx context.Context, fc *fleet.Cluster, d *benchDaemon, tenants, step int) (MigrateRow, error) {
	files := examples.Saas()
	for i := 1; i <= step; i++ {
		files = append(files, templates.Upload{Name: fmt.Sprintf("%04d_density_%d.sql", i+1, i),
			Body: fmt.Sprintf("ALTER TABLE users ADD COLUMN density_%d text;\n", i)})
	}
	added, err := d.client.PushTemplate(ctx, "saas", files)
	if err != nil {
		return MigrateRow{}, fmt.Errorf("push saas: %w", err)
	}
	for _, j := range added.BuildJobs {
		if j, err := d.waitJob(ctx, j.ID); err != nil || j.State != jobs.Succeeded {
			return MigrateRow{}, fmt.Errorf("build saas v%d: %v %s", added.Version, err, j.LastError)
		}
	}
	admin, err := smallPool(ctx, fc.PrimaryDSN("postgres"))
	if err != nil {
		return MigrateRow{}, err
	}
	defer admin.Close()
	meter, err := newMeter(ctx, fc)
	if err != nil {
		return MigrateRow{}, err
	}
	defer meter.Close()
	return e.migrateRollout(ctx, admin, meter, d, tenants, methodRollout, added.Version, 0)
}

// settleAutovacuum waits, for up to most, until no autovacuum worker has
// worked on a table for quiet in a row (sampled every 250 ms; a worker
// that visits a database with nothing to do does not count); it returns
// how long that took and whether it happened. A quiet of 0 is one
// autovacuum_naptime and 5 s: every database's turn has come and gone,
// so the work a burst left is done and not merely between two visits.
func settleAutovacuum(ctx context.Context, admin *pgx.Conn, most, quiet time.Duration) (time.Duration, bool, error) {
	if quiet == 0 {
		var naptime int
		if err := admin.QueryRow(ctx, `SELECT setting::int FROM pg_catalog.pg_settings WHERE name = 'autovacuum_naptime'`).Scan(&naptime); err != nil {
			return 0, false, err
		}
		quiet = time.Duration(naptime)*time.Second + 5*time.Second
	}
	start, since := time.Now(), time.Now()
	for time.Since(start) < most {
		var working int
		if err := admin.QueryRow(ctx, `SELECT count(*) FROM pg_catalog.pg_stat_activity
			WHERE backend_type = 'autovacuum worker' AND query LIKE 'autovacuum:%'`).Scan(&working); err != nil {
			return 0, false, err
		}
		if working > 0 {
			since = time.Now()
		}
		if time.Since(since) >= quiet {
			return time.Since(start), true, nil
		}
		select {
		case <-ctx.Done():
			return 0, false, ctx.Err()
		case <-time.After(250 * time.Millisecond):
		}
	}
	return time.Since(start), false, nil
}

// pooledSessionMemory logs in through the pooler with dsn (a schema
// tenant's), reads each of its tables in one transaction (so on one of the
// pooler's server connections) and returns that server backend's own
// memory.
func pooledSessionMemory(ctx context.Context, dsn string) (int64, error) {
	cfg, err := pgx.ParseConfig(dsn)
	if err != nil {
		return 0, err
	}
	cfg.DefaultQueryExecMode = pgx.QueryExecModeSimpleProtocol // transaction mode: no prepared statements
	conn, err := pgx.ConnectConfig(ctx, cfg)
	if err != nil {
		return 0, fmt.Errorf("pooled session: %w", err)
	}
	defer conn.Close(context.WithoutCancel(ctx))
	tx, err := conn.Begin(ctx)
	if err != nil {
		return 0, err
	}
	defer tx.Rollback(context.WithoutCancel(ctx))
	rows, err := tx.Query(ctx, `SELECT format('%I', relname) FROM pg_catalog.pg_class
		WHERE relnamespace = current_schema()::regnamespace AND relkind IN ('r', 'p')`)
	if err != nil {
		return 0, err
	}
	tables, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil || len(tables) == 0 {
		return 0, fmt.Errorf("pooled session: the tenant's tables: %v (%d)", err, len(tables))
	}
	for _, t := range tables {
		if _, err := tx.Exec(ctx, "SELECT count(*) FROM "+t); err != nil {
			return 0, err
		}
	}
	var pid int
	if err := tx.QueryRow(ctx, `SELECT pg_backend_pid()`).Scan(&pid); err != nil {
		return 0, err
	}
	if err := tx.Commit(ctx); err != nil {
		return 0, err
	}
	return procValue(fmt.Sprintf("/proc/%d/smaps_rollup", pid), "Pss_Anon:")
}

// adminSessionMemory reads the users table of every schema of the shared
// database at dsn in one superuser session (100 tables a statement) and
// returns that backend's own memory and how many schemas it read.
func adminSessionMemory(ctx context.Context, dsn string) (int64, int, error) {
	conn, err := pgx.Connect(ctx, dsn)
	if err != nil {
		return 0, 0, err
	}
	defer conn.Close(context.WithoutCancel(ctx))
	rows, err := conn.Query(ctx, `SELECT format('%I.%I', n.nspname, c.relname) FROM pg_catalog.pg_class c
		JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace WHERE c.relname = 'users' AND c.relkind = 'r'`)
	if err != nil {
		return 0, 0, err
	}
	tables, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		return 0, 0, err
	}
	for i := 0; i < len(tables); i += 100 {
		q := "SELECT count(*) FROM " + strings.Join(tables[i:min(i+100, len(tables))], " UNION ALL SELECT count(*) FROM ")
		if _, err := conn.Exec(ctx, q); err != nil {
			return 0, 0, err
		}
	}
	var pid int
	if err := conn.QueryRow(ctx, `SELECT pg_backend_pid()`).Scan(&pid); err != nil {
		return 0, 0, err
	}
	mem, err := procValue(fmt.Sprintf("/proc/%d/smaps_rollup", pid), "Pss_Anon:")
	return mem, len(tables), err
}

// procValue reads the figure on the line of a /proc file that starts with
// key: write_bytes in io (bytes), VmRSS in status and Pss_Anon in
// smaps_rollup (kB, returned in bytes).
func procValue(path, key string) (int64, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return 0, err
	}
	for _, line := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, key); ok {
			v = strings.TrimSpace(v)
			kB := strings.HasSuffix(v, " kB")
			n, err := strconv.ParseInt(strings.TrimSuffix(v, " kB"), 10, 64)
			if kB {
				n <<= 10
			}
			return n, err
		}
	}
	return 0, fmt.Errorf("%s: no %s line", path, key)
}
