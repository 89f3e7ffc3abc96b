package backup

import (
	"bufio"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/pgtenant/pgtenant/internal/catalog"
	"github.com/pgtenant/pgtenant/internal/config"
	"github.com/pgtenant/pgtenant/internal/fleet"
)

// ErrExternal is returned for a backup asked of an external cluster: its
// operator's own schedule takes its backups, pgtenant only reads them.
var ErrExternal = errors.New("backups of an external cluster are taken by its operator's own pgBackRest schedule, not by pgtenant")

// ExternalError names the stanza and config of the external cluster a
// backup was asked of. It is ErrExternal and catalog.ErrConflict (the API
// answers 409: the request is fine, the cluster's setup refuses it).
type ExternalError struct {
	Cluster, Stanza, Config string
}

func (e *ExternalError) Error() string {
	return fmt.Sprintf("cluster %s is external: its backups (stanza %s in %s) are taken by its operator's own schedule; "+
		"pgtenant only reads them and restores from them. Take one where that schedule runs: `pgbackrest --config=%s --stanza=%s --type=full backup`",
		e.Cluster, e.Stanza, e.Config, e.Config, e.Stanza)
}

func (e *ExternalError) Unwrap() []error { return []error{ErrExternal, catalog.ErrConflict} }

// ErrRepoNotLocal is returned for the disk and size of an external
// stanza's repository that is not a directory on this host (another
// repo1-type than posix or cifs, or a repo1-host).
var ErrRepoNotLocal = errors.New("the stanza's repository is not a directory on this host (repo1-type s3, gcs, azure or sftp, or repo1-host): its disk and size are not read here")

// ForExternal describes the stanza an external cluster's operator runs, as
// its backup block names it (config.ClusterBackupConfig). dsn is the
// cluster's: a scratch instance restored from the stanza is the cluster
// as it was, entered as the DSN's user with its password. Scratch
// instances live in scratchRoot, a directory of pgtenant's own: the
// operator's hosts have no directory of pgtenant's. Nothing is written or
// run; the config file must exist, and the servers' OS user must be able
// to reach scratchRoot.
func ForExternal(cluster string, b config.ClusterBackupConfig, dsn, scratchRoot string) (*Stanza, error) {
	if err := b.Validate(); err != nil {
		return nil, fmt.Errorf("backup.%w", err)
	}
	prog := b.Program
	if prog == "" {
		var err error
		if prog, err = Find(); err != nil {
			return nil, err
		}
	} else if _, err := os.Stat(prog); err != nil {
		return nil, fmt.Errorf("backup.program: %w (install pgbackrest there, or leave program out to run pgbackrest on PATH)", err)
	}
	conf := b.Config
	if conf == "" {
		conf = config.DefaultPgBackRestConfig
	}
	if _, err := os.Stat(conf); err != nil {
		return nil, fmt.Errorf("backup.config: %w: pgtenant reads stanza %s through its operator's pgbackrest.conf, which must be on this host "+
			"(copy it here, or set config to where it is)", err, b.Stanza)
	}
	pc, err := pgconn.ParseConfig(dsn)
	if err != nil {
		return nil, fmt.Errorf("dsn: %w", err)
	}
	user, err := fleet.ServerUser()
	if err != nil {
		return nil, err
	}
	if err := user.CheckTraversable(scratchRoot); err != nil {
		return nil, fmt.Errorf("scratch instances of stanza %s: %w", b.Stanza, err)
	}
	return &Stanza{Name: b.Stanza, Program: prog, External: true, configPath: conf, password: pc.Password, user: user,
		superuser: pc.User, cluster: cluster, scratchRoot: scratchRoot, repoPath: repoPath(conf, b.Stanza)}, nil
}

// WithExternal returns the managed stanzas and those of the configured
// clusters with a backup block, by cluster name. Their scratch instances
// live in scratchRoot (the daemon gives a directory beside its token file:
// its state, on a disk sized for it, unlike a tmpfs /tmp).
func WithExternal(managed map[string]*Stanza, clusters []config.ClusterConfig, scratchRoot string) (map[string]*Stanza, error) {
	out := map[string]*Stanza{}
	for n, st := range managed {
		out[n] = st
	}
	for i, c := range clusters {
		if c.Backup == nil {
			continue
		}
		if _, ok := out[c.Name]; ok {
			return nil, fmt.Errorf("clusters[%d]: cluster %s is managed by pgtenant up, which backs it up itself: remove its backup block", i, c.Name)
		}
		st, err := ForExternal(c.Name, *c.Backup, c.DSN, scratchRoot)
		if err != nil {
			return nil, fmt.Errorf("clusters[%d] (%s): %w", i, c.Name, err)
		}
		out[c.Name] = st
	}
	return out, nil
}

// externalArgs are the options pgtenant adds for an external stanza: its
// pgbackrest runs log to the console only, so that nothing is written into
// the operator's log-path.
func (s *Stanza) externalArgs() []string {
	if !s.External {
		return nil
	}
	return []string{"--log-level-file=off"}
}

// onThisHost are the options of the commands a scratch instance runs here
// (restore, archive-get): an operator's config run from a repository host
// names the servers' host in pg1-host, and pgBackRest refuses to restore
// onto a remote host.
func (s *Stanza) onThisHost() []string {
	if !s.External {
		return nil
	}
	return []string{"--reset-pg1-host"}
}

func (s *Stanza) externalError() error {
	return &ExternalError{Cluster: s.cluster, Stanza: s.Name, Config: s.configPath}
}

// repoPath reads repo1-path from an operator's pgbackrest.conf (the
// stanza's section over [global]; pgBackRest's default
// /var/lib/pgbackrest), "" when repo1 is not a directory on this host.
// Files under config-include-path are not read: a repo1-path set there
// only leaves the repository's disk and size unread (and the newest
// archived segment's time: the window then ends at the newest backup).
func repoPath(configPath, stanza string) string {
	f, err := os.Open(configPath)
	if err != nil {
		return ""
	}
	defer f.Close()
	vals := map[string]map[string]string{"global": {}, stanza: {}}
	section := ""
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		if strings.HasPrefix(line, "[") && strings.HasSuffix(line, "]") {
			section = strings.TrimSpace(line[1 : len(line)-1])
			continue
		}
		k, v, ok := strings.Cut(line, "=")
		if m, known := vals[section]; ok && known {
			m[strings.TrimSpace(k)] = strings.TrimSpace(v)
		}
	}
	get := func(k string) string {
		if v, ok := vals[stanza][k]; ok {
			return v
		}
		return vals["global"][k]
	}
	if t := get("repo1-type"); (t != "" && t != "posix" && t != "cifs") || get("repo1-host") != "" {
		return ""
	}
	if p := get("repo1-path"); p != "" {
		return filepath.Clean(p)
	}
	return "/var/lib/pgbackrest"
}
