package tenant

import (
	"strings"
	"testing"
)

func TestMarker_RoundTrip(t *testing.T) {
	for _, tc := range []struct {
		m    Marker
		want string
	}{
		{BuiltMarker(1), "pgtenant: built from version 1"},
		{Marker{Built: 1, Version: 3}, "pgtenant: built from version 1, at version 3"},
		{Marker{Built: 2, Version: 3, Extra: 1, Next: 4}, "pgtenant: built from version 2, at version 3, +1 file of version 4"},
		{Marker{Built: 2, Version: 2, Extra: 2, Next: 3}, "pgtenant: built from version 2, at version 2, +2 files of version 3"},
		// Version 2 failed to build: the files after version 1 are version 3's.
		{Marker{Built: 1, Version: 1, Extra: 1, Next: 3}, "pgtenant: built from version 1, at version 1, +1 file of version 3"},
	} {
		got := tc.m.String()
		if got != tc.want {
			t.Errorf("%+v.String() = %q, want %q", tc.m, got, tc.want)
		}
		// The reconciler takes a schema whose comment starts so as fully built.
		if !strings.HasPrefix(got, "pgtenant: built") {
			t.Errorf("%q does not start with the reconciler's prefix", got)
		}
		back, ok := ParseMarker(got)
		if !ok || back != tc.m {
			t.Errorf("ParseMarker(%q) = %+v, %v; want %+v", got, back, ok, tc.m)
		}
	}
	for _, bad := range []string{"", "pgtenant: schema-mode tenants of template x", "pgtenant: built from version 0",
		"pgtenant: built from version 3, at version 2", "pgtenant: built from version 1, at version 2, +1 file of version 2",
		"pgtenant: built from version 1; DROP"} {
		if m, ok := ParseMarker(bad); ok {
			t.Errorf("ParseMarker(%q) = %+v, want not a marker", bad, m)
		}
	}
}
