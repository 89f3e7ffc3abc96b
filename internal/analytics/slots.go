package analytics

import (
	"context"
	"time"

	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/pgtenant/pgtenant/internal/cluster"
	"github.com/pgtenant/pgtenant/internal/tenant"
)

// createSlot makes a mirror's slot (for says which) with its wait on other
// sessions' transactions bounded by the cluster's pacer.slot_wait
// (cluster.CreateSlot): a tenant's old transaction that holds it up is
// ended, any other blocker fails the run with an error naming it, which
// the mirror's loop reports in its status and retries.
func (s *Service) createSlot(ctx context.Context, cl *cluster.Cluster, repl *pgconn.PgConn, name, what string,
	opts pglogrepl.CreateReplicationSlotOptions) (pglogrepl.CreateReplicationSlotResult, error) {
	var bound time.Duration // 0: cluster.DefaultSlotWait
	if s.Pacer != nil {
		bound = s.Pacer.SlotWait(cl.Name())
	}
	return cl.CreateSlot(ctx, repl, name, opts, cluster.SlotWait{Bound: bound, For: what, TenantOf: tenant.IDFromPhysical,
		Record: func(ctx context.Context, id, kind string, detail map[string]any) error {
			return s.Store.AddEvent(ctx, s.Store.Pool(), id, kind, detail)
		}})
}
