package bench

import (
	"testing"
	"time"
)

// TestMaxGap: the longest time without a successful write within the
// window counts the edges (start to the first, the last to the end) and
// ignores writes outside the window.
func TestMaxGap(t *testing.T) {
	t0 := time.Date(2026, 12, 2, 9, 0, 0, 0, time.UTC)
	at := func(ms int) time.Time { return t0.Add(time.Duration(ms) * time.Millisecond) }
	for _, c := range []struct {
		name string
		done []time.Time
		want time.Duration
	}{
		{"none", nil, 1000 * time.Millisecond},
		{"between", []time.Time{at(-500), at(100), at(700), at(300), at(900), at(5000)}, 400 * time.Millisecond},
		{"start", []time.Time{at(450), at(800)}, 450 * time.Millisecond},
		{"end", []time.Time{at(100), at(200), at(300)}, 700 * time.Millisecond},
	} {
		if got := maxGap(c.done, at(0), at(1000)); got != c.want {
			t.Errorf("%s: maxGap = %s, want %s", c.name, got, c.want)
		}
	}
}

// TestArchiveLag: the lag is the WAL past the newest archived segment's
// end; the RPO is how long ago the WAL position passed that end.
func TestArchiveLag(t *testing.T) {
	t0 := time.Date(2026, 12, 2, 9, 0, 0, 0, time.UTC)
	s := []lagSample{
		{at: t0, lsn: 100, archived: 0},                        // nothing archived yet: not counted
		{at: t0.Add(1 * time.Second), lsn: 200, archived: 150}, // passed 150 since the sample at t0
		{at: t0.Add(2 * time.Second), lsn: 300, archived: 150}, // still: 2 s
		{at: t0.Add(3 * time.Second), lsn: 400, archived: 300}, // 300 reached at 2 s: 1 s
		{at: t0.Add(4 * time.Second), lsn: 400, archived: 400}, // caught up
		{at: t0.Add(5 * time.Second), lsn: 900, archived: 400}, // 1 s
	}
	maxBytes, p50, rpo := archiveLag(s)
	if got, want := maxBytes, int64(500); got != want {
		t.Errorf("max lag = %d, want %d", got, want)
	}
	if got, want := p50, int64(100); got != want {
		t.Errorf("p50 lag = %d, want %d", got, want)
	}
	if got, want := rpo, 2*time.Second; got != want {
		t.Errorf("rpo = %s, want %s", got, want)
	}
}

func TestTPSCost(t *testing.T) {
	if got, want := tpsCost(950, 1000), 0.05; got < want-1e-9 || got > want+1e-9 {
		t.Errorf("tpsCost(950, 1000) = %v, want %v", got, want)
	}
	if got := tpsCost(10, 0); got != 0 {
		t.Errorf("tpsCost(10, 0) = %v, want 0", got)
	}
	if got, want := ratio(30*time.Second, 60*time.Second), 0.5; got != want {
		t.Errorf("ratio = %v, want %v", got, want)
	}
}
