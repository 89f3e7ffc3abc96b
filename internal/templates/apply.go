package templates

import (
	"context"
	"fmt"
	"strings"

	"github.com/jackc/pgx/v5"

	"github.com/pgtenant/pgtenant/internal/cluster"
)

// ApplyOptions tune Apply.
type ApplyOptions struct {
	// LockBudget: a transaction is committed as soon as it holds this many
	// locks, so that neither the primary's nor the standby's lock table
	// overflows (max_locks_per_transaction) and no commit record grows large.
	LockBudget int
	// OnBatch is called after each commit with the statements applied so far.
	OnBatch func(ctx context.Context, done, total int) error
	// Single runs all transactional statements in one transaction regardless
	// of LockBudget (a tenant's migration is all or nothing); a NO TRANSACTION
	// file still commits what came before it and runs on its own.
	Single bool
}

// Apply runs the Up statements of files on conn. Files marked NO TRANSACTION
// run statement by statement outside a transaction block; the others run in
// transactions bounded by the lock budget (or one transaction with Single).
// On error the open transaction is rolled back; earlier batches stay (the
// caller discards a half-built object).
func Apply(ctx context.Context, conn *pgx.Conn, files []File, opts ApplyOptions) error {
	total := 0
	for _, f := range files {
		total += len(f.Statements)
	}
	done := 0
	var tx pgx.Tx
	commit := func() error {
		if tx == nil {
			return nil
		}
		err := tx.Commit(ctx)
		tx = nil
		if err != nil {
			return fmt.Errorf("commit: %w", cluster.Classify(err))
		}
		if opts.OnBatch != nil {
			return opts.OnBatch(ctx, done, total)
		}
		return nil
	}
	defer func() {
		if tx != nil {
			_ = tx.Rollback(context.WithoutCancel(ctx))
		}
	}()
	for _, f := range files {
		if f.NoTransaction {
			if err := commit(); err != nil {
				return err
			}
		}
		for i, stmt := range f.Statements {
			if !f.NoTransaction && tx == nil {
				var err error
				if tx, err = conn.Begin(ctx); err != nil {
					return cluster.Classify(err)
				}
			}
			if _, err := conn.Exec(ctx, stmt); err != nil {
				return fmt.Errorf("%s, statement %d (%s): %w", f.Name, i+1, abbreviate(stmt), cluster.Classify(err))
			}
			done++
			if f.NoTransaction || opts.Single {
				continue
			}
			var locks int
			if err := conn.QueryRow(ctx, `SELECT count(*) FROM pg_locks WHERE pid = pg_backend_pid()`).Scan(&locks); err != nil {
				return cluster.Classify(err)
			}
			if locks >= opts.LockBudget {
				if err := commit(); err != nil {
					return err
				}
			}
		}
		if f.NoTransaction && opts.OnBatch != nil {
			if err := opts.OnBatch(ctx, done, total); err != nil {
				return err
			}
		}
	}
	return commit()
}

func abbreviate(stmt string) string {
	s := strings.Join(strings.Fields(stmt), " ")
	if len(s) > 80 {
		s = s[:77] + "..."
	}
	return s
}
