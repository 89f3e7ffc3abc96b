package cli

import (
	"encoding/json"
	"fmt"
	"io"
	"slices"
	"strings"
	"text/tabwriter"

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
	return fmt.Errorf("%s %q: one of %s", flag, v, join(valid))
}

// join lists values for a help text or an error: "a, b, c".
func join[S ~string](values []S) string {
	names := make([]string, len(values))
	for i, s := range values {
		names[i] = string(s)
	}
	return strings.Join(names, ", ")
}
