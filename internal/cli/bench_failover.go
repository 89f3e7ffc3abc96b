package cli

import (
	"slices"
	"time"

	"github.com/spf13/cobra"

	"github.com/pgtenant/pgtenant/internal/bench"
)

func newBenchFailoverCmd(g *globals, env *bench.Env) *cobra.Command {
	o := bench.FailoverOptions{}
	var scenarios, modes []string
	c := &cobra.Command{
		Use:   "failover",
		Short: "Node loss, postgres crash and switchover of a Patroni cluster behind pgtenant's pooler, in synchronous and asynchronous mode: time to resume, errors, acknowledged writes lost, tps",
		Long: `A catalog cluster (a primary and a streaming standby) with a daemon in process, and
a Patroni cluster (one etcd, two Patroni nodes with pgtenant's Patroni timing:
ttl 20 s, loop_wait 2 s, retry_timeout 5 s) registered with the daemon as
'cluster add --patroni' does, behind a PgBouncer the daemon runs. --tenants tenants on
it (a transaction-mode tier), each written through its pooler DSN by --clients
writers inserting sequential ids at --rate inserts/s (connect timeout 2 s, write
timeout 5 s, a new connection after any error). Then --runs runs of each scenario
in each mode of --modes (synchronous first; the mode is changed through Patroni's
PATCH /config on the same cluster):

  node-loss   the leader's Patroni and PostgreSQL SIGKILLed together; once another
              node leads and every tenant writes again, the node is started again
              and rejoins as a standby (pg_rewind)
  crash       the leader's postmaster alone SIGKILLed: Patroni restarts it or fails over
  switchover  a planned switchover through pgtenant's API (its job waited for): the
              pooler pauses, Patroni switches, the pooler is re-pointed and resumes

Each run is waited out until the cluster has a leader and a standby streaming from
it (synchronous in synchronous mode), the daemon connects to that leader and every
tenant writes through the pooler. Per scenario and mode: the time from the kill (or
the switchover request) to each tenant's first write acknowledged by the new leader
(p50 and max over every tenant of every run), the longest pause of a writer, the
writers' errors, and the acknowledged writes missing from the new primary (read
directly after each run). Then --tps-clients unpaced clients insert through the
pooler on one tenant for --tps-duration in each mode: synchronous mode's cost.
Everything it starts is stopped and removed at the end. Needs patroni,
etcd-server, pgbouncer and postgresql-15 (Debian packages). Exits non-zero if a
target is not met.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			env.Log = g.stderr
			if err := atLeast(cmd, 1, "tenants", "clients", "rate", "runs", "tps-clients"); err != nil {
				return err
			}
			// The order is fixed: synchronous mode first (the cluster
			// starts in it), the scenarios as listed in the help.
			o.Scenarios, o.Modes = nil, nil
			for _, s := range []string{bench.ScenarioNodeLoss, bench.ScenarioCrash, bench.ScenarioSwitchover} {
				if slices.Contains(scenarios, s) {
					o.Scenarios = append(o.Scenarios, s)
				}
			}
			for _, m := range []string{bench.ModeSync, bench.ModeAsync} {
				if slices.Contains(modes, m) {
					o.Modes = append(o.Modes, m)
				}
			}
			for _, s := range scenarios {
				if !slices.Contains(o.Scenarios, s) {
					return usagef("--scenarios %q: want node-loss, crash or switchover", s)
				}
			}
			for _, m := range modes {
				if !slices.Contains(o.Modes, m) {
					return usagef("--modes %q: want sync or async", m)
				}
			}
			if len(o.Modes) == 0 {
				return usagef("--modes: want sync, async or both")
			}
			_, table, err := env.Failover(cmd.Context(), o)
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
	f.IntVar(&o.Tenants, "tenants", 4, "tenants on the Patroni cluster, written through the pooler")
	f.IntVar(&o.Clients, "clients", 1, "paced writers per tenant")
	f.IntVar(&o.Rate, "rate", 50, "inserts per second of each writer")
	f.IntVar(&o.Runs, "runs", 3, "runs of each scenario in each mode")
	f.StringSliceVar(&scenarios, "scenarios", []string{bench.ScenarioNodeLoss, bench.ScenarioCrash, bench.ScenarioSwitchover}, "scenarios to run: node-loss, crash, switchover")
	f.StringSliceVar(&modes, "modes", []string{bench.ModeSync, bench.ModeAsync}, "replication modes: sync, async")
	f.IntVar(&o.TPSClients, "tps-clients", 4, "unpaced clients of each tps run")
	f.DurationVar(&o.TPSDuration, "tps-duration", 10*time.Second, "each tps run (one per mode)")
	return c
}
