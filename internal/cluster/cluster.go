// Package cluster talks to one PostgreSQL cluster (a primary and its
// standbys): connection pools, the health probe the pacer and metrics use
// (replay lag, WAL, checkpoints), and the mapping of SQLSTATEs to domain
// errors. It knows nothing of tenants or the catalog.
package cluster

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/url"
	"slices"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
)

// Cluster is one PostgreSQL cluster known by the admin DSN of its primary.
// Standbys are seen through pg_stat_replication; their DSNs, when known, let
// the probe and prewarm reach them directly.
type Cluster struct {
	name        string
	dsn         string          // as registered, to notice a change
	cfg         *pgx.ConnConfig // primary, admin role, maintenance database
	standbyDSNs []string
	log         *slog.Logger

	mu    sync.Mutex
	pools map[string]*pgxpool.Pool // one lazy pool per database, closed by Close

	probeMu   sync.Mutex
	lastProbe Health
	lastErr   error
}

// Maximum connections of each per-database pool. Admin work is short DDL and
// catalog reads; keeping pools small leaves the cluster's connection budget to
// tenants.
const poolMaxConns = 4

// New checks the DSN and returns the cluster. It does not connect.
func New(name, dsn string, standbyDSNs []string, logger *slog.Logger) (*Cluster, error) {
	cfg, err := pgx.ParseConfig(dsn)
	if err != nil {
		return nil, fmt.Errorf("cluster %s: bad dsn: %s", name, RedactError(err, dsn))
	}
	if cfg.Database == "" {
		cfg.Database = "postgres"
	}
	for i, s := range standbyDSNs {
		if _, err := pgx.ParseConfig(s); err != nil {
			return nil, fmt.Errorf("cluster %s: bad standby dsn %d: %s", name, i+1, RedactError(err, s))
		}
	}
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	return &Cluster{name: name, dsn: dsn, cfg: cfg, standbyDSNs: standbyDSNs,
		log: logger.With("component", "cluster", "cluster", name), pools: map[string]*pgxpool.Pool{}}, nil
}

// Name returns the cluster's name.
func (c *Cluster) Name() string { return c.name }

// Registered reports whether the cluster was made from these DSNs.
func (c *Cluster) Registered(dsn string, standbyDSNs []string) bool {
	return c.dsn == dsn && slices.Equal(c.standbyDSNs, standbyDSNs)
}

// Host and Port of the primary, for DSNs handed to tenants.
func (c *Cluster) Host() string { return c.cfg.Host }
func (c *Cluster) Port() uint16 { return c.cfg.Port }

// MaintenanceDB is the database admin connections use by default.
func (c *Cluster) MaintenanceDB() string { return c.cfg.Database }

// StandbyDSNs returns the configured standby DSNs.
func (c *Cluster) StandbyDSNs() []string { return c.standbyDSNs }

// Admin returns the pool of the maintenance database.
func (c *Cluster) Admin(ctx context.Context) (*pgxpool.Pool, error) {
	return c.Pool(ctx, c.cfg.Database)
}

// Pool returns the admin pool of one database, creating it on first use.
func (c *Cluster) Pool(ctx context.Context, database string) (*pgxpool.Pool, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if p, ok := c.pools[database]; ok {
		return p, nil
	}
	pc, err := pgxpool.ParseConfig("")
	if err != nil {
		return nil, err
	}
	pc.ConnConfig = c.connConfig(database)
	pc.MaxConns = poolMaxConns
	pc.MaxConnIdleTime = time.Minute
	p, err := pgxpool.NewWithConfig(ctx, pc)
	if err != nil {
		return nil, Classify(err)
	}
	c.pools[database] = p
	return p, nil
}

// ClosePool closes and forgets the pool of one database, e.g. before that
// database is dropped or renamed.
func (c *Cluster) ClosePool(database string) {
	c.mu.Lock()
	p, ok := c.pools[database]
	delete(c.pools, database)
	c.mu.Unlock()
	if ok {
		p.Close()
	}
}

// Connect opens a single admin connection to a database, for work that needs
// a session of its own (batched builds, SET ROLE). The caller closes it.
func (c *Cluster) Connect(ctx context.Context, database string) (*pgx.Conn, error) {
	conn, err := pgx.ConnectConfig(ctx, c.connConfig(database))
	if err != nil {
		return nil, fmt.Errorf("connect to %s/%s: %w", c.name, database, Classify(err))
	}
	return conn, nil
}

// ConnectAs opens a connection to a database of the primary as another
// role (a tenant's agent), with the same host, TLS and pinned settings as
// admin sessions. The caller closes it.
func (c *Cluster) ConnectAs(ctx context.Context, database, user, password, application string) (*pgx.Conn, error) {
	cc := c.connConfig(database)
	cc.User, cc.Password = user, password
	cc.RuntimeParams["application_name"] = application
	conn, err := pgx.ConnectConfig(ctx, cc)
	if err != nil {
		return nil, fmt.Errorf("connect to %s/%s as %s: %w", c.name, database, user, Classify(err))
	}
	return conn, nil
}

// ConnectReplication opens a logical replication connection (replication
// = database) to a database of the primary as the admin, with the pinned
// settings: pgoutput's text values then come in the formats they pin.
// wrap, unless nil, wraps the socket once dialled (under TLS).
func (c *Cluster) ConnectReplication(ctx context.Context, database string, wrap func(net.Conn) net.Conn) (*pgconn.PgConn, error) {
	cc := c.connConfig(database).Config.Copy()
	cc.RuntimeParams["replication"] = "database"
	if dial := cc.DialFunc; wrap != nil {
		cc.DialFunc = func(ctx context.Context, network, addr string) (net.Conn, error) {
			conn, err := dial(ctx, network, addr)
			if err != nil {
				return nil, err
			}
			return wrap(conn), nil
		}
	}
	conn, err := pgconn.ConnectConfig(ctx, cc)
	if err != nil {
		return nil, fmt.Errorf("replication connection to %s/%s: %w", c.name, database, Classify(err))
	}
	return conn, nil
}

func (c *Cluster) connConfig(database string) *pgx.ConnConfig {
	return withDefaults(c.cfg.Copy(), database)
}

// withDefaults points cc at database (unless empty), pins the session
// settings (PinnedSettings) and pgtenant's application_name and, unless the
// DSN has one, sets a 5 s connect timeout.
func withDefaults(cc *pgx.ConnConfig, database string) *pgx.ConnConfig {
	if database != "" {
		cc.Database = database
	}
	if cc.RuntimeParams == nil {
		cc.RuntimeParams = map[string]string{}
	}
	for k, v := range PinnedSettings {
		cc.RuntimeParams[k] = v
	}
	cc.RuntimeParams["application_name"] = "pgtenant"
	if cc.ConnectTimeout == 0 {
		cc.ConnectTimeout = 5 * time.Second
	}
	return cc
}

// AdminLockTimeout bounds every lock wait of a session pgtenant opens on a
// cluster, unless a statement sets its own: a tenant can hold locks on its
// tables, its schema and its role's catalog row, and no control-plane step
// may wait on them for ever. A step that times out fails with
// ErrLockNotAvailable and is retried by its job.
const AdminLockTimeout = 10 * time.Second

// PinnedSettings are sent as startup parameters on every session pgtenant
// opens on a cluster, admin and tenant-agent sessions alike. Startup
// parameters take precedence over ALTER DATABASE … SET and ALTER ROLE … SET,
// so nothing a tenant sets on a database or on a role it can reach changes
// how pgtenant's own SQL behaves (docs/SECURITY.md, "Pinned sessions"):
//   - search_path: functions, operators and types resolve in pg_catalog
//     only (pg_temp is never searched for functions or operators), so a
//     tenant's public.unnest(oid[]) cannot shadow pg_catalog.unnest;
//   - role: ALTER DATABASE … SET role would start the session as a tenant;
//   - read-only, isolation, timeouts: a tenant cannot make the control
//     plane's writes fail, time out, or wait unbounded;
//   - standard_conforming_strings and backslash_quote: Literal's quoting
//     relies on them;
//   - exit_on_error, local_preload_libraries, tablespaces, access method,
//     date and number formats: no surprise in behaviour or in text output;
//   - jit: pgtenant's queries read catalogs and statistics, never enough
//     rows to repay compiling them: JIT took 1.2 s of the collector's
//     1.3 s size query over 100 schema tenants (bench density), and a
//     tenant's ALTER DATABASE … SET jit_above_cost = 0 would slow them all.
//
// Only parameters any role may set are pinned, since tenant-agent sessions
// are not superusers.
var PinnedSettings = map[string]string{
	"search_path":                         "pg_catalog, pg_temp",
	"role":                                "none",
	"default_transaction_read_only":       "off",
	"default_transaction_isolation":       "read committed",
	"default_transaction_deferrable":      "off",
	"statement_timeout":                   "0",
	"lock_timeout":                        fmt.Sprintf("%dms", AdminLockTimeout.Milliseconds()),
	"idle_in_transaction_session_timeout": "0",
	"idle_session_timeout":                "0",
	"standard_conforming_strings":         "on",
	"backslash_quote":                     "safe_encoding",
	"check_function_bodies":               "on",
	"exit_on_error":                       "off",
	"local_preload_libraries":             "",
	"row_security":                        "on",
	"default_tablespace":                  "",
	"temp_tablespaces":                    "",
	"default_table_access_method":         "heap",
	"client_min_messages":                 "warning",
	"client_encoding":                     "UTF8",
	"DateStyle":                           "ISO, MDY",
	"IntervalStyle":                       "postgres",
	"TimeZone":                            "UTC",
	"extra_float_digits":                  "1",
	"bytea_output":                        "hex",
	"transform_null_equals":               "off",
	"array_nulls":                         "on",
	"quote_all_identifiers":               "off",
	"xmloption":                           "content",
	"jit":                                 "off",
}

// TenantDSN is the DSN a tenant uses: the primary's host and port, the
// tenant's role and database.
func (c *Cluster) TenantDSN(database, user, password string) string {
	u := url.URL{Scheme: "postgres", Host: fmt.Sprintf("%s:%d", c.cfg.Host, c.cfg.Port), Path: "/" + database}
	if password != "" {
		u.User = url.UserPassword(user, password)
	} else {
		u.User = url.User(user)
	}
	if c.cfg.TLSConfig == nil {
		u.RawQuery = "sslmode=disable"
	}
	return u.String()
}

// Close closes every pool.
func (c *Cluster) Close() {
	c.mu.Lock()
	defer c.mu.Unlock()
	for db, p := range c.pools {
		p.Close()
		delete(c.pools, db)
	}
}

// Ping checks that the primary answers.
func (c *Cluster) Ping(ctx context.Context) error {
	p, err := c.Admin(ctx)
	if err != nil {
		return err
	}
	if err := p.Ping(ctx); err != nil {
		return fmt.Errorf("cluster %s: %w", c.name, Classify(err))
	}
	return nil
}

// Registry holds the clusters the daemon knows, by name. It owns their pools.
type Registry struct {
	mu sync.RWMutex
	m  map[string]*Cluster
}

// ErrUnknownCluster is returned by Registry.Get for a name it does not hold.
var ErrUnknownCluster = errors.New("unknown cluster")

// NewRegistry returns an empty registry.
func NewRegistry() *Registry { return &Registry{m: map[string]*Cluster{}} }

// Put adds or replaces a cluster; a replaced cluster's pools are closed.
func (r *Registry) Put(c *Cluster) {
	r.mu.Lock()
	old := r.m[c.name]
	r.m[c.name] = c
	r.mu.Unlock()
	if old != nil && old != c {
		old.Close()
	}
}

// Get returns the named cluster.
func (r *Registry) Get(name string) (*Cluster, error) {
	r.mu.RLock()
	defer r.mu.RUnlock()
	c, ok := r.m[name]
	if !ok {
		return nil, fmt.Errorf("%w %q (daemons read the catalog's clusters every few seconds; register it with `pgtenant cluster add`)", ErrUnknownCluster, name)
	}
	return c, nil
}

// All returns every cluster, in no particular order.
func (r *Registry) All() []*Cluster {
	r.mu.RLock()
	defer r.mu.RUnlock()
	out := make([]*Cluster, 0, len(r.m))
	for _, c := range r.m {
		out = append(out, c)
	}
	return out
}

// Close closes every cluster's pools.
func (r *Registry) Close() {
	for _, c := range r.All() {
		c.Close()
	}
}

// Nodes returns the names of the cluster's nodes: "primary", then
// "standby1", "standby2", … for the configured standby DSNs.
func (c *Cluster) Nodes() []string {
	out := []string{"primary"}
	for i := range c.standbyDSNs {
		out = append(out, fmt.Sprintf("standby%d", i+1))
	}
	return out
}

// ConnectNode opens an admin connection to a database on one node (see
// Nodes). Standbys are read-only.
func (c *Cluster) ConnectNode(ctx context.Context, node, database string) (*pgx.Conn, error) {
	if node == "" || node == "primary" {
		return c.Connect(ctx, database)
	}
	dsn, err := c.standbyDSN(node)
	if err != nil {
		return nil, err
	}
	conn, err := ConnectDSN(ctx, dsn, database)
	if err != nil {
		return nil, fmt.Errorf("connect to %s/%s/%s: %w", c.name, node, database, Classify(err))
	}
	return conn, nil
}

// NodeAdmin returns an admin pool of the maintenance database on one node
// (see Nodes), created on first use: the primary's is Admin; a standby's
// serves checks that run there every few seconds (sessions to end, the
// statement cap) without a connection set-up each time.
func (c *Cluster) NodeAdmin(ctx context.Context, node string) (*pgxpool.Pool, error) {
	if node == "" || node == "primary" {
		return c.Admin(ctx)
	}
	dsn, err := c.standbyDSN(node)
	if err != nil {
		return nil, err
	}
	key := node + "/"
	c.mu.Lock()
	defer c.mu.Unlock()
	if p, ok := c.pools[key]; ok {
		return p, nil
	}
	pc, err := pgxpool.ParseConfig(dsn)
	if err != nil {
		return nil, fmt.Errorf("cluster %s %s: bad dsn: %s", c.name, node, RedactError(err, dsn))
	}
	pc.ConnConfig = withDefaults(pc.ConnConfig, c.cfg.Database)
	pc.MaxConns = 2 // short checks only
	pc.MaxConnIdleTime = time.Minute
	p, err := pgxpool.NewWithConfig(ctx, pc)
	if err != nil {
		return nil, Classify(err)
	}
	c.pools[key] = p
	return p, nil
}

func (c *Cluster) standbyDSN(node string) (string, error) {
	var i int
	if _, err := fmt.Sscanf(node, "standby%d", &i); err != nil || i < 1 || i > len(c.standbyDSNs) {
		return "", fmt.Errorf("cluster %s has no node %q (nodes: %v)", c.name, node, c.Nodes())
	}
	return c.standbyDSNs[i-1], nil
}

// ConnectDSN opens one connection to a server given by DSN (to database
// instead of the DSN's when database is not empty), with withDefaults.
func ConnectDSN(ctx context.Context, dsn, database string) (*pgx.Conn, error) {
	cfg, err := pgx.ParseConfig(dsn)
	if err != nil {
		return nil, err
	}
	return pgx.ConnectConfig(ctx, withDefaults(cfg, database))
}
