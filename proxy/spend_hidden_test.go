package proxy_test

import (
	"encoding/json"
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
