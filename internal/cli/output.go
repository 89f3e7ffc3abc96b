package cli

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"slices"
	"strings"
	"text/tabwriter"

	"github.com/spf13/cobra"

	"github.com/pgtenant/pgtenant/internal/api"
	"github.com/pgtenant/pgtenant/internal/config"
)

// print writes v as indented JSON with -o json, or calls table otherwise.
func (g *globals) print(v any, table func(w io.Writer)) error {
	if g.output == "json" {
		enc := json.NewEncoder(g.stdout)
		enc.SetIndent("", "  ")
		return enc.Encode(v)
	}
	tw := tabwriter.NewWriter(g.stdout, 0, 4, 2, ' ', 0)
	table(tw)
	return tw.Flush()
}

// row writes tab-separated cells.
func row(w io.Writer, cells ...any) {
	s := make([]string, len(cells))
	for i, c := range cells {
		s[i] = fmt.Sprint(c)
	}
	fmt.Fprintln(w, strings.Join(s, "\t"))
}

// humanBytes formats a byte count with 1024-based units.
func humanBytes(n int64) string { return config.ByteSize(n).Human() }

// oneOf checks a filter flag: empty, or one of valid. The error names the
// valid values (the daemon checks too; this answers without it).
func oneOf[S ~string](flag string, v S, valid ...S) error {
	if v == "" || slices.Contains(valid, v) {
		return nil
	}
	return usagef("%s %q: one of %s", flag, v, join(valid))
}

// atLeast checks cmd's int flags that must be at least lo (counts,
// rates): the usage error names the first that is not, with its value.
func atLeast(cmd *cobra.Command, lo int, flags ...string) error {
	for _, name := range flags {
		n, err := cmd.Flags().GetInt(name)
		if err != nil {
			return err // not an int flag of cmd: a bug, caught by the tests
		}
		if n < lo {
			return usagef("--%s %d: must be at least %d", name, n, lo)
		}
	}
	return nil
}

// The exit statuses of a failed command, for scripts to branch on. They
// are the API's status classes where the error is the daemon's answer.
const (
	ExitError       = 1 // any other error
	ExitUsage       = 2 // the command line or the request is wrong (400)
	ExitNotFound    = 3 // 404
	ExitConflict    = 4 // 409
	ExitUnavailable = 5 // no answer from the daemon, 502, 503, 504
)

// exitStatuses documents the statuses: the root's help (short) and
// docs/cli.md's table (when, codes: the JSON error codes it comes with)
// are written from it.
var exitStatuses = []struct {
	status             int
	short, when, codes string
}{
	{0, "success", "success", ""},
	{ExitError, "any other error",
		"any other error: the daemon's own error (500), a refused token (401, 403), a job that failed under `--wait`, a confirmation not given on the terminal",
		"`internal`, `unauthorized`, `forbidden`, `not_confirmed`"},
	{ExitUsage, "usage: a wrong command line, or a request the API refused as invalid (400)",
		"usage: an unknown command or flag, a wrong number of arguments, a flag value that cannot be right, a destructive command without `--yes` off a terminal; or a request the API refused as invalid (400)",
		"`invalid`"},
	{ExitNotFound, "not found (404)", "not found (404): no such tenant, template, cluster or job", "`not_found`"},
	{ExitConflict, "conflict (409)",
		"conflict (409): the object is in another state (a dropped tenant resumed, a second rollout), or a create's external id names a tenant with other parameters",
		"`conflict`"},
	{ExitUnavailable, "unavailable: no answer from the daemon, or 502, 503, 504; retry later",
		"unavailable: the daemon does not answer (not running, wrong `--server`), a cluster or its front door is down or there is no capacity (503; 502 from a proxy), or the daemon timed out (504); worth retrying later",
		"`unavailable`, `no_capacity`, `timeout`"},
}

// exitStatusHelp lists the exit statuses for the root's help (indented:
// a code block in docs/cli.md).
func exitStatusHelp() string {
	var b strings.Builder
	for _, e := range exitStatuses {
		fmt.Fprintf(&b, "    %d  %s\n", e.status, e.short)
	}
	return b.String()
}

// exitStatusTable is the exit statuses as a markdown table, for docs/cli.md.
func exitStatusTable(w io.Writer) {
	fmt.Fprintln(w, "| exit status | meaning | `error.code` under `-o json` |")
	fmt.Fprintln(w, "|---|---|---|")
	for _, e := range exitStatuses {
		fmt.Fprintf(w, "| %d | %s | %s |\n", e.status, e.when, e.codes)
	}
}

// failure classifies a failed command's error: its exit status and its
// JSON error code (the API's, when the daemon answered). It is the one
// place that does.
func failure(err error) (status int, code string) {
	var apiErr *api.Error
	var usage usageError
	switch {
	case errors.As(err, &usage):
		return ExitUsage, "invalid"
	case errors.Is(err, errNotConfirmed):
		return ExitError, "not_confirmed"
	case errors.Is(err, api.ErrServerUnreachable):
		return ExitUnavailable, "unavailable"
	case errors.As(err, &apiErr):
		switch apiErr.Status {
		case http.StatusBadRequest:
			return ExitUsage, apiErr.Code
		case http.StatusNotFound:
			return ExitNotFound, apiErr.Code
		case http.StatusConflict:
			return ExitConflict, apiErr.Code
		case http.StatusBadGateway, http.StatusServiceUnavailable, http.StatusGatewayTimeout:
			return ExitUnavailable, apiErr.Code
		}
		return ExitError, apiErr.Code
	}
	return ExitError, "internal"
}

// ExitCode is the exit status of Run's error: 0 for none, else one of
// the Exit constants.
func ExitCode(err error) int {
	if err == nil {
		return 0
	}
	status, _ := failure(err)
	return status
}

// usageError is a command line that cannot work as given: ExitUsage.
type usageError struct{ err error }

func (e usageError) Error() string { return e.err.Error() }
func (e usageError) Unwrap() error { return e.err }

// usagef returns a usage error: a command line that cannot work as given.
func usagef(format string, args ...any) error {
	return usageError{fmt.Errorf(format, args...)}
}

// printedError is an error printed on stdout already (-o json).
type printedError struct{ err error }

func (e printedError) Error() string { return e.err.Error() }
func (e printedError) Unwrap() error { return e.err }

// Printed reports whether Run printed err on stdout already (as JSON,
// under -o json): the caller prints it no more.
func Printed(err error) bool {
	var p printedError
	return errors.As(err, &p)
}

// printError writes err as the API's error body, the shape scripts already
// parse: {"error": {"code": "...", "message": "..."}}.
func printError(w io.Writer, err error) error {
	_, code := failure(err)
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	if werr := enc.Encode(api.ErrorBody{Error: api.ErrorDetail{Code: code, Message: err.Error()}}); werr != nil {
		return err // stdout is gone: the caller prints err on stderr
	}
	return printedError{err}
}

// asksJSON reports whether args ask for -o json, read without the flag
// parser (for an error that stopped it before it read -o).
func asksJSON(args []string) bool {
	for i, a := range args {
		switch a {
		case "--":
			return false
		case "-o", "--output":
			if i+1 < len(args) && args[i+1] == "json" {
				return true
			}
		case "-ojson", "-o=json", "--output=json":
			return true
		}
	}
	return false
}

// join lists values for a help text or an error: "a, b, c".
func join[S ~string](values []S) string {
	names := make([]string, len(values))
	for i, s := range values {
		names[i] = string(s)
	}
	return strings.Join(names, ", ")
}
