package upstream_test

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"net/url"
	"os"
	"strings"
	"sync"
	"testing"

	"github.com/ratelimit-proxy/ratelimit-proxy/upstream"
)

type timeoutErr struct{}

func (timeoutErr) Error() string   { return "i/o timeout" }
func (timeoutErr) Timeout() bool   { return true }
func (timeoutErr) Temporary() bool { return true }

var _ net.Error = timeoutErr{}

func TestStatus(t *testing.T) {
	live := context.Background()
	gone, cancel := context.WithCancel(context.Background())
	cancel()
	tests := []struct {
		name string
		ctx  context.Context
		err  error
		want int
	}{
		{"refused", live, &net.OpError{Op: "dial", Err: errors.New("connection refused")}, http.StatusBadGateway},
		{"response header timeout", live, timeoutErr{}, http.StatusGatewayTimeout},
		{"deadline", live, fmt.Errorf("read: %w", os.ErrDeadlineExceeded), http.StatusGatewayTimeout},
		{"context deadline", live, context.DeadlineExceeded, http.StatusGatewayTimeout},
		{"client went away", gone, context.Canceled, upstream.StatusClientClosed},
		{"client went away during a dial error", gone, errors.New("dial: operation was canceled"), upstream.StatusClientClosed},
		{"unexpected EOF", live, errors.New("unexpected EOF"), http.StatusBadGateway},
	}
	for _, tt := range tests {
		if got := upstream.Status(tt.ctx, tt.err); got != tt.want {
			t.Errorf("%s: %d, want %d", tt.name, got, tt.want)
		}
	}
}

// The transport keeps enough idle connections for a burst to one host.
func TestTransportPoolsPerHost(t *testing.T) {
	tr := upstream.NewHTTPTransport(0)
	if tr.MaxIdleConnsPerHost < 256 || tr.Proxy != nil || !tr.DisableCompression {
		t.Fatalf("transport %+v", tr)
	}
}

// A client's own Forwarded header never reaches the upstream from an
// untrusted peer; from a trusted proxy it is kept.
func TestForwardedHeaderTrust(t *testing.T) {
	var got []string
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		got = r.Header.Values("Forwarded")
	}))
	defer up.Close()
	target, _ := url.Parse(up.URL)
	for _, trusted := range []bool{false, true} {
		rp := upstream.New(upstream.Options{Target: target, TrustForwarded: func(*http.Request) bool { return trusted }})
		r := httptest.NewRequest(http.MethodPost, "/v1/chat/completions", nil)
		r.Header.Set("Forwarded", "for=198.51.100.9")
		rp.ServeHTTP(httptest.NewRecorder(), r)
		if want := trusted; (len(got) == 1) != want {
			t.Errorf("trusted=%v: upstream saw Forwarded %q", trusted, got)
		}
	}
}

// headerUpstream is a real upstream that keeps the headers of the last
// request it received.
func headerUpstream(t *testing.T) (*url.URL, func() http.Header) {
	t.Helper()
	var mu sync.Mutex
	var last http.Header
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		last = r.Header.Clone()
		mu.Unlock()
		w.Write([]byte("ok"))
	}))
	t.Cleanup(up.Close)
	target, _ := url.Parse(up.URL)
	return target, func() http.Header { mu.Lock(); defer mu.Unlock(); return last }
}

// claimHeaders claim a client address (SPEC §4.5), as an attacker sends them.
var claimHeaders = map[string]string{
	"X-Real-IP": "1.1.1.1", "True-Client-IP": "1.1.1.2", "CF-Connecting-IP": "1.1.1.3", "X-Client-IP": "1.1.1.4",
	"X-Cluster-Client-IP": "1.1.1.5", "Fastly-Client-IP": "1.1.1.6",
}

// From an untrusted peer every header claiming a client address is
// removed (in its _ spelling too) and X-Real-IP is the peer's full
// address; from a trusted proxy they pass as sent, and X-Real-IP is
// added only when it sent none.
func TestClientAddressHeaders(t *testing.T) {
	target, last := headerUpstream(t)
	send := func(o upstream.Options, peer string, hdr map[string]string) http.Header {
		t.Helper()
		o.Target = target
		r := httptest.NewRequest(http.MethodPost, "/v1/chat/completions", nil)
		r.RemoteAddr = peer
		for k, v := range hdr {
			r.Header[http.CanonicalHeaderKey(k)] = []string{v} // as the server parses them
		}
		w := httptest.NewRecorder()
		upstream.New(o).ServeHTTP(w, r)
		if w.Code != 200 {
			t.Fatalf("status %d", w.Code)
		}
		return last()
	}
	disguised := map[string]string{"X-Custom": "kept", "X_real_ip": "1.1.1.7", "X_forwarded_for": "1.1.1.8", "X-Original-Forwarded-For": "1.1.1.9"}
	for k, v := range claimHeaders {
		disguised[http.CanonicalHeaderKey(k)] = v
	}

	for _, tc := range []struct {
		peer, want string
	}{
		{"198.51.100.7:4711", "198.51.100.7"},
		{"[2001:db8:1:2:3:4:5:6]:4711", "2001:db8:1:2:3:4:5:6"}, // the address, not its /64
		{"[::ffff:198.51.100.7]:4711", "198.51.100.7"},
	} {
		h := send(upstream.Options{}, tc.peer, disguised)
		for k := range disguised {
			if k == "X-Custom" || k == "X-Real-Ip" {
				continue
			}
			if v, ok := h[k]; ok {
				t.Errorf("untrusted %s: upstream saw %s: %q", tc.peer, k, v)
			}
		}
		if v := h.Values("X-Real-IP"); len(v) != 1 || v[0] != tc.want {
			t.Errorf("untrusted %s: X-Real-IP %q, want %q", tc.peer, v, tc.want)
		}
		if h.Get("X-Custom") != "kept" || h.Get("X-Forwarded-For") == "" {
			t.Errorf("untrusted %s: X-Custom %q, X-Forwarded-For %q", tc.peer, h.Get("X-Custom"), h.Get("X-Forwarded-For"))
		}
	}

	// An honest request from an untrusted peer: only X-Real-IP is added.
	h := send(upstream.Options{}, "198.51.100.7:4711", map[string]string{"X-Custom": "kept"})
	if h.Get("X-Real-IP") != "198.51.100.7" || h.Get("X-Custom") != "kept" {
		t.Errorf("honest request: %v", h)
	}

	// ClientIP names the address the proxy used.
	trusted := upstream.Options{TrustForwarded: func(*http.Request) bool { return true },
		ClientIP: func(*http.Request) netip.Addr { return netip.MustParseAddr("203.0.113.9") }}
	h = send(trusted, "10.0.0.2:4711", disguised)
	for k, v := range disguised {
		if got := h.Values(k); len(got) != 1 || got[0] != v {
			t.Errorf("trusted: %s = %q, want %q as sent", k, got, v)
		}
	}
	h = send(trusted, "10.0.0.2:4711", map[string]string{"X-Forwarded-For": "203.0.113.9"})
	if h.Get("X-Real-IP") != "203.0.113.9" {
		t.Errorf("trusted without X-Real-IP: got %q, want the computed client", h.Get("X-Real-IP"))
	}
	untrustedClient := upstream.Options{ClientIP: func(*http.Request) netip.Addr { return netip.MustParseAddr("198.51.100.1") }}
	if h = send(untrustedClient, "198.51.100.1:1", map[string]string{"X-Real-IP": "1.1.1.1"}); h.Get("X-Real-IP") != "198.51.100.1" {
		t.Errorf("untrusted with ClientIP: X-Real-IP %q", h.Get("X-Real-IP"))
	}
}

// With NoUpgrade no protocol upgrade reaches the upstream; otherwise only
// WebSocket does (an h2c upgrade would open an unguarded HTTP/2
// connection). Other headers pass either way.
func TestUpgradeHeaders(t *testing.T) {
	target, last := headerUpstream(t)
	for _, tc := range []struct {
		noUpgrade  bool
		connection string
		upgrade    string
		want       string // the Upgrade the upstream sees; "" for none
	}{
		{true, "Upgrade", "websocket", ""},
		{true, "upgrade, HTTP2-Settings", "h2c", ""},
		{true, "keep-alive, Upgrade", "WebSocket", ""},
		{false, "Upgrade", "websocket", "websocket"},
		{false, "keep-alive, upgrade", "WebSocket", "WebSocket"},
		{false, "Upgrade, HTTP2-Settings", "h2c", ""},
		{false, "Upgrade", "websocket, h2c", ""},
		{false, "Upgrade", "TLS/1.0", ""},
		{false, "Upgrade", "HTTP/2.0", ""},
	} {
		r := httptest.NewRequest(http.MethodPost, "/v1/chat/completions", nil)
		r.Header.Set("Connection", tc.connection)
		r.Header.Set("Upgrade", tc.upgrade)
		r.Header.Set("HTTP2-Settings", "AAMAAABkAARAAAAAAAIAAAAA")
		r.Header.Set("X-Custom", "kept")
		w := httptest.NewRecorder()
		upstream.New(upstream.Options{Target: target, NoUpgrade: tc.noUpgrade}).ServeHTTP(w, r)
		h := last()
		if got := h.Get("Upgrade"); got != tc.want {
			t.Errorf("noUpgrade=%v %q: upstream saw Upgrade %q, want %q", tc.noUpgrade, tc.upgrade, got, tc.want)
		}
		if c := strings.ToLower(strings.Join(h.Values("Connection"), ",")); strings.Contains(c, "upgrade") != (tc.want != "") {
			t.Errorf("noUpgrade=%v %q: upstream saw Connection %q", tc.noUpgrade, tc.upgrade, c)
		}
		if v := h.Values("Http2-Settings"); len(v) > 0 || h.Get("X-Custom") != "kept" {
			t.Errorf("noUpgrade=%v %q: HTTP2-Settings %q, X-Custom %q", tc.noUpgrade, tc.upgrade, v, h.Get("X-Custom"))
		}
	}
}

// An upstream that switches protocols although no upgrade was forwarded
// gets no tunnel: the client gets a 502.
func TestUnrequestedSwitchIs502(t *testing.T) {
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		conn, rw, err := http.NewResponseController(w).Hijack()
		if err != nil {
			return
		}
		defer conn.Close()
		rw.WriteString("HTTP/1.1 101 Switching Protocols\r\nConnection: Upgrade\r\nUpgrade: h2c\r\n\r\n")
		rw.Flush()
	}))
	defer up.Close()
	target, _ := url.Parse(up.URL)
	status := 0
	rp := upstream.New(upstream.Options{Target: target, NoUpgrade: true,
		ErrorHandler: func(w http.ResponseWriter, _ *http.Request, s int) { status = s; w.WriteHeader(s) }})
	r := httptest.NewRequest(http.MethodPost, "/v1/chat/completions", nil)
	r.Header.Set("Connection", "Upgrade")
	r.Header.Set("Upgrade", "h2c")
	w := httptest.NewRecorder()
	rp.ServeHTTP(w, r)
	if status != http.StatusBadGateway || w.Code != http.StatusBadGateway {
		t.Fatalf("error handler got %d, client %d", status, w.Code)
	}
}
