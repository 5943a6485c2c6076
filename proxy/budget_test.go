package proxy_test

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ratelimit-proxy/ratelimit-proxy/config"
	"github.com/ratelimit-proxy/ratelimit-proxy/proxy"
	"github.com/ratelimit-proxy/ratelimit-proxy/tokens"
)

// llm is a deterministic OpenAI/Anthropic-shaped upstream for the budget
// tests. X-Test-Usage chooses what it reports: "P,C" (prompt and
// completion tokens), "none" (no usage), "text" (a plain-text answer),
// "error" (a 400 error JSON); X-Test-Hang makes a stream stop after its
// first content chunks and wait for the client to leave.
type llm struct {
	mu     sync.Mutex
	bodies []string // request bodies received
	hdrs   []http.Header
	gone   chan struct{}
}

var words = []string{"Hello", " there", ",", " general", " Kenobi", "!"}

func newLLM(t testing.TB) (*llm, string) {
	u := &llm{gone: make(chan struct{}, 16)}
	s := httptest.NewServer(u)
	t.Cleanup(s.Close)
	return u, s.URL
}

func (u *llm) last() string {
	u.mu.Lock()
	defer u.mu.Unlock()
	if len(u.bodies) == 0 {
		return ""
	}
	return u.bodies[len(u.bodies)-1]
}

func (u *llm) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	b, _ := io.ReadAll(r.Body)
	u.mu.Lock()
	u.bodies = append(u.bodies, string(b))
	u.hdrs = append(u.hdrs, r.Header.Clone())
	u.mu.Unlock()
	if r.Header.Get("Upgrade") != "" {
		c, rw, _ := w.(http.Hijacker).Hijack()
		rw.WriteString("HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\r\nhello")
		rw.Flush()
		c.Close()
		return
	}
	var req struct {
		Stream        bool `json:"stream"`
		StreamOptions struct {
			IncludeUsage bool `json:"include_usage"`
		} `json:"stream_options"`
	}
	json.Unmarshal(b, &req)
	if r.Header.Get("X-Test-Ignore-Stream") != "" {
		req.Stream = false // an upstream that answers one JSON document anyway
	}
	prompt, completion, mode := 0, 0, r.Header.Get("X-Test-Usage")
	if p, c, ok := strings.Cut(mode, ","); ok {
		prompt, _ = strconv.Atoi(p)
		completion, _ = strconv.Atoi(c)
		mode = "usage"
	}
	switch {
	case mode == "text":
		w.Header().Set("Content-Type", "text/plain")
		io.WriteString(w, strings.Join(words, ""))
		return
	case mode == "html":
		w.Header().Set("Content-Type", "text/html")
		w.WriteHeader(502)
		io.WriteString(w, "<html><body>Bad gateway: "+strings.Join(words, "")+"</body></html>")
		return
	case mode == "error":
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(400)
		io.WriteString(w, `{"error":{"message":"bad","type":"invalid_request_error"}}`)
		return
	case !req.Stream:
		w.Header().Set("Content-Type", "application/json")
		text, _ := json.Marshal(strings.Join(words, ""))
		if strings.HasSuffix(r.URL.Path, "/messages") {
			fmt.Fprintf(w, `{"id":"msg_1","type":"message","role":"assistant","content":[{"type":"text","text":%s}]`, text)
			if mode == "usage" {
				fmt.Fprintf(w, `,"usage":{"input_tokens":%d,"output_tokens":%d}`, prompt, completion)
			}
			io.WriteString(w, "}")
			return
		}
		fmt.Fprintf(w, `{"id":"c1","object":"chat.completion","choices":[{"index":0,"message":{"role":"assistant","content":%s},"finish_reason":"stop"}]`, text)
		if mode == "usage" {
			fmt.Fprintf(w, `,"usage":{"prompt_tokens":%d,"completion_tokens":%d,"total_tokens":%d}`, prompt, completion, prompt+completion)
		}
		io.WriteString(w, "}")
		return
	}
	w.Header().Set("Content-Type", "text/event-stream")
	if ct := r.Header.Get("X-Test-Type"); ct != "" {
		w.Header().Set("Content-Type", ct) // an SSE stream mislabelled
	}
	flush := func(s string) {
		io.WriteString(w, s)
		w.(http.Flusher).Flush()
	}
	hang := r.Header.Get("X-Test-Hang") != ""
	if strings.HasSuffix(r.URL.Path, "/messages") {
		flush(fmt.Sprintf("event: message_start\ndata: {\"type\":\"message_start\",\"message\":{\"id\":\"msg_1\",\"usage\":{\"input_tokens\":%d,\"output_tokens\":1}}}\n\n", prompt))
		for i, wd := range words {
			if hang && i == 2 {
				<-r.Context().Done()
				u.gone <- struct{}{}
				return
			}
			text, _ := json.Marshal(wd)
			flush(fmt.Sprintf("event: content_block_delta\ndata: {\"type\":\"content_block_delta\",\"index\":0,\"delta\":{\"type\":\"text_delta\",\"text\":%s}}\n\n", text))
		}
		if mode == "usage" {
			flush(fmt.Sprintf("event: message_delta\ndata: {\"type\":\"message_delta\",\"delta\":{\"stop_reason\":\"end_turn\"},\"usage\":{\"output_tokens\":%d}}\n\n", completion))
		}
		flush("event: message_stop\ndata: {\"type\":\"message_stop\"}\n\n")
		return
	}
	null := ""
	if req.StreamOptions.IncludeUsage {
		null = `,"usage":null`
	}
	chunk := func(delta, finish string) string {
		return `data: {"id":"c1","object":"chat.completion.chunk","created":1,"model":"gpt-4o","choices":[{"index":0,"delta":` +
			delta + `,"finish_reason":` + finish + `}]` + null + "}\n\n"
	}
	flush(chunk(`{"role":"assistant","content":""}`, "null"))
	for i, wd := range words {
		if hang && i == 2 {
			<-r.Context().Done()
			u.gone <- struct{}{}
			return
		}
		text, _ := json.Marshal(wd)
		flush(chunk(`{"content":`+string(text)+`}`, "null"))
	}
	flush(chunk(`{}`, `"stop"`))
	if req.StreamOptions.IncludeUsage && mode == "usage" {
		flush(fmt.Sprintf(`data: {"id":"c1","object":"chat.completion.chunk","created":1,"model":"gpt-4o","choices":[],"usage":{"prompt_tokens":%d,"completion_tokens":%d,"total_tokens":%d}}`+"\n\n",
			prompt, completion, prompt+completion))
	}
	flush("data: [DONE]\n\n")
}

func upstreamAt(url string) option {
	return func(c *config.Config, _ *proxy.Options) { c.UpstreamURL = url }
}

// budgetRules loads TOML with the upstream kept at url.
func budgetRules(t *testing.T, url, toml string, env ...string) []option {
	return []option{upstreamAt(url), rules(t, toml, append([]string{"UPSTREAM_URL", url}, env...)...)}
}

var tokenizer = tokens.New()

// estimate is the proxy's input estimate of a body.
func estimate(t *testing.T, path, body string) int64 {
	t.Helper()
	est, err := tokenizer.Estimate(tokens.Request{Format: tokens.FormatForPath(path), ContentType: "application/json",
		Body: []byte(body)}, -1)
	if err != nil {
		t.Fatal(err)
	}
	return int64(est.Tokens)
}

func header(w *httptest.ResponseRecorder, name string) int64 {
	n, _ := strconv.ParseInt(w.Header().Get(name), 10, 64)
	return n
}

const weatherBody = `{"model":"gpt-4o","messages":[{"role":"user","content":"Tell me something about the weather in Asunción today."}]`

// An input_tokens rule charges the estimate at admission and nothing
// later; the headers carry the state after the request's own charge.
func TestInputTokensBudget(t *testing.T) {
	_, url := newLLM(t)
	f := newFixture(t, budgetRules(t, url, `
[[rule]]
name   = "tpm"
cost   = "input_tokens"
limit  = 100
window = "1m"
`)...)
	body := weatherBody + "}"
	est := estimate(t, "/v1/chat/completions", body)
	left := int64(100)
	for left >= est {
		w := f.send("/v1/chat/completions", "203.0.113.7:1", "application/json", body, "X-Test-Usage", "7,5")
		left -= est
		if w.Code != 200 || header(w, "X-Ratelimit-Remaining-Tokens") != left || header(w, "X-Ratelimit-Limit-Tokens") != 100 ||
			w.Header().Get("X-Ratelimit-Reset-Tokens") != "1m0s" || header(w, "X-Ratelimit-Remaining") != left {
			t.Fatalf("admitted with %d left: %d %v", left, w.Code, w.Header())
		}
		if got := w.Header().Get("RateLimit-Policy"); got != `"tpm";q=100;w=60;qu="tokens"` {
			t.Fatalf("RateLimit-Policy %q", got)
		}
		if w.Header().Get("X-Ratelimit-Limit-Requests") != "" {
			t.Fatalf("-requests headers without a request rule: %v", w.Header())
		}
	}
	w := f.send("/v1/chat/completions", "203.0.113.7:1", "application/json", body)
	b := body429(t, w)
	if w.Code != 429 || b.DeniedBy != "tpm" || header(w, "X-Ratelimit-Remaining-Tokens") != left || w.Header().Get("X-Ratelimit-Remaining") != "0" {
		t.Fatalf("past the budget: %d %v %s", w.Code, w.Header(), w.Body)
	}
	// A smaller request still fits what is left.
	small := `{"model":"gpt-4o","messages":[{"role":"user","content":"Hi"}]}`
	if est2 := estimate(t, "/v1/chat/completions", small); est2 <= left {
		if w := f.send("/v1/chat/completions", "203.0.113.7:1", "application/json", small); w.Code != 200 {
			t.Fatalf("a request of %d tokens with %d left: %d", est2, left, w.Code)
		}
	}
	if got := metric(t, f, "ratelimit_proxy_input_estimate_error_tokens", map[string]string{"model": "gpt-4o"}); got == 0 {
		t.Errorf("no estimate error observed")
	}
}

// Concurrent requests never overshoot an input_tokens budget.
func TestInputTokensConcurrent(t *testing.T) {
	_, url := newLLM(t)
	f := newFixture(t, budgetRules(t, url, `
[[rule]]
name   = "tpm"
cost   = "input_tokens"
key    = ["global"]
limit  = 1000
window = "1m"
`)...)
	body := weatherBody + "}"
	est := estimate(t, "/v1/chat/completions", body)
	var ok atomic.Int64
	var wg sync.WaitGroup
	for i := range 100 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if w := f.send("/v1/chat/completions", fmt.Sprintf("203.0.113.%d:1", i), "application/json", body); w.Code == 200 {
				ok.Add(1)
			}
		}()
	}
	wg.Wait()
	if ok.Load() != 1000/est {
		t.Fatalf("%d admitted at %d tokens each against 1000, want %d", ok.Load(), est, 1000/est)
	}
}

const totalRule = `
[[rule]]
name   = "tpm"
cost   = "total_tokens"
limit  = 5000
window = "1m"
`

// probeCost is what usedBefore's probe reserves.
func probeCost(t *testing.T) int64 {
	return estimate(t, "/v1/chat/completions", `{"model":"gpt-4o","messages":[],"max_tokens":1}`) + 1
}

// A total_tokens rule reserves the estimate plus max_tokens, then settles
// to the usage reported: a JSON answer, an OpenAI stream with usage asked
// by the client or added by the proxy, an Anthropic stream.
func TestTotalTokensSettle(t *testing.T) {
	for _, tc := range []struct {
		name, path, body string
		usage            string
		want             func(est int64) int64
	}{
		{"json", "/v1/chat/completions", weatherBody + `,"max_tokens":300}`, "40,25", func(int64) int64 { return 65 }},
		{"stream asked", "/v1/chat/completions", weatherBody + `,"stream":true,"stream_options":{"include_usage":true}}`, "41,26", func(int64) int64 { return 67 }},
		{"stream added", "/v1/chat/completions", weatherBody + `,"stream":true}`, "42,27", func(int64) int64 { return 69 }},
		{"anthropic json", "/v1/messages", `{"model":"claude-sonnet-4","max_tokens":500,"messages":[{"role":"user","content":"Hi there"}]}`, "12,30", func(int64) int64 { return 42 }},
		{"anthropic stream", "/v1/messages", `{"model":"claude-sonnet-4","max_tokens":500,"stream":true,"messages":[{"role":"user","content":"Hi there"}]}`, "13,31", func(int64) int64 { return 44 }},
		{"no usage", "/v1/chat/completions", weatherBody + `,"stream":true}`, "none", func(est int64) int64 { return est + outputTokens("gpt-4o") }},
		{"plain text", "/v1/chat/completions", weatherBody + `}`, "text", func(est int64) int64 { return est + outputTokens("gpt-4o") }},
		{"error answer", "/v1/chat/completions", weatherBody + `}`, "error", func(est int64) int64 { return est }},
		{"error page", "/v1/chat/completions", weatherBody + `,"stream":true}`, "html", func(est int64) int64 { return est }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, url := newLLM(t)
			f := newFixture(t, budgetRules(t, url, totalRule)...)
			est := estimate(t, tc.path, tc.body)
			w := f.send(tc.path, "203.0.113.7:1", "application/json", tc.body, "X-Test-Usage", tc.usage)
			if tc.usage == "error" || tc.usage == "html" {
				if w.Code != 400 && w.Code != 502 {
					t.Fatalf("%d %s", w.Code, w.Body)
				}
			} else if w.Code != 200 {
				t.Fatalf("%d %s", w.Code, w.Body)
			}
			if used := usedBeforeOn(t, f, 5000); used != tc.want(est) {
				t.Fatalf("settled to %d, want %d (estimate %d)", used, tc.want(est), est)
			}
		})
	}
}

// outputTokens is what the llm's answer text counts.
func outputTokens(model string) int64 {
	return int64(tokenizer.CountText(model, []byte(strings.Join(words, ""))))
}

// The client that did not ask for usage gets exactly the bytes the
// upstream sends without it; the upstream was asked for usage.
func TestStreamUsageRemoved(t *testing.T) {
	u, url := newLLM(t)
	f := newFixture(t, budgetRules(t, url, totalRule)...)
	body := weatherBody + `,"stream":true,"max_tokens":100}`
	w := f.send("/v1/chat/completions", "203.0.113.7:1", "application/json", body, "X-Test-Usage", "40,25")
	if !strings.Contains(u.last(), `"stream_options":{"include_usage":true}`) {
		t.Fatalf("upstream got %s", u.last())
	}
	// What the upstream sends a client that did not ask.
	r := httptest.NewRequest(http.MethodPost, "/v1/chat/completions", strings.NewReader(body))
	r.Header.Set("X-Test-Usage", "40,25")
	direct := httptest.NewRecorder()
	u.ServeHTTP(direct, r)
	if w.Body.String() != direct.Body.String() {
		t.Fatalf("client got\n%s\nwant\n%s", w.Body, direct.Body)
	}
	if w.Header().Get("Content-Length") != "" {
		t.Errorf("Content-Length %q on a stripped stream", w.Header().Get("Content-Length"))
	}
	// A client that asked gets the usage untouched.
	asked := weatherBody + `,"stream":true,"stream_options":{"include_usage":true}}`
	w = f.send("/v1/chat/completions", "203.0.113.7:1", "application/json", asked, "X-Test-Usage", "40,25")
	if u.last() != asked || !strings.Contains(w.Body.String(), `"usage":{"prompt_tokens":40`) {
		t.Fatalf("asked: upstream got %s, client got %s", u.last(), w.Body)
	}
}

// A client that leaves mid-stream: the upstream request is cancelled and
// the charge is the input estimate plus the output already forwarded.
func TestStreamDisconnectSettles(t *testing.T) {
	for _, path := range []string{"/v1/chat/completions", "/v1/messages"} {
		t.Run(path, func(t *testing.T) {
			u, url := newLLM(t)
			f := newFixture(t, budgetRules(t, url, totalRule)...)
			srv := httptest.NewServer(f.handler)
			defer srv.Close()
			body := weatherBody + `,"stream":true,"max_tokens":100}`
			if path == "/v1/messages" {
				body = `{"model":"gpt-4o","max_tokens":100,"stream":true,"messages":[{"role":"user","content":"Hi there"}]}`
			}
			est := estimate(t, path, body)
			ctx, cancel := context.WithCancel(context.Background())
			req, _ := http.NewRequestWithContext(ctx, http.MethodPost, srv.URL+path, strings.NewReader(body))
			req.Header.Set("Content-Type", "application/json")
			req.Header.Set("X-Test-Usage", "40,25")
			req.Header.Set("X-Test-Hang", "1")
			res, err := http.DefaultClient.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			sc := bufio.NewScanner(res.Body)
			seen := 0
			for seen < 2 && sc.Scan() {
				if strings.Contains(sc.Text(), `"Hello"`) || strings.Contains(sc.Text(), `" there"`) {
					seen++
				}
			}
			cancel()
			res.Body.Close()
			select {
			case <-u.gone:
			case <-time.After(5 * time.Second):
				t.Fatal("the upstream request was not cancelled")
			}
			want := est + int64(tokenizer.CountText("gpt-4o", []byte("Hello there")))
			deadline := time.Now().Add(5 * time.Second)
			for metric(t, f, "ratelimit_proxy_tokens_settled_total", map[string]string{"rule": "tpm"}) == 0 && time.Now().Before(deadline) {
				time.Sleep(5 * time.Millisecond)
			}
			if got := int64(metric(t, f, "ratelimit_proxy_tokens_settled_total", map[string]string{"rule": "tpm"})); got != want {
				t.Fatalf("settled %d, want %d", got, want)
			}
		})
	}
}

// A request whose cost alone exceeds the limit gets 413, never a 429
// whose wait cannot help; nothing is charged.
func TestTokenCostOverLimit(t *testing.T) {
	_, url := newLLM(t)
	f := newFixture(t, budgetRules(t, url, `
[[rule]]
name   = "tpm"
cost   = "total_tokens"
limit  = 500
window = "1m"

[[rule]]
name      = "bucket"
cost      = "input_tokens"
algorithm = "token_bucket"
limit     = 1000
burst     = 10
window    = "1m"
paths     = ["/v1/messages"]
`)...)
	body := weatherBody + `,"max_tokens":1000}`
	est := estimate(t, "/v1/chat/completions", body)
	w := f.send("/v1/chat/completions", "203.0.113.7:1", "application/json", body)
	var b struct {
		Error     string `json:"error"`
		DeniedBy  string `json:"denied_by"`
		Limit     int64  `json:"limit"`
		Estimated int64  `json:"estimated_tokens"`
	}
	json.Unmarshal(w.Body.Bytes(), &b)
	if w.Code != 413 || b.DeniedBy != "tpm" || b.Limit != 500 || b.Estimated != est+1000 || header(w, "X-Ratelimit-Remaining-Tokens") != 500 {
		t.Fatalf("%d %v %s", w.Code, w.Header(), w.Body)
	}
	if f.upstream.Load() != 0 {
		t.Fatal("forwarded")
	}
	// Without max_tokens the reserve (1024) alone is over 500 too;
	// with a small max_tokens it fits.
	if w := f.send("/v1/chat/completions", "203.0.113.7:1", "application/json", weatherBody+"}"); w.Code != 413 {
		t.Fatalf("default reserve: %d %s", w.Code, w.Body)
	}
	if w := f.send("/v1/chat/completions", "203.0.113.7:1", "application/json", weatherBody+`,"max_completion_tokens":10}`, "X-Test-Usage", "1,1"); w.Code != 200 {
		t.Fatalf("small: %d %s", w.Code, w.Body)
	}
	// A token bucket: over its burst.
	msg := `{"model":"claude-sonnet-4","max_tokens":5,"messages":[{"role":"user","content":"Tell me something about the weather in Asunción today."}]}`
	w = f.send("/v1/messages", "203.0.113.7:1", "application/json", msg)
	json.Unmarshal(w.Body.Bytes(), &b)
	if w.Code != 413 || b.DeniedBy != "bucket" || b.Limit != 10 {
		t.Fatalf("bucket: %d %s", w.Code, w.Body)
	}
}

// OUTPUT_TOKEN_RESERVE and n: what is reserved.
func TestOutputReserve(t *testing.T) {
	_, url := newLLM(t)
	f := newFixture(t, budgetRules(t, url, totalRule, "OUTPUT_TOKEN_RESERVE", "200")...)
	body := weatherBody + `,"stream":true}` // no usage will come: the probe is sent before settlement matters
	est := estimate(t, "/v1/chat/completions", body)
	w := f.send("/v1/chat/completions", "203.0.113.7:1", "application/json", body, "X-Test-Usage", "none")
	if header(w, "X-Ratelimit-Remaining-Tokens") != 5000-est-200 {
		t.Fatalf("reserve 200: remaining %s, estimate %d", w.Header().Get("X-Ratelimit-Remaining-Tokens"), est)
	}
	body = weatherBody + `,"max_tokens":100,"n":3}`
	est = estimate(t, "/v1/chat/completions", body)
	used := usedBeforeOn(t, f, 5000) // the probe settles to nothing
	w = f.send("/v1/chat/completions", "203.0.113.7:1", "application/json", body, "X-Test-Usage", "1,1")
	if got := 5000 - used - header(w, "X-Ratelimit-Remaining-Tokens"); got != est+300 {
		t.Fatalf("n=3 × 100 reserved %d, want %d", got, est+300)
	}
	// A repeated output field is ambiguous: 400.
	w = f.send("/v1/chat/completions", "203.0.113.7:1", "application/json", weatherBody+`,"max_tokens":1,"Max_Tokens":4000}`)
	if w.Code != 400 {
		t.Fatalf("duplicate max_tokens: %d %s", w.Code, w.Body)
	}
}

// Request and token rules together: X-RateLimit-* and -requests describe
// the request rule, -tokens the token rule.
func TestBudgetHeadersBothKinds(t *testing.T) {
	_, url := newLLM(t)
	f := newFixture(t, budgetRules(t, url, `
chat_rpm = 3

[[rule]]
name   = "tpm"
cost   = "input_tokens"
limit  = 10000
window = "1m"
`)...)
	w := f.send("/v1/chat/completions", "203.0.113.7:1", "application/json", weatherBody+"}")
	h := w.Header()
	if w.Code != 200 || h.Get("X-Ratelimit-Limit") != "3" || h.Get("X-Ratelimit-Remaining") != "2" ||
		h.Get("X-Ratelimit-Limit-Requests") != "3" || h.Get("X-Ratelimit-Remaining-Requests") != "2" ||
		h.Get("X-Ratelimit-Reset-Requests") != "1m0s" || h.Get("X-Ratelimit-Limit-Tokens") != "10000" ||
		h.Get("RateLimit-Policy") != `"chat_rpm";q=3;w=60, "tpm";q=10000;w=60;qu="tokens"` {
		t.Fatalf("%d %v", w.Code, h)
	}
}
