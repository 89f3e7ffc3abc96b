package cli

import (
	"fmt"
	"io"

	"github.com/spf13/cobra"

	"github.com/pgtenant/pgtenant/internal/api"
	"github.com/pgtenant/pgtenant/internal/patroni"
)

func newClusterSwitchoverCmd(g *globals) *cobra.Command {
	return newLeaderChangeCmd(g, false, "switchover NAME [--to NODE]",
		"Hand a Patroni cluster's primary to a standby, for maintenance: clients see a pause, not an error (a job)",
		`Change the leader of a cluster Patroni runs (registered with `+"`cluster add --patroni`"+`),
as a planned operation: the cluster's PgBouncer PAUSEs (the transactions in flight
end; new queries wait in the pooler; if one runs longer than 10 s the switchover is
refused and nothing changes), Patroni stops the leader cleanly and promotes --to
(default: the synchronous standby, else the replica of least lag), pgtenant waits
for it to answer as primary, re-points its own sessions and the PgBouncer at it, then
RESUMEs: the tenants' clients wait about two seconds and go on through the same DSN.
The old leader rejoins as a standby. In synchronous mode Patroni promotes only the
synchronous standby. `+"`cluster show NAME`"+` lists the members. A second request while one
runs returns the same job. --wait follows it.`)
}

func newClusterFailoverCmd(g *globals) *cobra.Command {
	return newLeaderChangeCmd(g, true, "failover NAME --to NODE",
		"Force a member of a Patroni cluster to lead it, even with no healthy leader (a job)",
		`Promote --to in a cluster Patroni runs, whether or not its leader is healthy: the
operator's decision when Patroni does not fail over on its own (no synchronous
standby in synchronous mode, a leader that answers but should not lead). The
cluster's PgBouncer is paused and resumed as for a switchover. In asynchronous mode
a failover can lose the transactions --to had not received: prefer
`+"`cluster switchover`"+` while the leader is healthy. --wait follows the job.`)
}

func newLeaderChangeCmd(g *globals, force bool, use, short, long string) *cobra.Command {
	var to string
	var wait bool
	cmd := &cobra.Command{
		Use: use, Short: short, Long: long,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := g.client()
			if err != nil {
				return err
			}
			change := c.Switchover
			if force {
				change = c.Failover
			}
			j, err := change(cmd.Context(), args[0], api.SwitchoverRequest{To: to})
			if err != nil {
				return err
			}
			return g.printJob(cmd.Context(), c, j, wait)
		},
	}
	if force {
		cmd.Flags().StringVar(&to, "to", "", "the member to promote, as cluster show names it (required)")
		_ = cmd.MarkFlagRequired("to")
	} else {
		cmd.Flags().StringVar(&to, "to", "", "the member to promote (default: the synchronous standby, else the replica of least lag)")
	}
	cmd.Flags().BoolVar(&wait, "wait", false, "wait for the change with a progress line")
	return cmd
}

// members prints a Patroni cluster's members in `cluster show`.
func members(w io.Writer, d api.ClusterDetail) {
	if d.PatroniError != "" {
		row(w, "patroni", "does not answer: "+d.PatroniError)
	}
	if len(d.Members) == 0 {
		return
	}
	mode := "asynchronous (a failover may lose the last commits)"
	if d.SynchronousMode {
		mode = "synchronous (a commit is acknowledged once the sync_standby has it)"
		if !hasSyncStandby(d.Members) {
			mode += "; NO synchronous standby now: commits are acknowledged unreplicated"
		}
	}
	row(w, "replication", mode)
	for _, m := range d.Members {
		lag := "-"
		switch {
		case m.Role == patroni.RoleLeader:
		case m.Lag < 0:
			lag = "unknown"
		default:
			lag = humanBytes(m.Lag)
		}
		row(w, "member "+m.Name, fmt.Sprintf("%s, %s, %s:%d, timeline %d, lag %s", m.Role, m.State, m.Host, m.Port, m.Timeline, lag))
	}
}

func hasSyncStandby(ms []patroni.Member) bool {
	for _, m := range ms {
		if m.Role == patroni.RoleSyncStandby {
			return true
		}
	}
	return false
}
