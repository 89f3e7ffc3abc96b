package doctor

import (
	"cmp"
	"fmt"
	"math"
	"strconv"
	"strings"
	"time"

	"github.com/pgtenant/pgtenant/internal/catalog"
	"github.com/pgtenant/pgtenant/internal/cluster"
	"github.com/pgtenant/pgtenant/internal/config"
	"github.com/pgtenant/pgtenant/internal/tenant"
)

// Statuses of a check, from best to worst.
const (
	OK      = "ok"
	Unknown = "unknown" // could not be checked; says why
	Warn    = "warn"
	Fail    = "fail"
)

func rank(s string) int {
	switch s {
	case OK:
		return 0
	case Unknown:
		return 1
	case Warn:
		return 2
	}
	return 3
}

// Check is one finding: what was seen, what the fleet needs, why, and what to set.
type Check struct {
	Name   string `json:"name"`
	Status string `json:"status"`
	Got    string `json:"got"`
	Want   string `json:"want,omitempty"`
	Why    string `json:"why"`
	Fix    string `json:"fix,omitempty"`
}

// Facts are what the checks look at, gathered from the cluster, its
// standbys, the catalog, the configuration and (when the server runs on this
// machine) the operating system. The checks themselves are pure functions
// of the facts.
type Facts struct {
	Cluster    string
	Version    string
	VersionNum int
	Settings   map[string]string // pg_settings.setting (base units)
	Standbys   []StandbyFacts    // configured standby DSNs
	Streaming  int               // standbys streaming from the primary (pg_stat_replication)
	Databases  int
	Files      int64 // relation files under base/ (-1 unknown)
	Extensions map[string]cluster.ExtensionState

	CheckpointsTimed, CheckpointsRequested int64
	StatsReset                             time.Time // of pg_stat_bgwriter

	Largest     *catalog.LargestBuild // the template build with the most relations, any cluster
	LargestSize int64                 // the largest template build, bytes
	BuildsDay   int                   // tenant builds finished on this cluster in the last 24 hours
	PurgesDay   int                   // tenant purges finished on this cluster in the last 24 hours
	Spares      map[string]int        // spares by mode
	Tenants     map[string]int        // claimed tenants (provisioning, active, suspended, dropped) by mode

	TenantsByTier       map[string]int // claimed tenants on this cluster (provisioning, active, suspended, dropped) by tier
	ConnectionLimits    map[string]int // each configured tier's connection_limit (-1: unlimited)
	Overcommit          float64        // provision.connection_overcommit (0: admission off)
	RolloutConnections  int            // migrate.per_cluster
	ReservedConnections int            // provision.reserved_connections

	BatchLocks     int   // provision.batch_locks
	PurgeBatch     int   // drop.batch_relations
	WALLogMaxSize  int64 // provision.wal_log_max_size
	TenantBytesNow int64 // summed latest sizes of tenants measured a day ago too
	TenantBytesDay int64 // their sizes a day ago
	GrowthTenants  int   // how many tenants that is

	Local          bool   // the data directory is on this machine
	LocalWhy       string // why it is not known to be
	DataDir        string
	DiskFree       int64
	DiskTotal      int64
	OpenFilesLimit int64  // the postmaster's soft RLIMIT_NOFILE (-1 unknown)
	StatsTempFS    string // file system type of stats_temp_directory (servers before 15)

	Pooler  *PoolerFacts  // the cluster's PgBouncer, nil without one
	Backup  *BackupFacts  // the cluster's pgBackRest stanza, nil when it has none
	Patroni *PatroniFacts // the cluster's Patroni members, nil when Patroni does not run it
	Certs   []CertFacts   // the TLS certificates of its front door and of the daemon's ports, where configured
	// TierExtensions: the extensions the tiers list, as this cluster has them.
	TierExtensions []TierExtension
	Now            time.Time // when the facts were gathered (certificates' expiry is judged against it)
}

// PatroniFacts are what the failover check looks at: the members of a
// cluster Patroni runs, as its REST API reports them.
type PatroniFacts struct {
	Err             string // Patroni did not answer
	Leader          string // the running leader, "" for none
	Members         int
	Replicas        int // running replicas (synchronous or not)
	SyncStandbys    int // running synchronous standbys
	SynchronousMode bool
}

// BackupFacts are what the backup checks look at: the repository
// (pgbackrest info), the primary's archiver (pg_stat_archiver), the
// repository's file system and the schedule (backups.*).
type BackupFacts struct {
	Now     time.Time
	InfoErr string    // the repository could not be read
	Backups int       // backups in the repository
	Newest  time.Time // stop of the newest backup (zero: none)
	Running bool      // a backup holds pgBackRest's lock

	ArchiverErr    string // pg_stat_archiver could not be read
	ArchiveFailing bool
	FailedCount    int64
	LastFailedWAL  string
	LastFailedAt   time.Time
	LastArchivedAt time.Time // zero: nothing archived yet

	RepoPath  string
	DiskErr   string
	DiskFree  int64
	DiskTotal int64

	FullEvery time.Duration // backups.full_every
	DiffEvery time.Duration // backups.diff_every (0: none)
}

// PoolerFacts are what the pooler check looks at.
type PoolerFacts struct {
	Addr    string
	Running bool      // its process runs on this machine
	Up      bool      // it answered its last sync
	Err     string    // the last sync's error
	At      time.Time // the last successful sync
	Entries int
	Skipped int      // tenants left out (no SCRAM verifier)
	Drift   []string // its databases against the catalog after the last sync
	// MaxClientConn and ServerConnections (the tenants' max_db_connections
	// added up) are the file descriptors it may need; OpenFilesLimit is its
	// soft RLIMIT_NOFILE (-1 unknown).
	MaxClientConn     int
	ServerConnections int
	OpenFilesLimit    int64
}

// StandbyFacts are one configured standby's settings.
type StandbyFacts struct {
	DSN      string // password redacted
	Err      string // could not connect
	Settings map[string]string
}

func (f Facts) int(name string) int64 {
	v, err := strconv.ParseInt(f.Settings[name], 10, 64)
	if err != nil {
		return -1
	}
	return v
}

// maxBackends is PostgreSQL's MaxBackends: the lock table has room for
// max_locks_per_transaction × (MaxBackends + max_prepared_transactions) locks.
func maxBackends(s func(string) int64) int64 {
	return s("max_connections") + s("autovacuum_max_workers") + 1 + s("max_worker_processes") + s("max_wal_senders")
}

// Checks runs every check over the facts.
func Checks(f Facts) []Check {
	out := []Check{locks(f)}
	out = append(out, standbySettings(f)...)
	out = append(out, connections(f))
	out = append(out, replication(f), analyticsSlots(f), files(f), density(f), extensions(f), autovacuum(f), checkpoints(f), disk(f), statsTemp(f))
	if f.Pooler != nil {
		out = append(out, poolerCheck(f))
	}
	if f.Backup != nil {
		out = append(out, archiving(*f.Backup), backupAge(f.Cluster, *f.Backup), backupDisk(*f.Backup))
	}
	if f.Patroni != nil {
		out = append(out, failover(f.Cluster, *f.Patroni))
	}
	if len(f.Certs) > 0 {
		out = append(out, certificates(f.Now, f.Certs))
	}
	if len(f.TierExtensions) > 0 {
		out = append(out, tierExtensions(f.TierExtensions))
	}
	return out
}

// failover: a cluster Patroni runs has a leader and a replica to promote,
// and in synchronous mode a synchronous standby (else a commit is
// acknowledged unreplicated, and no standby is promoted automatically).
func failover(name string, p PatroniFacts) Check {
	c := Check{Name: "failover", Want: "a running leader and a running replica; in synchronous mode a synchronous standby",
		Why: "Patroni promotes a replica when the leader's node dies. With none, the cluster is down until the node is back; " +
			"in synchronous mode without a synchronous standby commits are acknowledged before any standby has them, " +
			"and Patroni promotes no one automatically (docs/operations/failover.md)."}
	mode := "asynchronous"
	if p.SynchronousMode {
		mode = "synchronous"
	}
	c.Got = fmt.Sprintf("leader %s, %d members, %d running replicas (%d synchronous), %s mode", cmp.Or(p.Leader, "none"), p.Members,
		p.Replicas, p.SyncStandbys, mode)
	switch {
	case p.Err != "":
		c.Status, c.Got = Unknown, "Patroni does not answer: "+p.Err
		c.Fix = "check the Patroni nodes' REST APIs (`pgtenant cluster show " + name + "` lists their URLs)"
	case p.Leader == "":
		c.Status = Fail
		c.Fix = "see why no node leads in the Patroni nodes' logs; `pgtenant cluster failover " + name + " --to NODE` forces one"
	case p.Replicas == 0:
		c.Status = Warn
		c.Fix = "start the cluster's other node(s): Patroni rejoins them as replicas"
	case p.SynchronousMode && p.SyncStandbys == 0:
		c.Status = Warn
		c.Fix = "wait for the replica to catch up (it becomes the synchronous standby), or see why it does not in its Patroni log"
	default:
		c.Status = OK
	}
	return c
}

// poolerCheck: the pooler runs, is in sync with the catalog, and has the
// clients and files the fleet may need.
func poolerCheck(f Facts) Check {
	p := f.Pooler
	c := Check{Name: "pooler", Why: "Tenants connect through the cluster's PgBouncer: down, nobody gets in; out of sync with " +
		"the catalog, a new tenant cannot log in or a suspended one still can. Each client and each server connection " +
		"holds a file descriptor: max_client_conn plus the tenants' max_db_connections must fit under its open-file " +
		"limit, and max_client_conn is shared by every tenant (PgBouncer 1.18 has no per-tenant client limit)."}
	running, synced, limit := "running", "last sync ok", "unknown"
	if !p.Running {
		running = "not running"
	}
	if !p.Up || p.Err != "" {
		synced = "last sync failed"
	}
	if p.OpenFilesLimit >= 0 {
		limit = strconv.FormatInt(p.OpenFilesLimit, 10)
	}
	c.Got = fmt.Sprintf("%s: %s, %s, %d entries, %d tenants left out, %d differences; max_client_conn=%d, "+
		"tenants' max_db_connections add up to %d, open-file limit %s", p.Addr, running, synced, p.Entries,
		p.Skipped, len(p.Drift), p.MaxClientConn, p.ServerConnections, limit)
	need := int64(p.MaxClientConn + p.ServerConnections + 64)
	c.Want = fmt.Sprintf("running and in sync; open-file limit >= %d (max_client_conn + server connections + 64); "+
		"max_client_conn >= %d (every tenant's pool usable at once)", need, p.ServerConnections)
	var fixes []string
	c.Status = OK
	worse := func(s string) {
		if rank(s) > rank(c.Status) {
			c.Status = s
		}
	}
	switch {
	case !p.Running:
		worse(Fail)
		fixes = append(fixes, "the pooler is not running: the daemon restarts it (see its log and the pooler's pgbouncer.log)")
	case !p.Up || p.Err != "":
		worse(Fail)
		fixes = append(fixes, "the last sync failed: "+p.Err)
	}
	if len(p.Drift) > 0 {
		worse(Warn)
		fixes = append(fixes, "differences with the catalog: "+strings.Join(p.Drift, "; ")+" (`pgtenant reconcile --fix` syncs it)")
	}
	if p.Skipped > 0 {
		worse(Warn)
		fixes = append(fixes, fmt.Sprintf("%d tenants have no SCRAM-SHA-256 password on their role and cannot log in through the pooler: rotate their passwords (`pgtenant tenant password ID`)", p.Skipped))
	}
	if p.OpenFilesLimit >= 0 && p.OpenFilesLimit < need {
		worse(Fail)
		fixes = append(fixes, fmt.Sprintf("raise the open-file limit of the user running pgbouncer to %d (the soft limit is raised to the hard one at start: raise the hard limit, e.g. LimitNOFILE or /etc/security/limits.conf), or lower the pooler's max_client_conn", need))
	}
	if p.MaxClientConn < p.ServerConnections {
		worse(Warn)
		fixes = append(fixes, fmt.Sprintf("raise the pooler's max_client_conn to at least %d", p.ServerConnections))
	}
	c.Fix = strings.Join(fixes, "; ")
	return c
}

func roundUp(n, to int64) int64 { return (n + to - 1) / to * to }

// locks: the lock table against the largest template and pgtenant's batches.
func locks(f Facts) Check {
	c := Check{Name: "locks"}
	mlpt := f.int("max_locks_per_transaction")
	backends := maxBackends(f.int) + max(f.int("max_prepared_transactions"), 0)
	slots := mlpt * backends
	largest, what := int64(0), "no template is built yet"
	if f.Largest != nil {
		largest = int64(f.Largest.Relations)
		what = fmt.Sprintf("template %s v%d has %d relations (built on %s)", f.Largest.Template, f.Largest.Version, f.Largest.Relations, f.Largest.Cluster)
	}
	one := max(largest, int64(f.BatchLocks), int64(f.PurgeBatch))
	need := 2 * one
	c.Got = fmt.Sprintf("max_locks_per_transaction=%d: lock table of %d locks; %s; provision.batch_locks=%d, drop.batch_relations=%d",
		mlpt, slots, what, f.BatchLocks, f.PurgeBatch)
	want := max(roundUp((need+backends-1)/max(backends, 1), 64), 64)
	c.Want = fmt.Sprintf("a lock table of at least %d locks (twice the largest of those), i.e. max_locks_per_transaction >= %d at these connection settings", need, want)
	c.Why = "A transaction that touches every relation of a tenant (pg_dump, DROP SCHEMA … CASCADE, a migration in one " +
		"transaction) takes a lock per relation, and pgtenant's own build and purge batches take up to their budgets; all " +
		"sessions share one lock table of max_locks_per_transaction × (max_connections + background workers + " +
		"max_prepared_transactions) entries. When it is full, every session fails with \"out of shared memory\". " +
		"Standbys replay the primary's exclusive locks and need the same budget."
	switch {
	case mlpt < 0:
		c.Status, c.Got = Unknown, "max_locks_per_transaction not readable"
	case slots < one:
		c.Status = Fail
		c.Fix = fmt.Sprintf("ALTER SYSTEM SET max_locks_per_transaction = %d on the primary and every standby, then restart them (standbys first)", want)
	case slots < need:
		c.Status = Warn
		c.Fix = fmt.Sprintf("ALTER SYSTEM SET max_locks_per_transaction = %d on the primary and every standby, then restart them (standbys first)", want)
	default:
		c.Status = OK
	}
	return c
}

// standbySettings: a hot standby needs settings at least as large as the primary's.
func standbySettings(f Facts) []Check {
	var out []Check
	names := []string{"max_locks_per_transaction", "max_connections", "max_prepared_transactions", "max_worker_processes", "max_wal_senders"}
	for i, s := range f.Standbys {
		c := Check{Name: fmt.Sprintf("standby%d_settings", i+1),
			Why: "A hot standby must have max_locks_per_transaction, max_connections, max_prepared_transactions, " +
				"max_worker_processes and max_wal_senders at least as large as its primary, or replay stops (PostgreSQL pauses " +
				"recovery until it is restarted with larger values) and the standby falls behind.",
			Want: "each at least the primary's"}
		if s.Err != "" {
			c.Status, c.Got = Unknown, fmt.Sprintf("cannot connect to %s: %s", s.DSN, s.Err)
			out = append(out, c)
			continue
		}
		var low, got []string
		for _, n := range names {
			p, _ := strconv.ParseInt(f.Settings[n], 10, 64)
			v, err := strconv.ParseInt(s.Settings[n], 10, 64)
			if err != nil {
				continue
			}
			got = append(got, fmt.Sprintf("%s=%d", n, v))
			if v < p {
				low = append(low, fmt.Sprintf("%s = %d", n, p))
			}
		}
		c.Got = s.DSN + ": " + strings.Join(got, ", ")
		if len(low) > 0 {
			c.Status = Fail
			c.Fix = "on the standby: ALTER SYSTEM SET " + strings.Join(low, ", SET ") + ", then restart it (before raising the primary further)"
		} else {
			c.Status = OK
		}
		out = append(out, c)
	}
	return out
}

// minReserved is the superuser_reserved_connections the connections check
// wants: pgtenant's admin sessions (on the primary: its pool, the capper's
// checks, suspend and lock-out) must get in when tenants fill the server.
const minReserved = 5

// connections: the connection limits of the cluster's tenants against what
// admission promises them, and the superuser reserve.
func connections(f Facts) Check {
	c := Check{Name: "connections", Why: "Each tenant may open up to its tier's connection_limit sessions. Admission " +
		"(provision.connection_overcommit) places a tenant on a cluster only while its tenants' limits add up to at most " +
		"(max_connections − superuser_reserved_connections − provision.reserved_connections − migrate.per_cluster) × " +
		"overcommit, so that busy tenants " +
		"cannot take the connections promised to others or to rollouts. Limits that add up to more (overcommit lowered, " +
		"or a tier's connection_limit raised, after tenants were admitted: tenants already placed keep their role's " +
		"limit) let tenants fill the server, and then everyone gets \"too many connections\" before reaching their own " +
		"limit. superuser_reserved_connections are the slots left to superusers when the rest are taken: pgtenant's " +
		"admin sessions (a superuser's: the statement capper, suspend, lock-out, its checks) need them exactly when " +
		"tenants fill the server."}
	maxConns, reserved := f.int("max_connections"), f.int("superuser_reserved_connections")
	if maxConns < 0 || reserved < 0 {
		c.Status, c.Got = Unknown, "max_connections or superuser_reserved_connections not readable"
		return c
	}
	cc := tenant.Connections{MaxConnections: int(maxConns), Reserved: int(reserved) + f.ReservedConnections, Rollout: f.RolloutConnections}
	tenants := 0
	for tier, n := range f.TenantsByTier {
		cc.Used += n * tenant.Share(f.ConnectionLimits[tier], cc.MaxConnections)
		tenants += n
	}
	overcommit := f.Overcommit
	times := fmt.Sprintf("provision.connection_overcommit=%g", overcommit)
	if overcommit == 0 {
		overcommit, times = 1, "1 (admission off: provision.connection_overcommit=0)"
	}
	capacity := cc.Capacity(overcommit)
	pct := math.Inf(1)
	if capacity > 0 {
		pct = float64(cc.Used) / float64(capacity) * 100
	} else if cc.Used == 0 {
		pct = 0
	}
	c.Got = fmt.Sprintf("%d tenants whose connection limits add up to %d of %d (%.0f%%) = (max_connections=%d − "+
		"superuser_reserved_connections=%d − provision.reserved_connections=%d − migrate.per_cluster=%d) × %s",
		tenants, cc.Used, capacity, pct, maxConns, reserved, f.ReservedConnections, f.RolloutConnections, times)
	c.Want = fmt.Sprintf("connection limits within 90%% of that, superuser_reserved_connections >= %d", minReserved)
	// The max_connections at which the tenants' limits would be within 90% of capacity.
	wantMax := int(math.Ceil(float64(cc.Used)/overcommit/0.9)) + cc.Reserved + f.RolloutConnections
	var fixes []string
	c.Status = OK
	switch {
	case f.Overcommit == 0 && pct > 100:
		c.Status = Warn
		fixes = append(fixes, fmt.Sprintf("admission is off and the limits exceed the server's connections: set "+
			"provision.connection_overcommit (1: no overcommit), or raise max_connections to %d on the primary and every "+
			"standby (ALTER SYSTEM; restart, standbys first)", wantMax))
	case f.Overcommit == 0:
	case pct > 100:
		c.Status = Fail
		fixes = append(fixes, fmt.Sprintf("ALTER SYSTEM SET max_connections = %d on the primary and every standby, then "+
			"restart them (standbys first), or move tenants to another cluster; new tenants are refused here meanwhile", wantMax))
	case pct > 90:
		c.Status = Warn
		fixes = append(fixes, fmt.Sprintf("new tenants will soon be refused here: add a cluster, or ALTER SYSTEM SET "+
			"max_connections = %d on the primary and every standby and restart them (standbys first)", wantMax))
	}
	if reserved < minReserved {
		if c.Status == OK {
			c.Status = Warn
		}
		fixes = append(fixes, fmt.Sprintf("ALTER SYSTEM SET superuser_reserved_connections = %d and restart (the reserve "+
			"counts within max_connections: raise that by %d too to keep the tenants' share)", minReserved, minReserved-reserved))
	}
	c.Fix = strings.Join(fixes, "; ")
	return c
}

// replication: wal_level and standbys.
func replication(f Facts) Check {
	c := Check{Name: "replication", Why: "Tenants live on the primary; a streaming standby is what survives its loss. " +
		"wal_level must be replica (or logical) for standbys, and every standby needs a WAL sender (plus spares for pg_basebackup)."}
	wal := f.Settings["wal_level"]
	senders := f.int("max_wal_senders")
	c.Got = fmt.Sprintf("wal_level=%s, max_wal_senders=%d, %d standby DSN(s) configured, %d streaming", wal, senders, len(f.Standbys), f.Streaming)
	c.Want = "wal_level=replica or logical, at least one streaming standby, max_wal_senders >= standbys + 2"
	switch {
	case wal == "minimal":
		c.Status, c.Fix = Fail, "ALTER SYSTEM SET wal_level = replica; ALTER SYSTEM SET max_wal_senders = 10; restart, then add a standby (pg_basebackup -R)"
	case f.Streaming < len(f.Standbys):
		c.Status, c.Fix = Fail, "a configured standby is not streaming: check it is running and can reach the primary (see `pgtenant cluster list`)"
	case f.Streaming == 0:
		c.Status, c.Fix = Warn, "add a streaming standby (pg_basebackup -R) and register it: `pgtenant cluster add NAME --dsn … --standby DSN`"
	case senders < int64(f.Streaming)+2:
		c.Status, c.Fix = Warn, fmt.Sprintf("ALTER SYSTEM SET max_wal_senders = %d; restart", f.Streaming+2)
	default:
		c.Status = OK
	}
	return c
}

// analyticsSlots: tenants' analytics mirrors decode WAL through logical
// slots; a slot whose mirror lags or is gone keeps WAL on the primary.
func analyticsSlots(f Facts) Check {
	c := Check{Name: "analytics_slots", Why: "Analytics mirrors (`pgtenant analytics enable`) read the WAL through a logical slot per tenant: " +
		"that needs wal_level=logical, and a slot retains WAL until its mirror confirms it. Without max_slot_wal_keep_size a mirror " +
		"that lags or whose daemon is gone fills the primary's disk; with it, PostgreSQL invalidates the slot instead and pgtenant copies the mirror again."}
	wal := f.Settings["wal_level"]
	keep := f.int("max_slot_wal_keep_size")
	keepGot := f.Settings["max_slot_wal_keep_size"] // MB
	switch {
	case keepGot == "":
		keepGot = "unknown"
	case keep == -1:
		keepGot = "-1 (no limit)"
	case keep >= 0:
		keepGot = human(keep << 20)
	}
	c.Got = fmt.Sprintf("wal_level=%s, max_slot_wal_keep_size=%s", wal, keepGot)
	c.Want = "wal_level=logical, max_slot_wal_keep_size set (not -1), below the free disk"
	switch {
	case f.Settings["max_slot_wal_keep_size"] == "":
		c.Status, c.Fix = Unknown, "max_slot_wal_keep_size could not be read (PostgreSQL 13 or later has it)"
	case wal != "logical":
		c.Status, c.Fix = Warn, "ALTER SYSTEM SET wal_level = logical; restart (analytics mirrors cannot be enabled before)"
	case keep < 0:
		c.Status, c.Fix = Warn, "ALTER SYSTEM SET max_slot_wal_keep_size = '4GB' (well below the free disk); SELECT pg_reload_conf()"
	case f.DiskFree > 0 && keep<<20 > f.DiskFree:
		c.Status, c.Fix = Warn, fmt.Sprintf("max_slot_wal_keep_size is more than the free disk (%s): lower it", config.ByteSize(f.DiskFree).Human())
	default:
		c.Status = OK
	}
	return c
}

// measuredFiles is the most relation files a cluster was measured with
// (bench density at 10,000 schema + 1,000 database tenants: 2.05 M; claims,
// rollouts, the collector and reconcile within their targets, crash
// recovery 1.8 s with recovery_init_sync_method = syncfs).
const measuredFiles = 2_000_000

// files: relation files, max_files_per_process and the open-file limit.
func files(f Facts) Check {
	c := Check{Name: "files", Why: "Every relation is at least one file (an empty database about 300); each backend keeps at most " +
		"max_files_per_process of them open and recycles the rest, and the checkpointer fsyncs every file written since the " +
		"last checkpoint (after 1,000 creates, ~290k files: minutes on the standby). A session touching every relation of a " +
		"tenant (pg_dump, VACUUM) reopens files constantly when a tenant has more files than max_files_per_process. " +
		"PostgreSQL silently lowers max_files_per_process to what the open-file limit (ulimit -n) allows."}
	mfpp := f.int("max_files_per_process")
	perTenant := int64(0)
	if f.Largest != nil {
		perTenant = int64(f.Largest.Relations) * 3 / 2 // main fork, plus FSM/VM forks of the larger relations
	}
	wantFiles := max(1000, roundUp(perTenant+perTenant/4, 1000))
	var got []string
	got = append(got, fmt.Sprintf("max_files_per_process=%d", mfpp))
	if f.Files >= 0 {
		got = append(got, fmt.Sprintf("%d relation files", f.Files))
	} else {
		got = append(got, "relation files unknown (needs superuser or pg_read_server_files)")
	}
	if perTenant > 0 {
		got = append(got, fmt.Sprintf("~%d files per tenant of the largest template", perTenant))
	}
	if f.OpenFilesLimit > 0 {
		got = append(got, fmt.Sprintf("open-file limit %d", f.OpenFilesLimit))
	} else if !f.Local {
		got = append(got, "open-file limit unknown (server not on this machine)")
	}
	c.Got = strings.Join(got, ", ")
	c.Want = fmt.Sprintf("max_files_per_process >= %d, open-file limit >= max_files_per_process + 100", wantFiles)
	c.Status = OK
	var fixes []string
	if mfpp >= 0 && mfpp < wantFiles {
		c.Status = Warn
		fixes = append(fixes, fmt.Sprintf("ALTER SYSTEM SET max_files_per_process = %d; restart", wantFiles))
	}
	limitNeeded := max(mfpp, wantFiles) + 100
	if f.OpenFilesLimit > 0 && f.OpenFilesLimit < limitNeeded {
		c.Status = Warn
		fixes = append(fixes, fmt.Sprintf("raise the server's open-file limit to at least %d (LimitNOFILE= in its systemd unit, or ulimit -n before pg_ctl)", limitNeeded))
	}
	if f.Files > measuredFiles {
		c.Status = Warn
		fixes = append(fixes, fmt.Sprintf("%d relation files on one cluster, more than the %d measured (bench density: 10,000 schema + 1,000 database tenants "+
			"of saas; docs/operations/capacity.md): drops, restarts and crash recovery grow with files; place new tenants on another cluster", f.Files, measuredFiles))
	}
	c.Fix = strings.Join(fixes, "; ")
	return c
}

// The most tenants of each mode a cluster was measured with (bench density:
// 10,000 schema tenants of saas in one shared database and 1,000 database
// tenants, with claims, rollouts, the collector, reconcile and idle WAL
// within their targets); docs/operations/capacity.md plans a cluster by it.
const (
	measuredSchemaTenants   = 10_000
	measuredDatabaseTenants = 1_000
)

// density: the cluster's tenants against what was measured.
func density(f Facts) Check {
	s, d := f.Tenants[string(tenant.ModeSchema)], f.Tenants[string(tenant.ModeDatabase)]
	c := Check{Name: "density", Why: "A cluster's tenants share its catalogs, files, WAL and checkpoints: a schema tenant of saas adds 159 " +
		"pg_class and ~900 pg_attribute rows to its shared database, a database tenant ~470 files and its own catalogs. bench density " +
		"measured a cluster up to 10,000 schema and 1,000 database tenants with claims, rollouts, the collector and reconcile within " +
		"their targets; beyond that nothing was measured (docs/operations/capacity.md).",
		Got:  fmt.Sprintf("%d schema tenants, %d database tenants", s, d),
		Want: fmt.Sprintf("at most %d schema and %d database tenants (measured)", measuredSchemaTenants, measuredDatabaseTenants), Status: OK}
	if s > measuredSchemaTenants || d > measuredDatabaseTenants {
		c.Status = Warn
		c.Fix = fmt.Sprintf("place new tenants on another cluster: pgtenant cluster set %s --max-tenants %d (and `pgtenant cluster add` one), "+
			"or measure this size first with pgtenant bench density", f.Cluster, s+d)
	}
	return c
}

// extensions: what prewarm needs.
func extensions(f Facts) Check {
	c := Check{Name: "prewarm_extensions", Why: "After a restart or failover pgtenant warms tenants' hot data with pg_prewarm, " +
		"using hot sets captured with pg_buffercache; without them tenants come back cold (a 1 GB scan: 22 s cold vs 8 s warm).",
		Want: "pg_prewarm and pg_buffercache available"}
	var missing, got []string
	for _, e := range cluster.Extensions {
		st := f.Extensions[e]
		switch {
		case !st.Available:
			missing = append(missing, e)
			got = append(got, e+" not available")
		case st.Installed != "":
			got = append(got, e+" "+st.Installed+" installed")
		default:
			got = append(got, e+" available")
		}
	}
	c.Got = strings.Join(got, ", ")
	if len(missing) > 0 {
		c.Status = Warn
		c.Fix = "install the server's contrib package (Debian: postgresql-" + majorOf(f.VersionNum) + " includes them; RHEL: postgresql" + majorOf(f.VersionNum) + "-contrib)"
	} else {
		c.Status = OK
	}
	return c
}

func majorOf(num int) string {
	if num <= 0 {
		return "N"
	}
	return strconv.Itoa(num / 10000)
}

// autovacuum: on, and not relaunching workers too often with many databases.
func autovacuum(f Facts) Check {
	c := Check{Name: "autovacuum", Why: "Autovacuum must run (dead rows, and transaction ID wraparound would stop every tenant). " +
		"Its launcher starts a worker in each database once per autovacuum_naptime: with thousands of databases that is a " +
		"worker start every few milliseconds, each reading that database's statistics (before PostgreSQL 15 each such read " +
		"made the statistics collector rewrite a stats file: the source document's 80-90 MB/s of writes on an idle server)."}
	naptime := f.int("autovacuum_naptime")
	on := f.Settings["autovacuum"] == "on"
	rate := 0.0
	if naptime > 0 {
		rate = float64(f.Databases) / float64(naptime)
	}
	c.Got = fmt.Sprintf("autovacuum=%s, %d databases, autovacuum_naptime=%ds: %.1f worker starts per second", f.Settings["autovacuum"], f.Databases, naptime, rate)
	wantNap := max(60, int64(math.Ceil(float64(f.Databases)/2)))
	c.Want = fmt.Sprintf("autovacuum=on, at most 2 worker starts per second (autovacuum_naptime >= %ds here)", wantNap)
	switch {
	case !on:
		c.Status, c.Fix = Fail, "ALTER SYSTEM SET autovacuum = on; SELECT pg_reload_conf()"
	case rate > 2:
		c.Status = Warn
		if f.VersionNum > 0 && f.VersionNum < 150000 && f.StatsTempFS != "tmpfs" {
			c.Status = Fail
		}
		c.Fix = fmt.Sprintf("ALTER SYSTEM SET autovacuum_naptime = '%ds'; SELECT pg_reload_conf()", wantNap)
	default:
		c.Status = OK
	}
	return c
}

// statsWindow is how long the checkpoint statistics must cover before
// doctor compares requested checkpoints with timed ones: 6 hours, and at
// least 24 checkpoint_timeout intervals (seconds).
func statsWindow(timeout int64) time.Duration {
	return max(6*time.Hour, 24*time.Duration(max(timeout, 0))*time.Second)
}

// checkpoints: forced checkpoints from FILE_COPY creates and database drops.
func checkpoints(f Facts) Check {
	c := Check{Name: "checkpoints", Why: "CREATE DATABASE … STRATEGY FILE_COPY forces two checkpoints and DROP DATABASE one, on " +
		"the primary and, in replay, on the standby; each fsyncs every dirty file of the cluster. WAL_LOG creates force none " +
		"but write the template to the WAL, which forces checkpoints once max_wal_size is reached. Forced checkpoints should " +
		"not outnumber the timed ones."}
	timeout := f.int("checkpoint_timeout")
	maxWAL := f.int("max_wal_size") << 20 // MB
	timedPerHour := 0.0
	if timeout > 0 {
		timedPerHour = 3600 / float64(timeout)
	}
	fileCopy := tenant.CreateStrategy(f.LargestSize, f.Streaming, f.WALLogMaxSize) == cluster.FileCopy
	forcedDay := f.PurgesDay
	strategy := "WAL_LOG"
	if fileCopy {
		forcedDay += 2 * f.BuildsDay
		strategy = "FILE_COPY"
	}
	estPerHour := float64(forcedDay) / 24
	// The observed counts are judged only once the statistics cover
	// enough timed checkpoints to outnumber the burst a new server's
	// setup requests (base backups for its standbys, the first template
	// and spare builds): a fleet 20 minutes old has had 4 timed ones.
	obsPerHour := 0.0
	window := statsWindow(timeout)
	observed := fmt.Sprintf("observed %d requested vs %d timed", f.CheckpointsRequested, f.CheckpointsTimed)
	if f.StatsReset.IsZero() {
		observed += " (when the statistics were reset is unknown: not judged)"
	} else {
		age := time.Since(f.StatsReset)
		shown := age.Truncate(time.Second)
		if age >= time.Hour {
			shown = age.Truncate(time.Minute)
		}
		observed += fmt.Sprintf(" in the %s since statistics reset", span(shown))
		if age < window {
			observed += fmt.Sprintf(" (not judged before %s: a new server's setup requests checkpoints that only hours of timed ones outnumber)", span(window))
		} else {
			obsPerHour = float64(f.CheckpointsRequested) / age.Hours()
		}
	}
	walGot := "unknown"
	if maxWAL >= 0 {
		walGot = human(maxWAL)
	}
	c.Got = fmt.Sprintf("checkpoint_timeout=%ds (%.0f timed/hour), max_wal_size=%s; last 24h: %d tenant builds (%s for the largest template, %s), %d purges: ~%.1f forced/hour; %s",
		timeout, timedPerHour, walGot, f.BuildsDay, strategy, human(f.LargestSize), f.PurgesDay, estPerHour, observed)
	c.Want = "forced (requested) checkpoints fewer than timed ones"
	walPerCkpt := 0.0
	if !fileCopy && timeout > 0 {
		walPerCkpt = float64(f.BuildsDay) / 24 / timedPerHour * float64(f.LargestSize) // WAL from creates per checkpoint interval
	}
	var fixes []string
	c.Status = OK
	if estPerHour > timedPerHour || (obsPerHour > timedPerHour && f.CheckpointsRequested > f.CheckpointsTimed) {
		c.Status = Warn
		if fileCopy {
			fixes = append(fixes, fmt.Sprintf("creates use FILE_COPY because the template (%s) exceeds provision.wal_log_max_size (%s): raise it if the standby's lag budget (pacer.max_replay_lag) allows, so creates force no checkpoint", human(f.LargestSize), human(f.WALLogMaxSize)))
		}
		fixes = append(fixes, "drops force a checkpoint each: keep drop.retention so that purges spread out, and pacer.heavy_ddl_slots = 1")
	}
	if maxWAL > 0 && walPerCkpt > float64(maxWAL)/2 {
		c.Status = Warn
		fixes = append(fixes, fmt.Sprintf("WAL_LOG creates write ~%s of WAL per checkpoint interval: ALTER SYSTEM SET max_wal_size = '%dMB'", human(int64(walPerCkpt)), roundUp(int64(walPerCkpt*2)>>20, 1024)))
	}
	c.Fix = strings.Join(fixes, "; ")
	if timeout < 0 {
		c.Status = Unknown
	}
	return c
}

// disk: free space against the growth of the last day.
func disk(f Facts) Check {
	c := Check{Name: "disk", Why: "Tenants grow, spares and template copies take space, and a full disk stops the whole cluster " +
		"(and its standby, which needs the same space)."}
	if !f.Local {
		c.Status = Unknown
		c.Got = "the server's file system is not visible from here: " + f.LocalWhy
		c.Fix = "watch free space on the server (and the standbys) with your monitoring"
		return c
	}
	growth := float64(f.TenantBytesNow - f.TenantBytesDay) // bytes per day
	pct := float64(f.DiskFree) / float64(max(f.DiskTotal, 1)) * 100
	c.Got = fmt.Sprintf("%s free of %s (%.0f%%) under %s", human(f.DiskFree), human(f.DiskTotal), pct, f.DataDir)
	days := math.Inf(1)
	if f.GrowthTenants > 0 {
		c.Got += fmt.Sprintf("; %d tenants grew %s in the last day", f.GrowthTenants, human(int64(growth)))
		if growth > 0 {
			days = float64(f.DiskFree) / growth
			c.Got += fmt.Sprintf(": full in %.0f days at that rate", days)
		}
	} else {
		c.Got += "; growth unknown (no size history from a day ago yet)"
	}
	c.Want = "more than 15% free and more than 30 days of growth"
	switch {
	case pct < 5 || days < 7:
		c.Status = Fail
	case pct < 15 || days < 30:
		c.Status = Warn
	default:
		c.Status = OK
	}
	if c.Status != OK {
		c.Fix = "add disk, or place new tenants on another cluster (tenant create --cluster) and move big ones away"
	}
	return c
}

// statsTemp: before PostgreSQL 15, the statistics collector's temp files.
func statsTemp(f Facts) Check {
	c := Check{Name: "stats_temp_directory", Why: "Before PostgreSQL 15 the statistics collector rewrote stats files in " +
		"stats_temp_directory whenever a backend or autovacuum worker asked for fresh statistics; with hundreds of databases " +
		"that was 80-90 MB/s of disk writes on an idle server (the source document). On tmpfs those writes cost no disk. " +
		"From 15 on, statistics live in shared memory."}
	if f.VersionNum >= 150000 {
		c.Status = OK
		c.Got = fmt.Sprintf("PostgreSQL %s keeps statistics in shared memory", f.Version)
		return c
	}
	dir := f.Settings["stats_temp_directory"]
	c.Got = fmt.Sprintf("stats_temp_directory=%s", dir)
	c.Want = "stats_temp_directory on a tmpfs"
	switch {
	case f.StatsTempFS == "":
		c.Status = Unknown
		c.Got += ", file system unknown (server not on this machine)"
		c.Fix = "make sure stats_temp_directory is on a tmpfs (e.g. /run/postgresql)"
	case f.StatsTempFS == "tmpfs":
		c.Status = OK
		c.Got += " (tmpfs)"
	default:
		c.Status = Warn
		if f.Databases > 100 {
			c.Status = Fail
		}
		c.Got += fmt.Sprintf(" on %s, %d databases", f.StatsTempFS, f.Databases)
		c.Fix = "mount a tmpfs (e.g. 64MB at /run/postgresql/stats_tmp, owned by postgres) and ALTER SYSTEM SET stats_temp_directory = '/run/postgresql/stats_tmp'; SELECT pg_reload_conf()"
	}
	return c
}

func human(n int64) string { return config.ByteSize(n).Human() }

// archiving: the primary's archive_command succeeds.
func archiving(b BackupFacts) Check {
	c := Check{Name: "archiving", Want: "the last archive attempt succeeded",
		Why: "While archive_command fails, no WAL reaches the repository: the recovery window stops growing " +
			"(a restore or rewind cannot reach past the last archived segment) and the WAL piles up in pg_wal until the disk is full."}
	switch {
	case b.ArchiverErr != "":
		c.Status, c.Got = Unknown, "pg_stat_archiver could not be read: "+b.ArchiverErr
	case b.ArchiveFailing:
		c.Status = Fail
		c.Got = fmt.Sprintf("archiving %s failed at %s (%d failures since the statistics were reset)",
			b.LastFailedWAL, b.LastFailedAt.UTC().Format(time.DateTime), b.FailedCount)
		if !b.LastArchivedAt.IsZero() {
			c.Got += "; last success " + b.LastArchivedAt.UTC().Format(time.DateTime)
		}
		c.Fix = "read the cause in the server log and in the stanza's log/ (<cluster dir>/backup/log/*-archive-push-async.log): " +
			"a full repository disk, a changed archive_command, pgbackrest removed; once fixed the archiver retries by itself"
	default:
		c.Status, c.Got = OK, "archiving works"
		if !b.LastArchivedAt.IsZero() {
			c.Got += "; last segment archived " + b.LastArchivedAt.UTC().Format(time.DateTime)
		}
	}
	return c
}

// backupAge: the newest backup is no older than twice the schedule.
func backupAge(clusterName string, b BackupFacts) Check {
	every, what := b.FullEvery, "backups.full_every"
	if b.DiffEvery > 0 {
		every, what = b.DiffEvery, "backups.diff_every"
	}
	c := Check{Name: "backup_age", Want: fmt.Sprintf("a backup within twice the schedule (%s, %s %s)", span(2*every), what, span(every)),
		Why: "A restore starts from the newest backup and replays WAL from there: the older it is, the longer a restore or " +
			"rewind takes and the more archived WAL it depends on. No backup within twice the schedule means the scheduled ones fail."}
	fix := "look at the last cluster.backup jobs (`pgtenant job list --type cluster.backup`) and their errors, " +
		"then take one with `pgtenant backup now --cluster " + clusterName + " --wait`"
	switch {
	case b.InfoErr != "":
		c.Status, c.Got, c.Fix = Unknown, "the repository could not be read: "+b.InfoErr, "run `pgtenant backup list` for the cause"
	case b.Backups == 0 && b.Running:
		c.Status, c.Got = OK, "no backup yet; the first one is running"
	case b.Backups == 0:
		c.Status, c.Got, c.Fix = Warn, "no backup in the repository: nothing to restore from", fix
	default:
		age := b.Now.Sub(b.Newest)
		c.Got = fmt.Sprintf("newest backup stopped %s ago (%s)", span(age), b.Newest.UTC().Format(time.DateTime))
		c.Status = OK
		if age > 2*every {
			c.Status, c.Fix = Warn, fix
		}
	}
	return c
}

// backupDisk: room left on the repository's file system.
func backupDisk(b BackupFacts) Check {
	c := Check{Name: "backup_disk", Want: "more than 10% free",
		Why: "A full repository disk fails every backup and every archive-push: archiving stops, WAL piles up " +
			"on the primary, and when the repository shares the data disk, the cluster stops too."}
	if b.DiskErr != "" {
		c.Status, c.Got = Unknown, b.DiskErr
		return c
	}
	pct := float64(b.DiskFree) / float64(max(b.DiskTotal, 1)) * 100
	c.Got = fmt.Sprintf("%s free of %s (%.0f%%) under %s", human(b.DiskFree), human(b.DiskTotal), pct, b.RepoPath)
	switch {
	case pct < 5:
		c.Status = Fail
	case pct < 10:
		c.Status = Warn
	default:
		c.Status = OK
	}
	if c.Status != OK {
		c.Fix = "add disk, or shorten backups.retention (fewer full backups and less WAL kept; takes effect at the next backup's expire)"
	}
	return c
}

// span prints a duration as an operator reads it: 14d, 1d12h, 1m30s.
func span(d time.Duration) string {
	d = d.Round(time.Second)
	var b strings.Builder
	for _, u := range []struct {
		n    time.Duration
		unit string
	}{{24 * time.Hour, "d"}, {time.Hour, "h"}, {time.Minute, "m"}, {time.Second, "s"}} {
		if d >= u.n {
			fmt.Fprintf(&b, "%d%s", d/u.n, u.unit)
			d %= u.n
		}
	}
	if b.Len() == 0 {
		return "0s"
	}
	return b.String()
}
