package tests

import (
	"bytes"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ratelimit-proxy/ratelimit-proxy/internal/redistest"
	"github.com/ratelimit-proxy/ratelimit-proxy/tokens"
	"github.com/ratelimit-proxy/ratelimit-proxy/upstream/mockapi"
)

// budgetFile is the token-budget group the end-to-end tests run on every
// store: an input budget shared by everyone, a total budget per caller.
const budgetFile = `
[[rule]]
name   = "input-global"
paths  = ["/v1/embeddings"]
cost   = "input_tokens"
key    = ["global", "header:X-Run"]
limit  = 1000
window = "1h"

[price."gpt-4o*"]
input  = 2.50
output = 10.00

[[rule]]
name   = "spend-global"
paths  = ["/v1/responses"]
cost   = "usd"
key    = ["global", "header:X-Run"]
limit  = 0.1
window = "1h"

[[rule]]
name   = "total-per-caller"
paths  = ["/v1/chat/completions"]
cost   = "total_tokens"
limit  = 20000
window = "1h"
`

func mockUpstream(t *testing.T) string {
	s := httptest.NewServer(mockapi.NewWithOptions(mockapi.Options{}))
	t.Cleanup(s.Close)
	return s.URL
}

// mockUsage is what the mock reports for a chat body (asked directly).
func mockUsage(t *testing.T, upstream string, body []byte) int64 {
	t.Helper()
	res, err := http.Post(upstream+"/v1/chat/completions", "application/json", bytes.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	var v struct {
		Usage struct {
			TotalTokens int64 `json:"total_tokens"`
		} `json:"usage"`
	}
	if err := json.NewDecoder(res.Body).Decode(&v); err != nil || v.Usage.TotalTokens == 0 {
		t.Fatalf("mock usage: %v %+v", err, v)
	}
	return v.Usage.TotalTokens
}

func runBudgetGroup(t *testing.T, ps []*proc, upstream, tag string, exact bool) {
	pick := func(i int) *proc { return ps[i%len(ps)] }
	tk := tokens.New()

	t.Run("input budget never overshot", func(t *testing.T) {
		body := []byte(`{"model":"text-embedding-3-small","input":"The quick brown fox jumps over the lazy dog, again and again."}`)
		est, err := tk.Estimate(tokens.Request{Format: tokens.FormatEmbeddings, ContentType: "application/json",
			Body: []byte(body)}, -1)
		if err != nil {
			t.Fatal(err)
		}
		var ok atomic.Int64
		var wg sync.WaitGroup
		for i := range 120 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				r := pick(i).do(t, http.MethodPost, pick(i).url("/v1/embeddings"), body, "X-Run", tag)
				if r.StatusCode == 200 {
					ok.Add(1)
				}
			}()
		}
		wg.Wait()
		want := int64(1000 / est.Tokens)
		if ok.Load() > want || exact && ok.Load() != want {
			t.Fatalf("%d admitted at %d tokens against 1000: want %d", ok.Load(), est.Tokens, want)
		}
	})

	t.Run("spend never overshot", func(t *testing.T) {
		// 100 concurrent requests reserving 2 500 µ$ + their input each
		// (250 output tokens at $10/M) against $0.10: never more than fits.
		body := []byte(`{"model":"gpt-4o-mini","max_output_tokens":250,"input":"Say hello"}`)
		est, err := tk.Estimate(tokens.Request{Format: tokens.FormatResponses, ContentType: "application/json",
			Body: []byte(body)}, -1)
		if err != nil {
			t.Fatal(err)
		}
		reserve := (int64(est.Tokens)*2_500_000 + 250*10_000_000 + 999_999) / 1_000_000
		var ok atomic.Int64
		var wg sync.WaitGroup
		for i := range 100 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				r := pick(i).do(t, http.MethodPost, pick(i).url("/v1/responses"), body, "X-Run", tag+"-usd")
				if r.StatusCode == 200 {
					ok.Add(1)
				} else if r.StatusCode != 429 || field(r.json(t), "error", "code") != "insufficient_quota" {
					t.Errorf("%d %s", r.StatusCode, r.body)
				}
			}()
		}
		wg.Wait()
		// Settlements refund while others decide: at least what fits at
		// once is admitted, and never a reservation past the limit.
		if ok.Load() < 100_000/reserve {
			t.Fatalf("%d admitted at %d µ$ against 100 000 µ$", ok.Load(), reserve)
		}
		// What was spent, settled to the usage, stays within the limit:
		// every output was within its reservation.
		var spent float64
		for _, p := range ps {
			spent += sample(t, p, `ratelimit_proxy_spend_usd_total{model="gpt-4o-mini",rule="spend-global"}`)
		}
		if spent <= 0 || spent > 0.1+1e-9 {
			t.Fatalf("spent $%v against $0.10 (%d admitted)", spent, ok.Load())
		}
	})

	t.Run("total budget settled to usage", func(t *testing.T) {
		key := "Bearer total-" + tag
		probe := []byte(`{"model":"gpt-4o-mini","max_tokens":1,"messages":[{"role":"user","content":"hi"}]}`)
		probeUsed := mockUsage(t, upstream, probe)
		settled := func(p *proc) float64 {
			return sample(t, p, `ratelimit_proxy_tokens_settled_total{rule="total-per-caller"}`)
		}
		// waitSettled waits for p's settled tokens to pass from, and
		// returns how many were added.
		waitSettled := func(p *proc, from float64) float64 {
			t.Helper()
			var now float64
			if !waitFor(5*time.Second, func() bool { now = settled(p); return now > from }) {
				t.Fatalf("nothing settled on %s", p.public)
			}
			return now - from
		}
		for _, stream := range []bool{false, true} {
			body := fmt.Sprintf(`{"model":"gpt-4o-mini","max_tokens":3000,"stream":%t,"messages":[{"role":"user","content":"Write about %s"}]}`, stream, tag)
			used := mockUsage(t, upstream, []byte(strings.Replace(body, `"stream":true`, `"stream":false`, 1)))

			s0 := settled(pick(0))
			r1 := pick(0).do(t, http.MethodPost, pick(0).url("/v1/chat/completions"), probe, "Authorization", key)
			wantStatus(t, r1, 200)
			if got := waitSettled(pick(0), s0); got != float64(probeUsed) {
				t.Fatalf("probe settled to %v, want %d", got, probeUsed)
			}
			s1 := settled(pick(1))
			r := pick(1).do(t, http.MethodPost, pick(1).url("/v1/chat/completions"), []byte(body), "Authorization", key)
			wantStatus(t, r, 200)
			if stream && bytes.Contains(r.body, []byte(`"usage"`)) {
				t.Fatalf("the client did not ask for usage and got it:\n%s", r.body)
			}
			if got := waitSettled(pick(1), s1); got != float64(used) {
				t.Fatalf("stream=%t: settled to %v, want the usage %d", stream, got, used)
			}
			s2 := settled(pick(0))
			r2 := pick(0).do(t, http.MethodPost, pick(0).url("/v1/chat/completions"), probe, "Authorization", key)
			wantStatus(t, r2, 200)
			waitSettled(pick(0), s2) // before the next round's probe
			// Between the probes' decisions: the first probe's refund to
			// its usage, the request's settled charge, the second probe's
			// reservation (the same as the first's).
			gone := num(r1.Header.Get("X-Ratelimit-Remaining-Tokens")) - num(r2.Header.Get("X-Ratelimit-Remaining-Tokens"))
			if gone != float64(probeUsed+used) {
				t.Fatalf("stream=%t: %v tokens gone between the probes, want %d + %d", stream, gone, probeUsed, used)
			}
		}
	})
}

func TestBudgetsInMemory(t *testing.T) {
	t.Parallel()
	up := mockUpstream(t)
	p := startProxy(t, up, nil, "-config", writeRules(t, budgetFile))
	runBudgetGroup(t, []*proc{p}, up, "mem", true)
}

func TestBudgetsTwoInstancesOneRedis(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	up := mockUpstream(t)
	env := map[string]string{"REDIS_URL": srv.URL(), "REDIS_TIMEOUT": "1s"}
	cfg := writeRules(t, budgetFile)
	ps := []*proc{startProxy(t, up, env, "-config", cfg), startProxy(t, up, env, "-config", cfg)}
	runBudgetGroup(t, ps, up, "redis", true)
}

func TestBudgetsOnRedisCluster(t *testing.T) {
	c := redistest.StartCluster(t, redistest.ClusterOptions{Masters: 3})
	up := mockUpstream(t)
	env := map[string]string{"REDIS_URL": c.URL(), "REDIS_TIMEOUT": "1s"}
	cfg := writeRules(t, budgetFile)
	ps := []*proc{startProxy(t, up, env, "-config", cfg), startProxy(t, up, env, "-config", cfg)}
	runBudgetGroup(t, ps, up, "cluster", false)
}
