package pooler

import (
	"context"
	"fmt"
	"net"
	"net/url"
	"strconv"
	"time"

	"github.com/jackc/pgx/v5"
)

// Admin is a session on PgBouncer's admin console (the pseudo-database
// pgbouncer). The console speaks the simple query protocol only.
type Admin struct {
	conn *pgx.Conn
}

// DialAdmin opens an admin console session on addr.
func DialAdmin(ctx context.Context, addr, user, password string) (*Admin, error) {
	u := url.URL{Scheme: "postgres", User: url.UserPassword(user, password), Host: addr, Path: "/pgbouncer", RawQuery: "sslmode=disable"}
	cfg, err := pgx.ParseConfig(u.String())
	if err != nil {
		return nil, err
	}
	cfg.DefaultQueryExecMode = pgx.QueryExecModeSimpleProtocol
	cfg.ConnectTimeout = 5 * time.Second
	conn, err := pgx.ConnectConfig(ctx, cfg)
	if err != nil {
		return nil, fmt.Errorf("pooler admin console on %s: %w", addr, err)
	}
	return &Admin{conn: conn}, nil
}

// Close ends the session.
func (a *Admin) Close() { _ = a.conn.Close(context.Background()) }

// Command runs a console command: RELOAD, RECONNECT, PAUSE or RESUME (of
// db, or of the whole pooler with db ""), or one of DISABLE, ENABLE, KILL
// on the entry db (a name pgtenant made; anything else is refused before
// it reaches the console).
func (a *Admin) Command(ctx context.Context, cmd, db string) error {
	switch cmd {
	case "RELOAD":
		db = ""
	case "RECONNECT", "PAUSE", "RESUME":
		if db != "" && !validName(db) {
			return fmt.Errorf("pooler %s: bad database name %q", cmd, db)
		}
	case "DISABLE", "ENABLE", "KILL":
		if !validName(db) {
			return fmt.Errorf("pooler %s: bad database name %q", cmd, db)
		}
	default:
		return fmt.Errorf("pooler: command %q is not one pgtenant sends", cmd)
	}
	sql := cmd
	if db != "" {
		sql += " " + db
	}
	if _, err := a.conn.Exec(ctx, sql); err != nil {
		return fmt.Errorf("pooler %s: %w", sql, err)
	}
	return nil
}

// Show runs SHOW what (DATABASES, POOLS, CONFIG, LISTS …) and returns its
// rows as column → text.
func (a *Admin) Show(ctx context.Context, what string) ([]map[string]string, error) {
	switch what {
	case "DATABASES", "POOLS", "CONFIG", "LISTS", "CLIENTS", "SERVERS", "STATS":
	default:
		return nil, fmt.Errorf("pooler: SHOW %q is not one pgtenant sends", what)
	}
	rows, err := a.conn.Query(ctx, "SHOW "+what)
	if err != nil {
		return nil, fmt.Errorf("pooler SHOW %s: %w", what, err)
	}
	defer rows.Close()
	var out []map[string]string
	fields := rows.FieldDescriptions()
	for rows.Next() {
		raw := rows.RawValues()
		m := make(map[string]string, len(fields))
		for i, f := range fields {
			if i < len(raw) {
				m[f.Name] = string(raw[i])
			}
		}
		out = append(out, m)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("pooler SHOW %s: %w", what, err)
	}
	return out, nil
}

// Database is a row of SHOW DATABASES.
type Database struct {
	Name, Database, PoolMode           string
	PoolSize, MaxConnections, Currents int
	Paused, Disabled                   bool
}

// Databases returns SHOW DATABASES, without the console itself.
func (a *Admin) Databases(ctx context.Context) (map[string]Database, error) {
	rows, err := a.Show(ctx, "DATABASES")
	if err != nil {
		return nil, err
	}
	out := make(map[string]Database, len(rows))
	for _, r := range rows {
		if r["name"] == "pgbouncer" {
			continue
		}
		out[r["name"]] = Database{Name: r["name"], Database: r["database"], PoolMode: r["pool_mode"],
			PoolSize: atoi(r["pool_size"]), MaxConnections: atoi(r["max_connections"]), Currents: atoi(r["current_connections"]),
			Paused: r["paused"] == "1", Disabled: r["disabled"] == "1"}
	}
	return out, nil
}

// Pool is a tenant's figures from SHOW POOLS.
type Pool struct {
	Mode                        string // session or transaction
	ClientActive, ClientWaiting int
	ServerActive, ServerIdle    int
	MaxWait                     time.Duration // the oldest waiting client's wait
}

// Pools returns SHOW POOLS by database (the pool of the entry's own user:
// the HBA file admits no other), without the console itself.
func (a *Admin) Pools(ctx context.Context) (map[string]Pool, error) {
	rows, err := a.Show(ctx, "POOLS")
	if err != nil {
		return nil, err
	}
	out := make(map[string]Pool, len(rows))
	for _, r := range rows {
		if r["database"] == "pgbouncer" || r["database"] != r["user"] {
			continue
		}
		out[r["database"]] = Pool{Mode: r["pool_mode"], ClientActive: atoi(r["cl_active"]), ClientWaiting: atoi(r["cl_waiting"]),
			ServerActive: atoi(r["sv_active"]), ServerIdle: atoi(r["sv_idle"]) + atoi(r["sv_used"]),
			MaxWait: time.Duration(atoi(r["maxwait"]))*time.Second + time.Duration(atoi(r["maxwait_us"]))*time.Microsecond}
	}
	return out, nil
}

// Config returns SHOW CONFIG as key → value.
func (a *Admin) Config(ctx context.Context) (map[string]string, error) {
	rows, err := a.Show(ctx, "CONFIG")
	if err != nil {
		return nil, err
	}
	out := make(map[string]string, len(rows))
	for _, r := range rows {
		out[r["key"]] = r["value"]
	}
	return out, nil
}

func atoi(s string) int {
	n, _ := strconv.Atoi(s)
	return n
}

// Addr joins a host and port.
func Addr(host string, port int) string { return net.JoinHostPort(host, strconv.Itoa(port)) }

func splitHostPort(s string) (string, string, error) {
	h, p, err := net.SplitHostPort(s)
	if err == nil && (h == "" || p == "") {
		err = fmt.Errorf("%q is not host:port", s)
	}
	return h, p, err
}
