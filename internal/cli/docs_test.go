package cli

import (
	"bytes"
	"os"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/pgtenant/pgtenant/internal/jobs"
)

// TestCLIDocs_UpToDate: docs/cli.md is what the command tree generates, so
// the committed reference never drifts from the commands' help.
func TestCLIDocs_UpToDate(t *testing.T) {
	t.Setenv("PGTENANT_SERVER", "http://elsewhere:1") // the reference must not depend on it
	dir := t.TempDir()
	var out bytes.Buffer
	root := newRoot(&out, &out)
	root.SetArgs([]string{"gen-docs", dir})
	if err := root.Execute(); err != nil {
		t.Fatal(err)
	}
	got, err := os.ReadFile(dir + "/" + cliDocFile)
	if err != nil {
		t.Fatal(err)
	}
	want, err := os.ReadFile("../../docs/" + cliDocFile)
	if err != nil {
		t.Fatalf("%v: run make docs", err)
	}
	if !bytes.Equal(got, want) {
		t.Errorf("docs/%s differs from the command tree (%d bytes generated, %d committed): run make docs", cliDocFile, len(got), len(want))
	}
}

// TestJobsDoc_NamesEveryType: the job types docs/jobs.md lists for `job
// list --type` are every type the flag takes (its help is generated from
// jobs.Types; the page is not).
func TestJobsDoc_NamesEveryType(t *testing.T) {
	b, err := os.ReadFile("../../docs/jobs.md")
	if err != nil {
		t.Fatal(err)
	}
	_, list, ok := strings.Cut(string(b), "`--type` takes ")
	list, _, _ = strings.Cut(list, "likewise checked")
	if !ok {
		t.Fatal("docs/jobs.md does not say what `--type` takes")
	}
	var got []string
	for _, m := range regexp.MustCompile("`([a-z._]+)`").FindAllStringSubmatch(list, -1) {
		got = append(got, m[1])
	}
	var want []string
	for _, typ := range jobs.Types {
		want = append(want, string(typ))
	}
	if !slices.Equal(got, want) {
		t.Errorf("docs/jobs.md: --type takes %v, want %v (jobs.Types)", got, want)
	}
}
