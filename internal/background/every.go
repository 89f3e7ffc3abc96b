// Package background holds the one shape of pgtenant's periodic loops:
// do something, wait, do it again, until the daemon stops (Every), or
// until it works (Until). It owns no
// state and knows nothing of what the loops do.
package background

import (
	"context"
	"fmt"
	"time"
)

// Every calls fn at once and then each interval until ctx ends. Calls
// never overlap: one that takes longer than interval is followed by the
// next at once, and the ticks it overran are dropped (time.Ticker). An
// interval <= 0 calls fn once and waits for ctx.
func Every(ctx context.Context, interval time.Duration, fn func(context.Context)) {
	loop(ctx, interval, true, fn)
}

// EveryAfter is Every without the call at once: the first call comes one
// interval from now (for a loop whose first round its caller has just done).
func EveryAfter(ctx context.Context, interval time.Duration, fn func(context.Context)) {
	loop(ctx, interval, false, fn)
}

// Until calls try at once and then each interval until it returns nil,
// or ctx ends: then the error says so, with try's last error.
func Until(ctx context.Context, interval time.Duration, try func(context.Context) error) error {
	for {
		last := try(ctx)
		if last == nil {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("%w (last: %v)", ctx.Err(), last)
		case <-time.After(interval):
		}
	}
}

func loop(ctx context.Context, interval time.Duration, now bool, fn func(context.Context)) {
	if now && ctx.Err() == nil {
		fn(ctx)
	}
	if interval <= 0 {
		<-ctx.Done()
		return
	}
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		if ctx.Err() != nil { // both ready: stopping wins
			return
		}
		fn(ctx)
	}
}
