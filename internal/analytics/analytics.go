// Package analytics keeps a columnar mirror of a tenant in DuckDB, fed by
// logical replication, and serves it to the tenant over the PostgreSQL
// protocol. The heap stays the system of record: the mirror is a
// publication and a pgoutput slot on the tenant's cluster, an initial copy
// taken in the slot's exported snapshot, then the stream applied in batches
// to one DuckDB file per tenant, with the applied LSN committed in the same
// DuckDB transaction as the data (a crash resumes without gaps or
// duplicates). One daemon owns a mirror at a time through a lease in the
// catalog (table analytics); any daemon's analytics port answers for any
// tenant, forwarding the session to the owner (forward.go).
//
// It owns the publication pgt_analytics_<id>, the slot of the same name and
// the file <dir>/<id>.duckdb; it never writes to the tenant's tables and
// runs no tenant code: the copy is COPY … TO STDOUT (type output functions
// only, no casts) in an admin session with pinned settings, and names from
// the tenant reach DuckDB quoted.
package analytics

import (
	"context"
	"crypto/rand"
	"crypto/tls"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/pgtenant/pgtenant/internal/catalog"
	"github.com/pgtenant/pgtenant/internal/cluster"
	"github.com/pgtenant/pgtenant/internal/config"
	"github.com/pgtenant/pgtenant/internal/jobs"
	"github.com/pgtenant/pgtenant/internal/pooler"
	"github.com/pgtenant/pgtenant/internal/tenant"
)

// Mirror states, as in the catalog.
const (
	StateCopying   = "copying"   // the slot is made and the initial copy runs (or will run again)
	StateStreaming = "streaming" // the copy is in the file; changes are applied as they come
	StateDisabling = "disabling" // its owner (or any daemon, once the lease ends) drops slot, publication and file
)

// Errors callers branch on.
var (
	ErrInvalid  = errors.New("invalid analytics request")
	ErrDisabled = errors.New("analytics not enabled")
)

// Prefix starts the names of every mirror's slot and publication.
const Prefix = "pgt_analytics_"

// SlotName is a tenant's slot and publication name.
func SlotName(id string) string { return Prefix + id }

// Service enables, disables and runs tenants' mirrors.
type Service struct {
	Store    *catalog.Store
	Clusters *cluster.Registry
	Config   config.AnalyticsConfig
	Logger   *slog.Logger
	// Dir holds the DuckDB files (Config.Dir resolved).
	Dir string
	// TLS, when set, is the analytics port's certificate: a client's
	// SSLRequest gets TLS (wire.go); nil: clear text only. With it,
	// sessions forwarded to another daemon go over TLS too when that
	// daemon offers it (forward.go).
	TLS *tls.Config
	// Pacer, when set, paces the copies (the initial one, table by table,
	// and a table's copy after a change of its definition) like the jobs'
	// steps: each waits while its cluster is over budget.
	Pacer Pacer
	// Tiers: a tenant whose tier has require_tls logs in over TLS only,
	// here as at its front door.
	Tiers map[string]config.Tier

	owner string       // this daemon, in leases
	ln    net.Listener // the analytics port (Listen), nil without one
	addr  string       // its address, in the tenants' DSNs

	mu      sync.Mutex
	mirrors map[string]*mirror // the mirrors this daemon runs

	fwdMu  sync.Mutex
	fwdKey []byte               // the fleet's forwarding key, once read
	nonces map[string]time.Time // forwarding proofs used here, until they expire

	sessMu   sync.Mutex
	sessions map[string]map[*sqlSession]bool // the sessions served here, by tenant (sessions.go)
	refusals *prometheus.CounterVec          // pgtenant_analytics_refusals_total{reason}

	queriesMu sync.Mutex
	queries   map[string]int64 // statements run here by tenant, since usage last took them
}

// countQuery counts a statement a tenant ran on the port, for usage.
func (s *Service) countQuery(id string) {
	s.queriesMu.Lock()
	defer s.queriesMu.Unlock()
	if s.queries == nil {
		s.queries = map[string]int64{}
	}
	s.queries[id]++
}

// TakeQueries hands usage metering the statements tenants ids ran on the
// port since it last took them, and forgets them.
func (s *Service) TakeQueries(ids []string) map[string]int64 {
	s.queriesMu.Lock()
	defer s.queriesMu.Unlock()
	out := map[string]int64{}
	for _, id := range ids {
		if n := s.queries[id]; n > 0 {
			out[id] = n
			delete(s.queries, id)
		}
	}
	return out
}

// Pacer is the jobs' pacer as the mirrors use it: its budget for copies,
// and how long a slot may wait on others' transactions (pacer.slot_wait).
type Pacer interface {
	Acquire(ctx context.Context, cluster string, kind jobs.Kind, report func(reason string)) (func(), error)
	SlotWait(cluster string) time.Duration
}

// pace waits for the cluster's budget before a copy (at once without a
// pacer) and returns its release.
func (s *Service) pace(ctx context.Context, clusterName string) (func(), error) {
	if s.Pacer == nil {
		return func() {}, nil
	}
	return s.Pacer.Acquire(ctx, clusterName, jobs.Light, nil)
}

// New returns the service; Run runs the mirrors this daemon owns.
func New(store *catalog.Store, clusters *cluster.Registry, cfg config.AnalyticsConfig, dir string, log *slog.Logger) *Service {
	host, _ := os.Hostname()
	b := make([]byte, 4)
	_, _ = rand.Read(b)
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	refusals := prometheus.NewCounterVec(prometheus.CounterOpts{Name: "pgtenant_analytics_refusals_total",
		Help: "What the analytics port refused or ended, by reason: message_size, statements, portals, session_memory (a session's limits), sessions (the tenant's connection limit), lifecycle (sessions ended by a suspend, drop or password change)."},
		[]string{"reason"})
	for _, r := range []string{refusedMessage, refusedStatements, refusedPortals, refusedHeld, refusedSessions, refusedLifecycle} {
		refusals.WithLabelValues(r) // every reason, at 0 until it happens
	}
	return &Service{Store: store, Clusters: clusters, Config: cfg, Dir: dir, Logger: log.With("component", "analytics"),
		owner: fmt.Sprintf("%s:%d:%s", host, os.Getpid(), hex.EncodeToString(b)), mirrors: map[string]*mirror{}, refusals: refusals}
}

// Status is a mirror as `analytics status` and `tenant show` see it.
type Status struct {
	Tenant      string     `json:"tenant"`
	Enabled     bool       `json:"enabled"`
	State       string     `json:"state,omitempty"`
	Tables      []string   `json:"tables,omitempty"` // empty: every table
	Error       string     `json:"error,omitempty"`
	Owner       string     `json:"owner,omitempty"`
	DSN         string     `json:"dsn,omitempty"` // the tenant's own login, on the owner's analytics port (no password)
	AppliedLSN  string     `json:"applied_lsn,omitempty"`
	AppliedRows int64      `json:"applied_rows"`
	LagBytes    int64      `json:"lag_bytes"`
	ReportedAt  *time.Time `json:"reported_at,omitempty"`
	Slot        string     `json:"slot,omitempty"`
}

// tableRE is a table a tenant names in --tables: table or schema.table,
// plain identifiers (quoted when they reach SQL).
var tableRE = regexp.MustCompile(`^([A-Za-z_][A-Za-z0-9_$]{0,62}\.)?[A-Za-z_][A-Za-z0-9_$]{0,62}$`)

// Enable records a mirror for t; a daemon's Run makes it. Enabling a
// mirror that exists answers its status (tables are not changed).
func (s *Service) Enable(ctx context.Context, t catalog.Tenant, tables []string) (Status, error) {
	if t.State != catalog.StateActive {
		return Status{}, fmt.Errorf("%w: tenant %s is %s (only active tenants get a mirror)", ErrInvalid, t.ID, t.State)
	}
	if err := checkNames(t, tables); err != nil {
		return Status{}, err
	}
	if tables == nil {
		tables = []string{}
	}
	if st, err := s.Status(ctx, t); err != nil || st.Enabled {
		return st, err
	}
	if err := s.checkIdentity(ctx, t, tables); err != nil {
		return Status{}, err
	}
	_, err := s.Store.Pool().Exec(ctx, `INSERT INTO analytics (tenant, tables) VALUES ($1, $2) ON CONFLICT (tenant) DO NOTHING`, t.ID, tables)
	if err != nil {
		return Status{}, fmt.Errorf("enable analytics of %s: %w", t.ID, err)
	}
	return s.Status(ctx, t)
}

// TablesExcept is every table of t a mirror would carry (its ordinary
// tables, as the tenant names them: name, or schema.name in database mode
// outside public) but those of exclude, which must each name one: the
// explicit --tables list of a mirror of all tables but a few. Tables made
// later are not in it.
func (s *Service) TablesExcept(ctx context.Context, t catalog.Tenant, exclude []string) ([]string, error) {
	if err := checkNames(t, exclude); err != nil {
		return nil, err
	}
	found, err := s.tenantTables(ctx, t, "")
	if err != nil {
		return nil, err
	}
	var out []string
	left := slices.Clone(exclude)
	for _, x := range found {
		name := tableName(t, x)
		if i := slices.IndexFunc(left, func(e string) bool { return e == name || (x[0] == "public" && e == x[1]) || e == x[0]+"."+x[1] }); i >= 0 {
			left = slices.Delete(left, i, i+1)
			continue
		}
		out = append(out, name)
	}
	switch {
	case len(left) > 0:
		return nil, fmt.Errorf("%w: tenant %s has no table %s to leave out", ErrInvalid, t.ID, strings.Join(left, ", "))
	case len(out) == 0:
		return nil, fmt.Errorf("%w: every table of tenant %s is left out: nothing to mirror", ErrInvalid, t.ID)
	}
	return out, nil
}

// tableName is a table as the tenant names it in --tables.
func tableName(t catalog.Tenant, x [2]string) string {
	if t.Mode == tenant.ModeSchema || x[0] == "public" {
		return x[1]
	}
	return x[0] + "." + x[1]
}

// checkNames refuses table names a tenant cannot mean.
func checkNames(t catalog.Tenant, tables []string) error {
	for _, tb := range tables {
		if !tableRE.MatchString(tb) {
			return fmt.Errorf("%w: table %q: want name or schema.name", ErrInvalid, tb)
		}
		if t.Mode == tenant.ModeSchema && strings.Contains(tb, ".") {
			return fmt.Errorf("%w: table %q: a schema tenant names its tables without a schema", ErrInvalid, tb)
		}
	}
	return nil
}

// checkIdentity refuses a mirror of tables without a replica identity (no
// primary key, no REPLICA IDENTITY USING INDEX or FULL): once published,
// PostgreSQL would refuse their UPDATEs and DELETEs to the tenant.
func (s *Service) checkIdentity(ctx context.Context, t catalog.Tenant, tables []string) error {
	found, err := s.tenantTables(ctx, t, `AND (c.relreplident = 'n' OR c.relreplident = 'd' AND NOT EXISTS (SELECT 1 FROM pg_catalog.pg_index i WHERE i.indrelid = c.oid AND i.indisprimary)
			OR c.relreplident = 'i' AND NOT EXISTS (SELECT 1 FROM pg_catalog.pg_index i WHERE i.indrelid = c.oid AND i.indisreplident))`)
	if err != nil {
		return err
	}
	var bad []string
	for _, x := range found {
		name := x[0] + "." + x[1]
		if t.Mode == tenant.ModeSchema {
			name = x[1]
		}
		if len(tables) > 0 && !slices.Contains(tables, name) && !(x[0] == "public" && slices.Contains(tables, x[1])) {
			continue
		}
		bad = append(bad, name)
	}
	if len(bad) > 0 {
		return fmt.Errorf("%w: tables without a primary key: %s (once mirrored, PostgreSQL would refuse their updates and deletes): add a primary key, or ALTER TABLE … REPLICA IDENTITY FULL, or leave them out with --tables or --exclude-tables",
			ErrInvalid, strings.Join(bad, ", "))
	}
	return nil
}

// tenantTables lists t's ordinary permanent tables a mirror may carry
// (schema, name), those that also meet cond (SQL on pg_class c, "": all).
func (s *Service) tenantTables(ctx context.Context, t catalog.Tenant, cond string) ([][2]string, error) {
	cl, err := s.Clusters.Get(t.Cluster)
	if err != nil {
		return nil, err
	}
	conn, err := cl.Connect(ctx, t.Database)
	if err != nil {
		return nil, err
	}
	defer conn.Close(context.WithoutCancel(ctx))
	scope := `n.nspname NOT IN ('pg_catalog', 'information_schema', '` + stateSchema + `') AND n.nspname NOT LIKE 'pg\_%'`
	args := []any{}
	if t.Mode == tenant.ModeSchema {
		scope = `n.nspname = $1`
		args = append(args, tenant.PhysicalName(t.ID))
	}
	rows, err := conn.Query(ctx, `SELECT n.nspname::text, c.relname::text FROM pg_catalog.pg_class c JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace
		WHERE c.relkind = 'r' AND c.relpersistence = 'p' AND `+scope+` `+cond+`
		ORDER BY 1, 2`, args...)
	if err != nil {
		return nil, fmt.Errorf("tables of %s: %w", t.ID, cluster.Classify(err))
	}
	found, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) ([2]string, error) {
		var x [2]string
		return x, r.Scan(&x[0], &x[1])
	})
	if err != nil {
		return nil, fmt.Errorf("tables of %s: %w", t.ID, cluster.Classify(err))
	}
	return found, nil
}

// Disable asks for the mirror to go: its owner stops it and drops its
// slot, publication and file, then deletes the row.
func (s *Service) Disable(ctx context.Context, t catalog.Tenant) (Status, error) {
	tag, err := s.Store.Pool().Exec(ctx, `UPDATE analytics SET state = 'disabling' WHERE tenant = $1`, t.ID)
	if err != nil {
		return Status{}, fmt.Errorf("disable analytics of %s: %w", t.ID, err)
	}
	if tag.RowsAffected() == 0 {
		return Status{}, fmt.Errorf("tenant %s: %w", t.ID, ErrDisabled)
	}
	return s.Status(ctx, t)
}

// Status reads the mirror's row; a tenant without one is not Enabled.
func (s *Service) Status(ctx context.Context, t catalog.Tenant) (Status, error) {
	st := Status{Tenant: t.ID}
	var owner *string
	err := s.Store.Pool().QueryRow(ctx, `SELECT tables, state, error, owner, owner_addr, applied_lsn, applied_rows, lag_bytes, reported_at
		FROM analytics WHERE tenant = $1`, t.ID).Scan(&st.Tables, &st.State, &st.Error, &owner, &st.DSN, &st.AppliedLSN, &st.AppliedRows, &st.LagBytes, &st.ReportedAt)
	if errors.Is(err, pgx.ErrNoRows) {
		return st, nil
	}
	if err != nil {
		return st, fmt.Errorf("analytics status of %s: %w", t.ID, err)
	}
	st.Enabled, st.Slot = true, SlotName(t.ID)
	if owner != nil {
		st.Owner = *owner
	}
	if gone := t.State == catalog.StateDropped || t.State == catalog.StatePurging || t.State == catalog.StatePurged; gone && st.State != StateDisabling {
		// The owner's next pass disables it (manager.go); until then it
		// serves no one and is no longer streaming for anyone.
		st.State, st.Error = StateDisabling, "the tenant is "+string(t.State)+": its mirror is being disabled"
	}
	st.DSN = s.dsn(st.DSN, t)
	return st, nil
}

// DSN is the analytics DSN of t on this daemon's port ("" without one).
func (s *Service) DSN(t catalog.Tenant) string { return s.dsn(s.addr, t) }

// dsn is t's analytics DSN on addr. The daemons of a fleet share their
// configuration: addr (the owner's port) serves TLS as this one does.
func (s *Service) dsn(addr string, t catalog.Tenant) string {
	if addr == "" {
		return ""
	}
	role := tenant.PhysicalName(t.ID)
	return fmt.Sprintf("postgres://%s@%s/%s?%s", role, addr, role, pooler.SSLQuery(s.TLS != nil, s.Config.TLSCAFile))
}

// Purge is the purge job's hook: the mirror goes before the tenant's
// storage (a database with a logical slot cannot be dropped). It asks for
// the mirror's disable and waits for its owner; without an owner within
// the wait it drops the server side itself (the slot must not outlive the
// tenant: it would retain WAL for ever).
func (s *Service) Purge(ctx context.Context, t catalog.Tenant) error {
	live, err := s.Store.GetTenant(ctx, nil, t.ID)
	if err != nil && !errors.Is(err, catalog.ErrNotFound) {
		return err
	}
	if err == nil && live.Cluster != t.Cluster {
		// The copy a move left behind: the tenant's mirror, if it has
		// one, follows it where it lives; only its slot on this cluster
		// can remain (a mirror that has not yet seen the move streams
		// from it: dropping it ends that stream, which then copies anew).
		cl, err := s.Clusters.Get(t.Cluster)
		if err != nil {
			return err
		}
		return DropSlot(ctx, cl, SlotName(t.ID))
	}
	tag, err := s.Store.Pool().Exec(ctx, `UPDATE analytics SET state = 'disabling' WHERE tenant = $1`, t.ID)
	if err != nil {
		return fmt.Errorf("disable analytics of %s: %w", t.ID, err)
	}
	cl, err := s.Clusters.Get(t.Cluster)
	if err != nil {
		return err
	}
	if tag.RowsAffected() == 0 {
		// No mirror (or a disable that finished): a slot left by a crash
		// is all there can be.
		return DropSlot(ctx, cl, SlotName(t.ID))
	}
	deadline := time.Now().Add(3 * s.Config.Lease.D())
	for {
		var n int
		if err := s.Store.Pool().QueryRow(ctx, `SELECT count(*) FROM analytics WHERE tenant = $1`, t.ID).Scan(&n); err != nil {
			return err
		}
		if n == 0 {
			break
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("analytics of %s: its owner has not dropped the mirror yet", t.ID)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(s.Config.PollInterval.D() / 2):
		}
	}
	return dropServerSide(ctx, cl, t)
}

// dropServerSide drops the slot (ending the walsender that streams it)
// and the publication; both may be gone already.
func dropServerSide(ctx context.Context, cl *cluster.Cluster, t catalog.Tenant) error {
	name := SlotName(t.ID)
	if err := DropSlot(ctx, cl, name); err != nil {
		return err
	}
	conn, err := cl.Connect(ctx, t.Database)
	if errors.Is(err, cluster.ErrNotFound) {
		return nil // the database is gone, and its publication with it
	}
	if err != nil {
		return err
	}
	defer conn.Close(context.WithoutCancel(ctx))
	if _, err := conn.Exec(ctx, "DROP PUBLICATION IF EXISTS "+cluster.Ident(name)); err != nil {
		return fmt.Errorf("drop publication %s: %w", name, cluster.Classify(err))
	}
	return nil
}

// DropSlot drops a replication slot, ending the session that streams it
// first; a slot that is gone is dropped already.
func DropSlot(ctx context.Context, cl *cluster.Cluster, name string) error {
	admin, err := cl.Admin(ctx)
	if err != nil {
		return err
	}
	for range 50 {
		var active bool
		err := admin.QueryRow(ctx, `SELECT active FROM pg_catalog.pg_replication_slots WHERE slot_name = $1`, name).Scan(&active)
		if errors.Is(err, pgx.ErrNoRows) {
			return nil
		}
		if err != nil {
			return fmt.Errorf("read slot %s: %w", name, cluster.Classify(err))
		}
		if active {
			_, err = admin.Exec(ctx, `SELECT pg_catalog.pg_terminate_backend(active_pid) FROM pg_catalog.pg_replication_slots WHERE slot_name = $1 AND active_pid IS NOT NULL`, name)
		} else {
			_, err = admin.Exec(ctx, `SELECT pg_catalog.pg_drop_replication_slot($1)`, name)
		}
		if err != nil && !strings.Contains(err.Error(), "does not exist") && !strings.Contains(err.Error(), "is active") {
			return fmt.Errorf("drop slot %s: %w", name, cluster.Classify(err))
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(100 * time.Millisecond):
		}
	}
	return fmt.Errorf("drop slot %s: still there after 5 s", name)
}

// File is the path of a tenant's DuckDB file.
func (s *Service) File(id string) string { return filepath.Join(s.Dir, id+".duckdb") }

// removeFile removes a tenant's DuckDB file and its WAL.
func (s *Service) removeFile(id string) error {
	var errs []error
	for _, p := range []string{s.File(id), s.File(id) + ".wal"} {
		if err := os.Remove(p); err != nil && !errors.Is(err, os.ErrNotExist) {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// Orphan is a slot or publication of pgtenant's analytics that no mirror
// of the catalog accounts for; a slot retains WAL until dropped.
type Orphan struct {
	Cluster string `json:"cluster"`
	Slot    string `json:"slot"`
	Tenant  string `json:"tenant"`
	Active  bool   `json:"active"`
	// RetainedBytes is the WAL the slot holds back on the primary.
	RetainedBytes int64 `json:"retained_bytes"`
}

// Orphans lists the analytics slots of cl without a mirror in the catalog.
func (s *Service) Orphans(ctx context.Context, cl *cluster.Cluster) ([]Orphan, error) {
	admin, err := cl.Admin(ctx)
	if err != nil {
		return nil, err
	}
	rows, err := admin.Query(ctx, `SELECT slot_name::text, active, coalesce(pg_catalog.pg_wal_lsn_diff(pg_catalog.pg_current_wal_lsn(), restart_lsn), 0)::int8
		FROM pg_catalog.pg_replication_slots WHERE slot_name LIKE 'pgt\_analytics\_%'`)
	if err != nil {
		return nil, fmt.Errorf("list slots of %s: %w", cl.Name(), cluster.Classify(err))
	}
	slots, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (Orphan, error) {
		o := Orphan{Cluster: cl.Name()}
		return o, r.Scan(&o.Slot, &o.Active, &o.RetainedBytes)
	})
	if err != nil {
		return nil, fmt.Errorf("list slots of %s: %w", cl.Name(), cluster.Classify(err))
	}
	var out []Orphan
	for _, o := range slots {
		o.Tenant = strings.TrimPrefix(o.Slot, Prefix)
		var n int
		if err := s.Store.Pool().QueryRow(ctx, `SELECT count(*) FROM analytics a JOIN tenants t ON t.id = a.tenant WHERE a.tenant = $1 AND t.cluster = $2`,
			o.Tenant, cl.Name()).Scan(&n); err != nil {
			return nil, err
		}
		if n == 0 {
			out = append(out, o)
		}
	}
	return out, nil
}
