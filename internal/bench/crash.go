package bench

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"

	examples "github.com/pgtenant/pgtenant/examples/templates"
	"github.com/pgtenant/pgtenant/internal/api"
	"github.com/pgtenant/pgtenant/internal/catalog"
	"github.com/pgtenant/pgtenant/internal/jobs"
	"github.com/pgtenant/pgtenant/internal/provision"
	"github.com/pgtenant/pgtenant/internal/reconcile"
	"github.com/pgtenant/pgtenant/internal/tenant"
)

// CrashOptions tune the crash soak.
type CrashOptions struct {
	Binary     string // the pgtenant binary to run as the daemon (default: this executable)
	Iterations int    // SIGKILLs of the daemon
	Seed       uint64
}

// CrashResult is what the crash soak observed.
type CrashResult struct {
	Iterations       int                 `json:"iterations"`
	Kills            int                 `json:"kills"`
	KillsAtStep      int                 `json:"kills_right_after_a_step"` // killed just after a step was recorded
	Creates          int                 `json:"creates_confirmed"`
	Drops            int                 `json:"drops_confirmed"`
	JobsByState      map[string]int      `json:"jobs_by_state"`
	Unfinished       int                 `json:"unfinished_jobs"`
	Findings         []reconcile.Finding `json:"reconcile_findings"`
	DuplicateTenants int                 `json:"tenants_created_twice"`
	Duration         time.Duration       `json:"duration_ns"`
}

// Crash runs the crash soak: a daemon process provisions and drops tenants
// while it is SIGKILLed again and again, right after job steps complete and
// in the middle of them, and restarted each time. At the end every job must
// have finished, the reconciler must find nothing, and no external id may
// have produced two tenants.
func (e *Env) Crash(ctx context.Context, opts CrashOptions) (CrashResult, Table, error) {
	start := time.Now()
	res := CrashResult{Iterations: opts.Iterations, JobsByState: map[string]int{}}
	if opts.Binary == "" {
		exe, err := os.Executable()
		if err != nil {
			return res, Table{}, err
		}
		opts.Binary = exe
	}
	rng := rand.New(rand.NewPCG(opts.Seed, opts.Seed^0x5eed))
	fc, stop, err := e.fleetFor(ctx, "crash", nil, true)
	if err != nil {
		return res, Table{}, err
	}
	defer stop()
	dir := filepath.Join(e.Dir, "crash")
	cfgPath, tokenFile, logPath := filepath.Join(dir, "pgtenant.yaml"), filepath.Join(dir, "token"), filepath.Join(dir, "daemon.log")
	catalogDSN := fc.PrimaryDSN("pgtenant_crash")
	cfg := fmt.Sprintf(`listen: 127.0.0.1:0
token_file: %s
catalog:
  dsn: %s
clusters:
  - name: c1
    dsn: %s
jobs: {workers: 4, lease: 2s, backoff: 100ms, max_backoff: 2s, max_attempts: 10}
pools:
  - {template: saas, mode: database, size: 2}
  - {template: saas, mode: schema, size: 2}
provision: {pool_interval: 300ms, cold_wait: 20s}
reconcile: {interval: 0s}
`, tokenFile, catalogDSN, fc.PrimaryDSN("postgres"))
	if err := os.WriteFile(cfgPath, []byte(cfg), 0o600); err != nil {
		return res, Table{}, err
	}

	s := &soak{e: e, rng: rng, pending: map[string]tenant.Mode{}}
	for i := 0; i <= opts.Iterations; i++ {
		p, err := startDaemon(ctx, opts.Binary, cfgPath, tokenFile, logPath)
		if err != nil {
			return res, Table{}, err
		}
		if i == 0 {
			if err := s.template(ctx, p.client); err != nil {
				p.kill()
				return res, Table{}, err
			}
		}
		if i == opts.Iterations {
			err = s.settle(ctx, p.client, catalogDSN, &res)
			if serr := p.stop(); err == nil {
				err = serr
			}
			if err != nil {
				return res, Table{}, err
			}
			break
		}
		s.ensureCoverage(ctx, p.client)
		atStep, err := s.runUntilKilled(ctx, p, catalogDSN)
		if err != nil {
			return res, Table{}, err
		}
		res.Kills++
		if atStep {
			res.KillsAtStep++
		}
		if (i+1)%10 == 0 {
			e.logf("crash: %d/%d kills, %d creates and %d drops confirmed", i+1, opts.Iterations, s.creates, s.drops)
		}
	}
	res.Creates, res.Drops, res.Duration = s.creates, s.drops, time.Since(start)
	return res, crashTable(res), nil
}

// soak is the client side of the crash soak.
type soak struct {
	e       *Env
	rng     *rand.Rand
	mu      sync.Mutex
	pending map[string]tenant.Mode // external id → mode: creates not yet confirmed, retried after each restart
	active  []string               // tenants known active, to drop
	next    int
	creates int
	drops   int
}

func (s *soak) template(ctx context.Context, c *api.Client) error {
	added, err := c.CreateTemplate(ctx, "saas", examples.Saas())
	if err != nil && !errors.Is(err, catalog.ErrConflict) {
		return err
	}
	for _, j := range added.BuildJobs {
		if j, err := c.WaitJob(ctx, j.ID, nil); err != nil || j.State != jobs.Succeeded {
			return fmt.Errorf("template build: %v %s", err, j.LastError)
		}
	}
	return nil
}

// op does one create or drop; errors from the kill are expected and the
// operation stays pending.
func (s *soak) op(ctx context.Context, c *api.Client) {
	s.mu.Lock()
	var ext, drop string
	var mode tenant.Mode
	switch {
	case len(s.active) > 0 && s.rng.IntN(3) == 0:
		i := s.rng.IntN(len(s.active))
		drop = s.active[i]
		s.active = append(s.active[:i], s.active[i+1:]...)
	default:
		for k, m := range s.pending {
			ext, mode = k, m
			break
		}
		if ext == "" {
			s.next++
			ext, mode = fmt.Sprintf("crash-%d", s.next), tenant.Modes[s.rng.IntN(2)]
			s.pending[ext] = mode
		}
	}
	s.mu.Unlock()
	if drop != "" {
		_, err := c.DropTenant(ctx, drop, true)
		s.mu.Lock()
		if err == nil || errors.Is(err, catalog.ErrNotFound) {
			s.drops++
		} else {
			s.active = append(s.active, drop) // try again later
		}
		s.mu.Unlock()
		return
	}
	r, err := c.CreateTenant(ctx, provision.Request{Template: "saas", Mode: mode, ExternalID: ext})
	if err != nil || r.Job != nil || r.Tenant.State == catalog.StateProvisioning {
		return // still pending: retried with the same external id until it is built
	}
	s.mu.Lock()
	if _, ok := s.pending[ext]; ok { // another client may have confirmed it meanwhile
		delete(s.pending, ext)
		s.creates++
		if r.Tenant.State == catalog.StateActive {
			s.active = append(s.active, r.Tenant.ID)
		}
	}
	s.mu.Unlock()
}

// ensureCoverage runs operations on a daemon that is not being killed
// until the soak has confirmed at least one create and one drop: on a
// loaded machine, kills right after each job step can otherwise come before
// any create is confirmed, and with no active tenant nothing is dropped.
// The kills then land among the jobs these operations leave behind
// (builds, pool refills, purges) and among the operations that follow.
func (s *soak) ensureCoverage(ctx context.Context, c *api.Client) {
	for deadline := time.Now().Add(time.Minute); time.Now().Before(deadline) && ctx.Err() == nil; {
		s.mu.Lock()
		done := s.creates > 0 && s.drops > 0
		s.mu.Unlock()
		if done {
			return
		}
		s.op(ctx, c)
	}
}

// runUntilKilled keeps operations flowing and SIGKILLs the daemon right
// after a job step is recorded (then at once, or a few ms into the next
// step), or after a random time when no step comes.
func (s *soak) runUntilKilled(ctx context.Context, p *daemonProc, catalogDSN string) (bool, error) {
	conn, err := pgx.Connect(ctx, catalogDSN)
	if err != nil {
		return false, err
	}
	defer conn.Close(ctx)
	opCtx, cancel := context.WithCancel(ctx)
	var wg sync.WaitGroup
	for range 3 { // a few clients at once, as a real sign-up flow has
		wg.Add(1)
		go func() {
			defer wg.Done()
			for opCtx.Err() == nil {
				s.op(opCtx, p.client)
			}
		}()
	}
	defer func() { cancel(); wg.Wait() }()

	var base int64
	if err := conn.QueryRow(ctx, `SELECT count(*) FROM job_steps`).Scan(&base); err != nil {
		return false, err
	}
	s.mu.Lock() // the rng is shared with the clients
	target := base + 1 + int64(s.rng.IntN(3))
	deadline := time.Now().Add(time.Duration(500+s.rng.IntN(2500)) * time.Millisecond)
	pause := time.Duration(s.rng.IntN(2)*s.rng.IntN(30)) * time.Millisecond
	s.mu.Unlock()
	for time.Now().Before(deadline) {
		var n int64
		if err := conn.QueryRow(ctx, `SELECT count(*) FROM job_steps`).Scan(&n); err != nil {
			return false, err
		}
		if n >= target {
			time.Sleep(pause) // at once, or a few ms into the next step
			p.kill()
			return true, nil
		}
		time.Sleep(2 * time.Millisecond)
	}
	p.kill()
	return false, nil
}

// settle lets the last daemon finish everything, then checks the result.
func (s *soak) settle(ctx context.Context, c *api.Client, catalogDSN string, res *CrashResult) error {
	deadline := time.Now().Add(5 * time.Minute)
	for len(s.pending) > 0 && time.Now().Before(deadline) {
		s.op(ctx, c)
		time.Sleep(20 * time.Millisecond) // a pending tenant may still be building
	}
	conn, err := pgx.Connect(ctx, catalogDSN)
	if err != nil {
		return err
	}
	defer conn.Close(ctx)
	for stable := 0; stable < 5; {
		var active int
		if err := conn.QueryRow(ctx, `SELECT count(*) FROM jobs WHERE state IN ('queued', 'running', 'waiting', 'paused')`).Scan(&active); err != nil {
			return err
		}
		if active == 0 {
			stable++
		} else {
			stable = 0
		}
		if time.Now().After(deadline) {
			break
		}
		time.Sleep(300 * time.Millisecond)
	}
	rows, err := conn.Query(ctx, `SELECT state, count(*) FROM jobs GROUP BY state`)
	if err != nil {
		return err
	}
	for rows.Next() {
		var st string
		var n int
		if err := rows.Scan(&st, &n); err != nil {
			return err
		}
		res.JobsByState[st] = n
		if !jobs.Finished(jobs.State(st)) {
			res.Unfinished += n
		}
	}
	if err := rows.Err(); err != nil {
		return err
	}
	if err := conn.QueryRow(ctx, `SELECT count(*) - count(DISTINCT external_id) FROM tenants WHERE external_id IS NOT NULL`).Scan(&res.DuplicateTenants); err != nil {
		return err
	}
	rep, err := c.Reconcile(ctx, api.ReconcileRequest{})
	if err != nil {
		return err
	}
	res.Findings = rep.Findings
	return nil
}

func crashTable(r CrashResult) Table {
	var states []string
	for _, st := range []jobs.State{jobs.Succeeded, jobs.Failed, jobs.Cancelled} {
		states = append(states, fmt.Sprintf("%s %d", st, r.JobsByState[string(st)]))
	}
	t := Table{
		Title:   "pgtenant bench crash: daemon SIGKILLed during provisioning and purges",
		Columns: []string{"kills", "right after a step", "creates", "drops", "jobs", "unfinished", "reconcile findings", "tenants twice", "time"},
		Rows: [][]string{{fmt.Sprint(r.Kills), fmt.Sprint(r.KillsAtStep), fmt.Sprint(r.Creates), fmt.Sprint(r.Drops),
			strings.Join(states, ", "), fmt.Sprint(r.Unfinished), fmt.Sprint(len(r.Findings)), fmt.Sprint(r.DuplicateTenants),
			r.Duration.Round(time.Second).String()}},
		Data: map[string]any{"result": r},
	}
	t.Checks = []Check{
		{Target: "every job succeeded or failed", Got: fmt.Sprintf("%d unfinished", r.Unfinished), Met: r.Unfinished == 0},
		{Target: "reconciler finds no orphans either way", Got: fmt.Sprintf("%d findings", len(r.Findings)), Met: len(r.Findings) == 0},
		{Target: "no tenant created twice", Got: fmt.Sprintf("%d", r.DuplicateTenants), Met: r.DuplicateTenants == 0},
	}
	for _, f := range r.Findings {
		t.Notes = append(t.Notes, fmt.Sprintf("finding: %s %s: %s", f.Kind, f.Object, f.Detail))
	}
	return t
}
