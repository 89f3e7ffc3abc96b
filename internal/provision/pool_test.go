package provision_test

import (
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pgtenant/pgtenant/internal/config"
	"github.com/pgtenant/pgtenant/internal/daemon/daemontest"
	"github.com/pgtenant/pgtenant/internal/jobs"
	"github.com/pgtenant/pgtenant/internal/pgtest"
	"github.com/pgtenant/pgtenant/internal/provision"
	"github.com/pgtenant/pgtenant/internal/templates"
)

// poolState is a pool's spares by state (every version).
type poolState struct{ ready, building, retiring int }

func readPool(t *testing.T, conn *pgx.Conn, template, mode string) poolState {
	t.Helper()
	var p poolState
	err := conn.QueryRow(pgtest.Context(t), `SELECT count(*) FILTER (WHERE state = 'spare'),
		count(*) FILTER (WHERE state = 'building'), count(*) FILTER (WHERE state = 'purging' AND claimed_at IS NULL)
		FROM tenants WHERE template = $1 AND mode = $2`, template, mode).Scan(&p.ready, &p.building, &p.retiring)
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// TestPool_FollowsDemand: a burst of creates grows a pool of 2 towards the
// creates of the demand window, never past provision.max_pool_size, with
// several builds in flight; once no create came for pool_idle_after, the
// spares above the configured size are retired by purge jobs, one at a
// time, and the pool settles at its size.
func TestPool_FollowsDemand(t *testing.T) {
	cfg := daemontest.Config(t, pg)
	cfg.Provision.DefaultPoolSize = 0
	cfg.Pools = []config.PoolConfig{{Template: "tiny", Mode: "database", Size: 2}}
	cfg.Provision.MaxPoolSize = 6
	cfg.Provision.PoolDemandWindow = config.Duration(10 * time.Second)
	cfg.Provision.PoolIdleAfter = config.Duration(10 * time.Second)
	cfg.Provision.RefillParallel = 3
	cfg.Provision.PoolInterval = config.Duration(200 * time.Millisecond)
	cfg.Jobs.Workers = 6
	catDB := daemontest.CatalogDB(t, cfg)
	_, c := daemontest.Start(t, pg, cfg)
	ctx := pgtest.Context(t)
	daemontest.CreateTemplate(t, c, "tiny", tiny())
	waitSpares(t, catDB, "tiny", "database", 2)
	cat := pg.Conn(t, catDB)

	create := func(n int) {
		var wg sync.WaitGroup
		for range n {
			wg.Add(1)
			go func() {
				defer wg.Done()
				if _, err := c.CreateTenant(ctx, provision.Request{Template: "tiny", Mode: "database"}); err != nil {
					t.Errorf("create: %v", err)
				}
			}()
		}
		wg.Wait()
	}
	// Eight creates at once: the pool's 2 and 6 cold. The target is then
	// 8 creates × 1, capped at 6.
	create(8)
	var most, mostBuilding int
	lastCreate := time.Now()
	for {
		p := readPool(t, cat, "tiny", "database")
		most, mostBuilding = max(most, p.ready+p.building), max(mostBuilding, p.building)
		if p.ready >= 6 {
			break
		}
		// Keep the demand within the window while the pool grows, however
		// slow the machine: one more create now and then.
		if time.Since(lastCreate) > 3*time.Second {
			create(1)
			lastCreate = time.Now()
		}
		if ctx.Err() != nil {
			t.Fatalf("pool never grew to 6 ready spares (last %+v)", p)
		}
		time.Sleep(50 * time.Millisecond)
	}
	// Sampling may miss builds that overlap briefly: the jobs table keeps
	// when each spare build (priority 0; a cold create's is higher) was
	// enqueued and when it ended.
	var overlapped int
	if err := cat.QueryRow(ctx, `SELECT coalesce(max((SELECT count(*) FROM jobs k WHERE k.type = $1 AND k.priority = 0
		AND k.created_at <= j.created_at AND coalesce(k.finished_at, 'infinity') > j.created_at)), 0)
		FROM jobs j WHERE j.type = $1 AND j.priority = 0`, jobs.TenantBuild).Scan(&overlapped); err != nil {
		t.Fatal(err)
	}
	mostBuilding = max(mostBuilding, overlapped)
	if mostBuilding < 2 {
		t.Errorf("at most %d spare builds in flight while the pool grew, want several (refill_parallel 3)", mostBuilding)
	}

	// No more creates: the pool goes back to its size once idle.
	var mostRetiring int
	for {
		p := readPool(t, cat, "tiny", "database")
		most, mostRetiring = max(most, p.ready+p.building), max(mostRetiring, p.retiring)
		if p.ready+p.building < 2 {
			t.Fatalf("pool shrank below its size: %+v", p)
		}
		if p.ready == 2 && p.building == 0 && p.retiring == 0 {
			break
		}
		if ctx.Err() != nil {
			t.Fatalf("pool never shrank back to 2 (last %+v)", p)
		}
		time.Sleep(50 * time.Millisecond)
	}
	if most > 6 {
		t.Errorf("pool held %d spares (ready and building) at most, want at most max_pool_size 6", most)
	}
	if mostRetiring > 1 {
		t.Errorf("%d spares retired at once, want one at a time", mostRetiring)
	}
	// The last purge marks its tenant purged a moment before its job ends.
	var retired, unfinished int
	for {
		if err := cat.QueryRow(ctx, `SELECT count(*) FILTER (WHERE state = 'succeeded'), count(*) FILTER (WHERE state <> 'succeeded')
			FROM jobs WHERE type = 'tenant.purge' AND args->>'reason' LIKE 'spare above the pool''s size%'`).Scan(&retired, &unfinished); err != nil {
			t.Fatal(err)
		}
		if unfinished == 0 || ctx.Err() != nil {
			break
		}
		time.Sleep(50 * time.Millisecond)
	}
	if retired < 4 || unfinished != 0 {
		t.Errorf("retirement purges: %d succeeded, %d not, want at least 4 (6 spares back to 2), all succeeded", retired, unfinished)
	}
	// Still a pool: a create is served from it.
	got, err := c.CreateTenant(ctx, provision.Request{Template: "tiny", Mode: "database"})
	if err != nil || got.Path != "pool" {
		t.Errorf("create after the shrink: path %q, %v; want pool", got.Path, err)
	}
}

// TestPool_TargetFollowsDemand: the target is the window's creates × the
// factor, within the configured size and max_pool_size; a pool of 0 stays
// off and one configured above the maximum keeps its size.
func TestPool_TargetFollowsDemand(t *testing.T) {
	pc := config.Default().Provision // size 5, max 50, factor 1
	for _, tc := range []struct {
		size, recent, want int
		factor             float64
	}{
		{5, 0, 5, 1}, {5, 3, 5, 1}, {5, 12, 12, 1}, {5, 120, 50, 1}, {5, 12, 24, 2}, {5, 7, 10, 1.3},
		{0, 100, 0, 1}, {60, 100, 60, 1}, {50, 100, 50, 1},
	} {
		pc.PoolDemandFactor = tc.factor
		if got := provision.Target(pc, tc.size, tc.recent); got != tc.want {
			t.Errorf("Target(size %d, %d creates, factor %g) = %d, want %d", tc.size, tc.recent, tc.factor, got, tc.want)
		}
	}
}

// TestPool_RetiresStaleSpares: once a template's newer version is built,
// the pool retires the spares of the older one (purge jobs) and refills
// with the new version.
func TestPool_RetiresStaleSpares(t *testing.T) {
	cfg := daemontest.Config(t, pg)
	cfg.Provision.DefaultPoolSize = 0
	cfg.Pools = []config.PoolConfig{{Template: "stale", Mode: "database", Size: 2}}
	cfg.Provision.PoolInterval = config.Duration(200 * time.Millisecond)
	catDB := daemontest.CatalogDB(t, cfg)
	_, c := daemontest.Start(t, pg, cfg)
	ctx := pgtest.Context(t)
	daemontest.CreateTemplate(t, c, "stale", tiny())
	waitSpares(t, catDB, "stale", "database", 2)
	added, err := c.PushTemplate(ctx, "stale", append(tiny(), templates.Upload{Name: "0002.sql", Body: "CREATE TABLE u (y int);"}))
	if err != nil {
		t.Fatal(err)
	}
	for _, j := range added.BuildJobs {
		if j, err := c.WaitJob(ctx, j.ID, nil); err != nil || j.State != jobs.Succeeded {
			t.Fatalf("build job %d of version 2: %s %v: %s", j.ID, j.State, err, j.LastError)
		}
	}
	cat := pg.Conn(t, catDB)
	for {
		var old, fresh, retired int
		if err := cat.QueryRow(ctx, `SELECT
			(SELECT count(*) FROM tenants WHERE template = 'stale' AND state = 'spare' AND version = 1),
			(SELECT count(*) FROM tenants WHERE template = 'stale' AND state = 'spare' AND version = 2),
			(SELECT count(*) FROM jobs WHERE type = $1 AND state = 'succeeded' AND args->>'reason' = 'spare of an old template version')`,
			jobs.TenantPurge).Scan(&old, &fresh, &retired); err != nil {
			t.Fatal(err)
		}
		if old == 0 && fresh == 2 && retired == 2 {
			break
		}
		if ctx.Err() != nil {
			t.Fatalf("%d spares of version 1 left (%d retired by purges), %d of version 2: want 0 (2), 2", old, retired, fresh)
		}
		time.Sleep(100 * time.Millisecond)
	}
}
