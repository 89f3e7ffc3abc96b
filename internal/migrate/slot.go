package migrate

import (
	"context"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pgtenant/pgtenant/internal/cluster"
)

// ApplicationName is the application_name of a rollout's connections to tenants.
const ApplicationName = "pgtenant migrate"

// slot is one of a cluster's connection slots in a rollout: at most
// per_cluster tenants are migrated at once on a cluster, each holding one
// slot, and a slot holds at most one connection. A connection to a shared
// database (schema mode) is kept for the next tenant of the same database,
// which saves a connection set-up and a cold catalog cache per tenant; one
// to a tenant's own database is closed when that tenant is done.
type slot struct {
	cl   *cluster.Cluster
	db   string
	keep bool
	c    *pgx.Conn
}

// conn returns a connection to database, reusing the slot's when it is to
// the same database.
func (s *slot) conn(ctx context.Context, database string, keep bool) (*pgx.Conn, error) {
	if s.c != nil && s.db == database && !s.c.IsClosed() {
		return s.c, nil
	}
	s.drop()
	c, err := s.cl.Connect(ctx, database)
	if err != nil {
		return nil, err
	}
	// Named, so that operators (and the benchmark) see the rollout's
	// connections in pg_stat_activity.
	if _, err := c.Exec(ctx, "SET application_name = "+cluster.Literal(ApplicationName)); err != nil {
		_ = c.Close(context.WithoutCancel(ctx))
		return nil, cluster.Classify(err)
	}
	s.c, s.db, s.keep = c, database, keep
	return c, nil
}

// done ends a tenant's use of the slot.
func (s *slot) done() {
	if !s.keep {
		s.drop()
	}
}

// drop closes the slot's connection and waits (up to a second) until its
// backend has exited: an exiting backend still holds one of the server's
// connection slots, and the slot must not open a second connection before
// the first is gone, or the rollout would exceed its connection budget.
func (s *slot) drop() {
	if s.c == nil {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	pid := s.c.PgConn().PID()
	_ = s.c.Close(ctx)
	s.c, s.db = nil, ""
	admin, err := s.cl.Admin(ctx)
	if err != nil {
		return
	}
	for deadline := time.Now().Add(time.Second); time.Now().Before(deadline); {
		time.Sleep(time.Millisecond) // an exit takes about that
		var alive bool
		if err := admin.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM pg_stat_activity WHERE pid = $1)`, pid).Scan(&alive); err != nil || !alive {
			return
		}
	}
}

// slots are a cluster's slots. The dispatcher never has more tenants of a
// cluster in flight than the cluster has slots, so take never waits.
type slots chan *slot

func newSlots(cl *cluster.Cluster, n int) slots {
	ch := make(slots, n)
	for range n {
		ch <- &slot{cl: cl}
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
