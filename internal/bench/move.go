package bench

import (
	"context"
	"fmt"
	"math/rand/v2"
	"net/url"
	"path/filepath"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pgtenant/pgtenant/internal/catalog"
	"github.com/pgtenant/pgtenant/internal/config"
	"github.com/pgtenant/pgtenant/internal/daemon"
	"github.com/pgtenant/pgtenant/internal/fleet"
	"github.com/pgtenant/pgtenant/internal/jobs"
	"github.com/pgtenant/pgtenant/internal/provision"
	"github.com/pgtenant/pgtenant/internal/templates"
	"github.com/pgtenant/pgtenant/internal/tenant"
)

// MoveOptions size bench move.
type MoveOptions struct {
	SizeMB  int // the tenant's data before the first move
	Clients int // writing clients through the pooler
	Moves   int // moves, back and forth between the two clusters
}

// MoveRow is one move.
type MoveRow struct {
	From        string        `json:"from"`
	To          string        `json:"to"`
	Copy        time.Duration `json:"copy"`         // the initial copy (the copy step)
	Total       time.Duration `json:"total"`        // the job, queued to done
	PauseServer time.Duration `json:"pause_server"` // the move_pause event: PAUSE to RESUME
	// PauseClient is the longest a client transaction took during the
	// move: from its first queued query to its answer.
	PauseClient time.Duration `json:"pause_client"`
	Bytes       int64         `json:"bytes"`  // the tenant's database on the source
	Phases      string        `json:"phases"` // the pause's phases (ms), from the move_pause event
}

// MoveResult is what bench move measured.
type MoveResult struct {
	Moves         []MoveRow `json:"moves"`
	Transactions  int64     `json:"transactions"`
	Failed        int64     `json:"failed_transactions"`
	RowsAcked     int64     `json:"rows_acknowledged"`
	RowsFound     int64     `json:"rows_found"`
	RowsDistinct  int64     `json:"rows_distinct"`
	PeakLagSource int64     `json:"peak_standby_lag_bytes_a"`
	PeakLagTarget int64     `json:"peak_standby_lag_bytes_b"`
}

var moveTemplate = []templates.Upload{{Name: "0001_init.sql", Body: `CREATE TABLE accounts (id bigint PRIMARY KEY, balance bigint NOT NULL DEFAULT 0, filler text NOT NULL);
CREATE TABLE history (id bigserial PRIMARY KEY, client int NOT NULL, seq bigint NOT NULL, account bigint NOT NULL, delta int NOT NULL, at timestamptz NOT NULL DEFAULT now(), UNIQUE (client, seq));
`}}

// Move runs bench move: a database tenant of SizeMB, written by Clients
// pgbench-like clients through its pooler DSN, moved Moves times between
// two clusters (a primary and a standby each); the copy, the pause as the
// server and the clients saw it, failed transactions, rows lost or
// doubled, and the peak standby lag on both clusters.
func (e *Env) Move(ctx context.Context, o MoveOptions) (MoveResult, Table, error) {
	var res MoveResult
	a, stopA, err := e.fleetFor(ctx, "move-a", nil, true)
	if err != nil {
		return res, Table{}, err
	}
	defer stopA()
	b, stopB, err := e.fleetFor(ctx, "move-b", nil, true)
	if err != nil {
		return res, Table{}, err
	}
	defer stopB()
	dir, removeDir, err := e.daemonDir("move-daemon")
	if err != nil {
		return res, Table{}, err
	}
	defer removeDir()
	poolers := map[string]config.PoolerConfig{}
	for _, fc := range []*fleet.Cluster{a, b} {
		if poolers[fc.Name()], err = benchPooler(filepath.Join(e.Dir, fc.Name(), "pgbouncer")); err != nil {
			return res, Table{}, err
		}
	}
	cfg := benchConfig(a, dir)
	cfg.Drop.Retention = config.Duration(time.Second)
	cfg.Drop.CheckInterval = config.Duration(time.Second)
	cfg.Tiers["bench"] = config.Tier{ConnectionLimit: 4 * o.Clients, StatementTimeout: config.Duration(time.Minute),
		PoolMode: "transaction", PoolSize: o.Clients, MaxDBConnections: o.Clients}
	d, err := e.startDaemonInProcess(ctx, a, cfg, func(do *daemon.Options) {
		do.Poolers = poolers
		m := catalog.Cluster{Name: b.Name(), DSN: b.PrimaryDSN("postgres")}
		for _, s := range b.Standbys() {
			m.StandbyDSNs = append(m.StandbyDSNs, b.DSN(s, "postgres"))
		}
		do.Managed = append(do.Managed, m)
	})
	if err != nil {
		return res, Table{}, err
	}
	defer d.Stop()
	if err := d.createTemplate(ctx, "ledger", moveTemplate); err != nil {
		return res, Table{}, err
	}
	r, err := d.client.CreateTenant(ctx, provision.Request{Template: "ledger", Mode: tenant.ModeDatabase, Tier: "bench", Cluster: a.Name()})
	if err != nil {
		return res, Table{}, err
	}
	id := r.Tenant.ID
	rows := int64(o.SizeMB) * (1 << 20) / 600
	e.logf("move: loading %d MB (%d accounts) into tenant %s on %s", o.SizeMB, rows, id, a.Name())
	load, err := pgx.Connect(ctx, r.DirectDSN)
	if err != nil {
		return res, Table{}, err
	}
	for from := int64(1); from <= rows; from += 100000 {
		if _, err := load.Exec(ctx, `INSERT INTO accounts (id, filler) SELECT i, repeat('x', 500) FROM generate_series($1::bigint, $2::bigint) i`,
			from, min(from+99999, rows)); err != nil {
			load.Close(ctx)
			return res, Table{}, err
		}
	}
	load.Close(ctx)
	// The load's WAL replayed on move-a's standby first: the lag sampled
	// from here on is the moves'.
	for {
		lag, err := standbyLag(ctx, a)
		if err != nil || lag < 1<<20 {
			break
		}
		time.Sleep(200 * time.Millisecond)
	}

	// The clients: TPC-B-like transactions through the pooler DSN, each
	// acknowledged one counted, each one's latency kept with its start.
	type sample struct {
		start time.Time
		took  time.Duration
	}
	var mu sync.Mutex
	var samples []sample
	var txns, failed, acked atomic.Int64
	// Clients stop between transactions (a cancelled one could commit
	// unacknowledged); the sampler stops with lctx.
	var stopping atomic.Bool
	lctx, cancelLoad := context.WithCancel(ctx)
	stopLoad := func() { stopping.Store(true); cancelLoad() }
	var wg sync.WaitGroup
	for c := range o.Clients {
		wg.Add(1)
		go func() {
			defer wg.Done()
			conn, err := connectSimple(ctx, r.DSN)
			if err != nil {
				failed.Add(1)
				return
			}
			defer conn.Close(context.Background())
			for seq := int64(1); !stopping.Load(); seq++ {
				acct := rand.Int64N(rows) + 1
				start := time.Now()
				_, err := conn.Exec(ctx, fmt.Sprintf(`BEGIN; UPDATE accounts SET balance = balance + 1 WHERE id = %d;
					INSERT INTO history (client, seq, account, delta) VALUES (%d, %d, %d, 1); COMMIT`, acct, c, seq, acct))
				took := time.Since(start)
				txns.Add(1)
				if err != nil {
					failed.Add(1)
					e.logf("move: client %d: %v", c, err)
					conn.Close(context.Background())
					if conn, err = connectSimple(ctx, r.DSN); err != nil {
						return
					}
					continue
				}
				acked.Add(1)
				mu.Lock()
				samples = append(samples, sample{start, took})
				mu.Unlock()
			}
		}()
	}
	// Standby lag on both clusters, sampled throughout.
	var peakA, peakB atomic.Int64
	go func() {
		for lctx.Err() == nil {
			for _, x := range []struct {
				fc   *fleet.Cluster
				peak *atomic.Int64
			}{{a, &peakA}, {b, &peakB}} {
				if lag, err := standbyLag(lctx, x.fc); err == nil && lag > x.peak.Load() {
					x.peak.Store(lag)
				}
			}
			time.Sleep(100 * time.Millisecond)
		}
	}()
	time.Sleep(2 * time.Second)

	from, to := a.Name(), b.Name()
	for i := range o.Moves {
		var size int64
		src := a
		if from == b.Name() {
			src = b
		}
		if conn, err := pgx.Connect(ctx, src.PrimaryDSN("postgres")); err == nil {
			_ = conn.QueryRow(ctx, `SELECT pg_database_size($1)`, "t_"+id).Scan(&size)
			conn.Close(ctx)
		}
		e.logf("move %d/%d: tenant %s (%s) from %s to %s", i+1, o.Moves, id, kb(size), from, to)
		began := time.Now()
		j, err := d.client.MoveTenant(ctx, id, to)
		if err != nil {
			stopLoad()
			wg.Wait()
			return res, Table{}, err
		}
		if j, err = d.waitJob(ctx, j.ID); err != nil || j.State != jobs.Succeeded {
			stopLoad()
			wg.Wait()
			return res, Table{}, fmt.Errorf("move %d: %v %s %s", i+1, err, j.State, j.LastError)
		}
		ended := time.Now()
		row := MoveRow{From: from, To: to, Total: ended.Sub(began), Bytes: size}
		for _, s := range j.Steps {
			if s.Step == "copy" {
				row.Copy = s.FinishedAt.Sub(s.StartedAt)
			}
		}
		var pauseMS int64
		_ = d.catalog.QueryRow(ctx, `SELECT (detail->>'pause_ms')::bigint, coalesce(detail->>'phases_ms', '') FROM tenant_events WHERE tenant = $1 AND kind = 'move_pause'
			AND (detail->>'job')::bigint = $2`, id, j.ID).Scan(&pauseMS, &row.Phases)
		row.PauseServer = time.Duration(pauseMS) * time.Millisecond
		mu.Lock()
		for _, s := range samples {
			if !s.start.Before(began) && !s.start.After(ended) && s.took > row.PauseClient {
				row.PauseClient = s.took
			}
		}
		mu.Unlock()
		e.logf("move %d: copy %s, total %s, pause %s (server) %s (client), phases %s", i+1, row.Copy.Round(time.Millisecond), row.Total.Round(time.Millisecond),
			ms(row.PauseServer), ms(row.PauseClient), row.Phases)
		res.Moves = append(res.Moves, row)
		// Moving back needs the source copy purged (drop retention 1 s).
		if i+1 < o.Moves {
			if err := waitLeftoverPurged(ctx, d, id, from); err != nil {
				stopLoad()
				wg.Wait()
				return res, Table{}, err
			}
		}
		from, to = to, from
	}
	time.Sleep(time.Second)
	stopping.Store(true)
	wg.Wait()
	cancelLoad()
	res.Transactions, res.Failed, res.RowsAcked = txns.Load(), failed.Load(), acked.Load()
	res.PeakLagSource, res.PeakLagTarget = peakA.Load(), peakB.Load()
	last := a
	if from == b.Name() {
		last = b
	}
	conn, err := pgx.Connect(ctx, last.PrimaryDSN("t_"+id))
	if err != nil {
		return res, Table{}, err
	}
	err = conn.QueryRow(ctx, `SELECT count(*), count(DISTINCT (client, seq)) FROM history`).Scan(&res.RowsFound, &res.RowsDistinct)
	conn.Close(ctx)
	if err != nil {
		return res, Table{}, err
	}
	return res, moveTable(res, o), nil
}

func standbyLag(ctx context.Context, fc *fleet.Cluster) (int64, error) {
	conn, err := pgx.Connect(ctx, fc.PrimaryDSN("postgres"))
	if err != nil {
		return 0, err
	}
	defer conn.Close(ctx)
	// Standbys only: a move's subscription (and an analytics mirror) has a
	// walsender of its own in pg_stat_replication, whose replay_lsn is what
	// the subscriber confirmed, not a standby's replay.
	var lag int64
	err = conn.QueryRow(ctx, `SELECT coalesce(max(pg_wal_lsn_diff(pg_current_wal_lsn(), r.replay_lsn)), 0)::bigint FROM pg_stat_replication r
		WHERE NOT EXISTS (SELECT 1 FROM pg_replication_slots s WHERE s.active_pid = r.pid AND s.slot_type = 'logical')`).Scan(&lag)
	return lag, err
}

// waitLeftoverPurged waits for the purge of the copy a move left on a cluster.
func waitLeftoverPurged(ctx context.Context, d *benchDaemon, id, cluster string) error {
	for {
		js, err := d.client.Jobs(ctx, url.Values{"type": {string(jobs.TenantPurge)}, "target": {id}})
		if err != nil {
			return err
		}
		for _, j := range js {
			if j.Cluster == cluster && j.State == jobs.Succeeded && j.CreatedAt.After(time.Now().Add(-time.Hour)) {
				done := true
				// Every leftover purge of this cluster is done.
				for _, k := range js {
					if k.Cluster == cluster && !jobs.Finished(k.State) {
						done = false
					}
				}
				if done {
					return nil
				}
			}
			if j.Cluster == cluster && j.State == jobs.Failed {
				return fmt.Errorf("purge of the copy left on %s: %s", cluster, j.LastError)
			}
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(200 * time.Millisecond):
		}
	}
}

func moveTable(res MoveResult, o MoveOptions) Table {
	t := Table{Title: fmt.Sprintf("bench move: a database tenant of %d MB, %d clients writing through its pooler DSN, %d moves between two clusters (primary + standby each)", o.SizeMB, o.Clients, len(res.Moves)),
		Columns: []string{"move", "size", "copy", "copy MB/s", "total", "pause (server)", "pause (client max)"},
		Data:    map[string]any{"result": res}}
	var server, client []time.Duration
	for i, m := range res.Moves {
		rate := "-"
		if m.Copy > 0 {
			rate = fmt.Sprintf("%.1f", float64(m.Bytes)/(1<<20)/m.Copy.Seconds())
		}
		t.Rows = append(t.Rows, []string{fmt.Sprintf("%d %s→%s", i+1, m.From, m.To), kb(m.Bytes), m.Copy.Round(time.Millisecond).String(), rate,
			m.Total.Round(time.Millisecond).String(), ms(m.PauseServer), ms(m.PauseClient)})
		server, client = append(server, m.PauseServer), append(client, m.PauseClient)
	}
	maxOf := func(ds []time.Duration) time.Duration {
		var m time.Duration
		for _, d := range ds {
			m = max(m, d)
		}
		return m
	}
	for i, m := range res.Moves {
		t.Notes = append(t.Notes, fmt.Sprintf("move %d: the pause's phases (ms) %s", i+1, m.Phases))
	}
	t.Notes = append(t.Notes,
		fmt.Sprintf("pause as the server recorded it (PAUSE to RESUME): p50 %s, max %s", ms(percentile(server, 50)), ms(maxOf(server))),
		fmt.Sprintf("transactions %d, failed %d; rows acknowledged %d, found on the last cluster %d (%d distinct)", res.Transactions, res.Failed, res.RowsAcked, res.RowsFound, res.RowsDistinct),
		fmt.Sprintf("peak standby replay lag: %s on %s, %s on %s", kb(res.PeakLagSource), "move-a", kb(res.PeakLagTarget), "move-b"),
		"pause (client max): the longest client transaction that started during the move, queued at the pooler while paused")
	const mb64 = 64 << 20
	t.Checks = append(t.Checks,
		Check{Target: "pause p50 <= 1 s (client)", Got: ms(percentile(client, 50)), Met: len(client) > 0 && percentile(client, 50) <= time.Second},
		Check{Target: "pause max <= 2 s (client)", Got: ms(maxOf(client)), Met: len(client) > 0 && maxOf(client) <= 2*time.Second},
		Check{Target: "zero failed client transactions", Got: strconv.FormatInt(res.Failed, 10), Met: res.Failed == 0},
		Check{Target: "zero lost or duplicated rows", Got: fmt.Sprintf("%d acknowledged, %d found, %d distinct", res.RowsAcked, res.RowsFound, res.RowsDistinct),
			Met: res.RowsFound == res.RowsAcked && res.RowsDistinct == res.RowsFound},
		Check{Target: "standby lag <= 64 MB on both clusters", Got: kb(res.PeakLagSource) + ", " + kb(res.PeakLagTarget),
			Met: res.PeakLagSource <= mb64 && res.PeakLagTarget <= mb64},
	)
	return t
}
