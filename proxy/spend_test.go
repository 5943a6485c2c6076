package proxy_test

import (
	"encoding/json"
	"strconv"
	"testing"
)

const spendRules = `
[price."gpt-4o*"]
input  = 2.50
output = 10.00

[price."tiny*"]
input  = 0.15
output = 0.60

[[rule]]
name   = "spend"
key    = ["api_key"]
cost   = "usd"
limit  = 0.05
window = "24h"
`

// micro reads a dollars header as micro-dollars.
func micro(t *testing.T, s string) int64 {
	t.Helper()
	f, err := strconv.ParseFloat(s, 64)
	if err != nil {
		t.Fatalf("dollars %q: %v", s, err)
	}
	return int64(f*1e6 + 0.5)
}

func TestSpendBudget(t *testing.T) {
	_, url := newLLM(t)
	f := newFixture(t, budgetRules(t, url, spendRules)...)
	key := []string{"Authorization", "Bearer k1"}
	send := func(body string, hdr ...string) (int, map[string]any, func(string) string) {
		w := f.send("/v1/chat/completions", "203.0.113.7:1", "application/json", body, append(append([]string{}, key...), hdr...)...)
		var m map[string]any
		json.Unmarshal(w.Body.Bytes(), &m)
		return w.Code, m, w.Header().Get
	}
	body := weatherBody + `,"max_tokens":1000}`
	est := estimate(t, "/v1/chat/completions", body)
	reserve := (est*2_500_000 + 1000*10_000_000 + 999_999) / 1_000_000
	code, _, h := send(body, "X-Test-Usage", "40,2000") // settles to 40×2.5 + 2000×10 = 20 100 µ$
	if code != 200 || micro(t, h("X-Ratelimit-Remaining-Usd")) != 50_000-reserve || h("X-Ratelimit-Limit-Usd") != "0.05" ||
		h("X-Ratelimit-Reset-Usd") != "24h0m0s" || h("RateLimit-Policy") != `"spend";q=0.05;w=86400;qu="usd"` || h("X-Ratelimit-Limit") != "0.05" {
		t.Fatalf("first: %d remaining %s (reserve %d) policy %q limit %q", code, h("X-Ratelimit-Remaining-Usd"), reserve, h("RateLimit-Policy"), h("X-Ratelimit-Limit"))
	}
	code, _, h = send(body, "X-Test-Usage", "40,2000")
	if code != 200 || micro(t, h("X-Ratelimit-Remaining-Usd")) != 50_000-20_100-reserve {
		t.Fatalf("second: %d remaining %s", code, h("X-Ratelimit-Remaining-Usd"))
	}
	// 40 200 µ$ used: a reservation of ~10 000 does not fit.
	code, m, h := send(body)
	if code != 429 || m["error"].(map[string]any)["code"] != "insufficient_quota" || m["error"].(map[string]any)["type"] != "rate_limit_error" ||
		m["limit"] != 0.05 || m["denied_by"] != "spend" || micro(t, h("X-Ratelimit-Remaining-Usd")) != 50_000-40_200 {
		t.Fatalf("spent: %d %v remaining %s", code, m, h("X-Ratelimit-Remaining-Usd"))
	}
	// A smaller request still fits what is left.
	small := weatherBody + `,"max_tokens":100}`
	if code, m, _ := send(small, "X-Test-Usage", "1,1"); code != 200 {
		t.Fatalf("small: %d %v", code, m)
	}
	// A reservation over the limit alone: 413 with the cost in dollars.
	code, m, _ = send(weatherBody + `,"max_tokens":10000}`)
	if code != 413 || m["denied_by"] != "spend" || m["limit"] != 0.05 || micro(t, strconv.FormatFloat(m["estimated_cost_usd"].(float64), 'f', -1, 64)) != (est*2_500_000+10000*10_000_000+999_999)/1_000_000 {
		t.Fatalf("over the limit: %d %v", code, m)
	}
	// An unpriced model never reaches the upstream.
	before := f.upstream.Load()
	code, m, _ = send(`{"model":"llama-3","messages":[{"role":"user","content":"hi"}]}`)
	if code != 400 || m["error"].(map[string]any)["code"] != "unpriced_model" || m["model"] != "llama-3" || m["denied_by"] != "spend" || f.upstream.Load() != before {
		t.Fatalf("unpriced: %d %v", code, m)
	}
	if got := metric(t, f, "ratelimit_proxy_spend_usd_total", map[string]string{"rule": "spend", "model": "gpt-4o"}); got < 0.0402 {
		t.Errorf("spend metric %v", got)
	}
}

// A thousand charges of a micro-dollar each add up to exactly $0.001.
func TestSpendSumsExactly(t *testing.T) {
	_, url := newLLM(t)
	f := newFixture(t, budgetRules(t, url, spendRules)...)
	body := `{"model":"tiny-1","messages":[],"max_tokens":1}`
	var first int64
	for i := range 1001 {
		w := f.send("/v1/chat/completions", "203.0.113.7:1", "application/json", body, "Authorization", "Bearer k2", "X-Test-Usage", "3,0")
		if w.Code != 200 {
			t.Fatalf("request %d: %d %s", i, w.Code, w.Body)
		}
		left := micro(t, w.Header().Get("X-Ratelimit-Remaining-Usd"))
		if i == 0 {
			first = left
		} else if i == 1000 && first-left != 1000 {
			// 3 tokens at $0.15/M = 0.45 µ$, rounded up to 1 per charge.
			t.Fatalf("1000 charges moved the budget by %d µ$, want 1000", first-left)
		}
	}
}

// The admin API reads and changes a usd rule in dollars (SPEC §8.1, §10).
func TestSpendAdminInDollars(t *testing.T) {
	_, url := newLLM(t)
	f := newFixture(t, budgetRules(t, url, spendRules)...)
	w := f.send("/v1/chat/completions", "203.0.113.7:1", "application/json", `{"model":"tiny-1","messages":[],"max_tokens":1}`,
		"Authorization", "Bearer k3", "X-Test-Usage", "1000000,0") // settles to 1M × $0.15/M = $0.15: over the $0.05
	if w.Code != 200 {
		t.Fatalf("request: %d %s", w.Code, w.Body)
	}
	key := "/admin/limits/spend?key=api_key=" + keyHash("k3")
	code, m := f.adminDo(t, "GET", key, "", "")
	if code != 200 || m["limit"] != 0.05 || m["used"] != 0.05 || m["remaining"] != 0.0 || m["cost"] != "usd" || m["window_seconds"] != 86400.0 {
		t.Fatalf("GET: %d %v", code, m)
	}
	// Used counts to the limit; the $0.15 really spent shows under a higher one.
	code, m = f.adminDo(t, "PUT", key, "", `{"limit":"0.5"}`)
	if code != 200 || m["limit"] != 0.5 || m["override"] != 0.5 || m["used"] != 0.15 || m["remaining"] != 0.35 {
		t.Fatalf("PUT override: %d %v", code, m)
	}
	// Finer than a micro-dollar: refused, not rounded.
	if code, m = f.adminDo(t, "PUT", "/admin/rules/spend", "", `{"limit":25.1234567}`); code != 400 {
		t.Fatalf("PUT 7 decimals: %d %v", code, m)
	}
	code, m = f.adminDo(t, "PUT", "/admin/rules/spend", "", `{"limit":25.125}`)
	if code != 200 || m["limit"] != 25.125 {
		t.Fatalf("PUT rule: %d %v", code, m)
	}
	_, cfg := f.adminDo(t, "GET", "/admin/config", "", "")
	if r := cfg["rule"].([]any)[0].(map[string]any); r["limit"] != 25.125 {
		t.Fatalf("config: %v", r)
	}
}
