package proxy

import (
	"testing"
	"time"

	"github.com/ratelimit-proxy/ratelimit-proxy/config"
	"github.com/ratelimit-proxy/ratelimit-proxy/upstream/usage"
)

// Every usage shape settles at every price that applies, exactly, in
// micro-dollars rounded up once.
func TestSpendArithmetic(t *testing.T) {
	gpt := &config.Price{Pattern: "gpt-4o*", Input: 2_500_000, CachedInput: 1_250_000, CacheWrite: 2_500_000, Output: 10_000_000}
	claude := &config.Price{Pattern: "claude-sonnet-4*", Input: 3_000_000, CachedInput: 300_000, CacheWrite: 3_750_000,
		Output: 15_000_000, LongAbove: 200_000, LongInput: 6_000_000, LongOutput: 22_500_000}
	tiny := &config.Price{Pattern: "tiny", Input: 150_000, CachedInput: 150_000, CacheWrite: 150_000, Output: 600_000}
	for _, tc := range []struct {
		name  string
		price *config.Price
		got   int64
		want  int64
	}{
		// 1000 input at $2.50/M = 2500 µ$, 100 output at $10/M = 1000 µ$.
		{"reserve", gpt, reserveUSD(gpt, 1000, 100), 3500},
		// Past 200k input: the long-context prices for input and output.
		{"reserve long", claude, reserveUSD(claude, 200_001, 1000), 1_200_006 + 22_500},
		{"reserve at the threshold", claude, reserveUSD(claude, 200_000, 1000), 600_000 + 15_000},
		// OpenAI: cached tokens inside prompt_tokens; reasoning inside completion.
		{"openai cached", gpt, settleUSD(gpt, 999, usage.Result{Reported: true,
			Usage: usage.Usage{Input: 1000, CachedInput: 400, Output: 300, Reasoning: 200}}), 1500 + 500 + 3000},
		// Anthropic: input excludes cache reads and writes (Input here is normalised: it includes them).
		{"anthropic cache", claude, settleUSD(claude, 10, usage.Result{Reported: true,
			Usage: usage.Usage{Input: 1000 + 2000 + 4000, CachedInput: 2000, CacheWrite: 4000, Output: 500}}), 3000 + 600 + 15000 + 7500},
		// Long context by the reported input, cache included; cache prices stay.
		{"anthropic long", claude, settleUSD(claude, 10, usage.Result{Reported: true,
			Usage: usage.Usage{Input: 150_000 + 60_000, CachedInput: 60_000, Output: 1000}}), 900_000 + 18_000 + 22_500},
		// No usage: the estimate at the input price plus the output that passed.
		{"no usage", gpt, settleUSD(gpt, 1000, usage.Result{Output: 7}), 2500 + 70},
		// Rounded up once per charge: 3 tokens at $0.15/M = 0.45 µ$ → 1.
		{"round up", tiny, settleUSD(tiny, 3, usage.Result{}), 1},
		{"zero", tiny, settleUSD(tiny, 0, usage.Result{Reported: true}), 0},
		// Saturates instead of overflowing.
		{"huge", claude, reserveUSD(claude, 1<<40, 1<<50), maxReserve},
	} {
		if tc.got != tc.want {
			t.Errorf("%s: %d µ$, want %d", tc.name, tc.got, tc.want)
		}
	}
}

// OpenAI's reset headers: Go durations, whole seconds from one second on.
func TestDurationValue(t *testing.T) {
	for d, want := range map[time.Duration]string{0: "0s", -time.Second: "0s", 349_100 * time.Microsecond: "350ms",
		time.Second: "1s", 59_001 * time.Millisecond: "1m0s", 360 * time.Second: "6m0s", 24 * time.Hour: "24h0m0s"} {
		if got := durationValue(d)[0]; got != want {
			t.Errorf("%v: %q, want %q", d, got, want)
		}
	}
}

// The admin change log shows a usd rule's amounts in dollars.
func TestSpendRuleDiffInDollars(t *testing.T) {
	usd := &rule{cost: costUSD, conf: config.Rule{Limit: 25_500_000, Burst: 1_250_000, BurstSet: true, Action: "reject"}}
	if got, want := ruleDiffValues(usd), "limit=25.5 action=reject burst=1.25"; got != want {
		t.Errorf("usd: %q, want %q", got, want)
	}
	req := &rule{cost: costRequests, conf: config.Rule{Limit: 60, Action: "reject"}}
	if got, want := ruleDiffValues(req), "limit=60 action=reject"; got != want {
		t.Errorf("requests: %q, want %q", got, want)
	}
}
