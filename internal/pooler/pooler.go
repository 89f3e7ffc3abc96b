// Package pooler runs the PgBouncer in front of a cluster: every tenant
// connects through it with its own pool. It owns the pooler's files (its
// config, auth file and HBA file, written atomically and applied with
// RELOAD), its process (started, supervised and stopped here, as the
// postgres OS user when pgtenant runs as root) and the admin console client
// (simple protocol: the console speaks no other). The entries come from the
// catalog and the tenants' SCRAM verifiers from pg_authid: a restart loses
// nothing. It never changes a tenant's role or database: purge, provision
// and credentials do, then ask it to sync.
package pooler

import (
	"bytes"
	"fmt"
	"net/netip"
	"regexp"
	"slices"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/pgtenant/pgtenant/internal/config"
)

// AdminUser is the pooler's admin console user (admin_users): only
// pgtenant has its password, and only from loopback.
const AdminUser = "pgtenant_pooler"

// Pool modes a tier may choose.
const (
	ModeSession     = "session"
	ModeTransaction = "transaction"
)

// Entry is one tenant's pool: a [databases] entry named after the tenant's
// physical name, the only user allowed to reach it (the HBA file), and
// that user's SCRAM verifier (the auth file). PgBouncer logs in to the
// server as the client with the client's own SCRAM keys, so the verifier
// must be the very one PostgreSQL has.
type Entry struct {
	Name             string // t_<id>: the entry and the user
	Database         string // on the server: the tenant's database, or its template's shared database
	Verifier         string // SCRAM-SHA-256$…, as in pg_authid
	PoolMode         string // session or transaction
	PoolSize         int    // server connections of the pool
	MaxDBConnections int    // cap of the entry's server connections
	Disabled         bool   // suspended: DISABLE (clients are refused, the entry stays)
	RequireTLS       bool   // its tier's require_tls: hostssl HBA lines, clear text refused
	// Allow are the client networks (CIDR) its users may come from; none:
	// any address.
	Allow []string
	// Logins are the tenant's extra logins allowed on the entry beside its
	// own user, with their verifiers.
	Logins []User
	// Replica: the entry of the tenant's replica logins, served by a
	// standby (Host, Port): only its Logins, no line for the tenant's own
	// user (Verifier unused).
	Replica bool
	// Spare: an unclaimed spare's, there ahead of its claim (its role
	// cannot log in): one not in PgBouncer yet is no drift.
	Spare bool
	// Host and Port locate the server of a tenant that lives on another
	// cluster than the pooler's (moved there: its DSN stays this
	// pooler's); empty: the pooler's own cluster (Settings).
	Host string
	Port int
}

// User is a login allowed on an entry beside the tenant's own.
type User struct {
	Name     string // t_<id>_<name>
	Verifier string // SCRAM-SHA-256$…, as in pg_authid
}

// Settings are the pooler-wide settings.
type Settings struct {
	ListenHost string
	ListenPort int
	// ServerHost and ServerPort locate the cluster's primary; a
	// ServerHost that starts with / is the directory of its Unix socket.
	ServerHost string
	ServerPort int
	// MaxClientConn bounds the clients of every pool together.
	MaxClientConn int
	// ServerIdleTimeout closes a server connection idle this long, so that
	// thousands of mostly idle tenants hold few backends.
	ServerIdleTimeout time.Duration
	// QueryWaitTimeout bounds how long a client waits for a server connection.
	QueryWaitTimeout time.Duration
	// AdminVerifier is the admin user's SCRAM verifier.
	AdminVerifier string
	// TLSCertFile and TLSKeyFile are the front door's certificate and key
	// (PEM; both or neither): clients that ask for TLS get it
	// (client_tls_sslmode prefer). TLSCAFile, optional, is the CA that
	// signed them (client_tls_ca_file): tenants' DSNs name it as
	// sslrootcert.
	TLSCertFile, TLSKeyFile, TLSCAFile string
	// RequireTLS refuses every tenant's clear-text login (hostssl lines
	// for every entry, as an entry's own RequireTLS does for it).
	RequireTLS bool
	// ServerTLSSSLMode and ServerTLSCAFile are how PgBouncer connects to
	// the server (server_tls_sslmode, server_tls_ca_file); "": disable.
	ServerTLSSSLMode, ServerTLSCAFile string
}

// TLS reports whether the front door serves TLS.
func (s Settings) TLS() bool { return s.TLSCertFile != "" }

var (
	hostRE = regexp.MustCompile(`^[A-Za-z0-9.:_-]{1,253}$`)
	// pathRE is a file path written into pgbouncer.ini as is.
	pathRE = regexp.MustCompile(`^/[A-Za-z0-9._/+-]{1,1000}$`)
)

// validName reports whether s is a name written unquoted into the files:
// ^[a-z][a-z0-9_]{0,62}$. Names and verifiers are checked by hand, not by
// regexp: a sync checks every entry's, four times faster so
// (BenchmarkRender).
func validName(s string) bool {
	if len(s) < 1 || len(s) > 63 || s[0] < 'a' || s[0] > 'z' {
		return false
	}
	for i := 1; i < len(s); i++ {
		if c := s[i]; !(c >= 'a' && c <= 'z' || c >= '0' && c <= '9' || c == '_') {
			return false
		}
	}
	return true
}

// ValidVerifier reports whether v is a SCRAM-SHA-256 verifier:
// ^SCRAM-SHA-256\$[0-9]{1,7}:B\$B:B$ where B is [A-Za-z0-9+/=]{1,100}.
// Anything else (an md5 hash a tenant set on its own role, nothing at all)
// is never written to the auth file: the tenant cannot log in through the
// pooler until its password is rotated.
func ValidVerifier(v string) bool {
	rest, ok := strings.CutPrefix(v, "SCRAM-SHA-256$")
	if !ok {
		return false
	}
	// run takes the longest prefix of rest of bytes in class, 1 to most
	// of them, followed by sep (or by the end when sep is 0).
	run := func(class func(byte) bool, most int, sep byte) bool {
		n := 0
		for n < len(rest) && class(rest[n]) {
			n++
		}
		if n < 1 || n > most {
			return false
		}
		if sep == 0 {
			rest = rest[n:]
			return rest == ""
		}
		if n == len(rest) || rest[n] != sep {
			return false
		}
		rest = rest[n+1:]
		return true
	}
	digit := func(c byte) bool { return c >= '0' && c <= '9' }
	base64 := func(c byte) bool {
		return c >= 'A' && c <= 'Z' || c >= 'a' && c <= 'z' || c >= '0' && c <= '9' || c == '+' || c == '/' || c == '='
	}
	return run(digit, 7, ':') && run(base64, 100, '$') && run(base64, 100, ':') && run(base64, 100, 0)
}

// validEntry checks what reaches the files: names and verifiers are
// written unquoted, so anything but the expected shapes is refused.
func validEntry(e Entry) error {
	switch {
	case !validName(e.Name):
		return fmt.Errorf("entry name %q", e.Name)
	case !validName(e.Database):
		return fmt.Errorf("entry %s: database %q", e.Name, e.Database)
	case !e.Replica && !ValidVerifier(e.Verifier):
		return fmt.Errorf("entry %s: not a SCRAM-SHA-256 verifier", e.Name)
	case e.PoolMode != ModeSession && e.PoolMode != ModeTransaction:
		return fmt.Errorf("entry %s: pool mode %q", e.Name, e.PoolMode)
	case e.PoolSize < 1 || e.MaxDBConnections < 1:
		return fmt.Errorf("entry %s: pool_size and max_db_connections must be at least 1", e.Name)
	case e.Host != "" && (!hostRE.MatchString(e.Host) || e.Port < 1 || e.Port > 65535):
		return fmt.Errorf("entry %s: server %q port %d", e.Name, e.Host, e.Port)
	}
	for _, u := range e.Logins {
		if !validName(u.Name) || !ValidVerifier(u.Verifier) {
			return fmt.Errorf("entry %s: login %q or its verifier", e.Name, u.Name)
		}
	}
	for _, a := range e.Allow {
		if p, err := netip.ParsePrefix(a); err != nil || p.String() != a {
			return fmt.Errorf("entry %s: allowed network %q", e.Name, a)
		}
	}
	return nil
}

// users are the users an entry admits: the tenant's own (but on its
// replica entry) and its logins.
func (e Entry) users() []User {
	out := e.Logins
	if !e.Replica {
		out = append([]User{{Name: e.Name, Verifier: e.Verifier}}, e.Logins...)
	}
	return out
}

// Files are the pooler's three files, rendered.
type Files struct {
	Config, Auth, HBA []byte
}

// Render writes the files for dir: entries sorted by name, so that the same
// entries give the same bytes (a sync whose files did not change reloads
// nothing). An invalid entry is an error: callers filter first.
func Render(dir string, s Settings, entries []Entry) (Files, error) {
	if !hostRE.MatchString(s.ListenHost) || !(hostRE.MatchString(s.ServerHost) || config.CheckSocketDir(s.ServerHost) == nil) {
		return Files{}, fmt.Errorf("pooler: bad listen or server host")
	}
	if !ValidVerifier(s.AdminVerifier) {
		return Files{}, fmt.Errorf("pooler: the admin verifier is not SCRAM-SHA-256")
	}
	for _, p := range []string{s.TLSCertFile, s.TLSKeyFile, s.TLSCAFile, s.ServerTLSCAFile} {
		if p != "" && !pathRE.MatchString(p) {
			return Files{}, fmt.Errorf("pooler: TLS file %q: an absolute path of letters, digits and . _ / + - only", p)
		}
	}
	if (s.TLSCertFile == "") != (s.TLSKeyFile == "") || (s.TLSCAFile != "" && s.TLSCertFile == "") {
		return Files{}, fmt.Errorf("pooler: TLS needs both a certificate and its key (and a CA file only with them)")
	}
	if s.ServerTLSSSLMode != "" && !slices.Contains(config.ServerTLSModes, s.ServerTLSSSLMode) {
		return Files{}, fmt.Errorf("pooler: server TLS mode %q", s.ServerTLSSSLMode)
	}
	es := append([]Entry(nil), entries...)
	sort.Slice(es, func(i, j int) bool { return es[i].Name < es[j].Name })
	var conf, auth, hba bytes.Buffer
	conf.WriteString(";; Written by pgtenant from its catalog; rewritten on every change. Do not edit.\n[databases]\n")
	fmt.Fprintf(&auth, "%q %q\n", AdminUser, s.AdminVerifier)
	// The admin console from loopback only; each tenant to its own entry
	// only. Nothing else matches: another tenant's entry, the console or an
	// unknown name is "login rejected". A tenant that must use TLS (its
	// tier's require_tls, or the pooler's) has hostssl lines: its
	// clear-text login matches none. The console stays host: pgtenant's
	// own loopback session.
	fmt.Fprintf(&hba, "host pgbouncer %s 127.0.0.1/32 scram-sha-256\nhost pgbouncer %s ::1/128 scram-sha-256\n", AdminUser, AdminUser)
	authed := map[string]bool{}
	for _, e := range es {
		if err := validEntry(e); err != nil {
			return Files{}, fmt.Errorf("pooler: %w", err)
		}
		// No user= and no password=: the server login is the client's own,
		// with the SCRAM keys of its authentication.
		host, port := s.ServerHost, s.ServerPort
		if e.Host != "" {
			host, port = e.Host, e.Port
		}
		fmt.Fprintf(&conf, "%s = host=%s port=%d dbname=%s pool_mode=%s pool_size=%d max_db_connections=%d min_pool_size=0 reserve_pool=0\n",
			e.Name, host, port, e.Database, e.PoolMode, e.PoolSize, e.MaxDBConnections)
		kind := "host"
		if e.RequireTLS || s.RequireTLS {
			kind = "hostssl"
		}
		nets := e.Allow
		if len(nets) == 0 {
			nets = []string{"0.0.0.0/0", "::/0"}
		}
		for _, u := range e.users() {
			if !authed[u.Name] {
				// Checked names and verifiers hold no quote nor
				// backslash: quoted as they are.
				auth.WriteString(`"` + u.Name + `" "` + u.Verifier + "\"\n")
				authed[u.Name] = true
			}
			for _, n := range nets {
				hba.WriteString(kind + " " + e.Name + " " + u.Name + " " + n + " scram-sha-256\n")
			}
		}
	}
	secs := func(d time.Duration) string { return strconv.Itoa(max(int(d.Seconds()), 1)) }
	settings := [][2]string{
		{"listen_addr", s.ListenHost},
		{"listen_port", strconv.Itoa(s.ListenPort)},
		{"unix_socket_dir", ""}, // TCP only: no clash over /tmp or /var/run/postgresql
		{"auth_type", "hba"},
		{"auth_hba_file", dir + "/" + hbaFile},
		{"auth_file", dir + "/" + authFile},
		{"admin_users", AdminUser},
		{"pidfile", dir + "/" + pidFile},
		{"logfile", dir + "/" + logFile},
		{"pool_mode", ModeSession},
		{"default_pool_size", "1"},
		{"min_pool_size", "0"},
		{"reserve_pool_size", "0"},
		{"max_client_conn", strconv.Itoa(s.MaxClientConn)},
		{"server_idle_timeout", secs(s.ServerIdleTimeout)},
		{"server_lifetime", "3600"},
		// A server login that failed (a tenant suspended at that moment)
		// is retried soon, not after the default 15 s.
		{"server_login_retry", "1"},
		{"query_wait_timeout", secs(s.QueryWaitTimeout)},
		{"client_login_timeout", "60"},
		// JDBC sends it; nothing else a client sends at startup (options,
		// search_path) is accepted: a tenant's session settings come from
		// its role.
		{"ignore_startup_parameters", "extra_float_digits"},
		{"server_reset_query", "DISCARD ALL"},
		{"log_connections", "0"},
		{"log_disconnections", "0"},
		{"log_pooler_errors", "1"},
		{"stats_period", "60"},
	}
	if s.TLS() {
		// prefer: a client that asks gets TLS, one that does not gets
		// clear text unless its HBA lines are hostssl. Not require: the
		// admin console (pgtenant's loopback session) stays clear text.
		settings = append(settings, [2]string{"client_tls_sslmode", "prefer"},
			[2]string{"client_tls_cert_file", s.TLSCertFile}, [2]string{"client_tls_key_file", s.TLSKeyFile})
		if s.TLSCAFile != "" {
			settings = append(settings, [2]string{"client_tls_ca_file", s.TLSCAFile})
		}
	}
	if s.ServerTLSSSLMode != "" {
		settings = append(settings, [2]string{"server_tls_sslmode", s.ServerTLSSSLMode})
		if s.ServerTLSCAFile != "" {
			settings = append(settings, [2]string{"server_tls_ca_file", s.ServerTLSCAFile})
		}
	}
	conf.WriteString("\n[pgbouncer]\n")
	for _, kv := range settings {
		fmt.Fprintf(&conf, "%s = %s\n", kv[0], kv[1])
	}
	return Files{Config: conf.Bytes(), Auth: auth.Bytes(), HBA: hba.Bytes()}, nil
}

// File names in the pooler's directory.
const (
	configFile = "pgbouncer.ini"
	authFile   = "users.txt"
	hbaFile    = "hba.conf"
	pidFile    = "pgbouncer.pid"
	logFile    = "pgbouncer.log"
	adminFile  = "admin.password"
	stateFile  = "pooler.json"
)

// EntryNames lists the names in a rendered config's [databases] section
// (for tests and doctor).
func EntryNames(conf []byte) []string {
	var out []string
	in := false
	for _, line := range strings.Split(string(conf), "\n") {
		line = strings.TrimSpace(line)
		switch {
		case strings.HasPrefix(line, "["):
			in = line == "[databases]"
		case in && line != "" && !strings.HasPrefix(line, ";"):
			if name, _, ok := strings.Cut(line, " = "); ok {
				out = append(out, name)
			}
		}
	}
	return out
}
