package cli

import (
	"fmt"
	"io"
	"strconv"

	"github.com/spf13/cobra"

	"github.com/pgtenant/pgtenant/internal/api"
	"github.com/pgtenant/pgtenant/internal/catalog"
)

// newTenantMetricsCmd is `pgtenant tenant metrics ID`.
func newTenantMetricsCmd(g *globals) *cobra.Command {
	var history, export string
	cmd := &cobra.Command{
		Use:   "metrics ID",
		Short: "Show a tenant's figures, storage quota state and minute history",
		Long: `Show what the metrics collector measured of a tenant: size, sessions, transactions,
rows and blocks per second, hit ratio, temp bytes, deadlocks, and its storage quota
state with the tier's thresholds. --history 1h adds the minute rollups kept in the
catalog (only minutes with activity are stored). --export true keeps the tenant's
series on /metrics whatever its activity (the others appear only while among the
metrics.top_tenants most active).`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			var exported bool
			if export != "" {
				var err error
				if exported, err = strconv.ParseBool(export); err != nil {
					return usagef("--export %q: true or false", export)
				}
			}
			c, err := g.client()
			if err != nil {
				return err
			}
			if export != "" {
				if _, err := c.SetMetricsExport(cmd.Context(), args[0], exported); err != nil {
					return err
				}
			}
			m, err := c.TenantMetrics(cmd.Context(), args[0], history)
			if err != nil {
				return err
			}
			return g.print(m, func(w io.Writer) {
				row(w, "tenant", m.Tenant)
				metricsDetail(w, &m)
				if len(m.History) > 0 {
					fmt.Fprintln(w)
					row(w, "MINUTE", "SIZE", "CONNS", "COMMITS", "ROLLBACKS", "ROWS READ", "ROWS WRITTEN", "BLKS HIT", "BLKS READ", "TEMP", "DEADLOCKS")
					for _, h := range m.History {
						row(w, h.Minute.Local().Format("2006-01-02 15:04"), optBytes(h.SizeBytes), h.Connections, opt(h.Commits), opt(h.Rollbacks),
							h.RowsRead, h.RowsWritten, h.BlksHit, h.BlksRead, optBytes(h.TempBytes), opt(h.Deadlocks))
					}
				}
			})
		},
	}
	cmd.Flags().StringVar(&history, "history", "", "also show the minute rollups of this last period (e.g. 1h, 7d)")
	cmd.Flags().StringVar(&export, "export", "", "true: always export this tenant's series on /metrics; false: only while among the most active")
	return cmd
}

func opt(p *int64) string {
	if p == nil {
		return "-"
	}
	return strconv.FormatInt(*p, 10)
}

func optBytes(p *int64) string {
	if p == nil {
		return "-"
	}
	return humanBytes(*p)
}

// listFigures are the SIZE, CONNS, ACTIVITY and QUOTA cells of `tenant list`.
func listFigures(t api.Tenant) (size, conns, activity, quota string) {
	if t.Metrics == nil || t.Metrics.Figures == nil {
		return "-", "-", "-", "-"
	}
	f := t.Metrics.Figures
	return optBytes(f.SizeBytes), strconv.Itoa(f.Connections.Active + f.Connections.Idle + f.Connections.IdleInTransaction),
		fmt.Sprintf("%.1f", f.Activity), f.Quota
}

// metricsDetail writes a tenant's figures and quota as rows of `tenant show`.
func metricsDetail(w io.Writer, m *api.TenantMetrics) {
	if m == nil {
		return
	}
	if f := m.Figures; f != nil {
		size := "not sampled yet"
		if f.SizeBytes != nil {
			size = fmt.Sprintf("%s (sampled %s)", humanBytes(*f.SizeBytes), f.SizeAt.Local().Format("15:04:05"))
		}
		row(w, "size", size)
		row(w, "connections", fmt.Sprintf("%d active, %d idle, %d idle in transaction", f.Connections.Active, f.Connections.Idle, f.Connections.IdleInTransaction))
		if f.CommitsPerSec != nil {
			row(w, "transactions", fmt.Sprintf("%.1f commits/s, %.1f rollbacks/s (%d, %d in total)", *f.CommitsPerSec, *f.RollbacksPerSec, *f.Commits, *f.Rollbacks))
		} else {
			row(w, "transactions", "n/a (PostgreSQL counts transactions per database, not per schema)")
		}
		row(w, "rows", fmt.Sprintf("%.1f read/s, %.1f written/s", f.RowsReadPerSec, f.RowsWrittenPerSec))
		hit := "-"
		if f.HitRatio != nil {
			hit = fmt.Sprintf("%.2f%%", *f.HitRatio*100)
		}
		row(w, "blocks", fmt.Sprintf("%d hit, %d read (hit ratio %s)", f.BlocksHit, f.BlocksRead, hit))
		if f.TempBytes != nil {
			row(w, "temp, deadlocks", fmt.Sprintf("%s, %d", humanBytes(*f.TempBytes), *f.Deadlocks))
		}
		row(w, "activity", fmt.Sprintf("%.1f (measured %s)", f.Activity, f.At.Local().Format("15:04:05")))
	} else if m.Note != "" {
		row(w, "metrics", m.Note)
	}
	if q := m.Quota; q != nil {
		s := q.State
		if q.QuotaBytes > 0 {
			s += fmt.Sprintf(" (warn at %s, quota %s, grace %s)", humanBytes(q.WarnBytes), humanBytes(q.QuotaBytes), q.Grace)
		} else if q.WarnBytes > 0 {
			s += fmt.Sprintf(" (warn at %s, no quota)", humanBytes(q.WarnBytes))
		} else {
			s += " (its tier has no storage quota)"
		}
		if q.State == catalog.QuotaGrace && q.EnforceAt != nil {
			s += ", enforced from " + q.EnforceAt.Local().Format("2006-01-02 15:04:05") + " if still over"
		}
		if q.State == catalog.QuotaEnforced {
			s += ": INSERT, UPDATE and CREATE refused; SELECT, DELETE and TRUNCATE allowed"
		}
		row(w, "quota", s)
		if q.StatementCap != "" {
			row(w, "statement_cap", q.StatementCap+" (longer statements are cancelled)")
		}
	}
}
