package catalog

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"
)

// Secret returns the catalog's secret of that name, creating it (32 random
// bytes) on first use. Daemons racing to create it all get the first one
// written.
func (s *Store) Secret(ctx context.Context, name string) ([]byte, error) {
	fresh := make([]byte, 32)
	_, _ = rand.Read(fresh)
	var v []byte
	var err error
	// A racing daemon's insert that commits while this statement waits on
	// it is a conflict here, but not in this statement's snapshot: no row.
	// The next statement sees it.
	for range 3 {
		err = s.pool.QueryRow(ctx, `WITH ins AS (
				INSERT INTO secrets (name, value) VALUES ($1, $2) ON CONFLICT (name) DO NOTHING RETURNING value)
			SELECT value FROM ins UNION ALL SELECT value FROM secrets WHERE name = $1 LIMIT 1`, name, fresh).Scan(&v)
		if !errors.Is(err, pgx.ErrNoRows) {
			break
		}
	}
	if err != nil {
		return nil, fmt.Errorf("catalog secret %s: %w", name, err)
	}
	return v, nil
}
