package tests

import (
	"bufio"
	"bytes"
	"context"
	"io"
	"math/rand/v2"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"
)

// 5. Bodies (any bytes) and Authorization reach the upstream byte for
// byte, with Content-Length, path and query preserved.
func TestBodyAndAuthorizationForwardedUnchanged(t *testing.T) {
	t.Parallel()
	up := newRecorder(t)
	p := startProxy(t, up.URL(), nil)

	raw := make([]byte, 200<<10)
	rng := rand.New(rand.NewPCG(1, 2))
	for i := range raw {
		raw[i] = byte(rng.UintN(256))
	}
	copy(raw, []byte{0xff, 0xfe, 0x00, 0xc3, 0x28, 0xed, 0xa0, 0x80, '\r', '\n'}) // BOM-ish, NUL, invalid UTF-8
	// A JSON body with unusual but valid spelling, on a protected route:
	// whitespace, escapes and key order must survive.
	chat := []byte("{ \"messages\" :[ {\"content\":\"h\\u00e9llo \\\"w\\\" \u2603\",\n\t\"role\":\"user\"}],\r\n \"model\":\"gpt-4o-mini\" ,\"x\":1e0 }  ")

	for _, tc := range []struct {
		name, path, query string
		body              []byte
	}{
		{"binary on an unprotected route", "/v1/files/upload", "purpose=fine-tune&name=a%2Fb%20c&empty=", raw},
		{"JSON on a protected route", "/v1/chat/completions", "api-version=2024-06-01&x=%E2%98%83", chat},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := p.do(t, http.MethodPost, p.url(tc.path+"?"+tc.query), tc.body,
				"Authorization", "Bearer sk-secret", "X-Custom", "kept")
			wantStatus(t, r, http.StatusOK)
			got := up.last(t)
			if !bytes.Equal(got.Body, tc.body) {
				t.Errorf("upstream body differs: got %d bytes, sent %d (first difference at %d)",
					len(got.Body), len(tc.body), firstDiff(got.Body, tc.body))
			}
			if v := got.Header.Values("Authorization"); len(v) != 1 || v[0] != "Bearer sk-secret" {
				t.Errorf("upstream Authorization = %q, want exactly \"Bearer sk-secret\"", v)
			}
			if got.ContentLength != int64(len(tc.body)) || got.Header.Get("Content-Length") != strconv.Itoa(len(tc.body)) {
				t.Errorf("upstream Content-Length = %d (header %q), want %d", got.ContentLength, got.Header.Get("Content-Length"), len(tc.body))
			}
			if got.Path != tc.path || got.RawQuery != tc.query {
				t.Errorf("upstream saw %s?%s, want %s?%s", got.Path, got.RawQuery, tc.path, tc.query)
			}
			if got.Header.Get("X-Custom") != "kept" || got.Header.Get("Content-Type") != "application/json" {
				t.Errorf("end-to-end headers lost: %v", got.Header)
			}
		})
	}
}

func firstDiff(a, b []byte) int {
	for i := range min(len(a), len(b)) {
		if a[i] != b[i] {
			return i
		}
	}
	return min(len(a), len(b))
}

// 6a. From an untrusted peer, X-Forwarded-For is replaced by the peer and
// X-Forwarded-Proto/Host are set by the proxy.
func TestXForwardedFromUntrustedPeer(t *testing.T) {
	t.Parallel()
	up := newRecorder(t)
	p := startProxy(t, up.URL(), nil)

	r := p.post(t, "/v1/chat/completions", "X-Forwarded-For", "1.2.3.4",
		"X-Forwarded-Host", "evil.example", "X-Forwarded-Proto", "https")
	wantStatus(t, r, http.StatusOK)
	h := up.last(t).Header
	if v := h.Values("X-Forwarded-For"); len(v) != 1 || v[0] != "127.0.0.1" {
		t.Errorf("upstream X-Forwarded-For = %q, want only the peer \"127.0.0.1\"", v)
	}
	if v := h.Values("X-Forwarded-Proto"); len(v) != 1 || v[0] != "http" {
		t.Errorf("upstream X-Forwarded-Proto = %q, want \"http\"", v)
	}
	if v := h.Values("X-Forwarded-Host"); len(v) != 1 || v[0] != p.public {
		t.Errorf("upstream X-Forwarded-Host = %q, want %q", v, p.public)
	}
}

// 6b. From a trusted proxy, the inbound chain is kept with the peer
// appended, and the client it names is the rate-limited caller.
func TestXForwardedFromTrustedProxy(t *testing.T) {
	t.Parallel()
	up := newRecorder(t)
	p := startProxy(t, up.URL(), map[string]string{"TRUSTED_PROXIES": "127.0.0.1/32", "CHAT_RPM": "1"})

	r := p.post(t, "/v1/chat/completions", "X-Forwarded-For", "203.0.113.9")
	wantStatus(t, r, http.StatusOK)
	h := up.last(t).Header
	if v := h.Values("X-Forwarded-For"); len(v) != 1 || v[0] != "203.0.113.9, 127.0.0.1" {
		t.Errorf("upstream X-Forwarded-For = %q, want \"203.0.113.9, 127.0.0.1\"", v)
	}
	if h.Get("X-Forwarded-Proto") == "" || h.Get("X-Forwarded-Host") == "" {
		t.Errorf("X-Forwarded-Proto %q / X-Forwarded-Host %q not set", h.Get("X-Forwarded-Proto"), h.Get("X-Forwarded-Host"))
	}

	r = p.post(t, "/api/chat", "X-Forwarded-For", "203.0.113.9")
	wantStatus(t, r, http.StatusTooManyRequests)
	if got := r.json(t)["denied_key"]; got != "caller=ip:203.0.113.9" {
		t.Errorf("denied_key = %#v, want caller=ip:203.0.113.9", got)
	}
	r = p.post(t, "/api/chat", "X-Forwarded-For", "198.51.100.7")
	if r.StatusCode != http.StatusOK {
		t.Errorf("another client behind the trusted proxy shares a budget: status %d %s", r.StatusCode, r.body)
	}
}

// releaser is a gate an upstream handler waits on; released at most once
// and always at cleanup, so no handler outlives its test.
type releaser struct {
	ch   chan struct{}
	once sync.Once
}

func newReleaser(t *testing.T) *releaser {
	r := &releaser{ch: make(chan struct{})}
	t.Cleanup(r.release)
	return r
}

func (r *releaser) release() { r.once.Do(func() { close(r.ch) }) }

// 8. Streaming responses (SSE, and chunked of unknown length) reach the
// client as they are written, not when the upstream finishes.
func TestStreamingIsUnbuffered(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name, path, ctype, first, second string
	}{
		{"sse", "/v1/chat/completions", "text/event-stream", "data: 1\n\n", "data: 2\n\n"},
		{"chunked", "/api/chat", "text/plain; charset=utf-8", "chunk-1\n", "chunk-2\n"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			gate := newReleaser(t)
			up := newUpstream(t, func(w http.ResponseWriter, r *http.Request) {
				io.Copy(io.Discard, r.Body)
				w.Header().Set("Content-Type", tc.ctype)
				w.WriteHeader(http.StatusOK)
				io.WriteString(w, tc.first)
				http.NewResponseController(w).Flush()
				select {
				case <-gate.ch:
				case <-r.Context().Done():
					t.Logf("upstream: request context ended before the release: %v", context.Cause(r.Context()))
					return
				}
				io.WriteString(w, tc.second)
			})
			p := startProxy(t, up.URL, nil)

			first := make(chan string, 1)
			rest := make(chan string, 1)
			headers := make(chan *http.Response, 1)
			go func() {
				req, _ := http.NewRequest(http.MethodPost, p.url(tc.path), bytes.NewReader(bodyFor(tc.path)))
				resp, err := p.client.Do(req)
				if err != nil {
					first <- "error: " + err.Error()
					return
				}
				defer resp.Body.Close()
				headers <- resp
				br := bufio.NewReader(resp.Body)
				buf := make([]byte, len(tc.first))
				_, err = io.ReadFull(br, buf)
				first <- string(buf)
				if err != nil {
					return
				}
				b, err := io.ReadAll(br)
				if err != nil {
					b = append(b, "\nread error: "+err.Error()...)
				}
				rest <- string(b)
			}()
			select {
			case got := <-first:
				if got != tc.first {
					t.Fatalf("first event = %q, want %q", got, tc.first)
				}
			case <-time.After(3 * time.Second):
				gate.release() // let the proxy drain at cleanup
				t.Fatalf("the first %s event did not reach the client within 3 s while the upstream held the stream open: the proxy buffers", tc.name)
			}
			resp := <-headers
			if resp.StatusCode != http.StatusOK {
				t.Fatalf("status %d", resp.StatusCode)
			}
			if resp.ContentLength != -1 {
				t.Errorf("Content-Length %d on a stream", resp.ContentLength)
			}
			if ct := resp.Header.Get("Content-Type"); ct != tc.ctype {
				t.Errorf("Content-Type = %q, want %q", ct, tc.ctype)
			}
			for _, h := range rateLimitHeaders {
				if resp.Header.Get(h) == "" {
					t.Errorf("streamed response lacks %s", h)
				}
			}
			gate.release()
			select {
			case got := <-rest:
				if got != tc.second {
					t.Errorf("rest of the stream = %q, want %q", got, tc.second)
				}
			case <-time.After(5 * time.Second):
				t.Fatal("the stream did not end after the upstream finished")
			}
		})
	}
}

// 9a. An unreachable upstream is a 502 in the path's envelope, still with
// the rate-limit headers.
func TestUpstreamDownIs502(t *testing.T) {
	t.Parallel()
	p := startProxy(t, deadURL(t), map[string]string{"CHAT_RPM": "5"})

	r := p.post(t, "/api/chat")
	wantStatus(t, r, http.StatusBadGateway)
	wantRateLimitHeaders(t, r)
	wantHeader(t, r, "X-RateLimit-Remaining", "4")
	if ct := r.Header.Get("Content-Type"); ct != "application/json" {
		t.Errorf("502 Content-Type = %q", ct)
	}
	if b := r.json(t); b["error"] != "upstream_unavailable" {
		t.Errorf("flat 502 body = %v", b)
	}

	r = p.post(t, "/v1/chat/completions")
	wantStatus(t, r, http.StatusBadGateway)
	wantRateLimitHeaders(t, r)
	if b := r.json(t); field(b, "error", "code") != "upstream_unavailable" || field(b, "error", "type") != "api_error" {
		t.Errorf("OpenAI 502 body = %v", b)
	}
}

// 9b. An upstream slower than UPSTREAM_TIMEOUT is a 504 upstream_timeout.
func TestUpstreamTimeoutIs504(t *testing.T) {
	t.Parallel()
	up := newUpstream(t, func(w http.ResponseWriter, r *http.Request) {
		io.Copy(io.Discard, r.Body) // so the server notices a closed connection
		select {
		case <-r.Context().Done():
		case <-time.After(5 * time.Second):
		}
	})
	p := startProxy(t, up.URL, map[string]string{"UPSTREAM_TIMEOUT": "1s"})

	start := time.Now()
	r := p.post(t, "/api/chat")
	took := time.Since(start)
	wantStatus(t, r, http.StatusGatewayTimeout)
	if took < 900*time.Millisecond || took > 4*time.Second {
		t.Errorf("504 after %v, want about UPSTREAM_TIMEOUT=1s", took)
	}
	wantRateLimitHeaders(t, r)
	if b := r.json(t); b["error"] != "upstream_timeout" {
		t.Errorf("504 body = %v", b)
	}
}

// 15. A client that goes away cancels the upstream request, and the proxy
// keeps serving.
func TestClientDisconnectCancelsUpstream(t *testing.T) {
	t.Parallel()
	received := make(chan struct{})
	cancelled := make(chan struct{})
	var once sync.Once
	up := newUpstream(t, func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/v1/chat/completions" {
			w.Write([]byte("fast\n"))
			return
		}
		io.Copy(io.Discard, r.Body) // so the server notices a closed connection
		once.Do(func() { close(received) })
		select {
		case <-r.Context().Done():
			close(cancelled)
		case <-time.After(10 * time.Second):
		}
	})
	p := startProxy(t, up.URL, nil)

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	errc := make(chan error, 1)
	go func() {
		req, _ := http.NewRequestWithContext(ctx, http.MethodPost, p.url("/v1/chat/completions"), strings.NewReader(string(bodyFor("/v1/chat/completions"))))
		resp, err := p.client.Do(req)
		if err == nil {
			resp.Body.Close()
		}
		errc <- err
	}()
	select {
	case <-received:
	case <-time.After(5 * time.Second):
		t.Fatal("the upstream never received the request")
	}
	cancel()
	select {
	case <-cancelled:
	case <-time.After(5 * time.Second):
		t.Fatal("the client disconnected but the upstream request was not cancelled within 5 s")
	}
	if err := <-errc; err == nil {
		t.Error("the cancelled request got a response")
	}
	r := p.do(t, http.MethodPost, p.url("/api/chat"), bodyFor("/api/chat"))
	wantStatus(t, r, http.StatusOK)
	if string(r.body) != "fast\n" {
		t.Errorf("body after a disconnect = %q", r.body)
	}
	select {
	case <-p.done:
		t.Fatalf("the proxy exited: %v", p.waitErr)
	default:
	}
}
