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
	// socketDir holds every node's Unix socket: its pooler reaches the
	// primary there ("": over TCP).
	socketDir string
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
	uc := upCluster{name: name, sup: fc, stop: fc.Stop, socketDir: fc.SocketDir()}
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

// upUnderPatroni decides how up runs the data dir's clusters: under
// Patroni, with the etcd members it returns (1 or 3), or itself (0). A data
// dir made under Patroni always is, one made without it never is (an
// explicit --patroni or --etcd is refused); a new one is unless
// --patroni=false, and then patroni and etcd must be installed (the
// error says what to install, or to ask for --patroni=false). Clusters up
// runs itself come with a warning (note): no failover. The etcd's member count
// is the data dir's once made: another --etcd is refused. The usage errors
// come first, so that they do not depend on what is installed.
func upUnderPatroni(dir string, o upOptions) (etcd int, note string, err error) {
	var fleetMade, patroniMade bool
	for _, name := range dataDirClusters(dir) {
		if _, err := os.Stat(filepath.Join(dir, name, "patroni.json")); err == nil {
			patroniMade = true
		} else {
			fleetMade = true
		}
	}
	switch {
	case fleetMade && (o.patroniSet && o.patroni || o.etcdSet):
		return 0, "", usagef("%s was made without Patroni: its clusters are run by up itself (run `pgtenant up` without --patroni or --etcd), "+
			"or make a fleet under Patroni in another --data-dir", dir)
	case patroniMade && o.patroniSet && !o.patroni:
		return 0, "", usagef("%s was made under Patroni: its clusters always run under it (run `pgtenant up` without --patroni=false), "+
			"or make a fleet without Patroni in another --data-dir", dir)
	case o.patroniSet && !o.patroni && o.etcdSet:
		return 0, "", usagef("--etcd %d: etcd is Patroni's store, and --patroni=false runs the clusters without Patroni: drop one of the two", o.etcd)
	case !patroniMade && (fleetMade || o.patroniSet && !o.patroni):
		return 0, noFailover, nil
	}
	have, err := patroni.EtcdMembers(filepath.Join(dir, "etcd"))
	if err != nil {
		return 0, "", err
	}
	etcd = o.etcd
	if have != 0 {
		if o.etcdSet && o.etcd != have {
			return 0, "", usagef("--etcd %d: %s has %d etcd member(s), fixed when it was made: run `pgtenant up` without --etcd, "+
				"or make a fleet with --etcd %d in another --data-dir", o.etcd, dir, have, o.etcd)
		}
		etcd = have
	}
	var missing []string
	for _, p := range []struct{ program, pkg string }{{"patroni", "patroni"}, {"etcd", "etcd-server"}} {
		if _, err := exec.LookPath(p.program); err != nil {
			missing = append(missing, p.pkg)
		}
	}
	if len(missing) > 0 {
		how := "make run and make test install them as root"
		if !patroniMade {
			how += "; or run this fleet's clusters without failover: pgtenant up --patroni=false"
		}
		return 0, "", fmt.Errorf("clusters under Patroni need %s: apt-get install -y %s (%s)", strings.Join(missing, " and "), patroniPackages, how)
	}
	return etcd, "", nil
}

// noFailover is what up says at each start of clusters it runs itself.
const noFailover = "WARNING: no failover: up runs this data dir's clusters itself (--patroni=false, or made so): " +
	"when a primary dies, up restarts it, but if its machine or disk is lost its tenants are down until a person " +
	"promotes the standby (docs/operations/failover.md); a new data dir runs under Patroni by default"

// patroniPackages are Debian's packages of clusters under Patroni
// (python3-etcd: Patroni's etcd3 store imports it, and the patroni
// package's dependency may be met by another store's client).
const patroniPackages = "patroni etcd-server python3-etcd"

// startUpEtcd starts the data dir's etcd, where its Patroni nodes keep
// their leader locks: members etcd members (DATA_DIR/etcd for one,
// DATA_DIR/etcd/e1, e2, e3 for three; the same ports each time).
func startUpEtcd(ctx context.Context, g *globals, dir string, members int, log *slog.Logger) (*patroni.EtcdCluster, error) {
	e, err := patroni.StartEtcdCluster(ctx, patroni.EtcdClusterOptions{Dir: filepath.Join(dir, "etcd"), Members: members, Logger: log})
	if err != nil {
		return nil, err
	}
	fmt.Fprintf(g.stderr, "etcd (Patroni's store, %d member(s)) on %s\n", len(e.Members), strings.Join(e.Endpoints(), ", "))
	return e, nil
}

// startPatroniCluster starts (or makes) a cluster of 1 + standbys nodes
// under Patroni, with the settings up gives its own clusters, and waits
// for its leader.
func startPatroniCluster(ctx context.Context, g *globals, dir, name string, standbys int, etcd []string, pgbackrest string, log *slog.Logger) (upCluster, *backup.Stanza, error) {
	pc, err := newPatroniCluster(dir, name, 1+standbys, etcd, pgbackrest, log)
	if err != nil {
		return upCluster{}, nil, err
	}
	settings := pc.Settings()
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
	uc := upCluster{name: name, sup: pc, stop: stop, catalogDSN: pc.PrimaryDSN("pgtenant"), socketDir: pc.SocketDir()}
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

// newPatroniCluster is cluster name of data dir dir under Patroni (nodes
// nodes, or the ones it has), with the settings up gives its own clusters.
func newPatroniCluster(dir, name string, nodes int, etcd []string, pgbackrest string, log *slog.Logger) (*patroni.Cluster, error) {
	settings := patroni.DefaultSettings()
	conf := fleet.DefaultSettings()
	if b, err := fleet.FindBinaries(0); err == nil {
		conf = fleet.WithMetering(conf, b) // usage's CPU seconds, when pg_stat_kcache is installed
	}
	settings.Parameters = patroniParameters(conf)
	return patroni.NewCluster(patroni.ClusterOptions{Scope: name, Dir: filepath.Join(dir, name), Nodes: nodes, Etcd: etcd,
		Settings: settings, PgBackRest: pgbackrest, Logger: log})
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
