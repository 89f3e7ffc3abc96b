package console

import (
	"cmp"
	"fmt"
	"html/template"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/pgtenant/pgtenant/internal/api"
	"github.com/pgtenant/pgtenant/internal/catalog"
	"github.com/pgtenant/pgtenant/internal/jobs"
	"github.com/pgtenant/pgtenant/internal/migrate"
	"github.com/pgtenant/pgtenant/internal/tenant"
)

// pageSize is the tenants on one page of the list unless ?per= (up to
// maxPageSize) says otherwise.
const pageSize, maxPageSize = 50, 500

// refreshSeconds is how often a page with work in flight reloads itself
// (<meta http-equiv="refresh">: live progress without JavaScript).
const refreshSeconds = 2

var funcs = template.FuncMap{
	"bytes": humanBytes,
	"rate":  func(f float64) string { return humanBytes(int64(f)) + "/s" },
	"ago":   func(t time.Time) string { return time.Since(t).Round(time.Second).String() + " ago" },
	// count is a rollout's tenants in one state: {{count .Counts "done"}}.
	"count": func(m map[catalog.RolloutTenantState]int, state string) int {
		return m[catalog.RolloutTenantState(state)]
	},
	"when": func(t *time.Time) string {
		if t == nil {
			return ""
		}
		return t.UTC().Format("2006-01-02 15:04:05")
	},
	"size": func(n *int64) string {
		if n == nil {
			return ""
		}
		return humanBytes(*n)
	},
	"num": func(f *float64) string {
		if f == nil {
			return ""
		}
		return strconv.FormatFloat(*f, 'f', 2, 64)
	},
	"pct": func(f *float64) string {
		if f == nil {
			return ""
		}
		return strconv.FormatFloat(*f*100, 'f', 1, 64) + "%"
	},
	"percent": func(done, total int64) int64 {
		if total <= 0 {
			return 0
		}
		return done * 100 / total
	},
	"finished": jobs.Finished,
	"query":    func(q url.Values) string { return q.Encode() },
	"with": func(q url.Values, kv ...string) string {
		out := url.Values{}
		for k, vs := range q {
			if vs[0] != "" {
				out[k] = vs
			}
		}
		for i := 0; i+1 < len(kv); i += 2 {
			if kv[i+1] == "" {
				out.Del(kv[i])
			} else {
				out.Set(kv[i], kv[i+1])
			}
		}
		return out.Encode()
	},
}

// tenants lists tenants: searched (q: the id, or part of the name or
// external id), filtered, sorted and paged. Pages by id go on from the
// last id shown; sorted ones (by size or activity) by number.
func (c *Console) tenants(w http.ResponseWriter, r *http.Request, v view) error {
	in := r.URL.Query()
	q := url.Values{}
	for _, k := range []string{"q", "state", "template", "cluster", "tier", "mode", "sort"} {
		if s := strings.TrimSpace(in.Get(k)); s != "" {
			q.Set(k, s)
		}
	}
	per := pageSize
	if n, err := strconv.Atoi(in.Get("per")); err == nil && n > 0 {
		per = min(n, maxPageSize)
		if per != pageSize {
			q.Set("per", strconv.Itoa(per))
		}
	}
	page := 0
	if q.Get("sort") != "" {
		page, _ = strconv.Atoi(in.Get("page"))
		page = max(page, 0)
		q.Set("limit", strconv.Itoa((page+1)*per+1))
	} else {
		q.Set("limit", strconv.Itoa(per+1))
		if a := in.Get("after"); a != "" {
			q.Set("after", a)
		}
	}
	filters := url.Values{} // what the page's links keep
	for k, vs := range q {
		if k != "limit" && k != "after" {
			filters[k] = vs
		}
	}
	q.Del("per")
	cl := c.client(r)
	ts, err := cl.Tenants(r.Context(), q)
	if err != nil {
		return err
	}
	if q.Get("sort") != "" {
		ts = ts[min(page*per, len(ts)):]
		if len(ts) > per {
			v["Next"] = "/tenants?" + withValues(filters, "page", strconv.Itoa(page+1))
			ts = ts[:per]
		}
		if page > 0 {
			v["Prev"] = "/tenants?" + withValues(filters, "page", strconv.Itoa(page-1))
		}
	} else {
		if len(ts) > per {
			ts = ts[:per]
			v["Next"] = "/tenants?" + withValues(filters, "after", ts[len(ts)-1].ID)
		}
		if q.Get("after") != "" {
			v["Prev"] = "/tenants?" + filters.Encode() // back to the first page
		}
	}
	tpls, err := cl.Templates(r.Context())
	if err != nil {
		return err
	}
	cls, err := c.Store.Clusters(r.Context())
	if err != nil {
		return err
	}
	v["Tenants"], v["Filters"], v["Templates"], v["ClusterNames"] = ts, filters, tpls, cls
	v["States"] = catalog.ListedStates
	v["Modes"] = tenant.Modes
	c.render(w, http.StatusOK, "tenants.html", v)
	return nil
}

func withValues(q url.Values, k, val string) string {
	out := url.Values{}
	for key, vs := range q {
		out[key] = vs
	}
	out.Set(k, val)
	return out.Encode()
}

// tenantActions are the actions of a tenant page, by name: what the
// confirmation says, and the states they apply to.
var tenantActions = map[string]struct {
	Title, Says string
	From        []catalog.TenantState
}{
	"suspend":  {"Suspend", "No one can log in as the tenant and its sessions are ended on every node, until it is resumed.", []catalog.TenantState{catalog.StateActive}},
	"resume":   {"Resume", "The tenant can log in again; its hot set is prewarmed.", []catalog.TenantState{catalog.StateSuspended}},
	"drop":     {"Drop", "The tenant can no longer log in; it is kept, restorable, for the drop retention, then purged.", []catalog.TenantState{catalog.StateActive, catalog.StateSuspended}},
	"restore":  {"Restore", "The dropped tenant comes back as it was.", []catalog.TenantState{catalog.StateDropped}},
	"purge":    {"Purge now", "The tenant is dropped (if it is not yet) and its database or schema is destroyed now: this cannot be undone.", []catalog.TenantState{catalog.StateActive, catalog.StateSuspended, catalog.StateDropped}},
	"password": {"Rotate password", "The tenant gets a new password, shown once on the next page; the old one stops working and its open sessions are ended.", []catalog.TenantState{catalog.StateActive, catalog.StateSuspended}},
}

// actionOrder is the order of the buttons on a tenant page.
var actionOrder = []string{"suspend", "resume", "password", "drop", "restore", "purge"}

type actionLink struct{ Name, Title string }

// tenant shows one tenant: its figures, quota, prewarm state, charts of
// its minute history, events and the actions its state allows.
func (c *Console) tenant(w http.ResponseWriter, r *http.Request, v view) error {
	cl := c.client(r)
	t, err := cl.Tenant(r.Context(), r.PathValue("id"))
	if err != nil {
		return err
	}
	window := r.URL.Query().Get("history")
	if _, ok := historyWindows[window]; !ok {
		window = "6h"
	}
	m, err := cl.TenantMetrics(r.Context(), t.ID, window)
	if err != nil {
		return err
	}
	var links []actionLink
	hidden := false
	for _, name := range actionOrder {
		if a := tenantActions[name]; slices.Contains(a.From, t.State) {
			if !may(who(r), "tenant/"+name) {
				hidden = true
				continue
			}
			links = append(links, actionLink{name, a.Title})
		}
	}
	if hidden {
		v["Hidden"] = fmt.Sprintf("Actions hidden: you are logged in with scope %s; a tenant's actions need scope tenants (or admin).", who(r).Scope)
	}
	v["Tenant"], v["Metrics"], v["Actions"], v["Window"] = t, m, links, window
	v["Windows"] = []string{"1h", "6h", "24h", "7d"}
	v["Charts"] = tenantCharts(m.History, historyWindows[window], c.clock())
	v["Done"] = doneMessages[r.URL.Query().Get("done")]
	if t.State == catalog.StateProvisioning || t.State == catalog.StatePurging {
		v["Refresh"] = refreshSeconds
	}
	c.render(w, http.StatusOK, "tenant.html", v)
	return nil
}

// historyWindows are the chart windows a tenant page offers.
var historyWindows = map[string]time.Duration{"1h": time.Hour, "6h": 6 * time.Hour, "24h": 24 * time.Hour, "7d": 7 * 24 * time.Hour}

// doneMessages say what an action did, after its redirect (?done=).
var doneMessages = map[string]string{
	"suspend": "Suspended.", "resume": "Resumed.", "drop": "Dropped: restorable until its purge.",
	"restore": "Restored.", "purge": "Purge started.", "continue": "The rollout goes on.", "retry": "Failed tenants queued again.",
	"cancel-job": "Cancel asked: the job stops at its next step.", "retry-job": "The job is queued again.",
	"switchover": "Switchover started: the cluster's clients wait in its PgBouncer while the leader changes.",
}

// confirmTenant is the confirmation page of a tenant action (GET); its
// form posts the same path.
func (c *Console) confirmTenant(w http.ResponseWriter, r *http.Request, v view) error {
	a, ok := tenantActions[r.PathValue("action")]
	if !ok {
		http.NotFound(w, r)
		return nil
	}
	t, err := c.client(r).Tenant(r.Context(), r.PathValue("id"))
	if err != nil {
		return err
	}
	v["Title"], v["Says"], v["Action"] = a.Title, a.Says, r.URL.Path
	v["Refused"] = refusal(who(r), "tenant/"+r.PathValue("action"))
	v["What"] = fmt.Sprintf("tenant %s (%s, %s)", t.ID, t.Name, t.State)
	v["Back"] = "/tenants/" + t.ID
	v["Danger"] = r.PathValue("action") == "purge" || r.PathValue("action") == "drop"
	c.render(w, http.StatusOK, "confirm.html", v)
	return nil
}

// tenantAction runs a confirmed tenant action through the API, then goes
// back to the tenant page (a purge's job page; the new password's page).
func (c *Console) tenantAction(w http.ResponseWriter, r *http.Request, v view) error {
	id, name := r.PathValue("id"), r.PathValue("action")
	cl, ctx := c.client(r), r.Context()
	var res api.LifecycleResponse
	var err error
	switch name {
	case "suspend", "resume", "restore":
		res, err = cl.TenantAction(ctx, id, name)
	case "drop":
		res, err = cl.DropTenant(ctx, id, false)
	case "purge":
		res, err = cl.DropTenant(ctx, id, true)
	case "password":
		pw, err := cl.RotatePassword(ctx, id, false)
		if err != nil {
			return err
		}
		v["Rotated"] = pw
		c.render(w, http.StatusOK, "password.html", v)
		return nil
	default:
		http.NotFound(w, r)
		return nil
	}
	if err != nil {
		return err
	}
	if res.Job != nil {
		http.Redirect(w, r, fmt.Sprintf("/jobs/%d", res.Job.ID), http.StatusSeeOther)
		return nil
	}
	http.Redirect(w, r, "/tenants/"+url.PathEscape(id)+"?done="+name, http.StatusSeeOther)
	return nil
}

// jobs lists jobs, newest first, refreshing while any is unfinished.
func (c *Console) jobs(w http.ResponseWriter, r *http.Request, v view) error {
	in := r.URL.Query()
	q := url.Values{"limit": {"100"}}
	for _, k := range []string{"state", "type", "target"} {
		if s := strings.TrimSpace(in.Get(k)); s != "" {
			q.Set(k, s)
		}
	}
	js, err := c.client(r).Jobs(r.Context(), q)
	if err != nil {
		return err
	}
	for _, j := range js {
		if !jobs.Finished(j.State) && j.State != jobs.Paused {
			v["Refresh"] = refreshSeconds
			break
		}
	}
	v["Jobs"], v["Filters"] = js, q
	v["States"] = []jobs.State{jobs.Active, jobs.Queued, jobs.Running, jobs.Waiting, jobs.Paused, jobs.Succeeded, jobs.Failed, jobs.Cancelled}
	c.render(w, http.StatusOK, "jobs.html", v)
	return nil
}

// job shows one job with its steps, refreshing until it ends.
func (c *Console) job(w http.ResponseWriter, r *http.Request, v view) error {
	id, err := strconv.ParseInt(r.PathValue("id"), 10, 64)
	if err != nil {
		http.NotFound(w, r)
		return nil
	}
	j, err := c.client(r).Job(r.Context(), id)
	if err != nil {
		return err
	}
	if !jobs.Finished(j.State) && j.State != jobs.Paused {
		v["Refresh"] = refreshSeconds
	}
	v["Job"] = j
	v["CanCancel"] = !jobs.Finished(j.State) && !j.CancelRequested && may(who(r), "job/cancel")
	v["CanRetry"] = (j.State == jobs.Failed || j.State == jobs.Cancelled) && may(who(r), "job/retry")
	v["Done"] = doneMessages[r.URL.Query().Get("done")]
	c.render(w, http.StatusOK, "job.html", v)
	return nil
}

var jobActions = map[string][2]string{
	"cancel": {"Cancel the job", "The job stops at its next step and cleans up after itself; a cancelled job can be retried."},
	"retry":  {"Retry the job", "The job is queued again and resumes after its last completed step."},
}

func (c *Console) confirmJob(w http.ResponseWriter, r *http.Request, v view) error {
	a, ok := jobActions[r.PathValue("action")]
	if !ok {
		http.NotFound(w, r)
		return nil
	}
	v["Title"], v["Says"], v["Action"] = a[0], a[1], r.URL.Path
	v["Refused"] = refusal(who(r), "job/"+r.PathValue("action"))
	v["What"] = "job " + r.PathValue("id")
	v["Back"] = "/jobs/" + r.PathValue("id")
	v["Danger"] = r.PathValue("action") == "cancel"
	c.render(w, http.StatusOK, "confirm.html", v)
	return nil
}

func (c *Console) jobAction(w http.ResponseWriter, r *http.Request, v view) error {
	id, err := strconv.ParseInt(r.PathValue("id"), 10, 64)
	if err != nil {
		http.NotFound(w, r)
		return nil
	}
	switch r.PathValue("action") {
	case "cancel":
		_, err = c.client(r).CancelJob(r.Context(), id)
	case "retry":
		_, err = c.client(r).RetryJob(r.Context(), id)
	default:
		http.NotFound(w, r)
		return nil
	}
	if err != nil {
		return err
	}
	http.Redirect(w, r, fmt.Sprintf("/jobs/%d?done=%s-job", id, r.PathValue("action")), http.StatusSeeOther)
	return nil
}

// template shows a template's versions and tenants by version, with the
// form that starts a rollout.
func (c *Console) template(w http.ResponseWriter, r *http.Request, v view) error {
	d, err := c.client(r).Template(r.Context(), r.PathValue("name"))
	if err != nil {
		return err
	}
	ros, err := c.client(r).Rollouts(r.Context(), url.Values{"template": {d.Name}, "limit": {"10"}})
	if err != nil {
		return err
	}
	v["Template"], v["Rollouts"] = d, ros
	v["CanRollout"] = may(who(r), "template/rollout")
	v["Scope"] = who(r).Scope
	c.render(w, http.StatusOK, "template.html", v)
	return nil
}

// rolloutRequest reads the start-rollout form.
func rolloutRequest(r *http.Request) (migrate.Request, error) {
	req := migrate.Request{Template: r.PathValue("name"), Cluster: strings.TrimSpace(r.FormValue("cluster"))}
	for _, f := range []struct {
		name string
		dst  *int
	}{{"to", &req.To}, {"canary", &req.Canary}, {"parallel", &req.Parallel}} {
		if s := strings.TrimSpace(r.FormValue(f.name)); s != "" {
			n, err := strconv.Atoi(s)
			if err != nil || n < 0 {
				return req, &api.Error{Status: http.StatusBadRequest, Code: "invalid", Message: fmt.Sprintf("%s %q: a number", f.name, s)}
			}
			*f.dst = n
		}
	}
	return req, nil
}

// confirmStartRollout shows the plan of a rollout (a dry run through the
// API) and asks to start it.
func (c *Console) confirmStartRollout(w http.ResponseWriter, r *http.Request, v view) error {
	req, err := rolloutRequest(r)
	if err != nil {
		return err
	}
	req.DryRun = true
	plan, err := c.client(r).StartRollout(r.Context(), req)
	if err != nil {
		return err
	}
	v["Title"] = "Start the rollout"
	v["What"] = fmt.Sprintf("template %s to version %d: %d tenants to migrate", plan.Plan.Template, plan.Plan.To, plan.Plan.Tenants)
	v["Says"] = "Tenants are migrated one transaction per version each; with a canary, the rollout pauses after that many tenants until you continue it."
	v["Action"] = r.URL.Path
	v["Fields"] = map[string]string{"to": strconv.Itoa(plan.Plan.To), "canary": strconv.Itoa(req.Canary), "parallel": strconv.Itoa(req.Parallel), "cluster": req.Cluster}
	v["Back"] = "/templates/" + url.PathEscape(req.Template)
	c.render(w, http.StatusOK, "confirm.html", v)
	return nil
}

func (c *Console) startRollout(w http.ResponseWriter, r *http.Request, v view) error {
	req, err := rolloutRequest(r)
	if err != nil {
		return err
	}
	st, err := c.client(r).StartRollout(r.Context(), req)
	if err != nil {
		return err
	}
	if st.Rollout == nil {
		return &api.Error{Status: http.StatusInternalServerError, Code: "internal", Message: "the API started no rollout"}
	}
	http.Redirect(w, r, fmt.Sprintf("/rollouts/%d", st.Rollout.ID), http.StatusSeeOther)
	return nil
}

// rollouts lists rollouts, refreshing while one runs.
func (c *Console) rollouts(w http.ResponseWriter, r *http.Request, v view) error {
	ros, err := c.client(r).Rollouts(r.Context(), url.Values{"limit": {"100"}})
	if err != nil {
		return err
	}
	for _, ro := range ros {
		if rolloutRunning(ro.State) {
			v["Refresh"] = refreshSeconds
		}
	}
	v["Rollouts"] = ros
	c.render(w, http.StatusOK, "rollouts.html", v)
	return nil
}

func rolloutRunning(state catalog.RolloutState) bool {
	return state == catalog.RolloutQueued || state == catalog.RolloutBuilding || state == catalog.RolloutMigrating
}

// rollout shows a rollout with every tenant's status and error, and its
// actions: continue (paused after its canary), retry (failed tenants).
func (c *Console) rollout(w http.ResponseWriter, r *http.Request, v view) error {
	id, err := strconv.ParseInt(r.PathValue("id"), 10, 64)
	if err != nil {
		http.NotFound(w, r)
		return nil
	}
	st, err := c.client(r).Rollout(r.Context(), id, url.Values{"state": {"all"}, "limit": {"1000"}})
	if err != nil {
		return err
	}
	if rolloutRunning(st.State) {
		v["Refresh"] = refreshSeconds
	}
	v["Rollout"] = st
	v["CanContinue"] = st.State == catalog.RolloutPaused && may(who(r), "rollout/continue")
	v["CanRetry"] = (st.Counts[catalog.RolloutTenantFailed] > 0 || st.State == catalog.RolloutFailed) && may(who(r), "rollout/retry")
	v["Done"] = doneMessages[r.URL.Query().Get("done")]
	c.render(w, http.StatusOK, "rollout.html", v)
	return nil
}

var rolloutActions = map[string][2]string{
	"continue": {"Continue the rollout", "The canary's tenants are done: the rest of the tenants are migrated."},
	"retry":    {"Retry the failed tenants", "Tenants whose migration failed are queued again; the rollout runs until they are done or fail again."},
}

func (c *Console) confirmRollout(w http.ResponseWriter, r *http.Request, v view) error {
	a, ok := rolloutActions[r.PathValue("action")]
	if !ok {
		http.NotFound(w, r)
		return nil
	}
	v["Title"], v["Says"], v["Action"] = a[0], a[1], r.URL.Path
	v["Refused"] = refusal(who(r), "rollout/"+r.PathValue("action"))
	v["What"] = "rollout " + r.PathValue("id")
	v["Back"] = "/rollouts/" + r.PathValue("id")
	c.render(w, http.StatusOK, "confirm.html", v)
	return nil
}

func (c *Console) rolloutAction(w http.ResponseWriter, r *http.Request, v view) error {
	id, err := strconv.ParseInt(r.PathValue("id"), 10, 64)
	if err != nil {
		http.NotFound(w, r)
		return nil
	}
	switch r.PathValue("action") {
	case "continue":
		_, err = c.client(r).ContinueRollout(r.Context(), id)
	case "retry":
		_, err = c.client(r).RetryRollout(r.Context(), id, "")
	default:
		http.NotFound(w, r)
		return nil
	}
	if err != nil {
		return err
	}
	http.Redirect(w, r, fmt.Sprintf("/rollouts/%d?done=%s", id, r.PathValue("action")), http.StatusSeeOther)
	return nil
}

// clusters shows each cluster probed now, with its standbys and the
// history of its lag and pacer kept by Run.
func (c *Console) clusters(w http.ResponseWriter, r *http.Request, v view) error {
	cls, err := c.client(r).Clusters(r.Context())
	if err != nil {
		return err
	}
	waiting, err := c.client(r).Jobs(r.Context(), url.Values{"state": {string(jobs.Waiting)}, "limit": {"100"}})
	if err != nil {
		return err
	}
	// Clusters Patroni runs: their members, from Patroni now.
	var patroniClusters []api.ClusterDetail
	for _, cl := range cls {
		if len(cl.Patroni) == 0 {
			continue
		}
		d, err := c.client(r).Cluster(r.Context(), cl.Name)
		if err != nil {
			return err
		}
		patroniClusters = append(patroniClusters, d)
	}
	v["Clusters"], v["Waiting"], v["Patroni"] = cls, waiting, patroniClusters
	v["CanSwitchover"] = may(who(r), "cluster/switchover")
	v["Done"] = doneMessages[r.URL.Query().Get("done")]
	v["Charts"] = c.clusterCharts(c.clock())
	v["Refresh"] = 10
	c.render(w, http.StatusOK, "clusters.html", v)
	return nil
}

// confirmSwitchover is the confirmation page of a Patroni cluster's
// switchover to a member (?to=; none: Patroni's choice).
func (c *Console) confirmSwitchover(w http.ResponseWriter, r *http.Request, v view) error {
	name, to := r.PathValue("name"), r.URL.Query().Get("to")
	if _, err := c.client(r).Cluster(r.Context(), name); err != nil {
		return err
	}
	v["Title"] = "Switch over"
	v["Refused"] = refusal(who(r), "cluster/switchover")
	v["What"] = "cluster " + name + ": the leader hands over to " + cmp.Or(to, "the synchronous standby")
	v["Says"] = "The cluster's PgBouncer pauses its clients (transactions in flight end; session-mode clients lose their server connection once), " +
		"Patroni stops the leader cleanly and promotes the standby, pgtenant follows it, and the clients go on through the same DSN. The old leader rejoins as a standby."
	v["Action"], v["Back"] = r.URL.Path, "/clusters"
	v["Fields"] = map[string]string{"to": to}
	c.render(w, http.StatusOK, "confirm.html", v)
	return nil
}

// switchover starts a confirmed switchover through the API and shows its
// job.
func (c *Console) switchover(w http.ResponseWriter, r *http.Request, v view) error {
	j, err := c.client(r).Switchover(r.Context(), r.PathValue("name"), api.SwitchoverRequest{To: r.PostFormValue("to")})
	if err != nil {
		return err
	}
	http.Redirect(w, r, fmt.Sprintf("/jobs/%d?done=switchover", j.ID), http.StatusSeeOther)
	return nil
}
