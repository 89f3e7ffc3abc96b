package console

import (
	"bytes"
	"context"
	"io"
	"net/http"

	"github.com/pgtenant/pgtenant/internal/api"
)

// client is an API client whose requests never leave the process: they are
// served by c.API with the token the session of r logged in with (page and
// action put the session in r's context), so that every page and action
// runs the same handler, validation and service code as `pgtenant` and
// scripts do, and the API checks that token, its scope and its revocation
// and audits the call under its name. The calls carry the browser's
// address as their peer's, for the audit. A request without a session
// carries no token: the API answers 401.
func (c *Console) client(r *http.Request) *api.Client {
	ss, _ := r.Context().Value(sessionKey{}).(session)
	return &api.Client{BaseURL: "http://console.invalid", Token: ss.token,
		HTTP: &http.Client{Transport: inProcess{h: c.API, remote: r.RemoteAddr}}}
}

// sessionKey is the context key of the session a page or action serves.
type sessionKey struct{}

func withSession(ctx context.Context, ss session) context.Context {
	return context.WithValue(ctx, sessionKey{}, ss)
}

// who is whom the session of r logged in as (its token's principal).
func who(r *http.Request) api.Principal {
	ss, _ := r.Context().Value(sessionKey{}).(session)
	return ss.who
}

// inProcess is a RoundTripper that serves requests with a handler, as if
// they came from remote.
type inProcess struct {
	h      http.Handler
	remote string
}

func (t inProcess) RoundTrip(req *http.Request) (*http.Response, error) {
	w := &buffered{header: http.Header{}}
	req = req.Clone(req.Context()) // a RoundTripper must not change its request
	req.RemoteAddr = t.remote
	t.h.ServeHTTP(w, req)
	if w.status == 0 {
		w.status = http.StatusOK
	}
	return &http.Response{StatusCode: w.status, Status: http.StatusText(w.status), Proto: "HTTP/1.1", ProtoMajor: 1, ProtoMinor: 1,
		Header: w.header, Body: io.NopCloser(&w.body), ContentLength: int64(w.body.Len()), Request: req}, nil
}

// buffered is a ResponseWriter that keeps the answer in memory.
type buffered struct {
	header http.Header
	status int
	body   bytes.Buffer
}

func (b *buffered) Header() http.Header { return b.header }

func (b *buffered) WriteHeader(status int) {
	if b.status == 0 {
		b.status = status
	}
}

func (b *buffered) Write(p []byte) (int, error) {
	b.WriteHeader(http.StatusOK)
	return b.body.Write(p)
}
