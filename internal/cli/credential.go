package cli

import (
	"io"
	"time"

	"github.com/spf13/cobra"

	"github.com/pgtenant/pgtenant/internal/api"
	"github.com/pgtenant/pgtenant/internal/catalog"
)

func newTenantCredentialCmd(g *globals) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "credential",
		Short: "Give a tenant more logins: read-write, read-only, or read-only on a standby",
		Long: `A tenant's extra logins, beside its own: each a role t_<id>_<name> with its own
password, rotated and revoked on its own, held to the tenant's tier (its
connection limit and settings, the capper's caps) and locked out with it when it
is suspended or dropped. A read-write login acts as the tenant's role (what it
makes is the tenant's); a read-only one can SELECT the tenant's tables, those it
makes later included, and nothing else; a replica one is read-only and its DSN is
a standby's. A tenant has at most 10. Passwords are shown once, at create and at
rotation, and never kept.`,
	}
	var req api.CreateCredentialRequest
	create := &cobra.Command{
		Use:   "create ID --name NAME [--read-only] [--replica]",
		Short: "Give a tenant another login and print its DSN and password (once)",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := g.client()
			if err != nil {
				return err
			}
			out, err := c.CreateCredential(cmd.Context(), args[0], req)
			if err != nil {
				return err
			}
			return g.print(out, func(w io.Writer) { credentialDetail(w, out) })
		},
	}
	create.Flags().StringVar(&req.Name, "name", "", "the login's name (required): a lowercase letter, then up to 19 lowercase letters and digits")
	create.Flags().BoolVar(&req.ReadOnly, "read-only", false, "SELECT on the tenant's tables only (new ones included)")
	create.Flags().BoolVar(&req.Replica, "replica", false, "read-only, served by a standby of the tenant's cluster")
	_ = create.MarkFlagRequired("name")
	list := &cobra.Command{
		Use:   "list ID",
		Short: "List a tenant's extra logins (never their passwords)",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := g.client()
			if err != nil {
				return err
			}
			ls, err := c.Credentials(cmd.Context(), args[0])
			if err != nil {
				return err
			}
			return g.print(ls, func(w io.Writer) { credentialTable(w, ls) })
		},
	}
	rotate := &cobra.Command{
		Use:   "rotate ID NAME",
		Short: "Give one of a tenant's logins a new password (its sessions end, the old password is refused at once)",
		Args:  cobra.ExactArgs(2),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := g.client()
			if err != nil {
				return err
			}
			out, err := c.RotateCredential(cmd.Context(), args[0], args[1])
			if err != nil {
				return err
			}
			return g.print(out, func(w io.Writer) { credentialDetail(w, out) })
		},
	}
	revoke := &cobra.Command{
		Use:   "revoke ID NAME",
		Short: "Revoke one of a tenant's logins: its sessions end and its role is dropped (again: no error)",
		Args:  cobra.ExactArgs(2),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := g.client()
			if err != nil {
				return err
			}
			ls, err := c.RevokeCredential(cmd.Context(), args[0], args[1])
			if err != nil {
				return err
			}
			return g.print(ls, func(w io.Writer) { credentialTable(w, ls) })
		},
	}
	cmd.AddCommand(create, list, rotate, revoke)
	return cmd
}

func credentialDetail(w io.Writer, out api.CredentialResponse) {
	row(w, "name", out.Credential.Name)
	row(w, "user", out.User)
	row(w, "kind", credentialKind(out.Credential))
	row(w, "password", out.Password+"  (shown once)")
	row(w, "dsn", out.DSN)
}

func credentialTable(w io.Writer, ls []catalog.Login) {
	row(w, "NAME", "KIND", "CREATED", "ROTATED")
	for _, l := range ls {
		rotated := "-"
		if l.RotatedAt != nil {
			rotated = l.RotatedAt.Local().Format(time.DateTime)
		}
		row(w, l.Name, credentialKind(l), l.CreatedAt.Local().Format(time.DateTime), rotated)
	}
}

func credentialKind(l catalog.Login) string {
	switch {
	case l.Replica:
		return "replica (read-only, a standby)"
	case l.ReadOnly:
		return "read-only"
	}
	return "read-write"
}
