package cli

import (
	"encoding/csv"
	"fmt"
	"io"
	"net/url"
	"strconv"
	"time"

	"github.com/spf13/cobra"

	"github.com/pgtenant/pgtenant/internal/catalog"
)

// csvAnnotation marks the commands that print -o csv.
const csvAnnotation = "csv"

// newUsageCmd is `pgtenant usage [ID] --from T --to T`.
func newUsageCmd(g *globals) *cobra.Command {
	var from, to string
	cmd := &cobra.Command{
		Use:   "usage [ID]",
		Short: "Show usage per tenant and hour, for billing",
		Long: `Show what each tenant (or the tenant ID) used, per hour: storage in byte-hours
(the bytes it held, integrated over the hour), CPU seconds (user + system, from
pg_stat_kcache; "-" where its cluster has not got it), rows written (inserts,
updates and deletes), connection-seconds (its server sessions × seconds) and the
bytes in and out of its front door (PgBouncer; "-" without one).

Hours are whole: --from goes down to its hour, --to up to the next one (at most
92 days). Each is an RFC 3339 time (2026-12-01T10:00:00Z), a date (2026-12-01,
midnight UTC) or a duration back from now (24h, 7d); the default is the last 24
hours. A tenant that held no bytes and did nothing in an hour has no row for it.
Usage is read from the catalog only: no tenant is woken or touched.

-o csv prints one line per tenant and hour, with a header, for a spreadsheet or a
billing system (an unknown figure is an empty field); -o json the API's answer.
docs/operations/usage.md says how each figure is measured and how accurate it is.`,
		Annotations: map[string]string{csvAnnotation: "yes"},
		Args:        cobra.MaximumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := g.client()
			if err != nil {
				return err
			}
			q := url.Values{}
			if len(args) == 1 {
				q.Set("tenant", args[0])
			}
			if from != "" {
				q.Set("from", from)
			}
			if to != "" {
				q.Set("to", to)
			}
			rep, err := c.Usage(cmd.Context(), q)
			if err != nil {
				return err
			}
			if g.output == "csv" {
				return usageCSV(g.stdout, rep.Hours)
			}
			return g.print(rep, func(w io.Writer) {
				row(w, "TENANT", "HOUR", "STORAGE", "CPU S", "ROWS WRITTEN", "CONN S", "BYTES IN", "BYTES OUT", "ANALYTICS Q")
				for _, h := range rep.Hours {
					row(w, h.Tenant, h.Hour.Local().Format("2006-01-02 15:04"), humanBytes(int64(h.StorageByteHours))+"·h",
						optFloat(h.CPUSeconds, 3), h.RowsWritten, strconv.FormatFloat(h.ConnectionSeconds, 'f', 0, 64), optBytes(h.BytesIn), optBytes(h.BytesOut), h.AnalyticsQueries)
				}
				if len(rep.Hours) == 0 {
					fmt.Fprintf(w, "no usage from %s to %s\n", rep.From.Local().Format(time.DateTime), rep.To.Local().Format(time.DateTime))
				}
			})
		},
	}
	cmd.Flags().StringVar(&from, "from", "", "first hour: an RFC 3339 time, a date or a duration back from now (default: --to minus 24h)")
	cmd.Flags().StringVar(&to, "to", "", "end (exclusive, up to the next hour): an RFC 3339 time, a date or a duration back from now (default now)")
	return cmd
}

// usageCSV writes hours as CSV: exact figures (bytes, not GiB), times in
// RFC 3339 UTC, an unknown figure as an empty field.
func usageCSV(w io.Writer, hours []catalog.UsageHour) error {
	cw := csv.NewWriter(w)
	_ = cw.Write([]string{"tenant", "hour", "storage_byte_hours", "cpu_seconds", "rows_written", "connection_seconds", "bytes_in", "bytes_out", "analytics_queries"})
	num := func(p *int64) string {
		if p == nil {
			return ""
		}
		return strconv.FormatInt(*p, 10)
	}
	for _, h := range hours {
		cpu := ""
		if h.CPUSeconds != nil {
			cpu = strconv.FormatFloat(*h.CPUSeconds, 'f', 6, 64)
		}
		_ = cw.Write([]string{h.Tenant, h.Hour.UTC().Format(time.RFC3339), strconv.FormatFloat(h.StorageByteHours, 'f', 0, 64), cpu,
			strconv.FormatInt(h.RowsWritten, 10), strconv.FormatFloat(h.ConnectionSeconds, 'f', 3, 64), num(h.BytesIn), num(h.BytesOut), strconv.FormatInt(h.AnalyticsQueries, 10)})
	}
	cw.Flush()
	return cw.Error()
}

func optFloat(p *float64, prec int) string {
	if p == nil {
		return "-"
	}
	return strconv.FormatFloat(*p, 'f', prec, 64)
}
