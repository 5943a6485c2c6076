package proxy_test

import (
	"encoding/json"
	"strings"
	"testing"
)

const spendDollar = `
[price."gpt-4o*"]
input  = 2.50
output = 10.00

[[rule]]
name   = "spend"
key    = ["api_key"]
cost   = "usd"
limit  = 1.00
window = "24h"
`

// A background response answers "queued" with no usage and is generated
// later, fetched past the proxy: its whole reservation is its charge, so
// five of them cannot run on a dollar (SPEC §8.1).
func TestSpendBackgroundKeepsReservation(t *testing.T) {
	_, url := newLLM(t)
	f := newFixture(t, budgetRules(t, url, spendDollar)...)
	body := `{"model":"gpt-4o","input":"Write a long essay.","max_output_tokens":90000,"background":true}`
	var codes []int
	for range 5 {
		w := f.send("/v1/responses", "203.0.113.7:1", "application/json", body, "Authorization", "Bearer kb")
		codes = append(codes, w.Code)
	}
	if codes[0] != 200 || codes[1] != 429 {
		t.Fatalf("codes %v: the second background request must be refused ($0.90 kept of $1)", codes)
	}
	// Without background the reservation is refunded to what was used.
	fg := `{"model":"gpt-4o","input":"Write a long essay.","max_output_tokens":90000}`
	for i := range 3 {
		w := f.send("/v1/responses", "203.0.113.7:1", "application/json", fg, "Authorization", "Bearer kf")
		if w.Code != 200 {
			var m map[string]any
			json.Unmarshal(w.Body.Bytes(), &m)
			t.Fatalf("foreground %d: %d %v", i, w.Code, m)
		}
	}
}

// Input the provider holds (a previous response, a conversation, a stored
// prompt) cannot be reserved: a usd or total_tokens rule refuses it, and
// without such a rule it passes.
func TestSpendHiddenInputRefused(t *testing.T) {
	_, url := newLLM(t)
	f := newFixture(t, budgetRules(t, url, spendDollar+`
[[rule]]
name   = "tpm"
key    = ["api_key"]
cost   = "total_tokens"
limit  = 100000
window = "1m"
paths  = ["/v1/chat/completions"]
`)...)
	for _, extra := range []string{`"previous_response_id":"resp_1"`, `"conversation":"conv_1"`, `"conversation":{"id":"conv_1"}`,
		`"prompt":{"id":"pmpt_1","version":"2"}`} {
		body := `{"model":"gpt-4o","input":"and then?","max_output_tokens":100,` + extra + `}`
		before := f.upstream.Load()
		w := f.send("/v1/responses", "203.0.113.7:1", "application/json", body, "Authorization", "Bearer kh")
		var m map[string]any
		json.Unmarshal(w.Body.Bytes(), &m)
		if w.Code != 400 || m["error"].(map[string]any)["code"] != "invalid_request" || f.upstream.Load() != before ||
			!strings.Contains(m["error"].(map[string]any)["message"].(string), "refers to input held by the provider") {
			t.Fatalf("%s: %d %v", extra, w.Code, m)
		}
	}
	// A plain request, and a completions prompt string, pass.
	for path, body := range map[string]string{
		"/v1/responses":   `{"model":"gpt-4o","input":"hi","max_output_tokens":100}`,
		"/v1/completions": `{"model":"gpt-4o","prompt":"hi","max_tokens":100}`,
	} {
		if w := f.send(path, "203.0.113.7:1", "application/json", body, "Authorization", "Bearer kh"); w.Code != 200 {
			t.Fatalf("%s: %d %s", path, w.Code, w.Body)
		}
	}
}

// Without a settling budget, a request that refers to provider-held input
// passes.
func TestSpendHiddenInputWithoutBudget(t *testing.T) {
	_, url := newLLM(t)
	f := newFixture(t, budgetRules(t, url, `
[[rule]]
name   = "rpm"
key    = ["api_key"]
limit  = 10
window = "1m"

[[rule]]
name   = "itpm"
key    = ["api_key"]
cost   = "input_tokens"
limit  = 100000
window = "1m"
`)...)
	body := `{"model":"gpt-4o","input":"and then?","previous_response_id":"resp_1","prompt":{"id":"pmpt_1"}}`
	if w := f.send("/v1/responses", "203.0.113.7:1", "application/json", body, "Authorization", "Bearer kh"); w.Code != 200 {
		t.Fatalf("%d %s", w.Code, w.Body)
	}
}

// A shadow usd rule never refuses: an unpriced model is a would-be
// refusal, counted, and the request passes. A key whose tier is unlimited
// is never priced.
func TestSpendShadowAndUnlimitedUnpriced(t *testing.T) {
	_, url := newLLM(t)
	f := newFixture(t, budgetRules(t, url, `
tier_from = "header:X-Plan"

[price."gpt-4o*"]
input  = 2.50
output = 10.00

[[rule]]
name   = "spend-shadow"
key    = ["api_key"]
cost   = "usd"
limit  = 1.00
window = "24h"
action = "shadow"

[[rule]]
name   = "spend-tiered"
key    = ["api_key"]
cost   = "usd"
limit  = 1.00
window = "24h"
tiers  = { enterprise = "unlimited" }
`)...)
	body := `{"model":"llama-3","messages":[{"role":"user","content":"hi"}],"max_tokens":10}`
	w := f.send("/v1/chat/completions", "203.0.113.7:1", "application/json", body, "Authorization", "Bearer ks", "X-Plan", "enterprise")
	if w.Code != 200 {
		t.Fatalf("unlimited tier, shadow rule: %d %s", w.Code, w.Body)
	}
	if got := metric(t, f, "ratelimit_proxy_shadow_denials_total", map[string]string{"rule": "spend-shadow"}); got != 1 {
		t.Fatalf("shadow denials %v, want 1", got)
	}
	// The enforcing rule still refuses an unpriced model for other keys.
	w = f.send("/v1/chat/completions", "203.0.113.7:1", "application/json", body, "Authorization", "Bearer ks")
	var m map[string]any
	json.Unmarshal(w.Body.Bytes(), &m)
	if w.Code != 400 || m["denied_by"] != "spend-tiered" {
		t.Fatalf("limited tier: %d %v", w.Code, m)
	}
}

// A batch is priced at its members' model, which must agree.
func TestSpendBatchPricedByMembersModel(t *testing.T) {
	_, url := newLLM(t)
	f := newFixture(t, budgetRules(t, url, spendDollar+`
[price."*"]
input  = 100
output = 100
`)...)
	batch := `[{"model":"gpt-4o","prompt":"a","max_tokens":100},{"model":"gpt-4o","prompt":"b","max_tokens":100}]`
	est := estimate(t, "/v1/completions", batch)
	w := f.send("/v1/completions", "203.0.113.7:1", "application/json", batch, "Authorization", "Bearer kbatch")
	want := 1_000_000 - (est*2_500_000+200*10_000_000+999_999)/1_000_000
	if w.Code != 200 || micro(t, w.Header().Get("X-Ratelimit-Remaining-Usd")) != want {
		t.Fatalf("batch: %d remaining %s, want %d µ$ (gpt-4o prices)", w.Code, w.Header().Get("X-Ratelimit-Remaining-Usd"), want)
	}
	mixed := `[{"model":"gpt-4o","prompt":"a","max_tokens":1},{"model":"o1-pro","prompt":"b","max_tokens":1}]`
	w = f.send("/v1/completions", "203.0.113.7:1", "application/json", mixed, "Authorization", "Bearer kbatch")
	var m map[string]any
	json.Unmarshal(w.Body.Bytes(), &m)
	if w.Code != 400 || m["error"].(map[string]any)["code"] != "invalid_request" {
		t.Fatalf("mixed models: %d %v", w.Code, m)
	}
}

// Spend metrics count a kept reservation as spend, and observe the settle
// delta once per request however many usd rules apply.
func TestSpendMetricsKeptAndOncePerRequest(t *testing.T) {
	_, url := newLLM(t)
	f := newFixture(t, budgetRules(t, url, spendDollar+`
[[rule]]
name   = "spend-global"
key    = ["global"]
cost   = "usd"
limit  = 10.00
window = "24h"
`)...)
	w := f.send("/v1/chat/completions", "203.0.113.7:1", "application/json", weatherBody+`,"max_tokens":100}`,
		"Authorization", "Bearer km", "X-Test-Usage", "10,10")
	if w.Code != 200 {
		t.Fatalf("request: %d %s", w.Code, w.Body)
	}
	if got := metric(t, f, "ratelimit_proxy_spend_settle_delta_usd", map[string]string{"model": "gpt-4o"}); got != 1 {
		t.Fatalf("settle delta observed %v times for one request, want 1", got)
	}
	batch := `[{"model":"gpt-4o","prompt":"a","max_tokens":1000},{"model":"gpt-4o","prompt":"b","max_tokens":1000}]`
	before := metric(t, f, "ratelimit_proxy_spend_usd_total", map[string]string{"rule": "spend", "model": "gpt-4o"})
	if w := f.send("/v1/completions", "203.0.113.7:1", "application/json", batch, "Authorization", "Bearer km"); w.Code != 200 {
		t.Fatalf("batch: %d %s", w.Code, w.Body)
	}
	est := estimate(t, "/v1/completions", batch)
	want := float64((est*2_500_000+2000*10_000_000+999_999)/1_000_000) / 1e6
	if got := metric(t, f, "ratelimit_proxy_spend_usd_total", map[string]string{"rule": "spend", "model": "gpt-4o"}) - before; got < want-1e-9 || got > want+1e-9 {
		t.Fatalf("batch spend %v, want its reservation %v", got, want)
	}
}
