// Package provision creates tenants: it claims a pre-built spare in one
// short transaction (the hot path), builds a tenant from its template when
// the pool is empty (the cold path, a durable job), and keeps the spare
// pools full (pool.go). It never drops what it did not build.
package provision

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"sort"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pgtenant/pgtenant/internal/catalog"
	"github.com/pgtenant/pgtenant/internal/cluster"
	"github.com/pgtenant/pgtenant/internal/config"
	"github.com/pgtenant/pgtenant/internal/credentials"
	"github.com/pgtenant/pgtenant/internal/jobs"
	"github.com/pgtenant/pgtenant/internal/pooler"
	"github.com/pgtenant/pgtenant/internal/sandbox"
	"github.com/pgtenant/pgtenant/internal/templates"
	"github.com/pgtenant/pgtenant/internal/tenant"
)

// Service provisions tenants.
type Service struct {
	Store     *catalog.Store
	Clusters  *cluster.Registry
	Runner    *jobs.Runner
	Templates *templates.Service
	Agents    *sandbox.Agents
	Provision config.ProvisionConfig
	Tiers     map[string]config.Tier
	Pools     []config.PoolConfig
	// RolloutConnections is what a rollout holds of a cluster's
	// connections (migrate.per_cluster), counted by admission.
	RolloutConnections int
	// BatchRelations is how many relations a half-built schema's drop
	// takes per transaction (drop.batch_relations).
	BatchRelations int
	// PacerFor is each cluster's pacer budget (config.Config.PacerFor).
	PacerFor func(cluster string) config.PacerConfig
	Logger   *slog.Logger
	// ColdWait bounds how long Create waits for a cold build (and for a
	// template's first materialisation) before answering "still provisioning".
	ColdWait time.Duration
	// Pool is poked after each claim so that it refills; may be nil.
	Pool *Pool
	// Credentials keeps the password of a tenant created with an external
	// id for the retry window, and recalls it for a retried create; nil
	// keeps nothing.
	Credentials *credentials.Service
	// Poolers are the clusters' PgBouncers: a new tenant's entry is in its
	// cluster's pooler before Create answers, and its DSN points there.
	// nil: tenants connect directly.
	Poolers *pooler.Set

	placed placement
}

// Request asks for a tenant.
type Request struct {
	Template   string      `json:"template"`
	Mode       tenant.Mode `json:"mode,omitempty"`
	Name       *string     `json:"name,omitempty"`
	ExternalID string      `json:"external_id,omitempty"`
	Tier       string      `json:"tier,omitempty"`
	Cluster    string      `json:"cluster,omitempty"`
	// Labels pin the tenant to clusters that carry each of them (k=v):
	// where it is placed now and wherever it moves later.
	Labels []string `json:"labels,omitempty"`
}

// Created is the answer to Create.
type Created struct {
	Tenant   catalog.Tenant
	DSN      string    // includes the password when Password is set; the pooler's when the cluster has one
	Direct   string    // the DSN of the primary itself, with the password too
	Password string    // shown at creation, and to a retry within the retry window
	Existing bool      // an earlier request with the same external id made it
	Path     string    // pool or cold
	Job      *jobs.Job // the cold build, when it did not finish within ColdWait
	Note     string    // why a retry (Existing) carries no password
}

// ErrInvalid wraps errors in the request.
var ErrInvalid = errors.New("invalid tenant request")

func invalid(format string, args ...any) error {
	return fmt.Errorf("%w: %s", ErrInvalid, fmt.Sprintf(format, args...))
}

// Create provisions a tenant: from the pool when a spare is ready, else from
// the template. A retry with the same external id returns the first tenant;
// one that asks for other parameters is a conflict naming them.
func (s *Service) Create(ctx context.Context, req Request) (Created, error) {
	asked := req // as the caller set it, before the defaults: what a retry is held to
	if err := s.validate(&req); err != nil {
		return Created{}, err
	}
	if t, err := s.Store.GetTemplate(ctx, req.Template); err != nil {
		return Created{}, err
	} else if t.Deleting {
		return Created{}, fmt.Errorf("%w: template %s is being deleted", catalog.ErrConflict, req.Template)
	}
	if req.ExternalID != "" {
		if t, err := s.Store.TenantByExternalID(ctx, req.ExternalID); err == nil {
			return s.existing(ctx, asked, t)
		} else if !errors.Is(err, catalog.ErrNotFound) {
			return Created{}, err
		}
	}
	cl, err := s.place(ctx, req.Cluster, req.Tier, req.Labels)
	if err != nil {
		return Created{}, err
	}
	// The tenant's front door must serve before anything is created: a
	// create never answers success with a DSN that does not work, and a
	// refusal here leaves nothing behind (the client retries).
	if err := s.Poolers.Serving(ctx, cl.Name(), frontDoorWait); err != nil {
		return Created{}, fmt.Errorf("%w; no tenant was created: retry in a moment, or on another cluster", err)
	}
	version, err := s.version(ctx, req.Template, cl.Name())
	if err != nil {
		return Created{}, err
	}
	password, verifier := tenant.NewPassword()
	name := ""
	if req.Name != nil {
		name = *req.Name
	}
	want := catalog.Tenant{Name: name, ExternalID: req.ExternalID, Mode: req.Mode, Cluster: cl.Name(),
		Template: req.Template, Version: version, Tier: req.Tier, Pins: req.Labels}

	t, claimed, registered, err := s.claim(ctx, cl, want, password, verifier)
	if err == nil {
		s.Pool.Poke()
		out := Created{Tenant: t, Password: claimed, Path: "pool"}
		var front error
		if !registered {
			front = s.Poolers.Await(ctx, cl.Name())
		}
		s.answer(ctx, cl, t, claimed, front, &out)
		return out, nil
	}
	if errors.Is(err, catalog.ErrConflict) && req.ExternalID != "" {
		if t, err := s.Store.TenantByExternalID(ctx, req.ExternalID); err == nil {
			return s.existing(ctx, asked, t)
		}
	}
	if !errors.Is(err, catalog.ErrNotFound) {
		return Created{}, err
	}
	return s.cold(ctx, cl, asked, want, password, verifier)
}

func (s *Service) validate(req *Request) error {
	if err := templates.ValidName(req.Template); err != nil {
		return invalid("%v", err)
	}
	if req.Mode == "" {
		req.Mode = tenant.Mode(s.Provision.DefaultMode)
	}
	if !req.Mode.Valid() {
		return invalid("mode %q: use database or schema", req.Mode)
	}
	if req.Tier == "" {
		req.Tier = "default"
	}
	if _, ok := s.Tiers[req.Tier]; !ok {
		names := make([]string, 0, len(s.Tiers))
		for n := range s.Tiers {
			names = append(names, n)
		}
		sort.Strings(names)
		return invalid("unknown tier %q (configured tiers: %s)", req.Tier, strings.Join(names, ", "))
	}
	if req.Name != nil {
		if err := tenant.ValidateName(*req.Name); err != nil {
			return invalid("%v", err)
		}
	}
	if req.ExternalID != "" {
		if err := tenant.ValidateExternalID(req.ExternalID); err != nil {
			return invalid("%v", err)
		}
	}
	var err error
	req.Labels, err = ParsePins(req.Labels)
	return err
}

// maxPins bounds a tenant's pins.
const maxPins = 10

// ParsePins checks a tenant's pins (cluster labels, k=v) and returns them
// sorted, each once; nil for none.
func ParsePins(pins []string) ([]string, error) {
	if len(pins) > maxPins {
		return nil, invalid("labels: %d, at most %d", len(pins), maxPins)
	}
	var out []string
	keys := map[string]string{}
	for _, p := range pins {
		k, _, err := config.ParseLabel(p)
		if err != nil {
			return nil, invalid("%v", err)
		}
		if prev, ok := keys[k]; ok && prev != p {
			return nil, invalid("labels %s and %s: a cluster has one value per key", prev, p)
		}
		keys[k] = p
		if !slices.Contains(out, p) {
			out = append(out, p)
		}
	}
	slices.Sort(out)
	return out, nil
}

// existing answers a retry of a create whose external id names a tenant:
// the tenant with, within the retry window, its password (else a note
// saying why not), and while it is still being built, the build job to
// follow. A retry that asks for other parameters than the tenant has is a
// conflict (retried): the external id is someone else's tenant, or the
// client's request changed, and answering the tenant would hide either.
func (s *Service) existing(ctx context.Context, asked Request, t catalog.Tenant) (Created, error) {
	if err := retried(asked, t); err != nil {
		return Created{}, err
	}
	cl, err := s.Clusters.Get(t.Cluster)
	if err != nil {
		return Created{}, err
	}
	out := Created{Tenant: t, Existing: true}
	password, err := s.Credentials.Recall(ctx, t.ID)
	switch {
	case err == nil:
		out.Password = password
	case errors.Is(err, credentials.ErrNotKept):
		out.Note = fmt.Sprintf("created earlier with this external id; %v. Rotate it to get a new one: `pgtenant tenant password %s`", err, t.ID)
	case errors.Is(err, credentials.ErrCannotOpen):
		s.Logger.Warn("a retried create's kept password does not open here", "tenant", t.ID, "err", err)
		out.Note = fmt.Sprintf("created earlier with this external id; %v. Retry through a daemon with that key, "+
			"or rotate the password: `pgtenant tenant password %s`", err, t.ID)
	default:
		return Created{}, err
	}
	s.answer(ctx, cl, t, out.Password, s.Poolers.Serving(ctx, t.FrontCluster(), frontDoorWait), &out)
	if t.State == catalog.StateProvisioning {
		js, err := jobs.List(ctx, s.Store.Pool(), jobs.Filter{Type: jobs.TenantBuild, TargetKind: "tenant", Target: t.ID, Limit: 1})
		if err != nil {
			return Created{}, err
		}
		if len(js) == 1 {
			out.Job = &js[0]
		}
	}
	return out, nil
}

// retried checks a retry against the tenant its external id names: each
// parameter the retry sets (one it leaves empty takes the tenant's) must be
// the tenant's. The conflict names every one that differs, with both values.
func retried(asked Request, t catalog.Tenant) error {
	var diffs []string
	differs := func(field, asked, has string) {
		if asked != "" && asked != has {
			diffs = append(diffs, fmt.Sprintf("%s %q (this request: %q)", field, has, asked))
		}
	}
	differs("template", asked.Template, t.Template)
	differs("mode", string(asked.Mode), string(t.Mode))
	differs("tier", asked.Tier, t.Tier)
	if asked.Name != nil {
		differs("name", *asked.Name, t.Name)
	}
	differs("cluster", asked.Cluster, t.Cluster)
	if pins, err := ParsePins(asked.Labels); err == nil && pins != nil {
		differs("labels", strings.Join(pins, ","), strings.Join(t.Pins, ","))
	}
	if len(diffs) == 0 {
		return nil
	}
	return fmt.Errorf("%w: external id %q is tenant %s, which has %s: use another external id for a new tenant, "+
		"or repeat the original parameters to get this one", catalog.ErrConflict, t.ExternalID, t.ID, strings.Join(diffs, ", "))
}

// connections reads a cluster's connection settings.
func (s *Service) connections(ctx context.Context, cl *cluster.Cluster) (tenant.Connections, error) {
	cc := tenant.Connections{Rollout: s.RolloutConnections}
	admin, err := cl.Admin(ctx)
	if err != nil {
		return cc, err
	}
	err = admin.QueryRow(ctx, `SELECT current_setting('max_connections')::int, current_setting('superuser_reserved_connections')::int`).
		Scan(&cc.MaxConnections, &cc.Reserved)
	cc.Reserved += s.Provision.ReservedConnections
	return cc, cluster.Classify(err)
}

// version is the template version new tenants get on a cluster. The first
// tenant of a template on a cluster may wait for the template's
// materialisation there; a version that failed to build is an error with
// the build's error.
func (s *Service) version(ctx context.Context, template, clusterName string) (int, error) {
	v, err := s.Templates.ProvisionVersion(ctx, template, clusterName)
	if !errors.Is(err, catalog.ErrNotFound) {
		return v, err
	}
	want, err := s.Templates.Wanted(ctx, template)
	if err != nil {
		return 0, err
	}
	if _, err := s.Templates.EnsureBuild(ctx, template, want, clusterName); err != nil {
		return 0, err
	}
	wctx, cancel := context.WithTimeout(ctx, s.ColdWait)
	defer cancel()
	for {
		v, err := s.Templates.ProvisionVersion(wctx, template, clusterName)
		if err == nil {
			return v, nil
		}
		if err := s.Templates.Failed(ctx, template, want); err != nil {
			return 0, err
		}
		// A version built elsewhere whose build failed here (a cluster
		// added since): its job can be retried once the cause is fixed.
		if b, err := s.Store.GetBuild(ctx, template, want, clusterName); err == nil && b.State == catalog.BuildFailed {
			return 0, fmt.Errorf("%w: template %s version %d failed to build on cluster %s: %s (retry its build job once fixed: `pgtenant job list --type %s`)",
				catalog.ErrConflict, template, want, clusterName, b.Error, jobs.TemplateBuild)
		}
		select {
		case <-wctx.Done():
			return 0, fmt.Errorf("%w: template %s is still being materialised on cluster %s; retry in a moment", cluster.ErrUnavailable, template, clusterName)
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// claim takes a ready spare and hands it to the caller in one catalog
// transaction, with one statement batch on the cluster: enable login (with
// the password the spare was built with, or else the new one), grant
// CONNECT, apply the tier. It returns the tenant's password and whether its
// front door serves its entry already (registered: no sync to wait for).
// ErrNotFound: the pool is empty.
func (s *Service) claim(ctx context.Context, cl *cluster.Cluster, want catalog.Tenant, password, verifier string) (_ catalog.Tenant, _ string, registered bool, _ error) {
	tx, err := s.Store.Begin(ctx)
	if err != nil {
		return catalog.Tenant{}, "", false, err
	}
	defer tx.Rollback(context.WithoutCancel(ctx))
	t, err := s.Store.ClaimSpare(ctx, tx, want.Cluster, want.Template, want.Version, want.Mode)
	if err != nil {
		return catalog.Tenant{}, "", false, err
	}
	// A spare built with its password (sealed in its row, its role's
	// verifier set) is claimed with it: its front door has its entry.
	sealed, ok, err := s.Credentials.TakeSpare(ctx, tx, t.ID)
	if err != nil {
		return catalog.Tenant{}, "", false, err
	}
	if ok {
		password, verifier = sealed, ""
	}
	t.Name, t.ExternalID, t.Tier, t.Pins = want.Name, want.ExternalID, want.Tier, want.Pins
	if t, err = s.Store.ActivateTenant(ctx, tx, t); err != nil {
		return catalog.Tenant{}, "", false, err
	}
	if err := s.Store.AddEvent(ctx, tx, t.ID, "created", map[string]any{"path": "pool", "tier": t.Tier}); err != nil {
		return catalog.Tenant{}, "", false, err
	}
	if err := s.keep(ctx, tx, t, password); err != nil {
		return catalog.Tenant{}, "", false, err
	}
	admin, err := cl.Admin(ctx)
	if err != nil {
		return catalog.Tenant{}, "", false, err
	}
	withTier := t.Tier != "default"
	if _, err := admin.Exec(ctx, s.activationSQL(t, verifier, withTier)); err != nil {
		return catalog.Tenant{}, "", false, fmt.Errorf("activate tenant %s on cluster %s: %w", t.ID, cl.Name(), cluster.Classify(err))
	}
	if ok && !withTier {
		// Its entry serves already when the front door rendered it from the
		// verifier the role has (the tier's pooling, the default's).
		role := tenant.PhysicalName(t.ID)
		var v string
		if err := admin.QueryRow(ctx, `SELECT coalesce(rolpassword, '') FROM pg_catalog.pg_authid WHERE rolname = $1`, role).Scan(&v); err != nil {
			return catalog.Tenant{}, "", false, fmt.Errorf("read the verifier of tenant %s on cluster %s: %w", t.ID, cl.Name(), cluster.Classify(err))
		}
		registered = s.Poolers.Serves(cl.Name(), role, v)
	}
	if err := tx.Commit(ctx); err != nil {
		return catalog.Tenant{}, "", false, err
	}
	return t, password, registered, nil
}

// keep keeps a new tenant's password for the retry window, in the
// transaction that creates it. Only a create with an external id can be
// retried, so only its password is kept.
func (s *Service) keep(ctx context.Context, tx pgx.Tx, t catalog.Tenant, password string) error {
	if t.ExternalID == "" {
		return nil
	}
	return s.Credentials.Keep(ctx, tx, t.ID, password)
}

// cold builds a tenant from its template in a job and waits for it. asked
// is the request as the caller set it (for a create that lost the race to
// another with its external id).
func (s *Service) cold(ctx context.Context, cl *cluster.Cluster, asked Request, want catalog.Tenant, password, verifier string) (Created, error) {
	pctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	err := cl.Ping(pctx)
	cancel()
	if err != nil {
		return Created{}, err
	}
	want.ID = tenant.NewID()
	want.State = catalog.StateProvisioning
	want.Database = s.databaseOf(want)
	tx, err := s.Store.Begin(ctx)
	if err != nil {
		return Created{}, err
	}
	defer tx.Rollback(context.WithoutCancel(ctx))
	if err := s.Store.InsertTenant(ctx, tx, want); err != nil {
		// Give the aborted transaction's connection back first: answering
		// the retry reads the catalog again, and a burst of creates with
		// one external id must not hold every catalog connection while
		// waiting for one.
		tx.Rollback(context.WithoutCancel(ctx))
		if errors.Is(err, catalog.ErrConflict) {
			if t, err := s.Store.TenantByExternalID(ctx, want.ExternalID); err == nil {
				return s.existing(ctx, asked, t)
			}
		}
		return Created{}, err
	}
	if err := s.Store.AddEvent(ctx, tx, want.ID, "created", map[string]any{"path": "cold", "tier": want.Tier}); err != nil {
		return Created{}, err
	}
	if err := s.keep(ctx, tx, want, password); err != nil {
		return Created{}, err
	}
	// Someone waits for this build: it goes before spare builds queued
	// earlier (which only someone later would use).
	spec := buildSpec(want, &activation{Verifier: verifier, Tier: want.Tier})
	spec.Priority = coldPriority
	enqueued, err := s.Runner.Enqueue(ctx, tx, spec)
	if err != nil {
		return Created{}, err
	}
	if err := tx.Commit(ctx); err != nil {
		return Created{}, err
	}
	s.Runner.Poke()
	s.Pool.Poke()
	wctx, cancel := context.WithTimeout(ctx, s.ColdWait)
	defer cancel()
	job, err := s.Runner.Wait(wctx, enqueued.ID, nil)
	out := Created{Tenant: want, Password: password, Path: "cold"}
	out.DSN, out.Direct = s.Poolers.DSNs(cl, want, password)
	switch {
	case err != nil && wctx.Err() != nil && ctx.Err() == nil:
		// Still provisioning: the caller polls the job. The wait may have
		// ended in the middle of reading it.
		if job.ID == 0 {
			job = enqueued
		}
		out.Job = &job
		return out, nil
	case err != nil:
		return Created{}, err
	case job.State != jobs.Succeeded:
		return Created{}, fmt.Errorf("provision tenant on cluster %s: %s", cl.Name(), job.LastError)
	}
	t, err := s.Store.GetTenant(ctx, nil, want.ID)
	if err != nil {
		return Created{}, err
	}
	out.Tenant = t
	s.answer(ctx, cl, t, password, s.Poolers.Await(ctx, cl.Name()), &out)
	return out, nil
}

// frontDoorWait bounds how long a create waits for its cluster's front
// door to serve (a PgBouncer being restarted comes back within a second or
// two) before it answers 503 unavailable without creating anything.
const frontDoorWait = 5 * time.Second

// answer sets a tenant's DSNs: its front door's when it serves (front nil),
// else the direct DSN to the primary with a note saying so. That happens
// only when the front door stopped serving after the create was admitted
// (Serving), the tenant made already: answering 503 then would leave the
// client a tenant it cannot reach and whose password it never got, while
// the direct DSN works now; the pooler's DSN (tenant show) works once the
// front door serves again.
func (s *Service) answer(ctx context.Context, cl *cluster.Cluster, t catalog.Tenant, password string, front error, out *Created) {
	out.DSN, out.Direct = s.Poolers.DSNs(cl, t, password)
	if front == nil || out.DSN == out.Direct {
		return
	}
	s.Logger.WarnContext(ctx, "answered a tenant's direct DSN: its front door is not serving", "tenant", t.ID, "cluster", t.FrontCluster(), "err", front)
	out.DSN = out.Direct
	note := fmt.Sprintf("dsn is the direct DSN to the primary: %v; the tenant's pooler DSN (`pgtenant tenant show %s`) works once it serves again", front, t.ID)
	if out.Note != "" {
		note = out.Note + " " + note
	}
	out.Note = note
}

// coldPriority is the job priority of a cold create's build (spare builds
// have 0).
const coldPriority = 10

// databaseOf is where a tenant lives: its own database, or its template's
// shared database.
func (s *Service) databaseOf(t catalog.Tenant) string {
	if t.Mode == tenant.ModeSchema {
		return templates.SharedDatabase(t.Template)
	}
	return tenant.PhysicalName(t.ID)
}

// DSNs returns a tenant's connection strings without its password: the
// pooler's when its cluster has one (else the primary's), and the primary's.
func (s *Service) DSNs(t catalog.Tenant) (dsn, direct string, err error) {
	cl, err := s.Clusters.Get(t.Cluster)
	if err != nil {
		return "", "", err
	}
	dsn, direct = s.Poolers.DSNs(cl, t, "")
	return dsn, direct, nil
}

// activationSQL makes a spare usable by its tenant: LOGIN with the new
// password's verifier (none: the one the role has) and CONNECT, and the
// tier's settings when they differ from the default tier the spare was
// built with. A schema tenant's grant
// on the shared database comes first: it takes that database's lock
// (templates.ConnectSQL).
func (s *Service) activationSQL(t catalog.Tenant, verifier string, withTier bool) string {
	role := cluster.Ident(tenant.PhysicalName(t.ID))
	var b strings.Builder
	if t.Mode == tenant.ModeSchema {
		b.WriteString(templates.ConnectSQL(true, t.Template, tenant.PhysicalName(t.ID)))
	}
	if verifier == "" { // a spare's role has its password since its build
		fmt.Fprintf(&b, "ALTER ROLE %s WITH LOGIN;\n", role)
	} else {
		fmt.Fprintf(&b, "ALTER ROLE %s WITH LOGIN PASSWORD %s;\n", role, cluster.Literal(verifier))
	}
	if t.Mode == tenant.ModeDatabase {
		fmt.Fprintf(&b, "GRANT ALL ON DATABASE %s TO %s;\n", cluster.Ident(t.Database), role)
	}
	if withTier {
		b.WriteString(s.TierSQL(t.ID, t.Tier))
		b.WriteString(s.ExtensionsSQL(t, t.Tier))
	}
	return b.String()
}

// ExtensionsSQL writes the extensions a database tenant's tier lets it
// create (tenant.ExtensionsSQL) on its database; nothing for a schema
// tenant, which may create none.
func (s *Service) ExtensionsSQL(t catalog.Tenant, tierName string) string {
	if t.Mode != tenant.ModeDatabase {
		return ""
	}
	return tenant.ExtensionsSQL(tenant.PhysicalName(t.ID), s.Tiers[tierName])
}

// TierSQL applies a tier's limits to a tenant's role (a move that
// carries a tier change runs it on the target).
func (s *Service) TierSQL(id, tierName string) string {
	return tenant.TierSQL(tenant.PhysicalName(id), s.Tiers[tierName])
}
