package placement

import (
	"context"
	"encoding/json"
	"slices"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/pgtenant/pgtenant/internal/jobs"
	"github.com/pgtenant/pgtenant/internal/move"
)

// Collector exports the moves in flight: how many are in each phase (the
// move job's step under way; queued before its first), and each one's
// progress in its phase (the copy: tables copied of all). A few catalog
// queries per scrape: moves are few at a time (move.max_concurrent_per_cluster).
// Each move's client-visible pause is in its tenant's events (move_pause,
// with phases_ms).
type Collector struct {
	s        *Service
	phases   *prometheus.Desc
	progress *prometheus.Desc
	lag      *prometheus.Desc
	up       *prometheus.Desc
}

// NewCollector returns the moves collector of s.
func NewCollector(s *Service) *Collector {
	return &Collector{
		s: s,
		phases: prometheus.NewDesc("pgtenant_moves_in_progress",
			"Tenant moves not finished, by phase: queued, or the step under way (check, roles, schema, subscribe, copy, cutover, finish).",
			[]string{"phase"}, nil),
		progress: prometheus.NewDesc("pgtenant_move_progress_ratio",
			"Progress of a move in flight within its phase (copy: tables copied of all), 0 to 1.",
			[]string{"tenant", "from", "to", "phase"}, nil),
		lag: prometheus.NewDesc("pgtenant_move_lag_bytes",
			"WAL of the source a move's subscription has not confirmed yet (its slot's confirmed_flush_lsn behind the source's current WAL), from the subscribe step on.",
			[]string{"tenant", "from", "to"}, nil),
		up: prometheus.NewDesc("pgtenant_moves_up", "1 if the catalog answered the moves query.", nil, nil),
	}
}

// Describe implements prometheus.Collector.
func (c *Collector) Describe(ch chan<- *prometheus.Desc) {
	ch <- c.phases
	ch <- c.progress
	ch <- c.lag
	ch <- c.up
}

// Collect implements prometheus.Collector.
func (c *Collector) Collect(ch chan<- prometheus.Metric) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	moves, err := c.s.moves(ctx)
	if err != nil {
		ch <- prometheus.MustNewConstMetric(c.up, prometheus.GaugeValue, 0)
		return
	}
	ch <- prometheus.MustNewConstMetric(c.up, prometheus.GaugeValue, 1)
	count := map[string]int{}
	for _, m := range moves {
		count[m.Phase]++
		ratio := 0.0
		if m.Job.ProgressTotal > 0 {
			ratio = float64(m.Job.ProgressDone) / float64(m.Job.ProgressTotal)
		}
		ch <- prometheus.MustNewConstMetric(c.progress, prometheus.GaugeValue, ratio, m.Tenant, m.From, m.To, m.Phase)
		if lag, ok := c.s.slotLag(ctx, m); ok {
			ch <- prometheus.MustNewConstMetric(c.lag, prometheus.GaugeValue, float64(lag), m.Tenant, m.From, m.To)
		}
	}
	for _, p := range append([]string{"queued"}, movePhases()...) {
		ch <- prometheus.MustNewConstMetric(c.phases, prometheus.GaugeValue, float64(count[p]), p)
	}
}

// InFlight is a move not finished, with its phase.
type InFlight struct {
	Move
	Phase string
	Job   jobs.Job
}

// movePhases are the move job's steps, in order.
func movePhases() []string {
	steps, err := (&move.Service{}).Handler().Steps(&jobs.Job{Args: json.RawMessage(`{}`)})
	if err != nil {
		return nil
	}
	out := make([]string, len(steps))
	for i, st := range steps {
		out[i] = st.Name
	}
	return out
}

// moves lists the moves in flight with their phases.
func (s *Service) moves(ctx context.Context) ([]InFlight, error) {
	fl, err := s.inFlight(ctx)
	if err != nil {
		return nil, err
	}
	js, err := jobs.List(ctx, s.Store.Pool(), jobs.Filter{Type: jobs.TenantMove, State: jobs.Active})
	if err != nil {
		return nil, err
	}
	phases := movePhases()
	var out []InFlight
	for _, j := range js {
		full, err := jobs.Get(ctx, s.Store.Pool(), j.ID)
		if err != nil {
			continue // ended meanwhile
		}
		phase := "queued"
		if len(full.Steps) > 0 || full.State != jobs.Queued {
			done := map[string]bool{}
			for _, st := range full.Steps {
				done[st.Step] = true
			}
			for _, p := range phases {
				if !done[p] {
					phase = p
					break
				}
			}
		}
		out = append(out, InFlight{Move: fl.tenants[j.Target], Phase: phase, Job: full})
	}
	slices.SortFunc(out, func(a, b InFlight) int { return int(a.Job.ID - b.Job.ID) })
	return out, nil
}

// slotLag reads how far a move's slot on its source is behind: one query
// on the source's admin pool (no tenant database), bounded by the scrape's
// deadline; false when the slot is not there (before subscribe, after the
// cut-over) or the source does not answer.
func (s *Service) slotLag(ctx context.Context, m InFlight) (int64, bool) {
	if s.Clusters == nil || m.From == "" {
		return 0, false
	}
	cl, err := s.Clusters.Get(m.From)
	if err != nil {
		return 0, false
	}
	admin, err := cl.Admin(ctx)
	if err != nil {
		return 0, false
	}
	var lag *int64
	err = admin.QueryRow(ctx, `SELECT pg_catalog.pg_wal_lsn_diff(pg_catalog.pg_current_wal_lsn(), confirmed_flush_lsn)::bigint
		FROM pg_catalog.pg_replication_slots WHERE slot_name = $1`, move.Name(m.Tenant)).Scan(&lag)
	if err != nil || lag == nil {
		return 0, false
	}
	return *lag, true
}
