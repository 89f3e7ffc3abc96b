package cli

import (
	"fmt"
	"io"
	"os"
	"runtime/pprof"
	"time"

	"github.com/spf13/cobra"

	"github.com/pgtenant/pgtenant/internal/bench"
)

func newBenchCmd(g *globals) *cobra.Command {
	env := &bench.Env{}
	cmd := &cobra.Command{
		Use:   "bench",
		Short: "Benchmarks and soak tests, each on a throwaway local fleet (primary + standby)",
		Long: `Each benchmark starts its own throwaway fleet (a primary and a streaming standby
made from the local PostgreSQL binaries) under --dir, runs the alternatives side by
side in one run on it, and prints a table (or JSON with -o json) with its
targets marked MET or NOT MET. Results and commands are recorded in docs/BENCHMARKS.md.`,
	}
	cmd.PersistentFlags().StringVar(&env.Dir, "dir", "", "work directory for the throwaway fleet (default: a new temp dir)")
	cmd.PersistentFlags().BoolVar(&env.Keep, "keep", false, "keep the fleet's files afterwards (for inspection)")
	var profile string
	cmd.PersistentFlags().StringVar(&profile, "cpu-profile", "", "write a CPU profile of this process (the daemon, for benches that run it in-process) to `FILE`, for go tool pprof")
	cmd.PersistentPreRunE = func(cmd *cobra.Command, args []string) error {
		if err := cmd.Root().PersistentPreRunE(cmd, args); err != nil { // cobra runs only the nearest hook
			return err
		}
		if profile == "" {
			return nil
		}
		f, err := os.Create(profile)
		if err != nil {
			return err
		}
		if err := pprof.StartCPUProfile(f); err != nil {
			f.Close()
			return err
		}
		cobra.OnFinalize(func() { // also after a bench that failed its targets
			pprof.StopCPUProfile()
			f.Close()
		})
		return nil
	}

	var crash bench.CrashOptions
	crashCmd := &cobra.Command{
		Use:   "crash",
		Short: "Soak: SIGKILL the daemon at job step boundaries while it provisions and purges, then check nothing is lost",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			env.Log = g.stderr
			if crash.Seed == 0 {
				crash.Seed = uint64(time.Now().UnixNano())
			}
			res, table, err := env.Crash(cmd.Context(), crash)
			if err != nil {
				return err
			}
			if err := g.printTable(table); err != nil {
				return err
			}
			if res.Unfinished > 0 || len(res.Findings) > 0 || res.DuplicateTenants > 0 {
				return fmt.Errorf("crash soak found problems (seed %d)", crash.Seed)
			}
			return nil
		},
	}
	crashCmd.Flags().IntVar(&crash.Iterations, "iterations", 100, "how many times to SIGKILL the daemon")
	crashCmd.Flags().Uint64Var(&crash.Seed, "seed", 0, "random seed (default: from the clock; printed on failure)")

	cmd.AddCommand(crashCmd)
	cmd.AddCommand(newBenchPrewarmCmd(g, env))
	cmd.AddCommand(newBenchProvisionCmd(g, env), newBenchDropCmd(g, env))
	cmd.AddCommand(newBenchMigrateCmd(g, env))
	cmd.AddCommand(newBenchIdleIOCmd(g, env))
	cmd.AddCommand(newBenchPoolerCmd(g, env))
	cmd.AddCommand(newBenchBurstCmd(g, env))
	cmd.AddCommand(newBenchDensityCmd(g, env))
	cmd.AddCommand(newBenchMoveCmd(g, env))
	cmd.AddCommand(newBenchAnalyticsCmd(g, env))
	cmd.AddCommand(newBenchRestoreCmd(g, env))
	cmd.AddCommand(newBenchFailoverCmd(g, env))
	return cmd
}

func newBenchMoveCmd(g *globals, env *bench.Env) *cobra.Command {
	opts := bench.MoveOptions{SizeMB: 1024, Clients: 8, Moves: 4}
	c := &cobra.Command{
		Use:   "move",
		Short: "A database tenant of --size-mb written through its pooler DSN, moved --moves times between two clusters",
		Long: `Two clusters (a primary and a streaming standby each, a PgBouncer in front of each)
and one daemon: a database tenant loaded with --size-mb of rows, --clients clients
running TPC-B-like transactions (an UPDATE and an INSERT of a numbered row) through its
pooler DSN throughout, and --moves moves back and forth (each waits for the purge of
the copy the previous one left). Per move: the copy time and throughput, the job's
total, the pause as the server recorded it (PAUSE to RESUME) and as the clients saw it
(the longest transaction started during the move); then the failed transactions, the
rows acknowledged against those found (and distinct) on the last cluster, and the
peak standby replay lag on both clusters. Exits non-zero if a target is not met.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			env.Log = g.stderr
			if err := atLeast(cmd, 1, "size-mb", "clients", "moves"); err != nil {
				return err
			}
			_, table, err := env.Move(cmd.Context(), opts)
			if err != nil {
				return err
			}
			if err := g.printTable(table); err != nil {
				return err
			}
			return unmetTargets(table)
		},
	}
	c.Flags().IntVar(&opts.SizeMB, "size-mb", 1024, "the tenant's data before the first move, in MB")
	c.Flags().IntVar(&opts.Clients, "clients", 8, "clients writing through the pooler")
	c.Flags().IntVar(&opts.Moves, "moves", 4, "moves, back and forth")
	return c
}

func newBenchAnalyticsCmd(g *globals, env *bench.Env) *cobra.Command {
	opts := bench.AnalyticsOptions{}
	c := &cobra.Command{
		Use:   "analytics",
		Short: "A 22-column table on the heap and in a tenant's DuckDB mirror: sizes, group-bys, PK lookups, upserts with the mirror off and on",
		Long: `On one primary with a streaming standby: one database tenant with the source
document's table (id int8 primary key, int1..int10 int, text1..text10 text, crt_time
timestamp) of --rows rows. Heap: size, select int1 / text1, count(*) … group by 1, a
filtered aggregate; PK lookups with pgbench -M prepared (p50); upserts (insert … on
conflict (id) do update) with pgbench at each of --clients, mirror off. Then the
mirror is enabled (initial copy timed) and the same queries run on it through the
analytics port, and the upserts again with the mirror on: tps, the slowest 1 s window,
the mirror's lag (p50, p99, max), its catch-up after the load, and the CPU per change
of the daemon (its apply, Go and DuckDB, and a checkpoint of the mirror taken once it
has caught up, so that the compression of the run's changes counts; the share its
other loops take, at their rate before the mirror is enabled, is shown) and of the
walsender; last the mirror is disabled and the upserts run once more with it off.
Then once more with decoding only: a pgoutput slot of the table streamed by
pg_recvlogical to /dev/null, no mirror, which is what logical decoding alone costs the
primary: the mirror-on tps is compared with it (no mirror's tps can be above it on the
same cores), and pg_recvlogical's CPU per change is what receiving the stream alone
costs on the machine. Exits non-zero if a target is not met.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			env.Log = g.stderr
			_, table, err := env.Analytics(cmd.Context(), opts)
			if err != nil {
				return err
			}
			if err := g.printTable(table); err != nil {
				return err
			}
			return unmetTargets(table)
		},
	}
	c.Flags().IntVar(&opts.Rows, "rows", 1_000_000, "rows of the table")
	c.Flags().IntSliceVar(&opts.Clients, "clients", []int{8, 32}, "pgbench clients of the upsert runs")
	c.Flags().DurationVar(&opts.Duration, "duration", 20*time.Second, "each pgbench run")
	c.Flags().IntVar(&opts.Repeat, "repeat", 3, "runs of each query (the fastest counts)")
	return c
}

func newBenchPoolerCmd(g *globals, env *bench.Env) *cobra.Command {
	opts := bench.PoolerOptions{Tenants: 1000, Idle: 3, Busy: 20, Duration: 15 * time.Second, Burst: 200}
	c := &cobra.Command{
		Use:   "pooler",
		Short: "pgbench through the pooler (clear text and TLS) vs direct, a burst of creates and its reloads, density (1,000 tenants × 3 idle clients + 20 busy on max_connections 100) and the leak check",
		Long: `On one primary (max_connections 100) with a streaming standby and a PgBouncer run by
pgtenant in front of it: (a) pgbench select-only and TPC-B-like on one database tenant,
--busy clients for --duration, direct, through the pooler (which reaches the server
through its Unix socket, as up makes it), through the same pooler re-pointed at the
server's TCP port, and through the pooler over TLS (sslmode=verify-full, a local CA's
certificate) (throughput, p50, p95); (b) --burst creates, 50 at a time, and the pooler RELOADs they cost; (c) density:
--tenants schema tenants, --idle idle clients each connected through the pooler and
served one query, then --busy busy clients, with the server's client backends sampled
throughout; (d) the transaction-mode leak check (SET search_path, RESET ALL, DISCARD
ALL between queries; no row of another tenant may be read). Exits non-zero if a
target is not met.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			env.Log = g.stderr
			if opts.Burst > opts.Tenants {
				opts.Burst = opts.Tenants
			}
			_, table, err := env.Pooler(cmd.Context(), opts)
			if err != nil {
				return err
			}
			if err := g.printTable(table); err != nil {
				return err
			}
			return unmetTargets(table)
		},
	}
	c.Flags().IntVar(&opts.Tenants, "tenants", 1000, "density: schema tenants")
	c.Flags().IntVar(&opts.Idle, "idle", 3, "density: idle clients per tenant")
	c.Flags().IntVar(&opts.Busy, "busy", 20, "busy clients (pgbench and density)")
	c.Flags().DurationVar(&opts.Duration, "duration", 15*time.Second, "each pgbench run and the density's busy phase")
	c.Flags().IntVar(&opts.Burst, "burst", 200, "creates in the burst whose reloads are counted")
	return c
}

func newBenchDensityCmd(g *globals, env *bench.Env) *cobra.Command {
	var opts bench.DensityOptions
	grown := bench.DensityRealOptions{}
	var steps []int
	c := &cobra.Command{
		Use:   "density",
		Short: "A cluster grown to 10,000 schema and 2,000 database tenants, measured at each step; or the control plane on a simulated catalog of a million",
		Long: `On one primary with a streaming standby, the cluster is grown through pgtenant's pools
and claims to --schema-tenants schema tenants and --database-tenants database tenants of
the shipped saas template, and measured at each of --steps (schema tenants; database
tenants grow in proportion): claim p50/p95 of each mode through the API of a daemon with
the cluster's front door (PgBouncer), as up runs it (--claims spares built for them,
claimed 300 ms apart once autovacuum is done with them, up to --settle, and the front
door has their entries) and a cold build of each (a create that finds no spare), one sync
of the front door, a drop + purge of each mode, the
metrics collector's passes (in the first round of sizes and after it) and the WAL of
that first round (its first reads of what growth and the rollout wrote set hint bits,
each page's image in the WAL once), the statement
capper's check of the primary's sessions and its pass over every tenant's role settings,
a /metrics scrape, a rollout of every tenant to a version of one statement more (and again, with
nothing to do: tenants/s both) next to the new connections a second the primary takes
(4 at a time: each tenant's migration opens a session of its own, so a machine whose
process start is slow bounds it), reconcile of the cluster, API show/list/search p95 (--requests calls),
the daemon's heap and its process's RSS, the server's relation files, disk, the shared
database's pg_class and pg_attribute, shared memory, the own memory of two server
backends (a pooled session that served one schema tenant, a superuser session that read
a table of every schema), idle WAL and writes per second with a daemon running after that round
(once autovacuum has finished what
growth left: no worker on a table for autovacuum_naptime + 5 s, up to --settle; what
wrote it by kind of record and database, from pg_waldump), a restart and a crash recovery;
with --backup, the cluster archives its WAL with pgBackRest from its creation (as up makes
it) and each step ends with two full backups from the standby, side by side: files bundled
(repo-bundle, pgtenant's default) and one repository file per file (pgBackRest's
default), each timed, with the size read, the repository's and its files. The notes say
which figures grow faster than the tenants, and what each that grows reads or holds;
exits non-zero if a target
of issue 28 is not met. A run the disk cannot hold is refused before it starts: the
default size needs about 73 GB (most of it the 2,000 databases' own catalogs, on the
primary and the standby) and takes about an hour and a half.

With --simulate-tenants N: what the control plane itself costs at internet scale,
without the PostgreSQL objects of the tenants. The catalog gets N active tenants (four
in five schema tenants, each with a name and an external id) spread over --clusters
registered clusters (all but the grown one with DSNs nothing answers) and --jobs
finished jobs of the last 30 days. At a hundredth, a tenth and all of N a daemon is
started on that catalog and measured: API list (first page, a page after a random id,
one cluster's page), search and show p50/p95 over --requests calls each, the jobs
list, the placement query and its decision on what it read, a reconcile of the grown
cluster (its share of the simulated tenants has no objects: found missing), one
cluster's tenants read and its pooler config rendered, a /metrics scrape, the Go heap,
the catalog's size (the jobs table's apart), and show through two more daemons on the
same catalog.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			env.Log = g.stderr
			if opts.SimulateTenants > 0 {
				if opts.SimulateTenants < 1000 || opts.Clusters < 1 || opts.Requests < 1 || opts.Jobs < 0 {
					return usagef("--simulate-tenants must be at least 1000, --clusters and --requests at least 1, --jobs at least 0")
				}
				_, table, err := env.Density(cmd.Context(), opts)
				if err != nil {
					return err
				}
				if err := g.printTable(table); err != nil {
					return err
				}
				return unmetTargets(table)
			}
			grown.Requests, grown.Steps = opts.Requests, steps
			if grown.SchemaTenants < 1 || grown.DatabaseTenants < 0 || grown.Claims < 1 || grown.Requests < 1 || len(steps) == 0 {
				return usagef("--schema-tenants, --claims and --requests must be at least 1, --database-tenants at least 0, --steps not empty")
			}
			for i, s := range steps {
				if s < 1 || s > grown.SchemaTenants || (i > 0 && s <= steps[i-1]) {
					return usagef("--steps must grow, each between 1 and --schema-tenants (%d)", grown.SchemaTenants)
				}
			}
			_, table, err := env.DensityReal(cmd.Context(), grown)
			if err != nil {
				return err
			}
			if err := g.printTable(table); err != nil {
				return err
			}
			return unmetTargets(table)
		},
	}
	c.Flags().IntVar(&grown.SchemaTenants, "schema-tenants", 10000, "schema tenants at the last step")
	c.Flags().IntVar(&grown.DatabaseTenants, "database-tenants", 2000, "database tenants at the last step (each step has its share)")
	c.Flags().IntSliceVar(&steps, "steps", []int{1000, 2000, 5000, 10000}, "schema tenants at which to measure")
	c.Flags().IntVar(&grown.Claims, "claims", 20, "claims, then drops and purges, per mode and step")
	c.Flags().BoolVar(&grown.Backup, "backup", false, "archive the cluster's WAL with pgBackRest from its creation (as up does) and end each step with two full backups, bundled and one file per file, timed; needs pgbackrest, and disk for the repository")
	c.Flags().DurationVar(&grown.Settle, "settle", 5*time.Minute, "wait at most this long for autovacuum's workers to finish what the bench's bursts of builds left, before a step's claims and before its idle WAL")
	c.Flags().IntVar(&opts.SimulateTenants, "simulate-tenants", 0, "simulated mode: tenants in the catalog at the last scale point (rows only), e.g. 1000000")
	c.Flags().IntVar(&opts.Clusters, "clusters", 200, "simulated mode: registered clusters the tenants are spread over")
	c.Flags().IntVar(&opts.Jobs, "jobs", 500000, "simulated mode: finished jobs in the catalog (about a month of a large fleet's history)")
	c.Flags().IntVar(&opts.Requests, "requests", 200, "API calls per measured request and scale point")
	return c
}

func newBenchBurstCmd(g *globals, env *bench.Env) *cobra.Command {
	opts := bench.BurstOptions{Sample: 250 * time.Millisecond}
	c := &cobra.Command{
		Use:   "burst",
		Short: "A burst of concurrent creates (mixed modes, with retries) against the default settings and a pool of 50",
		Long: `On one primary with a streaming standby, the same burst of --creates concurrent
tenant creates through the API (both modes, --retries of them the same create again
with an external id sent earlier in the burst) against (a) the shipped defaults and
(b) pools of --big-pool spares per mode, each with its own catalog and template. For
each: every answer checked (same tenant, password and DSN for an external id, one
tenant per external id in the catalog, a login with the DSN), wall time, creates/s,
p50/p95/p99 by path (pool, cold, retry), peak standby replay lag, and the pool's
ready spares sampled every --sample during the burst and for --observe after it.
Meanwhile --probes creates of a template with a pool of its own, one every
--probe-every, measure what a sign-up that finds a spare gets during the burst.
Exits non-zero if a target is not met.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			env.Log = g.stderr
			if opts.Seed == 0 {
				opts.Seed = uint64(time.Now().UnixNano())
			}
			_, table, err := env.Burst(cmd.Context(), opts)
			if err != nil {
				return err
			}
			if err := g.printTable(table); err != nil {
				return err
			}
			return unmetTargets(table)
		},
	}
	c.Flags().IntVar(&opts.Creates, "creates", 200, "creates in the burst, all sent at once (the retries after --retry-after)")
	c.Flags().Float64Var(&opts.RetryShare, "retries", 0.4, "share of the creates that retry an external id sent earlier in the burst")
	c.Flags().Float64Var(&opts.SchemaShare, "schema-share", 0.5, "share of the new tenants in schema mode (the others: database mode)")
	c.Flags().DurationVar(&opts.RetryAfter, "retry-after", time.Second, "the retries are sent this long after the burst starts")
	c.Flags().IntVar(&opts.BigPool, "big-pool", 50, "pool size per mode of the second variant")
	c.Flags().DurationVar(&opts.Observe, "observe", 30*time.Second, "how long the pools are watched after the burst")
	c.Flags().DurationVar(&opts.Sample, "sample", 250*time.Millisecond, "pool size sampling period")
	c.Flags().IntVar(&opts.Probes, "probes", 40, "pool creates of a template of their own sent one at a time during the burst (its pool holds as many)")
	c.Flags().DurationVar(&opts.ProbeEvery, "probe-every", 250*time.Millisecond, "interval between two probe creates")
	c.Flags().Uint64Var(&opts.Seed, "seed", 0, "random seed of the burst's order (default: from the clock)")
	return c
}

// printTable prints a benchmark table, or its JSON with -o json.
func (g *globals) printTable(t bench.Table) error {
	return g.print(t, func(w io.Writer) { t.Write(w) })
}

func newBenchProvisionCmd(g *globals, env *bench.Env) *cobra.Command {
	var opts bench.ProvisionOptions
	c := &cobra.Command{
		Use:   "provision",
		Short: "SQL-replayed schema, cold WAL_LOG and FILE_COPY, and pool claims (both modes), for saas and wide",
		Long: `For the saas template and the wide template (T copies), on one primary with a
streaming standby: (a) schema tenants built by replaying the template SQL the way
django-tenants and apartment do, (b) database tenants on pgtenant's cold path with
STRATEGY WAL_LOG, (c) the same with FILE_COPY, the pool refilling its spares, then
(d) database and (e) schema tenants claimed from the pool through the API. For each:
p50/p95 latency, tenants/s, WAL per tenant, largest WAL record (pg_waldump),
checkpoints forced and peak standby replay lag. Exits non-zero if a target is not met.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			env.Log = g.stderr
			_, table, err := env.Provision(cmd.Context(), opts)
			if err != nil {
				return err
			}
			if err := g.printTable(table); err != nil {
				return err
			}
			return unmetTargets(table)
		},
	}
	c.Flags().IntVar(&opts.Tenants, "tenants", 20, "tenants per cold method (a, b, c) and template")
	c.Flags().IntVar(&opts.Claims, "claims", 100, "saas: spares refilled per mode, then claimed through the API")
	c.Flags().IntVar(&opts.WideClaims, "wide-claims", 20, "wide: spares refilled per mode, then claimed (each spare is ~100*T relations)")
	c.Flags().IntVar(&opts.WideCopies, "wide-copies", 20, "T of the wide template: copies of its 100-column table (at least 20)")
	return c
}

func newBenchDropCmd(g *globals, env *bench.Env) *cobra.Command {
	var opts bench.DropOptions
	c := &cobra.Command{
		Use:   "drop",
		Short: "Monolithic DROP SCHEMA vs pgtenant's batched purge, DROP DATABASE, and many small drops, at max_locks_per_transaction=64",
		Long: `On one primary with a streaming standby, both at PostgreSQL's default
max_locks_per_transaction=64, for the wide template at --copies and at --big-copies
(T=200 gives about 20,400 relations per tenant): (a) one DROP SCHEMA ... CASCADE of a
schema tenant, (b) pgtenant's batched purge of a schema tenant, (c) pgtenant's purge
of a database tenant (DROP DATABASE); then (d) --small-tenants saas database tenants
purged one after another. For each: success or the error, time, WAL, largest WAL
record (pg_waldump), peak lock count, checkpoints, peak standby replay lag and the
time until the standby has replayed everything. Building the big tenants takes a
few minutes. Exits non-zero if a target is not met.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			env.Log = g.stderr
			_, table, err := env.Drop(cmd.Context(), opts)
			if err != nil {
				return err
			}
			if err := g.printTable(table); err != nil {
				return err
			}
			return unmetTargets(table)
		},
	}
	c.Flags().IntVar(&opts.Copies, "copies", 20, "T of the smaller wide template")
	c.Flags().IntVar(&opts.BigCopies, "big-copies", 200, "T of the big wide template (200 gives >= 20,000 relations per tenant)")
	c.Flags().IntVar(&opts.SmallTenants, "small-tenants", 50, "saas database tenants purged one after another")
	return c
}

// unmetTargets is an error naming the targets a benchmark table did not meet.
func unmetTargets(t bench.Table) error {
	n := 0
	for _, c := range t.Checks {
		if !c.Met {
			n++
		}
	}
	if n > 0 {
		return fmt.Errorf("%d of %d targets not met (see the table)", n, len(t.Checks))
	}
	return nil
}

func newBenchIdleIOCmd(g *globals, env *bench.Env) *cobra.Command {
	opts := bench.IdleIOOptions{Window: time.Minute, Settle: 20 * time.Second, Rounds: 2}
	c := &cobra.Command{
		Use:   "idle-io",
		Short: "Disk writes and CPU of an idle fleet with the metrics collector off and on; pass and /metrics times at 1,000 and 10,000 tenants",
		Long: `On one primary with a streaming standby holding --tenants database tenants and
--schemas schema tenants of saas (spares built by the pool, claimed through the
API), all idle: a window with the metrics collector (and statement cap checks)
off, then one with them on as shipped. For each: bytes written by the PostgreSQL
processes of both servers (/proc/<pid>/io, each window ended by a checkpoint) and
by pgtenant (in-process daemon, /proc/self/io), pgtenant's and PostgreSQL's CPU,
WAL, and history rows written. Then the time of one collector pass and of a
/metrics scrape at that size and at --simulate tenants (extra catalog rows
without databases). Exits non-zero if a target is not met.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			env.Log = g.stderr
			_, table, err := env.IdleIO(cmd.Context(), opts)
			if err != nil {
				return err
			}
			if err := g.printTable(table); err != nil {
				return err
			}
			return unmetTargets(table)
		},
	}
	c.Flags().IntVar(&opts.Tenants, "tenants", 1000, "database tenants")
	c.Flags().IntVar(&opts.Schemas, "schemas", 100, "schema tenants")
	c.Flags().DurationVar(&opts.Window, "window", time.Minute, "length of each idle window")
	c.Flags().DurationVar(&opts.Settle, "settle", 20*time.Second, "wait after the daemon starts, before measuring")
	c.Flags().IntVar(&opts.Simulate, "simulate", 10000, "tenants at the scale point (catalog rows without databases beyond the real ones)")
	c.Flags().IntVar(&opts.Rounds, "rounds", 2, "pairs of idle windows (off, on), alternating")
	return c
}
