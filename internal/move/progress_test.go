package move

import "testing"

// TestCopyProgress_CountsBytesAndTables: the copy's progress line counts
// the bytes it copies, with units, and names the table it copies, not the
// rows of the tables done before it ("1 rows … done" while 45 MB went by);
// the notes at the end pluralise the rows.
func TestCopyProgress_CountsBytesAndTables(t *testing.T) {
	got := copyProgress("copying tenant abc from local to local2", 12<<20, 45<<20, "table 2 of 3 (public.big)")
	want := "copying tenant abc from local to local2: 12.0 MiB of about 45.0 MiB copied, table 2 of 3 (public.big)"
	if got != want {
		t.Errorf("progress = %q, want %q", got, want)
	}
	for _, c := range []struct {
		n    int64
		want string
	}{{0, "0 rows"}, {1, "1 row"}, {45000, "45000 rows"}} {
		if got := count(c.n, "row"); got != c.want {
			t.Errorf("count(%d) = %q, want %q", c.n, got, c.want)
		}
	}
}
