package reconcile

import "context"

// LoopLockKey is the advisory lock of a periodic round.
const LoopLockKey = loopLockKey

// Round is one periodic round: whether it ran, and its error.
func (l *Loop) Round(ctx context.Context) (bool, error) {
	ran, _, err := l.round(ctx)
	return ran, err
}
