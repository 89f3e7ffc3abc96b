package cli

import (
	"archive/tar"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/spf13/cobra"

	"github.com/pgtenant/pgtenant/internal/api"
	"github.com/pgtenant/pgtenant/internal/catalog"
	"github.com/pgtenant/pgtenant/internal/move"
	"github.com/pgtenant/pgtenant/internal/provision"
	"github.com/pgtenant/pgtenant/internal/tenant"
)

func newTenantCmd(g *globals) *cobra.Command {
	cmd := &cobra.Command{Use: "tenant", Short: "Create, inspect and connect to tenants"}

	var req provision.Request
	var name string
	create := &cobra.Command{
		Use:   "create --template NAME",
		Short: "Create a tenant (claims a ready spare in milliseconds when the pool has one)",
		Long: `Create a tenant from a template, as its own database (--mode database) or as a
schema in the template's shared database (--mode schema). The answer carries the
tenant's id and a DSN with a generated password; only its SCRAM verifier reaches
PostgreSQL. With --external-id, a retry returns the tenant already created
instead of creating a second one, with its password within the retry window
(config credentials.retry_window, 24h), when the daemon keeps it sealed for
exactly that: a create whose answer was lost is simply sent again. After the
window, 'pgtenant tenant password ID' gives the tenant a new one. A create whose
external id names a tenant with other parameters (--template, --mode, --tier,
--name, --cluster: those given) is a conflict naming each difference.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			if cmd.Flags().Changed("name") {
				req.Name = &name
			}
			c, err := g.client()
			if err != nil {
				return err
			}
			out, err := c.CreateTenant(cmd.Context(), req)
			if err != nil {
				return err
			}
			if out.Job != nil {
				if _, err := g.waitJob(cmd.Context(), c, out.Job.ID); err != nil {
					return err
				}
				t, err := c.Tenant(cmd.Context(), out.Tenant.ID)
				if err != nil {
					return err
				}
				out.Tenant, out.Job = t, nil
			}
			return g.print(out, func(w io.Writer) {
				t := out.Tenant
				row(w, "id", t.ID)
				row(w, "name", t.Name)
				row(w, "mode", t.Mode)
				row(w, "cluster", t.Cluster)
				row(w, "template", fmt.Sprintf("%s v%d", t.Template, t.Version))
				row(w, "tier", t.Tier)
				if len(t.Pins) > 0 {
					row(w, "labels", strings.Join(t.Pins, ", "))
				}
				row(w, "state", t.State)
				if out.Existing {
					row(w, "existing", "created earlier with this external id")
					row(w, "dsn", out.DSN)
					if out.Password != "" {
						row(w, "password", out.Password+"   (kept only for the retry window: store it now)")
					}
					if out.Note != "" {
						row(w, "note", out.Note)
					}
					return
				}
				row(w, "provisioned", "from "+out.Path)
				row(w, "dsn", out.DSN)
				directRow(w, out.DSN, out.DirectDSN)
				row(w, "password", out.Password+"   (store it now)")
			})
		},
	}
	f := create.Flags()
	f.StringVar(&req.Template, "template", "", "template name (required)")
	f.StringVar((*string)(&req.Mode), "mode", "", "database or schema (default: provision.default_mode, database)")
	f.StringVar(&name, "name", "", "display name, kept in the catalog only")
	f.StringVar(&req.ExternalID, "external-id", "", "your id for this tenant; makes retries idempotent")
	f.StringVar(&req.Tier, "tier", "", "tier of limits from the config (default: default)")
	f.StringVar(&req.Cluster, "cluster", "", "cluster to place it on (default: the one with the fewest tenants)")
	f.StringSliceVar(&req.Labels, "label", nil, "pin it to clusters with this label, key=value (repeat or comma-separate for several): now and whenever it moves")
	_ = create.MarkFlagRequired("template")

	var q struct{ state, cluster, template, mode, after, sort string }
	var limit int
	list := &cobra.Command{
		Use: "list", Short: "List tenants", Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			if err := oneOf("--state", catalog.TenantState(q.state), catalog.ListedStates...); err != nil {
				return err
			}
			if err := oneOf("--mode", tenant.Mode(q.mode), tenant.Modes...); err != nil {
				return err
			}
			c, err := g.client()
			if err != nil {
				return err
			}
			v := url.Values{}
			for k, s := range map[string]string{"state": q.state, "cluster": q.cluster, "template": q.template, "mode": q.mode, "after": q.after} {
				if s != "" {
					v.Set(k, s)
				}
			}
			v.Set("limit", strconv.Itoa(limit))
			if q.sort != "" {
				v.Set("sort", q.sort)
			}
			out, err := c.Tenants(cmd.Context(), v)
			if err != nil {
				return err
			}
			return g.print(out, func(w io.Writer) {
				row(w, "ID", "NAME", "MODE", "CLUSTER", "TEMPLATE", "TIER", "STATE", "CREATED", "SIZE", "CONNS", "ACTIVITY", "QUOTA")
				for _, t := range out {
					size, conns, act, quota := listFigures(t)
					row(w, t.ID, t.Name, t.Mode, t.Cluster, fmt.Sprintf("%s v%d", t.Template, t.Version), t.Tier, t.State, t.CreatedAt.Format("2006-01-02 15:04"), size, conns, act, quota)
				}
			})
		},
	}
	lf := list.Flags()
	lf.StringVar(&q.state, "state", "", "only tenants in this state: "+join(catalog.ListedStates)+" (purged: remembered for drop.purged_retention)")
	lf.StringVar(&q.cluster, "cluster", "", "only tenants on this cluster")
	lf.StringVar(&q.template, "template", "", "only tenants of this template")
	lf.StringVar(&q.mode, "mode", "", "only database or schema tenants")
	lf.StringVar(&q.after, "after", "", "page: tenants with ids after this one")
	lf.IntVar(&limit, "limit", 1000, "at most this many")
	lf.StringVar(&q.sort, "sort", "", "size or activity: largest or busiest first (from the metrics collector)")

	var showDirect bool
	show := &cobra.Command{
		Use: "show ID", Short: "Show a tenant and its history", Args: cobra.ExactArgs(1),
		Long: `Show a tenant, its figures and its history. Its dsn is the pooler's when its
cluster has one; --direct shows the primary's own DSN as dsn instead (for tools that
need a session on the server itself, such as migrations behind a transaction pool).
-o json always carries both: .dsn and .direct_dsn.`,
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := g.client()
			if err != nil {
				return err
			}
			t, err := c.Tenant(cmd.Context(), args[0])
			if err != nil {
				return err
			}
			if showDirect {
				t.DSN = t.DirectDSN
			}
			return g.print(t, func(w io.Writer) { tenantDetail(w, t) })
		},
	}
	show.Flags().BoolVar(&showDirect, "direct", false, "show the primary's DSN (not the pooler's) as dsn")

	var printOnly, connectDirect bool
	connect := &cobra.Command{
		Use:   "connect ID",
		Short: "Open psql as the tenant (asks for its password; PGPASSWORD works too)",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := g.client()
			if err != nil {
				return err
			}
			t, err := c.Tenant(cmd.Context(), args[0])
			if err != nil {
				return err
			}
			if connectDirect {
				t.DSN = t.DirectDSN
			}
			if printOnly {
				return g.print(map[string]string{"dsn": t.DSN}, func(w io.Writer) { fmt.Fprintln(w, t.DSN) })
			}
			psql, err := exec.LookPath("psql")
			if err != nil {
				return errors.New("psql not found on PATH (apt-get install -y postgresql-client); the DSN is: " + t.DSN)
			}
			return syscall.Exec(psql, []string{"psql", t.DSN}, os.Environ())
		},
	}
	connect.Flags().BoolVar(&printOnly, "print", false, "print the DSN instead of starting psql")
	connect.Flags().BoolVar(&connectDirect, "direct", false, "connect to the primary itself, not through the pooler")

	var purgeNow, wait, yes bool
	drop := &cobra.Command{
		Use:   "drop ID",
		Short: "Soft-delete a tenant: locked out, data kept for the retention (drop.retention), then purged",
		Long: `Drop a tenant: it can no longer log in, its sessions are ended and its data
stays intact until the retention ends (config drop.retention, default 7 days);
'pgtenant tenant restore' brings it back until then. --purge-now purges at once:
a database tenant is dropped (one DROP DATABASE at a time per cluster), a schema
tenant's relations are dropped in small batches paced by the standby's replay lag.
A purge cannot be undone: on a terminal --purge-now asks you to type the tenant's
id to confirm; elsewhere (a script) it needs --yes. Dropping a dropped tenant
again is not an error.`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if purgeNow {
				if err := g.confirm(yes, "purging tenant "+args[0]+" now", args[0]); err != nil {
					return err
				}
			}
			c, err := g.client()
			if err != nil {
				return err
			}
			out, err := c.DropTenant(cmd.Context(), args[0], purgeNow)
			if err != nil {
				return err
			}
			if wait && out.Job != nil {
				j, err := g.waitJob(cmd.Context(), c, out.Job.ID)
				if err != nil {
					return err
				}
				out.Job = &j
				// The tenant as the purge left it: purged, with its history
				// (or gone, with drop.purged_retention 0).
				t, err := c.Tenant(cmd.Context(), args[0])
				var apiErr *api.Error
				switch {
				case err == nil:
					out.Tenant = t
				case errors.As(err, &apiErr) && apiErr.Status == http.StatusNotFound:
					out.Tenant = api.Tenant{}
				default:
					return err
				}
			}
			return g.print(out, func(w io.Writer) {
				if out.Tenant.ID != "" {
					tenantDetail(w, out.Tenant)
				}
				if out.Job != nil {
					row(w, "purge job", fmt.Sprintf("%d (%s)", out.Job.ID, out.Job.State))
				}
			})
		},
	}
	drop.Flags().BoolVar(&purgeNow, "purge-now", false, "skip the retention and purge now")
	drop.Flags().BoolVar(&wait, "wait", false, "with --purge-now, wait for the purge with a progress bar")
	drop.Flags().BoolVar(&yes, "yes", false, "with --purge-now, purge without asking (needed when stdin is not a terminal)")

	action := func(verb, short string) *cobra.Command {
		return &cobra.Command{Use: verb + " ID", Short: short, Args: cobra.ExactArgs(1),
			RunE: func(cmd *cobra.Command, args []string) error {
				c, err := g.client()
				if err != nil {
					return err
				}
				out, err := c.TenantAction(cmd.Context(), args[0], verb)
				if err != nil {
					return err
				}
				// The tenant as tenant show prints it: one shape per resource.
				return g.print(out.Tenant, func(w io.Writer) { tenantDetail(w, out.Tenant) })
			}}
	}
	var keepSessions bool
	password := &cobra.Command{
		Use:   "password ID",
		Short: "Give a tenant a new password (the old one stops working at once, on every node)",
		Long: `Rotate a tenant's password: its role gets a new one (only its SCRAM verifier
reaches PostgreSQL) and the old one is refused from then on, on the primary and,
once they have replayed the change (waited for, at most 10s each), on the
standbys. The tenant's sessions are ended on every node unless --keep-sessions
(they logged in already; only new logins need the new password). Prints the new
DSN and password (-o json: .dsn, .password).

Active and suspended tenants can be rotated (a suspended one still cannot log in
until resumed); a tenant being provisioned, dropped or purged is a conflict. A
create retried within the retry window gets the new password too. Every call
makes a new password: if the answer is lost, rotate again.`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := g.client()
			if err != nil {
				return err
			}
			out, err := c.RotatePassword(cmd.Context(), args[0], keepSessions)
			if err != nil {
				return err
			}
			return g.print(out, func(w io.Writer) {
				row(w, "id", out.Tenant.ID)
				row(w, "state", out.Tenant.State)
				row(w, "dsn", out.DSN)
				directRow(w, out.DSN, out.DirectDSN)
				row(w, "password", out.Password+"   (store it now)")
				row(w, "sessions ended", out.SessionsEnded)
				if out.Note != "" {
					row(w, "note", out.Note)
				}
			})
		},
	}
	password.Flags().BoolVar(&keepSessions, "keep-sessions", false, "leave the tenant's open sessions alone (default: end them on every node)")

	cmd.AddCommand(create, list, show, connect, drop, password, newTenantSetCmd(g), newTenantCredentialCmd(g), newTenantMoveCmd(g), newTenantRewindCmd(g), newTenantForkCmd(g), newTenantExportCmd(g), newTenantImportCmd(g), newTenantMetricsCmd(g),
		action("restore", "Bring a dropped tenant back, as it was, within its retention"),
		action("suspend", "Lock a tenant out (no login, sessions ended) without deleting it"),
		action("resume", "Let a suspended tenant log in again"))
	return cmd
}

// directRow shows the direct DSN when the tenant's DSN is another (its
// cluster has a pooler).
func directRow(w io.Writer, dsn, direct string) {
	if direct != "" && direct != dsn {
		row(w, "direct_dsn", direct)
	}
}

func tenantDetail(w io.Writer, t api.Tenant) {
	row(w, "id", t.ID)
	row(w, "name", t.Name)
	if t.ExternalID != "" {
		row(w, "external_id", t.ExternalID)
	}
	row(w, "mode", t.Mode)
	row(w, "cluster", t.Cluster)
	if t.Front != "" {
		row(w, "front", t.Front+" (its pooler serves the tenant's DSN: the tenant moved from there)")
	}
	row(w, "database", t.Database)
	row(w, "template", fmt.Sprintf("%s v%d", t.Template, t.Version))
	row(w, "tier", t.Tier)
	if len(t.Pins) > 0 {
		row(w, "labels", strings.Join(t.Pins, ", ")+" (pinned: only clusters with these)")
	}
	if len(t.Allow) > 0 {
		row(w, "allow", strings.Join(t.Allow, ", ")+" (through the front door)")
	}
	row(w, "state", t.State)
	metricsDetail(w, t.Metrics)
	if t.DSN != "" {
		row(w, "dsn", t.DSN)
		directRow(w, t.DSN, t.DirectDSN)
	}
	row(w, "created", t.CreatedAt.Format("2006-01-02 15:04:05 MST"))
	if t.PurgeAfter != nil {
		row(w, "purge_after", t.PurgeAfter.Format("2006-01-02 15:04:05 MST"))
	}
	if t.PurgedAt != nil {
		row(w, "purged", t.PurgedAt.Format("2006-01-02 15:04:05 MST"))
	}
	if t.Prewarm != nil {
		for _, h := range t.Prewarm.HotSets {
			row(w, "hot set "+h.Node, fmt.Sprintf("%d blocks (%s), usage %d, captured %s", h.Blocks, humanBytes(h.Blocks*8192), h.Usage, h.CapturedAt.Format("2006-01-02 15:04:05")))
		}
		for _, p := range t.Prewarm.Last {
			row(w, "prewarm "+p.Node, fmt.Sprintf("%s at %s: %d blocks into shared_buffers, %d into the OS cache %s", p.State, p.At.Format("2006-01-02 15:04:05"), p.BlocksBuffer, p.BlocksOS, p.Error))
		}
	}
	if a := t.Analytics; a != nil && a.Enabled {
		row(w, "analytics", fmt.Sprintf("%s, applied %s, lag %s", a.State, a.AppliedLSN, humanBytes(a.LagBytes)))
		row(w, "analytics_dsn", a.DSN)
	}
	if rw := t.RecoveryWindow; rw != nil {
		row(w, "recovery_window", rw.Earliest.Format(time.RFC3339)+" to "+rw.Latest.Format(time.RFC3339)+" (tenant rewind, tenant fork)")
	}
	for _, e := range t.Events {
		row(w, "event "+e.At.Format("2006-01-02 15:04:05"), strings.TrimSpace(e.Kind+" "+e.DetailText()))
	}
}

// parseWhen reads a point in time: RFC 3339 ("2026-12-02T08:15:00Z"), or a
// duration before now ("5m ago", "-90s", "2h").
func parseWhen(s string) (time.Time, error) {
	if t, err := time.Parse(time.RFC3339Nano, s); err == nil {
		return t, nil
	}
	d := strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(s), "ago"))
	if dur, err := time.ParseDuration(strings.TrimPrefix(d, "-")); err == nil && dur >= 0 {
		return time.Now().Add(-dur), nil
	}
	return time.Time{}, fmt.Errorf("time %q: want RFC 3339 (2026-12-02T08:15:00Z) or a duration before now (5m ago)", s)
}

func newTenantRewindCmd(g *globals) *cobra.Command {
	var to string
	var wait bool
	cmd := &cobra.Command{
		Use:   "rewind ID --to TIME",
		Short: "Take a tenant back to a point in time, in place (same id, DSN and password)",
		Long: `Take one tenant back to TIME without touching its neighbours. The cluster's
backup (pgBackRest) is restored as of TIME into a scratch instance on a free port
(only the tenant's database), the tenant is copied from there into a new tenant
in its own role's session, and the two swap their storage while the tenant's pool
is paused at the pooler: its clients see a pause, never a half-restored tenant.
What the rewind replaced is kept as a dropped tenant (named in the "rewound"
event, kept_as) for drop.retention: restore that tenant to get it back, or rewind
again to the "replaced_at" of the event. TIME is RFC 3339 or a duration before now
("5m ago"), and must be in the tenant's recovery window (tenant show). The
scratch instance and its files are removed whatever happens. Needs backups on the
tenant's cluster (docs/operations/backups.md). --wait follows the job.`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			at, err := parseWhen(to)
			if err != nil {
				return err
			}
			c, err := g.client()
			if err != nil {
				return err
			}
			j, err := c.RewindTenant(cmd.Context(), args[0], at)
			if err != nil {
				return err
			}
			return g.printJob(cmd.Context(), c, j, wait)
		},
	}
	cmd.Flags().StringVar(&to, "to", "", `the time to go back to: RFC 3339, or a duration before now ("5m ago") (required)`)
	cmd.Flags().BoolVar(&wait, "wait", false, "wait for the rewind with a progress bar")
	_ = cmd.MarkFlagRequired("to")
	return cmd
}

func newTenantForkCmd(g *globals) *cobra.Command {
	var at, name, tier string
	var wait bool
	cmd := &cobra.Command{
		Use:   "fork ID [--at TIME]",
		Short: "Make a new tenant holding a tenant's data as of a time (now by default)",
		Long: `Make a new tenant (new id, new password) on the same cluster holding the
tenant's data as of TIME, or as of now: for staging copies, investigations and
tests against real data. The data is read from the cluster's backup restored into
a scratch instance, so the source never pauses, whatever its size, and the copy is
consistent as of one instant. The answer is the new tenant's DSN and password,
shown once, and the job that copies the data; the new tenant is suspended until
the job has succeeded (its "forked" event records the source, the time and the
template version). Needs backups on the tenant's cluster.`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			var req api.ForkTenantRequest
			if at != "" {
				t, err := parseWhen(at)
				if err != nil {
					return err
				}
				req.At = &t
			}
			if cmd.Flags().Changed("name") {
				req.Name = &name
			}
			req.Tier = tier
			c, err := g.client()
			if err != nil {
				return err
			}
			res, err := c.ForkTenant(cmd.Context(), args[0], req)
			if err != nil {
				return err
			}
			return g.printCopy(cmd.Context(), c, res, wait)
		},
	}
	cmd.Flags().StringVar(&at, "at", "", `the time of the copy: RFC 3339, or a duration before now ("1h ago"); now when absent`)
	cmd.Flags().StringVar(&name, "name", "", `the new tenant's name (default "fork of <source name>")`)
	cmd.Flags().StringVar(&tier, "tier", "", "the new tenant's tier (default the source's)")
	cmd.Flags().BoolVar(&wait, "wait", false, "wait for the copy with a progress bar")
	return cmd
}

// printCopy prints the new tenant of a fork or an import, once its copy
// is done when wait.
func (g *globals) printCopy(ctx context.Context, c *api.Client, res api.CreateTenantResponse, wait bool) error {
	if wait && res.Job != nil {
		j, err := g.waitJob(ctx, c, res.Job.ID)
		if err != nil {
			return err
		}
		res.Job = &j
		if t, err := c.Tenant(ctx, res.Tenant.ID); err == nil {
			res.Tenant = t
		}
	}
	return g.print(res, func(w io.Writer) {
		row(w, "id", res.Tenant.ID)
		row(w, "state", string(res.Tenant.State))
		row(w, "dsn", res.DSN)
		row(w, "password", res.Password)
		if res.Job != nil {
			row(w, "job", fmt.Sprintf("%d (%s)", res.Job.ID, res.Job.State))
		}
	})
}

func newTenantExportCmd(g *globals) *cobra.Command {
	var to string
	cmd := &cobra.Command{
		Use:   "export ID --to FILE",
		Short: "Write a tenant's portable archive (its objects, rows and a manifest) to a file",
		Long: `Write one tenant to FILE as a portable archive: a tar of manifest.json (the
tenant, its mode, template and version, the rows of each table, the checksum of
the dump) and tenant.dump (pg_dump's custom format of the tenant's objects and
rows, without owners or privileges). The dump is consistent as of one instant;
the tenant keeps serving meanwhile (its DDL waits until the dump ends). Another
pgtenant installation makes a new tenant of it with 'tenant import': for moving a
customer between regions or installations, and for handing customers their own
data ('pg_restore -l tenant.dump' lists it; 'pg_restore --no-owner' restores it
into any PostgreSQL 15 or later). The file is written as FILE.partial and renamed
once complete; "-" writes to standard output. A database tenant's extensions
(beyond plpgsql) are in the archive; an import refuses a tier that does not allow
them all (tiers.<name>.extensions).`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := g.client()
			if err != nil {
				return err
			}
			var w io.Writer = g.stdout
			var f *os.File
			if to != "-" {
				if f, err = os.OpenFile(to+".partial", os.O_CREATE|os.O_TRUNC|os.O_WRONLY, 0o600); err != nil {
					return err
				}
				defer os.Remove(f.Name()) // gone once renamed
				defer f.Close()
				w = f
			}
			p := newProgress(g.stderr)
			what := "exporting tenant " + args[0]
			n, err := c.ExportTenant(cmd.Context(), args[0], w, func(done, total int64) { p.bytes(what, done, total) })
			p.done()
			if err != nil {
				return err
			}
			if f == nil {
				return nil
			}
			if err := f.Close(); err != nil {
				return err
			}
			if err := os.Rename(f.Name(), to); err != nil {
				return err
			}
			m, err := readManifest(to)
			if err != nil {
				return err
			}
			out := exportResult{File: to, Bytes: n, Manifest: m}
			return g.print(out, func(w io.Writer) {
				row(w, "file", to)
				row(w, "size", humanBytes(n))
				row(w, "tenant", m.Tenant)
				row(w, "mode", string(m.Mode))
				row(w, "template", fmt.Sprintf("%s version %d", m.Template, m.Version))
				var rows int64
				for _, t := range m.Tables {
					rows += t.Rows
				}
				row(w, "tables", fmt.Sprintf("%d (%d rows)", len(m.Tables), rows))
				row(w, "exported at", m.ExportedAt.Format(time.RFC3339))
			})
		},
	}
	cmd.Flags().StringVar(&to, "to", "", `the file to write the archive to ("-": standard output) (required)`)
	_ = cmd.MarkFlagRequired("to")
	return cmd
}

// exportResult is what tenant export prints.
type exportResult struct {
	File     string        `json:"file"`
	Bytes    int64         `json:"bytes"`
	Manifest move.Manifest `json:"manifest"`
}

// readManifest reads the manifest of the archive at path.
func readManifest(path string) (move.Manifest, error) {
	var m move.Manifest
	f, err := os.Open(path)
	if err != nil {
		return m, err
	}
	defer f.Close()
	tr := tar.NewReader(f)
	if _, err := tr.Next(); err != nil {
		return m, fmt.Errorf("%s: %w", path, err)
	}
	return m, json.NewDecoder(tr).Decode(&m)
}

func newTenantImportCmd(g *globals) *cobra.Command {
	var from, cluster, name, tier string
	var wait bool
	cmd := &cobra.Command{
		Use:   "import --from FILE",
		Short: "Make a new tenant from an archive of 'tenant export'",
		Long: `Make a new tenant (new id, new password) from an archive written by 'tenant
export', here or on another pgtenant installation. The archive is checked first
(its manifest, the dump's checksum) and this installation must have the archive's
template at the archive's version, with the same files (push them first). The
answer is the new tenant's DSN and password, shown once, and the job that copies
the data: it loads the dump into a scratch instance as a role without privilege
(the archive comes from outside: none of it runs with privilege), copies it into
the new tenant in the tenant's own role, and checks that each table holds at
least the rows the manifest counted before the commit. The new tenant is
suspended until then; its "imported" event names the archived tenant. "-" reads
standard input.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			var r io.Reader = os.Stdin
			if from != "-" {
				f, err := os.Open(from)
				if err != nil {
					return err
				}
				defer f.Close()
				r = f
			}
			c, err := g.client()
			if err != nil {
				return err
			}
			q := api.ImportTenantQuery{Cluster: cluster, Tier: tier}
			if cmd.Flags().Changed("name") {
				q.Name = &name
			}
			res, err := c.ImportTenant(cmd.Context(), r, q)
			if err != nil {
				return err
			}
			return g.printCopy(cmd.Context(), c, res, wait)
		},
	}
	cmd.Flags().StringVar(&from, "from", "", `the archive to import ("-": standard input) (required)`)
	cmd.Flags().StringVar(&cluster, "cluster", "", "the cluster to put the tenant on (default: placement chooses)")
	cmd.Flags().StringVar(&name, "name", "", "the new tenant's name (default: the archived tenant's)")
	cmd.Flags().StringVar(&tier, "tier", "", "the new tenant's tier (default: the default tier)")
	cmd.Flags().BoolVar(&wait, "wait", false, "wait for the copy with a progress bar")
	_ = cmd.MarkFlagRequired("from")
	return cmd
}

func newTenantSetCmd(g *globals) *cobra.Command {
	var tier string
	var allow, labels []string
	var allowAny, noLabels, wait bool
	cmd := &cobra.Command{
		Use:   "set ID [--tier TIER | --label K=V,… | --no-labels] [--allow NET,… | --allow-any]",
		Short: "Change a tenant's tier or labels (in place, or moved online to a cluster they need) or its allowlist",
		Long: `Give a tenant another tier (a plan change). When its cluster admits a tenant of
the new tier, the change is made in place at once: the role's connection limit and
settings (statement_timeout, idle_in_transaction_session_timeout, work_mem,
temp_file_limit), then the catalog, then the pooler entry (pool mode and sizes).
New sessions get the new settings; the capper holds running ones to the new caps
from its next pass, and the storage quota is judged by the new tier from then on.
A session of the tenant that holds its role's row (an uncommitted ALTER ROLE of
its own) is ended after 3s so that a downgrade cannot be held off.

When the tier's placement needs another cluster (placement: dedicated, a
cluster_label the cluster lacks, or connections it does not have), the tenant is
moved there with the online cut-over of 'tenant move', and takes the new tier at
the switch; the answer is the move's job (--wait follows it). Only active tenants
move. The same tier again changes nothing.

--label pins the tenant to clusters that carry each label (key=value, as set with
'cluster set NAME --label'), for data residency: placement, drains, rebalances and
moves keep it on such clusters, and a move to another is refused. When its cluster
lacks one, it is moved online to one that has them (the answer is the move's job).
--no-labels unpins it. Change the tier and the labels one at a time.

--allow sets the client networks the tenant's logins (its own and its extra ones)
may come from through the front door: CIDRs or single addresses, comma-separated;
a login from anywhere else is "login rejected" by the pooler. --allow-any lifts it.
It takes effect at once; the direct DSN (the primary's) is the server's own HBA's.`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			req := api.SetTenantRequest{Tier: tier}
			switch {
			case noLabels && len(labels) > 0:
				return usagef("--label and --no-labels: choose one")
			case noLabels:
				req.Labels = &[]string{}
			case len(labels) > 0:
				req.Labels = &labels
			}
			switch {
			case allowAny && len(allow) > 0:
				return usagef("--allow and --allow-any: choose one")
			case allowAny:
				req.Allow = &[]string{}
			case len(allow) > 0:
				req.Allow = &allow
			case tier == "" && req.Labels == nil:
				return usagef("say what to change: --tier, --label, --no-labels, --allow or --allow-any")
			}
			if tier != "" && req.Labels != nil {
				return usagef("--tier and --label: change one at a time (either may move the tenant)")
			}
			c, err := g.client()
			if err != nil {
				return err
			}
			out, err := c.SetTenant(cmd.Context(), args[0], req)
			if err != nil {
				return err
			}
			if out.Job != nil && wait {
				j, err := g.waitJob(cmd.Context(), c, out.Job.ID)
				if err != nil {
					return err
				}
				out.Job = &j
				if out.Tenant, err = c.Tenant(cmd.Context(), args[0]); err != nil {
					return err
				}
			}
			return g.print(out, func(w io.Writer) {
				tenantDetail(w, out.Tenant)
				if out.Job != nil {
					row(w, "move job", fmt.Sprintf("%d to %s (%s)", out.Job.ID, out.Job.Cluster, out.Job.State))
				}
			})
		},
	}
	cmd.Flags().StringVar(&tier, "tier", "", "the tier to give the tenant (one of the config's tiers)")
	cmd.Flags().StringSliceVar(&allow, "allow", nil, "the client networks its logins may come from through the front door (CIDR or address, comma-separated)")
	cmd.Flags().BoolVar(&allowAny, "allow-any", false, "lift the allowlist: logins from any address")
	cmd.Flags().StringSliceVar(&labels, "label", nil, "pin the tenant to clusters with this label, key=value (repeat or comma-separate for several)")
	cmd.Flags().BoolVar(&noLabels, "no-labels", false, "unpin the tenant: any cluster its tier admits")
	cmd.Flags().BoolVar(&wait, "wait", false, "when the tier or labels need another cluster, wait for the move with a progress bar")
	return cmd
}

func newTenantMoveCmd(g *globals) *cobra.Command {
	var to string
	var wait bool
	cmd := &cobra.Command{
		Use:   "move ID --to CLUSTER",
		Short: "Move a tenant online to another cluster (its DSN does not change)",
		Long: `Move a tenant to another cluster while it serves: its schema is recreated empty
on the target, its rows follow by logical replication, then its pool is paused at
the pooler (clients queue), writes on the source stop, the target catches up, the
sequences are set and the catalog and the pooler entry switch to the target before
the pool resumes. The pause is recorded in the tenant's events (move_pause).
A move that cannot be done (large objects, tables without a primary key, …) is
refused before anything is copied. A failure or a cancel before the switch leaves
the tenant where it was. The source copy stays locked for drop.retention, then is
purged. The answer is the move's job; --wait follows it with a progress bar.`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := g.client()
			if err != nil {
				return err
			}
			j, err := c.MoveTenant(cmd.Context(), args[0], to)
			if err != nil {
				return err
			}
			return g.printJob(cmd.Context(), c, j, wait)
		},
	}
	cmd.Flags().StringVar(&to, "to", "", "the cluster to move the tenant to (required)")
	cmd.Flags().BoolVar(&wait, "wait", false, "wait for the move with a progress bar")
	_ = cmd.MarkFlagRequired("to")
	return cmd
}
