package cli

import (
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sort"
	"time"

	"github.com/spf13/cobra"

	"github.com/pgtenant/pgtenant/internal/jobs"
	"github.com/pgtenant/pgtenant/internal/templates"
)

func newTemplateCmd(g *globals) *cobra.Command {
	cmd := &cobra.Command{Use: "template", Short: "Manage versioned tenant templates"}
	var from string
	var wait bool
	upload := func(push bool) func(*cobra.Command, []string) error {
		return func(cmd *cobra.Command, args []string) error {
			files, err := readTemplateDir(from)
			if err != nil {
				return err
			}
			c, err := g.client()
			if err != nil {
				return err
			}
			add := c.CreateTemplate
			if push {
				add = c.PushTemplate
			}
			out, err := add(cmd.Context(), args[0], files)
			if err != nil {
				return err
			}
			header := func(w io.Writer) {
				fmt.Fprintf(w, "template %s version %d stored (%d files)\n", out.Template, out.Version, len(files))
				for _, j := range out.BuildJobs {
					fmt.Fprintf(w, "materialising on cluster %s: job %d\n", j.Cluster, j.ID)
				}
			}
			if !wait {
				return g.print(out, header)
			}
			// The header comes first, then the builds' progress (on
			// stderr), then the outcome; -o json prints the answer once
			// the builds are done.
			if g.output != "json" {
				header(g.stdout)
			}
			for _, j := range out.BuildJobs {
				if _, err := g.waitJob(cmd.Context(), c, j.ID); err != nil {
					return err
				}
			}
			return g.print(out, func(w io.Writer) {
				fmt.Fprintf(w, "template %s version %d built on every cluster\n", out.Template, out.Version)
			})
		}
	}
	create := &cobra.Command{
		Use:   "create NAME --from DIR",
		Short: "Create a template from a directory of SQL files (version 1)",
		Long: `Create a template from the .sql files of DIR, applied in name order
(0001_init.sql, 0002_…). Files may be plain SQL or goose-style
(-- +goose Up / Down, StatementBegin/End, NO TRANSACTION). The files are stored
in the catalog with checksums; each cluster then materialises the version as a
template database, built in lock-bounded batches.`,
		Args: cobra.ExactArgs(1),
		RunE: upload(false),
	}
	push := &cobra.Command{
		Use:   "push NAME --from DIR",
		Short: "Store the next version of a template",
		Long: `Store the next version: DIR must hold every file of the current version (the
newest one built on every cluster) unchanged, plus new files that sort after
them. A version that failed to build is never the base: fix its files and push
them again. The new version becomes current, and new tenants get it, once it is
built on every cluster; existing tenants move with 'pgtenant migrate'. A push
waits for the version before it to be built (or to fail).`,
		Args: cobra.ExactArgs(1),
		RunE: upload(true),
	}
	for _, c := range []*cobra.Command{create, push} {
		c.Flags().StringVar(&from, "from", "", "directory of .sql files (required)")
		c.Flags().BoolVar(&wait, "wait", false, "wait until the version is materialised on every cluster")
		_ = c.MarkFlagRequired("from")
	}
	list := &cobra.Command{
		Use: "list", Short: "List templates", Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := g.client()
			if err != nil {
				return err
			}
			out, err := c.Templates(cmd.Context())
			if err != nil {
				return err
			}
			return g.print(out, func(w io.Writer) {
				row(w, "NAME", "CURRENT", "LATEST", "CREATED")
				for _, t := range out {
					latest := fmt.Sprint(t.LatestVersion)
					if t.Deleting {
						latest += " (deleting)"
					}
					row(w, t.Name, t.CurrentVersion, latest, t.CreatedAt.Format("2006-01-02 15:04"))
				}
			})
		},
	}
	show := &cobra.Command{
		Use: "show NAME", Short: "Show a template: versions, files, where it is materialised, tenants by version, spare pools", Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := g.client()
			if err != nil {
				return err
			}
			d, err := c.Template(cmd.Context(), args[0])
			if err != nil {
				return err
			}
			return g.print(d, func(w io.Writer) {
				row(w, "name", d.Name)
				row(w, "current_version", d.CurrentVersion)
				if d.Deleting {
					row(w, "deleting", "yes (`pgtenant job list --type template.delete --target "+d.Name+"`)")
				}
				for _, v := range d.Versions {
					state := v.State
					if v.Version == d.CurrentVersion {
						state = "current"
					}
					row(w, fmt.Sprintf("version %d", v.Version), fmt.Sprintf("%s, %d file(s), checksum %s", state, len(v.Files), shortSum(v.Checksum)))
					if v.Error != "" {
						row(w, fmt.Sprintf("version %d error", v.Version), v.Error)
					}
					for _, f := range v.Files {
						row(w, "  "+f.Name, "sha256 "+shortSum(f.Checksum))
					}
				}
				for _, b := range d.Builds {
					detail := fmt.Sprintf("%s on %s: %s, %d relations, %s", fmt.Sprint("v", b.Version), b.Cluster, b.State, b.Relations, humanBytes(b.SizeBytes))
					if b.Error != "" {
						detail += " (" + b.Error + ")"
					}
					row(w, "build", detail)
				}
				versions := make([]string, 0, len(d.Tenants))
				for v := range d.Tenants {
					versions = append(versions, v)
				}
				sort.Strings(versions)
				for _, v := range versions {
					row(w, "tenants at v"+v, d.Tenants[v])
				}
				for _, p := range d.Pools {
					detail := fmt.Sprintf("v%d, %d ready, %d building of target %d (size %d)", p.Version, p.Ready, p.Building, p.Target, p.Size)
					if p.Retiring > 0 {
						detail += fmt.Sprintf(", %d retiring", p.Retiring)
					}
					if p.LastCreate != nil {
						detail += fmt.Sprintf("; %d create(s) lately, the last %s", p.RecentCreates, p.LastCreate.Local().Format(time.DateTime))
					}
					if p.Draining {
						detail += "; the cluster is draining: no spares"
					}
					row(w, fmt.Sprintf("spare pool %s/%s", p.Cluster, p.Mode), detail)
				}
			})
		},
	}
	var deleteWait, deleteYes bool
	del := &cobra.Command{
		Use:   "delete NAME",
		Short: "Delete a template that has no tenants, with its spares and its databases on every cluster",
		Long: `Delete a template that has no tenants (spares do not count: they go with it).
A template with tenants is refused, naming how many and in which states: drop
and purge them first. The delete is a durable job: it stops the template's
builds and rollouts, purges its spares, drops its template databases
(pgt_tpl_NAME_vN), its shared database (pgt_shared_NAME) and its connect role
on every cluster (paced like every DROP DATABASE), then forgets it. From the
request on, the template takes no new tenants or versions. Deleting again
returns the job at work; a failed delete is retried with 'pgtenant job retry'.
A delete cannot be undone: on a terminal it asks you to type the template's name
to confirm; elsewhere (a script) it needs --yes.`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if err := g.confirm(deleteYes, "deleting template "+args[0], args[0]); err != nil {
				return err
			}
			c, err := g.client()
			if err != nil {
				return err
			}
			out, err := c.DeleteTemplate(cmd.Context(), args[0])
			if err != nil {
				return err
			}
			if deleteWait {
				j, err := g.waitJob(cmd.Context(), c, out.Job.ID)
				if err != nil {
					return err
				}
				out.Job = j
			}
			return g.print(out, func(w io.Writer) {
				if out.Job.State == jobs.Succeeded {
					fmt.Fprintf(w, "template %s deleted (job %d)\n", out.Template, out.Job.ID)
					return
				}
				fmt.Fprintf(w, "deleting template %s: job %d (%s); follow it with `pgtenant job show %d --wait`\n", out.Template, out.Job.ID, out.Job.State, out.Job.ID)
			})
		},
	}
	del.Flags().BoolVar(&deleteWait, "wait", false, "wait until the template is deleted, with a progress bar")
	del.Flags().BoolVar(&deleteYes, "yes", false, "delete without asking (needed when stdin is not a terminal)")
	cmd.AddCommand(create, push, list, show, del)
	return cmd
}

// shortSum is the first 16 hex digits of a checksum, as tables show it
// (-o json has it whole).
func shortSum(sum string) string {
	if len(sum) > 16 {
		return sum[:16]
	}
	return sum
}

// readTemplateDir reads the .sql files of a directory.
func readTemplateDir(dir string) ([]templates.Upload, error) {
	if dir == "" {
		return nil, usagef("--from DIR is required")
	}
	entries, err := os.ReadDir(dir)
	if err != nil {
		return nil, fmt.Errorf("read template directory: %w", err)
	}
	var out []templates.Upload
	for _, e := range entries {
		if e.IsDir() || filepath.Ext(e.Name()) != ".sql" {
			continue
		}
		b, err := os.ReadFile(filepath.Join(dir, e.Name()))
		if err != nil {
			return nil, err
		}
		out = append(out, templates.Upload{Name: e.Name(), Body: string(b)})
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("%s has no .sql files", dir)
	}
	return out, nil
}
