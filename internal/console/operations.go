package console

import (
	"cmp"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"slices"
	"strings"
	"time"

	"github.com/pgtenant/pgtenant/internal/api"
	"github.com/pgtenant/pgtenant/internal/jobs"
	"github.com/pgtenant/pgtenant/internal/provision"
	"github.com/pgtenant/pgtenant/internal/tenant"
)

// The operator's pages beyond a tenant's lifecycle: creating a tenant
// (its connection string shown once), moving, rewinding and forking one,
// the templates with their builds, a cluster's drain, doctor, reconcile
// and backups. Like every page, each reads and acts through the API's own
// handlers (inprocess.go), and each action has its confirmation page.

// badgeClass is the colour of a state, by its word: ok (green), warn
// (amber), bad (red), run (blue) or idle (grey).
func badgeClass(state any) string {
	switch strings.ToLower(fmt.Sprint(state)) {
	case "active", "up", "ok", "ready", "succeeded", "done", "streaming":
		return "ok"
	case "suspended", "paused", "waiting", "warn", "warning", "grace", "draining", "disabling":
		return "warn"
	case "failed", "down", "fail", "dropped", "purging", "enforced":
		return "bad"
	case "queued", "running", "building", "migrating", "provisioning", "pending", "copying":
		return "run"
	}
	return "idle"
}

// apiRefusal is an API answer a page shows in place (a scope that may not
// run the route, a feature not configured) rather than as the error page:
// its status and message; nil for anything else (5xx included).
func apiRefusal(err error) *api.Error {
	var ae *api.Error
	if errors.As(err, &ae) && ae.Status < 500 {
		return ae
	}
	return nil
}

// invalidForm is a form field the API would refuse, caught before the call
// because it does not parse.
func invalidForm(format string, args ...any) error {
	return &api.Error{Status: http.StatusBadRequest, Code: "invalid", Message: fmt.Sprintf(format, args...)}
}

// moveOrRewind starts a confirmed move (to: a cluster) or rewind (to: an
// RFC 3339 time) of tenant id through the API and returns its job.
func (c *Console) moveOrRewind(r *http.Request, id, name string) (jobs.Job, error) {
	to := strings.TrimSpace(r.PostFormValue("to"))
	if to == "" {
		return jobs.Job{}, invalidForm("%s: say to what (%s)", name, map[string]string{"move": "a cluster", "rewind": "a time"}[name])
	}
	if name == "move" {
		return c.client(r).MoveTenant(r.Context(), id, to)
	}
	at, err := time.Parse(time.RFC3339, to)
	if err != nil {
		return jobs.Job{}, invalidForm("rewind to %q: an RFC 3339 time, e.g. %s", to, time.Now().UTC().Add(-time.Hour).Format(time.RFC3339))
	}
	return c.client(r).RewindTenant(r.Context(), id, at)
}

// forkRequest reads the fork form: the new tenant's name (optional) and
// the time to copy as of (optional: now).
func forkRequest(r *http.Request) (api.ForkTenantRequest, error) {
	var req api.ForkTenantRequest
	if n := strings.TrimSpace(r.PostFormValue("name")); n != "" {
		req.Name = &n
	}
	if s := strings.TrimSpace(r.PostFormValue("at")); s != "" {
		at, err := time.Parse(time.RFC3339, s)
		if err != nil {
			return req, invalidForm("fork as of %q: an RFC 3339 time, or nothing for now", s)
		}
		req.At = &at
	}
	return req, nil
}

// createFields are the create form's fields, as provision.Request names
// them.
var createFields = []string{"template", "name", "external_id", "tier", "mode", "cluster", "labels"}

// newTenant is the create form: a template, a name and external id, and
// where to place it (tier, mode, cluster, labels to pin it to: the API's
// defaults when empty).
func (c *Console) newTenant(w http.ResponseWriter, r *http.Request, v view) error {
	cl := c.client(r)
	tpls, err := cl.Templates(r.Context())
	if err != nil {
		return err
	}
	cls, err := cl.Clusters(r.Context())
	if err != nil {
		return err
	}
	v["Templates"], v["Clusters"], v["Modes"] = tpls, cls, tenant.Modes
	v["Form"] = r.URL.Query()
	v["Refused"] = refusal(who(r), "tenant/create")
	c.render(w, http.StatusOK, "newtenant.html", v)
	return nil
}

// confirmCreateTenant says what the create form asks for and posts it.
func (c *Console) confirmCreateTenant(w http.ResponseWriter, r *http.Request, v view) error {
	fields := map[string]string{}
	for _, f := range createFields {
		if s := strings.TrimSpace(r.URL.Query().Get(f)); s != "" {
			fields[f] = s
		}
	}
	if fields["template"] == "" {
		return invalidForm("create a tenant: choose its template")
	}
	v["Title"] = "Create the tenant"
	ext, mode, tier, on := "", "the template's mode", "the default tier", "on the cluster placement picks"
	if fields["external_id"] != "" {
		ext = " (external id " + fields["external_id"] + ")"
	}
	if fields["mode"] != "" {
		mode = fields["mode"] + " mode"
	}
	if fields["tier"] != "" {
		tier = "tier " + fields["tier"]
	}
	if fields["cluster"] != "" {
		on = "on cluster " + fields["cluster"]
	}
	if fields["labels"] != "" {
		on += ", pinned to clusters labelled " + fields["labels"]
	}
	v["What"] = fmt.Sprintf("a tenant of template %s named %q%s: %s, %s, %s", fields["template"], fields["name"], ext, mode, tier, on)
	v["Says"] = "The tenant is claimed from the template's spare pool, or built now when the pool is empty. Its password is shown once on the next page: copy it there."
	v["Action"], v["Fields"], v["Back"] = "/tenants/new", fields, "/tenants/new?"+r.URL.RawQuery
	v["Refused"] = refusal(who(r), "tenant/create")
	c.render(w, http.StatusOK, "confirm.html", v)
	return nil
}

// createTenant creates the confirmed tenant through the API and shows its
// connection string, password included, once (the page is not stored:
// Cache-Control no-store).
func (c *Console) createTenant(w http.ResponseWriter, r *http.Request, v view) error {
	req := provision.Request{Template: strings.TrimSpace(r.PostFormValue("template")), ExternalID: strings.TrimSpace(r.PostFormValue("external_id")),
		Tier: strings.TrimSpace(r.PostFormValue("tier")), Mode: tenant.Mode(strings.TrimSpace(r.PostFormValue("mode"))),
		Cluster: strings.TrimSpace(r.PostFormValue("cluster"))}
	if n := strings.TrimSpace(r.PostFormValue("name")); n != "" {
		req.Name = &n
	}
	for _, l := range strings.Split(r.PostFormValue("labels"), ",") {
		if l = strings.TrimSpace(l); l != "" {
			req.Labels = append(req.Labels, l)
		}
	}
	res, err := c.client(r).CreateTenant(r.Context(), req)
	if err != nil {
		return err
	}
	v["Created"] = res
	c.render(w, http.StatusOK, "created.html", v)
	return nil
}

// templateRow is a template on the templates page: its versions' and
// builds' state, its tenants and its last rollout.
type templateRow struct {
	api.TemplateDetail
	Latest      string         // the latest version's state
	Builds      map[string]int // the latest version's builds by state
	TenantCount int
	Rollout     string // the last rollout's state and id, "" for none
	RolloutID   int64
}

// templates lists the templates, each read in full through the API.
func (c *Console) templates(w http.ResponseWriter, r *http.Request, v view) error {
	cl := c.client(r)
	tpls, err := cl.Templates(r.Context())
	if err != nil {
		return err
	}
	rows := make([]templateRow, 0, len(tpls))
	for _, t := range tpls {
		d, err := cl.Template(r.Context(), t.Name)
		if err != nil {
			return err
		}
		row := templateRow{TemplateDetail: d, Builds: map[string]int{}}
		for _, ver := range d.Versions {
			if ver.Version == d.LatestVersion {
				row.Latest = string(ver.State)
			}
		}
		for _, b := range d.Builds {
			if b.Version == d.LatestVersion {
				row.Builds[string(b.State)]++
			}
		}
		for _, n := range d.Tenants {
			row.TenantCount += n
		}
		ros, err := cl.Rollouts(r.Context(), url.Values{"template": {t.Name}, "limit": {"1"}})
		if err != nil {
			return err
		}
		if len(ros) > 0 {
			row.Rollout, row.RolloutID = string(ros[0].State), ros[0].ID
		}
		rows = append(rows, row)
	}
	v["Templates"] = rows
	c.render(w, http.StatusOK, "templates.html", v)
	return nil
}

// clusterActions are a cluster's actions besides the switchover.
var clusterActions = map[string][2]string{
	"drain":   {"Drain the cluster", "No new tenant or spare is placed on it and its spares are retired; a job moves its active tenants, largest first, to the other clusters. Undrain to stop."},
	"undrain": {"Undrain the cluster", "The cluster takes new tenants and spares again. Tenants already moved away stay where they are."},
}

func (c *Console) confirmCluster(w http.ResponseWriter, r *http.Request, v view) error {
	name, action := r.PathValue("name"), r.PathValue("action")
	a, ok := clusterActions[action]
	if !ok {
		http.NotFound(w, r)
		return nil
	}
	d, err := c.client(r).Cluster(r.Context(), name)
	if err != nil {
		return err
	}
	v["Title"], v["Says"], v["Action"], v["Back"] = a[0], a[1], r.URL.Path, "/clusters"
	v["What"] = fmt.Sprintf("cluster %s: %d tenants (%s)", d.Name, d.Tenants, humanBytes(d.SizeBytes))
	v["Refused"] = refusal(who(r), "cluster/"+action)
	v["Danger"] = action == "drain"
	c.render(w, http.StatusOK, "confirm.html", v)
	return nil
}

// clusterAction runs a confirmed drain (then shows its job) or undrain.
func (c *Console) clusterAction(w http.ResponseWriter, r *http.Request, v view) error {
	name := r.PathValue("name")
	switch r.PathValue("action") {
	case "drain":
		j, err := c.client(r).DrainCluster(r.Context(), name)
		if err != nil {
			return err
		}
		http.Redirect(w, r, fmt.Sprintf("/jobs/%d?done=drain", j.ID), http.StatusSeeOther)
	case "undrain":
		if _, err := c.client(r).UndrainCluster(r.Context(), name); err != nil {
			return err
		}
		http.Redirect(w, r, "/clusters?done=undrain", http.StatusSeeOther)
	default:
		http.NotFound(w, r)
	}
	return nil
}

// doctor runs the API's doctor (GET /v1/doctor) over every cluster, or
// the one ?cluster= names, and shows each check with why and how to fix.
func (c *Console) doctor(w http.ResponseWriter, r *http.Request, v view) error {
	name := strings.TrimSpace(r.URL.Query().Get("cluster"))
	rep, err := c.client(r).Doctor(r.Context(), name)
	if ae := apiRefusal(err); ae != nil {
		v["Refused"], v["Cluster"] = ae.Message, name
		c.render(w, ae.Status, "doctor.html", v)
		return nil
	}
	if err != nil {
		return err
	}
	v["Report"], v["Cluster"] = rep, name
	c.render(w, http.StatusOK, "doctor.html", v)
	return nil
}

// reconcile checks the clusters against the catalog without fixing
// anything (POST /v1/reconcile with fix false: it reads only) and lists
// what it finds, with the button that fixes it.
func (c *Console) reconcile(w http.ResponseWriter, r *http.Request, v view) error {
	name := strings.TrimSpace(r.URL.Query().Get("cluster"))
	v["Cluster"] = name
	// Even the check (fix false) is an admin route: a narrower login is
	// told so rather than sent to the API, which would refuse and audit
	// a 403 at every visit.
	if msg := refusal(who(r), "reconcile/fix"); msg != "" {
		v["Refused"] = msg
		c.render(w, http.StatusOK, "reconcile.html", v)
		return nil
	}
	rep, err := c.client(r).Reconcile(r.Context(), api.ReconcileRequest{Cluster: name})
	if ae := apiRefusal(err); ae != nil {
		v["Refused"] = ae.Message
		c.render(w, ae.Status, "reconcile.html", v)
		return nil
	}
	if err != nil {
		return err
	}
	v["Report"], v["CanFix"] = rep, true
	c.render(w, http.StatusOK, "reconcile.html", v)
	return nil
}

func (c *Console) confirmReconcileFix(w http.ResponseWriter, r *http.Request, v view) error {
	name := strings.TrimSpace(r.URL.Query().Get("cluster"))
	v["Title"] = "Fix what reconcile finds"
	v["What"] = "reconcile every cluster"
	if name != "" {
		v["What"] = "reconcile cluster " + name
	}
	v["Says"] = "The check runs again and fixes what it finds: leftovers pgtenant made are dropped or purged, logins of tenants that are not active are locked out, missing builds are enqueued. Objects pgtenant did not demonstrably make are left alone."
	v["Action"], v["Back"] = r.URL.Path, "/reconcile"
	v["Fields"] = map[string]string{"cluster": name}
	v["Refused"] = refusal(who(r), "reconcile/fix")
	v["Danger"] = true
	c.render(w, http.StatusOK, "confirm.html", v)
	return nil
}

// reconcileFix runs a confirmed fix and shows its report (what it did).
func (c *Console) reconcileFix(w http.ResponseWriter, r *http.Request, v view) error {
	name := strings.TrimSpace(r.PostFormValue("cluster"))
	rep, err := c.client(r).Reconcile(r.Context(), api.ReconcileRequest{Cluster: name, Fix: true})
	if err != nil {
		return err
	}
	v["Report"], v["Cluster"], v["Fixed"] = rep, name, true
	c.render(w, http.StatusOK, "reconcile.html", v)
	return nil
}

// backups lists each backed-up cluster's repository (GET /v1/backups):
// its backups, its recovery window and the newest archived WAL. Without
// backups configured the page says what the API says.
func (c *Console) backups(w http.ResponseWriter, r *http.Request, v view) error {
	bs, err := c.client(r).Backups(r.Context(), "")
	if ae := apiRefusal(err); ae != nil {
		v["Refused"] = ae.Message
		c.render(w, http.StatusOK, "backups.html", v)
		return nil
	}
	if err != nil {
		return err
	}
	v["Backups"] = bs
	v["CanBackup"] = may(who(r), "backup/now")
	v["Done"] = doneMessages[r.URL.Query().Get("done")]
	c.render(w, http.StatusOK, "backups.html", v)
	return nil
}

var backupTypes = []string{"full", "diff", "incr"}

func (c *Console) confirmBackupNow(w http.ResponseWriter, r *http.Request, v view) error {
	name, typ := strings.TrimSpace(r.URL.Query().Get("cluster")), cmp.Or(strings.TrimSpace(r.URL.Query().Get("type")), "full")
	if !slices.Contains(backupTypes, typ) {
		return invalidForm("backup type %q: one of %s", typ, strings.Join(backupTypes, ", "))
	}
	v["Title"] = "Take a backup"
	v["What"] = fmt.Sprintf("a %s backup of every backed-up cluster", typ)
	if name != "" {
		v["What"] = fmt.Sprintf("a %s backup of cluster %s", typ, name)
	}
	v["Says"] = "A job per cluster runs pgBackRest, from a standby when the cluster is set up so; the cluster keeps serving. The recovery window grows once it is done."
	v["Action"], v["Back"] = r.URL.Path, "/backups"
	v["Fields"] = map[string]string{"cluster": name, "type": typ}
	v["Refused"] = refusal(who(r), "backup/now")
	c.render(w, http.StatusOK, "confirm.html", v)
	return nil
}

// backupNow starts the confirmed backups and shows the job (or the jobs).
func (c *Console) backupNow(w http.ResponseWriter, r *http.Request, v view) error {
	js, err := c.client(r).BackupNow(r.Context(), api.BackupRequest{Cluster: strings.TrimSpace(r.PostFormValue("cluster")), Type: strings.TrimSpace(r.PostFormValue("type"))})
	if err != nil {
		return err
	}
	if len(js) == 1 {
		http.Redirect(w, r, fmt.Sprintf("/jobs/%d?done=backup", js[0].ID), http.StatusSeeOther)
		return nil
	}
	http.Redirect(w, r, "/jobs?type="+string(jobs.ClusterBackup), http.StatusSeeOther)
	return nil
}
