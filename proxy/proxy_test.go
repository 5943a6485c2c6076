package proxy_test

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
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

// clock is a fake clock the tests move by hand.
type clock struct {
	mu sync.Mutex
	t  time.Time
}

func (c *clock) Now() time.Time { c.mu.Lock(); defer c.mu.Unlock(); return c.t }
func (c *clock) Set(sec float64) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.t = time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC).Add(time.Duration(sec * float64(time.Second)))
}

type fixture struct {
	p        *proxy.Proxy
	handler  http.Handler
	admin    http.Handler
	clock    *clock
	reg      *prometheus.Registry
	upstream atomic.Int64 // requests the upstream received
}

type option func(*config.Config, *proxy.Options)

func newFixture(t testing.TB, opts ...option) *fixture {
	t.Helper()
	f := &fixture{clock: &clock{}, reg: prometheus.NewRegistry()}
	f.clock.Set(0)
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		f.upstream.Add(1)
		io.Copy(io.Discard, r.Body)
		w.Header().Set("Content-Type", "application/json")
		w.Header().Set("X-Ratelimit-Limit", "999") // an upstream's own header must not win
		io.WriteString(w, `{"ok":true}`)
	}))
	t.Cleanup(up.Close)
	cfg := config.Default()
	cfg.UpstreamURL = up.URL
	store := limits.NewMemory(limits.MemoryOptions{})
	o := proxy.Options{Store: store, Logger: slog.New(slog.DiscardHandler), Registerer: f.reg, Now: f.clock.Now, Stats: store.Stats}
	for _, opt := range opts {
		opt(&cfg, &o)
	}
	o.Config = cfg
	p, err := proxy.New(o)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(p.Close)
	f.p, f.handler, f.admin = p, p.Handler(), p.AdminHandler(f.reg)
	return f
}

func rpm(n int64) option { return func(c *config.Config, _ *proxy.Options) { c.ChatRPM = n } }

func (f *fixture) do(path, peer string, hdr ...string) *httptest.ResponseRecorder {
	r := httptest.NewRequest(http.MethodPost, path, strings.NewReader(`{"message":"hi"}`))
	r.RemoteAddr = peer
	for i := 0; i+1 < len(hdr); i += 2 {
		r.Header.Set(hdr[i], hdr[i+1])
	}
	w := httptest.NewRecorder()
	f.handler.ServeHTTP(w, r)
	return w
}

func TestRetryAfterRoundsUp(t *testing.T) {
	f := newFixture(t, rpm(2))
	steps := []struct {
		at             float64
		status         int
		retry, retryMS string
		remaining      string
		rateLimit      string
	}{
		{0, 200, "", "", "1", `"chat_rpm";r=1;t=60`},
		{40, 200, "", "", "0", `"chat_rpm";r=0;t=20`},
		{41, 429, "19", "19000", "0", `"chat_rpm";r=0;t=19`},
		{41.5, 429, "19", "18500", "0", `"chat_rpm";r=0;t=19`},
		{59.9999, 429, "1", "1", "0", `"chat_rpm";r=0;t=1`},
		{60.5, 200, "", "", "0", `"chat_rpm";r=0;t=40`},
	}
	for _, s := range steps {
		f.clock.Set(s.at)
		w := f.do("/api/chat", "203.0.113.7:1")
		h := w.Header()
		if w.Code != s.status || h.Get("Retry-After") != s.retry || h.Get("retry-after-ms") != s.retryMS ||
			h.Get("X-RateLimit-Remaining") != s.remaining || h.Get("RateLimit") != s.rateLimit {
			t.Fatalf("t=%v: %d %v", s.at, w.Code, h)
		}
		if h.Get("X-RateLimit-Limit") != "2" || h.Get("RateLimit-Policy") != `"chat_rpm";q=2;w=60` {
			t.Fatalf("t=%v: policy headers %v", s.at, h)
		}
		if s.status == 429 && h.Get("X-RateLimit-Retry-After") != s.retry {
			t.Fatalf("t=%v: X-RateLimit-Retry-After %q", s.at, h.Get("X-RateLimit-Retry-After"))
		}
	}
	if n := f.upstream.Load(); n != 3 {
		t.Fatalf("upstream got %d requests, want the 3 admitted", n)
	}
}

func TestResetIsWhenAllCountedLeave(t *testing.T) {
	f := newFixture(t, rpm(5))
	f.clock.Set(0)
	f.do("/api/chat", "203.0.113.7:1")
	f.clock.Set(30)
	w := f.do("/api/chat", "203.0.113.7:1")
	if got := w.Header().Get("X-RateLimit-Reset"); got != "60" {
		t.Fatalf("reset %q", got)
	}
	f.clock.Set(45)
	w = f.do("/v1/other", "203.0.113.7:1") // unprotected: no headers
	if w.Header().Get("X-RateLimit-Reset") != "" {
		t.Fatal("unprotected route got rate-limit headers")
	}
}

func Test429Bodies(t *testing.T) {
	f := newFixture(t, rpm(0))
	tests := []struct {
		path string
		want string
	}{
		{"/api/chat", `{"error":"rate_limited","message":"Too many requests. Please retry after 60 seconds.","retry_after_seconds":60,"denied_by":"chat_rpm","denied_key":"caller=ip:203.0.113.7","limit":0,"violated":["chat_rpm"]}`},
		{"/v1/chat/completions", `{"error":{"message":"Too many requests. Please retry after 60 seconds.","type":"rate_limit_error","code":"rate_limited","param":null},"retry_after_seconds":60,"denied_by":"chat_rpm","denied_key":"caller=ip:203.0.113.7","limit":0,"violated":["chat_rpm"]}`},
		{"/v1/messages", `{"type":"error","error":{"type":"rate_limit_error","code":"rate_limited","message":"Too many requests. Please retry after 60 seconds."},"retry_after_seconds":60,"denied_by":"chat_rpm","denied_key":"caller=ip:203.0.113.7","limit":0,"violated":["chat_rpm"]}`},
	}
	for _, tt := range tests {
		w := f.do(tt.path, "203.0.113.7:1")
		if w.Code != 429 || strings.TrimSpace(w.Body.String()) != tt.want || w.Header().Get("Content-Type") != "application/json" {
			t.Errorf("%s: %d %s", tt.path, w.Code, w.Body)
		}
	}
	flat := newFixture(t, rpm(0), func(c *config.Config, _ *proxy.Options) { c.ErrorFormat = "flat" })
	if w := flat.do("/v1/messages", "203.0.113.7:1"); !strings.HasPrefix(w.Body.String(), `{"error":"rate_limited",`) {
		t.Errorf("flat: %s", w.Body)
	}
}

func TestUnauthorized(t *testing.T) {
	f := newFixture(t, func(c *config.Config, _ *proxy.Options) { c.RequireAuth = true })
	w := f.do("/v1/chat/completions", "203.0.113.7:1")
	if w.Code != 401 || w.Header().Get("WWW-Authenticate") != "Bearer" || w.Header().Get("X-RateLimit-Limit") != "" {
		t.Fatalf("%d %v", w.Code, w.Header())
	}
	var body struct {
		Error struct{ Code, Type string }
	}
	if err := json.Unmarshal(w.Body.Bytes(), &body); err != nil || body.Error.Code != "unauthorized" || body.Error.Type != "authentication_error" {
		t.Fatalf("%s", w.Body)
	}
	if w := f.do("/v1/chat/completions", "203.0.113.7:1", "X-API-Key", "k"); w.Code != 200 {
		t.Fatalf("with a key: %d", w.Code)
	}
	if f.upstream.Load() != 1 {
		t.Fatal("a refused request reached the upstream")
	}
}

// The upstream's own X-RateLimit-* must not replace ours.
func TestOurHeadersWin(t *testing.T) {
	f := newFixture(t, rpm(7))
	w := f.do("/api/chat", "203.0.113.7:1")
	if v := w.Header().Values("X-RateLimit-Limit"); len(v) != 1 || v[0] != "7" {
		t.Fatalf("X-RateLimit-Limit %q", v)
	}
}

func TestConcurrentRequestsAreExact(t *testing.T) {
	for round := 0; round < 5; round++ {
		f := newFixture(t, rpm(20))
		for i := 0; i < 10; i++ {
			f.do("/api/chat", "203.0.113.7:1")
		}
		var ok, limited atomic.Int64
		var wg sync.WaitGroup
		for i := 0; i < 50; i++ {
			wg.Add(1)
			go func() {
				defer wg.Done()
				switch f.do("/v1/chat/completions", "203.0.113.7:1").Code {
				case 200:
					ok.Add(1)
				case 429:
					limited.Add(1)
				}
			}()
		}
		wg.Wait()
		if ok.Load() != 10 || limited.Load() != 40 || f.upstream.Load() != 20 {
			t.Fatalf("round %d: %d admitted, %d limited, upstream saw %d", round, ok.Load(), limited.Load(), f.upstream.Load())
		}
	}
}

// failingStore is a store whose backend is down.
type failingStore struct{}

func (failingStore) Decide(context.Context, []limits.Hit, time.Time, []limits.Decision) (bool, error) {
	return false, errors.New("connection refused")
}

func (failingStore) Peek(context.Context, []limits.Hit, time.Time, []limits.Decision) (bool, error) {
	return false, errors.New("connection refused")
}

func (failingStore) Reset(context.Context, *limits.Rule, limits.Key) error {
	return errors.New("connection refused")
}

func (failingStore) Settle(context.Context, []limits.Settlement, time.Time) error {
	return errors.New("connection refused")
}

func TestFailOpenAndClosed(t *testing.T) {
	open := newFixture(t, func(_ *config.Config, o *proxy.Options) { o.Store = failingStore{} })
	w := open.do("/api/chat", "203.0.113.7:1")
	if w.Code != 200 || w.Header().Get("RateLimit-Policy") != "" {
		t.Fatalf("fail open: %d %v", w.Code, w.Header())
	}
	closed := newFixture(t, func(c *config.Config, o *proxy.Options) { o.Store = failingStore{}; c.FailOpen = config.FailOpenFalse })
	w = closed.do("/v1/chat/completions", "203.0.113.7:1")
	if w.Code != 503 || !strings.Contains(w.Body.String(), `"code":"rate_limiter_unavailable"`) || closed.upstream.Load() != 0 {
		t.Fatalf("fail closed: %d %s", w.Code, w.Body)
	}
	if n, err := testutil.GatherAndCount(closed.reg, "ratelimit_proxy_store_errors_total"); err != nil || n != 1 {
		t.Fatalf("store errors metric: %d %v", n, err)
	}
}

func TestRateLimitDisabled(t *testing.T) {
	f := newFixture(t, rpm(0), func(c *config.Config, _ *proxy.Options) { c.RateLimitEnabled = false })
	if w := f.do("/api/chat", "203.0.113.7:1"); w.Code != 200 || w.Header().Get("RateLimit-Policy") != "" {
		t.Fatalf("%d %v", w.Code, w.Header())
	}
}

func TestMetricsAreLintClean(t *testing.T) {
	f := newFixture(t, rpm(1))
	f.do("/api/chat", "203.0.113.7:1")
	f.do("/api/chat", "203.0.113.7:1")
	problems, err := testutil.GatherAndLint(f.reg)
	if err != nil || len(problems) > 0 {
		t.Fatalf("%v %+v", err, problems)
	}
	w := httptest.NewRecorder()
	f.admin.ServeHTTP(w, httptest.NewRequest(http.MethodGet, "/metrics", nil))
	for _, want := range []string{
		`ratelimit_proxy_requests_total{decision="rate_limited",route="/api/chat"} 1`,
		`ratelimit_proxy_requests_total{decision="allowed",route="/api/chat"} 1`,
		`ratelimit_proxy_tracked_keys 1`,
		`ratelimit_proxy_guard_duration_seconds_count{route="/api/chat"} 2`,
		`ratelimit_proxy_upstream_duration_seconds_count{route="/api/chat"} 1`,
	} {
		if !strings.Contains(w.Body.String(), want) {
			t.Errorf("metrics lack %s", want)
		}
	}
	for _, path := range []string{"/healthz", "/readyz"} {
		w := httptest.NewRecorder()
		f.admin.ServeHTTP(w, httptest.NewRequest(http.MethodGet, path, nil))
		if w.Code != 200 {
			t.Errorf("%s: %d", path, w.Code)
		}
	}
}

// FuzzPlainJSON: the fast path writes exactly what json.Marshal writes.
func FuzzPlainJSON(f *testing.F) {
	for _, s := range []string{"caller=key:3f9a", `a"b`, "<&>", "é", "\x00", ""} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		if got, want := proxy.JSONString(s), mustMarshal(s); got != want {
			t.Fatalf("%q: %s, json.Marshal gives %s", s, got, want)
		}
	})
}

func mustMarshal(s string) string {
	b, _ := json.Marshal(s)
	return string(b)
}
