package bench

// Measuring what a method costs a fleet (Meter, Cost), and running pgtenant
// in-process against a bench fleet (benchDaemon). Both are meant to be
// reused by every benchmark that compares alternatives on one fleet.

import (
	"bufio"
	"bytes"
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgtenant/pgtenant/internal/api"
	"github.com/pgtenant/pgtenant/internal/catalog"
	"github.com/pgtenant/pgtenant/internal/config"
	"github.com/pgtenant/pgtenant/internal/daemon"
	"github.com/pgtenant/pgtenant/internal/fleet"
	"github.com/pgtenant/pgtenant/internal/jobs"
	"github.com/pgtenant/pgtenant/internal/pooler"
	"github.com/pgtenant/pgtenant/internal/templates"
	"github.com/pgtenant/pgtenant/internal/tenant"
)

// Cost is what one method cost the primary and its standby, from Start to Stop.
type Cost struct {
	Duration time.Duration `json:"duration_ns"`
	StartLSN string        `json:"start_lsn"`
	EndLSN   string        `json:"end_lsn"`
	// WALBytes is pg_wal_lsn_diff of pg_current_wal_insert_lsn() at Stop and Start.
	WALBytes int64 `json:"wal_bytes"`
	// WALRecords and LargestRecord come from pg_waldump over [StartLSN, EndLSN).
	WALRecords    int64     `json:"wal_records"`
	LargestRecord WALRecord `json:"largest_wal_record"`
	FPIBytes      int64     `json:"fpi_bytes"` // of WALBytes, full-page images (first change of a page after a checkpoint)
	WALDumpError  string    `json:"waldump_error,omitempty"`
	// Checkpoints is the change of pg_stat_bgwriter.checkpoints_req: forced
	// ones (CREATE DATABASE … FILE_COPY, DROP DATABASE) and those max_wal_size
	// triggers; TimedCheckpoints are checkpoint_timeout's.
	Checkpoints      int64 `json:"checkpoints_requested"`
	TimedCheckpoints int64 `json:"checkpoints_timed"`
	// PeakLagBytes is the largest primary pg_current_wal_lsn() minus standby
	// pg_last_wal_replay_lsn() seen by the sampler.
	PeakLagBytes     int64 `json:"peak_replay_lag_bytes"`
	PeakLocks        int64 `json:"peak_locks"`         // rows of pg_locks on the primary
	PeakStandbyLocks int64 `json:"peak_standby_locks"` // rows of pg_locks on the standby (its startup process replays AccessExclusiveLocks)
	Samples          int   `json:"samples"`
	// StandbyErrors counts samples that could not reach the standby (down or restarting).
	StandbyErrors int    `json:"standby_errors,omitempty"`
	StandbyError  string `json:"standby_error,omitempty"`
	// CatchUp is the time from Stop until the standby had replayed EndLSN.
	CatchUp  time.Duration `json:"standby_catch_up_ns"`
	CaughtUp bool          `json:"standby_caught_up"`
}

// WALRecord is one record as pg_waldump prints it.
type WALRecord struct {
	Rmgr  string `json:"rmgr"`
	Desc  string `json:"desc"` // the first word of the description (COMMIT, FPI, …)
	LSN   string `json:"lsn"`
	Rec   int64  `json:"rec_len"`
	Total int64  `json:"total_len"`              // with block images: what the standby reads
	DB    uint32 `json:"database_oid,omitempty"` // of its first block (0: none, or a shared catalog's)
}

func (r WALRecord) String() string {
	if r.Total == 0 {
		return "-"
	}
	return fmt.Sprintf("%s (%s %s)", kb(r.Total), r.Rmgr, r.Desc)
}

// Meter measures methods on a fleet's primary and first standby.
type Meter struct {
	fc       *fleet.Cluster
	primary  *pgxpool.Pool
	standby  *pgxpool.Pool // nil without standbys
	Interval time.Duration // sampling period of replay lag and locks
	// CatchUpTimeout bounds how long Stop waits for the standby.
	CatchUpTimeout time.Duration
}

// newMeter connects to the fleet's primary and first standby.
func newMeter(ctx context.Context, fc *fleet.Cluster) (*Meter, error) {
	m := &Meter{fc: fc, Interval: 25 * time.Millisecond, CatchUpTimeout: 15 * time.Minute}
	var err error
	if m.primary, err = smallPool(ctx, fc.PrimaryDSN("postgres")); err != nil {
		return nil, fmt.Errorf("meter: primary: %w", err)
	}
	if sb := fc.Standbys(); len(sb) > 0 {
		if m.standby, err = smallPool(ctx, fc.DSN(sb[0], "postgres")); err != nil {
			m.primary.Close()
			return nil, fmt.Errorf("meter: standby: %w", err)
		}
	}
	return m, nil
}

func smallPool(ctx context.Context, dsn string) (*pgxpool.Pool, error) {
	cfg, err := pgxpool.ParseConfig(dsn)
	if err != nil {
		return nil, err
	}
	cfg.MaxConns = 3
	cfg.ConnConfig.RuntimeParams["application_name"] = "pgtenant-bench-meter"
	return pgxpool.NewWithConfig(ctx, cfg)
}

// Close releases the meter's connections.
func (m *Meter) Close() {
	m.primary.Close()
	if m.standby != nil {
		m.standby.Close()
	}
}

// Measurement is a method being measured.
type Measurement struct {
	m        *Meter
	start    time.Time
	startLSN int64
	ckptReq  int64
	ckptTime int64
	stop     context.CancelFunc
	done     chan struct{}

	mu    sync.Mutex
	peaks Cost // PeakLagBytes, PeakLocks, PeakStandbyLocks, Samples, StandbyErrors
}

// Start reads the WAL position and checkpoint counters and starts sampling
// replay lag and locks.
func (m *Meter) Start(ctx context.Context) (*Measurement, error) {
	x := &Measurement{m: m, done: make(chan struct{})}
	if err := m.primary.QueryRow(ctx, `SELECT pg_wal_lsn_diff(pg_current_wal_insert_lsn(), '0/0')::bigint,
		checkpoints_req, checkpoints_timed FROM pg_stat_bgwriter`).Scan(&x.startLSN, &x.ckptReq, &x.ckptTime); err != nil {
		return nil, fmt.Errorf("meter start: %w", err)
	}
	x.start = time.Now()
	sctx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	x.stop = cancel
	go x.sample(sctx)
	return x, nil
}

// sample polls the primary and the standby until stopped.
func (x *Measurement) sample(ctx context.Context) {
	defer close(x.done)
	t := time.NewTicker(x.m.Interval)
	defer t.Stop()
	for {
		x.sampleOnce(ctx)
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

func (x *Measurement) sampleOnce(ctx context.Context) {
	qctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	var lsn, locks int64
	if err := x.m.primary.QueryRow(qctx, `SELECT pg_wal_lsn_diff(pg_current_wal_lsn(), '0/0')::bigint,
		(SELECT count(*) FROM pg_locks)`).Scan(&lsn, &locks); err != nil {
		return // the primary is busy or the method ended: the next sample tells
	}
	var replay, sbLocks int64
	var sbErr error
	if x.m.standby != nil {
		sbErr = x.m.standby.QueryRow(qctx, `SELECT coalesce(pg_wal_lsn_diff(pg_last_wal_replay_lsn(), '0/0'), 0)::bigint,
			(SELECT count(*) FROM pg_locks)`).Scan(&replay, &sbLocks)
	}
	x.mu.Lock()
	defer x.mu.Unlock()
	p := &x.peaks
	p.Samples++
	p.PeakLocks = max(p.PeakLocks, locks)
	switch {
	case x.m.standby == nil:
	case sbErr != nil && ctx.Err() == nil:
		p.StandbyErrors++
		p.StandbyError = sbErr.Error()
	case sbErr == nil:
		p.PeakLagBytes = max(p.PeakLagBytes, lsn-replay)
		p.PeakStandbyLocks = max(p.PeakStandbyLocks, sbLocks)
	}
}

// Stop ends the method: it stops sampling, reads the end of its WAL and the
// checkpoint counters, waits until the standby has replayed that WAL, then
// reads the WAL range with pg_waldump for its largest record.
func (x *Measurement) Stop(ctx context.Context) (Cost, error) {
	end := time.Now()
	x.stop()
	<-x.done
	x.mu.Lock()
	c := x.peaks
	x.mu.Unlock()
	c.Duration = end.Sub(x.start)
	m := x.m
	var endLSN int64
	if err := m.primary.QueryRow(ctx, `SELECT pg_wal_lsn_diff(pg_current_wal_insert_lsn(), '0/0')::bigint`).Scan(&endLSN); err != nil {
		return c, fmt.Errorf("meter stop: %w", err)
	}
	c.StartLSN, c.EndLSN, c.WALBytes = formatLSN(x.startLSN), formatLSN(endLSN), endLSN-x.startLSN
	if m.standby != nil {
		c.CaughtUp, c.CatchUp = m.waitReplay(ctx, endLSN)
	}
	var req, timed int64
	if err := m.primary.QueryRow(ctx, `SELECT checkpoints_req, checkpoints_timed FROM pg_stat_bgwriter`).Scan(&req, &timed); err != nil {
		return c, fmt.Errorf("meter stop: %w", err)
	}
	c.Checkpoints, c.TimedCheckpoints = req-x.ckptReq, timed-x.ckptTime
	if err := m.flushedTo(ctx, endLSN); err != nil {
		return c, err
	}
	walDir := filepath.Join(m.fc.DataDir(m.fc.Primary().Name), "pg_wal")
	sum, err := readWAL(ctx, m.fc.Binaries().Path("pg_waldump"), walDir, c.StartLSN, c.EndLSN)
	c.LargestRecord, c.WALRecords, c.FPIBytes = sum.Largest, sum.Records, sum.FPIBytes
	if err != nil {
		c.WALDumpError = err.Error()
	}
	return c, nil
}

// Settle brings the fleet to a quiet state before a method: VACUUM in each
// of databases (the shared catalogs included), so that no method pays the
// full-page images of hint bits on rows the previous one wrote (data
// checksums are on); a CHECKPOINT, so that none pays the previous one's
// dirty buffers or runs under its checkpoint; then the standby catches up
// and makes a restartpoint.
func (m *Meter) Settle(ctx context.Context, databases ...string) error {
	for _, db := range databases {
		conn, err := pgx.Connect(ctx, m.fc.PrimaryDSN(db))
		if err != nil {
			return fmt.Errorf("settle: %w", err)
		}
		_, err = conn.Exec(ctx, "VACUUM")
		conn.Close(ctx)
		if err != nil {
			return fmt.Errorf("settle: vacuum %s: %w", db, err)
		}
	}
	var lsn int64
	if _, err := m.primary.Exec(ctx, "CHECKPOINT"); err != nil {
		return fmt.Errorf("settle: %w", err)
	}
	if err := m.primary.QueryRow(ctx, `SELECT pg_wal_lsn_diff(pg_current_wal_insert_lsn(), '0/0')::bigint`).Scan(&lsn); err != nil {
		return fmt.Errorf("settle: %w", err)
	}
	if m.standby != nil {
		if ok, waited := m.waitReplay(ctx, lsn); !ok {
			return fmt.Errorf("settle: the standby did not catch up within %s", waited.Round(time.Second))
		}
		// CHECKPOINT on a standby is a restartpoint: its writes and fsyncs
		// (the same disk as the primary's here) are done before the method.
		if _, err := m.standby.Exec(ctx, "CHECKPOINT"); err != nil {
			return fmt.Errorf("settle: standby restartpoint: %w", err)
		}
	}
	return nil
}

// waitReplay polls the standby until it has replayed lsn. A position a page
// header short of lsn counts: the insert position may point past the header
// of a page that no record has reached yet.
func (m *Meter) waitReplay(ctx context.Context, lsn int64) (bool, time.Duration) {
	start := time.Now()
	deadline := start.Add(m.CatchUpTimeout)
	for time.Now().Before(deadline) && ctx.Err() == nil {
		var replay int64
		err := m.standby.QueryRow(ctx, `SELECT coalesce(pg_wal_lsn_diff(pg_last_wal_replay_lsn(), '0/0'), 0)::bigint`).Scan(&replay)
		if err == nil && replay >= lsn-40 {
			return true, time.Since(start)
		}
		time.Sleep(10 * time.Millisecond)
	}
	return false, time.Since(start)
}

// flushedTo waits until the primary has flushed WAL up to lsn (the walwriter
// does within wal_writer_delay), so that pg_waldump can read all of it.
func (m *Meter) flushedTo(ctx context.Context, lsn int64) error {
	for i := 0; ; i++ {
		var flushed int64
		if err := m.primary.QueryRow(ctx, `SELECT pg_wal_lsn_diff(pg_current_wal_flush_lsn(), '0/0')::bigint`).Scan(&flushed); err != nil {
			return err
		}
		if flushed >= lsn-40 || i >= 200 {
			return nil
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func formatLSN(n int64) string { return fmt.Sprintf("%X/%X", uint64(n)>>32, uint32(n)) }

// walSummary is what readWAL finds in a range of WAL.
type walSummary struct {
	Largest  WALRecord // by total length
	Records  int64
	FPIBytes int64 // sum of total minus record length: the full-page images
	// Bytes (total length) by kind of record and by the database of a
	// record's first block (0: records of no database).
	Kinds     map[walKind]int64
	Databases map[uint32]int64
}

// walKind is a kind of WAL record: its resource manager and description.
type walKind struct{ Rmgr, Desc string }

// top names the n kinds of record and the n databases that wrote most of
// the range, with their shares: "Heap/INSERT 41%, XLOG/FPI_FOR_HINT 30%;
// pgtenant 80%, (none) 20%". names maps database OIDs to names.
func (s walSummary) top(n int, names map[uint32]string) string {
	var total int64
	for _, b := range s.Kinds {
		total += b
	}
	if total == 0 {
		return "-"
	}
	shares := func(m map[string]int64) string {
		keys := slices.Collect(maps.Keys(m))
		slices.SortFunc(keys, func(a, b string) int { return cmp.Or(cmp.Compare(m[b], m[a]), cmp.Compare(a, b)) })
		var parts []string
		for _, k := range keys[:min(n, len(keys))] {
			parts = append(parts, fmt.Sprintf("%s %.0f%%", k, 100*float64(m[k])/float64(total)))
		}
		return strings.Join(parts, ", ")
	}
	kinds := map[string]int64{}
	for k, b := range s.Kinds {
		kinds[k.Rmgr+"/"+k.Desc] = b
	}
	dbs := map[string]int64{}
	for oid, b := range s.Databases {
		name := names[oid]
		switch {
		case oid == 0:
			name = "(none)"
		case name == "":
			name = strconv.FormatUint(uint64(oid), 10)
		}
		dbs[name] += b
	}
	return shares(kinds) + "; " + shares(dbs)
}

// readWAL runs pg_waldump over [start, end) of walDir and summarises the
// records. pg_waldump ending with an error after it read records (the end
// of the WAL written so far) is reported with what it read.
func readWAL(ctx context.Context, pgWaldump, walDir, start, end string) (walSummary, error) {
	cmd := exec.CommandContext(ctx, pgWaldump, "-p", walDir, "-s", start, "-e", end)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.StdoutPipe()
	if err != nil {
		return walSummary{}, err
	}
	if err := cmd.Start(); err != nil {
		return walSummary{}, fmt.Errorf("pg_waldump: %w", err)
	}
	sum, perr := scanWALDump(out)
	if perr != nil {
		_, _ = io.Copy(io.Discard, out)
	}
	werr := cmd.Wait()
	switch {
	case perr != nil:
		return sum, perr
	case werr != nil && sum.Records == 0:
		return sum, fmt.Errorf("pg_waldump %s..%s: %v: %s", start, end, werr, strings.TrimSpace(stderr.String()))
	case werr != nil:
		return sum, fmt.Errorf("pg_waldump stopped after %d records: %s", sum.Records, strings.TrimSpace(stderr.String()))
	}
	return sum, nil
}

// scanWALDump reads pg_waldump's output: one record a line. Lines of big
// commit records run to megabytes; only their start is read.
func scanWALDump(r io.Reader) (walSummary, error) {
	br := bufio.NewReaderSize(r, 64<<10)
	var sum walSummary
	for {
		line, isPrefix, err := br.ReadLine()
		if len(line) > 0 {
			if rec, ok := parseWALDumpLine(string(line)); ok {
				sum.Records++
				sum.FPIBytes += rec.Total - rec.Rec
				if sum.Kinds == nil {
					sum.Kinds, sum.Databases = map[walKind]int64{}, map[uint32]int64{}
				}
				sum.Kinds[walKind{rec.Rmgr, rec.Desc}] += rec.Total
				sum.Databases[rec.DB] += rec.Total
				if rec.Total > sum.Largest.Total {
					sum.Largest = rec
				}
			}
		}
		for isPrefix && err == nil { // skip the rest of a long line
			_, isPrefix, err = br.ReadLine()
		}
		if errors.Is(err, io.EOF) {
			return sum, nil
		}
		if err != nil {
			return sum, err
		}
	}
}

// blockRef is a record's first block reference: rel tablespace/database/relfilenode.
var blockRef = regexp.MustCompile(`blkref #0: rel \d+/(\d+)/\d+`)

var walDumpLine = regexp.MustCompile(`^rmgr: (\S+)\s+len \(rec/tot\):\s*(\d+)/\s*(\d+), tx:\s*\d+, lsn: ([0-9A-Fa-f]+/[0-9A-Fa-f]+), prev [0-9A-Fa-f]+/[0-9A-Fa-f]+, desc: (\S*)`)

// parseWALDumpLine parses a line such as
//
//	rmgr: Transaction len (rec/tot):    805/   805, tx:        735, lsn: 0/01A2B3C8, prev 0/01A2B390, desc: COMMIT 2024-…
func parseWALDumpLine(line string) (WALRecord, bool) {
	m := walDumpLine.FindStringSubmatch(line)
	if m == nil {
		return WALRecord{}, false
	}
	rec, err1 := strconv.ParseInt(m[2], 10, 64)
	tot, err2 := strconv.ParseInt(m[3], 10, 64)
	if err1 != nil || err2 != nil {
		return WALRecord{}, false
	}
	r := WALRecord{Rmgr: m[1], Rec: rec, Total: tot, LSN: m[4], Desc: strings.TrimRight(m[5], ";,")}
	if b := blockRef.FindStringSubmatch(line); b != nil {
		db, _ := strconv.ParseUint(b[1], 10, 32)
		r.DB = uint32(db)
	}
	return r, true
}

// latencyStats returns p50, p95 and calls per second over the method's wall time.
func latencyStats(lat []time.Duration, wall time.Duration) (p50, p95 time.Duration, perSec float64) {
	if len(lat) == 0 {
		return 0, 0, 0
	}
	if wall > 0 {
		perSec = float64(len(lat)) / wall.Seconds()
	}
	return percentile(lat, 50), percentile(lat, 95), perSec
}

// benchDaemon is a pgtenant daemon running in this process against a bench
// fleet (as internal/daemon/daemontest does for tests), with its catalog in
// the database "pgtenant" of the fleet's primary.
type benchDaemon struct {
	client  *api.Client
	catalog *pgxpool.Pool // the bench's own connection to the catalog
	cancel  context.CancelFunc
	done    chan error
	d       *daemon.Daemon
}

// benchConfig is the daemon configuration benchmarks start from: no pools
// (every pool size 0 unless a benchmark lists it), no reconciler, and cold
// creates that wait for their build however long it takes.
func benchConfig(fc *fleet.Cluster, dir string) config.Config {
	cfg := config.Default()
	cfg.Listen = "127.0.0.1:0"
	cfg.Catalog.DSN = fc.PrimaryDSN("pgtenant")
	cfg.TokenFile = filepath.Join(dir, "token")
	cfg.Provision.DefaultPoolSize = 0
	cfg.Provision.ColdWait = config.Duration(30 * time.Minute)
	// The daemon's background work that no bench row measures is off: the
	// reconciler, the metrics collector (bench idle-io turns it on) and the
	// prewarm watcher (bench prewarm turns it on). Their first passes after a
	// daemon starts (sizes of every new tenant, a hot-set capture) would
	// otherwise run under whatever is measured next.
	cfg.Reconcile.Interval = 0
	cfg.Metrics.Interval = 0
	cfg.Prewarm.CaptureInterval = 0
	cfg.Prewarm.WatchInterval = 0
	// Benches create more tenants than one cluster admits at the default
	// tier's connection limit; admission is not what they measure.
	cfg.Provision.ConnectionOvercommit = 0
	return cfg
}

// daemonDir makes the work dir e.Dir/name of a bench's daemon; remove
// deletes it unless Keep.
func (e *Env) daemonDir(name string) (dir string, remove func(), err error) {
	dir = filepath.Join(e.Dir, name)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return "", nil, err
	}
	return dir, func() {
		if !e.Keep {
			os.RemoveAll(dir)
		}
	}, nil
}

// benchPooler is the pooler block of a bench's cluster: its files in dir,
// a free loopback port, stopped with the daemon.
func benchPooler(dir string) (config.PoolerConfig, error) {
	port, err := pooler.LocalPort(dir)
	if err != nil {
		return config.PoolerConfig{}, err
	}
	pc := config.DefaultPooler()
	pc.Listen, pc.Dir = "127.0.0.1:"+strconv.Itoa(port), dir
	keep := false
	pc.KeepRunning = &keep
	return pc, nil
}

// startDaemonInProcess runs a daemon with cfg on fc until Stop.
func (e *Env) startDaemonInProcess(ctx context.Context, fc *fleet.Cluster, cfg config.Config, opts ...func(*daemon.Options)) (*benchDaemon, error) {
	managed := catalog.Cluster{Name: fc.Name(), DSN: fc.PrimaryDSN("postgres")}
	for _, s := range fc.Standbys() {
		managed.StandbyDSNs = append(managed.StandbyDSNs, fc.DSN(s, "postgres"))
	}
	dctx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	o := daemon.Options{Config: cfg, Managed: []catalog.Cluster{managed}, Logger: e.Logger}
	for _, f := range opts {
		f(&o)
	}
	d, err := daemon.New(dctx, o)
	if err != nil {
		cancel()
		return nil, fmt.Errorf("start pgtenant: %w", err)
	}
	cat, err := smallPool(ctx, cfg.Catalog.DSN)
	if err != nil {
		cancel()
		d.Close()
		return nil, err
	}
	bd := &benchDaemon{client: api.NewClient(d.Addr(), d.Token()), catalog: cat, cancel: cancel, done: make(chan error, 1), d: d}
	// A cold create answers when its build is done (up to cold_wait): a big
	// template's copy can wait minutes for a running checkpoint (the pacer).
	bd.client.HTTP.Timeout = cfg.Provision.ColdWait.D() + 5*time.Minute
	go func() { bd.done <- d.Run(dctx) }()
	return bd, nil
}

// Stop stops the daemon and waits until it has.
func (d *benchDaemon) Stop() error {
	d.cancel()
	err := <-d.done
	d.catalog.Close()
	return err
}

// createTemplate stores a template through the API and waits for its builds.
func (d *benchDaemon) createTemplate(ctx context.Context, name string, files []templates.Upload) error {
	added, err := d.client.CreateTemplate(ctx, name, files)
	if err != nil {
		return fmt.Errorf("create template %s: %w", name, err)
	}
	for _, j := range added.BuildJobs {
		j, err := d.client.WaitJob(ctx, j.ID, nil)
		if err != nil {
			return fmt.Errorf("template %s build: %w", name, err)
		}
		if j.State != jobs.Succeeded {
			return fmt.Errorf("template %s build job %d: %s: %s", name, j.ID, j.State, j.LastError)
		}
	}
	return nil
}

// waitJob polls a job every 20 ms until it is finished (finer than the
// client's WaitJob, so that timings are not rounded to its 200 ms).
func (d *benchDaemon) waitJob(ctx context.Context, id int64) (jobs.Job, error) {
	for {
		j, err := d.client.Job(ctx, id)
		if err != nil {
			return j, err
		}
		if jobs.Finished(j.State) || j.State == jobs.Paused {
			return j, nil
		}
		select {
		case <-ctx.Done():
			return j, ctx.Err()
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// waitIdle waits until the catalog has no job queued or running.
func (d *benchDaemon) waitIdle(ctx context.Context) error {
	for {
		var active int
		if err := d.catalog.QueryRow(ctx, `SELECT count(*) FROM jobs WHERE state IN ('queued', 'running', 'waiting')`).Scan(&active); err != nil {
			return err
		}
		if active == 0 {
			return nil
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// spares counts the ready spares of a pool.
func (d *benchDaemon) spares(ctx context.Context, template string, mode tenant.Mode) (int, error) {
	var n int
	err := d.catalog.QueryRow(ctx, `SELECT count(*) FROM tenants WHERE template = $1 AND mode = $2 AND state = 'spare'`, template, mode).Scan(&n)
	return n, err
}
