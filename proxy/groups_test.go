package proxy_test

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"net/http/httptest"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/redis/go-redis/v9"

	"github.com/ratelimit-proxy/ratelimit-proxy/config"
	"github.com/ratelimit-proxy/ratelimit-proxy/internal/redistest"
	"github.com/ratelimit-proxy/ratelimit-proxy/proxy"
	"github.com/ratelimit-proxy/ratelimit-proxy/upstream"
	"github.com/ratelimit-proxy/ratelimit-proxy/upstream/gate"
)

// modal is an upstream whose answer the request's X-Mode header chooses:
// ok, slow (200 after 30 ms), hang (never answers before the client or
// timeout gives up), stream (an SSE stream of many slow events), reset
// (the connection is cut), 429 (with retry-after-ms: 1, once per
// X-Once key, then ok), 429s (the same with Retry-After: 1).
type modal struct {
	seen   atomic.Int64
	mu     sync.Mutex
	once   map[string]bool
	bodies map[string][]string // X-Once key → the bodies received
}

func newModal(t testing.TB) (*modal, string) {
	m := &modal{once: map[string]bool{}, bodies: map[string][]string{}}
	s := httptest.NewServer(m)
	t.Cleanup(s.Close)
	return m, s.URL
}

func (m *modal) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	m.seen.Add(1)
	body, _ := io.ReadAll(r.Body)
	key := r.Header.Get("X-Once")
	if key != "" {
		m.mu.Lock()
		m.bodies[key] = append(m.bodies[key], string(body))
		m.mu.Unlock()
	}
	switch r.Header.Get("X-Mode") {
	case "slow":
		time.Sleep(30 * time.Millisecond)
	case "hang":
		select {
		case <-r.Context().Done():
		case <-time.After(10 * time.Second):
		}
		return
	case "stream":
		w.Header().Set("Content-Type", "text/event-stream")
		for i := 0; i < 20; i++ {
			if _, err := io.WriteString(w, "data: {\"choices\":[{\"delta\":{\"content\":\"x\"}}]}\n\n"); err != nil {
				return
			}
			w.(http.Flusher).Flush()
			select {
			case <-r.Context().Done():
				return
			case <-time.After(2 * time.Millisecond):
			}
		}
		io.WriteString(w, "data: [DONE]\n\n")
		return
	case "reset":
		if c, _, err := http.NewResponseController(w).Hijack(); err == nil {
			c.Close()
		}
		return
	case "429", "429s":
		m.mu.Lock()
		first := !m.once[key]
		m.once[key] = true
		m.mu.Unlock()
		if first {
			if r.Header.Get("X-Mode") == "429s" {
				w.Header().Set("Retry-After", "1")
			} else {
				w.Header().Set("retry-after-ms", "1")
			}
			w.WriteHeader(http.StatusTooManyRequests)
			io.WriteString(w, `{"error":{"message":"slow down","type":"rate_limit_error"}}`)
			return
		}
	}
	w.Header().Set("Content-Type", "application/json")
	io.WriteString(w, `{"ok":true}`)
}

func groupProxy(t *testing.T, url, toml string, more ...option) (*fixture, *httptest.Server) {
	t.Helper()
	opts := append([]option{upstreamAt(url), rules(t, toml, "CHAT_RPM", "1000000000"), realClock}, more...)
	f := newFixture(t, opts...)
	srv := httptest.NewServer(f.handler)
	t.Cleanup(srv.Close)
	return f, srv
}

func postTo(ctx context.Context, url string, hdr ...string) (*http.Response, error) {
	r, _ := http.NewRequestWithContext(ctx, http.MethodPost, url, strings.NewReader(`{"model":"gpt-4o","messages":[{"role":"user","content":"hi"}]}`))
	r.Header.Set("Content-Type", "application/json")
	for i := 0; i+1 < len(hdr); i += 2 {
		r.Header.Set(hdr[i], hdr[i+1])
	}
	return http.DefaultClient.Do(r)
}

func gauge(t *testing.T, f *fixture, name, labels string) float64 {
	t.Helper()
	mfs, err := f.reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
		for _, m := range mf.GetMetric() {
			var ls []string
			for _, l := range m.GetLabel() {
				ls = append(ls, l.GetName()+"="+l.GetValue())
			}
			if strings.Join(ls, ",") == labels {
				if m.Gauge != nil {
					return m.GetGauge().GetValue()
				}
				return m.GetCounter().GetValue()
			}
		}
	}
	return 0
}

// A full queue answers 503 upstream_busy at once, in the envelope of the
// path, with Retry-After; the request never reaches the upstream and
// its token reservation is given back.
func TestGroupBusy(t *testing.T) {
	m, url := newModal(t)
	f, srv := groupProxy(t, url, `
[[rule]]
name = "tokens"
limit = 100000
cost = "total_tokens"

[[upstream_group]]
name = "chat"
max_in_flight = 1
queue = 0
`)
	release := holdSlot(t, m, srv.URL+"/v1/chat/completions")
	defer release()
	before := m.seen.Load()
	var remaining []string
	for _, path := range []string{"/v1/chat/completions", "/v1/chat/completions", "/api/chat"} {
		res, err := postTo(context.Background(), srv.URL+path)
		if err != nil {
			t.Fatal(err)
		}
		body, _ := io.ReadAll(res.Body)
		res.Body.Close()
		if res.StatusCode != http.StatusServiceUnavailable || res.Header.Get("Retry-After") == "" || res.Header.Get("Retry-After-Ms") == "" {
			t.Fatalf("%s: %d %v %s", path, res.StatusCode, res.Header, body)
		}
		var got map[string]any
		if err := json.Unmarshal(body, &got); err != nil {
			t.Fatal(err)
		}
		code := got["error"]
		if path != "/api/chat" {
			code = got["error"].(map[string]any)["code"]
		}
		if code != "upstream_busy" || got["retry_after_seconds"].(float64) < 1 || got["group"] != "chat" || got["reason"] != "queue_full" {
			t.Fatalf("%s: body %s", path, body)
		}
		if path != "/api/chat" {
			remaining = append(remaining, res.Header.Get("X-Ratelimit-Remaining-Tokens"))
		}
	}
	// The refused request's reservation was given back: the second saw
	// the same remaining as the first (each shows it after its own).
	if len(remaining) != 2 || remaining[0] == "" || remaining[0] != remaining[1] {
		t.Fatalf("remaining tokens after each refusal: %q", remaining)
	}
	if m.seen.Load() != before {
		t.Fatal("a refused request reached the upstream")
	}
	if n := gauge(t, f, "ratelimit_proxy_requests_total", "decision=upstream_busy,route=/v1/chat/completions"); n != 2 {
		t.Fatalf("upstream_busy decisions %v", n)
	}
	release()
	if !waitUntil(func() bool { return gauge(t, f, "ratelimit_proxy_upstream_in_flight", "group=chat") == 0 }) {
		t.Fatal("the slot leaked")
	}
	if problems, err := testutil.GatherAndLint(f.reg); err != nil || len(problems) > 0 {
		t.Fatalf("the groups' metrics: %v %+v", err, problems)
	}
}

// holdSlot sends a request that the upstream holds, and waits until the
// upstream has it; release ends it (the client leaves) and waits for the
// end. Calling release again does nothing.
func holdSlot(t *testing.T, m *modal, url string) (release func()) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		if res, err := postTo(ctx, url, "X-Mode", "hang"); err == nil {
			res.Body.Close()
		}
	}()
	if !waitUntil(func() bool { return m.seen.Load() >= 1 }) {
		cancel()
		t.Fatal("the held request never reached the upstream")
	}
	return func() {
		cancel()
		<-done
	}
}

func waitUntil(cond func() bool) bool {
	deadline := time.Now().Add(15 * time.Second) // a bound, not a measure: a loaded machine may take long
	for !cond() {
		if time.Now().After(deadline) {
			return false
		}
		time.Sleep(2 * time.Millisecond)
	}
	return true
}

// A retry sends the body the upstream got the first time, byte for
// byte — here the one the proxy edited to ask for usage.
func TestGroupRetrySendsSameBody(t *testing.T) {
	m, url := newModal(t)
	_, srv := groupProxy(t, url, `
[[rule]]
name = "tokens"
limit = 100000
cost = "total_tokens"

[[upstream_group]]
name = "chat"
retries = 2
max_backoff = "1s"
`)
	r, _ := http.NewRequest(http.MethodPost, srv.URL+"/v1/chat/completions",
		strings.NewReader(`{"model":"gpt-4o","stream":true,"messages":[{"role":"user","content":"hi"}]}`))
	r.Header.Set("X-Mode", "429")
	r.Header.Set("X-Once", "edited")
	res, err := http.DefaultClient.Do(r)
	if err != nil {
		t.Fatal(err)
	}
	io.Copy(io.Discard, res.Body)
	res.Body.Close()
	if res.StatusCode != http.StatusOK {
		t.Fatalf("status %d", res.StatusCode)
	}
	m.mu.Lock()
	bodies := m.bodies["edited"]
	m.mu.Unlock()
	if len(bodies) != 2 || bodies[0] != bodies[1] || !strings.Contains(bodies[0], "include_usage") {
		t.Fatalf("bodies %q", bodies)
	}
}

// max_backoff caps the backoff, not the pause: a 429 asking for 1 s under
// a max_backoff of 500 ms is retried once the pause is over, the client
// gets the retried 200, and the retry is counted.
func TestGroupRetryWaitsPauseLongerThanMaxBackoff(t *testing.T) {
	m, url := newModal(t)
	f, srv := groupProxy(t, url, `
[[upstream_group]]
name = "chat"
retries = 1
max_backoff = "500ms"
`)
	start := time.Now()
	res, err := postTo(context.Background(), srv.URL+"/v1/chat/completions", "X-Mode", "429s", "X-Once", "k")
	if err != nil {
		t.Fatal(err)
	}
	io.Copy(io.Discard, res.Body)
	res.Body.Close()
	took := time.Since(start)
	m.mu.Lock()
	n := len(m.bodies["k"])
	m.mu.Unlock()
	if res.StatusCode != http.StatusOK || n != 2 {
		t.Fatalf("status %d after %d attempts, want 200 after 2", res.StatusCode, n)
	}
	if took < time.Second || took > 10*time.Second {
		t.Fatalf("answered after %v, want the 1 s pause and a backoff under 500 ms", took)
	}
	if v := gauge(t, f, "ratelimit_proxy_upstream_retries_total", "group=chat"); v != 1 {
		t.Fatalf("retries_total %v, want 1", v)
	}
}

// Thousands of endings of every kind — success, upstream reset, timeout,
// the client gone while queued or mid-stream, 503 busy, a retried 429 —
// leave nothing behind: no slot, no waiter, no goroutine.
func TestGroupNoLeak(t *testing.T) {
	t.Run("memory", func(t *testing.T) { testGroupNoLeak(t, func(*config.Config, *proxy.Options) {}) })
	t.Run("redis", func(t *testing.T) {
		opt, client := gateOnRedis(t, "leak:")
		testGroupNoLeak(t, opt)
		// Nothing is left on Redis either: no lease, no place in the queue.
		for _, k := range []string{"f", "q", "l"} {
			if n := client.ZCard(context.Background(), "leak:{gate:chat}:"+k).Val(); n != 0 {
				t.Errorf("%s holds %d entries", k, n)
			}
		}
	})
}

// gateOnRedis is an option that shares the upstream groups on a Redis
// server of the test's own, under prefix; client inspects it.
func gateOnRedis(t *testing.T, prefix string) (option, *redis.Client) {
	t.Helper()
	srv := redistest.Start(t)
	client := redis.NewClient(&redis.Options{Addr: srv.Addr})
	t.Cleanup(func() { client.Close() })
	return func(_ *config.Config, o *proxy.Options) {
		o.GateRedis = &gate.RedisOptions{Client: client, Prefix: prefix, Timeout: time.Second, Instances: 1}
	}, client
}

func testGroupNoLeak(t *testing.T, shared option) {
	_, url := newModal(t)
	// The proxy's transport is the test's, so that its idle connections
	// (and their goroutines) can be closed at the end.
	tr := upstream.NewHTTPTransport(100 * time.Millisecond)
	f, srv := groupProxy(t, url, `
[[upstream_group]]
name = "chat"
max_in_flight = 4
queue = 16
max_wait = "100ms"
priority_from = "header:X-Priority"
retries = 1
max_backoff = "5ms"
`, func(_ *config.Config, o *proxy.Options) { o.Transport = tr }, shared)
	client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 64}}
	defer client.CloseIdleConnections()
	base := runtime.NumGoroutine()
	modes := []string{"ok", "slow", "hang", "stream", "stream-cut", "reset", "429", "gone-queued"}
	var wg sync.WaitGroup
	var answered, statuses sync.Map
	sem := make(chan struct{}, 24)
	const n = 2000
	for i := range n {
		wg.Add(1)
		sem <- struct{}{}
		go func() {
			defer wg.Done()
			defer func() { <-sem }()
			mode := modes[i%len(modes)]
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			if mode == "gone-queued" {
				time.AfterFunc(time.Duration(rand.IntN(20))*time.Millisecond, cancel)
			}
			r, _ := http.NewRequestWithContext(ctx, http.MethodPost, srv.URL+"/v1/chat/completions",
				strings.NewReader(`{"model":"gpt-4o","messages":[{"role":"user","content":"hi"}]}`))
			r.Header.Set("X-Mode", strings.TrimSuffix(mode, "-cut"))
			r.Header.Set("X-Once", fmt.Sprint(i))
			r.Header.Set("X-Priority", []string{"interactive", "default", "batch", "bogus"}[i%4])
			res, err := client.Do(r)
			if err != nil {
				answered.Store(i, "error")
				return
			}
			if mode == "stream-cut" {
				br := bufio.NewReader(res.Body)
				br.ReadString('\n')
				cancel() // gone mid-stream
			} else {
				io.Copy(io.Discard, res.Body)
			}
			res.Body.Close()
			answered.Store(i, res.StatusCode)
			statuses.Store(res.StatusCode, true)
		}()
	}
	wg.Wait()
	count := 0
	answered.Range(func(any, any) bool { count++; return true })
	if count != n {
		t.Fatalf("%d of %d requests ended", count, n)
	}
	for _, st := range []int{200, 503} {
		if _, ok := statuses.Load(st); !ok {
			t.Errorf("no request ended with %d", st)
		}
	}
	// Each ending once more, alone, with the answer it must get.
	for mode, want := range map[string]int{"ok": 200, "hang": 504, "reset": 502, "stream": 200, "429": 200} {
		res, err := postTo(context.Background(), srv.URL+"/v1/chat/completions", "X-Mode", mode, "X-Once", "alone-"+mode)
		if err != nil {
			t.Fatal(err)
		}
		io.Copy(io.Discard, res.Body)
		res.Body.Close()
		if res.StatusCode != want {
			t.Errorf("%s alone: %d, want %d", mode, res.StatusCode, want)
		}
	}
	if !waitUntil(func() bool {
		return gauge(t, f, "ratelimit_proxy_upstream_in_flight", "group=chat") == 0 &&
			gauge(t, f, "ratelimit_proxy_upstream_queue_depth", "group=chat,priority=default") == 0 &&
			gauge(t, f, "ratelimit_proxy_upstream_queue_depth", "group=chat,priority=batch") == 0 &&
			gauge(t, f, "ratelimit_proxy_upstream_queue_depth", "group=chat,priority=interactive") == 0
	}) {
		t.Fatalf("in flight %v after every ending", gauge(t, f, "ratelimit_proxy_upstream_in_flight", "group=chat"))
	}
	client.CloseIdleConnections()
	http.DefaultClient.CloseIdleConnections()
	tr.CloseIdleConnections()
	if !waitUntil(func() bool { return runtime.NumGoroutine() <= base }) {
		buf := make([]byte, 1<<20)
		t.Fatalf("goroutines %d, were %d\n%s", runtime.NumGoroutine(), base, buf[:runtime.Stack(buf, true)])
	}
}

// An Upgrade header buys no way past the group: on a protected route the
// upgrade is stripped, so the request is an ordinary one and is gated.
func TestGroupUpgradeIsGated(t *testing.T) {
	m, url := newModal(t)
	_, srv := groupProxy(t, url, `
[[upstream_group]]
name = "chat"
max_in_flight = 1
queue = 0
`)
	release := holdSlot(t, m, srv.URL+"/v1/chat/completions")
	defer release()
	for _, up := range []string{"websocket", "h2c", "foo"} {
		res, err := postTo(context.Background(), srv.URL+"/v1/chat/completions", "Upgrade", up, "Connection", "Upgrade")
		if err != nil {
			t.Fatal(err)
		}
		io.Copy(io.Discard, res.Body)
		res.Body.Close()
		if res.StatusCode != http.StatusServiceUnavailable {
			t.Errorf("Upgrade: %s: %d, want 503 upstream_busy", up, res.StatusCode)
		}
	}
	if m.seen.Load() != 1 {
		t.Fatalf("the upstream saw %d requests", m.seen.Load())
	}
}

// A group path the guards do not read (outside PROTECTED_PATHS) has its
// body read before it queues: a client that gives up while queued leaves
// at once and never reaches the upstream.
func TestGroupUnprotectedPathLeavesQueue(t *testing.T) {
	m, url := newModal(t)
	f, srv := groupProxy(t, url, `
[[upstream_group]]
name = "images"
paths = ["/v1/images/generations"]
max_in_flight = 1
`)
	release := holdSlot(t, m, srv.URL+"/v1/images/generations")
	defer release()
	qctx, qcancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer qcancel()
	if _, err := postTo(qctx, srv.URL+"/v1/images/generations"); err == nil {
		t.Fatal("the queued request was answered")
	}
	if !waitUntil(func() bool {
		return gauge(t, f, "ratelimit_proxy_upstream_queue_abandoned_total", "group=images") == 1 &&
			gauge(t, f, "ratelimit_proxy_upstream_queue_depth", "group=images,priority=default") == 0
	}) {
		t.Fatal("the client that left is still queued")
	}
	release()
	if m.seen.Load() != 1 {
		t.Fatalf("the upstream saw %d requests", m.seen.Load())
	}
}
