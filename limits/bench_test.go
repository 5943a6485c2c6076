package limits_test

import (
	"context"
	"fmt"
	"strconv"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/ratelimit-proxy/ratelimit-proxy/internal/redistest"
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

// BenchmarkDecide5Rules is one decision of a batch of five rules (three
// sliding windows, two token buckets) on warm keys, admitted and refused
// in turn: the critical section of a request under SPEC §7 rules.
func BenchmarkDecide5Rules(b *testing.B) {
	for _, peek := range []bool{false, true} {
		name := "decide"
		if peek {
			name = "peek"
		}
		b.Run(name, func(b *testing.B) {
			s := limits.NewMemory(limits.MemoryOptions{})
			hits := fiveRules(limits.KeyOf("caller", "ip:203.0.113.7"), 20)
			out := make([]limits.Decision, len(hits))
			ctx := context.Background()
			now := t0
			b.ReportAllocs()
			for b.Loop() {
				now = now.Add(time.Millisecond)
				var err error
				if peek {
					_, err = s.Peek(ctx, hits, now, out)
				} else {
					_, err = s.Decide(ctx, hits, now, out)
				}
				if err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// BenchmarkDecideTokenBucket is one token-bucket decision on a warm key.
func BenchmarkDecideTokenBucket(b *testing.B) {
	s := limits.NewMemory(limits.MemoryOptions{})
	hits := []limits.Hit{{Rule: tb("bucket", 20, time.Minute, 5), Key: limits.KeyOf("caller", "ip:203.0.113.7"), Cost: 1}}
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

// fiveRules is a batch of three sliding windows and two token buckets on
// key, each admitting limit a minute.
func fiveRules(key limits.Key, limit int64) []limits.Hit {
	rules := []*limits.Rule{
		sw("per-caller", limit, time.Minute), tb("burst", limit, time.Minute, limit/4+1),
		sw("per-hour", 60*limit, time.Hour), tb("per-model", 2*limit, time.Minute, limit),
		sw("per-day", 1440*limit, 24*time.Hour),
	}
	hits := make([]limits.Hit, len(rules))
	for i, r := range rules {
		hits[i] = limits.Hit{Rule: r, Key: key, Cost: 1}
	}
	return hits
}

// BenchmarkRedisDecide1 and BenchmarkRedisDecide5 are one decision of one
// hit and of a batch of five (one round trip each) against a local
// redis-server, on warm keys, admitted (the writing path). Besides ns/op
// (wall time, which depends on the machine's other load) they report the
// CPU each op cost the proxy side (this process: the client, the
// benchmark loop, the GC) and the redis-server process: the numbers to
// compare on a shared machine.
func BenchmarkRedisDecide1(b *testing.B) { benchRedis(b, 1) }
func BenchmarkRedisDecide5(b *testing.B) { benchRedis(b, 5) }

// BenchmarkRedisDecide5vs1 is the five-rule batch against one rule side
// by side in one run, so the machine's drift cannot favour either: blocks
// of 256 decisions of one hit and of five alternate on one redis-server,
// each block's CPU (this process and redis-server) added to its side.
// five:one is the ratio of their CPU per decision.
func BenchmarkRedisDecide5vs1(b *testing.B) {
	eachRedisAlgorithm(b, func(b *testing.B, srv *redistest.Server, s *limits.Redis, alg limits.Algorithm) {
		batches := [2][]limits.Hit{benchHits(alg, 1), benchHits(alg, 5)}
		out := make([]limits.Decision, 5)
		ctx := context.Background()
		for i := range 200 { // warm keys
			s.Decide(ctx, batches[i%2], time.Now(), out)
		}
		const block = 256
		var spent [2][2]time.Duration // [side][this process, redis-server]
		var done [2]int
		last, ok := cpuNow(srv.PID())
		if !ok {
			b.Skip("no CPU times to read here")
		}
		i := 0
		for b.Loop() {
			side := i / block % 2
			if ok, err := s.Decide(ctx, batches[side], time.Now(), out); err != nil || !ok {
				b.Fatal(ok, err)
			}
			done[side]++
			if i++; i%block == 0 {
				now, _ := cpuNow(srv.PID())
				spent[side][0] += now[0] - last[0]
				spent[side][1] += now[1] - last[1]
				last = now
			}
		}
		if done[0] < block || done[1] < block {
			return // too few blocks to say
		}
		per := func(side, who int) float64 { return float64(spent[side][who]) / float64(done[side]/block*block) }
		one, five := per(0, 0)+per(0, 1), per(1, 0)+per(1, 1)
		b.ReportMetric(one, "one-cpu-ns/op")
		b.ReportMetric(five, "five-cpu-ns/op")
		b.ReportMetric(per(1, 0)-per(0, 0), "extra-proxy-ns/op")
		b.ReportMetric(per(1, 1)-per(0, 1), "extra-redis-ns/op")
		b.ReportMetric(five/one, "five:one")
	})
}

// eachRedisAlgorithm runs bench as sub-benchmarks on one redis-server,
// each with a store of its own prefix: windows, buckets, and the two
// alternating ("mixed").
func eachRedisAlgorithm(b *testing.B, bench func(b *testing.B, srv *redistest.Server, s *limits.Redis, alg limits.Algorithm)) {
	srv := redistest.Start(b)
	client := redis.NewClient(&redis.Options{Addr: srv.Addr, Protocol: 2})
	b.Cleanup(func() { client.Close() })
	for _, alg := range []limits.Algorithm{limits.SlidingWindow, limits.TokenBucket, "mixed"} {
		b.Run(string(alg), func(b *testing.B) {
			s := limits.NewRedis(limits.RedisOptions{Client: client, Prefix: fmt.Sprintf("bench%d:", prefixes.Add(1)), Timeout: time.Second})
			b.Cleanup(s.Close)
			if err := s.Warm(context.Background()); err != nil {
				b.Fatal(err)
			}
			bench(b, srv, s, alg)
		})
	}
}

// cpuNow is this process's CPU time and redis-server's (pid).
func cpuNow(pid int) ([2]time.Duration, bool) {
	self, ok1 := selfCPU()
	server, ok2 := processCPU(pid)
	return [2]time.Duration{self, server}, ok1 && ok2
}

// benchHits is a batch of n hits on one key, of alg's rules ("mixed":
// windows and buckets alternating), never refused.
func benchHits(alg limits.Algorithm, n int) []limits.Hit {
	key := limits.KeyOf("caller", "ip:203.0.113.7")
	var hits []limits.Hit
	for i := range n {
		r := sw(fmt.Sprint("r", i), 1<<40, time.Minute)
		if alg == limits.TokenBucket || (alg == "mixed" && i%2 == 1) {
			r = tb(fmt.Sprint("r", i), 1<<40, time.Minute, 1<<40)
		}
		hits = append(hits, limits.Hit{Rule: r, Key: key, Cost: 1})
	}
	return hits
}

func benchRedis(b *testing.B, n int) {
	eachRedisAlgorithm(b, func(b *testing.B, srv *redistest.Server, s *limits.Redis, alg limits.Algorithm) {
		hits := benchHits(alg, n)
		out := make([]limits.Decision, n)
		ctx := context.Background()
		for range 100 { // warm keys
			s.Decide(ctx, hits, time.Now(), out)
		}
		b.ReportAllocs()
		cpu := startCPU(srv.PID())
		for b.Loop() {
			if ok, err := s.Decide(ctx, hits, time.Now(), out); err != nil || !ok {
				b.Fatal(ok, err)
			}
		}
		cpu.report(b)
	})
}

// cpuMeter reads the CPU time of this process and of a redis-server
// around a benchmark loop.
type cpuMeter struct {
	pid          int
	self, server time.Duration
	ok           bool
}

func startCPU(pid int) cpuMeter {
	self, ok1 := selfCPU()
	server, ok2 := processCPU(pid)
	return cpuMeter{pid: pid, self: self, server: server, ok: ok1 && ok2}
}

// report adds proxy-ns/op, redis-ns/op and their sum cpu-ns/op to b's
// result (nothing where /proc cannot be read).
func (m cpuMeter) report(b *testing.B) {
	self, ok1 := selfCPU()
	server, ok2 := processCPU(m.pid)
	if !m.ok || !ok1 || !ok2 || b.N == 0 {
		return
	}
	n := float64(b.N)
	proxy, redis := float64(self-m.self)/n, float64(server-m.server)/n
	b.ReportMetric(proxy, "proxy-ns/op")
	b.ReportMetric(redis, "redis-ns/op")
	b.ReportMetric(proxy+redis, "cpu-ns/op")
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

// BenchmarkMemoryPerKey reports the heap each tracked caller costs: 1M
// callers with one admission each under CHAT_RPM=5, keyed as the proxy keys
// an API key, and 100,000 with a full CHAT_RPM=20 window (the README's
// memory note). The heap is HeapInuse after a collection, so the map's
// spare room and the size classes' rounding count.
func BenchmarkMemoryPerKey(b *testing.B) {
	for _, c := range []struct {
		name       string
		keys       int
		limit, adm int64
	}{{"1-admission", 1_000_000, 5, 1}, {"20-admissions", 100_000, 20, 20}} {
		b.Run(c.name, func(b *testing.B) {
			var perKey float64
			for b.Loop() {
				perKey = memoryPerKey(b, c.keys, c.limit, c.adm)
			}
			b.ReportMetric(perKey, "B/key")
		})
	}
}
