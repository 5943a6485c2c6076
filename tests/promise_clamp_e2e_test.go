package tests

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"math"
	"net/http"
	"reflect"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// An independent, black-box check of three promises of the product, written
// from the contract and the user documentation only (budgets.md: "Budgets
// that are never overshot" and "A reserve learned per model"; upstream.md:
// "Fair share"). Every test drives the real binary over TCP in front of an
// upstream written here. One file a promise (promise_clamp, _learned,
// _fair); the greedy upstream is promise_greedy_e2e_test.go.

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

// The clamp promise for a token budget and a money budget, on one
// instance in memory and on two instances sharing one Redis.
func TestPromiseClamp(t *testing.T) {
	for _, c := range []struct {
		name string
		cc   clampCase
		rule string
	}{{"tokens", clampTokens, "clamp-total"}, {"usd", clampUSD, "clamp-usd"}} {
		t.Run(c.name+"/memory", func(t *testing.T) {
			t.Parallel()
			g := newGreedyUpstream(t)
			p := startProxy(t, g.srv, clampEnv(c.cc), "-config", writeRules(t, c.cc.file))
			checkRulesListing(t, p, c.rule, "clamp", 16, float64(c.cc.reserve))
			runClampPromise(t, c.cc, []*proc{p}, g)
		})
		t.Run(c.name+"/two instances on one redis", func(t *testing.T) {
			t.Parallel()
			g := newGreedyUpstream(t)
			runClampPromise(t, c.cc, twoOnOneRedis(t, g.srv, clampEnv(c.cc), c.cc.file), g)
		})
	}
}
