package upstream_test

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/http/httptrace"
	"net/http/httputil"
	"net/textproto"
	"net/url"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/ratelimit-proxy/ratelimit-proxy/upstream"
)

// Hop-by-hop headers (also those Connection lists) never reach the
// upstream, "Te: trailers" does, no User-Agent is added, and the
// X-Forwarded-* headers are the proxy's for an untrusted peer and the
// chain extended for a trusted one; over the h1 client and net/http's
// transport alike.
func TestForwardRequestHeaders(t *testing.T) {
	target, last := headerUpstream(t)
	for _, tr := range []struct {
		name string
		rt   http.RoundTripper
	}{{"h1", nil}, {"net/http", upstream.NewHTTPTransport(0)}} {
		for _, trusted := range []bool{false, true} {
			h := upstream.New(upstream.Options{Target: target, Transport: tr.rt,
				TrustForwarded: func(*http.Request) bool { return trusted }})
			r := httptest.NewRequest(http.MethodPost, "http://front.example/v1/chat/completions", strings.NewReader("{}"))
			r.RemoteAddr = "10.0.0.2:4711"
			for k, v := range map[string]string{
				"Connection": "keep-alive, X-Drop-Me", "X-Drop-Me": "1", "Keep-Alive": "timeout=5",
				"Proxy-Connection": "keep-alive", "Proxy-Authorization": "Basic eA==", "Proxy-Authenticate": "x",
				"Te": "deflate, trailers", "Trailer": "X-T", "Upgrade": "websocket", "Http2-Settings": "AAA",
				"X-Custom": "kept", "X-Forwarded-For": "192.0.2.1", "X-Forwarded-Host": "edge.example",
				"X-Forwarded-Proto": "https", "Forwarded": "for=192.0.2.1",
			} {
				r.Header.Set(k, v)
			}
			w := httptest.NewRecorder()
			h.ServeHTTP(w, r)
			if w.Code != 200 || w.Body.String() != "ok" {
				t.Fatalf("%s trusted=%v: %d %q", tr.name, trusted, w.Code, w.Body)
			}
			got := last()
			for _, k := range []string{"X-Drop-Me", "Keep-Alive", "Proxy-Connection", "Proxy-Authorization",
				"Proxy-Authenticate", "Trailer", "Upgrade", "Http2-Settings", "User-Agent"} {
				if v, ok := got[k]; ok {
					t.Errorf("%s trusted=%v: upstream saw %s: %q", tr.name, trusted, k, v)
				}
			}
			if c := got.Get("Connection"); strings.Contains(strings.ToLower(c), "drop") {
				t.Errorf("%s: Connection %q", tr.name, c)
			}
			want := map[string]string{"Te": "trailers", "X-Custom": "kept", "X-Real-Ip": "10.0.0.2",
				"X-Forwarded-For": "10.0.0.2", "X-Forwarded-Host": "front.example", "X-Forwarded-Proto": "http", "Forwarded": ""}
			if trusted {
				want["X-Forwarded-For"] = "192.0.2.1, 10.0.0.2"
				want["X-Forwarded-Host"] = "edge.example"
				want["X-Forwarded-Proto"] = "https"
				want["Forwarded"] = "for=192.0.2.1"
			}
			for k, v := range want {
				if g := strings.Join(got.Values(k), "|"); g != v {
					t.Errorf("%s trusted=%v: %s = %q, want %q", tr.name, trusted, k, g, v)
				}
			}
			// The inbound request is left as it was.
			if r.Header.Get("X-Drop-Me") != "1" || r.Header.Get("X-Forwarded-For") != "192.0.2.1" || r.URL.Host != "front.example" {
				t.Errorf("%s: inbound request changed: %v %v", tr.name, r.Header, r.URL)
			}
		}
	}
}

// recordingTransport records the requests sent and answers 204.
type recordingTransport struct {
	mu   sync.Mutex
	reqs []*http.Request
}

func (rt *recordingTransport) RoundTrip(r *http.Request) (*http.Response, error) {
	rt.mu.Lock()
	rt.reqs = append(rt.reqs, r)
	rt.mu.Unlock()
	return &http.Response{StatusCode: 204, Header: http.Header{}, Body: http.NoBody, Request: r}, nil
}

func (rt *recordingTransport) last() *http.Request {
	rt.mu.Lock()
	defer rt.mu.Unlock()
	return rt.reqs[len(rt.reqs)-1]
}

// The outgoing URL is what httputil.ReverseProxy with ProxyRequest.SetURL
// sends: target and inbound paths joined (escaped paths too), queries
// joined, an unparsable query re-encoded, no Host of its own.
func TestForwardURLAsSetURL(t *testing.T) {
	targets := []string{"http://up.example", "http://up.example/", "http://up.example/base",
		"http://up.example/base/", "http://up.example/b%2Fc/", "http://up.example/base?k=v", "http://up.example:8080/v1?k=v&j=w"}
	paths := []string{"/", "/v1/chat/completions", "/a%2Fb/c", "/a%20b", "/x?q=1", "/x?a=1;b=2",
		"/x?a=%zz&b=2", "/x?a=%2", "/p?x=1&y=2&x=3", "/%7Euser", "/a/../b", "/x?", "/x?&&"}
	for _, ts := range targets {
		target, err := url.Parse(ts)
		if err != nil {
			t.Fatal(err)
		}
		ours, ref := &recordingTransport{}, &recordingTransport{}
		h := upstream.New(upstream.Options{Target: target, Transport: ours})
		rp := &httputil.ReverseProxy{Rewrite: func(pr *httputil.ProxyRequest) { pr.SetURL(target) }, Transport: ref}
		for _, p := range paths {
			for _, x := range []http.Handler{h, rp} {
				r := httptest.NewRequest(http.MethodGet, "http://front.example"+p, nil)
				x.ServeHTTP(httptest.NewRecorder(), r)
			}
			a, b := ours.last(), ref.last()
			if a.URL.String() != b.URL.String() || a.URL.Path != b.URL.Path || a.URL.RawPath != b.URL.RawPath ||
				a.URL.RawQuery != b.URL.RawQuery || a.Host != b.Host {
				t.Errorf("%s + %s: sent %q (path %q raw %q query %q host %q), SetURL gives %q (path %q raw %q query %q host %q)",
					ts, p, a.URL, a.URL.Path, a.URL.RawPath, a.URL.RawQuery, a.Host, b.URL, b.URL.Path, b.URL.RawPath, b.URL.RawQuery, b.Host)
			}
		}
	}
}

// The body sent is OutgoingBody's when it gives one, else the inbound
// body (none for an empty one); the request keeps its context and
// GetBody.
func TestForwardBodyAndContext(t *testing.T) {
	type key struct{}
	var gotBody string
	var gotCtx any
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		gotBody = string(b)
	}))
	defer up.Close()
	target, _ := url.Parse(up.URL)
	var getBody bool
	o := upstream.Options{Target: target, ModifyResponse: func(res *http.Response) error {
		gotCtx = res.Request.Context().Value(key{})
		getBody = res.Request.GetBody != nil
		return nil
	}}
	send := func(o upstream.Options, body string) {
		r := httptest.NewRequest(http.MethodPost, "/v1/x", strings.NewReader(body))
		r = r.WithContext(context.WithValue(r.Context(), key{}, "exchange"))
		r.GetBody = func() (io.ReadCloser, error) { return io.NopCloser(strings.NewReader(body)), nil }
		w := httptest.NewRecorder()
		o.ErrorHandler = func(w http.ResponseWriter, r *http.Request, s int) { t.Errorf("status %d", s) }
		upstream.New(o).ServeHTTP(w, r)
		if w.Code != 200 {
			t.Fatalf("status %d", w.Code)
		}
	}
	send(o, "inbound")
	if gotBody != "inbound" || gotCtx != "exchange" || !getBody {
		t.Errorf("body %q, context value %v, GetBody %v", gotBody, gotCtx, getBody)
	}
	o.OutgoingBody = func(in *http.Request) io.ReadCloser { return io.NopCloser(strings.NewReader("EDITED!")) }
	send(o, "inbound")
	if gotBody != "EDITED!" {
		t.Errorf("OutgoingBody: upstream got %q", gotBody)
	}
	o.OutgoingBody = func(in *http.Request) io.ReadCloser { return nil }
	send(o, "inbound")
	if gotBody != "inbound" {
		t.Errorf("OutgoingBody nil: upstream got %q", gotBody)
	}
}

// Trailers the upstream announces and sends reach the client after the
// body.
func TestForwardTrailers(t *testing.T) {
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Trailer", "X-Sum")
		io.WriteString(w, "body")
		w.Header().Set("X-Sum", "42")
		w.Header().Set(http.TrailerPrefix+"X-Late", "7") // unannounced
	}))
	defer up.Close()
	target, _ := url.Parse(up.URL)
	front := httptest.NewServer(upstream.New(upstream.Options{Target: target}))
	defer front.Close()
	res, err := http.Get(front.URL + "/t")
	if err != nil {
		t.Fatal(err)
	}
	b, err := io.ReadAll(res.Body)
	res.Body.Close()
	if err != nil || string(b) != "body" {
		t.Fatalf("body %q, %v", b, err)
	}
	if res.Trailer.Get("X-Sum") != "42" || res.Trailer.Get("X-Late") != "7" {
		t.Fatalf("trailers %v", res.Trailer)
	}
}

// A 103 Early Hints from the upstream reaches the client before the final
// response, whose headers do not repeat it.
func TestForwardInformational(t *testing.T) {
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Link", "</s.css>; rel=preload")
		w.WriteHeader(http.StatusEarlyHints)
		w.Header().Del("Link")
		io.WriteString(w, "final")
	}))
	defer up.Close()
	target, _ := url.Parse(up.URL)
	front := httptest.NewServer(upstream.New(upstream.Options{Target: target}))
	defer front.Close()
	var hints []string
	ctx := httptrace.WithClientTrace(context.Background(), &httptrace.ClientTrace{
		Got1xxResponse: func(code int, h textproto.MIMEHeader) error {
			hints = append(hints, fmt.Sprint(code, " ", h.Get("Link")))
			return nil
		}})
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, front.URL+"/", nil)
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(res.Body)
	res.Body.Close()
	if len(hints) != 1 || hints[0] != "103 </s.css>; rel=preload" || string(b) != "final" || res.Header.Get("Link") != "" {
		t.Fatalf("hints %q, body %q, final Link %q", hints, b, res.Header.Get("Link"))
	}
}

// flushRecorder is a ResponseWriter that records the body sent at each
// Flush.
type flushRecorder struct {
	mu      sync.Mutex
	h       http.Header
	code    int
	body    bytes.Buffer
	flushed []string
	flushes chan string
}

func newFlushRecorder() *flushRecorder {
	return &flushRecorder{h: http.Header{}, flushes: make(chan string, 1000)}
}

func (f *flushRecorder) Header() http.Header { return f.h }
func (f *flushRecorder) WriteHeader(code int) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.code == 0 {
		f.code = code
	}
}
func (f *flushRecorder) Write(b []byte) (int, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.body.Write(b)
}
func (f *flushRecorder) Flush() {
	f.mu.Lock()
	s := f.body.String()
	f.flushed = append(f.flushed, s)
	f.mu.Unlock()
	f.flushes <- s
}

// dataFlushes counts the flushes that sent body bytes.
func (f *flushRecorder) dataFlushes() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	n, prev := 0, ""
	for _, s := range f.flushed {
		if s != prev {
			n++
		}
		prev = s
	}
	return n
}

// smallReads reads at most 7 bytes at a time from an *h1.Body, passing its
// Buffered through, as a wrapping reader (the usage scan) may.
type smallReads struct{ io.ReadCloser }

func (s smallReads) Read(p []byte) (int, error) { return s.ReadCloser.Read(p[:min(len(p), 7)]) }
func (s smallReads) Buffered() int              { return s.ReadCloser.(interface{ Buffered() int }).Buffered() }

// waitFlush waits for a flush whose body contains want.
func waitFlush(t *testing.T, f *flushRecorder, want string) {
	t.Helper()
	timeout := time.After(10 * time.Second)
	for {
		select {
		case s := <-f.flushes:
			if strings.Contains(s, want) {
				return
			}
		case <-timeout:
			t.Fatalf("no flush with %q; flushed %q", want, f.flushed)
		}
	}
}

// SSE events the upstream sends in one burst reach the client in one
// flush, however many reads the copy takes; an event sent alone is
// flushed at once (the next is not sent before the client has it).
func TestForwardStreamFlushes(t *testing.T) {
	step := make(chan struct{})
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/event-stream")
		w.WriteHeader(200)
		http.NewResponseController(w).Flush()
		<-step
		for i := 1; i <= 3; i++ {
			fmt.Fprintf(w, "data: {\"burst\":%d,\"pad\":\"%s\"}\n\n", i, strings.Repeat("x", 40))
		}
		http.NewResponseController(w).Flush()
		for i := 4; i <= 5; i++ {
			<-step
			fmt.Fprintf(w, "data: {\"alone\":%d}\n\n", i)
			http.NewResponseController(w).Flush()
		}
	}))
	defer up.Close()
	target, _ := url.Parse(up.URL)
	h := upstream.New(upstream.Options{Target: target, ModifyResponse: func(res *http.Response) error {
		res.Body = smallReads{res.Body}
		return nil
	}})
	f := newFlushRecorder()
	done := make(chan struct{})
	go func() {
		defer close(done)
		h.ServeHTTP(f, httptest.NewRequest(http.MethodPost, "/v1/chat/completions", nil))
	}()
	waitFlush(t, f, "") // the head, before any event
	step <- struct{}{}
	waitFlush(t, f, `"burst":3`)
	if n := f.dataFlushes(); n != 1 {
		t.Errorf("burst of 3 events: %d flushes with data (%q), want 1", n, f.flushed)
	}
	step <- struct{}{}
	waitFlush(t, f, `"alone":4`)
	step <- struct{}{}
	<-done
	if !strings.HasSuffix(f.body.String(), "data: {\"alone\":5}\n\n") || f.code != 200 {
		t.Fatalf("code %d body %q", f.code, f.body.String())
	}
}

// A body of known length is copied without a flush midway.
func TestForwardSizedBodyNotFlushed(t *testing.T) {
	body := strings.Repeat("0123456789abcdef", 16<<10) // 256 KiB: several reads
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		w.Header().Set("Content-Length", fmt.Sprint(len(body)))
		io.WriteString(w, body)
	}))
	defer up.Close()
	target, _ := url.Parse(up.URL)
	f := newFlushRecorder()
	upstream.New(upstream.Options{Target: target}).ServeHTTP(f, httptest.NewRequest(http.MethodGet, "/", nil))
	if f.body.String() != body || len(f.flushed) != 0 {
		t.Fatalf("body %d bytes, %d flushes", f.body.Len(), len(f.flushed))
	}
}

// A body cut short by the upstream is cut short for the client too: the
// connection ends without the response's end, never a clean short body.
func TestForwardCopyErrorAborts(t *testing.T) {
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		c, brw, err := http.NewResponseController(w).Hijack()
		if err != nil {
			return
		}
		brw.WriteString("HTTP/1.1 200 OK\r\nContent-Length: 1000\r\n\r\nonly this")
		brw.Flush()
		c.Close()
	}))
	defer up.Close()
	target, _ := url.Parse(up.URL)
	front := httptest.NewServer(upstream.New(upstream.Options{Target: target}))
	defer front.Close()
	res, err := http.Get(front.URL + "/")
	if err != nil {
		return // cut before the head was sent
	}
	b, err := io.ReadAll(res.Body)
	res.Body.Close()
	if err == nil {
		t.Fatalf("client read %q cleanly", b)
	}
}

// Transport errors reach ErrorHandler as 502, 504 past the response
// header timeout, and 499 when the client left first; an unasked 101 is a
// 502.
func TestForwardErrors(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	closed, _ := url.Parse("http://" + ln.Addr().String())
	ln.Close()
	release := make(chan struct{})
	slow := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		select {
		case <-release:
		case <-r.Context().Done():
		}
	}))
	defer slow.Close()
	defer close(release)
	slowURL, _ := url.Parse(slow.URL)
	switching := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		c, brw, err := http.NewResponseController(w).Hijack()
		if err != nil {
			return
		}
		defer c.Close()
		brw.WriteString("HTTP/1.1 101 Switching Protocols\r\nConnection: Upgrade\r\nUpgrade: h2c\r\n\r\n")
		brw.Flush()
	}))
	defer switching.Close()
	switchURL, _ := url.Parse(switching.URL)

	for _, tc := range []struct {
		name    string
		target  *url.URL
		timeout time.Duration
		cancel  bool
		want    int
	}{
		{"refused", closed, 0, false, http.StatusBadGateway},
		{"timeout", slowURL, 50 * time.Millisecond, false, http.StatusGatewayTimeout},
		{"client gone", slowURL, 0, true, upstream.StatusClientClosed},
		{"unasked 101", switchURL, 0, false, http.StatusBadGateway},
	} {
		status := 0
		h := upstream.New(upstream.Options{Target: tc.target, ResponseHeaderTimeout: tc.timeout,
			ErrorHandler: func(w http.ResponseWriter, r *http.Request, s int) { status = s; w.WriteHeader(s) }})
		r := httptest.NewRequest(http.MethodPost, "/v1/chat/completions", strings.NewReader("{}"))
		if tc.cancel {
			ctx, cancel := context.WithCancel(r.Context())
			r = r.WithContext(ctx)
			time.AfterFunc(50*time.Millisecond, cancel)
		}
		h.ServeHTTP(httptest.NewRecorder(), r)
		if status != tc.want {
			t.Errorf("%s: status %d, want %d", tc.name, status, tc.want)
		}
	}
}
