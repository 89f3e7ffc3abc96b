package config_test

import (
	"strings"
	"testing"

	"github.com/pgtenant/pgtenant/internal/config"
)

// TestParse_ClusterBackup: an external cluster's backup block, its
// defaults, and validation naming the bad key.
func TestParse_ClusterBackup(t *testing.T) {
	const head = "clusters:\n  - name: c1\n    dsn: postgres://admin@db1/postgres\n"
	cfg, err := config.Parse([]byte(head + "    backup: {stanza: main}\n"))
	if err != nil {
		t.Fatal(err)
	}
	got, want := cfg.Clusters[0].Backup, config.ClusterBackupConfig{Stanza: "main", Config: "/etc/pgbackrest/pgbackrest.conf"}
	if got == nil || *got != want {
		t.Errorf("clusters[0].backup = %+v, want %+v", got, want)
	}
	cfg, err = config.Parse([]byte(head + "    backup:\n      stanza: db1.main\n      config: /srv/pgbackrest/db1.conf\n      program: /opt/pgbackrest/bin/pgbackrest\n"))
	if err != nil {
		t.Fatal(err)
	}
	want = config.ClusterBackupConfig{Stanza: "db1.main", Config: "/srv/pgbackrest/db1.conf", Program: "/opt/pgbackrest/bin/pgbackrest"}
	if got := cfg.Clusters[0].Backup; got == nil || *got != want {
		t.Errorf("clusters[0].backup = %+v, want %+v", got, want)
	}
	cfg, err = config.Parse([]byte(head))
	if err != nil {
		t.Fatal(err)
	}
	if b := cfg.Clusters[0].Backup; b != nil {
		t.Errorf("clusters[0].backup = %+v without a block, want nil", b)
	}
	for _, tc := range []struct{ yaml, want string }{
		{"    backup:\n", "clusters[0].backup.stanza: required"},
		{"    backup: {}\n", "clusters[0].backup.stanza: required"},
		{"    backup: {config: /etc/pgbackrest/pgbackrest.conf}\n", "clusters[0].backup.stanza: required"},
		{"    backup: {stanza: \"main; rm -rf /\"}\n", "clusters[0].backup.stanza: \"main; rm -rf /\": letters, digits"},
		{"    backup: {stanza: -main}\n", "clusters[0].backup.stanza"},
		{"    backup: {stanza: main, config: pgbackrest.conf}\n", "clusters[0].backup.config: \"pgbackrest.conf\": an absolute path"},
		{"    backup: {stanza: main, config: \"/etc/pg backrest.conf\"}\n", "clusters[0].backup.config"},
		{"    backup: {stanza: main, program: pgbackrest}\n", "clusters[0].backup.program: \"pgbackrest\": an absolute path"},
		{"    backup: {stanza: main, repo: /var/lib/pgbackrest}\n", "field repo not found"},
	} {
		if _, err := config.Parse([]byte(head + tc.yaml)); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("Parse(%q) = %v, want an error containing %q", tc.yaml, err, tc.want)
		}
	}
}
