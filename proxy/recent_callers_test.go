package proxy_test

import (
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/ratelimit-proxy/ratelimit-proxy/config"
	"github.com/ratelimit-proxy/ratelimit-proxy/limits"
	"github.com/ratelimit-proxy/ratelimit-proxy/proxy"
	"github.com/ratelimit-proxy/ratelimit-proxy/tokens"
)

// TestRefusalAllocatesNothingForEveryCaller: a refused caller asking again
// costs no allocation whoever it is — an IPv6 client (counted by its
// prefix), an API key in Authorization or, on Anthropic's path, X-API-Key
// — and under rules from a file: keyed by the caller, by a header, by
// both.
func TestRefusalAllocatesNothingForEveryCaller(t *testing.T) {
	if raceOn {
		t.Skip("the race detector empties sync.Pool at random")
	}
	for _, tc := range []struct {
		name string
		path string
		rule string
		set  func(r *http.Request, i int)
	}{
		{"IPv6", "/v1/chat/completions", "", func(r *http.Request, i int) {
			r.RemoteAddr = "[2001:db8:" + strconv.FormatInt(int64(i), 16) + "::7]:4711"
		}},
		{"API key", "/v1/chat/completions", "", func(r *http.Request, i int) {
			r.Header.Set("Authorization", "Bearer sk-refused-"+strconv.Itoa(i))
		}},
		{"X-API-Key", "/v1/messages", "", func(r *http.Request, i int) {
			r.Header.Set("X-API-Key", "sk-ant-refused-"+strconv.Itoa(i))
		}},
		{"file caller", "/v1/chat/completions", `
[[rule]]
name   = "per-caller"
key    = ["caller"]
limit  = 1
window = "1m"
`, func(r *http.Request, i int) {}},
		{"file header", "/v1/chat/completions", `
[[rule]]
name   = "per-team"
key    = ["header:X-Team"]
limit  = 1
window = "1m"
`, func(r *http.Request, i int) { r.Header.Set("X-Team", "team-"+strconv.Itoa(i)) }},
		{"chat_rpm plus X-Team", "/v1/chat/completions", "", func(r *http.Request, i int) { r.Header.Set("X-Team", "team-"+strconv.Itoa(i%7)) }},
		{"two key parts", "/v1/chat/completions", `
[[rule]]
name   = "per-team"
key    = ["caller", "header:X-Team"]
limit  = 1
window = "1m"
`, func(r *http.Request, i int) {
			r.Header.Set("X-Team", "team-"+strconv.Itoa(i%7))
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg := config.Default()
			cfg.UpstreamURL = "http://upstream.invalid"
			cfg.ChatRPM = 1
			if tc.rule != "" {
				var o proxy.Options
				rules(t, tc.rule)(&cfg, &o)
				cfg.ChatRPM = 0
			}
			tk := tokens.New()
			if err := tk.Preload(); err != nil {
				t.Fatal(err)
			}
			p, err := proxy.New(proxy.Options{Config: cfg, Store: limits.NewRemember(limits.NewMemory(limits.MemoryOptions{}), 100_000),
				Logger: slog.New(slog.DiscardHandler), Tokenizer: tk, Registerer: prometheus.NewRegistry(),
				Transport: staticTransport{body: []byte(`{}`)}})
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(p.Close)
			h := p.Handler()
			reqs := make([]*http.Request, 128)
			bodies := make([]*strings.Reader, len(reqs))
			w := &discardWriter{h: http.Header{}}
			for i := range reqs {
				bodies[i] = strings.NewReader(chatBody)
				r := httptest.NewRequest(http.MethodPost, tc.path, io.NopCloser(bodies[i]))
				r.RemoteAddr = "203.0.113." + strconv.Itoa(i) + ":4711"
				r.Header.Set("Content-Type", "application/json")
				tc.set(r, i)
				reqs[i] = r
				h.ServeHTTP(w, r) // admitted: the one request
				if w.status != 200 {
					t.Fatalf("caller %d's first request: %d", i, w.status)
				}
			}
			ask := func(i int) {
				j := i % len(reqs)
				bodies[j].Reset(chatBody)
				clear(w.h)
				h.ServeHTTP(w, reqs[j])
				if w.status != http.StatusTooManyRequests {
					t.Fatalf("caller %d asking again: %d, want 429", j, w.status)
				}
			}
			for i := range 2 * len(reqs) { // every caller's answer prepared
				ask(i)
			}
			i := 0
			if n := testing.AllocsPerRun(1024, func() { ask(i); i++ }); n != 0 {
				t.Errorf("%v allocations per remembered 429, want 0", n)
			}
		})
	}
}
