package quota

import (
	"context"
	"fmt"
	"log/slog"
	"math"
	"strconv"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/pgtenant/pgtenant/internal/catalog"
	"github.com/pgtenant/pgtenant/internal/cluster"
	"github.com/pgtenant/pgtenant/internal/config"
	"github.com/pgtenant/pgtenant/internal/tenant"
)

// Capper enforces each tier's statement_cap. statement_timeout on the role
// is only a default: a tenant can SET statement_timeout = 0. The capper
// looks at pg_stat_activity from outside, every metrics.cap_interval, and
// cancels a tenant's statement that has run longer than its tier's cap; one
// still running terminateAfter later (a cancel can be ignored while a
// backend waits in some system calls) has its session terminated. Each is
// an event in the tenant's history.
type Capper struct {
	Store    *catalog.Store
	Clusters *cluster.Registry
	Config   config.Config
	Logger   *slog.Logger

	actions  *prometheus.CounterVec
	mu       sync.Mutex
	canceled map[capKey]time.Time // statements cancelled, by when
}

type capKey struct {
	cluster string
	pid     int32
	start   time.Time
}

// terminateAfter is how long a cancelled statement may still run before its
// session is terminated.
const terminateAfter = 5 * time.Second

// Register adds the capper's counter (pgtenant_statements_capped_total) to reg.
func (c *Capper) Register(reg prometheus.Registerer) {
	c.actions = prometheus.NewCounterVec(prometheus.CounterOpts{Name: "pgtenant_statements_capped_total",
		Help: "Tenant statements stopped for running longer than their tier's statement_cap, by action (cancel, terminate)."},
		[]string{"cluster", "action"})
	reg.MustRegister(c.actions)
}

func (c *Capper) log() *slog.Logger {
	if c.Logger == nil {
		return slog.New(slog.DiscardHandler)
	}
	return c.Logger.With("component", "capper")
}

// minCap is the smallest statement_cap of any tier (0: no tier has one).
func (c *Capper) minCap() time.Duration {
	var m time.Duration
	for _, t := range c.Config.Tiers {
		if d := t.StatementCap.D(); d > 0 && (m == 0 || d < m) {
			m = d
		}
	}
	return m
}

// Run checks every cluster each cap interval until ctx is done. With no
// tier capping statements it only waits.
func (c *Capper) Run(ctx context.Context) error {
	if c.minCap() == 0 {
		<-ctx.Done()
		return nil
	}
	t := time.NewTicker(c.Config.Metrics.CapInterval.D())
	defer t.Stop()
	failing := map[string]string{}
	for {
		for _, cl := range c.Clusters.All() {
			cctx, cancel := context.WithTimeout(ctx, 10*time.Second)
			_, err := c.Check(cctx, cl)
			cancel()
			if err != nil && ctx.Err() == nil && failing[cl.Name()] != err.Error() {
				c.log().Warn("statement cap check failed", "cluster", cl.Name(), "err", err)
				failing[cl.Name()] = err.Error()
			} else if err == nil {
				delete(failing, cl.Name())
			}
		}
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		}
	}
}

// Check cancels the statements of one cluster's tenants that run longer
// than their tier's cap and returns how many it stopped. One query finds the
// statements older than the smallest cap (usually none); tiers are looked up
// only for those.
func (c *Capper) Check(ctx context.Context, cl *cluster.Cluster) (int, error) {
	minCap := c.minCap()
	if minCap == 0 {
		return 0, nil
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	admin, err := cl.Admin(ctx)
	if err != nil {
		return 0, err
	}
	rows, err := admin.Query(ctx, `
		SELECT pid, usename, query_start, extract(epoch FROM clock_timestamp() - query_start)::float8
		FROM pg_stat_activity
		WHERE backend_type = 'client backend' AND state IN ('active', 'fastpath function call')
		  AND usename LIKE 't\_%' AND query_start < clock_timestamp() - make_interval(secs => $1)`, minCap.Seconds())
	if err != nil {
		return 0, fmt.Errorf("read pg_stat_activity of %s: %w", cl.Name(), cluster.Classify(err))
	}
	type long struct {
		pid   int32
		id    string
		start time.Time
		ran   float64
	}
	var longs []long
	var ids []string
	for rows.Next() {
		var l long
		var role string
		if err := rows.Scan(&l.pid, &role, &l.start, &l.ran); err != nil {
			rows.Close()
			return 0, err
		}
		id, ok := tenant.IDFromPhysical(role)
		if !ok {
			continue
		}
		l.id = id
		longs = append(longs, l)
		ids = append(ids, id)
	}
	if err := rows.Err(); err != nil {
		return 0, cluster.Classify(err)
	}
	c.forget(time.Now())
	if len(longs) == 0 {
		return 0, nil
	}
	tiers, err := c.Store.TenantTiers(ctx, ids)
	if err != nil {
		return 0, err
	}
	stopped := 0
	for _, l := range longs {
		limit := c.Config.Tiers[tiers[l.id]].StatementCap.D()
		if limit <= 0 || l.ran < limit.Seconds() {
			continue
		}
		key := capKey{cl.Name(), l.pid, l.start}
		action, fn := "cancel", "pg_cancel_backend"
		if at, ok := c.canceled[key]; ok {
			if time.Since(at) < terminateAfter {
				continue // cancelled a moment ago: give it time to stop
			}
			action, fn = "terminate", "pg_terminate_backend"
		}
		// Only if the backend still runs the same statement.
		var done bool
		err := admin.QueryRow(ctx, `SELECT coalesce((SELECT `+fn+`(pid) FROM pg_stat_activity
			WHERE pid = $1 AND query_start = $2 AND state IN ('active', 'fastpath function call')), false)`, l.pid, l.start).Scan(&done)
		if err != nil {
			return stopped, cluster.Classify(err)
		}
		if !done {
			continue
		}
		stopped++
		if c.canceled == nil {
			c.canceled = map[capKey]time.Time{}
		}
		c.canceled[key] = time.Now()
		if c.actions != nil {
			c.actions.WithLabelValues(cl.Name(), action).Inc()
		}
		kind := "statement_cancelled"
		if action == "terminate" {
			kind = "session_terminated"
		}
		detail := map[string]any{"pid": l.pid, "ran_seconds": math.Round(l.ran*10) / 10, "statement_cap": limit.String(),
			"tier": tiers[l.id], "query_start": l.start.UTC().Format(time.RFC3339Nano)}
		if err := c.Store.AddEvent(ctx, c.Store.Pool(), l.id, kind, detail); err != nil {
			c.log().Warn("record statement cap event", "tenant", l.id, "err", err)
		}
		c.log().Info("statement over its tier's cap stopped", "tenant", l.id, "action", action,
			"pid", strconv.Itoa(int(l.pid)), "ran", l.ran, "cap", limit)
	}
	return stopped, nil
}

// forget drops statements cancelled long ago (they ended, or were terminated).
func (c *Capper) forget(now time.Time) {
	for k, at := range c.canceled {
		if now.Sub(at) > time.Minute {
			delete(c.canceled, k)
		}
	}
}
