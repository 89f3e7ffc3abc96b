package tenant_test

import (
	"encoding/base64"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/pgtenant/pgtenant/internal/config"
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

// TestSameSetting: values a tenant may write for a tier parameter compare
// by what PostgreSQL reads, not by their text; every value RoleSettings
// writes compares equal to itself.
func TestSameSetting(t *testing.T) {
	for _, tc := range []struct {
		name, a, b string
		want       bool
	}{
		{"statement_timeout", "30000ms", "30s", true},
		{"statement_timeout", "30000ms", "30000", true},
		{"statement_timeout", "30000ms", " 0.5min ", true},
		{"statement_timeout", "1000ms", "1000us", false},
		{"statement_timeout", "30000ms", "0", false},
		{"idle_in_transaction_session_timeout", "60000ms", "1min", true},
		{"work_mem", "4096kB", "4MB", true},
		{"work_mem", "4096kB", "4096", true},
		{"work_mem", "4096kB", "4mb", false}, // units are case-sensitive: PostgreSQL refuses it
		{"work_mem", "4096kB", "1GB", false},
		{"temp_file_limit", "1048576kB", "1GB", true},
		{"temp_file_limit", "1048576kB", "-1", false},
		{"work_mem", "0x1000", "0x1000", true}, // unreadable here: the same text only
		{"work_mem", "0x1000", "4096kB", false},
	} {
		if got := tenant.SameSetting(tc.name, tc.a, tc.b); got != tc.want {
			t.Errorf("SameSetting(%s, %q, %q) = %v, want %v", tc.name, tc.a, tc.b, got, tc.want)
		}
	}
	tier := config.Default().Tiers["default"]
	for k, v := range tenant.RoleSettings(tier) {
		if !tenant.SameSetting(k, v, v) {
			t.Errorf("%s = %q is not the same as itself", k, v)
		}
	}
}

// TestStatementCap: statement_cap when the tier has one, else its
// statement_timeout, else none.
func TestStatementCap(t *testing.T) {
	for _, tc := range []struct {
		tier config.Tier
		want time.Duration
	}{
		{config.Tier{StatementTimeout: config.Duration(30 * time.Second), StatementCap: config.Duration(time.Minute)}, time.Minute},
		{config.Tier{StatementTimeout: config.Duration(30 * time.Second)}, 30 * time.Second},
		{config.Tier{}, 0},
	} {
		if got := tenant.StatementCap(tc.tier); got != tc.want {
			t.Errorf("StatementCap(%+v) = %s, want %s", tc.tier, got, tc.want)
		}
	}
}
