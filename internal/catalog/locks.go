package catalog

import (
	"context"
	"hash/fnv"
)

// Exclusively runs fn while one of the pool's sessions holds the catalog's
// advisory lock key, so that one daemon of a catalog at a time does what
// fn does. When another session holds it, fn does not run and ran is
// false. The lock is given back when fn returns, even after ctx ended.
func (s *Store) Exclusively(ctx context.Context, key int64, fn func(context.Context) error) (ran bool, err error) {
	conn, err := s.pool.Acquire(ctx)
	if err != nil {
		return false, err
	}
	defer conn.Release()
	if err := conn.QueryRow(ctx, `SELECT pg_catalog.pg_try_advisory_lock($1)`, key).Scan(&ran); err != nil || !ran {
		return false, err
	}
	defer conn.Exec(context.WithoutCancel(ctx), `SELECT pg_catalog.pg_advisory_unlock($1)`, key)
	return true, fn(ctx)
}

// LockKey is the advisory lock key of name (a cluster's) in a space: the
// same in every daemon.
func LockKey(space uint32, name string) int64 {
	h := fnv.New32a()
	h.Write([]byte(name))
	return int64(space)<<32 | int64(h.Sum32())
}
