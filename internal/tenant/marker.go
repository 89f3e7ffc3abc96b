package tenant

import (
	"fmt"
	"regexp"
	"strconv"
)

// Marker is the version a tenant records inside itself, as the comment of
// its schema (schema mode) or of its database (database mode), so that a
// restored or moved tenant knows its version without the catalog. A
// migration rewrites it in the same transaction as the version's files, so
// the marker is exactly what the tenant has committed: it is the guard that
// stops a resumed rollout from applying a version twice.
//
//	pgtenant: built from version 1                       (as built; provision writes this)
//	pgtenant: built from version 1, at version 3         (migrated)
//	pgtenant: built from version 1, at version 3, +1 file of version 4
//	                                                     (a NO TRANSACTION file of version 4 committed on its own;
//	                                                      the version after 3 that did not fail to build)
//
// Every form starts with "pgtenant: built", which the reconciler takes as
// "fully built" (a schema without it is a half-built one).
type Marker struct {
	Built   int // the version the tenant was built from
	Version int // the version it is at
	Extra   int // files of version Next already committed (only between the segments of a version with NO TRANSACTION files)
	Next    int // the version Extra counts files of: the next one that did not fail (Version+1 unless one failed); set with Extra
}

// String formats the marker.
func (m Marker) String() string {
	s := fmt.Sprintf("pgtenant: built from version %d", m.Built)
	if m.Version != m.Built || m.Extra > 0 {
		s += fmt.Sprintf(", at version %d", m.Version)
	}
	if m.Extra > 0 {
		plural := "s"
		if m.Extra == 1 {
			plural = ""
		}
		s += fmt.Sprintf(", +%d file%s of version %d", m.Extra, plural, m.Next)
	}
	return s
}

var markerRE = regexp.MustCompile(`^pgtenant: built from version (\d+)(?:, at version (\d+))?(?:, \+(\d+) files? of version (\d+))?$`)

// ParseMarker reads a marker; ok is false when s is not one.
func ParseMarker(s string) (m Marker, ok bool) {
	sub := markerRE.FindStringSubmatch(s)
	if sub == nil {
		return Marker{}, false
	}
	atoi := func(s string) int { n, _ := strconv.Atoi(s); return n }
	m.Built = atoi(sub[1])
	m.Version = m.Built
	if sub[2] != "" {
		m.Version = atoi(sub[2])
	}
	if sub[3] != "" {
		m.Extra, m.Next = atoi(sub[3]), atoi(sub[4])
		if m.Next <= m.Version {
			return Marker{}, false
		}
	}
	return m, m.Built > 0 && m.Version >= m.Built
}

// BuiltMarker returns the marker of a tenant built from a version.
func BuiltMarker(version int) Marker { return Marker{Built: version, Version: version} }
