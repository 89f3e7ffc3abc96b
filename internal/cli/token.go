package cli

import (
	"fmt"
	"io"
	"net/url"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/pgtenant/pgtenant/internal/api"
)

func newTokenCmd(g *globals) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "token",
		Short: "Create, list and revoke scoped API tokens",
		Long: `Scoped API tokens, for scripts and teams that should not hold the admin token (the
token file's, which stays valid and may do everything). Every token may read (GET);
what else it may do is its scope:

  read-only   nothing else
  tenants     tenant lifecycle: create, drop, restore, suspend, resume, rewind, fork,
              passwords, analytics mirrors, a tenant's prewarm and metrics export
  templates   templates and rollouts
  clusters    clusters and placement: add, set, drain, rebalance, tenant moves,
              backups, fleet prewarm
  admin       everything, including tokens, jobs and reconcile

A call outside the token's scope gets 403 naming the scope it needs. Only the token's
SHA-256 is kept in the catalog: the token is printed once, by create. A revoked or
expired token gets 401 at its next call. Making and revoking tokens needs admin.`,
	}
	var req api.CreateTokenRequest
	var scope string
	create := &cobra.Command{
		Use:   "create",
		Short: "Create a scoped token and print it (once)",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			req.Scope = api.Scope(scope)
			if scope == "" {
				return usagef("--scope is required: one of %s", join(api.Scopes))
			}
			if err := oneOf("--scope", req.Scope, api.Scopes...); err != nil {
				return err
			}
			c, err := g.client()
			if err != nil {
				return err
			}
			out, err := c.CreateToken(cmd.Context(), req)
			if err != nil {
				return err
			}
			return g.print(out, func(w io.Writer) {
				tokenTable(w, []api.Token{out.Token})
				fmt.Fprintf(w, "\ntoken: %s\n", out.Secret)
				fmt.Fprintln(w, "It is shown this once (only its hash is kept): export PGTENANT_TOKEN=<token> where it is used.")
			})
		},
	}
	create.Flags().StringVar(&scope, "scope", "", "what the token may do: "+join(api.Scopes))
	create.Flags().StringVar(&req.ExpiresIn, "expires", "", "`DURATION` after which it is refused, such as 12h or 30d (default: never)")
	create.Flags().StringVar(&req.Name, "name", "", "a name to know it by, in lists and the audit")

	list := &cobra.Command{
		Use:   "list",
		Short: "List scoped tokens: scope, state, expiry (never the tokens themselves)",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := g.client()
			if err != nil {
				return err
			}
			out, err := c.Tokens(cmd.Context())
			if err != nil {
				return err
			}
			return g.print(out, func(w io.Writer) { tokenTable(w, out) })
		},
	}

	revoke := &cobra.Command{
		Use:   "revoke ID",
		Short: "Revoke a token: refused from its next call",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			id, err := strconv.ParseInt(args[0], 10, 64)
			if err != nil {
				return usagef("token id %q: a number, as `pgtenant token list` shows it", args[0])
			}
			c, err := g.client()
			if err != nil {
				return err
			}
			out, err := c.RevokeToken(cmd.Context(), id)
			if err != nil {
				return err
			}
			return g.print(out, func(w io.Writer) { tokenTable(w, []api.Token{out}) })
		},
	}
	cmd.AddCommand(create, list, revoke)
	return cmd
}

func tokenTable(w io.Writer, ts []api.Token) {
	row(w, "ID", "NAME", "SCOPE", "STATE", "CREATED", "EXPIRES")
	for _, t := range ts {
		expires := "never"
		if t.ExpiresAt != nil {
			expires = t.ExpiresAt.Local().Format("2006-01-02 15:04")
		}
		row(w, t.ID, printable(t.Name), t.Scope, t.State, t.CreatedAt.Local().Format("2006-01-02 15:04"), expires)
	}
}

// printable keeps a free-text cell on one line and in its column.
func printable(s string) string {
	return strings.NewReplacer("\t", " ", "\n", " ", "\r", " ").Replace(s)
}

func newAuditCmd(g *globals) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "audit",
		Short: "Read the audit log of mutating API calls",
		Long: `Every API call that changes something (any method but GET), allowed or refused, is
recorded in the catalog's append-only audit log before its answer is sent: who (the
scoped token's name and id, "admin token", or "unauthenticated"), what (method and
route), the target (the route's path values), when, from where (the peer address)
and the result (the HTTP status). The console's actions are recorded as the admin
token's.`,
	}
	var since string
	var limit int
	list := &cobra.Command{
		Use:   "list",
		Short: "List audit entries, newest first",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := g.client()
			if err != nil {
				return err
			}
			q := url.Values{"limit": {strconv.Itoa(limit)}}
			if since != "" {
				q.Set("since", since)
			}
			out, err := c.Audit(cmd.Context(), q)
			if err != nil {
				return err
			}
			return g.print(out, func(w io.Writer) {
				row(w, "ID", "AT", "WHO", "CALL", "TARGET", "FROM", "STATUS")
				for _, e := range out {
					who := printable(e.Actor)
					if e.TokenID != nil {
						who = fmt.Sprintf("%s (token %d)", who, *e.TokenID)
					}
					row(w, e.ID, e.At.Local().Format(time.DateTime), who, e.Method+" "+e.Route, targetCell(e.Target), e.Remote, e.Status)
				}
			})
		},
	}
	list.Flags().StringVar(&since, "since", "", "only entries from this `WHEN` on: a duration back from now (24h, 7d) or an RFC 3339 time")
	list.Flags().IntVar(&limit, "limit", 100, "at most this many")
	cmd.AddCommand(list)
	return cmd
}

// targetCell is "id=t_1", or "-" for a route without path values.
func targetCell(t map[string]string) string {
	if len(t) == 0 {
		return "-"
	}
	keys := make([]string, 0, len(t))
	for k := range t {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	parts := make([]string, len(keys))
	for i, k := range keys {
		parts[i] = k + "=" + printable(t[k])
	}
	return strings.Join(parts, " ")
}
