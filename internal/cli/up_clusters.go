package cli

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/pgtenant/pgtenant/internal/backup"
	"github.com/pgtenant/pgtenant/internal/catalog"
	"github.com/pgtenant/pgtenant/internal/failover"
	"github.com/pgtenant/pgtenant/internal/fleet"
	"github.com/pgtenant/pgtenant/internal/patroni"
)

// upCluster is one cluster `up` runs: servers it runs itself
// (internal/fleet), or Patroni nodes that run them (internal/patroni).
type upCluster struct {
	name string
	// sup is what up's supervisor keeps running: the servers, or the
	// Patroni processes.
	sup fleet.Supervised
	// managed is the cluster as the daemon registers it; catalogDSN is its
	// primary's database pgtenant (local's is the catalog).
	managed    catalog.Cluster
	catalogDSN string
	nodes      []nodeInfo
	stop       func(context.Context) error // nil when nothing was started
}

// startFleetCluster opens (or makes) and starts a cluster up runs itself,
// with its backups when withBackups (pgBackRest installed): the stanza
// is returned for the daemon.
func startFleetCluster(ctx context.Context, g *globals, dir, name string, standbys int, withBackups, first bool, log *slog.Logger) (upCluster, *backup.Stanza, error) {
	fc, err := fleet.Open(fleet.Options{Dir: filepath.Join(dir, name), Name: name, Standbys: standbys, Logger: log, Backups: withBackups, Metering: true})
	if err != nil {
		return upCluster{}, nil, err
	}
	if first && fc.RunsAsPostgres() {
		fmt.Fprintln(g.stderr, "running as root: PostgreSQL runs as the postgres OS user; the cluster files are owned by it")
	}
	fmt.Fprintf(g.stderr, "starting cluster %s (PostgreSQL %s from %s) in %s\n", name, fc.Binaries().Version, fc.Binaries().Dir, filepath.Join(dir, name))
	uc := upCluster{name: name, sup: fc, stop: fc.Stop}
	if fc.Backups() {
		// The config is there before the archiver first needs it.
		st, err := backup.ForCluster(fc, true)
		if err != nil {
			return uc, nil, err
		}
		if err := st.Prepare(); err != nil {
			return uc, nil, fmt.Errorf("cluster %s: backups: %w", name, err)
		}
	}
	if err := fc.Start(ctx); err != nil {
		return uc, nil, err
	}
	// The ports are known once started (a new cluster's are picked then).
	uc.catalogDSN = fc.PrimaryDSN("pgtenant")
	uc.managed = catalog.Cluster{Name: name, DSN: fc.PrimaryDSN("postgres")}
	for _, s := range fc.Standbys() {
		uc.managed.StandbyDSNs = append(uc.managed.StandbyDSNs, fc.DSN(s, "postgres"))
	}
	for _, n := range append([]fleet.Node{fc.Primary()}, fc.Standbys()...) {
		uc.nodes = append(uc.nodes, newNodeInfo(n.Name, fleet.Superuser, n.Port))
	}
	if !fc.Backups() {
		if withBackups {
			fmt.Fprintf(g.stderr, "cluster %s was made without backups (before pgbackrest was installed): it has no WAL archive\n", name)
		}
		return uc, nil, nil
	}
	// Backups are read from the first standby, sparing the primary.
	st, err := backup.ForCluster(fc, true)
	if err != nil {
		return uc, nil, err
	}
	if err := st.Setup(ctx); err != nil {
		return uc, nil, fmt.Errorf("cluster %s: backups: %w", name, err)
	}
	return uc, st, nil
}

// newNodeInfo is a node as up prints it: the superuser's DSN of its
// postgres database, without the password.
func newNodeInfo(name, superuser string, port int) nodeInfo {
	return nodeInfo{Name: name, DSN: "postgres://" + superuser + "@127.0.0.1:" + strconv.Itoa(port) + "/postgres?sslmode=disable"}
}

// upUnderPatroni decides whether up runs the data dir's clusters under
// Patroni: a data dir made so always is, one made without it never is
// (--patroni is refused), a new one is when --patroni asks. Patroni and
// etcd must then be installed.
func upUnderPatroni(dir string, asked bool) (bool, error) {
	var fleetMade, patroniMade bool
	for _, name := range dataDirClusters(dir) {
		if _, err := os.Stat(filepath.Join(dir, name, "patroni.json")); err == nil {
			patroniMade = true
		} else {
			fleetMade = true
		}
	}
	if asked && fleetMade {
		return false, usagef("%s was made without Patroni: its clusters are run by up itself (run `pgtenant up` without --patroni), "+
			"or make a fleet under Patroni in another --data-dir", dir)
	}
	if !asked && !patroniMade {
		return false, nil
	}
	var missing []string
	for _, p := range []struct{ program, pkg string }{{"patroni", "patroni"}, {"etcd", "etcd-server"}} {
		if _, err := exec.LookPath(p.program); err != nil {
			missing = append(missing, p.pkg)
		}
	}
	if len(missing) > 0 {
		return false, fmt.Errorf("clusters under Patroni need %s: apt-get install -y %s (make run and make test install them as root)",
			strings.Join(missing, " and "), strings.Join(missing, " "))
	}
	return true, nil
}

// startUpEtcd starts the one-member etcd the data dir's Patroni nodes
// keep their leader locks in (DATA_DIR/etcd, the same ports each time).
func startUpEtcd(ctx context.Context, g *globals, dir string, log *slog.Logger) ([]string, func(context.Context) error, error) {
	e, err := patroni.StartEtcd(ctx, patroni.EtcdOptions{Dir: filepath.Join(dir, "etcd"), Logger: log})
	if err != nil {
		return nil, nil, err
	}
	fmt.Fprintf(g.stderr, "etcd (Patroni's store) on %s\n", e.Endpoint())
	return []string{e.Endpoint()}, e.Stop, nil
}

// startPatroniCluster starts (or makes) a cluster of 1 + standbys nodes
// under Patroni, with the settings up gives its own clusters, and waits
// for its leader.
func startPatroniCluster(ctx context.Context, g *globals, dir, name string, standbys int, etcd []string, pgbackrest string, log *slog.Logger) (upCluster, *backup.Stanza, error) {
	settings := patroni.DefaultSettings()
	conf := fleet.DefaultSettings()
	if b, err := fleet.FindBinaries(0); err == nil {
		conf = fleet.WithMetering(conf, b) // usage's CPU seconds, when pg_stat_kcache is installed
	}
	settings.Parameters = patroniParameters(conf)
	pc, err := patroni.NewCluster(patroni.ClusterOptions{Scope: name, Dir: filepath.Join(dir, name), Nodes: 1 + standbys, Etcd: etcd,
		Settings: settings, PgBackRest: pgbackrest, Logger: log})
	if err != nil {
		return upCluster{}, nil, err
	}
	var st *backup.Stanza
	if pc.Backups() {
		// The config is there before the archiver first needs it.
		if st, err = backup.ForPatroni(pc); err != nil {
			return upCluster{}, nil, err
		}
		if err := st.Prepare(); err != nil {
			return upCluster{}, nil, fmt.Errorf("cluster %s: backups: %w", name, err)
		}
	}
	fmt.Fprintf(g.stderr, "starting cluster %s under Patroni (%d nodes; ttl %v, loop_wait %v, retry_timeout %v, synchronous_mode %v) in %s\n",
		name, len(pc.Nodes), settings.TTL, settings.LoopWait, settings.RetryTimeout, settings.SynchronousMode, filepath.Join(dir, name))
	// A node whose Patroni does not stop within a minute is killed, and its
	// PostgreSQL shut down immediately (crash recovery at the next start):
	// Ctrl-C never leaves a server behind.
	stop := func(ctx context.Context) error {
		ctx, cancel := context.WithTimeout(ctx, time.Minute)
		defer cancel()
		return pc.Stop(ctx)
	}
	uc := upCluster{name: name, sup: pc, stop: stop, catalogDSN: pc.PrimaryDSN("pgtenant")}
	if err := pc.Start(ctx); err != nil {
		return uc, nil, err
	}
	// The superuser's password where a cluster up runs itself keeps it.
	if err := os.WriteFile(filepath.Join(dir, name, "superuser.password"), []byte(pc.Passwords.Superuser+"\n"), 0o600); err != nil {
		return uc, nil, err
	}
	primary, replicas, err := failover.Topology(ctx, pc.URLs, pc.DSN(1, "postgres"), nil)
	if err != nil {
		return uc, nil, fmt.Errorf("cluster %s: %w", name, err)
	}
	uc.managed = catalog.Cluster{Name: name, DSN: primary, StandbyDSNs: replicas, PatroniURLs: pc.URLs}
	for _, n := range pc.Nodes {
		uc.nodes = append(uc.nodes, newNodeInfo(n.Name(), patroni.SuperuserName, n.Port()))
	}
	if st != nil {
		if err := st.Setup(ctx); err != nil {
			return uc, nil, fmt.Errorf("cluster %s: backups: %w", name, err)
		}
	}
	return uc, st, nil
}

// patroniParameters are up's postgresql.conf settings as Patroni's
// parameters: unquoted (Patroni quotes what it writes), without what
// Patroni sets itself (the listen address, the socket dir).
func patroniParameters(conf map[string]string) map[string]string {
	out := map[string]string{}
	for k, v := range conf {
		switch k {
		case "listen_addresses", "unix_socket_directories", "port":
			continue
		}
		if len(v) >= 2 && strings.HasPrefix(v, "'") && strings.HasSuffix(v, "'") {
			v = strings.ReplaceAll(v[1:len(v)-1], "''", "'")
		}
		out[k] = v
	}
	return out
}
