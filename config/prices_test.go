package config_test

import (
	"strings"
	"testing"

	"github.com/ratelimit-proxy/ratelimit-proxy/config"
)

// SPEC §8.1's example price tables load exactly, and the longest pattern
// wins.
func TestPricesDecode(t *testing.T) {
	c, err := loadRules(t, `
[price."gpt-4o*"]
input        = 2.50
cached_input = 1.25
output       = 10.00

[price."gpt-4o-mini*"]
input  = 0.15
output = 0.6

[price."gpt-4o-mini"]
input  = "0.000001"
output = 1

[price."claude-sonnet-4*"]
input        = 3.00
cached_input = 0.30
cache_write  = 3.75
output       = 15.00
long_context = { above = 200000, input = 6.00, output = 22.50 }

[price."*"]
input  = 0
output = 0
`, nil)
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		model, pattern string
		input, output  int64
	}{
		{"gpt-4o-2024-08-06", "gpt-4o*", 2_500_000, 10_000_000},
		{"gpt-4o-mini-2024-07-18", "gpt-4o-mini*", 150_000, 600_000},
		{"gpt-4o-mini", "gpt-4o-mini", 1, 1_000_000},
		{"claude-sonnet-4-5", "claude-sonnet-4*", 3_000_000, 15_000_000},
		{"llama-3", "*", 0, 0},
	} {
		p, ok := c.Prices.Match(tc.model)
		if !ok || p.Pattern != tc.pattern || p.Input != tc.input || p.Output != tc.output {
			t.Errorf("%s: %+v %v, want %s %d/%d", tc.model, p, ok, tc.pattern, tc.input, tc.output)
		}
	}
	p, _ := c.Prices.Match("gpt-4o")
	if p.CachedInput != 1_250_000 || p.CacheWrite != 2_500_000 || p.LongAbove != 0 {
		t.Errorf("gpt-4o defaults: %+v", p)
	}
	p, _ = c.Prices.Match("claude-sonnet-4")
	if p.CachedInput != 300_000 || p.CacheWrite != 3_750_000 || p.LongAbove != 200000 || p.LongInput != 6_000_000 || p.LongOutput != 22_500_000 {
		t.Errorf("claude-sonnet-4: %+v", p)
	}
	if _, ok := (config.Prices{{Pattern: "gpt-4o"}}).Match("gpt-4o-mini"); ok {
		t.Error("an exact entry matched a longer name")
	}
}

// -check names the entry and the field of each bad price.
func TestPriceErrors(t *testing.T) {
	for _, tc := range []struct{ body, want string }{
		{"[price.\"m\"]\noutput = 1\n", `price "m": input: required`},
		{"[price.\"m\"]\ninput = 1\n", `price "m": output: required`},
		{"[price.\"m\"]\ninput = \"abc\"\noutput = 1\n", `price "m": input "abc": not a number`},
		{"[price.\"m\"]\ninput = -1\noutput = 1\n", `price "m": input -1: must not be negative`},
		{"[price.\"m\"]\ninput = 1\noutput = [1]\n", `price "m": output [1]: not a number`},
		{"[price.\"m\"]\ninput = 1\noutput = 1\ncached = 1\n", `price "m": cached: unknown field`},
		{"[price.\"m\"]\ninput = 1\noutput = 1\nlong_context = { input = 2, output = 3 }\n", `price "m": long_context.above: a number of input tokens above 0 is required`},
		{"[price.\"m\"]\ninput = 1\noutput = 1\nlong_context = { above = 10, input = 2 }\n", `price "m": long_context.output: required`},
		{"[price.\"g*t*\"]\ninput = 1\noutput = 1\n", `price "g*t*": a model name, or a prefix ending in one *`},
	} {
		_, err := loadRules(t, tc.body, nil)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%q:\n got %v\nwant %s", tc.body, err, tc.want)
		}
	}
}

// A usd rule's amounts are dollars, kept as integers of 10⁻⁶ USD.
func TestUSDRuleAmounts(t *testing.T) {
	c, err := loadRules(t, `
tier_from = "header:X-Plan"

[price."*"]
input  = 1
output = 1

[[rule]]
name   = "spend-per-key-day"
key    = ["api_key"]
cost   = "usd"
limit  = 25.00
window = "24h"
tiers  = { free = 0.5, pro = "100", team = 1, vip = "unlimited" }
`, nil)
	if err != nil {
		t.Fatal(err)
	}
	r := c.Rules[0]
	if r.Limit != 25_000_000 || len(r.Tiers) != 4 || r.Tiers[0].Limit != 500_000 || r.Tiers[1].Limit != 100_000_000 || r.Tiers[2].Limit != 1_000_000 {
		t.Fatalf("%+v", r)
	}
	for micro, want := range map[int64]string{25_000_000: "25", 1: "0.000001", 1_500_000: "1.5", 0: "0", -2_250_000: "-2.25"} {
		if got := config.Dollars(micro); got != want {
			t.Errorf("Dollars(%d) = %q, want %q", micro, got, want)
		}
	}
}

// prices.example.toml loads, and its entries price the models they name.
func TestPricesExample(t *testing.T) {
	c, err := config.Load("../prices.example.toml", func(k string) (string, bool) {
		return map[string]string{"UPSTREAM_URL": "http://127.0.0.1:1"}[k], k == "UPSTREAM_URL"
	})
	if err == nil {
		err = c.Validate()
	}
	if err != nil {
		t.Fatal(err)
	}
	for model, want := range map[string]string{
		"gpt-4o-2024-08-06": "gpt-4o*", "gpt-4o-mini": "gpt-4o-mini*", "gpt-4.1-nano-2025-04-14": "gpt-4.1-nano*",
		"gpt-5-mini": "gpt-5-mini*", "claude-sonnet-4-20250514": "claude-sonnet-4*", "claude-3-5-haiku-latest": "claude-3-5-haiku*",
		"o4-mini-2025-04-16": "o4-mini*",
		// Costlier variants are not priced at their family's price.
		"o1-pro-2025-03-19": "o1-pro*", "o3-pro": "o3-pro*", "o3-deep-research-2025-06-26": "o3-deep-research*",
		"o4-mini-deep-research": "o4-mini-deep-research*", "gpt-4o-2024-05-13": "gpt-4o-2024-05-13", "o1-2024-12-17": "o1*",
	} {
		if p, ok := c.Prices.Match(model); !ok || p.Pattern != want {
			t.Errorf("%s priced by %+v, want %s", model, p, want)
		}
	}
	if _, ok := c.Prices.Match("llama-3.1-70b"); ok {
		t.Error("an unknown model is priced")
	}
	if p, _ := c.Prices.Match("o1-pro"); p.Input != 150_000_000 || p.Output != 600_000_000 || p.CachedInput != 150_000_000 {
		t.Errorf("o1-pro: %+v", p)
	}
	p, _ := c.Prices.Match("claude-sonnet-4-5")
	if p.LongAbove != 200000 || p.CacheWrite != 3_750_000 {
		t.Errorf("claude-sonnet-4: %+v", p)
	}
}

// -check prints the prices it will charge, defaults applied, and what it
// prints loads back the same.
func TestPricesWritten(t *testing.T) {
	c, err := loadRules(t, "[price.\"claude-sonnet-4*\"]\ninput = 3\ncached_input = 0.3\noutput = 15\nlong_context = { above = 200000, input = 6, output = 22.5 }\n", nil)
	if err != nil {
		t.Fatal(err)
	}
	var b strings.Builder
	if err := c.Write(&b); err != nil {
		t.Fatal(err)
	}
	want := "[price.\"claude-sonnet-4*\"]\ninput = 3\ncached_input = 0.3\ncache_write = 3\noutput = 15\nlong_context = { above = 200000, input = 6, output = 22.5 }\n"
	if !strings.Contains(b.String(), want) {
		t.Fatalf("-check printed\n%s\nwant\n%s", b.String(), want)
	}
	i := strings.Index(b.String(), "[price.")
	again, err := loadRules(t, b.String()[i:], nil)
	if err != nil || len(again.Prices) != 1 || again.Prices[0] != c.Prices[0] {
		t.Fatalf("printed prices load back as %+v, %v", again.Prices, err)
	}
}
