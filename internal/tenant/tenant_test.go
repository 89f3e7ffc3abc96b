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
	cands := []tenant.Candidate{
		{Name: "b", Tenants: 2, SizeBytes: 9},
		{Name: "a", Tenants: 5},
		{Name: "c", Tenants: 2, SizeBytes: 3},
	}
	if got, err := tenant.Place(cands, tenant.Need{Tier: "default"}); err != nil || got != "c" {
		t.Errorf("Place = %q, %v; want c (fewest tenants, then smallest)", got, err)
	}
	if _, err := tenant.Place(nil, tenant.Need{}); err == nil {
		t.Error("Place with no clusters succeeded")
	}
}

func TestPlace_Policy(t *testing.T) {
	conns := &tenant.Connections{MaxConnections: 20, Used: 18}
	for _, tc := range []struct {
		name string
		c    tenant.Candidate
		n    tenant.Need
		want string // part of the refusal; "" admits
	}{
		{"draining", tenant.Candidate{Name: "x", Draining: true}, tenant.Need{}, "cluster undrain x"},
		{"max tenants", tenant.Candidate{Name: "x", Tenants: 3, MaxTenants: 3}, tenant.Need{}, "--max-tenants"},
		{"below max tenants", tenant.Candidate{Name: "x", Tenants: 2, MaxTenants: 3}, tenant.Need{}, ""},
		{"max size", tenant.Candidate{Name: "x", SizeBytes: 90, MaxSizeBytes: 100}, tenant.Need{SizeBytes: 20}, "--max-size"},
		{"label missing", tenant.Candidate{Name: "x"}, tenant.Need{Tier: "gold", Label: "disk=ssd"}, "--label disk=ssd"},
		{"label other value", tenant.Candidate{Name: "x", Labels: map[string]string{"disk": "hdd"}}, tenant.Need{Label: "disk=ssd"}, "lacks label"},
		{"label", tenant.Candidate{Name: "x", Labels: map[string]string{"disk": "ssd"}}, tenant.Need{Label: "disk=ssd"}, ""},
		{"dedicated needs empty", tenant.Candidate{Name: "x", Tenants: 1}, tenant.Need{Tier: "big", Dedicated: true}, "of its own"},
		{"dedicated empty", tenant.Candidate{Name: "x"}, tenant.Need{Dedicated: true}, ""},
		{"taken by dedicated", tenant.Candidate{Name: "x", Tenants: 1, Dedicated: true}, tenant.Need{}, "dedicated"},
		{"connections", tenant.Candidate{Name: "x", Conns: conns, Share: 5}, tenant.Need{Overcommit: 1}, "no connections left"},
		{"connections off", tenant.Candidate{Name: "x", Conns: conns, Share: 5}, tenant.Need{}, ""},
	} {
		got := tenant.Refusal(tc.c, tc.n)
		if (tc.want == "") != (got == "") || !strings.Contains(got, tc.want) {
			t.Errorf("%s: Refusal = %q; want %q", tc.name, got, tc.want)
		}
	}
	_, err := tenant.Place([]tenant.Candidate{{Name: "x", Draining: true}}, tenant.Need{Tier: "default"})
	if !errors.Is(err, tenant.ErrNoCapacity) || !strings.Contains(err.Error(), "draining") {
		t.Errorf("Place on a draining fleet: %v", err)
	}
	for _, bad := range []string{"k", "=v", "K=v", "k=a,b"} {
		if _, _, err := config.ParseLabel(bad); err == nil {
			t.Errorf("ParseLabel(%q) accepted", bad)
		}
	}
	if k, v, err := config.ParseLabel("disk=ssd"); err != nil || k != "disk" || v != "ssd" {
		t.Errorf("ParseLabel = %q %q %v", k, v, err)
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
