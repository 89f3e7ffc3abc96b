package config_test

import (
	"strings"
	"testing"
	"time"

	"github.com/pgtenant/pgtenant/internal/config"
)

// TestParse_Backups: the backups section's defaults, a file that sets it,
// and validation naming the bad field.
func TestParse_Backups(t *testing.T) {
	day := 24 * time.Hour
	d := config.Default().Backups
	if d.FullEvery.D() != 7*day || d.DiffEvery.D() != day || d.Retention.D() != 7*day || d.CheckInterval.D() != time.Minute {
		t.Errorf("default backups = %+v, want full 7d, diff 1d, retention 7d, check 1m", d)
	}
	cfg, err := config.Parse([]byte("backups:\n  full_every: 3d\n  diff_every: 0\n  retention: 14d\n  check_interval: 30s\n"))
	if err != nil {
		t.Fatal(err)
	}
	if b := cfg.Backups; b.FullEvery.D() != 3*day || b.DiffEvery != 0 || b.Retention.D() != 14*day || b.CheckInterval.D() != 30*time.Second {
		t.Errorf("backups = %+v, want full 3d, no diffs, retention 14d, check 30s", b)
	}
	for _, tc := range []struct{ yaml, want string }{
		{"backups:\n  full_every: 10s\n", "backups.full_every"},
		{"backups:\n  diff_every: 10s\n", "backups.diff_every: must be 0"},
		{"backups:\n  full_every: 1d\n  diff_every: 1d\n", "backups.diff_every: 24h0m0s is not below backups.full_every"},
		{"backups:\n  retention: 12h\n", "backups.retention: must be whole days"},
		{"backups:\n  retention: 36h\n", "backups.retention: must be whole days"},
		{"backups:\n  check_interval: 10ms\n", "backups.check_interval"},
		{"backups:\n  every: 1d\n", "field every not found"},
	} {
		if _, err := config.Parse([]byte(tc.yaml)); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("Parse(%q) = %v, want an error containing %q", tc.yaml, err, tc.want)
		}
	}
}
