// Package bench runs pgtenant's benchmarks and soak tests. Each benchmark
// starts its own throwaway fleet (a primary and a streaming standby, with
// the settings the comparison needs), runs the alternatives side by side in
// one run on that fleet, and returns rows for a table or JSON. Absolute times
// are noisy on shared machines: compare ratios and medians.
package bench

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/pgtenant/pgtenant/internal/fleet"
)

// Env is where a benchmark runs.
type Env struct {
	Dir    string // work directory (a temp dir when empty)
	Logger *slog.Logger
	Log    io.Writer // progress lines for the operator
	Keep   bool      // keep the fleet's files afterwards
}

func (e *Env) logf(format string, args ...any) {
	if e.Log != nil {
		fmt.Fprintf(e.Log, "%s  "+format+"\n", append([]any{time.Now().Format("15:04:05")}, args...)...)
	}
}

// fleetFor starts a primary with one streaming standby under dir/name.
func (e *Env) fleetFor(ctx context.Context, name string, settings map[string]string, fast bool) (*fleet.Cluster, func(), error) {
	if e.Dir == "" {
		d, err := os.MkdirTemp("", "pgtenant-bench-")
		if err != nil {
			return nil, nil, err
		}
		e.Dir = d
	}
	if err := os.MkdirAll(e.Dir, 0o755); err != nil {
		return nil, nil, err
	}
	if err := os.Chmod(e.Dir, 0o755); err != nil {
		return nil, nil, err
	}
	logger := e.Logger
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	dir := filepath.Join(e.Dir, name)
	fc, err := fleet.Open(fleet.Options{Dir: dir, Name: name, Standbys: 1, Settings: settings, Fast: fast, Logger: logger})
	if err != nil {
		return nil, nil, err
	}
	e.logf("starting fleet %s (PostgreSQL %s, primary + 1 standby) in %s", name, fc.Binaries().Version, dir)
	if err := fc.Start(ctx); err != nil {
		return nil, nil, err
	}
	stop := func() {
		sctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
		defer cancel()
		_ = fc.Stop(sctx)
		if !e.Keep {
			os.RemoveAll(dir)
		}
	}
	return fc, stop, nil
}

// Table is a benchmark's result: a title, column names and rows.
type Table struct {
	Title   string         `json:"title"`
	Columns []string       `json:"columns"`
	Rows    [][]string     `json:"rows"`
	Notes   []string       `json:"notes,omitempty"`
	Data    map[string]any `json:"data,omitempty"` // the raw figures, for -o json
	Checks  []Check        `json:"checks,omitempty"`
}

// Check is one target of an issue, met or not.
type Check struct {
	Target string `json:"target"`
	Got    string `json:"got"`
	Met    bool   `json:"met"`
}

// Write prints the table as text.
func (t Table) Write(w io.Writer) {
	fmt.Fprintf(w, "\n%s\n\n", t.Title)
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, strings.Join(t.Columns, "\t")+"\t")
	for _, r := range t.Rows {
		fmt.Fprintln(tw, strings.Join(r, "\t")+"\t")
	}
	tw.Flush()
	if len(t.Checks) > 0 {
		fmt.Fprintln(w)
		for _, c := range t.Checks {
			mark := "MET   "
			if !c.Met {
				mark = "NOT MET"
			}
			fmt.Fprintf(w, "  %s %s: %s\n", mark, c.Target, c.Got)
		}
	}
	for _, n := range t.Notes {
		fmt.Fprintf(w, "  note: %s\n", n)
	}
}

// percentile returns the p-th percentile (0..100) of durations.
func percentile(ds []time.Duration, p float64) time.Duration {
	if len(ds) == 0 {
		return 0
	}
	s := append([]time.Duration(nil), ds...)
	sort.Slice(s, func(i, j int) bool { return s[i] < s[j] })
	idx := int(float64(len(s)-1) * p / 100)
	return s[idx]
}

func ms(d time.Duration) string { return fmt.Sprintf("%.1f ms", float64(d)/float64(time.Millisecond)) }

func kb(n int64) string {
	switch {
	case n >= 10<<20:
		return fmt.Sprintf("%.1f MB", float64(n)/(1<<20))
	case n >= 10<<10:
		return fmt.Sprintf("%.1f KB", float64(n)/(1<<10))
	}
	return fmt.Sprintf("%d B", n)
}
