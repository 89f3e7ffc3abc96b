package fleet_test

import (
	"testing"

	"github.com/pgtenant/pgtenant/internal/fleet"
)

// TestArchiveCommand_Quoted: archive_command is one quoted value in
// postgresql.conf (unquoted, its spaces end it), quotes in it doubled, and
// a path the shell would split or expand is quoted for the shell.
func TestArchiveCommand_Quoted(t *testing.T) {
	for _, tc := range []struct{ config, want string }{
		{"/data/local/backup/pgbackrest.conf",
			`'/usr/bin/pgbackrest --config=/data/local/backup/pgbackrest.conf --stanza=local archive-push %p'`},
		{"/data/my fleet/local/backup/pgbackrest.conf",
			`'/usr/bin/pgbackrest --config=''/data/my fleet/local/backup/pgbackrest.conf'' --stanza=local archive-push %p'`},
		{"/data/it's/pgbackrest.conf",
			`'/usr/bin/pgbackrest --config=''/data/it''\''''s/pgbackrest.conf'' --stanza=local archive-push %p'`},
	} {
		if got := fleet.ArchiveCommand("/usr/bin/pgbackrest", tc.config, "local"); got != tc.want {
			t.Errorf("ArchiveCommand(%q) = %s, want %s", tc.config, got, tc.want)
		}
	}
}
