package move_test

import (
	"encoding/json"
	"fmt"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/pgtenant/pgtenant/internal/api"
	"github.com/pgtenant/pgtenant/internal/config"
	"github.com/pgtenant/pgtenant/internal/daemon/daemontest"
	"github.com/pgtenant/pgtenant/internal/jobs"
	"github.com/pgtenant/pgtenant/internal/pgtest"
	"github.com/pgtenant/pgtenant/internal/provision"
	"github.com/pgtenant/pgtenant/internal/tenant"
)

const sessionTier = "session"

// TestMove_EndsSessionModeClientsThatStay moves a tenant of a session-mode
// tier while a client keeps its connection through the pooler open (idle
// but for a SELECT 1 every 100 ms): PAUSE would wait for it for ever.
// After the pause timeout (10 s) the move ends the tenant's sessions,
// records how many in a move_sessions_ended event and cuts over: the move
// succeeds at its first attempt, the client's connection is ended, and the
// client, reconnecting at once through the same DSN, reaches the tenant on
// the target with its rows.
func TestMove_EndsSessionModeClientsThatStay(t *testing.T) {
	ctx := pgtest.Context(t)
	cfg := testConfig(t)
	cfg.Tiers[sessionTier] = config.Tier{ConnectionLimit: 5, StatementTimeout: config.Duration(30 * time.Second),
		PoolMode: "session", PoolSize: 2, MaxDBConnections: 2}
	_, c, _ := daemontest.StartClusters(t, pgs, cfg, true)
	buildSaas(t, c)
	r, err := c.CreateTenant(ctx, provision.Request{Template: "saas", Mode: "database", Tier: sessionTier, Cluster: "local"})
	if err != nil {
		t.Fatal(err)
	}
	id := r.Tenant.ID
	before, err := c.Tenant(ctx, id)
	if err != nil {
		t.Fatal(err)
	}
	held, err := connectDSN(ctx, r.DSN)
	if err != nil {
		t.Fatal(err)
	}
	defer held.Close(ctx)
	if _, err := held.Exec(ctx, `INSERT INTO organizations (name, slug) VALUES ('kept', 'kept')`); err != nil {
		t.Fatal(err)
	}
	// The client: its connection until it is ended, then a new one at once.
	type reconnected struct {
		lost       error
		port       string
		kept       int
		err        error
		lostAt, at time.Time
	}
	stop, finished := make(chan struct{}), make(chan struct{})
	got := make(chan reconnected, 1)
	defer func() { // before held.Close: the client is done with it
		select {
		case <-stop:
		default:
			close(stop)
		}
		<-finished
	}()
	go func() {
		defer close(finished)
		var rc reconnected
		defer func() { got <- rc }()
		for {
			select {
			case <-stop:
				return
			case <-time.After(100 * time.Millisecond):
			}
			var one int
			if rc.lost = held.QueryRow(ctx, `SELECT 1`).Scan(&one); rc.lost != nil {
				break
			}
		}
		rc.lostAt = time.Now()
		conn, err := connectDSN(ctx, r.DSN)
		if err != nil {
			rc.err = err
			return
		}
		defer conn.Close(ctx)
		rc.err = conn.QueryRow(ctx, `SELECT current_setting('port'), (SELECT count(*) FROM organizations WHERE slug = 'kept')`).Scan(&rc.port, &rc.kept)
		rc.at = time.Now()
	}()

	start := time.Now()
	j, err := c.MoveTenant(ctx, id, "local2")
	if err != nil {
		t.Fatal(err)
	}
	j, err = c.WaitJob(ctx, j.ID, nil)
	if err != nil || j.State != jobs.Succeeded {
		t.Fatalf("move: %v %s %s; want succeeded", err, j.State, j.LastError)
	}
	if took := time.Since(start); took < 10*time.Second {
		t.Errorf("the move took %s, want at least the pause timeout (10 s) before the sessions were ended", took)
	}
	if j.Attempts != 0 {
		t.Errorf("move attempts %d (last error %q), want 0: the pause does not fail", j.Attempts, j.LastError)
	}

	after, err := c.Tenant(ctx, id)
	if err != nil {
		t.Fatal(err)
	}
	if after.Cluster != "local2" || after.DSN != before.DSN {
		t.Errorf("after the move: cluster %s dsn %s; want local2 and the same dsn %s", after.Cluster, after.DSN, before.DSN)
	}
	var ended []int
	for _, e := range after.Events {
		if e.Kind != "move_sessions_ended" {
			continue
		}
		var d struct {
			Sessions int `json:"sessions"`
		}
		if err := json.Unmarshal(e.Detail, &d); err != nil {
			t.Fatal(err)
		}
		ended = append(ended, d.Sessions)
	}
	if len(ended) != 1 || ended[0] < 1 {
		t.Errorf("move_sessions_ended events: %v sessions; want one event with at least the held client's session (events %+v)", ended, after.Events)
	}

	// The held connection was ended; the client's new one reached the
	// target.
	var rc reconnected
	select {
	case rc = <-got:
	case <-time.After(30 * time.Second):
		close(stop)
		rc = <-got
	}
	switch {
	case rc.lost == nil:
		t.Errorf("the client's connection held across the move still answers; want it ended")
	case rc.err != nil:
		t.Errorf("the client lost its connection (%v) and could not reconnect: %v", rc.lost, rc.err)
	case !strings.Contains(pgs[1].PrimaryDSN("postgres"), rc.port) || rc.kept != 1:
		t.Errorf("the client, reconnected at once: port %s, %d kept rows; want local2's (%s) and 1", rc.port, rc.kept, pgs[1].PrimaryDSN("postgres"))
	default:
		t.Logf("connection lost after %s (%v); reconnected in %s", rc.lostAt.Sub(start).Round(time.Millisecond), rc.lost, rc.at.Sub(rc.lostAt).Round(time.Millisecond))
	}
	conn, err := connectDSN(ctx, r.DSN)
	if err != nil {
		t.Fatalf("reconnect after the move: %v", err)
	}
	defer conn.Close(ctx)
	var port string
	var kept int
	if err := conn.QueryRow(ctx, `SELECT current_setting('port'), (SELECT count(*) FROM organizations WHERE slug = 'kept')`).Scan(&port, &kept); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(pgs[1].PrimaryDSN("postgres"), port) || kept != 1 {
		t.Errorf("after reconnecting: port %s, %d kept rows; want local2's (%s) and 1", port, kept, pgs[1].PrimaryDSN("postgres"))
	}
	if _, err := conn.Exec(ctx, `INSERT INTO organizations (name, slug) VALUES ('after', 'after')`); err != nil {
		t.Errorf("write on the target after the move: %v", err)
	}
}

// TestMove_BackWithinRetention moves a tenant to local2 and back to local
// while the copy the first move left on local is kept for drop.retention
// (an hour here). A database tenant's move back purges that leftover
// itself (the same tenant's older data, whose purge was queued), cancels
// its queued purge and succeeds: the tenant serves on local with the rows
// written on either side. A schema tenant whose leftover purge was
// cancelled by hand is refused, naming the command that purges it
// (`pgtenant job retry N`); once that has run, the move back succeeds.
func TestMove_BackWithinRetention(t *testing.T) {
	ctx := pgtest.Context(t)
	cfg := testConfig(t)
	cfg.Drop.Retention = config.Duration(time.Hour)
	_, c, _ := daemontest.StartClusters(t, pgs, cfg, true)
	buildSaas(t, c)
	for _, mode := range []string{"database", "schema"} {
		t.Run(mode, func(t *testing.T) {
			r, err := c.CreateTenant(ctx, provision.Request{Template: "saas", Mode: tenant.Mode(mode), Tier: pooledTier, Cluster: "local"})
			if err != nil {
				t.Fatal(err)
			}
			id := r.Tenant.ID
			write := func(slug string) {
				t.Helper()
				conn, err := connectDSN(ctx, r.DSN)
				if err != nil {
					t.Fatal(err)
				}
				defer conn.Close(ctx)
				if _, err := conn.Exec(ctx, `INSERT INTO organizations (name, slug) VALUES ('`+slug+`', '`+slug+`')`); err != nil {
					t.Fatal(err)
				}
			}
			moveTo := func(to string) jobs.Job {
				t.Helper()
				j, err := c.MoveTenant(ctx, id, to)
				if err != nil {
					t.Fatal(err)
				}
				if j, err = c.WaitJob(ctx, j.ID, nil); err != nil {
					t.Fatal(err)
				}
				return j
			}
			write("first")
			if j := moveTo("local2"); j.State != jobs.Succeeded {
				t.Fatalf("move to local2: %s %s", j.State, j.LastError)
			}
			write("second")
			left := leftoverPurge(t, c, id, "local")
			if left.State != jobs.Queued || left.RunAfter.Before(time.Now().Add(30*time.Minute)) {
				t.Fatalf("the leftover's purge job %d: %s, runs after %s; want queued for the retention (1 h)", left.ID, left.State, left.RunAfter)
			}

			if mode == "schema" {
				// Its purge cancelled: refused, naming the command.
				if _, err := c.CancelJob(ctx, left.ID); err != nil {
					t.Fatal(err)
				}
				j := moveTo("local")
				retry := fmt.Sprintf("pgtenant job retry %d", left.ID)
				if j.State != jobs.Failed || !strings.Contains(j.LastError, "still has a copy") || !strings.Contains(j.LastError, retry) {
					t.Fatalf("move back with the leftover's purge cancelled: %s %q; want refused naming `%s`", j.State, j.LastError, retry)
				}
				if _, err := c.RetryJob(ctx, left.ID); err != nil {
					t.Fatal(err)
				}
				if p, err := c.WaitJob(ctx, left.ID, nil); err != nil || p.State != jobs.Succeeded {
					t.Fatalf("`%s`: %v %s %s", retry, err, p.State, p.LastError)
				}
			}

			j := moveTo("local")
			if j.State != jobs.Succeeded {
				t.Fatalf("move back within the retention: %s %q; want succeeded", j.State, j.LastError)
			}
			if mode == "database" {
				if got := leftoverPurgeByID(t, c, left.ID); got.State != jobs.Cancelled {
					t.Errorf("the first move's leftover purge job %d is %s after the move back, want cancelled (the move back purged it)", left.ID, got.State)
				}
				after, err := c.Tenant(ctx, id)
				if err != nil {
					t.Fatal(err)
				}
				var purged int
				for _, e := range after.Events {
					if e.Kind == "move_leftover_purged" {
						purged++
					}
				}
				if purged != 1 {
					t.Errorf("move_leftover_purged events = %d, want 1 (events %+v)", purged, after.Events)
				}
			}
			after, err := c.Tenant(ctx, id)
			if err != nil || after.Cluster != "local" || after.State != "active" {
				t.Fatalf("after the move back: %+v %v; want active on local", after.Tenant, err)
			}
			conn, err := connectDSN(ctx, r.DSN)
			if err != nil {
				t.Fatal(err)
			}
			defer conn.Close(ctx)
			var port string
			var rows int
			if err := conn.QueryRow(ctx, `SELECT current_setting('port'), (SELECT count(*) FROM organizations WHERE slug IN ('first', 'second'))`).Scan(&port, &rows); err != nil {
				t.Fatal(err)
			}
			if !strings.Contains(pgs[0].PrimaryDSN("postgres"), port) || rows != 2 {
				t.Errorf("after the move back: port %s, %d of the 2 rows; want local's (%s) and both", port, rows, pgs[0].PrimaryDSN("postgres"))
			}
			// Its copy on local2 is now the leftover kept for the retention.
			if back := leftoverPurge(t, c, id, "local2"); back.State != jobs.Queued {
				t.Errorf("the move back's leftover purge job %d is %s, want queued", back.ID, back.State)
			}
		})
	}
}

// leftoverPurge returns the newest purge job of the copy of tenant id a
// move left on cluster.
func leftoverPurge(t *testing.T, c *api.Client, id, cluster string) jobs.Job {
	t.Helper()
	js, err := c.Jobs(pgtest.Context(t), url.Values{"type": {string(jobs.TenantPurge)}, "target": {id}})
	if err != nil {
		t.Fatal(err)
	}
	for _, j := range js {
		if j.Cluster == cluster {
			return j
		}
	}
	t.Fatalf("no purge job of tenant %s's leftover on %s among %+v", id, cluster, js)
	return jobs.Job{}
}

func leftoverPurgeByID(t *testing.T, c *api.Client, id int64) jobs.Job {
	t.Helper()
	j, err := c.Job(pgtest.Context(t), id)
	if err != nil {
		t.Fatal(err)
	}
	return j
}
