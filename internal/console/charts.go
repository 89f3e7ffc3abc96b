package console

import (
	"context"
	"fmt"
	"html/template"
	"math"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/pgtenant/pgtenant/internal/background"
	"github.com/pgtenant/pgtenant/internal/catalog"
	"github.com/pgtenant/pgtenant/internal/jobs"
)

// Charts are SVG drawn on the server: a polyline per series, no script and
// no style attribute (the CSP allows neither; colours are in console.css).

// point is one sample of a series.
type point struct {
	at time.Time
	v  float64
}

// chart is a titled series over a window ending now.
type chart struct {
	Title  string
	Latest string // the last value, formatted
	SVG    template.HTML
	Empty  bool
}

const chartW, chartH = 360.0, 90.0

// drawChart renders points between now-window and now; format labels the
// largest value and the latest one.
func drawChart(title string, pts []point, window time.Duration, now time.Time, format func(float64) string) chart {
	c := chart{Title: title}
	from := now.Add(-window)
	var in []point
	for _, p := range pts {
		if !p.at.Before(from) && !math.IsNaN(p.v) && !math.IsInf(p.v, 0) {
			in = append(in, p)
		}
	}
	if len(in) == 0 {
		c.Empty = true
		c.Latest = "no data yet"
		return c
	}
	sort.Slice(in, func(i, j int) bool { return in[i].at.Before(in[j].at) })
	top := 0.0
	for _, p := range in {
		top = max(top, p.v)
	}
	if top == 0 {
		top = 1
	}
	var b strings.Builder
	fmt.Fprintf(&b, `<svg class="chart" viewBox="0 0 %.0f %.0f" width="%.0f" height="%.0f" role="img" aria-label="%s">`,
		chartW, chartH+14, chartW, chartH+14, template.HTMLEscapeString(title))
	fmt.Fprintf(&b, `<line class="axis" x1="0" y1="%.1f" x2="%.0f" y2="%.1f"/>`, chartH, chartW, chartH)
	var pl strings.Builder
	for _, p := range in {
		x := chartW * float64(p.at.Sub(from)) / float64(window)
		y := chartH - (chartH-4)*p.v/top
		fmt.Fprintf(&pl, "%.1f,%.1f ", x, y)
	}
	if len(in) == 1 {
		x := chartW * float64(in[0].at.Sub(from)) / float64(window)
		fmt.Fprintf(&b, `<circle class="dot" cx="%.1f" cy="%.1f" r="2"/>`, x, chartH-(chartH-4)*in[0].v/top)
	} else {
		fmt.Fprintf(&b, `<polyline class="line" points="%s"/>`, strings.TrimSpace(pl.String()))
	}
	fmt.Fprintf(&b, `<text class="label" x="2" y="10">max %s</text>`, template.HTMLEscapeString(format(top)))
	fmt.Fprintf(&b, `<text class="label" x="2" y="%.0f">%s ago</text>`, chartH+12, span(window))
	fmt.Fprintf(&b, `<text class="label end" x="%.0f" y="%.0f">now</text>`, chartW-2, chartH+12)
	b.WriteString(`</svg>`)
	c.SVG = template.HTML(b.String()) // built here from numbers and escaped text only
	c.Latest = format(in[len(in)-1].v)
	return c
}

// span writes a window as 7d, 6h or 15m.
func span(d time.Duration) string {
	switch {
	case d >= 24*time.Hour && d%(24*time.Hour) == 0:
		return fmt.Sprintf("%dd", d/(24*time.Hour))
	case d >= time.Hour && d%time.Hour == 0:
		return fmt.Sprintf("%dh", d/time.Hour)
	}
	return fmt.Sprintf("%dm", d/time.Minute)
}

func formatBytes(f float64) string { return humanBytes(int64(f)) }
func formatCount(f float64) string { return fmt.Sprintf("%.0f", f) }
func formatRate(f float64) string  { return fmt.Sprintf("%.2f/s", f) }
func formatRatio(f float64) string { return fmt.Sprintf("%.1f%%", f*100) }

// tenantCharts draws a tenant's minute rollups: size, connections,
// commits/s and buffer hit ratio.
func tenantCharts(rs []catalog.Rollup, window time.Duration, now time.Time) []chart {
	var size, conns, commits, hit []point
	for _, r := range rs {
		if r.SizeBytes != nil {
			size = append(size, point{r.Minute, float64(*r.SizeBytes)})
		}
		conns = append(conns, point{r.Minute, float64(r.Connections)})
		if r.Commits != nil {
			commits = append(commits, point{r.Minute, float64(*r.Commits) / 60})
		}
		if n := r.BlksHit + r.BlksRead; n > 0 {
			hit = append(hit, point{r.Minute, float64(r.BlksHit) / float64(n)})
		}
	}
	return []chart{
		drawChart("size", size, window, now, formatBytes),
		drawChart("connections", conns, window, now, formatCount),
		drawChart("commits/s", commits, window, now, formatRate),
		drawChart("buffer hit ratio", hit, window, now, formatRatio),
	}
}

// history keeps each cluster's recent samples in memory (a restart
// forgets them): the largest standby replay lag, WAL written per second
// and the steps the pacer holds.
type history struct {
	mu      sync.Mutex
	samples map[string][]sample
}

type sample struct {
	at            time.Time
	lag, walPerS  float64
	waiting       int
	checkpointing bool
}

const (
	// historyEvery is how often Run samples; historyKeep how much it keeps.
	historyEvery = 15 * time.Second
	historyKeep  = time.Hour
)

// Run samples the clusters until ctx ends, for the clusters page's charts.
// It reads the last probe (no query to the clusters) and the catalog's
// waiting jobs (one query).
func (c *Console) Run(ctx context.Context) error {
	background.Every(ctx, historyEvery, c.sample)
	return nil
}

func (c *Console) sample(ctx context.Context) {
	now := c.clock()
	waiting := map[string]int{}
	if js, err := jobs.List(ctx, c.Store.Pool(), jobs.Filter{State: jobs.Waiting, Limit: 1000}); err == nil {
		for _, j := range js {
			waiting[j.Cluster]++
		}
	}
	c.history.mu.Lock()
	defer c.history.mu.Unlock()
	if c.history.samples == nil {
		c.history.samples = map[string][]sample{}
	}
	for _, cl := range c.Clusters.All() {
		h, err := cl.LastProbeResult()
		if err != nil || h.At.IsZero() {
			continue
		}
		lag, _ := h.MaxReplayLag()
		s := append(c.history.samples[cl.Name()], sample{at: now, lag: float64(lag), walPerS: h.WALBytesPerSec,
			waiting: waiting[cl.Name()], checkpointing: h.CheckpointInProgress})
		for len(s) > 0 && now.Sub(s[0].at) > historyKeep {
			s = s[1:]
		}
		c.history.samples[cl.Name()] = s
	}
}

// clusterChart is one cluster's charts.
type clusterChart struct {
	Cluster string
	Charts  []chart
}

func (c *Console) clusterCharts(now time.Time) []clusterChart {
	c.history.mu.Lock()
	defer c.history.mu.Unlock()
	var names []string
	for name := range c.history.samples {
		names = append(names, name)
	}
	sort.Strings(names)
	var out []clusterChart
	for _, name := range names {
		var lag, wal, waiting []point
		for _, s := range c.history.samples[name] {
			lag = append(lag, point{s.at, s.lag})
			wal = append(wal, point{s.at, s.walPerS})
			waiting = append(waiting, point{s.at, float64(s.waiting)})
		}
		out = append(out, clusterChart{name, []chart{
			drawChart("standby replay lag", lag, historyKeep, now, formatBytes),
			drawChart("WAL/s", wal, historyKeep, now, func(f float64) string { return humanBytes(int64(f)) + "/s" }),
			drawChart("steps held by the pacer", waiting, historyKeep, now, formatCount),
		}})
	}
	return out
}
