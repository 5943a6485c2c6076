package limits_test

import (
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
