package tenant

// Mode is how a tenant is isolated on its cluster. The catalog's
// tenants.mode, the API's "mode" and the config's pools[].mode and
// provision.default_mode carry the same strings.
type Mode string

// Modes of isolation.
const (
	ModeDatabase Mode = "database" // a database of its own
	ModeSchema   Mode = "schema"   // a schema in its template's shared database
)

// Modes are the modes, in the order help texts name them.
var Modes = []Mode{ModeDatabase, ModeSchema}

// Valid reports whether m is one of Modes.
func (m Mode) Valid() bool { return m == ModeDatabase || m == ModeSchema }
