// Package prewarm brings hot tenants back to warm speed after a restart, a
// failover or a resume. It captures each tenant's hot set (block ranges of
// its relations, from pg_buffercache on every node) into the catalog, and
// prewarm jobs load those blocks back with pg_prewarm, tenants in priority
// order (tier, then activity), into free shared buffers only — so that a
// colder tenant never evicts a hotter one's blocks — and beyond that budget
// into the OS cache. It never writes inside a tenant's schema.
package prewarm

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sort"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pgtenant/pgtenant/internal/catalog"
	"github.com/pgtenant/pgtenant/internal/cluster"
	"github.com/pgtenant/pgtenant/internal/config"
	"github.com/pgtenant/pgtenant/internal/jobs"
	"github.com/pgtenant/pgtenant/internal/tenant"
)

// Service captures hot sets and prewarms.
type Service struct {
	Store    *catalog.Store
	Clusters *cluster.Registry
	Runner   *jobs.Runner
	Prewarm  config.PrewarmConfig
	Tiers    map[string]config.Tier // a tier's priority orders a node's tenants
	Logger   *slog.Logger

	// beforeStore, if set, runs between reading the buffer cache and storing
	// the hot sets (tests interrupt a capture there).
	beforeStore func(ctx context.Context) error
}

// Range is a run of consecutive blocks of one relation fork in the cache.
type Range = catalog.BlockRange

// HotSet is one tenant's hot blocks on one node.
type HotSet = catalog.HotSet

// CaptureResult summarises one capture of a node.
type CaptureResult struct {
	Cluster string `json:"cluster"`
	Node    string `json:"node"`
	Tenants int    `json:"tenants"`
	Blocks  int64  `json:"blocks"`
	Skipped string `json:"skipped,omitempty"` // why no capture was made
}

// Capture reads the buffer cache of one node and replaces that node's hot
// sets in one catalog transaction: a capture that fails or is interrupted
// leaves the previous hot sets intact. It does not run while a prewarm of
// the cluster is in progress, nor on a node that restarted since pgtenant
// last looked (its cache is cold: the prewarm comes first).
func (s *Service) Capture(ctx context.Context, cl *cluster.Cluster, node string) (CaptureResult, error) {
	res := CaptureResult{Cluster: cl.Name(), Node: node}
	if busy, err := s.prewarmRunning(ctx, cl.Name()); err != nil || busy {
		if busy {
			res.Skipped = "a prewarm of the cluster is in progress"
		}
		return res, err
	}
	conn, err := cl.ConnectNode(ctx, node, cl.MaintenanceDB())
	if err != nil {
		return res, err
	}
	defer conn.Close(context.WithoutCancel(ctx))
	id, err := identity(ctx, conn)
	if err != nil {
		return res, err
	}
	seen, err := s.Store.GetPrewarmNode(ctx, cl.Name(), node)
	if err == nil && seen.PostmasterStart != nil && !seen.PostmasterStart.Equal(id.start) {
		res.Skipped = "the node restarted and has not been prewarmed yet"
		return res, nil
	}
	view, err := ensureBufferCache(ctx, conn, node)
	if err != nil {
		return res, err
	}
	sets, err := s.readCache(ctx, cl, node, conn, view)
	if err != nil {
		return res, err
	}
	if s.beforeStore != nil {
		if err := s.beforeStore(ctx); err != nil {
			return res, err
		}
	}
	all := make([]HotSet, 0, len(sets))
	for _, h := range sets {
		all = append(all, *h)
		res.Blocks += h.Blocks
	}
	res.Tenants, err = s.Store.ReplaceHotSets(ctx, cl.Name(), node, id.start, id.timeline, time.Now(), all)
	if err != nil {
		return res, fmt.Errorf("store hot sets of %s/%s: %w", cl.Name(), node, err)
	}
	return res, nil
}

// nodeID is what identifies a node's life: a restart changes the start time,
// a promotion the timeline.
type nodeID struct {
	start    time.Time
	timeline int
}

func identity(ctx context.Context, conn *pgx.Conn) (nodeID, error) {
	var id nodeID
	err := conn.QueryRow(ctx, `SELECT pg_postmaster_start_time(), timeline_id FROM pg_control_checkpoint()`).Scan(&id.start, &id.timeline)
	return id, cluster.Classify(err)
}

// ensureBufferCache installs pg_buffercache in the maintenance database of a
// primary (a standby gets it by replication) and returns the qualified name
// of its view.
func ensureBufferCache(ctx context.Context, conn *pgx.Conn, node string) (string, error) {
	if node == "primary" {
		if err := cluster.InstallExtension(ctx, conn, "pg_buffercache", node); err != nil {
			return "", err
		}
	}
	schema, err := cluster.ExtensionSchema(ctx, conn, "pg_buffercache")
	if errors.Is(err, cluster.ErrNotFound) {
		return "", fmt.Errorf("pg_buffercache is not installed on %s; it is created on the primary and replicates", node)
	}
	return schema + ".pg_buffercache", err
}

// readCache groups the node's buffer cache into ranges and attributes them
// to tenants: by database for database tenants, by the relation's schema
// (one catalog query per shared database) for schema tenants.
func (s *Service) readCache(ctx context.Context, cl *cluster.Cluster, node string, conn *pgx.Conn, view string) (map[string]*HotSet, error) {
	rows, err := conn.Query(ctx, `
		SELECT d.datname, r.relfilenode, r.fork, r.first, r.last, r.usage
		FROM (SELECT reldatabase, relfilenode, relforknumber AS fork,
		             min(relblocknumber) AS first, max(relblocknumber) AS last, sum(usagecount) AS usage
		      FROM (SELECT reldatabase, relfilenode, relforknumber, relblocknumber, usagecount,
		                   relblocknumber - row_number() OVER (PARTITION BY reldatabase, relfilenode, relforknumber
		                                                       ORDER BY relblocknumber) AS grp
		            FROM `+view+` WHERE reldatabase IS NOT NULL AND reldatabase <> 0) b
		      GROUP BY reldatabase, relfilenode, relforknumber, grp) r
		JOIN pg_database d ON d.oid = r.reldatabase
		WHERE d.datname LIKE 't\_%' OR d.datname LIKE 'pgt\_shared\_%'`)
	if err != nil {
		return nil, fmt.Errorf("read pg_buffercache on %s/%s: %w", cl.Name(), node, cluster.Classify(err))
	}
	type raw struct {
		db string
		r  Range
	}
	var all []raw
	for rows.Next() {
		var x raw
		var filenode uint32
		if err := rows.Scan(&x.db, &filenode, &x.r.Fork, &x.r.First, &x.r.Last, &x.r.Usage); err != nil {
			return nil, err
		}
		x.r.Filenode = filenode
		all = append(all, x)
	}
	if err := rows.Err(); err != nil {
		return nil, err
	}
	schemaOf := map[string]map[uint32]string{} // shared db → filenode → schema
	sets := map[string]*HotSet{}
	for _, x := range all {
		var id string
		if strings.HasPrefix(x.db, "pgt_shared_") {
			m, ok := schemaOf[x.db]
			if !ok {
				if m, err = s.schemaFilenodes(ctx, cl, node, x.db); err != nil {
					return nil, err
				}
				schemaOf[x.db] = m
			}
			if id, ok = tenant.IDFromPhysical(m[x.r.Filenode]); !ok {
				continue // a template's own or pgtenant's object
			}
		} else if id, _ = tenant.IDFromPhysical(x.db); id == "" {
			continue
		}
		h := sets[id]
		if h == nil {
			h = &HotSet{Tenant: id, Cluster: cl.Name(), Node: node}
			sets[id] = h
		}
		h.Ranges = append(h.Ranges, x.r)
		h.Blocks += x.r.Blocks()
		h.Usage += x.r.Usage
	}
	if err := s.readCounters(ctx, cl, node, conn, sets, schemaOf); err != nil {
		return nil, err
	}
	for _, h := range sets {
		// Hottest first: by usage per block, then by size.
		sort.Slice(h.Ranges, func(i, j int) bool {
			a, b := h.Ranges[i], h.Ranges[j]
			da, db := float64(a.Usage)/float64(a.Blocks()), float64(b.Usage)/float64(b.Blocks())
			if da != db {
				return da > db
			}
			return a.Blocks() > b.Blocks()
		})
	}
	return sets, nil
}

// readCounters reads how many blocks each tenant has hit or read (the
// statistics views): pg_stat_database for database tenants, one
// pg_statio_user_tables aggregate per shared database for schema tenants.
func (s *Service) readCounters(ctx context.Context, cl *cluster.Cluster, node string, conn *pgx.Conn,
	sets map[string]*HotSet, shared map[string]map[uint32]string) error {
	rows, err := conn.Query(ctx, `SELECT datname, blks_hit + blks_read FROM pg_stat_database WHERE datname LIKE 't\_%'`)
	if err != nil {
		return cluster.Classify(err)
	}
	for rows.Next() {
		var db string
		var n int64
		if err := rows.Scan(&db, &n); err != nil {
			return err
		}
		if id, ok := tenant.IDFromPhysical(db); ok && sets[id] != nil {
			sets[id].Counter = n
		}
	}
	if err := rows.Err(); err != nil {
		return err
	}
	for db := range shared {
		c, err := cl.ConnectNode(ctx, node, db)
		if err != nil {
			return err
		}
		rows, err := c.Query(ctx, `SELECT schemaname, pg_catalog.sum(coalesce(heap_blks_hit, 0) + coalesce(heap_blks_read, 0)
			+ coalesce(idx_blks_hit, 0) + coalesce(idx_blks_read, 0) + coalesce(toast_blks_hit, 0) + coalesce(toast_blks_read, 0))::bigint
			FROM pg_catalog.pg_statio_user_tables WHERE schemaname LIKE 't\_%' GROUP BY schemaname`)
		if err != nil {
			c.Close(ctx)
			return cluster.Classify(err)
		}
		for rows.Next() {
			var schema string
			var n int64
			if err := rows.Scan(&schema, &n); err != nil {
				c.Close(ctx)
				return err
			}
			if id, ok := tenant.IDFromPhysical(schema); ok && sets[id] != nil {
				sets[id].Counter = n
			}
		}
		err = rows.Err()
		c.Close(ctx)
		if err != nil {
			return err
		}
	}
	return nil
}

// schemaFilenodes maps the files of a shared database's relations (with
// their TOAST tables and TOAST indexes) to the schema of the relation.
func (s *Service) schemaFilenodes(ctx context.Context, cl *cluster.Cluster, node, db string) (map[uint32]string, error) {
	conn, err := cl.ConnectNode(ctx, node, db)
	if err != nil {
		return nil, err
	}
	defer conn.Close(context.WithoutCancel(ctx))
	rows, err := conn.Query(ctx, `
		SELECT pg_catalog.pg_relation_filenode(x.oid), n.nspname
		FROM pg_catalog.pg_class c
		JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace AND n.nspname LIKE 't\_%'
		CROSS JOIN LATERAL (VALUES (c.oid), (c.reltoastrelid),
		                           ((SELECT i.indexrelid FROM pg_catalog.pg_index i WHERE i.indrelid = c.reltoastrelid LIMIT 1))) x(oid)
		WHERE x.oid IS NOT NULL AND x.oid <> 0 AND pg_catalog.pg_relation_filenode(x.oid) IS NOT NULL`)
	if err != nil {
		return nil, cluster.Classify(err)
	}
	out := map[uint32]string{}
	for rows.Next() {
		var f uint32
		var schema string
		if err := rows.Scan(&f, &schema); err != nil {
			return nil, err
		}
		out[f] = schema
	}
	return out, rows.Err()
}

// NodeState is what pgtenant last saw of a node.
type NodeState = catalog.PrewarmNode

func (s *Service) prewarmRunning(ctx context.Context, clusterName string) (bool, error) {
	return jobs.Busy(ctx, s.Store.Pool(), jobs.Prewarm, clusterName)
}

// HotSets returns a tenant's hot sets, one per node.
func (s *Service) HotSets(ctx context.Context, tenantID string) ([]HotSet, error) {
	return s.Store.HotSets(ctx, tenantID)
}
