package move_test

import (
	"database/sql"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/pgtenant/pgtenant/internal/analytics"
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
	write := func(from, to int) {
		t.Helper()
		conn, err := connectDSN(ctx, r.DSN)
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
	const digest = `SELECT count(*)::text || ':' || coalesce(string_agg(id::text || '=' || v, ',' ORDER BY id), '') FROM facts`
	sameAsHeap := func(when string) {
		t.Helper()
		conn, err := connectDSN(ctx, r.DSN)
		if err != nil {
			t.Fatal(err)
		}
		defer conn.Close(ctx)
		var heap, mirror string
		if err := conn.QueryRow(ctx, digest).Scan(&heap); err != nil {
			t.Fatal(err)
		}
		var last error
		for range 600 {
			last = d.Analytics().WithMirror(id, func(db *sql.DB) error { return db.QueryRow(digest).Scan(&mirror) })
			if last == nil && mirror == heap {
				return
			}
			time.Sleep(100 * time.Millisecond)
		}
		st, _ := c.AnalyticsStatus(ctx, id)
		t.Fatalf("%s: the mirror never equalled the heap (last error %v, status %+v)\nheap:   %.200s\nmirror: %.200s", when, last, st, heap, mirror)
	}
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
	view, err := c.Tenant(ctx, id)
	if err != nil {
		t.Fatal(err)
	}
	moved := 0
	for _, e := range view.Events {
		if e.Kind == "analytics" && strings.Contains(string(e.Detail), "the tenant moved from") {
			moved++
		}
	}
	if moved != 2 {
		t.Errorf("%d analytics events saying the tenant moved, want 2: %+v", moved, view.Events)
	}
}
