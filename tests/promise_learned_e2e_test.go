package tests

import (
	"context"
	"fmt"
	"math"
	"net/http"
	"sort"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

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
