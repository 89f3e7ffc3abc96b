package cli

import (
	"fmt"
	"io"
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
side in one run on it, and prints a table (or JSON with -o json) with the issue's
targets marked MET or NOT MET. Results and commands are recorded in docs/BENCHMARKS.md.`,
	}
	cmd.PersistentFlags().StringVar(&env.Dir, "dir", "", "work directory for the throwaway fleet (default: a new temp dir)")
	cmd.PersistentFlags().BoolVar(&env.Keep, "keep", false, "keep the fleet's files afterwards (for inspection)")

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
	return cmd
}

// printTable prints a benchmark table, or its JSON with -o json.
func (g *globals) printTable(t bench.Table) error {
	return g.print(t, func(w io.Writer) { t.Write(w) })
}
