package cli

import (
	"time"

	"github.com/spf13/cobra"

	"github.com/pgtenant/pgtenant/internal/bench"
)

func newBenchPrewarmCmd(g *globals, env *bench.Env) *cobra.Command {
	o := bench.PrewarmOptions{}
	c := &cobra.Command{
		Use:   "prewarm",
		Short: "Time for hot tenants to get back to a 99% hit ratio after a restart: none vs autoprewarm vs pgtenant",
		Long: `Makes many tenants whose data is several times shared_buffers, runs a read
workload on a few hot ones (after reading the others once, so that the cache
holds mostly cold tenants' blocks, as on a busy fleet), then for each variant restarts the primary with the OS
page cache dropped (as root) and measures the hot workload: (a) no prewarm,
(b) PostgreSQL's autoprewarm (pg_prewarm.autoprewarm=on), (c) pgtenant's prewarm
(hot sets captured before the restart, prewarmed by priority after it). Reports the
time to a 99% buffer hit ratio, p50/p95 latency in the first 10 s and the whole
window, and the cold tenants' blocks loaded.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			env.Log = g.stderr
			_, table, err := env.Prewarm(cmd.Context(), o)
			if err != nil {
				return err
			}
			return g.printTable(table)
		},
	}
	f := c.Flags()
	f.IntVar(&o.Tenants, "tenants", 200, "database tenants")
	f.IntVar(&o.SchemaTenants, "schema-tenants", 20, "schema tenants")
	f.IntVar(&o.Hot, "hot", 10, "hot database tenants (with a read workload)")
	f.IntVar(&o.MBPerTenant, "mb", 5, "data per tenant, in MB")
	f.StringVar(&o.SharedBuffers, "shared-buffers", "512MB", "shared_buffers of the primary")
	f.DurationVar(&o.Warmup, "warmup", 20*time.Second, "workload before each restart")
	f.DurationVar(&o.Measure, "measure", 60*time.Second, "workload measured after each restart")
	return c
}
