package console

import (
	"errors"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"strings"

	"github.com/pgtenant/pgtenant/internal/api"
)

// auditLimit is the entries the audit page shows unless ?limit= says
// otherwise (the API bounds it).
const auditLimit = 200

// auditRow is one entry of the audit page, its target written out.
type auditRow struct {
	api.AuditEntry
	Targets string // "id=t_…", the route's path values
	Tenant  string // the tenant the call named, for a link
}

// audit lists the API's audit log, newest first, through GET /v1/audit
// in-process: the page shows what the API answers to the session's token,
// and a refusal (a malformed since, a scope the route would not allow) is
// the API's status and message, shown above the filter form.
func (c *Console) audit(w http.ResponseWriter, r *http.Request, v view) error {
	in := r.URL.Query()
	q := url.Values{"limit": {strconv.Itoa(auditLimit)}}
	since, limit := strings.TrimSpace(in.Get("since")), strings.TrimSpace(in.Get("limit"))
	if since != "" {
		q.Set("since", since)
	}
	if limit != "" {
		q.Set("limit", limit)
	}
	v["Since"], v["Limit"] = since, q.Get("limit")
	es, err := c.client(r).Audit(r.Context(), q)
	var ae *api.Error
	if errors.As(err, &ae) && ae.Status < 500 {
		v["Refused"] = ae.Message
		c.render(w, ae.Status, "audit.html", v)
		return nil
	}
	if err != nil {
		return err
	}
	rows := make([]auditRow, len(es))
	for i, e := range es {
		keys := make([]string, 0, len(e.Target))
		for k := range e.Target {
			keys = append(keys, k)
		}
		slices.Sort(keys)
		parts := make([]string, len(keys))
		for j, k := range keys {
			parts[j] = k + "=" + e.Target[k]
		}
		rows[i] = auditRow{AuditEntry: e, Targets: strings.Join(parts, " ")}
		if strings.HasPrefix(e.Route, "/v1/tenants/{id}") {
			rows[i].Tenant = e.Target["id"]
		}
	}
	v["Entries"] = rows
	v["More"] = strconv.Itoa(len(rows)) == q.Get("limit")
	c.render(w, http.StatusOK, "audit.html", v)
	return nil
}
