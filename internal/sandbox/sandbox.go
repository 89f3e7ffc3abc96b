// Package sandbox opens the only sessions in which pgtenant runs SQL inside
// a tenant: sessions authenticated as the tenant's agent role
// (tenant.AgentRole), a login role that is a member of the tenant's role
// and of nothing else, and whose password only the control plane can derive.
//
// Why not an admin session with SET ROLE: the permission of SET ROLE, RESET
// ROLE and SET SESSION AUTHORIZATION is checked against the session user. In
// a superuser session, any tenant function that runs (a trigger, a default,
// an index expression, a cast, an operator, a deferred constraint trigger
// at COMMIT) can RESET ROLE and act as the superuser. In an agent session
// the session user is the agent: whatever tenant code does, it cannot get
// more than the tenant's own rights (docs/SECURITY.md, "Tenant sessions").
//
// Every path that runs SQL where tenant code may execute (rollouts) takes a
// *Session from here; the type is what keeps an admin connection out of
// those paths. This package owns the agent roles' creation and passwords; it
// never opens an admin session in a tenant's database.
package sandbox

import (
	"context"
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"sync"

	"github.com/jackc/pgx/v5"

	"github.com/pgtenant/pgtenant/internal/catalog"
	"github.com/pgtenant/pgtenant/internal/cluster"
	"github.com/pgtenant/pgtenant/internal/templates"
	"github.com/pgtenant/pgtenant/internal/tenant"
)

// secretName is the catalog secret agent passwords are derived from.
const secretName = "agent-password"

// agentConnectionLimit bounds an agent's sessions: a rollout uses one per
// tenant, a daemon that lost its lease at most one more.
const agentConnectionLimit = 3

// Agents creates agent roles and opens sessions as them.
type Agents struct {
	Store *catalog.Store

	mu     sync.Mutex
	secret []byte
}

// Target is the tenant a session is for.
type Target struct {
	ID       string
	Mode     tenant.Mode
	Database string // its database, or its template's shared database
	Template string
}

// TargetOf is the Target of a catalog tenant.
func TargetOf(t catalog.Tenant) Target {
	return Target{ID: t.ID, Mode: t.Mode, Database: t.Database, Template: t.Template}
}

// password derives an agent's password from the catalog's secret: every
// daemon of the catalog computes the same, and nothing stores it.
func (a *Agents) password(ctx context.Context, id string) (string, error) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.secret == nil {
		s, err := a.Store.Secret(ctx, secretName)
		if err != nil {
			return "", err
		}
		a.secret = s
	}
	m := hmac.New(sha256.New, a.secret)
	m.Write([]byte("agent/" + id))
	return hex.EncodeToString(m.Sum(nil)), nil
}

// EnsureRole creates the tenant's agent role (or, existing, gives it back
// LOGIN, its connection limit and its password, which tenant code running
// in an agent session may have changed) and makes it a member of the
// tenant's role. It runs in the maintenance database; grants on the
// tenant's database are GrantConnect's.
func (a *Agents) EnsureRole(ctx context.Context, admin cluster.Execer, id string) error {
	pw, err := a.password(ctx, id)
	if err != nil {
		return err
	}
	salt := make([]byte, 16)
	_, _ = rand.Read(salt)
	agent, role := cluster.Ident(tenant.AgentRole(id)), cluster.Ident(tenant.PhysicalName(id))
	// Only the verifier travels: the password is never in a log or in
	// pg_stat_activity. NOINHERIT is not used: the agent needs the tenant's
	// rights to write its marker outside SET ROLE.
	_, err = admin.Exec(ctx, fmt.Sprintf(`DO $$ BEGIN
			IF NOT EXISTS (SELECT 1 FROM pg_catalog.pg_roles WHERE rolname = %[3]s) THEN
				CREATE ROLE %[1]s;
			END IF;
		END $$;
		ALTER ROLE %[1]s WITH LOGIN INHERIT NOSUPERUSER NOCREATEDB NOCREATEROLE NOREPLICATION NOBYPASSRLS
			CONNECTION LIMIT %[4]d PASSWORD %[5]s;
		ALTER ROLE %[1]s RESET ALL;
		GRANT %[2]s TO %[1]s`,
		agent, role, cluster.Literal(tenant.AgentRole(id)), agentConnectionLimit,
		cluster.Literal(tenant.SCRAMVerifier(pw, salt, 4096))))
	if err != nil {
		return fmt.Errorf("agent role of tenant %s: %w", id, cluster.Classify(err))
	}
	return nil
}

// GrantConnect lets the agent connect to the tenant's database: its own
// database, or the shared one (under that database's lock:
// templates.ConnectSQL).
func GrantConnect(ctx context.Context, admin cluster.Execer, t Target) error {
	agent := tenant.AgentRole(t.ID)
	sql := "GRANT CONNECT ON DATABASE " + cluster.Ident(t.Database) + " TO " + cluster.Ident(agent)
	if t.Mode == tenant.ModeSchema {
		sql = templates.ConnectSQL(true, t.Template, agent)
	}
	if _, err := admin.Exec(ctx, sql); err != nil {
		return fmt.Errorf("let the agent of tenant %s connect: %w", t.ID, cluster.Classify(err))
	}
	return nil
}

// Session is a connection authenticated as a tenant's agent. Tenant code
// that runs in it has at most the tenant's rights.
type Session struct {
	conn   *pgx.Conn
	Tenant string
}

// Conn is the session's connection.
func (s *Session) Conn() *pgx.Conn { return s.conn }

// Close ends the session.
func (s *Session) Close(ctx context.Context) error { return s.conn.Close(ctx) }

// Open starts a session as the tenant's agent on the primary of cl. An agent
// that cannot log in (a tenant built before agents, a password changed from
// inside an agent session, a role dropped by hand) is repaired once with an
// admin session in the maintenance database, never in the tenant's.
func (a *Agents) Open(ctx context.Context, cl *cluster.Cluster, t Target, application string) (*Session, error) {
	pw, err := a.password(ctx, t.ID)
	if err != nil {
		return nil, err
	}
	agent := tenant.AgentRole(t.ID)
	conn, err := cl.ConnectAs(ctx, t.Database, agent, pw, application)
	if errors.Is(err, cluster.ErrAuthFailed) {
		if rerr := a.repair(ctx, cl, t); rerr != nil {
			return nil, fmt.Errorf("%w (repairing the agent role: %v)", err, rerr)
		}
		conn, err = cl.ConnectAs(ctx, t.Database, agent, pw, application)
	}
	if err != nil {
		return nil, err
	}
	return &Session{conn: conn, Tenant: t.ID}, nil
}

func (a *Agents) repair(ctx context.Context, cl *cluster.Cluster, t Target) error {
	admin, err := cl.Admin(ctx)
	if err != nil {
		return err
	}
	var exists bool
	if err := admin.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM pg_catalog.pg_roles WHERE rolname = $1)`,
		tenant.PhysicalName(t.ID)).Scan(&exists); err != nil {
		return cluster.Classify(err)
	}
	if !exists {
		return fmt.Errorf("tenant %s has no role on cluster %s: %w", t.ID, cl.Name(), cluster.ErrNotFound)
	}
	if err := a.EnsureRole(ctx, admin, t.ID); err != nil {
		return err
	}
	return GrantConnect(ctx, admin, t)
}
