// Package doctor checks each cluster against what a tenant fleet needs and
// says why and what to set: the lock table against the largest template and
// pgtenant's batches (and standbys against their primary), the tenants'
// connection limits against the server's connections, files and the
// open-file limit, replication, the prewarm extensions, autovacuum with many
// databases, forced checkpoints, disk space against growth, and, before
// PostgreSQL 15, the statistics temp directory. It only reads: the cluster's
// settings and views, its standbys' settings, the catalog, and (when the
// server runs on this machine) the operating system.
package doctor

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pgtenant/pgtenant/internal/backup"
	"github.com/pgtenant/pgtenant/internal/catalog"
	"github.com/pgtenant/pgtenant/internal/cluster"
	"github.com/pgtenant/pgtenant/internal/config"
	"github.com/pgtenant/pgtenant/internal/jobs"
	"github.com/pgtenant/pgtenant/internal/patroni"
	"github.com/pgtenant/pgtenant/internal/pooler"
)

// Doctor examines clusters.
type Doctor struct {
	Store    *catalog.Store
	Clusters *cluster.Registry
	Config   config.Config
	Logger   *slog.Logger
	// Poolers, when a cluster has one, adds the pooler check (and makes
	// the connections check count each tenant's max_db_connections).
	Poolers *pooler.Set
	// Backups, for the clusters it backs up, adds the archiving, backup
	// age and backup disk checks.
	Backups *backup.Service
}

// Report is one examination.
type Report struct {
	At       time.Time       `json:"at"`
	Status   string          `json:"status"` // the worst of all clusters
	Clusters []ClusterReport `json:"clusters"`
}

// ClusterReport is one cluster's checks.
type ClusterReport struct {
	Cluster string  `json:"cluster"`
	Version string  `json:"server_version,omitempty"`
	Status  string  `json:"status"` // the worst check
	Error   string  `json:"error,omitempty"`
	Checks  []Check `json:"checks"`
}

// settings the checks read (base units, as pg_settings.setting).
var settings = []string{"max_connections", "superuser_reserved_connections", "max_locks_per_transaction", "max_prepared_transactions",
	"autovacuum_max_workers", "max_worker_processes", "max_wal_senders", "max_files_per_process", "wal_level",
	"autovacuum", "autovacuum_naptime", "checkpoint_timeout", "max_wal_size", "data_directory", "stats_temp_directory",
	"shared_preload_libraries", "max_slot_wal_keep_size", "max_replication_slots"}

// Run examines one cluster, or every cluster with clusterName "".
func (d *Doctor) Run(ctx context.Context, clusterName string) (Report, error) {
	rep := Report{At: time.Now(), Status: OK, Clusters: []ClusterReport{}}
	var cls []*cluster.Cluster
	if clusterName != "" {
		cl, err := d.Clusters.Get(clusterName)
		if err != nil {
			return rep, err
		}
		cls = []*cluster.Cluster{cl}
	} else {
		cls = d.Clusters.All()
		sort.Slice(cls, func(i, j int) bool { return cls[i].Name() < cls[j].Name() })
	}
	for _, cl := range cls {
		cr := ClusterReport{Cluster: cl.Name(), Checks: []Check{}}
		f, err := d.Facts(ctx, cl)
		if err != nil {
			cr.Status, cr.Error = Fail, err.Error()
		} else {
			cr.Version = f.Version
			cr.Checks = Checks(f)
			cr.Status = OK
			for _, c := range cr.Checks {
				if rank(c.Status) > rank(cr.Status) {
					cr.Status = c.Status
				}
			}
		}
		if rank(cr.Status) > rank(rep.Status) {
			rep.Status = cr.Status
		}
		rep.Clusters = append(rep.Clusters, cr)
	}
	return rep, nil
}

// Facts gathers what the checks need about one cluster.
func (d *Doctor) Facts(ctx context.Context, cl *cluster.Cluster) (Facts, error) {
	info, err := cl.Info(ctx)
	if err != nil {
		return Facts{}, err
	}
	f := Facts{Cluster: cl.Name(), Version: info.ServerVersion, VersionNum: info.VersionNum, Databases: info.Databases,
		Files: info.RelationFiles, Extensions: info.Extensions, Settings: map[string]string{}, OpenFilesLimit: -1,
		CheckpointsTimed: info.CheckpointsTimed, CheckpointsRequested: info.CheckpointsRequested,
		BatchLocks: d.Config.Provision.BatchLocks, PurgeBatch: d.Config.Drop.BatchRelations,
		WALLogMaxSize: int64(d.Config.Provision.WALLogMaxSize), ConnectionLimits: map[string]int{},
		Overcommit: d.Config.Provision.ConnectionOvercommit, RolloutConnections: d.Config.Migrate.PerCluster,
		ReservedConnections: d.Config.Provision.ReservedConnections}
	front := d.Poolers.Get(cl.Name())
	for name, t := range d.Config.Tiers {
		f.ConnectionLimits[name] = t.ConnectionLimit
		if front != nil {
			_, _, f.ConnectionLimits[name] = t.Pooling()
		}
	}
	for _, s := range info.Standbys {
		if s.State != cluster.StandbyDown {
			f.Streaming++
		}
	}
	admin, err := cl.Admin(ctx)
	if err != nil {
		return f, err
	}
	if f.Settings, err = readSettings(ctx, admin); err != nil {
		return f, fmt.Errorf("read settings of %s: %w", cl.Name(), err)
	}
	if f.TierExtensions, err = tierExtensionFacts(ctx, admin, d.Config.Tiers); err != nil {
		return f, fmt.Errorf("read the extensions of %s: %w", cl.Name(), err)
	}
	var reset *time.Time
	if err := admin.QueryRow(ctx, `SELECT stats_reset FROM pg_stat_bgwriter`).Scan(&reset); err == nil && reset != nil {
		f.StatsReset = *reset
	}
	for _, dsn := range cl.StandbyDSNs() {
		f.Standbys = append(f.Standbys, standbyFacts(ctx, dsn))
	}

	// The catalog: the largest template, recent builds and purges, growth.
	b, maxSize, err := d.Store.LargestTemplateBuild(ctx)
	switch {
	case err == nil:
		f.Largest, f.LargestSize = &b, maxSize
	case !errors.Is(err, catalog.ErrNotFound):
		return f, err
	}
	day := time.Now().Add(-24 * time.Hour)
	if f.BuildsDay, err = jobs.SucceededSince(ctx, d.Store.Pool(), cl.Name(), jobs.TenantBuild, day); err != nil {
		return f, err
	}
	if f.PurgesDay, err = jobs.SucceededSince(ctx, d.Store.Pool(), cl.Name(), jobs.TenantPurge, day); err != nil {
		return f, err
	}
	if f.Spares, f.Tenants, err = d.Store.ModeCounts(ctx, cl.Name()); err != nil {
		return f, err
	}
	byCluster, err := d.Store.TierCounts(ctx)
	if err != nil {
		return f, err
	}
	f.TenantsByTier = byCluster[cl.Name()]
	if f.TenantBytesNow, f.TenantBytesDay, f.GrowthTenants, err = d.Store.SizeGrowth(ctx, cl.Name(), 24*time.Hour); err != nil {
		return f, err
	}

	d.local(ctx, admin, &f)
	if front != nil {
		f.Pooler = d.poolerFacts(front, f.TenantsByTier)
	}
	f.Backup = backupFacts(ctx, d.Backups, cl.Name())
	var frontCert string
	if front != nil {
		frontCert = front.Settings.TLSCertFile
	}
	f.Certs, f.Now = certFacts(d.Config, frontCert), time.Now()
	if c, err := d.Store.GetCluster(ctx, cl.Name()); err == nil && len(c.PatroniURLs) > 0 {
		f.Patroni = patroniFacts(ctx, c.PatroniURLs)
	}
	return f, nil
}

// patroniFacts reads a cluster's members from its Patroni nodes.
func patroniFacts(ctx context.Context, urls []string) *PatroniFacts {
	pc := patroni.NewClient(urls, &http.Client{Timeout: 5 * time.Second})
	ms, err := pc.Members(ctx)
	if err == nil {
		var sync bool
		if sync, err = pc.SynchronousMode(ctx); err == nil {
			p := &PatroniFacts{Members: len(ms), SynchronousMode: sync}
			for _, m := range ms {
				switch {
				case m.Role == patroni.RoleLeader && m.Running():
					p.Leader = m.Name
				case m.Running():
					p.Replicas++
					if m.Role == patroni.RoleSyncStandby {
						p.SyncStandbys++
					}
				}
			}
			return p
		}
	}
	return &PatroniFacts{Err: err.Error()}
}

// poolerFacts reads a pooler's last sync, its settings and its process.
func (d *Doctor) poolerFacts(front *pooler.Front, byTier map[string]int) *PoolerFacts {
	s := front.Snapshot()
	pf := &PoolerFacts{Addr: front.Addr(), Up: s.Up, Err: s.LastError, At: s.At, Entries: s.Entries,
		Skipped: len(s.Skipped), Drift: s.Drift, MaxClientConn: front.Settings.MaxClientConn, OpenFilesLimit: -1}
	for tier, n := range byTier {
		t, ok := d.Config.Tiers[tier]
		if !ok {
			t = d.Config.Tiers["default"]
		}
		_, _, maxDB := t.Pooling()
		pf.ServerConnections += n * maxDB
	}
	if pid := front.Proc.PID(); pid != 0 {
		pf.Running = true
		pf.OpenFilesLimit = openFilesLimit(pid)
	}
	return pf
}

type queryRower interface {
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}

func readSettings(ctx context.Context, q queryRower) (map[string]string, error) {
	rows, err := q.Query(ctx, `SELECT name, setting FROM pg_settings WHERE name = ANY($1)`, settings)
	if err != nil {
		return nil, cluster.Classify(err)
	}
	defer rows.Close()
	out := map[string]string{}
	for rows.Next() {
		var k, v string
		if err := rows.Scan(&k, &v); err != nil {
			return nil, err
		}
		out[k] = v
	}
	return out, rows.Err()
}

func standbyFacts(ctx context.Context, dsn string) StandbyFacts {
	s := StandbyFacts{DSN: cluster.RedactDSN(dsn)}
	conn, err := cluster.ConnectDSN(ctx, dsn, "")
	if err != nil {
		s.Err = cluster.RedactError(err, dsn)
		return s
	}
	defer conn.Close(context.WithoutCancel(ctx))
	if s.Settings, err = readSettings(ctx, conn); err != nil {
		s.Err = err.Error()
	}
	return s
}

// local fills the facts only the server's machine knows, when the server
// runs on this one: its postmaster.pid, read through SQL, must be the very
// file found at data_directory here.
func (d *Doctor) local(ctx context.Context, admin queryRower, f *Facts) {
	dir := f.Settings["data_directory"]
	if dir == "" {
		f.LocalWhy = "data_directory is not readable (needs superuser or pg_read_all_settings)"
		return
	}
	var remote string
	if err := admin.QueryRow(ctx, `SELECT pg_read_file('postmaster.pid')`).Scan(&remote); err != nil {
		f.LocalWhy = "postmaster.pid is not readable through SQL (needs superuser or pg_read_server_files)"
		return
	}
	here, err := os.ReadFile(filepath.Join(dir, "postmaster.pid"))
	if err != nil || string(here) != remote {
		f.LocalWhy = "the server runs on another machine (its data directory " + dir + " is not here)"
		return
	}
	f.Local, f.DataDir = true, dir
	var st syscall.Statfs_t
	if err := syscall.Statfs(dir, &st); err == nil {
		f.DiskFree, f.DiskTotal = int64(st.Bavail)*st.Bsize, int64(st.Blocks)*st.Bsize
	}
	if pid, err := strconv.Atoi(strings.SplitN(remote, "\n", 2)[0]); err == nil {
		f.OpenFilesLimit = openFilesLimit(pid)
	}
	if f.VersionNum < 150000 {
		p := f.Settings["stats_temp_directory"]
		if p != "" && !filepath.IsAbs(p) {
			p = filepath.Join(dir, p)
		}
		f.StatsTempFS = fsType(p)
	}
}

// openFilesLimit reads the soft "Max open files" of a process (-1 unknown).
func openFilesLimit(pid int) int64 {
	file, err := os.Open(fmt.Sprintf("/proc/%d/limits", pid))
	if err != nil {
		return -1
	}
	defer file.Close()
	sc := bufio.NewScanner(file)
	for sc.Scan() {
		if rest, ok := strings.CutPrefix(sc.Text(), "Max open files"); ok {
			fields := strings.Fields(rest)
			if len(fields) > 0 {
				if n, err := strconv.ParseInt(fields[0], 10, 64); err == nil {
					return n
				}
			}
		}
	}
	return -1
}

// fsType returns the file system type of the mount holding path ("" unknown).
func fsType(path string) string {
	b, err := os.ReadFile("/proc/mounts")
	if err != nil || path == "" {
		return ""
	}
	if p, err := filepath.EvalSymlinks(path); err == nil {
		path = p
	}
	best, typ := "", ""
	for _, line := range strings.Split(string(b), "\n") {
		fields := strings.Fields(line)
		if len(fields) < 3 {
			continue
		}
		mnt := fields[1]
		if (path == mnt || strings.HasPrefix(path, strings.TrimSuffix(mnt, "/")+"/")) && len(mnt) > len(best) {
			best, typ = mnt, fields[2]
		}
	}
	return typ
}
