package limits_test

import (
	"context"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/ratelimit-proxy/ratelimit-proxy/internal/redistest"
	"github.com/ratelimit-proxy/ratelimit-proxy/limits"
)

// BenchmarkSettle is one settlement (a refund of one unit, or an extra
// charge of one) of a warm key in Memory, for both algorithms.
func BenchmarkSettle(b *testing.B) {
	benchSettle(b, func(*testing.B) limits.Store { return limits.NewMemory(limits.MemoryOptions{}) }, t0, time.Microsecond)
}

// BenchmarkRedisSettle is one settlement (one round trip) against a local
// redis-server, on Redis's clock.
func BenchmarkRedisSettle(b *testing.B) {
	srv := redistest.Start(b)
	client := redis.NewClient(&redis.Options{Addr: srv.Addr, Protocol: 2})
	b.Cleanup(func() { client.Close() })
	benchSettle(b, func(b *testing.B) limits.Store {
		s := limits.NewRedis(limits.RedisOptions{Client: client, Prefix: "benchsettle:", Timeout: time.Second})
		b.Cleanup(s.Close)
		if err := s.Warm(context.Background()); err != nil {
			b.Fatal(err)
		}
		return s
	}, time.Now(), 0)
}

func benchSettle(b *testing.B, newStore func(*testing.B) limits.Store, start time.Time, step time.Duration) {
	for _, alg := range []limits.Algorithm{limits.SlidingWindow, limits.TokenBucket} {
		for _, extra := range []int64{-1, 1} {
			name := string(alg) + "/refund"
			if extra > 0 {
				name = string(alg) + "/charge"
			}
			b.Run(name, func(b *testing.B) {
				s := newStore(b)
				r := sw(name, 1<<40, time.Hour)
				if alg == limits.TokenBucket {
					r = tb(name, 1<<40, time.Hour, 1<<40)
				}
				hit := limits.Hit{Rule: r, Key: limits.KeyOf("caller", "ip:203.0.113.7"), Cost: 1 << 30}
				out := make([]limits.Decision, 1)
				ctx := context.Background()
				if ok, err := s.Decide(ctx, []limits.Hit{hit}, start, out); !ok || err != nil {
					b.Fatal(ok, err)
				}
				st := []limits.Settlement{{Hit: hit, Ticket: out[0].Ticket, Actual: hit.Cost + extra}}
				now := start
				b.ReportAllocs()
				for b.Loop() {
					if step > 0 {
						now = now.Add(step)
					} else {
						now = time.Now()
					}
					if err := s.Settle(ctx, st, now); err != nil {
						b.Fatal(err)
					}
				}
			})
		}
	}
}
