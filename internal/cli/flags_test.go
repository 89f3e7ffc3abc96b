package cli

import (
	"bytes"
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/pgtenant/pgtenant/internal/api"
)

// TestCLI_BadFlagValuesAreUsageErrors: a flag value that cannot be right
// exits 2 (ExitUsage, code invalid under -o json) with a message naming
// the flag and what it accepts, before anything connects or starts: no
// daemon answers at --server, and up's data dir holds clusters it would
// otherwise start.
func TestCLI_BadFlagValuesAreUsageErrors(t *testing.T) {
	t.Setenv("PGTENANT_TOKEN", "x")
	dir := t.TempDir() // a data dir up made with --clusters 3, not under Patroni
	for _, name := range []string{"local", "local2", "local3"} {
		if err := os.MkdirAll(filepath.Join(dir, name), 0o700); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, name, "cluster.json"), []byte("{}"), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"up", "--standbys", "6"}, "--standbys 6: must be 0 to 5"},
		{[]string{"up", "--standbys", "-1"}, "--standbys -1: must be 0 to 5"},
		{[]string{"up", "--max-restarts", "-1"}, "--max-restarts -1: must be 0 (never restart) or more"},
		{[]string{"up", "--clusters", "0"}, "--clusters 0: must be 1 to 8"},
		{[]string{"up", "--clusters", "9"}, "--clusters 9: must be 1 to 8"},
		{[]string{"up", "--clusters", "2"}, "--clusters 2 would leave local3 down"},
		{[]string{"up", "--patroni"}, "was made without Patroni"},
		{[]string{"up", "--etcd", "2"}, "--etcd 2: must be 1 or 3"},
		{[]string{"up", "--etcd", "0"}, "--etcd 0: must be 1 or 3"},
		{[]string{"up", "--etcd", "3"}, "was made without Patroni"},
		{[]string{"token", "create"}, "--scope is required: one of read-only, tenants, templates, clusters, admin"},
		{[]string{"token", "create", "--scope", "root"}, `--scope "root": one of read-only, tenants, templates, clusters, admin`},
		{[]string{"token", "revoke", "abc"}, `token id "abc": a number`},
		{[]string{"tenant", "metrics", "t_1", "--export", "maybe"}, `--export "maybe": true or false`},
		{[]string{"cluster", "set", "local", "--max-size", "12XB"}, `--max-size: bad size "12XB" (want e.g. 64MB, 512kB, 1GB), or 0 for no cap`},
		{[]string{"cluster", "set", "local", "--label", "Bad Label"}, `--label: label "Bad Label": use key=value`},
		{[]string{"bench", "move", "--size-mb", "-5"}, "--size-mb -5: must be at least 1"},
		{[]string{"bench", "move", "--moves", "0"}, "--moves 0: must be at least 1"},
		{[]string{"bench", "failover", "--rate", "0"}, "--rate 0: must be at least 1"},
		{[]string{"bench", "failover", "--tps-clients", "0"}, "--tps-clients 0: must be at least 1"},
		{[]string{"bench", "failover", "--scenarios", "crash,meteor"}, `--scenarios "meteor": want node-loss, crash or switchover`},
		{[]string{"bench", "failover", "--modes", "semi"}, `--modes "semi": want sync or async`},
		{[]string{"bench", "failover", "--modes", ""}, "--modes: want sync, async or both"},
		{[]string{"bench", "restore", "--mode", "table"}, `--mode "table": want database or schema`},
		{[]string{"bench", "restore", "--big-mb", "0"}, "--big-mb 0: must be at least 1"},
		{[]string{"bench", "restore", "--rate", "-1"}, "--rate -1: must be at least 1"},
	} {
		args := append([]string{"--server", "http://127.0.0.1:1", "--data-dir", dir}, c.args...)
		var stdout, stderr bytes.Buffer
		err := run(context.Background(), args, &globals{stdout: &stdout, stderr: &stderr})
		if got := ExitCode(err); got != ExitUsage || err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%v: %v, status %d; want status %d naming %q", c.args, err, got, ExitUsage, c.want)
		}
		stdout.Reset()
		err = run(context.Background(), append(args, "-o", "json"), &globals{stdout: &stdout, stderr: &stderr})
		var body api.ErrorBody
		if jerr := json.Unmarshal(stdout.Bytes(), &body); jerr != nil || body.Error.Code != "invalid" || !strings.Contains(body.Error.Message, c.want) ||
			ExitCode(err) != ExitUsage || !Printed(err) {
			t.Errorf("%v -o json: status %d, printed %q; want status %d and an error body with code invalid naming %q",
				c.args, ExitCode(err), stdout.String(), ExitUsage, c.want)
		}
	}
}
