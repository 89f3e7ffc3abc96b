package credentials

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pgtenant/pgtenant/internal/catalog"
	"github.com/pgtenant/pgtenant/internal/cluster"
	"github.com/pgtenant/pgtenant/internal/purge"
	"github.com/pgtenant/pgtenant/internal/tenant"
)

// Rotated is the answer to Rotate.
type Rotated struct {
	Tenant   catalog.Tenant
	DSN      string // with the new password; the pooler's when the cluster has one
	Direct   string // the primary's, with the new password
	Password string
	// SessionsEnded counts the tenant's sessions ended, on every node (0
	// with keepSessions).
	SessionsEnded int
	// Note says what did not go as it should on a standby: the old
	// password may work there until it replays.
	Note string
}

// setPasswordLockTimeout bounds ALTER ROLE's wait for the role's row, which
// a tenant holds with its own uncommitted ALTER ROLE.
const setPasswordLockTimeout = 3 * time.Second

// rotateTimeout bounds a whole rotation: the attempts on the primary and
// the wait for each standby's replay (purge.ReplayWait).
const rotateTimeout = time.Minute

// setPasswordAttempts: each attempt ends the tenant's sessions first, unless
// they are kept, then waits at most setPasswordLockTimeout.
const setPasswordAttempts = 3

// Rotate gives a tenant a new password: a new SCRAM verifier on its role
// (only the verifier reaches PostgreSQL), so that the old password stops
// working at once on the primary and, once they have replayed (waited for,
// bounded), on the standbys. Its sessions are ended on every node unless
// keepSessions (sessions authenticated already; only new logins need the
// new password). A kept password (retry window) is replaced by the new one,
// so that a retried create never answers with a password that no longer
// works; its expiry stays. Active and suspended tenants can be rotated
// (suspended: the role stays NOLOGIN); the others are a conflict.
//
// Every call makes a new password and retires the previous one: a client
// whose answer was lost rotates again.
func (s *Service) Rotate(ctx context.Context, id string, keepSessions bool) (Rotated, error) {
	if !tenant.ValidID(id) {
		return Rotated{}, fmt.Errorf("tenant %q: %w", id, catalog.ErrNotFound)
	}
	// Once begun, a rotation finishes even if its caller goes away: a
	// password changed on the primary with the catalog left behind would
	// leave a retried create answering with the old one.
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), rotateTimeout)
	defer cancel()
	password, verifier := tenant.NewPassword()
	var out Rotated
	var cl *cluster.Cluster
	err := pgx.BeginFunc(ctx, s.Store.Pool(), func(tx pgx.Tx) error {
		t, err := s.Store.LockTenant(ctx, tx, id)
		if err != nil {
			return err
		}
		if err := rotatable(t); err != nil {
			return err
		}
		if cl, err = s.Clusters.Get(t.Cluster); err != nil {
			return err
		}
		role := tenant.PhysicalName(t.ID)
		n, err := setPassword(ctx, cl, role, verifier, keepSessions)
		if err != nil {
			return err
		}
		if s.keeping() {
			sealed, err := s.Key.Seal(t.ID, password)
			if err != nil {
				return fmt.Errorf("seal the password of tenant %s: %w", t.ID, err)
			}
			if _, err := s.Store.ReplaceCredential(ctx, tx, catalog.Credential{Tenant: t.ID, KeyID: s.Key.ID(), Sealed: sealed}, s.Window); err != nil {
				return fmt.Errorf("replace the kept password of tenant %s: %w", t.ID, err)
			}
		}
		if err := s.Store.AddEvent(ctx, tx, t.ID, "password_rotated", map[string]any{"keep_sessions": keepSessions}); err != nil {
			return err
		}
		out = Rotated{Tenant: t, Password: password, SessionsEnded: n}
		out.DSN, out.Direct = s.Poolers.DSNs(cl, t, password)
		return nil
	})
	if err != nil {
		return Rotated{}, err
	}
	// The primary has the new password: from here on the answer carries
	// it, whatever the standbys say (rotating again is the only way back
	// in for a client that does not get it). The pooler takes the new
	// verifier before the answer, so that the new password works there
	// at once.
	s.Poolers.Sync(ctx, out.Tenant.FrontCluster(), "password "+id)
	n, late, err := purge.OnStandbys(ctx, cl, !keepSessions, tenant.PhysicalName(id))
	out.SessionsEnded += n
	switch {
	case err != nil:
		s.Logger.Warn("password rotated on the primary; a standby failed", "tenant", id, "cluster", cl.Name(), "err", err)
		out.Note = fmt.Sprintf("a standby failed (%v): the old password works there until it replays the change", err)
	case len(late) > 0:
		out.Note = fmt.Sprintf("standby %s had not replayed the change within %s: the old password works there until it does", strings.Join(late, ", "), purge.ReplayWait)
	}
	return out, nil
}

// rotatable refuses the tenants whose password cannot, or need not, change.
func rotatable(t catalog.Tenant) error {
	switch t.State {
	case catalog.StateActive, catalog.StateSuspended:
		return nil
	case catalog.StateBuilding, catalog.StateSpare:
		return fmt.Errorf("tenant %q: %w", t.ID, catalog.ErrNotFound) // spares are invisible
	case catalog.StateProvisioning:
		return fmt.Errorf("%w: tenant %s is still being provisioned and gets its password when the build finishes (`pgtenant job list --target %s`); rotate it then",
			catalog.ErrConflict, t.ID, t.ID)
	case catalog.StateDropped:
		return fmt.Errorf("%w: tenant %s is dropped and cannot log in; restore it first (`pgtenant tenant restore %s`), then rotate its password",
			catalog.ErrConflict, t.ID, t.ID)
	}
	return fmt.Errorf("%w: tenant %s is %s: it is being removed, there is no password to rotate", catalog.ErrConflict, t.ID, t.State)
}

// setPassword sets a role's password to verifier on the primary and
// returns the sessions it ended: before each attempt (a tenant's open
// transaction that changed its own role holds the row ALTER ROLE waits
// for) and after (sessions that logged in with the old password
// meanwhile), unless keep. With keep, a held row is a conflict at once.
func setPassword(ctx context.Context, cl *cluster.Cluster, role, verifier string, keep bool) (int, error) {
	admin, err := cl.Admin(ctx)
	if err != nil {
		return 0, err
	}
	alter := fmt.Sprintf("ALTER ROLE %s PASSWORD %s", cluster.Ident(role), cluster.Literal(verifier))
	ended := 0
	for attempt := 1; ; attempt++ {
		if !keep {
			n, err := purge.EndSessions(ctx, cl, role)
			if err != nil {
				return ended, err
			}
			ended += n
		}
		err := cluster.ExecLockBounded(ctx, admin, setPasswordLockTimeout, alter)
		if err == nil {
			break
		}
		if !errors.Is(err, cluster.ErrLockNotAvailable) {
			return ended, fmt.Errorf("set the password of role %s: %w", role, err)
		}
		if keep {
			return ended, fmt.Errorf("%w: a session of the tenant holds its role (an uncommitted ALTER ROLE of its own) and its sessions are kept; "+
				"rotate without --keep-sessions to end them, or once that transaction has ended", catalog.ErrConflict)
		}
		if attempt == setPasswordAttempts { // it logged in again and took the row before us, every time
			return ended, fmt.Errorf("%w: the tenant's sessions took its role's row (an ALTER ROLE of their own) before each of %d attempts; rotate again",
				catalog.ErrConflict, setPasswordAttempts)
		}
	}
	if !keep {
		n, err := purge.EndSessions(ctx, cl, role) // logged in with the old password meanwhile
		if err != nil {
			return ended, err
		}
		ended += n
	}
	return ended, nil
}
