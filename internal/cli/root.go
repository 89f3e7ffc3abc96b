// Package cli is pgtenant's command line: one file per command group. Client
// commands talk to the daemon through the API client; `up` and `serve` run
// the daemon in this process.
package cli

import (
	"bufio"
	"context"
	"errors"
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
	// terminal is stdin when it is a terminal, else nil: destructive
	// commands ask there for a confirmation (confirm).
	terminal io.Reader
}

// Run executes the command line args. Its error's exit status is
// ExitCode's; under -o json the error is on stdout already (Printed).
func Run(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	return run(ctx, args, &globals{stdout: stdout, stderr: stderr, terminal: terminalIn(os.Stdin)})
}

// run executes args with g's streams. An error that no command's RunE
// returned is cobra's (an unknown command or flag, a wrong argument
// count, a missing required flag, a bad --output): a usage error.
func run(ctx context.Context, args []string, g *globals) error {
	root := rootCmd(g)
	ran := false
	markRun(root, &ran)
	// cobra answers a group's unknown verb (tenant frob) with the group's
	// help, and success: a script's typo would pass unseen.
	var unknown error
	help := root.HelpFunc()
	root.SetHelpFunc(func(c *cobra.Command, args []string) {
		if verb := c.Flags().Arg(0); !c.Runnable() && verb != "" {
			unknown = fmt.Errorf("unknown command %q for %q", verb, c.CommandPath())
			c.SuggestionsMinimumDistance = 2 // cobra's default, set only where it suggests itself
			if s := c.SuggestionsFor(verb); len(s) > 0 {
				unknown = fmt.Errorf("%w: did you mean %s?", unknown, strings.Join(s, " or "))
			}
			return
		}
		help(c, args)
	})
	root.SetArgs(args)
	err := root.ExecuteContext(ctx)
	if err == nil {
		err = unknown
	}
	if err == nil {
		return nil
	}
	if !ran {
		err = usageError{err}
	}
	// A flag error stops the parse before a later -o json is read.
	if g.output == "json" || (!ran && asksJSON(args)) {
		return printError(g.stdout, err)
	}
	return err
}

// markRun sets *ran when a command's RunE starts.
func markRun(c *cobra.Command, ran *bool) {
	if runE := c.RunE; runE != nil {
		c.RunE = func(cmd *cobra.Command, args []string) error {
			*ran = true
			return runE(cmd, args)
		}
	}
	for _, sub := range c.Commands() {
		markRun(sub, ran)
	}
}

// newRoot is the command tree with no terminal to confirm on (docs, tests).
func newRoot(stdout, stderr io.Writer) *cobra.Command {
	return rootCmd(&globals{stdout: stdout, stderr: stderr})
}

func rootCmd(g *globals) *cobra.Command {
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
--server) is the error "pgtenant server unreachable at URL: ...".

With -o json a resource prints as its show command prints it (tenant suspend,
resume and restore print the tenant as tenant show does).

An error is printed on stderr, or with -o json on stdout as the API's error
body, {"error": {"code": "...", "message": "..."}}. The exit status says what
kind of error it was (docs/cli.md has the table in full):

` + exitStatusHelp(),
		SilenceUsage:  true,
		SilenceErrors: true,
		PersistentPreRunE: func(cmd *cobra.Command, args []string) error {
			if g.output == "csv" && cmd.Annotations[csvAnnotation] == "" {
				return usagef("--output csv: only %s prints CSV; use table or json", "usage")
			}
			if g.output != "table" && g.output != "json" && g.output != "csv" {
				return usagef("--output must be table or json (or csv for usage), not %q", g.output)
			}
			return nil
		},
	}
	root.SetOut(g.stdout)
	root.SetErr(g.stderr)
	pf := root.PersistentFlags()
	pf.StringVarP(&g.output, "output", "o", "table", "output format: table or json (usage: also csv)")
	pf.StringVar(&g.server, "server", envOr("PGTENANT_SERVER", defaultServer), "pgtenant API address (env PGTENANT_SERVER)")
	pf.StringVar(&g.caFile, "ca-file", os.Getenv("PGTENANT_CA_FILE"), "PEM file of the CA (or self-signed certificate) to trust for an https:// --server, instead of the system's (env PGTENANT_CA_FILE)")
	pf.StringVar(&g.dataDir, "data-dir", envOr("PGTENANT_DATA_DIR", defaultDataDir), "`DIR` where pgtenant up keeps its fleet; client commands read the API token from DIR/token when PGTENANT_TOKEN is unset (env PGTENANT_DATA_DIR)")

	root.AddCommand(newUpCmd(g), newServeCmd(g), newClusterCmd(g), newTemplateCmd(g), newTenantCmd(g), newJobCmd(g), newReconcileCmd(g), newMigrateCmd(g), newRolloutCmd(g), newPrewarmCmd(g), newBenchCmd(g))
	root.AddCommand(newDoctorCmd(g), newAnalyticsCmd(g), newRebalanceCmd(g))
	root.AddCommand(newBackupCmd(g))
	root.AddCommand(newTokenCmd(g), newAuditCmd(g))
	root.AddCommand(newUsageCmd(g))
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

// confirm asks before a command that cannot be undone: on a terminal the
// operator types want (the tenant's id, the template's name) back; without
// one (a script, a pipe, a test) it refuses unless --yes was given, rather
// than act on nobody's word.
func (g *globals) confirm(yes bool, what, want string) error {
	if yes {
		return nil
	}
	if g.terminal == nil {
		return usagef("%s cannot be undone: add --yes to confirm (stdin is not a terminal to ask on)", what)
	}
	fmt.Fprintf(g.stderr, "%s cannot be undone. Type %s to confirm: ", what, want)
	line, err := bufio.NewReader(g.terminal).ReadString('\n')
	if got := strings.TrimSpace(line); got != want {
		if err != nil && got == "" {
			return fmt.Errorf("%w (%v): nothing was done", errNotConfirmed, err)
		}
		return fmt.Errorf("%w: typed %q, not %q; nothing was done", errNotConfirmed, got, want)
	}
	return nil
}

// errNotConfirmed is a confirmation the operator did not give.
var errNotConfirmed = errors.New("not confirmed")

// terminalIn returns f when it is a terminal, else nil. /dev/null is a
// character device too, but nobody types there (exec.Cmd's default stdin).
func terminalIn(f *os.File) io.Reader {
	fi, err := f.Stat()
	if err != nil || fi.Mode()&os.ModeCharDevice == 0 {
		return nil
	}
	if null, err := os.Stat(os.DevNull); err == nil && os.SameFile(fi, null) {
		return nil
	}
	return f
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
