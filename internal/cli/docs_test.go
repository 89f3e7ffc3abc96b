package cli

import (
	"bytes"
	"os"
	"testing"
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
