package catalog

import (
	"strconv"
	"strings"
	"testing"

	"github.com/pgtenant/pgtenant/internal/pgtest"
)

var pg *pgtest.Cluster

func TestMain(m *testing.M) { pgtest.Main(m, pgtest.Options{}, &pg) }

// TestListTenants_FiltersReachTheirIndexes: at a million tenants a search
// and a cluster's page scanned the table while their filters were folded
// into "the parameter is empty OR …" (bench density: search p95 327 ms → 0.6 ms once only
// the filters given reach the statement). With sequential scans off, the
// generic plan of ListTenants's statement for a search uses the trigram indexes
// (and the id's), a cluster's page its (cluster, id) index; and the search
// finds by part of a name or external id, with LIKE's wildcards matched as
// themselves; several states are listed at once (the front door's read),
// spares only when asked for.
func TestListTenants_FiltersReachTheirIndexes(t *testing.T) {
	ctx := pgtest.Context(t)
	s, err := Open(ctx, pg.PrimaryDSN(pg.NewDatabase(t)), nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.Close)
	if _, err := s.pool.Exec(ctx, `INSERT INTO clusters (name, kind, dsn) VALUES ('c1', 'external', 'postgres://nobody@127.0.0.1:9/postgres');
		INSERT INTO templates (name, current_version) VALUES ('tiny', 1);
		INSERT INTO tenants (id, name, external_id, mode, cluster, template, version, state, database)
		VALUES ('t1', 'Acme 100% Ltd', 'ext-acme', 'schema', 'c1', 'tiny', 1, 'active', 'shared'),
		       ('t2', 'Globex', 'ext-globex', 'schema', 'c1', 'tiny', 1, 'active', 'shared'),
		       ('t3', 'Initech', NULL, 'schema', 'c1', 'tiny', 1, 'suspended', 'shared'),
		       ('t4', '', NULL, 'schema', 'c1', 'tiny', 1, 'spare', 'shared')`); err != nil {
		t.Fatal(err)
	}
	for i, tc := range []struct {
		f     TenantFilter
		index []string
	}{
		{TenantFilter{Search: "acme", Limit: 100}, []string{"tenants_name_trgm", "tenants_external_id_trgm"}},
		{TenantFilter{Cluster: "c1", Limit: 100}, []string{"tenants_cluster_id"}},
	} {
		q, args := listTenantsQuery(tc.f)
		// EXECUTE's arguments cannot be parameters of an EXPLAIN: literals.
		params := make([]string, len(args))
		for i, a := range args {
			switch v := a.(type) {
			case string:
				params[i] = "'" + strings.ReplaceAll(v, "'", "''") + "'"
			case int:
				params[i] = strconv.Itoa(v)
			default:
				t.Fatalf("argument %d of %T", i, a)
			}
		}
		tx, err := s.pool.Begin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		// A generic plan, as pgx's statement cache gets after five runs: a
		// filter folded into "$n = '' OR …" is not simplified away there.
		// One simple query, sent as it is ($n are the prepared statement's).
		// Plain index scans off too: on a table this small, the id's index
		// in ORDER BY id order would do, whatever the filter.
		results, err := tx.Conn().PgConn().Exec(ctx, `SET LOCAL enable_seqscan = off; SET LOCAL enable_indexscan = off; SET LOCAL plan_cache_mode = force_generic_plan;
			PREPARE listed`+strconv.Itoa(i)+` AS `+q+`; EXPLAIN EXECUTE listed`+strconv.Itoa(i)+`(`+strings.Join(params, ", ")+`)`).ReadAll()
		var lines []string
		if err == nil {
			for _, r := range results[len(results)-1].Rows {
				lines = append(lines, string(r[0]))
			}
		}
		tx.Rollback(ctx)
		if err != nil {
			t.Fatal(err)
		}
		plan := strings.Join(lines, "\n")
		for _, ix := range tc.index {
			if !strings.Contains(plan, ix) {
				t.Errorf("%+v: the plan does not use %s:\n%s", tc.f, ix, plan)
			}
		}
	}
	// The front door's one read of what it serves: several states at once.
	for f, want := range map[*TenantFilter]string{
		{Search: "cme 100"}: "t1", {Search: "EXT-GLOB"}: "t2", {Search: "100%"}: "t1", {Search: "1_0"}: "",
		{States: []TenantState{StateSuspended, StateSpare}, Front: "c1"}: "t3t4", {}: "t1t2t3",
	} {
		ts, err := s.ListTenants(ctx, *f)
		if err != nil {
			t.Fatal(err)
		}
		got := ""
		for _, tn := range ts {
			got += tn.ID
		}
		if got != want {
			t.Errorf("%+v listed %q, want %q", *f, got, want)
		}
	}
}
