package gate

// The adaptive factor is computed twice, in Go (memory.go, aimd) and in
// Lua (gate.lua); these tests drive both through the same steps of a
// fake clock and require the same factor, in ppm, at every step.

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/ratelimit-proxy/ratelimit-proxy/internal/redistest"
)

// fakeClock is a clock the test steps.
type fakeClock struct {
	mu sync.Mutex
	t  time.Time
}

func newFakeClock() *fakeClock { return &fakeClock{t: time.UnixMilli(1_700_000_000_000)} }

func (c *fakeClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.t
}

func (c *fakeClock) Set(t time.Time) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.t = t
}

var aimdPrefixes atomic.Int64

// backends names the backends a test runs on: memory, and redis where
// redis-server is installed (or REQUIRE_REDIS=1).
func backends(t *testing.T) []string {
	if _, err := exec.LookPath("redis-server"); err != nil && os.Getenv("REQUIRE_REDIS") != "1" {
		t.Log("redis-server not installed: memory only")
		return []string{"memory"}
	}
	return []string{"memory", "redis"}
}

// newBackend is a group of options o in memory, or on Redis with the
// script using o.Now (ClientClock).
func newBackend(t *testing.T, name string, o Options) *Group {
	t.Helper()
	if name == "memory" {
		g, err := New(o)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(g.Close)
		return g
	}
	srv := redistest.Start(t)
	client := redis.NewClient(&redis.Options{Addr: srv.Addr})
	g, err := NewRedis(o, RedisOptions{Client: client, Prefix: fmt.Sprintf("ga%d:", aimdPrefixes.Add(1)),
		Timeout: time.Second, ClientClock: true})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		g.Close()
		client.Close()
	})
	return g
}

// bothBackends is a group of options o on each backend.
func bothBackends(t *testing.T, o Options) map[string]*Group {
	t.Helper()
	gs := map[string]*Group{}
	for _, name := range backends(t) {
		gs[name] = newBackend(t, name, o)
	}
	return gs
}

// factorNow is g's factor in ppm at its clock's now. A Redis group knows
// the factor of its last step: one step (an empty renew) refreshes it.
func factorNow(t *testing.T, g *Group) int64 {
	t.Helper()
	if b, ok := g.b.(*redisBackend); ok {
		if _, err := b.run(context.Background(), "renew", g.now()); err != nil {
			t.Fatal(err)
		}
	}
	f := g.b.snapshot(g.now()).factor
	if s := g.Snapshot().Factor; s != float64(f)/PPM {
		t.Fatalf("Snapshot().Factor %v, ppm %d", s, f)
	}
	return f
}

func defaultAdaptive() *Adaptive {
	// SPEC §9's example: start 0.5, +0.1 each 5m, ×0.5 on a 429, hold
	// 10m, ceiling 0.8.
	return &Adaptive{Start: 500_000, Increase: 100_000, Every: 5 * time.Minute, Decrease: 500_000,
		Hold: 10 * time.Minute, Ceiling: 800_000}
}

func TestAIMDConformance(t *testing.T) {
	clk := newFakeClock()
	t0 := clk.Now()
	gs := bothBackends(t, Options{Name: "aimd", Priorities: []string{"default"}, Rate: 10, Per: time.Minute,
		Now: clk.Now, Adaptive: defaultAdaptive()})
	const minute = time.Minute
	var at time.Duration
	step := func(d time.Duration, want int64) {
		t.Helper()
		at = d
		clk.Set(t0.Add(d))
		for name, g := range gs {
			if got := factorNow(t, g); got != want {
				t.Fatalf("%s at %s: factor %d, want %d", name, d, got, want)
			}
		}
	}
	// throttle applies an answer with status to a request sent ago.
	throttle := func(status int, ago time.Duration, want int64) {
		t.Helper()
		for name, g := range gs {
			if left := g.throttled(nil, status, 0, clk.Now().Add(-ago)); left != 0 {
				t.Fatalf("%s: pause left %s, want 0", name, left)
			}
			if got := factorNow(t, g); got != want {
				t.Fatalf("%s at %s: %d sent %s before: factor %d, want %d", name, at, status, ago, got, want)
			}
		}
	}
	step(0, 500_000) // start
	step(5*minute-time.Millisecond, 500_000)
	step(5*minute, 600_000) // +0.1 each clean 5m
	step(10*minute, 700_000)
	step(15*minute-time.Millisecond, 700_000)
	step(15*minute, 800_000)
	step(20*minute, 800_000) // ceiling
	step(30*minute, 800_000)
	step(31*minute, 800_000)
	throttle(429, time.Second, 400_000) // ×0.5, held until 41m
	step(31*minute+500*time.Millisecond, 400_000)
	// 429s of requests sent before that decrease do not compound.
	throttle(429, time.Second, 400_000)
	step(32*minute, 400_000)
	throttle(429, 90*time.Second, 400_000)
	throttle(503, 0, 400_000) // a 503 pauses but does not lower the rate
	step(40*minute, 400_000)  // held: no increase although 5m passed
	step(41*minute-time.Millisecond, 400_000)
	step(41*minute, 400_000) // the hold ends; a clean period begins
	step(46*minute-time.Millisecond, 400_000)
	step(46*minute, 500_000)
	step(46*minute+30*time.Second, 500_000)
	throttle(429, time.Second, 250_000) // sent after the last decrease: it counts
	step(46*minute+31*time.Second, 250_000)
	throttle(429, 500*time.Millisecond, 125_000)
	step(46*minute+32*time.Second, 125_000)
	throttle(429, 500*time.Millisecond, 100_000) // the floor: one request per window (1/10)
	step(46*minute+33*time.Second, 100_000)
	throttle(429, 0, 100_000)
	step(56*minute+33*time.Second-time.Millisecond, 100_000) // held until 56m33s
	step(61*minute+33*time.Second-time.Millisecond, 100_000)
	step(61*minute+33*time.Second, 200_000)
	step(66*minute+33*time.Second, 300_000)
	step(200*minute, 800_000) // many periods at once, capped at the ceiling
}

// The effective rate follows the factor: Rate × factor per window, at
// least one.
func TestAIMDRate(t *testing.T) {
	for _, name := range backends(t) {
		t.Run(name, func(t *testing.T) {
			clk := newFakeClock()
			t0 := clk.Now()
			// MaxWait 0: nobody waits, the request past the rate is
			// refused at once.
			g := newBackend(t, name, Options{Name: "aimdrate", Priorities: []string{"default"}, Rate: 10,
				Per: time.Minute, Now: clk.Now, Adaptive: defaultAdaptive()})
			// pass takes n tickets, and checks the next is refused with
			// a Retry-After of retry.
			pass := func(n int, retry time.Duration) {
				t.Helper()
				for i := range n {
					tk, err := g.Acquire(context.Background(), 0, time.Time{})
					if err != nil {
						t.Fatalf("at %s: request %d of %d: %v", clk.Now().Sub(t0), i+1, n, err)
					}
					tk.Release()
				}
				_, err := g.Acquire(context.Background(), 0, time.Time{})
				var busy *BusyError
				if !errors.As(err, &busy) || busy.Reason != ReasonQueueFull || busy.RetryAfter != retry {
					t.Fatalf("at %s: request %d: %v, want queue_full retry after %s", clk.Now().Sub(t0), n+1, err, retry)
				}
			}
			pass(5, time.Minute) // 10 × 0.5
			clk.Set(t0.Add(30 * time.Second))
			pass(0, 30*time.Second)
			// A 429 halves the factor: 10 × 0.25 = 2.5, so 2.
			g.throttled(nil, 429, 0, clk.Now())
			clk.Set(t0.Add(time.Minute))
			pass(2, time.Minute)
			for range 3 {
				g.throttled(nil, 429, 0, clk.Now())
			}
			if f := factorNow(t, g); f != 100_000 {
				t.Fatalf("factor %d after four 429s, want the floor 100000", f)
			}
			clk.Set(t0.Add(2 * time.Minute))
			pass(1, time.Minute) // the floor: 1
			// After the hold (until 11m) and two clean periods: 0.3, so 3.
			clk.Set(t0.Add(21 * time.Minute))
			pass(3, time.Minute)
		})
	}
}

// Random adaptive settings and random histories: Go and Lua agree at
// every step.
func TestAIMDRandomConformance(t *testing.T) {
	seed := uint64(time.Now().UnixNano())
	t.Logf("seed %d", seed)
	rng := rand.New(rand.NewPCG(seed, 1))
	for round := range 6 {
		rate := []int64{1, 3, 7, 10, 600, 1_000_003}[round]
		a := &Adaptive{
			Start: 1 + rng.Int64N(PPM), Increase: 1 + rng.Int64N(300_000), Decrease: 1 + rng.Int64N(PPM-1),
			Ceiling: 1 + rng.Int64N(PPM),
			// Every from 1 ms to about 17 minutes, hold from 0 to as long,
			// each scale alike.
			Every: time.Duration(1+rng.Int64N(pow10(rng.IntN(6)+1))) * time.Millisecond,
			Hold:  time.Duration(rng.Int64N(pow10(rng.IntN(7)))) * time.Millisecond,
		}
		t.Run(fmt.Sprintf("rate %d %+v", rate, *a), func(t *testing.T) {
			clk := newFakeClock()
			gs := bothBackends(t, Options{Name: "rnd", Priorities: []string{"default"}, Rate: rate, Per: time.Minute,
				Now: clk.Now, Adaptive: a})
			if len(gs) < 2 {
				t.Skip("one backend only")
			}
			m, r := gs["memory"], gs["redis"]
			span := max(a.Every, a.Hold, time.Millisecond)
			for i := range 500 {
				var what string
				switch k := rng.IntN(10); {
				case k < 5:
					d := time.Duration(rng.Int64N(int64(2*span)/int64(time.Millisecond)+1)) * time.Millisecond
					if rng.IntN(4) == 0 {
						d = time.Duration(rng.IntN(3)) * time.Millisecond // near a boundary just crossed
					}
					clk.Set(clk.Now().Add(d))
					what = "advance " + d.String()
				default:
					status := 429
					if k == 9 {
						status = 503
					}
					ago := time.Duration(rng.Int64N(int64(2*span)/int64(time.Millisecond)+1)) * time.Millisecond
					sent := clk.Now().Add(-ago)
					m.throttled(nil, status, 0, sent)
					r.throttled(nil, status, 0, sent)
					what = fmt.Sprintf("%d sent %s ago", status, ago)
				}
				fm, fr := factorNow(t, m), factorNow(t, r)
				if fm != fr {
					t.Fatalf("step %d (%s): memory %d, redis %d", i, what, fm, fr)
				}
			}
		})
	}
}

func pow10(n int) int64 {
	p := int64(1)
	for range n {
		p *= 10
	}
	return p
}

// A decrease never raises the factor, even where the one-request floor is
// above it (rate 1: the floor is the ceiling).
func TestAIMDDecreaseNeverRaises(t *testing.T) {
	a := newAIMD(Adaptive{Start: 500_000, Increase: 100_000, Decrease: 500_000, Ceiling: 800_000,
		Every: time.Minute, Hold: time.Minute}, 1)
	if f := a.factor(0); f != 500_000 {
		t.Fatalf("start %d", f)
	}
	a.decrease(1000, 1000)
	if f := a.factor(1000); f != 500_000 {
		t.Fatalf("after a 429: %d, want 500000 (unchanged)", f)
	}
	if l := a.limit(1000); l != 1 {
		t.Fatalf("limit %d, want 1", l)
	}
}

// The adaptive rate starts at Start × Rate, not at zero: with a rate of
// 20 per second and start 0.5, requests arriving every 10 ms pass at 10
// per second from the first one on, in memory and on Redis.
func TestAIMDStartRate(t *testing.T) {
	for _, name := range backends(t) {
		t.Run(name, func(t *testing.T) {
			clk := newFakeClock()
			t0 := clk.Now()
			// MaxWait 0: a request past the rate is refused at once.
			g := newBackend(t, name, Options{Name: "aimdstart", Priorities: []string{"default"}, Rate: 20,
				Per: time.Second, Now: clk.Now, Adaptive: defaultAdaptive()})
			if f := g.Snapshot().Factor; f != 0.5 {
				t.Fatalf("factor %v before any request, want 0.5", f)
			}
			var passed []time.Duration
			for at := time.Duration(0); at < 2*time.Second; at += 10 * time.Millisecond {
				clk.Set(t0.Add(at))
				tk, err := g.Acquire(context.Background(), 0, time.Time{})
				var busy *BusyError
				switch {
				case err == nil:
					passed = append(passed, at)
					tk.Release()
				case !errors.As(err, &busy):
					t.Fatalf("at %s: %v", at, err)
				}
			}
			early := 0
			for _, at := range passed {
				if at < 700*time.Millisecond {
					early++
				}
			}
			if early < 7 || early > 10 {
				t.Fatalf("%d requests passed in the first 0.7 s (%v), want 7 to 10 (20/s × 0.5)", early, passed)
			}
			if len(passed) != 20 {
				t.Fatalf("%d requests passed in 2 s (%v), want 20", len(passed), passed)
			}
		})
	}
}
