package cli

import (
	"fmt"
	"log/slog"

	"github.com/spf13/cobra"

	"github.com/pgtenant/pgtenant/internal/config"
	"github.com/pgtenant/pgtenant/internal/daemon"
)

func newServeCmd(g *globals) *cobra.Command {
	var path string
	cmd := &cobra.Command{
		Use:   "serve --config FILE",
		Short: "Run the daemon against the clusters in a config file",
		Long: `Run the pgtenant daemon (API, jobs, metrics, console) against configured
clusters. See docs/configuration.md for the file format. Several daemons
may share one catalog: give them all the same credentials.key_file (without it,
each generates its own next to its token file and warns that it did).

A cluster with a pooler: block gets a PgBouncer that this daemon runs on its
host; it keeps running when the daemon stops (tenants keep their connections
across a daemon restart) and the next start adopts it.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			cfg, err := config.Load(path)
			if err != nil {
				return err
			}
			if cfg.Catalog.DSN == "" {
				return fmt.Errorf("config %s: catalog.dsn: required", path)
			}
			if cfg.TokenFile == "" {
				return fmt.Errorf("config %s: token_file: required", path)
			}
			log := slog.New(slog.NewTextHandler(g.stderr, nil))
			d, err := daemon.New(cmd.Context(), daemon.Options{Config: cfg, Logger: log})
			if err != nil {
				return err
			}
			fmt.Fprintf(g.stdout, "pgtenant serving on %s (token in %s)\n", d.URL(), cfg.TokenFile)
			return d.Run(cmd.Context())
		},
	}
	cmd.Flags().StringVar(&path, "config", "pgtenant.yaml", "config file (YAML)")
	return cmd
}
