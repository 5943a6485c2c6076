package gate_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/ratelimit-proxy/ratelimit-proxy/internal/redistest"
	"github.com/ratelimit-proxy/ratelimit-proxy/upstream/gate"
)

// The cost of a group's admission step per request: Acquire of a free
// slot (cap and rate both checked) and its Release, on one goroutine per
// CPU. In memory that is two critical sections; on Redis two scripts.
func BenchmarkAcquireRelease(b *testing.B) {
	o := gate.Options{Name: "bench", Priorities: prios, MaxInFlight: 1 << 20, Rate: 1 << 30, Per: time.Minute,
		Queue: 1000, MaxWait: time.Second}
	b.Run("memory", func(b *testing.B) {
		g, err := gate.New(o)
		if err != nil {
			b.Fatal(err)
		}
		defer g.Close()
		run(b, g, 1)
	})
	b.Run("redis", func(b *testing.B) {
		srv := redistest.Start(b)
		client := redis.NewClient(&redis.Options{Addr: srv.Addr, PoolSize: 64})
		defer client.Close()
		g, err := gate.NewRedis(o, gate.RedisOptions{Client: client, Prefix: fmt.Sprintf("bench%d:", prefixes.Add(1)),
			Timeout: time.Second})
		if err != nil {
			b.Fatal(err)
		}
		defer g.Close()
		b.Run("serial", func(b *testing.B) { run(b, g, 1) })
		b.Run("parallel16", func(b *testing.B) { run(b, g, 16) })
	})
}

// run acquires and releases on p goroutines per CPU.
func run(b *testing.B, g *gate.Group, p int) {
	b.ReportAllocs()
	b.SetParallelism(p)
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		ctx := context.Background()
		for pb.Next() {
			t, err := g.Acquire(ctx, 1, time.Time{})
			if err != nil {
				b.Error(err)
				return
			}
			t.Release()
		}
	})
}
