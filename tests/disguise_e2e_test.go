package tests

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"
)

// End-to-end checks of SPEC §3, §4.1 and §4.5 against disguises: a
// protected request dressed as something else is still guarded, and the
// same dress on an honest request is forwarded as sent.

// rawResponse is an answer read off a connection the test wrote by hand.
type rawResponse struct {
	*http.Response
	body string
}

// rawConn writes requests byte for byte, so paths reach the proxy exactly
// as spelled (Go's client would clean or escape some of them).
type rawConn struct {
	t    *testing.T
	conn net.Conn
	br   *bufio.Reader
}

func dialRaw(t *testing.T, p *proc) *rawConn {
	t.Helper()
	conn, err := net.Dial("tcp", p.public)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return &rawConn{t: t, conn: conn, br: bufio.NewReader(conn)}
}

// do sends one request (Host and, with a body, Content-Type and
// Content-Length added) and reads its answer; a 101's body is left unread.
func (c *rawConn) do(method, target, body string, hdr ...string) *rawResponse {
	c.t.Helper()
	var b strings.Builder
	fmt.Fprintf(&b, "%s %s HTTP/1.1\r\nHost: proxy.test\r\n", method, target)
	for i := 0; i+1 < len(hdr); i += 2 {
		fmt.Fprintf(&b, "%s: %s\r\n", hdr[i], hdr[i+1])
	}
	if body != "" {
		fmt.Fprintf(&b, "Content-Type: application/json\r\nContent-Length: %d\r\n", len(body))
	}
	b.WriteString("\r\n" + body)
	c.conn.SetDeadline(time.Now().Add(10 * time.Second))
	if _, err := io.WriteString(c.conn, b.String()); err != nil {
		c.t.Fatal(err)
	}
	resp, err := http.ReadResponse(c.br, nil)
	if err != nil {
		c.t.Fatalf("%s %s: %v", method, target, err)
	}
	if resp.StatusCode == http.StatusSwitchingProtocols {
		return &rawResponse{Response: resp}
	}
	got, err := io.ReadAll(resp.Body)
	if err != nil {
		c.t.Fatalf("%s %s: reading the body: %v", method, target, err)
	}
	return &rawResponse{Response: resp, body: string(got)}
}

// rawDo sends one request on a connection of its own.
func rawDo(t *testing.T, p *proc, method, target, body string, hdr ...string) *rawResponse {
	t.Helper()
	return dialRaw(t, p).do(method, target, body, hdr...)
}

func (r *rawResponse) guarded() bool { return r.Header.Get("X-RateLimit-Limit") != "" }

// requestLog is an upstream that records request lines, headers and
// bodies, switches protocols whenever asked (101, then echoes), and
// otherwise answers {"ok":true}.
type requestLog struct {
	mu   sync.Mutex
	reqs []recorded // Path holds the request-target as received
}

func newRequestLog(t *testing.T) (*requestLog, string) {
	t.Helper()
	l := &requestLog{}
	srv := newUpstream(t, func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		l.mu.Lock()
		l.reqs = append(l.reqs, recorded{Method: r.Method, Path: r.RequestURI, Header: r.Header.Clone(), Body: body})
		l.mu.Unlock()
		if up := r.Header.Get("Upgrade"); up != "" && strings.Contains(strings.ToLower(r.Header.Get("Connection")), "upgrade") {
			conn, rw, err := http.NewResponseController(w).Hijack()
			if err != nil {
				return
			}
			defer conn.Close()
			fmt.Fprintf(rw, "HTTP/1.1 101 Switching Protocols\r\nConnection: Upgrade\r\nUpgrade: %s\r\n\r\n", up)
			rw.Flush()
			io.Copy(conn, rw)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		io.WriteString(w, `{"ok":true}`)
	})
	return l, srv.URL
}

func (l *requestLog) count() int { l.mu.Lock(); defer l.mu.Unlock(); return len(l.reqs) }

func (l *requestLog) last(t *testing.T) recorded {
	t.Helper()
	l.mu.Lock()
	defer l.mu.Unlock()
	if len(l.reqs) == 0 {
		t.Fatal("the upstream received no request")
	}
	return l.reqs[len(l.reqs)-1]
}

const smallPrompt = `{"model":"gpt-4o-mini","messages":[{"role":"user","content":"hi"}]}`

var longPrompt = `{"model":"gpt-4o-mini","messages":[{"role":"user","content":"` + strings.Repeat("many more words ", 300) + `"}]}`

// Spellings an upstream's router takes for /v1/chat/completions, and an
// Azure-style * entry, are guarded and counted under the configured
// entry; in the same dress a small prompt reaches the upstream with its
// request line and body as sent.
func TestDisguisedPathsGuardedEndToEnd(t *testing.T) {
	t.Parallel()
	up, upURL := newRequestLog(t)
	p := startProxy(t, upURL, map[string]string{"MAX_INPUT_TOKENS": "50", "CHAT_RPM": "1000",
		"PROTECTED_PATHS": "/v1/chat/completions,/v1/messages,/openai/deployments/*/chat/completions"})

	disguises := []string{
		"/V1/Chat/Completions",
		"/v1/chat/completions;jsessionid=1",
		"/v1;a=b/chat/completions",
		"/v1/chat%2Fcompletions",
		"/v1/%63hat/%63ompletions?stream=false",
		"/v1//chat/completions/",
		"/v1/x/%2E%2E/chat/completions",
		"/v1/chat/..;/chat/completions",
	}
	for _, target := range disguises {
		r := rawDo(t, p, "POST", target, longPrompt)
		if r.StatusCode != http.StatusRequestEntityTooLarge || !r.guarded() || !strings.Contains(r.body, "input_too_large") {
			t.Errorf("long prompt to %s: %d guarded=%v %s", target, r.StatusCode, r.guarded(), r.body)
		}
		n := up.count()
		r = rawDo(t, p, "POST", target, smallPrompt)
		if r.StatusCode != http.StatusOK || !r.guarded() || up.count() != n+1 {
			t.Fatalf("small prompt to %s: %d guarded=%v %s", target, r.StatusCode, r.guarded(), r.body)
		}
		if got := up.last(t); got.Path != target || string(got.Body) != smallPrompt {
			t.Errorf("upstream got %s %q, want %s and the body as sent", got.Path, got.Body, target)
		}
	}
	azure := "/openai/deployments/gpt-4o/chat/completions?api-version=2024-06-01"
	if r := rawDo(t, p, "POST", azure, longPrompt); r.StatusCode != http.StatusRequestEntityTooLarge {
		t.Errorf("%s: %d %s", azure, r.StatusCode, r.body)
	}
	if r := rawDo(t, p, "POST", azure, smallPrompt); r.StatusCode != http.StatusOK || !r.guarded() || up.last(t).Path != azure {
		t.Errorf("%s: %d guarded=%v", azure, r.StatusCode, r.guarded())
	}

	// Not a protected path under any reading: forwarded unguarded.
	for _, target := range []string{"/v1/models", "/v1/chat/completionsx", "/v1/chat", "/openai/deployments/chat/completions"} {
		n := up.count()
		r := rawDo(t, p, "POST", target, longPrompt)
		if r.StatusCode != http.StatusOK || r.guarded() || up.count() != n+1 {
			t.Errorf("POST %s: %d guarded=%v", target, r.StatusCode, r.guarded())
		}
	}

	m := p.do(t, http.MethodGet, p.adminURL("/metrics"), nil)
	for series, want := range map[string]string{
		`ratelimit_proxy_requests_total{decision="too_large",route="/v1/chat/completions"}`:                   fmt.Sprint(len(disguises)),
		`ratelimit_proxy_requests_total{decision="allowed",route="/v1/chat/completions"}`:                     fmt.Sprint(len(disguises)),
		`ratelimit_proxy_requests_total{decision="allowed",route="/openai/deployments/*/chat/completions"}`:   "1",
		`ratelimit_proxy_requests_total{decision="too_large",route="/openai/deployments/*/chat/completions"}`: "1",
	} {
		if got := metricValue(string(m.body), series); got != want {
			t.Errorf("%s = %q, want %s", series, got, want)
		}
	}
}

// A method-override header naming POST is a POST; a POST overridden to
// GET stays guarded.
func TestMethodOverrideGuardedEndToEnd(t *testing.T) {
	t.Parallel()
	up, upURL := newRequestLog(t)
	p := startProxy(t, upURL, map[string]string{"MAX_INPUT_TOKENS": "50"})

	for _, tc := range []struct {
		method string
		hdr    []string
	}{
		{"GET", []string{"X-HTTP-Method-Override", "POST"}},
		{"PUT", []string{"X-HTTP-Method", "post"}},
		{"GET", []string{"X-Method-Override", "POST"}},
		{"POST", []string{"X-HTTP-Method-Override", "GET"}},
	} {
		r := rawDo(t, p, tc.method, "/v1/chat/completions", longPrompt, tc.hdr...)
		if r.StatusCode != http.StatusRequestEntityTooLarge || !r.guarded() {
			t.Errorf("%s %q with a long prompt: %d %s", tc.method, tc.hdr, r.StatusCode, r.body)
		}
		r = rawDo(t, p, tc.method, "/v1/chat/completions", smallPrompt, tc.hdr...)
		if r.StatusCode != http.StatusOK || !r.guarded() {
			t.Errorf("%s %q with a small prompt: %d %s", tc.method, tc.hdr, r.StatusCode, r.body)
			continue
		}
		if got := up.last(t); got.Method != tc.method || got.Header.Get(tc.hdr[0]) != tc.hdr[1] || string(got.Body) != smallPrompt {
			t.Errorf("upstream got %s %v %q, want the request as sent", got.Method, got.Header, got.Body)
		}
	}
	if r := rawDo(t, p, "GET", "/v1/chat/completions", ""); r.StatusCode != http.StatusOK || r.guarded() {
		t.Errorf("plain GET: %d guarded=%v", r.StatusCode, r.guarded())
	}
}

// A constant real key plus a made-up key rotated in another header buys
// no fresh budget: the key is read from the header the path's API reads
// first.
func TestRotatingSecondCredentialEndToEnd(t *testing.T) {
	t.Parallel()
	up := newRecorder(t)
	p := startProxy(t, up.URL(), map[string]string{"CHAT_RPM": "2",
		"PROTECTED_PATHS": "/v1/chat/completions,/v1/messages,/openai/deployments/*/chat/completions"})

	for _, tc := range []struct {
		path, real string
		hdr        func(i int) []string
	}{
		{"/v1/chat/completions", "sk-openai-real", func(i int) []string {
			return []string{"Authorization", "Bearer sk-openai-real", "X-API-Key", fmt.Sprint("made-up-", i), "Api-Key", fmt.Sprint("made-up-", i)}
		}},
		{"/v1/messages", "sk-ant-real", func(i int) []string {
			return []string{"X-API-Key", "sk-ant-real", "Authorization", fmt.Sprint("Bearer made-up-", i)}
		}},
		{"/openai/deployments/gpt-4o/chat/completions", "azure-real", func(i int) []string {
			return []string{"Api-Key", "azure-real", "Authorization", "Bearer "}
		}},
	} {
		for i := range 3 {
			r := p.post(t, tc.path, tc.hdr(i)...)
			if i < 2 {
				wantStatus(t, r, http.StatusOK)
				continue
			}
			wantStatus(t, r, http.StatusTooManyRequests)
			if got := r.json(t)["denied_key"]; got != "caller="+keyHash(tc.real) {
				t.Errorf("%s: denied_key %v, want the real key's caller=%s", tc.path, got, keyHash(tc.real))
			}
		}
	}
	// Honest: another real key has its own budget.
	wantStatus(t, p.post(t, "/v1/messages", "X-API-Key", "sk-ant-other"), http.StatusOK)
}

// A protected POST never upgrades: the upstream, which would switch to h2c
// or WebSocket, answers a plain request, and the next request on the
// client's connection is guarded. A WebSocket GET on an unprotected route
// is tunnelled as before. Client-address headers from an untrusted peer
// are replaced by X-Real-IP.
func TestUpgradesEndToEnd(t *testing.T) {
	t.Parallel()
	up, upURL := newRequestLog(t)
	p := startProxy(t, upURL, map[string]string{"MAX_INPUT_TOKENS": "50"})

	for name, hdr := range map[string][]string{
		"h2c":       {"Connection", "Upgrade, HTTP2-Settings", "Upgrade", "h2c", "HTTP2-Settings", "AAMAAABkAARAAAAAAAIAAAAA"},
		"websocket": {"Connection", "Upgrade", "Upgrade", "websocket", "Sec-WebSocket-Version", "13", "Sec-WebSocket-Key", "dGhlIHNhbXBsZSBub25jZQ=="},
	} {
		c := dialRaw(t, p)
		r := c.do("POST", "/v1/chat/completions", smallPrompt, append(hdr, "X-Real-IP", "6.6.6.6", "CF-Connecting-IP", "6.6.6.7")...)
		if r.StatusCode != http.StatusOK || r.body != `{"ok":true}` || !r.guarded() {
			t.Errorf("%s POST: %d %q", name, r.StatusCode, r.body)
		}
		got := up.last(t)
		if got.Header.Get("Upgrade") != "" || got.Header.Get("Http2-Settings") != "" || strings.Contains(strings.ToLower(got.Header.Get("Connection")), "upgrade") {
			t.Errorf("%s POST: the upstream was asked to upgrade: %v", name, got.Header)
		}
		if got.Header.Get("X-Real-IP") != "127.0.0.1" || got.Header.Get("CF-Connecting-IP") != "" {
			t.Errorf("%s POST: X-Real-IP %q, CF-Connecting-IP %q", name, got.Header.Get("X-Real-IP"), got.Header.Get("CF-Connecting-IP"))
		}
		if r := c.do("POST", "/v1/chat/completions", longPrompt); r.StatusCode != http.StatusRequestEntityTooLarge {
			t.Errorf("%s: the next request on the connection: %d %s", name, r.StatusCode, r.body)
		}
	}

	c := dialRaw(t, p)
	r := c.do("GET", "/v1/realtime?model=gpt-4o-realtime-preview", "", "Connection", "Upgrade", "Upgrade", "websocket",
		"Sec-WebSocket-Version", "13", "Sec-WebSocket-Key", "dGhlIHNhbXBsZSBub25jZQ==")
	if r.StatusCode != http.StatusSwitchingProtocols || !strings.EqualFold(r.Header.Get("Upgrade"), "websocket") {
		t.Fatalf("WebSocket GET: %d %v", r.StatusCode, r.Header)
	}
	io.WriteString(c.conn, "ping\n")
	if line, err := c.br.ReadString('\n'); err != nil || line != "ping\n" {
		t.Errorf("through the WebSocket tunnel: %q %v", line, err)
	}
}
