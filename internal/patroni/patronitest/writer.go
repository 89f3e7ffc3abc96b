package patronitest

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
)

// Ack is one acknowledged write: its id, the server port that took it, when.
type Ack struct {
	ID, Port int
	At       time.Time
}

// Writer inserts ids one by one through a DSN into the table writes (id
// int NOT NULL, which the test creates), reconnecting after any error, and
// records the acknowledged ones: what a client sees of a failover. An id
// whose outcome is unknown (an error) is never retried, so that a row
// twice or an acknowledged row missing is the cluster's doing.
type Writer struct {
	cancel context.CancelFunc
	done   chan struct{}
	mu     sync.Mutex
	acks   []Ack
	errs   int
	last   string // the last error
}

// StartWriter starts writing through dsn until Stop, the end of ctx or the
// end of the test.
func StartWriter(t testing.TB, ctx context.Context, dsn string) *Writer {
	ctx, cancel := context.WithCancel(ctx)
	w := &Writer{cancel: cancel, done: make(chan struct{})}
	t.Cleanup(func() { w.Stop() })
	go func() {
		defer close(w.done)
		var conn *pgx.Conn
		defer func() {
			if conn != nil {
				conn.Close(context.Background())
			}
		}()
		for id := 1; ctx.Err() == nil; id++ {
			if conn == nil {
				cctx, ccancel := context.WithTimeout(ctx, 3*time.Second)
				c, err := pgx.Connect(cctx, dsn)
				ccancel()
				if err != nil {
					w.failed(err)
					sleep(ctx, 100*time.Millisecond)
					continue
				}
				conn = c
			}
			ectx, ecancel := context.WithTimeout(ctx, 5*time.Second)
			var port int
			err := conn.QueryRow(ectx, `INSERT INTO writes (id) VALUES ($1) RETURNING current_setting('port')::int`, id).Scan(&port)
			ecancel()
			if err != nil {
				w.failed(err)
				conn.Close(context.Background())
				conn = nil
				sleep(ctx, 100*time.Millisecond)
				continue
			}
			w.mu.Lock()
			w.acks = append(w.acks, Ack{ID: id, Port: port, At: time.Now()})
			w.mu.Unlock()
			sleep(ctx, 20*time.Millisecond)
		}
	}()
	return w
}

func (w *Writer) failed(err error) {
	w.mu.Lock()
	w.errs++
	w.last = err.Error()
	w.mu.Unlock()
}

// Acks are the writes acknowledged so far.
func (w *Writer) Acks() []Ack {
	w.mu.Lock()
	defer w.mu.Unlock()
	return append([]Ack(nil), w.acks...)
}

// Errors is how many connections and writes have failed so far.
func (w *Writer) Errors() int {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.errs
}

// LastError is the last error a connection or a write met, "" if none.
func (w *Writer) LastError() string {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.last
}

func (w *Writer) count() int {
	w.mu.Lock()
	defer w.mu.Unlock()
	return len(w.acks)
}

// Stop ends the writer and returns the acknowledged writes.
func (w *Writer) Stop() []Ack {
	w.cancel()
	<-w.done
	return w.Acks()
}

// WaitAcks waits up to a minute for n acknowledged writes in all.
func (w *Writer) WaitAcks(t testing.TB, ctx context.Context, n int, what string) {
	t.Helper()
	WaitFor(t, ctx, 60*time.Second, what, func() bool { return w.count() >= n }, w.state)
}

// WaitAckOn waits for the first write acknowledged by the server on port
// after since, and returns its time.
func (w *Writer) WaitAckOn(t testing.TB, ctx context.Context, port int, since time.Time, bound time.Duration) time.Time {
	t.Helper()
	var at time.Time
	WaitFor(t, ctx, bound, fmt.Sprintf("a write acknowledged by port %d", port), func() bool {
		w.mu.Lock()
		defer w.mu.Unlock()
		for _, a := range w.acks {
			if a.Port == port && a.At.After(since) {
				at = a.At
				return true
			}
		}
		return false
	}, w.state)
	return at
}

func (w *Writer) state() string {
	return fmt.Sprintf("%d acknowledged, %d errors (last: %s)", w.count(), w.Errors(), w.LastError())
}

// LongestPause is the longest time without an acknowledged write since
// since: what a client saw of the event at since.
func (w *Writer) LongestPause(since time.Time) time.Duration {
	w.mu.Lock()
	defer w.mu.Unlock()
	var longest time.Duration
	prev := since
	for _, a := range w.acks {
		if a.At.Before(since) {
			continue
		}
		longest = max(longest, a.At.Sub(prev))
		prev = a.At
	}
	return longest
}

// CheckRows checks, through dsn, that every acknowledged id is there
// exactly once and that no id is there twice; where names dsn's server in
// the log line ("on n2", "through the pooler").
func CheckRows(t testing.TB, ctx context.Context, dsn, where string, acked []Ack) {
	t.Helper()
	conn, err := pgx.Connect(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	rows, err := conn.Query(ctx, `SELECT id, count(*) FROM writes GROUP BY id`)
	if err != nil {
		t.Fatal(err)
	}
	counts := map[int]int{}
	for rows.Next() {
		var id, n int
		if err := rows.Scan(&id, &n); err != nil {
			t.Fatal(err)
		}
		counts[id] = n
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	lost := 0
	for _, a := range acked {
		if counts[a.ID] != 1 {
			lost++
			t.Errorf("acknowledged id %d: %d rows, want 1", a.ID, counts[a.ID])
		}
	}
	for id, n := range counts {
		if n > 1 {
			t.Errorf("id %d: %d rows, want at most 1", id, n)
		}
	}
	t.Logf("%d acknowledged writes, %d rows %s, %d acknowledged writes lost", len(acked), len(counts), where, lost)
}
