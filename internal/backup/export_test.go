package backup

import "context"

// CreateStanza is createStanza, which Setup runs only for a stanza not
// made yet.
func (s *Stanza) CreateStanza(ctx context.Context) error { return s.createStanza(ctx) }

// InfoRuns is how many `pgbackrest info` the stanza has run.
func (s *Stanza) InfoRuns() int64 { return s.infoRuns.Load() }
