package move

import (
	"testing"
	"time"

	"github.com/pgtenant/pgtenant/internal/pooler"
)

// A paused move stops waiting for its target 5 s before a client queued
// at the pooler since the pause would reach query_wait_timeout.
func TestSwitchWait_EndsBeforeQueuedClientsTimeOut(t *testing.T) {
	front := &pooler.Front{Settings: pooler.Settings{QueryWaitTimeout: 30 * time.Second}}
	for _, c := range []struct {
		name   string
		front  *pooler.Front
		paused time.Duration // since the pause began
		want   time.Duration
	}{
		{"no pooler: the whole limit", nil, 10 * time.Second, 30 * time.Second},
		{"pooler without a wait limit", &pooler.Front{}, 10 * time.Second, 30 * time.Second},
		{"what query_wait_timeout leaves", front, 10 * time.Second, 15 * time.Second},
		{"never less than a second", front, 29 * time.Second, time.Second},
	} {
		got := switchWait(30*time.Second, c.front, time.Now().Add(-c.paused))
		if got > c.want || got < c.want-time.Second {
			t.Errorf("%s: waits %s, want %s", c.name, got, c.want)
		}
	}
}
