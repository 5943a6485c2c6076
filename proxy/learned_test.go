package proxy_test

import (
	"fmt"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/ratelimit-proxy/ratelimit-proxy/config"
	"github.com/ratelimit-proxy/ratelimit-proxy/internal/redistest"
	"github.com/ratelimit-proxy/ratelimit-proxy/proxy"
)

// OUTPUT_TOKEN_RESERVE = "learned": a request that names no output cap
// reserves the floor until 100 answers of its model have settled, then the
// nearest-rank 95th percentile of the model's settled outputs; other
// models keep the floor; the gauge tells the reserve per model; answers
// of several choices do not teach it.
func TestLearnedOutputReserve(t *testing.T) {
	_, url := newLLM(t)
	f := newFixture(t, budgetRules(t, url, `
[[rule]]
name   = "tpm"
cost   = "total_tokens"
limit  = 100000000
window = "1m"
`, "OUTPUT_TOKEN_RESERVE", "learned", "OUTPUT_TOKEN_RESERVE_MIN", "10")...)
	body := func(model, extra string) string {
		return `{"model":"` + model + `","messages":[{"role":"user","content":"Tell me about the weather."}]` + extra + `}`
	}
	reserved := func(b string, usage string) int64 {
		t.Helper()
		before := metric(t, f, "ratelimit_proxy_tokens_reserved_total", map[string]string{"rule": "tpm"})
		if w := f.send("/v1/chat/completions", "203.0.113.7:1", "application/json", b, "X-Test-Usage", usage); w.Code != 200 {
			t.Fatalf("%d %s", w.Code, w.Body)
		}
		return int64(metric(t, f, "ratelimit_proxy_tokens_reserved_total", map[string]string{"rule": "tpm"}) - before)
	}
	est := estimate(t, "/v1/chat/completions", body("gpt-4o", ""))
	// Answers of 3 choices, each 1000 tokens long: not one answer's output.
	for range 50 {
		reserved(body("gpt-4o", `,"n":3`), "40,3000")
	}
	for k := 1; k <= 100; k++ {
		if got := reserved(body("gpt-4o", ""), fmt.Sprintf("40,%d", k)); got != est+10 {
			t.Fatalf("answer %d, still learning: reserved %d, want the estimate %d + the floor 10", k, got, est)
		}
	}
	// Outputs 1..100: the 95th smallest is 95.
	if got := reserved(body("gpt-4o", ""), "40,5"); got != est+95 {
		t.Fatalf("learned: reserved %d, want %d + 95", got, est)
	}
	if g := metric(t, f, "ratelimit_proxy_output_reserve_tokens", map[string]string{"model": "gpt-4o"}); g != 95 {
		t.Fatalf("gauge %v", g)
	}
	// A request naming its cap reserves the cap; another model the floor.
	if got := reserved(body("gpt-4o", `,"max_tokens":7`), "40,5"); got != est+7 {
		t.Fatalf("max_tokens 7: reserved %d", got)
	}
	if got := reserved(body("gpt-4.1", ""), "40,5"); got != est+10 {
		t.Fatalf("another model: reserved %d", got)
	}
}

// The cookbook's learned-reserve.toml: the floor of 128 while a model
// learns, then what it wrote.
func TestCookbookLearnedReserve(t *testing.T) {
	_, url := newLLM(t)
	f := newFixture(t, upstreamAt(url), cookbook(t, "learned-reserve.toml", "UPSTREAM_URL", url))
	if _, m := f.adminDo(t, "GET", "/admin/rules/tokens-per-day", "", ""); m["output_reserve"] != "learned" {
		t.Fatalf("GET /admin/rules/tokens-per-day: output_reserve %v, want learned", m["output_reserve"])
	}
	body := `{"model":"gpt-4o-mini","messages":[{"role":"user","content":"Hi"}]}`
	est := estimate(t, "/v1/chat/completions", body)
	reserved := func() int64 {
		t.Helper()
		before := metric(t, f, "ratelimit_proxy_tokens_reserved_total", map[string]string{"rule": "tokens-per-day"})
		if w := f.send("/v1/chat/completions", "203.0.113.7:1", "application/json", body, "X-Test-Usage", "9,60"); w.Code != 200 {
			t.Fatalf("%d %s", w.Code, w.Body)
		}
		return int64(metric(t, f, "ratelimit_proxy_tokens_reserved_total", map[string]string{"rule": "tokens-per-day"}) - before)
	}
	for i := range 100 {
		if got := reserved(); got != est+128 {
			t.Fatalf("answer %d: reserved %d, want %d + 128", i+1, got, est)
		}
	}
	// Every answer wrote 60: under the floor, the floor stays.
	if got := reserved(); got != est+128 {
		t.Fatalf("learned under the floor: reserved %d", got)
	}
}

// Under output = "clamp", the learned reserve is the cap sent to a
// request that names none.
func TestLearnedReserveIsTheClampedCap(t *testing.T) {
	u, url := newLLM(t)
	f := newFixture(t, budgetRules(t, url, `
[[rule]]
name   = "tpm"
cost   = "total_tokens"
output = "clamp"
limit  = 100000000
window = "1m"
`, "OUTPUT_TOKEN_RESERVE", "learned", "OUTPUT_TOKEN_RESERVE_MIN", "10")...)
	body := `{"model":"gpt-4o","messages":[{"role":"user","content":"Hi"}]}`
	for k := 1; k <= 100; k++ {
		if w := f.send("/v1/chat/completions", "203.0.113.7:1", "application/json", body, "X-Test-Usage", fmt.Sprintf("9,%d", k)); w.Code != 200 {
			t.Fatalf("%d %s", w.Code, w.Body)
		}
	}
	w := f.send("/v1/chat/completions", "203.0.113.7:1", "application/json", body, "X-Test-Usage", "9,5")
	if w.Code != 200 || w.Header().Get("X-Ratelimit-Output-Clamped") != "95" {
		t.Fatalf("%d, clamped %q", w.Code, w.Header().Get("X-Ratelimit-Output-Clamped"))
	}
	if sent := u.last(); sent != `{"model":"gpt-4o","messages":[{"role":"user","content":"Hi"}],"max_tokens":95}` {
		t.Fatalf("upstream got %s", sent)
	}
}

// With Redis, instances learn from each other's answers: what one
// instance settled becomes the reserve of another that served nothing.
func TestLearnedReserveSharedThroughRedis(t *testing.T) {
	srv := redistest.Start(t)
	client := redis.NewClient(&redis.Options{Addr: srv.Addr})
	t.Cleanup(func() { client.Close() })
	_, url := newLLM(t)
	shared := func(_ *config.Config, o *proxy.Options) {
		o.LearnedShare = proxy.NewLearnedShare(client, "lrn:", time.Second)
		o.LearnedSync = 10 * time.Millisecond
	}
	rules := `
[[rule]]
name   = "tpm"
cost   = "total_tokens"
limit  = 100000000
window = "1m"
`
	a := newFixture(t, append(budgetRules(t, url, rules, "OUTPUT_TOKEN_RESERVE", "learned", "OUTPUT_TOKEN_RESERVE_MIN", "10"), shared)...)
	b := newFixture(t, append(budgetRules(t, url, rules, "OUTPUT_TOKEN_RESERVE", "learned", "OUTPUT_TOKEN_RESERVE_MIN", "10"), shared)...)
	body := `{"model":"gpt-4o","messages":[{"role":"user","content":"Hi"}]}`
	for k := 1; k <= 100; k++ {
		if w := a.send("/v1/chat/completions", "203.0.113.7:1", "application/json", body, "X-Test-Usage", fmt.Sprintf("9,%d", 300+k)); w.Code != 200 {
			t.Fatalf("%d %s", w.Code, w.Body)
		}
	}
	// The 95th of 301…400 is 395: b learns it without serving one.
	deadline := time.Now().Add(10 * time.Second)
	for metric(t, b, "ratelimit_proxy_output_reserve_tokens", map[string]string{"model": "gpt-4o"}) != 395 {
		if time.Now().After(deadline) {
			t.Fatalf("b's learned reserve %v, want 395 (a's answers)", metric(t, b, "ratelimit_proxy_output_reserve_tokens", map[string]string{"model": "gpt-4o"}))
		}
		time.Sleep(5 * time.Millisecond)
	}
	est := estimate(t, "/v1/chat/completions", body)
	before := metric(t, b, "ratelimit_proxy_tokens_reserved_total", map[string]string{"rule": "tpm"})
	if w := b.send("/v1/chat/completions", "203.0.113.7:1", "application/json", body, "X-Test-Usage", "9,5"); w.Code != 200 {
		t.Fatalf("%d %s", w.Code, w.Body)
	}
	if got := int64(metric(t, b, "ratelimit_proxy_tokens_reserved_total", map[string]string{"rule": "tpm"}) - before); got != est+395 {
		t.Fatalf("b reserved %d, want %d + 395", got, est)
	}
}
