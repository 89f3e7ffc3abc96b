package provision_test

import (
	"context"
	"log/slog"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/pgtenant/pgtenant/internal/api"
	"github.com/pgtenant/pgtenant/internal/config"
	"github.com/pgtenant/pgtenant/internal/daemon/daemontest"
	"github.com/pgtenant/pgtenant/internal/pgtest"
	"github.com/pgtenant/pgtenant/internal/provision"
	"github.com/pgtenant/pgtenant/internal/templates"
)

// tiny is a one-table template: builds are quick, so that the tests are
// about pools and slots, not copies.
func tiny() []templates.Upload {
	return []templates.Upload{{Name: "0001.sql", Body: "CREATE TABLE t (x int);"}}
}

// copies records the "template copied" lines of a daemon's log (provision
// logs them on the daemon's root logger): when each CREATE DATABASE of a
// tenant ran, and with which strategy.
type copies struct {
	slog.Handler // the test's log
	mu           sync.Mutex
	got          []copyRun
}

type copyRun struct {
	strategy string
	from, to time.Time
}

func (c *copies) Handle(ctx context.Context, r slog.Record) error {
	if r.Message == "template copied" {
		var run copyRun
		r.Attrs(func(a slog.Attr) bool {
			switch a.Key {
			case "strategy":
				run.strategy = a.Value.String()
			case "from":
				run.from = a.Value.Time()
			case "took":
				run.to = run.from.Add(a.Value.Duration())
			}
			return true
		})
		c.mu.Lock()
		c.got = append(c.got, run)
		c.mu.Unlock()
	}
	return c.Handler.Handle(ctx, r)
}

// overlap is the most copies running at one moment.
func (c *copies) overlap() (most int, strategies []string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, a := range c.got {
		n := 0
		for _, b := range c.got {
			if !b.from.After(a.from) && a.from.Before(b.to) {
				n++
			}
		}
		most = max(most, n)
		if !slices.Contains(strategies, a.strategy) {
			strategies = append(strategies, a.strategy)
		}
	}
	return most, strategies
}

// coldCreates runs n database creates at once on an empty pool.
func coldCreates(t *testing.T, c *api.Client, template string, n int) {
	t.Helper()
	ctx := pgtest.Context(t)
	var wg sync.WaitGroup
	for range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			r, err := c.CreateTenant(ctx, provision.Request{Template: template, Mode: "database"})
			if err != nil || r.Path != "cold" {
				t.Errorf("cold create: path %q, %v", r.Path, err)
			}
		}()
	}
	wg.Wait()
}

// TestCreate_CopiesWithinSlots: cold database creates whose copy is WAL_LOG
// (no checkpoint) run several at once, never more than pacer.wal_log_slots;
// FILE_COPY ones (two forced checkpoints each) never run at once.
func TestCreate_CopiesWithinSlots(t *testing.T) {
	for _, tc := range []struct {
		strategy  string
		walLogMax config.ByteSize // forces the strategy (tenant.CreateStrategy)
		creates   int
		least     int
		most      int
	}{
		{"WAL_LOG", 1 << 40, 8, 2, 3},
		{"FILE_COPY", 1, 4, 1, 1},
	} {
		t.Run(tc.strategy, func(t *testing.T) {
			cfg := daemontest.Config(t, pg)
			cfg.Provision.DefaultPoolSize = 0
			cfg.Provision.WALLogMaxSize = tc.walLogMax
			cfg.Pacer.WALLogSlots = 3
			cfg.Pacer.HeavyDDLSlots = 1
			cfg.Jobs.Workers = 8 // every create's build is taken at once: only the pacer holds them back
			rec := &copies{Handler: pgtest.Logger(t).Handler()}
			c, _ := daemontest.StartLogged(t, pg, cfg, slog.New(rec))
			daemontest.CreateTemplate(t, c, "tiny", tiny())
			coldCreates(t, c, "tiny", tc.creates)

			most, strategies := rec.overlap()
			if !slices.Equal(strategies, []string{tc.strategy}) {
				t.Errorf("copies used %v, want %s only", strategies, tc.strategy)
			}
			if n := len(rec.got); n != tc.creates {
				t.Errorf("%d copies logged, want %d", n, tc.creates)
			}
			if most < tc.least || most > tc.most {
				t.Errorf("%s copies at once: at most %d, want between %d and %d", tc.strategy, most, tc.least, tc.most)
			}
		})
	}
}
