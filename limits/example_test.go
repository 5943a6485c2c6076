package limits_test

import (
	"bytes"
	"context"
	"fmt"
	"time"

	"github.com/ratelimit-proxy/ratelimit-proxy/limits"
)

func ExampleMemory_Decide() {
	store := limits.NewMemory(limits.MemoryOptions{MaxKeys: 100_000})
	chat := &limits.Rule{Name: "chat_rpm", Algorithm: limits.SlidingWindow, Limit: 2, Window: time.Minute}
	hits := []limits.Hit{{Rule: chat, Key: limits.KeyOf("caller", "ip:203.0.113.7"), Cost: 1}}
	out := make([]limits.Decision, len(hits))

	start := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	for _, sec := range []int{0, 40, 41, 61} {
		ok, _ := store.Decide(context.Background(), hits, start.Add(time.Duration(sec)*time.Second), out)
		fmt.Printf("t=%ds allowed=%v remaining=%d retry_after=%v\n", sec, ok, out[0].Remaining, out[0].RetryAfter)
	}
	// Output:
	// t=0s allowed=true remaining=1 retry_after=0s
	// t=40s allowed=true remaining=0 retry_after=0s
	// t=41s allowed=false remaining=0 retry_after=19s
	// t=61s allowed=true remaining=0 retry_after=0s
}

// A token bucket admits a burst, then one request per refill; a shadow
// rule counts alongside without ever refusing.
func ExampleMemory_Decide_tokenBucket() {
	store := limits.NewMemory(limits.MemoryOptions{})
	chat := &limits.Rule{Name: "chat-per-user", Algorithm: limits.TokenBucket, Limit: 20, Window: time.Minute, Burst: 3}
	daily := &limits.Rule{Name: "daily-per-key", Algorithm: limits.SlidingWindow, Limit: 2, Window: 24 * time.Hour, Shadow: true}
	key := limits.KeyOf("caller", "key:3f2a")
	hits := []limits.Hit{{Rule: chat, Key: key, Cost: 1}, {Rule: daily, Key: key, Cost: 1}}
	out := make([]limits.Decision, len(hits))

	start := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	for _, ms := range []int{0, 0, 0, 0, 3000} {
		ok, _ := store.Decide(context.Background(), hits, start.Add(time.Duration(ms)*time.Millisecond), out)
		fmt.Printf("t=%dms allowed=%v remaining=%d retry_after=%v shadow_would_allow=%v\n",
			ms, ok, out[0].Remaining, out[0].RetryAfter, out[1].Allowed)
	}
	// Output:
	// t=0ms allowed=true remaining=2 retry_after=0s shadow_would_allow=true
	// t=0ms allowed=true remaining=1 retry_after=0s shadow_would_allow=true
	// t=0ms allowed=true remaining=0 retry_after=0s shadow_would_allow=false
	// t=0ms allowed=false remaining=0 retry_after=3s shadow_would_allow=false
	// t=3000ms allowed=true remaining=0 retry_after=0s shadow_would_allow=false
}

// A token budget reserves a request's estimate plus its requested output
// at admission, then settles the charge to the usage the upstream
// reported: the difference comes back, or the extra is charged.
func ExampleMemory_Settle() {
	store := limits.NewMemory(limits.MemoryOptions{})
	ctx := context.Background()
	budget := &limits.Rule{Name: "tokens-per-key", Algorithm: limits.SlidingWindow, Limit: 10_000, Window: time.Minute, Settles: true}
	key := limits.KeyOf("caller", "key:3f2a")
	out := make([]limits.Decision, 1)
	start := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)

	first := []limits.Hit{{Rule: budget, Key: key, Cost: 4_000}}
	store.Decide(ctx, first, start, out)
	fmt.Printf("reserved 4000: remaining=%d\n", out[0].Remaining)
	store.Settle(ctx, []limits.Settlement{{Hit: first[0], Ticket: out[0].Ticket, Actual: 1_200}}, start.Add(3*time.Second))

	second := []limits.Hit{{Rule: budget, Key: key, Cost: 8_000}}
	store.Decide(ctx, second, start.Add(4*time.Second), out)
	fmt.Printf("reserved 8000: remaining=%d\n", out[0].Remaining)
	store.Settle(ctx, []limits.Settlement{{Hit: second[0], Ticket: out[0].Ticket, Actual: 9_500}}, start.Add(5*time.Second))

	ok, _ := store.Decide(ctx, []limits.Hit{{Rule: budget, Key: key, Cost: 1}}, start.Add(5*time.Second), out)
	fmt.Printf("overrun of 1500: allowed=%v retry_after=%v\n", ok, out[0].RetryAfter)
	// Output:
	// reserved 4000: remaining=6000
	// reserved 8000: remaining=800
	// overrun of 1500: allowed=false retry_after=55s
}

// A store's counters written before a restart and read back after it: the
// caller has what it had left, and what expired meanwhile is dropped.
func ExampleMemory_WriteState() {
	chat := &limits.Rule{Name: "chat_rpm", Algorithm: limits.SlidingWindow, Limit: 5, Window: time.Minute}
	hits := []limits.Hit{{Rule: chat, Key: limits.KeyOf("caller", "key:3f2a"), Cost: 1}}
	out := make([]limits.Decision, 1)
	start := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)

	before := limits.NewMemory(limits.MemoryOptions{})
	for range 3 {
		before.Decide(context.Background(), hits, start, out)
	}
	var file bytes.Buffer // SaveStateFile and LoadStateFile do this with a file, atomically
	n, _ := before.WriteState(&file, start)
	fmt.Printf("saved %d counter\n", n)

	after := limits.NewMemory(limits.MemoryOptions{})
	st, _ := after.ReadState(&file, start.Add(10*time.Second))
	ok, _ := after.Decide(context.Background(), hits, start.Add(10*time.Second), out)
	fmt.Printf("loaded %d: allowed=%v remaining=%d\n", st.Loaded, ok, out[0].Remaining)
	// Output:
	// saved 1 counter
	// loaded 1: allowed=true remaining=1
}
