// Package daemon wires pgtenant's components into one process: catalog,
// cluster registry and monitor, job runner and workflows, HTTP API, metrics
// and console. It is the only place dependencies are constructed; both
// `pgtenant up` and `pgtenant serve` run it.
package daemon

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"golang.org/x/sync/errgroup"

	"github.com/pgtenant/pgtenant/internal/analytics"
	"github.com/pgtenant/pgtenant/internal/api"
	"github.com/pgtenant/pgtenant/internal/background"
	"github.com/pgtenant/pgtenant/internal/backup"
	"github.com/pgtenant/pgtenant/internal/catalog"
	"github.com/pgtenant/pgtenant/internal/cluster"
	"github.com/pgtenant/pgtenant/internal/config"
	"github.com/pgtenant/pgtenant/internal/console"
	"github.com/pgtenant/pgtenant/internal/credentials"
	"github.com/pgtenant/pgtenant/internal/doctor"
	"github.com/pgtenant/pgtenant/internal/failover"
	"github.com/pgtenant/pgtenant/internal/jobs"
	"github.com/pgtenant/pgtenant/internal/metrics"
	"github.com/pgtenant/pgtenant/internal/migrate"
	"github.com/pgtenant/pgtenant/internal/move"
	"github.com/pgtenant/pgtenant/internal/placement"
	"github.com/pgtenant/pgtenant/internal/pooler"
	"github.com/pgtenant/pgtenant/internal/prewarm"
	"github.com/pgtenant/pgtenant/internal/provision"
	"github.com/pgtenant/pgtenant/internal/purge"
	"github.com/pgtenant/pgtenant/internal/quota"
	"github.com/pgtenant/pgtenant/internal/reconcile"
	"github.com/pgtenant/pgtenant/internal/sandbox"
	"github.com/pgtenant/pgtenant/internal/templates"
)

// Options configure a daemon.
type Options struct {
	Config config.Config
	// Managed are clusters run by `pgtenant up`, registered with kind managed.
	Managed []catalog.Cluster
	// Collectors are registered on /metrics next to the daemon's own
	// (`pgtenant up`'s supervisor counts its restarts there).
	Collectors []prometheus.Collector
	// Poolers are the PgBouncers in front of managed clusters, by cluster
	// name (`up` runs one per cluster); configured clusters have theirs in
	// their pooler block.
	Poolers map[string]config.PoolerConfig
	// Backups are the pgBackRest stanzas of managed clusters, by cluster
	// name (`up` sets one up per cluster when pgbackrest is installed).
	Backups map[string]*backup.Stanza
	Logger  *slog.Logger
}

// Daemon is a running pgtenant server.
type Daemon struct {
	cfg      config.Config
	log      *slog.Logger
	store    *catalog.Store
	clusters *cluster.Registry
	listener net.Listener
	http     *http.Server
	// metricsListener and metricsHTTP serve /metrics alone when
	// metrics_listen is set; nil otherwise.
	metricsListener net.Listener
	metricsHTTP     *http.Server
	// tls is the certificate both listeners serve (tls_cert_file); nil: plain HTTP.
	tls     *tls.Config
	token   string
	monitor *cluster.Monitor
	runner  *jobs.Runner
	pool    *provision.Pool
	recLoop *reconcile.Loop
	retain  *purge.Retention
	watcher *prewarm.Watcher
	// creds keeps passwords for retried creates; its Run deletes them when
	// their window ends.
	creds *credentials.Service
	// metrics is every collector /metrics serves.
	metrics *prometheus.Registry
	// collector measures tenants (and checks quotas); capper enforces statement caps.
	collector *metrics.Collector
	capper    *quota.Capper
	console   *console.Console // samples the clusters for its charts
	// poolers keep each cluster's PgBouncer in line with the catalog.
	poolers *pooler.Set
	// analytics runs the tenants' columnar mirrors this daemon owns and
	// serves them on the analytics port.
	analytics *analytics.Service
	// backups takes the scheduled backups of the stanzas this daemon holds
	// (none: it only waits).
	backups *backup.Scheduler
	// follower re-points the registry, the catalog and the poolers at the
	// leader of each cluster Patroni runs.
	follower *failover.Follower
}

// analyticsDir is where the mirrors' DuckDB files live: analytics.dir, or
// "analytics" next to the token file.
func analyticsDir(cfg config.Config) string {
	if cfg.Analytics.Dir != "" {
		return cfg.Analytics.Dir
	}
	return filepath.Join(filepath.Dir(cfg.TokenFile), "analytics")
}

// New opens the catalog, registers clusters and binds the listener. Nothing
// runs until Run.
func New(ctx context.Context, opts Options) (*Daemon, error) {
	cfg, log := opts.Config, opts.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	if cfg.Catalog.DSN == "" {
		return nil, errors.New("catalog.dsn: required")
	}
	if cfg.TokenFile == "" {
		return nil, errors.New("token_file: required")
	}
	token, _, err := LoadOrCreateToken(cfg.TokenFile)
	if err != nil {
		return nil, err
	}
	tlsConfig, err := loadTLS(cfg)
	if err != nil {
		return nil, err
	}
	key, err := loadCredentialsKey(cfg, log)
	if err != nil {
		return nil, err
	}
	store, err := catalog.Open(ctx, cfg.Catalog.DSN, log)
	if err != nil {
		return nil, err
	}
	d := &Daemon{cfg: cfg, log: log, store: store, clusters: cluster.NewRegistry(), token: token, tls: tlsConfig}
	if err := d.registerClusters(ctx, opts.Managed); err != nil {
		d.Close()
		return nil, err
	}
	if d.poolers, err = d.newPoolers(cfg, opts.Poolers, log); err != nil {
		d.Close()
		return nil, err
	}
	d.creds = &credentials.Service{Store: store, Clusters: d.clusters, Key: key, Window: cfg.Credentials.RetryWindow.D(), Logger: log,
		Poolers: d.poolers, Tiers: cfg.Tiers}
	if others, err := d.creds.OtherKeys(ctx); err != nil {
		d.Close()
		return nil, err
	} else if len(others) > 0 {
		log.Warn("passwords kept in the catalog were sealed with other credentials keys: their daemons do not share this one, "+
			"and retried creates they answered get no password here; give every daemon of the catalog the same credentials.key_file",
			"key_id", key.ID(), "other_key_ids", others)
	}

	reg := prometheus.NewRegistry()
	d.metrics = reg
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}),
		metrics.NewClusterCollector(d.clusters))
	reg.MustRegister(metrics.NewTemplateCollector(store))
	reg.MustRegister(opts.Collectors...)
	reg.MustRegister(pooler.NewCollector(d.poolers))
	d.follower = failover.New(store, d.clusters, d.poolers, cfg.Failover.CheckInterval.D(), log)
	reg.MustRegister(d.follower.Collectors()...)
	d.monitor = &cluster.Monitor{Clusters: d.clusters, Interval: 5 * time.Second, Logger: log}

	pacer := jobs.NewPacer(d.clusters, cfg.PacerFor, store.Pool(), log, reg)
	d.runner = jobs.NewRunner(store.Pool(), cfg.Jobs, pacer, log, reg)
	tpl := &templates.Service{Store: store, Clusters: d.clusters, Runner: d.runner, Provision: cfg.Provision, Logger: log}
	agents := &sandbox.Agents{Store: store}
	prov := &provision.Service{Store: store, Clusters: d.clusters, Runner: d.runner, Templates: tpl, Agents: agents,
		Provision: cfg.Provision, Tiers: cfg.Tiers, Pools: cfg.Pools, RolloutConnections: cfg.Migrate.PerCluster,
		BatchRelations: cfg.Drop.BatchRelations, PacerFor: cfg.PacerFor,
		Credentials: d.creds, Logger: log, ColdWait: cfg.Provision.ColdWait.D(), Poolers: d.poolers}
	d.pool = provision.NewPool(prov, cfg.Provision.PoolInterval.D())
	pur := &purge.Service{Store: store, Clusters: d.clusters, Runner: d.runner, Config: cfg.Drop, Logger: log, Poolers: d.poolers}
	tpl.Spares = pur // a template's delete purges its spares
	d.runner.Register(jobs.TemplateBuild, tpl.BuildHandler())
	d.runner.Register(jobs.TemplateDelete, tpl.DeleteHandler())
	d.runner.Register(jobs.TenantBuild, prov.BuildHandler())
	d.runner.Register(jobs.TenantPurge, pur.Handler())
	d.retain = &purge.Retention{S: pur, Interval: cfg.Drop.CheckInterval.D()}
	mig := &migrate.Service{Store: store, Clusters: d.clusters, Runner: d.runner, Templates: tpl, Agents: agents, Migrate: cfg.Migrate,
		Provision: cfg.Provision, Logger: log, Pool: d.pool}
	d.runner.Register(jobs.Rollout, mig.Handler())
	warm := &prewarm.Service{Store: store, Clusters: d.clusters, Runner: d.runner, Prewarm: cfg.Prewarm, Tiers: cfg.Tiers, Logger: log}
	d.runner.Register(jobs.Prewarm, warm.Handler())
	d.follower.Runner = d.runner
	d.follower.Prewarm = func(ctx context.Context, name string) error {
		_, err := warm.PrewarmNodes(ctx, name, nil, "failover")
		return err
	}
	d.runner.Register(jobs.ClusterSwitchover, d.follower.SwitchoverHandler())
	d.watcher = &prewarm.Watcher{S: warm}
	reg.MustRegister(prewarm.NewCollector(warm))
	pur.OnResume = warm.PrewarmTenant
	d.analytics = analytics.New(store, d.clusters, cfg.Analytics, analyticsDir(cfg), log)
	d.analytics.Pacer, d.analytics.Tiers = pacer, cfg.Tiers
	if d.analytics.TLS, err = loadAnalyticsTLS(cfg); err != nil {
		d.Close()
		return nil, err
	}
	if cfg.Analytics.Listen != "" {
		if _, err := d.analytics.Listen(cfg.Analytics.Listen); err != nil {
			d.Close()
			return nil, err
		}
	}
	pur.Analytics = d.analytics
	reg.MustRegister(analytics.NewCollector(d.analytics))

	mov := &move.Service{Store: store, Clusters: d.clusters, Runner: d.runner, Agents: agents, Drop: cfg.Drop, Logger: log, Poolers: d.poolers,
		Provision: prov, Lifecycle: pur}
	d.runner.Register(jobs.TenantMove, mov.Handler())
	d.runner.Register(jobs.TenantImport, mov.ImportHandler())
	plc := &placement.Service{Store: store, Clusters: d.clusters, Runner: d.runner, Provision: prov, Move: mov, Config: cfg.Move, Tiers: cfg.Tiers, Logger: log}
	d.runner.Register(jobs.ClusterDrain, plc.DrainHandler())
	d.runner.Register(jobs.Rebalance, plc.RebalanceHandler())
	// External clusters' own stanzas (their backup blocks) are read and
	// restored from; their scratch instances live beside the token file.
	stanzas, err := backup.WithExternal(opts.Backups, cfg.Clusters, filepath.Join(filepath.Dir(cfg.TokenFile), "scratch"))
	if err != nil {
		d.Close()
		return nil, err
	}
	bk := &backup.Service{Store: store, Runner: d.runner, Stanzas: stanzas, Clusters: d.clusters, Schedule: cfg.Backups,
		Logger: log.With("component", "backup")}
	d.backups = &backup.Scheduler{S: bk}
	mov.Backups = bk // forks and rewinds read the repositories
	reg.MustRegister(backup.NewCollector(bk))
	// Only the daemon that holds the stanzas (up's) runs backups: another
	// daemon on the same catalog would claim the jobs and fail them.
	if len(stanzas) > 0 {
		// The stanzas' retention follows backups.retention.
		if err := bk.Configure(); err != nil {
			d.Close()
			return nil, fmt.Errorf("write the stanzas' config (backups.retention): %w", err)
		}
		if bk.TakesBackups() { // not with external stanzas only: their operators take their backups
			d.runner.Register(jobs.ClusterBackup, bk.Handler())
		}
		d.runner.Register(jobs.TenantFork, mov.ForkHandler())
		d.runner.Register(jobs.TenantRewind, mov.ForkHandler())
		// A cluster just made gets its first full backup: its recovery
		// window starts there. Not fatal; `backup list` says more.
		if err := bk.EnsureFirst(ctx); err != nil {
			log.Warn("first backup not started", "err", err)
		}
	}
	reg.MustRegister(placement.NewCollector(plc))

	rec := &reconcile.Reconciler{Store: store, Clusters: d.clusters, Runner: d.runner, Templates: tpl, Drop: cfg.Drop, Logger: log, Poolers: d.poolers,
		Tiers: cfg.Tiers, Analytics: d.analytics}
	d.recLoop = &reconcile.Loop{R: rec, Interval: cfg.Reconcile.Interval.D()}

	quo := &quota.Service{Store: store, Clusters: d.clusters, Tiers: cfg.Tiers, Logger: log}
	d.collector = &metrics.Collector{Store: store, Clusters: d.clusters, Metrics: cfg.Metrics, Tiers: cfg.Tiers, Logger: log, Quota: quo,
		Poolers: d.poolers, Analytics: d.analytics}
	tenants := metrics.NewTenantCollector(d.collector, cfg.Metrics.TopTenants)
	tenants.Pools = d.poolers
	reg.MustRegister(tenants)
	d.capper = &quota.Capper{Store: store, Clusters: d.clusters, Metrics: cfg.Metrics, Tiers: cfg.Tiers, Logger: log}
	d.capper.Register(reg)
	doc := &doctor.Doctor{Store: store, Clusters: d.clusters, Config: cfg, Logger: log, Poolers: d.poolers, Backups: bk}

	d.console = &console.Console{Store: store, Clusters: d.clusters, Token: token, SessionTTL: cfg.ConsoleSessionTTL.D(), Logger: log}
	srv := api.NewServer(api.Deps{Store: store, Clusters: d.clusters, Registry: reg, Token: token, Logger: log,
		Runner: d.runner, Templates: tpl, Provision: prov, Purge: pur, Credentials: d.creds, Reconciler: rec, Prewarm: warm, Move: mov, Placement: plc, Analytics: d.analytics, Failover: d.follower,
		Console: d.console, Migrate: mig,
		Metrics: d.collector, Quota: quo, Doctor: doc, Backups: bk, MetricsAuth: cfg.MetricsAuth, MetricsElsewhere: cfg.MetricsListen != ""})
	d.console.API = srv // the console reads and acts through the API's handlers

	d.listener, err = net.Listen("tcp", cfg.Listen)
	if err != nil {
		d.Close()
		return nil, fmt.Errorf("listen on %s: %w (is another pgtenant running? choose another address with --listen)", cfg.Listen, err)
	}
	// net/http's own messages (TLS handshake errors, …) go to slog too.
	errLog := slog.NewLogLogger(log.With("component", "http").Handler(), slog.LevelWarn)
	d.http = &http.Server{Handler: srv, ReadHeaderTimeout: 10 * time.Second, TLSConfig: tlsConfig, ErrorLog: errLog}
	if cfg.MetricsListen != "" {
		if d.metricsListener, err = net.Listen("tcp", cfg.MetricsListen); err != nil {
			d.listener.Close()
			d.Close()
			return nil, fmt.Errorf("metrics_listen: listen on %s: %w", cfg.MetricsListen, err)
		}
		d.metricsHTTP = &http.Server{Handler: srv.MetricsHandler(), ReadHeaderTimeout: 10 * time.Second, TLSConfig: tlsConfig.Clone(), ErrorLog: errLog}
	}
	return d, nil
}

// loadCredentialsKey reads (or makes) the key that seals passwords kept for
// retried creates; nil with credentials.retry_window 0. Without
// credentials.key_file it lives next to the token file: made there, it is
// this daemon's alone, which other daemons of the catalog must be given.
func loadCredentialsKey(cfg config.Config, log *slog.Logger) (*credentials.Key, error) {
	if cfg.Credentials.RetryWindow <= 0 {
		return nil, nil
	}
	path := cfg.Credentials.KeyFile
	if path == "" {
		path = filepath.Join(filepath.Dir(cfg.TokenFile), "credentials.key")
	}
	key, created, err := credentials.LoadOrCreateKey(path)
	if err != nil {
		return nil, fmt.Errorf("credentials.key_file: %w", err)
	}
	switch {
	case created && cfg.Credentials.KeyFile == "":
		log.Warn("generated a credentials key next to the token file: every daemon of this catalog needs this same key; "+
			"copy it to each and set credentials.key_file", "key_file", path, "key_id", key.ID())
	case created:
		log.Info("generated the credentials key", "key_file", path, "key_id", key.ID())
	}
	if fi, err := os.Stat(path); err == nil && fi.Mode().Perm()&0o077 != 0 {
		log.Warn("the credentials key file is readable by others than its owner: chmod 600 it", "key_file", path, "mode", fi.Mode().Perm().String())
	}
	return key, nil
}

// newPoolers makes the Front of every cluster with a pooler: configured
// clusters' pooler blocks and the managed ones `up` passes. Each is
// started (or adopted, when it runs already) by Run.
func (d *Daemon) newPoolers(cfg config.Config, managed map[string]config.PoolerConfig, log *slog.Logger) (*pooler.Set, error) {
	blocks := map[string]config.PoolerConfig{}
	for _, c := range cfg.Clusters {
		if c.Pooler != nil {
			blocks[c.Name] = *c.Pooler
		}
	}
	for name, pc := range managed {
		if err := pc.Validate(); err != nil {
			return nil, fmt.Errorf("pooler of cluster %s: %w", name, err)
		}
		blocks[name] = pc
	}
	for name, pc := range blocks {
		if err := pc.CheckTLSFiles(); err != nil {
			return nil, fmt.Errorf("pooler of cluster %s: %w", name, err)
		}
	}
	// A tier that requires TLS gets hostssl lines: through a pooler with
	// no certificate its tenants could not log in at all.
	for tier, t := range cfg.Tiers {
		for name, pc := range blocks {
			if t.RequireTLS && pc.TLSCertFile == "" {
				return nil, fmt.Errorf("tiers.%s.require_tls: the pooler of cluster %s has no tls_cert_file: the tier's tenants could not log in through it; give it a certificate", tier, name)
			}
		}
	}
	src := pooler.CatalogSource{Store: d.store, Clusters: d.clusters, Tiers: cfg.Tiers, Logger: log}
	var fronts []*pooler.Front
	for name, pc := range blocks {
		cl, err := d.clusters.Get(name)
		if err != nil {
			return nil, err
		}
		stop := pc.KeepRunning != nil && !*pc.KeepRunning
		f, err := pooler.NewFront(cl, pc, src.For(name), stop, log)
		if err != nil {
			return nil, err
		}
		fronts = append(fronts, f)
	}
	return pooler.NewSet(log, fronts...), nil
}

// Poolers are the clusters' PgBouncers (for tests and `up`).
func (d *Daemon) Poolers() *pooler.Set { return d.poolers }

// loadTLS reads tls_cert_file and tls_key_file, nil when neither is set.
// TLS 1.2 is the floor; Go's defaults choose the cipher suites.
func loadTLS(cfg config.Config) (*tls.Config, error) {
	if cfg.TLSCertFile == "" && cfg.TLSKeyFile == "" {
		return nil, nil
	}
	if cfg.TLSCertFile == "" || cfg.TLSKeyFile == "" {
		return nil, errors.New("tls_cert_file, tls_key_file: set both to serve HTTPS, or neither")
	}
	cert, err := tls.LoadX509KeyPair(cfg.TLSCertFile, cfg.TLSKeyFile)
	if err != nil {
		return nil, fmt.Errorf("tls_cert_file %s, tls_key_file %s: %w", cfg.TLSCertFile, cfg.TLSKeyFile, err)
	}
	return &tls.Config{MinVersion: tls.VersionTLS12, Certificates: []tls.Certificate{cert}}, nil
}

// loadAnalyticsTLS reads the analytics port's certificate: its own
// (analytics.tls_cert_file) or else the daemon's; nil when there is none
// (clear text only). Read at start: a renewed certificate needs a restart.
func loadAnalyticsTLS(cfg config.Config) (*tls.Config, error) {
	if err := cfg.CheckAnalyticsTLSFiles(); err != nil {
		return nil, err
	}
	cert, key := cfg.AnalyticsTLSPair()
	if cert == "" && key == "" {
		if cfg.Analytics.RequireTLS {
			return nil, errors.New("analytics.require_tls: needs a certificate (analytics.tls_cert_file and tls_key_file, or the daemon's)")
		}
		return nil, nil
	}
	pair, err := tls.LoadX509KeyPair(cert, key)
	if err != nil {
		return nil, fmt.Errorf("the analytics port's certificate %s, key %s: %w", cert, key, err)
	}
	return &tls.Config{MinVersion: tls.VersionTLS12, Certificates: []tls.Certificate{pair}}, nil
}

// registerClusters upserts configured and managed clusters in the catalog,
// then loads every registered cluster into the registry.
func (d *Daemon) registerClusters(ctx context.Context, managed []catalog.Cluster) error {
	for _, c := range d.cfg.Clusters {
		if err := d.store.UpsertCluster(ctx, catalog.Cluster{Name: c.Name, Kind: "external", DSN: c.DSN, StandbyDSNs: c.Standbys}); err != nil {
			return err
		}
	}
	for _, c := range managed {
		c.Kind = "managed"
		if err := d.store.UpsertCluster(ctx, c); err != nil {
			return err
		}
		// On a cluster pgtenant runs, tenants may connect to their own
		// databases only: not to postgres or template1.
		cl, err := cluster.New(c.Name, c.DSN, nil, d.log)
		if err != nil {
			return err
		}
		err = cluster.RevokePublicConnect(ctx, cl, "postgres", "template1")
		if err == nil {
			// Managed clusters get the extension hot-set capture reads from.
			err = cluster.CreateExtension(ctx, cl, "pg_buffercache")
		}
		cl.Close()
		if err != nil {
			return err
		}
	}
	return d.loadClusters(ctx)
}

// loadClusters puts into the registry every cluster of the catalog that it
// does not hold yet, or holds with other DSNs.
func (d *Daemon) loadClusters(ctx context.Context) error {
	all, err := d.store.Clusters(ctx)
	if err != nil {
		return fmt.Errorf("load clusters: %w", err)
	}
	for _, c := range all {
		if cur, err := d.clusters.Get(c.Name); err == nil && cur.Registered(c.DSN, c.StandbyDSNs) {
			continue
		}
		cl, err := cluster.New(c.Name, c.DSN, c.StandbyDSNs, d.log)
		if err != nil {
			return err
		}
		d.clusters.Put(cl)
		d.log.Info("cluster registered", "cluster", c.Name)
	}
	return nil
}

// clusterSyncInterval bounds how long a cluster added (or changed) through
// another daemon of the catalog stays unknown to this one.
const clusterSyncInterval = 5 * time.Second

// syncClusters keeps the registry following the catalog until ctx is done.
type syncClusters struct{ d *Daemon }

func (s syncClusters) Run(ctx context.Context) error {
	down := cluster.Outage{What: "read the clusters from the catalog"}
	// The first load is registerClusters's, at start.
	background.EveryAfter(ctx, clusterSyncInterval, func(ctx context.Context) {
		if err := s.d.loadClusters(ctx); ctx.Err() == nil {
			down.Report(s.d.log, err)
		}
	})
	return nil
}

// Addr is the address the API listens on.
func (d *Daemon) Addr() string { return d.listener.Addr().String() }

// URL is the base URL of the API and the console: https:// with TLS.
func (d *Daemon) URL() string {
	if d.tls != nil {
		return "https://" + d.Addr()
	}
	return "http://" + d.Addr()
}

// MetricsAddr is the address of the /metrics listener, "" without one.
func (d *Daemon) MetricsAddr() string {
	if d.metricsListener == nil {
		return ""
	}
	return d.metricsListener.Addr().String()
}

// Token is the API bearer token.
func (d *Daemon) Token() string { return d.token }

// Metrics is the registry of every series /metrics serves: its Describe
// lists them all, with or without samples (the docs' names are checked
// against it).
func (d *Daemon) Metrics() *prometheus.Registry { return d.metrics }

// Analytics runs the tenants' mirrors (for tests).
func (d *Daemon) Analytics() *analytics.Service { return d.analytics }

// Store is the catalog (for tests and the in-process CLI).
func (d *Daemon) Store() *catalog.Store { return d.store }

// Run serves until ctx is cancelled (or a component fails), then shuts down
// in order: first the HTTP server stops taking requests and lets in-flight
// ones finish (a cold create may still need a worker), then the /metrics
// listener (it needs no worker, and a scrape during shutdown still sees the
// figures), then the background workers stop (a job in progress goes back
// to the queue with its completed steps recorded; the poolers stop with
// them: a PgBouncer is stopped only with keep_running false, as under
// `up`, otherwise it goes on serving tenants and the next start adopts
// it), and last the pools close.
func (d *Daemon) Run(ctx context.Context) error {
	defer d.Close()
	g, gctx := errgroup.WithContext(ctx)
	workCtx, stopWork := context.WithCancel(context.WithoutCancel(ctx))
	defer stopWork()
	g.Go(func() error { return d.serve("http", d.http, d.listener) })
	if d.metricsHTTP != nil {
		g.Go(func() error { return d.serve("metrics http", d.metricsHTTP, d.metricsListener) })
	}
	for _, w := range []interface{ Run(context.Context) error }{syncClusters{d}, d.monitor, d.runner, d.pool, d.recLoop, d.retain, d.watcher, d.collector, d.capper, d.creds, d.poolers, d.console, d.analytics, d.backups, d.follower} {
		g.Go(func() error { return w.Run(workCtx) })
	}
	g.Go(func() error {
		<-gctx.Done()
		sctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		err := d.http.Shutdown(sctx)
		if d.metricsHTTP != nil {
			err = errors.Join(err, d.metricsHTTP.Shutdown(sctx))
		}
		stopWork()
		return err
	})
	d.log.Info("pgtenant daemon running", "url", d.URL(), "metrics_listen", d.MetricsAddr())
	return g.Wait()
}

// serve runs srv on ln, over TLS when the daemon has a certificate, until
// Shutdown.
func (d *Daemon) serve(name string, srv *http.Server, ln net.Listener) error {
	var err error
	if d.tls != nil {
		err = srv.ServeTLS(ln, "", "") // the certificate is in srv.TLSConfig
	} else {
		err = srv.Serve(ln)
	}
	if !errors.Is(err, http.ErrServerClosed) {
		return fmt.Errorf("%s: %w", name, err)
	}
	return nil
}

// Close releases the catalog and cluster pools.
func (d *Daemon) Close() {
	d.clusters.Close()
	d.store.Close()
}
