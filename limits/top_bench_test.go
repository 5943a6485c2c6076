package limits_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/ratelimit-proxy/ratelimit-proxy/limits"
)

// BenchmarkMemoryTop is one ?top=20 over a store of 200,000 callers of
// the rule (and as many of another rule it skips).
func BenchmarkMemoryTop(b *testing.B) {
	m := limits.NewMemory(limits.MemoryOptions{})
	r := rule(100, time.Minute)
	other := &limits.Rule{Name: "other", Algorithm: limits.SlidingWindow, Limit: 100, Window: time.Minute}
	for i := range 200_000 {
		allow(b, m, r, fmt.Sprint(i), int64(1+i%50), at(float64(i%60)))
		allow(b, m, other, fmt.Sprint(i), 1, at(0))
	}
	b.ReportAllocs()
	b.ResetTimer()
	for b.Loop() {
		res, err := m.Top(context.Background(), limits.TopQuery{Rule: r, N: 20}, at(59))
		if err != nil || len(res.Keys) != 20 {
			b.Fatal(err, len(res.Keys))
		}
	}
}
