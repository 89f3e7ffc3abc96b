package cluster

import (
	"context"
	"fmt"
)

// Info is what `cluster show` reports beyond Health: the settings that matter
// for a tenant fleet and the extensions pgtenant uses.
type Info struct {
	Health
	RelationFiles int64                     `json:"relation_files"` // files under base/, counted server-side
	Settings      map[string]string         `json:"settings"`
	Extensions    map[string]ExtensionState `json:"extensions"`
}

// ExtensionState says whether an extension can be and is installed.
type ExtensionState struct {
	Available bool   `json:"available"`
	Installed string `json:"installed_version,omitempty"` // in the maintenance database
}

// FleetSettings are the server settings `cluster show` and `doctor` report.
var FleetSettings = []string{
	"max_connections", "max_locks_per_transaction", "max_files_per_process", "shared_buffers",
	"wal_level", "shared_preload_libraries", "max_wal_senders", "hot_standby_feedback",
	"checkpoint_timeout", "max_wal_size", "autovacuum", "autovacuum_max_workers", "data_checksums",
}

// Extensions pgtenant uses: pg_prewarm to prewarm, pg_buffercache to capture hot sets.
var Extensions = []string{"pg_prewarm", "pg_buffercache"}

// Info probes health and reads settings, extensions and the number of relation
// files (pg_ls_dir over each database directory: one query, but it lists every
// file, so it is for `show` and `doctor`, not for a hot path).
func (c *Cluster) Info(ctx context.Context) (Info, error) {
	h, err := c.Probe(ctx)
	if err != nil {
		return Info{}, err
	}
	in := Info{Health: h, Settings: map[string]string{}, Extensions: map[string]ExtensionState{}}
	p, err := c.Admin(ctx)
	if err != nil {
		return Info{}, err
	}
	rows, err := p.Query(ctx, `SELECT name, current_setting(name) FROM pg_settings WHERE name = ANY($1)`, FleetSettings)
	if err != nil {
		return Info{}, fmt.Errorf("read settings of %s: %w", c.name, Classify(err))
	}
	for rows.Next() {
		var k, v string
		if err := rows.Scan(&k, &v); err != nil {
			return Info{}, err
		}
		in.Settings[k] = v
	}
	if err := rows.Err(); err != nil {
		return Info{}, err
	}
	for _, e := range Extensions {
		in.Extensions[e] = ExtensionState{}
	}
	rows, err = p.Query(ctx, `SELECT name, coalesce(installed_version, '') FROM pg_available_extensions WHERE name = ANY($1)`, Extensions)
	if err != nil {
		return Info{}, fmt.Errorf("read extensions of %s: %w", c.name, Classify(err))
	}
	for rows.Next() {
		var name, inst string
		if err := rows.Scan(&name, &inst); err != nil {
			return Info{}, err
		}
		in.Extensions[name] = ExtensionState{Available: true, Installed: inst}
	}
	if err := rows.Err(); err != nil {
		return Info{}, err
	}
	// Needs superuser or pg_read_server_files; an unprivileged admin gets -1.
	err = p.QueryRow(ctx, `SELECT count(*) FROM pg_database d, pg_ls_dir('base/' || d.oid, true, false) f`).Scan(&in.RelationFiles)
	if err != nil {
		in.RelationFiles = -1
	}
	return in, nil
}
