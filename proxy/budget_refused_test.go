package proxy_test

import (
	"net/http/httptest"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/ratelimit-proxy/ratelimit-proxy/config"
	"github.com/ratelimit-proxy/ratelimit-proxy/internal/redistest"
	"github.com/ratelimit-proxy/ratelimit-proxy/limits"
	"github.com/ratelimit-proxy/ratelimit-proxy/proxy"
)

// tokenHeaders are a response's OpenAI token headers.
func tokenHeaders(w *httptest.ResponseRecorder) [3]string {
	h := w.Header()
	return [3]string{h.Get("X-Ratelimit-Limit-Tokens"), h.Get("X-Ratelimit-Remaining-Tokens"), h.Get("X-Ratelimit-Reset-Tokens")}
}

func onRedis(t *testing.T) option {
	srv := redistest.Start(t)
	client := redis.NewClient(&redis.Options{Addr: srv.Addr})
	t.Cleanup(func() { client.Close() })
	return func(_ *config.Config, o *proxy.Options) {
		s := limits.NewRedis(limits.RedisOptions{Client: client, Prefix: "refused:", Timeout: time.Second, ClientClock: true})
		t.Cleanup(s.Close)
		o.Store = s
	}
}

// A 429 that a token rule applies to carries the rule's
// x-ratelimit-*-tokens, as an admitted answer does, whichever rule refused
// it and however: a request rule peeked before the body was read, a
// request rule that reads the body (one batch), a refusal answered from
// memory; and RateLimit-Policy lists the token rule.
func TestRefusalCarriesTokenHeaders(t *testing.T) {
	const tpm = `
[[rule]]
name   = "tpm"
cost   = "%s"
limit  = 10000
window = "1m"
`
	const perModel = `
[[rule]]
name   = "per-model"
key    = ["model"]
limit  = 1
window = "1m"
`
	for _, tc := range []struct {
		name  string
		toml  string
		cost  string
		store func(t *testing.T) option
		deny  string
	}{
		{"peek", "chat_rpm = 1\n", "input_tokens", nil, "chat_rpm"},
		{"peek, total_tokens", "chat_rpm = 1\n", "total_tokens", nil, "chat_rpm"},
		{"peek, remembered", "chat_rpm = 1\n", "input_tokens", func(*testing.T) option { return remembering }, "chat_rpm"},
		{"peek, redis", "chat_rpm = 1\n", "input_tokens", onRedis, "chat_rpm"},
		{"batch", perModel, "input_tokens", nil, "per-model"},
		{"batch, remembered", perModel, "total_tokens", func(*testing.T) option { return remembering }, "per-model"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, url := newLLM(t)
			opts := budgetRules(t, url, tc.toml+strings.Replace(tpm, "%s", tc.cost, 1))
			if tc.store != nil {
				opts = append(opts, tc.store(t))
			}
			f := newFixture(t, opts...)
			body := weatherBody + `,"max_tokens":10}`
			w := f.send("/v1/chat/completions", "203.0.113.7:1", "application/json", body, "X-Test-Usage", "none")
			admitted := tokenHeaders(w)
			if w.Code != 200 || admitted[0] != "10000" || admitted[1] == "" || admitted[1] == "10000" {
				t.Fatalf("admitted: %d %v", w.Code, w.Header())
			}
			// (A total_tokens charge settles when the response ends: the
			// refusals see the settled state, not the admission's.)
			want := admitted
			for i := range 3 {
				w := f.send("/v1/chat/completions", "203.0.113.7:1", "application/json", body)
				if w.Code != 429 || body429(t, w).DeniedBy != tc.deny {
					t.Fatalf("refusal %d: %d %s", i, w.Code, w.Body)
				}
				got := tokenHeaders(w)
				if got[0] != "10000" || got[1] == "" || got[2] == "" {
					t.Fatalf("refusal %d lacks the token headers: %v", i, w.Header())
				}
				if tc.cost == "input_tokens" && got != want {
					t.Fatalf("refusal %d: token headers %v, want the state the admission left %v", i, got, want)
				}
				if !strings.Contains(w.Header().Get("RateLimit-Policy"), `"tpm";q=10000;w=60;qu="tokens"`) {
					t.Fatalf("refusal %d: RateLimit-Policy %q", i, w.Header().Get("RateLimit-Policy"))
				}
				if w.Header().Get("X-Ratelimit-Remaining") != "0" || w.Header().Get("X-Ratelimit-Limit") != "1" {
					t.Fatalf("refusal %d: X-RateLimit-* %v", i, w.Header())
				}
			}
			if strings.Contains(tc.name, "remembered") {
				if got := metric(t, f, "ratelimit_proxy_refusal_cache_hits_total", nil); got < 2 {
					t.Fatalf("%v refusals answered from memory, want 2", got)
				}
			}
		})
	}
}

// A 429 answered from memory shows a token rule's state even when what is
// remembered of that rule is its own refusal of a larger request: the
// state that refusal left, not a full budget.
func TestRememberedRefusalShowsTokenState(t *testing.T) {
	small := weatherBody + "}"
	big := `{"model":"gpt-4o","messages":[{"role":"user","content":"` + strings.Repeat("Tell me about the weather. ", 40) + `"}]}`
	es, eb := estimate(t, "/v1/chat/completions", small), estimate(t, "/v1/chat/completions", big)
	if eb < 3*es {
		t.Fatalf("estimates %d, %d: the big one must be larger", es, eb)
	}
	limit := eb + es - 1 // after one small request the big one no longer fits
	_, url := newLLM(t)
	f := newFixture(t, append(budgetRules(t, url, "chat_rpm = 3\n"+`
[[rule]]
name   = "tpm"
cost   = "input_tokens"
limit  = `+itoa(limit)+`
window = "1m"
`), remembering)...)
	send := func(body string) *httptest.ResponseRecorder {
		return f.send("/v1/chat/completions", "203.0.113.7:1", "application/json", body)
	}
	if w := send(small); w.Code != 200 {
		t.Fatalf("first: %d", w.Code)
	}
	if w := send(big); w.Code != 429 || body429(t, w).DeniedBy != "tpm" {
		t.Fatalf("big: %d %s", w.Code, w.Body)
	}
	for i := range 2 {
		if w := send(small); w.Code != 200 {
			t.Fatalf("small %d: %d %s", i, w.Code, w.Body)
		}
	}
	left := itoa(limit - 3*es)
	for i := range 3 { // refused by chat_rpm: by the store, then from memory
		w := send(small)
		if w.Code != 429 || body429(t, w).DeniedBy != "chat_rpm" {
			t.Fatalf("refusal %d: %d %s", i, w.Code, w.Body)
		}
		if got := tokenHeaders(w); got != [3]string{itoa(limit), left, "1m0s"} {
			t.Fatalf("refusal %d: token headers %v, want limit %d, %s left", i, got, limit, left)
		}
	}
}

func itoa(n int64) string { return strconv.FormatInt(n, 10) }
