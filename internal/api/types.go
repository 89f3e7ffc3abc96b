package api

import (
	"time"

	"github.com/pgtenant/pgtenant/internal/analytics"
	"github.com/pgtenant/pgtenant/internal/backup"
	"github.com/pgtenant/pgtenant/internal/catalog"
	"github.com/pgtenant/pgtenant/internal/cluster"
	"github.com/pgtenant/pgtenant/internal/jobs"
	"github.com/pgtenant/pgtenant/internal/patroni"
	"github.com/pgtenant/pgtenant/internal/provision"
	"github.com/pgtenant/pgtenant/internal/templates"
)

// Wire types shared by the server, the Go client (CLI, tests) and the console.

// ErrorBody is the JSON body of every error response.
type ErrorBody struct {
	Error ErrorDetail `json:"error"`
}

// ErrorDetail says what went wrong and, where it can, what to do.
type ErrorDetail struct {
	Code    string `json:"code"` // not_found, invalid, conflict, unavailable, unauthorized, internal
	Message string `json:"message"`
}

// Cluster is a registered cluster as listed.
type Cluster struct {
	Name     string                 `json:"name"`
	Kind     string                 `json:"kind"`   // managed or external
	DSN      string                 `json:"dsn"`    // password redacted
	Status   string                 `json:"status"` // up, down
	Error    string                 `json:"error,omitempty"`
	Standbys []cluster.StandbyState `json:"standbys"`
	// Patroni are the REST APIs of the Patroni nodes that run the cluster,
	// whose leader pgtenant follows; none: pgtenant connects to the DSN.
	Patroni   []string  `json:"patroni,omitempty"`
	CreatedAt time.Time `json:"created_at"`
	// The placement policy set on it, and what it holds: tenants (not
	// spares) and their sizes as last sampled.
	catalog.Placement
	Tenants   int   `json:"tenants"`
	SizeBytes int64 `json:"size_bytes"`
}

// ClusterDetail is `cluster show`.
type ClusterDetail struct {
	Cluster
	Info *cluster.Info `json:"info,omitempty"`
	// Members are a Patroni cluster's nodes as Patroni sees them (role,
	// state, timeline, lag), by name; SynchronousMode: a commit is
	// acknowledged once the sync_standby has it. PatroniError: Patroni
	// did not answer.
	Members         []patroni.Member `json:"members,omitempty"`
	SynchronousMode bool             `json:"synchronous_mode,omitempty"`
	PatroniError    string           `json:"patroni_error,omitempty"`
}

// SwitchoverRequest changes the leader of a cluster Patroni runs.
type SwitchoverRequest struct {
	// To is the member to promote. A switchover may leave it out (Patroni
	// then promotes the synchronous standby, or the healthiest replica); a
	// failover needs it.
	To string `json:"to,omitempty"`
}

// AddClusterRequest registers an external cluster.
type AddClusterRequest struct {
	Name     string   `json:"name"`
	DSN      string   `json:"dsn"`
	Standbys []string `json:"standbys,omitempty"`
	// Patroni are the REST APIs (http://host:port) of the Patroni nodes
	// that run the cluster: pgtenant connects to their leader, with the
	// DSN's role, password, database and options, and follows it on a
	// failover. The standbys are then Patroni's replicas (no Standbys).
	Patroni []string `json:"patroni,omitempty"`
}

// Health is /healthz.
type Health struct {
	Status   string            `json:"status"`   // ok; degraded (a cluster is down); down (the catalog is: 503)
	Catalog  string            `json:"catalog"`  // ok, or down: the cause
	Clusters map[string]string `json:"clusters"` // by name: ok, or down: the cause (from the last probe)
	Version  string            `json:"version"`
}

// CreateTemplateRequest uploads a template's files (create or push).
type CreateTemplateRequest struct {
	Name  string             `json:"name,omitempty"` // create only; push takes it from the path
	Files []templates.Upload `json:"files"`
}

// TemplateSummary is a template as listed.
type TemplateSummary struct {
	Name string `json:"name"`
	// CurrentVersion is the newest version built on every cluster, the one
	// new tenants get (0: none yet); LatestVersion the newest stored.
	CurrentVersion int       `json:"current_version"`
	LatestVersion  int       `json:"latest_version"`
	Deleting       bool      `json:"deleting,omitempty"`
	CreatedAt      time.Time `json:"created_at"`
}

func templateSummary(t catalog.Template) TemplateSummary {
	return TemplateSummary{Name: t.Name, CurrentVersion: t.CurrentVersion, LatestVersion: t.LatestVersion, Deleting: t.Deleting, CreatedAt: t.CreatedAt}
}

// TemplateDetail is `template show`.
type TemplateDetail struct {
	TemplateSummary
	// Versions with their state (building, ready, failed) and, for a
	// failed one, its build's error.
	Versions []catalog.TemplateVersion `json:"versions"`
	Builds   []catalog.TemplateBuild   `json:"builds"`
	// Tenants counts active, suspended and dropped tenants by version ("1": 12).
	Tenants map[string]int `json:"tenants_by_version"`
	// Pools are its spare pools, by cluster and mode.
	Pools []provision.PoolStatus `json:"pools"`
}

// Tenant is a tenant as the API shows it: never its password.
type Tenant struct {
	catalog.Tenant
	DSN string `json:"dsn"` // without the password; the pooler's when the cluster has one
	// DirectDSN is the primary's own (without the password): for tools
	// that need a session on the server, e.g. migrations behind a
	// transaction-mode pool.
	DirectDSN string          `json:"direct_dsn"`
	Events    []catalog.Event `json:"events,omitempty"`
	Prewarm   *TenantPrewarm  `json:"prewarm,omitempty"` // in show only
	Metrics   *TenantMetrics  `json:"metrics,omitempty"` // figures (list, show) and quota (show)
	// Analytics is the tenant's columnar mirror (show only): its state
	// and DSN (the tenant's own login, on the analytics port).
	Analytics *analytics.Status `json:"analytics,omitempty"`
	// RecoveryWindow is the times the tenant can be rewound or forked to
	// (show only, when its cluster is backed up): from its creation, or its
	// cluster's oldest backup, to the newest WAL archived.
	RecoveryWindow *backup.Window `json:"recovery_window,omitempty"`
}

// CreateTenantResponse answers POST /v1/tenants.
type CreateTenantResponse struct {
	Tenant    Tenant    `json:"tenant"`
	DSN       string    `json:"dsn"`                // with the password when it is shown; the pooler's when the cluster has one
	DirectDSN string    `json:"direct_dsn"`         // the primary's, with the password when it is shown
	Password  string    `json:"password,omitempty"` // at creation, and to a retry within credentials.retry_window
	Existing  bool      `json:"existing"`           // an earlier request with this external id created it
	Path      string    `json:"path,omitempty"`     // pool or cold
	Job       *jobs.Job `json:"job,omitempty"`      // still provisioning: poll this job
	Note      string    `json:"note,omitempty"`     // why a retry carries no password (window ended, another daemon's key)
}

// RewindTenantRequest asks POST /v1/tenants/{id}/rewind to take a tenant
// back to a time, in place; the answer is its job (202).
type RewindTenantRequest struct {
	To time.Time `json:"to"`
}

// ArchiveType is the media type of a tenant's archive: what POST
// /v1/tenants/{id}/export answers and POST /v1/tenants/import takes.
const ArchiveType = "application/x-tar"

// ImportTenantQuery is where POST /v1/tenants/import puts the new tenant
// (its query parameters).
type ImportTenantQuery struct {
	Cluster, Tier string
	Name          *string
}

// ForkTenantRequest asks POST /v1/tenants/{id}/fork for a new tenant
// holding the tenant's data as of At (absent: now). The answer (202) is a
// create's, the new tenant's credentials included, with the job that
// copies the data; the new tenant is suspended until that job succeeds.
type ForkTenantRequest struct {
	At   *time.Time `json:"at,omitempty"`
	Name *string    `json:"name,omitempty"`
	Tier string     `json:"tier,omitempty"`
}

// MoveTenantRequest asks POST /v1/tenants/{id}/move to move a tenant to
// another cluster; the answer is its job (202).
type MoveTenantRequest struct {
	To string `json:"to"`
}

// SetTenantRequest asks PATCH /v1/tenants/{id} to change a tenant: its
// tier or its labels, and its allowlist. The answer is a
// LifecycleResponse: 200 when the change was made in place, 202 with the
// job of the move that carries the tenant to a cluster its new tier or
// labels need (the tier is the new one once the move switches).
type SetTenantRequest struct {
	Tier string `json:"tier,omitempty"`
	// Allow: the client networks (CIDR, or addresses) the tenant's logins
	// may come from through the front door; [] allows any; absent: as it is.
	Allow *[]string `json:"allow,omitempty"`
	// Labels pin the tenant to clusters carrying each (k=v); [] unpins;
	// absent: as it is.
	Labels *[]string `json:"labels,omitempty"`
}

// RotatePasswordRequest asks POST /v1/tenants/{id}/password for a new
// password; an empty body is the defaults.
type RotatePasswordRequest struct {
	// KeepSessions leaves the tenant's sessions open (they logged in
	// already); by default they are ended on every node.
	KeepSessions bool `json:"keep_sessions,omitempty"`
}

// RotatePasswordResponse answers POST /v1/tenants/{id}/password.
type RotatePasswordResponse struct {
	Tenant        Tenant `json:"tenant"`
	DSN           string `json:"dsn"`        // with the new password; the pooler's when the cluster has one
	DirectDSN     string `json:"direct_dsn"` // the primary's, with the new password
	Password      string `json:"password"`   // the old one no longer works
	SessionsEnded int    `json:"sessions_ended"`
	// Note says when a standby had not taken the new password in time.
	Note string `json:"note,omitempty"`
}

// LifecycleResponse answers drop, restore, suspend, resume and a tier change.
type LifecycleResponse struct {
	Tenant Tenant    `json:"tenant"`
	Job    *jobs.Job `json:"job,omitempty"` // the purge, when one started; a tier change's move
}

// RetryRolloutRequest reruns a rollout's failed tenants, or only Tenant.
type RetryRolloutRequest struct {
	Tenant string `json:"tenant,omitempty"`
}
