package limits_test

import (
	"context"
	"runtime"
	"strconv"
	"testing"
	"time"

	"github.com/ratelimit-proxy/ratelimit-proxy/limits"
)

// BenchmarkDecideWarmKey is one decision on a key that already exists; the
// window rolls forward so the key is admitted and refused in turn.
func BenchmarkDecideWarmKey(b *testing.B) {
	s := limits.NewMemory(limits.MemoryOptions{})
	r := rule(20, time.Minute)
	hits := []limits.Hit{{Rule: r, Key: limits.KeyOf("caller", "ip:203.0.113.7"), Cost: 1}}
	out := make([]limits.Decision, 1)
	ctx := context.Background()
	now := t0
	b.ReportAllocs()
	for b.Loop() {
		now = now.Add(time.Millisecond)
		if _, err := s.Decide(ctx, hits, now, out); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkDecideWarmKeyParallel(b *testing.B) {
	s := limits.NewMemory(limits.MemoryOptions{})
	r := rule(20, time.Minute)
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		hits := []limits.Hit{{Rule: r, Key: limits.KeyOf("caller", "ip:203.0.113.7"), Cost: 1}}
		out := make([]limits.Decision, 1)
		ctx := context.Background()
		now := t0
		for pb.Next() {
			now = now.Add(time.Millisecond)
			s.Decide(ctx, hits, now, out)
		}
	})
}

// BenchmarkDecideManyKeys spreads decisions over 1M distinct callers, all
// held in the store: the cost of a cold cache and a big map.
func BenchmarkDecideManyKeys(b *testing.B) {
	const n = 1 << 20
	s := limits.NewMemory(limits.MemoryOptions{MaxKeys: 2 * n})
	r := rule(20, time.Minute)
	keys := make([]limits.Key, n)
	for i := range keys {
		keys[i] = limits.KeyOf("caller", "key:"+strconv.Itoa(i))
	}
	out := make([]limits.Decision, 1)
	ctx := context.Background()
	for i := range keys {
		s.Decide(ctx, []limits.Hit{{Rule: r, Key: keys[i], Cost: 1}}, t0, out)
	}
	b.Run("serial", func(b *testing.B) {
		hits := make([]limits.Hit, 1)
		i := 0
		b.ReportAllocs()
		for b.Loop() {
			hits[0] = limits.Hit{Rule: r, Key: keys[i&(n-1)], Cost: 1}
			s.Decide(ctx, hits, t0.Add(time.Second), out)
			i += 7919 // a prime stride: no locality
		}
	})
	b.Run("parallel", func(b *testing.B) {
		b.ReportAllocs()
		b.RunParallel(func(pb *testing.PB) {
			hits := make([]limits.Hit, 1)
			out := make([]limits.Decision, 1)
			i := int(time.Now().UnixNano())
			for pb.Next() {
				hits[0] = limits.Hit{Rule: r, Key: keys[i&(n-1)], Cost: 1}
				s.Decide(ctx, hits, t0.Add(time.Second), out)
				i += 7919
			}
		})
	})
}

// BenchmarkMemoryPerKey reports the heap each tracked caller costs, with 1
// admission and with a full CHAT_RPM=20 window (the README's memory note).
func BenchmarkMemoryPerKey(b *testing.B) {
	for _, adm := range []int{1, 20} {
		b.Run(strconv.Itoa(adm)+"-admissions", func(b *testing.B) {
			const n = 100_000
			r := rule(20, time.Minute)
			out := make([]limits.Decision, 1)
			var perKey float64
			for b.Loop() {
				runtime.GC()
				var before, after runtime.MemStats
				runtime.ReadMemStats(&before)
				s := limits.NewMemory(limits.MemoryOptions{MaxKeys: 2 * n})
				for i := 0; i < n; i++ {
					k := limits.KeyOf("caller", "ip:10.0."+strconv.Itoa(i>>8)+"."+strconv.Itoa(i&255))
					for j := 0; j < adm; j++ {
						s.Decide(context.Background(), []limits.Hit{{Rule: r, Key: k, Cost: 1}}, t0.Add(time.Duration(j)*time.Millisecond), out)
					}
				}
				runtime.GC()
				runtime.ReadMemStats(&after)
				perKey = float64(after.HeapAlloc-before.HeapAlloc) / n
				runtime.KeepAlive(s)
			}
			b.ReportMetric(perKey, "B/key")
		})
	}
}
