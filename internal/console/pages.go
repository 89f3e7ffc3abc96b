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

// navLink is an entry of the header's navigation.
type navLink struct{ Name, Href string }

// nav is the header's navigation, in order.
var nav = []navLink{{"Overview", "/"}, {"Tenants", "/tenants"}, {"Templates", "/templates"}, {"Jobs", "/jobs"},
	{"Rollouts", "/rollouts"}, {"Clusters", "/clusters"}, {"Backups", "/backups"}, {"Doctor", "/doctor"},
	{"Reconcile", "/reconcile"}, {"Audit", "/audit"}}

var funcs = template.FuncMap{
	"navLinks": func() []navLink { return nav },
	// active says whether the page at path belongs under the nav link href.
	"active": func(p any, href string) bool {
		path, _ := p.(string) // a page rendered without one (a test) has none
		if href == "/" {
			return path == "/"
		}
		return path == href || strings.HasPrefix(path, href+"/") || (href == "/rollouts" && strings.HasPrefix(path, "/rollouts"))
	},
	// badge is the CSS class of a state's colour: ok, warn, bad, run or
	// idle (grey).
	"badge": badgeClass,
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
	"canary":   func(set map[string]bool, id string) bool { return set[id] },
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

// tenantActionDef is an action of a tenant page: what its confirmation
// says, the states it applies to, and the form fields it carries (chosen
// on the tenant page, shown on the confirmation, posted with it).
type tenantActionDef struct {
	Title, Says string
	From        []catalog.TenantState
	Fields      []string
	// Show, when set, says whether this tenant offers it at all.
	Show func(api.Tenant) bool
}

// live are the states of a tenant that can log in, or be let in again.
var live = []catalog.TenantState{catalog.StateActive, catalog.StateSuspended}

// tenantActions are the actions of a tenant page, by name.
var tenantActions = map[string]tenantActionDef{
	"suspend":  {Title: "Suspend", Says: "No one can log in as the tenant and its sessions are ended on every node, until it is resumed.", From: []catalog.TenantState{catalog.StateActive}},
	"resume":   {Title: "Resume", Says: "The tenant can log in again; its hot set is prewarmed.", From: []catalog.TenantState{catalog.StateSuspended}},
	"drop":     {Title: "Drop", Says: "The tenant can no longer log in; it is kept, restorable, for the drop retention, then purged.", From: live},
	"restore":  {Title: "Restore", Says: "The dropped tenant comes back as it was.", From: []catalog.TenantState{catalog.StateDropped}},
	"purge":    {Title: "Purge now", Says: "The tenant is dropped (if it is not yet) and its database or schema is destroyed now: this cannot be undone.", From: []catalog.TenantState{catalog.StateActive, catalog.StateSuspended, catalog.StateDropped}},
	"password": {Title: "Rotate password", Says: "The tenant gets a new password, shown once on the next page; the old one stops working and its open sessions are ended.", From: live},
	"analytics-enable": {Title: "Enable analytics", Says: "The tenant's tables are mirrored, as they change, into a columnar copy it can query on the analytics port with its own login.",
		From: []catalog.TenantState{catalog.StateActive}, Show: func(t api.Tenant) bool { return t.Analytics == nil || !t.Analytics.Enabled }},
	"analytics-disable": {Title: "Disable analytics", Says: "The tenant's columnar mirror is stopped and removed, with its replication slot; the tenant itself is untouched.",
		From: live, Show: func(t api.Tenant) bool {
			return t.Analytics != nil && t.Analytics.Enabled && t.Analytics.State != "disabling"
		}},
	"move": {Title: "Move", Says: "A job copies the tenant to the other cluster while it keeps running, then switches it over in a short pause; its DSN's host changes to the new cluster's.",
		From: []catalog.TenantState{catalog.StateActive}, Fields: []string{"to"}},
	"rewind": {Title: "Rewind", Says: "A job takes the tenant back, in place, to that time, from the cluster's backups and archived WAL: what it wrote since is lost. Its sessions are ended while it runs.",
		From: []catalog.TenantState{catalog.StateActive, catalog.StateSuspended}, Fields: []string{"to"}},
	"fork": {Title: "Fork", Says: "A new tenant is made as a copy of this one (as of a time in its recovery window, or now); its password is shown once on the next page. This tenant is untouched.",
		From: []catalog.TenantState{catalog.StateActive, catalog.StateSuspended}, Fields: []string{"name", "at"}},
}

// actionOrder is the order of the buttons on a tenant page; formOrder the
// actions it offers as small forms instead (their fields first).
var (
	actionOrder = []string{"suspend", "resume", "password", "analytics-enable", "analytics-disable", "drop", "restore", "purge"}
	formOrder   = []string{"move", "rewind", "fork"}
)

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
		window = fitWindow(c.clock().Sub(cmp.Or(derefTime(t.ClaimedAt), t.CreatedAt)))
	}
	m, err := cl.TenantMetrics(r.Context(), t.ID, window)
	if err != nil {
		return err
	}
	var links []actionLink
	hidden := false
	for _, name := range actionOrder {
		if a := tenantActions[name]; slices.Contains(a.From, t.State) && (a.Show == nil || a.Show(t)) {
			if !may(who(r), "tenant/"+name) {
				hidden = true
				continue
			}
			links = append(links, actionLink{name, a.Title})
		}
	}
	forms := map[string]bool{}
	var formsHidden []string
	for _, name := range formOrder {
		if a := tenantActions[name]; slices.Contains(a.From, t.State) {
			if may(who(r), "tenant/"+name) {
				forms[name] = true
			} else if !hidden {
				need, _ := routeScope(actionRoutes["tenant/"+name])
				formsHidden = append(formsHidden, fmt.Sprintf("%s needs scope %s", strings.ToLower(a.Title), need))
			}
		}
	}
	if len(formsHidden) > 0 {
		v["FormsHidden"] = fmt.Sprintf("Hidden: you are logged in with scope %s; %s (or admin).", who(r).Scope, strings.Join(formsHidden, ", "))
	}
	if forms["move"] {
		cls, err := cl.Clusters(r.Context())
		if err != nil {
			return err
		}
		var to []string
		for _, x := range cls {
			if x.Name != t.Cluster && !x.Draining {
				to = append(to, x.Name)
			}
		}
		v["MoveTo"] = to
	}
	if hidden {
		v["Hidden"] = fmt.Sprintf("Actions hidden: you are logged in with scope %s; a tenant's actions need scope tenants (or admin).", who(r).Scope)
	}
	v["Forms"] = forms
	v["PageTitle"] = "Tenant " + t.ID + " " + t.Name
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

// fitWindow is the chart window a tenant of age age is shown over unless
// the page asks for another: the shortest that holds its whole life, so a
// tenant made a minute ago is not a dot at the end of six empty hours.
func fitWindow(age time.Duration) string {
	for _, w := range []string{"1h", "6h", "24h"} {
		if age <= historyWindows[w] {
			return w
		}
	}
	return "7d"
}

func derefTime(t *time.Time) time.Time {
	if t == nil {
		return time.Time{}
	}
	return *t
}

// historyWindows are the chart windows a tenant page offers.
var historyWindows = map[string]time.Duration{"1h": time.Hour, "6h": 6 * time.Hour, "24h": 24 * time.Hour, "7d": 7 * 24 * time.Hour}

// doneMessages say what an action did, after its redirect (?done=).
var doneMessages = map[string]string{
	"suspend": "Suspended.", "resume": "Resumed.", "drop": "Dropped: restorable until its purge.",
	"restore": "Restored.", "purge": "Purge started.", "continue": "The rollout goes on.", "retry": "Failed tenants queued again.",
	"cancel-job": "Cancel asked: the job stops at its next step.", "retry-job": "The job is queued again.",
	"switchover":       "Switchover started: the cluster's clients wait in its PgBouncer while the leader changes.",
	"analytics-enable": "Analytics enabled: the mirror is being made.", "analytics-disable": "Analytics disabled.",
	"move": "Move started.", "rewind": "Rewind started.", "fork": "Fork started.",
	"drain": "Drain started: no new tenant is placed there, and its tenants are moved away.", "undrain": "Undrained: the cluster takes new tenants again.",
	"backup": "Backup started.",
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
	fields := map[string]string{}
	for _, f := range a.Fields {
		fields[f] = strings.TrimSpace(r.URL.Query().Get(f))
	}
	switch name := r.PathValue("action"); {
	case name == "move":
		v["What"] = fmt.Sprintf("%s: from cluster %s to %s", v["What"], t.Cluster, fields["to"])
	case name == "rewind":
		v["What"] = fmt.Sprintf("%s: back to %s", v["What"], fields["to"])
	case name == "fork":
		into := "a new tenant"
		if fields["name"] != "" {
			into = fmt.Sprintf("a new tenant %q", fields["name"])
		}
		v["What"] = fmt.Sprintf("%s: into %s, as of %s", v["What"], into, cmp.Or(fields["at"], "now"))
	}
	if len(fields) > 0 {
		v["Fields"] = fields
	}
	v["Back"] = "/tenants/" + t.ID
	v["Danger"] = slices.Contains([]string{"purge", "drop", "rewind"}, r.PathValue("action"))
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
	case "analytics-enable":
		_, err = cl.EnableAnalytics(ctx, id, nil)
	case "analytics-disable":
		_, err = cl.DisableAnalytics(ctx, id)
	case "move", "rewind":
		j, err := c.moveOrRewind(r, id, name)
		if err != nil {
			return err
		}
		http.Redirect(w, r, fmt.Sprintf("/jobs/%d?done=%s", j.ID, name), http.StatusSeeOther)
		return nil
	case "fork":
		req, err := forkRequest(r)
		if err != nil {
			return err
		}
		res, err := cl.ForkTenant(ctx, id, req)
		if err != nil {
			return err
		}
		v["Created"], v["ForkOf"], v["PageTitle"] = res, id, "Fork of "+id
		c.render(w, http.StatusOK, "created.html", v)
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

// jobsPerPage is the jobs on one page of the list unless ?per= says
// otherwise (up to maxPageSize).
const jobsPerPage = 50

// jobs lists jobs, newest first, filtered and paged, refreshing while any
// shown is unfinished. Background builds (tenant.build: the spares the
// pools keep, and cold-path tenants) are hidden unless ?builds=1 or the
// type filter asks for them: a busy pool would bury everything else.
// The API pages by a limit only, so page N asks for the first (N+1)*per
// jobs (more when builds are hidden) and shows its end.
func (c *Console) jobs(w http.ResponseWriter, r *http.Request, v view) error {
	in := r.URL.Query()
	filters := url.Values{}
	for _, k := range []string{"state", "type", "target"} {
		if s := strings.TrimSpace(in.Get(k)); s != "" {
			filters.Set(k, s)
		}
	}
	builds := in.Get("builds") == "1" || filters.Get("type") == string(jobs.TenantBuild)
	if in.Get("builds") == "1" {
		filters.Set("builds", "1")
	}
	per := jobsPerPage
	if n, err := strconv.Atoi(in.Get("per")); err == nil && n > 0 {
		per = min(n, maxPageSize)
		if per != jobsPerPage {
			filters.Set("per", strconv.Itoa(per))
		}
	}
	page, _ := strconv.Atoi(in.Get("page"))
	page = max(page, 0)
	want := (page+1)*per + 1 // one more: is there a next page?
	var js []jobs.Job
	hidden := 0
	for limit := want; ; limit *= 4 {
		q := url.Values{"limit": {strconv.Itoa(limit)}}
		for _, k := range []string{"state", "type", "target"} {
			if s := filters.Get(k); s != "" {
				q.Set(k, s)
			}
		}
		all, err := c.client(r).Jobs(r.Context(), q)
		if err != nil {
			return err
		}
		js, hidden = js[:0], 0
		for _, j := range all {
			if !builds && j.Type == jobs.TenantBuild {
				hidden++
				continue
			}
			js = append(js, j)
		}
		if len(js) >= want || len(all) < limit || limit >= 10000 {
			break
		}
	}
	js = js[min(page*per, len(js)):]
	if len(js) > per {
		js = js[:per]
		v["Next"] = "/jobs?" + withValues(filters, "page", strconv.Itoa(page+1))
	}
	if page > 0 {
		v["Prev"] = "/jobs?" + withValues(filters, "page", strconv.Itoa(page-1))
	}
	v["Builds"], v["HiddenBuilds"] = builds, hidden
	v["ShowBuilds"] = "/jobs?" + withValues(filters, "builds", "1")
	v["Types"] = jobs.Types
	for _, j := range js {
		if !jobs.Finished(j.State) && j.State != jobs.Paused {
			v["Refresh"] = refreshSeconds
			break
		}
	}
	v["Jobs"], v["Filters"] = js, filters
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
	v["PageTitle"] = fmt.Sprintf("Job %d %s", j.ID, j.Type)
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
	v["PageTitle"] = "Template " + d.Name
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
	v["PageTitle"] = fmt.Sprintf("Rollout %d", st.ID)
	canary := map[string]bool{}
	for _, ct := range st.CanaryTenants {
		canary[ct.Tenant] = true
	}
	v["Canary"] = canary
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
	v["CanDrain"], v["CanUndrain"] = may(who(r), "cluster/drain"), may(who(r), "cluster/undrain")
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
