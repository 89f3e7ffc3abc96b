// Package tenant holds the rules about tenants that need no I/O: opaque ids
// and physical names, validation of names a customer chooses, passwords and
// SCRAM verifiers, tier settings and placement. Pure functions only.
package tenant

import (
	"crypto/hmac"
	"crypto/pbkdf2"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"errors"
	"fmt"
	"math"
	"regexp"
	"strconv"
	"strings"
	"time"
	"unicode"
	"unicode/utf8"

	"github.com/pgtenant/pgtenant/internal/cluster"
	"github.com/pgtenant/pgtenant/internal/config"
)

// Prefix starts every tenant's physical name (database, schema and role).
const Prefix = "t_"

const idAlphabet = "abcdefghijklmnopqrstuvwxyz234567"

var idRE = regexp.MustCompile(`^[a-z2-7]{12}$`)

// NewID returns a random opaque tenant id: 12 characters, 60 bits.
func NewID() string {
	b := make([]byte, 12)
	_, _ = rand.Read(b)
	for i := range b {
		b[i] = idAlphabet[b[i]&31]
	}
	return string(b)
}

// ValidID reports whether s is a well-formed tenant id.
func ValidID(s string) bool { return idRE.MatchString(s) }

// PhysicalName is the tenant's database, schema and role name. It reveals
// nothing about the customer: tenants can read other names from the catalogs.
func PhysicalName(id string) string { return Prefix + id }

// AgentPrefix starts the name of every tenant's agent role.
const AgentPrefix = "pgt_agent_"

// AgentRole is the login role pgtenant uses to run SQL inside a tenant
// (rollouts): a member of the tenant's role and nothing else, whose password
// only the control plane knows (docs/SECURITY.md, "Tenant sessions").
func AgentRole(id string) string { return AgentPrefix + id }

// IDFromAgent returns the id of an agent role's name, if it is one.
func IDFromAgent(name string) (string, bool) {
	id, ok := strings.CutPrefix(name, AgentPrefix)
	return id, ok && ValidID(id)
}

// LockPrefix starts the name of every tenant's quota lock role.
const LockPrefix = "pgt_quota_lock_"

// LockRole owns a tenant's objects while its quota is enforced
// (internal/quota): a role of its own (NOLOGIN, no members), made at
// enforcement, dropped at restore or purge. It is never shared: PostgreSQL
// runs some of an object's code as its owner (rule actions, foreign-key
// actions with the triggers and policies they set off, ANALYZE of
// expression indexes, SECURITY DEFINER routines), so a tenant's code can
// act as the owner of its locked objects, and an owner that held two
// tenants' objects would reach both.
func LockRole(id string) string { return LockPrefix + id }

// IDFromLockRole returns the id of a lock role's name, if it is one.
func IDFromLockRole(name string) (string, bool) {
	id, ok := strings.CutPrefix(name, LockPrefix)
	return id, ok && ValidID(id)
}

// MarkerSchema holds, in a database tenant's database, the version marker
// (its comment). It belongs to the tenant's agent role, so that a rollout
// moves the marker in the transaction of the version's files, while the
// tenant itself can neither alter nor drop it.
const MarkerSchema = "pgtenant"

// IDFromPhysical returns the id of a physical name, if it is one.
func IDFromPhysical(name string) (string, bool) {
	id, ok := strings.CutPrefix(name, Prefix)
	return id, ok && ValidID(id)
}

// LoginRole is the role of one of a tenant's extra logins (`pgtenant
// tenant credential create`): t_<id>_<name>. It is no tenant's physical
// name (an id is 12 characters), and the login's name has no underscore,
// so that IDFromLogin reads it back unambiguously.
func LoginRole(id, name string) string { return Prefix + id + "_" + name }

// StandbyEntry is the front door's entry of a tenant's replica logins,
// served by a standby: t_<id>__standby, which no login role can be.
func StandbyEntry(id string) string { return Prefix + id + "__standby" }

// IDFromEntry returns the tenant of a front door entry: its own
// (PhysicalName) or its standby entry.
func IDFromEntry(entry string) (string, bool) {
	return IDFromPhysical(strings.TrimSuffix(entry, "__standby"))
}

var loginNameRE = regexp.MustCompile(`^[a-z][a-z0-9]{0,19}$`)

// ValidLoginName reports whether name may name an extra login: a lowercase
// letter, then up to 19 lowercase letters and digits.
func ValidLoginName(name string) bool { return loginNameRE.MatchString(name) }

// IDFromLogin returns the tenant id and login name of a login role's name,
// if it is one.
func IDFromLogin(role string) (id, name string, ok bool) {
	rest, ok := strings.CutPrefix(role, Prefix)
	if !ok || len(rest) < 14 || rest[12] != '_' {
		return "", "", false
	}
	id, name = rest[:12], rest[13:]
	return id, name, ValidID(id) && ValidLoginName(name)
}

// TenantRole is the tenant's own role for a role it logs in with: role
// itself, or the tenant's for one of its extra logins.
func TenantRole(role string) string {
	if id, _, ok := IDFromLogin(role); ok {
		return PhysicalName(id)
	}
	return role
}

// IDFromRole returns the tenant whose sessions a login role opens: the
// tenant's own role or one of its extra logins.
func IDFromRole(role string) (string, bool) {
	if id, ok := IDFromPhysical(role); ok {
		return id, true
	}
	id, _, ok := IDFromLogin(role)
	return id, ok
}

// Errors of customer-chosen input.
var (
	ErrBadName       = errors.New("invalid display name")
	ErrBadExternalID = errors.New("invalid external id")
)

// ValidateName checks a display name: 1 to 200 characters, no control
// characters, not only spaces. It is stored in the catalog only.
func ValidateName(n string) error {
	return validateText(n, 200, ErrBadName)
}

// ValidateExternalID checks an external id the same way (1 to 200 characters).
func ValidateExternalID(s string) error {
	return validateText(s, 200, ErrBadExternalID)
}

func validateText(s string, maxLen int, kind error) error {
	switch {
	case !utf8.ValidString(s):
		return fmt.Errorf("%w: not valid UTF-8", kind)
	case strings.TrimSpace(s) == "":
		return fmt.Errorf("%w: empty", kind)
	case utf8.RuneCountInString(s) > maxLen:
		return fmt.Errorf("%w: longer than %d characters", kind, maxLen)
	}
	for _, r := range s {
		if unicode.IsControl(r) {
			return fmt.Errorf("%w: contains control character %U", kind, r)
		}
	}
	return nil
}

// scramIterations matches PostgreSQL's default scram_iterations.
const scramIterations = 4096

// NewPassword returns a random password and its SCRAM-SHA-256 verifier. Only
// the verifier is sent to PostgreSQL, so the password never appears in a
// server log or in pg_stat_activity.
func NewPassword() (password, verifier string) {
	b := make([]byte, 16)
	_, _ = rand.Read(b)
	password = hex.EncodeToString(b)
	salt := make([]byte, 16)
	_, _ = rand.Read(salt)
	return password, SCRAMVerifier(password, salt, scramIterations)
}

// SCRAMVerifier computes PostgreSQL's stored form of a SCRAM-SHA-256
// password (RFC 5802/7677): SCRAM-SHA-256$iter:salt$StoredKey:ServerKey.
func SCRAMVerifier(password string, salt []byte, iterations int) string {
	salted, err := pbkdf2.Key(sha256.New, password, salt, iterations, sha256.Size)
	if err != nil {
		panic(err) // only for parameters FIPS mode forbids; ours are fixed
	}
	clientKey := hmacSHA256(salted, "Client Key")
	stored := sha256.Sum256(clientKey)
	serverKey := hmacSHA256(salted, "Server Key")
	enc := base64.StdEncoding.EncodeToString
	return fmt.Sprintf("SCRAM-SHA-256$%d:%s$%s:%s", iterations, enc(salt), enc(stored[:]), enc(serverKey))
}

func hmacSHA256(key []byte, msg string) []byte {
	h := hmac.New(sha256.New, key)
	h.Write([]byte(msg))
	return h.Sum(nil)
}

// RoleSettings are the per-role defaults a tier sets (ALTER ROLE … SET), by
// parameter name. The connection limit is separate (ALTER ROLE … CONNECTION LIMIT).
func RoleSettings(t config.Tier) map[string]string {
	ms := func(d config.Duration) string { return fmt.Sprintf("%dms", time.Duration(d).Milliseconds()) }
	kb := func(b config.ByteSize) string { return fmt.Sprintf("%dkB", int64(b)/1024) }
	out := map[string]string{}
	if t.StatementTimeout > 0 {
		out["statement_timeout"] = ms(t.StatementTimeout)
	}
	if t.IdleInTransactionSessionTimeout > 0 {
		out["idle_in_transaction_session_timeout"] = ms(t.IdleInTransactionSessionTimeout)
	}
	if t.WorkMem > 0 {
		out["work_mem"] = kb(t.WorkMem)
	}
	if t.TempFileLimit > 0 {
		out["temp_file_limit"] = kb(t.TempFileLimit)
	}
	return out
}

// TierSQL applies a tier's limits to a role of a tenant (its own, or one of
// its extra logins): the connection limit and RoleSettings, each parameter
// the tier does not set reset.
func TierSQL(role string, t config.Tier) string {
	id := cluster.Ident(role)
	var b strings.Builder
	fmt.Fprintf(&b, "ALTER ROLE %s CONNECTION LIMIT %d;\n", id, t.ConnectionLimit)
	set := RoleSettings(t)
	for _, k := range TierParameters {
		if v, ok := set[k]; ok {
			fmt.Fprintf(&b, "ALTER ROLE %s SET %s = %s;\n", id, k, cluster.Literal(v))
		} else {
			fmt.Fprintf(&b, "ALTER ROLE %s RESET %s;\n", id, k)
		}
	}
	return b.String()
}

// TierParameters are the parameters a tier sets as role defaults
// (RoleSettings), and so the ones the capper puts back when a tenant
// changes them on its own role.
var TierParameters = []string{"statement_timeout", "idle_in_transaction_session_timeout", "work_mem", "temp_file_limit"}

// StatementCap is how long a tier's statements may run before the capper
// cancels them from outside: statement_cap if set, else statement_timeout
// (a role default the tenant can SET away). 0: no limit.
func StatementCap(t config.Tier) time.Duration {
	if t.StatementCap > 0 {
		return t.StatementCap.D()
	}
	return max(t.StatementTimeout.D(), 0)
}

// settingUnits are the units PostgreSQL accepts for the tier parameters,
// in each one's base unit (ms for the timeouts, kB for the sizes). Units
// are case-sensitive, as in PostgreSQL.
var settingUnits = map[string]map[string]float64{
	"ms": {"us": 0.001, "ms": 1, "s": 1000, "min": 60_000, "h": 3_600_000, "d": 86_400_000},
	"kB": {"B": 1.0 / 1024, "kB": 1, "MB": 1024, "GB": 1 << 20, "TB": 1 << 30},
}

var settingRE = regexp.MustCompile(`^\s*([-+]?(?:[0-9]+\.?[0-9]*|\.[0-9]+)(?:[eE][-+]?[0-9]+)?)\s*([A-Za-z]*)\s*$`)

// settingBase returns a value of one of TierParameters in its base unit, as
// PostgreSQL reads it (a number without a unit is in the base unit; the
// result is rounded to it).
func settingBase(name, v string) (float64, bool) {
	base := "ms"
	if name == "work_mem" || name == "temp_file_limit" {
		base = "kB"
	}
	m := settingRE.FindStringSubmatch(v)
	if m == nil {
		return 0, false
	}
	n, err := strconv.ParseFloat(m[1], 64)
	if err != nil {
		return 0, false
	}
	if m[2] != "" {
		f, ok := settingUnits[base][m[2]]
		if !ok {
			return 0, false
		}
		n *= f
	}
	return math.Round(n), true
}

// SameSetting reports whether two values of a tier parameter mean the same
// to PostgreSQL ("30s", "30000ms" and "30000" for statement_timeout). A
// value it cannot read is the same only as the identical text.
func SameSetting(name, a, b string) bool {
	if a == b {
		return true
	}
	x, okA := settingBase(name, a)
	y, okB := settingBase(name, b)
	return okA && okB && x == y
}

// Connections is what admission knows of one cluster: its server's
// connection settings and the connection limits its tenants hold.
type Connections struct {
	MaxConnections int // max_connections
	Reserved       int // superuser_reserved_connections + provision.reserved_connections: pgtenant's own sessions
	Rollout        int // the agent sessions a rollout may hold (migrate.per_cluster)
	Used           int // the sum of its tenants' connection limits
}

// Capacity is what the tenants' connection limits may add up to on the
// cluster: the connections left to tenants, times overcommit.
func (c Connections) Capacity(overcommit float64) int {
	return int(float64(c.MaxConnections-c.Reserved-c.Rollout) * overcommit)
}

// Share is what a tenant with a tier's connection limit holds of a
// cluster's connections: an unlimited tier (-1) may take them all.
func Share(limit, maxConnections int) int {
	if limit < 0 {
		return maxConnections
	}
	return limit
}

// Admits reports whether a tenant holding share fits on the cluster
// (overcommit 0: admission off).
func (c Connections) Admits(share int, overcommit float64) bool {
	return overcommit == 0 || c.Used+share <= c.Capacity(overcommit)
}

// CreateStrategy chooses CREATE DATABASE's strategy for a template of
// templateSize bytes (docs/provisioning.md, "Creating databases"):
//   - WAL_LOG copies the template through the WAL: the standby replays about
//     templateSize bytes, but no checkpoint is forced;
//   - FILE_COPY writes almost no WAL but forces two checkpoints, each of
//     which fsyncs every dirty file of the cluster.
//
// WAL_LOG is used up to walLogMax (default 32 MB, half the pacer's default
// lag budget, so one create cannot put a standby over budget on its own).
// Without standbys, WAL costs only local writes, so WAL_LOG goes up to 8×
// walLogMax. Beyond that, FILE_COPY.
func CreateStrategy(templateSize int64, standbys int, walLogMax int64) string {
	limit := walLogMax
	if standbys == 0 {
		limit *= 8
	}
	if templateSize <= limit {
		return "WAL_LOG"
	}
	return "FILE_COPY"
}
