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
type discardWriter struct{ h http.Header }

func (d *discardWriter) Header() http.Header         { return d.h }
func (d *discardWriter) Write(b []byte) (int, error) { return len(b), nil }
func (d *discardWriter) WriteHeader(int)             {}

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
			store := limits.NewMemory(limits.MemoryOptions{})
			tk := tokens.New()
			if err := tk.Preload(); err != nil {
				b.Fatal(err)
			}
			p, err := proxy.New(proxy.Options{Config: cfg, Store: store, Logger: slog.New(slog.DiscardHandler), Tokenizer: tk,
				Registerer: prometheus.NewRegistry(), Transport: staticTransport{body: []byte(`{"id":"chatcmpl-1","object":"chat.completion","choices":[]}`)}})
			if err != nil {
				b.Fatal(err)
			}
			h := p.Handler()
			b.ReportAllocs()
			b.ResetTimer()
			b.RunParallel(func(pb *testing.PB) {
				w := &discardWriter{h: http.Header{}}
				i := 0
				for pb.Next() {
					r := httptest.NewRequest(http.MethodPost, tc.path, strings.NewReader(chatBody))
					r.RemoteAddr = "203.0.113." + strconv.Itoa(i&255) + ":4711"
					r.Header.Set("Content-Type", "application/json")
					clear(w.h)
					h.ServeHTTP(w, r)
					i++
				}
			})
		})
	}
}
