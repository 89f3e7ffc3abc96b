package bench

import (
	"bufio"
	"context"
	"fmt"
	"math/rand/v2"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"

	examples "github.com/pgtenant/pgtenant/examples/templates"
	"github.com/pgtenant/pgtenant/internal/config"
	"github.com/pgtenant/pgtenant/internal/daemon"
	"github.com/pgtenant/pgtenant/internal/provision"
	"github.com/pgtenant/pgtenant/internal/templates"
	"github.com/pgtenant/pgtenant/internal/tenant"
	"github.com/pgtenant/pgtenant/internal/tlsca"
)

// PoolerOptions size bench pooler.
type PoolerOptions struct {
	Tenants  int           // density: tenants, each with Idle idle clients
	Idle     int           // idle clients per tenant
	Busy     int           // busy clients (pgbench's, and the density phase's)
	Duration time.Duration // of each pgbench run and of the busy phase
	Burst    int           // creates in the burst whose reloads are counted
}

// PoolerRow is one pgbench run.
type PoolerRow struct {
	Method string        `json:"method"`
	TPS    float64       `json:"tps"`
	P50    time.Duration `json:"p50"`
	P95    time.Duration `json:"p95"`
	Failed int           `json:"failed"`
}

// PoolerResult is what bench pooler measured.
type PoolerResult struct {
	Runs          []PoolerRow   `json:"pgbench"`
	BurstCreates  int           `json:"burst_creates"`
	BurstReloads  int64         `json:"burst_reloads"`
	BurstWall     time.Duration `json:"burst_wall"`
	Tenants       int           `json:"tenants"`
	IdleClients   int           `json:"idle_clients"`
	IdleFailed    int           `json:"idle_failed"`
	BusyTxns      int64         `json:"busy_transactions"`
	BusyFailed    int64         `json:"busy_failed"`
	PeakBackends  int           `json:"peak_backends"`
	MaxConns      int           `json:"max_connections"`
	LeakTxns      int64         `json:"leak_transactions"`
	LeakForeign   int64         `json:"leak_foreign_rows"`
	LeakWrongRole int64         `json:"leak_wrong_role"`
}

// burstParallel is how many creates of the burst are in flight at once:
// each waits for the sync that puts its tenant in the pooler, so a sync
// serves at most this many, and 200 creates cost at least 200/this reloads.
const burstParallel = 50

// density template: one small table, so that a thousand schema tenants
// build in about a minute.
var tinyTemplate = []templates.Upload{{Name: "0001_init.sql", Body: "CREATE TABLE item (id serial PRIMARY KEY, owner text NOT NULL DEFAULT current_user);\n"}}

// Pooler runs bench pooler: pgbench through the pooler against direct, a
// burst of creates and its reloads, then density (Tenants × Idle idle
// clients plus Busy busy ones through the pooler on a server of
// max_connections 100) and the transaction-mode leak check.
func (e *Env) Pooler(ctx context.Context, o PoolerOptions) (PoolerResult, Table, error) {
	res := PoolerResult{MaxConns: 100}
	raiseOpenFiles()
	fc, stop, err := e.fleetFor(ctx, "pooler", map[string]string{"max_connections": "100", "superuser_reserved_connections": "5"}, true)
	if err != nil {
		return res, Table{}, err
	}
	defer stop()
	dir, removeDir, err := e.daemonDir("pooler-daemon")
	if err != nil {
		return res, Table{}, err
	}
	defer removeDir()
	pc, err := benchPooler(filepath.Join(e.Dir, "pooler", "pgbouncer"))
	if err != nil {
		return res, Table{}, err
	}
	pc.MaxClientConn = o.Tenants*o.Idle + 4*o.Busy + 100
	// The server through its Unix socket, as `up` makes it; the TCP rows
	// re-point the pooler for their run.
	pc.ServerSocketDir = fc.SocketDir()
	// The front door serves TLS (a local CA's certificate, as `up` makes):
	// pgbench runs through it in clear text and over TLS, in the same run.
	ca, err := tlsca.Ensure(filepath.Join(e.Dir, "pooler", "tls"))
	if err != nil {
		return res, Table{}, err
	}
	pc.TLSCertFile, pc.TLSKeyFile, pc.TLSCAFile = ca.Cert, ca.Key, ca.CA
	// Idle server connections go after a second: a thousand tenants that
	// each ran a query hold few backends soon after.
	pc.ServerIdleTimeout = config.Duration(time.Second)

	cfg := benchConfig(fc, dir)
	cfg.Tiers["bench"] = config.Tier{ConnectionLimit: 2 * o.Busy, StatementTimeout: config.Duration(time.Minute),
		PoolMode: "transaction", PoolSize: o.Busy, MaxDBConnections: o.Busy}
	cfg.Tiers["dense"] = config.Tier{ConnectionLimit: 2, StatementTimeout: config.Duration(time.Minute),
		PoolMode: "transaction", PoolSize: 1, MaxDBConnections: 1}
	cfg.Pools = []config.PoolConfig{{Template: "tiny", Mode: string(tenant.ModeSchema), Size: o.Tenants}}
	cfg.Jobs.Workers = 4
	withPooler := func(do *daemon.Options) { do.Poolers = map[string]config.PoolerConfig{fc.Name(): pc} }
	d, err := e.startDaemonInProcess(ctx, fc, cfg, withPooler)
	if err != nil {
		return res, Table{}, err
	}
	e.logf("pooler: PgBouncer on %s; building templates saas and tiny, and %d spares of tiny (schema mode)", pc.Listen, o.Tenants)
	if err := d.createTemplate(ctx, "saas", examples.Saas()); err != nil {
		d.Stop()
		return res, Table{}, err
	}
	if err := d.createTemplate(ctx, "tiny", tinyTemplate); err != nil {
		d.Stop()
		return res, Table{}, err
	}
	// The spares first, then the daemon again with the pool refill off:
	// builds would run under the measurements.
	if err := e.waitPoolerSpares(ctx, d, o.Tenants); err != nil {
		d.Stop()
		return res, Table{}, err
	}
	if err := d.Stop(); err != nil {
		return res, Table{}, err
	}
	cfg.Pools = []config.PoolConfig{{Template: "tiny", Mode: string(tenant.ModeSchema), Size: 0}}
	if d, err = e.startDaemonInProcess(ctx, fc, cfg, withPooler); err != nil {
		return res, Table{}, err
	}
	defer d.Stop()
	front := d.d.Poolers().Get(fc.Name())
	if err := front.Sync(ctx); err != nil {
		return res, Table{}, err
	}

	// 1. pgbench, direct and through the pooler, on one database tenant.
	r, err := d.client.CreateTenant(ctx, provision.Request{Template: "saas", Mode: tenant.ModeDatabase, Tier: "bench"})
	if err != nil {
		return res, Table{}, err
	}
	pgbench := fc.Binaries().Path("pgbench")
	if out, err := exec.CommandContext(ctx, pgbench, "-i", "-s", "2", "-q", r.DirectDSN).CombinedOutput(); err != nil {
		return res, Table{}, fmt.Errorf("pgbench -i: %w: %s", err, out)
	}
	tcp, err := pgx.ParseConfig(fc.PrimaryDSN("postgres"))
	if err != nil {
		return res, Table{}, err
	}
	// point sends the pooler to the server over TCP or through its socket.
	point := func(overTCP bool) error {
		if pc.ServerSocketDir == "" {
			return nil
		}
		if overTCP {
			return front.Point(ctx, tcp.Host, int(tcp.Port))
		}
		return front.Point(ctx, pc.ServerSocketDir, int(tcp.Port))
	}
	for _, mode := range []struct{ name, flag string }{{"select-only", "-S"}, {"TPC-B-like", ""}} {
		for _, path := range []struct {
			name, dsn string
			tcp       bool
		}{{"direct", r.DirectDSN, false}, {"pooler", clearText(r.DSN), false}, {"pooler, TCP", clearText(r.DSN), true}, {"pooler, TLS", r.DSN, false}} {
			if path.name != "direct" {
				if err := point(path.tcp); err != nil {
					return res, Table{}, err
				}
			}
			row, err := e.pgbench(ctx, pgbench, dir, mode.flag, path.dsn, o)
			if err != nil {
				return res, Table{}, err
			}
			row.Method = mode.name + ", " + path.name
			e.logf("pooler: %s: %.0f tps, p50 %s, p95 %s, %d failed", row.Method, row.TPS, ms(row.P50), ms(row.P95), row.Failed)
			res.Runs = append(res.Runs, row)
		}
	}

	// 2. A burst of creates: reloads counted.
	var mu sync.Mutex
	var dsns []string
	create := func(n, parallel int) error {
		var wg sync.WaitGroup
		var firstErr error
		next := atomic.Int64{}
		for w := 0; w < parallel; w++ {
			wg.Go(func() {
				for next.Add(1) <= int64(n) {
					r, err := d.client.CreateTenant(ctx, provision.Request{Template: "tiny", Mode: tenant.ModeSchema, Tier: "dense"})
					mu.Lock()
					if err != nil && firstErr == nil {
						firstErr = err
					}
					if err == nil {
						// Density and the leak check as before TLS: clear text.
						dsns = append(dsns, clearText(r.DSN))
					}
					mu.Unlock()
				}
			})
		}
		wg.Wait()
		return firstErr
	}
	before := front.Snapshot().Reloads
	start := time.Now()
	if err := create(o.Burst, burstParallel); err != nil {
		return res, Table{}, err
	}
	res.BurstWall, res.BurstCreates = time.Since(start), o.Burst
	res.BurstReloads = front.Snapshot().Reloads - before
	e.logf("pooler: %d creates (%d at a time) in %s: %d reloads", o.Burst, burstParallel, res.BurstWall.Round(time.Millisecond), res.BurstReloads)
	if err := create(o.Tenants-o.Burst, 20); err != nil {
		return res, Table{}, err
	}
	res.Tenants = len(dsns)

	// 3. Density: Idle clients per tenant, connected and served, then Busy
	// busy ones; backends sampled throughout.
	admin, err := pgx.Connect(ctx, fc.PrimaryDSN("postgres"))
	if err != nil {
		return res, Table{}, err
	}
	defer admin.Close(context.WithoutCancel(ctx))
	sctx, stopSampling := context.WithCancel(ctx)
	peak := make(chan int, 1)
	go func() {
		p := 0
		for sctx.Err() == nil {
			var n int
			if err := admin.QueryRow(sctx, `SELECT count(*) FROM pg_stat_activity WHERE backend_type = 'client backend'`).Scan(&n); err == nil && n > p {
				p = n
			}
			time.Sleep(20 * time.Millisecond)
		}
		peak <- p
	}()
	e.logf("pooler: connecting %d idle clients (%d per tenant), each running one query", len(dsns)*o.Idle, o.Idle)
	var idle []*pgx.Conn
	var idleMu sync.Mutex
	var wg sync.WaitGroup
	sem := make(chan struct{}, 8)
	for i, dsn := range dsns {
		for k := 0; k < o.Idle; k++ {
			sem <- struct{}{}
			wg.Go(func() {
				defer func() { <-sem }()
				conn, err := connectSimple(ctx, dsn)
				if err == nil {
					_, err = conn.Exec(ctx, "SELECT 1")
				}
				idleMu.Lock()
				defer idleMu.Unlock()
				if err != nil {
					res.IdleFailed++
					if res.IdleFailed <= 3 {
						e.logf("pooler: idle client of tenant %d: %v", i, err)
					}
					if conn != nil {
						conn.Close(context.WithoutCancel(ctx))
					}
					return
				}
				idle = append(idle, conn)
			})
		}
		// About 40 tenants a second: the server connections of the
		// tenants just served close after server_idle_timeout (1 s).
		if i%10 == 9 {
			time.Sleep(250 * time.Millisecond)
		}
	}
	wg.Wait()
	res.IdleClients = len(idle)
	e.logf("pooler: %d idle clients connected and served (%d failed); %d busy clients for %s", res.IdleClients, res.IdleFailed, o.Busy, o.Duration)
	var txns, failed atomic.Int64
	bctx, cancel := context.WithTimeout(ctx, o.Duration)
	for b := 0; b < o.Busy; b++ {
		dsn := dsns[b%len(dsns)]
		wg.Go(func() {
			conn, err := connectSimple(bctx, dsn)
			if err != nil {
				failed.Add(1)
				return
			}
			defer conn.Close(context.WithoutCancel(ctx))
			for bctx.Err() == nil {
				if _, err := conn.Exec(bctx, "INSERT INTO item DEFAULT VALUES"); err != nil {
					if bctx.Err() == nil {
						failed.Add(1)
					}
					continue
				}
				txns.Add(1)
			}
		})
	}
	wg.Wait()
	cancel()
	res.BusyTxns, res.BusyFailed = txns.Load(), failed.Load()

	// 4. The leak check on a few of them, in transaction mode, one server
	// connection per tenant.
	e.logf("pooler: leak check")
	leakTenants := dsns[:min(5, len(dsns))]
	for i, dsn := range leakTenants {
		for k := 0; k < 8; k++ {
			other := strings.TrimPrefix(dsnPath(leakTenants[(i+1)%len(leakTenants)]), "/")
			wg.Go(func() {
				conn, err := connectSimple(ctx, dsn)
				if err != nil {
					return
				}
				defer conn.Close(context.WithoutCancel(ctx))
				own := strings.TrimPrefix(dsnPath(dsn), "/")
				rng := rand.New(rand.NewPCG(uint64(i), uint64(k)))
				for n := 0; n < 250; n++ {
					switch rng.IntN(5) {
					case 0:
						_, _ = conn.Exec(ctx, "SET search_path = "+other)
					case 1:
						_, _ = conn.Exec(ctx, "RESET ALL")
					case 2:
						_, _ = conn.Exec(ctx, "DISCARD ALL")
					case 3:
						_, _ = conn.Exec(ctx, "SET search_path = "+own+", "+other)
					}
					rows, err := conn.Query(ctx, "SELECT owner, current_user::text FROM item")
					atomicAdd(&res.LeakTxns, 1)
					if err != nil {
						continue
					}
					for rows.Next() {
						var o, u string
						if rows.Scan(&o, &u) == nil {
							if o != own {
								atomicAdd(&res.LeakForeign, 1)
							}
							if u != own {
								atomicAdd(&res.LeakWrongRole, 1)
							}
						}
					}
					rows.Close()
				}
			})
		}
	}
	wg.Wait()
	stopSampling()
	res.PeakBackends = <-peak
	for _, c := range idle {
		c.Close(context.WithoutCancel(ctx))
	}
	return res, poolerTable(res, o), nil
}

var atomicMu sync.Mutex

func atomicAdd(p *int64, n int64) {
	atomicMu.Lock()
	*p += n
	atomicMu.Unlock()
}

// clearText is a DSN with sslmode=disable (and no sslrootcert).
func clearText(dsn string) string {
	u, err := url.Parse(dsn)
	if err != nil {
		return dsn
	}
	q := u.Query()
	q.Del("sslrootcert")
	q.Set("sslmode", "disable")
	u.RawQuery = q.Encode()
	return u.String()
}

func dsnPath(dsn string) string {
	cfg, err := pgx.ParseConfig(dsn)
	if err != nil {
		return ""
	}
	return "/" + cfg.Database
}

func connectSimple(ctx context.Context, dsn string) (*pgx.Conn, error) {
	cfg, err := pgx.ParseConfig(dsn)
	if err != nil {
		return nil, err
	}
	// Behind a transaction pool, PgBouncer 1.18 cannot carry named
	// prepared statements.
	cfg.DefaultQueryExecMode = pgx.QueryExecModeSimpleProtocol
	cfg.ConnectTimeout = 30 * time.Second
	return pgx.ConnectConfig(ctx, cfg)
}

// waitPoolerSpares waits until n spares of tiny are ready.
func (e *Env) waitPoolerSpares(ctx context.Context, d *benchDaemon, n int) error {
	last := -1
	for {
		got, err := d.spares(ctx, "tiny", tenant.ModeSchema)
		if err != nil {
			return err
		}
		if got >= n {
			return nil
		}
		if got/100 != last/100 {
			e.logf("pooler: %d of %d spares ready", got, n)
			last = got
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(time.Second):
		}
	}
}

// pgbenchLatencies reads (and removes) the per-transaction logs pgbench
// --log --log-prefix=prefix wrote: each line's third field is the
// transaction's latency in microseconds. Sorted, for percentile.
func pgbenchLatencies(prefix string) []time.Duration {
	logs, _ := filepath.Glob(prefix + ".*")
	var lat []time.Duration
	for _, l := range logs {
		f, err := os.Open(l)
		if err != nil {
			continue
		}
		sc := bufio.NewScanner(f)
		for sc.Scan() {
			fs := strings.Fields(sc.Text())
			if len(fs) >= 3 {
				if us, err := strconv.ParseInt(fs[2], 10, 64); err == nil {
					lat = append(lat, time.Duration(us)*time.Microsecond)
				}
			}
		}
		f.Close()
		os.Remove(l)
	}
	sort.Slice(lat, func(i, j int) bool { return lat[i] < lat[j] })
	return lat
}

var tpsRE = regexp.MustCompile(`tps = ([0-9.]+) \(without initial connection time\)`)

// pgbench runs Busy clients for Duration with the simple protocol (the
// extended protocol's named statements cannot cross a transaction pool in
// PgBouncer 1.18; both paths run the same) and reads every transaction's
// latency from its log.
func (e *Env) pgbench(ctx context.Context, bin, dir, flag, dsn string, o PoolerOptions) (PoolerRow, error) {
	prefix := filepath.Join(dir, fmt.Sprintf("pgbench-%d", time.Now().UnixNano()))
	args := []string{"-n", "-M", "simple", "-c", strconv.Itoa(o.Busy), "-j", "2", "-T", strconv.Itoa(int(o.Duration.Seconds())),
		"-l", "--log-prefix", prefix}
	if flag != "" {
		args = append(args, flag)
	}
	out, err := exec.CommandContext(ctx, bin, append(args, dsn)...).CombinedOutput()
	if err != nil {
		return PoolerRow{}, fmt.Errorf("pgbench: %w: %s", err, out)
	}
	var row PoolerRow
	if m := tpsRE.FindSubmatch(out); m != nil {
		row.TPS, _ = strconv.ParseFloat(string(m[1]), 64)
	}
	if m := regexp.MustCompile(`number of failed transactions: ([0-9]+)`).FindSubmatch(out); m != nil {
		row.Failed, _ = strconv.Atoi(string(m[1]))
	}
	lat := pgbenchLatencies(prefix)
	row.P50, row.P95 = percentile(lat, 50), percentile(lat, 95)
	return row, nil
}

func poolerTable(r PoolerResult, o PoolerOptions) Table {
	t := Table{Title: "pgtenant bench pooler: one primary (max_connections 100) + streaming standby, PgBouncer 1.18 in front",
		Columns: []string{"method", "tps", "p50", "p95", "failed"}, Data: map[string]any{"result": r}}
	byName := map[string]PoolerRow{}
	for _, row := range r.Runs {
		t.Rows = append(t.Rows, []string{row.Method, fmt.Sprintf("%.0f", row.TPS), ms(row.P50), ms(row.P95), strconv.Itoa(row.Failed)})
		byName[row.Method] = row
	}
	// The targets of this machine (issue 28): the pooler, PostgreSQL and
	// pgbench share 2 cores, so the pooler's CPU is taken from the server.
	for _, m := range []struct {
		name string
		min  float64
	}{{"select-only", 0.7}, {"TPC-B-like", 0.8}} {
		dr, pr := byName[m.name+", direct"], byName[m.name+", pooler"]
		if dr.TPS > 0 {
			ratio := pr.TPS / dr.TPS
			t.Checks = append(t.Checks, Check{Target: fmt.Sprintf("%s through the pooler >= %.0f%% of direct throughput (%d busy clients)", m.name, 100*m.min, o.Busy),
				Got: fmt.Sprintf("%.0f%% of direct (%.0f vs %.0f tps); p95 %s vs %s", ratio*100, pr.TPS, dr.TPS, ms(pr.P95), ms(dr.P95)), Met: ratio >= m.min})
		}
	}
	t.Checks = append(t.Checks,
		Check{Target: fmt.Sprintf("%d creates in a burst cost <= 10 reloads", r.BurstCreates),
			Got: fmt.Sprintf("%d reloads in %s (%d creates at a time)", r.BurstReloads, r.BurstWall.Round(time.Millisecond), burstParallel), Met: r.BurstReloads <= 10},
		Check{Target: fmt.Sprintf("density: %d tenants x %d idle clients + %d busy, all connected and served, PostgreSQL backends <= %d", o.Tenants, o.Idle, o.Busy, r.MaxConns),
			Got: fmt.Sprintf("%d of %d idle clients served, %d busy transactions (%d failed), peak %d client backends", r.IdleClients,
				o.Tenants*o.Idle, r.BusyTxns, r.BusyFailed, r.PeakBackends),
			Met: r.IdleFailed == 0 && r.IdleClients == o.Tenants*o.Idle && r.BusyFailed == 0 && r.BusyTxns > 0 && r.PeakBackends <= r.MaxConns},
		Check{Target: "zero cross-tenant rows in the leak test", Got: fmt.Sprintf("%d transactions, %d rows of another tenant, %d as another role",
			r.LeakTxns, r.LeakForeign, r.LeakWrongRole), Met: r.LeakTxns > 0 && r.LeakForeign == 0 && r.LeakWrongRole == 0})
	t.Notes = []string{
		"pgbench runs with -M simple on both paths (PgBouncer 1.18 cannot carry protocol-level prepared statements in transaction mode), -c busy -j 2, on one database tenant of tier bench (transaction mode, pool_size = busy clients); p50/p95 from pgbench's per-transaction log.",
		"pooler: PgBouncer reaches the server through its Unix socket, as `up` configures it (pooler.server_socket_dir); pooler, TCP: the same pooler re-pointed at the server's loopback TCP port for that run.",
		"pooler, TLS: the same tenant through the same PgBouncer, with the DSN pgtenant hands out (sslmode=verify-full, a local CA's ECDSA P-256 certificate, client_tls_sslmode prefer); pgbench connects once per client, so the row measures encryption, not handshakes. The other pooler rows and the density and leak phases use sslmode=disable.",
		"the pooler, PostgreSQL (primary and standby), pgbench and pgtenant share the machine's cores.",
		"density: schema tenants of a one-table template, tier dense (transaction mode, pool_size 1); idle clients connect 8 at a time, about 40 tenants a second, each runs SELECT 1 and stays connected; server_idle_timeout 1 s; busy clients INSERT in a loop, one per tenant.",
		"peak client backends: pg_stat_activity sampled every 20 ms through the whole density and leak phases, the daemon's own sessions included.",
	}
	// TLS has no target yet: its cost is reported, not judged.
	for _, m := range []string{"select-only", "TPC-B-like"} {
		if pr, tr := byName[m+", pooler"], byName[m+", pooler, TCP"]; pr.TPS > 0 && tr.TPS > 0 {
			t.Notes = append(t.Notes, fmt.Sprintf("%s through the pooler, its server over the Unix socket against TCP: %.0f vs %.0f tps (%+.0f%%), p95 %s vs %s.",
				m, pr.TPS, tr.TPS, 100*(pr.TPS/tr.TPS-1), ms(pr.P95), ms(tr.P95)))
		}
		if pr, tr := byName[m+", pooler"], byName[m+", pooler, TLS"]; pr.TPS > 0 && tr.TPS > 0 {
			t.Notes = append(t.Notes, fmt.Sprintf("%s through the pooler over TLS: %.0f%% of its clear-text throughput (%.0f vs %.0f tps), p95 %s vs %s.",
				m, 100*tr.TPS/pr.TPS, tr.TPS, pr.TPS, ms(tr.P95), ms(pr.P95)))
		}
	}
	return t
}

// raiseOpenFiles lifts the soft open-file limit to the hard one: the
// density phase holds thousands of client connections in this process.
func raiseOpenFiles() {
	var l syscall.Rlimit
	if syscall.Getrlimit(syscall.RLIMIT_NOFILE, &l) == nil && l.Cur < l.Max {
		l.Cur = l.Max
		_ = syscall.Setrlimit(syscall.RLIMIT_NOFILE, &l)
	}
}
