// Package background holds the one shape of pgtenant's periodic loops:
// do something, wait, do it again, until the daemon stops. It owns no
// state and knows nothing of what the loops do.
package background

import (
	"context"
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
