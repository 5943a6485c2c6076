package tests

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"reflect"
	"regexp"
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
	h.completion = out
	g.mu.Lock()
	g.hits = append(g.hits, h)
	g.mu.Unlock()

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
	usageAsked bool // the client set stream_options.include_usage itself
	model      string
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
key    = ["global"]
cost   = "total_tokens"
output = "clamp"
limit  = 60000
window = "1h"
`,
}

var clampUSD = clampCase{
	// $0.05 at $2.50/M input and $10/M output: 2.5 µ$ an input token,
	// 10 µ$ an output token.
	rule: "clamp-usd", limit: 50000, minOut: 16, reserve: 500, refusal: "insufficient_quota",
	variants: clampVariants[:7], // priced models only
	cost:     func(p, c int64) int64 { return (5*p+1)/2 + 10*c },
	file: `
[price."gpt-4o*"]
input  = 2.50
output = 10.00

[[rule]]
name   = "clamp-usd"
key    = ["global"]
cost   = "usd"
output = "clamp"
limit  = 0.05
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
	const path = "/v1/chat/completions"
	est := make([]int64, len(c.variants))
	var maxEst int64
	for i, v := range c.variants {
		est[i] = estimate(t, ps[0], v.model, path, v.sent())
		maxEst = max(maxEst, est[i])
		if len(ps) > 1 {
			if e := estimate(t, ps[1], v.model, path, v.sent()); e != est[i] {
				t.Fatalf("%s: the instances estimate %d and %d", v.name, est[i], e)
			}
		}
	}

	// 150 moderate requests first (small, mid, no cap, the streams), then
	// 90 of every shape, the huge caps among them; 24 clients at once.
	var order []int
	moderate := []int{0, 1, 2, 4, 5}
	for i := range 150 {
		order = append(order, moderate[i%len(moderate)])
	}
	for i := range 90 {
		order = append(order, i%len(c.variants))
	}
	outs := make([]clampOutcome, len(order))
	var next atomic.Int64
	var wg sync.WaitGroup
	ctx, cancel := context.WithTimeout(context.Background(), 25*time.Second)
	defer cancel()
	for w := range 24 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				i := int(next.Add(1)) - 1
				if i >= len(order) {
					return
				}
				vi := order[i]
				v := c.variants[vi]
				id := fmt.Sprintf("r%d", i)
				res := send(ctx, ps[(i+w)%len(ps)], http.MethodPost, path, v.sent(),
					"X-Req-Id", id, "X-Est", strconv.FormatInt(est[vi], 10))
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
				outs[i] = o
			}
		}()
	}
	wg.Wait()

	hits := g.byID()
	var spent int64
	for _, h := range g.all() {
		spent += c.cost(h.prompt, h.completion)
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
	if got := len(g.all()); got != admitted {
		t.Errorf("the upstream saw %d requests, %d were admitted", got, admitted)
	}
	t.Logf("%s: %d admitted, %d refused; the upstream produced %d of %d", c.rule, admitted, refused, spent, c.limit)
	// The promise.
	if spent > c.limit {
		t.Errorf("DEFECT? budget overshot: the admitted requests cost %d, the limit is %d", spent, c.limit)
	}
	// Not vacuous: demand was far above the limit, so some were refused;
	// and since every reservation was settled exactly (the upstream reported
	// what was reserved), the budget is full up to less than the largest
	// input plus min_output.
	if refused == 0 {
		t.Errorf("no request refused: the test did not reach the limit")
	}
	if slack := c.limit - spent; slack >= c.cost(maxEst, c.minOut) {
		t.Errorf("%d left unspent after refusals, want less than one input plus min_output (%d)", slack, c.cost(maxEst, c.minOut))
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
		asked, _ := strconv.ParseInt(v.capDigits, 10, 64)
		if h.capVal > asked {
			t.Errorf("%s: cap raised from %d to %d", what, asked, h.capVal)
		}
		lowered = h.capVal != asked
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
	return map[string]string{"CHAT_RPM": "100000", "OUTPUT_TOKEN_RESERVE": strconv.FormatInt(c.reserve, 10), "MAX_INPUT_TOKENS": "100000"}
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
