package cli

import (
	"time"

	"github.com/spf13/cobra"

	"github.com/pgtenant/pgtenant/internal/bench"
	"github.com/pgtenant/pgtenant/internal/tenant"
)

func newBenchRestoreCmd(g *globals, env *bench.Env) *cobra.Command {
	o := bench.RestoreOptions{}
	var mode string
	c := &cobra.Command{
		Use:   "restore",
		Short: "Rewind of a big tenant against the manual recipe (whole-cluster pgbackrest restore, pg_dump | pg_restore), forks, neighbours' latency, archive lag and tps",
		Long: `On one cluster backed up with pgBackRest (a primary and a streaming standby,
archiving on): --tenants tenants of --tenant-mb and one of --big-mb, all in --mode, a
full backup taken after the load, then paced inserts on --writers of the small
tenants (--clients each) and on the big one. Side by side, in one run: (1) the big
tenant rewound to TIME (--ago before) through the API, waited for, against (2) the
manual recipe a user follows today, timed the same way: pgbackrest restore of the
whole cluster as of TIME into a scratch dir, started on a free port, then pg_dump -Fc
of the tenant piped into pg_restore into a new database on the live cluster;
(3) a fork of the big tenant as of now and (4) at TIME, with the source's pause (the
longest gap between the successful writes of its writer during the fork); (5) the
neighbours' write latency before and during the rewind; (6) the archive lag under
the writes (newest archived segment against the WAL position, and its age), and the
primary's tps with archiving on, with a full backup running, and with
archive_command = 'true'. Everything it starts is stopped and removed at the end.
Exits non-zero if a target is not met.

The issue's full run (about 6 GB): --tenants 20 --tenant-mb 250 --big-mb 1024 --ago 5m.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			env.Log = g.stderr
			switch o.Mode = tenant.Mode(mode); o.Mode {
			case tenant.ModeDatabase, tenant.ModeSchema:
			default:
				return usagef("--mode %q: want database or schema", mode)
			}
			if err := atLeast(cmd, 1, "tenants", "tenant-mb", "big-mb", "clients", "rate", "tps-clients"); err != nil {
				return err
			}
			_, table, err := env.Restore(cmd.Context(), o)
			if err != nil {
				return err
			}
			if err := g.printTable(table); err != nil {
				return err
			}
			return unmetTargets(table)
		},
	}
	f := c.Flags()
	f.IntVar(&o.Tenants, "tenants", 5, "small tenants (the neighbours)")
	f.IntVar(&o.TenantMB, "tenant-mb", 20, "data of each small tenant, in MB")
	f.IntVar(&o.BigMB, "big-mb", 200, "data of the big tenant (rewound and forked), in MB")
	f.StringVar(&mode, "mode", string(tenant.ModeDatabase), "mode of every tenant: database or schema")
	f.IntVar(&o.Writers, "writers", 3, "small tenants written during the run (besides the big one)")
	f.IntVar(&o.Clients, "clients", 2, "paced clients per written small tenant")
	f.IntVar(&o.Rate, "rate", 50, "inserts per second of each paced client")
	f.DurationVar(&o.Ago, "ago", time.Minute, "how long before the rewind TIME is (writes run meanwhile)")
	f.IntVar(&o.TPSClients, "tps-clients", 4, "unpaced clients of each tps run")
	f.DurationVar(&o.TPSDuration, "tps-duration", 10*time.Second, "each tps run")
	return c
}
