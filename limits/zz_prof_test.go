package limits_test

import (
	"context"
	"fmt"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/ratelimit-proxy/ratelimit-proxy/internal/redistest"
	"github.com/ratelimit-proxy/ratelimit-proxy/limits"
)

func TestZZProf(t *testing.T) {
	if os.Getenv("ZZPROF") == "" {
		t.Skip()
	}
	srv := redistest.Start(t)
	client := redis.NewClient(&redis.Options{Addr: srv.Addr, Protocol: 2})
	defer client.Close()
	ctx := context.Background()
	for _, n := range []int{1, 5} {
		for _, alg := range []limits.Algorithm{limits.SlidingWindow, limits.TokenBucket} {
			s := limits.NewRedis(limits.RedisOptions{Client: client, Prefix: fmt.Sprintf("p%d%s:", n, alg), Timeout: time.Second})
			key := limits.KeyOf("caller", "ip:203.0.113.7")
			var hits []limits.Hit
			for i := range n {
				r := sw(fmt.Sprint("r", i), 1<<40, time.Minute)
				if alg == limits.TokenBucket {
					r = tb(fmt.Sprint("r", i), 1<<40, time.Minute, 1<<40)
				}
				hits = append(hits, limits.Hit{Rule: r, Key: key, Cost: 1})
			}
			out := make([]limits.Decision, n)
			for range 100 {
				s.Decide(ctx, hits, time.Now(), out)
			}
			client.ConfigResetStat(ctx)
			cpu := startCPU(srv.PID())
			const N = 20000
			for range N {
				s.Decide(ctx, hits, time.Now(), out)
			}
			self, _ := selfCPU()
			server, _ := processCPU(srv.PID())
			info := client.Info(ctx, "commandstats").Val()
			fmt.Printf("== %d %s proxy %d redis %d ns/op\n", n, alg, (self-cpu.self).Nanoseconds()/N, (server-cpu.server).Nanoseconds()/N)
			for _, l := range strings.Split(info, "\n") {
				if strings.HasPrefix(l, "cmdstat_") {
					f := strings.Split(l, ",")
					fmt.Println("  ", f[0], f[1], f[2])
				}
			}
		}
	}
}
