package bench

import (
	"context"
	"fmt"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pgtenant/pgtenant/internal/api"
	"github.com/pgtenant/pgtenant/internal/config"
	"github.com/pgtenant/pgtenant/internal/daemon"
	"github.com/pgtenant/pgtenant/internal/jobs"
	"github.com/pgtenant/pgtenant/internal/patroni"
	"github.com/pgtenant/pgtenant/internal/provision"
	"github.com/pgtenant/pgtenant/internal/templates"
)

// Scenarios of bench failover.
const (
	ScenarioNodeLoss   = "node-loss"  // the leader's Patroni and PostgreSQL SIGKILLed together
	ScenarioCrash      = "crash"      // the leader's postmaster alone SIGKILLed
	ScenarioSwitchover = "switchover" // a planned switchover through pgtenant's API
)

// Replication modes of bench failover.
const (
	ModeSync  = "sync"
	ModeAsync = "async"
)

// FailoverOptions size bench failover.
type FailoverOptions struct {
	Tenants   int      // tenants on the Patroni cluster, each written through the pooler
	Clients   int      // paced writers per tenant
	Rate      int      // inserts per second of each writer
	Runs      int      // runs of each scenario in each mode
	Scenarios []string // of ScenarioNodeLoss, ScenarioCrash, ScenarioSwitchover, in that order
	Modes     []string // of ModeSync, ModeAsync, in that order
	// TPSClients unpaced clients insert for TPSDuration through the pooler
	// on one tenant, in each mode.
	TPSClients  int
	TPSDuration time.Duration
}

// FailoverRun is one run of a scenario.
type FailoverRun struct {
	Mode     string `json:"mode"`
	Scenario string `json:"scenario"`
	Run      int    `json:"run"`
	From     string `json:"from"` // the leader before
	To       string `json:"to"`   // the leader after
	// Resume is, per tenant, the time from the event (the kill, or the
	// switchover request) to its first write acknowledged by another
	// server than the leader's at the event (see resumeAfter).
	Resume []time.Duration `json:"resume_ns"`
	// Pause is the longest time a writer went without an acknowledged
	// write, from the event until the cluster was whole again.
	Pause     time.Duration `json:"longest_pause_ns"`
	Errors    int           `json:"client_errors"`     // failed connects and writes, over every writer
	Acked     int           `json:"acknowledged"`      // writes acknowledged over the same window
	Lost      int           `json:"acknowledged_lost"` // acknowledged writes missing from the new primary
	Recovered time.Duration `json:"recovered_ns"`      // until a leader, a streaming standby, followed, writing
	Job       time.Duration `json:"switchover_job_ns"` // the switchover job, queued to done
	JobSteps  string        `json:"switchover_steps"`  // its steps' times
	// Held is how long the switchover held the front door's clients, as
	// the job recorded it (its data's paused_ms); 0 when it did not.
	Held time.Duration `json:"switchover_held_ns"`
}

// FailoverSummary is a scenario in one mode, over its runs.
type FailoverSummary struct {
	Mode      string        `json:"mode"`
	Scenario  string        `json:"scenario"`
	Runs      int           `json:"runs"`
	Changed   int           `json:"leader_changes"` // runs whose leader changed
	ResumeP50 time.Duration `json:"resume_p50_ns"`  // over every tenant of every run
	ResumeMax time.Duration `json:"resume_max_ns"`
	Pause     time.Duration `json:"longest_pause_ns"`
	Errors    int           `json:"client_errors"`
	Acked     int           `json:"acknowledged"`
	Lost      int           `json:"acknowledged_lost"`
}

// FailoverResult is what bench failover measured.
type FailoverResult struct {
	Runs      []FailoverRun     `json:"runs"`
	Summaries []FailoverSummary `json:"summaries"`
	TPS       []TPSRun          `json:"tps"` // Name is the mode
	// Errors are the writers' errors outside the runs' windows (while
	// the mode changed or tps ran): none is expected.
	ErrorsOutside int `json:"client_errors_outside_runs"`
}

// failoverTemplate: writes holds the paced writers' ids, events the tps
// runs' inserts (insertLoop's table).
var failoverTemplate = []templates.Upload{{Name: "0001_init.sql", Body: `CREATE TABLE writes (client int NOT NULL, id bigint NOT NULL, PRIMARY KEY (client, id));
CREATE TABLE events (id bigserial PRIMARY KEY, client int NOT NULL, at timestamptz NOT NULL DEFAULT now(), note text);
`}}

// failoverPackages are the Debian packages of the programs bench failover runs.
var failoverPackages = map[string]string{"patroni": "patroni", "etcd": "etcd-server", "pgbouncer": "pgbouncer"}

// The bench's bounds. A run that exceeds one fails the bench: the cluster
// is not whole, and the next run would measure something else.
const (
	// failoverWriteTimeout bounds one insert: a client waiting longer
	// counts an error and reconnects (a switchover's pause queues writes
	// at the pooler, well within it).
	failoverWriteTimeout = 5 * time.Second
	// failoverConnectTimeout bounds a writer's connect (a dead node's
	// address may not answer at all).
	failoverConnectTimeout = 2 * time.Second
	// failoverSettle bounds each wait for the cluster to be whole again:
	// a rejoin runs pg_rewind and catches up on 2 shared cores.
	failoverSettle = 3 * time.Minute
)

// Failover runs bench failover: a catalog cluster with a daemon in
// process, a Patroni cluster (etcd and two nodes) registered with it as
// `cluster add --patroni` does, behind a PgBouncer the daemon runs, and
// Tenants tenants on it written through their pooler DSNs by paced
// writers. Then Runs runs of each scenario in each mode (synchronous
// first; the mode is changed through Patroni's PATCH /config, on the same
// cluster), each waited out until the cluster has a leader and a
// streaming standby again, the daemon has followed it and every tenant
// writes; and unpaced tps through the pooler in each mode.
func (e *Env) Failover(ctx context.Context, o FailoverOptions) (FailoverResult, Table, error) {
	var res FailoverResult
	var missing, packages []string
	for _, p := range []string{"patroni", "etcd", "pgbouncer"} {
		if _, err := exec.LookPath(p); err != nil {
			missing, packages = append(missing, p), append(packages, failoverPackages[p])
		}
	}
	if _, err := os.Stat(filepath.Join(patroni.DefaultBinDir, "postgres")); err != nil {
		missing, packages = append(missing, filepath.Join(patroni.DefaultBinDir, "postgres")), append(packages, "postgresql-15")
	}
	if len(missing) > 0 {
		return res, Table{}, fmt.Errorf("bench failover runs etcd, Patroni, PgBouncer and PostgreSQL 15: %s not found (apt-get install %s)",
			strings.Join(missing, ", "), strings.Join(packages, " "))
	}
	raiseOpenFiles()
	fc, stopFleet, err := e.fleetFor(ctx, "catalog", nil, true)
	if err != nil {
		return res, Table{}, err
	}
	defer stopFleet()

	b := &failoverBench{e: e, o: o, name: "patroni"}
	b.pdir = filepath.Join(e.Dir, "failover-patroni")
	defer func() {
		if !e.Keep {
			os.RemoveAll(b.pdir)
		}
	}()
	if err := b.startPatroni(ctx); err != nil {
		b.stopPatroni()
		return res, Table{}, err
	}
	// Nodes and etcd stop after the daemon (defers run last first): its
	// PgBouncer and pools are closed before their servers go.
	defer b.stopPatroni()
	leader, _, err := b.waitWhole(ctx, ModeSync)
	if err != nil {
		return res, Table{}, err
	}

	dir, removeDir, err := e.daemonDir("failover-daemon")
	if err != nil {
		return res, Table{}, err
	}
	defer removeDir()
	cfg := benchConfig(fc, dir)
	// A transaction-mode tier: a switchover's PAUSE waits for the
	// transactions in flight, not for the clients to disconnect. One
	// tenant also takes the tps run's clients.
	size := o.Clients + o.TPSClients
	cfg.Tiers["bench"] = config.Tier{ConnectionLimit: 2*size + 4, StatementTimeout: config.Duration(time.Minute),
		PoolMode: "transaction", PoolSize: size, MaxDBConnections: size}

	// The cluster is registered as `cluster add --patroni` does, by a
	// first daemon; the daemon the bench uses starts again with a
	// pooler for it (pooler blocks are read at start).
	d, err := e.startDaemonInProcess(ctx, fc, cfg)
	if err != nil {
		return res, Table{}, err
	}
	// The DSN's host and port are nobody's: the leader's replace them.
	dsn := fmt.Sprintf("host=192.0.2.1 port=1 user=%s password=%s dbname=postgres sslmode=disable connect_timeout=2",
		patroni.SuperuserName, b.cluster.Passwords.Superuser)
	added, err := d.client.AddCluster(ctx, api.AddClusterRequest{Name: b.name, DSN: dsn, Patroni: b.cluster.URLs})
	if stopErr := d.Stop(); err == nil {
		err = stopErr
	}
	if err != nil {
		return res, Table{}, fmt.Errorf("cluster add %s --patroni: %w", b.name, err)
	}
	e.logf("failover: registered %s (%s, leader %s at port %d)", b.name, added.Status, leader.Name, leader.Port)
	pdir, removePooler, err := e.daemonDir("failover-pgbouncer")
	if err != nil {
		return res, Table{}, err
	}
	defer removePooler()
	pc, err := benchPooler(pdir)
	if err != nil {
		return res, Table{}, err
	}
	if d, err = e.startDaemonInProcess(ctx, fc, cfg, func(do *daemon.Options) {
		do.Poolers = map[string]config.PoolerConfig{b.name: pc}
	}); err != nil {
		return res, Table{}, err
	}
	defer d.Stop()
	b.d = d
	if err := d.createTemplate(ctx, "failover", failoverTemplate); err != nil {
		return res, Table{}, err
	}
	for i := range o.Tenants {
		r, err := d.client.CreateTenant(ctx, provision.Request{Template: "failover", Tier: "bench", Cluster: b.name})
		if err != nil {
			return res, Table{}, fmt.Errorf("create tenant %d: %w", i, err)
		}
		if r.Job != nil {
			if j, err := d.waitJob(ctx, r.Job.ID); err != nil || j.State != jobs.Succeeded {
				return res, Table{}, fmt.Errorf("create tenant %d: %v %s %s", i, err, j.State, j.LastError)
			}
		}
		b.tenants = append(b.tenants, r)
	}
	e.logf("failover: %d tenants on %s behind PgBouncer %s; %s each at %d inserts/s", o.Tenants, b.name, pc.Listen, plural(o.Clients, "writer"), o.Rate)

	wctx, stopWrites := context.WithCancel(ctx)
	var wg sync.WaitGroup
	defer func() { stopWrites(); wg.Wait() }()
	for t := range b.tenants {
		for c := range o.Clients {
			w := &failoverWriter{tenant: t, client: c, dsn: b.tenants[t].DSN}
			b.writers = append(b.writers, w)
			wg.Go(func() { w.run(wctx, time.Second/time.Duration(max(o.Rate, 1))) })
		}
	}
	if err := b.waitWrites(ctx, time.Now(), leader.Port); err != nil {
		return res, Table{}, err
	}

	mode := ModeSync
	var windows [][2]time.Time
	for i, m := range o.Modes {
		if m != mode {
			if err := b.setMode(ctx, m); err != nil {
				return res, Table{}, err
			}
			mode = m
		}
		tps := func() error {
			r, err := b.tps(ctx, m)
			if err == nil {
				res.TPS = append(res.TPS, r)
			}
			return err
		}
		// The two tps runs are next to each other: synchronous last
		// after its runs, asynchronous first before its own.
		if i > 0 {
			if err := tps(); err != nil {
				return res, Table{}, err
			}
		}
		for _, s := range o.Scenarios {
			for n := 1; n <= o.Runs; n++ {
				r, from, to, err := b.run(ctx, m, s, n)
				if err != nil {
					return res, Table{}, fmt.Errorf("%s, %s mode, run %d: %w", s, m, n, err)
				}
				windows = append(windows, [2]time.Time{from, to})
				res.Runs = append(res.Runs, r)
			}
		}
		if i == 0 {
			if err := tps(); err != nil {
				return res, Table{}, err
			}
		}
	}
	for _, w := range b.writers {
		res.ErrorsOutside += w.errorsOutside(windows)
	}
	res.Summaries = summarizeFailover(res.Runs)
	return res, failoverTable(res, o), nil
}

// failoverBench is one bench failover: the Patroni cluster, the daemon,
// the tenants and their writers.
type failoverBench struct {
	e       *Env
	o       FailoverOptions
	name    string // the cluster's name in pgtenant and Patroni's scope
	pdir    string
	etcd    *patroni.Etcd
	cluster *patroni.Cluster
	patroni *patroni.Client
	d       *benchDaemon
	tenants []api.CreateTenantResponse
	writers []*failoverWriter
	// missing are the acknowledged writes already found missing, by
	// writer: each run counts only those it lost.
	missing map[*failoverWriter]map[int64]bool
}

// startPatroni starts a one-member etcd and two Patroni nodes (the first
// bootstraps before the second makes its standby), as `up` does.
func (b *failoverBench) startPatroni(ctx context.Context) error {
	if err := os.MkdirAll(b.pdir, 0o755); err != nil {
		return err
	}
	var err error
	b.etcd, err = patroni.StartEtcd(ctx, patroni.EtcdOptions{Dir: filepath.Join(b.pdir, "etcd"), Logger: b.e.Logger})
	if err != nil {
		return err
	}
	settings := patroni.DefaultSettings()
	// The daemon's pools and PgBouncer want more connections than
	// Patroni's small default; fsync off as in every bench fleet (the
	// bench kills processes, never the machine).
	settings.Parameters = map[string]string{"shared_buffers": "64MB", "max_connections": "100", "fsync": "off"}
	if b.cluster, err = patroni.NewCluster(patroni.ClusterOptions{Scope: b.name, Dir: b.pdir, Nodes: 2,
		Etcd: []string{b.etcd.Endpoint()}, Settings: settings, Logger: b.e.Logger}); err != nil {
		return err
	}
	b.patroni = b.cluster.Client
	b.e.logf("failover: starting etcd and Patroni nodes n1, n2 (PostgreSQL 15, synchronous_mode on) in %s", b.pdir)
	return b.cluster.Start(ctx)
}

// stopPatroni stops the nodes, then etcd: a Patroni without its store
// would demote and retry until killed.
func (b *failoverBench) stopPatroni() {
	ctx, cancel := context.WithTimeout(context.Background(), 45*time.Second)
	defer cancel()
	if b.cluster != nil {
		_ = b.cluster.Stop(ctx)
	}
	if b.etcd != nil {
		_ = b.etcd.Stop(ctx)
	}
}

func (b *failoverBench) node(name string) (*patroni.Node, error) {
	if n := b.cluster.Node(name); n != nil {
		return n, nil
	}
	return nil, fmt.Errorf("patroni names a member %q the bench did not start", name)
}

func (b *failoverBench) nodeDSN(port int) string { return b.cluster.DSN(port, "postgres") }

// waitWhole waits until the cluster has a running leader and a running
// standby that streams from it less than 1 MiB behind, synchronous in
// mode sync and asynchronous in mode async (patroni.Cluster.WaitStandby).
func (b *failoverBench) waitWhole(ctx context.Context, mode string) (leader, standby patroni.Member, err error) {
	wctx, cancel := context.WithTimeout(ctx, failoverSettle)
	defer cancel()
	return b.cluster.WaitStandby(wctx, "", mode == ModeSync)
}

// waitFollowed waits until the daemon connects to the leader at port.
func (b *failoverBench) waitFollowed(ctx context.Context, port int) error {
	var last string
	err := waitUntil(ctx, failoverSettle, func() bool {
		c, err := b.d.client.Cluster(ctx, b.name)
		if err != nil {
			last = err.Error()
			return false
		}
		last = c.DSN
		return strings.Contains(c.DSN, fmt.Sprintf("port=%d", port)) || strings.Contains(c.DSN, fmt.Sprintf(":%d/", port))
	})
	if err != nil {
		return fmt.Errorf("wait for the daemon to follow the leader at port %d: %w; last: %s", port, err, last)
	}
	return nil
}

// waitWrites waits until every tenant has a write sent after since and
// acknowledged by the server at port.
func (b *failoverBench) waitWrites(ctx context.Context, since time.Time, port int) error {
	var waiting []int
	err := waitUntil(ctx, failoverSettle, func() bool {
		waiting = waiting[:0]
		for t := range b.tenants {
			ok := false
			for _, w := range b.writers {
				if w.tenant == t && w.ackedSince(since, port) {
					ok = true
					break
				}
			}
			if !ok {
				waiting = append(waiting, t)
			}
		}
		return len(waiting) == 0
	})
	if err != nil {
		return fmt.Errorf("wait for writes through the pooler on port %d: %w; tenants without one: %v", port, err, waiting)
	}
	return nil
}

// setMode turns synchronous_mode on or off through Patroni's PATCH
// /config (the dynamic configuration in the store, applied by each node
// at its next loop), then waits for the standby to stream in that mode.
func (b *failoverBench) setMode(ctx context.Context, mode string) error {
	if err := b.patroni.SetSynchronousMode(ctx, mode == ModeSync); err != nil {
		return err
	}
	b.e.logf("failover: synchronous_mode %v; waiting for the standby to stream in %s mode", mode == ModeSync, mode)
	_, _, err := b.waitWhole(ctx, mode)
	return err
}

// tps runs the unpaced inserts through the pooler on the first tenant.
func (b *failoverBench) tps(ctx context.Context, mode string) (TPSRun, error) {
	dsn, err := withParams(b.tenants[0].DSN, map[string]string{"default_query_exec_mode": "simple_protocol"})
	if err != nil {
		return TPSRun{}, err
	}
	r, err := insertLoop(ctx, dsn, b.o.TPSClients, b.o.TPSDuration, nil)
	if err != nil {
		return TPSRun{}, fmt.Errorf("tps (%s mode): %w", mode, err)
	}
	r.Name = mode
	b.e.logf("failover: tps in %s mode: %.0f (%d in %s)", mode, r.TPS, r.Txns, r.Duration.Round(time.Millisecond))
	return r, nil
}

// run is one run of scenario in mode: the event, then the wait until the
// cluster is whole again (the old leader back as a standby), the daemon
// has followed its leader and every tenant writes; then what the writers
// saw, and the acknowledged writes missing from the new primary.
func (b *failoverBench) run(ctx context.Context, mode, scenario string, n int) (r FailoverRun, from, to time.Time, err error) {
	r = FailoverRun{Mode: mode, Scenario: scenario, Run: n}
	leader, _, err := b.waitWhole(ctx, mode)
	if err != nil {
		return r, from, to, err
	}
	r.From = leader.Name
	old, err := b.node(leader.Name)
	if err != nil {
		return r, from, to, err
	}
	// The server the writers reach before the event: a write it still
	// acknowledges after the kill (a dying backend's) is no resumption.
	var was server
	if err := queryRow(ctx, b.nodeDSN(leader.Port), `SELECT current_setting('port')::int, pg_postmaster_start_time()`, &was.port, &was.started); err != nil {
		return r, from, to, err
	}
	// A second of writes before the event: a writer that is still
	// reconnecting from the last run would be counted in this one.
	if err := sleepCtx(ctx, time.Second); err != nil {
		return r, from, to, err
	}
	from = time.Now()
	switch scenario {
	case ScenarioNodeLoss:
		old.Kill()
		b.e.logf("failover: %s mode, run %d: killed %s (leader, timeline %d): patroni and postgres", mode, n, leader.Name, leader.Timeline)
		// The old node comes back once another leads: started before its
		// lock expired, it could take the leadership back.
		var last string
		if err := waitUntil(ctx, failoverSettle, func() bool {
			l, err := b.patroni.Leader(ctx)
			last = fmt.Sprint(l.Name, err)
			return err == nil && l.Name != leader.Name
		}); err != nil {
			return r, from, to, fmt.Errorf("wait for a new leader: %w; last: %s", err, last)
		}
		nl, err := b.patroni.Leader(ctx)
		if err != nil {
			return r, from, to, err
		}
		if err := b.waitWrites(ctx, from, nl.Port); err != nil {
			return r, from, to, err
		}
		if err := old.Start(ctx); err != nil {
			return r, from, to, err
		}
	case ScenarioCrash:
		pid := old.PostmasterPID()
		if pid == 0 {
			return r, from, to, fmt.Errorf("%s: no postmaster runs", leader.Name)
		}
		if err := syscall.Kill(pid, syscall.SIGKILL); err != nil {
			return r, from, to, fmt.Errorf("kill postmaster %d of %s: %w", pid, leader.Name, err)
		}
		b.e.logf("failover: %s mode, run %d: killed %s's postmaster (pid %d)", mode, n, leader.Name, pid)
	case ScenarioSwitchover:
		j, err := b.d.client.Switchover(ctx, b.name, api.SwitchoverRequest{})
		if err != nil {
			return r, from, to, fmt.Errorf("switchover: %w", err)
		}
		b.e.logf("failover: %s mode, run %d: switchover of %s (job %d)", mode, n, b.name, j.ID)
		if j, err = b.d.waitJob(ctx, j.ID); err != nil || j.State != jobs.Succeeded {
			return r, from, to, fmt.Errorf("switchover job %d: %v %s %s", j.ID, err, j.State, j.LastError)
		}
		r.Job, r.JobSteps = time.Since(from), stepTimes(j)
		var held int64
		if err := b.d.catalog.QueryRow(ctx, `SELECT coalesce((data->>'paused_ms')::bigint, 0) FROM jobs WHERE id = $1`, j.ID).Scan(&held); err == nil {
			r.Held = time.Duration(held) * time.Millisecond
		}
	default:
		return r, from, to, fmt.Errorf("unknown scenario %q", scenario)
	}

	nl, _, err := b.waitWhole(ctx, mode)
	if err != nil {
		return r, from, to, err
	}
	r.To = nl.Name
	if err := b.waitFollowed(ctx, nl.Port); err != nil {
		return r, from, to, err
	}
	if err := b.waitWrites(ctx, time.Now(), nl.Port); err != nil {
		return r, from, to, err
	}
	to = time.Now()
	r.Recovered = to.Sub(from)

	r.Resume = make([]time.Duration, len(b.tenants))
	for t := range b.tenants {
		first := time.Duration(-1)
		for _, w := range b.writers {
			if w.tenant != t {
				continue
			}
			acks, _ := w.snapshot()
			if d, ok := resumeAfter(acks, from, was); ok && (first < 0 || d < first) {
				first = d
			}
		}
		// waitWrites saw one: a tenant without one is a bug here.
		r.Resume[t] = max(first, 0)
	}
	for _, w := range b.writers {
		acks, errs := w.snapshot()
		var done []time.Time
		for _, a := range acks {
			done = append(done, a.at)
			if !a.at.Before(from) && !a.at.After(to) {
				r.Acked++
			}
		}
		r.Pause = max(r.Pause, maxGap(done, from, to))
		for _, e := range errs {
			if !e.Before(from) && !e.After(to) {
				r.Errors++
			}
		}
	}
	if r.Lost, err = b.lost(ctx, nl.Port); err != nil {
		return r, from, to, err
	}
	sort.Slice(r.Resume, func(i, j int) bool { return r.Resume[i] < r.Resume[j] })
	b.e.logf("failover: %s mode, run %d: %s → %s, writes resumed after %s (slowest tenant), longest pause %s, %d errors, %d acknowledged writes lost; whole again after %s",
		mode, n, r.From, r.To, r.Resume[len(r.Resume)-1].Round(10*time.Millisecond), r.Pause.Round(10*time.Millisecond), r.Errors, r.Lost, r.Recovered.Round(100*time.Millisecond))
	return r, from, to, nil
}

// lost counts the acknowledged writes missing from the tenants' tables on
// the primary at port, read directly, not through the pooler; a write
// found missing by an earlier run is not counted again.
func (b *failoverBench) lost(ctx context.Context, port int) (int, error) {
	if b.missing == nil {
		b.missing = map[*failoverWriter]map[int64]bool{}
	}
	n := 0
	for t, tn := range b.tenants {
		cfg, err := pgx.ParseConfig(tn.DirectDSN)
		if err != nil {
			return 0, fmt.Errorf("tenant %s's direct DSN: %w", tn.Tenant.ID, err)
		}
		cfg.Host, cfg.Port, cfg.Fallbacks = "127.0.0.1", uint16(port), nil
		cfg.DefaultQueryExecMode = pgx.QueryExecModeSimpleProtocol
		// Writes acknowledged before the query started are in its snapshot.
		cutoff := time.Now()
		conn, err := pgx.ConnectConfig(ctx, cfg)
		if err != nil {
			return 0, fmt.Errorf("connect to tenant %s on port %d: %w", tn.Tenant.ID, port, err)
		}
		found := map[[2]int64]bool{}
		rows, err := conn.Query(ctx, `SELECT client, id FROM writes`)
		if err == nil {
			for rows.Next() {
				var c, id int64
				if err = rows.Scan(&c, &id); err != nil {
					break
				}
				found[[2]int64{c, id}] = true
			}
			rows.Close()
			if err == nil {
				err = rows.Err()
			}
		}
		conn.Close(context.Background())
		if err != nil {
			return 0, fmt.Errorf("read tenant %s's writes: %w", tn.Tenant.ID, err)
		}
		for _, w := range b.writers {
			if w.tenant != t {
				continue
			}
			if b.missing[w] == nil {
				b.missing[w] = map[int64]bool{}
			}
			acks, _ := w.snapshot()
			for _, a := range acks {
				if a.at.Before(cutoff) && !found[[2]int64{int64(w.client), a.id}] && !b.missing[w][a.id] {
					b.missing[w][a.id] = true
					n++
				}
			}
		}
	}
	return n, nil
}

// server is one run of a PostgreSQL server: a restart in place is
// another, a promoted standby is another by its port.
type server struct {
	port    int       // current_setting('port'): the same over TCP and a Unix socket
	started time.Time // pg_postmaster_start_time()
}

// failoverAck is one acknowledged insert of a writer.
type failoverAck struct {
	id    int64
	by    server    // the server that took it
	start time.Time // sent
	at    time.Time // acknowledged
}

// failoverWriter inserts ids one by one through a tenant's DSN, paced,
// reconnecting after any error, and records the acknowledged ones and the
// errors. An id whose outcome is unknown (an error) is never sent again,
// so that an acknowledged id missing is the cluster's doing.
type failoverWriter struct {
	tenant, client int
	dsn            string

	mu   sync.Mutex
	acks []failoverAck
	errs []time.Time
}

func (w *failoverWriter) run(ctx context.Context, pace time.Duration) {
	cfg, err := pgx.ParseConfig(w.dsn)
	if err != nil {
		w.failed()
		return
	}
	// Behind a transaction pool, PgBouncer 1.18 cannot carry named
	// prepared statements.
	cfg.DefaultQueryExecMode = pgx.QueryExecModeSimpleProtocol
	cfg.ConnectTimeout = failoverConnectTimeout
	var conn *pgx.Conn
	defer func() {
		if conn != nil {
			conn.Close(context.Background())
		}
	}()
	tick := time.NewTicker(pace)
	defer tick.Stop()
	for id := int64(1); ; id++ {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
		start := time.Now()
		if conn == nil {
			if conn, err = pgx.ConnectConfig(ctx, cfg); err != nil {
				conn = nil
				if ctx.Err() != nil {
					return
				}
				w.failed()
				continue
			}
		}
		ectx, cancel := context.WithTimeout(ctx, failoverWriteTimeout)
		var by server
		err := conn.QueryRow(ectx, `INSERT INTO writes (client, id) VALUES ($1, $2) RETURNING current_setting('port')::int, pg_postmaster_start_time()`,
			w.client, id).Scan(&by.port, &by.started)
		cancel()
		if ctx.Err() != nil {
			return
		}
		if err != nil {
			w.failed()
			conn.Close(context.Background())
			conn = nil
			continue
		}
		w.mu.Lock()
		w.acks = append(w.acks, failoverAck{id: id, by: by, start: start, at: time.Now()})
		w.mu.Unlock()
	}
}

func (w *failoverWriter) failed() {
	w.mu.Lock()
	w.errs = append(w.errs, time.Now())
	w.mu.Unlock()
}

func (w *failoverWriter) snapshot() ([]failoverAck, []time.Time) {
	w.mu.Lock()
	defer w.mu.Unlock()
	return append([]failoverAck(nil), w.acks...), append([]time.Time(nil), w.errs...)
}

// ackedSince reports whether a write sent after since was acknowledged by
// the server at port.
func (w *failoverWriter) ackedSince(since time.Time, port int) bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	for i := len(w.acks) - 1; i >= 0 && !w.acks[i].start.Before(since); i-- {
		if w.acks[i].by.port == port {
			return true
		}
	}
	return false
}

// errorsOutside counts the writer's errors outside every window.
func (w *failoverWriter) errorsOutside(windows [][2]time.Time) int {
	_, errs := w.snapshot()
	n := 0
	for _, e := range errs {
		in := false
		for _, win := range windows {
			if !e.Before(win[0]) && !e.After(win[1]) {
				in = true
				break
			}
		}
		if !in {
			n++
		}
	}
	return n
}

// resumeAfter is the time from the event at from to a writer's first write
// sent after from and acknowledged by another server than was, the leader
// at the event: a promoted standby, or the same node's PostgreSQL
// restarted. A write that a dying server still acknowledged, or one the
// old leader took before a switchover's pause, does not count. False when
// there is none.
func resumeAfter(acks []failoverAck, from time.Time, was server) (time.Duration, bool) {
	for _, a := range acks {
		if !a.start.Before(from) && (a.by.port != was.port || !a.by.started.Equal(was.started)) {
			return a.at.Sub(from), true
		}
	}
	return 0, false
}

// summarizeFailover folds the runs by mode and scenario, in the runs'
// order: resume p50 and max over every tenant of every run, the longest
// pause, and sums.
func summarizeFailover(runs []FailoverRun) []FailoverSummary {
	var out []FailoverSummary
	idx := map[[2]string]int{}
	resumes := map[[2]string][]time.Duration{}
	for _, r := range runs {
		k := [2]string{r.Mode, r.Scenario}
		i, ok := idx[k]
		if !ok {
			i = len(out)
			idx[k] = i
			out = append(out, FailoverSummary{Mode: r.Mode, Scenario: r.Scenario})
		}
		s := &out[i]
		s.Runs++
		if r.From != r.To {
			s.Changed++
		}
		s.Pause = max(s.Pause, r.Pause)
		s.Errors += r.Errors
		s.Acked += r.Acked
		s.Lost += r.Lost
		resumes[k] = append(resumes[k], r.Resume...)
	}
	for i := range out {
		rs := resumes[[2]string{out[i].Mode, out[i].Scenario}]
		out[i].ResumeP50 = percentile(rs, 50)
		out[i].ResumeMax = percentile(rs, 100)
	}
	return out
}

// withParams sets query parameters of a URL DSN, or appends key=value
// pairs to a keyword/value one.
func withParams(dsn string, params map[string]string) (string, error) {
	if strings.Contains(dsn, "://") {
		u, err := url.Parse(dsn)
		if err != nil {
			return "", fmt.Errorf("parse DSN: %w", err)
		}
		q := u.Query()
		for k, v := range params {
			q.Set(k, v)
		}
		u.RawQuery = q.Encode()
		return u.String(), nil
	}
	for k, v := range params {
		dsn += " " + k + "=" + v
	}
	return dsn, nil
}

// plural is "1 run", "3 runs".
func plural(n int, noun string) string {
	if n == 1 {
		return "1 " + noun
	}
	return strconv.Itoa(n) + " " + noun + "s"
}

// waitUntil polls cond every 200 ms for up to bound.
func waitUntil(ctx context.Context, bound time.Duration, cond func() bool) error {
	deadline := time.Now().Add(bound)
	for !cond() {
		if time.Now().After(deadline) {
			return fmt.Errorf("not within %s", bound)
		}
		if err := sleepCtx(ctx, 200*time.Millisecond); err != nil {
			return err
		}
	}
	return nil
}

var scenarioNames = map[string]string{
	ScenarioNodeLoss:   "(a) node loss",
	ScenarioCrash:      "(b) postgres crash",
	ScenarioSwitchover: "(c) switchover",
}

var modeNames = map[string]string{ModeSync: "synchronous", ModeAsync: "asynchronous"}

func failoverTable(res FailoverResult, o FailoverOptions) Table {
	t := Table{Title: fmt.Sprintf("bench failover: Patroni (etcd + 2 nodes, ttl 20 s, loop_wait 2 s, retry_timeout 5 s) behind pgtenant's PgBouncer, %s, %s each at %d inserts/s through the pooler, %s of each scenario per mode",
		plural(o.Tenants, "tenant"), plural(o.Clients, "writer"), o.Rate, plural(o.Runs, "run")),
		Columns: []string{"scenario", "mode", "runs", "leader changed", "resume p50", "resume max", "longest pause", "errors", "acked lost"},
		Data:    map[string]any{"result": res, "options": o}}
	sec := func(d time.Duration) string { return d.Round(10 * time.Millisecond).String() }
	for _, s := range res.Summaries {
		t.Rows = append(t.Rows, []string{scenarioNames[s.Scenario], modeNames[s.Mode], strconv.Itoa(s.Runs), fmt.Sprintf("%d of %d", s.Changed, s.Runs),
			sec(s.ResumeP50), sec(s.ResumeMax), sec(s.Pause), strconv.Itoa(s.Errors), fmt.Sprintf("%d of %d", s.Lost, s.Acked)})
	}
	var tpsSync, tpsAsync float64
	for _, r := range res.TPS {
		if r.Name == ModeSync {
			tpsSync = r.TPS
		} else {
			tpsAsync = r.TPS
		}
		t.Notes = append(t.Notes, fmt.Sprintf("tps in %s mode: %.0f (%d in %s; %d unpaced clients of single-row inserts through the pooler on one tenant, the writers running)",
			modeNames[r.Name], r.TPS, r.Txns, sec(r.Duration), o.TPSClients))
	}
	for _, r := range res.Runs {
		if r.Scenario == ScenarioSwitchover {
			t.Notes = append(t.Notes, fmt.Sprintf("switchover, %s, run %d: job %s (%s), front door held %s (as the job recorded it), clients' longest pause %s",
				modeNames[r.Mode], r.Run, sec(r.Job), r.JobSteps, ms(r.Held), sec(r.Pause)))
		}
	}
	t.Notes = append(t.Notes,
		"resume: from the kill (or the switchover request) to a tenant's first write sent after it and acknowledged by another server than the leader at the event (a promoted standby, or its PostgreSQL restarted); p50 and max over every tenant of every run",
		"longest pause: the longest time a writer went without an acknowledged write, from the event until the cluster was whole again (a leader, a streaming standby, the daemon following, every tenant writing)",
		fmt.Sprintf("errors: failed connects (timeout %s) and writes (timeout %s) of every writer during the runs, one per attempt at the writers' pace (a writer tries again at its next tick); %d outside the runs", failoverConnectTimeout, failoverWriteTimeout, res.ErrorsOutside),
		"acked lost: acknowledged writes missing from the new primary (read directly, after each run) of those acknowledged during the runs",
	)
	worst := func(scenario, mode string) (FailoverSummary, bool) {
		var w FailoverSummary
		found := false
		for _, s := range res.Summaries {
			if s.Scenario == scenario && (mode == "" || s.Mode == mode) {
				if !found || s.ResumeMax > w.ResumeMax {
					w.ResumeMax = s.ResumeMax
				}
				w.Pause = max(w.Pause, s.Pause)
				w.Errors += s.Errors
				w.Lost += s.Lost
				w.Acked += s.Acked
				found = true
			}
		}
		return w, found
	}
	if s, ok := worst(ScenarioNodeLoss, ""); ok {
		t.Checks = append(t.Checks, Check{Target: "writes resume <= 30 s after a node loss", Got: sec(s.ResumeMax) + " max", Met: s.ResumeMax <= 30*time.Second})
	}
	if s, ok := worst(ScenarioCrash, ""); ok {
		t.Checks = append(t.Checks, Check{Target: "writes resume <= 10 s after a postgres crash", Got: sec(s.ResumeMax) + " max", Met: s.ResumeMax <= 10*time.Second})
	}
	if s, ok := worst(ScenarioSwitchover, ""); ok {
		t.Checks = append(t.Checks, Check{Target: "a switchover pauses clients <= 2 s with 0 errors", Got: fmt.Sprintf("longest pause %s, %d errors", sec(s.Pause), s.Errors),
			Met: s.Pause <= 2*time.Second && s.Errors == 0})
	}
	var syncLost, syncAcked int
	haveSync := false
	for _, s := range res.Summaries {
		if s.Mode == ModeSync {
			syncLost += s.Lost
			syncAcked += s.Acked
			haveSync = true
		}
	}
	if haveSync {
		t.Checks = append(t.Checks, Check{Target: "0 acknowledged writes lost in synchronous mode", Got: fmt.Sprintf("%d of %d", syncLost, syncAcked), Met: syncLost == 0})
	}
	if tpsSync > 0 && tpsAsync > 0 {
		cost := tpsCost(tpsSync, tpsAsync)
		t.Checks = append(t.Checks, Check{Target: "synchronous mode costs <= 25 % of tps", Got: fmt.Sprintf("%.1f %% (%.0f vs %.0f tps)", 100*cost, tpsSync, tpsAsync), Met: cost <= 0.25})
	}
	return t
}
