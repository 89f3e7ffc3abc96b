package migrate

import (
	"context"
	"sync"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgtenant/pgtenant/internal/catalog"
	"github.com/pgtenant/pgtenant/internal/cluster"
	"github.com/pgtenant/pgtenant/internal/sandbox"
)

// ApplicationName is the application_name of a rollout's connections to tenants.
const ApplicationName = "pgtenant migrate"

// slot is one of a cluster's connection slots in a rollout: at most
// per_cluster tenants are migrated at once on a cluster, each holding one
// slot, and a slot holds at most one session. A session is a tenant's own
// (authenticated as its agent role, see internal/sandbox), so it is closed
// when that tenant is done: no connection ever serves two tenants. The
// cluster is looked up for each session: after a failover the registry
// holds the new primary's, and a rollout's slots follow it.
type slot struct {
	clusters *cluster.Registry
	name     string
	agents   *sandbox.Agents
	s        *sandbox.Session
	cl       *cluster.Cluster // the cluster of s
}

// session returns the slot's session for tenant t, opening it on first use.
func (s *slot) session(ctx context.Context, t catalog.Tenant) (*sandbox.Session, error) {
	if s.s != nil && s.s.Tenant == t.ID && !s.s.Conn().IsClosed() {
		return s.s, nil
	}
	s.drop()
	cl, err := s.clusters.Get(s.name)
	if err != nil {
		return nil, err
	}
	sess, err := s.agents.Open(ctx, cl, sandbox.TargetOf(t), ApplicationName)
	if err != nil {
		return nil, err
	}
	s.s, s.cl = sess, cl
	return sess, nil
}

// drop closes the slot's session and waits (up to a second) until its
// backend has exited: an exiting backend still holds one of the server's
// connection slots, and the slot must not open a second connection before
// the first is gone, or the rollout would exceed its connection budget.
func (s *slot) drop() {
	if s.s == nil {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	pid := s.s.Conn().PgConn().PID()
	_ = s.s.Close(ctx)
	s.s = nil
	admin, err := s.cl.Admin(ctx)
	if err != nil {
		return
	}
	for deadline := time.Now().Add(time.Second); time.Now().Before(deadline); {
		time.Sleep(time.Millisecond) // an exit takes about that
		var alive bool
		if err := admin.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM pg_catalog.pg_stat_activity WHERE pid = $1)`, pid).Scan(&alive); err != nil || !alive {
			return
		}
	}
}

// slots is a cluster's pool of slots.
type slots chan *slot

func newSlots(clusters *cluster.Registry, name string, agents *sandbox.Agents, n int) slots {
	ch := make(slots, n)
	for range n {
		ch <- &slot{clusters: clusters, name: name, agents: agents}
	}
	return ch
}

func (s slots) take() *slot  { return <-s }
func (s slots) put(sl *slot) { s <- sl }
func (s slots) limit() int   { return cap(s) }
func (s slots) close() {
	for range cap(s) {
		(<-s).drop()
	}
}

// tenantLocks keep two migrators off one tenant: a daemon that lost the
// rollout's lease may still be migrating a tenant when another daemon takes
// the job over. The locks are advisory locks in the catalog database, which
// tenants cannot connect to: in a tenant's database any tenant of the
// server could take the same key (keys are visible in pg_locks) and stall
// a neighbour's migration. One catalog connection holds all of a rollout
// run's locks; if it is lost, its locks go with it, and the marker check
// inside each tenant's transaction is what remains.
type tenantLocks struct {
	mu   sync.Mutex
	pool *pgxpool.Pool
	conn *pgxpool.Conn
}

func newTenantLocks(ctx context.Context, pool *pgxpool.Pool) (*tenantLocks, error) {
	c, err := pool.Acquire(ctx)
	if err != nil {
		return nil, err
	}
	return &tenantLocks{pool: pool, conn: c}, nil
}

// try takes the tenant's lock if it is free. A connection that was lost
// (with the locks it held) is replaced.
func (l *tenantLocks) try(ctx context.Context, id string) (bool, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.conn.Conn().IsClosed() {
		c, err := l.pool.Acquire(ctx)
		if err != nil {
			return false, cluster.Classify(err)
		}
		l.conn.Release()
		l.conn = c
	}
	var ok bool
	err := l.conn.QueryRow(ctx, `SELECT pg_try_advisory_lock($1, hashtext($2))`, lockSpace, id).Scan(&ok)
	return ok, cluster.Classify(err)
}

// release gives the tenant's lock back; if that fails, the connection is
// closed so that the server releases it.
func (l *tenantLocks) release(id string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if _, err := l.conn.Exec(ctx, `SELECT pg_advisory_unlock($1, hashtext($2))`, lockSpace, id); err != nil {
		_ = l.conn.Conn().Close(ctx)
	}
}

// close releases every lock (by ending the session) and the connection.
func (l *tenantLocks) close() {
	l.mu.Lock()
	defer l.mu.Unlock()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if _, err := l.conn.Exec(ctx, `SELECT pg_advisory_unlock_all()`); err != nil {
		_ = l.conn.Conn().Close(ctx)
	}
	l.conn.Release()
}
