package tenant

import (
	"fmt"
	"strings"

	"github.com/pgtenant/pgtenant/internal/cluster"
	"github.com/pgtenant/pgtenant/internal/config"
)

// ExtensionsSetting is the database setting that lists the extensions a
// database tenant may create itself: its tier's (config.Tier.Extensions).
// Only the database's owner, the admin role, may ALTER DATABASE SET it;
// the guard reads the stored value (pg_db_role_setting), not the session's,
// which the tenant may SET at will. SHOW shows the tenant its list.
const ExtensionsSetting = "pgtenant.extensions"

// ExtensionsSQL writes a database tenant's list of allowed extensions.
func ExtensionsSQL(database string, t config.Tier) string {
	return fmt.Sprintf("ALTER DATABASE %s SET %s = %s;\n", cluster.Ident(database), ExtensionsSetting,
		cluster.Literal(strings.Join(t.Extensions, ",")))
}

// ExtensionGuardSQL installs, in a database tenant's database, the event
// trigger that holds its CREATE EXTENSION to its list. A database tenant
// has CREATE on its database, with which PostgreSQL lets it create any
// trusted extension; at the end of each CREATE EXTENSION the guard undoes
// it unless the extension, and each one it requires (CASCADE), is listed.
// Sessions of superusers (pgtenant's own) and of the tenant's agent (a
// template version's migration, a move's or a rewind's restore of what
// the tenant has) pass.
//
// Both objects are the admin's, where tenants cannot write (pg_catalog):
// the tenant can neither alter, replace, drop nor disable them
// (session_replication_role, which would, is a superuser's setting). The
// function runs as the admin (SECURITY DEFINER, to read the stored
// setting) with a search path of pg_catalog alone, every name qualified,
// and takes nothing from the tenant but the names of the extensions it
// made; EXECUTE is nobody's (an event trigger calls it regardless).
var ExtensionGuardSQL = fmt.Sprintf(`CREATE OR REPLACE FUNCTION pg_catalog.pgt_extension_guard() RETURNS event_trigger
	LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $guard$
DECLARE
	allowed text[];
	refused text[];
BEGIN
	IF pg_catalog.starts_with(session_user::text, %[1]s)
		OR (SELECT r.rolsuper FROM pg_catalog.pg_roles r WHERE r.rolname = session_user) THEN
		RETURN;
	END IF;
	SELECT pg_catalog.string_to_array(pg_catalog.substr(c, pg_catalog.length(%[2]s) + 1), ',') INTO allowed
		FROM pg_catalog.pg_db_role_setting s, pg_catalog.unnest(s.setconfig) c
		WHERE s.setrole = 0 AND pg_catalog.starts_with(c, %[2]s)
			AND s.setdatabase = (SELECT d.oid FROM pg_catalog.pg_database d WHERE d.datname = pg_catalog.current_database());
	allowed := pg_catalog.array_cat(coalesce(allowed, '{}'), '{plpgsql}');
	WITH RECURSIVE made(name) AS (
		SELECT e.extname::text FROM pg_catalog.pg_event_trigger_ddl_commands() c
			JOIN pg_catalog.pg_extension e ON e.oid = c.objid
		WHERE c.object_type = 'extension'
		UNION
		SELECT r::text FROM made
			JOIN pg_catalog.pg_extension e ON e.extname = made.name
			JOIN pg_catalog.pg_available_extension_versions v ON v.name = e.extname AND v.version = e.extversion,
			pg_catalog.unnest(v.requires) r
	)
	SELECT pg_catalog.array_agg(name ORDER BY name) INTO refused FROM made WHERE NOT (name = ANY (allowed));
	IF refused IS NOT NULL THEN
		RAISE EXCEPTION USING ERRCODE = 'insufficient_privilege',
			MESSAGE = pg_catalog.format('extension %%s is not allowed for this tenant', pg_catalog.array_to_string(refused, ', ')),
			DETAIL = pg_catalog.format('The tenant''s tier allows %%s.', coalesce(nullif(pg_catalog.array_to_string(allowed[1:pg_catalog.cardinality(allowed) - 1], ', '), ''), 'none')),
			HINT = 'SHOW %[3]s lists them; the operator sets them per tier (tiers.<tier>.extensions in pgtenant''s configuration).';
	END IF;
END
$guard$;
REVOKE ALL ON FUNCTION pg_catalog.pgt_extension_guard() FROM PUBLIC;
DO $do$ BEGIN
	IF NOT EXISTS (SELECT 1 FROM pg_catalog.pg_event_trigger WHERE evtname = 'pgt_extension_guard') THEN
		CREATE EVENT TRIGGER pgt_extension_guard ON ddl_command_end WHEN TAG IN ('CREATE EXTENSION')
			EXECUTE FUNCTION pg_catalog.pgt_extension_guard();
	END IF;
END $do$;
`, cluster.Literal(AgentPrefix), cluster.Literal(ExtensionsSetting+"="), ExtensionsSetting)
