package proxy

import (
	"io"
	"log/slog"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/ratelimit-proxy/ratelimit-proxy/config"
	"github.com/ratelimit-proxy/ratelimit-proxy/limits"
	"github.com/ratelimit-proxy/ratelimit-proxy/tokens"
)

// BenchmarkAccessLogLine is ACCESS_LOG's own cost per request: the line
// of an admitted, forwarded chat request with an API key, its tokens
// counted and a rule applied, written by slog's JSON handler to
// io.Discard. (Measured alone: inside a whole request it is below the
// noise of a shared machine.)
func BenchmarkAccessLogLine(b *testing.B) {
	cfg := config.Default()
	cfg.UpstreamURL = "http://upstream.invalid"
	cfg.ChatRPM = 20
	cfg.AccessLog = true
	p, err := New(Options{Config: cfg, Store: limits.NewMemory(limits.MemoryOptions{}),
		Logger: slog.New(slog.NewJSONHandler(io.Discard, nil)), Registerer: prometheus.NewRegistry()})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(p.Close)
	pol := p.policy.Load()
	r := httptest.NewRequest("POST", "/v1/chat/completions", strings.NewReader("{}"))
	r.Header.Set("Authorization", "Bearer sk-proj-Zm9vYmFyYmF6")
	var ap []*rule
	ap = pol.applying(r, true, nil, ap)
	if len(ap) == 0 {
		b.Fatal("no rule applies")
	}
	t0 := time.Unix(1_800_000_000, 0)
	x := &exchange{p: p, r: r, pol: pol, status: 200, written: 412, forwarded: true, decision: "allowed",
		forwardedAt: t0, now: func() time.Time { return t0.Add(42 * time.Millisecond) }, rules: ap, limited: true}
	x.keys.c = pol.identify(r, false)
	x.est = tokens.Estimate{Encoding: "o200k_base", Tokens: 129}
	b.ReportAllocs()
	for b.Loop() {
		x.accessLog()
	}
}
