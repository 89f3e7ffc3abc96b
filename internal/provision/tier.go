package provision

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pgtenant/pgtenant/internal/catalog"
	"github.com/pgtenant/pgtenant/internal/cluster"
	"github.com/pgtenant/pgtenant/internal/jobs"
	"github.com/pgtenant/pgtenant/internal/purge"
	"github.com/pgtenant/pgtenant/internal/tenant"
)

// EventTierChanged is the tenant event of a tier change (in place, or at
// the switch of the move that carried it).
const EventTierChanged = "tier_changed"

// TierChange is what SetTier (or SetPins) did, or what is left to do.
type TierChange struct {
	Tenant catalog.Tenant // after an in-place change; as it is when a move must carry the change
	From   string         // the tier it had
	// MoveTo is set when the tenant's cluster does not admit a tenant of
	// the new tier (Why says why) and placement chose this cluster: the
	// caller starts the move (move.Service.StartTierChange), whose switch
	// records the new tier. "" when the change was made in place.
	MoveTo, Why string
	// SessionsEnded: sessions of the tenant that held its role's row (an
	// uncommitted ALTER ROLE of their own) and were ended so that the
	// new limits could be set.
	SessionsEnded int
}

// tierLockTimeout bounds each attempt's wait for the tenant's role row;
// tierAttempts attempts are made, the tenant's sessions ended before each
// one after the first.
const (
	tierLockTimeout = 3 * time.Second
	tierAttempts    = 3
	tierTimeout     = time.Minute
)

// SetTier changes a tenant's tier. When its cluster admits a tenant of the
// new tier (the tier's placement: dedicated, cluster_label; and its
// connections), the change is made in place: the role's connection limit
// and settings (TierSQL), then the catalog, then the pooler entry (pool
// mode and sizes); the capper and the storage quota read the tier from the
// catalog on their next pass. Otherwise it chooses the cluster to move the
// tenant to and leaves the move to the caller. The same tier again changes
// nothing.
func (s *Service) SetTier(ctx context.Context, id, tierName string) (TierChange, error) {
	if !tenant.ValidID(id) {
		return TierChange{}, fmt.Errorf("tenant %q: %w", id, catalog.ErrNotFound)
	}
	if _, ok := s.Tiers[tierName]; !ok {
		names := make([]string, 0, len(s.Tiers))
		for n := range s.Tiers {
			names = append(names, n)
		}
		slices.Sort(names)
		return TierChange{}, invalid("tier %q is not configured; the tiers are %s (config: tiers)", tierName, strings.Join(names, ", "))
	}
	// Once begun, the change finishes even if its caller goes away.
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), tierTimeout)
	defer cancel()
	t, err := s.Store.GetTenant(ctx, nil, id)
	if err != nil {
		return TierChange{}, err
	}
	if err := t.Changeable("set its tier"); err != nil {
		return TierChange{}, err
	}
	out := TierChange{Tenant: t, From: t.Tier}
	if t.Tier == tierName {
		return out, nil
	}
	moving, err := jobs.Unfinished(ctx, s.Store.Pool(), jobs.TenantMove, id)
	if err != nil {
		return TierChange{}, err
	}
	if moving {
		return TierChange{}, fmt.Errorf("%w: tenant %s is moving (`pgtenant job list --target %s`); change its tier once the move is done",
			catalog.ErrConflict, id, id)
	}
	if out.Why, out.MoveTo, err = s.placementFor(ctx, t, tierName, t.Pins, "tier "+tierName); err != nil || out.MoveTo != "" {
		return out, err
	}
	cl, err := s.Clusters.Get(t.Cluster)
	if err != nil {
		return TierChange{}, err
	}
	if out.SessionsEnded, err = s.alterTier(ctx, cl, t, tierName); err != nil {
		return TierChange{}, err
	}
	out.Tenant, err = s.recordChange(ctx, id, func(tx pgx.Tx) error {
		locked, err := s.Store.LockTenant(ctx, tx, id)
		if err != nil {
			return err
		}
		if locked.Cluster != t.Cluster {
			return fmt.Errorf("%w: tenant %s moved to %s meanwhile; set its tier again", catalog.ErrConflict, id, locked.Cluster)
		}
		return s.Store.SetTenantTier(ctx, tx, id, tierName)
	}, EventTierChanged, map[string]any{"from": t.Tier, "to": tierName, "in_place": true, "sessions_ended": out.SessionsEnded})
	if err != nil {
		return TierChange{}, err
	}
	s.Invalidate()
	s.Poolers.Sync(ctx, t.FrontCluster(), "tier "+id)
	s.Logger.Info("tenant tier changed in place", "tenant", id, "from", t.Tier, "to", tierName, "sessions_ended", out.SessionsEnded)
	return out, nil
}

// placementFor says whether tenant t may stay on its cluster with tier
// tierName and pins: "" when it may; else why not, and the cluster
// placement chooses for it among the others. what names the change for
// errors ("tier gold", "labels region=eu").
func (s *Service) placementFor(ctx context.Context, t catalog.Tenant, tierName string, pins []string, what string) (why, to string, err error) {
	fleet, err := s.LoadFleet(ctx)
	if err != nil {
		return "", "", err
	}
	var size int64
	sized, err := s.Store.SizedTenants(ctx, t.Cluster)
	if err != nil {
		return "", "", err
	}
	for _, st := range sized {
		if st.ID == t.ID {
			size = st.SizeBytes
		}
	}
	// The cluster as it would be without the tenant: it is there already,
	// so the caps and a drain do not count, its placement policy does.
	fleet.Add(t.Cluster, t.Tier, size, -1)
	here := slices.IndexFunc(fleet.Candidates(tierName), func(c tenant.Candidate) bool { return c.Name == t.Cluster })
	if here < 0 {
		return "", "", fmt.Errorf("%w: cluster %s did not answer; set the %s again once it does", cluster.ErrUnavailable, t.Cluster, what)
	}
	cand := fleet.Candidates(tierName)[here]
	cand.Draining, cand.MaxTenants, cand.MaxSizeBytes = false, 0, 0
	if why = tenant.Refusal(cand, fleet.Need(tierName, pins, size)); why == "" {
		return "", "", nil
	}
	if t.State != catalog.StateActive {
		return "", "", fmt.Errorf("%w: %s needs another cluster than %s (%s) and only active tenants move: resume tenant %s first (`pgtenant tenant resume %s`)",
			catalog.ErrConflict, what, t.Cluster, why, t.ID, t.ID)
	}
	to, err = fleet.Place("", tierName, pins, size, t.Cluster)
	if err != nil {
		return "", "", fmt.Errorf("%s needs another cluster than %s (%s), and none other admits it: %w", what, t.Cluster, why, err)
	}
	return why, to, nil
}

// alterTier sets the tier's limits on the tenant's roles (and its list of
// extensions on its database), each attempt bounded: a session of the
// tenant holding its role's row (an uncommitted ALTER ROLE of its own, to
// keep its limits) is ended before the next attempt, so that a downgrade
// cannot be held off by the tenant.
func (s *Service) alterTier(ctx context.Context, cl *cluster.Cluster, t catalog.Tenant, tierName string) (int, error) {
	id := t.ID
	admin, err := cl.Admin(ctx)
	if err != nil {
		return 0, err
	}
	// Its extra logins are held to its tier too.
	logins, err := s.Store.Logins(ctx, nil, id)
	if err != nil {
		return 0, err
	}
	roles, sql := []string{tenant.PhysicalName(id)}, s.TierSQL(id, tierName)+s.ExtensionsSQL(t, tierName)
	for _, role := range catalog.LoginRoles(logins) {
		roles, sql = append(roles, role), sql+tenant.TierSQL(role, s.Tiers[tierName])
	}
	ended := 0
	for attempt := 1; ; attempt++ {
		err := cluster.ExecLockBounded(ctx, admin, tierLockTimeout, sql)
		if !errors.Is(err, cluster.ErrLockNotAvailable) {
			if err != nil {
				return ended, fmt.Errorf("set tier %s on the role of tenant %s: %w", tierName, id, err)
			}
			return ended, nil
		}
		if attempt == tierAttempts {
			return ended, fmt.Errorf("%w: the tenant's sessions took its role's row (an ALTER ROLE of their own) before each of %d attempts; set the tier again",
				catalog.ErrConflict, tierAttempts)
		}
		n, err := purge.EndSessions(ctx, cl, roles...)
		if err != nil {
			return ended, err
		}
		ended += n
	}
}

// maxAllow bounds a tenant's allowlist (each network is two HBA lines).
const maxAllow = 50

// SetAllow sets the client networks a tenant's logins may come from
// through its front door (the pooler's HBA lines for its entry): CIDRs or
// single addresses; none: any address. It takes effect at the pooler's
// next sync, done before it answers.
func (s *Service) SetAllow(ctx context.Context, id string, allow []string) (catalog.Tenant, error) {
	if !tenant.ValidID(id) {
		return catalog.Tenant{}, fmt.Errorf("tenant %q: %w", id, catalog.ErrNotFound)
	}
	nets, err := ParseAllow(allow)
	if err != nil {
		return catalog.Tenant{}, err
	}
	var t catalog.Tenant
	err = pgx.BeginFunc(ctx, s.Store.Pool(), func(tx pgx.Tx) error {
		if t, err = s.Store.LockTenant(ctx, tx, id); err != nil {
			return err
		}
		if err := t.Changeable("set its allowlist"); err != nil {
			return err
		}
		if slices.Equal(t.Allow, nets) {
			return nil
		}
		if err := s.Store.SetTenantAllow(ctx, tx, id, nets); err != nil {
			return err
		}
		if err := s.Store.AddEvent(ctx, tx, id, "allow_changed", map[string]any{"from": t.Allow, "to": nets}); err != nil {
			return err
		}
		t, err = s.Store.GetTenant(ctx, tx, id)
		return err
	})
	if err != nil {
		return catalog.Tenant{}, err
	}
	s.Poolers.Sync(ctx, t.FrontCluster(), "allow "+id)
	return t, nil
}

// EventLabelsChanged is the tenant event of a change of its pins.
const EventLabelsChanged = "labels_changed"

// SetPins pins a tenant to clusters carrying each of labels (k=v; none:
// unpinned). When its cluster carries them, that is all; else placement
// chooses a cluster that does among the others (refused, and nothing
// recorded, when none admits the tenant or it is not active) and the
// caller moves it there (MoveTo). The pins are recorded before the move,
// so the move's target must carry them; setting the same pins again
// starts the move again when an earlier one failed.
func (s *Service) SetPins(ctx context.Context, id string, labels []string) (TierChange, error) {
	if !tenant.ValidID(id) {
		return TierChange{}, fmt.Errorf("tenant %q: %w", id, catalog.ErrNotFound)
	}
	pins, err := ParsePins(labels)
	if err != nil {
		return TierChange{}, err
	}
	t, err := s.Store.GetTenant(ctx, nil, id)
	if err != nil {
		return TierChange{}, err
	}
	if err := t.Changeable("set its labels"); err != nil {
		return TierChange{}, err
	}
	out := TierChange{Tenant: t, From: t.Tier}
	if out.Why, out.MoveTo, err = s.placementFor(ctx, t, t.Tier, pins, "labels "+strings.Join(pins, ",")); err != nil {
		return TierChange{}, err
	}
	if out.MoveTo != "" {
		moving, err := jobs.Unfinished(ctx, s.Store.Pool(), jobs.TenantMove, id)
		if err != nil {
			return TierChange{}, err
		}
		if moving {
			return TierChange{}, fmt.Errorf("%w: tenant %s is moving (`pgtenant job list --target %s`); set its labels once the move is done",
				catalog.ErrConflict, id, id)
		}
	}
	if slices.Equal(t.Pins, pins) {
		return out, nil
	}
	out.Tenant, err = s.recordChange(ctx, id, func(tx pgx.Tx) error { return s.Store.SetTenantPins(ctx, tx, id, pins) },
		EventLabelsChanged, map[string]any{"from": t.Pins, "to": pins, "move_to": out.MoveTo})
	if err != nil {
		return TierChange{}, err
	}
	s.Invalidate()
	return out, nil
}

// recordChange makes a change of tenant id in the catalog (set) with its
// event, in one transaction, and returns the tenant as it is after.
func (s *Service) recordChange(ctx context.Context, id string, set func(pgx.Tx) error, kind string, detail map[string]any) (catalog.Tenant, error) {
	var t catalog.Tenant
	err := pgx.BeginFunc(ctx, s.Store.Pool(), func(tx pgx.Tx) error {
		if err := set(tx); err != nil {
			return err
		}
		if err := s.Store.AddEvent(ctx, tx, id, kind, detail); err != nil {
			return err
		}
		var err error
		t, err = s.Store.GetTenant(ctx, tx, id)
		return err
	})
	return t, err
}

// ParseAllow checks an allowlist and returns it normalised: each network
// in its canonical CIDR form (an address alone is /32 or /128), sorted,
// without duplicates.
func ParseAllow(allow []string) ([]string, error) {
	if len(allow) > maxAllow {
		return nil, invalid("allow: %d networks, at most %d", len(allow), maxAllow)
	}
	var out []string
	for _, a := range allow {
		a = strings.TrimSpace(a)
		p, err := netip.ParsePrefix(a)
		if err != nil {
			addr, aerr := netip.ParseAddr(a)
			if aerr != nil || addr.Zone() != "" {
				return nil, invalid("allow: %q is not a network (CIDR such as 10.0.0.0/8 or 2001:db8::/32) nor an address", a)
			}
			p = netip.PrefixFrom(addr, addr.BitLen())
		}
		out = append(out, p.Masked().String())
	}
	slices.Sort(out)
	return slices.Compact(out), nil
}
