package analytics

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pgtenant/pgtenant/internal/catalog"
	"github.com/pgtenant/pgtenant/internal/cluster"
	"github.com/pgtenant/pgtenant/internal/tenant"
)

// What one analytics session may hold: the port refuses past these, with
// an error to the tenant, a log line and pgtenant_analytics_refusals_total,
// rather than grow. A session of a tenant takes a slot of the tenant's
// connection limit too (admit).
const (
	// maxMessage bounds a message's body (a query's text, a Bind's
	// parameters); a longer one ends the session (its bytes are not read).
	maxMessage = 1 << 20
	// maxStatements bounds a session's named prepared statements (pgx
	// caches up to 512 per connection).
	maxStatements = 1000
	// maxPortals bounds a session's named portals.
	maxPortals = 100
	// maxHeld bounds what a session keeps between messages: its
	// statements' text and its portals' parameters.
	maxHeld = 16 << 20
)

// Reasons of refusals, the label of pgtenant_analytics_refusals_total.
const (
	refusedMessage    = "message_size"
	refusedStatements = "statements"
	refusedPortals    = "portals"
	refusedHeld       = "session_memory"
	refusedSessions   = "sessions"
	refusedLifecycle  = "lifecycle"
)

// login is a tenant's authenticated session, to be served here.
type login struct {
	id string
	// credential fingerprints the role's verifier the session logged in
	// against (a rotation makes a new one, even for the same password: a
	// new salt).
	credential string
	// limit is the role's connection limit, the tier's connection_limit as
	// applied to it (-1: none).
	limit int
	at    time.Time
}

// admit counts a session of the tenant in its connection limit, on this
// daemon: a tenant's sessions are all served by its mirror's owner (the
// others forward them there), so the limit holds across the fleet except
// for a moment while the mirror changes owner. release uncounts it.
func (s *Service) admit(ss *sqlSession) (release func(), err error) {
	s.sessMu.Lock()
	defer s.sessMu.Unlock()
	if s.sessions == nil {
		s.sessions = map[string]map[*sqlSession]bool{}
	}
	open := s.sessions[ss.id]
	if ss.limit >= 0 && len(open) >= ss.limit {
		s.refused(refusedSessions, ss.id, "connection limit", ss.limit)
		return nil, &pgError{"53300", fmt.Sprintf("too many analytics sessions for tenant %s: its connection limit is %d (counted by the daemon serving its mirror)", ss.id, ss.limit)}
	}
	if open == nil {
		open = map[*sqlSession]bool{}
		s.sessions[ss.id] = open
	}
	open[ss] = true
	return func() {
		s.sessMu.Lock()
		defer s.sessMu.Unlock()
		delete(s.sessions[ss.id], ss)
		if len(s.sessions[ss.id]) == 0 {
			delete(s.sessions, ss.id)
		}
	}, nil
}

// refused counts a refusal and logs it.
func (s *Service) refused(reason, id string, what string, limit int) {
	if s.refusals != nil {
		s.refusals.WithLabelValues(reason).Inc()
	}
	s.Logger.Warn("analytics session refused", "tenant", id, "reason", reason, "what", what, "limit", limit)
}

// fingerprint identifies a verifier without keeping it.
func fingerprint(rolpassword string) string {
	h := sha256.Sum256([]byte(rolpassword))
	return hex.EncodeToString(h[:8])
}

// standing is a tenant as its sessions are checked against: its state in
// the catalog, its role's verifier and login right on its cluster.
type standing struct {
	state      catalog.TenantState
	credential string
	canLogin   bool
}

// standings reads the standing of tenants: one catalog query, then one
// query per cluster. A tenant missing from the answer is gone.
func (s *Service) standings(ctx context.Context, ids []string) (map[string]standing, error) {
	rows, err := s.Store.Pool().Query(ctx, `SELECT id, state, cluster FROM tenants WHERE id = ANY($1)`, ids)
	if err != nil {
		return nil, fmt.Errorf("read tenants' states: %w", err)
	}
	out := map[string]standing{}
	roles := map[string][]string{} // cluster → roles
	var id, state, cl string
	_, err = pgx.ForEachRow(rows, []any{&id, &state, &cl}, func() error {
		out[id] = standing{state: catalog.TenantState(state)}
		roles[cl] = append(roles[cl], tenant.PhysicalName(id))
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("read tenants' states: %w", err)
	}
	for name, names := range roles {
		c, err := s.Clusters.Get(name)
		if err != nil {
			return nil, err
		}
		admin, err := c.Admin(ctx)
		if err != nil {
			return nil, err
		}
		rows, err := admin.Query(ctx, `SELECT rolname::text, coalesce(rolpassword, ''), rolcanlogin AND (rolvaliduntil IS NULL OR rolvaliduntil > now())
			FROM pg_catalog.pg_authid WHERE rolname = ANY($1)`, names)
		if err != nil {
			return nil, fmt.Errorf("read roles of %s: %w", name, cluster.Classify(err))
		}
		var role, pw string
		var canLogin bool
		_, err = pgx.ForEachRow(rows, []any{&role, &pw, &canLogin}, func() error {
			id := role[len(tenant.Prefix):]
			st := out[id]
			st.credential, st.canLogin = fingerprint(pw), canLogin
			out[id] = st
			return nil
		})
		if err != nil {
			return nil, fmt.Errorf("read roles of %s: %w", name, cluster.Classify(err))
		}
	}
	return out, nil
}

// verdict is why a session of a tenant in standing st must end (nil: it
// goes on). A rotation with --keep-sessions keeps it, as it keeps the
// tenant's other sessions: the session takes the new verifier.
func (s *Service) verdict(ctx context.Context, ss *sqlSession, st standing, found bool) (*pgError, error) {
	switch {
	case !found || st.state == catalog.StateDropped || st.state == catalog.StatePurging || st.state == catalog.StatePurged:
		return &pgError{"57P01", fmt.Sprintf("terminating analytics session: tenant %s was dropped", ss.id)}, nil
	case st.state != catalog.StateActive:
		return &pgError{"57P01", fmt.Sprintf("terminating analytics session: tenant %s is %s", ss.id, st.state)}, nil
	case !st.canLogin:
		return &pgError{"57P01", fmt.Sprintf("terminating analytics session: tenant %s can no longer log in", ss.id)}, nil
	case st.credential == ss.credential.Load().(string):
		return nil, nil
	}
	var keep bool
	err := s.Store.Pool().QueryRow(ctx, `SELECT coalesce((detail->>'keep_sessions')::bool, false) FROM tenant_events
		WHERE tenant = $1 AND kind = 'password_rotated' AND at >= $2 ORDER BY at DESC, id DESC LIMIT 1`, ss.id, ss.at).Scan(&keep)
	if err != nil && !errors.Is(err, pgx.ErrNoRows) {
		return nil, fmt.Errorf("read the tenant's rotations: %w", err)
	}
	if keep {
		ss.credential.Store(st.credential)
		return nil, nil
	}
	return &pgError{"57P01", fmt.Sprintf("terminating analytics session: the password of tenant %s was changed", ss.id)}, nil
}

// recheck is a session's check before a statement: the tenant is still
// active and its credential the one the session logged in with. A verdict
// ends the session; an error (the catalog or the cluster did not answer)
// fails the statement only.
func (ss *sqlSession) recheck(ctx context.Context) (*pgError, error) {
	all, err := ss.s.standings(ctx, []string{ss.id})
	if err != nil {
		return nil, err
	}
	st, found := all[ss.id]
	return ss.s.verdict(ctx, ss, st, found)
}

// sweep checks every open session of this daemon against its tenant's
// standing (sessions that send nothing are checked too) and ends those a
// lifecycle change ended: one catalog query for all of them, one per
// cluster for their roles.
func (s *Service) sweep(ctx context.Context) {
	s.sessMu.Lock()
	var ids []string
	var open []*sqlSession
	for id, m := range s.sessions {
		ids = append(ids, id)
		for ss := range m {
			open = append(open, ss)
		}
	}
	s.sessMu.Unlock()
	if len(open) == 0 {
		return
	}
	all, err := s.standings(ctx, ids)
	if err != nil {
		if ctx.Err() == nil {
			s.Logger.Warn("analytics sessions: read the tenants' standing", "err", err)
		}
		return
	}
	for _, ss := range open {
		st, found := all[ss.id]
		v, err := s.verdict(ctx, ss, st, found)
		if err != nil {
			s.Logger.Warn("analytics sessions: check a session", "tenant", ss.id, "err", err)
			continue
		}
		if v != nil {
			ss.end(v)
		}
	}
}

// sessionState is what another goroutine may do to a session: end it.
type sessionState struct {
	ended   atomic.Pointer[pgError]
	endOnce sync.Once
	stop    func() // cancels its statement and unblocks its read
}

// end makes the session end with err (FATAL) as soon as it can: at once
// when it waits for a message, after cancelling its statement otherwise.
func (ss *sqlSession) end(err *pgError) {
	ss.ended.CompareAndSwap(nil, err)
	ss.endOnce.Do(func() {
		if ss.s.refusals != nil {
			ss.s.refusals.WithLabelValues(refusedLifecycle).Inc()
		}
		ss.s.Logger.Info("analytics session ended", "tenant", ss.id, "reason", err.msg)
		ss.stop()
	})
}
