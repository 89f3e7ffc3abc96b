package jobs

import (
	"fmt"
	"strings"
)

// Type names a kind of job: the catalog's jobs.type, the key a handler is
// registered under. Every type is named here, not in the workflow that
// handles it, so that a package which only reads jobs (doctor, the API, the
// CLI, the console) needs no import of the workflow.
type Type string

// Job types, one per workflow handler.
const (
	TemplateBuild  Type = "template.build"   // materialise a template version on a cluster (templates)
	TemplateDelete Type = "template.delete"  // remove a template that has no tenants (templates)
	Rollout        Type = "template.rollout" // move a template's tenants to a version (migrate)
	TenantBuild    Type = "tenant.build"     // build a spare, or a tenant on the cold path (provision)
	TenantPurge    Type = "tenant.purge"     // remove a dropped tenant or a leftover (purge)
	TenantMove     Type = "tenant.move"      // move a tenant to another cluster (move)
	Prewarm        Type = "cluster.prewarm"  // load the hot sets of one node (prewarm)
	ClusterDrain   Type = "cluster.drain"    // move a draining cluster's tenants away (placement)
	Rebalance      Type = "fleet.rebalance"  // run a rebalance's planned moves (placement)
	ClusterBackup  Type = "cluster.backup"   // take one pgBackRest backup of a cluster (backup)
	TenantFork     Type = "tenant.fork"      // copy a tenant as of a time into a new tenant (move)
	TenantRewind   Type = "tenant.rewind"    // take a tenant back to a time, in place (move)
	TenantImport   Type = "tenant.import"    // copy an exported tenant's archive into a new tenant (move)
	// ClusterSwitchover changes the leader of a cluster Patroni runs, its
	// front door paused meanwhile (failover).
	ClusterSwitchover Type = "cluster.switchover"
)

// Types are the job types, the ones List's filter takes.
var Types = []Type{TemplateBuild, TemplateDelete, Rollout, TenantBuild, TenantPurge, TenantMove, Prewarm, ClusterDrain, Rebalance, ClusterBackup, TenantFork, TenantRewind, TenantImport, ClusterSwitchover}

// maxListed bounds the items a job's message names.
const maxListed = 10

// Listed joins items for a job's result or error with sep, naming at most
// ten of them and how many more there are.
func Listed(items []string, sep string) string {
	if len(items) > maxListed {
		return strings.Join(items[:maxListed], sep) + fmt.Sprintf("%sand %d more", sep, len(items)-maxListed)
	}
	return strings.Join(items, sep)
}
