package h1_test

import (
	"bufio"
	"bytes"
	"context"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/http/httptrace"
	"net/textproto"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ratelimit-proxy/ratelimit-proxy/upstream"
	"github.com/ratelimit-proxy/ratelimit-proxy/upstream/h1"
)

// rawOrigin is a loopback origin that reads each request with
// http.ReadRequest and answers with serve's bytes; it counts connections.
type rawOrigin struct {
	ln    net.Listener
	conns atomic.Int64
	reqs  atomic.Int64
}

func newRawOrigin(t *testing.T, serve func(n int64, c net.Conn, req *http.Request, body []byte) bool) *rawOrigin {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	o := &rawOrigin{ln: ln}
	var wg sync.WaitGroup
	var mu sync.Mutex
	var open []net.Conn
	t.Cleanup(func() {
		ln.Close()
		mu.Lock()
		for _, c := range open {
			c.Close()
		}
		mu.Unlock()
		wg.Wait()
	})
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			o.conns.Add(1)
			mu.Lock()
			open = append(open, c)
			mu.Unlock()
			wg.Add(1)
			go func() {
				defer wg.Done()
				defer c.Close()
				br := bufio.NewReader(c)
				for {
					req, err := http.ReadRequest(br)
					if err != nil {
						return
					}
					body, _ := io.ReadAll(req.Body)
					if !serve(o.reqs.Add(1), c, req, body) {
						return
					}
				}
			}()
		}
	}()
	return o
}

func (o *rawOrigin) client(o2 h1.Options) *h1.Client {
	o2.Host = o.ln.Addr().String()
	return h1.New(o2)
}

func (o *rawOrigin) url(path string) string { return "http://" + o.ln.Addr().String() + path }

func okJSON(c net.Conn) bool {
	io.WriteString(c, "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 11\r\n\r\n{\"ok\":true}")
	return true
}

func do(t *testing.T, rt http.RoundTripper, method, url, body string) (*http.Response, string) {
	t.Helper()
	var r io.Reader
	if body != "" {
		r = strings.NewReader(body)
	}
	req, _ := http.NewRequest(method, url, r)
	res, err := rt.RoundTrip(req)
	if err != nil {
		t.Fatalf("%s %s: %v", method, url, err)
	}
	b, err := io.ReadAll(res.Body)
	res.Body.Close()
	if err != nil {
		t.Fatal(err)
	}
	return res, string(b)
}

func TestSequentialRequestsShareOneConnection(t *testing.T) {
	o := newRawOrigin(t, func(_ int64, c net.Conn, _ *http.Request, _ []byte) bool { return okJSON(c) })
	cl := o.client(h1.Options{})
	for i := 0; i < 100; i++ {
		if _, b := do(t, cl, "POST", o.url("/v1/chat/completions"), `{"model":"x"}`); b != `{"ok":true}` {
			t.Fatalf("body %q", b)
		}
	}
	if n := o.conns.Load(); n != 1 {
		t.Fatalf("%d connections for 100 sequential requests, want 1", n)
	}
	// The connection is peeked at when first taken back from the pool;
	// kept alive since, back-to-back requests take it without a syscall.
	// (A request slower than freshIdle under a loaded race detector costs
	// one more peek: the bound leaves room for that, not for one a request.)
	if p := cl.Stats().Peeks; p < 1 || p > 10 {
		t.Fatalf("%d liveness peeks for 100 back-to-back requests on a kept-alive connection, want about 1", p)
	}
}

func TestConcurrentClientsReuseConnections(t *testing.T) {
	o := newRawOrigin(t, func(_ int64, c net.Conn, _ *http.Request, _ []byte) bool { return okJSON(c) })
	cl := o.client(h1.Options{})
	const workers, each = 50, 40
	var wg sync.WaitGroup
	for w := 0; w < workers; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; i < each; i++ {
				do(t, cl, "POST", o.url("/"), "x")
			}
		}()
	}
	wg.Wait()
	if n := o.conns.Load(); n > workers {
		t.Fatalf("%d connections for %d concurrent clients", n, workers)
	}
	if s := cl.Stats(); s.Dials != o.conns.Load() {
		t.Fatalf("Stats.Dials %d, origin saw %d", s.Dials, o.conns.Load())
	}
}

func TestRequestIsOneWriteWithItsBody(t *testing.T) {
	got := make(chan []byte, 1)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	go func() {
		c, err := ln.Accept()
		if err != nil {
			return
		}
		defer c.Close()
		buf := make([]byte, 4096)
		n, _ := c.Read(buf) // the first read gets everything written at once
		got <- buf[:n]
		okJSON(c)
	}()
	cl := h1.New(h1.Options{Host: ln.Addr().String()})
	body := strings.Repeat("b", 300)
	req, _ := http.NewRequest("POST", "http://"+ln.Addr().String()+"/p?q=1", io.NopCloser(bytes.NewReader([]byte(body))))
	req.ContentLength = int64(len(body))
	req.Header.Set("User-Agent", "")
	req.Header.Set("X-A", "1")
	res, err := cl.RoundTrip(req)
	if err != nil {
		t.Fatal(err)
	}
	res.Body.Close()
	first := string(<-got)
	want := "POST /p?q=1 HTTP/1.1\r\nHost: " + ln.Addr().String() + "\r\nContent-Length: 300\r\nX-A: 1\r\n\r\n" + body
	if first != want {
		t.Fatalf("first read %q\nwant %q", first, want)
	}
}

func TestFraming(t *testing.T) {
	answers := map[string]string{
		"/cl":      "HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nhello",
		"/chunked": "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\nTrailer: X-Sum\r\n\r\n3\r\nhel\r\n2\r\nlo\r\n0\r\nX-Sum: 5\r\n\r\n",
		"/204":     "HTTP/1.1 204 No Content\r\n\r\n",
		"/304":     "HTTP/1.1 304 Not Modified\r\nContent-Length: 99\r\n\r\n",
		"/1xx":     "HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 103 Early Hints\r\nLink: </s.css>\r\n\r\nHTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nhello",
		"/head":    "HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\n",
	}
	o := newRawOrigin(t, func(_ int64, c net.Conn, req *http.Request, _ []byte) bool {
		io.WriteString(c, answers[req.URL.Path])
		return true
	})
	cl := o.client(h1.Options{})
	for _, tc := range []struct{ method, path, body, trailer string }{
		{"GET", "/cl", "hello", ""},
		{"GET", "/chunked", "hello", "5"},
		{"GET", "/204", "", ""},
		{"GET", "/304", "", ""},
		{"HEAD", "/head", "", ""},
		{"GET", "/1xx", "hello", ""},
		{"GET", "/cl", "hello", ""},
	} {
		res, b := do(t, cl, tc.method, o.url(tc.path), "")
		if b != tc.body || res.Trailer.Get("X-Sum") != tc.trailer {
			t.Fatalf("%s %s: body %q trailer %q", tc.method, tc.path, b, res.Trailer.Get("X-Sum"))
		}
		if tc.path == "/head" && res.ContentLength != 5 {
			t.Fatalf("HEAD ContentLength %d", res.ContentLength)
		}
	}
	if n := o.conns.Load(); n != 1 {
		t.Fatalf("%d connections, want 1: every framing leaves the connection reusable", n)
	}
	// 103 reaches the request's trace, as with net/http.
	var hints []int
	req, _ := http.NewRequest("GET", o.url("/1xx"), nil)
	req = req.WithContext(httptrace.WithClientTrace(req.Context(), &httptrace.ClientTrace{
		Got1xxResponse: func(code int, h textproto.MIMEHeader) error { hints = append(hints, code); return nil },
	}))
	res, err := cl.RoundTrip(req)
	if err != nil {
		t.Fatal(err)
	}
	res.Body.Close()
	if len(hints) != 2 || hints[0] != 100 || hints[1] != 103 {
		t.Fatalf("1xx seen %v", hints)
	}
}

func TestConnectionClose(t *testing.T) {
	o := newRawOrigin(t, func(_ int64, c net.Conn, req *http.Request, _ []byte) bool {
		if req.URL.Path == "/server-closes" {
			io.WriteString(c, "HTTP/1.1 200 OK\r\nConnection: close\r\nContent-Length: 2\r\n\r\nok")
			return false
		}
		return okJSON(c)
	})
	cl := o.client(h1.Options{})
	do(t, cl, "GET", o.url("/server-closes"), "")
	do(t, cl, "GET", o.url("/server-closes"), "")
	if n := o.conns.Load(); n != 2 {
		t.Fatalf("%d connections after two Connection: close answers, want 2", n)
	}
	req, _ := http.NewRequest("GET", o.url("/"), nil)
	req.Close = true
	res, err := cl.RoundTrip(req)
	if err != nil {
		t.Fatal(err)
	}
	io.ReadAll(res.Body)
	res.Body.Close()
	do(t, cl, "GET", o.url("/"), "")
	if n := o.conns.Load(); n != 4 {
		t.Fatalf("%d connections, want 4: a request with Connection: close is not followed on its connection", n)
	}
	if s := cl.Stats(); s.Idle != 1 {
		t.Fatalf("%d idle, want 1", s.Idle)
	}
}

func TestUnreadBodyClosesConnection(t *testing.T) {
	hold := make(chan struct{})
	o := newRawOrigin(t, func(n int64, c net.Conn, r *http.Request, _ []byte) bool {
		if r.URL.Path == "/partial" { // the rest of the body is never sent
			io.WriteString(c, "HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\n012")
			<-hold
			return false
		}
		io.WriteString(c, "HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\n0123456789")
		return true
	})
	defer close(hold)
	cl := o.client(h1.Options{})
	closeEarly := func(path string) {
		req, _ := http.NewRequest("GET", o.url(path), nil)
		res, err := cl.RoundTrip(req)
		if err != nil {
			t.Fatal(err)
		}
		buf := make([]byte, 3)
		io.ReadFull(res.Body, buf)
		res.Body.Close()
	}
	// The rest of the body was in the buffer already: read past, reused.
	closeEarly("/")
	do(t, cl, "GET", o.url("/"), "")
	if n := o.conns.Load(); n != 1 {
		t.Fatalf("%d connections, want 1: a body closed with its rest buffered is reused", n)
	}
	// The rest has not come: the connection (the pooled one) cannot be
	// reused, and the next request dials.
	closeEarly("/partial")
	do(t, cl, "GET", o.url("/"), "")
	if n := o.conns.Load(); n != 2 {
		t.Fatalf("%d connections, want 2: a body closed before its end is not reused", n)
	}
}

// TestCancelledAfterTheAnswerKeepsConnection: a request whose context ends
// once its answer is in (a client that left as the answer came) still
// gives its connection back, read to the end from the buffer.
func TestCancelledAfterTheAnswerKeepsConnection(t *testing.T) {
	o := newRawOrigin(t, func(_ int64, c net.Conn, _ *http.Request, _ []byte) bool { return okJSON(c) })
	cl := o.client(h1.Options{})
	for range 20 {
		ctx, cancel := context.WithCancel(context.Background())
		req, _ := http.NewRequestWithContext(ctx, "POST", o.url("/"), strings.NewReader("x"))
		res, err := cl.RoundTrip(req)
		if err != nil {
			t.Fatal(err)
		}
		for res.Body.(*h1.Body).Buffered() == 0 { // the whole answer is in
			time.Sleep(time.Millisecond)
		}
		cancel()
		b, _ := io.ReadAll(res.Body)
		res.Body.Close()
		if string(b) != `{"ok":true}` {
			t.Fatalf("body %q", b)
		}
	}
	do(t, cl, "GET", o.url("/"), "")
	if n := o.conns.Load(); n != 1 {
		t.Fatalf("%d connections for 21 requests, 20 of them cancelled after their answer came, want 1", n)
	}
}

func TestResponseHeaderTimeoutIs504(t *testing.T) {
	release := make(chan struct{})
	defer close(release)
	o := newRawOrigin(t, func(_ int64, c net.Conn, _ *http.Request, _ []byte) bool {
		<-release
		return false
	})
	cl := o.client(h1.Options{ResponseHeaderTimeout: 100 * time.Millisecond})
	req, _ := http.NewRequest("POST", o.url("/"), strings.NewReader("x"))
	_, err := cl.RoundTrip(req)
	if err == nil {
		t.Fatal("no error past the response-header timeout")
	}
	if s := upstream.Status(req.Context(), err); s != http.StatusGatewayTimeout {
		t.Fatalf("status %d for %v, want 504", s, err)
	}
}

func TestCancelAbortsWait(t *testing.T) {
	release := make(chan struct{})
	defer close(release)
	o := newRawOrigin(t, func(_ int64, c net.Conn, _ *http.Request, _ []byte) bool {
		<-release
		return false
	})
	cl := o.client(h1.Options{})
	ctx, cancel := context.WithCancel(context.Background())
	req, _ := http.NewRequestWithContext(ctx, "GET", o.url("/"), nil)
	done := make(chan error, 1)
	go func() {
		_, err := cl.RoundTrip(req)
		done <- err
	}()
	time.Sleep(50 * time.Millisecond) // the request is waiting for its head
	cancel()
	select {
	case err := <-done:
		if s := upstream.Status(ctx, err); s != upstream.StatusClientClosed {
			t.Fatalf("status %d for %v", s, err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("cancel did not abort the wait")
	}
}

// staleOrigin answers the first request on each connection, then closes
// the connection without answering the second (as a peer whose keep-alive
// ran out just as the request came).
func staleOrigin(t *testing.T) *rawOrigin {
	var perConn sync.Map
	return newRawOrigin(t, func(_ int64, c net.Conn, _ *http.Request, _ []byte) bool {
		if _, seen := perConn.LoadOrStore(c, true); seen {
			return false
		}
		return okJSON(c)
	})
}

func TestStaleConnectionRetriedForIdempotentOnly(t *testing.T) {
	o := staleOrigin(t)
	cl := o.client(h1.Options{})
	do(t, cl, "GET", o.url("/"), "") // pools a connection the origin will drop on its next request
	// A GET that found it dead after writing: retried once, on a new one.
	if _, b := do(t, cl, "GET", o.url("/"), ""); b != `{"ok":true}` {
		t.Fatalf("GET body %q", b)
	}
	if n := o.conns.Load(); n != 2 {
		t.Fatalf("%d connections, want 2", n)
	}
	// A POST whose bytes were written on it: never sent twice.
	reqs := o.reqs.Load()
	req, _ := http.NewRequest("POST", o.url("/"), strings.NewReader(`{"n":1}`))
	if res, err := cl.RoundTrip(req); err == nil {
		res.Body.Close()
		t.Fatal("POST on a connection the origin dropped succeeded: it was sent twice")
	}
	if got := o.reqs.Load() - reqs; got != 1 {
		t.Fatalf("the origin read the POST %d times, want 1", got)
	}
}

func TestClosedIdleConnectionNotTaken(t *testing.T) {
	o := newRawOrigin(t, func(n int64, c net.Conn, _ *http.Request, _ []byte) bool {
		okJSON(c)
		return false // close right after answering
	})
	cl := o.client(h1.Options{})
	// The answer has no Connection: close, so the connection is pooled;
	// the origin's close is seen when it is taken, and a POST goes on a
	// new connection instead of failing.
	do(t, cl, "POST", o.url("/"), "a")
	time.Sleep(20 * time.Millisecond) // the FIN arrives
	if _, b := do(t, cl, "POST", o.url("/"), "b"); b != `{"ok":true}` {
		t.Fatalf("body %q", b)
	}
}

func TestFallbackCarriesUpgradesAndOtherHosts(t *testing.T) {
	var fallback atomic.Int64
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, "fb") }))
	defer srv.Close()
	o := newRawOrigin(t, func(_ int64, c net.Conn, _ *http.Request, _ []byte) bool { return okJSON(c) })
	cl := o.client(h1.Options{Fallback: roundTripFunc(func(r *http.Request) (*http.Response, error) {
		fallback.Add(1)
		return http.DefaultTransport.RoundTrip(r)
	})})
	req, _ := http.NewRequest("GET", o.url("/ws"), nil)
	req.Header.Set("Connection", "Upgrade")
	req.Header.Set("Upgrade", "websocket")
	if res, err := cl.RoundTrip(req); err == nil {
		res.Body.Close()
	}
	do(t, cl, "GET", srv.URL, "")
	if fallback.Load() != 2 {
		t.Fatalf("fallback carried %d requests, want 2", fallback.Load())
	}
}

type roundTripFunc func(*http.Request) (*http.Response, error)

func (f roundTripFunc) RoundTrip(r *http.Request) (*http.Response, error) { return f(r) }

func TestChunkedRequestBody(t *testing.T) {
	o := newRawOrigin(t, func(_ int64, c net.Conn, req *http.Request, body []byte) bool {
		if len(req.TransferEncoding) != 1 || string(body) != strings.Repeat("z", 100_000) {
			io.WriteString(c, "HTTP/1.1 400 Bad\r\nContent-Length: 0\r\n\r\n")
			return true
		}
		return okJSON(c)
	})
	cl := o.client(h1.Options{})
	req, _ := http.NewRequest("POST", o.url("/"), io.MultiReader(strings.NewReader(strings.Repeat("z", 100_000))))
	req.ContentLength = -1
	res, err := cl.RoundTrip(req)
	if err != nil {
		t.Fatal(err)
	}
	res.Body.Close()
	if res.StatusCode != 200 {
		t.Fatalf("status %d", res.StatusCode)
	}
}

// TestClientGoneBeforeSendCostsNoConnection: under load RoundTrip yields
// the processor before it sends (so that one scheduling round's requests
// leave together); a client that leaves during that yield must not cost
// a pooled connection. With one processor and a round trip already under
// way the client is under load, and the goroutine started here runs in
// that yield (nearly always), and cancels the request.
func TestClientGoneBeforeSendCostsNoConnection(t *testing.T) {
	hold := make(chan struct{})
	var release sync.Once
	o := newRawOrigin(t, func(_ int64, c net.Conn, req *http.Request, _ []byte) bool {
		if req.URL.Path == "/hold" {
			<-hold
		}
		return okJSON(c)
	})
	t.Cleanup(func() { release.Do(func() { close(hold) }) }) // before the origin's
	defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(1))
	cl := o.client(h1.Options{})       // made with one processor
	do(t, cl, "POST", o.url("/"), "x") // one pooled connection
	held := make(chan error, 1)
	go func() {
		req, _ := http.NewRequest("POST", o.url("/hold"), strings.NewReader("x"))
		res, err := cl.RoundTrip(req)
		if err == nil {
			io.Copy(io.Discard, res.Body)
			res.Body.Close()
		}
		held <- err
	}()
	for o.reqs.Load() < 2 { // the held round trip is under way
		time.Sleep(time.Millisecond)
	}
	for range 20 {
		ctx, cancel := context.WithCancel(context.Background())
		req, _ := http.NewRequestWithContext(ctx, "POST", o.url("/"), strings.NewReader("x"))
		go cancel() // runs when RoundTrip yields
		if res, err := cl.RoundTrip(req); err == nil {
			res.Body.Close() // cancelled only once answered (see below)
		}
	}
	release.Do(func() { close(hold) })
	if err := <-held; err != nil {
		t.Fatal(err)
	}
	do(t, cl, "POST", o.url("/"), "x")
	// The scheduler now and then runs the yielding goroutine again first
	// (it looks at the global queue every 61st time): that request may be
	// sent, then cancelled, and cost its connection. One that never
	// reached the origin must cost none. (The held one has its own.)
	sent := o.reqs.Load() - 3
	if n := o.conns.Load(); n-2 > sent {
		t.Fatalf("%d connections for %d requests at the origin (%d whose client left): requests never sent cost connections", n, sent+3, sent)
	}
	if sent > 5 {
		t.Fatalf("%d of 20 requests whose client left during the yield were sent: did RoundTrip yield?", sent)
	}
}
