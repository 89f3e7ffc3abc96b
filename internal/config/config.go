// Package config holds the daemon's configuration: defaults, strict YAML over
// them, ${ENV} expansion and validation that names the bad field. It owns no
// behaviour; secrets in it (DSNs) are never logged.
package config

import (
	"bytes"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"regexp"
	"slices"
	"strings"
	"time"

	"go.yaml.in/yaml/v3"
)

// Config is the whole daemon configuration.
type Config struct {
	// Listen is the HTTP address of the API, /metrics and the console.
	Listen string `yaml:"listen"`
	// TLSCertFile and TLSKeyFile (PEM), both or neither: when set, every
	// listener (Listen and MetricsListen) serves HTTPS only. Read at start;
	// a renewed certificate needs a restart.
	TLSCertFile string `yaml:"tls_cert_file"`
	TLSKeyFile  string `yaml:"tls_key_file"`
	// MetricsListen, if set, is a separate address serving /metrics only
	// (e.g. 127.0.0.1:9187, for a local Prometheus); /metrics is then not
	// served on Listen.
	MetricsListen string `yaml:"metrics_listen"`
	// MetricsAuth makes /metrics (wherever it is served) need the API bearer
	// token. Off by default: a Prometheus scrape needs no secret, and the
	// series hold tenant ids and sizes but no passwords or DSNs.
	MetricsAuth bool `yaml:"metrics_auth"`
	// ConsoleSessionTTL is how long a console login lasts, counted from the
	// login (absolute, not renewed by use). Sessions live in the daemon's
	// memory: a restart, or another daemon behind the same address, asks
	// for the token again.
	ConsoleSessionTTL Duration `yaml:"console_session_ttl"`
	// TokenFile holds the API bearer token; generated (0600) if missing.
	TokenFile string `yaml:"token_file"`
	// Credentials keeps tenants' passwords for retried creates.
	Credentials CredentialsConfig `yaml:"credentials"`
	// Catalog is where pgtenant keeps its own state.
	Catalog CatalogConfig `yaml:"catalog"`
	// Clusters are registered (upserted) in the catalog at start.
	Clusters []ClusterConfig `yaml:"clusters"`
	// Pacer is the default budget of every cluster; a cluster may override it.
	Pacer PacerConfig `yaml:"pacer"`
	// Jobs tunes the durable job runner.
	Jobs JobsConfig `yaml:"jobs"`
	// Tiers are named sets of per-tenant limits; "default" always exists.
	Tiers map[string]Tier `yaml:"tiers"`
	// Pools keep spare tenants ready per template, mode and cluster.
	Pools []PoolConfig `yaml:"pools"`
	// Provision tunes how tenants and templates are built.
	Provision ProvisionConfig `yaml:"provision"`
	// Drop tunes soft delete and purge.
	Drop DropConfig `yaml:"drop"`
	// Reconcile sets the period of the daemon's reconciler (0 = off).
	Reconcile ReconcileConfig `yaml:"reconcile"`
	// Migrate tunes rollouts of template versions to tenants.
	Migrate MigrateConfig `yaml:"migrate"`
	// Metrics tunes the per-tenant metrics collector, its history and the
	// statement cap checks.
	Metrics MetricsConfig `yaml:"metrics"`
	// Prewarm tunes hot-set capture and prewarming after restarts.
	Prewarm PrewarmConfig `yaml:"prewarm"`
	// Analytics tunes tenants' columnar mirrors (internal/analytics).
	Analytics AnalyticsConfig `yaml:"analytics"`
	// Move tunes the moves that drain and rebalance start.
	Move MoveConfig `yaml:"move"`
	// Backups schedules the pgBackRest backups of managed clusters and
	// sets how long their recovery window reaches back (internal/backup).
	Backups BackupsConfig `yaml:"backups"`
	// Failover tunes how the daemon follows the leader of clusters that
	// Patroni runs (internal/failover).
	Failover FailoverConfig `yaml:"failover"`
}

// FailoverConfig tunes the following of Patroni leaders (docs/operations/failover.md).
type FailoverConfig struct {
	// CheckInterval is how often each cluster registered with Patroni
	// endpoints is asked for its members (default 1 s; 0 = never follow).
	// A new leader is served through the same DSNs at most this long after
	// Patroni promotes it; each check is one small HTTP request to a
	// Patroni node and one to the leader, which Patroni answers from memory.
	CheckInterval Duration `yaml:"check_interval"`
}

// BackupsConfig schedules backups and sets their retention (docs/operations/backups.md).
type BackupsConfig struct {
	// FullEvery: a full backup is taken when the newest full is this old.
	FullEvery Duration `yaml:"full_every"`
	// DiffEvery: otherwise a differential backup (what changed since the
	// last full) when the newest backup of any type is this old (0 = none).
	DiffEvery Duration `yaml:"diff_every"`
	// Retention is the recovery window kept, in whole days: pgBackRest
	// expires a full backup (with its diffs and WAL) once a newer full is
	// older than this.
	Retention Duration `yaml:"retention"`
	// CheckInterval is how often the schedule is looked at.
	CheckInterval Duration `yaml:"check_interval"`
}

// MoveConfig tunes drains and rebalances (internal/placement).
type MoveConfig struct {
	// MaxConcurrentPerCluster bounds the moves in flight that a drain or
	// rebalance starts into or out of any one cluster (a move's copy
	// loads both).
	MaxConcurrentPerCluster int `yaml:"max_concurrent_per_cluster"`
}

// AnalyticsConfig tunes the DuckDB mirrors of tenants and the port that
// serves them.
type AnalyticsConfig struct {
	// Dir holds one DuckDB file per mirrored tenant ("" = "analytics" next
	// to the token file).
	Dir string `yaml:"dir"`
	// Listen is the PostgreSQL-protocol address tenants query their
	// mirror on ("" = off; `up` picks a port and keeps it).
	Listen string `yaml:"listen"`
	// Advertise is the host:port tenants' analytics DSNs name and other
	// daemons forward sessions to ("" = the address Listen bound): set it
	// when the daemon listens on a wildcard or behind NAT.
	Advertise string `yaml:"advertise"`
	// MemoryLimit and Threads bound each tenant's DuckDB (its apply and
	// its queries together).
	MemoryLimit ByteSize `yaml:"memory_limit"`
	Threads     int      `yaml:"threads"`
	// StatementTimeout cancels a tenant's analytics query.
	StatementTimeout Duration `yaml:"statement_timeout"`
	// FlushInterval and BatchRows: changes are applied in one DuckDB
	// transaction per batch, at whichever comes first.
	FlushInterval Duration `yaml:"flush_interval"`
	BatchRows     int      `yaml:"batch_rows"`
	// Lease is how long a mirror's owner may be silent before another
	// daemon takes the mirror over; PollInterval is how often each daemon
	// looks at the mirrors (claims, renewals, disables).
	Lease        Duration `yaml:"lease"`
	PollInterval Duration `yaml:"poll_interval"`
	// TLSCertFile and TLSKeyFile (PEM), both or neither: the analytics
	// port's certificate. Empty: the daemon's tls_cert_file and
	// tls_key_file when set (`up` gives the port a pair of its own: its
	// API stays plain HTTP). With a certificate, a client's SSLRequest is
	// answered with TLS; without one, with "N" (clear text).
	TLSCertFile string `yaml:"tls_cert_file"`
	TLSKeyFile  string `yaml:"tls_key_file"`
	// TLSCAFile is the CA that signed the certificate: the analytics DSNs
	// then say sslmode=verify-full sslrootcert=<it> (default: sslmode=require).
	TLSCAFile string `yaml:"tls_ca_file"`
	// RequireTLS refuses clear-text logins on the analytics port (a
	// FATAL telling the client to use sslmode=require); needs a certificate.
	RequireTLS bool `yaml:"require_tls"`
}

// AnalyticsTLSPair is the analytics port's certificate and key: its own pair, else
// the daemon's, else none.
func (c Config) AnalyticsTLSPair() (cert, key string) {
	if c.Analytics.TLSCertFile != "" || c.Analytics.TLSKeyFile != "" {
		return c.Analytics.TLSCertFile, c.Analytics.TLSKeyFile
	}
	return c.TLSCertFile, c.TLSKeyFile
}

// PrewarmConfig tunes hot-set capture and prewarm.
type PrewarmConfig struct {
	// CaptureInterval between hot-set captures from pg_buffercache (0 = off).
	CaptureInterval Duration `yaml:"capture_interval"`
	// WatchInterval between polls of each node (one query on a connection
	// kept open) for restarts and failovers (0 = off).
	WatchInterval Duration `yaml:"watch_interval"`
	// RateLimit caps how fast prewarm reads, per second (all workers of a job together).
	RateLimit ByteSize `yaml:"rate_limit"`
	// Parallel: tenants a prewarm job loads at once, taken in priority order.
	Parallel int `yaml:"parallel"`
	// BufferFraction of the free shared buffers that prewarm fills (mode buffer);
	// it never evicts a buffer in use, so hotter data is never pushed out.
	BufferFraction float64 `yaml:"buffer_fraction"`
	// Beyond is what happens to hot blocks past that budget: prefetch (OS
	// cache, asynchronous), read (OS cache, synchronous) or none.
	Beyond string `yaml:"beyond"`
	// Standbys: also prewarm standbys (so that a failover lands on a warm node).
	Standbys bool `yaml:"standbys"`
}

// CredentialsConfig keeps the password of a tenant created with an external
// id for a while, sealed, so that a retried create (its answer was lost)
// gets it again (docs/operations/tenants.md; docs/SECURITY.md, "Credentials").
type CredentialsConfig struct {
	// RetryWindow: a create retried with the same external id within this
	// long gets the same answer, password included; then the sealed copy is
	// deleted (0 = keep nothing: a retry answers without the password).
	RetryWindow Duration `yaml:"retry_window"`
	// KeyFile holds the key that seals the kept passwords (AES-256-GCM): 32
	// random bytes, base64 or hex. Every daemon of a catalog needs the same
	// one. Empty: credentials.key next to token_file, generated (0600) if
	// missing.
	KeyFile string `yaml:"key_file"`
}

// CatalogConfig locates the catalog database.
type CatalogConfig struct {
	DSN string `yaml:"dsn"`
}

// ClusterConfig is one external cluster given by DSN.
type ClusterConfig struct {
	Name     string       `yaml:"name"`
	DSN      string       `yaml:"dsn"`      // admin (superuser or CREATEROLE+CREATEDB) on the primary
	Standbys []string     `yaml:"standbys"` // optional standby DSNs: a missing one counts as down
	Pacer    *PacerConfig `yaml:"pacer"`    // overrides the global pacer
	// Pooler is the PgBouncer in front of the cluster that this daemon
	// runs on its host (docs/connections.md); nil: tenants connect to
	// the server directly.
	Pooler *PoolerConfig `yaml:"pooler"`
	// Backup names the cluster's existing pgBackRest stanza and its
	// config (docs/operations/backups.md, "External clusters"): pgtenant
	// reads its backups and restores from them for rewinds and forks; it
	// never writes that config nor takes backups. nil: no backups here.
	Backup *ClusterBackupConfig `yaml:"backup"`
}

// DefaultPgBackRestConfig is where pgBackRest itself looks for its config
// when run without --config.
const DefaultPgBackRestConfig = "/etc/pgbackrest/pgbackrest.conf"

// ClusterBackupConfig is an external cluster's own pgBackRest setup, as
// its operator made it.
type ClusterBackupConfig struct {
	// Stanza is the stanza the cluster archives to and is backed up to
	// (its [section] in the config). Required in the block.
	Stanza string `yaml:"stanza"`
	// Config is the operator's pgbackrest.conf that defines the stanza and
	// its repository (absolute; default DefaultPgBackRestConfig). It is
	// passed as --config to every pgbackrest pgtenant runs, and never
	// written.
	Config string `yaml:"config"`
	// Program is the pgbackrest to run (absolute; "" = pgbackrest on
	// PATH): one that reads the repository's format, e.g. the version the
	// operator's servers run.
	Program string `yaml:"program"`
}

// PoolerConfig is a PgBouncer pgtenant runs on this host in front of a
// cluster (internal/pooler): its files live in Dir, it listens on Listen,
// and tenants' DSNs name Host (default: Listen's host) and Listen's port.
type PoolerConfig struct {
	// Listen is the address PgBouncer listens on, host:port.
	Listen string `yaml:"listen"`
	// Host is the host tenants' DSNs name (a DNS name or an address that
	// reaches Listen); default Listen's host.
	Host string `yaml:"host"`
	// Dir holds its config, auth file, HBA file, pid file and log
	// (absolute; made 0700).
	Dir string `yaml:"dir"`
	// Server is the primary's host:port as PgBouncer reaches it (default:
	// the cluster DSN's).
	Server string `yaml:"server"`
	// ServerSocketDir: PgBouncer reaches the cluster's primary through
	// its Unix socket in this directory (at the primary's port, after a
	// failover too) instead of TCP: for a server on the pooler's host,
	// which then spends less CPU per query. `up` sets it for the
	// clusters it makes. Not with Server.
	ServerSocketDir string `yaml:"server_socket_dir"`
	// MaxClientConn bounds the clients of all tenants together; PgBouncer
	// needs about one open file per client and per server connection.
	MaxClientConn int `yaml:"max_client_conn"`
	// ServerIdleTimeout closes server connections idle this long.
	ServerIdleTimeout Duration `yaml:"server_idle_timeout"`
	// QueryWaitTimeout bounds a client's wait for a server connection.
	QueryWaitTimeout Duration `yaml:"query_wait_timeout"`
	// Coalesce is the least time between two reloads asked for by
	// lifecycle changes: a burst of creates is batched into few reloads.
	Coalesce Duration `yaml:"coalesce"`
	// SyncInterval: the pooler is compared with the catalog this often
	// (changes made through another daemon, a tenant's own password change).
	SyncInterval Duration `yaml:"sync_interval"`
	// KeepRunning leaves PgBouncer running when the daemon stops (serve's
	// default: tenants keep their connections across a daemon restart);
	// `up` stops it with its servers.
	KeepRunning *bool `yaml:"keep_running"`
	// TLSCertFile and TLSKeyFile (PEM, absolute), both or neither: the
	// front door's certificate (client_tls_cert_file, client_tls_key_file;
	// client_tls_sslmode prefer). PgBouncer reads them as its OS user
	// (postgres when pgtenant runs as root). Empty: clear text only.
	TLSCertFile string `yaml:"tls_cert_file"`
	TLSKeyFile  string `yaml:"tls_key_file"`
	// TLSCAFile is the CA that signed the certificate (client_tls_ca_file):
	// tenants' DSNs then say sslmode=verify-full sslrootcert=<it>; without
	// it, sslmode=require.
	TLSCAFile string `yaml:"tls_ca_file"`
	// RequireTLS refuses clear-text logins of every tenant of this pooler
	// (hostssl HBA lines); a tier's require_tls does so for its tenants.
	RequireTLS bool `yaml:"require_tls"`
	// ServerTLSSSLMode is how PgBouncer connects to the server
	// (server_tls_sslmode, as libpq's sslmode): prefer (the default: TLS
	// when the server offers it, unverified), disable, require,
	// verify-ca or verify-full (these two need ServerTLSCAFile). Where the
	// pooler and the server are on different hosts, verify-full.
	ServerTLSSSLMode string `yaml:"server_tls_sslmode"`
	// ServerTLSCAFile is the CA that signed the server's certificate
	// (server_tls_ca_file).
	ServerTLSCAFile string `yaml:"server_tls_ca_file"`
}

// ServerTLSModes are PgBouncer's server_tls_sslmode values.
var ServerTLSModes = []string{"disable", "allow", "prefer", "require", "verify-ca", "verify-full"}

// DefaultPooler is the pooler block's defaults over which a cluster's
// pooler block is read.
func DefaultPooler() PoolerConfig {
	return PoolerConfig{MaxClientConn: 5000, ServerIdleTimeout: Duration(10 * time.Second),
		QueryWaitTimeout: Duration(30 * time.Second), Coalesce: Duration(100 * time.Millisecond),
		SyncInterval: Duration(10 * time.Second), ServerTLSSSLMode: "prefer"}
}

// PacerConfig is the budget a cluster gives heavy steps.
type PacerConfig struct {
	// MaxReplayLag: heavy steps wait while any standby lags more than this.
	MaxReplayLag ByteSize `yaml:"max_replay_lag"`
	// HeavyDDLSlots: steps that force a checkpoint (CREATE DATABASE …
	// FILE_COPY, DROP DATABASE) in flight per cluster.
	HeavyDDLSlots int `yaml:"heavy_ddl_slots"`
	// WALLogSlots: CREATE DATABASE … STRATEGY WAL_LOG copies in flight per
	// cluster. They force no checkpoint; what bounds them is the WAL they
	// send the standbys, so besides this limit they run only while the WAL
	// of those in flight fits MaxReplayLag.
	WALLogSlots int `yaml:"wal_log_slots"`
	// WaitForCheckpoint: wait while a forced checkpoint is running before a
	// step that forces another (never for a timed one, which the forced
	// request would speed up anyway).
	WaitForCheckpoint bool `yaml:"wait_for_checkpoint"`
	// MaxCheckpointWait bounds that wait; then the step goes ahead.
	MaxCheckpointWait Duration `yaml:"max_checkpoint_wait"`
	// StandbyDown: "proceed" (report and go on) or "wait" (hold heavy work until it is back).
	StandbyDown string `yaml:"standby_down"`
	// PollInterval between budget checks while waiting.
	PollInterval Duration `yaml:"poll_interval"`
	// SlotWait bounds how long making a logical slot (a move's copy, an
	// analytics mirror's copy or resync) waits on other sessions'
	// transactions: it waits for every transaction holding an xid in the
	// cluster. Past it, a tenant session whose transaction is at least
	// this old and blocks the slot is terminated; any other blocker fails
	// the step, naming it, and the step is tried again later.
	SlotWait Duration `yaml:"slot_wait"`
}

// JobsConfig tunes the job runner.
type JobsConfig struct {
	Workers     int      `yaml:"workers"`      // jobs run at once by this daemon
	Lease       Duration `yaml:"lease"`        // a job whose lease expires is resumed by any daemon
	MaxAttempts int      `yaml:"max_attempts"` // then the job ends failed
	Backoff     Duration `yaml:"backoff"`      // first retry delay, doubled each attempt
	MaxBackoff  Duration `yaml:"max_backoff"`
	// Retention: finished jobs (succeeded, failed, cancelled) older than
	// this are deleted, with their step records; 0 keeps them for ever.
	Retention Duration `yaml:"retention"`
}

// Tier is a set of limits applied to a tenant's role. The timeouts and
// work_mem are role defaults a tenant can SET away; the capper
// (internal/quota) holds it to the timeouts from outside and puts back the
// role defaults it changes (docs/tiers.md).
type Tier struct {
	ConnectionLimit                 int      `yaml:"connection_limit"`
	StatementTimeout                Duration `yaml:"statement_timeout"`
	IdleInTransactionSessionTimeout Duration `yaml:"idle_in_transaction_session_timeout"`
	WorkMem                         ByteSize `yaml:"work_mem"`
	TempFileLimit                   ByteSize `yaml:"temp_file_limit"`
	Priority                        int      `yaml:"priority"` // higher goes first (prewarm)
	// Storage quota (Heroku-style): above StorageWarn an event; above
	// StorageQuota for StorageGrace the tenant loses INSERT/UPDATE/CREATE
	// (SELECT, DELETE and TRUNCATE remain) until it is back under. 0 = none.
	StorageWarn  ByteSize `yaml:"storage_warn"`
	StorageQuota ByteSize `yaml:"storage_quota"`
	StorageGrace Duration `yaml:"storage_grace"`
	// StatementCap: statements running longer are cancelled from outside,
	// whatever statement_timeout the tenant SETs (0 = none: then the
	// StatementTimeout is enforced from outside instead).
	StatementCap Duration `yaml:"statement_cap"`
	// MaxTransactionAge: a session whose transaction has been open longer
	// is terminated from outside (0 = none). PostgreSQL 15 has no such
	// setting, and an old transaction holds back vacuum's horizon and the
	// making of logical slots for every tenant of the cluster, however
	// short each of its statements and pauses.
	MaxTransactionAge Duration `yaml:"max_transaction_age"`
	// Pooling through the cluster's pooler (when it has one):
	// PoolMode is session (a client keeps its server connection: every
	// feature works) or transaction (a server connection per transaction:
	// many clients on few backends; PgBouncer 1.18 cannot carry
	// protocol-level prepared statements, docs/connections.md).
	PoolMode string `yaml:"pool_mode"`
	// PoolSize is the server connections the tenant's pool opens.
	PoolSize int `yaml:"pool_size"`
	// MaxDBConnections caps the server connections of the tenant's entry:
	// what admission counts on a cluster with a pooler (at most
	// connection_limit, which the server enforces on every session).
	MaxDBConnections int `yaml:"max_db_connections"`
	// Placement is shared (the default) or dedicated: a tenant of a
	// dedicated tier is placed only on a cluster that holds no other
	// tenant, and no other tenant is placed beside it (docs/operations/placement.md).
	Placement string `yaml:"placement"`
	// ClusterLabel (k=v) places the tier's tenants only on clusters with
	// that label (`pgtenant cluster set NAME --label k=v`).
	ClusterLabel string `yaml:"cluster_label"`
	// RequireTLS: the tier's tenants log in through their front door
	// (PgBouncer) and to the analytics port over TLS only; a clear-text
	// login is refused as PgBouncer refuses a login no HBA line admits.
	// Every pooler that fronts them needs tls_cert_file.
	RequireTLS bool `yaml:"require_tls"`
	// Extensions a database tenant of the tier may CREATE EXTENSION
	// itself: trusted ones only (PostgreSQL runs an untrusted one's script
	// as a superuser). None by default; schema tenants never (an extension
	// exists once per database, which their neighbours share).
	Extensions []string `yaml:"extensions"`
}

var extensionRE = regexp.MustCompile(`^[a-z0-9][a-z0-9_-]{0,62}$`)

var labelRE = regexp.MustCompile(`^[a-z0-9][a-z0-9_.-]{0,62}$`)

// ParseLabel splits a cluster label, key=value.
func ParseLabel(s string) (key, value string, err error) {
	k, v, ok := strings.Cut(s, "=")
	if !ok || !labelRE.MatchString(k) || len(v) > 63 || strings.ContainsAny(v, "=,\n") {
		return "", "", fmt.Errorf("label %q: use key=value (key: lowercase letters, digits, _ . -; value: up to 63 characters, no = or ,)", s)
	}
	return k, v, nil
}

// Dedicated reports whether the tier asks for a cluster of its own.
func (t Tier) Dedicated() bool { return t.Placement == "dedicated" }

// Pooling is a tier's pooling with its defaults: session mode; a pool of
// connection_limit (10 for an unlimited tier); max_db_connections of
// connection_limit, never below the pool.
func (t Tier) Pooling() (mode string, poolSize, maxDBConnections int) {
	mode = t.PoolMode
	if mode == "" {
		mode = "session"
	}
	limit := t.ConnectionLimit
	if limit < 0 {
		limit = 10
	}
	maxDBConnections = t.MaxDBConnections
	if maxDBConnections == 0 {
		maxDBConnections = max(limit, t.PoolSize, 1)
	}
	poolSize = t.PoolSize
	if poolSize == 0 {
		poolSize = maxDBConnections
	}
	return mode, min(poolSize, maxDBConnections), maxDBConnections
}

// PoolConfig keeps Size spares of a template's current version.
type PoolConfig struct {
	Template string `yaml:"template"`
	Mode     string `yaml:"mode"`    // database or schema: a tenant.Mode (tenant imports config, for tiers)
	Cluster  string `yaml:"cluster"` // empty: every cluster
	Size     int    `yaml:"size"`
}

// ProvisionConfig tunes building.
type ProvisionConfig struct {
	// BatchLocks bounds the locks one build transaction holds (and so its commit record).
	BatchLocks int `yaml:"batch_locks"`
	// WALLogMaxSize: CREATE DATABASE uses STRATEGY WAL_LOG for templates up to
	// this size and FILE_COPY above it (docs/provisioning.md, "Creating databases").
	WALLogMaxSize ByteSize `yaml:"wal_log_max_size"`
	// DefaultPoolSize is the spare count for pools not listed in Pools.
	DefaultPoolSize int `yaml:"default_pool_size"`
	// DefaultMode is the tenant mode when a create request names none: a
	// tenant.Mode, kept a string as Pools[].Mode is.
	DefaultMode string `yaml:"default_mode"`
	// ColdWait bounds how long a create waits for a cold build before it
	// answers 202 with the job to poll.
	ColdWait Duration `yaml:"cold_wait"`
	// PoolInterval is how often pools are checked (they are also refilled after each claim).
	PoolInterval Duration `yaml:"pool_interval"`
	// MaxPoolSize is how far a pool grows with demand: its target is its
	// recent creates × PoolDemandFactor, at least its configured size and at
	// most this. A pool configured at or above it, or at 0, does not grow;
	// 0 turns growth off (docs/provisioning.md, "Spare pools").
	MaxPoolSize int `yaml:"max_pool_size"`
	// PoolDemandWindow: a pool's recent creates (pool claims and cold
	// creates; a retry makes no tenant) are those within this window
	// before its latest create.
	PoolDemandWindow Duration `yaml:"pool_demand_window"`
	// PoolDemandFactor multiplies those creates into a target size.
	PoolDemandFactor float64 `yaml:"pool_demand_factor"`
	// PoolIdleAfter: a pool with no create for this long is idle, and its
	// spares above the configured size are retired, one purge at a time.
	PoolIdleAfter Duration `yaml:"pool_idle_after"`
	// RefillParallel is how many spare builds a pool below its target has
	// in flight, within the pacer's slots for its copies (database mode:
	// pacer.wal_log_slots or heavy_ddl_slots); the next ones are enqueued
	// as those end.
	RefillParallel int `yaml:"refill_parallel"`
	// ReservedConnections are a cluster's connections kept out of tenants'
	// share for pgtenant's own sessions (admin pools, the catalog when it
	// lives on the cluster, prewarm, metrics), on top of the server's
	// superuser_reserved_connections; rollouts' agent sessions
	// (migrate.per_cluster) are reserved as well.
	ReservedConnections int `yaml:"reserved_connections"`
	// ConnectionOvercommit is how far the connection limits of a cluster's
	// tenants may add up beyond its connections: a tenant is placed on a
	// cluster only while the sum of its tenants' tier connection_limit
	// stays within (max_connections − superuser_reserved_connections −
	// reserved_connections − migrate.per_cluster) × this. 1 (the default) promises every tenant
	// its whole limit whatever its neighbours do; 4 admits four times as
	// many, mostly idle, tenants at the risk that busy neighbours fill the
	// server; 0 turns admission off (docs/connections.md).
	ConnectionOvercommit float64 `yaml:"connection_overcommit"`
}

// DropConfig tunes dropping.
type DropConfig struct {
	Retention Duration `yaml:"retention"` // dropped tenants are restorable this long
	// BatchRelations bounds the relations one purge transaction drops (schema mode).
	BatchRelations int `yaml:"batch_relations"`
	// CheckInterval is how often dropped tenants past their retention are looked for.
	CheckInterval Duration `yaml:"check_interval"`
	// PurgedRetention is how long a purged tenant is remembered: its row
	// (state purged) and its events, for `tenant show` and `tenant list
	// --state purged` (0: forgotten at once).
	PurgedRetention Duration `yaml:"purged_retention"`
}

// MetricsConfig tunes the per-tenant metrics collector (internal/metrics)
// and quota enforcement (internal/quota).
type MetricsConfig struct {
	// Interval between collector passes over each cluster (0 = collector off).
	Interval Duration `yaml:"interval"`
	// SizeInterval: each tenant's size is sampled once per this, spread
	// evenly over the passes (sizes stat every file).
	SizeInterval Duration `yaml:"size_interval"`
	// IdleSizeInterval: a tenant whose clients did nothing since its last
	// size (no session open, no row written, read or counted) is sized
	// again at its first turn after this (0: at every turn, like the
	// others). Its size cannot have moved but for what sessions that come
	// and go between two passes leave outside its tables (see
	// docs/metrics.md): this bounds that.
	IdleSizeInterval Duration `yaml:"idle_size_interval"`
	// HistoryRetention keeps minute rollups this long.
	HistoryRetention Duration `yaml:"history_retention"`
	// TopTenants bounds the per-tenant series on /metrics: the N most active
	// tenants plus the opted-in ones.
	TopTenants int `yaml:"top_tenants"`
	// CapInterval between two capper checks of every node (statements over
	// their tier's cap or statement_timeout, transactions idle too long);
	// the tenants' role settings are checked every 30 of them.
	CapInterval Duration `yaml:"cap_interval"`
}

// ReconcileConfig tunes the periodic reconciler.
type ReconcileConfig struct {
	Interval Duration `yaml:"interval"`
}

// MigrateConfig tunes rollouts (pgtenant migrate).
type MigrateConfig struct {
	// Parallel: tenants a rollout migrates at once, over all clusters (a
	// rollout's --parallel overrides it).
	Parallel int `yaml:"parallel"`
	// PerCluster: tenants migrated at once on one cluster. Each holds one
	// connection, so this is the rollout's connection budget per cluster
	// (it never takes more than half of a cluster's free connection slots).
	PerCluster int `yaml:"per_cluster"`
	// LockTimeout of each tenant's migration transaction: a busy tenant
	// waits its turn (retried with backoff) instead of queueing its own
	// traffic behind the migration's lock.
	LockTimeout Duration `yaml:"lock_timeout"`
	// NoTransactionLockTimeout bounds each lock wait of a NO TRANSACTION
	// file (CREATE INDEX CONCURRENTLY waits for every older transaction of
	// the database): a tenant, or a neighbour in a shared database, holding
	// a transaction open cannot stall the rollout for longer.
	NoTransactionLockTimeout Duration `yaml:"no_transaction_lock_timeout"`
	// Retries of a tenant's transaction after a lock timeout, deadlock or lost connection.
	Retries int `yaml:"retries"`
	// RetryBackoff before the first retry, doubled each time (with jitter).
	RetryBackoff Duration `yaml:"retry_backoff"`
	// CanaryAutoContinue: a rollout whose canary tenants all succeeded goes
	// on without `pgtenant rollout continue` (a failed canary still pauses).
	CanaryAutoContinue bool `yaml:"canary_auto_continue"`
}

// Default returns the configuration used when a file sets nothing.
func Default() Config {
	return Config{
		Listen:            "127.0.0.1:8080",
		ConsoleSessionTTL: Duration(12 * time.Hour),
		Credentials:       CredentialsConfig{RetryWindow: Duration(24 * time.Hour)},
		Pacer: PacerConfig{
			MaxReplayLag:      64 << 20,
			HeavyDDLSlots:     1,
			WALLogSlots:       4,
			WaitForCheckpoint: true,
			MaxCheckpointWait: Duration(30 * time.Second),
			StandbyDown:       "proceed",
			PollInterval:      Duration(250 * time.Millisecond),
			SlotWait:          Duration(30 * time.Second),
		},
		Jobs: JobsConfig{
			Workers:     4,
			Lease:       Duration(30 * time.Second),
			MaxAttempts: 5,
			Backoff:     Duration(time.Second),
			MaxBackoff:  Duration(time.Minute),
			Retention:   Duration(30 * 24 * time.Hour),
		},
		Tiers: map[string]Tier{
			"default": {ConnectionLimit: 10, StatementTimeout: Duration(30 * time.Second),
				IdleInTransactionSessionTimeout: Duration(time.Minute), WorkMem: 4 << 20, TempFileLimit: 1 << 30, Priority: 1,
				MaxTransactionAge: Duration(15 * time.Minute)},
		},
		Provision: ProvisionConfig{BatchLocks: 1000, WALLogMaxSize: 32 << 20, DefaultPoolSize: 5, DefaultMode: "database",
			ColdWait: Duration(time.Minute), PoolInterval: Duration(5 * time.Second),
			MaxPoolSize: 50, PoolDemandWindow: Duration(time.Minute), PoolDemandFactor: 1,
			PoolIdleAfter: Duration(10 * time.Minute), RefillParallel: 4,
			ReservedConnections: 20, ConnectionOvercommit: 1},
		Drop: DropConfig{Retention: Duration(7 * 24 * time.Hour), BatchRelations: 200, CheckInterval: Duration(time.Minute),
			PurgedRetention: Duration(30 * 24 * time.Hour)},
		Reconcile: ReconcileConfig{Interval: Duration(5 * time.Minute)},
		Failover:  FailoverConfig{CheckInterval: Duration(time.Second)},
		Migrate: MigrateConfig{Parallel: 8, PerCluster: 4, LockTimeout: Duration(2 * time.Second),
			NoTransactionLockTimeout: Duration(time.Minute), Retries: 5,
			RetryBackoff: Duration(200 * time.Millisecond)},
		Metrics: MetricsConfig{Interval: Duration(15 * time.Second), SizeInterval: Duration(10 * time.Minute), IdleSizeInterval: Duration(time.Hour),
			HistoryRetention: Duration(14 * 24 * time.Hour), TopTenants: 100, CapInterval: Duration(time.Second)},
		Prewarm: PrewarmConfig{CaptureInterval: Duration(5 * time.Minute), WatchInterval: Duration(500 * time.Millisecond),
			RateLimit: 256 << 20, Parallel: 4, BufferFraction: 0.9, Beyond: "prefetch", Standbys: true},
		Analytics: AnalyticsConfig{MemoryLimit: 256 << 20, Threads: 1, StatementTimeout: Duration(30 * time.Second),
			FlushInterval: Duration(200 * time.Millisecond), BatchRows: 50000, Lease: Duration(30 * time.Second), PollInterval: Duration(time.Second)},
		Move: MoveConfig{MaxConcurrentPerCluster: 1},
		// A weekly full and a daily diff: a restore reads one full, at most
		// one diff and at most a day of WAL, and the cluster is read whole
		// once a week only (docs/operations/backups.md).
		Backups: BackupsConfig{FullEvery: Duration(7 * 24 * time.Hour), DiffEvery: Duration(24 * time.Hour),
			Retention: Duration(7 * 24 * time.Hour), CheckInterval: Duration(time.Minute)},
	}
}

// Load reads a YAML file over Default(): ${VAR} is replaced by the
// environment (an unset variable is an error), unknown fields are errors.
func Load(path string) (Config, error) {
	raw, err := os.ReadFile(path)
	if err != nil {
		return Config{}, fmt.Errorf("config: %w", err)
	}
	cfg, err := Parse(raw)
	if err != nil {
		return Config{}, fmt.Errorf("config %s: %w", path, err)
	}
	return cfg, nil
}

var envRef = regexp.MustCompile(`\$\{([A-Za-z_][A-Za-z0-9_]*)\}`)

// Parse is Load without the file.
func Parse(raw []byte) (Config, error) {
	var missing []string
	expanded := envRef.ReplaceAllStringFunc(string(raw), func(m string) string {
		name := envRef.FindStringSubmatch(m)[1]
		v, ok := os.LookupEnv(name)
		if !ok {
			missing = append(missing, name)
		}
		return v
	})
	if len(missing) > 0 {
		return Config{}, fmt.Errorf("environment variable(s) not set: %s", strings.Join(missing, ", "))
	}
	cfg := Default()
	dec := yaml.NewDecoder(bytes.NewReader([]byte(expanded)))
	dec.KnownFields(true)
	if err := dec.Decode(&cfg); err != nil && !errors.Is(err, io.EOF) { // an empty file is the defaults
		if strings.Contains(err.Error(), "did not find expected ','") {
			// A DSN's "?" or ":" inside a [flow, list] or {flow: map}.
			return Config{}, fmt.Errorf("%w (quote values such as DSNs inside [..] or {..}: [\"postgres://…?sslmode=require\"])", err)
		}
		return Config{}, err
	}
	if _, ok := cfg.Tiers["default"]; !ok {
		cfg.Tiers["default"] = Default().Tiers["default"]
	}
	if err := inheritPacer(&cfg, []byte(expanded)); err != nil {
		return Config{}, err
	}
	if err := poolerDefaults(&cfg, []byte(expanded)); err != nil {
		return Config{}, err
	}
	if err := backupDefaults(&cfg, []byte(expanded)); err != nil {
		return Config{}, err
	}
	if err := cfg.Validate(); err != nil {
		return Config{}, err
	}
	return cfg, nil
}

// inheritPacer decodes each cluster's pacer override again over the global
// pacer, so that an override sets only the fields it names.
func inheritPacer(cfg *Config, raw []byte) error {
	var nodes struct {
		Clusters []struct {
			Pacer yaml.Node `yaml:"pacer"`
		} `yaml:"clusters"`
	}
	if err := yaml.Unmarshal(raw, &nodes); err != nil {
		return err
	}
	for i, n := range nodes.Clusters {
		if i >= len(cfg.Clusters) || cfg.Clusters[i].Pacer == nil {
			continue
		}
		p := cfg.Pacer
		if err := n.Pacer.Decode(&p); err != nil {
			return fmt.Errorf("clusters[%d].pacer: %w", i, err)
		}
		cfg.Clusters[i].Pacer = &p
	}
	return nil
}

// poolerDefaults decodes each cluster's pooler block again over
// DefaultPooler, so that a block sets only the fields it names.
func poolerDefaults(cfg *Config, raw []byte) error {
	var nodes struct {
		Clusters []struct {
			Pooler yaml.Node `yaml:"pooler"`
		} `yaml:"clusters"`
	}
	if err := yaml.Unmarshal(raw, &nodes); err != nil {
		return err
	}
	for i, n := range nodes.Clusters {
		if i >= len(cfg.Clusters) || cfg.Clusters[i].Pooler == nil {
			continue
		}
		p := DefaultPooler()
		if err := n.Pooler.Decode(&p); err != nil {
			return fmt.Errorf("clusters[%d].pooler: %w", i, err)
		}
		cfg.Clusters[i].Pooler = &p
	}
	return nil
}

// backupDefaults gives each cluster's backup block its defaults, and makes
// a block written with no keys (`backup:` alone) present, so that
// validation asks for its stanza instead of ignoring it.
func backupDefaults(cfg *Config, raw []byte) error {
	var nodes struct {
		Clusters []struct {
			Backup yaml.Node `yaml:"backup"`
		} `yaml:"clusters"`
	}
	if err := yaml.Unmarshal(raw, &nodes); err != nil {
		return err
	}
	for i, n := range nodes.Clusters {
		if i >= len(cfg.Clusters) || n.Backup.Kind == 0 { // 0: no backup key
			continue
		}
		b := ClusterBackupConfig{Config: DefaultPgBackRestConfig}
		if err := n.Backup.Decode(&b); err != nil {
			return fmt.Errorf("clusters[%d].backup: %w", i, err)
		}
		cfg.Clusters[i].Backup = &b
	}
	return nil
}

var nameRE = regexp.MustCompile(`^[a-z][a-z0-9_]{0,30}$`)

// Validate checks every field and names the first bad one.
func (c Config) Validate() error {
	var errs []error
	bad := func(field, format string, args ...any) {
		errs = append(errs, fmt.Errorf("%s: %s", field, fmt.Sprintf(format, args...)))
	}
	if c.Listen == "" {
		bad("listen", "required (host:port)")
	}
	if (c.TLSCertFile == "") != (c.TLSKeyFile == "") {
		if c.TLSCertFile == "" {
			bad("tls_cert_file", "required with tls_key_file (set both to serve HTTPS, or neither)")
		} else {
			bad("tls_key_file", "required with tls_cert_file (set both to serve HTTPS, or neither)")
		}
	}
	if c.MetricsListen != "" {
		if _, port, err := net.SplitHostPort(c.MetricsListen); err != nil {
			bad("metrics_listen", "%q is not host:port, e.g. 127.0.0.1:9187", c.MetricsListen)
		} else if c.MetricsListen == c.Listen && port != "0" {
			bad("metrics_listen", "must differ from listen (leave it empty to serve /metrics on listen)")
		}
	}
	if c.ConsoleSessionTTL.D() < time.Minute {
		bad("console_session_ttl", "must be at least 1m")
	}
	if w := c.Credentials.RetryWindow.D(); w < 0 || (w > 0 && w < time.Second) {
		bad("credentials.retry_window", "must be 0 (keep no password) or at least 1s, e.g. 24h")
	}
	seen := map[string]bool{}
	for i, cl := range c.Clusters {
		f := fmt.Sprintf("clusters[%d]", i)
		if !nameRE.MatchString(cl.Name) {
			bad(f+".name", "%q must be lowercase letters, digits and _, starting with a letter, at most 31 characters", cl.Name)
		}
		if seen[cl.Name] {
			bad(f+".name", "%q is listed twice", cl.Name)
		}
		seen[cl.Name] = true
		if cl.DSN == "" {
			bad(f+".dsn", "required")
		}
		if cl.Pacer != nil {
			if err := cl.Pacer.validate(); err != nil {
				bad(f+".pacer."+err.field, "%s", err.msg)
			}
		}
		if cl.Pooler != nil {
			if err := cl.Pooler.Validate(); err != nil {
				bad(f+".pooler."+err.field, "%s", err.msg)
			}
		}
		if cl.Backup != nil {
			if err := cl.Backup.Validate(); err != nil {
				bad(f+".backup."+err.field, "%s", err.msg)
			}
		}
	}
	if err := c.Pacer.validate(); err != nil {
		bad("pacer."+err.field, "%s", err.msg)
	}
	if c.Move.MaxConcurrentPerCluster < 1 {
		bad("move.max_concurrent_per_cluster", "must be at least 1")
	}
	if c.Jobs.Workers < 1 {
		bad("jobs.workers", "must be at least 1")
	}
	if c.Jobs.Lease.D() < time.Second {
		bad("jobs.lease", "must be at least 1s")
	}
	if c.Jobs.MaxAttempts < 1 {
		bad("jobs.max_attempts", "must be at least 1")
	}
	if r := c.Jobs.Retention.D(); r < 0 || (r > 0 && r < 24*time.Hour) {
		bad("jobs.retention", "must be 0 (keep finished jobs for ever) or at least 24h (the doctor counts a day of them)")
	}
	for name, t := range c.Tiers {
		f := "tiers." + name
		if !nameRE.MatchString(name) {
			bad(f, "tier names must be lowercase letters, digits and _")
		}
		if t.ConnectionLimit < -1 {
			bad(f+".connection_limit", "must be -1 (no limit) or more")
		}
		if t.StorageWarn < 0 || t.StorageQuota < 0 || t.StorageGrace < 0 || t.StatementCap < 0 {
			bad(f, "storage_warn, storage_quota, storage_grace and statement_cap must not be negative")
		}
		if t.MaxTransactionAge < 0 {
			bad(f+".max_transaction_age", "must not be negative (0: none)")
		}
		if t.PoolMode != "" && t.PoolMode != "session" && t.PoolMode != "transaction" {
			bad(f+".pool_mode", "must be session or transaction, not %q", t.PoolMode)
		}
		if t.PoolSize < 0 || t.MaxDBConnections < 0 {
			bad(f, "pool_size and max_db_connections must not be negative (0: the default)")
		}
		if t.PoolSize > 0 && t.MaxDBConnections > 0 && t.MaxDBConnections < t.PoolSize {
			bad(f+".max_db_connections", "%d is below pool_size %d", t.MaxDBConnections, t.PoolSize)
		}
		if t.ConnectionLimit == 0 && (t.PoolSize > 0 || t.MaxDBConnections > 0) {
			bad(f+".connection_limit", "0 lets no session in, not even the pooler's")
		}
		if t.ConnectionLimit > 0 && t.MaxDBConnections > t.ConnectionLimit {
			bad(f+".max_db_connections", "%d is above connection_limit %d: the server refuses the pooler's logins beyond the role's limit", t.MaxDBConnections, t.ConnectionLimit)
		}
		for _, e := range t.Extensions {
			if !extensionRE.MatchString(e) {
				bad(f+".extensions", "%q is not an extension's name (lowercase letters, digits, _ and -)", e)
			}
		}
		if t.Placement != "" && t.Placement != "shared" && t.Placement != "dedicated" {
			bad(f+".placement", "must be shared or dedicated, not %q", t.Placement)
		}
		if t.ClusterLabel != "" {
			if _, _, err := ParseLabel(t.ClusterLabel); err != nil {
				bad(f+".cluster_label", "%v", err)
			}
		}
		if t.StorageQuota > 0 && t.StorageWarn > t.StorageQuota {
			bad(f+".storage_warn", "%s is above storage_quota %s", t.StorageWarn, t.StorageQuota)
		}
	}
	for i, p := range c.Pools {
		f := fmt.Sprintf("pools[%d]", i)
		if !nameRE.MatchString(p.Template) {
			bad(f+".template", "required: a template name")
		}
		if p.Mode != "database" && p.Mode != "schema" {
			bad(f+".mode", "must be database or schema, not %q", p.Mode)
		}
		if p.Size < 0 || p.Size > 1000 {
			bad(f+".size", "must be between 0 and 1000")
		}
	}
	if c.Provision.BatchLocks < 10 {
		bad("provision.batch_locks", "must be at least 10")
	}
	if c.Provision.ColdWait.D() < 0 {
		bad("provision.cold_wait", "must not be negative")
	}
	if c.Provision.PoolInterval.D() <= 0 {
		bad("provision.pool_interval", "must be positive")
	}
	if c.Provision.ReservedConnections < 0 {
		bad("provision.reserved_connections", "must be 0 or more")
	}
	if c.Provision.ConnectionOvercommit < 0 {
		bad("provision.connection_overcommit", "must be 0 (admission off) or positive, e.g. 1 (no overcommit)")
	}
	if c.Provision.DefaultPoolSize < 0 {
		bad("provision.default_pool_size", "must be 0 or more")
	}
	if c.Provision.MaxPoolSize < 0 || c.Provision.MaxPoolSize > 1000 {
		bad("provision.max_pool_size", "must be between 0 (pools do not grow with demand) and 1000")
	}
	if c.Provision.PoolDemandWindow.D() < time.Second {
		bad("provision.pool_demand_window", "must be at least 1s")
	}
	if c.Provision.PoolDemandFactor <= 0 || c.Provision.PoolDemandFactor > 100 {
		bad("provision.pool_demand_factor", "must be above 0 and at most 100")
	}
	if c.Provision.PoolIdleAfter.D() < c.Provision.PoolDemandWindow.D() {
		bad("provision.pool_idle_after", "must be at least provision.pool_demand_window (%s)", c.Provision.PoolDemandWindow)
	}
	if c.Provision.RefillParallel < 1 || c.Provision.RefillParallel > 100 {
		bad("provision.refill_parallel", "must be between 1 and 100")
	}
	if c.Provision.DefaultMode != "database" && c.Provision.DefaultMode != "schema" {
		bad("provision.default_mode", "must be database or schema")
	}
	if c.Metrics.Interval < 0 {
		bad("metrics.interval", "must not be negative (0 turns the collector off)")
	}
	if c.Metrics.Interval > 0 && c.Metrics.SizeInterval.D() < c.Metrics.Interval.D() {
		bad("metrics.size_interval", "must be at least metrics.interval")
	}
	if c.Metrics.IdleSizeInterval != 0 && c.Metrics.IdleSizeInterval.D() < c.Metrics.SizeInterval.D() {
		bad("metrics.idle_size_interval", "must be 0 (idle tenants sized like the others) or at least metrics.size_interval")
	}
	if c.Metrics.HistoryRetention.D() < time.Minute {
		bad("metrics.history_retention", "must be at least 1m")
	}
	if c.Metrics.TopTenants < 0 {
		bad("metrics.top_tenants", "must be 0 or more")
	}
	if c.Metrics.CapInterval.D() < 100*time.Millisecond {
		bad("metrics.cap_interval", "must be at least 100ms")
	}
	if c.Drop.BatchRelations < 1 {
		bad("drop.batch_relations", "must be at least 1")
	}
	if c.Analytics.MemoryLimit < 16<<20 {
		bad("analytics.memory_limit", "at least 16MB")
	}
	if c.Analytics.Threads < 1 {
		bad("analytics.threads", "at least 1")
	}
	if c.Analytics.StatementTimeout <= 0 || c.Analytics.FlushInterval <= 0 || c.Analytics.PollInterval <= 0 {
		bad("analytics", "statement_timeout, flush_interval and poll_interval must be > 0")
	}
	if c.Analytics.BatchRows < 1 {
		bad("analytics.batch_rows", "at least 1")
	}
	if c.Analytics.Lease < 3*c.Analytics.PollInterval {
		bad("analytics.lease", "at least 3 × analytics.poll_interval")
	}
	if a := c.Analytics.Advertise; a != "" {
		if host, port, err := net.SplitHostPort(a); err != nil || host == "" || port == "" || port == "0" {
			bad("analytics.advertise", "a host:port the tenants and the other daemons reach, e.g. analytics1.internal:6543")
		}
	}
	if (c.Analytics.TLSCertFile == "") != (c.Analytics.TLSKeyFile == "") {
		bad("analytics.tls_cert_file", "set both analytics.tls_cert_file and analytics.tls_key_file, or neither (then the daemon's tls_cert_file serves the port, when set)")
	} else if cert, _ := c.AnalyticsTLSPair(); cert == "" && c.Analytics.RequireTLS {
		bad("analytics.require_tls", "needs a certificate: analytics.tls_cert_file and analytics.tls_key_file (or the daemon's tls_cert_file and tls_key_file)")
	} else if cert == "" && c.Analytics.TLSCAFile != "" {
		bad("analytics.tls_ca_file", "needs a certificate: analytics.tls_cert_file and analytics.tls_key_file (or the daemon's)")
	}
	for name, t := range c.Tiers {
		if !t.RequireTLS {
			continue
		}
		for i, cl := range c.Clusters {
			if cl.Pooler != nil && cl.Pooler.TLSCertFile == "" {
				bad("tiers."+name+".require_tls", "the pooler of cluster %s (clusters[%d].pooler) has no tls_cert_file: this tier's tenants could not log in through it; give it a certificate", cl.Name, i)
			}
		}
	}
	if c.Prewarm.RateLimit <= 0 {
		bad("prewarm.rate_limit", "must be positive, e.g. 256MB")
	}
	if c.Prewarm.Parallel < 1 {
		bad("prewarm.parallel", "must be at least 1")
	}
	if c.Prewarm.BufferFraction <= 0 || c.Prewarm.BufferFraction > 1 {
		bad("prewarm.buffer_fraction", "must be in (0, 1]")
	}
	if c.Prewarm.Beyond != "prefetch" && c.Prewarm.Beyond != "read" && c.Prewarm.Beyond != "none" {
		bad("prewarm.beyond", "must be prefetch, read or none, not %q", c.Prewarm.Beyond)
	}
	if c.Drop.CheckInterval.D() <= 0 {
		bad("drop.check_interval", "must be positive")
	}
	if c.Drop.PurgedRetention.D() < 0 {
		bad("drop.purged_retention", "must not be negative (0: purged tenants are forgotten at once)")
	}
	if c.Drop.Retention.D() < 0 {
		bad("drop.retention", "must not be negative")
	}
	if c.Migrate.Parallel < 1 || c.Migrate.Parallel > 1000 {
		bad("migrate.parallel", "must be between 1 and 1000")
	}
	if c.Migrate.PerCluster < 1 || c.Migrate.PerCluster > 1000 {
		bad("migrate.per_cluster", "must be between 1 and 1000")
	}
	if c.Migrate.LockTimeout.D() < 10*time.Millisecond {
		bad("migrate.lock_timeout", "must be at least 10ms")
	}
	if c.Migrate.NoTransactionLockTimeout.D() < 10*time.Millisecond {
		bad("migrate.no_transaction_lock_timeout", "must be at least 10ms")
	}
	if c.Migrate.Retries < 0 {
		bad("migrate.retries", "must be 0 or more")
	}
	if c.Migrate.RetryBackoff.D() <= 0 {
		bad("migrate.retry_backoff", "must be positive")
	}
	if c.Backups.FullEvery.D() < time.Minute {
		bad("backups.full_every", "must be at least 1m, e.g. 7d")
	}
	if d := c.Backups.DiffEvery.D(); d < 0 || (d > 0 && d < time.Minute) {
		bad("backups.diff_every", "must be 0 (no differential backups) or at least 1m, e.g. 1d")
	} else if d >= c.Backups.FullEvery.D() && c.Backups.FullEvery.D() > 0 {
		bad("backups.diff_every", "%s is not below backups.full_every %s: every backup would be a full one (set 0 for none)", c.Backups.DiffEvery, c.Backups.FullEvery)
	}
	if r := c.Backups.Retention.D(); r < 24*time.Hour || r%(24*time.Hour) != 0 {
		bad("backups.retention", "must be whole days, at least 1d, e.g. 7d (pgBackRest keeps time-based retention in days)")
	}
	if c.Backups.CheckInterval.D() < time.Second {
		bad("backups.check_interval", "must be at least 1s")
	}
	if i := c.Failover.CheckInterval.D(); i < 0 || (i > 0 && i < 100*time.Millisecond) {
		bad("failover.check_interval", "must be 0 (do not follow Patroni leaders) or at least 100ms, e.g. 1s")
	}
	return errors.Join(errs...)
}

type fieldError struct{ field, msg string }

// Validate checks a pooler block; `up` checks the one it builds too.
func (p PoolerConfig) Validate() *fieldError {
	host, port, err := net.SplitHostPort(p.Listen)
	switch {
	case err != nil || host == "" || port == "" || port == "0":
		return &fieldError{"listen", fmt.Sprintf("%q is not host:port, e.g. 127.0.0.1:6432", p.Listen)}
	case p.Dir == "" || !strings.HasPrefix(p.Dir, "/"):
		return &fieldError{"dir", "required: an absolute directory for PgBouncer's config, auth file and log"}
	case p.Server != "":
		if h, pt, err := net.SplitHostPort(p.Server); err != nil || h == "" || pt == "" {
			return &fieldError{"server", fmt.Sprintf("%q is not host:port", p.Server)}
		}
		if p.ServerSocketDir != "" {
			return &fieldError{"server_socket_dir", "not with server: one names the server's socket directory, the other its TCP address"}
		}
	case p.ServerSocketDir != "":
		if err := CheckSocketDir(p.ServerSocketDir); err != nil {
			return &fieldError{"server_socket_dir", err.Error()}
		}
	}
	switch {
	case p.MaxClientConn < 1:
		return &fieldError{"max_client_conn", "must be at least 1"}
	case p.ServerIdleTimeout.D() < time.Second:
		return &fieldError{"server_idle_timeout", "must be at least 1s"}
	case p.QueryWaitTimeout.D() < time.Second:
		return &fieldError{"query_wait_timeout", "must be at least 1s"}
	case p.Coalesce < 0 || p.Coalesce.D() > 10*time.Second:
		return &fieldError{"coalesce", "must be between 0 and 10s"}
	case p.SyncInterval.D() < time.Second:
		return &fieldError{"sync_interval", "must be at least 1s"}
	}
	return p.validateTLS()
}

// MaxSocketDir is the longest socket directory a server's socket fits
// in: a Unix socket's path (DIR/.s.PGSQL.PORT) has at most 107 bytes.
const MaxSocketDir = 107 - len("/.s.PGSQL.65535")

// CheckSocketDir checks a server's socket directory as PgBouncer is
// given it: absolute, of the characters pgbouncer.ini takes as they are,
// and short enough for the socket's path.
func CheckSocketDir(dir string) error {
	switch {
	case !poolerPathRE.MatchString(dir):
		return fmt.Errorf("%q: an absolute path of letters, digits and . _ / + - only (it is written into pgbouncer.ini)", dir)
	case len(dir) > MaxSocketDir:
		return fmt.Errorf("%q: %d bytes, at most %d (a Unix socket's path, DIR/.s.PGSQL.PORT, has at most 107)", dir, len(dir), MaxSocketDir)
	}
	return nil
}

// poolerPathRE is a path written into pgbouncer.ini as is: absolute, no
// space, quote, newline or comment character.
var poolerPathRE = regexp.MustCompile(`^/[A-Za-z0-9._/+-]*$`)

// validateTLS checks the front door's certificate files: their shape (they
// are written into pgbouncer.ini) and that both or neither are set
// (CheckTLSFiles loads them).
func (p PoolerConfig) validateTLS() *fieldError {
	for _, f := range []struct{ key, path string }{{"tls_cert_file", p.TLSCertFile}, {"tls_key_file", p.TLSKeyFile}, {"tls_ca_file", p.TLSCAFile},
		{"server_tls_ca_file", p.ServerTLSCAFile}} {
		if f.path != "" && !poolerPathRE.MatchString(f.path) {
			return &fieldError{f.key, fmt.Sprintf("%q: an absolute path of letters, digits and . _ / + - only (it is written into pgbouncer.ini)", f.path)}
		}
	}
	switch {
	case p.TLSCertFile == "" && p.TLSKeyFile != "":
		return &fieldError{"tls_cert_file", "required with tls_key_file (set both to serve TLS, or neither)"}
	case p.TLSCertFile != "" && p.TLSKeyFile == "":
		return &fieldError{"tls_key_file", "required with tls_cert_file (set both to serve TLS, or neither)"}
	case p.TLSCertFile == "" && p.TLSCAFile != "":
		return &fieldError{"tls_ca_file", "needs tls_cert_file and tls_key_file: the CA names what signed them"}
	case p.TLSCertFile == "" && p.RequireTLS:
		return &fieldError{"require_tls", "needs tls_cert_file and tls_key_file: without a certificate no tenant could log in"}
	case p.ServerTLSSSLMode != "" && !slices.Contains(ServerTLSModes, p.ServerTLSSSLMode):
		return &fieldError{"server_tls_sslmode", fmt.Sprintf("%q: one of %s", p.ServerTLSSSLMode, strings.Join(ServerTLSModes, ", "))}
	case strings.HasPrefix(p.ServerTLSSSLMode, "verify-") && p.ServerTLSCAFile == "":
		return &fieldError{"server_tls_ca_file", "required with server_tls_sslmode " + p.ServerTLSSSLMode + ": the CA that signed the server's certificate"}
	case p.ServerSocketDir != "" && (p.ServerTLSSSLMode == "require" || strings.HasPrefix(p.ServerTLSSSLMode, "verify-")):
		return &fieldError{"server_tls_sslmode", p.ServerTLSSSLMode + " with server_socket_dir: a Unix socket carries no TLS; use prefer or disable, or drop server_socket_dir"}
	}
	return nil
}

// CheckTLSFiles loads the pooler's certificate, key and CA, when set, so
// that a bad file is named at the daemon's start rather than in
// PgBouncer's log (Validate checks only their shape: a config is parsed
// where its files may not be).
func (p PoolerConfig) CheckTLSFiles() error {
	if err := checkTLSFiles(p.TLSCertFile, p.TLSKeyFile, p.TLSCAFile); err != nil {
		return err
	}
	return nil
}

// CheckAnalyticsTLSFiles loads analytics.tls_cert_file, tls_key_file and
// tls_ca_file, when set.
func (c Config) CheckAnalyticsTLSFiles() error {
	if err := checkTLSFiles(c.Analytics.TLSCertFile, c.Analytics.TLSKeyFile, c.Analytics.TLSCAFile); err != nil {
		return &fieldError{"analytics." + err.field, err.msg}
	}
	return nil
}

// checkTLSFiles loads a certificate and its key, and a CA, when set.
func checkTLSFiles(cert, key, ca string) *fieldError {
	if cert != "" {
		if _, err := tls.LoadX509KeyPair(cert, key); err != nil {
			return &fieldError{"tls_cert_file", fmt.Sprintf("%s with tls_key_file %s: %v (PEM files, the key of that certificate)", cert, key, err)}
		}
	}
	if ca != "" {
		b, err := os.ReadFile(ca)
		if err != nil {
			return &fieldError{"tls_ca_file", err.Error()}
		}
		if !x509.NewCertPool().AppendCertsFromPEM(b) {
			return &fieldError{"tls_ca_file", fmt.Sprintf("%s holds no PEM certificate", ca)}
		}
	}
	return nil
}

// stanzaRE is what a stanza name may hold here: it is passed to pgbackrest
// and written into the restore_command of scratch instances, which a
// shell runs.
var stanzaRE = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$`)

// shellPathRE is an absolute path the shell takes literally: the config
// and program paths are written into restore_command too.
var shellPathRE = regexp.MustCompile(`^/[A-Za-z0-9._/+-]*$`)

// Validate checks an external cluster's backup block.
func (b ClusterBackupConfig) Validate() *fieldError {
	switch {
	case b.Stanza == "":
		return &fieldError{"stanza", "required: the name of the cluster's existing pgBackRest stanza (its [section] in the config; `pgbackrest info` lists them)"}
	case !stanzaRE.MatchString(b.Stanza):
		return &fieldError{"stanza", fmt.Sprintf("%q: letters, digits, '.', '_' and '-' only, at most 64 (it is passed to pgbackrest and to the shell of a scratch instance's restore_command)", b.Stanza)}
	case b.Config != "" && !shellPathRE.MatchString(b.Config):
		return &fieldError{"config", fmt.Sprintf("%q: an absolute path without spaces or quotes, e.g. %s", b.Config, DefaultPgBackRestConfig)}
	case b.Program != "" && !shellPathRE.MatchString(b.Program):
		return &fieldError{"program", fmt.Sprintf("%q: an absolute path without spaces or quotes, e.g. /usr/bin/pgbackrest (or leave it out: pgbackrest on PATH)", b.Program)}
	}
	return nil
}

// Error makes a fieldError an error.
func (e *fieldError) Error() string { return e.field + ": " + e.msg }

func (p PacerConfig) validate() *fieldError {
	switch {
	case p.MaxReplayLag <= 0:
		return &fieldError{"max_replay_lag", "must be positive, e.g. 64MB"}
	case p.HeavyDDLSlots < 1 || p.HeavyDDLSlots > 16:
		return &fieldError{"heavy_ddl_slots", "must be between 1 and 16"}
	case p.WALLogSlots < 1 || p.WALLogSlots > 16:
		return &fieldError{"wal_log_slots", "must be between 1 and 16"}
	case p.StandbyDown != "proceed" && p.StandbyDown != "wait":
		return &fieldError{"standby_down", fmt.Sprintf("must be proceed or wait, not %q", p.StandbyDown)}
	case p.PollInterval.D() <= 0:
		return &fieldError{"poll_interval", "must be positive"}
	case p.MaxCheckpointWait < 0:
		return &fieldError{"max_checkpoint_wait", "must not be negative"}
	case p.SlotWait.D() < time.Second:
		return &fieldError{"slot_wait", "must be at least 1s, e.g. 30s"}
	}
	return nil
}

// PacerFor returns the pacer budget of a cluster.
func (c Config) PacerFor(cluster string) PacerConfig {
	for _, cl := range c.Clusters {
		if cl.Name == cluster && cl.Pacer != nil {
			return *cl.Pacer
		}
	}
	return c.Pacer
}
