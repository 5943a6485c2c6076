package proxy_test

import (
	"bufio"
	"bytes"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/ratelimit-proxy/ratelimit-proxy/config"
	"github.com/ratelimit-proxy/ratelimit-proxy/proxy"
)

// rawConn is a client that writes bytes as they are: a request line and
// headers whose body it sends only when told to.
type rawConn struct {
	t  *testing.T
	c  net.Conn
	br *bufio.Reader
}

func dialRaw(t *testing.T, srv *httptest.Server) *rawConn {
	t.Helper()
	c, err := net.Dial("tcp", srv.Listener.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return &rawConn{t: t, c: c, br: bufio.NewReader(c)}
}

func (rc *rawConn) write(s string) {
	rc.t.Helper()
	if _, err := io.WriteString(rc.c, s); err != nil {
		rc.t.Fatal(err)
	}
}

// head sends a POST's request line and headers (each "Name: value"),
// without its body.
func (rc *rawConn) head(path string, length int, hdr ...string) {
	rc.t.Helper()
	var b strings.Builder
	fmt.Fprintf(&b, "POST %s HTTP/1.1\r\nHost: proxy.test\r\nContent-Type: application/json\r\nContent-Length: %d\r\n", path, length)
	for _, h := range hdr {
		b.WriteString(h + "\r\n")
	}
	b.WriteString("\r\n")
	rc.write(b.String())
}

// response reads the next response, an interim 1xx included.
func (rc *rawConn) response() *http.Response {
	rc.t.Helper()
	rc.c.SetReadDeadline(time.Now().Add(5 * time.Second))
	res, err := http.ReadResponse(rc.br, nil)
	if err != nil {
		rc.t.Fatalf("reading the response: %v", err)
	}
	if res.StatusCode >= 200 {
		b, _ := io.ReadAll(res.Body)
		res.Body = io.NopCloser(bytes.NewReader(b))
	}
	return res
}

// fixtureServer serves the fixture's handler on a real listener (with
// realClock: the body's read deadline is set from the proxy's clock).
func fixtureServer(t *testing.T, f *fixture) *httptest.Server {
	srv := httptest.NewServer(f.handler)
	t.Cleanup(srv.Close)
	return srv
}

// With Expect: 100-continue, an answer decided before the body is read
// is the first (and only) answer: no 100 Continue invites a body the
// proxy will not read. A Content-Length over MAX_BODY_BYTES is the 413.
func TestExpectContinueRefusedUnread(t *testing.T) {
	const expect = "Expect: 100-continue"
	for _, tc := range []struct {
		name   string
		opts   []option
		warm   int // requests admitted first, from the same caller
		path   string
		length int
		hdr    []string
		status int
		code   string
	}{
		{name: "body over the cap", opts: []option{rpm(100)}, path: "/api/chat", length: 12 << 20, status: 413, code: "body_too_large"},
		{name: "body over the cap, small cap", opts: []option{func(c *config.Config, _ *proxy.Options) { c.MaxBodyBytes = 1000 }},
			path: "/v1/chat/completions", length: 1001, status: 413, code: "body_too_large"},
		{name: "rate limited", opts: []option{rpm(1)}, warm: 1, path: "/api/chat", length: 20, status: 429, code: "rate_limited"},
		{name: "rate limited before a body rule reads the body", opts: []option{rules(t, `
chat_rpm = 1

[[rule]]
name   = "per-model"
paths  = ["/api/chat"]
key    = ["model"]
limit  = 100
window = "1m"
`)}, warm: 1, path: "/api/chat", length: 20, status: 429, code: "rate_limited"},
		{name: "no credential", opts: []option{func(c *config.Config, _ *proxy.Options) { c.RequireAuth = true }},
			path: "/api/chat", length: 20, status: 401, code: "unauthorized"},
		{name: "compressed", path: "/api/chat", length: 20, hdr: []string{"Content-Encoding: gzip"}, status: 415, code: "unsupported_encoding"},
		{name: "missing key", opts: []option{rules(t, `
[[rule]]
name   = "per-team"
paths  = ["/api/chat"]
key    = ["header:X-Team"]
on_missing_key = "reject"
limit  = 3
window = "1m"
`)}, path: "/api/chat", length: 20, status: 400, code: "missing_key"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			// A real server: its read deadlines are on the wall clock.
			f := newFixture(t, append(tc.opts, realClock)...)
			srv := fixtureServer(t, f)
			for range tc.warm {
				rc := dialRaw(t, srv)
				body := `{"message":"hi"}`
				rc.head("/api/chat", len(body))
				rc.write(body)
				if res := rc.response(); res.StatusCode != 200 {
					t.Fatalf("warm-up: %d", res.StatusCode)
				}
			}
			rc := dialRaw(t, srv)
			rc.head(tc.path, tc.length, append([]string{expect}, tc.hdr...)...)
			res := rc.response()
			b, _ := io.ReadAll(res.Body)
			if res.StatusCode != tc.status || !bytes.Contains(b, []byte(`"`+tc.code+`"`)) {
				t.Fatalf("first answer: %d %s, want %d %s (no 100 Continue)", res.StatusCode, b, tc.status, tc.code)
			}
			if got := f.upstream.Load(); got != int64(tc.warm) {
				t.Fatalf("the upstream saw %d requests, want %d", got, tc.warm)
			}
		})
	}
}

// Within the cap, Expect: 100-continue gets 100 Continue; the body sent
// then is forwarded byte for byte.
func TestExpectContinueWithinCap(t *testing.T) {
	srv, rec := capsServer(t, func(c *config.Config) { c.MaxBodyBytes = 1000 })
	body := `{"message":"` + strings.Repeat("é", 300) + `"}`
	rc := dialRaw(t, srv)
	rc.head("/api/chat", len(body), "Expect: 100-continue")
	if res := rc.response(); res.StatusCode != http.StatusContinue {
		t.Fatalf("first answer %d, want 100 Continue", res.StatusCode)
	}
	rc.write(body)
	if res := rc.response(); res.StatusCode != 200 {
		t.Fatalf("after the body: %d", res.StatusCode)
	}
	rec.mu.Lock()
	defer rec.mu.Unlock()
	if len(rec.bodies) != 1 || string(rec.bodies[0]) != body || rec.lengths[0] != int64(len(body)) {
		t.Fatalf("the upstream got %q (length %v), want the %d bytes sent", rec.bodies, rec.lengths, len(body))
	}
}
