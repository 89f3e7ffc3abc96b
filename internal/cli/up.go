package cli

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/spf13/cobra"
	"golang.org/x/sync/errgroup"

	"github.com/pgtenant/pgtenant/internal/backup"
	"github.com/pgtenant/pgtenant/internal/config"
	"github.com/pgtenant/pgtenant/internal/daemon"
	"github.com/pgtenant/pgtenant/internal/fleet"
	"github.com/pgtenant/pgtenant/internal/patroni"
	"github.com/pgtenant/pgtenant/internal/pooler"
	"github.com/pgtenant/pgtenant/internal/tlsca"
)

// upInfo is what `up` prints once the fleet and the daemon run.
type upInfo struct {
	URL          string `json:"url"`
	Token        string `json:"token"`
	TokenFile    string `json:"token_file"`
	PasswordFile string `json:"superuser_password_file"`
	// Nodes and Pooler are the first cluster's (local), as before --clusters.
	Nodes []nodeInfo `json:"nodes"`
	// Pooler is the PgBouncer tenants connect through (host:port), "" without one.
	Pooler string `json:"pooler,omitempty"`
	// Clusters are every cluster up runs, local first.
	Clusters []clusterInfo `json:"clusters"`

	// Analytics is the port tenants query their analytics mirrors on.
	Analytics string `json:"analytics,omitempty"`

	// CAFile is the local CA that signed the certificate of the poolers
	// and the analytics port: clients' sslrootcert.
	CAFile string `json:"ca_file,omitempty"`

	// CredentialsKeyFile seals the passwords kept for retried creates.
	CredentialsKeyFile string `json:"credentials_key_file,omitempty"`

	// Templates are the templates the catalog holds already (a restarted
	// fleet): the next steps printed use them instead of creating saas.
	Templates []string `json:"templates,omitempty"`
}

type clusterInfo struct {
	Name         string     `json:"name"`
	Nodes        []nodeInfo `json:"nodes"`
	Pooler       string     `json:"pooler,omitempty"`
	PasswordFile string     `json:"superuser_password_file"`
	// Patroni are the REST APIs of the cluster's Patroni nodes (up
	// --patroni); none for a cluster up runs itself.
	Patroni []string `json:"patroni,omitempty"`
}

type nodeInfo struct {
	Name string `json:"name"`
	DSN  string `json:"dsn"` // without the password
}

func newUpCmd(g *globals) *cobra.Command {
	var listen, cfgPath string
	var standbys, maxRestarts, clusters, etcd int
	var withPooler, allowFewer, underPatroni bool
	cmd := &cobra.Command{
		Use:   "up",
		Short: "Start a local fleet (clusters of a primary + standbys) and the daemon, in the foreground",
		Long: `Start a local managed PostgreSQL cluster named "local" (a primary and --standbys
streaming standbys, made with initdb and pg_basebackup on free loopback ports) under
--data-dir, its catalog, a PgBouncer in front of it (the tenants' front door, on a
loopback port of its own; --pooler=false: none) and the pgtenant daemon. With
--clusters N, N clusters: local, local2, local3, … each with its standbys and its
PgBouncer, under DATA_DIR/local, DATA_DIR/local2, …; the catalog lives on local.
Ctrl-C stops the daemon and the poolers, then each cluster's primary, then its
standbys. Running it again restarts what is there: without --clusters, every
cluster the data dir has (a line says so); a --clusters smaller than that is
refused, naming the clusters it would leave down, unless --allow-fewer says to
leave them down (their tenants are unreachable until an up starts them again;
the other clusters' tenants and front doors are not affected).

A new data dir's clusters run under Patroni when patroni and etcd are installed:
up starts an etcd of --etcd members (1, or 3 on loopback ports: one lost leaves a
quorum; DATA_DIR/etcd) and a Patroni per node (DATA_DIR/local/n1, n2, …), which run
the servers: a standby is promoted when the primary's node dies, the daemon follows
the new leader (catalog, pools, PgBouncer), and ` + "`cluster switchover`" + ` works. Without
them installed, up says what to install and stops; --patroni=false makes a data dir
whose clusters up runs itself, without failover (a warning at each start). A data
dir keeps what it was made with
(plain up detects it): one made under Patroni refuses --patroni=false and another
--etcd, one made without refuses --patroni and --etcd. Clusters under Patroni
archive and are backed up with pgBackRest as the others are (pgBackRest finds
whichever node leads).

While it runs, up restarts a server of the cluster that dies (checked every 2 s;
backoff from 1 s doubling to 1 min between failed attempts) and gives up on it after
--max-restarts failed attempts in a row, with an error naming its log (under
Patroni: a node's Patroni, or an etcd member, that dies; Patroni restarts its
server). A server stopped by hand is restarted: to take one down, stop up.

The PgBouncers and the analytics port serve TLS with a certificate signed by a
local CA that up makes under DATA_DIR/tls (kept, renewed 30 days before it ends):
tenants' DSNs say sslmode=verify-full sslrootcert=DATA_DIR/tls/ca.crt. The API
stays plain HTTP on loopback.

As root, PostgreSQL runs as the postgres OS user.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			// The flags are checked before anything is read or started.
			switch {
			case standbys < 0 || standbys > 5:
				return usagef("--standbys %d: must be 0 to 5", standbys)
			case maxRestarts < 0:
				return usagef("--max-restarts %d: must be 0 (never restart) or more", maxRestarts)
			case clusters < 1 || clusters > 8:
				return usagef("--clusters %d: must be 1 to 8", clusters)
			case etcd != 1 && etcd != 3:
				return usagef("--etcd %d: must be 1 or 3 (three members keep a quorum when one is lost)", etcd)
			}
			cfg := config.Default()
			if cfgPath != "" {
				var err error
				if cfg, err = config.Load(cfgPath); err != nil {
					return err
				}
			}
			if cmd.Flags().Changed("listen") || cfgPath == "" {
				cfg.Listen = listen
			}
			return runUp(cmd.Context(), g, cfg, upOptions{standbys: standbys, maxRestarts: maxRestarts, pooler: withPooler, clusters: clusters,
				clustersSet: cmd.Flags().Changed("clusters"), allowFewer: allowFewer, patroni: underPatroni, patroniSet: cmd.Flags().Changed("patroni"),
				etcd: etcd, etcdSet: cmd.Flags().Changed("etcd")})
		},
	}
	cmd.Flags().StringVar(&listen, "listen", "127.0.0.1:8080", "address of the API, /metrics and the console")
	cmd.Flags().IntVar(&standbys, "standbys", 1, "streaming standbys of each local cluster")
	cmd.Flags().IntVar(&clusters, "clusters", 1, "managed clusters to run: local, local2, … (1 to 8); default: as many as the data dir has, at least 1")
	cmd.Flags().BoolVar(&allowFewer, "allow-fewer", false, "start fewer --clusters than the data dir has: the others stay down, and their tenants unreachable")
	cmd.Flags().IntVar(&maxRestarts, "max-restarts", 5, "failed restart attempts in a row after which up gives up on a server that died; 0: never restart")
	cmd.Flags().BoolVar(&withPooler, "pooler", true, "run a PgBouncer in front of each cluster: tenants' DSNs point at it")
	cmd.Flags().BoolVar(&underPatroni, "patroni", true, "make a new data dir's clusters under Patroni (an etcd, a Patroni per node): "+
		"a standby takes over when the primary's node dies; patroni and etcd must be installed. "+
		"--patroni=false: up runs them itself, without failover. A data dir keeps what it was made with")
	cmd.Flags().IntVar(&etcd, "etcd", 1, "etcd members of a new data dir under Patroni: 1, or 3 (one lost leaves a quorum, and the leaders keep leading); "+
		"fixed when the data dir is made")
	cmd.Flags().StringVar(&cfgPath, "config", "", "optional config file for tiers, pools and budgets (clusters and catalog are set by up)")
	return cmd
}

type upOptions struct {
	standbys, maxRestarts, clusters int
	pooler                          bool
	// patroni: --patroni's value (true unless --patroni=false), which
	// patroniSet says was given; etcd: --etcd's, which etcdSet says was
	// given. upUnderPatroni decides from them and the data dir.
	patroni, patroniSet bool
	etcd                int
	etcdSet             bool
	// clustersSet: --clusters was given; allowFewer: --allow-fewer.
	clustersSet, allowFewer bool
}

// dataDirClusters returns the clusters a data dir has: ClusterName(0) up to
// the last one whose directory holds a cluster (its fleet state file), or
// none for a new data dir.
func dataDirClusters(dir string) []string {
	n := 0
	for i := range 8 {
		for _, state := range []string{"cluster.json", "patroni.json"} {
			if _, err := os.Stat(filepath.Join(dir, ClusterName(i), state)); err == nil {
				n = i + 1
			}
		}
	}
	names := make([]string, n)
	for i := range n {
		names[i] = ClusterName(i)
	}
	return names
}

// clusterCount is how many clusters up starts on a data dir that has the
// clusters in have. A cluster is never dropped silently: tenants live on it,
// and some may still be fronted by another cluster's pooler (moved there).
// Without --clusters, up starts them all; a smaller --clusters is refused
// unless --allow-fewer says to leave the others down. The note is the line
// up prints about it, "" when there is nothing to say.
func clusterCount(dir string, have []string, o upOptions) (n int, note string, err error) {
	if len(have) <= o.clusters {
		return o.clusters, "", nil
	}
	left := strings.Join(have[o.clusters:], ", ")
	switch {
	case !o.clustersSet:
		return len(have), fmt.Sprintf("this data dir has %d clusters (%s): starting them all (--clusters %d)", len(have), strings.Join(have, ", "), len(have)), nil
	case o.allowFewer:
		return o.clusters, fmt.Sprintf("--allow-fewer: leaving %s down: their tenants are unreachable until an up starts them (plain `pgtenant up` starts all %d)", left, len(have)), nil
	}
	return 0, "", usagef("%s has %d clusters (%s): --clusters %d would leave %s down and their tenants unreachable; "+
		"run `pgtenant up` (it starts every cluster a data dir has) or `pgtenant up --clusters %d`, or add --allow-fewer to leave %s down on purpose",
		dir, len(have), strings.Join(have, ", "), o.clusters, left, len(have), left)
}

// ClusterName is the name of up's i-th cluster (0-based): local, local2, local3, …
func ClusterName(i int) string {
	if i == 0 {
		return "local"
	}
	return "local" + strconv.Itoa(i+1)
}

func runUp(ctx context.Context, g *globals, cfg config.Config, o upOptions) error {
	log := slog.New(slog.NewTextHandler(g.stderr, &slog.HandlerOptions{Level: slog.LevelInfo}))
	dir, err := filepath.Abs(g.dataDir)
	if err != nil {
		return err
	}
	if err := os.MkdirAll(dir, 0o711); err != nil {
		return fmt.Errorf("create data dir: %w", err)
	}
	unlock, err := lockDir(dir)
	if err != nil {
		return err
	}
	defer unlock()
	n, note, err := clusterCount(dir, dataDirClusters(dir), o)
	if err != nil {
		return err
	}
	if note != "" {
		fmt.Fprintln(g.stderr, note)
	}
	o.clusters = n

	etcdMembers, patroniNote, err := upUnderPatroni(dir, o)
	if err != nil {
		return err
	}
	if patroniNote != "" {
		fmt.Fprintln(g.stderr, patroniNote)
	}
	underPatroni := etcdMembers > 0
	var ucs []upCluster
	// The clusters are stopped with a context of their own: ctx is already
	// cancelled when Ctrl-C brings us here. Deferred first, so that it runs
	// after everything else up started has stopped.
	var etcd *patroni.EtcdCluster
	defer func() {
		sctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
		defer cancel()
		for _, uc := range ucs {
			fmt.Fprintln(g.stderr, "stopping cluster", uc.name)
			if err := uc.stop(sctx); err != nil {
				fmt.Fprintln(g.stderr, "stop:", err)
			}
		}
		if etcd != nil {
			if err := etcd.Stop(sctx); err != nil {
				fmt.Fprintln(g.stderr, "stop etcd:", err)
			}
		}
	}()
	stanzas := map[string]*backup.Stanza{}
	// New clusters archive their WAL and get backups with pgBackRest when it
	// is installed (internal/backup), under Patroni too.
	pgbackrest, noBackRest := backup.Find()
	if noBackRest != nil {
		fmt.Fprintln(g.stderr, "pgbackrest is not installed: new clusters get no WAL archive and no backups; to have them: "+backup.InstallHint)
	}
	if underPatroni {
		if etcd, err = startUpEtcd(ctx, g, dir, etcdMembers, log); err != nil {
			return err
		}
	}
	for i := range o.clusters {
		var uc upCluster
		var st *backup.Stanza
		if underPatroni {
			uc, st, err = startPatroniCluster(ctx, g, dir, ClusterName(i), o.standbys, etcd.Endpoints(), pgbackrest, log)
		} else {
			uc, st, err = startFleetCluster(ctx, g, dir, ClusterName(i), o.standbys, noBackRest == nil, i == 0, log)
		}
		if uc.stop != nil {
			ucs = append(ucs, uc)
		}
		if err != nil {
			return err
		}
		if st != nil {
			stanzas[uc.name] = st
		}
	}

	cfg.Catalog.DSN = ucs[0].catalogDSN
	cfg.TokenFile = filepath.Join(dir, "token")
	if cfg.Credentials.KeyFile == "" {
		cfg.Credentials.KeyFile = filepath.Join(dir, "credentials.key")
	}
	if cfg.Analytics.Listen == "" {
		// A free port the first time, the same one after: tenants keep
		// their analytics DSNs.
		port, err := pooler.LocalPort(filepath.Join(dir, "local", "analytics"))
		if err != nil {
			return fmt.Errorf("analytics port: %w", err)
		}
		cfg.Analytics.Listen = "127.0.0.1:" + strconv.Itoa(port)
	}
	// TLS on every port a tenant uses: a local CA and a certificate it
	// signs for loopback, kept under the data dir (made once, renewed
	// when it nears its end). The analytics port gets it as a pair of its
	// own: the API stays plain HTTP, which the CLI speaks.
	ca, err := tlsca.Ensure(filepath.Join(dir, "tls"))
	if err != nil {
		return fmt.Errorf("local CA: %w", err)
	}
	if cfg.Analytics.TLSCertFile == "" && cfg.Analytics.TLSKeyFile == "" {
		cfg.Analytics.TLSCertFile, cfg.Analytics.TLSKeyFile, cfg.Analytics.TLSCAFile = ca.Cert, ca.Key, ca.CA
	}
	// What up's supervisors keep running: each cluster's servers (or
	// Patroni nodes), and the etcd members under Patroni.
	var sups []fleet.Supervised
	for _, uc := range ucs {
		sups = append(sups, uc.sup)
	}
	if etcd != nil {
		sups = append(sups, etcd)
	}
	restarts := restartCounter(sups)
	opts := daemon.Options{Config: cfg, Collectors: []prometheus.Collector{restarts}, Logger: log, Poolers: map[string]config.PoolerConfig{},
		Backups: stanzas}
	for _, uc := range ucs {
		opts.Managed = append(opts.Managed, uc.managed)
		if o.pooler {
			pc, err := localPooler(filepath.Join(dir, uc.name, "pooler"), ca, uc.socketDir)
			if err != nil {
				return err
			}
			opts.Poolers[uc.name] = pc
		}
	}
	// The daemon runs the poolers and stops them when it returns, before
	// the servers stop (keep_running false).
	d, err := daemon.New(ctx, opts)
	if err != nil {
		return err
	}
	info := upInfo{URL: d.URL(), Token: d.Token(), TokenFile: cfg.TokenFile}
	if cfg.Credentials.RetryWindow > 0 {
		info.CredentialsKeyFile = cfg.Credentials.KeyFile
	}
	if ts, err := d.Store().Templates(ctx); err == nil {
		for _, t := range ts {
			if !t.Deleting {
				info.Templates = append(info.Templates, t.Name)
			}
		}
	}
	info.Analytics = d.Analytics().Addr()
	info.CAFile = ca.CA
	for _, uc := range ucs {
		ci := clusterInfo{Name: uc.name, PasswordFile: filepath.Join(dir, uc.name, "superuser.password"), Nodes: uc.nodes, Patroni: uc.managed.PatroniURLs}
		if pc, ok := opts.Poolers[uc.name]; ok {
			ci.Pooler = pc.Listen
		}
		info.Clusters = append(info.Clusters, ci)
	}
	info.Nodes, info.Pooler, info.PasswordFile = info.Clusters[0].Nodes, info.Clusters[0].Pooler, info.Clusters[0].PasswordFile

	// Shutdown order, once Ctrl-C cancels ctx (or the daemon fails):
	//  1. the daemon stops (API, then workers and the poolers, then pools)
	//     while the supervisors still keep the servers up for the work it
	//     finishes;
	//  2. the supervisors stop; an attempt in progress runs to its end;
	//  3. the deferred Stops stop each cluster's primary, then its standbys
	//     (under Patroni: its nodes at once), then the etcd members.
	// The supervisors must be done before 3, or one would restart a server
	// that up is stopping: hence their own context, cancelled only after
	// the daemon has returned, and eg.Wait before the deferred Stops.
	supCtx, stopSup := context.WithCancel(context.WithoutCancel(ctx))
	defer stopSup()
	runCtx, stopRun := context.WithCancel(ctx)
	defer stopRun()
	eg, ectx := errgroup.WithContext(runCtx)
	eg.Go(func() error {
		defer stopSup()
		return d.Run(ectx)
	})
	if o.maxRestarts > 0 {
		for _, s := range sups {
			sup := &fleet.Supervisor{Cluster: s, MaxRestarts: o.maxRestarts, Logger: log,
				OnEvent: func(ev fleet.RestartEvent) { restarts.WithLabelValues(ev.Cluster, ev.Node, ev.Outcome).Inc() }}
			eg.Go(func() error { return sup.Run(supCtx) })
		}
	}
	// The info is printed once the poolers serve (their first sync), so
	// that whoever reads it can connect at once.
	for _, uc := range ucs {
		if f := d.Poolers().Get(uc.name); f != nil {
			wctx, cancel := context.WithTimeout(ectx, time.Minute)
			if err := f.Sync(wctx); err != nil && ectx.Err() == nil {
				fmt.Fprintln(g.stderr, "pooler of", uc.name+":", err)
			}
			cancel()
		}
	}
	if ectx.Err() == nil {
		if err := g.print(info, func(w io.Writer) { printUp(w, info) }); err != nil {
			stopRun()
			_ = eg.Wait()
			return err
		}
	}
	return eg.Wait()
}

// localPooler is the pooler block of up's cluster: its files under dir, a
// loopback port kept from one start to the next, stopped with up, TLS
// with the local CA's certificate, the server reached through its Unix
// socket in socketDir (unless "").
func localPooler(dir string, ca tlsca.Files, socketDir string) (config.PoolerConfig, error) {
	port, err := pooler.LocalPort(dir)
	if err != nil {
		return config.PoolerConfig{}, fmt.Errorf("pooler: %w", err)
	}
	pc := config.DefaultPooler()
	pc.Listen = "127.0.0.1:" + strconv.Itoa(port)
	pc.Dir = dir
	stop := false
	pc.KeepRunning = &stop
	pc.TLSCertFile, pc.TLSKeyFile, pc.TLSCAFile = ca.Cert, ca.Key, ca.CA
	pc.ServerSocketDir = socketDir
	return pc, nil
}

// restartCounter counts the supervisor's restart attempts and give-ups,
// every series present from the start so that an alert on an increase
// sees the first one.
func restartCounter(cs []fleet.Supervised) *prometheus.CounterVec {
	c := prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "pgtenant_managed_restarts_total",
		Help: "Restart attempts of managed servers (or Patroni nodes, or etcd members) that died, by outcome (restarted, failed), and give-ups (gave_up), by pgtenant up's supervisor.",
	}, []string{"cluster", "node", "outcome"})
	for _, cl := range cs {
		for _, n := range cl.SupervisedNodes() {
			for _, o := range []string{fleet.OutcomeRestarted, fleet.OutcomeFailed, fleet.OutcomeGaveUp} {
				c.WithLabelValues(cl.Name(), n, o)
			}
		}
	}
	return c
}

func printUp(w io.Writer, in upInfo) {
	fmt.Fprintf(w, "pgtenant is up.\n\n")
	for _, c := range in.Clusters {
		if len(in.Clusters) > 1 {
			fmt.Fprintf(w, "  cluster %s\n", c.Name)
		}
		for _, n := range c.Nodes {
			fmt.Fprintf(w, "  %-9s %s\n", n.Name, n.DSN)
		}
		fmt.Fprintf(w, "  %-9s superuser password in %s\n", "", c.PasswordFile)
		if c.Pooler != "" {
			fmt.Fprintf(w, "  %-9s %s  (PgBouncer: tenants' DSNs point here)\n", "pooler", c.Pooler)
		}
	}
	if in.Analytics != "" {
		fmt.Fprintf(w, "  %-9s %s  (tenants' analytics mirrors: `pgtenant analytics enable ID`)\n", "analytics", in.Analytics)
	}
	if in.CAFile != "" {
		fmt.Fprintf(w, "  %-9s CA in %s (TLS on the poolers and the analytics port: sslmode=verify-full sslrootcert=%s)\n", "tls", in.CAFile, in.CAFile)
	}
	if in.CredentialsKeyFile != "" {
		fmt.Fprintf(w, "  %-9s credentials key in %s (seals passwords kept for retried creates)\n", "", in.CredentialsKeyFile)
	}
	fmt.Fprintf(w, "  %-9s %s  (console, /v1 API, /metrics, /healthz)\n\n", "API", in.URL)
	fmt.Fprintf(w, "In another shell:\n")
	fmt.Fprintf(w, "  export PGTENANT_TOKEN=%s PGTENANT_SERVER=%s\n", in.Token, in.URL)
	fmt.Fprintf(w, "  ./bin/pgtenant cluster show local\n")
	template := "saas"
	if len(in.Templates) == 0 {
		fmt.Fprintf(w, "  ./bin/pgtenant template create saas --from examples/templates/saas\n")
	} else {
		template = in.Templates[0]
		if slices.Contains(in.Templates, "saas") {
			template = "saas"
		}
		fmt.Fprintf(w, "  ./bin/pgtenant template list     # this fleet has %s already\n", strings.Join(in.Templates, ", "))
		fmt.Fprintf(w, "  ./bin/pgtenant tenant list\n")
	}
	fmt.Fprintf(w, "  ./bin/pgtenant tenant create --template %s --name \"Acme Inc\"\n\n", template)
	fmt.Fprintf(w, "A server that dies is restarted. Ctrl-C stops the daemon, then the clusters.\n")
}

// lockDir takes an exclusive lock on the data dir so that two `up`s never run
// (and stop) the same fleet.
func lockDir(dir string) (func(), error) {
	path := filepath.Join(dir, "up.lock")
	f, err := os.OpenFile(path, os.O_CREATE|os.O_RDWR, 0o600)
	if err != nil {
		return nil, err
	}
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); err != nil {
		pid, _ := os.ReadFile(path)
		f.Close()
		return nil, fmt.Errorf("another `pgtenant up` (pid %s) is running on %s; stop it first or use another --data-dir", string(pid), dir)
	}
	_ = f.Truncate(0)
	_, _ = f.WriteAt([]byte(strconv.Itoa(os.Getpid())), 0)
	return func() { f.Close() }, nil
}
