package templates_test

import (
	"os"
	"testing"

	"github.com/pgtenant/pgtenant/internal/templates"
)

// TestWide_MatchesExample keeps examples/templates/wide equal to Wide(20).
// Regenerate with: PGTENANT_WRITE_EXAMPLES=1 go test ./internal/templates -run TestWide
func TestWide_MatchesExample(t *testing.T) {
	const path = "../../examples/templates/wide/0001_init.sql"
	want := templates.Wide(20)[0].Body
	if os.Getenv("PGTENANT_WRITE_EXAMPLES") != "" {
		if err := os.WriteFile(path, []byte(want), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	got, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if string(got) != want {
		t.Errorf("%s differs from templates.Wide(20); regenerate it", path)
	}
	f, err := templates.ParseFile("0001_init.sql", want)
	if err != nil {
		t.Fatal(err)
	}
	if got, want := len(f.Statements), 21; got != want {
		t.Errorf("statements = %d, want %d", got, want)
	}
}
