package pooler

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/url"
	"os"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/pgtenant/pgtenant/internal/cluster"
)

// Source returns the entries a cluster's pooler must have now (from the
// catalog and pg_authid), and the tenants left out with why.
type Source func(ctx context.Context) (entries []Entry, skipped map[string]string, err error)

// Restart outcomes reported through Front.OnRestart.
const (
	OutcomeRestarted = "restarted"
	OutcomeFailed    = "failed"
)

// Front keeps one cluster's PgBouncer in line with the catalog: it starts
// it, restarts it when it dies (backoff doubling from 1 s to 1 min), writes
// its files from Source and RELOADs it when they change, and applies what
// files cannot say (DISABLE for suspended tenants). Changes are batched: a
// Sync asked while one runs, or within a window of the last one (Coalesce,
// widened up to 8 × Coalesce while changes keep coming), is served by the
// next, so a burst of creates costs a bounded number of reloads.
type Front struct {
	Cluster  string
	Proc     *Process
	Settings Settings // AdminVerifier is filled in from the admin password
	Source   Source
	// PublicHost is the host in tenants' DSNs (default: Settings.ListenHost).
	PublicHost string
	// Coalesce is the least time between two syncs asked for by changes
	// (default 100 ms; widened up to 8× during a burst); SyncInterval the period of the sync that catches
	// changes made elsewhere (another daemon, a tenant's own ALTER ROLE …
	// PASSWORD; default 10 s); CheckInterval the period of the process
	// check (default 1 s).
	Coalesce, SyncInterval, CheckInterval time.Duration
	// StopOnExit stops PgBouncer when Run returns (`up`); otherwise it
	// keeps serving tenants across a daemon restart and is adopted by the
	// next start.
	StopOnExit bool
	Logger     *slog.Logger
	// OnRestart, when set, is called after each restart attempt of a
	// pooler found down.
	OnRestart func(outcome string)
	// OnReload, when set, is called after each RELOAD.
	OnReload func()
	// fixedServer: the pooler block names its server (pooler.server, a
	// proxy of the operator's), which Repoint leaves alone.
	fixedServer bool
	// socketDir: the primary is reached through its Unix socket there
	// (pooler.server_socket_dir), at the port Repoint is given.
	socketDir string

	once    sync.Once
	kick    chan struct{}
	mu      sync.Mutex
	req     uint64
	done    uint64
	doneErr error
	doneCh  chan struct{}
	paused  map[string]bool // PAUSEd by Pause: left paused by syncs
	// unhold ends a Hold: it stops the session waiting on the PAUSE.
	unhold   context.CancelFunc
	snap     Snapshot
	lastSync time.Time
	window   time.Duration // the current least time between two syncs asked for by changes
	// served: the entries PgBouncer served at the end of the last sync
	// (enabled), with the verifier of their user (Serves).
	served map[string]string

	adminMu sync.Mutex
	admin   *Admin
	pwMu    sync.Mutex
	pw      string
	// verifier is AdminVerifier of verifierOf (adminVerifier).
	verifier, verifierOf string
	down                 cluster.Outage

	// tlsStamp is the TLS files' sizes and times at the last sync: a
	// change RELOADs PgBouncer.
	tlsStamp string

	// supervision
	started   bool
	failures  int
	delay     time.Duration
	nextStart time.Time
}

// Snapshot is what the last sync saw: for /metrics, doctor and reconcile.
type Snapshot struct {
	Up        bool
	At        time.Time
	Entries   int
	Skipped   map[string]string // tenants left out, with why
	Databases map[string]Database
	Pools     map[string]Pool
	// Drift lists differences between the pooler's databases and the
	// entries after the sync (should be none).
	Drift     []string
	Reloads   int64
	Restarts  int64
	LastError string
}

func (f *Front) init() {
	f.once.Do(func() {
		f.kick = make(chan struct{}, 1)
		f.doneCh = make(chan struct{})
		f.paused = map[string]bool{}
		f.Coalesce = cmp.Or(f.Coalesce, 100*time.Millisecond)
		f.SyncInterval = cmp.Or(f.SyncInterval, 10*time.Second)
		f.CheckInterval = cmp.Or(f.CheckInterval, time.Second)
		f.window = f.Coalesce
		if f.Logger == nil {
			f.Logger = slog.New(slog.DiscardHandler)
		}
		f.Logger = f.Logger.With("component", "pooler", "cluster", f.Cluster)
		f.down.What = "pooler sync"
		f.PublicHost = cmp.Or(f.PublicHost, f.Settings.ListenHost)
	})
}

// Addr is where the pooler listens.
func (f *Front) Addr() string { return Addr(f.Settings.ListenHost, f.Settings.ListenPort) }

// PublicAddr is the host:port in tenants' DSNs.
func (f *Front) PublicAddr() string {
	f.init()
	return Addr(f.PublicHost, f.Settings.ListenPort)
}

// tlsStamp identifies the contents of the TLS files by size and
// modification time ("" without TLS).
func tlsStamp(s Settings) string {
	if !s.TLS() {
		return ""
	}
	var b strings.Builder
	for _, p := range []string{s.TLSCertFile, s.TLSKeyFile, s.TLSCAFile} {
		if fi, err := os.Stat(p); err == nil {
			fmt.Fprintf(&b, "%s:%d:%d;", p, fi.Size(), fi.ModTime().UnixNano())
		}
	}
	return b.String()
}

// SSLQuery is the query of tenants' DSNs through this front door: with
// TLS, sslmode=verify-full and the CA as sslrootcert when the CA file is
// known (the host must be in the certificate), else sslmode=require;
// without TLS, sslmode=disable.
func (f *Front) SSLQuery() string { return SSLQuery(f.Settings.TLS(), f.Settings.TLSCAFile) }

// SSLQuery is a DSN's query for a server that serves TLS or not, whose
// certificate caFile (optional) signed.
func SSLQuery(tls bool, caFile string) string {
	switch {
	case !tls:
		return "sslmode=disable"
	case caFile == "":
		return "sslmode=require"
	}
	// Slashes kept for a readable DSN; each segment escaped ('+' would
	// read as a space to some parsers).
	parts := strings.Split(caFile, "/")
	for i, p := range parts {
		parts[i] = url.QueryEscape(p)
	}
	return "sslmode=verify-full&sslrootcert=" + strings.Join(parts, "/")
}

// Run keeps the pooler in line until ctx is done.
func (f *Front) Run(ctx context.Context) error {
	f.init()
	defer func() {
		f.closeAdmin()
		if f.StopOnExit {
			if err := f.Proc.Stop(); err != nil {
				f.Logger.Warn("stop pooler", "err", err)
			} else {
				f.Logger.Info("pooler stopped")
			}
		}
	}()
	f.cycle(ctx)
	check := time.NewTicker(f.CheckInterval)
	defer check.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-f.kick:
			// An isolated change syncs at once. Changes that keep coming
			// (a burst of creates) widen the window between two syncs,
			// doubling up to 8 × Coalesce, so that each sync takes more of
			// them: a burst costs a bounded number of reloads, each of its
			// changes waits at most the widest window. Calm again (no
			// change for two windows), it starts over.
			since := time.Since(f.lastSync)
			if since > 2*f.window {
				f.window = f.Coalesce
			} else {
				f.window = min(2*f.window, 8*f.Coalesce)
			}
			if wait := f.window - since; wait > 0 {
				select {
				case <-ctx.Done():
					return nil
				case <-time.After(wait):
				}
			}
		case <-check.C:
			if f.Proc.Running() && time.Since(f.lastSync) < f.SyncInterval {
				continue
			}
		}
		f.cycle(ctx)
	}
}

// cycle runs one sync and answers the Syncs asked before it began.
func (f *Front) cycle(ctx context.Context) {
	f.mu.Lock()
	gen := f.req
	f.mu.Unlock()
	err := f.sync(ctx)
	f.lastSync = time.Now()
	f.mu.Lock()
	f.done, f.doneErr = gen, err
	if err != nil {
		f.snap.LastError = err.Error()
	} else {
		f.snap.LastError = ""
	}
	close(f.doneCh)
	f.doneCh = make(chan struct{})
	f.mu.Unlock()
	if ctx.Err() == nil {
		f.down.Report(f.Logger, err) // once when it starts failing, each minute, and when it works again
	}
}

// adminVerifier is the admin console's SCRAM verifier of password, made
// once (its PBKDF2 costs half a millisecond a sync otherwise).
func (f *Front) adminVerifier(password string) string {
	f.pwMu.Lock()
	defer f.pwMu.Unlock()
	if f.verifierOf != password {
		f.verifier, f.verifierOf = AdminVerifier(password, f.Proc.Dir), password
	}
	return f.verifier
}

// password returns the admin console's password (read, or made, once).
func (f *Front) password() (string, error) {
	f.pwMu.Lock()
	defer f.pwMu.Unlock()
	if f.pw == "" {
		pw, err := f.Proc.AdminPassword()
		if err != nil {
			return "", err
		}
		f.pw = pw
	}
	return f.pw, nil
}

// Serves reports whether PgBouncer served entry, for its user with
// verifier, at the end of the last sync: a spare registered when it was
// built, claimed since, needs no sync to be reached.
func (f *Front) Serves(entry, verifier string) bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	v, ok := f.served[entry]
	return ok && v == verifier && f.snap.Up && f.snap.LastError == "" // served holds checked verifiers only
}

// Sync asks for a sync and waits until one that began after the call has
// ended: when it returns nil, the pooler has every change committed before
// the call. Bounded by ctx.
func (f *Front) Sync(ctx context.Context) error {
	f.init()
	f.mu.Lock()
	f.req++
	want := f.req
	f.mu.Unlock()
	select {
	case f.kick <- struct{}{}:
	default:
	}
	for {
		f.mu.Lock()
		done, err, ch := f.done, f.doneErr, f.doneCh
		f.mu.Unlock()
		if done >= want {
			return err
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("pooler of cluster %s: sync not done in time: %w", f.Cluster, ctx.Err())
		case <-ch:
		}
	}
}

// Repoint sends the entries of the pooler's own cluster to a new primary
// (a Patroni failover) at host:port, or at port through the socket
// directory of the pooler block (server_socket_dir: every node of a
// cluster up makes has its socket there). It reports false, doing
// nothing, when the pooler block names its own server (pooler.server):
// the operator's proxy follows the primary then.
func (f *Front) Repoint(ctx context.Context, host string, port int) (bool, error) {
	f.init()
	if f.fixedServer {
		return false, nil
	}
	return true, f.Point(ctx, cmp.Or(f.socketDir, host), port)
}

// Point sends the entries of the pooler's own cluster to host (an
// address, or a socket directory) and port: rewritten and reloaded, then
// RECONNECT closes every server connection once released, so that no
// session goes on with the old server (PgBouncer reconnects on a changed
// entry by itself; RECONNECT also covers one it kept unchanged).
func (f *Front) Point(ctx context.Context, host string, port int) error {
	f.init()
	f.mu.Lock()
	f.Settings.ServerHost, f.Settings.ServerPort = host, port
	f.mu.Unlock()
	if err := f.Sync(ctx); err != nil {
		return err
	}
	if err := f.command(ctx, "RECONNECT", ""); err != nil {
		return err
	}
	f.Logger.Info("pooler re-pointed", "server", Addr(host, port))
	return nil
}

// Poke asks for a sync without waiting for it.
func (f *Front) Poke() {
	f.init()
	f.mu.Lock()
	f.req++
	f.mu.Unlock()
	select {
	case f.kick <- struct{}{}:
	default:
	}
}

// serving reports whether the pooler serves now: its last sync worked and
// its process runs.
func (f *Front) serving() bool {
	f.init()
	f.mu.Lock()
	ok := f.snap.Up && f.snap.LastError == "" && !f.snap.At.IsZero()
	f.mu.Unlock()
	return ok && f.Proc.Running()
}

// Snapshot returns what the last sync saw.
func (f *Front) Snapshot() Snapshot {
	f.init()
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.snap
}

func (f *Front) sync(ctx context.Context) error {
	if time.Now().Before(f.nextStart) && !f.Proc.Running() {
		f.setUp(false)
		return fmt.Errorf("pooler of cluster %s is down; next start attempt in %s", f.Cluster, time.Until(f.nextStart).Round(time.Second))
	}
	entries, skipped, err := f.Source(ctx)
	if err != nil {
		f.setUp(f.Proc.Running())
		return fmt.Errorf("read the pooler's entries: %w", err)
	}
	password, err := f.password()
	if err != nil {
		return err
	}
	f.mu.Lock() // Repoint changes the server
	s := f.Settings
	f.mu.Unlock()
	s.AdminVerifier = f.adminVerifier(password)
	files, err := Render(f.Proc.Dir, s, entries)
	if err != nil {
		return err
	}
	changed, err := f.Proc.Write(files)
	if err != nil {
		return err
	}
	// A renewed certificate keeps its paths: pgbouncer.ini does not
	// change, but PgBouncer reads the files again on RELOAD only (a key it
	// cannot read then is logged and the old one kept). So a change of the
	// files RELOADs it, and so does the first sync (a PgBouncer adopted
	// from before the daemon's start may hold older ones).
	if stamp := tlsStamp(s); stamp != f.tlsStamp {
		changed = changed || stamp != ""
		f.tlsStamp = stamp
	}
	if !f.Proc.Running() {
		f.closeAdmin()
		if err := f.start(ctx); err != nil {
			f.setUp(false)
			return err
		}
	} else if changed {
		if err := f.command(ctx, "RELOAD", ""); err != nil {
			return err
		}
		f.mu.Lock()
		f.snap.Reloads++
		f.mu.Unlock()
		if f.OnReload != nil {
			f.OnReload()
		}
	}
	return f.apply(ctx, entries, skipped)
}

// start starts the pooler found down, within the backoff.
func (f *Front) start(ctx context.Context) error {
	if time.Now().Before(f.nextStart) {
		return fmt.Errorf("pooler of cluster %s is down; next start attempt in %s", f.Cluster, time.Until(f.nextStart).Round(time.Second))
	}
	restart := f.started
	if restart {
		f.Logger.Warn("pooler is down; restarting it", "attempt", f.failures+1)
	}
	err := f.Proc.Start(ctx, f.Addr())
	if err == nil {
		f.started, f.failures, f.delay, f.nextStart = true, 0, 0, time.Time{}
		if restart {
			f.Logger.Info("pooler restarted", "outcome", OutcomeRestarted)
			f.mu.Lock()
			f.snap.Restarts++
			f.mu.Unlock()
			f.report(OutcomeRestarted)
		} else {
			f.Logger.Info("pooler running", "addr", f.Addr(), "dir", f.Proc.Dir)
		}
		return nil
	}
	f.failures++
	f.delay = min(max(2*f.delay, time.Second), time.Minute)
	f.nextStart = time.Now().Add(f.delay)
	if restart {
		f.report(OutcomeFailed)
	}
	return fmt.Errorf("%w (log: %s)", err, f.Proc.LogPath())
}

func (f *Front) report(outcome string) {
	if f.OnRestart != nil {
		f.OnRestart(outcome)
	}
}

func (f *Front) setUp(up bool) {
	f.mu.Lock()
	f.snap.Up = up
	f.mu.Unlock()
}

// apply brings the pooler's runtime state in line with the entries:
// suspended tenants DISABLEd (their clients cut off with KILL, the pause
// KILL leaves lifted so that the entry answers "disabled" at once), the
// others ENABLEd and not paused unless Pause paused them; then records
// what the pooler has.
func (f *Front) apply(ctx context.Context, entries []Entry, skipped map[string]string) error {
	dbs, err := withAdmin(f, ctx, func(a *Admin) (map[string]Database, error) { return a.Databases(ctx) })
	if err != nil {
		return err
	}
	f.mu.Lock()
	paused := make(map[string]bool, len(f.paused))
	for k := range f.paused {
		paused[k] = true
	}
	f.mu.Unlock()
	var drift []string
	want := make(map[string]bool, len(entries))
	for _, e := range entries {
		want[e.Name] = true
		d, ok := dbs[e.Name]
		if !ok {
			drift = append(drift, e.Name+": missing from the pooler")
			continue
		}
		var cmds []string
		switch {
		case e.Disabled && !d.Disabled:
			cmds = []string{"DISABLE", "KILL"}
			if !paused[e.Name] {
				cmds = append(cmds, "RESUME")
			}
		case !e.Disabled && d.Disabled:
			if d.Paused && !paused[e.Name] {
				cmds = append(cmds, "RESUME")
			}
			cmds = append(cmds, "ENABLE")
		case d.Paused && !paused[e.Name]:
			cmds = []string{"RESUME"}
		}
		for _, c := range cmds {
			if err := f.command(ctx, c, e.Name); err != nil {
				return err
			}
		}
		if len(cmds) > 0 {
			f.Logger.Info("pooler entry state", "tenant", e.Name, "commands", cmds)
			d.Disabled = e.Disabled
			dbs[e.Name] = d
		}
	}
	for name := range dbs {
		if !want[name] {
			drift = append(drift, name+": in the pooler, not in the catalog")
		}
	}
	sort.Strings(drift)
	pools, err := withAdmin(f, ctx, func(a *Admin) (map[string]Pool, error) { return a.Pools(ctx) })
	if err != nil {
		return err
	}
	serving := make(map[string]string, len(entries))
	for _, e := range entries {
		if d, ok := dbs[e.Name]; ok && !e.Replica && !d.Disabled {
			serving[e.Name] = e.Verifier
		}
	}
	f.mu.Lock()
	f.served = serving
	f.snap.Up, f.snap.At, f.snap.Entries, f.snap.Skipped = true, time.Now(), len(entries), skipped
	f.snap.Databases, f.snap.Pools, f.snap.Drift = dbs, pools, drift
	f.mu.Unlock()
	return nil
}

// command runs one console command on the kept admin session.
func (f *Front) command(ctx context.Context, cmd, db string) error {
	_, err := withAdmin(f, ctx, func(a *Admin) (struct{}, error) { return struct{}{}, a.Command(ctx, cmd, db) })
	return err
}

// withAdmin runs fn on the kept admin session, dialling it (again, once,
// after a failure: the pooler may have restarted).
func withAdmin[T any](f *Front, ctx context.Context, fn func(*Admin) (T, error)) (T, error) {
	f.adminMu.Lock()
	defer f.adminMu.Unlock()
	var zero T
	for attempt := 0; ; attempt++ {
		if f.admin == nil {
			password, err := f.password()
			if err != nil {
				return zero, err
			}
			a, err := DialAdmin(ctx, f.Addr(), AdminUser, password)
			if err != nil {
				return zero, err
			}
			f.admin = a
		}
		v, err := fn(f.admin)
		if err == nil || attempt == 1 || ctx.Err() != nil || !f.admin.conn.IsClosed() {
			return v, err
		}
		f.admin.Close()
		f.admin = nil
	}
}

func (f *Front) closeAdmin() {
	f.adminMu.Lock()
	defer f.adminMu.Unlock()
	if f.admin != nil {
		f.admin.Close()
		f.admin = nil
	}
}

// Pause holds a tenant's clients (PAUSE: new queries queue in the pooler
// once the pool's server connections are released; in session mode that
// is when its clients disconnect) until Resume: the building block of an
// online move, which repoints the entry between the two. Syncs leave a
// paused entry paused. It runs on a session of its own (PAUSE waits) and
// gives up with ctx, resuming the entry.
func (f *Front) Pause(ctx context.Context, name string) error {
	f.init()
	if !validName(name) {
		return fmt.Errorf("pause: bad name %q", name)
	}
	f.mu.Lock()
	f.paused[name] = true
	f.mu.Unlock()
	password, err := f.password()
	if err != nil {
		return err
	}
	a, err := DialAdmin(ctx, f.Addr(), AdminUser, password)
	if err == nil {
		err = a.Command(ctx, "PAUSE", name)
		a.Close()
	}
	if err != nil {
		rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
		defer cancel()
		return errors.Join(err, f.Resume(rctx, name))
	}
	return nil
}

// Hold pauses the whole pooler (PAUSE) while the cluster's primary
// changes: from the command on, a client waits in the pooler for a server
// connection until Release. It returns once the transactions in flight
// in transaction-mode pools have ended, at most after wait, and reports
// whether the pause completed: it does not while a client of a
// session-mode pool holds a server connection (until it leaves). Such a
// client keeps its connection until the primary stops, loses it then, and
// waits on reconnecting. Release ends the hold, complete or not; a Hold
// whose PAUSE fails resumes.
func (f *Front) Hold(ctx context.Context, wait time.Duration) (complete bool, err error) {
	f.init()
	password, err := f.password()
	if err != nil {
		return false, err
	}
	a, err := DialAdmin(ctx, f.Addr(), AdminUser, password)
	if err != nil {
		return false, err
	}
	// The PAUSE answers once complete: its session waits until then, or
	// until Release.
	hctx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	f.mu.Lock()
	f.unhold = cancel
	f.mu.Unlock()
	done := make(chan error, 1)
	go func() {
		err := a.Command(hctx, "PAUSE", "")
		a.Close()
		done <- err
	}()
	deadline := time.NewTimer(wait)
	defer deadline.Stop()
	tick := time.NewTicker(100 * time.Millisecond)
	defer tick.Stop()
wait:
	for {
		select {
		case err = <-done:
			if err == nil {
				return true, nil
			}
			break wait
		case <-deadline.C:
			return false, nil
		case <-ctx.Done():
			err = ctx.Err()
			break wait
		case <-tick.C:
			if f.onlySessionsActive(ctx) {
				return false, nil
			}
		}
	}
	rctx, rcancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
	defer rcancel()
	return false, errors.Join(err, f.Release(rctx))
}

// onlySessionsActive reports whether the pools' active server connections
// are all of session-mode pools: no transaction-mode pool has one in
// flight (false when the pooler does not answer).
func (f *Front) onlySessionsActive(ctx context.Context) bool {
	pools, err := withAdmin(f, ctx, func(a *Admin) (map[string]Pool, error) { return a.Pools(ctx) })
	if err != nil {
		return false
	}
	for _, p := range pools {
		if p.ServerActive > 0 && p.Mode != "session" {
			return false
		}
	}
	return true
}

// Release ends a Hold (RESUME): the clients waiting in the pooler go on,
// to the server its entries name.
func (f *Front) Release(ctx context.Context) error {
	f.init()
	err := f.command(ctx, "RESUME", "")
	f.mu.Lock()
	if f.unhold != nil {
		f.unhold()
		f.unhold = nil
	}
	f.mu.Unlock()
	if isNotPaused(err) {
		return nil
	}
	return err
}

// Resume lets a paused tenant's clients go on.
func (f *Front) Resume(ctx context.Context, name string) error {
	f.init()
	f.mu.Lock()
	delete(f.paused, name)
	f.mu.Unlock()
	err := f.command(ctx, "RESUME", name)
	if err != nil && isNotPaused(err) {
		return nil
	}
	return err
}

func isNotPaused(err error) bool {
	return err != nil && strings.Contains(err.Error(), "not paused")
}

// Difference is one way the running pooler differs from the catalog.
type Difference struct {
	Kind   string // missing (an entry the catalog wants), extra (an entry it does not), mismatch
	Name   string // the entry: t_<id>
	Detail string
}

// Compare reads the pooler's databases (SHOW DATABASES) now and compares
// them with the entries the catalog wants: for reconcile.
func (f *Front) Compare(ctx context.Context) ([]Difference, error) {
	f.init()
	entries, _, err := f.Source(ctx)
	if err != nil {
		return nil, err
	}
	dbs, err := withAdmin(f, ctx, func(a *Admin) (map[string]Database, error) { return a.Databases(ctx) })
	if err != nil {
		return nil, err
	}
	var out []Difference
	want := map[string]bool{}
	for _, e := range entries {
		want[e.Name] = true
		d, ok := dbs[e.Name]
		switch {
		case !ok && e.Spare: // the next sync adds it; nobody logs in to a spare
		case !ok:
			out = append(out, Difference{"missing", e.Name, "the tenant's entry is not in the pooler: it cannot log in through it"})
		case d.Database != e.Database:
			out = append(out, Difference{"mismatch", e.Name, fmt.Sprintf("points at database %s, want %s", d.Database, e.Database)})
		case d.Disabled != e.Disabled:
			out = append(out, Difference{"mismatch", e.Name, fmt.Sprintf("disabled %v, want %v (suspended: %v)", d.Disabled, e.Disabled, e.Disabled)})
		case d.PoolMode != e.PoolMode || d.PoolSize != e.PoolSize || d.MaxConnections != e.MaxDBConnections:
			out = append(out, Difference{"mismatch", e.Name, fmt.Sprintf("pool %s/%d/%d, want %s/%d/%d (mode/pool_size/max_db_connections)",
				d.PoolMode, d.PoolSize, d.MaxConnections, e.PoolMode, e.PoolSize, e.MaxDBConnections)})
		}
	}
	for name := range dbs {
		if !want[name] {
			out = append(out, Difference{"extra", name, "in the pooler, but no active, suspended or spare tenant of the catalog: it can still be logged in to"})
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out, nil
}
