package metrics

import (
	"context"
	"strings"
	"time"

	"github.com/pgtenant/pgtenant/internal/cluster"
)

// SchemaSizes and SchemaSizesSQL are the schema tenants' size query, over a
// definition of their objects and as the collector runs it; SchemaObjects
// is the collector's definition; Forks leaves out the forks a relation
// cannot have.
var SchemaSizes, SchemaSizesSQL, SchemaObjects, Forks = schemaSizes, schemaSizesSQL, schemaObjectsByDependency, forks

// SchemaObjectsQuery lists a definition's objects ($1: the schemas), one
// row each: tenant, catalog and oid.
func SchemaObjectsQuery(definition string) string {
	q := schemaSizes(definition)
	return q[:strings.Index(q, "files (name, path")] + `_ AS (SELECT 1)
		SELECT name || ' pg_class ' || oid::pg_catalog.regclass::text || ' ' || relkind::text FROM relations
		UNION ALL SELECT name || ' ' || classid::pg_catalog.regclass::text || ' ' || objid::text FROM owned`
}

// Round is one round of the collector's loop over clusters, in their order.
func (c *Collector) Round(ctx context.Context, clusters []*cluster.Cluster, timeout time.Duration) []error {
	return c.round(ctx, clusters, timeout)
}
