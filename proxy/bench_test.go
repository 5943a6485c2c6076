package proxy_test

import (
	"bytes"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/ratelimit-proxy/ratelimit-proxy/config"
	"github.com/ratelimit-proxy/ratelimit-proxy/limits"
	"github.com/ratelimit-proxy/ratelimit-proxy/proxy"
	"github.com/ratelimit-proxy/ratelimit-proxy/tokens"
)

// staticTransport answers every request in memory, so the benchmark
// measures the proxy's own work, not a network round trip.
type staticTransport struct{ body []byte }

func (s staticTransport) RoundTrip(r *http.Request) (*http.Response, error) {
	io.Copy(io.Discard, r.Body)
	r.Body.Close()
	return &http.Response{
		StatusCode:    200,
		Header:        http.Header{"Content-Type": {"application/json"}},
		Body:          io.NopCloser(bytes.NewReader(s.body)),
		ContentLength: int64(len(s.body)),
		Request:       r,
	}, nil
}

// discardWriter is a ResponseWriter that keeps nothing.
type discardWriter struct {
	h      http.Header
	status int
}

func (d *discardWriter) Header() http.Header         { return d.h }
func (d *discardWriter) Write(b []byte) (int, error) { return len(b), nil }
func (d *discardWriter) WriteHeader(code int)        { d.status = code }

// SetReadDeadline and SetWriteDeadline are what the server's writer
// answers: without them http.ResponseController builds an error.
func (d *discardWriter) SetReadDeadline(time.Time) error  { return nil }
func (d *discardWriter) SetWriteDeadline(time.Time) error { return nil }

const chatBody = `{"model":"gpt-4o-mini","messages":[{"role":"system","content":"You are a helpful assistant."},{"role":"user","content":"Translate the following English text to French: Hello, how are you today? I hope everything is going well."}],"temperature":0.2,"max_tokens":128}`

// BenchmarkHandler is one protected POST through the whole chain: routing,
// identification, the rate-limit decision, headers, forwarding through
// httputil.ReverseProxy to an in-memory upstream, metrics.
func BenchmarkHandler(b *testing.B) {
	for _, tc := range []struct {
		name  string
		path  string
		limit int64
	}{
		{"admitted", "/v1/chat/completions", 1 << 40},
		{"limited", "/v1/chat/completions", 0},
		{"unprotected", "/v1/models", 1 << 40},
	} {
		b.Run(tc.name, func(b *testing.B) {
			cfg := config.Default()
			cfg.UpstreamURL = "http://upstream.invalid"
			cfg.ChatRPM = tc.limit
			postChats(b, benchHandler(b, cfg), tc.path, nil)
		})
	}
}

// BenchmarkHandlerRules compares the whole handler with one rule and with
// five (SPEC §7: the bound is 5 µs more for five), all admitting,
// on warm keys: caller, ip, a header, a composite key and a token bucket.
func BenchmarkHandlerRules(b *testing.B) {
	five := []config.Rule{
		{Name: "per-caller", Key: []string{"caller"}},
		{Name: "per-ip", Key: []string{"ip"}},
		{Name: "per-team", Key: []string{"header:X-Team"}},
		{Name: "team-path", Key: []string{"header:X-Team", "path"}},
		{Name: "bucket", Key: []string{"caller"}, Algorithm: config.AlgTokenBucket},
	}
	for _, n := range []int{1, 5} {
		b.Run(strconv.Itoa(n)+"-rules", func(b *testing.B) {
			cfg := config.Default()
			cfg.UpstreamURL = "http://upstream.invalid"
			for _, r := range five[:n] {
				r.Methods, r.OnMissingKey, r.Cost, r.Action = []string{"POST"}, "skip", "requests", "reject"
				if r.Algorithm == "" {
					r.Algorithm = config.AlgSlidingWindow
				}
				r.Limit, r.Window = 1<<40, time.Minute
				cfg.Rules = append(cfg.Rules, r)
			}
			postChats(b, benchHandler(b, cfg), "/v1/chat/completions", func(r *http.Request, i int) {
				r.Header.Set("X-Team", "team-"+strconv.Itoa(i&15))
			})
		})
	}
}

// benchHandler is the public handler for cfg over an in-memory store and
// upstream, with the tokenizer loaded before the timer starts.
func benchHandler(b *testing.B, cfg config.Config) http.Handler {
	return benchProxy(b, cfg, staticTransport{body: []byte(`{"id":"chatcmpl-1","object":"chat.completion","choices":[]}`)})
}

// benchProxy is the public handler for cfg over an in-memory store,
// forwarding through transport (nil: a real one), the tokenizer loaded.
func benchProxy(b *testing.B, cfg config.Config, transport http.RoundTripper) http.Handler {
	b.Helper()
	tk := tokens.New()
	if err := tk.Preload(); err != nil {
		b.Fatal(err)
	}
	p, err := proxy.New(proxy.Options{Config: cfg, Store: limits.NewMemory(limits.MemoryOptions{}), Logger: slog.New(slog.DiscardHandler),
		Tokenizer: tk, Registerer: prometheus.NewRegistry(), Transport: transport})
	if err != nil {
		b.Fatal(err)
	}
	return p.Handler()
}

// postChats runs the benchmark's loop: chatBody POSTed to path from 256
// client addresses, in parallel, each request set up by hdr when given.
func postChats(b *testing.B, h http.Handler, path string, hdr func(r *http.Request, i int)) {
	b.ReportAllocs()
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		w := &discardWriter{h: http.Header{}}
		i := 0
		for pb.Next() {
			r := httptest.NewRequest(http.MethodPost, path, strings.NewReader(chatBody))
			r.RemoteAddr = "203.0.113." + strconv.Itoa(i&255) + ":4711"
			r.Header.Set("Content-Type", "application/json")
			if hdr != nil {
				hdr(r, i)
			}
			clear(w.h)
			h.ServeHTTP(w, r)
			i++
		}
	})
}

// BenchmarkHandlerBudget is one admitted protected POST under a
// total_tokens rule, then under a usd rule (SPEC §8.1's target: within
// 5 % of each other): reservation, the response read for usage, the
// settlement, in memory.
func BenchmarkHandlerBudget(b *testing.B) {
	for _, cost := range []string{config.CostTotalTokens, config.CostUSD} {
		b.Run(cost, func(b *testing.B) {
			cfg := config.Default()
			cfg.UpstreamURL = "http://upstream.invalid"
			cfg.Rules = []config.Rule{{Name: "budget", Methods: []string{"POST"}, Key: []string{"caller"}, OnMissingKey: "skip",
				Algorithm: config.AlgSlidingWindow, Limit: 1 << 50, Window: time.Minute, Cost: cost, Action: "reject"}}
			cfg.Prices = config.Prices{{Pattern: "gpt-4o*", Input: 2_500_000, CachedInput: 1_250_000, CacheWrite: 2_500_000, Output: 10_000_000}}
			h := benchProxy(b, cfg, staticTransport{body: []byte(`{"id":"chatcmpl-1","object":"chat.completion","choices":[{"index":0,"message":{"role":"assistant","content":"Bonjour"}}],"usage":{"prompt_tokens":40,"completion_tokens":5,"total_tokens":45}}`)})
			postChats(b, h, "/v1/chat/completions", nil)
		})
	}
}

// BenchmarkHandlerGroup is BenchmarkHandler's admitted POST without an
// upstream group and with one (SPEC §9) whose cap and rate are never
// reached, measured side by side: the group's admission step, in memory.
func BenchmarkHandlerGroup(b *testing.B) {
	for _, grouped := range []bool{false, true} {
		b.Run(map[bool]string{false: "none", true: "group"}[grouped], func(b *testing.B) {
			cfg := config.Default()
			cfg.UpstreamURL = "http://upstream.invalid"
			cfg.ChatRPM = 1 << 40
			if grouped {
				cfg.UpstreamGroups = []config.UpstreamGroup{{Name: "chat", MaxInFlight: 1 << 20, Rate: 1_000_000_000,
					Per: time.Minute, Queue: 1000, MaxWait: 30 * time.Second, Priorities: config.DefaultPriorities,
					Retries: 2, MaxBackoff: 20 * time.Second}}
			}
			postChats(b, benchHandler(b, cfg), "/v1/chat/completions", nil)
		})
	}
}

// BenchmarkHandlerRemembered is a refused caller asking again: the 429
// answered from the refusal memory (limits.Remember), its waits counted
// down by the clock, without a store round trip: the attacker's hot path.
func BenchmarkHandlerRemembered(b *testing.B) {
	h := rememberingProxy(b)
	for i := range 256 { // each of the 256 callers spends its one request
		r := httptest.NewRequest(http.MethodPost, "/v1/chat/completions", strings.NewReader(chatBody))
		r.RemoteAddr = "203.0.113." + strconv.Itoa(i) + ":4711"
		r.Header.Set("Content-Type", "application/json")
		h.ServeHTTP(&discardWriter{h: http.Header{}}, r)
	}
	postChats(b, h, "/v1/chat/completions", nil)
}

// BenchmarkHandlerAccessLog is the admitted POST with ACCESS_LOG off and
// on, the line written by slog's JSON handler to io.Discard: the access
// log's own cost per request.
func BenchmarkHandlerAccessLog(b *testing.B) {
	for _, on := range []bool{false, true} {
		b.Run(map[bool]string{false: "off", true: "on"}[on], func(b *testing.B) {
			cfg := config.Default()
			cfg.UpstreamURL = "http://upstream.invalid"
			cfg.ChatRPM = 1 << 40
			cfg.AccessLog = on
			tk := tokens.New()
			if err := tk.Preload(); err != nil {
				b.Fatal(err)
			}
			p, err := proxy.New(proxy.Options{Config: cfg, Store: limits.NewMemory(limits.MemoryOptions{}),
				Logger: slog.New(slog.NewJSONHandler(io.Discard, nil)), Tokenizer: tk, Registerer: prometheus.NewRegistry(),
				Transport: staticTransport{body: []byte(`{"id":"chatcmpl-1","object":"chat.completion","choices":[]}`)}})
			if err != nil {
				b.Fatal(err)
			}
			postChats(b, p.Handler(), "/v1/chat/completions", nil)
		})
	}
}

// BenchmarkRefusedAllocs is BenchmarkHandlerRemembered without the
// benchmark's own allocations: the 256 requests are built once and their
// bodies rewound, so allocs/op is the proxy's own per 429.
func BenchmarkRefusedAllocs(b *testing.B) {
	ask := rememberedRefusals(b)
	b.ReportAllocs()
	b.ResetTimer()
	for i := range b.N {
		ask(i)
	}
}

// rememberedRefusals is a proxy whose 256 callers have each spent their
// one request a minute, and ask(i) has caller i&255 ask again: a 429
// from the refusal memory, through a writer that keeps nothing.
func rememberedRefusals(tb testing.TB) (ask func(i int)) {
	w, again := replayed(rememberingProxy(tb), "/v1/chat/completions", 256, nil)
	for i := range 256 {
		again(i) // admitted: the one request
	}
	return func(i int) {
		if again(i); w.status != http.StatusTooManyRequests {
			tb.Fatalf("caller %d asking again: status %d, want 429", i&255, w.status)
		}
	}
}

// replayed builds n chat POSTs to path, request i from 203.0.113.i then
// changed by set (when not nil), and returns the writer they are answered
// through and ask(i), which sends request i%n again with its body
// rewound: asking costs the benchmark nothing, so allocations counted
// around it are the proxy's own.
func replayed(h http.Handler, path string, n int, set func(r *http.Request, i int)) (w *discardWriter, ask func(i int)) {
	reqs := make([]*http.Request, n)
	bodies := make([]*strings.Reader, n)
	for i := range reqs {
		bodies[i] = strings.NewReader(chatBody)
		r := httptest.NewRequest(http.MethodPost, path, io.NopCloser(bodies[i]))
		r.RemoteAddr = "203.0.113." + strconv.Itoa(i%256) + ":4711"
		r.Header.Set("Content-Type", "application/json")
		if set != nil {
			set(r, i)
		}
		reqs[i] = r
	}
	w = &discardWriter{h: http.Header{}}
	return w, func(i int) {
		j := i % n
		bodies[j].Reset(chatBody)
		clear(w.h)
		h.ServeHTTP(w, reqs[j])
	}
}

// rememberingProxy is the public handler of a proxy allowing one request
// a minute per caller, over a memory store behind the refusal memory.
func rememberingProxy(tb testing.TB) http.Handler {
	cfg := config.Default()
	cfg.UpstreamURL = "http://upstream.invalid"
	cfg.ChatRPM = 1
	return rememberingProxyFor(tb, cfg)
}

// rememberingProxyFor is rememberingProxy under cfg.
func rememberingProxyFor(tb testing.TB, cfg config.Config) http.Handler {
	tk := tokens.New()
	if err := tk.Preload(); err != nil {
		tb.Fatal(err)
	}
	p, err := proxy.New(proxy.Options{Config: cfg, Store: limits.NewRemember(limits.NewMemory(limits.MemoryOptions{}), 100_000),
		Logger: slog.New(slog.DiscardHandler), Tokenizer: tk, Registerer: prometheus.NewRegistry(),
		Transport: staticTransport{body: []byte(`{}`)}})
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(p.Close)
	return p.Handler()
}
