package prewarm

import "context"

// SetBeforeStore lets tests interrupt a capture between reading the cache
// and storing the hot sets.
func SetBeforeStore(s *Service, f func(ctx context.Context) error) { s.beforeStore = f }
