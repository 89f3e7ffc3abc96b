// Package cli is pgtenant's command line: one file per command group. Client
// commands talk to the daemon through the API client; `up` and `serve` run
// the daemon in this process.
package cli

import (
	"context"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"

	"github.com/spf13/cobra"

	"github.com/pgtenant/pgtenant/internal/api"
)

// globals are the flags every command shares.
type globals struct {
	output  string // table or json
	server  string
	caFile  string // PEM CA certificates to trust for an https:// server
	dataDir string
	stdout  io.Writer
	stderr  io.Writer
}

// Run executes the command line args.
func Run(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	root := newRoot(stdout, stderr)
	root.SetArgs(args)
	return root.ExecuteContext(ctx)
}

func newRoot(stdout, stderr io.Writer) *cobra.Command {
	g := &globals{stdout: stdout, stderr: stderr}
	root := &cobra.Command{
		Use:   "pgtenant",
		Short: "Multi-tenant PostgreSQL: provision, drop, upgrade and move tenants across a fleet",
		Long: `pgtenant turns a fleet of PostgreSQL servers into a multi-tenant database service.
Tenants are provisioned from versioned templates in milliseconds, as a database or a
schema, and dropped, restored and upgraded without stalling the standby.

Start a local fleet with 'pgtenant up'; other commands talk to its API.

Every client command accepts -o json, --server URL (env PGTENANT_SERVER; an
https:// URL for a daemon with tls_cert_file) and reads the API token from
PGTENANT_TOKEN or, failing that, from DATA_DIR/token (--data-dir, env
PGTENANT_DATA_DIR). --ca-file FILE (env PGTENANT_CA_FILE) trusts the PEM
certificates in FILE instead of the system's, for a daemon with a self-signed or
private-CA certificate. A daemon that does not answer (not running, wrong
--server) is the error "pgtenant server unreachable at URL: ..."; every error
exits with status 1.`,
		SilenceUsage:  true,
		SilenceErrors: true,
		PersistentPreRunE: func(cmd *cobra.Command, args []string) error {
			if g.output != "table" && g.output != "json" {
				return fmt.Errorf("--output must be table or json, not %q", g.output)
			}
			return nil
		},
	}
	root.SetOut(stdout)
	root.SetErr(stderr)
	pf := root.PersistentFlags()
	pf.StringVarP(&g.output, "output", "o", "table", "output format: table or json")
	pf.StringVar(&g.server, "server", envOr("PGTENANT_SERVER", defaultServer), "pgtenant API address (env PGTENANT_SERVER)")
	pf.StringVar(&g.caFile, "ca-file", os.Getenv("PGTENANT_CA_FILE"), "PEM file of the CA (or self-signed certificate) to trust for an https:// --server, instead of the system's (env PGTENANT_CA_FILE)")
	pf.StringVar(&g.dataDir, "data-dir", envOr("PGTENANT_DATA_DIR", defaultDataDir), "`DIR` where pgtenant up keeps its fleet; client commands read the API token from DIR/token when PGTENANT_TOKEN is unset (env PGTENANT_DATA_DIR)")

	root.AddCommand(newUpCmd(g), newServeCmd(g), newClusterCmd(g), newTemplateCmd(g), newTenantCmd(g), newJobCmd(g), newReconcileCmd(g), newMigrateCmd(g), newRolloutCmd(g), newPrewarmCmd(g), newBenchCmd(g))
	root.AddCommand(newDoctorCmd(g), newAnalyticsCmd(g), newRebalanceCmd(g))
	root.AddCommand(newBackupCmd(g))
	root.AddCommand(newTokenCmd(g), newAuditCmd(g))
	root.AddCommand(newGenDocsCmd(g))
	return root
}

// The built-in defaults of --server and --data-dir (the environment may
// override them; docs/cli.md shows these).
const (
	defaultServer  = "http://127.0.0.1:8080"
	defaultDataDir = ".pgtenant"
)

func envOr(name, def string) string {
	if v := os.Getenv(name); v != "" {
		return v
	}
	return def
}

// client builds the API client: token from PGTENANT_TOKEN, else DATA_DIR/token.
func (g *globals) client() (*api.Client, error) {
	token := os.Getenv("PGTENANT_TOKEN")
	if token == "" {
		b, err := os.ReadFile(filepath.Join(g.dataDir, "token"))
		if err != nil {
			return nil, fmt.Errorf("no API token: set PGTENANT_TOKEN (printed by `pgtenant up`) or run from the directory holding %s/token (or pass --data-dir)", g.dataDir)
		}
		token = strings.TrimSpace(string(b))
	}
	c := api.NewClient(g.server, token)
	if g.caFile != "" {
		pem, err := os.ReadFile(g.caFile)
		if err != nil {
			return nil, fmt.Errorf("--ca-file: %w", err)
		}
		if err := c.TrustCA(pem); err != nil {
			return nil, fmt.Errorf("--ca-file %s: %w", g.caFile, err)
		}
	}
	return c, nil
}
