package api

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strings"
	"time"

	"github.com/pgtenant/pgtenant/internal/cluster"
)

// Client calls the API. The CLI and the tests use it.
type Client struct {
	BaseURL string // e.g. http://127.0.0.1:8080
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
	req, err := http.NewRequestWithContext(ctx, method, c.BaseURL+path, rd)
	if err != nil {
		return err
	}
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	if c.Token != "" {
		req.Header.Set("Authorization", "Bearer "+c.Token)
	}
	resp, err := c.HTTP.Do(req)
	if err != nil {
		return fmt.Errorf("%w: pgtenant server at %s: %v (is the daemon running? start it with `pgtenant up`, or set --server / PGTENANT_SERVER)",
			cluster.ErrUnavailable, c.BaseURL, err)
	}
	defer resp.Body.Close()
	data, err := io.ReadAll(resp.Body)
	if err != nil {
		return err
	}
	if resp.StatusCode >= 400 {
		var eb ErrorBody
		if json.Unmarshal(data, &eb) == nil && eb.Error.Message != "" {
			return &Error{Status: resp.StatusCode, Code: eb.Error.Code, Message: eb.Error.Message}
		}
		return &Error{Status: resp.StatusCode, Code: "http", Message: fmt.Sprintf("%s %s: %s", method, path, resp.Status)}
	}
	if out != nil {
		if err := json.Unmarshal(data, out); err != nil {
			return fmt.Errorf("decode %s answer: %w", path, err)
		}
	}
	return nil
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
