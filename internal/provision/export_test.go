package provision

import (
	"context"
	"time"
)

// SetPlacementTTL sets how old placement's cache may grow before a
// create reads the fleet again in the background.
func (s *Service) SetPlacementTTL(d time.Duration) {
	s.placed.mu.Lock()
	defer s.placed.mu.Unlock()
	s.placed.ttl = d
}

// PlacementReloading says whether placement's background read is under way.
func (s *Service) PlacementReloading() bool {
	s.placed.mu.Lock()
	defer s.placed.mu.Unlock()
	return s.placed.reloading
}

// Place is the cluster a create would place a tenant of tier on.
func (s *Service) Place(ctx context.Context, tier string) (string, error) {
	cl, err := s.place(ctx, "", tier, nil)
	if err != nil {
		return "", err
	}
	return cl.Name(), nil
}
