package cli

import (
	"context"
	"fmt"
	"io"
	"time"

	"github.com/spf13/cobra"

	"github.com/pgtenant/pgtenant/internal/analytics"
	"github.com/pgtenant/pgtenant/internal/api"
)

func newAnalyticsCmd(g *globals) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "analytics",
		Short: "A tenant's columnar mirror in DuckDB, fed by logical replication",
		Long: `A tenant's analytics mirror: a publication and a pgoutput slot on its cluster, an
initial copy in the slot's snapshot, then its changes applied in batches to a
DuckDB file the daemon owns. The tenant queries it with its own login on the
analytics port (its DSN is in 'analytics status' and 'tenant show'), read-only.`,
	}
	var tables, exclude []string
	var wait bool
	enable := &cobra.Command{
		Use:   "enable ID",
		Short: "Start a tenant's mirror (all its tables, --tables, or all but --exclude-tables)",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if len(tables) > 0 && len(exclude) > 0 {
				return usagef("--tables and --exclude-tables: give one or the other")
			}
			c, err := g.client()
			if err != nil {
				return err
			}
			st, err := c.EnableAnalyticsRequest(cmd.Context(), args[0], api.EnableAnalyticsRequest{Tables: tables, ExcludeTables: exclude})
			if err != nil {
				return err
			}
			if wait {
				if st, err = waitAnalytics(cmd.Context(), c, args[0], func(st analytics.Status) bool { return st.State == analytics.StateStreaming }); err != nil {
					return err
				}
			}
			return g.print(st, func(w io.Writer) { analyticsDetail(w, st) })
		},
	}
	enable.Flags().StringSliceVar(&tables, "tables", nil, "only these tables (name, or schema.name in database mode); default every table, new ones included")
	enable.Flags().StringSliceVar(&exclude, "exclude-tables", nil, "every table the tenant has now but these (tables made later are not mirrored)")
	enable.Flags().BoolVar(&wait, "wait", false, "wait until the initial copy is done and the mirror streams (a failure the mirror reports ends the wait with its error; the mirror retries)")
	var waitOff bool
	disable := &cobra.Command{
		Use:   "disable ID",
		Short: "Drop a tenant's mirror: its slot, publication and file",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := g.client()
			if err != nil {
				return err
			}
			st, err := c.DisableAnalytics(cmd.Context(), args[0])
			if err != nil {
				return err
			}
			if waitOff {
				if st, err = waitAnalytics(cmd.Context(), c, args[0], func(st analytics.Status) bool { return !st.Enabled }); err != nil {
					return err
				}
			}
			return g.print(st, func(w io.Writer) { analyticsDetail(w, st) })
		},
	}
	disable.Flags().BoolVar(&waitOff, "wait", false, "wait until slot, publication and file are dropped")
	status := &cobra.Command{
		Use:   "status ID",
		Short: "Show a tenant's mirror: state, applied LSN, lag, DSN",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := g.client()
			if err != nil {
				return err
			}
			st, err := c.AnalyticsStatus(cmd.Context(), args[0])
			if err != nil {
				return err
			}
			return g.print(st, func(w io.Writer) { analyticsDetail(w, st) })
		},
	}
	cmd.AddCommand(enable, disable, status)
	return cmd
}

// waitAnalytics polls a mirror's status until done says so, or until the
// mirror reports a failure after the first poll (it retries in the
// background: the wait ends with its error rather than for ever).
func waitAnalytics(ctx context.Context, c *api.Client, id string, done func(analytics.Status) bool) (analytics.Status, error) {
	var since *time.Time
	for first := true; ; first = false {
		st, err := c.AnalyticsStatus(ctx, id)
		if err != nil || done(st) {
			return st, err
		}
		if first {
			since = st.ReportedAt
		} else if st.Error != "" && st.ReportedAt != nil && (since == nil || st.ReportedAt.After(*since)) {
			return st, fmt.Errorf("the mirror of tenant %s failed (%s): %s; it retries in the background: `pgtenant analytics status %s` follows it, `pgtenant analytics disable %s` stops it",
				id, st.State, st.Error, id, id)
		}
		select {
		case <-ctx.Done():
			return st, ctx.Err()
		case <-time.After(250 * time.Millisecond):
		}
	}
}

func analyticsDetail(w io.Writer, st analytics.Status) {
	row(w, "tenant", st.Tenant)
	if !st.Enabled {
		row(w, "analytics", "off")
		return
	}
	row(w, "state", st.State)
	if len(st.Tables) > 0 {
		row(w, "tables", fmt.Sprint(st.Tables))
	}
	row(w, "dsn", st.DSN)
	row(w, "slot", st.Slot)
	row(w, "owner", st.Owner)
	row(w, "applied_lsn", st.AppliedLSN)
	row(w, "applied_rows", fmt.Sprint(st.AppliedRows))
	row(w, "lag", humanBytes(st.LagBytes))
	if st.Error != "" {
		row(w, "error", st.Error)
	}
}
