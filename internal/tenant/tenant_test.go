package tenant_test

import (
	"encoding/base64"
	"errors"
	"strings"
	"testing"

	"github.com/pgtenant/pgtenant/internal/tenant"
)

func TestNewID_OpaqueAndValid(t *testing.T) {
	seen := map[string]bool{}
	for i := 0; i < 1000; i++ {
		id := tenant.NewID()
		if !tenant.ValidID(id) {
			t.Fatalf("NewID() = %q, not valid", id)
		}
		if seen[id] {
			t.Fatalf("NewID() repeated %q", id)
		}
		seen[id] = true
		got, ok := tenant.IDFromPhysical(tenant.PhysicalName(id))
		if !ok || got != id {
			t.Fatalf("IDFromPhysical(PhysicalName(%q)) = %q, %v", id, got, ok)
		}
	}
}

func TestValidateName(t *testing.T) {
	for _, ok := range []string{"Acme Inc", "Ünïcødé ☃", "'; DROP DATABASE x; --", strings.Repeat("x", 200)} {
		if err := tenant.ValidateName(ok); err != nil {
			t.Errorf("ValidateName(%q) = %v, want nil", ok, err)
		}
	}
	for _, bad := range []string{"", "   ", strings.Repeat("x", 201), "a\x00b", "line\nbreak", "bell\a", "\xff\xfe"} {
		if err := tenant.ValidateName(bad); !errors.Is(err, tenant.ErrBadName) {
			t.Errorf("ValidateName(%q) = %v, want ErrBadName", bad, err)
		}
	}
}

// TestSCRAMVerifier checks the verifier against RFC 7677's test vector:
// user "user", password "pencil", salt W22ZaJ0SNY7soEsUEjb6gQ==, 4096 iterations.
func TestSCRAMVerifier(t *testing.T) {
	salt, _ := base64.StdEncoding.DecodeString("W22ZaJ0SNY7soEsUEjb6gQ==")
	got := tenant.SCRAMVerifier("pencil", salt, 4096)
	// StoredKey and ServerKey derived from the RFC's SaltedPassword.
	want := "SCRAM-SHA-256$4096:W22ZaJ0SNY7soEsUEjb6gQ==$WG5d8oPm3OtcPnkdi4Uo7BkeZkBFzpcXkuLmtbsT4qY=:wfPLwcE6nTWhTAmQ7tl2KeoiWGPlZqQxSrmfPwDl2dU="
	if got != want {
		t.Errorf("SCRAMVerifier = %s\nwant %s", got, want)
	}
	pw, ver := tenant.NewPassword()
	if len(pw) != 32 || !strings.HasPrefix(ver, "SCRAM-SHA-256$4096:") {
		t.Errorf("NewPassword = %q, %q", pw, ver)
	}
}

func TestPlace(t *testing.T) {
	got, err := tenant.Place([]string{"b", "a", "c"}, map[string]int{"a": 5, "b": 2, "c": 2})
	if err != nil || got != "b" {
		t.Errorf("Place = %q, %v; want b", got, err)
	}
	if _, err := tenant.Place(nil, nil); err == nil {
		t.Error("Place with no clusters succeeded")
	}
}

func TestCreateStrategy(t *testing.T) {
	const mb = 1 << 20
	for _, tc := range []struct {
		size     int64
		standbys int
		want     string
	}{
		{8 * mb, 1, "WAL_LOG"},
		{32 * mb, 1, "WAL_LOG"},
		{33 * mb, 1, "FILE_COPY"},
		{200 * mb, 0, "WAL_LOG"},
		{300 * mb, 0, "FILE_COPY"},
	} {
		if got := tenant.CreateStrategy(tc.size, tc.standbys, 32*mb); got != tc.want {
			t.Errorf("CreateStrategy(%d MB, %d standbys) = %s, want %s", tc.size/mb, tc.standbys, got, tc.want)
		}
	}
}
