// Package catalog is pgtenant's own state in PostgreSQL: the schema (embedded
// goose migrations, every table's, jobs' included), row types and every
// query of the catalog's tables but two packages': clusters, templates and
// their builds, tenants (and purged tenants' tombstones), events, rollouts,
// metrics history and quotas, prewarm state (hot sets, last prewarms, node
// lives), credentials and secrets, API tokens (their hashes) and the
// append-only audit log. The jobs and job_steps tables' queries
// live in internal/jobs, the analytics table's in internal/analytics.
// Services group methods in one transaction by passing a pgx.Tx as the
// Querier. It does not talk to tenant clusters.
package catalog

import (
	"context"
	"embed"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/jackc/pgx/v5/stdlib"
	"github.com/pressly/goose/v3"
	"github.com/pressly/goose/v3/lock"

	"github.com/pgtenant/pgtenant/internal/cluster"
)

//go:embed migrations/*.sql
var migrations embed.FS

// ErrNotFound is returned when a row does not exist.
var ErrNotFound = errors.New("not found")

// ErrConflict is returned when a write conflicts with a row (duplicate name,
// wrong state).
var ErrConflict = errors.New("conflict")

// Store is the catalog. Several daemons may share one.
type Store struct {
	pool *pgxpool.Pool
	log  *slog.Logger
}

// Catalog pool size: API requests and job workers share it; each holds a
// connection only for a short transaction.
const poolMaxConns = 16

// Open connects to the catalog, creating the database if it does not exist
// (when the role may), and applies pending migrations under an advisory lock
// so that daemons starting together migrate once.
func Open(ctx context.Context, dsn string, logger *slog.Logger) (*Store, error) {
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	cfg, err := pgxpool.ParseConfig(dsn)
	if err != nil {
		return nil, fmt.Errorf("catalog dsn: %s", cluster.RedactError(err, dsn))
	}
	cfg.MaxConns = poolMaxConns
	cfg.ConnConfig.RuntimeParams["application_name"] = "pgtenant"
	if err := ensureDatabase(ctx, cfg.ConnConfig); err != nil {
		return nil, err
	}
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return nil, fmt.Errorf("catalog: %w", cluster.Classify(err))
	}
	s := &Store{pool: pool, log: logger.With("component", "catalog")}
	if err := s.migrate(ctx); err != nil {
		pool.Close()
		return nil, err
	}
	// The catalog may share a server with tenants: none of them may connect.
	if _, err := pool.Exec(ctx, "REVOKE ALL ON DATABASE "+cluster.Ident(cfg.ConnConfig.Database)+" FROM PUBLIC"); err != nil {
		pool.Close()
		return nil, fmt.Errorf("revoke public access to the catalog database: %w", err)
	}
	return s, nil
}

// ensureDatabase creates the catalog database when it is missing.
func ensureDatabase(ctx context.Context, cc *pgx.ConnConfig) error {
	conn, err := pgx.ConnectConfig(ctx, cc)
	if err == nil {
		return conn.Close(ctx)
	}
	if err = cluster.Classify(err); !errors.Is(err, cluster.ErrNotFound) { // 3D000: no such database
		return fmt.Errorf("connect to catalog: %w", err)
	}
	admin := cc.Copy()
	admin.Database = "postgres"
	conn, err = pgx.ConnectConfig(ctx, admin)
	if err != nil {
		return fmt.Errorf("catalog database %q does not exist and cannot connect to create it: %w", cc.Database, cluster.Classify(err))
	}
	defer conn.Close(ctx)
	if _, err := conn.Exec(ctx, "CREATE DATABASE "+cluster.Ident(cc.Database)); err != nil && !errors.Is(cluster.Classify(err), cluster.ErrDuplicate) {
		return fmt.Errorf("create catalog database %q: %w", cc.Database, err)
	}
	return nil
}

func (s *Store) migrate(ctx context.Context) error {
	fsys, err := fs.Sub(migrations, "migrations")
	if err != nil {
		return err
	}
	// 0x70677465 = "pgte": one catalog, one migration at a time.
	locker, err := lock.NewPostgresSessionLocker(lock.WithLockID(0x70677465))
	if err != nil {
		return err
	}
	db := stdlib.OpenDBFromPool(s.pool)
	defer db.Close()
	// Migrations are independent tables: one added out of order (a daemon of
	// a newer build on an older catalog) is applied rather than refused.
	p, err := goose.NewProvider(goose.DialectPostgres, db, fsys, goose.WithSessionLocker(locker), goose.WithAllowOutofOrder(true))
	if err != nil {
		return fmt.Errorf("catalog migrations: %w", err)
	}
	res, err := p.Up(ctx)
	if err != nil {
		return fmt.Errorf("apply catalog migrations: %w", err)
	}
	for _, r := range res {
		s.log.Info("applied catalog migration", "version", r.Source.Version, "file", r.Source.Path)
	}
	return nil
}

// Pool exposes the catalog pool: for transactions that group the Store's
// methods, and to the packages that keep their own tables' queries (jobs,
// analytics). No other service queries the catalog's tables but through
// the Store (internal/bench, which measures a fleet from outside, reads
// them).
func (s *Store) Pool() *pgxpool.Pool { return s.pool }

// Close closes the pool.
func (s *Store) Close() { s.pool.Close() }

// Ping checks the catalog answers.
func (s *Store) Ping(ctx context.Context) error { return s.pool.Ping(ctx) }

// notFound turns pgx.ErrNoRows into ErrNotFound with context.
func notFound(err error, what string) error {
	if errors.Is(err, pgx.ErrNoRows) {
		return fmt.Errorf("%s: %w", what, ErrNotFound)
	}
	return err
}
