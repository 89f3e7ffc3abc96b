// Package credentials owns tenants' passwords once they are made: the
// sealed copy a create with an external id keeps for the retry window
// (credentials.retry_window), so that a retried create whose answer was
// lost gets the same password; its deletion when the window ends; and
// rotation (`pgtenant tenant password`). Passwords are sealed with the
// operator's key (AES-256-GCM, key.go) before they reach the catalog; only
// SCRAM verifiers reach PostgreSQL; a password is never logged. It does not
// create tenants (internal/provision) nor lock them out (internal/purge).
package credentials

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pgtenant/pgtenant/internal/background"
	"github.com/pgtenant/pgtenant/internal/catalog"
	"github.com/pgtenant/pgtenant/internal/cluster"
	"github.com/pgtenant/pgtenant/internal/config"
	"github.com/pgtenant/pgtenant/internal/pooler"
	"github.com/pgtenant/pgtenant/internal/tenant"
)

// Service keeps, recalls and rotates tenants' passwords.
type Service struct {
	Store    *catalog.Store
	Clusters *cluster.Registry
	// Key seals kept passwords; nil when Window is 0.
	Key *Key
	// Window is credentials.retry_window: how long a kept password can be
	// recalled (0: none is kept).
	Window time.Duration
	Logger *slog.Logger
	// Poolers get a rotated password's verifier before Rotate answers.
	Poolers *pooler.Set
	// Tiers hold a tenant's extra logins to its tier (logins.go).
	Tiers map[string]config.Tier
}

// Errors of Recall.
var (
	// ErrNotKept: no password is kept for the tenant (created without an
	// external id, before its window, or with keeping off), or its window
	// has ended.
	ErrNotKept = errors.New("password not kept")
	// ErrCannotOpen: a password is kept but this daemon cannot open it
	// (another daemon's key, or an altered row).
	ErrCannotOpen = errors.New("the kept password does not open with this daemon's credentials key")
)

// keeping says whether passwords are kept at all.
func (s *Service) keeping() bool { return s != nil && s.Window > 0 && s.Key != nil }

// Keep seals a new tenant's password into the catalog in q (the
// transaction that creates the tenant, so that the tenant never exists
// without it) for the retry window. Nothing is kept with keeping off.
func (s *Service) Keep(ctx context.Context, q catalog.Querier, tenantID, password string) error {
	if !s.keeping() {
		return nil
	}
	sealed, err := s.Key.Seal(tenantID, password)
	if err != nil {
		return fmt.Errorf("seal the password of tenant %s: %w", tenantID, err)
	}
	if err := s.Store.InsertCredential(ctx, q, catalog.Credential{Tenant: tenantID, KeyID: s.Key.ID(), Sealed: sealed}, s.Window); err != nil {
		return fmt.Errorf("keep the password of tenant %s: %w", tenantID, err)
	}
	return nil
}

// Recall returns a tenant's kept password: ErrNotKept when there is none
// (one whose window has ended is deleted now rather than at the next
// sweep), ErrCannotOpen with what to do when this daemon cannot open it.
func (s *Service) Recall(ctx context.Context, tenantID string) (string, error) {
	if !s.keeping() {
		return "", fmt.Errorf("%w: credentials.retry_window is 0", ErrNotKept)
	}
	c, err := s.Store.GetCredential(ctx, tenantID, s.Window)
	if errors.Is(err, catalog.ErrNotFound) {
		if _, err := s.Store.DeleteExpiredCredentials(ctx, tenantID, s.Window); err != nil {
			return "", fmt.Errorf("delete the expired password of tenant %s: %w", tenantID, err)
		}
		return "", fmt.Errorf("%w: passwords are kept for credentials.retry_window (%s) after the create", ErrNotKept, s.Window)
	}
	if err != nil {
		return "", err
	}
	if c.KeyID != s.Key.ID() {
		return "", fmt.Errorf("%w: it was sealed by a daemon with key %s, this daemon has key %s; every daemon of a catalog needs the same credentials.key_file",
			ErrCannotOpen, c.KeyID, s.Key.ID())
	}
	password, err := s.Key.Open(tenantID, c.Sealed)
	if err != nil {
		return "", fmt.Errorf("%w: its row in the catalog was altered, or copied from another tenant's", ErrCannotOpen)
	}
	return password, nil
}

// OtherKeys lists the ids of keys other than this daemon's that sealed
// live kept passwords: daemons of the catalog that do not share the key.
func (s *Service) OtherKeys(ctx context.Context) ([]string, error) {
	if !s.keeping() {
		return nil, nil
	}
	ids, err := s.Store.CredentialKeyIDs(ctx, s.Window)
	if err != nil {
		return nil, fmt.Errorf("credentials keys in the catalog: %w", err)
	}
	return slices.DeleteFunc(ids, func(id string) bool { return id == s.Key.ID() }), nil
}

// Sweep deletes every kept password whose window has ended (all of them
// with keeping off).
func (s *Service) Sweep(ctx context.Context) (int64, error) {
	n, err := s.Store.DeleteExpiredCredentials(ctx, "", s.Window)
	if err != nil {
		return 0, fmt.Errorf("delete expired passwords: %w", err)
	}
	return n, nil
}

// SweepInterval is how often Run sweeps: every minute, or every window
// when that is shorter, so that a password outlives its window by at most
// that long.
func (s *Service) SweepInterval() time.Duration {
	if s.Window > 0 && s.Window < time.Minute {
		return s.Window
	}
	return time.Minute
}

// Run sweeps every SweepInterval until ctx is done.
func (s *Service) Run(ctx context.Context) error {
	log := s.Logger.With("component", "credentials")
	background.Every(ctx, s.SweepInterval(), func(ctx context.Context) {
		n, err := s.Sweep(ctx)
		if err != nil && ctx.Err() == nil {
			log.Warn("sweep of expired passwords failed", "err", err)
		}
		if n > 0 {
			log.Debug("deleted kept passwords whose retry window ended", "passwords", n)
		}
	})
	return nil
}

// spareAAD is what a spare's sealed password is bound to: its tenant, and
// that it is a spare's (it opens nowhere else).
func spareAAD(tenantID string) string { return "spare/" + tenantID }

// SealSpare makes the password a spare will be claimed with and records it
// sealed on the spare's row; it returns the verifier for the spare's role.
// ok is false when this daemon has no credentials key: the claim then
// makes the password (and waits for the front door's sync).
func (s *Service) SealSpare(ctx context.Context, tenantID string) (verifier string, ok bool, err error) {
	if s == nil || s.Key == nil {
		return "", false, nil
	}
	password, verifier := tenant.NewPassword()
	sealed, err := s.Key.Seal(spareAAD(tenantID), password)
	if err != nil {
		return "", false, fmt.Errorf("seal the password of spare %s: %w", tenantID, err)
	}
	if err := s.Store.SetSparePassword(ctx, tenantID, s.Key.ID(), sealed); err != nil {
		return "", false, fmt.Errorf("record the password of spare %s: %w", tenantID, err)
	}
	return verifier, true, nil
}

// TakeSpare returns the password of a spare claimed in tx, clearing it from
// the row; ok is false when there is none this daemon can open (built
// without a key, before, or sealed by another key): the claim makes one.
func (s *Service) TakeSpare(ctx context.Context, tx pgx.Tx, tenantID string) (password string, ok bool, err error) {
	if s == nil {
		return "", false, nil
	}
	keyID, sealed, err := s.Store.TakeSparePassword(ctx, tx, tenantID)
	if errors.Is(err, catalog.ErrNotFound) {
		return "", false, nil
	}
	if err != nil {
		return "", false, err
	}
	if s.Key == nil || keyID != s.Key.ID() {
		return "", false, nil
	}
	if password, err = s.Key.Open(spareAAD(tenantID), sealed); err != nil {
		if s.Logger != nil {
			s.Logger.Warn("a spare's sealed password does not open: its claim makes a new one", "tenant", tenantID)
		}
		return "", false, nil
	}
	return password, true, nil
}
