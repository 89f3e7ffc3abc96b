package analytics

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"os"
	"time"

	"github.com/duckdb/duckdb-go/v2"
	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5"

	"github.com/pgtenant/pgtenant/internal/background"
	"github.com/pgtenant/pgtenant/internal/catalog"
	"github.com/pgtenant/pgtenant/internal/cluster"
)

// Run claims mirrors (free, or whose owner's lease ended), renews the
// leases of those it runs, stops those it lost and carries out disables,
// every PollInterval until ctx is done; then it stops its mirrors (their
// files keep the applied LSN: the next owner resumes there).
func (s *Service) Run(ctx context.Context) error {
	if err := os.MkdirAll(s.Dir, 0o700); err != nil {
		return fmt.Errorf("analytics dir: %w", err)
	}
	served := make(chan error, 1)
	swept := make(chan struct{})
	if s.ln != nil {
		go func() { served <- s.serve(ctx) }()
		// Sessions that send nothing learn of a suspend, drop or new
		// password too (sessions.go).
		go func() {
			defer close(swept)
			background.EveryAfter(ctx, s.Config.PollInterval.D(), s.sweep)
		}()
	} else {
		served <- nil
		close(swept)
	}
	err := s.manage(ctx)
	<-swept
	return errors.Join(err, <-served)
}

func (s *Service) manage(ctx context.Context) error {
	down := cluster.Outage{What: "run the analytics mirrors"}
	defer s.stopAll()
	background.Every(ctx, s.Config.PollInterval.D(), func(ctx context.Context) {
		if err := s.pass(ctx); ctx.Err() == nil {
			down.Report(s.Logger, err)
		}
	})
	return nil
}

type row struct {
	tenant, state string
	tables        []string
	mine, free    bool
	gone          bool   // the tenant is dropped (or further on)
	source        string // where the tenant is (sourceOf)
}

func (s *Service) pass(ctx context.Context) error {
	rows, err := s.Store.Pool().Query(ctx, `SELECT a.tenant, a.state, a.tables, coalesce(a.owner = $1, false),
		a.owner IS NULL OR a.lease_expires < now(), coalesce(t.state IN ('dropped', 'purging', 'purged'), false),
		coalesce(t.cluster || '/' || t.database, '')
		FROM analytics a LEFT JOIN tenants t ON t.id = a.tenant ORDER BY a.tenant`, s.owner)
	if err != nil {
		return fmt.Errorf("read mirrors: %w", err)
	}
	all, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (row, error) {
		var x row
		return x, r.Scan(&x.tenant, &x.state, &x.tables, &x.mine, &x.free, &x.gone, &x.source)
	})
	if err != nil {
		return fmt.Errorf("read mirrors: %w", err)
	}
	seen := map[string]bool{}
	var errs []error
	for _, x := range all {
		seen[x.tenant] = true
		if x.gone && x.state != StateDisabling {
			// A dropped tenant's mirror goes (its slot would hold WAL of
			// the whole cluster until the purge): restore does not bring
			// it back, `analytics enable` does.
			tag, err := s.Store.Pool().Exec(ctx, `UPDATE analytics SET state = 'disabling' WHERE tenant = $1 AND state <> 'disabling'`, x.tenant)
			if err != nil {
				errs = append(errs, err)
				continue
			}
			if tag.RowsAffected() == 1 {
				s.Logger.Info("analytics mirror of a dropped tenant: disabling it", "tenant", x.tenant)
				_ = s.Store.AddEvent(ctx, s.Store.Pool(), x.tenant, "analytics", "mirror disabled: the tenant was dropped")
			}
			x.state = StateDisabling
		}
		if x.state == StateDisabling {
			if x.mine || x.free {
				errs = append(errs, s.disable(ctx, x.tenant))
			}
			continue
		}
		if m := s.mirror(x.tenant); m != nil && m.moved(x.source) {
			// The tenant moved: its mirror starts again (and is copied
			// again from where the tenant is now).
			s.Logger.Info("the tenant of an analytics mirror moved: restarting the mirror", "tenant", x.tenant, "to", x.source)
			s.stop(x.tenant)
		}
		if s.running(x.tenant) {
			tag, err := s.Store.Pool().Exec(ctx, `UPDATE analytics SET lease_expires = now() + $2::interval, owner_addr = $3
				WHERE tenant = $1 AND owner = $4`, x.tenant, s.Config.Lease.D().String(), s.addr, s.owner)
			if err != nil {
				errs = append(errs, err)
				continue
			}
			if tag.RowsAffected() == 0 {
				s.Logger.Warn("lost the lease of a mirror: stopping it", "tenant", x.tenant)
				s.stop(x.tenant)
			}
			continue
		}
		if !x.mine && !x.free {
			continue
		}
		tag, err := s.Store.Pool().Exec(ctx, `UPDATE analytics SET owner = $2, owner_addr = $3, lease_expires = now() + $4::interval
			WHERE tenant = $1 AND state <> 'disabling' AND (owner IS NULL OR owner = $2 OR lease_expires < now())`,
			x.tenant, s.owner, s.addr, s.Config.Lease.D().String())
		if err != nil {
			errs = append(errs, err)
			continue
		}
		if tag.RowsAffected() == 1 {
			if err := s.start(x.tenant, x.tables); err != nil {
				errs = append(errs, err)
			}
		}
	}
	for _, id := range s.runningIDs() {
		if !seen[id] {
			s.stop(id)
		}
	}
	return errors.Join(errs...)
}

// disable stops the mirror here, drops its slot, publication and file and
// deletes its row.
func (s *Service) disable(ctx context.Context, id string) error {
	s.stop(id)
	t, err := s.Store.GetTenant(ctx, nil, id)
	if err != nil {
		return err
	}
	cl, err := s.Clusters.Get(t.Cluster)
	if err != nil {
		return err
	}
	if err := dropServerSide(ctx, cl, t); err != nil {
		return fmt.Errorf("disable analytics of %s: %w", id, err)
	}
	if err := s.removeFile(id); err != nil {
		return fmt.Errorf("disable analytics of %s: %w", id, err)
	}
	_, err = s.Store.Pool().Exec(ctx, `DELETE FROM analytics WHERE tenant = $1 AND state = 'disabling'`, id)
	if err == nil {
		s.Logger.Info("analytics disabled", "tenant", id)
		_ = s.Store.AddEvent(ctx, s.Store.Pool(), id, "analytics", "mirror disabled: slot, publication and file dropped")
	}
	return err
}

func (s *Service) running(id string) bool { return s.mirror(id) != nil }

// mirror is the mirror of tenant id this daemon runs (nil: none).
func (s *Service) mirror(id string) *mirror {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.mirrors[id]
}

func (s *Service) runningIDs() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make([]string, 0, len(s.mirrors))
	for id := range s.mirrors {
		out = append(out, id)
	}
	return out
}

// start runs a mirror in its own goroutine until stop.
func (s *Service) start(id string, tables []string) error {
	ctx, cancel := context.WithCancel(context.Background())
	m := &mirror{s: s, id: id, tables: tables, cancel: cancel, done: make(chan struct{}), log: s.Logger.With("tenant", id)}
	s.mu.Lock()
	s.mirrors[id] = m
	s.mu.Unlock()
	go m.loop(ctx)
	return nil
}

// stop ends a mirror this daemon runs, waiting until its file is closed.
func (s *Service) stop(id string) {
	s.mu.Lock()
	m, ok := s.mirrors[id]
	delete(s.mirrors, id)
	s.mu.Unlock()
	if ok {
		m.cancel()
		<-m.done
	}
}

func (s *Service) stopAll() {
	for _, id := range s.runningIDs() {
		s.stop(id)
	}
}

// report records the mirror's progress in its row (for status and
// metrics), unless its tenant has left the cluster and database the
// mirror reads: the move marked the row stale (catalog.MoveTenant), and so
// it stays until the mirror reads where the tenant is.
func (m *mirror) report(ctx context.Context, state, lsn string, rows, lag int64, failure string) {
	m.mu.Lock()
	source := m.source
	m.mu.Unlock()
	s := m.s
	_, err := s.Store.Pool().Exec(ctx, `UPDATE analytics SET state = CASE WHEN state = 'disabling' THEN state ELSE $2 END,
		applied_lsn = $3, applied_rows = $4, lag_bytes = $5, error = $6, reported_at = now()
		WHERE tenant = $1 AND owner = $7 AND ($8 = '' OR EXISTS (SELECT 1 FROM tenants WHERE id = $1 AND cluster || '/' || database = $8))`,
		m.id, state, lsn, rows, lag, failure, s.owner, source)
	if err != nil && ctx.Err() == nil {
		s.Logger.Warn("report mirror progress", "tenant", m.id, "err", err)
	}
}

// tenantOf loads a mirrored tenant and its cluster.
func (s *Service) tenantOf(ctx context.Context, id string) (catalog.Tenant, *cluster.Cluster, error) {
	t, err := s.Store.GetTenant(ctx, nil, id)
	if err != nil {
		return t, nil, err
	}
	cl, err := s.Clusters.Get(t.Cluster)
	return t, cl, err
}

// ErrNotHere: this daemon does not run the tenant's mirror (another owns
// it, or it is not streaming yet).
var ErrNotHere = errors.New("the mirror is not served by this daemon")

// WithMirror runs f on the tenant's open DuckDB file, if this daemon runs
// its mirror and the file is past its initial copy; the mirror is not
// closed while f runs.
func (s *Service) WithMirror(id string, f func(*sql.DB) error) error {
	m := s.mirror(id)
	if m == nil {
		return ErrNotHere
	}
	db, release, ok := m.borrow()
	if !ok {
		return ErrNotHere
	}
	defer release()
	return f(db)
}

// withConn runs f on a DuckDB connection of its own on the tenant's open
// file (mirror.connect), if this daemon runs its mirror and the file is
// past its initial copy.
func (s *Service) withConn(ctx context.Context, id string, f func(*duckdb.Conn) error) error {
	m := s.mirror(id)
	if m == nil {
		return ErrNotHere
	}
	c, release, err := m.connect(ctx)
	if err != nil {
		return err
	}
	defer release()
	return f(c)
}

// Progress is a mirror's position as this daemon runs it.
type Progress struct {
	Applied    pglogrepl.LSN // the file's LSN
	CaughtUp   pglogrepl.LSN // every change of the tenant up to here is in the file
	LagBytes   int64         // received, not yet applied
	LagSeconds float64       // age of the oldest commit not yet applied (0: caught up)
	Rows       int64         // rows copied and changes applied
}

// Progress reports a mirror this daemon runs (ok false otherwise).
func (s *Service) Progress(id string) (Progress, bool) {
	m := s.mirror(id)
	if m == nil {
		return Progress{}, false
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	p := Progress{Applied: m.applied, CaughtUp: max(m.applied, m.caughtUp), LagBytes: m.lagBytes, Rows: m.rows}
	if !m.pending.IsZero() {
		p.LagSeconds = max(0, time.Since(m.pending).Seconds())
	}
	return p, m.db != nil
}
