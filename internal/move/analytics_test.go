package move_test

import (
	"context"
	"database/sql"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/pgtenant/pgtenant/internal/analytics"
	"github.com/pgtenant/pgtenant/internal/api"
	"github.com/pgtenant/pgtenant/internal/daemon"
	"github.com/pgtenant/pgtenant/internal/jobs"
	"github.com/pgtenant/pgtenant/internal/pgtest"
	"github.com/pgtenant/pgtenant/internal/provision"
)

// TestMove_AnalyticsMirrorFollows: a database tenant's analytics mirror
// follows it to local2 and back. Once a move has switched, the mirror's
// status never says it streams from the copy the move left behind (it is
// copying, or streaming from the tenant's new cluster); rows written after
// each move reach the mirror, which then equals the heap; and the slot on
// the cluster the tenant left is gone.
func TestMove_AnalyticsMirrorFollows(t *testing.T) {
	ctx := pgtest.Context(t)
	d, c := fleet(t)
	r, err := c.CreateTenant(ctx, provision.Request{Template: "saas", Mode: "database", Cluster: "local"})
	if err != nil {
		t.Fatal(err)
	}
	id := r.Tenant.ID
	write := func(from, to int) { t.Helper(); writeFacts(t, ctx, r.DSN, from, to) }
	sameAsHeap := func(when string) { t.Helper(); mirrorEqualsHeap(t, ctx, d, c, id, r.DSN, when) }
	slots := func(pg *pgtest.Cluster) int {
		var n int
		if err := pg.Conn(t, "postgres").QueryRow(ctx, `SELECT count(*) FROM pg_replication_slots WHERE slot_name = $1`, analytics.SlotName(id)).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n
	}

	write(1, 100)
	if _, err := c.EnableAnalytics(ctx, id, nil); err != nil {
		t.Fatal(err)
	}
	sameAsHeap("before any move")
	next := 101
	for i, to := range []string{"local2", "local"} {
		from, target := pgs[i], pgs[1-i]
		write(next, next+99)
		next += 100
		j, err := c.MoveTenant(ctx, id, to)
		if err != nil {
			t.Fatal(err)
		}
		if j, err = c.WaitJob(ctx, j.ID, nil); err != nil || j.State != jobs.Succeeded {
			t.Fatalf("move to %s: %v %s %s", to, err, j.State, j.LastError)
		}
		st, err := c.AnalyticsStatus(ctx, id)
		if err != nil {
			t.Fatal(err)
		}
		if st.State != analytics.StateCopying && (st.State != analytics.StateStreaming || slots(target) != 1) {
			t.Errorf("status right after the move to %s: %s (%s); want copying, or streaming from %s", to, st.State, st.Error, to)
		}
		write(next, next+99) // through the same DSN, now served by the new cluster
		next += 100
		sameAsHeap(fmt.Sprintf("after the move to %s", to))
		if n := slots(from); n != 0 {
			t.Errorf("the cluster the tenant left still has the mirror's slot (%d)", n)
		}
		if n := slots(target); n != 1 {
			t.Errorf("the tenant's cluster %s has %d mirror slots, want 1", to, n)
		}
		if st, err := c.AnalyticsStatus(ctx, id); err != nil || st.State != analytics.StateStreaming {
			t.Errorf("status once equal: %+v %v; want streaming", st, err)
		}
	}
	if moved := events(t, ctx, c, id, "analytics", "the tenant moved from"); moved != 2 {
		t.Errorf("%d analytics events saying the tenant moved, want 2", moved)
	}
}

// writeFacts makes the table facts (id primary key, v) if need be and
// inserts ids from…to through dsn, then updates and deletes some.
func writeFacts(t *testing.T, ctx context.Context, dsn string, from, to int) {
	t.Helper()
	conn, err := connectDSN(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	if _, err := conn.Exec(ctx, `CREATE TABLE IF NOT EXISTS facts (id int PRIMARY KEY, v text);
		INSERT INTO facts SELECT g, 'v' || g FROM generate_series($1::int, $2::int) g;
		UPDATE facts SET v = v || '!' WHERE id % 7 = 0; DELETE FROM facts WHERE id % 11 = 0`, from, to); err != nil {
		t.Fatal(err)
	}
}

// factsDigest is every row of facts, in order, as one text.
const factsDigest = `SELECT count(*)::text || ':' || coalesce(string_agg(id::text || '=' || v, ',' ORDER BY id), '') FROM facts`

// mirrorEqualsHeap waits up to a minute for tenant id's analytics mirror
// to hold what facts holds through dsn, and fails the test with both
// when it never does.
func mirrorEqualsHeap(t *testing.T, ctx context.Context, d *daemon.Daemon, c *api.Client, id, dsn, when string) {
	t.Helper()
	conn, err := connectDSN(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	var heap, mirror string
	if err := conn.QueryRow(ctx, factsDigest).Scan(&heap); err != nil {
		t.Fatal(err)
	}
	var last error
	for range 600 {
		last = d.Analytics().WithMirror(id, func(db *sql.DB) error { return db.QueryRow(factsDigest).Scan(&mirror) })
		if last == nil && mirror == heap {
			return
		}
		time.Sleep(100 * time.Millisecond)
	}
	st, _ := c.AnalyticsStatus(ctx, id)
	t.Fatalf("%s: the mirror never equalled the heap (last error %v, status %+v)\nheap:   %.200s\nmirror: %.200s", when, last, st, heap, mirror)
}

// events counts tenant id's events of kind whose detail has text.
func events(t *testing.T, ctx context.Context, c *api.Client, id, kind, text string) int {
	t.Helper()
	view, err := c.Tenant(ctx, id)
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, e := range view.Events {
		if e.Kind == kind && strings.Contains(string(e.Detail), text) {
			n++
		}
	}
	return n
}
