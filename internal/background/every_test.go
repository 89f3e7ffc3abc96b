package background

import (
	"context"
	"testing"
	"time"
)

// TestEvery_CallsAtOnceThenEachIntervalUntilCancelled: the first call
// comes before any tick, later ones come from the ticker, and none after
// the context ends.
func TestEvery_CallsAtOnceThenEachIntervalUntilCancelled(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	calls := 0
	done := make(chan struct{})
	go func() {
		defer close(done)
		Every(ctx, time.Millisecond, func(context.Context) {
			calls++
			if calls == 3 {
				cancel()
			}
		})
	}()
	<-done
	if calls != 3 {
		t.Fatalf("calls = %d, want 3 (the loop stops once its context ends)", calls)
	}
}

// TestEveryAfter_NoCallAtOnce: with the context already ended, Every still
// makes no call and EveryAfter none either; with a long interval EveryAfter
// makes none before the context ends.
func TestEveryAfter_NoCallAtOnce(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	calls := 0
	done := make(chan struct{})
	go func() {
		defer close(done)
		EveryAfter(ctx, time.Hour, func(context.Context) { calls++ })
	}()
	cancel()
	<-done
	if calls != 0 {
		t.Fatalf("EveryAfter made %d calls before its first interval, want 0", calls)
	}
	Every(ctx, time.Hour, func(context.Context) { calls++ })
	if calls != 0 {
		t.Fatalf("Every with an ended context made %d calls, want 0", calls)
	}
}

// TestEvery_ZeroIntervalOnce: an interval of 0 is one call, then a wait for
// the end.
func TestEvery_ZeroIntervalOnce(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	calls := 0
	Every(ctx, 0, func(context.Context) { calls++; cancel() })
	if calls != 1 {
		t.Fatalf("calls = %d, want 1", calls)
	}
}
