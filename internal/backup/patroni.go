package backup

import (
	"fmt"

	"github.com/pgtenant/pgtenant/internal/patroni"
)

// ForPatroni describes the stanza of a cluster Patroni runs that archives
// (patroni.ClusterOptions.PgBackRest), laid out as a managed cluster's
// (its config, repository, log, spool and locks under the cluster's
// backup dir). pg1 and pg2 are its first two nodes, whichever leads:
// pgBackRest finds the primary among them at each command and, with two,
// takes backups from the other one (backup-standby), so a failover
// changes nothing here. Nothing is written; Setup does.
func ForPatroni(pc *patroni.Cluster) (*Stanza, error) {
	if !pc.Backups() {
		return nil, fmt.Errorf("cluster %s: %w", pc.Name(), ErrNotConfigured)
	}
	s, err := ownStanza(pc.Name(), pc.BackupDir(), pc.BackupConfigPath(), patroni.SuperuserName, pc.Passwords.Superuser)
	if err != nil {
		return nil, err
	}
	n1 := pc.Nodes[0]
	s.Primary = Node{Path: n1.DataDir(), Port: n1.Port()}
	if len(pc.Nodes) > 1 {
		n2 := pc.Nodes[1]
		s.Standby = &Node{Path: n2.DataDir(), Port: n2.Port()}
	}
	return s, nil
}
