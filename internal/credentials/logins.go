package credentials

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pgtenant/pgtenant/internal/catalog"
	"github.com/pgtenant/pgtenant/internal/cluster"
	"github.com/pgtenant/pgtenant/internal/config"
	"github.com/pgtenant/pgtenant/internal/purge"
	"github.com/pgtenant/pgtenant/internal/templates"
	"github.com/pgtenant/pgtenant/internal/tenant"
)

// A tenant's extra logins (`pgtenant tenant credential …`): each a role
// t_<id>_<name> of its own, with its own password, rotated and revoked on
// its own, held to the tenant's tier like the tenant's role (its
// connection limit and settings; the capper's caps, by tenant.IDFromRole).
//
//   - read-write: NOINHERIT member of the tenant's role, with role =
//     t_<id> as its default: every session acts as the tenant's role
//     (objects it makes are the tenant's), and after a RESET ROLE it has
//     nothing of its own to act with.
//   - read-only: SELECT on the tenant's tables and sequences, and on the
//     ones the tenant makes later (default privileges for the tenant's
//     role), USAGE on its schemas, default_transaction_read_only on.
//   - replica: read-only, its DSN a standby's.
//
// Only grants are run in the tenant's database, by the admin: GRANT,
// ALTER DEFAULT PRIVILEGES and DROP OWNED run no code of the tenant's.
// Every statement's lock waits are bounded (loginLockTimeout): the tenant
// can hold its tables' rows of pg_class with its own DDL.

// MaxLogins bounds a tenant's extra logins.
const MaxLogins = 10

// loginLockTimeout bounds each lock wait of a login's statements.
const loginLockTimeout = 5 * time.Second

// LoginCreated is a new login or a rotated one: its password is shown
// only here.
type LoginCreated struct {
	Login    catalog.Login
	Role     string
	Password string
	DSN      string
}

// CreateLogin gives tenant id another login. A suspended tenant's login is
// made NOLOGIN, as its own role is, until the tenant resumes.
func (s *Service) CreateLogin(ctx context.Context, id string, l catalog.Login) (LoginCreated, error) {
	if !tenant.ValidID(id) {
		return LoginCreated{}, fmt.Errorf("tenant %q: %w", id, catalog.ErrNotFound)
	}
	if !tenant.ValidLoginName(l.Name) {
		return LoginCreated{}, fmt.Errorf("%w: credential name %q: use a lowercase letter, then up to 19 lowercase letters and digits", ErrInvalid, l.Name)
	}
	l.Tenant = id
	if l.Replica {
		l.ReadOnly = true // a standby serves reads only
	}
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), rotateTimeout)
	defer cancel()
	password, verifier := tenant.NewPassword()
	var out LoginCreated
	var front string
	err := pgx.BeginFunc(ctx, s.Store.Pool(), func(tx pgx.Tx) error {
		t, err := s.Store.LockTenant(ctx, tx, id)
		if err != nil {
			return err
		}
		if err := t.Changeable("add credentials"); err != nil {
			return err
		}
		front = t.FrontCluster()
		have, err := s.Store.Logins(ctx, tx, id)
		if err != nil {
			return err
		}
		if len(have) >= MaxLogins {
			return fmt.Errorf("%w: tenant %s has %d credentials, the most it may have; revoke one first", catalog.ErrConflict, id, len(have))
		}
		cl, err := s.Clusters.Get(t.Cluster)
		if err != nil {
			return err
		}
		if l.Replica && len(cl.StandbyDSNs()) == 0 {
			return fmt.Errorf("%w: cluster %s has no standby to serve a replica credential", ErrInvalid, cl.Name())
		}
		if out.Login, err = s.Store.InsertLogin(ctx, tx, l); err != nil {
			return err
		}
		if err := s.makeLogin(ctx, cl, t, out.Login, verifier); err != nil {
			// The catalog forgets it: so does the cluster (a retry makes it again).
			if derr := DropLogins(ctx, cl, t, tenant.LoginRole(id, l.Name)); derr != nil {
				s.Logger.Warn("drop the role of a credential that could not be made", "tenant", id, "credential", l.Name, "err", derr)
			}
			return err
		}
		out.Role, out.Password = tenant.LoginRole(id, l.Name), password
		out.DSN, err = s.LoginDSN(cl, t, out.Login, password)
		if err != nil {
			return err
		}
		return s.Store.AddEvent(ctx, tx, id, "credential_created", map[string]any{"name": l.Name, "read_only": l.ReadOnly, "replica": l.Replica})
	})
	if err != nil {
		return LoginCreated{}, err
	}
	s.Poolers.Sync(ctx, front, "credential "+id)
	return out, nil
}

// ErrInvalid is a request to refuse as it is.
var ErrInvalid = errors.New("invalid credential request")

// makeLogin makes (or remakes: it is idempotent) a login's role on the
// tenant's cluster with verifier, its tier's limits and its privileges.
func (s *Service) makeLogin(ctx context.Context, cl *cluster.Cluster, t catalog.Tenant, l catalog.Login, verifier string) error {
	admin, err := cl.Admin(ctx)
	if err != nil {
		return err
	}
	if err := cluster.CreateRole(ctx, admin, tenant.LoginRole(t.ID, l.Name)); err != nil {
		return err
	}
	sql := LoginRoleSQL(t, l, verifier, s.Tiers[t.Tier], t.State == catalog.StateActive)
	if err := cluster.ExecLockBounded(ctx, admin, loginLockTimeout, sql); err != nil {
		return fmt.Errorf("make the role of credential %s of tenant %s: %w", l.Name, t.ID, err)
	}
	return GrantLogin(ctx, cl, t, l)
}

// LoginRoleSQL is what a login's role is given in the maintenance database:
// its password (verifier; "" keeps the one it has), LOGIN or NOLOGIN, its
// tier's limits, what it acts as, and (schema mode) CONNECT on the shared
// database. A move runs it on its target (NOLOGIN until the switch).
func LoginRoleSQL(t catalog.Tenant, l catalog.Login, verifier string, tier config.Tier, canLogin bool) string {
	role, own := tenant.LoginRole(t.ID, l.Name), tenant.PhysicalName(t.ID)
	id := cluster.Ident(role)
	var b strings.Builder
	if t.Mode == tenant.ModeSchema {
		b.WriteString(templates.ConnectSQL(true, t.Template, role)) // first: it takes the shared database's lock
	}
	login := "NOLOGIN"
	if canLogin {
		login = "LOGIN"
	}
	fmt.Fprintf(&b, "ALTER ROLE %s WITH %s NOINHERIT;\nALTER ROLE %s RESET ALL;\n", id, login, id)
	if verifier != "" {
		fmt.Fprintf(&b, "ALTER ROLE %s PASSWORD %s;\n", id, cluster.Literal(verifier))
	}
	b.WriteString(tenant.TierSQL(role, tier))
	if l.ReadOnly {
		fmt.Fprintf(&b, "ALTER ROLE %s SET default_transaction_read_only = on;\n", id)
	} else {
		fmt.Fprintf(&b, "GRANT %s TO %s;\nALTER ROLE %s SET role = %s;\n", cluster.Ident(own), id, id, cluster.Literal(own))
	}
	if t.Mode == tenant.ModeSchema {
		fmt.Fprintf(&b, "ALTER ROLE %s SET search_path = %s;\n", id, cluster.Ident(own))
	}
	return b.String()
}

// GrantLogin gives a login what it needs in the tenant's database: CONNECT
// on a database tenant's database and, read-only, SELECT on what the
// tenant has there and will make (a read-write login acts as the
// tenant's role and needs nothing else). Idempotent: a move runs it again
// on the tenant's new storage.
func GrantLogin(ctx context.Context, cl *cluster.Cluster, t catalog.Tenant, l catalog.Login) error {
	own, role := tenant.PhysicalName(t.ID), cluster.Ident(tenant.LoginRole(t.ID, l.Name))
	if t.Mode == tenant.ModeDatabase {
		admin, err := cl.Admin(ctx)
		if err != nil {
			return err
		}
		if _, err := admin.Exec(ctx, fmt.Sprintf("GRANT CONNECT ON DATABASE %s TO %s", cluster.Ident(t.Database), role)); err != nil {
			return fmt.Errorf("grant credential %s of tenant %s its database: %w", l.Name, t.ID, cluster.Classify(err))
		}
	}
	if !l.ReadOnly {
		return nil
	}
	pool, err := cl.Pool(ctx, t.Database)
	if err != nil {
		return err
	}
	schemas := []string{own}
	forSchemas := " IN SCHEMA " + cluster.Ident(own)
	if t.Mode == tenant.ModeDatabase {
		// Its schemas and those it has tables in (public): every schema
		// of its database but the system's and pgtenant's marker.
		rows, err := pool.Query(ctx, `SELECT nspname FROM pg_catalog.pg_namespace
			WHERE nspname NOT LIKE 'pg\_%' AND nspname NOT IN ('information_schema', $1) ORDER BY 1`, tenant.MarkerSchema)
		if err != nil {
			return cluster.Classify(err)
		}
		if schemas, err = pgx.CollectRows(rows, pgx.RowTo[string]); err != nil {
			return cluster.Classify(err)
		}
		forSchemas = ""
	}
	var b strings.Builder
	for _, sch := range schemas {
		fmt.Fprintf(&b, "GRANT USAGE ON SCHEMA %[1]s TO %[2]s;\nGRANT SELECT ON ALL TABLES IN SCHEMA %[1]s TO %[2]s;\nGRANT SELECT ON ALL SEQUENCES IN SCHEMA %[1]s TO %[2]s;\n",
			cluster.Ident(sch), role)
	}
	for _, what := range []string{"TABLES", "SEQUENCES"} {
		fmt.Fprintf(&b, "ALTER DEFAULT PRIVILEGES FOR ROLE %s%s GRANT SELECT ON %s TO %s;\n", cluster.Ident(own), forSchemas, what, role)
	}
	if t.Mode == tenant.ModeDatabase {
		fmt.Fprintf(&b, "ALTER DEFAULT PRIVILEGES FOR ROLE %s GRANT USAGE ON SCHEMAS TO %s;\n", cluster.Ident(own), role)
	}
	if err := cluster.ExecLockBounded(ctx, pool, loginLockTimeout, b.String()); err != nil {
		return fmt.Errorf("grant credential %s of tenant %s its reads: %w", l.Name, t.ID, err)
	}
	return nil
}

// LoginDSN is a login's DSN: the front door's when the tenant has one (a
// replica login's through its standby entry, which the next sync makes),
// else the primary's or, for a replica login, the first standby's.
func (s *Service) LoginDSN(cl *cluster.Cluster, t catalog.Tenant, l catalog.Login, password string) (string, error) {
	role := tenant.LoginRole(t.ID, l.Name)
	if dsn, ok := s.Poolers.LoginDSN(t, role, password, l.Replica); ok {
		return dsn, nil
	}
	if !l.Replica {
		return cl.TenantDSN(t.Database, role, password), nil
	}
	standbys := cl.StandbyDSNs()
	if len(standbys) == 0 {
		return "", fmt.Errorf("%w: cluster %s has no standby", cluster.ErrUnavailable, cl.Name())
	}
	cfg, err := pgx.ParseConfig(standbys[0])
	if err != nil {
		return "", err
	}
	u := url.URL{Scheme: "postgres", Host: fmt.Sprintf("%s:%d", cfg.Host, cfg.Port), Path: "/" + t.Database,
		User: url.UserPassword(role, password), RawQuery: "sslmode=disable"}
	if password == "" {
		u.User = url.User(role)
	}
	return u.String(), nil
}

// Logins lists a tenant's logins (never their passwords).
func (s *Service) Logins(ctx context.Context, id string) ([]catalog.Login, error) {
	if _, err := s.Store.GetTenant(ctx, nil, id); err != nil {
		return nil, err
	}
	return s.Store.Logins(ctx, nil, id)
}

// RotateLogin gives a login a new password: the old one is refused at
// once on the primary and, once they replay, on the standbys; the login's
// sessions are ended.
func (s *Service) RotateLogin(ctx context.Context, id, name string) (LoginCreated, error) {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), rotateTimeout)
	defer cancel()
	password, verifier := tenant.NewPassword()
	var out LoginCreated
	var cl *cluster.Cluster
	var front string
	err := pgx.BeginFunc(ctx, s.Store.Pool(), func(tx pgx.Tx) error {
		t, l, err := s.lockLogin(ctx, tx, id, name)
		if err != nil {
			return err
		}
		front = t.FrontCluster()
		if cl, err = s.Clusters.Get(t.Cluster); err != nil {
			return err
		}
		out.Role = tenant.LoginRole(id, name)
		if _, err := setPassword(ctx, cl, out.Role, verifier, false); err != nil {
			return err
		}
		if err := s.Store.LoginRotated(ctx, tx, id, name); err != nil {
			return err
		}
		if out.Login, err = s.Store.GetLogin(ctx, tx, id, name); err != nil {
			return err
		}
		out.Password = password
		if out.DSN, err = s.LoginDSN(cl, t, l, password); err != nil {
			return err
		}
		return s.Store.AddEvent(ctx, tx, id, "credential_rotated", map[string]any{"name": name})
	})
	if err != nil {
		return LoginCreated{}, err
	}
	s.Poolers.Sync(ctx, front, "credential "+id)
	if _, _, err := purge.OnStandbys(ctx, cl, true, out.Role); err != nil {
		s.Logger.Warn("credential rotated on the primary; a standby failed", "tenant", id, "credential", name, "err", err)
	}
	return out, nil
}

// RevokeLogin ends a login's sessions and drops its role (its grants with
// it); revoking one that is gone already is not an error.
func (s *Service) RevokeLogin(ctx context.Context, id, name string) error {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), rotateTimeout)
	defer cancel()
	var cl *cluster.Cluster
	var front string
	role := tenant.LoginRole(id, name)
	err := pgx.BeginFunc(ctx, s.Store.Pool(), func(tx pgx.Tx) error {
		t, _, err := s.lockLogin(ctx, tx, id, name)
		if err != nil {
			return err
		}
		front = t.FrontCluster()
		if cl, err = s.Clusters.Get(t.Cluster); err != nil {
			return err
		}
		if err := DropLogins(ctx, cl, t, role); err != nil {
			return err
		}
		if err := s.Store.DeleteLogins(ctx, tx, id, name); err != nil {
			return err
		}
		return s.Store.AddEvent(ctx, tx, id, "credential_revoked", map[string]any{"name": name})
	})
	if errors.Is(err, catalog.ErrNotFound) && tenant.ValidID(id) {
		if _, terr := s.Store.GetTenant(ctx, nil, id); terr == nil {
			return nil // revoked already
		}
	}
	if err != nil {
		return err
	}
	s.Poolers.Sync(ctx, front, "credential "+id)
	if _, _, err := purge.OnStandbys(ctx, cl, true, role); err != nil {
		s.Logger.Warn("credential revoked on the primary; a standby failed", "tenant", id, "credential", name, "err", err)
	}
	return nil
}

// DropLogins locks login roles out, ends their sessions and drops them
// with their grants in the tenant's database (DROP OWNED there, bounded)
// and on shared objects. Roles that are gone are skipped.
func DropLogins(ctx context.Context, cl *cluster.Cluster, t catalog.Tenant, roles ...string) error {
	if len(roles) == 0 {
		return nil
	}
	if err := purge.LockOut(ctx, cl, roles...); err != nil {
		return err
	}
	admin, err := cl.Admin(ctx)
	if err != nil {
		return err
	}
	var exist []string
	rows, err := admin.Query(ctx, `SELECT rolname FROM pg_catalog.pg_roles WHERE rolname = ANY($1)`, roles)
	if err == nil {
		exist, err = pgx.CollectRows(rows, pgx.RowTo[string])
	}
	if err != nil || len(exist) == 0 {
		return cluster.Classify(err)
	}
	ids := make([]string, len(exist))
	for i, r := range exist {
		ids[i] = cluster.Ident(r)
	}
	if ok, err := cluster.DatabaseExists(ctx, admin, t.Database); err != nil {
		return err
	} else if ok {
		pool, err := cl.Pool(ctx, t.Database)
		if err != nil {
			return err
		}
		if err := cluster.ExecLockBounded(ctx, pool, loginLockTimeout, "DROP OWNED BY "+strings.Join(ids, ", ")); err != nil {
			return fmt.Errorf("drop the grants of %s in %s: %w", strings.Join(exist, ", "), t.Database, err)
		}
	}
	return cluster.DropRoles(ctx, admin, exist...)
}

// lockLogin locks tenant id's row and returns it with its login name.
func (s *Service) lockLogin(ctx context.Context, tx pgx.Tx, id, name string) (catalog.Tenant, catalog.Login, error) {
	if !tenant.ValidID(id) {
		return catalog.Tenant{}, catalog.Login{}, fmt.Errorf("tenant %q: %w", id, catalog.ErrNotFound)
	}
	t, err := s.Store.LockTenant(ctx, tx, id)
	if err != nil {
		return t, catalog.Login{}, err
	}
	if t.IsSpare() {
		return t, catalog.Login{}, fmt.Errorf("tenant %q: %w", id, catalog.ErrNotFound)
	}
	l, err := s.Store.GetLogin(ctx, tx, id, name)
	return t, l, err
}
