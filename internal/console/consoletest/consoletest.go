// Package consoletest is a test client of the web console: a cookie jar
// that does not follow redirects, so that a test sees each answer, logs in
// with the API token and posts forms with their CSRF token.
package consoletest

import (
	"io"
	"net/http"
	"net/http/cookiejar"
	"net/url"
	"regexp"
	"strings"
	"testing"
)

// Browser is a console session.
type Browser struct {
	t    testing.TB
	base string
	hc   *http.Client
}

// New returns a browser of the console at base (http://host:port), not
// logged in.
func New(t testing.TB, base string) *Browser {
	jar, _ := cookiejar.New(nil)
	return &Browser{t: t, base: base, hc: &http.Client{Jar: jar,
		CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}}
}

// Login logs in with the API token and fails the test unless the console
// sends the browser to its overview.
func (b *Browser) Login(token string) {
	b.t.Helper()
	if status, loc, body := b.Post("/login", b.base, url.Values{"token": {token}}); status != http.StatusSeeOther || loc != "/" {
		b.t.Fatalf("console login: %d %s %s", status, loc, body)
	}
}

// Get fetches path and returns the status and the body.
func (b *Browser) Get(path string) (int, string) {
	b.t.Helper()
	resp, err := b.hc.Get(b.base + path)
	if err != nil {
		b.t.Fatal(err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(body)
}

// Post posts form to path with origin as its Origin header (none when
// ""), and returns the status, the Location and the body.
func (b *Browser) Post(path, origin string, form url.Values) (int, string, string) {
	b.t.Helper()
	req, _ := http.NewRequest(http.MethodPost, b.base+path, strings.NewReader(form.Encode()))
	req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	if origin != "" {
		req.Header.Set("Origin", origin)
	}
	resp, err := b.hc.Do(req)
	if err != nil {
		b.t.Fatal(err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, resp.Header.Get("Location"), string(body)
}

// Confirm opens the confirmation page at path (a GET) and posts its form
// as a click on its button does, with the page's CSRF token and hidden
// fields; it returns the status and the Location of the answer.
func (b *Browser) Confirm(path string) (int, string) {
	b.t.Helper()
	status, page := b.Get(path)
	m := CSRF.FindStringSubmatch(page)
	if status != http.StatusOK || m == nil {
		b.t.Fatalf("confirmation page %s: %d, no form:\n%s", path, status, page)
	}
	form := url.Values{}
	for _, f := range hiddenRE.FindAllStringSubmatch(page, -1) {
		form.Set(f[1], f[2])
	}
	action, _, _ := strings.Cut(path, "?")
	status, loc, _ := b.Post(action, b.base, form)
	return status, loc
}

// CSRF finds a form's CSRF token (its first group) in a page.
var CSRF = regexp.MustCompile(`name="csrf" value="([^"]+)"`)

var hiddenRE = regexp.MustCompile(`<input type="hidden" name="([^"]+)" value="([^"]*)">`)
