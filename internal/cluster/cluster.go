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
	"net/url"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// Cluster is one PostgreSQL cluster known by the admin DSN of its primary.
// Standbys are seen through pg_stat_replication; their DSNs, when known, let
// the probe and prewarm reach them directly.
type Cluster struct {
	name        string
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
	return &Cluster{name: name, cfg: cfg, standbyDSNs: standbyDSNs,
		log: logger.With("component", "cluster", "cluster", name), pools: map[string]*pgxpool.Pool{}}, nil
}

// Name returns the cluster's name.
func (c *Cluster) Name() string { return c.name }

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

func (c *Cluster) connConfig(database string) *pgx.ConnConfig {
	return withDefaults(c.cfg.Copy(), database)
}

// withDefaults points cc at database (unless empty) and sets pgtenant's
// application_name and, unless the DSN has one, a 5 s connect timeout.
func withDefaults(cc *pgx.ConnConfig, database string) *pgx.ConnConfig {
	if database != "" {
		cc.Database = database
	}
	if cc.RuntimeParams == nil {
		cc.RuntimeParams = map[string]string{}
	}
	cc.RuntimeParams["application_name"] = "pgtenant"
	if cc.ConnectTimeout == 0 {
		cc.ConnectTimeout = 5 * time.Second
	}
	return cc
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
		return nil, fmt.Errorf("%w %q", ErrUnknownCluster, name)
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
	var i int
	if _, err := fmt.Sscanf(node, "standby%d", &i); err != nil || i < 1 || i > len(c.standbyDSNs) {
		return nil, fmt.Errorf("cluster %s has no node %q (nodes: %v)", c.name, node, c.Nodes())
	}
	conn, err := ConnectDSN(ctx, c.standbyDSNs[i-1], database)
	if err != nil {
		return nil, fmt.Errorf("connect to %s/%s/%s: %w", c.name, node, database, Classify(err))
	}
	return conn, nil
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
