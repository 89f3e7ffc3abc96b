package cli

import (
	"bytes"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"

	"github.com/spf13/cobra"
	"github.com/spf13/cobra/doc"
)

// cliDocFile is the command reference inside the docs directory, generated
// from the command tree so that it never drifts from the commands' help.
const cliDocFile = "cli.md"

// newGenDocsCmd is the hidden `gen-docs DIR` behind `make docs`.
func newGenDocsCmd(g *globals) *cobra.Command {
	return &cobra.Command{
		Use:    "gen-docs DIR",
		Short:  "Write the command reference (DIR/cli.md) from the command tree",
		Hidden: true, // a maintainer's tool, not an operator's command
		Args:   cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			var buf bytes.Buffer
			if err := writeCLIDocs(&buf); err != nil {
				return err
			}
			path := filepath.Join(args[0], cliDocFile)
			if err := os.WriteFile(path, buf.Bytes(), 0o644); err != nil {
				return fmt.Errorf("write %s: %w", path, err)
			}
			fmt.Fprintf(g.stdout, "wrote %s\n", path)
			return nil
		},
	}
}

// writeCLIDocs writes every available command's page, in tree order
// (parents before children, children by name), as one markdown file whose
// "see also" links point at the headings of that file. The tree is built
// afresh with the built-in flag defaults, so the output does not depend on
// the environment (PGTENANT_SERVER …) or the date.
func writeCLIDocs(w io.Writer) error {
	root := newRoot(io.Discard, io.Discard)
	resetEnvDefaults(root)
	root.DisableAutoGenTag = true
	fmt.Fprint(w, `# pgtenant command reference

Generated from the command tree by `+"`make docs`"+` (the hidden `+"`pgtenant gen-docs docs`"+`);
do not edit: change the commands' help instead. The same text is `+"`pgtenant COMMAND --help`"+`.

## Errors and exit statuses

A command that fails prints its error on stderr, or with `+"`-o json`"+` on stdout as the
API's error body, `+"`{\"error\": {\"code\": \"...\", \"message\": \"...\"}}`"+`, and exits with a
status that says what kind of error it was, so that a script can tell a typo from a
missing tenant from a daemon that is down:

`)
	exitStatusTable(w)
	fmt.Fprint(w, `
Destructive commands (`+"`tenant drop --purge-now`, `template delete`"+`) ask on a terminal
for the tenant's id or the template's name to be typed back; off a terminal (a script,
a pipe) they need `+"`--yes`"+` and refuse without it (exit status 2).

`)
	var visit func(c *cobra.Command) error
	visit = func(c *cobra.Command) error {
		c.DisableAutoGenTag = true
		if err := doc.GenMarkdownCustom(c, w, anchorLink); err != nil {
			return fmt.Errorf("docs of %s: %w", c.CommandPath(), err)
		}
		for _, sub := range c.Commands() { // sorted by name
			if !sub.IsAvailableCommand() || sub.IsAdditionalHelpTopicCommand() {
				continue
			}
			if err := visit(sub); err != nil {
				return err
			}
		}
		return nil
	}
	return visit(root)
}

// anchorLink turns cobra's per-file link (pgtenant_tenant_create.md) into
// the anchor of that command's heading in the one file (#pgtenant-tenant-create).
func anchorLink(file string) string {
	return "#" + strings.ReplaceAll(strings.TrimSuffix(file, ".md"), "_", "-")
}

// resetEnvDefaults puts back the built-in defaults of the flags whose
// default comes from the environment.
func resetEnvDefaults(root *cobra.Command) {
	for name, def := range map[string]string{"server": defaultServer, "ca-file": "", "data-dir": defaultDataDir} {
		if f := root.PersistentFlags().Lookup(name); f != nil {
			f.DefValue = def
		}
	}
}
