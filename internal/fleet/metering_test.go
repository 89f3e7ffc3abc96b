package fleet

import (
	"os"
	"path/filepath"
	"testing"
)

// TestWithMetering_OnlyWhenTheLibraryIsThere: pg_stat_statements and
// pg_stat_kcache are added to what is preloaded when the server has
// pg_stat_kcache's library, and nothing changes without it (a server
// told to preload a missing library does not start).
func TestWithMetering_OnlyWhenTheLibraryIsThere(t *testing.T) {
	dir := t.TempDir()
	b := Binaries{Dir: filepath.Join(dir, "bin")}
	if err := os.MkdirAll(filepath.Join(dir, "lib"), 0o755); err != nil {
		t.Fatal(err)
	}
	if got := WithMetering(DefaultSettings(), b)["shared_preload_libraries"]; got != "'pg_prewarm'" {
		t.Errorf("without the library: shared_preload_libraries = %s, want 'pg_prewarm'", got)
	}
	if err := os.WriteFile(filepath.Join(dir, "lib", "pg_stat_kcache.so"), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	in := DefaultSettings()
	got := WithMetering(in, b)
	if want := "'pg_prewarm,pg_stat_statements,pg_stat_kcache'"; got["shared_preload_libraries"] != want {
		t.Errorf("with the library: shared_preload_libraries = %s, want %s", got["shared_preload_libraries"], want)
	}
	if in["shared_preload_libraries"] != "'pg_prewarm'" {
		t.Error("WithMetering changed its argument")
	}
	if again := WithMetering(got, b)["shared_preload_libraries"]; again != got["shared_preload_libraries"] {
		t.Errorf("twice: %s", again)
	}
}
