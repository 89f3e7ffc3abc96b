package cli

import (
	"errors"
	"fmt"
	"io"
	"sort"
	"strings"

	"github.com/spf13/cobra"

	"github.com/pgtenant/pgtenant/internal/api"
	"github.com/pgtenant/pgtenant/internal/catalog"
)

func newClusterCmd(g *globals) *cobra.Command {
	cmd := &cobra.Command{Use: "cluster", Short: "Register and inspect PostgreSQL clusters"}

	var dsn string
	var standbys, patroniURLs []string
	add := &cobra.Command{
		Use:   "add NAME --dsn DSN",
		Short: "Register an external cluster by the admin DSN of its primary",
		Long: `Register an external cluster. pgtenant connects with the DSN first and refuses
one it cannot reach. The DSN's role needs SUPERUSER (or CREATEDB and CREATEROLE).
The password is stored in the catalog and never printed.`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := g.client()
			if err != nil {
				return err
			}
			out, err := c.AddCluster(cmd.Context(), api.AddClusterRequest{Name: args[0], DSN: dsn, Standbys: standbys, Patroni: patroniURLs})
			if err != nil {
				return err
			}
			return g.print(out, func(w io.Writer) { clusterTable(w, []api.Cluster{out}) })
		},
	}
	add.Flags().StringVar(&dsn, "dsn", "", "admin DSN of the primary, e.g. postgres://admin:PASSWORD@host:5432/postgres (required)")
	add.Flags().StringSliceVar(&standbys, "standby", nil, "DSN of a standby (repeatable); a listed standby that is not streaming counts as down")
	add.Flags().StringSliceVar(&patroniURLs, "patroni", nil, "REST API of the cluster's Patroni nodes, e.g. http://10.0.0.1:8008,http://10.0.0.2:8008: "+
		"pgtenant connects to their leader with the DSN's role, password and database, and follows it on a failover")
	_ = add.MarkFlagRequired("dsn")

	list := &cobra.Command{
		Use:   "list",
		Short: "List clusters with their status and standbys",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := g.client()
			if err != nil {
				return err
			}
			out, err := c.Clusters(cmd.Context())
			if err != nil {
				return err
			}
			return g.print(out, func(w io.Writer) { clusterTable(w, out) })
		},
	}

	show := &cobra.Command{
		Use:   "show NAME",
		Short: "Show a cluster: version, standbys and lag, files, checkpoints and fleet settings",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := g.client()
			if err != nil {
				return err
			}
			d, err := c.Cluster(cmd.Context(), args[0])
			if err != nil {
				return err
			}
			// The recovery window (table only; `backup list -o json` has it).
			var window string
			switch bs, err := c.Backups(cmd.Context(), args[0]); {
			case err == nil && len(bs) == 1:
				window = recoveryWindow(bs[0])
			case errors.Is(err, catalog.ErrConflict):
				window = "no backups configured (see pgtenant backup --help)"
			default:
				window = fmt.Sprintf("unknown: %v", err)
			}
			return g.print(d, func(w io.Writer) { clusterDetail(w, d); row(w, "recovery window", window) })
		},
	}
	cmd.AddCommand(add, list, show, newClusterSetCmd(g), newClusterDrainCmd(g), newClusterUndrainCmd(g),
		newClusterSwitchoverCmd(g), newClusterFailoverCmd(g), newClusterRestoreCmd(g))
	return cmd
}

func clusterTable(w io.Writer, cs []api.Cluster) {
	row(w, "NAME", "KIND", "STATUS", "TENANTS", "SIZE", "PLACEMENT", "STANDBYS", "DSN")
	for _, c := range cs {
		var sb []string
		for _, s := range c.Standbys {
			sb = append(sb, fmt.Sprintf("%s:%s lag=%s", s.Name, s.State, humanBytes(s.ReplayLagBytes)))
		}
		if len(sb) == 0 {
			sb = []string{"-"}
		}
		status := c.Status
		if c.Draining {
			status += ",draining"
		}
		row(w, c.Name, c.Kind, status, c.Tenants, humanBytes(c.SizeBytes), placementCell(c), strings.Join(sb, ", "), c.DSN)
	}
}

func clusterDetail(w io.Writer, d api.ClusterDetail) {
	row(w, "name", d.Name)
	row(w, "kind", d.Kind)
	row(w, "dsn", d.DSN)
	if len(d.Patroni) > 0 {
		row(w, "patroni", strings.Join(d.Patroni, ", ")) // the DSN follows their leader
	}
	row(w, "status", d.Status)
	row(w, "draining", d.Draining)
	row(w, "tenants", fmt.Sprintf("%d (%s)", d.Tenants, humanBytes(d.SizeBytes)))
	row(w, "placement", placementCell(d.Cluster))
	if d.Error != "" {
		row(w, "error", d.Error)
	}
	members(w, d)
	if d.Info == nil {
		return
	}
	in := d.Info
	role := "primary"
	if in.InRecovery {
		role = "standby"
	}
	row(w, "server_version", in.ServerVersion)
	row(w, "role", role)
	row(w, "started", in.PostmasterStart.Format("2006-01-02 15:04:05 MST"))
	row(w, "databases", in.Databases)
	row(w, "relation_files", in.RelationFiles)
	row(w, "checkpoints", fmt.Sprintf("%d timed, %d requested, in progress: %v", in.CheckpointsTimed, in.CheckpointsRequested, in.CheckpointInProgress))
	for _, s := range in.Standbys {
		row(w, "standby "+s.Name, fmt.Sprintf("%s, replay lag %s / %.1fs", s.State, humanBytes(s.ReplayLagBytes), s.ReplayLagSeconds))
	}
	if in.MissingStandbys > 0 {
		row(w, "missing standbys", in.MissingStandbys)
	}
	keys := make([]string, 0, len(in.Settings))
	for k := range in.Settings {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		row(w, "setting "+k, in.Settings[k])
	}
	for _, e := range []string{"pg_prewarm", "pg_buffercache"} {
		st := in.Extensions[e]
		v := "not available (install the contrib package)"
		if st.Available {
			v = "available"
			if st.Installed != "" {
				v = "installed " + st.Installed
			}
		}
		row(w, "extension "+e, v)
	}
}
