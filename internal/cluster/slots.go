package cluster

import (
	"context"
	"errors"
	"fmt"
	"math"
	"strings"
	"time"

	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// DefaultSlotWait is SlotWait.Bound's default (pacer.slot_wait).
const DefaultSlotWait = 30 * time.Second

// EventBlockingTerminated is the event CreateSlot records in the history
// of a tenant whose session it ended.
const EventBlockingTerminated = "blocking_session_terminated"

// SlotWait says how long CreateSlot waits on other sessions' transactions
// and how it reports what it did about them.
type SlotWait struct {
	// Bound: how long the slot may wait before the sessions blocking it
	// are dealt with (0: DefaultSlotWait).
	Bound time.Duration
	// For is what the slot is for, in events, logs and errors ("the move
	// of tenant x").
	For string
	// TenantOf gives the tenant of a role (tenant.IDFromPhysical): only
	// such sessions are ever terminated.
	TenantOf func(role string) (id string, ok bool)
	// Record adds an event to a tenant's history (catalog.Store.AddEvent);
	// nil: logged only.
	Record func(ctx context.Context, tenant, kind string, detail map[string]any) error
}

// Blocker is a session whose transaction a slot waited on.
type Blocker struct {
	PID         int32
	Role        string // "" for a prepared transaction (pid 0)
	Database    string
	Application string
	// Age is its transaction's, or, where pg_stat_activity shows no
	// transaction start (a prepared transaction, a background worker), how
	// long the slot has seen it blocking.
	Age    time.Duration
	Tenant string // its tenant ("": not a tenant's session)
}

func (b Blocker) String() string {
	if b.PID == 0 {
		return "a prepared transaction (pg_prepared_xacts)"
	}
	return fmt.Sprintf("pid %d (role %s, database %s, application %q, transaction open at least %s)",
		b.PID, b.Role, b.Database, b.Application, b.Age.Round(time.Second))
}

// SlotBlockedError is a slot that waited its bound on transactions that
// CreateSlot may not end: sessions of roles that are not tenants (an
// operator's, pgtenant's own), prepared transactions.
type SlotBlockedError struct {
	Slot, Cluster, For string
	Waited             time.Duration
	Blockers           []Blocker
}

func (e *SlotBlockedError) Error() string {
	bs := make([]string, len(e.Blockers))
	for i, b := range e.Blockers {
		bs[i] = b.String()
	}
	return fmt.Sprintf("slot %s on %s (%s) waited %s for transactions that are not tenants': %s; "+
		"end them (COMMIT, ROLLBACK or pg_terminate_backend) or let them finish: the step is tried again later",
		e.Slot, e.Cluster, e.For, e.Waited.Round(time.Second), strings.Join(bs, "; "))
}

// slotPoll is how often a slot past its bound looks for blockers.
const slotPoll = 250 * time.Millisecond

// CreateSlot makes a logical slot on repl, a replication connection to this
// cluster's primary, with pglogrepl.CreateReplicationSlot. Making a logical
// slot waits for every transaction that holds an xid anywhere in the
// cluster when it starts (and, while it builds its snapshot, for those
// running at each of its next steps): one tenant that keeps a transaction
// open would hold it up for ever, and with it a neighbour's move or
// analytics mirror. So, once the slot has waited w.Bound, CreateSlot reads
// the sessions it waits on (pg_blocking_pids of the walsender: it waits on
// their xid locks) every slotPoll, and
//   - terminates a tenant's session (w.TenantOf) whose transaction is at
//     least w.Bound old, only if that transaction still runs, and records
//     EventBlockingTerminated in the tenant's history: every transaction
//     that was running when the wait began qualifies, and a later one once
//     it is as old, so a tenant cannot hold the slot up by starting new
//     ones; a younger one is waited for;
//   - fails, with a *SlotBlockedError that names them, when any other
//     blocker (a session that is not a tenant's client session, a prepared
//     transaction) at least w.Bound old blocks it (where no transaction
//     start is shown, once it has blocked w.Bound since first seen): those
//     are the operator's to end, and the caller tries again later.
//
// A slot whose wait ends this way is not made (its creation is cancelled,
// which closes repl). ctx bounds the whole.
func (c *Cluster) CreateSlot(ctx context.Context, repl *pgconn.PgConn, name string,
	opts pglogrepl.CreateReplicationSlotOptions, w SlotWait) (pglogrepl.CreateReplicationSlotResult, error) {
	bound := w.Bound
	if bound <= 0 {
		bound = DefaultSlotWait
	}
	type result struct {
		res pglogrepl.CreateReplicationSlotResult
		err error
	}
	// The walsender's pinned lock_timeout (AdminLockTimeout) would end
	// each wait on a transaction after 10 s whoever holds it, so the slot
	// would never be made beside a longer transaction, a tenant's or not,
	// and nothing would say why: the wait is bounded below instead, and the
	// timeout only backs that up. It stays for the stream that may follow
	// on repl: any command after the slot would end its exported snapshot.
	backstop := fmt.Sprintf("SET lock_timeout = %s", Literal(fmt.Sprintf("%dms", (2*bound+AdminLockTimeout).Milliseconds())))
	if _, err := repl.Exec(ctx, backstop).ReadAll(); err != nil {
		return pglogrepl.CreateReplicationSlotResult{}, fmt.Errorf("create slot %s on %s: %w", name, c.name, Classify(err))
	}
	began := time.Now()
	walsender := repl.PID()
	sctx, cancel := context.WithCancel(ctx)
	defer cancel()
	done := make(chan result, 1)
	go func() {
		res, err := pglogrepl.CreateReplicationSlot(sctx, repl, name, "pgoutput", opts)
		done <- result{res, err}
	}()
	// stop cancels the creation and waits for it to return: repl is the
	// caller's, and is not used by two goroutines at once.
	stop := func(err error) (pglogrepl.CreateReplicationSlotResult, error) {
		cancel()
		<-done
		return pglogrepl.CreateReplicationSlotResult{}, err
	}
	wait := time.NewTimer(bound)
	defer wait.Stop()
	var poll <-chan time.Time
	seen := map[int32]time.Time{} // blockers without a transaction start: since when
	for {
		select {
		case r := <-done:
			if r.err != nil {
				return r.res, fmt.Errorf("create slot %s on %s: %w", name, c.name, Classify(r.err))
			}
			return r.res, nil
		case <-ctx.Done():
			return stop(fmt.Errorf("create slot %s on %s: %w", name, c.name, ctx.Err()))
		case <-wait.C:
		case <-poll:
		}
		poll = time.After(slotPoll)
		blockers, err := c.slotBlockers(ctx, walsender, w.TenantOf)
		if err != nil {
			return stop(fmt.Errorf("create slot %s on %s: read the sessions it waits on: %w", name, c.name, err))
		}
		var others []Blocker
		for _, b := range blockers {
			if b.xactStart == nil {
				if _, ok := seen[b.PID]; !ok {
					seen[b.PID] = time.Now()
				}
				b.Age = time.Since(seen[b.PID])
			}
			switch {
			case b.Age < bound:
				// Younger than the bound: waited for, like any transaction.
			case b.Tenant != "":
				if err := c.endBlocker(ctx, b, name, bound, w); err != nil {
					return stop(fmt.Errorf("create slot %s on %s: %w", name, c.name, err))
				}
			default:
				others = append(others, b.Blocker)
			}
		}
		if len(others) > 0 {
			return stop(&SlotBlockedError{Slot: name, Cluster: c.name, For: w.For, Waited: time.Since(began), Blockers: others})
		}
	}
}

// slotBlockersSQL: the sessions the walsender $1 waits on, with their
// transaction's start and age (pid 0, a prepared transaction, has no row
// in pg_stat_activity).
const slotBlockersSQL = `
	SELECT b.pid, coalesce(a.usename, ''), coalesce(a.datname, ''), coalesce(a.application_name, ''),
	       coalesce(a.backend_type, ''), a.xact_start,
	       coalesce(extract(epoch FROM pg_catalog.clock_timestamp() - a.xact_start), 0)::float8
	FROM pg_catalog.unnest(pg_catalog.pg_blocking_pids($1)) AS b(pid)
	LEFT JOIN pg_catalog.pg_stat_activity a ON a.pid = b.pid
	ORDER BY b.pid`

type blocker struct {
	Blocker
	xactStart *time.Time
}

func (c *Cluster) slotBlockers(ctx context.Context, walsender uint32, tenantOf func(string) (string, bool)) ([]blocker, error) {
	admin, err := c.Admin(ctx)
	if err != nil {
		return nil, err
	}
	rows, err := admin.Query(ctx, slotBlockersSQL, int32(walsender))
	if err != nil {
		return nil, Classify(err)
	}
	out, err := pgx.CollectRows(rows, func(row pgx.CollectableRow) (blocker, error) {
		var b blocker
		var backendType string
		var age float64
		if err := row.Scan(&b.PID, &b.Role, &b.Database, &b.Application, &backendType, &b.xactStart, &age); err != nil {
			return b, err
		}
		b.Age = time.Duration(min(age, float64(math.MaxInt64/time.Second)) * float64(time.Second))
		// Only a tenant's own client sessions: never a background worker
		// or walsender, whatever role it runs as.
		if tenantOf != nil && backendType == "client backend" && b.xactStart != nil {
			if id, ok := tenantOf(b.Role); ok {
				b.Tenant = id
			}
		}
		return b, nil
	})
	return out, Classify(err)
}

// endBlockerSQL terminates the backend only while it is still in the
// transaction that was found ($2: its xact_start).
const endBlockerSQL = `SELECT coalesce((SELECT pg_catalog.pg_terminate_backend(pid) FROM pg_catalog.pg_stat_activity
	WHERE pid = $1 AND xact_start = $2), false)`

// endBlocker terminates a tenant's session that blocks slot and records it.
func (c *Cluster) endBlocker(ctx context.Context, b blocker, slot string, bound time.Duration, w SlotWait) error {
	admin, err := c.Admin(ctx)
	if err != nil {
		return err
	}
	var ended bool
	if err := admin.QueryRow(ctx, endBlockerSQL, b.PID, *b.xactStart).Scan(&ended); err != nil {
		return fmt.Errorf("terminate tenant %s's session %d: %w", b.Tenant, b.PID, Classify(err))
	}
	if !ended {
		return nil // its transaction ended meanwhile
	}
	age := math.Round(b.Age.Seconds()*10) / 10
	c.log.Warn("tenant session blocking a slot terminated", "tenant", b.Tenant, "pid", b.PID, "slot", slot, "for", w.For,
		"transaction_seconds", age)
	if w.Record == nil {
		return nil
	}
	detail := map[string]any{"pid": b.PID, "node": "primary", "cluster": c.name, "slot": slot, "blocked": w.For,
		"transaction_seconds": age, "xact_start": b.xactStart.UTC().Format(time.RFC3339Nano), "slot_wait": bound.String()}
	if err := w.Record(ctx, b.Tenant, EventBlockingTerminated, detail); err != nil && !errors.Is(err, context.Canceled) {
		c.log.Warn("record event", "tenant", b.Tenant, "event", EventBlockingTerminated, "err", err)
	}
	return nil
}
