package config_test

import (
	"fmt"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/pgtenant/pgtenant/internal/config"
)

func TestParse_Defaults(t *testing.T) {
	cfg, err := config.Parse(nil)
	if err != nil {
		t.Fatal(err)
	}
	if got, want := cfg.Pacer.MaxReplayLag, config.ByteSize(64<<20); got != want {
		t.Errorf("pacer.max_replay_lag = %v, want %v", got, want)
	}
	if got, want := cfg.Drop.Retention.D(), 7*24*time.Hour; got != want {
		t.Errorf("drop.retention = %v, want %v", got, want)
	}
	if got, want := cfg.Drop.PurgedRetention.D(), 30*24*time.Hour; got != want {
		t.Errorf("drop.purged_retention = %v, want %v", got, want)
	}
	if got, want := cfg.ConsoleSessionTTL.D(), 12*time.Hour; got != want {
		t.Errorf("console_session_ttl = %v, want %v", got, want)
	}
	if got, want := cfg.Credentials.RetryWindow.D(), 24*time.Hour; got != want || cfg.Credentials.KeyFile != "" {
		t.Errorf("credentials = %v, %q; want retry_window %v and key_file next to the token file", got, cfg.Credentials.KeyFile, want)
	}
	if p := cfg.Pacer; p.HeavyDDLSlots != 1 || p.WALLogSlots != 4 {
		t.Errorf("pacer slots = heavy %d, wal_log %d; want 1 and 4", p.HeavyDDLSlots, p.WALLogSlots)
	}
	if p := cfg.Provision; p.MaxPoolSize != 50 || p.PoolDemandWindow.D() != time.Minute || p.PoolDemandFactor != 1 ||
		p.PoolIdleAfter.D() != 10*time.Minute || p.RefillParallel != 4 || p.DefaultPoolSize != 5 {
		t.Errorf("provision pools = %+v, want size 5 growing to 50 with a minute's creates, idle after 10m, 4 builds in flight", p)
	}
	if cfg.TLSCertFile != "" || cfg.MetricsListen != "" || cfg.MetricsAuth {
		t.Errorf("defaults: tls_cert_file %q, metrics_listen %q, metrics_auth %v; want plain HTTP with open /metrics on listen",
			cfg.TLSCertFile, cfg.MetricsListen, cfg.MetricsAuth)
	}
}

func TestParse_EnvAndUnits(t *testing.T) {
	t.Setenv("C1_DSN", "postgres://admin:secret@db1:5432/postgres")
	cfg, err := config.Parse([]byte(`
listen: 0.0.0.0:9000
catalog:
  dsn: ${C1_DSN}
clusters:
  - name: c1
    dsn: ${C1_DSN}
    pacer:
      max_replay_lag: 16MB
      heavy_ddl_slots: 2
      standby_down: wait
      poll_interval: 1s
drop:
  retention: 3d
`))
	if err != nil {
		t.Fatal(err)
	}
	if got, want := cfg.Clusters[0].DSN, "postgres://admin:secret@db1:5432/postgres"; got != want {
		t.Errorf("clusters[0].dsn = %q, want %q", got, want)
	}
	if got, want := cfg.PacerFor("c1").MaxReplayLag, config.ByteSize(16<<20); got != want {
		t.Errorf("pacer for c1 = %v, want %v", got, want)
	}
	if got, want := cfg.Drop.Retention.D(), 72*time.Hour; got != want {
		t.Errorf("drop.retention = %v, want %v", got, want)
	}
}

// TestParse_Errors: every bad input names the field (or variable) at fault.
func TestParse_Errors(t *testing.T) {
	for _, tc := range []struct {
		name, yaml, want string
	}{
		{"unknown field", "listen: x\nlisen: y\n", "field lisen not found"},
		{"unset env", "catalog:\n  dsn: ${PGTENANT_TEST_UNSET_VAR}\n", "PGTENANT_TEST_UNSET_VAR"},
		{"cluster without dsn", "clusters:\n  - name: c1\n", "clusters[0].dsn: required"},
		{"bad cluster name", "clusters:\n  - name: 'C1; DROP'\n    dsn: x\n", "clusters[0].name"},
		{"duplicate cluster", "clusters:\n  - {name: a, dsn: x}\n  - {name: a, dsn: y}\n", "clusters[1].name"},
		{"bad size", "pacer:\n  max_replay_lag: lots\n", "bad size"},
		{"bad duration", "drop:\n  retention: soon\n", "bad duration"},
		{"negative purged_retention", "drop:\n  purged_retention: -1h\n", "drop.purged_retention"},
		{"bad standby_down", "pacer:\n  standby_down: maybe\n", "pacer.standby_down"},
		{"bad pool mode", "pools:\n  - {template: saas, mode: table, size: 1}\n", "pools[0].mode"},
		{"unquoted DSN in a flow map", "clusters:\n  - {name: c1, dsn: postgres://a@h:5432/p?sslmode=require}\n", "quote values such as DSNs"},
		{"zero workers", "jobs:\n  workers: 0\n", "jobs.workers"},
		{"zero wal_log_slots", "pacer:\n  wal_log_slots: 0\n", "pacer.wal_log_slots"},
		{"too many wal_log_slots", "clusters:\n  - name: c1\n    dsn: x\n    pacer: {wal_log_slots: 17}\n", "clusters[0].pacer.wal_log_slots"},
		{"too many heavy_ddl_slots", "pacer:\n  heavy_ddl_slots: 17\n", "pacer.heavy_ddl_slots"},
		{"negative max_pool_size", "provision:\n  max_pool_size: -1\n", "provision.max_pool_size"},
		{"zero demand factor", "provision:\n  pool_demand_factor: 0\n", "provision.pool_demand_factor"},
		{"tiny demand window", "provision:\n  pool_demand_window: 10ms\n", "provision.pool_demand_window"},
		{"idle before the window ends", "provision:\n  pool_demand_window: 5m\n  pool_idle_after: 1m\n", "provision.pool_idle_after"},
		{"zero refill_parallel", "provision:\n  refill_parallel: 0\n", "provision.refill_parallel"},
		{"cert without key", "tls_cert_file: /etc/pgtenant/cert.pem\n", "tls_key_file: required with tls_cert_file"},
		{"key without cert", "tls_key_file: /etc/pgtenant/key.pem\n", "tls_cert_file: required with tls_key_file"},
		{"metrics_listen not host:port", "metrics_listen: 9187\n", "metrics_listen"},
		{"metrics_listen is listen", "listen: 127.0.0.1:8080\nmetrics_listen: 127.0.0.1:8080\n", "metrics_listen: must differ from listen"},
		{"short session", "console_session_ttl: 10s\n", "console_session_ttl"},
		{"analytics advertise without a port", "analytics:\n  advertise: analytics1.internal\n", "analytics.advertise"},
		{"negative retry window", "credentials:\n  retry_window: -1h\n", "credentials.retry_window"},
		{"tiny retry window", "credentials:\n  retry_window: 10ms\n", "credentials.retry_window"},
		{"unknown credentials field", "credentials:\n  key: abc\n", "field key not found"},
		{"pooler without listen", "clusters:\n  - name: c1\n    dsn: x\n    pooler: {dir: /var/lib/p}\n", "clusters[0].pooler.listen"},
		{"pooler with a relative dir", "clusters:\n  - name: c1\n    dsn: x\n    pooler: {listen: '127.0.0.1:6432', dir: p}\n", "clusters[0].pooler.dir"},
		{"pooler without clients", "clusters:\n  - name: c1\n    dsn: x\n    pooler: {listen: '127.0.0.1:6432', dir: /p, max_client_conn: 0}\n", "clusters[0].pooler.max_client_conn"},
		{"pooler with a server and a socket dir", "clusters:\n  - name: c1\n    dsn: x\n    pooler: {listen: '127.0.0.1:6432', dir: /p, server: 'db:5432', server_socket_dir: /s}\n", "clusters[0].pooler.server_socket_dir"},
		{"pooler socket dir too long", "clusters:\n  - name: c1\n    dsn: x\n    pooler: {listen: '127.0.0.1:6432', dir: /p, server_socket_dir: /" + strings.Repeat("s", 92) + "}\n", "at most 92"},
		{"pooler socket dir relative", "clusters:\n  - name: c1\n    dsn: x\n    pooler: {listen: '127.0.0.1:6432', dir: /p, server_socket_dir: sock}\n", "clusters[0].pooler.server_socket_dir"},
		{"pooler socket dir with server TLS", "clusters:\n  - name: c1\n    dsn: x\n    pooler: {listen: '127.0.0.1:6432', dir: /p, server_socket_dir: /s, server_tls_sslmode: require}\n", "a Unix socket carries no TLS"},
		{"unknown pooler field", "clusters:\n  - name: c1\n    dsn: x\n    pooler: {listen: '127.0.0.1:6432', dir: /p, admin: x}\n", "field admin not found"},
		{"bad pool mode of a tier", "tiers:\n  t:\n    connection_limit: 5\n    pool_mode: statement\n", "tiers.t.pool_mode"},
		{"pool above the role's limit", "tiers:\n  t:\n    connection_limit: 5\n    max_db_connections: 6\n", "tiers.t.max_db_connections"},
		{"pool above its cap", "tiers:\n  t:\n    connection_limit: 5\n    pool_size: 4\n    max_db_connections: 2\n", "tiers.t.max_db_connections"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := config.Parse([]byte(tc.yaml))
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("Parse = %v, want an error containing %q", err, tc.want)
			}
		})
	}
}

// configDoc is the configuration reference: every key, its default and why.
const configDoc = "../../docs/configuration.md"

// yamlBlocks returns the ```yaml blocks of the markdown file at path.
func yamlBlocks(t *testing.T, path string) []string {
	t.Helper()
	raw, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var blocks []string
	for rest := string(raw); ; {
		var block string
		var ok bool
		if _, rest, ok = strings.Cut(rest, "```yaml\n"); !ok {
			break
		}
		if block, rest, ok = strings.Cut(rest, "```"); !ok {
			t.Fatalf("%s has an unterminated ```yaml block", path)
		}
		blocks = append(blocks, block)
	}
	if len(blocks) == 0 {
		t.Fatalf("%s has no ```yaml block", path)
	}
	return blocks
}

// TestParse_ConfigurationDocExample keeps docs/configuration.md true: every
// ```yaml block parses, and the first, the reference, sets what it says it
// sets.
func TestParse_ConfigurationDocExample(t *testing.T) {
	t.Setenv("CATALOG_PASSWORD", "x")
	t.Setenv("C1_PASSWORD", "y")
	blocks := yamlBlocks(t, configDoc)
	for i, b := range blocks {
		if _, err := config.Parse([]byte(b)); err != nil {
			t.Errorf("docs/configuration.md yaml block %d: %v", i+1, err)
		}
	}
	cfg, err := config.Parse([]byte(blocks[0]))
	if err != nil {
		t.Fatalf("docs/configuration.md example: %v", err)
	}
	if len(cfg.Clusters) != 1 || len(cfg.Clusters[0].Standbys) != 1 || !strings.HasSuffix(cfg.Clusters[0].Standbys[0], "?sslmode=require") {
		t.Errorf("the example's cluster = %+v, want one standby DSN with ?sslmode=require", cfg.Clusters)
	}
	if p := cfg.PacerFor("c1"); p.MaxReplayLag != 32<<20 || p.HeavyDDLSlots != 1 || p.WALLogSlots != 4 || !p.WaitForCheckpoint {
		t.Errorf("c1's pacer = %+v, want the global pacer with max_replay_lag 32MB", p)
	}
	if cfg.TLSCertFile == "" || cfg.TLSKeyFile == "" || cfg.MetricsListen != "127.0.0.1:9187" || cfg.ConsoleSessionTTL.D() != 12*time.Hour {
		t.Errorf("the example: tls %q %q, metrics_listen %q, console_session_ttl %v", cfg.TLSCertFile, cfg.TLSKeyFile, cfg.MetricsListen, cfg.ConsoleSessionTTL)
	}
	if cfg.Credentials.RetryWindow.D() != 24*time.Hour || cfg.Credentials.KeyFile == "" {
		t.Errorf("the example: credentials %+v, want retry_window 24h and a key_file", cfg.Credentials)
	}
	if p := cfg.Provision; p.MaxPoolSize != 50 || p.PoolDemandWindow.D() != time.Minute || p.PoolDemandFactor != 1 ||
		p.PoolIdleAfter.D() != 10*time.Minute || p.RefillParallel != 4 {
		t.Errorf("the example's provision = %+v, want the demand-following defaults", p)
	}
	if len(cfg.Pools) != 2 || cfg.Tiers["small"].StorageQuota != 1<<30 || cfg.Prewarm.Beyond != "prefetch" {
		t.Errorf("the example parsed to pools %+v, small tier %+v, prewarm %+v", cfg.Pools, cfg.Tiers["small"], cfg.Prewarm)
	}
}

func TestParse_PoolerBlockAndTierPooling(t *testing.T) {
	cfg, err := config.Parse([]byte(`
clusters:
  - name: c1
    dsn: postgres://a@db1/postgres
    pooler: {listen: "0.0.0.0:6432", host: pool.example.com, dir: /var/lib/pgtenant/pooler-c1, max_client_conn: 8000}
tiers:
  busy: {connection_limit: 20, pool_mode: transaction, pool_size: 3, max_db_connections: 5}
  plain: {connection_limit: 4}
  unlimited: {connection_limit: -1}
`))
	if err != nil {
		t.Fatal(err)
	}
	p := cfg.Clusters[0].Pooler
	if p == nil || p.MaxClientConn != 8000 || p.ServerIdleTimeout.D() != 10*time.Second || p.Coalesce.D() != 100*time.Millisecond || p.Host != "pool.example.com" {
		t.Errorf("pooler block = %+v, want max_client_conn 8000 over the defaults", p)
	}
	for name, want := range map[string]string{"busy": "transaction 3 5", "plain": "session 4 4", "unlimited": "session 10 10", "default": "session 10 10"} {
		mode, size, maxDB := cfg.Tiers[name].Pooling()
		if got := fmt.Sprintf("%s %d %d", mode, size, maxDB); got != want {
			t.Errorf("tier %s pooling = %s, want %s", name, got, want)
		}
	}
}

func TestByteSize_Human(t *testing.T) {
	for n, want := range map[int64]string{0: "0 B", 1023: "1023 B", 1536: "1.5 KiB", 64 << 20: "64.0 MiB", -2048: "-2.0 KiB"} {
		if got := config.ByteSize(n).Human(); got != want {
			t.Errorf("ByteSize(%d).Human() = %q, want %q", n, got, want)
		}
	}
}
