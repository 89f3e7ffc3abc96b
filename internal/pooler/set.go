package pooler

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"net/url"
	"sort"
	"strconv"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"golang.org/x/sync/errgroup"

	"github.com/pgtenant/pgtenant/internal/catalog"
	"github.com/pgtenant/pgtenant/internal/cluster"
	"github.com/pgtenant/pgtenant/internal/config"
	"github.com/pgtenant/pgtenant/internal/tenant"
)

// Set is the poolers of a daemon, by cluster. A nil Set, or a cluster
// without a pooler, answers as "no pooler": tenants connect directly.
type Set struct {
	mu     sync.RWMutex
	fronts map[string]*Front
	// SyncTimeout bounds how long a lifecycle change waits for its sync.
	SyncTimeout time.Duration
	Logger      *slog.Logger
}

// NewSet holds fronts.
func NewSet(log *slog.Logger, fronts ...*Front) *Set {
	s := &Set{fronts: map[string]*Front{}, SyncTimeout: 10 * time.Second, Logger: log}
	for _, f := range fronts {
		s.fronts[f.Cluster] = f
	}
	if s.Logger == nil {
		s.Logger = slog.New(slog.DiscardHandler)
	}
	return s
}

// Get returns the cluster's pooler, nil without one.
func (s *Set) Get(clusterName string) *Front {
	if s == nil {
		return nil
	}
	s.mu.RLock()
	defer s.mu.RUnlock()
	return s.fronts[clusterName]
}

// All returns the poolers by cluster name.
func (s *Set) All() []*Front {
	if s == nil {
		return nil
	}
	s.mu.RLock()
	defer s.mu.RUnlock()
	out := make([]*Front, 0, len(s.fronts))
	for _, f := range s.fronts {
		out = append(out, f)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Cluster < out[j].Cluster })
	return out
}

// Sync brings the cluster's pooler to the catalog's state and waits for it
// (at most SyncTimeout): called after each lifecycle change, once its
// catalog transaction committed. A pooler that cannot be synced is logged,
// not an error of the change: the server has the change already (a locked
// out role, a new password), and the next sync brings the pooler along.
func (s *Set) Sync(ctx context.Context, clusterName, why string) {
	f := s.Get(clusterName)
	if f == nil {
		return
	}
	ctx, cancel := context.WithTimeout(ctx, s.SyncTimeout)
	defer cancel()
	if err := f.Sync(ctx); err != nil {
		s.Logger.Warn("the pooler did not take a change yet; its next sync will", "component", "pooler", "cluster", clusterName, "change", why, "err", err)
	}
}

// ErrFrontDoorDown says a cluster's front door (its PgBouncer) does not
// serve: the API answers 503 unavailable with the error's own message (not
// the one of a database that does not answer: the database may be fine).
var ErrFrontDoorDown = errors.New("front door down")

// Serving returns nil when the cluster's front door serves: it has no
// pooler (tenants connect directly), or its PgBouncer runs and its last
// sync worked. Otherwise it asks for a sync and waits for it, at most wait;
// still not serving, the error wraps ErrFrontDoorDown and says why.
// A create asks before it creates anything, so that it never answers
// success with a DSN whose front door is down.
func (s *Set) Serving(ctx context.Context, clusterName string, wait time.Duration) error {
	f := s.Get(clusterName)
	if f == nil || f.serving() {
		return nil
	}
	ctx, cancel := context.WithTimeout(ctx, wait)
	defer cancel()
	if err := f.Sync(ctx); err != nil || !f.serving() {
		if err == nil {
			err = errors.New("its PgBouncer does not run")
		}
		return fmt.Errorf("%w: the PgBouncer of cluster %s, which its tenants connect through, is not serving: %v", ErrFrontDoorDown, clusterName, err)
	}
	return nil
}

// Await is Sync for a caller that answers with the tenant's pooler DSN: it
// returns the error instead of logging it (wrapping ErrFrontDoorDown),
// so that the caller does not hand out a DSN the pooler does not serve.
func (s *Set) Await(ctx context.Context, clusterName string) error {
	f := s.Get(clusterName)
	if f == nil {
		return nil
	}
	ctx, cancel := context.WithTimeout(ctx, s.SyncTimeout)
	defer cancel()
	if err := f.Sync(ctx); err != nil {
		return fmt.Errorf("%w: the PgBouncer of cluster %s did not take the change: %v", ErrFrontDoorDown, clusterName, err)
	}
	return nil
}

// Serves reports whether the cluster's front door serves entry for its
// user with verifier already (Front.Serves); true for a cluster without
// one.
func (s *Set) Serves(clusterName, entry, verifier string) bool {
	f := s.Get(clusterName)
	return f == nil || f.Serves(entry, verifier)
}

// Down lists the clusters whose front door does not serve now (its last
// sync failed or its PgBouncer does not run): read from memory and the pid
// file, placement asks on every create.
func (s *Set) Down() []string {
	var out []string
	for _, f := range s.All() {
		if !f.serving() {
			out = append(out, f.Cluster)
		}
	}
	return out
}

// Poke asks the cluster's pooler for a sync without waiting.
func (s *Set) Poke(clusterName string) {
	if f := s.Get(clusterName); f != nil {
		f.Poke()
	}
}

// Run runs every pooler until ctx is done.
func (s *Set) Run(ctx context.Context) error {
	g, gctx := errgroup.WithContext(ctx)
	for _, f := range s.All() {
		g.Go(func() error { return f.Run(gctx) })
	}
	return g.Wait()
}

// DSNs returns the DSN a tenant uses (the pooler's, whose database is the
// tenant's entry, when its cluster has one) and the direct DSN to the
// primary. password may be empty.
func (s *Set) DSNs(cl *cluster.Cluster, t catalog.Tenant, password string) (dsn, direct string) {
	role := tenant.PhysicalName(t.ID)
	direct = cl.TenantDSN(t.Database, role, password)
	f := s.Get(t.FrontCluster())
	if f == nil {
		return direct, direct
	}
	return f.dsn(role, role, password), direct
}

// LoginDSN is the DSN of one of a tenant's extra logins through its front
// door: its entry's, or for a replica login its standby entry's; false
// when the tenant has no front door.
func (s *Set) LoginDSN(t catalog.Tenant, role, password string, replica bool) (string, bool) {
	f := s.Get(t.FrontCluster())
	if f == nil {
		return "", false
	}
	entry := tenant.PhysicalName(t.ID)
	if replica {
		entry = tenant.StandbyEntry(t.ID)
	}
	return f.dsn(entry, role, password), true
}

// dsn is the DSN of user on entry through the front door (password may be
// empty).
func (f *Front) dsn(entry, user, password string) string {
	u := url.URL{Scheme: "postgres", Host: f.PublicAddr(), Path: "/" + entry, RawQuery: f.SSLQuery(), User: url.User(user)}
	if password != "" {
		u.User = url.UserPassword(user, password)
	}
	return u.String()
}

// CatalogSource makes the entries of a cluster's pooler from the catalog
// (active tenants whose front door it is; suspended ones disabled) and the
// verifiers of their roles in pg_authid, which the admin (a superuser) of
// the cluster each lives on reads: a tenant moved to another cluster keeps
// its entry here, pointed at that cluster.
//
// A fault stays in its cluster: a cluster a tenant lives on that is missing
// from the registry, down or slow (remoteWait) fails none of the entries of
// the others. Its tenants keep the verifiers last read from it (their entry
// stays, and their clients get the server's error, not "login
// rejected"), or are left out with why when none was read yet; the pooler
// renders, starts and serves its other tenants either way.
type CatalogSource struct {
	Store    *catalog.Store
	Clusters *cluster.Registry
	Tiers    map[string]config.Tier
	Logger   *slog.Logger
}

// remoteWait bounds the read of one cluster's verifiers during a sync, so
// that a cluster that does not answer delays its neighbours' front door by
// this much at most.
const remoteWait = 3 * time.Second

// For returns the Source of one cluster.
func (c CatalogSource) For(clusterName string) Source {
	var mu sync.Mutex // a sync and a reconcile's Compare may read at once
	warned := map[string]string{}
	known := map[string]string{} // role → the verifier last read, for a cluster that does not answer now
	return func(ctx context.Context) ([]Entry, map[string]string, error) {
		mu.Lock()
		defer mu.Unlock()
		// Spares too: one built with its password has its entry before
		// its claim (spares without one are left out, unwarned).
		ts, err := c.Store.ListTenants(ctx, catalog.TenantFilter{Front: clusterName, Limit: 100000,
			States: []catalog.TenantState{catalog.StateActive, catalog.StateSuspended, catalog.StateSpare}})
		if err != nil {
			return nil, nil, err
		}
		logins, err := c.Store.LoginsFronted(ctx, clusterName)
		if err != nil {
			return nil, nil, err
		}
		byCluster := map[string][]string{}
		for _, t := range ts {
			byCluster[t.Cluster] = append(byCluster[t.Cluster], tenant.PhysicalName(t.ID))
			byCluster[t.Cluster] = append(byCluster[t.Cluster], catalog.LoginRoles(logins[t.ID])...)
		}
		verifiers := map[string]string{}
		servers := map[string]*cluster.Cluster{}
		unreachable := map[string]string{} // cluster → why its verifiers were not read
		for name, roles := range byCluster {
			cl, err := c.Clusters.Get(name)
			if err == nil {
				servers[name] = cl
				rctx, cancel := context.WithTimeout(ctx, remoteWait)
				var vs map[string]string
				vs, err = Verifiers(rctx, cl, roles)
				cancel()
				if err == nil {
					maps.Copy(verifiers, vs)
					continue
				}
			}
			if ctx.Err() != nil {
				return nil, nil, ctx.Err()
			}
			unreachable[name] = err.Error()
			if warned[name] != "down" {
				c.Logger.Warn("a cluster's tenants keep their last pooler entries: their cluster did not answer", "component", "pooler",
					"cluster", clusterName, "tenant_cluster", name, "tenants", len(roles), "err", err)
			}
			for _, role := range roles {
				if v, ok := known[role]; ok {
					verifiers[role] = v
				}
			}
		}
		entries := make([]Entry, 0, len(ts))
		skipped := map[string]string{}
		for _, t := range ts {
			role := tenant.PhysicalName(t.ID)
			v := verifiers[role]
			if t.State == catalog.StateSpare && !ValidVerifier(v) {
				continue
			}
			if !ValidVerifier(v) {
				why := "its role has no SCRAM-SHA-256 password (changed by the tenant itself?): rotate it with `pgtenant tenant password " + t.ID + "`"
				switch {
				case unreachable[t.Cluster] != "":
					why = "its cluster " + t.Cluster + " did not answer (" + unreachable[t.Cluster] + "): back in the pooler once it does"
				case v == "":
					why = "its role has no password or is missing on the cluster"
				}
				skipped[role] = why
				if warned[role] != why {
					c.Logger.Warn("tenant left out of the pooler", "component", "pooler", "cluster", clusterName, "tenant", t.ID, "why", why)
				}
				continue
			}
			tier, ok := c.Tiers[t.Tier]
			if !ok {
				tier = c.Tiers["default"]
			}
			mode, size, maxDB := tier.Pooling()
			e := Entry{Name: role, Database: t.Database, Verifier: v, PoolMode: mode,
				PoolSize: size, MaxDBConnections: maxDB, Disabled: t.State == catalog.StateSuspended, RequireTLS: tier.RequireTLS,
				Allow: t.Allow, Spare: t.State == catalog.StateSpare}
			if t.Cluster != clusterName {
				host, port, ok := c.server(servers, t.Cluster)
				if !ok {
					skipped[role] = "its cluster " + t.Cluster + " is not registered with this daemon"
					continue
				}
				e.Host, e.Port = host, port
			}
			// Its extra logins: on its entry, or (replica) on the entry of
			// its cluster's first standby.
			standby := e
			standby.Name, standby.Replica, standby.Verifier = tenant.StandbyEntry(t.ID), true, ""
			for _, l := range logins[t.ID] {
				u := User{Name: l.Role(), Verifier: verifiers[l.Role()]}
				switch {
				case !ValidVerifier(u.Verifier):
					skipped[u.Name] = "its role has no SCRAM-SHA-256 password: rotate it with `pgtenant tenant credential rotate " + t.ID + " " + l.Name + "`"
				case l.Replica:
					standby.Logins = append(standby.Logins, u)
				default:
					e.Logins = append(e.Logins, u)
				}
			}
			entries = append(entries, e)
			if len(standby.Logins) > 0 {
				if host, port, ok := c.standby(servers, t.Cluster); ok {
					standby.Host, standby.Port = host, port
					entries = append(entries, standby)
				} else {
					skipped[standby.Name] = "its cluster " + t.Cluster + " has no standby registered with this daemon"
				}
			}
		}
		clear(warned)
		for k, v := range skipped {
			warned[k] = v
		}
		for name := range unreachable {
			warned[name] = "down"
		}
		// Only the verifiers of tenants this pooler still fronts are kept.
		clear(known)
		for _, e := range entries {
			for _, u := range e.users() {
				known[u.Name] = u.Verifier
			}
		}
		return entries, skipped, nil
	}
}

// server is where the entries of a tenant living on another cluster point:
// that cluster's primary, from the registry.
func (c CatalogSource) server(servers map[string]*cluster.Cluster, name string) (string, int, bool) {
	cl := servers[name]
	if cl == nil {
		return "", 0, false
	}
	return cl.Host(), int(cl.Port()), true
}

// standby is where a tenant's replica entry points: the first standby of
// its cluster, from the registry.
func (c CatalogSource) standby(servers map[string]*cluster.Cluster, name string) (string, int, bool) {
	cl := servers[name]
	if cl == nil || len(cl.StandbyDSNs()) == 0 {
		return "", 0, false
	}
	cfg, err := pgx.ParseConfig(cl.StandbyDSNs()[0])
	if err != nil {
		return "", 0, false
	}
	return cfg.Host, int(cfg.Port), true
}

// Verifiers reads the stored passwords of roles from pg_authid
// (superuser-only), by role name.
func Verifiers(ctx context.Context, cl *cluster.Cluster, roles []string) (map[string]string, error) {
	out := make(map[string]string, len(roles))
	if len(roles) == 0 {
		return out, nil
	}
	admin, err := cl.Admin(ctx)
	if err != nil {
		return nil, err
	}
	rows, err := admin.Query(ctx, `SELECT rolname::text, coalesce(rolpassword, '') FROM pg_catalog.pg_authid WHERE rolname = ANY($1::text[])`, roles)
	if err != nil {
		return nil, fmt.Errorf("read tenants' verifiers on cluster %s (the pooler needs the cluster's admin to be a superuser): %w", cl.Name(), cluster.Classify(err))
	}
	type kv struct{ k, v string }
	got, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (kv, error) {
		var x kv
		return x, r.Scan(&x.k, &x.v)
	})
	if err != nil {
		return nil, fmt.Errorf("read tenants' verifiers on cluster %s: %w", cl.Name(), cluster.Classify(err))
	}
	for _, x := range got {
		out[x.k] = x.v
	}
	return out, nil
}

// NewFront builds the Front of a cluster from its pooler block.
func NewFront(cl *cluster.Cluster, pc config.PoolerConfig, src Source, stopOnExit bool, log *slog.Logger) (*Front, error) {
	proc, err := NewProcess(pc.Dir)
	if err != nil {
		return nil, fmt.Errorf("pooler of cluster %s: %w", cl.Name(), err)
	}
	host, portText, err := splitHostPort(pc.Listen)
	if err != nil {
		return nil, fmt.Errorf("pooler of cluster %s: listen: %w", cl.Name(), err)
	}
	port, _ := strconv.Atoi(portText)
	serverHost, serverPort := cmp.Or(pc.ServerSocketDir, cl.Host()), int(cl.Port())
	if pc.Server != "" {
		h, p, err := splitHostPort(pc.Server)
		if err != nil {
			return nil, fmt.Errorf("pooler of cluster %s: server: %w", cl.Name(), err)
		}
		serverHost = h
		serverPort, _ = strconv.Atoi(p)
	}
	return &Front{Cluster: cl.Name(), Proc: proc, Source: src, PublicHost: pc.Host, fixedServer: pc.Server != "", socketDir: pc.ServerSocketDir,
		Settings: Settings{ListenHost: host, ListenPort: port, ServerHost: serverHost, ServerPort: serverPort,
			MaxClientConn: pc.MaxClientConn, ServerIdleTimeout: pc.ServerIdleTimeout.D(), QueryWaitTimeout: pc.QueryWaitTimeout.D(),
			TLSCertFile: pc.TLSCertFile, TLSKeyFile: pc.TLSKeyFile, TLSCAFile: pc.TLSCAFile, RequireTLS: pc.RequireTLS,
			ServerTLSSSLMode: pc.ServerTLSSSLMode, ServerTLSCAFile: pc.ServerTLSCAFile},
		Coalesce: pc.Coalesce.D(), SyncInterval: pc.SyncInterval.D(), StopOnExit: stopOnExit, Logger: log}, nil
}
