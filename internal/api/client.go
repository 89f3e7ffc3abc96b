package api

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/pgtenant/pgtenant/internal/catalog"
	"github.com/pgtenant/pgtenant/internal/doctor"
	"github.com/pgtenant/pgtenant/internal/jobs"
	"github.com/pgtenant/pgtenant/internal/migrate"
	"github.com/pgtenant/pgtenant/internal/prewarm"
	"github.com/pgtenant/pgtenant/internal/provision"
	"github.com/pgtenant/pgtenant/internal/reconcile"
	"github.com/pgtenant/pgtenant/internal/templates"
)

// ErrServerUnreachable is a request that got no answer from the daemon (not
// running, wrong --server): nothing is known about the clusters behind it.
var ErrServerUnreachable = errors.New("pgtenant server unreachable")

// Client calls the API. The CLI and the tests use it.
type Client struct {
	BaseURL string // e.g. http://127.0.0.1:8080, or https://… when the daemon has tls_cert_file
	Token   string
	HTTP    *http.Client
}

// NewClient returns a client with a sane timeout.
func NewClient(baseURL, token string) *Client {
	if !strings.Contains(baseURL, "://") {
		baseURL = "http://" + baseURL
	}
	return &Client{BaseURL: strings.TrimRight(baseURL, "/"), Token: token, HTTP: &http.Client{Timeout: 5 * time.Minute}}
}

// TrustCA makes the client trust the PEM certificates in pem instead of the
// system roots: for a daemon whose certificate is self-signed or from a
// private CA (PGTENANT_CA_FILE).
func (c *Client) TrustCA(pem []byte) error {
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(pem) {
		return errors.New("no PEM certificate in it")
	}
	t := http.DefaultTransport.(*http.Transport).Clone()
	t.TLSClientConfig = &tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS12}
	c.HTTP.Transport = t
	return nil
}

// Do sends a request with an optional JSON body and decodes a JSON answer into out.
func (c *Client) Do(ctx context.Context, method, path string, body, out any) error {
	var rd io.Reader
	if body != nil {
		b, err := json.Marshal(body)
		if err != nil {
			return err
		}
		rd = bytes.NewReader(b)
	}
	contentType := ""
	if body != nil {
		contentType = "application/json"
	}
	resp, err := c.send(ctx, method, path, contentType, rd)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	data, err := io.ReadAll(resp.Body)
	if err != nil {
		return err
	}
	if out != nil {
		if err := json.Unmarshal(data, out); err != nil {
			return fmt.Errorf("decode %s answer: %w", path, err)
		}
	}
	return nil
}

// send makes a request with body (of contentType; nil: none) and returns
// a success's answer, whose body the caller closes; an error answer is an
// *Error.
func (c *Client) send(ctx context.Context, method, path, contentType string, body io.Reader) (*http.Response, error) {
	req, err := http.NewRequestWithContext(ctx, method, c.BaseURL+path, body)
	if err != nil {
		return nil, err
	}
	if contentType != "" {
		req.Header.Set("Content-Type", contentType)
	}
	if c.Token != "" {
		req.Header.Set("Authorization", "Bearer "+c.Token)
	}
	resp, err := c.HTTP.Do(req)
	if err != nil {
		if ctx.Err() != nil {
			return nil, err
		}
		return nil, fmt.Errorf("%w at %s: %v (is the daemon running? start it with `pgtenant up`, or set --server / PGTENANT_SERVER)",
			ErrServerUnreachable, c.BaseURL, err)
	}
	if resp.StatusCode >= 400 {
		defer resp.Body.Close()
		data, err := io.ReadAll(resp.Body)
		if err != nil {
			return nil, err
		}
		var eb ErrorBody
		if json.Unmarshal(data, &eb) == nil && eb.Error.Message != "" {
			return nil, &Error{Status: resp.StatusCode, Code: eb.Error.Code, Message: eb.Error.Message}
		}
		return nil, &Error{Status: resp.StatusCode, Code: "http", Message: fmt.Sprintf("%s %s: %s", method, path, resp.Status)}
	}
	return resp, nil
}

// Health calls /healthz.
func (c *Client) Health(ctx context.Context) (Health, error) {
	var h Health
	return h, c.Do(ctx, http.MethodGet, "/healthz", nil, &h)
}

// Clusters lists clusters.
func (c *Client) Clusters(ctx context.Context) ([]Cluster, error) {
	var out []Cluster
	return out, c.Do(ctx, http.MethodGet, "/v1/clusters", nil, &out)
}

// Cluster shows one cluster.
func (c *Client) Cluster(ctx context.Context, name string) (ClusterDetail, error) {
	var out ClusterDetail
	return out, c.Do(ctx, http.MethodGet, "/v1/clusters/"+url.PathEscape(name), nil, &out)
}

// AddCluster registers an external cluster.
func (c *Client) AddCluster(ctx context.Context, req AddClusterRequest) (Cluster, error) {
	var out Cluster
	return out, c.Do(ctx, http.MethodPost, "/v1/clusters", req, &out)
}

// SetCluster changes a cluster's placement caps and labels.
func (c *Client) SetCluster(ctx context.Context, name string, req catalog.PlacementChange) (Cluster, error) {
	var out Cluster
	return out, c.Do(ctx, http.MethodPatch, "/v1/clusters/"+url.PathEscape(name), req, &out)
}

// DrainCluster marks a cluster draining and returns its drain job.
func (c *Client) DrainCluster(ctx context.Context, name string) (jobs.Job, error) {
	var out jobs.Job
	return out, c.Do(ctx, http.MethodPost, "/v1/clusters/"+url.PathEscape(name)+"/drain", nil, &out)
}

// Switchover starts a planned change of a Patroni cluster's leader
// (its front door paused meanwhile) and returns its job.
func (c *Client) Switchover(ctx context.Context, name string, req SwitchoverRequest) (jobs.Job, error) {
	var out jobs.Job
	return out, c.Do(ctx, http.MethodPost, "/v1/clusters/"+url.PathEscape(name)+"/switchover", req, &out)
}

// Failover starts a forced change of a Patroni cluster's leader to req.To
// and returns its job.
func (c *Client) Failover(ctx context.Context, name string, req SwitchoverRequest) (jobs.Job, error) {
	var out jobs.Job
	return out, c.Do(ctx, http.MethodPost, "/v1/clusters/"+url.PathEscape(name)+"/failover", req, &out)
}

// UndrainCluster places tenants on a cluster again.
func (c *Client) UndrainCluster(ctx context.Context, name string) (Cluster, error) {
	var out Cluster
	return out, c.Do(ctx, http.MethodPost, "/v1/clusters/"+url.PathEscape(name)+"/undrain", nil, &out)
}

// Rebalance plans (dry run) or starts a rebalance.
func (c *Client) Rebalance(ctx context.Context, req RebalanceRequest) (RebalanceResponse, error) {
	var out RebalanceResponse
	return out, c.Do(ctx, http.MethodPost, "/v1/rebalance", req, &out)
}

// CreateTemplate stores version 1 of a new template.
func (c *Client) CreateTemplate(ctx context.Context, name string, files []templates.Upload) (templates.Added, error) {
	var out templates.Added
	return out, c.Do(ctx, http.MethodPost, "/v1/templates", CreateTemplateRequest{Name: name, Files: files}, &out)
}

// PushTemplate stores the next version of a template.
func (c *Client) PushTemplate(ctx context.Context, name string, files []templates.Upload) (templates.Added, error) {
	var out templates.Added
	return out, c.Do(ctx, http.MethodPost, "/v1/templates/"+url.PathEscape(name)+"/versions", CreateTemplateRequest{Files: files}, &out)
}

// DeleteTemplate starts the delete of a template that has no tenants.
func (c *Client) DeleteTemplate(ctx context.Context, name string) (templates.Deleted, error) {
	var out templates.Deleted
	return out, c.Do(ctx, http.MethodDelete, "/v1/templates/"+url.PathEscape(name), nil, &out)
}

// Templates lists templates.
func (c *Client) Templates(ctx context.Context) ([]TemplateSummary, error) {
	var out []TemplateSummary
	return out, c.Do(ctx, http.MethodGet, "/v1/templates", nil, &out)
}

// Template shows one template.
func (c *Client) Template(ctx context.Context, name string) (TemplateDetail, error) {
	var out TemplateDetail
	return out, c.Do(ctx, http.MethodGet, "/v1/templates/"+url.PathEscape(name), nil, &out)
}

// CreateTenant provisions a tenant.
func (c *Client) CreateTenant(ctx context.Context, req provision.Request) (CreateTenantResponse, error) {
	var out CreateTenantResponse
	return out, c.Do(ctx, http.MethodPost, "/v1/tenants", req, &out)
}

// Tenants lists tenants; q filters (state, cluster, template, mode, limit, after).
func (c *Client) Tenants(ctx context.Context, q url.Values) ([]Tenant, error) {
	var out []Tenant
	return out, c.Do(ctx, http.MethodGet, "/v1/tenants?"+q.Encode(), nil, &out)
}

// Tenant shows one tenant with its history.
func (c *Client) Tenant(ctx context.Context, id string) (Tenant, error) {
	var out Tenant
	return out, c.Do(ctx, http.MethodGet, "/v1/tenants/"+url.PathEscape(id), nil, &out)
}

// Jobs lists jobs; q filters (state, type, target_kind, target, limit).
func (c *Client) Jobs(ctx context.Context, q url.Values) ([]jobs.Job, error) {
	var out []jobs.Job
	return out, c.Do(ctx, http.MethodGet, "/v1/jobs?"+q.Encode(), nil, &out)
}

// Job shows one job with its completed steps.
func (c *Client) Job(ctx context.Context, id int64) (jobs.Job, error) {
	var out jobs.Job
	return out, c.Do(ctx, http.MethodGet, fmt.Sprintf("/v1/jobs/%d", id), nil, &out)
}

// CancelJob asks a job to stop.
func (c *Client) CancelJob(ctx context.Context, id int64) (jobs.Job, error) {
	var out jobs.Job
	return out, c.Do(ctx, http.MethodPost, fmt.Sprintf("/v1/jobs/%d/cancel", id), nil, &out)
}

// RetryJob requeues a failed or cancelled job.
func (c *Client) RetryJob(ctx context.Context, id int64) (jobs.Job, error) {
	var out jobs.Job
	return out, c.Do(ctx, http.MethodPost, fmt.Sprintf("/v1/jobs/%d/retry", id), nil, &out)
}

// WaitJob polls a job until it is finished or paused, calling onChange when
// its state or progress changes.
func (c *Client) WaitJob(ctx context.Context, id int64, onChange func(jobs.Job)) (jobs.Job, error) {
	var last string
	for {
		j, err := c.Job(ctx, id)
		if err != nil {
			return j, err
		}
		if sig := fmt.Sprint(j.State, j.ProgressDone, j.ProgressTotal, j.ProgressMsg); sig != last && onChange != nil {
			onChange(j)
			last = sig
		}
		if jobs.Finished(j.State) || j.State == jobs.Paused {
			return j, nil
		}
		select {
		case <-ctx.Done():
			return j, ctx.Err()
		case <-time.After(200 * time.Millisecond):
		}
	}
}

// Reconcile compares the catalog with the clusters (and repairs with fix).
func (c *Client) Reconcile(ctx context.Context, req ReconcileRequest) (reconcile.Report, error) {
	var out reconcile.Report
	return out, c.Do(ctx, http.MethodPost, "/v1/reconcile", req, &out)
}

// DropTenant soft-deletes a tenant (purgeNow: purge at once).
func (c *Client) DropTenant(ctx context.Context, id string, purgeNow bool) (LifecycleResponse, error) {
	var out LifecycleResponse
	return out, c.Do(ctx, http.MethodDelete, "/v1/tenants/"+url.PathEscape(id)+"?purge_now="+strconv.FormatBool(purgeNow), nil, &out)
}

// TenantAction posts restore, suspend or resume.
func (c *Client) TenantAction(ctx context.Context, id, action string) (LifecycleResponse, error) {
	var out LifecycleResponse
	return out, c.Do(ctx, http.MethodPost, "/v1/tenants/"+url.PathEscape(id)+"/"+action, nil, &out)
}

// RewindTenant starts taking a tenant back to a time and returns its job.
func (c *Client) RewindTenant(ctx context.Context, id string, to time.Time) (jobs.Job, error) {
	var out jobs.Job
	return out, c.Do(ctx, http.MethodPost, "/v1/tenants/"+url.PathEscape(id)+"/rewind", RewindTenantRequest{To: to}, &out)
}

// ExportTenant writes a tenant's archive to w; progress, when set, is
// told the bytes written and the archive's length.
func (c *Client) ExportTenant(ctx context.Context, id string, w io.Writer, progress func(done, total int64)) (int64, error) {
	resp, err := c.send(ctx, http.MethodPost, "/v1/tenants/"+url.PathEscape(id)+"/export", "", nil)
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	pw := &progressWriter{w: w, total: resp.ContentLength, report: progress}
	n, err := io.Copy(pw, resp.Body)
	if err == nil && resp.ContentLength >= 0 && n != resp.ContentLength {
		err = fmt.Errorf("export of tenant %s cut short: %d of %d bytes (see the daemon's log)", id, n, resp.ContentLength)
	}
	return n, err
}

type progressWriter struct {
	w      io.Writer
	n      int64
	total  int64
	report func(done, total int64)
}

func (p *progressWriter) Write(b []byte) (int, error) {
	n, err := p.w.Write(b)
	p.n += int64(n)
	if p.report != nil {
		p.report(p.n, p.total)
	}
	return n, err
}

// ImportTenant makes a new tenant from an archive read from r.
func (c *Client) ImportTenant(ctx context.Context, r io.Reader, q ImportTenantQuery) (CreateTenantResponse, error) {
	v := url.Values{}
	for k, s := range map[string]string{"cluster": q.Cluster, "tier": q.Tier} {
		if s != "" {
			v.Set(k, s)
		}
	}
	if q.Name != nil {
		v.Set("name", *q.Name)
	}
	path := "/v1/tenants/import"
	if len(v) > 0 {
		path += "?" + v.Encode()
	}
	var out CreateTenantResponse
	resp, err := c.send(ctx, http.MethodPost, path, ArchiveType, r)
	if err != nil {
		return out, err
	}
	defer resp.Body.Close()
	return out, json.NewDecoder(resp.Body).Decode(&out)
}

// ForkTenant makes a new tenant holding a tenant's data as of a time.
func (c *Client) ForkTenant(ctx context.Context, id string, req ForkTenantRequest) (CreateTenantResponse, error) {
	var out CreateTenantResponse
	return out, c.Do(ctx, http.MethodPost, "/v1/tenants/"+url.PathEscape(id)+"/fork", req, &out)
}

// MoveTenant starts moving a tenant to cluster to and returns its job.
func (c *Client) MoveTenant(ctx context.Context, id, to string) (jobs.Job, error) {
	var out jobs.Job
	return out, c.Do(ctx, http.MethodPost, "/v1/tenants/"+url.PathEscape(id)+"/move", MoveTenantRequest{To: to}, &out)
}

// SetTenantTier changes a tenant's tier: in place, or the job of the move
// that carries it (LifecycleResponse.Job).
func (c *Client) SetTenantTier(ctx context.Context, id, tier string) (LifecycleResponse, error) {
	return c.SetTenant(ctx, id, SetTenantRequest{Tier: tier})
}

// SetTenant changes a tenant's tier, allowlist or both.
func (c *Client) SetTenant(ctx context.Context, id string, req SetTenantRequest) (LifecycleResponse, error) {
	var out LifecycleResponse
	return out, c.Do(ctx, http.MethodPatch, "/v1/tenants/"+url.PathEscape(id), req, &out)
}

// CreateCredential gives a tenant another login.
func (c *Client) CreateCredential(ctx context.Context, id string, req CreateCredentialRequest) (CredentialResponse, error) {
	var out CredentialResponse
	return out, c.Do(ctx, http.MethodPost, "/v1/tenants/"+url.PathEscape(id)+"/credentials", req, &out)
}

// Credentials lists a tenant's extra logins.
func (c *Client) Credentials(ctx context.Context, id string) ([]catalog.Login, error) {
	var out []catalog.Login
	return out, c.Do(ctx, http.MethodGet, "/v1/tenants/"+url.PathEscape(id)+"/credentials", nil, &out)
}

// RotateCredential gives one of a tenant's logins a new password.
func (c *Client) RotateCredential(ctx context.Context, id, name string) (CredentialResponse, error) {
	var out CredentialResponse
	return out, c.Do(ctx, http.MethodPost, "/v1/tenants/"+url.PathEscape(id)+"/credentials/"+url.PathEscape(name)+"/password", nil, &out)
}

// RevokeCredential drops one of a tenant's logins and returns those left.
func (c *Client) RevokeCredential(ctx context.Context, id, name string) ([]catalog.Login, error) {
	var out []catalog.Login
	return out, c.Do(ctx, http.MethodDelete, "/v1/tenants/"+url.PathEscape(id)+"/credentials/"+url.PathEscape(name), nil, &out)
}

// RotatePassword gives a tenant a new password and returns it with the DSN
// (keepSessions: its open sessions stay).
func (c *Client) RotatePassword(ctx context.Context, id string, keepSessions bool) (RotatePasswordResponse, error) {
	var out RotatePasswordResponse
	return out, c.Do(ctx, http.MethodPost, "/v1/tenants/"+url.PathEscape(id)+"/password", RotatePasswordRequest{KeepSessions: keepSessions}, &out)
}

// Prewarm starts prewarm jobs for a tenant, a cluster or all.
func (c *Client) Prewarm(ctx context.Context, req PrewarmRequest) ([]jobs.Job, error) {
	var out []jobs.Job
	return out, c.Do(ctx, http.MethodPost, "/v1/prewarm", req, &out)
}

// Capture captures hot sets now.
func (c *Client) Capture(ctx context.Context, req CaptureRequest) ([]prewarm.CaptureResult, error) {
	var out []prewarm.CaptureResult
	return out, c.Do(ctx, http.MethodPost, "/v1/prewarm/capture", req, &out)
}

// StartRollout starts a rollout of a template (or, with DryRun, only plans it).
func (c *Client) StartRollout(ctx context.Context, req migrate.Request) (migrate.Started, error) {
	var out migrate.Started
	return out, c.Do(ctx, http.MethodPost, "/v1/templates/"+url.PathEscape(req.Template)+"/rollouts", req, &out)
}

// Rollouts lists rollouts, newest first; q filters (template, limit).
func (c *Client) Rollouts(ctx context.Context, q url.Values) ([]migrate.Status, error) {
	var out []migrate.Status
	return out, c.Do(ctx, http.MethodGet, "/v1/rollouts?"+q.Encode(), nil, &out)
}

// Rollout shows a rollout with its tenants; q filters them (state: a list
// such as "failed,pending", or "all"; limit).
func (c *Client) Rollout(ctx context.Context, id int64, q url.Values) (migrate.Status, error) {
	var out migrate.Status
	return out, c.Do(ctx, http.MethodGet, fmt.Sprintf("/v1/rollouts/%d?%s", id, q.Encode()), nil, &out)
}

// ContinueRollout lets a rollout paused after its canary go on.
func (c *Client) ContinueRollout(ctx context.Context, id int64) (migrate.Status, error) {
	var out migrate.Status
	return out, c.Do(ctx, http.MethodPost, fmt.Sprintf("/v1/rollouts/%d/continue", id), nil, &out)
}

// RetryRollout reruns a rollout's failed tenants (or only tenant).
func (c *Client) RetryRollout(ctx context.Context, id int64, tenant string) (migrate.Status, error) {
	var out migrate.Status
	return out, c.Do(ctx, http.MethodPost, fmt.Sprintf("/v1/rollouts/%d/retry", id), RetryRolloutRequest{Tenant: tenant}, &out)
}

// TenantMetrics returns a tenant's figures, quota state and, with history
// (e.g. "1h"), its minute rollups.
func (c *Client) TenantMetrics(ctx context.Context, id, history string) (TenantMetrics, error) {
	var out TenantMetrics
	q := url.Values{}
	if history != "" {
		q.Set("history", history)
	}
	return out, c.Do(ctx, http.MethodGet, "/v1/tenants/"+url.PathEscape(id)+"/metrics?"+q.Encode(), nil, &out)
}

// SetMetricsExport opts a tenant in to (or out of) per-tenant series on /metrics.
func (c *Client) SetMetricsExport(ctx context.Context, id string, export bool) (TenantMetrics, error) {
	var out TenantMetrics
	return out, c.Do(ctx, http.MethodPut, "/v1/tenants/"+url.PathEscape(id)+"/metrics/export", MetricsExportRequest{Export: export}, &out)
}

// Doctor examines one cluster, or all with cluster "".
func (c *Client) Doctor(ctx context.Context, cluster string) (doctor.Report, error) {
	var out doctor.Report
	q := url.Values{}
	if cluster != "" {
		q.Set("cluster", cluster)
	}
	return out, c.Do(ctx, http.MethodGet, "/v1/doctor?"+q.Encode(), nil, &out)
}
