package failover_test

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/pgtenant/pgtenant/internal/api"
	"github.com/pgtenant/pgtenant/internal/catalog"
	"github.com/pgtenant/pgtenant/internal/config"
	"github.com/pgtenant/pgtenant/internal/console/consoletest"
	"github.com/pgtenant/pgtenant/internal/daemon/daemontest"
	"github.com/pgtenant/pgtenant/internal/jobs"
	"github.com/pgtenant/pgtenant/internal/migrate"
	"github.com/pgtenant/pgtenant/internal/patroni"
	"github.com/pgtenant/pgtenant/internal/patroni/patronitest"
	"github.com/pgtenant/pgtenant/internal/pgtest"
	"github.com/pgtenant/pgtenant/internal/provision"
	"github.com/pgtenant/pgtenant/internal/templates"
)

// TestSwitchover_PausesTheFrontDoor switches a Patroni cluster's leader
// with `cluster switchover` while clients write through two tenants' DSNs,
// one of a transaction-mode tier, one of a session-mode tier: the
// PgBouncer holds them while Patroni switches, the daemon follows the new
// leader, and the transaction-mode client sees no error (the
// session-mode one loses its server connection once, when the old
// leader stops); every acknowledged row is there once; cluster show
// lists the members with their roles; the new primary is prewarmed. Then
// `cluster failover --to` the old leader brings it back, and the
// console's switchover link hands over again. Requests that cannot be
// carried out answer 400 naming why.
func TestSwitchover_PausesTheFrontDoor(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	t.Cleanup(cancel)
	pc := patronitest.Start(t, ctx, patronitest.Options{Scope: "pc2",
		Parameters: map[string]string{"max_connections": "60"}, Programs: []string{"pgbouncer"}})
	leader, standby := pc.WaitLeaderAndSyncStandby(t, ctx, "")

	cfg := daemontest.Config(t, pg)
	cfg.Tiers["busy"] = config.Tier{ConnectionLimit: 5, PoolMode: "transaction", PoolSize: 2}
	local := daemontest.Managed(pg)
	d, c := daemontest.Following(t, ctx, cfg, []*pgtest.Cluster{pg}, pc, "pc2")

	for _, bad := range []struct {
		what   string
		change func(context.Context, string, api.SwitchoverRequest) (jobs.Job, error)
		name   string
		to     string
		want   string
	}{
		{"a failover without --to", c.Failover, "pc2", "", "--to"},
		{"an unknown member", c.Switchover, "pc2", "nosuch", "no member"},
		{"the leader itself", c.Switchover, "pc2", leader.Name, "leader already"},
		{"a cluster Patroni does not run", c.Switchover, local.Name, "", "not run by Patroni"},
	} {
		if _, err := bad.change(ctx, bad.name, api.SwitchoverRequest{To: bad.to}); !errors.Is(err, api.ErrInvalid) || !strings.Contains(err.Error(), bad.want) {
			t.Errorf("%s: got %v, want 400 naming %q", bad.what, err, bad.want)
		}
	}

	// doctor's failover check passes a cluster with a leader and a
	// synchronous standby.
	rep, err := c.Doctor(ctx, "pc2")
	if err != nil {
		t.Fatal(err)
	}
	var check string
	for _, cr := range rep.Clusters {
		for _, ch := range cr.Checks {
			if ch.Name == "failover" {
				check = ch.Status + ": " + ch.Got
			}
		}
	}
	if !strings.HasPrefix(check, "ok: leader "+leader.Name) {
		t.Errorf("doctor's failover check of pc2: %q, want ok naming the leader %s", check, leader.Name)
	}

	daemontest.CreateTemplate(t, c, "w", []templates.Upload{{Name: "0001_init.sql", Body: `CREATE TABLE writes (id int NOT NULL);`}})
	txn, err := c.CreateTenant(ctx, provision.Request{Template: "w", Cluster: "pc2", Tier: "busy"})
	if err != nil {
		t.Fatal(err)
	}
	session, err := c.CreateTenant(ctx, provision.Request{Template: "w", Cluster: "pc2"})
	if err != nil {
		t.Fatal(err)
	}
	// A transaction-mode client cannot keep prepared statements (PgBouncer
	// 1.18, docs/connections.md): pgx's statement cache is off for it.
	txnDSN := txn.DSN + map[bool]string{true: "&", false: "?"}[strings.Contains(txn.DSN, "?")] + "default_query_exec_mode=simple_protocol"
	wt := patronitest.StartWriter(t, ctx, txnDSN)
	ws := patronitest.StartWriter(t, ctx, session.DSN)
	wt.WaitAcks(t, ctx, 30, "30 writes of the transaction-mode tenant")
	ws.WaitAcks(t, ctx, 30, "30 writes of the session-mode tenant")

	started := time.Now()
	j, err := c.Switchover(ctx, "pc2", api.SwitchoverRequest{})
	if err != nil {
		t.Fatal(err)
	}
	if again, err := c.Switchover(ctx, "pc2", api.SwitchoverRequest{}); err != nil || again.ID != j.ID {
		t.Errorf("a second switchover while one runs: job %d, %v; want the same job %d", again.ID, err, j.ID)
	}
	j = waitJob(t, ctx, c, j.ID)
	newPort := pc.Node(standby.Name).Port()
	first := wt.WaitAckOn(t, ctx, newPort, started, 60*time.Second)
	ws.WaitAckOn(t, ctx, newPort, started, 60*time.Second)
	wt.WaitAcks(t, ctx, len(wt.Acks())+20, "20 writes of the transaction-mode tenant on the new leader")
	t.Logf("switchover: job %s in %.1fs (%s), first write on %s %.1fs after the request; longest pause: transaction mode %.1fs, session mode %.1fs (%d errors)",
		j.State, j.FinishedAt.Sub(*j.StartedAt).Seconds(), j.ProgressMsg, standby.Name, first.Sub(started).Seconds(),
		wt.LongestPause(started).Seconds(), ws.LongestPause(started).Seconds(), ws.Errors())
	if !strings.HasPrefix(j.ProgressMsg, standby.Name+" leads") {
		t.Errorf("switchover job's last line %q: want it to say %s leads", j.ProgressMsg, standby.Name)
	}
	if n := wt.Errors(); n != 0 {
		t.Errorf("transaction-mode client: %d errors across the switchover, want 0 (the pooler holds it); the last: %s", n, wt.LastError())
	}
	if n := ws.Errors(); n > 1 {
		t.Errorf("session-mode client: %d errors across the switchover, want at most 1 (its server connection, cut once); the last: %s", n, ws.LastError())
	}

	detail, err := c.Cluster(ctx, "pc2")
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(detail.DSN, fmt.Sprintf("port=%d", newPort)) || !detail.SynchronousMode || len(detail.Members) != 2 {
		t.Errorf("cluster show after the switchover: dsn %s, synchronous %v, %d members; want %s's port, synchronous, 2",
			detail.DSN, detail.SynchronousMode, len(detail.Members), standby.Name)
	}
	for _, m := range detail.Members {
		// (Patroni's timeline of the new leader is the store's, a loop
		// behind: not checked.)
		if (m.Name == standby.Name) != (m.Role == patroni.RoleLeader) {
			t.Errorf("cluster show: member %+v; want %s leading", m, standby.Name)
		}
	}
	if got := failovers(t, d, "pc2"); got != 1 {
		t.Errorf("pgtenant_failovers_total{cluster=pc2}: got %v, want 1", got)
	}
	warm, err := c.Jobs(ctx, url.Values{"type": {string(jobs.Prewarm)}})
	if err != nil || len(warm) == 0 || !strings.Contains(string(warm[0].Args), `"failover"`) || warm[0].Cluster != "pc2" {
		t.Errorf("prewarm of the new primary: jobs %+v, %v; want one of pc2 for the failover", warm, err)
	}

	// A forced failover back to the old leader, once it is the synchronous
	// standby again (Patroni promotes no other in synchronous mode).
	pc.WaitLeaderAndSyncStandby(t, ctx, standby.Name)
	started = time.Now()
	j, err = c.Failover(ctx, "pc2", api.SwitchoverRequest{To: leader.Name})
	if err != nil {
		t.Fatal(err)
	}
	waitJob(t, ctx, c, j.ID)
	wt.WaitAckOn(t, ctx, pc.Node(leader.Name).Port(), started, 60*time.Second)
	ws.WaitAckOn(t, ctx, pc.Node(leader.Name).Port(), started, 60*time.Second)
	t.Logf("failover back to %s: longest pause: transaction mode %.1fs, session mode %.1fs",
		leader.Name, wt.LongestPause(started).Seconds(), ws.LongestPause(started).Seconds())

	// The console's clusters page lists the members, each standby with a
	// switchover link, and its confirmation starts one.
	b := consoletest.New(t, d.URL())
	b.Login(d.Token())
	status, page := b.Get("/clusters")
	for _, want := range []string{"pc2: members (Patroni)", "synchronous replication", "/clusters/pc2/switchover?to=" + standby.Name} {
		if status != http.StatusOK || !strings.Contains(page, want) {
			t.Fatalf("console /clusters: %d, no %q in:\n%s", status, want, page)
		}
	}
	pc.WaitLeaderAndSyncStandby(t, ctx, leader.Name)
	started = time.Now()
	status, loc := b.Confirm("/clusters/pc2/switchover?to=" + standby.Name)
	var id int64
	if _, err := fmt.Sscanf(loc, "/jobs/%d?done=switchover", &id); status != http.StatusSeeOther || err != nil {
		t.Fatalf("console switchover: %d to %q, want a redirect to its job", status, loc)
	}
	waitJob(t, ctx, c, id)
	wt.WaitAckOn(t, ctx, newPort, started, 60*time.Second)
	t.Logf("console switchover to %s: longest pause: transaction mode %.1fs", standby.Name, wt.LongestPause(started).Seconds())

	// A daemon that died during a switchover's pause left the front door
	// paused, its clients waiting: the next attempt resumes it first (a
	// new switchover here, as the dead one's job resumed would).
	pc.WaitLeaderAndSyncStandby(t, ctx, standby.Name)
	if _, err := d.Poolers().Get("pc2").Hold(ctx, time.Second); err != nil {
		t.Fatal(err)
	}
	started = time.Now()
	if j, err = c.Switchover(ctx, "pc2", api.SwitchoverRequest{}); err != nil {
		t.Fatal(err)
	}
	waitJob(t, ctx, c, j.ID)
	wt.WaitAckOn(t, ctx, pc.Node(leader.Name).Port(), started, 60*time.Second)
	t.Logf("switchover with the front door left paused: longest pause: transaction mode %.1fs", wt.LongestPause(started).Seconds())

	// Counted before the writers stop (a stop cancels a write in flight).
	if n := wt.Errors(); n != 0 {
		t.Errorf("transaction-mode client: %d errors across the switchovers and the failover, want 0; the last: %s", n, wt.LastError())
	}
	for _, x := range []struct {
		w   *patronitest.Writer
		dsn string
	}{{wt, txn.DSN}, {ws, session.DSN}} {
		acked := x.w.Stop()
		patronitest.CheckRows(t, ctx, x.dsn, "through the pooler", acked)
	}
}

// waitJob waits for a job to succeed.
func waitJob(t *testing.T, ctx context.Context, c *api.Client, id int64) jobs.Job {
	t.Helper()
	wctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	j, err := c.WaitJob(wctx, id, nil)
	if err != nil || j.State != jobs.Succeeded {
		t.Fatalf("job %d: %s (%s), %v", id, j.State, j.LastError, err)
	}
	return j
}

// TestSwitchover_JobsInFlightFinish starts a rollout and a purge while a
// switchover of their cluster runs: both meet the old leader going away
// and finish on the new one; every tenant is at the new version, the
// purged one is gone, and reconcile finds nothing.
func TestSwitchover_JobsInFlightFinish(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	t.Cleanup(cancel)
	pc := patronitest.Start(t, ctx, patronitest.Options{Scope: "pc3",
		Parameters: map[string]string{"max_connections": "60"}, Programs: []string{"pgbouncer"}})
	_, standby := pc.WaitLeaderAndSyncStandby(t, ctx, "")
	_, c := daemontest.Following(t, ctx, daemontest.Config(t, pg), []*pgtest.Cluster{pg}, pc, "pc3")

	v1 := templates.Upload{Name: "0001_init.sql", Body: `CREATE TABLE items (id int PRIMARY KEY, note text);`}
	daemontest.CreateTemplate(t, c, "w", []templates.Upload{v1})
	var ids []string
	for range 6 {
		r, err := c.CreateTenant(ctx, provision.Request{Template: "w", Cluster: "pc3"})
		if err != nil {
			t.Fatal(err)
		}
		ids = append(ids, r.Tenant.ID)
	}
	// Half a second a tenant, one at a time: the rollout runs past the
	// switchover's end, so that its later tenants are migrated on the new
	// primary (its slots must look the cluster up again, not keep the old).
	added, err := c.PushTemplate(ctx, "w", []templates.Upload{v1, {Name: "0002_extra.sql", Body: `ALTER TABLE items ADD COLUMN extra int; SELECT pg_sleep(0.5);`}})
	if err != nil {
		t.Fatal(err)
	}
	for _, j := range added.BuildJobs {
		waitJob(t, ctx, c, j.ID)
	}

	sw, err := c.Switchover(ctx, "pc3", api.SwitchoverRequest{})
	if err != nil {
		t.Fatal(err)
	}
	ro, err := c.StartRollout(ctx, migrate.Request{Template: "w", Parallel: 1})
	if err != nil || ro.Rollout == nil || ro.Rollout.Job == nil {
		t.Fatalf("rollout during the switchover: %+v, %v", ro, err)
	}
	dropped, err := c.DropTenant(ctx, ids[0], true)
	if err != nil || dropped.Job == nil {
		t.Fatalf("purge during the switchover: %+v, %v", dropped, err)
	}
	waitJob(t, ctx, c, sw.ID)
	left := 0
	for _, id := range ids[1:] {
		if tn, err := c.Tenant(ctx, id); err == nil && tn.Version < 2 {
			left++
		}
	}
	t.Logf("tenants the rollout had left when the switchover ended: %d of %d", left, len(ids)-1)
	waitJob(t, ctx, c, ro.Rollout.Job.ID)
	waitJob(t, ctx, c, dropped.Job.ID)
	if d, err := c.Cluster(ctx, "pc3"); err != nil || !strings.Contains(d.DSN, fmt.Sprintf("port=%d", pc.Node(standby.Name).Port())) {
		t.Fatalf("after the switchover pc3 is at %s (%v), want %s's port", d.DSN, err, standby.Name)
	}
	for _, id := range ids[1:] {
		if tn, err := c.Tenant(ctx, id); err != nil || tn.Version != 2 {
			t.Errorf("tenant %s after the rollout across the switchover: version %d, %v; want 2", id, tn.Version, err)
		}
	}
	if tn, err := c.Tenant(ctx, ids[0]); err == nil && tn.State != catalog.StatePurged {
		t.Errorf("tenant %s after its purge across the switchover: %s, want purged", ids[0], tn.State)
	}
	// The old leader rejoins as the synchronous standby.
	pc.WaitLeaderAndSyncStandby(t, ctx, standby.Name)
	// The pool refills its spares meanwhile: reconcile once no job runs
	// (a spare's build makes its roles before its catalog row).
	patronitest.WaitFor(t, ctx, time.Minute, "no job queued or running", func() bool {
		js, err := c.Jobs(ctx, url.Values{"state": {string(jobs.Active)}})
		return err == nil && len(js) == 0
	}, func() string { return "jobs still active" })
	rep, err := c.Reconcile(ctx, api.ReconcileRequest{Cluster: "pc3"})
	if err != nil || len(rep.Findings) != 0 || len(rep.Errors) != 0 {
		t.Errorf("reconcile of pc3 after the switchover: %+v, %v; want nothing found", rep, err)
	}
}
