package tests

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"math"
	"net/http"
	"reflect"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ratelimit-proxy/ratelimit-proxy/internal/redistest"
)

// An independent, black-box check of three promises of the product, written
// from the contract and the user documentation only (budgets.md: "Budgets
// that are never overshot" and "A reserve learned per model"; upstream.md:
// "Fair share"). Every test drives the real binary over TCP in front of an
// upstream written here.

// ---------------------------------------------------------------------------
// A greedy upstream: it writes exactly the output cap it was sent (or, when
// the client asked with X-Out, min(cap, X-Out)) and reports that usage, with
// the input the client says the proxy estimated (X-Est), so it never reports
// more input than was estimated.

type greedyHit struct {
	id         string
	body       []byte
	capName    string // the top-level cap member it received ("" none)
	capVal     int64  // its value (-1: none, or not a whole number)
	prompt     int64
	completion int64
	model      string
	stream     bool
}

type greedyUpstream struct {
	mu   sync.Mutex
	hits []greedyHit
	srv  string
}

var capNames = []string{"max_tokens", "max_completion_tokens", "max_output_tokens"}

func newGreedyUpstream(t *testing.T) *greedyUpstream {
	t.Helper()
	g := &greedyUpstream{}
	g.srv = newUpstream(t, g.serve).URL
	return g
}

func (g *greedyUpstream) serve(w http.ResponseWriter, r *http.Request) {
	body, _ := io.ReadAll(r.Body)
	var top map[string]json.RawMessage
	_ = json.Unmarshal(body, &top)
	h := greedyHit{id: r.Header.Get("X-Req-Id"), body: body, capVal: -1}
	for _, n := range capNames {
		if raw, ok := top[n]; ok {
			h.capName = n
			if v, err := strconv.ParseInt(string(raw), 10, 64); err == nil {
				h.capVal = v
			}
		}
	}
	var model string
	_ = json.Unmarshal(top["model"], &model)
	h.model = model
	var stream bool
	_ = json.Unmarshal(top["stream"], &stream)
	h.stream = stream
	h.prompt, _ = strconv.ParseInt(r.Header.Get("X-Est"), 10, 64)
	out := h.capVal
	if out < 0 {
		out = 1_000_000 // no cap: a greedy model writes on and on
	}
	if want, err := strconv.ParseInt(r.Header.Get("X-Out"), 10, 64); err == nil && want < out {
		out = want
	}
	var n int64 = 1
	_ = json.Unmarshal(top["n"], &n)
	h.completion = out * max(n, 1) // every choice writes the cap
	g.mu.Lock()
	g.hits = append(g.hits, h)
	g.mu.Unlock()

	out = h.completion
	switch r.URL.Path {
	case "/v1/messages":
		g.anthropic(w, model, stream, h.prompt, out)
		return
	case "/v1/responses":
		w.Header().Set("Content-Type", "application/json")
		fmt.Fprintf(w, `{"id":"resp_g","object":"response","status":"incomplete","model":%q,"output":[{"type":"message","role":"assistant","content":[{"type":"output_text","text":"words"}]}],"usage":{"input_tokens":%d,"output_tokens":%d,"total_tokens":%d}}`+"\n", model, h.prompt, out, h.prompt+out)
		return
	}
	usage := fmt.Sprintf(`{"prompt_tokens":%d,"completion_tokens":%d,"total_tokens":%d}`, h.prompt, out, h.prompt+out)
	if !stream {
		w.Header().Set("Content-Type", "application/json")
		fmt.Fprintf(w, `{"id":"chatcmpl-g","object":"chat.completion","model":%q,"choices":[{"index":0,"message":{"role":"assistant","content":"words words words"},"finish_reason":"length"}],"usage":%s}`+"\n", model, usage)
		return
	}
	var so struct {
		IncludeUsage bool `json:"include_usage"`
	}
	_ = json.Unmarshal(top["stream_options"], &so)
	w.Header().Set("Content-Type", "text/event-stream")
	fl, _ := w.(http.Flusher)
	for range 3 {
		fmt.Fprintf(w, "data: {\"id\":\"chatcmpl-g\",\"object\":\"chat.completion.chunk\",\"model\":%q,\"choices\":[{\"index\":0,\"delta\":{\"content\":\"words \"}}]}\n\n", model)
		if fl != nil {
			fl.Flush()
		}
	}
	fmt.Fprintf(w, "data: {\"id\":\"chatcmpl-g\",\"object\":\"chat.completion.chunk\",\"model\":%q,\"choices\":[{\"index\":0,\"delta\":{},\"finish_reason\":\"length\"}]}\n\n", model)
	if so.IncludeUsage {
		fmt.Fprintf(w, "data: {\"id\":\"chatcmpl-g\",\"object\":\"chat.completion.chunk\",\"model\":%q,\"choices\":[],\"usage\":%s}\n\n", model, usage)
	}
	fmt.Fprint(w, "data: [DONE]\n\n")
}

// anthropic answers in the Messages API's shape; in a stream the usage
// comes in message_start (input) and message_delta (cumulative output).
func (g *greedyUpstream) anthropic(w http.ResponseWriter, model string, stream bool, in, out int64) {
	if !stream {
		w.Header().Set("Content-Type", "application/json")
		fmt.Fprintf(w, `{"id":"msg_g","type":"message","role":"assistant","model":%q,"content":[{"type":"text","text":"words"}],"stop_reason":"max_tokens","usage":{"input_tokens":%d,"output_tokens":%d}}`+"\n", model, in, out)
		return
	}
	w.Header().Set("Content-Type", "text/event-stream")
	ev := func(name, data string) {
		fmt.Fprintf(w, "event: %s\ndata: %s\n\n", name, data)
		if fl, ok := w.(http.Flusher); ok {
			fl.Flush()
		}
	}
	ev("message_start", fmt.Sprintf(`{"type":"message_start","message":{"id":"msg_g","type":"message","role":"assistant","model":%q,"content":[],"usage":{"input_tokens":%d,"output_tokens":1}}}`, model, in))
	ev("content_block_start", `{"type":"content_block_start","index":0,"content_block":{"type":"text","text":""}}`)
	ev("content_block_delta", `{"type":"content_block_delta","index":0,"delta":{"type":"text_delta","text":"words words"}}`)
	ev("content_block_stop", `{"type":"content_block_stop","index":0}`)
	ev("message_delta", fmt.Sprintf(`{"type":"message_delta","delta":{"stop_reason":"max_tokens"},"usage":{"output_tokens":%d}}`, out))
	ev("message_stop", `{"type":"message_stop"}`)
}

func (g *greedyUpstream) all() []greedyHit {
	g.mu.Lock()
	defer g.mu.Unlock()
	return append([]greedyHit(nil), g.hits...)
}

func (g *greedyUpstream) byID() map[string]greedyHit {
	m := map[string]greedyHit{}
	for _, h := range g.all() {
		m[h.id] = h
	}
	return m
}

// ---------------------------------------------------------------------------
// 1. output = "clamp": a budget is never overshot.

// clampVariant is one request shape. body has %CAP% where the client's cap
// digits go (capName/capDigits), or no cap at all (capName "").
type clampVariant struct {
	name       string
	body       string
	capName    string // the member the client named; "" none
	capDigits  string // what the client wrote
	addName    string // the member the proxy must add when the client named none
	stream     bool
	usageAsked bool // the client set stream_options.include_usage itself (or no stream_options apply)
	model      string
	path       string // default /v1/chat/completions
	n          int64  // choices (0: 1)
}

func (v clampVariant) urlPath() string {
	if v.path == "" {
		return "/v1/chat/completions"
	}
	return v.path
}

func (v clampVariant) sent() []byte {
	return []byte(strings.Replace(v.body, "%CAP%", v.capDigits, 1))
}

const storyMsgs = `[{"role":"system","content":"You are a storyteller."},{"role":"user","content":"Write a very long story about a lighthouse keeper and the sea."}]`

var clampVariants = []clampVariant{
	{name: "small cap", model: "gpt-4o-mini", capName: "max_tokens", capDigits: "40",
		body: `{"model":"gpt-4o-mini","max_tokens":%CAP%,"messages":` + storyMsgs + `}`},
	{name: "mid cap, odd spacing, nested namesake", model: "gpt-4o-mini", capName: "max_completion_tokens", capDigits: "300",
		body: `{ "model" : "gpt-4o-mini",  "metadata": {"max_tokens": "7"}, "max_completion_tokens" :  %CAP% ,` + "\n" + `"messages": ` + storyMsgs + ` }`},
	{name: "no cap", model: "gpt-4o-mini", addName: "max_tokens",
		body: `{"model":"gpt-4o-mini","messages":` + storyMsgs + `,"temperature":0.5}`},
	{name: "huge cap", model: "gpt-4o-mini", capName: "max_tokens", capDigits: "1000000",
		body: `{"model":"gpt-4o-mini","messages":` + storyMsgs + `,"max_tokens":%CAP%}`},
	{name: "stream, usage asked, big cap", model: "gpt-4o-mini", capName: "max_tokens", capDigits: "1500", stream: true, usageAsked: true,
		body: `{"model":"gpt-4o-mini","stream":true,"stream_options":{"include_usage":true},"max_tokens":%CAP%,"messages":` + storyMsgs + `}`},
	{name: "stream, no cap", model: "gpt-4o-mini", addName: "max_tokens", stream: true,
		body: `{"model":"gpt-4o-mini","stream":true,"messages":` + storyMsgs + `}`},
	{name: "stream, huge cap", model: "gpt-4o-mini", capName: "max_tokens", capDigits: "999999", stream: true,
		body: `{"model":"gpt-4o-mini","messages":` + storyMsgs + `,"stream":true,"max_tokens":%CAP%}`},
	{name: "reasoning model, no cap", model: "o3", addName: "max_completion_tokens",
		body: `{"model":"o3","messages":` + storyMsgs + `}`},
	{name: "three choices, huge cap", model: "gpt-4o-mini", capName: "max_tokens", capDigits: "100000", n: 3,
		body: `{"model":"gpt-4o-mini","n":3,"messages":` + storyMsgs + `,"max_tokens":%CAP%}`},
	{name: "cap 1e9", model: "gpt-4o-mini", capName: "max_tokens", capDigits: "1e9",
		body: `{"model":"gpt-4o-mini","max_tokens":%CAP%,"messages":` + storyMsgs + `}`},
	{name: "cap as a string", model: "gpt-4o-mini", capName: "max_tokens", capDigits: `"2000"`,
		body: `{"model":"gpt-4o-mini","max_tokens":%CAP%,"messages":` + storyMsgs + `}`},
	{name: "cap null", model: "gpt-4o-mini", capName: "max_completion_tokens", capDigits: "null",
		body: `{"model":"gpt-4o-mini","messages":` + storyMsgs + `,"max_completion_tokens":%CAP%}`},
	{name: "responses, no cap", model: "gpt-4o-mini", addName: "max_output_tokens", path: "/v1/responses",
		body: `{"model":"gpt-4o-mini","input":"Write a very long story about a lighthouse keeper and the sea."}`},
	{name: "anthropic, huge cap", model: "claude-3-5-haiku-latest", capName: "max_tokens", capDigits: "64000", path: "/v1/messages",
		body: `{"model":"claude-3-5-haiku-latest","max_tokens":%CAP%,"messages":[{"role":"user","content":"Write a very long story about a lighthouse keeper and the sea."}]}`},
	{name: "anthropic stream, huge cap", model: "claude-3-5-haiku-latest", capName: "max_tokens", capDigits: "64000", path: "/v1/messages",
		stream: true, usageAsked: true,
		body: `{"model":"claude-3-5-haiku-latest","stream":true,"max_tokens":%CAP%,"messages":[{"role":"user","content":"Write a very long story about a lighthouse keeper and the sea."}]}`},
}

// pricedVariants are the variants of the models the usd case prices.
func pricedVariants() []clampVariant {
	var out []clampVariant
	for _, v := range clampVariants {
		if strings.HasPrefix(v.model, "gpt-4o") {
			out = append(out, v)
		}
	}
	return out
}

// clampCase is one budget: its rule, and what a request costs in the rule's
// unit (tokens, or micro-dollars) from the usage the upstream reported.
type clampCase struct {
	rule     string
	file     string
	limit    int64 // tokens, or micro-dollars
	variants []clampVariant
	cost     func(prompt, completion int64) int64
	minOut   int64
	reserve  int64 // OUTPUT_TOKEN_RESERVE
	refusal  string
}

var clampTokens = clampCase{
	rule: "clamp-total", limit: 60000, minOut: 16, reserve: 500, refusal: "rate_limited",
	variants: clampVariants,
	cost:     func(p, c int64) int64 { return p + c },
	file: `
[[rule]]
name   = "clamp-total"
key    = ["header:X-Run"]
cost   = "total_tokens"
output = "clamp"
limit  = 60000
window = "1h"
`,
}

var clampUSD = clampCase{
	// $0.50 at $2.50/M input and $10/M output: 2.5 µ$ an input token,
	// 10 µ$ an output token.
	rule: "clamp-usd", limit: 500000, minOut: 16, reserve: 500, refusal: "insufficient_quota",
	variants: pricedVariants(),
	cost:     func(p, c int64) int64 { return (5*p+1)/2 + 10*c },
	file: `
[price."gpt-4o*"]
input  = 2.50
output = 10.00

[[rule]]
name   = "clamp-usd"
key    = ["header:X-Run"]
cost   = "usd"
output = "clamp"
limit  = 0.5
window = "1h"
`,
}

// estimate asks the admin API for the proxy's input estimate of body.
func estimate(t *testing.T, p *proc, model, path string, body []byte) int64 {
	t.Helper()
	r := p.do(t, http.MethodPost, p.adminURL("/admin/tokens?model="+model+"&path="+path), body)
	wantStatus(t, r, 200)
	n := num(r.json(t)["estimated_tokens"])
	if n <= 0 {
		t.Fatalf("/admin/tokens: no estimate: %s", r.body)
	}
	return int64(n)
}

type clampOutcome struct {
	v       clampVariant
	id      string
	status  int
	clamped []string
	body    []byte
	err     error
	code    any
	denied  any
}

var capAppended = regexp.MustCompile(`^\s*,\s*"([a-z_]+)"\s*:\s*([0-9]+)\s*\}\s*$`)

func runClampPromise(t *testing.T, c clampCase, ps []*proc, g *greedyUpstream) {
	est := make([]int64, len(c.variants))
	var maxEst int64
	for i, v := range c.variants {
		est[i] = estimate(t, ps[0], v.model, v.urlPath(), v.sent())
		maxEst = max(maxEst, est[i])
		if len(ps) > 1 {
			if e := estimate(t, ps[1], v.model, v.urlPath(), v.sent()); e != est[i] {
				t.Fatalf("%s: the instances estimate %d and %d", v.name, est[i], e)
			}
		}
	}
	// One budget (X-Run) per round. A round opens with one request of one
	// shape alone, so that every shape is admitted at least once, then
	// sends a burst from 24 clients at once over both instances: moderate
	// requests first (small, mid, no cap, the streams), then every shape,
	// the huge caps among them.
	for first := range c.variants {
		runClampRound(t, c, ps, g, fmt.Sprintf("run%d", first), first, est, maxEst, 60)
	}
	runClampRound(t, c, ps, g, "big", -1, est, maxEst, 150)
}

func runClampRound(t *testing.T, c clampCase, ps []*proc, g *greedyUpstream, run string, first int, est []int64, maxEst int64, moderates int) {
	t.Helper()
	var order []int
	moderate := []int{0, 1, 2, 4, 5}
	for i := range moderates {
		order = append(order, moderate[i%len(moderate)])
	}
	for i := range 2 * len(c.variants) {
		order = append(order, i%len(c.variants))
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	do := func(i, vi int, p *proc) clampOutcome {
		v := c.variants[vi]
		id := fmt.Sprintf("%s-%d", run, i)
		res := send(ctx, p, http.MethodPost, v.urlPath(), v.sent(),
			"X-Req-Id", id, "X-Run", run, "X-Est", strconv.FormatInt(est[vi], 10))
		o := clampOutcome{v: v, id: id, err: res.err}
		if res.err == nil {
			o.status = res.r.StatusCode
			o.clamped = res.r.Header.Values("X-Ratelimit-Output-Clamped")
			o.body = res.r.body
			var m map[string]any
			if json.Unmarshal(res.r.body, &m) == nil {
				if e, ok := m["error"].(map[string]any); ok {
					o.code = e["code"]
				} else {
					o.code = m["error"]
				}
				o.denied = m["denied_by"]
			}
		}
		return o
	}
	var outs []clampOutcome
	if first >= 0 {
		o := do(-1, first, ps[len(ps)-1])
		if o.err == nil && o.status != http.StatusOK {
			t.Errorf("%s (%s): the first request on a fresh budget got %d: %s", o.id, o.v.name, o.status, o.body)
		}
		outs = append(outs, o)
	}
	burst := make([]clampOutcome, len(order))
	var next atomic.Int64
	var wg sync.WaitGroup
	for w := range 24 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				i := int(next.Add(1)) - 1
				if i >= len(order) {
					return
				}
				burst[i] = do(i, order[i], ps[(i+w)%len(ps)])
			}
		}()
	}
	wg.Wait()
	outs = append(outs, burst...)

	hits := map[string]greedyHit{}
	var spent int64
	for _, h := range g.all() {
		if strings.HasPrefix(h.id, run+"-") {
			hits[h.id] = h
			spent += c.cost(h.prompt, h.completion)
		}
	}
	admitted, refused := 0, 0
	for _, o := range outs {
		if o.err != nil {
			t.Fatalf("%s (%s): %v", o.id, o.v.name, o.err)
		}
		h, reached := hits[o.id]
		switch o.status {
		case http.StatusOK:
			admitted++
			if !reached {
				t.Errorf("%s (%s): 200 but the upstream never saw it", o.id, o.v.name)
				continue
			}
			checkClampedRequest(t, c, o, h)
		case http.StatusTooManyRequests:
			refused++
			if reached {
				t.Errorf("%s (%s): 429 but the upstream saw it", o.id, o.v.name)
			}
			if o.code != c.refusal || o.denied != c.rule {
				t.Errorf("%s (%s): 429 code %v denied_by %v, want %s by %s: %s", o.id, o.v.name, o.code, o.denied, c.refusal, c.rule, o.body)
			}
		default:
			t.Errorf("%s (%s): status %d, want 200 or 429: %s", o.id, o.v.name, o.status, o.body)
		}
	}
	if len(hits) != admitted {
		t.Errorf("%s: the upstream saw %d requests, %d were admitted", run, len(hits), admitted)
	}
	if run == "big" || testing.Verbose() && first == 0 {
		t.Logf("%s %s: %d admitted, %d refused; the upstream produced %d of %d", c.rule, run, admitted, refused, spent, c.limit)
	}
	// The rule's counter holds exactly what was settled: the usage reported.
	checkCounter(t, c, ps[0], run, spent)
	// The promise.
	if spent > c.limit {
		t.Errorf("DEFECT? %s: budget overshot: the admitted requests cost %d, the limit is %d", run, spent, c.limit)
	}
	// Not vacuous: demand was far above the limit, so some were refused;
	// and since every reservation was settled exactly (the upstream reported
	// what was reserved), the budget is full up to less than the largest
	// input plus min_output.
	if refused == 0 {
		t.Errorf("%s: no request refused: the test did not reach the limit", run)
	}
	if slack := c.limit - spent; slack >= c.cost(maxEst, c.minOut) {
		t.Errorf("%s: %d left unspent after refusals, want less than one input plus min_output (%d)", run, slack, c.cost(maxEst, c.minOut))
	}
}

// checkClampedRequest checks one admitted request: the cap it carried
// upstream, the header its answer carried, and every other byte.
func checkClampedRequest(t *testing.T, c clampCase, o clampOutcome, h greedyHit) {
	t.Helper()
	v := o.v
	sent := v.sent()
	what := o.id + " (" + v.name + ")"
	if h.capVal < 1 {
		t.Errorf("%s: forwarded without a whole-number output cap: %s", what, h.body)
		return
	}
	if h.capVal < c.minOut {
		t.Errorf("%s: forwarded with cap %d, below min_output %d", what, h.capVal, c.minOut)
	}
	wantName := v.capName
	if wantName == "" {
		wantName = v.addName
	}
	if h.capName != wantName {
		t.Errorf("%s: the upstream got the cap as %q, want %q: %s", what, h.capName, wantName, h.body)
	}
	lowered := true
	if v.capName != "" {
		if asked, err := strconv.ParseInt(v.capDigits, 10, 64); err == nil {
			if h.capVal > asked {
				t.Errorf("%s: cap raised from %d to %d", what, asked, h.capVal)
			}
			lowered = h.capVal != asked
		} else if f, err := strconv.ParseFloat(strings.Trim(v.capDigits, `"`), 64); err == nil && float64(h.capVal) > f {
			// Not a whole number (1e9, a string): always replaced (the
			// header says so), never by more than it asked.
			t.Errorf("%s: cap %s replaced by %d, more than it asked", what, v.capDigits, h.capVal)
		}
	} else if h.capVal > c.reserve {
		t.Errorf("%s: no cap named, got %d, more than OUTPUT_TOKEN_RESERVE %d", what, h.capVal, c.reserve)
	}
	if lowered {
		if want := strconv.FormatInt(h.capVal, 10); len(o.clamped) != 1 || o.clamped[0] != want {
			t.Errorf("%s: x-ratelimit-output-clamped %q, want %q (the cap sent)", what, o.clamped, want)
		}
	} else if len(o.clamped) != 0 {
		t.Errorf("%s: cap kept, yet x-ratelimit-output-clamped %q", what, o.clamped)
	}

	// The body: byte for byte, but for the cap's digits (and the
	// stream_options the proxy adds for usage when the client asked none).
	if v.stream && !v.usageAsked {
		var got, want map[string]any
		if json.Unmarshal(h.body, &got) != nil || json.Unmarshal(sent, &want) != nil {
			t.Errorf("%s: forwarded body is not JSON: %s", what, h.body)
			return
		}
		so, _ := got["stream_options"].(map[string]any)
		if so["include_usage"] != true {
			t.Errorf("%s: stream forwarded without include_usage: %s", what, h.body)
		}
		delete(got, "stream_options")
		want[wantName] = float64(h.capVal)
		if !reflect.DeepEqual(got, want) {
			t.Errorf("%s: forwarded body changed beyond the cap:\nsent %s\ngot  %s", what, sent, h.body)
		}
		if bytes.Contains(o.body, []byte(`"usage"`)) {
			t.Errorf("%s: the client got a usage it did not ask for:\n%s", what, o.body)
		}
		return
	}
	if v.capName != "" {
		want := strings.Replace(v.body, "%CAP%", strconv.FormatInt(h.capVal, 10), 1)
		if string(h.body) != want {
			t.Errorf("%s: forwarded body differs beyond the cap digits:\nwant %s\ngot  %s", what, want, h.body)
		}
		return
	}
	base := strings.TrimSuffix(string(sent), "}")
	rest, ok := strings.CutPrefix(string(h.body), base)
	m := capAppended.FindStringSubmatch(rest)
	if !ok || m == nil || m[1] != wantName || m[2] != strconv.FormatInt(h.capVal, 10) {
		t.Errorf("%s: want the client's bytes with %q appended as the last member:\nsent %s\ngot  %s", what, wantName, sent, h.body)
	}
}

func clampEnv(c clampCase) map[string]string {
	return map[string]string{"CHAT_RPM": "100000", "OUTPUT_TOKEN_RESERVE": strconv.FormatInt(c.reserve, 10), "MAX_INPUT_TOKENS": "100000",
		"PROTECTED_PATHS": "/v1/chat/completions,/v1/messages,/v1/responses"}
}

func TestPromiseClampTokensInMemory(t *testing.T) {
	t.Parallel()
	g := newGreedyUpstream(t)
	p := startProxy(t, g.srv, clampEnv(clampTokens), "-config", writeRules(t, clampTokens.file))
	checkRulesListing(t, p, "clamp-total", "clamp", 16, float64(clampTokens.reserve))
	runClampPromise(t, clampTokens, []*proc{p}, g)
}

func TestPromiseClampTokensTwoInstancesOneRedis(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	g := newGreedyUpstream(t)
	env := clampEnv(clampTokens)
	env["REDIS_URL"], env["REDIS_TIMEOUT"] = srv.URL(), "2s"
	cfg := writeRules(t, clampTokens.file)
	ps := []*proc{startProxy(t, g.srv, env, "-config", cfg), startProxy(t, g.srv, env, "-config", cfg)}
	runClampPromise(t, clampTokens, ps, g)
}

func TestPromiseClampUSDInMemory(t *testing.T) {
	t.Parallel()
	g := newGreedyUpstream(t)
	p := startProxy(t, g.srv, clampEnv(clampUSD), "-config", writeRules(t, clampUSD.file))
	checkRulesListing(t, p, "clamp-usd", "clamp", 16, float64(clampUSD.reserve))
	runClampPromise(t, clampUSD, []*proc{p}, g)
}

func TestPromiseClampUSDTwoInstancesOneRedis(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	g := newGreedyUpstream(t)
	env := clampEnv(clampUSD)
	env["REDIS_URL"], env["REDIS_TIMEOUT"] = srv.URL(), "2s"
	cfg := writeRules(t, clampUSD.file)
	ps := []*proc{startProxy(t, g.srv, env, "-config", cfg), startProxy(t, g.srv, env, "-config", cfg)}
	runClampPromise(t, clampUSD, ps, g)
}

// checkRulesListing checks GET /admin/rules' output options of one rule
// (reserve: a number, or the string "learned").
func checkRulesListing(t *testing.T, p *proc, rule, output string, minOutput float64, reserve any) {
	t.Helper()
	r := p.do(t, http.MethodGet, p.adminURL("/admin/rules"), nil)
	wantStatus(t, r, 200)
	rules, _ := r.json(t)["rules"].([]any)
	for _, x := range rules {
		m, _ := x.(map[string]any)
		if m["name"] != rule {
			continue
		}
		if m["output"] != output {
			t.Errorf("/admin/rules %s: output %v, want %q", rule, m["output"], output)
		}
		if output == "clamp" && num(m["min_output"]) != minOutput {
			t.Errorf("/admin/rules %s: min_output %v, want %v", rule, m["min_output"], minOutput)
		}
		if m["output_reserve"] != reserve {
			t.Errorf("/admin/rules %s: output_reserve %#v, want %#v", rule, m["output_reserve"], reserve)
		}
		return
	}
	t.Errorf("/admin/rules does not list %s: %s", rule, r.body)
}

// ---------------------------------------------------------------------------
// 2. OUTPUT_TOKEN_RESERVE = "learned": a request naming no cap reserves the
// nearest-rank 95th percentile of its model's last 1000 settled outputs,
// never below OUTPUT_TOKEN_RESERVE_MIN, which is also the reserve until 100
// have settled.

const learnedFile = `
[[rule]]
name   = "learn-clamp"
key    = ["header:X-Run"]
cost   = "total_tokens"
output = "clamp"
limit  = 100000000
window = "1h"
when   = { "header:X-Rule" = "clamp" }

[[rule]]
name   = "learn-budget"
key    = ["header:X-Run"]
cost   = "total_tokens"
limit  = 100000000
window = "1h"
when   = { "header:X-Rule" = "budget" }
`

const learnedMin = 200

// learnedReserve is what the contract says the reserve is, from the
// outputs settled for one model, oldest first.
func learnedReserve(outputs []int64) int64 {
	if len(outputs) < 100 {
		return learnedMin
	}
	if len(outputs) > 1000 {
		outputs = outputs[len(outputs)-1000:]
	}
	s := append([]int64(nil), outputs...)
	sort.Slice(s, func(i, j int) bool { return s[i] < s[j] })
	rank := int(math.Ceil(0.95 * float64(len(s))))
	return max(s[rank-1], learnedMin)
}

func learnBody(model string, capTokens int) []byte {
	b := `{"model":"` + model + `","messages":[{"role":"user","content":"Summarise the history of lighthouses."}]`
	if capTokens > 0 {
		b += `,"max_tokens":` + strconv.Itoa(capTokens)
	}
	return []byte(b + "}")
}

func TestPromiseLearnedReserve(t *testing.T) {
	t.Parallel()
	const path = "/v1/chat/completions"
	const model, small = "gpt-4o-mini", "gpt-4.1-nano"
	g := newGreedyUpstream(t)
	p := startProxy(t, g.srv, map[string]string{"CHAT_RPM": "100000", "OUTPUT_TOKEN_RESERVE": "learned",
		"OUTPUT_TOKEN_RESERVE_MIN": strconv.Itoa(learnedMin)}, "-config", writeRules(t, learnedFile))
	checkRulesListing(t, p, "learn-clamp", "clamp", 16, "learned")
	checkRulesListing(t, p, "learn-budget", "reserve", 16, "learned")

	est := estimate(t, p, model, path, learnBody(model, 0))
	outputs := func(m string) []int64 {
		var out []int64
		for _, h := range g.all() {
			if h.model == m {
				out = append(out, h.completion)
			}
		}
		return out
	}
	metric := func(m string) float64 {
		return sample(t, p, fmt.Sprintf(`ratelimit_proxy_output_reserve_tokens{model=%q}`, m))
	}
	waitReserve := func(m string, want int64) {
		t.Helper()
		var got float64
		if !waitFor(5*time.Second, func() bool { got = metric(m); return got == float64(want) }) {
			t.Fatalf("ratelimit_proxy_output_reserve_tokens{model=%q} = %v, want %d (from %d settled outputs)", m, got, want, len(outputs(m)))
		}
	}
	// probe sends a request naming no cap through the clamping rule to an
	// upstream that would write out; under clamp the reserve is the cap sent.
	probe := func(m string, out int64) int64 {
		t.Helper()
		r := p.do(t, http.MethodPost, p.url(path), learnBody(m, 0), "X-Rule", "clamp", "X-Run", "c",
			"X-Out", strconv.FormatInt(out, 10), "X-Est", strconv.FormatInt(est, 10))
		wantStatus(t, r, 200)
		hits := g.all()
		h := hits[len(hits)-1]
		if h.capName != "max_tokens" || h.capVal < 1 {
			t.Fatalf("a request naming no cap was forwarded without one: %s", h.body)
		}
		wantHeader(t, r, "X-Ratelimit-Output-Clamped", strconv.FormatInt(h.capVal, 10))
		return h.capVal
	}
	// learn sends n requests of model with a cap of 5000 whose answers
	// write out(i) tokens, 8 at a time.
	learn := func(m string, n int, out func(i int) int64) {
		t.Helper()
		var wg sync.WaitGroup
		var next atomic.Int64
		errs := make(chan string, n)
		for range 8 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for {
					i := int(next.Add(1)) - 1
					if i >= n {
						return
					}
					res := send(context.Background(), p, http.MethodPost, path, learnBody(m, 5000), "X-Rule", "clamp", "X-Run", "c",
						"X-Out", strconv.FormatInt(out(i), 10), "X-Est", strconv.FormatInt(est, 10))
					if res.err != nil || res.r.StatusCode != 200 {
						errs <- fmt.Sprintf("learning request %d: %v %v", i, res.err, res.r)
					}
				}
			}()
		}
		wg.Wait()
		close(errs)
		for e := range errs {
			t.Fatal(e)
		}
	}

	// Nothing learned: the floor.
	if got := probe(model, 50); got != learnedMin {
		t.Fatalf("nothing learned: a request naming no cap was sent cap %d, want OUTPUT_TOKEN_RESERVE_MIN %d", got, learnedMin)
	}
	waitReserve(model, learnedMin)
	// 99 settled: still the floor.
	learn(model, 98, func(i int) int64 { return int64(401 + i) })
	if got := probe(model, 150); got != learnedMin {
		t.Fatalf("99 settled: cap %d, want the floor %d until 100 have settled", got, learnedMin)
	}
	// 100 settled: the 95th percentile.
	want := learnedReserve(outputs(model))
	if len(outputs(model)) != 100 || want <= learnedMin {
		t.Fatalf("test setup: %d outputs, p95 %d", len(outputs(model)), want)
	}
	waitReserve(model, want)
	if got := probe(model, 100000); got != want {
		t.Fatalf("100 settled: cap %d, want the p95 %d", got, want)
	}
	// The model now writes ~900: the reserve follows.
	learn(model, 110, func(int) int64 { return 900 })
	want = learnedReserve(outputs(model))
	if want != 900 {
		t.Fatalf("test setup: p95 %d, want 900", want)
	}
	waitReserve(model, want)
	if got := probe(model, 900); got != want {
		t.Fatalf("after 900s: cap %d, want %d", got, want)
	}

	// What a (non-clamping) budget reserves: the estimate plus the learned
	// reserve, seen in the remaining tokens, then in what fits the limit.
	budget := func(run string) *response {
		return p.do(t, http.MethodPost, p.url(path), learnBody(model, 0), "X-Rule", "budget", "X-Run", run,
			"X-Out", "900", "X-Est", strconv.FormatInt(est, 10))
	}
	R := learnedReserve(outputs(model))
	r := budget("b1")
	wantStatus(t, r, 200)
	if got, want := num(r.Header.Get("X-Ratelimit-Remaining-Tokens")), float64(100000000-est-R); got != want {
		t.Errorf("budget: remaining tokens after admission %v, want limit − estimate − learned reserve = %v", got, want)
	}
	R = learnedReserve(outputs(model))
	waitReserve(model, R)
	setLimit := func(n int64) {
		t.Helper()
		r := p.do(t, http.MethodPut, p.adminURL("/admin/rules/learn-budget"), []byte(fmt.Sprintf(`{"limit":%d}`, n)))
		wantStatus(t, r, 200)
	}
	setLimit(est + R - 1)
	r = budget("b2")
	wantStatus(t, r, http.StatusRequestEntityTooLarge)
	if m := r.json(t); field(m, "error", "code") != "input_too_large" || num(m["estimated_tokens"]) != float64(est+R) {
		t.Errorf("budget of estimate+reserve−1: want 413 input_too_large with estimated_tokens %d: %s", est+R, r.body)
	}
	setLimit(est + R)
	r = budget("b3")
	wantStatus(t, r, 200)
	if got := r.Header.Get("X-Ratelimit-Remaining-Tokens"); got != "0" {
		t.Errorf("budget of exactly estimate+reserve: remaining %q after admission, want 0", got)
	}
	if h := g.all(); h[len(h)-1].capVal != -1 {
		t.Errorf("a reserve rule wrote a cap into the body: %s", h[len(h)-1].body)
	}

	// A model that writes little: its p95 is below the floor, the floor holds,
	// and each model is learned apart.
	learn(small, 120, func(int) int64 { return 20 })
	waitReserve(small, learnedMin)
	if got := probe(small, 20); got != learnedMin {
		t.Errorf("a model writing 20: cap %d, want the floor %d", got, learnedMin)
	}
	waitReserve(model, learnedReserve(outputs(model)))

	// Answers of n > 1 choices are not one answer's output: left out, so
	// 150 of them teach nothing.
	const multi = "gpt-4o-2024-08-06"
	for i := range 150 {
		res := send(context.Background(), p, http.MethodPost, path,
			[]byte(`{"model":"`+multi+`","n":2,"max_tokens":5000,"messages":[{"role":"user","content":"Summarise the history of lighthouses."}]}`),
			"X-Rule", "clamp", "X-Run", "c", "X-Out", "700", "X-Est", strconv.FormatInt(est, 10))
		if res.err != nil || res.r.StatusCode != 200 {
			t.Fatalf("n=2 request %d: %v %v", i, res.err, res.r)
		}
	}
	if got := probe(multi, 700); got != learnedMin {
		t.Errorf("after 150 answers of n=2: a request naming no cap was sent %d, want the floor %d (n > 1 is left out)", got, learnedMin)
	}

	// Only the last 1000 count: after 1000 answers of 300, the 900s are gone.
	learn(model, 1000, func(int) int64 { return 300 })
	if want := learnedReserve(outputs(model)); want != 300 {
		t.Fatalf("test setup: p95 of the last 1000 is %d", want)
	}
	waitReserve(model, 300)
	if got := probe(model, 300); got != 300 {
		t.Errorf("after 1000 answers of 300: cap %d, want 300", got)
	}
}

// ---------------------------------------------------------------------------
// 3. Fair share in an upstream group: within a priority, waiters are served
// in turns across the values of fair_by (w per turn for a plan of weight
// w); a newcomer waits at most one turn, a caller alone gets every slot.

const (
	fpOne    = "/v1/fair/chat/completions"  // max_in_flight 1
	fpWeight = "/v1/fairw/chat/completions" // max_in_flight 1, pro 3 : free 1
	fpFour   = "/v1/fair4/chat/completions" // max_in_flight 4
)

const fairFile = `
tier_from = "header:X-Plan"

[[upstream_group]]
name          = "fair"
paths         = ["/v1/fair/chat/completions"]
max_in_flight = 1
queue         = 5000
max_wait      = "60s"
fair_by       = "header:X-Team"
fair_weights  = { pro = 3, free = 1 }

[[upstream_group]]
name          = "fairw"
paths         = ["/v1/fairw/chat/completions"]
max_in_flight = 1
queue         = 5000
max_wait      = "60s"
fair_by       = "header:X-Team"
fair_weights  = { pro = 3, free = 1 }

[[upstream_group]]
name          = "fair4"
paths         = ["/v1/fair4/chat/completions"]
max_in_flight = 4
queue         = 5000
max_wait      = "60s"
fair_by       = "header:X-Team"
`

func fairKeysSeries(group string) string {
	return fmt.Sprintf(`ratelimit_proxy_upstream_queue_fair_keys{group=%q,priority="default"}`, group)
}

// grantOrder releases the held request n times, one at a time, each time
// waiting for the next request to reach the upstream; it returns the teams
// (X-Tag) in the order they reached it, the first one included.
func grantOrder(t *testing.T, u *gateUpstream, path string, n int) []string {
	t.Helper()
	heldOne(t, u, path)
	for i := range n {
		before := u.count(path)
		start := u.release(t, path)
		// The released request is done and the next one is held.
		if !waitFor(15*time.Second, func() bool { return u.count(path) == before+1 && u.inFlight(path) == 1 }) {
			t.Fatalf("grant %d: no next request reached the upstream within 15 s of a release (%d requests so far, %d in flight)", i+1, u.count(path), u.inFlight(path))
		}
		if d := time.Since(start); d > 2*time.Second {
			t.Logf("grant %d took %v after its slot was freed", i+1, d)
		}
	}
	var order []string
	for _, h := range u.hitsOf(path) {
		order = append(order, h.tag)
	}
	return order
}

// heldOne waits until exactly one request of a max_in_flight = 1 group is
// held at the upstream: no grant is on its way.
func heldOne(t *testing.T, u *gateUpstream, path string) {
	t.Helper()
	if !waitFor(15*time.Second, func() bool { return u.inFlight(path) == 1 }) {
		t.Fatalf("%s: %d requests in flight, want 1 held", path, u.inFlight(path))
	}
}

func (u *gateUpstream) inFlight(path string) int {
	u.mu.Lock()
	defer u.mu.Unlock()
	return u.cur[path]
}

// patient is p with a client that waits up to a minute: queued backlogs
// outlive the harness client's 15 s.
func patient(p *proc) *proc {
	q := *p
	q.client = &http.Client{Transport: &http.Transport{Proxy: nil, DisableCompression: true, MaxIdleConnsPerHost: 64}, Timeout: 60 * time.Second}
	return &q
}

func fairHdr(team, plan string) []string {
	h := []string{"X-Team", team, "X-Tag", team}
	if plan != "" {
		h = append(h, "X-Plan", plan)
	}
	return h
}

// sendBacklog sends n requests of a team in the background on p.
func sendBacklog(ctx context.Context, p *proc, path string, n int, team, plan string) []<-chan result {
	var out []<-chan result
	for range n {
		out = append(out, goSend(ctx, p, http.MethodPost, path, nil, fairHdr(team, plan)...))
	}
	return out
}

func runFairPromise(t *testing.T, ps []*proc, u *gateUpstream) {
	a, b := patient(ps[0]), patient(ps[len(ps)-1])
	t.Cleanup(func() {
		a.client.CloseIdleConnections()
		b.client.CloseIdleConnections()
	})

	t.Run("admin rules list fair_by and fair_weights", func(t *testing.T) {
		r := a.do(t, http.MethodGet, a.adminURL("/admin/rules"), nil)
		wantStatus(t, r, 200)
		groups, _ := r.json(t)["upstream_groups"].([]any)
		found := false
		for _, x := range groups {
			m, _ := x.(map[string]any)
			if m["name"] != "fair" {
				continue
			}
			found = true
			if m["fair_by"] != "header:X-Team" {
				t.Errorf("fair_by %v", m["fair_by"])
			}
			if w, _ := m["fair_weights"].(map[string]any); num(w["pro"]) != 3 || num(w["free"]) != 1 || len(w) != 2 {
				t.Errorf("fair_weights %v, want pro 3 free 1", m["fair_weights"])
			}
		}
		if !found {
			t.Errorf("/admin/rules lists no upstream group \"fair\": %s", r.body)
		}
	})

	t.Run("a newcomer waits at most one turn behind a backlog", func(t *testing.T) {
		ctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		first := goSend(ctx, a, http.MethodPost, fpOne, nil, fairHdr("alpha", "")...)
		u.waitHits(t, fpOne, 1, 15*time.Second)
		const backlog = 200
		_ = sendBacklog(ctx, a, fpOne, backlog, "alpha", "")
		waitDepth(t, ps, "fair", "default", backlog, 20*time.Second)
		if got := sample(t, a, fairKeysSeries("fair")); got != 1 {
			t.Errorf("%s = %v with one team waiting, want 1", fairKeysSeries("fair"), got)
		}
		single := goSend(ctx, b, http.MethodPost, fpOne, nil, fairHdr("beta", "")...)
		waitDepth(t, ps, "fair", "default", backlog+1, 15*time.Second)
		if len(ps) == 1 {
			if got := sample(t, a, fairKeysSeries("fair")); got != 2 {
				t.Errorf("%s = %v with two teams waiting, want 2", fairKeysSeries("fair"), got)
			}
		} else {
			for i, p := range ps {
				if got := sample(t, p, fairKeysSeries("fair")); got != 1 {
					t.Errorf("instance %d: %s = %v with one team waiting on it, want 1", i, fairKeysSeries("fair"), got)
				}
			}
		}
		order := grantOrder(t, u, fpOne, 2)
		t.Logf("grants: %v", order)
		if order[0] != "alpha" || (order[1] != "beta" && order[2] != "beta") {
			t.Errorf("DEFECT? beta's single request was not among the 2 grants after it queued behind %d of alpha's: %v", backlog, order)
			return
		}
		// beta's answer: a 200 once its held request is released (the
		// second release let it go if it came first).
		if order[2] == "beta" {
			u.release(t, fpOne)
		}
		wantOK(t, await(t, single, 15*time.Second, "beta's request"), "beta's request")
		wantOK(t, await(t, first, 15*time.Second, "alpha's first request"), "alpha's first request")

		// 20 turns later (alpha alone), gamma comes, and beta again: each
		// within one turn.
		_ = grantOrder(t, u, fpOne, 20)
		for _, team := range []string{"gamma", "beta"} {
			heldOne(t, u, fpOne)
			before := u.count(fpOne)
			late := goSend(ctx, b, http.MethodPost, fpOne, nil, fairHdr(team, "")...)
			if !waitFor(15*time.Second, func() bool { return sample(t, b, fairKeysSeries("fair")) >= 1 }) {
				t.Fatalf("%s's request is not queued on its instance", team)
			}
			order := grantOrder(t, u, fpOne, 2)[before:]
			t.Logf("grants after %s came: %v", team, order)
			if order[0] != team && order[1] != team {
				t.Errorf("DEFECT? %s's request, arriving after %d grants, was not among the next 2 grants: %v", team, before, order)
				return
			}
			if order[1] == team {
				u.release(t, fpOne)
			}
			wantOK(t, await(t, late, 15*time.Second, team+"'s request"), team+"'s request")
		}
		cancel() // the backlog leaves the queue
		waitDepth(t, ps, "fair", "default", 0, 20*time.Second)
	})

	t.Run("a caller who abandoned its backlog starts afresh", func(t *testing.T) {
		ctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		_ = goSend(ctx, a, http.MethodPost, fpOne, nil, fairHdr("holder", "")...)
		heldOne(t, u, fpOne)
		// delta queues 100 and gives up on all of them.
		gone, leave := context.WithCancel(ctx)
		_ = sendBacklog(gone, a, fpOne, 100, "delta", "")
		waitDepth(t, ps, "fair", "default", 100, 20*time.Second)
		leave()
		waitDepth(t, ps, "fair", "default", 0, 20*time.Second)
		// epsilon's backlog on one instance, then delta's one request on the other.
		_ = sendBacklog(ctx, a, fpOne, 30, "epsilon", "")
		waitDepth(t, ps, "fair", "default", 30, 20*time.Second)
		back := goSend(ctx, b, http.MethodPost, fpOne, nil, fairHdr("delta", "")...)
		waitDepth(t, ps, "fair", "default", 31, 15*time.Second)
		heldOne(t, u, fpOne)
		before := u.count(fpOne)
		order := grantOrder(t, u, fpOne, 2)[before:]
		t.Logf("grants after delta came back: %v", order)
		if order[0] != "delta" && order[1] != "delta" {
			t.Errorf("DEFECT? delta, back after abandoning 100 queued requests, was not among the next 2 grants behind epsilon's 30: %v", order)
			return
		}
		if order[1] == "delta" {
			u.release(t, fpOne)
		}
		wantOK(t, await(t, back, 15*time.Second, "delta's request"), "delta's request")
		cancel()
		waitDepth(t, ps, "fair", "default", 0, 20*time.Second)
	})

	t.Run("weights 3:1 share the grants 3:1", func(t *testing.T) {
		ctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		_ = goSend(ctx, a, http.MethodPost, fpWeight, nil, fairHdr("zeta", "")...)
		u.waitHits(t, fpWeight, 1, 15*time.Second)
		const each = 40
		_ = sendBacklog(ctx, a, fpWeight, each, "pro-team", "pro")
		waitDepth(t, ps, "fairw", "default", each, 20*time.Second)
		_ = sendBacklog(ctx, b, fpWeight, each, "free-team", "free")
		waitDepth(t, ps, "fairw", "default", 2*each, 20*time.Second)
		const window = 40
		order := grantOrder(t, u, fpWeight, window)[1:]
		t.Logf("grants: %v", order)
		pro := 0
		for i, team := range order {
			if team == "pro-team" {
				pro++
			}
			if i > 0 && team == "free-team" && order[i-1] == "free-team" {
				t.Errorf("DEFECT? free (weight 1) got two grants in a row at %d while pro (weight 3) waited: %v", i, order)
			}
		}
		if pro < 3*window/4-3 || pro > 3*window/4+3 {
			t.Errorf("DEFECT? pro got %d of %d grants with weights 3:1, want %d ± 3: %v", pro, window, 3*window/4, order)
		}
		cancel()
		waitDepth(t, ps, "fairw", "default", 0, 20*time.Second)
	})

	t.Run("a team alone gets the whole capacity", func(t *testing.T) {
		ctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		const n = 20
		for i := range n {
			_ = goSend(ctx, ps[i%len(ps)], http.MethodPost, fpFour, nil, fairHdr("lone", "")...)
		}
		cur := func() int {
			u.mu.Lock()
			defer u.mu.Unlock()
			return u.cur[fpFour]
		}
		u.waitHits(t, fpFour, 4, 15*time.Second)
		waitDepth(t, ps, "fair4", "default", n-4, 20*time.Second)
		for i := range 8 {
			before := u.count(fpFour)
			u.release(t, fpFour)
			u.waitHits(t, fpFour, before+1, 15*time.Second)
			if !waitFor(10*time.Second, func() bool { return cur() == 4 }) {
				t.Fatalf("after release %d: %d in flight while the lone team has waiters, want 4", i+1, cur())
			}
		}
		if pk := u.peakOf(fpFour); pk != 4 {
			t.Errorf("peak in flight %d, want 4 (max_in_flight)", pk)
		}
		cancel()
		waitDepth(t, ps, "fair4", "default", 0, 20*time.Second)
	})
}

func fairEnv() map[string]string {
	return map[string]string{"CHAT_RPM": "1000000", "PROTECTED_PATHS": strings.Join([]string{fpOne, fpWeight, fpFour}, ","),
		"SHUTDOWN_TIMEOUT": "2s"}
}

func TestPromiseFairShareInMemory(t *testing.T) {
	t.Parallel()
	u := newGateUpstream(t, []string{fpOne, fpWeight, fpFour}, nil)
	p := startProxy(t, u.srv.URL, fairEnv(), "-config", writeRules(t, fairFile))
	t.Cleanup(u.unblock)
	runFairPromise(t, []*proc{p}, u)
}

func TestPromiseFairShareTwoInstancesOneRedis(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	u := newGateUpstream(t, []string{fpOne, fpWeight, fpFour}, nil)
	env := fairEnv()
	env["REDIS_URL"], env["REDIS_TIMEOUT"] = srv.URL(), "2s"
	cfg := writeRules(t, fairFile)
	ps := []*proc{startProxy(t, u.srv.URL, env, "-config", cfg), startProxy(t, u.srv.URL, env, "-config", cfg)}
	t.Cleanup(u.unblock)
	runFairPromise(t, ps, u)
}

// checkCounter reads the budget's counter of one run through the admin API
// (?top lists every key holding something) and compares it with what the
// upstream reported, in tokens or micro-dollars.
func checkCounter(t *testing.T, c clampCase, p *proc, run string, spent int64) {
	t.Helper()
	r := p.do(t, http.MethodGet, p.adminURL("/admin/limits/"+c.rule+"?top=1000"), nil)
	wantStatus(t, r, 200)
	keys, _ := r.json(t)["keys"].([]any)
	for _, x := range keys {
		m, _ := x.(map[string]any)
		k, _ := m["key"].(string)
		if k != run && !strings.HasSuffix(k, "="+run) && !strings.HasSuffix(k, ":"+run) {
			continue
		}
		used := num(m["used"])
		if c.rule == "clamp-usd" {
			used = math.Round(used * 1e6)
		}
		if used != float64(spent) {
			t.Errorf("%s: the counter of %s shows %v used, the upstream reported %d", run, k, m["used"], spent)
		}
		return
	}
	t.Errorf("%s: /admin/limits/%s?top=1000 lists no key of the run: %s", run, c.rule, r.body)
}
