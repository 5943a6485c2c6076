package proxy_test

import (
	"encoding/json"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/ratelimit-proxy/ratelimit-proxy/internal/redistest"
)

// greedy is an upstream that always produces the whole output cap it is
// sent, n choices of it, and reports that usage (prompt tokens as the
// X-Test-Prompt header says): the worst case for a budget. A request
// with no cap produces 1,000,000 tokens. It sums what it reported.
type greedy struct {
	reported atomic.Int64
	uncapped atomic.Int64
	mu       sync.Mutex
	bodies   []string
}

func newGreedy(t testing.TB) (*greedy, string) {
	g := &greedy{}
	s := httptest.NewServer(g)
	t.Cleanup(s.Close)
	return g, s.URL
}

func (g *greedy) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	b, _ := io.ReadAll(r.Body)
	g.mu.Lock()
	g.bodies = append(g.bodies, string(b))
	g.mu.Unlock()
	var req map[string]json.RawMessage
	if err := json.Unmarshal(b, &req); err != nil {
		http.Error(w, "bad json", 400)
		return
	}
	out := int64(-1)
	for _, name := range []string{"max_tokens", "max_completion_tokens", "max_output_tokens"} {
		if v, ok := req[name]; ok {
			f, err := strconv.ParseFloat(string(v), 64)
			if err != nil || f < 1 {
				out = 1_000_000 // a cap it does not read as one
				continue
			}
			out = max(out, int64(f))
		}
	}
	if out < 0 {
		out = 1_000_000
		g.uncapped.Add(1)
	}
	n := int64(1)
	if v, ok := req["n"]; ok {
		n, _ = strconv.ParseInt(string(v), 10, 64)
	}
	prompt, _ := strconv.ParseInt(r.Header.Get("X-Test-Prompt"), 10, 64)
	completion := out * n
	g.reported.Add(prompt + completion)
	usage := fmt.Sprintf(`{"prompt_tokens":%d,"completion_tokens":%d,"total_tokens":%d}`, prompt, completion, prompt+completion)
	if string(req["stream"]) != "true" {
		w.Header().Set("Content-Type", "application/json")
		fmt.Fprintf(w, `{"id":"c1","object":"chat.completion","choices":[{"index":0,"message":{"role":"assistant","content":"blah"},"finish_reason":"length"}],"usage":%s}`, usage)
		return
	}
	w.Header().Set("Content-Type", "text/event-stream")
	for range 3 {
		io.WriteString(w, `data: {"id":"c1","object":"chat.completion.chunk","choices":[{"index":0,"delta":{"content":"blah blah"}}]}`+"\n\n")
		w.(http.Flusher).Flush()
	}
	io.WriteString(w, `data: {"id":"c1","object":"chat.completion.chunk","choices":[{"index":0,"delta":{},"finish_reason":"length"}]}`+"\n\n")
	if strings.Contains(string(req["stream_options"]), `"include_usage":true`) {
		io.WriteString(w, `data: {"id":"c1","object":"chat.completion.chunk","choices":[],"usage":`+usage+"}\n\n")
	}
	io.WriteString(w, "data: [DONE]\n\n")
}

const clampRule = `
[[rule]]
name   = "tpm"
key    = ["global"]
cost   = "total_tokens"
output = "clamp"
limit  = %d
window = "1h"
`

const hiBody = `{"model":"gpt-4o","messages":[{"role":"user","content":"Hi there"}]`

// A request whose cap fits is forwarded byte for byte; one asking more
// than remains is lowered to exactly what remains after its input, in
// place; one naming none gets the reserve (or what remains), appended;
// below min_output it is refused (429) and an input alone over the limit
// is 413.
func TestClampRewritesTheCap(t *testing.T) {
	g, url := newGreedy(t)
	f := newFixture(t, budgetRules(t, url, fmt.Sprintf(clampRule, 3000), "OUTPUT_TOKEN_RESERVE", "2000")...)
	est := estimate(t, "/v1/chat/completions", hiBody+"}")
	p := strconv.FormatInt(est, 10)
	send := func(body string) *httptest.ResponseRecorder {
		return f.send("/v1/chat/completions", "203.0.113.7:1", "application/json", body, "X-Test-Prompt", p)
	}
	last := func() string { g.mu.Lock(); defer g.mu.Unlock(); return g.bodies[len(g.bodies)-1] }

	body := hiBody + ",\n \"max_tokens\" : 100 }"
	w := send(body)
	if w.Code != 200 || last() != body || w.Header().Get("X-Ratelimit-Output-Clamped") != "" {
		t.Fatalf("a cap that fits: %d %q %q", w.Code, last(), w.Header().Get("X-Ratelimit-Output-Clamped"))
	}
	left := 3000 - est - 100
	// No cap: the reserve (2000) fits and is added as the last member.
	w = send(hiBody + "}")
	if w.Code != 200 || last() != hiBody+`,"max_tokens":2000}` || w.Header().Get("X-Ratelimit-Output-Clamped") != "2000" {
		t.Fatalf("no cap: %d %q %v", w.Code, last(), w.Header())
	}
	left -= est + 2000
	// More than remains: lowered in place to what remains after the input.
	body = hiBody + `,"max_tokens":1e4,"temperature":0.5}`
	want := strconv.FormatInt(left-est, 10)
	w = send(body)
	if w.Code != 200 || last() != hiBody+`,"max_tokens":`+want+`,"temperature":0.5}` || w.Header().Get("X-Ratelimit-Output-Clamped") != want {
		t.Fatalf("lowered to %s: %d %q %v", want, w.Code, last(), w.Header())
	}
	if got := header(w, "X-Ratelimit-Remaining-Tokens"); got != 0 {
		t.Fatalf("%d tokens left after a clamp to what remained", got)
	}
	if n := metric(t, f, "ratelimit_proxy_output_clamped_total", map[string]string{"rule": "tpm"}); n != 2 {
		t.Fatalf("ratelimit_proxy_output_clamped_total %v, want 2 (one added, one lowered)", n)
	}
	// Nothing left: below min_output, 429 as without clamping.
	w = send(body)
	if b := body429(t, w); w.Code != 429 || b.DeniedBy != "tpm" {
		t.Fatalf("nothing left: %d %s", w.Code, w.Body)
	}
	if g.reported.Load() != 3000 {
		t.Fatalf("the upstream reported %d tokens in all, want the whole 3000", g.reported.Load())
	}

	// A request over the whole limit is lowered, not refused; an input
	// over it is 413.
	g2, url2 := newGreedy(t)
	f2 := newFixture(t, budgetRules(t, url2, fmt.Sprintf(clampRule, 500))...)
	w = f2.send("/v1/chat/completions", "203.0.113.7:1", "application/json", hiBody+`,"max_completion_tokens":100000}`, "X-Test-Prompt", p)
	if want := strconv.FormatInt(500-est, 10); w.Code != 200 || w.Header().Get("X-Ratelimit-Output-Clamped") != want {
		t.Fatalf("a request over the limit: %d %v %s", w.Code, w.Header(), w.Body)
	}
	if g2.reported.Load() != 500 {
		t.Fatalf("reported %d", g2.reported.Load())
	}
	huge := `{"model":"gpt-4o","messages":[{"role":"user","content":"` + strings.Repeat("word ", 600) + `"}]}`
	w = f2.send("/v1/chat/completions", "203.0.113.8:1", "application/json", huge)
	if w.Code != 413 || !strings.Contains(w.Body.String(), `"input_too_large"`) {
		t.Fatalf("an input over the limit: %d %s", w.Code, w.Body)
	}
}

// The member written is the one the request's API reads when it names
// none; n choices are each capped and reserved for.
func TestClampMemberPerAPI(t *testing.T) {
	for _, tc := range []struct{ path, body, want string }{
		{"/v1/chat/completions", `{"model":"o3-mini","messages":[{"role":"user","content":"Hi"}]}`, `"max_completion_tokens":300}`},
		{"/v1/chat/completions", `{"model":"gpt-4o","messages":[{"role":"user","content":"Hi"}]}`, `"max_tokens":300}`},
		{"/v1/responses", `{"model":"gpt-4o","input":"Hi"}`, `"max_output_tokens":300}`},
		{"/v1/completions", `{"model":"gpt-3.5-turbo-instruct","prompt":"Hi"}`, `"max_tokens":300}`},
		{"/v1/messages", `{"model":"claude-sonnet-4","messages":[{"role":"user","content":"Hi"}]}`, `"max_tokens":300}`},
	} {
		g, url := newGreedy(t)
		f := newFixture(t, budgetRules(t, url, fmt.Sprintf(clampRule, 100000), "OUTPUT_TOKEN_RESERVE", "300")...)
		w := f.send(tc.path, "203.0.113.7:1", "application/json", tc.body)
		if w.Code != 200 || g.bodies[0] != strings.TrimSuffix(tc.body, "}")+","+tc.want {
			t.Errorf("%s %s: %d forwarded %s", tc.path, tc.body, w.Code, g.bodies[0])
		}
	}
	// n = 3: each choice's cap is what remains divided among them.
	g, url := newGreedy(t)
	f := newFixture(t, budgetRules(t, url, fmt.Sprintf(clampRule, 1000))...)
	body := hiBody + `,"n":3,"max_tokens":900}`
	est := estimate(t, "/v1/chat/completions", body)
	w := f.send("/v1/chat/completions", "203.0.113.7:1", "application/json", body, "X-Test-Prompt", strconv.FormatInt(est, 10))
	if want := (1000 - est) / 3; w.Code != 200 || header(w, "X-Ratelimit-Output-Clamped") != want || g.reported.Load() > 1000 {
		t.Fatalf("n=3: %d %v, reported %d", w.Code, w.Header(), g.reported.Load())
	}
}

// The property: many concurrent requests, streaming or not, against one
// clamping budget, an upstream that always uses the whole cap it was sent
// and reports it: what is settled never exceeds the limit, and the
// counter holds exactly what was reported. In memory and on Redis.
func TestClampNeverOvershoots(t *testing.T) {
	for _, store := range []string{"memory", "redis"} {
		t.Run(store, func(t *testing.T) {
			g, url := newGreedy(t)
			const limit = 250000
			opts := budgetRules(t, url, fmt.Sprintf(clampRule, limit)+"min_output = 8\n")
			if store == "redis" {
				redistest.Require(t)
				opts = append(opts, onRedis(t))
			}
			f := newFixture(t, opts...)
			var admitted, clamped, refused atomic.Int64
			var wg sync.WaitGroup
			for c := range 24 {
				wg.Add(1)
				go func() {
					defer wg.Done()
					rng := rand.New(rand.NewPCG(uint64(c), 29))
					for range 12 {
						body := fmt.Sprintf(`{"model":"gpt-4o","messages":[{"role":"user","content":"%s"}]`, strings.Repeat("tell me more ", 1+rng.IntN(30)))
						if rng.IntN(2) == 0 {
							body += `,"stream":true`
						}
						if rng.IntN(3) == 0 {
							body += `,"n":2`
						}
						switch rng.IntN(4) {
						case 0: // no cap: the reserve
						case 1:
							body += fmt.Sprintf(`,"max_tokens":%d`, 1+rng.IntN(20000))
						case 2:
							body += fmt.Sprintf(`,"max_completion_tokens":%d.0`, 1+rng.IntN(3000))
						case 3:
							body += `,"max_tokens":-1`
						}
						body += "}"
						est := estimate(t, "/v1/chat/completions", body)
						w := f.send("/v1/chat/completions", fmt.Sprintf("203.0.113.%d:1", c), "application/json", body, "X-Test-Prompt", strconv.FormatInt(est, 10))
						switch w.Code {
						case 200:
							admitted.Add(1)
							if w.Header().Get("X-Ratelimit-Output-Clamped") != "" {
								clamped.Add(1)
							}
						case 429:
							refused.Add(1)
						default:
							t.Errorf("%d %s", w.Code, w.Body)
						}
					}
				}()
			}
			wg.Wait()
			if g.uncapped.Load() > 0 {
				t.Fatalf("%d requests left with no cap", g.uncapped.Load())
			}
			settled := g.reported.Load()
			code, m := f.adminDo(t, "GET", "/admin/limits/tpm?top=1", "", "")
			keys, _ := m["keys"].([]any)
			if code != 200 || len(keys) != 1 {
				t.Fatalf("admin: %d %v", code, m)
			}
			used, _ := keys[0].(map[string]any)["used"].(float64)
			if settled > limit || int64(used) != settled {
				t.Fatalf("settled %d (counted %v) against a limit of %d", settled, used, limit)
			}
			if clamped.Load() == 0 || refused.Load() == 0 || settled < limit*9/10 {
				t.Fatalf("%d admitted, %d clamped, %d refused, %d settled: the test did not reach the limit", admitted.Load(), clamped.Load(), refused.Load(), settled)
			}
			t.Logf("%d admitted (%d clamped), %d refused, %d of %d settled", admitted.Load(), clamped.Load(), refused.Load(), settled, limit)
		})
	}
}

const clampUSDRule = `
[[rule]]
name   = "spend"
key    = ["global"]
cost   = "usd"
output = "clamp"
limit  = %s
window = "1h"

[price."gpt-4o*"]
input  = 2.50
output = 10.00
`

// A usd rule clamps to the money that remains after the input's price,
// at the output price per token, rounded down; below min_output it is
// refused with insufficient_quota; concurrent requests never spend more
// than the limit.
func TestClampUSD(t *testing.T) {
	_, url := newGreedy(t)
	f := newFixture(t, budgetRules(t, url, fmt.Sprintf(clampUSDRule, "0.01"))...)
	body := hiBody + `,"max_tokens":5000}`
	est := estimate(t, "/v1/chat/completions", body)
	p := strconv.FormatInt(est, 10)
	base := (est*25 + 9) / 10 // 2.50 $/M tokens = 2.5 µ$ a token, rounded up
	want := (10000 - base) / 10
	w := f.send("/v1/chat/completions", "203.0.113.7:1", "application/json", body, "X-Test-Prompt", p)
	if w.Code != 200 || header(w, "X-Ratelimit-Output-Clamped") != want {
		t.Fatalf("want a cap of %d: %d %v %s", want, w.Code, w.Header(), w.Body)
	}
	w = f.send("/v1/chat/completions", "203.0.113.7:1", "application/json", body, "X-Test-Prompt", p)
	if w.Code != 429 || !strings.Contains(w.Body.String(), `"insufficient_quota"`) {
		t.Fatalf("spent: %d %s", w.Code, w.Body)
	}
	code, m := f.adminDo(t, "GET", "/admin/limits/spend?top=1", "", "")
	if keys, _ := m["keys"].([]any); code != 200 || len(keys) != 1 || keys[0].(map[string]any)["used"].(float64) > 0.01 {
		t.Fatalf("admin: %d %v", code, m)
	}

	for _, store := range []string{"memory", "redis"} {
		t.Run(store, func(t *testing.T) {
			g, url := newGreedy(t)
			opts := budgetRules(t, url, fmt.Sprintf(clampUSDRule, "1.00"))
			if store == "redis" {
				redistest.Require(t)
				opts = append(opts, onRedis(t))
			}
			f := newFixture(t, opts...)
			var wg sync.WaitGroup
			for c := range 16 {
				wg.Add(1)
				go func() {
					defer wg.Done()
					rng := rand.New(rand.NewPCG(uint64(c), 31))
					for range 12 {
						body := fmt.Sprintf(`{"model":"gpt-4o","messages":[{"role":"user","content":"%s"}],"stream":%v,"max_tokens":%d}`,
							strings.Repeat("more ", 1+rng.IntN(50)), rng.IntN(2) == 0, 1+rng.IntN(30000))
						est := estimate(t, "/v1/chat/completions", body)
						w := f.send("/v1/chat/completions", fmt.Sprintf("203.0.113.%d:1", c), "application/json", body, "X-Test-Prompt", strconv.FormatInt(est, 10))
						if w.Code != 200 && w.Code != 429 {
							t.Errorf("%d %s", w.Code, w.Body)
						}
					}
				}()
			}
			wg.Wait()
			code, m := f.adminDo(t, "GET", "/admin/limits/spend?top=1", "", "")
			keys, _ := m["keys"].([]any)
			if code != 200 || len(keys) != 1 {
				t.Fatalf("admin: %d %v", code, m)
			}
			used := keys[0].(map[string]any)["used"].(float64)
			if used > 1.00 || used < 0.9 || g.uncapped.Load() > 0 {
				t.Fatalf("spent $%v of $1.00 (%d uncapped)", used, g.uncapped.Load())
			}
			t.Logf("spent $%v of $1.00, %d output tokens", used, g.reported.Load())
		})
	}
}

// GET /admin/rules shows a budget rule's output option.
func TestClampAdminRules(t *testing.T) {
	_, url := newGreedy(t)
	f := newFixture(t, budgetRules(t, url, fmt.Sprintf(clampRule, 1000)+"min_output = 32\n"+`
[[rule]]
name   = "plain"
cost   = "total_tokens"
limit  = 1000
`)...)
	code, m := f.adminDo(t, "GET", "/admin/rules", "", "")
	b, _ := json.Marshal(m)
	if code != 200 || !strings.Contains(string(b), `"min_output":32,`) || !strings.Contains(string(b), `"output":"clamp"`) ||
		!strings.Contains(string(b), `"output":"reserve"`) {
		t.Fatalf("%d %s", code, b)
	}
}

// Disguised caps end to end: an escaped member name is read and lowered
// as the plain one; a cap given twice (any spelling) is a 400 under a
// clamping rule as under any total_tokens rule; an upstream's own
// x-ratelimit-output-clamped does not replace the proxy's.
func TestClampDisguises(t *testing.T) {
	g := &greedy{}
	spoof := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("X-Ratelimit-Output-Clamped", "999999")
		g.ServeHTTP(w, r)
	}))
	t.Cleanup(spoof.Close)
	f := newFixture(t, budgetRules(t, spoof.URL, fmt.Sprintf(clampRule, 1000))...)
	body := hiBody + `,"max\u005ftokens":   5e5}`
	est := estimate(t, "/v1/chat/completions", body)
	want := strconv.FormatInt(1000-est, 10)
	w := f.send("/v1/chat/completions", "203.0.113.7:1", "application/json", body, "X-Test-Prompt", strconv.FormatInt(est, 10))
	if w.Code != 200 || g.bodies[0] != hiBody+`,"max\u005ftokens":   `+want+`}` || w.Header().Get("X-Ratelimit-Output-Clamped") != want {
		t.Fatalf("escaped name: %d %s %v", w.Code, g.bodies[0], w.Header())
	}
	if g.reported.Load() != 1000 {
		t.Fatalf("reported %d", g.reported.Load())
	}
	for _, twice := range []string{hiBody + `,"max_tokens":10,"max_tokens":5000}`, hiBody + `,"max_tokens":10,"MAX_TOKENS":5000}`} {
		w := f.send("/v1/chat/completions", "203.0.113.7:1", "application/json", twice)
		if w.Code != 400 || !strings.Contains(w.Body.String(), "duplicate member") {
			t.Fatalf("%s: %d %s", twice, w.Code, w.Body)
		}
	}
	if len(g.bodies) != 1 {
		t.Fatalf("%d requests reached the upstream", len(g.bodies))
	}
}
