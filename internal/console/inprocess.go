package console

import (
	"bytes"
	"io"
	"net/http"

	"github.com/pgtenant/pgtenant/internal/api"
)

// client is an API client whose requests never leave the process: they are
// served by c.API, with the token, so that every page and action runs the
// same handler, validation and service code as `pgtenant` and scripts do.
func (c *Console) client() *api.Client {
	return &api.Client{BaseURL: "http://console.invalid", Token: c.Token, HTTP: &http.Client{Transport: inProcess{c.API}}}
}

// inProcess is a RoundTripper that serves requests with a handler.
type inProcess struct{ h http.Handler }

func (t inProcess) RoundTrip(req *http.Request) (*http.Response, error) {
	w := &buffered{header: http.Header{}}
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
