package hostile_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/pgtenant/pgtenant/internal/analytics"
	"github.com/pgtenant/pgtenant/internal/cluster"
	"github.com/pgtenant/pgtenant/internal/config"
	"github.com/pgtenant/pgtenant/internal/jobs"
	"github.com/pgtenant/pgtenant/internal/pgtest"
	"github.com/pgtenant/pgtenant/internal/quota"
)

// slotWait is pacer.slot_wait in these tests.
const slotWait = 2 * time.Second

// holder is a hostile tenant that keeps a transaction holding an xid open
// for as long as the test lets it: BEGIN; SELECT txid_current(); then short
// sleeps one after the other, each far under its statement cap, with no
// idle time that idle_in_transaction_session_timeout would see. When its
// session is ended it logs in again and opens another.
type holder struct {
	stop chan struct{}
	done chan struct{}

	mu     sync.Mutex
	ended  []string // how each session ended: the error its next statement got
	opened int      // transactions opened
}

func holdTransaction(t *testing.T, dsn string) *holder {
	t.Helper()
	h := &holder{stop: make(chan struct{}), done: make(chan struct{})}
	ctx := context.Background()
	go func() {
		defer close(h.done)
		for {
			select {
			case <-h.stop:
				return
			default:
			}
			conn, err := pgx.Connect(ctx, dsn)
			if err != nil {
				time.Sleep(100 * time.Millisecond)
				continue
			}
			err = h.hold(ctx, conn)
			conn.Close(ctx)
			if err == nil {
				return // stopped
			}
			h.mu.Lock()
			h.ended = append(h.ended, err.Error())
			h.mu.Unlock()
		}
	}()
	t.Cleanup(h.end)
	return h
}

// hold keeps one transaction open until the session is ended (its error)
// or the holder stops (nil).
func (h *holder) hold(ctx context.Context, conn *pgx.Conn) error {
	if _, err := conn.Exec(ctx, `BEGIN; SELECT txid_current()`); err != nil {
		return err
	}
	h.mu.Lock()
	h.opened++
	h.mu.Unlock()
	for {
		select {
		case <-h.stop:
			_, _ = conn.Exec(ctx, `ROLLBACK`)
			return nil
		default:
		}
		if _, err := conn.Exec(ctx, `SELECT pg_sleep(0.5)`); err != nil {
			return err
		}
	}
}

func (h *holder) end() {
	select {
	case <-h.stop:
	default:
		close(h.stop)
	}
	<-h.done
}

// terminated reports how many of the holder's sessions were ended by an
// administrator command (57P01), and every way one ended.
func (h *holder) terminated() (int, []string) {
	h.mu.Lock()
	defer h.mu.Unlock()
	n := 0
	for _, e := range h.ended {
		if strings.Contains(e, "SQLSTATE 57P01") {
			n++
		}
	}
	return n, append([]string(nil), h.ended...)
}

// eventsOf returns the details of a tenant's events of one kind.
func eventsOf(t *testing.T, e *env, id, kind string) []map[string]any {
	t.Helper()
	events, err := e.store.Events(pgtest.Context(t), id)
	if err != nil {
		t.Fatal(err)
	}
	var out []map[string]any
	for _, ev := range events {
		if ev.Kind != kind {
			continue
		}
		var d map[string]any
		if err := json.Unmarshal(ev.Detail, &d); err != nil {
			t.Fatal(err)
		}
		out = append(out, d)
	}
	return out
}

// waitEventOf waits (at most limit) for an event of kind in the tenant's
// history for which match holds.
func waitEventOf(t *testing.T, e *env, id, kind string, limit time.Duration, match func(map[string]any) bool) map[string]any {
	t.Helper()
	deadline := time.Now().Add(limit)
	for {
		for _, d := range eventsOf(t, e, id, kind) {
			if match == nil || match(d) {
				return d
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("tenant %s: no %s event after %s (have %v)", id, kind, limit, eventsOf(t, e, id, kind))
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// onLocal creates a tenant on the suite's cluster (placement would put
// some on local2).
func onLocal(t *testing.T, e *env, mode, tier string) login {
	t.Helper()
	return e.tenantOn(t, mode, tier, "local")
}

// TestR2Finding1_LongTransactionCannotStallSlots: a hostile tenant keeps a
// transaction holding an xid open, under every limit of its tier (short
// statements, no idle time), and opens another whenever it is ended. A
// neighbour's analytics enable and another neighbour's move each make a
// logical slot, which waits for that transaction: both finish within a
// bound, because past pacer.slot_wait the slot's wait ends the hostile
// session, with an event in its history that names it and what it
// blocked. A transaction of the operator's (not a tenant's) is never
// ended: the move reports it, naming it, and waits without using up its
// attempts, then goes on once it ends.
//
// Before the fix: the mirror stays "copying" for ever and the move fails
// after max_attempts one-minute waits.
func TestR2Finding1_LongTransactionCannotStallSlots(t *testing.T) {
	ctx := pgtest.Context(t)
	pg2, err := pgtest.Start(ctx, pgtest.Options{Name: "local2"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pg2.Close)
	e := startOn(t, func(c *config.Config) {
		c.Pacer.SlotWait = config.Duration(slotWait)
		c.Jobs.MaxBackoff = config.Duration(2 * time.Second)
		c.Analytics.PollInterval = config.Duration(100 * time.Millisecond)
		c.Analytics.Lease = config.Duration(2 * time.Second)
		c.Analytics.FlushInterval = config.Duration(50 * time.Millisecond)
	}, false, []*pgtest.Cluster{pg2})

	for _, mode := range []string{"database", "schema"} {
		t.Run(mode, func(t *testing.T) {
			ctx := pgtest.Context(t)
			h := onLocal(t, e, mode, hostileTier)
			mirrored := onLocal(t, e, mode, "default")
			moved := onLocal(t, e, mode, "default")
			blocker := holdTransaction(t, h.DSN)

			// The neighbour's mirror: streaming within the bound.
			began := time.Now()
			if _, err := e.c.EnableAnalytics(ctx, mirrored.ID, nil); err != nil {
				t.Fatal(err)
			}
			const enableBound = 60 * time.Second
			for {
				st, err := e.c.AnalyticsStatus(ctx, mirrored.ID)
				if err != nil {
					t.Fatal(err)
				}
				if st.State == analytics.StateStreaming {
					break
				}
				if time.Since(began) > enableBound {
					t.Fatalf("analytics enable of %s not streaming after %s beside a tenant's open transaction: %+v", mirrored.ID, enableBound, st)
				}
				time.Sleep(200 * time.Millisecond)
			}
			t.Logf("analytics enable streaming after %s", time.Since(began).Round(time.Millisecond))
			d := waitEventOf(t, e, h.ID, cluster.EventBlockingTerminated, 10*time.Second, func(d map[string]any) bool {
				return strings.Contains(fmt.Sprint(d["blocked"]), "analytics mirror of tenant "+mirrored.ID)
			})
			if d["slot"] != analytics.SlotName(mirrored.ID) || d["cluster"] != "local" || d["pid"] == nil ||
				d["transaction_seconds"].(float64) < slotWait.Seconds() {
				t.Errorf("event detail = %v, want the mirror's slot on local, the pid and a transaction at least %s old", d, slotWait)
			}

			// The other neighbour's move: done within the bound, its
			// attempts not used up.
			began = time.Now()
			j, err := e.c.MoveTenant(ctx, moved.ID, "local2")
			if err != nil {
				t.Fatal(err)
			}
			j = waitJobFor(t, e.c, j.ID, jobs.Succeeded, 3*time.Minute)
			t.Logf("move done after %s (%d failed attempts)", time.Since(began).Round(time.Millisecond), j.Attempts)
			waitEventOf(t, e, h.ID, cluster.EventBlockingTerminated, 10*time.Second, func(d map[string]any) bool {
				return d["slot"] == "pgt_move_"+moved.ID && strings.Contains(fmt.Sprint(d["blocked"]), "move of tenant "+moved.ID)
			})

			n, ended := blocker.terminated()
			if n < 2 {
				t.Errorf("the hostile tenant's sessions were ended %d times (%v), want at least once for each slot", n, ended)
			}
			for _, l := range []login{mirrored, moved} {
				if got := eventsOf(t, e, l.ID, cluster.EventBlockingTerminated); len(got) > 0 {
					t.Errorf("neighbour %s has %s events: %v", l.ID, cluster.EventBlockingTerminated, got)
				}
			}
			blocker.end()
			neighbourWorks(t, mirrored)
		})
	}

	t.Run("operator", func(t *testing.T) {
		ctx := pgtest.Context(t)
		moved := onLocal(t, e, "database", "default")
		admin := srv.Conn(t, "postgres")
		var pid int32
		if err := admin.QueryRow(ctx, `SELECT pg_backend_pid()`).Scan(&pid); err != nil {
			t.Fatal(err)
		}
		mustExec(t, admin, `BEGIN`)
		mustExec(t, admin, `SELECT txid_current()`)
		j, err := e.c.MoveTenant(ctx, moved.ID, "local2")
		if err != nil {
			t.Fatal(err)
		}
		// Reported, naming the session and what to do, and tried again
		// (pacer.slot_wait + jobs.max_backoff each) more often than
		// max_attempts allows, without failing.
		deadline := time.Now().Add(90 * time.Second)
		reported := 0
		var last time.Time
		for reported < 3*e.cfg.Jobs.MaxAttempts {
			got, err := e.c.Job(ctx, j.ID)
			if err != nil {
				t.Fatal(err)
			}
			if jobs.Finished(got.State) {
				t.Fatalf("move ended %s while the operator's transaction held its slot: %s", got.State, got.LastError)
			}
			if got.Attempts != 0 {
				t.Fatalf("move used %d attempts waiting for the operator's transaction: %s", got.Attempts, got.LastError)
			}
			if strings.Contains(got.LastError, fmt.Sprintf("pid %d ", pid)) && got.UpdatedAt.After(last) && got.State == jobs.Queued {
				if !strings.Contains(got.LastError, "pg_terminate_backend") {
					t.Errorf("last error %q does not say what to do", got.LastError)
				}
				reported++
				last = got.UpdatedAt
			}
			if time.Now().After(deadline) {
				t.Fatalf("move not reported blocked by pid %d %d times within 90 s (%d): %+v", pid, 3*e.cfg.Jobs.MaxAttempts, reported, got)
			}
			time.Sleep(100 * time.Millisecond)
		}
		var alive int
		if err := admin.QueryRow(ctx, `SELECT 1`).Scan(&alive); err != nil {
			t.Fatalf("the operator's session was ended: %v", err)
		}
		mustExec(t, admin, `COMMIT`)
		waitJobFor(t, e.c, j.ID, jobs.Succeeded, 3*time.Minute)
	})
}

// TestR2Finding1_TransactionAgeCapped: a tenant's transaction open longer
// than its tier's max_transaction_age is ended by the capper on the primary
// (both modes) and on the standby, however short its statements and
// pauses, with a transaction_age_terminated event; a transaction under the
// limit is left alone.
func TestR2Finding1_TransactionAgeCapped(t *testing.T) {
	const tier, limit = "xact", 3 * time.Second
	e := start(t, func(c *config.Config) {
		c.Metrics.CapInterval = config.Duration(100 * time.Millisecond)
		c.Tiers[tier] = config.Tier{ConnectionLimit: 4, StatementTimeout: config.Duration(30 * time.Second),
			IdleInTransactionSessionTimeout: config.Duration(time.Minute), MaxTransactionAge: config.Duration(limit)}
	})
	for _, node := range []string{"database", "schema", "standby"} {
		t.Run(node, func(t *testing.T) {
			ctx := pgtest.Context(t)
			mode, dsn := node, ""
			if node == "standby" {
				mode = "database"
			}
			l := e.tenant(t, mode, tier)
			dsn = l.DSN
			if node == "standby" {
				dsn = srv.OnStandby(t, l.DSN)
			}
			var conn *pgx.Conn
			for deadline := time.Now().Add(30 * time.Second); ; {
				c, err := pgx.Connect(ctx, dsn) // the role reaches the standby by replay
				if err == nil {
					conn = c
					t.Cleanup(func() { c.Close(context.Background()) })
					break
				}
				if time.Now().After(deadline) {
					t.Fatalf("log in on %s: %v", node, err)
				}
				time.Sleep(100 * time.Millisecond)
			}
			var pid int32
			if err := conn.QueryRow(ctx, `SELECT pg_backend_pid()`).Scan(&pid); err != nil {
				t.Fatal(err)
			}
			// Under the limit: left alone.
			mustExec(t, conn, `BEGIN`)
			mustExec(t, conn, `SELECT pg_sleep(1)`)
			mustExec(t, conn, `COMMIT`)

			hold := `SELECT txid_current()`
			if node == "standby" {
				hold = `SELECT count(*) FROM pg_class` // a snapshot: what a standby's transaction holds
			}
			began := time.Now()
			mustExec(t, conn, `BEGIN`)
			mustExec(t, conn, hold)
			var err error
			for time.Since(began) < 30*time.Second {
				if _, err = conn.Exec(ctx, `SELECT pg_sleep(0.2)`); err != nil {
					break
				}
			}
			var pgErr *pgconn.PgError
			if !errors.As(err, &pgErr) || pgErr.Code != "57P01" {
				t.Fatalf("a transaction open %s past its tier's %s: err = %v, want the session terminated (57P01)", time.Since(began).Round(time.Second), limit, err)
			}
			if took := time.Since(began); took < limit {
				t.Errorf("terminated after %s, before the limit %s", took, limit)
			}
			d := waitEventOf(t, e, l.ID, quota.EventXactTerminated, 10*time.Second, nil)
			wantNode := "primary"
			if node == "standby" {
				wantNode = "standby1"
			}
			if d["pid"] != float64(pid) || d["node"] != wantNode || d["tier"] != tier || d["max_transaction_age"] != limit.String() ||
				d["age_seconds"].(float64) < limit.Seconds() {
				t.Errorf("event detail = %v, want pid %d on %s, tier %s, limit %s", d, pid, wantNode, tier, limit)
			}
		})
	}
}
