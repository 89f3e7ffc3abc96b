package bench

import (
	"testing"
	"time"
)

// TestFailoverResumeAfter: the resume is the first write sent after the
// event and acknowledged by another server than the leader at the event:
// a promoted standby (another port) or the same node restarted (another
// start time). A write the dying server still acknowledged, or the old
// leader took before a switchover's pause, does not count.
func TestFailoverResumeAfter(t *testing.T) {
	t0 := time.Date(2026, 12, 2, 9, 0, 0, 0, time.UTC)
	at := func(ms int) time.Time { return t0.Add(time.Duration(ms) * time.Millisecond) }
	was := server{port: 5432, started: t0.Add(-time.Hour)}
	restarted := server{port: 5432, started: at(3000)}
	promoted := server{port: 5433, started: t0.Add(-time.Hour)}
	ack := func(by server, start, done int) failoverAck {
		return failoverAck{by: by, start: at(start), at: at(done)}
	}
	for _, c := range []struct {
		name string
		acks []failoverAck
		want time.Duration
		ok   bool
	}{
		{"node loss", []failoverAck{ack(was, -20, -18), ack(promoted, 21000, 21004), ack(promoted, 21020, 21022)}, 21004 * time.Millisecond, true},
		{"crash: a dying backend's ack does not count", []failoverAck{ack(was, 1, 3), ack(restarted, 4000, 4002)}, 4002 * time.Millisecond, true},
		{"switchover: the old leader's acks before the pause do not count", []failoverAck{ack(was, -5, 1), ack(was, 100, 102), ack(promoted, 120, 1500)}, 1500 * time.Millisecond, true},
		{"sent before the event", []failoverAck{ack(promoted, -10, 2000), ack(promoted, 2010, 2012)}, 2012 * time.Millisecond, true},
		{"none", []failoverAck{ack(was, 10, 20)}, 0, false},
	} {
		got, ok := resumeAfter(c.acks, t0, was)
		if got != c.want || ok != c.ok {
			t.Errorf("%s: resumeAfter = %s, %v; want %s, %v", c.name, got, ok, c.want, c.ok)
		}
	}
}

// TestFailoverSummary: runs fold by mode and scenario in their order;
// resume p50 and max are over every tenant of every run.
func TestFailoverSummary(t *testing.T) {
	s := time.Second
	runs := []FailoverRun{
		{Mode: ModeSync, Scenario: ScenarioNodeLoss, From: "n1", To: "n2", Resume: []time.Duration{21 * s, 22 * s}, Pause: 22 * s, Errors: 10, Acked: 100},
		{Mode: ModeSync, Scenario: ScenarioNodeLoss, From: "n2", To: "n1", Resume: []time.Duration{20 * s, 25 * s}, Pause: 25 * s, Errors: 12, Acked: 90},
		{Mode: ModeSync, Scenario: ScenarioCrash, From: "n1", To: "n1", Resume: []time.Duration{3 * s, 4 * s}, Pause: 4 * s, Errors: 2, Acked: 50},
		{Mode: ModeAsync, Scenario: ScenarioNodeLoss, From: "n1", To: "n2", Resume: []time.Duration{19 * s, 23 * s}, Pause: 23 * s, Errors: 9, Acked: 80, Lost: 3},
	}
	got := summarizeFailover(runs)
	if len(got) != 3 {
		t.Fatalf("got %d summaries, want 3: %+v", len(got), got)
	}
	nl := got[0]
	if nl.Mode != ModeSync || nl.Scenario != ScenarioNodeLoss || nl.Runs != 2 || nl.Changed != 2 {
		t.Errorf("first summary: got %+v, want sync node loss over 2 runs, 2 leader changes", nl)
	}
	// 20, 21, 22, 25: the p50 index is int(3 * 0.5) = 1.
	if nl.ResumeP50 != 21*s || nl.ResumeMax != 25*s || nl.Pause != 25*s || nl.Errors != 22 || nl.Acked != 190 || nl.Lost != 0 {
		t.Errorf("sync node loss: got %+v", nl)
	}
	if cr := got[1]; cr.Scenario != ScenarioCrash || cr.Changed != 0 || cr.ResumeMax != 4*s {
		t.Errorf("crash: got %+v, want no leader change, max 4s", cr)
	}
	if as := got[2]; as.Mode != ModeAsync || as.Lost != 3 {
		t.Errorf("async node loss: got %+v, want 3 lost", as)
	}
	tab := failoverTable(FailoverResult{Runs: runs, Summaries: got, TPS: []TPSRun{{Name: ModeSync, TPS: 800}, {Name: ModeAsync, TPS: 1000}}},
		FailoverOptions{Tenants: 2, Clients: 1, Rate: 50, Runs: 2, TPSClients: 4})
	want := map[string]bool{
		"writes resume <= 30 s after a node loss":        true,
		"writes resume <= 10 s after a postgres crash":   true,
		"0 acknowledged writes lost in synchronous mode": true,
		"synchronous mode costs <= 25 % of tps":          true,
	}
	for _, c := range tab.Checks {
		met, ok := want[c.Target]
		if !ok {
			t.Errorf("unexpected check %q", c.Target)
			continue
		}
		if c.Met != met {
			t.Errorf("%s: met %v (%s), want %v", c.Target, c.Met, c.Got, met)
		}
		delete(want, c.Target)
	}
	for target := range want {
		t.Errorf("no check %q", target)
	}
}
