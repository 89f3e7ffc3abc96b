package backup

import (
	"errors"
	"path/filepath"
	"strings"
	"testing"
)

// TestScratchRoom: a rewind's or a fork's scratch restore is refused before
// it starts when the disk it would be on has not room for the database and
// a margin, naming what it needs and where; one that fits passes.
func TestScratchRoom(t *testing.T) {
	root := t.TempDir()
	s := &Stanza{Name: "local", Dir: filepath.Join(root, "local", "backup")} // not made yet: its disk is root's
	if err := s.ScratchRoom("fork-1", 1<<20); err != nil {
		t.Errorf("1 MiB: %v; want room", err)
	}
	err := s.ScratchRoom("fork-1", 1<<60)
	if !errors.Is(err, ErrNoRoom) || !strings.Contains(err.Error(), "free in "+root) || !strings.Contains(err.Error(), "1.0 EiB now") {
		t.Errorf("1 EiB: %v; want ErrNoRoom naming %s and the database's size", err, root)
	}
}
