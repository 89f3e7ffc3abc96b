package doctor_test

import (
	"strings"
	"syscall"
	"testing"
	"time"

	examples "github.com/pgtenant/pgtenant/examples/templates"
	"github.com/pgtenant/pgtenant/internal/api"
	"github.com/pgtenant/pgtenant/internal/catalog"
	"github.com/pgtenant/pgtenant/internal/cluster"
	"github.com/pgtenant/pgtenant/internal/config"
	"github.com/pgtenant/pgtenant/internal/daemon/daemontest"
	"github.com/pgtenant/pgtenant/internal/doctor"
	"github.com/pgtenant/pgtenant/internal/fleet"
	"github.com/pgtenant/pgtenant/internal/pgtest"
	"github.com/pgtenant/pgtenant/internal/provision"
	"github.com/pgtenant/pgtenant/internal/templates"
)

var pg *pgtest.Cluster

// The package's cluster is deliberately mis-set for a big template: the
// default lock budget (64 per transaction). Its superuser reserve is what
// the connections check wants.
func TestMain(m *testing.M) {
	pgtest.Main(m, pgtest.Options{Standbys: 1, Settings: map[string]string{"max_locks_per_transaction": "64",
		"superuser_reserved_connections": "5"}}, &pg)
}

func check(t *testing.T, cr doctor.ClusterReport, name string) doctor.Check {
	t.Helper()
	for _, c := range cr.Checks {
		if c.Name == name {
			return c
		}
	}
	t.Fatalf("cluster %s: no check %q in %+v", cr.Cluster, name, cr.Checks)
	return doctor.Check{}
}

// TestDoctor_FlagsLowLockLimitAndPassesAGoodCluster: with a template of
// ~4,200 relations, a cluster at max_locks_per_transaction = 64 is flagged
// with the value to set; a cluster set up for it passes.
func TestDoctor_FlagsLowLockLimitAndPassesAGoodCluster(t *testing.T) {
	ctx := pgtest.Context(t)
	cfg := daemontest.Config(t, pg)
	cfg.Provision.DefaultPoolSize = 0
	d, c := daemontest.Start(t, pg, cfg)
	daemontest.CreateTemplate(t, c, "wide", templates.Wide(40))
	b, _, err := d.Store().LargestTemplateBuild(ctx)
	if err != nil || b.Relations < 4000 {
		t.Fatalf("largest build = %+v, %v", b, err)
	}

	rep, err := c.Doctor(ctx, "local")
	if err != nil {
		t.Fatal(err)
	}
	if len(rep.Clusters) != 1 {
		t.Fatalf("clusters = %+v", rep.Clusters)
	}
	bad := rep.Clusters[0]
	locks := check(t, bad, "locks")
	t.Logf("locks: %+v", locks)
	if locks.Status != doctor.Warn && locks.Status != doctor.Fail {
		t.Errorf("locks at max_locks_per_transaction=64 with %d relations: %s, want flagged", b.Relations, locks.Status)
	}
	if !strings.Contains(locks.Fix, "max_locks_per_transaction = 128") || !strings.Contains(locks.Got, "wide") {
		t.Errorf("locks check does not say what to set or why: %+v", locks)
	}
	if s := check(t, bad, "standby1_settings"); s.Status != doctor.OK {
		t.Errorf("standby with the primary's settings: %+v", s)
	}
	if bad.Status == doctor.OK {
		t.Errorf("cluster status = ok with a flagged check")
	}

	// pgtenant's own batches beyond the lock table: a failure.
	reg := pg.Registry(t, false)
	bigBatches := cfg
	bigBatches.Provision.BatchLocks = 20000
	r2, err := (&doctor.Doctor{Store: d.Store(), Clusters: reg, Config: bigBatches}).Run(ctx, "local")
	if err != nil {
		t.Fatal(err)
	}
	if l := check(t, r2.Clusters[0], "locks"); l.Status != doctor.Fail {
		t.Errorf("batch_locks 20000 over a lock table of ~7800: %+v", l)
	}

	// A cluster set up for the fleet: lock and file budgets for the template.
	good, err := pgtest.Start(ctx, pgtest.Options{Standbys: 1, Settings: map[string]string{
		"max_locks_per_transaction": "1024", "max_files_per_process": "10000", "superuser_reserved_connections": "5"}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(good.Close)
	if _, err := c.AddCluster(ctx, api.AddClusterRequest{Name: "good", DSN: good.PrimaryDSN("postgres"),
		Standbys: []string{good.DSN(good.Standbys()[0], "postgres")}}); err != nil {
		t.Fatal(err)
	}
	rep, err = c.Doctor(ctx, "good")
	if err != nil {
		t.Fatal(err)
	}
	ok := rep.Clusters[0]
	for _, ch := range ok.Checks {
		t.Logf("%-7s %s: %s", ch.Status, ch.Name, ch.Got)
		if ch.Status != doctor.OK {
			t.Errorf("good cluster: %s is %s: %s (fix: %s)", ch.Name, ch.Status, ch.Got, ch.Fix)
		}
	}
	if ok.Status != doctor.OK {
		t.Errorf("good cluster status = %s", ok.Status)
	}
	all, err := c.Doctor(ctx, "")
	if err != nil || len(all.Clusters) != 2 || all.Status == doctor.OK {
		t.Errorf("doctor over every cluster: %+v, %v", all, err)
	}
}

// TestDoctor_ConnectionsCountsClaimedTenants: the connections check adds up
// the limits of the tenants admitted to the cluster, and flags them once
// provision.connection_overcommit is lowered below what was admitted.
// TestDoctor_TierExtensions: a tier listing a trusted extension, a typo
// and an untrusted one is warned about, naming the last two.
func TestDoctor_TierExtensions(t *testing.T) {
	ctx := pgtest.Context(t)
	cfg := daemontest.Config(t, pg)
	cfg.Provision.DefaultPoolSize = 0
	cfg.Tiers["pro"] = config.Tier{ConnectionLimit: 2, Extensions: []string{"hstore", "hstre", "postgres_fdw"}}
	_, c := daemontest.Start(t, pg, cfg)
	rep, err := c.Doctor(ctx, "local")
	if err != nil || len(rep.Clusters) != 1 {
		t.Fatalf("doctor: %+v, %v", rep, err)
	}
	if x := check(t, rep.Clusters[0], "tier_extensions"); x.Status != doctor.Warn || !strings.Contains(x.Got, "hstre, which the server has not installed") ||
		!strings.Contains(x.Got, "postgres_fdw, which is not trusted") || strings.Contains(x.Got, "lists hstore") {
		t.Errorf("tier_extensions: %+v, want warn naming hstre (missing) and postgres_fdw (untrusted), not hstore", x)
	}
}

func TestDoctor_ConnectionsCountsClaimedTenants(t *testing.T) {
	ctx := pgtest.Context(t)
	cfg := daemontest.Config(t, pg)
	cfg.Provision.DefaultPoolSize = 0
	cfg.Provision.ConnectionOvercommit = 1 // admission on: (100 − 5 − 0 − 4) × 1 = 91 connections
	cfg.Provision.ReservedConnections = 0
	cfg.Tiers["big"] = config.Tier{ConnectionLimit: 40}
	d, c := daemontest.Start(t, pg, cfg)
	daemontest.CreateTemplate(t, c, "saas", examples.Saas())
	for range 2 {
		if _, err := c.CreateTenant(ctx, provision.Request{Template: "saas", Tier: "big"}); err != nil {
			t.Fatal(err)
		}
	}
	rep, err := c.Doctor(ctx, "local")
	if err != nil {
		t.Fatal(err)
	}
	got := check(t, rep.Clusters[0], "connections")
	t.Logf("connections: %+v", got)
	if got.Status != doctor.OK || !strings.Contains(got.Got, "2 tenants whose connection limits add up to 80 of 91") {
		t.Errorf("two tenants of 40 connections of 91: %+v", got)
	}
	// density counts the same claimed tenants by mode (the pools are empty).
	if d := check(t, rep.Clusters[0], "density"); d.Status != doctor.OK ||
		!(strings.Contains(d.Got, "0 schema tenants, 2 database tenants") || strings.Contains(d.Got, "2 schema tenants, 0 database tenants")) {
		t.Errorf("density of two claimed tenants: %+v", d)
	}

	reg := pg.Registry(t, false)
	for _, tc := range []struct {
		overcommit float64
		want       string
	}{{0.9, doctor.Warn}, {0.85, doctor.Fail}} {
		lowered := cfg
		lowered.Provision.ConnectionOvercommit = tc.overcommit
		r, err := (&doctor.Doctor{Store: d.Store(), Clusters: reg, Config: lowered}).Run(ctx, "local")
		if err != nil {
			t.Fatal(err)
		}
		got := check(t, r.Clusters[0], "connections")
		t.Logf("overcommit %g: %+v", tc.overcommit, got)
		if got.Status != tc.want || got.Fix == "" {
			t.Errorf("80 connections admitted, overcommit lowered to %g: %+v, want %s with a fix", tc.overcommit, got, tc.want)
		}
	}
}

func base() doctor.Facts {
	return doctor.Facts{Cluster: "c", Version: "15.18", VersionNum: 150018, Databases: 10, Files: 3000, Streaming: 1,
		Settings: map[string]string{"max_connections": "100", "superuser_reserved_connections": "5", "max_locks_per_transaction": "64", "max_prepared_transactions": "0",
			"autovacuum_max_workers": "3", "max_worker_processes": "8", "max_wal_senders": "10", "max_files_per_process": "1000",
			"wal_level": "logical", "max_slot_wal_keep_size": "4096", "autovacuum": "on", "autovacuum_naptime": "60", "checkpoint_timeout": "300", "max_wal_size": "1024"},
		Standbys:   []doctor.StandbyFacts{{DSN: "s1", Settings: map[string]string{"max_locks_per_transaction": "64", "max_connections": "100", "max_prepared_transactions": "0", "max_worker_processes": "8", "max_wal_senders": "10"}}},
		Extensions: map[string]cluster.ExtensionState{"pg_prewarm": {Available: true}, "pg_buffercache": {Available: true}},
		BatchLocks: 1000, PurgeBatch: 200, WALLogMaxSize: 32 << 20, Local: true, DiskFree: 50 << 30, DiskTotal: 100 << 30,
		OpenFilesLimit: 1 << 20,
		// 5 tenants of 10 connections, of (100 − 5 − 4) × 1 = 91.
		TenantsByTier: map[string]int{"default": 5}, ConnectionLimits: map[string]int{"default": 10, "big": -1},
		Overcommit: 1, RolloutConnections: 4}
}

func find(cs []doctor.Check, name string) doctor.Check {
	for _, c := range cs {
		if c.Name == name {
			return c
		}
	}
	return doctor.Check{}
}

// TestChecks covers the checks the integration test cannot reach.
func TestChecks(t *testing.T) {
	for _, tc := range []struct {
		name, check, want string
		mutate            func(*doctor.Facts)
	}{
		{"baseline", "locks", doctor.OK, func(f *doctor.Facts) {}},
		{"connection limits within capacity", "connections", doctor.OK, func(f *doctor.Facts) {}},
		{"connection limits over 90%", "connections", doctor.Warn, func(f *doctor.Facts) { f.TenantsByTier["default"] = 9 }},
		{"connection limits over capacity", "connections", doctor.Fail, func(f *doctor.Facts) { f.TenantsByTier["default"] = 10 }},
		{"overcommit lowered after admission", "connections", doctor.Fail, func(f *doctor.Facts) { f.Overcommit = 0.5 }},
		{"overcommit allows it", "connections", doctor.OK, func(f *doctor.Facts) { f.TenantsByTier["default"], f.Overcommit = 20, 4 }},
		{"an unlimited tier takes every connection", "connections", doctor.Fail, func(f *doctor.Facts) { f.TenantsByTier["big"] = 1 }},
		{"admission off, limits beyond the server", "connections", doctor.Warn, func(f *doctor.Facts) {
			f.TenantsByTier["default"], f.Overcommit = 20, 0
		}},
		{"admission off, within the server", "connections", doctor.OK, func(f *doctor.Facts) { f.Overcommit = 0 }},
		{"small superuser reserve", "connections", doctor.Warn, func(f *doctor.Facts) { f.Settings["superuser_reserved_connections"] = "3" }},
		{"connection settings unreadable", "connections", doctor.Unknown, func(f *doctor.Facts) { delete(f.Settings, "max_connections") }},
		{"template beyond the lock table", "locks", doctor.Fail, func(f *doctor.Facts) {
			f.Largest = &catalog.LargestBuild{Template: "huge", Version: 1, Relations: 22000}
		}},
		{"standby below the primary", "standby1_settings", doctor.Fail, func(f *doctor.Facts) {
			f.Standbys[0].Settings["max_locks_per_transaction"] = "32"
		}},
		{"standby unreachable", "standby1_settings", doctor.Unknown, func(f *doctor.Facts) { f.Standbys[0].Err = "refused" }},
		{"wal_level minimal", "replication", doctor.Fail, func(f *doctor.Facts) { f.Settings["wal_level"] = "minimal" }},
		{"standby down", "replication", doctor.Fail, func(f *doctor.Facts) { f.Streaming = 0 }},
		{"no standby at all", "replication", doctor.Warn, func(f *doctor.Facts) { f.Streaming, f.Standbys = 0, nil }},
		{"analytics: wal_level replica", "analytics_slots", doctor.Warn, func(f *doctor.Facts) { f.Settings["wal_level"] = "replica" }},
		{"analytics: slots keep WAL without bound", "analytics_slots", doctor.Warn, func(f *doctor.Facts) { f.Settings["max_slot_wal_keep_size"] = "-1" }},
		{"analytics: slots bounded", "analytics_slots", doctor.OK, func(f *doctor.Facts) {}},
		{"autovacuum off", "autovacuum", doctor.Fail, func(f *doctor.Facts) { f.Settings["autovacuum"] = "off" }},
		{"thousands of databases", "autovacuum", doctor.Warn, func(f *doctor.Facts) { f.Databases = 3000 }},
		{"missing contrib", "prewarm_extensions", doctor.Warn, func(f *doctor.Facts) {
			f.Extensions["pg_buffercache"] = cluster.ExtensionState{}
		}},
		{"open-file limit below max_files_per_process", "files", doctor.Warn, func(f *doctor.Facts) { f.OpenFilesLimit = 512 }},
		{"files of 10,000 schema tenants, as measured", "files", doctor.OK, func(f *doctor.Facts) { f.Files = 1_900_000 }},
		{"files beyond what was measured", "files", doctor.Warn, func(f *doctor.Facts) { f.Files = 3_000_000 }},
		{"10,000 schema + 1,000 database tenants, as measured", "density", doctor.OK, func(f *doctor.Facts) {
			f.Tenants = map[string]int{"schema": 10_000, "database": 1_000}
		}},
		{"schema tenants beyond what was measured", "density", doctor.Warn, func(f *doctor.Facts) { f.Tenants = map[string]int{"schema": 12_000} }},
		{"database tenants beyond what was measured", "density", doctor.Warn, func(f *doctor.Facts) { f.Tenants = map[string]int{"database": 1_500} }},
		{"FILE_COPY creates force checkpoints", "checkpoints", doctor.Warn, func(f *doctor.Facts) {
			f.LargestSize, f.BuildsDay = 1<<30, 600
		}},
		{"disk almost full", "disk", doctor.Fail, func(f *doctor.Facts) { f.DiskFree = 2 << 30 }},
		{"disk full in days", "disk", doctor.Fail, func(f *doctor.Facts) {
			f.GrowthTenants, f.TenantBytesDay, f.TenantBytesNow = 100, 10<<30, 20<<30
		}},
		{"remote disk", "disk", doctor.Unknown, func(f *doctor.Facts) { f.Local, f.LocalWhy = false, "remote" }},
		{"9.6 stats on disk, many databases", "stats_temp_directory", doctor.Fail, func(f *doctor.Facts) {
			f.VersionNum, f.Databases, f.StatsTempFS = 90624, 500, "ext4"
			f.Settings["stats_temp_directory"] = "pg_stat_tmp"
		}},
		{"9.6 stats on tmpfs", "stats_temp_directory", doctor.OK, func(f *doctor.Facts) {
			f.VersionNum, f.Databases, f.StatsTempFS = 90624, 500, "tmpfs"
		}},
		{"tier extensions installed and trusted", "tier_extensions", doctor.OK, func(f *doctor.Facts) {
			f.TierExtensions = []doctor.TierExtension{{Tier: "pro", Name: "hstore", Available: true, Trusted: true}}
		}},
		{"a tier lists an extension the server lacks", "tier_extensions", doctor.Warn, func(f *doctor.Facts) {
			f.TierExtensions = []doctor.TierExtension{{Tier: "pro", Name: "hstre"}}
		}},
		{"a tier lists an untrusted extension", "tier_extensions", doctor.Warn, func(f *doctor.Facts) {
			f.TierExtensions = []doctor.TierExtension{{Tier: "pro", Name: "postgres_fdw", Available: true}}
		}},
		{"certificates valid for months", "certificates", doctor.OK, func(f *doctor.Facts) {
			f.Now, f.Certs = time.Now(), []doctor.CertFacts{{What: "front door", Path: "/x.crt", NotAfter: time.Now().Add(200 * 24 * time.Hour)}}
		}},
		{"a certificate expiring in 10 days", "certificates", doctor.Warn, func(f *doctor.Facts) {
			f.Now, f.Certs = time.Now(), []doctor.CertFacts{{What: "analytics port", Path: "/x.crt", NotAfter: time.Now().Add(10 * 24 * time.Hour)}}
		}},
		{"a certificate expired", "certificates", doctor.Fail, func(f *doctor.Facts) {
			f.Now, f.Certs = time.Now(), []doctor.CertFacts{{What: "front door", Path: "/x.crt", NotAfter: time.Now().Add(-time.Hour)}}
		}},
		{"a certificate unreadable", "certificates", doctor.Fail, func(f *doctor.Facts) {
			f.Now, f.Certs = time.Now(), []doctor.CertFacts{{What: "front door", Path: "/x.crt", Err: "permission denied"}}
		}},
		{"pooler running and in sync", "pooler", doctor.OK, func(f *doctor.Facts) { f.Pooler = goodPooler() }},
		{"pooler down", "pooler", doctor.Fail, func(f *doctor.Facts) {
			f.Pooler = goodPooler()
			f.Pooler.Running, f.Pooler.Up = false, false
		}},
		{"pooler out of sync", "pooler", doctor.Warn, func(f *doctor.Facts) {
			f.Pooler = goodPooler()
			f.Pooler.Drift = []string{"t_x: missing from the pooler"}
		}},
		{"pooler's open-file limit below its clients", "pooler", doctor.Fail, func(f *doctor.Facts) {
			f.Pooler = goodPooler()
			f.Pooler.OpenFilesLimit = 1024
		}},
		{"pooler's max_client_conn below the tenants' pools", "pooler", doctor.Warn, func(f *doctor.Facts) {
			f.Pooler = goodPooler()
			f.Pooler.ServerConnections = 8000
			f.Pooler.OpenFilesLimit = 1 << 20
		}},
		{"9.6 with many databases and stats on disk: autovacuum storm", "autovacuum", doctor.Fail, func(f *doctor.Facts) {
			f.VersionNum, f.Databases, f.StatsTempFS = 90624, 500, "ext4"
		}},
		{"a fleet 20 minutes old: its setup's checkpoints are not judged", "checkpoints", doctor.OK, func(f *doctor.Facts) {
			f.StatsReset, f.CheckpointsRequested, f.CheckpointsTimed = time.Now().Add(-20*time.Minute), 30, 4
		}},
		{"a day of requested checkpoints outnumbering timed ones", "checkpoints", doctor.Warn, func(f *doctor.Facts) {
			f.StatsReset, f.CheckpointsRequested, f.CheckpointsTimed = time.Now().Add(-24*time.Hour), 600, 288
		}},
		{"Patroni: a leader and a synchronous standby", "failover", doctor.OK, func(f *doctor.Facts) { f.Patroni = goodPatroni() }},
		{"Patroni: asynchronous with a replica", "failover", doctor.OK, func(f *doctor.Facts) {
			f.Patroni = goodPatroni()
			f.Patroni.SynchronousMode, f.Patroni.SyncStandbys = false, 0
		}},
		{"Patroni: synchronous mode without a synchronous standby", "failover", doctor.Warn, func(f *doctor.Facts) {
			f.Patroni = goodPatroni()
			f.Patroni.SyncStandbys = 0
		}},
		{"Patroni: no replica to promote", "failover", doctor.Warn, func(f *doctor.Facts) {
			f.Patroni = goodPatroni()
			f.Patroni.Replicas, f.Patroni.SyncStandbys = 0, 0
		}},
		{"Patroni: no leader", "failover", doctor.Fail, func(f *doctor.Facts) {
			f.Patroni = goodPatroni()
			f.Patroni.Leader = ""
		}},
		{"Patroni does not answer", "failover", doctor.Unknown, func(f *doctor.Facts) { f.Patroni = &doctor.PatroniFacts{Err: "refused"} }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := base()
			tc.mutate(&f)
			got := find(doctor.Checks(f), tc.check)
			if got.Status != tc.want {
				t.Errorf("%s = %s (%s; fix: %s), want %s", tc.check, got.Status, got.Got, got.Fix, tc.want)
			}
			if got.Status != doctor.OK && got.Status != doctor.Unknown && got.Fix == "" {
				t.Errorf("%s flagged without a fix: %+v", tc.check, got)
			}
		})
	}
}

// goodPatroni is a cluster under Patroni as it should be.
func goodPatroni() *doctor.PatroniFacts {
	return &doctor.PatroniFacts{Leader: "n1", Members: 2, Replicas: 1, SyncStandbys: 1, SynchronousMode: true}
}

// TestChecks_UpsSettingsPass: the files and locks checks pass a cluster
// with the settings `up` writes (fleet.DefaultSettings), serving tenants
// of the shipped wide template, with the open-file limit its servers get:
// doctor asks nothing of a fleet that up configured.
func TestChecks_UpsSettingsPass(t *testing.T) {
	f := base()
	for k, v := range fleet.DefaultSettings() {
		f.Settings[k] = strings.Trim(v, "'")
	}
	f.Largest = &catalog.LargestBuild{Template: "wide", Version: 1, Relations: 2221}
	var l syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &l); err != nil {
		t.Fatal(err)
	}
	f.OpenFilesLimit = int64(l.Max)
	if l.Max < 5100 {
		t.Skipf("hard open-file limit %d: too low for the wide template's files, whatever up writes", l.Max)
	}
	for _, name := range []string{"files", "locks"} {
		if got := find(doctor.Checks(f), name); got.Status != doctor.OK {
			t.Errorf("%s on up's settings = %s (%s; fix: %s), want ok", name, got.Status, got.Got, got.Fix)
		}
	}
}

func goodPooler() *doctor.PoolerFacts {
	return &doctor.PoolerFacts{Addr: "127.0.0.1:6432", Running: true, Up: true, Entries: 10, MaxClientConn: 5000,
		ServerConnections: 100, OpenFilesLimit: 20000}
}

// TestChecks_SayWhatTheySaw: sizes carry units, states are words (not
// "running true"), and a young server's checkpoint counts are shown with
// the window they cover and why they are not judged yet.
func TestChecks_SayWhatTheySaw(t *testing.T) {
	f := base()
	f.Pooler = goodPooler()
	f.StatsReset, f.CheckpointsRequested, f.CheckpointsTimed = time.Now().Add(-20*time.Minute), 30, 4
	for _, tc := range []struct {
		check string
		want  []string
	}{
		{"analytics_slots", []string{"max_slot_wal_keep_size=4.0 GiB"}},
		{"checkpoints", []string{"max_wal_size=1.0 GiB", "observed 30 requested vs 4 timed in the 20m since statistics reset",
			"not judged before 6h"}},
		{"pooler", []string{"127.0.0.1:6432: running, last sync ok,", "open-file limit 20000"}},
	} {
		got := find(doctor.Checks(f), tc.check)
		for _, w := range tc.want {
			if !strings.Contains(got.Got, w) {
				t.Errorf("%s: %q, want it to contain %q", tc.check, got.Got, w)
			}
		}
	}
	f.Pooler.Running, f.Pooler.Up, f.Pooler.OpenFilesLimit = false, false, -1
	f.Settings["max_slot_wal_keep_size"] = "-1"
	if got := find(doctor.Checks(f), "pooler").Got; !strings.Contains(got, "not running, last sync failed") || !strings.Contains(got, "open-file limit unknown") {
		t.Errorf("pooler down: %q, want not running, last sync failed, open-file limit unknown", got)
	}
	if got := find(doctor.Checks(f), "analytics_slots").Got; !strings.Contains(got, "max_slot_wal_keep_size=-1 (no limit)") {
		t.Errorf("analytics_slots without a limit: %q", got)
	}
	for _, c := range doctor.Checks(f) {
		for _, word := range strings.FieldsFunc(c.Got, func(r rune) bool { return r == ' ' || r == ',' || r == ';' || r == ':' }) {
			if word == "true" || word == "false" {
				t.Errorf("%s says %q: %s", c.Name, word, c.Got)
			}
		}
	}
}
