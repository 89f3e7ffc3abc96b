package api

import (
	"context"
	"net/http"
	"net/url"
	"time"

	"github.com/pgtenant/pgtenant/internal/catalog"
	"github.com/pgtenant/pgtenant/internal/config"
)

// UsageReport is usage per tenant and hour over [from, to): the hours that
// start in it, each tenant's hours where it held bytes or did something
// (docs/operations/usage.md says what each figure measures).
type UsageReport struct {
	From  time.Time           `json:"from"`
	To    time.Time           `json:"to"`
	Hours []catalog.UsageHour `json:"hours"`
}

// maxUsageSpan bounds one answer: a quarter of hours.
const maxUsageSpan = 92 * 24 * time.Hour

// GET /v1/usage?tenant=&from=&to=
//
// It reads the catalog only: no cluster, and no tenant, is touched.
func (s *Server) usage(w http.ResponseWriter, r *http.Request) error {
	q := r.URL.Query()
	now := time.Now()
	to, err := usageTime("to", q.Get("to"), now, now)
	if err != nil {
		return err
	}
	from, err := usageTime("from", q.Get("from"), now, to.Add(-24*time.Hour))
	if err != nil {
		return err
	}
	// Whole hours: from down to its hour, to up to the next one.
	from = from.Truncate(time.Hour)
	if t := to.Truncate(time.Hour); !t.Equal(to) {
		to = t.Add(time.Hour)
	}
	if !to.After(from) {
		return invalid("from %s is not before to %s", from.Format(time.RFC3339), to.Format(time.RFC3339))
	}
	if to.Sub(from) > maxUsageSpan {
		return invalid("from %s to %s: at most 92 days in one request", from.Format(time.RFC3339), to.Format(time.RFC3339))
	}
	hours, err := s.Store.Usage(r.Context(), q.Get("tenant"), from, to, now)
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusOK, UsageReport{From: from.UTC(), To: to.UTC(), Hours: hours})
	return nil
}

// usageTime reads a from or to: an RFC 3339 time, a date (midnight UTC),
// or a duration back from now; def when empty.
func usageTime(name, v string, now, def time.Time) (time.Time, error) {
	if v == "" {
		return def, nil
	}
	if t, err := time.Parse(time.RFC3339, v); err == nil {
		return t, nil
	}
	if t, err := time.Parse(time.DateOnly, v); err == nil {
		return t, nil
	}
	if d, err := config.ParseDuration(v); err == nil && d >= 0 {
		return now.Add(-d), nil
	}
	return time.Time{}, invalid("%s %q: an RFC 3339 time (2026-12-01T10:00:00Z), a date (2026-12-01) or a duration back from now (24h, 7d)", name, v)
}

// Usage returns usage per tenant and hour (q: tenant, from, to).
func (c *Client) Usage(ctx context.Context, q url.Values) (UsageReport, error) {
	var out UsageReport
	return out, c.Do(ctx, http.MethodGet, "/v1/usage?"+q.Encode(), nil, &out)
}
