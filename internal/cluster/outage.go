package cluster

import (
	"log/slog"
	"sync"
	"time"
)

// outageSummaryEvery is how often a failure that goes on is logged again.
const outageSummaryEvery = time.Minute

// Outage logs what a loop keeps failing to do (its database does not
// answer): once when the failures start, a summary once a minute while they
// go on, and once when it works again, instead of once per attempt. The
// zero value is ready; What names the work ("claim jobs"). Safe for
// concurrent use: several workers may share one.
type Outage struct {
	What string

	mu     sync.Mutex
	since  time.Time
	count  int
	logged time.Time
}

// Report records an attempt's outcome: Fail for an error, OK for nil.
func (o *Outage) Report(log *slog.Logger, err error, attrs ...any) {
	if err != nil {
		o.Fail(log, err, attrs...)
	} else {
		o.OK(log, attrs...)
	}
}

// Fail records a failed attempt.
func (o *Outage) Fail(log *slog.Logger, err error, attrs ...any) {
	o.mu.Lock()
	defer o.mu.Unlock()
	now := time.Now()
	o.count++
	cause, ok := Unreachable(err)
	if !ok {
		cause = err.Error()
	}
	switch {
	case o.since.IsZero():
		o.since, o.logged = now, now
		log.Warn(o.What+" failed; retrying, logged again once a minute while it fails", append(attrs, "cause", cause)...)
	case now.Sub(o.logged) >= outageSummaryEvery:
		o.logged = now
		log.Warn(o.What+" still failing", append(attrs, "for", now.Sub(o.since).Round(time.Second), "failures", o.count, "cause", cause)...)
	}
}

// OK records a successful attempt.
func (o *Outage) OK(log *slog.Logger, attrs ...any) {
	o.mu.Lock()
	defer o.mu.Unlock()
	if !o.since.IsZero() {
		log.Info(o.What+" works again", append(attrs, "after", time.Since(o.since).Round(time.Second), "failures", o.count)...)
		o.since, o.count = time.Time{}, 0
	}
}
