// Command pgtenant is the multi-tenant PostgreSQL daemon and its CLI.
package main

import (
	"context"
	"fmt"
	"io"
	"os"
	"os/signal"
	"syscall"

	"github.com/pgtenant/pgtenant/internal/cli"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	err := run(ctx, os.Args[1:], os.Stdout, os.Stderr)
	stop()
	if err != nil {
		if !cli.Printed(err) {
			fmt.Fprintln(os.Stderr, "pgtenant:", err)
		}
		os.Exit(cli.ExitCode(err))
	}
}

func run(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	return cli.Run(ctx, args, stdout, stderr)
}
