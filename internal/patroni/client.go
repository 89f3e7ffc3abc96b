package patroni

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
	"time"

	"github.com/pgtenant/pgtenant/internal/background"
)

// Roles of a Member, as Patroni's GET /cluster names them.
const (
	RoleLeader      = "leader"
	RoleSyncStandby = "sync_standby"
	RoleReplica     = "replica"
)

// ErrNoLeader is returned when the cluster has no leader (an election is
// under way, or no node can be promoted).
var ErrNoLeader = errors.New("patroni: no leader")

// Member is one node of a cluster as Patroni sees it.
type Member struct {
	Name  string `json:"name"`
	Role  string `json:"role"`  // RoleLeader, RoleSyncStandby or RoleReplica
	State string `json:"state"` // running, starting, stopped, crashed, …
	Host  string `json:"host"`
	Port  int    `json:"port"`
	// Timeline is PostgreSQL's timeline: one more after each promotion.
	Timeline int `json:"timeline"`
	// APIURL is the member's REST API, …/patroni.
	APIURL string `json:"api_url"`
	// Lag is a standby's replay lag behind the leader in bytes; -1 when
	// Patroni does not know it; 0 on the leader. (Patroni's own field is
	// "lag", a number or "unknown": Members decodes it.)
	Lag int64 `json:"lag_bytes"`
}

// Running reports whether the member's PostgreSQL runs (Patroni 3.0 says
// running for a streaming replica, later versions streaming).
func (m Member) Running() bool { return m.State == "running" || m.State == "streaming" }

// LeaderOf returns the running leader of ms.
func LeaderOf(ms []Member) (Member, bool) {
	for _, m := range ms {
		if m.Role == RoleLeader && m.Running() {
			return m, true
		}
	}
	return Member{}, false
}

// BaseURL is the root of the member's REST API (http://host:port), as
// Client.Check takes it.
func (m Member) BaseURL() string { return strings.TrimSuffix(m.APIURL, "/patroni") }

// Client talks to the REST APIs of a cluster's Patroni nodes. Any node
// answers for the whole cluster (it reads the store); the client tries the
// URLs in order and uses the first that answers.
type Client struct {
	urls []string
	hc   *http.Client
}

// NewClient returns a client of the REST APIs at urls (http://host:port).
// hc may be nil: then requests time out after 30 s (a switchover answers
// only once done).
func NewClient(urls []string, hc *http.Client) *Client {
	if hc == nil {
		hc = &http.Client{Timeout: 30 * time.Second}
	}
	return &Client{urls: urls, hc: hc}
}

// Members returns the cluster's members, by name.
func (c *Client) Members(ctx context.Context) ([]Member, error) {
	var errs []error
	for _, u := range c.urls {
		ms, err := c.members(ctx, u)
		if err == nil {
			return ms, nil
		}
		errs = append(errs, err)
	}
	return nil, fmt.Errorf("patroni members: %w", errors.Join(errs...))
}

func (c *Client) members(ctx context.Context, base string) ([]Member, error) {
	status, body, err := c.do(ctx, http.MethodGet, base+"/cluster", nil)
	if err != nil {
		return nil, err
	}
	if status != http.StatusOK {
		return nil, fmt.Errorf("GET %s/cluster: %d %s", base, status, body)
	}
	var resp struct {
		Members []struct {
			Member
			Lag json.RawMessage `json:"lag"`
		} `json:"members"`
	}
	if err := json.Unmarshal(body, &resp); err != nil {
		return nil, fmt.Errorf("GET %s/cluster: decode: %w", base, err)
	}
	ms := make([]Member, 0, len(resp.Members))
	for _, r := range resp.Members {
		m := r.Member
		// lag is a number of bytes, or "unknown", or absent on the leader.
		switch {
		case len(r.Lag) == 0:
		case json.Unmarshal(r.Lag, &m.Lag) != nil:
			m.Lag = -1
		}
		ms = append(ms, m)
	}
	return ms, nil
}

// Leader returns the running leader, or ErrNoLeader.
func (c *Client) Leader(ctx context.Context) (Member, error) {
	ms, err := c.Members(ctx)
	if err != nil {
		return Member{}, err
	}
	if m, ok := LeaderOf(ms); ok {
		return m, nil
	}
	return Member{}, ErrNoLeader
}

// WaitLeader polls until the cluster has a running leader, and returns it.
// Unreachable APIs count as no leader yet (the nodes may be starting). The
// leader is the one the store names: after a node loss that is still the
// lost node until its lock expires (ttl), so a caller waiting for a new
// leader compares names.
func (c *Client) WaitLeader(ctx context.Context) (Member, error) {
	var m Member
	err := background.Until(ctx, 200*time.Millisecond, func(ctx context.Context) (err error) {
		m, err = c.Leader(ctx)
		return err
	})
	if err != nil {
		return Member{}, fmt.Errorf("wait for a leader: %w", err)
	}
	return m, nil
}

// Switchover is a planned change of leader: Patroni stops the leader
// cleanly, promotes candidate (in synchronous mode it must be the
// synchronous standby; "" lets Patroni choose) and makes the old leader its
// standby. It returns once the new leader holds the lock.
func (c *Client) Switchover(ctx context.Context, leader, candidate string) error {
	if leader == "" {
		return errors.New("patroni switchover: the current leader's name is required")
	}
	if err := c.post(ctx, "switchover", map[string]string{"leader": leader, "candidate": candidate}, leader); err != nil {
		return fmt.Errorf("patroni switchover from %s to %q: %w", leader, candidate, err)
	}
	return nil
}

// Failover promotes candidate even when the cluster has no healthy leader:
// an operator's decision, which may lose transactions an asynchronous
// standby had not received.
func (c *Client) Failover(ctx context.Context, candidate string) error {
	if candidate == "" {
		return errors.New("patroni failover: a candidate is required")
	}
	if err := c.post(ctx, "failover", map[string]string{"candidate": candidate}, candidate); err != nil {
		return fmt.Errorf("patroni failover to %s: %w", candidate, err)
	}
	return nil
}

// post sends a switchover or failover request to the member named via (it
// answers once the change is done, as patronictl does), else to the first
// URL that answers.
func (c *Client) post(ctx context.Context, action string, req map[string]string, via string) error {
	body, err := json.Marshal(req)
	if err != nil {
		return err
	}
	urls := c.urls
	if ms, err := c.Members(ctx); err == nil {
		for _, m := range ms {
			if m.Name == via && m.APIURL != "" {
				urls = append([]string{m.BaseURL()}, urls...)
			}
		}
	}
	var errs []error
	for _, u := range urls {
		status, resp, err := c.do(ctx, http.MethodPost, u+"/"+action, body)
		if err != nil {
			errs = append(errs, err)
			continue // not reachable: try the next node
		}
		if status != http.StatusOK {
			return fmt.Errorf("%d %s", status, strings.TrimSpace(string(resp)))
		}
		return nil
	}
	return errors.Join(errs...)
}

// SynchronousMode reports whether the cluster runs in synchronous_mode
// (Patroni's dynamic configuration, GET /config).
func (c *Client) SynchronousMode(ctx context.Context) (bool, error) {
	var errs []error
	for _, u := range c.urls {
		status, body, err := c.do(ctx, http.MethodGet, u+"/config", nil)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		if status != http.StatusOK {
			return false, fmt.Errorf("GET %s/config: %d %s", u, status, body)
		}
		var cfg struct {
			SynchronousMode bool `json:"synchronous_mode"`
		}
		if err := json.Unmarshal(body, &cfg); err != nil {
			return false, fmt.Errorf("GET %s/config: decode: %w", u, err)
		}
		return cfg.SynchronousMode, nil
	}
	return false, fmt.Errorf("patroni config: %w", errors.Join(errs...))
}

// SetSynchronousMode turns synchronous_mode on or off in the cluster's
// dynamic configuration (PATCH /config); each node applies it at its next
// loop.
func (c *Client) SetSynchronousMode(ctx context.Context, on bool) error {
	body, err := json.Marshal(map[string]bool{"synchronous_mode": on})
	if err != nil {
		return err
	}
	var errs []error
	for _, u := range c.urls {
		status, resp, err := c.do(ctx, http.MethodPatch, u+"/config", body)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		if status != http.StatusOK {
			return fmt.Errorf("PATCH %s/config: %d %s", u, status, strings.TrimSpace(string(resp)))
		}
		return nil
	}
	return fmt.Errorf("patroni config: %w", errors.Join(errs...))
}

// Check is a REST health endpoint: 200 when the node is what it names,
// 503 when it is not.
type Check string

const (
	CheckHealth  Check = "/health"  // PostgreSQL is running
	CheckPrimary Check = "/primary" // the node is the leader and its PostgreSQL runs as primary
	CheckReplica Check = "/replica" // the node runs a standby
)

// Check asks the node whose REST API is at apiURL whether it passes check:
// true on 200, false on 503, an error when it does not answer.
func (c *Client) Check(ctx context.Context, apiURL string, check Check) (bool, error) {
	status, body, err := c.do(ctx, http.MethodGet, strings.TrimSuffix(apiURL, "/")+string(check), nil)
	if err != nil {
		return false, fmt.Errorf("patroni check %s: %w", check, err)
	}
	switch status {
	case http.StatusOK:
		return true, nil
	case http.StatusServiceUnavailable:
		return false, nil
	}
	return false, fmt.Errorf("patroni check %s at %s: %d %s", check, apiURL, status, body)
}

// do sends one request; err is set only when no answer came.
func (c *Client) do(ctx context.Context, method, url string, body []byte) (int, []byte, error) {
	var r io.Reader
	if body != nil {
		r = bytes.NewReader(body)
	}
	req, err := http.NewRequestWithContext(ctx, method, url, r)
	if err != nil {
		return 0, nil, err
	}
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	resp, err := c.hc.Do(req)
	if err != nil {
		return 0, nil, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	if err != nil {
		return 0, nil, fmt.Errorf("%s %s: read answer: %w", method, url, err)
	}
	return resp.StatusCode, b, nil
}
