package bench

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"time"

	"github.com/jackc/pgx/v5"

	examples "github.com/pgtenant/pgtenant/examples/templates"
	"github.com/pgtenant/pgtenant/internal/catalog"
	"github.com/pgtenant/pgtenant/internal/cluster"
	"github.com/pgtenant/pgtenant/internal/fleet"
	"github.com/pgtenant/pgtenant/internal/jobs"
	"github.com/pgtenant/pgtenant/internal/provision"
	"github.com/pgtenant/pgtenant/internal/templates"
	"github.com/pgtenant/pgtenant/internal/tenant"
)

// DropOptions tune `bench drop`.
type DropOptions struct {
	Copies       int // T of the smaller wide template
	BigCopies    int // T of the big one: at least 20,000 relations per tenant at 200
	SmallTenants int // saas database tenants purged one after another
}

// Methods of `bench drop`, in table order.
const (
	methodMonolithic = "schema: DROP SCHEMA ... CASCADE, one transaction"
	methodBatched    = "schema: pgtenant purge (batched)"
	methodDropDB     = "database: pgtenant purge (DROP DATABASE)"
	methodDropMany   = "database: pgtenant purge, one after another"
)

// DropRow is one method on one kind of tenant.
type DropRow struct {
	Template  string `json:"template"`
	Relations int    `json:"relations_per_tenant"`
	Method    string `json:"method"`
	N         int    `json:"tenants"`
	OK        bool   `json:"ok"`
	Error     string `json:"error,omitempty"`
	// P50 and P95 are per tenant (the sequence of small drops).
	P50  time.Duration `json:"p50_ns,omitempty"`
	P95  time.Duration `json:"p95_ns,omitempty"`
	Cost Cost          `json:"cost"`
	// StandbyRestarted: the standby was down after the method and was started again.
	StandbyRestarted bool `json:"standby_restarted,omitempty"`
}

// DropResult is what `bench drop` measured.
type DropResult struct {
	Options DropOptions         `json:"options"`
	Locks   string              `json:"max_locks_per_transaction"`
	Rows    []DropRow           `json:"rows"`
	Tenants map[string][]string `json:"tenants"` // per template, the tenants built for the run
}

// Drop runs `bench drop`: on one fleet with a streaming standby and
// PostgreSQL's default max_locks_per_transaction (64), for `wide` at two
// sizes it drops a schema tenant in one DROP SCHEMA … CASCADE, purges
// another with pgtenant's batched purge, purges a database tenant, and then
// purges small `saas` database tenants one after another.
func (e *Env) Drop(ctx context.Context, opts DropOptions) (DropResult, Table, error) {
	res := DropResult{Options: opts, Locks: "64", Tenants: map[string][]string{}}
	if opts.Copies < 1 || opts.BigCopies <= opts.Copies || opts.SmallTenants < 1 {
		return res, Table{}, fmt.Errorf("want 1 <= --copies < --big-copies and --small-tenants >= 1")
	}
	fc, stop, err := e.fleetFor(ctx, "drop", map[string]string{"max_locks_per_transaction": "64", "wal_keep_size": "2GB"}, false)
	if err != nil {
		return res, Table{}, err
	}
	defer stop()
	meter, err := newMeter(ctx, fc)
	if err != nil {
		return res, Table{}, err
	}
	defer meter.Close()
	d, err := e.startDaemonInProcess(ctx, fc, benchConfig(fc, filepath.Join(e.Dir, "drop")))
	if err != nil {
		return res, Table{}, err
	}
	defer d.Stop()

	wides := []string{fmt.Sprintf("wide%d", opts.Copies), fmt.Sprintf("wide%d", opts.BigCopies)}
	for i, copies := range []int{opts.Copies, opts.BigCopies} {
		e.logf("drop: materialising template %s", wides[i])
		if err := d.createTemplate(ctx, wides[i], templates.Wide(copies)); err != nil {
			return res, Table{}, err
		}
	}
	if err := d.createTemplate(ctx, "saas", examples.Saas()); err != nil {
		return res, Table{}, err
	}
	// Per wide template: a schema tenant for the monolithic drop, one for
	// pgtenant's purge, and a database tenant. All built by pgtenant (the
	// pool is empty: the cold path), which works at lock limit 64.
	modes := []tenant.Mode{tenant.ModeSchema, tenant.ModeSchema, tenant.ModeDatabase}
	for _, w := range wides {
		for _, mode := range modes {
			e.logf("drop: building a %s tenant of %s", mode, w)
			id, err := createTenant(ctx, d, w, mode)
			if err != nil {
				return res, Table{}, err
			}
			res.Tenants[w] = append(res.Tenants[w], id)
		}
	}
	e.logf("drop: building %d saas database tenants", opts.SmallTenants)
	for range opts.SmallTenants {
		id, err := createTenant(ctx, d, "saas", tenant.ModeDatabase)
		if err != nil {
			return res, Table{}, err
		}
		res.Tenants["saas"] = append(res.Tenants["saas"], id)
	}
	if err := d.waitIdle(ctx); err != nil {
		return res, Table{}, err
	}

	add := func(r DropRow) {
		result := "ok"
		if !r.OK {
			result = r.Error
		}
		e.logf("drop: %s (%d rels), %s: %s in %s, WAL %s, largest record %s, peak locks %d, peak lag %s (WAL %s..%s)",
			r.Template, r.Relations, r.Method, result, r.Cost.Duration.Round(time.Millisecond), withFPI(r.Cost.WALBytes, r.Cost),
			r.Cost.LargestRecord, r.Cost.PeakLocks, kb(r.Cost.PeakLagBytes), r.Cost.StartLSN, r.Cost.EndLSN)
		res.Rows = append(res.Rows, r)
	}
	for _, w := range wides {
		ids := res.Tenants[w]
		shared := templates.SharedDatabase(w)
		for i, method := range []string{methodMonolithic, methodBatched, methodDropDB} {
			row := DropRow{Template: w, Method: method, N: 1}
			db, schema := shared, tenant.PhysicalName(ids[i])
			if method == methodDropDB {
				db, schema = tenant.PhysicalName(ids[i]), ""
			}
			if row.Relations, err = countRelations(ctx, fc, db, schema); err != nil {
				return res, Table{}, err
			}
			e.logf("drop: %s, %s: %d relations", w, method, row.Relations)
			settle := []string{"pgtenant"}
			if method != methodDropDB {
				settle = append(settle, shared)
			}
			if err := meter.Settle(ctx, settle...); err != nil {
				return res, Table{}, err
			}
			x, err := meter.Start(ctx)
			if err != nil {
				return res, Table{}, err
			}
			var derr error
			if method == methodMonolithic {
				derr = dropSchemaCascade(ctx, fc, shared, schema)
			} else {
				derr = purgeTenant(ctx, d, ids[i])
			}
			if row.Cost, err = x.Stop(ctx); err != nil {
				return res, Table{}, err
			}
			row.OK = derr == nil
			if derr != nil {
				row.Error = derr.Error()
			}
			if row.StandbyRestarted, err = ensureStandby(ctx, fc, meter); err != nil {
				return res, Table{}, err
			}
			add(row)
		}
	}

	small := res.Tenants["saas"]
	row := DropRow{Template: "saas", Method: methodDropMany, N: len(small), OK: true}
	if row.Relations, err = countRelations(ctx, fc, tenant.PhysicalName(small[0]), ""); err != nil {
		return res, Table{}, err
	}
	e.logf("drop: purging %d saas database tenants one after another", len(small))
	if err := meter.Settle(ctx, "pgtenant"); err != nil {
		return res, Table{}, err
	}
	x, err := meter.Start(ctx)
	if err != nil {
		return res, Table{}, err
	}
	var lat []time.Duration
	for _, id := range small {
		t0 := time.Now()
		if err := purgeTenant(ctx, d, id); err != nil {
			if row.OK {
				row.Error = err.Error()
			}
			row.OK = false
			continue
		}
		lat = append(lat, time.Since(t0))
	}
	if row.Cost, err = x.Stop(ctx); err != nil {
		return res, Table{}, err
	}
	row.P50, row.P95, _ = latencyStats(lat, row.Cost.Duration)
	if row.StandbyRestarted, err = ensureStandby(ctx, fc, meter); err != nil {
		return res, Table{}, err
	}
	add(row)
	return res, dropTable(res), nil
}

// createTenant creates a tenant through the API and waits until it is active.
func createTenant(ctx context.Context, d *benchDaemon, template string, mode tenant.Mode) (string, error) {
	r, err := d.client.CreateTenant(ctx, provision.Request{Template: template, Mode: mode})
	if err != nil {
		return "", fmt.Errorf("create a %s tenant of %s: %w", mode, template, err)
	}
	if r.Job != nil {
		j, err := d.waitJob(ctx, r.Job.ID)
		if err != nil {
			return "", err
		}
		if j.State != jobs.Succeeded {
			return "", fmt.Errorf("build of a %s tenant of %s: job %d %s: %s", mode, template, j.ID, j.State, j.LastError)
		}
	}
	return r.Tenant.ID, nil
}

// countRelations counts the relations of a schema (or, with schema "", of a
// whole database) outside the system schemas.
func countRelations(ctx context.Context, fc *fleet.Cluster, db, schema string) (int, error) {
	conn, err := pgx.Connect(ctx, fc.PrimaryDSN(db))
	if err != nil {
		return 0, err
	}
	defer conn.Close(ctx)
	return cluster.CountUserRelations(ctx, conn, schema)
}

// dropSchemaCascade drops a schema the way a hand-written tenant drop does:
// one DROP SCHEMA … CASCADE, one transaction.
func dropSchemaCascade(ctx context.Context, fc *fleet.Cluster, db, schema string) error {
	conn, err := pgx.Connect(ctx, fc.PrimaryDSN(db))
	if err != nil {
		return err
	}
	defer conn.Close(context.WithoutCancel(ctx))
	_, err = conn.Exec(ctx, "DROP SCHEMA "+cluster.Ident(schema)+" CASCADE")
	return err
}

// purgeTenant drops a tenant with purge now and waits for its purge job.
func purgeTenant(ctx context.Context, d *benchDaemon, id string) error {
	r, err := d.client.DropTenant(ctx, id, true)
	if err != nil {
		return err
	}
	if r.Job == nil {
		return fmt.Errorf("drop %s --purge-now started no purge job", id)
	}
	j, err := d.waitJob(ctx, r.Job.ID)
	if err != nil {
		return err
	}
	if j.State != jobs.Succeeded {
		return fmt.Errorf("purge job %d %s: %s", j.ID, j.State, j.LastError)
	}
	if _, err := d.client.Tenant(ctx, id); !errors.Is(err, catalog.ErrNotFound) {
		return fmt.Errorf("tenant %s still in the catalog after its purge (%v)", id, err)
	}
	return nil
}

// ensureStandby starts the fleet's standby again if a method brought it down
// (it replays the primary's AccessExclusiveLocks in its own lock table), and
// waits until it answers.
func ensureStandby(ctx context.Context, fc *fleet.Cluster, meter *Meter) (bool, error) {
	if meter.standby == nil || meter.standby.Ping(ctx) == nil {
		return false, nil
	}
	sb := fc.Standbys()[0]
	if err := fc.StartNode(ctx, sb.Name); err != nil {
		return true, fmt.Errorf("restart standby %s: %w", sb.Name, err)
	}
	for i := 0; i < 600; i++ {
		if meter.standby.Ping(ctx) == nil {
			return true, nil
		}
		time.Sleep(100 * time.Millisecond)
	}
	return true, fmt.Errorf("standby %s does not answer after a restart", sb.Name)
}

func dropTable(r DropResult) Table {
	t := Table{
		Title: fmt.Sprintf("pgtenant bench drop: one primary + streaming standby, max_locks_per_transaction=%s (PostgreSQL's default)", r.Locks),
		Columns: []string{"tenant", "method", "result", "time", "WAL", "largest WAL record", "peak locks",
			"ckpts", "peak replay lag", "standby caught up"},
		Data: map[string]any{"result": r},
	}
	for _, x := range r.Rows {
		label := fmt.Sprintf("%s (%d rels)", x.Template, x.Relations)
		result := "ok"
		if x.N > 1 {
			label = fmt.Sprintf("%d x %s (%d rels each)", x.N, x.Template, x.Relations)
			result = fmt.Sprintf("ok, p50 %s, p95 %s each", ms(x.P50), ms(x.P95))
		}
		if !x.OK {
			result = "FAILED: " + x.Error
		}
		if x.StandbyRestarted {
			result += " (standby went down; restarted)"
		}
		t.Rows = append(t.Rows, []string{label, x.Method, result, x.Cost.Duration.Round(10 * time.Millisecond).String(),
			withFPI(x.Cost.WALBytes, x.Cost), x.Cost.LargestRecord.String(), fmt.Sprint(x.Cost.PeakLocks), fmt.Sprint(x.Cost.Checkpoints),
			kb(x.Cost.PeakLagBytes), caughtUp(x.Cost)})
		if x.Cost.WALDumpError != "" {
			t.Notes = append(t.Notes, fmt.Sprintf("%s, %s: pg_waldump: %s", x.Template, x.Method, x.Cost.WALDumpError))
		}
		if x.Cost.StandbyErrors > 0 {
			t.Notes = append(t.Notes, fmt.Sprintf("%s, %s: %d samples could not reach the standby: %s", x.Template, x.Method, x.Cost.StandbyErrors, x.Cost.StandbyError))
		}
	}
	var big, mono *DropRow
	var batched []DropRow
	for i, x := range r.Rows {
		switch x.Method {
		case methodBatched:
			batched = append(batched, x)
			if big == nil || x.Relations > big.Relations {
				big = &r.Rows[i]
			}
		}
	}
	if big != nil {
		for i, x := range r.Rows {
			if x.Method == methodMonolithic && x.Template == big.Template {
				mono = &r.Rows[i]
			}
		}
	}
	if big != nil && mono != nil {
		got := fmt.Sprintf("batched purge of %d relations: %s; monolithic drop: %s", big.Relations, okOr(*big), okOr(*mono))
		t.Checks = append(t.Checks, Check{Target: "batched purge succeeds at >= 20,000 relations where the monolithic drop fails",
			Got: got, Met: big.OK && big.Relations >= 20000 && !mono.OK})
	}
	if len(batched) > 0 {
		var recs, lags string
		recOK, lagOK := true, true
		for i, x := range batched {
			if i > 0 {
				recs, lags = recs+"; ", lags+"; "
			}
			recs += fmt.Sprintf("%s at %d rels", x.Cost.LargestRecord, x.Relations)
			lags += fmt.Sprintf("%s at %d rels", kb(x.Cost.PeakLagBytes), x.Relations)
			recOK = recOK && x.OK && x.Cost.LargestRecord.Total > 0 && x.Cost.LargestRecord.Total <= 128<<10
			lagOK = lagOK && x.OK && x.Cost.PeakLagBytes <= 64<<20
		}
		t.Checks = append(t.Checks,
			Check{Target: "batched purge: largest WAL record <= 128 KB", Got: recs, Met: recOK},
			Check{Target: "batched purge: peak standby replay lag <= 64 MB", Got: lags, Met: lagOK})
	}
	t.Notes = append(t.Notes,
		"primary and standby run with max_locks_per_transaction=64 and max_connections=200: a shared lock table of about 64 x 200 = 12,800 locks.",
		"every tenant was built by pgtenant (cold path, empty pool): schema tenants in lock-bounded batches (provision.batch_locks=1000).",
		"the monolithic drop is a superuser's DROP SCHEMA t_<id> CASCADE in the template's shared database; pgtenant's purges are DELETE /v1/tenants/{id}?purge_now=true followed by waiting for the purge job (polled every 20 ms): lock-out, storage, role, catalog row.",
		"schema purge: drop.batch_relations=200 (a wide table with its 100 unique indexes weighs 101, so each batch drops one table), paced by standby replay lag between batches.",
		"the small tenants are purged one after another: each drop waits for its purge job before the next starts.",
		"before each method the bench runs VACUUM in the catalog database and (schema methods) the template's shared database, and CHECKPOINT, waits for the standby and makes it restartpoint; FPI = share of full-page images in the method's WAL.",
		"WAL = pg_current_wal_insert_lsn() difference (the catalog on the same primary included); largest record from pg_waldump; peak locks = rows of pg_locks on the primary, sampled every 25 ms with the replay lag (primary pg_current_wal_lsn() - standby pg_last_wal_replay_lsn()); ckpts = checkpoints_req difference; standby caught up = time from the method's end until the standby replayed its last WAL.",
	)
	return t
}

func okOr(r DropRow) string {
	if r.OK {
		return "ok"
	}
	return "failed (" + r.Error + ")"
}
