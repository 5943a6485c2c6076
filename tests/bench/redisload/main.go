// Command redisload measures decisions per second and their latency for the
// Redis store of package limits, from one process with many concurrent
// callers, against a running Redis. tests/bench/redis.sh runs it next to
// redis-benchmark sending the same script (EVALSHA), which is the floor.
//
// Every decision is limits.(*Redis).Decide with one hit of a sliding-window
// rule, through the client limits.NewRedisClient builds for REDIS_URL (the
// production configuration). Caller keys are "ip:" and a 12-digit number
// drawn uniformly from [0, -keys), the very key names redis-benchmark's
// __rand_int__ produces, so both send the same bytes.
//
//	go run ./tests/bench/redisload -addr 127.0.0.1:6379 -n 200000 -c 64
//
// It prints one line of key=value fields (decisions, seconds, rate, p50_us,
// p99_us, p999_us, errors, ...) and exits non-zero if any decision failed.
//
// -raw replaces the store and go-redis by a minimal client (one connection
// per caller, EVALSHA written and its reply parsed by hand) for diagnosis:
// it shows what the Go runtime alone gets out of the same server.
package main

import (
	"context"
	"crypto/sha1"
	"encoding/hex"
	"flag"
	"fmt"
	"math/rand/v2"
	"os"
	"runtime"
	"runtime/pprof"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/ratelimit-proxy/ratelimit-proxy/limits"
)

type config struct {
	addr, prefix, script string
	n, c, keys, pool     int
	limit                int64
	timeout              time.Duration
	raw                  bool
}

// result is what one caller goroutine did.
type result struct {
	lat                      []time.Duration
	errors, allowed, refused int
	firstErr                 error
}

func main() {
	var cfg config
	flag.StringVar(&cfg.addr, "addr", "127.0.0.1:6379", "Redis `host:port`")
	flag.IntVar(&cfg.n, "n", 200000, "total decisions")
	flag.IntVar(&cfg.c, "c", 64, "concurrent callers")
	flag.IntVar(&cfg.keys, "keys", 100000, "distinct caller keys")
	flag.Int64Var(&cfg.limit, "limit", 1000000000, "rule limit per minute (the default admits everything; 20 measures the refusing path)")
	flag.StringVar(&cfg.prefix, "prefix", "ratelimit-proxy:", "key prefix (RedisOptions.Prefix)")
	flag.StringVar(&cfg.script, "script", "limits/redis.lua", "the store's Lua script, for its SHA1 (and for -raw)")
	flag.IntVar(&cfg.pool, "pool", 0, "if > 0, add ?pool_size=N to the REDIS_URL (0: the client's default pool)")
	flag.DurationVar(&cfg.timeout, "timeout", time.Second, "RedisOptions.Timeout")
	flag.BoolVar(&cfg.raw, "raw", false, "diagnosis: bypass go-redis and the store with a minimal EVALSHA client, one connection per caller")
	cpuprofile := flag.String("cpuprofile", "", "write a CPU profile of the measured run to `file`")
	memprofile := flag.String("memprofile", "", "write an allocation profile to `file` after the run")
	flag.Parse()
	if cfg.n <= 0 || cfg.c <= 0 || cfg.keys <= 0 || cfg.limit < 0 || cfg.keys > 1e12 {
		fatalf("-n, -c, -keys must be positive (-keys < 1e12) and -limit not negative")
	}

	src, err := os.ReadFile(cfg.script)
	if err != nil {
		fatalf("read script: %v (run from the repository root or pass -script)", err)
	}
	sum := sha1.Sum(src)
	sha := hex.EncodeToString(sum[:])

	rule := &limits.Rule{Name: "chat_rpm", Algorithm: limits.SlidingWindow, Limit: cfg.limit, Window: time.Minute}
	if err := rule.Validate(); err != nil {
		fatalf("rule: %v", err)
	}
	names := make([]string, cfg.keys)
	for i := range names {
		names[i] = fmt.Sprintf("ip:%012d", i)
	}

	var (
		worker func(ctx context.Context, id int, next func() bool) result
		stop   func()
	)
	if cfg.raw {
		worker, stop, err = rawWorkers(cfg, rule, names, sha)
	} else {
		worker, stop, err = storeWorkers(cfg, rule, names)
	}
	if err != nil {
		fatalf("%v", err)
	}
	defer stop()

	if *cpuprofile != "" {
		f, err := os.Create(*cpuprofile)
		if err != nil {
			fatalf("%v", err)
		}
		if err := pprof.StartCPUProfile(f); err != nil {
			fatalf("%v", err)
		}
		defer f.Close()
	}

	var (
		claimed atomic.Int64
		results = make([]result, cfg.c)
		wg      sync.WaitGroup
		ms0     runtime.MemStats
		ru0     syscall.Rusage
	)
	next := func() bool { return claimed.Add(1) <= int64(cfg.n) }
	runtime.ReadMemStats(&ms0)
	_ = syscall.Getrusage(syscall.RUSAGE_SELF, &ru0)
	start := time.Now()
	for i := range cfg.c {
		wg.Go(func() { results[i] = worker(context.Background(), i, next) })
	}
	wg.Wait()
	elapsed := time.Since(start)
	var ru1 syscall.Rusage
	_ = syscall.Getrusage(syscall.RUSAGE_SELF, &ru1)
	if *cpuprofile != "" {
		pprof.StopCPUProfile()
	}
	var ms1 runtime.MemStats
	runtime.ReadMemStats(&ms1)
	if *memprofile != "" {
		f, err := os.Create(*memprofile)
		if err != nil {
			fatalf("%v", err)
		}
		if err := pprof.Lookup("allocs").WriteTo(f, 0); err != nil {
			fatalf("%v", err)
		}
		f.Close()
	}

	var all []time.Duration
	total := result{}
	for _, r := range results {
		all = append(all, r.lat...)
		total.errors += r.errors
		total.allowed += r.allowed
		total.refused += r.refused
		if total.firstErr == nil {
			total.firstErr = r.firstErr
		}
	}
	slices.Sort(all)
	done := len(all)
	cpu := tv(ru1.Utime) + tv(ru1.Stime) - tv(ru0.Utime) - tv(ru0.Stime)
	mode, pool := "store", "default"
	if cfg.raw {
		mode, pool = "raw", strconv.Itoa(cfg.c)
	} else if cfg.pool > 0 {
		pool = strconv.Itoa(cfg.pool)
	}
	fmt.Printf("decisions=%d seconds=%.3f rate=%.0f p50_us=%.1f p99_us=%.1f p999_us=%.1f max_us=%.1f "+
		"errors=%d allowed=%d refused=%d cpu_us_per_op=%.2f allocs_per_op=%.1f bytes_per_op=%.0f "+
		"mode=%s pool=%s c=%d keys=%d limit=%d gomaxprocs=%d script_sha=%s\n",
		done, elapsed.Seconds(), float64(done)/elapsed.Seconds(),
		pct(all, 0.50), pct(all, 0.99), pct(all, 0.999), pct(all, 1),
		total.errors, total.allowed, total.refused, cpu.Seconds()*1e6/float64(max(done, 1)),
		float64(ms1.Mallocs-ms0.Mallocs)/float64(max(done, 1)),
		float64(ms1.TotalAlloc-ms0.TotalAlloc)/float64(max(done, 1)),
		mode, pool, cfg.c, cfg.keys, cfg.limit, runtime.GOMAXPROCS(0), sha)
	if total.errors > 0 {
		fmt.Fprintf(os.Stderr, "redisload: %d decisions failed; first: %v\n", total.errors, total.firstErr)
		stop()
		os.Exit(1)
	}
}

// storeWorkers returns callers deciding through limits.(*Redis).Decide with
// the production client.
func storeWorkers(cfg config, rule *limits.Rule, names []string) (func(context.Context, int, func() bool) result, func(), error) {
	url := "redis://" + cfg.addr + "/0"
	if cfg.pool > 0 {
		url += "?pool_size=" + strconv.Itoa(cfg.pool)
	}
	client, err := limits.NewRedisClient(url)
	if err != nil {
		return nil, nil, fmt.Errorf("client: %w", err)
	}
	store := limits.NewRedis(limits.RedisOptions{Client: client, Prefix: cfg.prefix, Timeout: cfg.timeout})
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := client.Ping(ctx).Err(); err != nil {
		client.Close()
		return nil, nil, fmt.Errorf("ping %s: %w", cfg.addr, err)
	}
	keys := make([]limits.Key, len(names))
	for i, s := range names {
		keys[i] = limits.KeyOf("caller", s)
	}
	per := cfg.n/cfg.c + 1
	worker := func(ctx context.Context, id int, next func() bool) result {
		rng := rand.New(rand.NewPCG(uint64(id)+1, 0x9e3779b97f4a7c15))
		r := result{lat: make([]time.Duration, 0, 2*per)}
		hits := []limits.Hit{{Rule: rule, Cost: 1}}
		out := make([]limits.Decision, 1)
		for next() {
			hits[0].Key = keys[rng.IntN(len(keys))]
			t0 := time.Now()
			ok, err := store.Decide(ctx, hits, time.Now(), out)
			r.lat = append(r.lat, time.Since(t0))
			switch {
			case err != nil:
				r.errors++
				if r.firstErr == nil {
					r.firstErr = err
				}
			case ok:
				r.allowed++
			default:
				r.refused++
			}
		}
		return r
	}
	var once sync.Once
	stop := func() { once.Do(func() { store.Close(); client.Close() }) }
	return worker, stop, nil
}

// pct is the nearest-rank percentile of sorted, in µs.
func pct(sorted []time.Duration, p float64) float64 {
	if len(sorted) == 0 {
		return 0
	}
	i := int(p*float64(len(sorted))+0.999999) - 1
	i = min(max(i, 0), len(sorted)-1)
	return float64(sorted[i]) / 1e3
}

func tv(t syscall.Timeval) time.Duration {
	return time.Duration(t.Sec)*time.Second + time.Duration(t.Usec)*time.Microsecond
}

func fatalf(format string, a ...any) {
	fmt.Fprintf(os.Stderr, "redisload: "+format+"\n", a...)
	os.Exit(2)
}
