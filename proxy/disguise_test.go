package proxy_test

import (
	"bufio"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/ratelimit-proxy/ratelimit-proxy/config"
	"github.com/ratelimit-proxy/ratelimit-proxy/limits"
	"github.com/ratelimit-proxy/ratelimit-proxy/proxy"
)

// seen is one request as the upstream received it.
type seen struct {
	method, uri string
	header      http.Header
	body        string
}

// upgrader is a real upstream that records every request and switches
// protocols whenever it is asked to (101, then echoes what it reads), as
// an h2c- or WebSocket-capable server would; otherwise it answers
// {"ok":true}.
type upgrader struct {
	mu   sync.Mutex
	reqs []seen
}

func (u *upgrader) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	body, _ := io.ReadAll(r.Body)
	u.mu.Lock()
	u.reqs = append(u.reqs, seen{r.Method, r.RequestURI, r.Header.Clone(), string(body)})
	u.mu.Unlock()
	if up := r.Header.Get("Upgrade"); up != "" && strings.Contains(strings.ToLower(r.Header.Get("Connection")), "upgrade") {
		conn, rw, err := http.NewResponseController(w).Hijack()
		if err != nil {
			return
		}
		defer conn.Close()
		fmt.Fprintf(rw, "HTTP/1.1 101 Switching Protocols\r\nConnection: Upgrade\r\nUpgrade: %s\r\n\r\n", up)
		rw.Flush()
		io.Copy(conn, rw) // echo until the client closes
		return
	}
	w.Header().Set("Content-Type", "application/json")
	io.WriteString(w, `{"ok":true}`)
}

func (u *upgrader) count() int { u.mu.Lock(); defer u.mu.Unlock(); return len(u.reqs) }

func (u *upgrader) last(t *testing.T) seen {
	t.Helper()
	u.mu.Lock()
	defer u.mu.Unlock()
	if len(u.reqs) == 0 {
		t.Fatal("the upstream received nothing")
	}
	return u.reqs[len(u.reqs)-1]
}

// disguiseServer is the proxy, on a real listener, in front of an
// upgrader, with MAX_INPUT_TOKENS=50 so a long prompt shows whether a
// request was guarded.
func disguiseServer(t *testing.T, set func(*config.Config)) (string, *upgrader, *prometheus.Registry) {
	t.Helper()
	up := &upgrader{}
	us := httptest.NewServer(up)
	t.Cleanup(us.Close)
	cfg := config.Default()
	cfg.UpstreamURL = us.URL
	cfg.ChatRPM = 1000
	cfg.MaxInputTokens = 50
	if set != nil {
		set(&cfg)
	}
	reg := prometheus.NewRegistry()
	p, err := proxy.New(proxy.Options{Config: cfg, Store: limits.NewMemory(limits.MemoryOptions{}),
		Logger: slog.New(slog.DiscardHandler), Registerer: reg})
	if err != nil {
		t.Fatal(err)
	}
	ps := httptest.NewServer(p.Handler())
	t.Cleanup(ps.Close)
	return ps.Listener.Addr().String(), up, reg
}

var (
	smallChat = `{"model":"gpt-4o-mini","messages":[{"role":"user","content":"hi"}]}`
	longChat  = `{"model":"gpt-4o-mini","messages":[{"role":"user","content":"` + strings.Repeat("many words here ", 200) + `"}]}`
)

// exchange writes a request with exactly this request line and these
// headers (plus Host and Content-Length) on conn and reads the answer.
func exchange(t *testing.T, conn net.Conn, br *bufio.Reader, method, target, body string, hdr ...string) (*http.Response, string) {
	t.Helper()
	var b strings.Builder
	fmt.Fprintf(&b, "%s %s HTTP/1.1\r\nHost: proxy.test\r\n", method, target)
	for i := 0; i+1 < len(hdr); i += 2 {
		fmt.Fprintf(&b, "%s: %s\r\n", hdr[i], hdr[i+1])
	}
	if body != "" {
		fmt.Fprintf(&b, "Content-Type: application/json\r\nContent-Length: %d\r\n", len(body))
	}
	b.WriteString("\r\n" + body)
	conn.SetDeadline(time.Now().Add(10 * time.Second))
	if _, err := io.WriteString(conn, b.String()); err != nil {
		t.Fatal(err)
	}
	resp, err := http.ReadResponse(br, nil)
	if err != nil {
		t.Fatalf("%s %s: %v", method, target, err)
	}
	if resp.StatusCode == http.StatusSwitchingProtocols {
		return resp, ""
	}
	got, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatalf("%s %s: reading the body: %v", method, target, err)
	}
	return resp, string(got)
}

// send is exchange on a connection of its own.
func send(t *testing.T, addr, method, target, body string, hdr ...string) (*http.Response, string) {
	t.Helper()
	conn, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	return exchange(t, conn, bufio.NewReader(conn), method, target, body, hdr...)
}

func guarded(r *http.Response) bool { return r.Header.Get("X-RateLimit-Limit") != "" }

// Every spelling a router may take for a protected path is guarded, under
// the configured entry's route label, and an honest request in the same
// dress is forwarded with its path and body as sent.
func TestDisguisedPathsAreGuarded(t *testing.T) {
	addr, up, reg := disguiseServer(t, func(c *config.Config) {
		c.ProtectedPaths = append(c.ProtectedPaths, "/openai/deployments/*/chat/completions", "/v2/*")
	})
	tests := []struct{ target, route string }{
		{"/V1/Chat/Completions", "/v1/chat/completions"},
		{"/v1/chat/completions;x=1", "/v1/chat/completions"},
		{"/v1;a/chat/completions", "/v1/chat/completions"},
		{"/v1/chat%2Fcompletions", "/v1/chat/completions"},
		{"/v1/%63hat/completions?stream=false", "/v1/chat/completions"},
		{"/v1//chat/completions/", "/v1/chat/completions"},
		{"/v1/x/%2e%2e/chat/completions", "/v1/chat/completions"},
		{"/v1/chat/..;/chat/completions", "/v1/chat/completions"},
		{`/v1\chat\completions`, "/v1/chat/completions"},
		{"/openai/deployments/gpt-4o/chat/completions?api-version=2024-06-01", "/openai/deployments/*/chat/completions"},
		{"/OpenAI/Deployments/x/Chat/Completions", "/openai/deployments/*/chat/completions"},
		{"/v2/chat", "/v2/*"},
		{"/v2", "/v2/*"},
	}
	perRoute := map[string]int{}
	for _, tt := range tests {
		r, body := send(t, addr, "POST", tt.target, longChat)
		if r.StatusCode != http.StatusRequestEntityTooLarge || !guarded(r) || !strings.Contains(body, "input_too_large") {
			t.Errorf("long prompt to %s: %d guarded=%v %s", tt.target, r.StatusCode, guarded(r), body)
		}
		perRoute[tt.route]++
		n := up.count()
		r, _ = send(t, addr, "POST", tt.target, smallChat)
		if r.StatusCode != 200 || !guarded(r) || up.count() != n+1 {
			t.Fatalf("small prompt to %s: %d guarded=%v", tt.target, r.StatusCode, guarded(r))
		}
		perRoute[tt.route]++
		// Go's outgoing request line escapes a \ (as it does any byte
		// invalid in a path); every other byte goes as sent.
		want := strings.ReplaceAll(tt.target, `\`, "%5C")
		if got := up.last(t); got.uri != want || got.body != smallChat {
			t.Errorf("upstream got %s %q, want %s %q as sent", got.uri, got.body, want, smallChat)
		}
	}
	for route, n := range perRoute {
		got := requests(t, reg, route, "too_large") + requests(t, reg, route, "allowed")
		if int(got) != n {
			t.Errorf("route %s counted %v requests, want %d", route, got, n)
		}
	}

	// Paths no router takes for a protected one pass unguarded.
	for _, target := range []string{"/v1/models", "/v1/chat", "/v1/chat/completionsx", "/v1/chat/completions/x", "/v2x/chat", "/openai/deployments/chat/completions", "/v1/chat%252Fcompletionsx"} {
		n := up.count()
		r, _ := send(t, addr, "POST", target, longChat)
		if r.StatusCode != 200 || guarded(r) || up.count() != n+1 || up.last(t).body != longChat {
			t.Errorf("POST %s: %d guarded=%v", target, r.StatusCode, guarded(r))
		}
	}
}

// requests is the value of requests_total{route, decision}.
func requests(t *testing.T, reg *prometheus.Registry, route, decision string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != "ratelimit_proxy_requests_total" {
			continue
		}
		for _, m := range mf.GetMetric() {
			labels := map[string]string{}
			for _, l := range m.GetLabel() {
				labels[l.GetName()] = l.GetValue()
			}
			if labels["route"] == route && labels["decision"] == decision {
				return m.GetCounter().GetValue()
			}
		}
	}
	t.Fatalf("no requests_total{route=%q,decision=%q}", route, decision)
	return 0
}

// A method-override header naming POST makes a request a POST; a POST
// stays one whatever its override says.
func TestMethodOverrideIsGuarded(t *testing.T) {
	addr, up, _ := disguiseServer(t, nil)
	for _, tc := range []struct {
		method string
		hdr    []string
	}{
		{"GET", []string{"X-HTTP-Method-Override", "POST"}},
		{"GET", []string{"X-HTTP-Method", "post"}},
		{"PUT", []string{"X-Method-Override", "Post"}},
		{"PATCH", []string{"X-HTTP-Method-Override", "POST"}},
		{"POST", []string{"X-HTTP-Method-Override", "GET"}},
		{"post", nil},
	} {
		r, body := send(t, addr, tc.method, "/v1/chat/completions", longChat, tc.hdr...)
		if r.StatusCode != http.StatusRequestEntityTooLarge || !guarded(r) {
			t.Errorf("%s %q, long prompt: %d %s", tc.method, tc.hdr, r.StatusCode, body)
		}
		n := up.count()
		r, _ = send(t, addr, tc.method, "/v1/chat/completions", smallChat, tc.hdr...)
		if r.StatusCode != 200 || !guarded(r) || up.count() != n+1 {
			t.Fatalf("%s %q, small prompt: %d guarded=%v", tc.method, tc.hdr, r.StatusCode, guarded(r))
		}
		got := up.last(t)
		if got.method != tc.method || got.body != smallChat || (len(tc.hdr) > 0 && got.header.Get(tc.hdr[0]) != tc.hdr[1]) {
			t.Errorf("upstream got %s %q %v, want it as sent", got.method, got.body, got.header)
		}
	}
	// Without an override naming POST, other methods are not guarded.
	for _, tc := range []struct {
		method string
		hdr    []string
	}{{"GET", nil}, {"PUT", []string{"X-HTTP-Method-Override", "PATCH"}}} {
		r, _ := send(t, addr, tc.method, "/v1/chat/completions", longChat, tc.hdr...)
		if r.StatusCode != 200 || guarded(r) {
			t.Errorf("%s %q: %d guarded=%v", tc.method, tc.hdr, r.StatusCode, guarded(r))
		}
	}
}

// The API key comes from the header the path's API reads first, so a
// made-up key rotated in another header buys no fresh budget.
func TestCredentialOrder(t *testing.T) {
	key := func(s string) string { return "caller=" + hashKey(s) }
	for _, tc := range []struct {
		name        string
		path        string
		first, next []string // headers of the admitted and of the next request
		deniedKey   string   // "" when next is a different caller (admitted)
	}{
		{"openai: bearer, rotating x-api-key", "/v1/chat/completions",
			[]string{"Authorization", "Bearer sk-real", "X-API-Key", "made-up-1"},
			[]string{"Authorization", "Bearer sk-real", "X-API-Key", "made-up-2"}, key("sk-real")},
		{"openai: bearer, rotating api-key", "/v1/chat/completions",
			[]string{"Authorization", "Bearer sk-real", "Api-Key", "made-up-1"},
			[]string{"Authorization", "Bearer sk-real", "Api-Key", "made-up-2"}, key("sk-real")},
		{"openai: x-api-key before api-key", "/v1/embeddings",
			[]string{"X-API-Key", "sk-real", "Api-Key", "made-up-1"},
			[]string{"X-API-Key", "sk-real", "Api-Key", "made-up-2"}, key("sk-real")},
		{"openai: empty bearer is no credential", "/v1/chat/completions",
			[]string{"Authorization", "Bearer ", "X-API-Key", "sk-real"},
			[]string{"Authorization", "Bearer  ", "X-API-Key", "sk-real"}, key("sk-real")},
		{"azure: api-key", "/openai/deployments/gpt-4o/chat/completions",
			[]string{"Api-Key", "azure-real"},
			[]string{"Api-Key", "azure-real", "X-API-Key", ""}, key("azure-real")},
		{"anthropic: x-api-key, rotating bearer", "/v1/messages",
			[]string{"X-API-Key", "sk-ant-real", "Authorization", "Bearer made-up-1"},
			[]string{"X-API-Key", "sk-ant-real", "Authorization", "Bearer made-up-2"}, key("sk-ant-real")},
		{"anthropic disguised: x-api-key, rotating bearer", "/V1/Messages;x",
			[]string{"X-API-Key", "sk-ant-real", "Authorization", "Bearer made-up-1"},
			[]string{"X-API-Key", "sk-ant-real", "Authorization", "Bearer made-up-2"}, key("sk-ant-real")},
		{"anthropic: empty x-api-key, bearer", "/v1/messages",
			[]string{"X-API-Key", " ", "Authorization", "Bearer sk-ant-real"},
			[]string{"Authorization", "Bearer sk-ant-real"}, key("sk-ant-real")},
		{"honest: two real keys", "/v1/chat/completions",
			[]string{"Authorization", "Bearer sk-a"},
			[]string{"Authorization", "Bearer sk-b"}, ""},
		{"honest anthropic: two real keys", "/v1/messages",
			[]string{"X-API-Key", "sk-a"},
			[]string{"X-API-Key", "sk-b"}, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := newFixture(t, rpm(1), func(c *config.Config, _ *proxy.Options) {
				c.ProtectedPaths = append(c.ProtectedPaths, "/openai/deployments/*/chat/completions")
			})
			if w := f.do(tc.path, "203.0.113.7:1", tc.first...); w.Code != 200 {
				t.Fatalf("first: %d %s", w.Code, w.Body)
			}
			w := f.do(tc.path, "203.0.113.7:1", tc.next...)
			if tc.deniedKey == "" {
				if w.Code != 200 {
					t.Fatalf("another caller was refused: %d %s", w.Code, w.Body)
				}
				return
			}
			var body struct {
				DeniedKey string `json:"denied_key"`
				Type      string
			}
			json.Unmarshal(w.Body.Bytes(), &body)
			if w.Code != 429 || body.DeniedKey != tc.deniedKey {
				t.Fatalf("next: %d %s, want 429 for %s", w.Code, w.Body, tc.deniedKey)
			}
			if strings.Contains(strings.ToLower(tc.path), "/v1/messages") && body.Type != "error" {
				t.Errorf("Anthropic path answered outside Anthropic's envelope: %s", w.Body)
			}
		})
	}
}

// hashKey is an API key's public form (SPEC §5).
func hashKey(s string) string {
	sum := sha256.Sum256([]byte(s))
	return "key:" + hex.EncodeToString(sum[:8])
}

// tripwire is a request body that records whether anyone read it.
type tripwire struct {
	r    io.Reader
	read atomic.Bool
}

func (b *tripwire) Read(p []byte) (int, error) { b.read.Store(true); return b.r.Read(p) }

// A compressed protected body is refused with 415 before a byte of it is
// read, after the rate limit; identity and unprotected routes pass.
func TestCompressedBodyIs415(t *testing.T) {
	f := newFixture(t, rpm(100))
	do := func(path string, enc []string) (*httptest.ResponseRecorder, bool) {
		body := &tripwire{r: strings.NewReader(`{"message":"hi"}`)}
		r := httptest.NewRequest(http.MethodPost, path, body)
		r.RemoteAddr = "203.0.113.7:1"
		r.Header["Content-Type"] = []string{"application/json"}
		if enc != nil {
			r.Header["Content-Encoding"] = enc
		}
		w := httptest.NewRecorder()
		f.handler.ServeHTTP(w, r)
		return w, body.read.Load()
	}
	for _, enc := range [][]string{{"gzip"}, {"GZIP"}, {"br"}, {"deflate"}, {"zstd"}, {"x-gzip"}, {"compress"}, {"snappy"},
		{"identity, gzip"}, {"gzip, identity"}, {"identity", "gzip"}, {" Gzip "}} {
		w, read := do("/v1/chat/completions", enc)
		var body struct {
			Error struct{ Type, Code string }
		}
		json.Unmarshal(w.Body.Bytes(), &body)
		if w.Code != 415 || read || body.Error.Code != "unsupported_encoding" || body.Error.Type != "invalid_request_error" {
			t.Errorf("%q: %d read=%v %s", enc, w.Code, read, w.Body)
		}
		if w.Header().Get("Accept-Encoding") != "identity" || w.Header().Get("X-RateLimit-Limit") != "100" || w.Header().Get("Content-Type") != "application/json" {
			t.Errorf("%q: headers %v", enc, w.Header())
		}
	}
	if w, _ := do("/api/chat", []string{"gzip"}); w.Code != 415 || !strings.HasPrefix(w.Body.String(), `{"error":"unsupported_encoding","message":`) {
		t.Errorf("flat: %d %s", w.Code, w.Body)
	}
	if w, _ := do("/v1/messages", []string{"gzip"}); !strings.HasPrefix(w.Body.String(), `{"type":"error","error":{"type":"invalid_request_error","code":"unsupported_encoding"`) {
		t.Errorf("anthropic: %s", w.Body)
	}
	// The 415 spent a slot, like a 413.
	if w, _ := do("/api/chat", nil); w.Header().Get("X-RateLimit-Remaining") != strconv.Itoa(100-12-2-1) {
		t.Errorf("remaining %q after 14 refused 415s", w.Header().Get("X-RateLimit-Remaining"))
	}
	// Content_Encoding, which CGI and WSGI servers read as Content-Encoding.
	{
		body := &tripwire{r: strings.NewReader(`{"message":"hi"}`)}
		r := httptest.NewRequest(http.MethodPost, "/api/chat", body)
		r.RemoteAddr = "203.0.113.7:1"
		r.Header["Content_encoding"] = []string{"gzip"}
		w := httptest.NewRecorder()
		f.handler.ServeHTTP(w, r)
		if w.Code != 415 || body.read.Load() {
			t.Errorf("Content_Encoding: gzip: %d %s", w.Code, w.Body)
		}
	}
	n := f.upstream.Load()
	for _, enc := range [][]string{{"identity"}, {"Identity"}, {""}, {"identity, identity"}} {
		if w, read := do("/v1/chat/completions", enc); w.Code != 200 || !read {
			t.Errorf("%q: %d %s", enc, w.Code, w.Body)
		}
	}
	if w, _ := do("/v1/files", []string{"gzip"}); w.Code != 200 {
		t.Errorf("unprotected gzip: %d", w.Code)
	}
	if got := f.upstream.Load() - n; got != 5 {
		t.Errorf("upstream got %d requests, want 5", got)
	}
	if got := requests(t, f.reg, "/v1/chat/completions", "unsupported_encoding"); got != 12 {
		t.Errorf("unsupported_encoding counted %v, want 12", got)
	}
	if problems, err := testutil.GatherAndLint(f.reg); err != nil || len(problems) > 0 {
		t.Errorf("%v %+v", err, problems)
	}

	// A refused caller gets 429 first: the limit comes before the body.
	limited := newFixture(t, rpm(0))
	r := httptest.NewRequest(http.MethodPost, "/v1/chat/completions", strings.NewReader("x"))
	r.Header.Set("Content-Encoding", "gzip")
	w := httptest.NewRecorder()
	limited.handler.ServeHTTP(w, r)
	if w.Code != 429 {
		t.Errorf("over the limit with gzip: %d", w.Code)
	}
}

// upgradeHeaders ask to switch protocols, as h2c and WebSocket clients do.
var upgradeHeaders = map[string][]string{
	"h2c": {"Connection", "Upgrade, HTTP2-Settings", "Upgrade", "h2c", "HTTP2-Settings", "AAMAAABkAARAAAAAAAIAAAAA"},
	"websocket": {"Connection", "Upgrade", "Upgrade", "websocket", "Sec-WebSocket-Version", "13",
		"Sec-WebSocket-Key", "dGhlIHNhbXBsZSBub25jZQ=="},
}

// On a protected route no upgrade reaches the upstream: it answers a
// plain request, the client gets that answer, and the next request on
// the connection is guarded too. An unprotected WebSocket still upgrades.
func TestNoUpgradeOnProtectedRoutes(t *testing.T) {
	addr, up, _ := disguiseServer(t, nil)
	for _, name := range []string{"h2c", "websocket"} {
		for _, target := range []string{"/v1/chat/completions", "/V1/Chat/Completions/"} {
			conn, err := net.Dial("tcp", addr)
			if err != nil {
				t.Fatal(err)
			}
			br := bufio.NewReader(conn)
			r, body := exchange(t, conn, br, "POST", target, smallChat, upgradeHeaders[name]...)
			if r.StatusCode != 200 || body != `{"ok":true}` || !guarded(r) {
				t.Errorf("%s POST %s: %d %q", name, target, r.StatusCode, body)
			}
			got := up.last(t)
			if got.header.Get("Upgrade") != "" || got.header.Get("Http2-Settings") != "" ||
				strings.Contains(strings.ToLower(got.header.Get("Connection")), "upgrade") || got.body != smallChat {
				t.Errorf("%s POST %s: upstream saw %v %q", name, target, got.header, got.body)
			}
			// The connection is still HTTP to the proxy, and guarded.
			r, body = exchange(t, conn, br, "POST", "/v1/chat/completions", longChat)
			if r.StatusCode != http.StatusRequestEntityTooLarge {
				t.Errorf("%s: next request on the connection: %d %s", name, r.StatusCode, body)
			}
			conn.Close()
		}
	}

	// GET WebSocket on an unprotected route: switched and tunnelled.
	conn, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	br := bufio.NewReader(conn)
	r, _ := exchange(t, conn, br, "GET", "/v1/realtime?model=gpt-4o-realtime", "", upgradeHeaders["websocket"]...)
	if r.StatusCode != http.StatusSwitchingProtocols || r.Header.Get("Upgrade") != "websocket" || guarded(r) {
		t.Fatalf("WebSocket GET: %d %v", r.StatusCode, r.Header)
	}
	if got := up.last(t); got.header.Get("Upgrade") != "websocket" || got.header.Get("Sec-Websocket-Key") != "dGhlIHNhbXBsZSBub25jZQ==" {
		t.Errorf("upstream saw %v", got.header)
	}
	io.WriteString(conn, "ping\n")
	if line, err := br.ReadString('\n'); err != nil || line != "ping\n" {
		t.Errorf("through the tunnel: %q %v", line, err)
	}

	// h2c is never tunnelled, even on an unprotected route.
	r, body := send(t, addr, "GET", "/v1/models", "", upgradeHeaders["h2c"]...)
	if r.StatusCode != 200 || body != `{"ok":true}` || up.last(t).header.Get("Upgrade") != "" {
		t.Errorf("h2c GET: %d %q, upstream saw Upgrade %q", r.StatusCode, body, up.last(t).header.Get("Upgrade"))
	}
}
