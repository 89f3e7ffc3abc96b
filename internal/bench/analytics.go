package bench

import (
	"context"
	"database/sql"
	"fmt"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5"

	"github.com/pgtenant/pgtenant/internal/analytics"
	"github.com/pgtenant/pgtenant/internal/cluster"
	"github.com/pgtenant/pgtenant/internal/config"
	"github.com/pgtenant/pgtenant/internal/fleet"
	"github.com/pgtenant/pgtenant/internal/provision"
	"github.com/pgtenant/pgtenant/internal/templates"
	"github.com/pgtenant/pgtenant/internal/tenant"
)

// AnalyticsOptions size bench analytics.
type AnalyticsOptions struct {
	Rows     int           // rows of the source document's table
	Clients  []int         // pgbench clients of the upsert runs
	Duration time.Duration // of each pgbench run
	Repeat   int           // runs of each query; the fastest counts
}

// AnalyticsQuery is one query on the heap and on the mirror.
type AnalyticsQuery struct {
	Name   string        `json:"name"`
	SQL    string        `json:"sql"`
	Heap   time.Duration `json:"heap"`
	Mirror time.Duration `json:"mirror"`
	// MirrorDirect is the query on the mirror's DuckDB in the daemon,
	// without the analytics port (what the wire protocol adds is the
	// difference); Rows is what it returns.
	MirrorDirect time.Duration `json:"mirror_direct"`
	Rows         int           `json:"rows"`
}

// AnalyticsUpsert is one upsert run.
type AnalyticsUpsert struct {
	Clients int  `json:"clients"`
	Mirror  bool `json:"mirror"`
	// After: a mirror-off run after the mirror was disabled (the runs
	// before and after it bracket the mirror-on ones: the table and the
	// machine's load change meanwhile).
	After bool `json:"after,omitempty"`
	// DecodingOnly: mirror off, but pg_recvlogical streams a pgoutput
	// slot of the table to /dev/null, so the primary pays logical
	// decoding and nothing else: the ceiling of any mirror's "on" on
	// these cores. WalsenderCPU is the decoding's CPU, ReceiverCPU
	// pg_recvlogical's (receiving the stream and nothing else: a floor
	// under any mirror's CPU on this machine), Changes the upserts it
	// decoded.
	DecodingOnly bool          `json:"decoding_only,omitempty"`
	TPS          float64       `json:"tps"`
	MinWindow    float64       `json:"min_window_tps"` // the slowest 1 s window
	ZeroWindows  int           `json:"zero_windows"`
	LagP50       time.Duration `json:"lag_p50,omitempty"`
	LagP99       time.Duration `json:"lag_p99,omitempty"`
	LagMax       time.Duration `json:"lag_max,omitempty"`
	// PendingP99 is the WAL the daemon had received and not yet applied
	// (p99 of the same samples): small while the lag is large, the delay
	// is in the walsender's decoding, not in the apply.
	PendingP99 int64         `json:"pending_bytes_p99,omitempty"`
	CatchUp    time.Duration `json:"catch_up,omitempty"` // after pgbench ended, until the mirror held the primary's LSN
	// Changes applied to the mirror from pgbench's start until caught up,
	// and the CPU spent meanwhile by the daemon (its apply, in this
	// process) and by the walsender that decodes the slot.
	Changes   int64         `json:"changes,omitempty"`
	DaemonCPU time.Duration `json:"daemon_cpu,omitempty"`
	// CheckpointCPU: the part of DaemonCPU the checkpoint after the run
	// took. DaemonIdleCPU: the part the daemon's other loops would have
	// taken over the same span (their rate over two seconds before the
	// mirror was enabled).
	CheckpointCPU time.Duration `json:"checkpoint_cpu,omitempty"`
	DaemonIdleCPU time.Duration `json:"daemon_idle_cpu,omitempty"`
	WalsenderCPU  time.Duration `json:"walsender_cpu,omitempty"`
	ReceiverCPU   time.Duration `json:"receiver_cpu,omitempty"`
}

// AnalyticsResult is what bench analytics measured.
type AnalyticsResult struct {
	Rows        int               `json:"rows"`
	HeapBytes   int64             `json:"heap_bytes"`  // table + TOAST + primary key
	TableBytes  int64             `json:"table_bytes"` // table + TOAST
	MirrorBytes int64             `json:"mirror_bytes"`
	CopyTime    time.Duration     `json:"copy_time"`
	Queries     []AnalyticsQuery  `json:"queries"`
	LookupP50   time.Duration     `json:"pk_lookup_p50"`
	LookupTPS   float64           `json:"pk_lookup_tps"`
	Upserts     []AnalyticsUpsert `json:"upserts"`
}

// zedTable is the source document's table: id int8, int1..int10 int,
// text1..text10 text, crt_time timestamp.
func zedTable() string {
	var cols []string
	for i := 1; i <= 10; i++ {
		cols = append(cols, fmt.Sprintf("int%d int", i))
	}
	for i := 1; i <= 10; i++ {
		cols = append(cols, fmt.Sprintf("text%d text", i))
	}
	return "CREATE TABLE t (id int8 PRIMARY KEY, " + strings.Join(cols, ", ") + ", crt_time timestamp);\n"
}

// zedValues is a row of the table for id expr: ints in 0..1000, texts of
// 32 characters from 10,000 distinct values (group-bys have groups).
func zedValues(id string) string {
	var vals []string
	vals = append(vals, id)
	for i := 1; i <= 10; i++ {
		vals = append(vals, "(random()*1000)::int")
	}
	for i := 1; i <= 10; i++ {
		vals = append(vals, "md5(((random()*10000)::int)::text)")
	}
	return strings.Join(append(vals, "clock_timestamp()"), ", ")
}

// Analytics runs bench analytics: the source document's table on the heap
// and in a tenant's DuckDB mirror, in the same run: sizes, group-bys, a
// filtered aggregate, PK lookups on the heap, and upserts with pgbench
// with the mirror off and on (tps, 1 s windows, the mirror's lag and
// catch-up).
func (e *Env) Analytics(ctx context.Context, o AnalyticsOptions) (AnalyticsResult, Table, error) {
	res := AnalyticsResult{Rows: o.Rows}
	fc, stop, err := e.fleetFor(ctx, "analytics", map[string]string{"shared_buffers": "256MB", "max_wal_size": "4GB"}, true)
	if err != nil {
		return res, Table{}, err
	}
	defer stop()
	dir, removeDir, err := e.daemonDir("analytics-daemon")
	if err != nil {
		return res, Table{}, err
	}
	defer removeDir()
	cfg := benchConfig(fc, dir)
	cfg.Analytics.Listen = "127.0.0.1:0"
	cfg.Analytics.MemoryLimit = config.ByteSize(1 << 30)
	cfg.Analytics.Threads = 2
	cfg.Analytics.StatementTimeout = config.Duration(10 * time.Minute)
	cfg.Tiers["bench"] = config.Tier{ConnectionLimit: 100, StatementTimeout: config.Duration(30 * time.Minute)}
	d, err := e.startDaemonInProcess(ctx, fc, cfg)
	if err != nil {
		return res, Table{}, err
	}
	defer d.Stop()
	if err := d.createTemplate(ctx, "zed", []templates.Upload{{Name: "0001_init.sql", Body: zedTable()}}); err != nil {
		return res, Table{}, err
	}
	r, err := d.client.CreateTenant(ctx, provision.Request{Template: "zed", Mode: tenant.ModeDatabase, Tier: "bench"})
	if err != nil {
		return res, Table{}, err
	}
	id, dsn := r.Tenant.ID, r.DirectDSN
	heap, err := pgx.Connect(ctx, dsn)
	if err != nil {
		return res, Table{}, err
	}
	defer heap.Close(context.WithoutCancel(ctx))
	e.logf("analytics: loading %d rows into tenant %s", o.Rows, id)
	for from := 1; from <= o.Rows; from += 1_000_000 {
		to := min(from+999_999, o.Rows)
		if _, err := heap.Exec(ctx, fmt.Sprintf(`INSERT INTO t SELECT %s FROM generate_series(%d, %d) g`, zedValues("g"), from, to)); err != nil {
			return res, Table{}, fmt.Errorf("load: %w", err)
		}
	}
	if _, err := heap.Exec(ctx, `VACUUM ANALYZE t`); err != nil {
		return res, Table{}, err
	}
	if err := heap.QueryRow(ctx, `SELECT pg_total_relation_size('t'), pg_table_size('t')`).Scan(&res.HeapBytes, &res.TableBytes); err != nil {
		return res, Table{}, err
	}
	queries := []AnalyticsQuery{
		{Name: "group by int1", SQL: `SELECT int1, count(*) FROM t GROUP BY 1`},
		{Name: "group by text1", SQL: `SELECT text1, count(*) FROM t GROUP BY 1`},
		{Name: "filtered aggregate", SQL: `SELECT int2, count(*), avg(int3), max(text4) FROM t WHERE int5 < 100 AND text6 > 'c' GROUP BY 1`},
	}
	for i, q := range queries {
		if queries[i].Heap, err = fastest(ctx, o.Repeat, heap, q.SQL); err != nil {
			return res, Table{}, fmt.Errorf("heap %s: %w", q.Name, err)
		}
		e.logf("analytics: heap %s: %s", q.Name, queries[i].Heap.Round(time.Millisecond))
	}

	pgbench := fc.Binaries().Path("pgbench")
	lookup := filepath.Join(dir, "lookup.sql")
	upsert := filepath.Join(dir, "upsert.sql")
	if err := os.WriteFile(lookup, []byte(fmt.Sprintf("\\set id random(1, %d)\nSELECT * FROM t WHERE id = :id;\n", o.Rows)), 0o644); err != nil {
		return res, Table{}, err
	}
	up := fmt.Sprintf("\\set id random(1, %d)\nINSERT INTO t VALUES (%s) ON CONFLICT (id) DO UPDATE SET int1 = excluded.int1, int2 = excluded.int2, text1 = excluded.text1, crt_time = excluded.crt_time;\n",
		o.Rows, zedValues(":id"))
	if err := os.WriteFile(upsert, []byte(up), 0o644); err != nil {
		return res, Table{}, err
	}
	e.logf("analytics: PK lookups on the heap (pgbench -M prepared, 4 clients, %s)", o.Duration)
	lk, err := runPgbench(ctx, pgbench, dir, lookup, dsn, 4, o.Duration)
	if err != nil {
		return res, Table{}, err
	}
	res.LookupP50, res.LookupTPS = lk.p50, lk.tps
	for _, c := range o.Clients {
		e.logf("analytics: upserts, %d clients, mirror off", c)
		u, err := runPgbench(ctx, pgbench, dir, upsert, dsn, c, o.Duration)
		if err != nil {
			return res, Table{}, err
		}
		res.Upserts = append(res.Upserts, u.upsert(c, false))
	}

	// What the daemon spends without a mirror (its other loops), over two
	// seconds with nothing else running: their share of each run's
	// figure.
	idle, err := idleCPU(ctx, 2*time.Second)
	if err != nil {
		return res, Table{}, err
	}
	e.logf("analytics: enabling the mirror (initial copy of %d rows)", o.Rows)
	start := time.Now()
	if _, err := d.client.EnableAnalytics(ctx, id, nil); err != nil {
		return res, Table{}, err
	}
	var st analytics.Status
	for st.State != analytics.StateStreaming {
		if st, err = d.client.AnalyticsStatus(ctx, id); err != nil {
			return res, Table{}, err
		}
		if st.Error != "" {
			return res, Table{}, fmt.Errorf("mirror: %s", st.Error)
		}
		time.Sleep(100 * time.Millisecond)
	}
	res.CopyTime = time.Since(start)
	if err := d.d.Analytics().WithMirror(id, func(db *sql.DB) error { _, err := db.Exec("CHECKPOINT"); return err }); err != nil {
		return res, Table{}, err
	}
	for _, p := range []string{d.d.Analytics().File(id), d.d.Analytics().File(id) + ".wal"} {
		if fi, err := os.Stat(p); err == nil {
			res.MirrorBytes += fi.Size()
		}
	}
	u, _ := url.Parse(st.DSN)
	u.User = url.UserPassword(u.User.Username(), r.Password)
	mirror, err := pgx.Connect(ctx, u.String()+"&default_query_exec_mode=simple_protocol")
	if err != nil {
		return res, Table{}, fmt.Errorf("analytics port: %w", err)
	}
	defer mirror.Close(context.WithoutCancel(ctx))
	for i, q := range queries {
		if queries[i].Mirror, err = fastest(ctx, o.Repeat, mirror, q.SQL); err != nil {
			return res, Table{}, fmt.Errorf("mirror %s: %w", q.Name, err)
		}
		err := d.d.Analytics().WithMirror(id, func(db *sql.DB) error {
			for range max(1, o.Repeat) {
				start := time.Now()
				rows, err := db.QueryContext(ctx, q.SQL)
				if err != nil {
					return err
				}
				n := 0
				for rows.Next() {
					n++
				}
				rows.Close()
				if err := rows.Err(); err != nil {
					return err
				}
				if el := time.Since(start); queries[i].MirrorDirect == 0 || el < queries[i].MirrorDirect {
					queries[i].MirrorDirect = el
				}
				queries[i].Rows = n
			}
			return nil
		})
		if err != nil {
			return res, Table{}, fmt.Errorf("mirror %s in the daemon: %w", q.Name, err)
		}
		e.logf("analytics: mirror %s: %s (%s in the daemon, %d rows)", q.Name, queries[i].Mirror.Round(time.Millisecond), queries[i].MirrorDirect.Round(time.Millisecond), queries[i].Rows)
	}
	res.Queries = queries

	for _, c := range o.Clients {
		e.logf("analytics: upserts, %d clients, mirror on", c)
		var lags []time.Duration
		var pending []time.Duration // bytes, in a Duration for percentile
		done := make(chan struct{})
		var wg sync.WaitGroup
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				select {
				case <-done:
					return
				case <-time.After(100 * time.Millisecond):
				}
				if p, ok := d.d.Analytics().Progress(id); ok {
					lags = append(lags, time.Duration(p.LagSeconds*float64(time.Second)))
					pending = append(pending, time.Duration(p.LagBytes))
				}
			}
		}()
		var walPID int
		if err := heap.QueryRow(ctx, `SELECT coalesce(active_pid, 0) FROM pg_catalog.pg_replication_slots WHERE slot_name = $1`, analytics.SlotName(id)).Scan(&walPID); err != nil {
			return res, Table{}, err
		}
		p0, _ := d.d.Analytics().Progress(id)
		selfCPU0, walCPU0, runStart := processCPU(0), processCPU(walPID), time.Now()
		run, err := runPgbench(ctx, pgbench, dir, upsert, dsn, c, o.Duration)
		close(done)
		wg.Wait()
		if err != nil {
			return res, Table{}, err
		}
		row := run.upsert(c, true)
		var lsnText string
		if err := heap.QueryRow(ctx, `SELECT pg_current_wal_lsn()::text`).Scan(&lsnText); err != nil {
			return res, Table{}, err
		}
		lsn, _ := pglogrepl.ParseLSN(lsnText)
		ended := time.Now()
		for {
			if p, ok := d.d.Analytics().Progress(id); ok && p.CaughtUp >= lsn {
				break
			}
			if time.Since(ended) > 10*time.Minute {
				return res, Table{}, fmt.Errorf("the mirror did not catch up with %s in 10 minutes", lsn)
			}
			time.Sleep(20 * time.Millisecond)
		}
		row.CatchUp = time.Since(ended)
		// The checkpoint that compresses the run's changes into the file
		// is part of their cost: taken now, inside the measure, rather
		// than by the mirror once it has been idle.
		ckpt0 := processCPU(0)
		if err := d.d.Analytics().WithMirror(id, func(db *sql.DB) error { _, err := db.Exec("CHECKPOINT"); return err }); err != nil {
			return res, Table{}, fmt.Errorf("checkpoint the mirror: %w", err)
		}
		row.CheckpointCPU = processCPU(0) - ckpt0
		p1, _ := d.d.Analytics().Progress(id)
		row.Changes, row.DaemonCPU, row.WalsenderCPU = p1.Rows-p0.Rows, processCPU(0)-selfCPU0-run.parseCPU, processCPU(walPID)-walCPU0
		row.DaemonIdleCPU = time.Duration(idle * float64(time.Since(runStart)))
		sort.Slice(lags, func(i, j int) bool { return lags[i] < lags[j] })
		row.LagP50, row.LagP99 = percentile(lags, 50), percentile(lags, 99)
		if len(lags) > 0 {
			row.LagMax = lags[len(lags)-1]
			row.PendingP99 = int64(percentile(pending, 99))
		}
		res.Upserts = append(res.Upserts, row)
	}

	e.logf("analytics: disabling the mirror")
	if _, err := d.client.DisableAnalytics(ctx, id); err != nil {
		return res, Table{}, err
	}
	for {
		var slots int
		if err := heap.QueryRow(ctx, `SELECT count(*) FROM pg_catalog.pg_replication_slots WHERE slot_name = $1`, analytics.SlotName(id)).Scan(&slots); err != nil {
			return res, Table{}, err
		}
		if slots == 0 {
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	for _, c := range o.Clients {
		e.logf("analytics: upserts, %d clients, mirror off again", c)
		u, err := runPgbench(ctx, pgbench, dir, upsert, dsn, c, o.Duration)
		if err != nil {
			return res, Table{}, err
		}
		row := u.upsert(c, false)
		row.After = true
		res.Upserts = append(res.Upserts, row)
	}
	var db string
	if err := heap.QueryRow(ctx, `SELECT current_database()`).Scan(&db); err != nil {
		return res, Table{}, err
	}
	for _, c := range o.Clients {
		e.logf("analytics: upserts, %d clients, decoding only (pg_recvlogical to /dev/null)", c)
		var row AnalyticsUpsert
		err := decodingOnly(ctx, fc, db, func(walPID, recvPID int) error {
			cpu0, recv0 := processCPU(walPID), processCPU(recvPID)
			u, err := runPgbench(ctx, pgbench, dir, upsert, dsn, c, o.Duration)
			if err != nil {
				return err
			}
			row = u.upsert(c, false)
			row.DecodingOnly, row.WalsenderCPU, row.ReceiverCPU, row.Changes = true, processCPU(walPID)-cpu0, processCPU(recvPID)-recv0, u.transactions
			return nil
		})
		if err != nil {
			return res, Table{}, fmt.Errorf("decoding only: %w", err)
		}
		res.Upserts = append(res.Upserts, row)
	}
	return res, analyticsTable(res, o), nil
}

// decodingOnly runs fn while pg_recvlogical streams a pgoutput slot of
// table public.t of database db (the publication and the slot made for
// it, dropped after) to /dev/null, and passes fn the slot's walsender pid
// and pg_recvlogical's.
// Its admin session is the control plane's (cluster.Connect: pinned
// settings, bounded lock waits).
func decodingOnly(ctx context.Context, fc *fleet.Cluster, db string, fn func(walPID, recvPID int) error) error {
	const name = "bench_decoding"
	cl, err := cluster.New(fc.Name(), fc.PrimaryDSN("postgres"), nil, nil)
	if err != nil {
		return err
	}
	defer cl.Close()
	conn, err := cl.Connect(ctx, db)
	if err != nil {
		return err
	}
	cleanup := context.WithoutCancel(ctx)
	defer conn.Close(cleanup)
	if _, err := conn.Exec(ctx, `CREATE PUBLICATION `+name+` FOR TABLE public.t`); err != nil {
		return err
	}
	defer conn.Exec(cleanup, `DROP PUBLICATION IF EXISTS `+name)
	if _, err := conn.Exec(ctx, `SELECT pg_catalog.pg_create_logical_replication_slot($1, 'pgoutput')`, name); err != nil {
		return err
	}
	defer analytics.DropSlot(cleanup, cl, name)
	var stderr strings.Builder
	cmd := exec.Command(fc.Binaries().Path("pg_recvlogical"), "--start", "-S", name, "-f", "/dev/null", "-o", "proto_version=1", "-o", "publication_names="+name, "-d", fc.PrimaryDSN(db))
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		return err
	}
	exited := make(chan struct{})
	go func() { cmd.Wait(); close(exited) }()
	defer func() {
		cmd.Process.Signal(os.Interrupt)
		<-exited
	}()
	for deadline := time.Now().Add(time.Minute); ; {
		var pid int
		if err := conn.QueryRow(ctx, `SELECT coalesce(active_pid, 0) FROM pg_catalog.pg_replication_slots WHERE slot_name = $1`, name).Scan(&pid); err != nil {
			return err
		}
		if pid != 0 {
			return fn(pid, cmd.Process.Pid)
		}
		select {
		case <-exited:
			return fmt.Errorf("pg_recvlogical exited: %s", strings.TrimSpace(stderr.String()))
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(100 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("pg_recvlogical did not start streaming in a minute")
		}
	}
}

// fastest runs q n times and returns the fastest run, its rows read.
func fastest(ctx context.Context, n int, conn *pgx.Conn, q string) (time.Duration, error) {
	best := time.Duration(0)
	for range max(1, n) {
		start := time.Now()
		rows, err := conn.Query(ctx, q)
		if err != nil {
			return 0, err
		}
		for rows.Next() {
		}
		rows.Close()
		if err := rows.Err(); err != nil {
			return 0, err
		}
		if el := time.Since(start); best == 0 || el < best {
			best = el
		}
	}
	return best, nil
}

type pgbenchRun struct {
	tps          float64
	transactions int64 // processed
	p50          time.Duration
	windows      []float64     // tps of each 1 s progress window
	parseCPU     time.Duration // this process's CPU reading pgbench's logs (not the daemon's)
}

func (r pgbenchRun) upsert(clients int, mirror bool) AnalyticsUpsert {
	u := AnalyticsUpsert{Clients: clients, Mirror: mirror, TPS: r.tps}
	for i, w := range r.windows {
		if i == 0 || w < u.MinWindow {
			u.MinWindow = w
		}
		if w == 0 {
			u.ZeroWindows++
		}
	}
	return u
}

var processedRE = regexp.MustCompile(`number of transactions actually processed: ([0-9]+)`)

var progressRE = regexp.MustCompile(`progress: [0-9.]+ s, ([0-9.]+) tps`)

// runPgbench runs a script with the extended protocol's prepared
// statements (-M prepared), reporting every second.
func runPgbench(ctx context.Context, bin, dir, script, dsn string, clients int, d time.Duration) (pgbenchRun, error) {
	prefix := filepath.Join(dir, fmt.Sprintf("pgbench-%d", time.Now().UnixNano()))
	args := []string{"-n", "-M", "prepared", "-f", script, "-c", strconv.Itoa(clients), "-j", strconv.Itoa(min(clients, 2)),
		"-T", strconv.Itoa(max(1, int(d.Seconds()))), "-P", "1", "-l", "--log-prefix", prefix, dsn}
	out, err := exec.CommandContext(ctx, bin, args...).CombinedOutput()
	if err != nil {
		return pgbenchRun{}, fmt.Errorf("pgbench: %w: %s", err, out)
	}
	var r pgbenchRun
	if m := tpsRE.FindSubmatch(out); m != nil {
		r.tps, _ = strconv.ParseFloat(string(m[1]), 64)
	}
	if m := processedRE.FindSubmatch(out); m != nil {
		r.transactions, _ = strconv.ParseInt(string(m[1]), 10, 64)
	}
	for _, m := range progressRE.FindAllSubmatch(out, -1) {
		v, _ := strconv.ParseFloat(string(m[1]), 64)
		r.windows = append(r.windows, v)
	}
	runtime.LockOSThread() // the thread's CPU is the parse's
	defer runtime.UnlockOSThread()
	c0 := threadCPU()
	r.p50 = percentile(pgbenchLatencies(prefix), 50)
	r.parseCPU = threadCPU() - c0
	return r, nil
}

func analyticsTable(r AnalyticsResult, o AnalyticsOptions) Table {
	t := Table{Title: fmt.Sprintf("pgtenant bench analytics: the source document's table (id int8, int1..int10, text1..text10, crt_time), %d rows, heap vs DuckDB mirror", r.Rows),
		Columns: []string{"what", "heap", "mirror", "mirror / heap"}, Data: map[string]any{"result": r}}
	t.Rows = append(t.Rows, []string{"size (heap: table + TOAST + primary key)", mb(r.HeapBytes), mb(r.MirrorBytes), pct(float64(r.MirrorBytes) / float64(r.HeapBytes))})
	t.Rows = append(t.Rows, []string{"initial copy", "", r.CopyTime.Round(time.Millisecond).String(), ""})
	for _, q := range r.Queries {
		t.Rows = append(t.Rows, []string{fmt.Sprintf("%s (%d rows)", q.Name, q.Rows), ms(q.Heap), fmt.Sprintf("%s (in the daemon, no wire: %s)", ms(q.Mirror), ms(q.MirrorDirect)),
			fmt.Sprintf("%.1f× faster", float64(q.Heap)/float64(max(q.Mirror, 1)))})
	}
	t.Rows = append(t.Rows, []string{"PK lookup p50 (pgbench -M prepared, 4 clients)", fmt.Sprintf("%s (%.0f tps)", ms(r.LookupP50), r.LookupTPS), "(served by the heap)", ""})
	on := map[int]AnalyticsUpsert{}
	off := map[int][]float64{}    // tps of the off runs before and after the mirror
	decoding := map[int]float64{} // tps of the decoding-only runs
	for _, u := range r.Upserts {
		switch {
		case u.DecodingOnly:
			decoding[u.Clients] = u.TPS
		case !u.Mirror:
			off[u.Clients] = append(off[u.Clients], u.TPS)
		}
	}
	offMean := map[int]float64{}
	for c, tps := range off {
		for _, x := range tps {
			offMean[c] += x / float64(len(tps))
		}
	}
	perChange := func(cpu time.Duration, changes int64) float64 {
		return float64(cpu.Microseconds()) / float64(changes)
	}
	for _, u := range r.Upserts {
		state := "mirror off"
		switch {
		case u.Mirror:
			state = "mirror on"
			on[u.Clients] = u
		case u.After:
			state = "mirror off again (after disable)"
		case u.DecodingOnly:
			state = "decoding only (no mirror: pg_recvlogical to /dev/null)"
		}
		row := []string{fmt.Sprintf("upserts, %d clients, %s", u.Clients, state), fmt.Sprintf("%.0f tps (slowest 1 s window %.0f, %d at 0)", u.TPS, u.MinWindow, u.ZeroWindows), "", ""}
		switch {
		case u.Mirror:
			row[2] = fmt.Sprintf("lag p50 %s, p99 %s, max %s; caught up %s after; received, not applied: p99 %s", ms(u.LagP50), ms(u.LagP99), ms(u.LagMax), ms(u.CatchUp), mb(u.PendingP99))
			if u.Changes > 0 {
				row[3] = fmt.Sprintf("CPU per change: daemon %.0f µs (its checkpoint %.0f; its other loops, as when idle, %.0f), walsender %.0f µs", perChange(u.DaemonCPU, u.Changes), perChange(u.CheckpointCPU, u.Changes), perChange(u.DaemonIdleCPU, u.Changes), perChange(u.WalsenderCPU, u.Changes))
			}
		case u.DecodingOnly && u.Changes > 0 && offMean[u.Clients] > 0:
			row[2] = fmt.Sprintf("%s of off: the ceiling of mirror on", pct(u.TPS/offMean[u.Clients]))
			row[3] = fmt.Sprintf("CPU per change: walsender %.0f µs, pg_recvlogical %.0f µs (receiving alone)", perChange(u.WalsenderCPU, u.Changes), perChange(u.ReceiverCPU, u.Changes))
		}
		t.Rows = append(t.Rows, row)
	}
	t.Checks = append(t.Checks, Check{Target: "mirror <= 30% of the heap's size (zedstore 47%)", Got: pct(float64(r.MirrorBytes) / float64(r.HeapBytes)),
		Met: float64(r.MirrorBytes) <= 0.3*float64(r.HeapBytes)})
	for _, q := range r.Queries[:2] {
		f := float64(q.Heap) / float64(max(q.Mirror, 1))
		t.Checks = append(t.Checks, Check{Target: q.Name + ": >= 20× faster on the mirror (zedstore 2×)", Got: fmt.Sprintf("%.1f×", f), Met: f >= 20})
	}
	for _, c := range o.Clients {
		on := on[c]
		if base := decoding[c]; base > 0 {
			t.Checks = append(t.Checks, Check{Target: fmt.Sprintf("upserts, %d clients: tps with the mirror on >= 90%% of decoding only (the ceiling on these cores), no 1 s window at 0", c),
				Got: fmt.Sprintf("%s (%.0f vs %.0f; %s of off), %d windows at 0", pct(on.TPS/base), on.TPS, base, pct(on.TPS/offMean[c]), on.ZeroWindows), Met: on.TPS >= 0.9*base && on.ZeroWindows == 0})
		}
		if on.Changes > 0 {
			us := perChange(on.DaemonCPU, on.Changes)
			t.Checks = append(t.Checks, Check{Target: fmt.Sprintf("upserts, %d clients: the mirror's CPU <= 15 µs per change (the daemon's, its checkpoint included)", c),
				Got: fmt.Sprintf("%.0f µs", us), Met: us <= 15})
		}
		t.Checks = append(t.Checks, Check{Target: fmt.Sprintf("upserts, %d clients: mirror lag p99 <= 2 s, caught up within 10 s", c),
			Got: fmt.Sprintf("p99 %s, caught up in %s", ms(on.LagP99), ms(on.CatchUp)), Met: on.LagP99 <= 2*time.Second && on.CatchUp <= 10*time.Second})
	}
	t.Notes = append(t.Notes,
		fmt.Sprintf("%d rows (the source document has 10,000,000; --rows sets it). Query times: the fastest of %d runs; the heap's with PostgreSQL 15's defaults (parallel workers allowed), the mirror's through pgtenant's analytics port (DuckDB, analytics.threads=2, memory_limit 1GB).", r.Rows, o.Repeat),
		"ints are random in 0..1000, texts are 32-character md5s of 10,000 distinct values; one upsert changes int1, int2, text1 and crt_time of a random id (insert … on conflict (id) do update).",
		"lag: age of the oldest commit not yet in the mirror, sampled every 100 ms; caught up: from the end of pgbench until the mirror holds the primary's LSN.",
		"decoding only: the mirror disabled, a pgoutput slot of the table streamed by pg_recvlogical to /dev/null: what logical decoding alone costs the primary, so no mirror's tps can be above it on these cores.",
		"PostgreSQL, pgbench, the daemon and DuckDB share the machine's cores.")
	return t
}

// idleCPU is the share of a core this process uses over span.
func idleCPU(ctx context.Context, span time.Duration) (float64, error) {
	cpu0 := processCPU(0)
	if err := sleepCtx(ctx, span); err != nil {
		return 0, err
	}
	return float64(processCPU(0)-cpu0) / float64(span), nil
}

// processCPU is the user and system CPU a process has used: this one
// (pid 0) from getrusage, another from /proc (0 when unreadable).
func processCPU(pid int) time.Duration {
	if pid == 0 {
		return rusageCPU(syscall.RUSAGE_SELF)
	}
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0
	}
	// Fields after the command (in parentheses): utime and stime are the
	// 12th and 13th, in clock ticks (100 a second on Linux).
	_, rest, ok := strings.Cut(string(b), ") ")
	f := strings.Fields(rest)
	if !ok || len(f) < 13 {
		return 0
	}
	ut, _ := strconv.ParseInt(f[11], 10, 64)
	st, _ := strconv.ParseInt(f[12], 10, 64)
	return time.Duration(ut+st) * 10 * time.Millisecond
}

// threadCPU is the CPU the calling OS thread has used.
func threadCPU() time.Duration { return rusageCPU(1 /* RUSAGE_THREAD */) }

// rusageCPU is the user and system CPU getrusage reports for who.
func rusageCPU(who int) time.Duration {
	var ru syscall.Rusage
	if syscall.Getrusage(who, &ru) != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

func mb(b int64) string { return fmt.Sprintf("%.1f MB", float64(b)/(1<<20)) }

func pct(f float64) string { return fmt.Sprintf("%.0f%%", f*100) }
