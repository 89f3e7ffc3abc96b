package move

import (
	"context"
	"time"
)

// SetCrashHook makes f called at each point of a move where the tests kill
// the daemon (nil: none). See crashHook.
func SetCrashHook(f func(ctx context.Context, point string) error) {
	if f == nil {
		crashHook.Store(nil)
		return
	}
	crashHook.Store(&f)
}

// SetCatchUpTimeout sets the default of Service.CatchUpTimeout.
func SetCatchUpTimeout(d time.Duration) { catchUpTimeout = d }
