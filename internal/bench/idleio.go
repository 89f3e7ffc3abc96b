package bench

// `bench idle-io` (issue 8): what per-tenant metrics cost an idle fleet.

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	examples "github.com/pgtenant/pgtenant/examples/templates"
	"github.com/pgtenant/pgtenant/internal/catalog"
	"github.com/pgtenant/pgtenant/internal/cluster"
	"github.com/pgtenant/pgtenant/internal/config"
	"github.com/pgtenant/pgtenant/internal/fleet"
	"github.com/pgtenant/pgtenant/internal/metrics"
	"github.com/pgtenant/pgtenant/internal/provision"
	"github.com/pgtenant/pgtenant/internal/tenant"
)

// IdleIOOptions tune `bench idle-io`.
type IdleIOOptions struct {
	Tenants  int           `json:"tenants"`           // database tenants
	Schemas  int           `json:"schemas"`           // schema tenants
	Window   time.Duration `json:"window_ns"`         // each idle window
	Settle   time.Duration `json:"settle_ns"`         // after the daemon starts, before a window
	Simulate int           `json:"simulated_tenants"` // the scale point: tenants in the catalog (real ones included)
	Rounds   int           `json:"rounds"`            // pairs of windows (off, on)
}

// IdleWindow is one idle window with the collector off or on.
type IdleWindow struct {
	Collector          bool    `json:"collector"`
	Seconds            float64 `json:"seconds"`
	PrimaryWriteBytes  int64   `json:"primary_write_bytes"` // /proc/<pid>/io write_bytes over the postmaster and its children
	StandbyWriteBytes  int64   `json:"standby_write_bytes"`
	PGCPUSeconds       float64 `json:"postgres_cpu_seconds"` // utime + stime of both servers' processes
	SelfWriteBytes     int64   `json:"pgtenant_write_bytes"` // /proc/self/io (the daemon runs in this process)
	SelfCPUSeconds     float64 `json:"pgtenant_cpu_seconds"` // getrusage(RUSAGE_SELF)
	WALBytes           int64   `json:"primary_wal_bytes"`
	WALRecords         int64   `json:"primary_wal_records"` // pg_stat_wal
	WALFPI             int64   `json:"primary_wal_full_page_images"`
	HistoryRows        int64   `json:"history_rows_written"`
	CheckpointIncluded bool    `json:"final_checkpoint_included"`
	Windows            int     `json:"windows"` // summed over this many windows
}

func (w *IdleWindow) add(x IdleWindow) {
	w.Seconds += x.Seconds
	w.PrimaryWriteBytes += x.PrimaryWriteBytes
	w.StandbyWriteBytes += x.StandbyWriteBytes
	w.PGCPUSeconds += x.PGCPUSeconds
	w.SelfWriteBytes += x.SelfWriteBytes
	w.SelfCPUSeconds += x.SelfCPUSeconds
	w.WALBytes += x.WALBytes
	w.WALRecords += x.WALRecords
	w.WALFPI += x.WALFPI
	w.HistoryRows += x.HistoryRows
	w.CheckpointIncluded = x.CheckpointIncluded
	w.Windows++
}

func (w IdleWindow) pgWrites() int64    { return w.PrimaryWriteBytes + w.StandbyWriteBytes }
func (w IdleWindow) totalWrites() int64 { return w.pgWrites() + w.SelfWriteBytes }
func (w IdleWindow) perSec(n int64) float64 {
	if w.Seconds <= 0 {
		return 0
	}
	return float64(n) / w.Seconds
}

// ScaleTiming is the collector and /metrics at one fleet size.
type ScaleTiming struct {
	Tenants      int           `json:"tenants"`
	Real         int           `json:"real_tenants"`
	FirstPass    time.Duration `json:"first_pass_ns"` // loads remembered sizes, counts relation files
	Pass         time.Duration `json:"pass_p50_ns"`
	PassMax      time.Duration `json:"pass_max_ns"`
	Queries      int           `json:"queries_per_pass"`
	SizesPerPass int           `json:"sizes_per_pass"`
	// Steady*: passes after a whole round of sizes (size_interval /
	// interval passes), when an idle tenant's turn passes it over.
	SteadyPass       time.Duration `json:"steady_pass_p50_ns,omitempty"`
	SteadySizes      time.Duration `json:"steady_sizes_p50_ns,omitempty"`
	SteadySizesCount int           `json:"steady_sizes_per_pass,omitempty"`
	Statistics       time.Duration `json:"statistics_p50_ns"` // of Pass: the activity counters' queries
	Sizes            time.Duration `json:"sizes_p50_ns"`      // of Pass: the sizes' queries
	Scrape           time.Duration `json:"scrape_p50_ns"`     // the daemon's GET /metrics (top N + opted-in)
	ScrapeMax        time.Duration `json:"scrape_max_ns"`
	ScrapeSeries     int           `json:"scrape_series"`
	ScrapeBytes      int           `json:"scrape_bytes"`
	NoGuard          time.Duration `json:"scrape_no_guard_p50_ns"` // every tenant exported
	NoGuardSeries    int           `json:"scrape_no_guard_series"`
	SimulatedTenant  bool          `json:"simulated"`
}

// IdleIOResult is what `bench idle-io` measured.
type IdleIOResult struct {
	Options IdleIOOptions `json:"options"`
	Version string        `json:"server_version"`
	Off, On IdleWindow
	Scale   []ScaleTiming `json:"scale"`
}

// IdleIO measures, on one primary with a streaming standby holding
// opts.Tenants database tenants and opts.Schemas schema tenants, an idle
// window with the metrics collector (and the statement cap checks) off, then
// one with them on, side by side; then the time of a collector pass and of a
// /metrics scrape at that size and at opts.Simulate tenants (the extra ones
// are catalog rows without databases: creating 10,000 real databases would
// take ~75 GB and an hour here).
func (e *Env) IdleIO(ctx context.Context, o IdleIOOptions) (IdleIOResult, Table, error) {
	res := IdleIOResult{Options: o}
	fc, stop, err := e.fleetFor(ctx, "idleio", nil, true)
	if err != nil {
		return res, Table{}, err
	}
	defer stop()
	dir := filepath.Join(e.Dir, "idleio")
	if err := e.idleTenants(ctx, fc, dir, o); err != nil {
		return res, Table{}, err
	}
	var version string
	if err := queryRow(ctx, fc.PrimaryDSN("postgres"), `SELECT current_setting('server_version')`, &version); err != nil {
		return res, Table{}, err
	}
	res.Version = version

	if err := e.quietDown(ctx, fc, o); err != nil {
		return res, Table{}, err
	}
	// Off, on, off, on: background work that fades (or grows) over time
	// weighs on both sides alike.
	res.Off.Collector, res.On.Collector = false, true
	for i := 0; i < 2*max(o.Rounds, 1); i++ {
		on := i%2 == 1
		w, err := e.idleWindow(ctx, fc, dir, o, on)
		if err != nil {
			return res, Table{}, err
		}
		sum := &res.Off
		if on {
			sum = &res.On
		}
		sum.add(w)
	}
	n := o.Tenants + o.Schemas
	s, err := e.scaleTiming(ctx, fc, dir, n, n)
	if err != nil {
		return res, Table{}, err
	}
	res.Scale = append(res.Scale, s)
	if o.Simulate > n {
		if err := simulateTenants(ctx, fc, o.Simulate-n); err != nil {
			return res, Table{}, err
		}
		s, err := e.scaleTiming(ctx, fc, dir, o.Simulate, n)
		if err != nil {
			return res, Table{}, err
		}
		res.Scale = append(res.Scale, s)
	}
	return res, idleIOTable(res), nil
}

// idleConfig is the daemon configuration of the windows: the bench's
// defaults, hot-set capture and the restart watcher off (they would write on
// their own schedule), and the collector and statement cap off or as
// shipped (a statement cap and a quota on the default tier, so that the cap
// checks and the quota evaluation run too).
func idleConfig(fc *fleet.Cluster, dir string, on bool) config.Config {
	cfg := benchConfig(fc, dir)
	t := cfg.Tiers["default"]
	if on {
		cfg.Metrics = config.Default().Metrics
		t.StatementCap = config.Duration(5 * time.Minute)
		t.StorageWarn, t.StorageQuota, t.StorageGrace = 512<<20, 1<<30, config.Duration(time.Hour)
	}
	cfg.Tiers = map[string]config.Tier{"default": t}
	return cfg
}

// idleTenants builds o.Tenants database and o.Schemas schema tenants of
// saas.
func (e *Env) idleTenants(ctx context.Context, fc *fleet.Cluster, dir string, o IdleIOOptions) error {
	return e.growTenants(ctx, fc, dir, "idle-io", o.Tenants, o.Schemas)
}

// growTenants adds database and schema tenants of saas (the template is
// stored first when the catalog lacks it): it builds that many spares with
// a daemon of its own, then claims them through the API with a daemon
// without pools (nothing refills).
func (e *Env) growTenants(ctx context.Context, fc *fleet.Cluster, dir, label string, database, schema int) error {
	cfg := benchConfig(fc, dir)
	cfg.Jobs.Workers = 6
	cfg.Provision.PoolInterval = config.Duration(500 * time.Millisecond)
	cfg.Pools = []config.PoolConfig{
		{Template: "saas", Mode: string(tenant.ModeDatabase), Size: database},
		{Template: "saas", Mode: string(tenant.ModeSchema), Size: schema},
	}
	d, err := e.startDaemonInProcess(ctx, fc, cfg)
	if err != nil {
		return err
	}
	var stored int
	if err := d.catalog.QueryRow(ctx, `SELECT count(*) FROM templates WHERE name = 'saas'`).Scan(&stored); err != nil {
		d.Stop()
		return err
	}
	if stored == 0 {
		if err := d.createTemplate(ctx, "saas", examples.Saas()); err != nil {
			d.Stop()
			return err
		}
	}
	e.logf("%s: building %d database and %d schema spares of saas", label, database, schema)
	start := time.Now()
	last := -1
	for {
		db, err1 := d.spares(ctx, "saas", tenant.ModeDatabase)
		sc, err2 := d.spares(ctx, "saas", tenant.ModeSchema)
		if err1 != nil || err2 != nil {
			d.Stop()
			return fmt.Errorf("count spares: %v %v", err1, err2)
		}
		if db >= database && sc >= schema {
			break
		}
		if n := db + sc; n/100 != last/100 {
			e.logf("%s: %d database + %d schema spares after %s", label, db, sc, time.Since(start).Round(time.Second))
			last = n
		}
		select {
		case <-ctx.Done():
			d.Stop()
			return ctx.Err()
		case <-time.After(2 * time.Second):
		}
	}
	if err := d.Stop(); err != nil {
		return err
	}
	c := benchConfig(fc, dir)
	d, err = e.startDaemonInProcess(ctx, fc, c)
	if err != nil {
		return err
	}
	defer d.Stop()
	e.logf("%s: claiming the spares through the API", label)
	// Schema claims one at a time: concurrent GRANT CONNECT on the one shared
	// database can fail with "tuple concurrently updated" (XX000). A create
	// may be built cold: this daemon has no pools, and shrinks them to 0 a
	// spare per pass while the claims run.
	var cold atomic.Int64
	claim := func(mode tenant.Mode, n, workers int) error {
		work := make(chan struct{})
		var wg sync.WaitGroup
		var mu sync.Mutex
		var firstErr error
		for range workers {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for range work {
					r, err := d.client.CreateTenant(ctx, provision.Request{Template: "saas", Mode: mode})
					if err == nil && r.Path != "pool" {
						cold.Add(1)
					}
					if err != nil {
						mu.Lock()
						firstErr = err
						mu.Unlock()
					}
				}
			}()
		}
		for range n {
			work <- struct{}{}
		}
		close(work)
		wg.Wait()
		return firstErr
	}
	if err := claim(tenant.ModeDatabase, database, 8); err != nil {
		return err
	}
	if err := claim(tenant.ModeSchema, schema, 1); err != nil {
		return err
	}
	e.logf("%s: %d tenants in %s (%d built cold)", label, database+schema, time.Since(start).Round(time.Second), cold.Load())
	return nil
}

// quietDown brings the fleet to the state of one that has been idle for a
// while: every tenant database vacuumed (provisioning rewrote catalog rows
// that autovacuum would otherwise be cleaning up during the windows), then
// until the primary's WAL stands still.
func (e *Env) quietDown(ctx context.Context, fc *fleet.Cluster, o IdleIOOptions) error {
	e.logf("idle-io: vacuuming every database, then waiting for the WAL to stand still")
	var dbs []string
	conn, err := pgx.Connect(ctx, fc.PrimaryDSN("postgres"))
	if err != nil {
		return err
	}
	rows, err := conn.Query(ctx, `SELECT datname FROM pg_database WHERE datallowconn ORDER BY datname`)
	if err == nil {
		dbs, err = pgx.CollectRows(rows, pgx.RowTo[string])
	}
	conn.Close(ctx)
	if err != nil {
		return err
	}
	work := make(chan string)
	errs := make(chan error, len(dbs))
	var wg sync.WaitGroup
	for range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for db := range work {
				errs <- execOn(ctx, fc.PrimaryDSN(db), `VACUUM (ANALYZE)`)
			}
		}()
	}
	for _, db := range dbs {
		work <- db
	}
	close(work)
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			return err
		}
	}
	if err := checkpointBoth(ctx, fc); err != nil {
		return err
	}
	// Autovacuum then visits every database once per autovacuum_naptime and
	// rewrites each relation cache init file the vacuum invalidated (no WAL,
	// but ~100 kB of writes per database): wait until the servers' writes
	// and the WAL stand still (at most 10 minutes).
	primary, _, err := postmasters(fc)
	if err != nil {
		return err
	}
	var lastLSN, lastW int64 = -1, -1
	still := 0
	begin := time.Now()
	for still < 3 && time.Since(begin) < 10*time.Minute {
		var lsn int64
		if err := queryRow(ctx, fc.PrimaryDSN("postgres"), `SELECT pg_wal_lsn_diff(pg_current_wal_insert_lsn(), '0/0')::bigint`, &lsn); err != nil {
			return err
		}
		w := treeSample(primary).write
		if lastLSN >= 0 && lsn-lastLSN < 16<<10 && w-lastW < 64<<10 {
			still++
		} else {
			still = 0
		}
		lastLSN, lastW = lsn, w
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(10 * time.Second):
		}
	}
	e.logf("idle-io: quiet after %s", time.Since(begin).Round(time.Second))
	return nil
}

// idleWindow runs a daemon with the collector off or on, lets it settle,
// and measures an idle window, ended by a checkpoint on both servers so that
// what the window dirtied is written inside it.
func (e *Env) idleWindow(ctx context.Context, fc *fleet.Cluster, dir string, o IdleIOOptions, on bool) (IdleWindow, error) {
	w := IdleWindow{Collector: on, CheckpointIncluded: true}
	if err := checkpointBoth(ctx, fc); err != nil {
		return w, err
	}
	d, err := e.startDaemonInProcess(ctx, fc, idleConfig(fc, dir, on))
	if err != nil {
		return w, err
	}
	defer d.Stop()
	e.logf("idle-io: collector %s: settling %s, then measuring %s idle", onOff(on), o.Settle, o.Window)
	select {
	case <-ctx.Done():
		return w, ctx.Err()
	case <-time.After(o.Settle):
	}
	if err := checkpointBoth(ctx, fc); err != nil {
		return w, err
	}
	primary, standby, err := postmasters(fc)
	if err != nil {
		return w, err
	}
	var lsn0, lsn1, rows0, rows1, rec0, rec1, fpi0, fpi1 int64
	walSQL := `SELECT pg_wal_lsn_diff(pg_current_wal_insert_lsn(), '0/0')::bigint, wal_records, wal_fpi FROM pg_stat_wal`
	if err := queryRow(ctx, fc.PrimaryDSN("postgres"), walSQL, &lsn0, &rec0, &fpi0); err != nil {
		return w, err
	}
	if err := d.catalog.QueryRow(ctx, `SELECT count(*) FROM tenant_metrics`).Scan(&rows0); err != nil {
		return w, err
	}
	p0, s0, self0 := treeSample(primary), treeSample(standby), selfSample()
	begin := time.Now()
	select {
	case <-ctx.Done():
		return w, ctx.Err()
	case <-time.After(o.Window):
	}
	if err := checkpointBoth(ctx, fc); err != nil {
		return w, err
	}
	p1, s1, self1 := treeSample(primary), treeSample(standby), selfSample()
	w.Seconds = time.Since(begin).Seconds()
	if err := queryRow(ctx, fc.PrimaryDSN("postgres"), walSQL, &lsn1, &rec1, &fpi1); err != nil {
		return w, err
	}
	if err := d.catalog.QueryRow(ctx, `SELECT count(*) FROM tenant_metrics`).Scan(&rows1); err != nil {
		return w, err
	}
	w.PrimaryWriteBytes, w.StandbyWriteBytes = p1.write-p0.write, s1.write-s0.write
	w.PGCPUSeconds = float64(p1.ticks-p0.ticks+s1.ticks-s0.ticks) / clockTicks
	w.SelfWriteBytes, w.SelfCPUSeconds = self1.write-self0.write, self1.cpu-self0.cpu
	w.WALBytes, w.HistoryRows = lsn1-lsn0, rows1-rows0
	w.WALRecords, w.WALFPI = rec1-rec0, fpi1-fpi0
	w.Windows = 1
	e.logf("idle-io: collector %s: PostgreSQL wrote %s/s (primary %s, standby %s), pgtenant %s and %.2f%% of a core",
		onOff(on), kb(int64(w.perSec(w.pgWrites()))), kb(w.PrimaryWriteBytes), kb(w.StandbyWriteBytes), kb(w.SelfWriteBytes), 100*w.SelfCPUSeconds/w.Seconds)
	return w, nil
}

func onOff(on bool) string {
	if on {
		return "on"
	}
	return "off"
}

// checkpointBoth flushes the primary's and the standby's dirty buffers (a
// restartpoint on the standby, after it has replayed the primary's WAL).
func checkpointBoth(ctx context.Context, fc *fleet.Cluster) error {
	if err := execOn(ctx, fc.PrimaryDSN("postgres"), `CHECKPOINT`); err != nil {
		return err
	}
	var lsn string
	if err := queryRow(ctx, fc.PrimaryDSN("postgres"), `SELECT pg_current_wal_lsn()::text`, &lsn); err != nil {
		return err
	}
	for _, s := range fc.Standbys() {
		for {
			var caught bool
			if err := queryRow(ctx, fc.DSN(s, "postgres"), `SELECT pg_last_wal_replay_lsn() >= `+cluster.Literal(lsn)+`::pg_lsn`, &caught); err != nil {
				return err
			}
			if caught {
				break
			}
			select {
			case <-ctx.Done():
				return ctx.Err()
			case <-time.After(100 * time.Millisecond):
			}
		}
		if err := execOn(ctx, fc.DSN(s, "postgres"), `CHECKPOINT`); err != nil {
			return err
		}
	}
	return nil
}

func execOn(ctx context.Context, dsn, sql string) error {
	p, err := smallPool(ctx, dsn)
	if err != nil {
		return err
	}
	defer p.Close()
	_, err = p.Exec(ctx, sql)
	return err
}

// clockTicks is USER_HZ, the unit of /proc/<pid>/stat times (100 on Linux).
const clockTicks = 100

type procSample struct {
	write int64 // bytes
	ticks int64 // utime + stime (+ reaped children's)
}

// postmasters returns the pids of the primary's and the first standby's postmaster.
func postmasters(fc *fleet.Cluster) (primary, standby int, err error) {
	read := func(node string) (int, error) {
		b, err := os.ReadFile(filepath.Join(fc.DataDir(node), "postmaster.pid"))
		if err != nil {
			return 0, err
		}
		return strconv.Atoi(strings.SplitN(string(b), "\n", 2)[0])
	}
	if primary, err = read("primary"); err != nil {
		return 0, 0, err
	}
	if sb := fc.Standbys(); len(sb) > 0 {
		if standby, err = read(sb[0].Name); err != nil {
			return 0, 0, err
		}
	}
	return primary, standby, nil
}

// treeSample sums write_bytes and CPU ticks over a postmaster and its
// children. A reaped child's I/O and CPU are added to its parent's, so a
// backend that exits during a window is counted once either way.
func treeSample(pid int) procSample {
	var s procSample
	if pid == 0 {
		return s
	}
	for _, p := range tree(pid) {
		s.write += ioWriteBytes(p)
		if st, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", p)); err == nil {
			// Fields after the command: state(0) ppid(1) … utime(11) stime(12) cutime(13) cstime(14).
			if f := statFields(string(st)); len(f) > 14 {
				for _, i := range []int{11, 12, 13, 14} {
					v, _ := strconv.ParseInt(f[i], 10, 64)
					s.ticks += v
				}
			}
		}
	}
	return s
}

// tree is a process and its children.
func tree(pid int) []int {
	entries, _ := os.ReadDir("/proc")
	pids := []int{pid}
	for _, e := range entries {
		child, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		if st, err := os.ReadFile("/proc/" + e.Name() + "/stat"); err == nil {
			if f := statFields(string(st)); len(f) > 2 && f[1] == strconv.Itoa(pid) {
				pids = append(pids, child)
			}
		}
	}
	return pids
}

// treeWriters is write_bytes of a postmaster's processes by what each is
// (writerName): which of them write while the fleet is idle.
func treeWriters(pid int) map[string]int64 {
	out := map[string]int64{}
	if pid == 0 {
		return out
	}
	for _, p := range tree(pid) {
		cmd, _ := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", p))
		out[writerName(string(cmd), p == pid)] += ioWriteBytes(p)
	}
	return out
}

// writerName is what a PostgreSQL process is, from its command line: its
// type ("checkpointer", "autovacuum worker") or a backend's user and
// database ("pgtenant pgt_shared_saas"), after the cluster_name that
// PostgreSQL puts first when it is set; the postmaster's own counter
// holds its children that exited.
func writerName(cmdline string, postmaster bool) string {
	if postmaster {
		return "postmaster (and the children that exited)"
	}
	rest, ok := strings.CutPrefix(strings.TrimRight(strings.ReplaceAll(cmdline, "\x00", " "), " "), "postgres: ")
	if !ok {
		return "other"
	}
	if i := strings.Index(rest, ": "); i >= 0 {
		rest = rest[i+2:] // "<cluster_name>: " first when cluster_name is set
	}
	f := strings.Fields(rest)
	if len(f) > 2 {
		f = f[:2]
	}
	return strings.Join(f, " ")
}

// total is what treeWriters counted over all processes.
func total(by map[string]int64) int64 {
	var n int64
	for _, b := range by {
		n += b
	}
	return n
}

// topWriters names the largest of the writes between two treeWriters
// samples, n at most: "autovacuum worker 1.2 MB, checkpointer 300 KB".
func topWriters(before, after map[string]int64, n int) string {
	type w struct {
		name  string
		bytes int64
	}
	var ws []w
	for name, b := range after {
		if d := b - before[name]; d > 0 {
			ws = append(ws, w{name, d})
		}
	}
	sort.Slice(ws, func(i, j int) bool {
		return ws[i].bytes > ws[j].bytes || ws[i].bytes == ws[j].bytes && ws[i].name < ws[j].name
	})
	var parts []string
	for _, x := range ws[:min(n, len(ws))] {
		parts = append(parts, x.name+" "+kb(x.bytes))
	}
	if len(parts) == 0 {
		return "nothing written"
	}
	return strings.Join(parts, ", ")
}

// statFields are the fields of /proc/<pid>/stat after "(comm)".
func statFields(stat string) []string {
	i := strings.LastIndexByte(stat, ')')
	if i < 0 {
		return nil
	}
	return strings.Fields(stat[i+1:])
}

// ioWriteBytes is what a process wrote that reaches storage: its
// write_bytes less its cancelled_write_bytes, the pages of files it
// truncated or deleted before they were written back, such as a query's
// temp files (0 when they cannot be read).
func ioWriteBytes(pid int) int64 {
	path := fmt.Sprintf("/proc/%d/io", pid)
	n, _ := procValue(path, "write_bytes:")
	cancelled, _ := procValue(path, "cancelled_write_bytes:")
	return n - cancelled
}

type selfStat struct {
	write int64
	cpu   float64 // seconds
}

func selfSample() selfStat {
	var ru syscall.Rusage
	_ = syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	tv := func(t syscall.Timeval) float64 { return float64(t.Sec) + float64(t.Usec)/1e6 }
	return selfStat{write: ioWriteBytes(os.Getpid()), cpu: tv(ru.Utime) + tv(ru.Stime)}
}

// simulateTenants adds n catalog rows of active database tenants whose
// databases do not exist: the catalog and the collector's memory see a
// fleet of that size; pg_stat_database and the size batches only find the
// real ones.
func simulateTenants(ctx context.Context, fc *fleet.Cluster, n int) error {
	p, err := smallPool(ctx, fc.PrimaryDSN("pgtenant"))
	if err != nil {
		return err
	}
	defer p.Close()
	ids := make([]string, n)
	dbs := make([]string, n)
	for i := range ids {
		ids[i] = tenant.NewID()
		dbs[i] = tenant.PhysicalName(ids[i])
	}
	_, err = p.Exec(ctx, `INSERT INTO tenants (id, mode, cluster, template, version, state, database)
		SELECT id, 'database', $3, 'saas', 1, 'active', db FROM unnest($1::text[], $2::text[]) AS u(id, db)`, ids, dbs, fc.Name())
	return err
}

// timePasses times a first collector pass over fc (a collector of its
// own, as the daemon builds it), then five more: st's pass figures; with
// steady, it goes on through a round of sizes (size_interval / interval
// passes in all) and times five more: st's Steady figures. The collector
// is returned with what it holds; done closes them.
func timePasses(ctx context.Context, fc *fleet.Cluster, cfg config.Config, st *ScaleTiming, steady bool) (col *metrics.Collector, done func(), err error) {
	store, err := catalog.Open(ctx, cfg.Catalog.DSN, nil)
	if err != nil {
		return nil, nil, err
	}
	reg := cluster.NewRegistry()
	done = func() { reg.Close(); store.Close() }
	var standbys []string
	for _, s := range fc.Standbys() {
		standbys = append(standbys, fc.DSN(s, "postgres"))
	}
	cl, err := cluster.New(fc.Name(), fc.PrimaryDSN("postgres"), standbys, nil)
	if err != nil {
		done()
		return nil, nil, err
	}
	reg.Put(cl)
	col = &metrics.Collector{Store: store, Clusters: reg, Metrics: cfg.Metrics, Tiers: cfg.Tiers}
	var passes, statistics, sizes []time.Duration
	for i := range 6 {
		begin := time.Now()
		if err := col.Pass(ctx, fc.Name()); err != nil {
			done()
			return nil, nil, err
		}
		if i == 0 {
			st.FirstPass = time.Since(begin)
			continue
		}
		passes = append(passes, time.Since(begin))
		ps := col.LastPass()[fc.Name()]
		st.Queries, st.SizesPerPass = ps.Queries, ps.Sizes
		statistics, sizes = append(statistics, ps.Statistics), append(sizes, ps.SizesTime)
	}
	st.Pass, st.PassMax = percentile(passes, 50), percentile(passes, 100)
	st.Statistics, st.Sizes = percentile(statistics, 50), percentile(sizes, 50)
	if !steady {
		return col, done, nil
	}
	// The rest of a round of sizes, then 5 passes more.
	round := int(cfg.Metrics.SizeInterval.D() / max(cfg.Metrics.Interval.D(), 1))
	passes, sizes = nil, nil
	for i := 6; i < round+5; i++ {
		begin := time.Now()
		if err := col.Pass(ctx, fc.Name()); err != nil {
			done()
			return nil, nil, err
		}
		if i >= round {
			ps := col.LastPass()[fc.Name()]
			passes, sizes = append(passes, time.Since(begin)), append(sizes, ps.SizesTime)
			st.SteadySizesCount = ps.Sizes
		}
	}
	st.SteadyPass, st.SteadySizes = percentile(passes, 50), percentile(sizes, 50)
	return col, done, nil
}

// scaleTiming times collector passes (a collector of its own, as the daemon
// builds it) and scrapes of a daemon's /metrics at the catalog's current size.
func (e *Env) scaleTiming(ctx context.Context, fc *fleet.Cluster, dir string, tenants, real int) (ScaleTiming, error) {
	st := ScaleTiming{Tenants: tenants, Real: real, SimulatedTenant: tenants > real}
	cfg := idleConfig(fc, dir, true)
	col, done, err := timePasses(ctx, fc, cfg, &st, false)
	if err != nil {
		return st, err
	}
	defer done()

	// Scrapes of a daemon's /metrics once its own collector has seen every tenant.
	d, err := e.startDaemonInProcess(ctx, fc, cfg)
	if err != nil {
		return st, err
	}
	defer d.Stop()
	url := d.client.BaseURL + "/metrics"
	deadline := time.Now().Add(2 * time.Minute)
	for {
		body, _, err := scrape(ctx, url)
		if err != nil {
			return st, err
		}
		if activeTenants(body) >= tenants {
			break
		}
		if time.Now().After(deadline) {
			return st, fmt.Errorf("the daemon's collector did not see %d tenants within 2 minutes", tenants)
		}
		time.Sleep(time.Second)
	}
	var scrapes []time.Duration
	for range 5 {
		body, took, err := scrape(ctx, url)
		if err != nil {
			return st, err
		}
		scrapes = append(scrapes, took)
		st.ScrapeBytes, st.ScrapeSeries = len(body), seriesCount(body)
	}
	st.Scrape, st.ScrapeMax = percentile(scrapes, 50), percentile(scrapes, 100)

	// The same figures without the guard (every tenant exported), for comparison.
	noGuard := prometheus.NewRegistry()
	noGuard.MustRegister(metrics.NewTenantCollector(col, 1<<30))
	srv := httptest.NewServer(promhttp.HandlerFor(noGuard, promhttp.HandlerOpts{}))
	defer srv.Close()
	scrapes = nil
	for range 5 {
		body, took, err := scrape(ctx, srv.URL)
		if err != nil {
			return st, err
		}
		scrapes = append(scrapes, took)
		st.NoGuardSeries = seriesCount(body)
	}
	st.NoGuard = percentile(scrapes, 50)
	e.logf("idle-io: %d tenants: pass %s (%d queries), scrape %s (%d series), without the guard %s (%d series)",
		tenants, st.Pass, st.Queries, st.Scrape, st.ScrapeSeries, st.NoGuard, st.NoGuardSeries)
	return st, nil
}

func scrape(ctx context.Context, url string) (string, time.Duration, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return "", 0, err
	}
	begin := time.Now()
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return "", 0, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	took := time.Since(begin)
	if err == nil && resp.StatusCode != http.StatusOK {
		err = fmt.Errorf("GET %s: %s", url, resp.Status)
	}
	return string(b), took, err
}

func seriesCount(body string) int {
	n := 0
	for _, l := range strings.Split(body, "\n") {
		if l != "" && !strings.HasPrefix(l, "#") {
			n++
		}
	}
	return n
}

// activeTenants sums pgtenant_tenants{state="active"} of a scrape.
func activeTenants(body string) int {
	n := 0
	for _, l := range strings.Split(body, "\n") {
		if strings.HasPrefix(l, "pgtenant_tenants{") && strings.Contains(l, `state="active"`) {
			f := strings.Fields(l)
			v, _ := strconv.ParseFloat(f[len(f)-1], 64)
			n += int(v)
		}
	}
	return n
}

func idleIOTable(r IdleIOResult) Table {
	o := r.Options
	t := Table{
		Title: fmt.Sprintf("bench idle-io: %d database + %d schema tenants of saas, idle; %d windows of %s each with the collector off and on, alternating; PostgreSQL %s, primary + 1 streaming standby",
			o.Tenants, o.Schemas, r.On.Windows, o.Window, r.Version),
		Columns: []string{"", "collector off", "collector on", "added by the collector"},
		Data:    map[string]any{"result": r},
	}
	rate := func(w IdleWindow, n int64) string { return kb(int64(w.perSec(n))) + "/s" }
	diffRate := func(a, b int64) string {
		return kb(int64(r.On.perSec(b)-r.Off.perSec(a))) + "/s"
	}
	pct := func(sec, wall float64) string { return fmt.Sprintf("%.2f%%", 100*sec/wall) }
	t.Rows = [][]string{
		{"PostgreSQL writes, primary", rate(r.Off, r.Off.PrimaryWriteBytes), rate(r.On, r.On.PrimaryWriteBytes), diffRate(r.Off.PrimaryWriteBytes, r.On.PrimaryWriteBytes)},
		{"PostgreSQL writes, standby", rate(r.Off, r.Off.StandbyWriteBytes), rate(r.On, r.On.StandbyWriteBytes), diffRate(r.Off.StandbyWriteBytes, r.On.StandbyWriteBytes)},
		{"pgtenant writes", rate(r.Off, r.Off.SelfWriteBytes), rate(r.On, r.On.SelfWriteBytes), diffRate(r.Off.SelfWriteBytes, r.On.SelfWriteBytes)},
		{"all writes", rate(r.Off, r.Off.totalWrites()), rate(r.On, r.On.totalWrites()), diffRate(r.Off.totalWrites(), r.On.totalWrites())},
		{"WAL, primary", rate(r.Off, r.Off.WALBytes), rate(r.On, r.On.WALBytes), diffRate(r.Off.WALBytes, r.On.WALBytes)},
		{"WAL records (full-page images)", fmt.Sprintf("%d (%d)", r.Off.WALRecords, r.Off.WALFPI), fmt.Sprintf("%d (%d)", r.On.WALRecords, r.On.WALFPI),
			fmt.Sprintf("%d (%d)", r.On.WALRecords-r.Off.WALRecords, r.On.WALFPI-r.Off.WALFPI)},
		{"history rows written", strconv.FormatInt(r.Off.HistoryRows, 10), strconv.FormatInt(r.On.HistoryRows, 10), strconv.FormatInt(r.On.HistoryRows-r.Off.HistoryRows, 10)},
		{"pgtenant CPU (one core)", pct(r.Off.SelfCPUSeconds, r.Off.Seconds), pct(r.On.SelfCPUSeconds, r.On.Seconds),
			fmt.Sprintf("%.2f%%", 100*(r.On.SelfCPUSeconds/r.On.Seconds-r.Off.SelfCPUSeconds/r.Off.Seconds))},
		{"PostgreSQL CPU (one core)", pct(r.Off.PGCPUSeconds, r.Off.Seconds), pct(r.On.PGCPUSeconds, r.On.Seconds),
			fmt.Sprintf("%.2f%%", 100*(r.On.PGCPUSeconds/r.On.Seconds-r.Off.PGCPUSeconds/r.Off.Seconds))},
	}
	sort.Slice(r.Scale, func(i, j int) bool { return r.Scale[i].Tenants < r.Scale[j].Tenants })
	head := []string{"", "", "", ""}
	for i, s := range r.Scale {
		label := fmt.Sprintf("%d tenants", s.Tenants)
		if s.SimulatedTenant {
			label = fmt.Sprintf("%d tenants (%d simulated)", s.Tenants, s.Tenants-s.Real)
		}
		head[i+1] = label
	}
	t.Rows = append(t.Rows, []string{"", "", "", ""}, head)
	row := func(name string, f func(ScaleTiming) string) {
		cells := []string{name, "", "", ""}
		for i, s := range r.Scale {
			cells[i+1] = f(s)
		}
		t.Rows = append(t.Rows, cells)
	}
	row("collector pass, p50 (max)", func(s ScaleTiming) string { return fmt.Sprintf("%s (%s)", ms(s.Pass), ms(s.PassMax)) })
	row("first pass (sizes seed, file count)", func(s ScaleTiming) string { return ms(s.FirstPass) })
	row("queries per pass", func(s ScaleTiming) string { return strconv.Itoa(s.Queries) })
	row("sizes sampled per pass", func(s ScaleTiming) string { return strconv.Itoa(s.SizesPerPass) })
	row("/metrics scrape, p50 (max)", func(s ScaleTiming) string { return fmt.Sprintf("%s (%s)", ms(s.Scrape), ms(s.ScrapeMax)) })
	row("  series, bytes", func(s ScaleTiming) string { return fmt.Sprintf("%d, %s", s.ScrapeSeries, kb(int64(s.ScrapeBytes))) })
	row("  without the guard, p50 (series)", func(s ScaleTiming) string { return fmt.Sprintf("%s (%d)", ms(s.NoGuard), s.NoGuardSeries) })

	added := r.On.perSec(r.On.totalWrites()) - r.Off.perSec(r.Off.totalWrites())
	cpu := 100 * (r.On.SelfCPUSeconds/r.On.Seconds - r.Off.SelfCPUSeconds/r.Off.Seconds)
	t.Checks = append(t.Checks,
		Check{Target: fmt.Sprintf("collector adds <= 50 KB/s of writes at %d idle tenants", o.Tenants+o.Schemas),
			Got: kb(int64(added)) + "/s", Met: added <= 50<<10},
		Check{Target: "collector adds <= 2% of one core (pgtenant's CPU)", Got: fmt.Sprintf("%.2f%%", cpu), Met: cpu <= 2})
	if n := len(r.Scale); n > 0 {
		s := r.Scale[n-1]
		t.Checks = append(t.Checks, Check{Target: fmt.Sprintf("/metrics scrape <= 200 ms at %d tenants", s.Tenants),
			Got: ms(s.ScrapeMax) + " (slowest of 5)", Met: s.ScrapeMax <= 200*time.Millisecond})
	}
	t.Notes = append(t.Notes,
		"writes: /proc/<pid>/io write_bytes summed over each postmaster and its children (reaped children count in their parent), each window ended by a CHECKPOINT on the primary and a restartpoint on the standby so that what it dirtied is written within it",
		"pgtenant runs in this process: its writes are /proc/self/io and its CPU getrusage(RUSAGE_SELF); its catalog is on the measured primary, so history rows count in PostgreSQL's writes",
		"collector on = metrics.interval 15s, size_interval 10m, top_tenants 100, plus a statement_cap (checked every 1s) and a storage quota on the default tier; hot-set capture and the restart watcher are off in both windows",
		"before the windows every database was vacuumed (provisioning leaves catalog rows for autovacuum), then the bench waited until the primary wrote < 64 kB and < 16 kB of WAL per 10 s, three times in a row (autovacuum's first visit after a vacuum rewrites each database's relation cache init file)",
		"the larger scale point adds catalog rows of active database tenants without databases: the catalog query, the collector's memory and /metrics grow to that size, the statistics and size queries only find the real tenants",
		"servers run with fsync=off (bench fleets are throwaway); write_bytes counts bytes handed to the OS, which fsync does not change")
	return t
}
