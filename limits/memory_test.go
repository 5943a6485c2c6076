package limits_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ratelimit-proxy/ratelimit-proxy/internal/redistest"
	"github.com/ratelimit-proxy/ratelimit-proxy/limits"
)

var t0 = time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)

func at(sec float64) time.Time { return t0.Add(time.Duration(sec * float64(time.Second))) }

func rule(limit int64, window time.Duration) *limits.Rule {
	return &limits.Rule{Name: "chat_rpm", Algorithm: limits.SlidingWindow, Limit: limit, Window: window}
}

// stores are the Store implementations every behavioural test runs against.
// The Redis store is driven by the test's fake clock (ClientClock); one
// redis-server serves the whole top-level test, each store under its own
// key prefix.
func stores(top *testing.T) map[string]func(t *testing.T) limits.Store {
	var srv *redistest.Server
	return map[string]func(t *testing.T) limits.Store{
		"memory": func(*testing.T) limits.Store { return limits.NewMemory(limits.MemoryOptions{}) },
		"redis": func(t *testing.T) limits.Store {
			redistest.Require(t)
			if srv == nil {
				srv = redistest.Start(top)
			}
			return newRedisStore(t, srv, true)
		},
	}
}

// eachStore runs f once per Store implementation. Without redis-server
// the Redis run is skipped (failed with REQUIRE_REDIS=1) here, before f
// makes a store from a subtest of its own.
func eachStore(t *testing.T, f func(t *testing.T, newStore func() limits.Store)) {
	for name, mk := range stores(t) {
		t.Run(name, func(t *testing.T) {
			if name == "redis" {
				redistest.Require(t)
			}
			f(t, func() limits.Store { return mk(t) })
		})
	}
}

func allow(t testing.TB, s limits.Store, r *limits.Rule, key string, cost int64, now time.Time) limits.Decision {
	t.Helper()
	out := make([]limits.Decision, 1)
	ok, err := s.Decide(context.Background(), []limits.Hit{{Rule: r, Key: limits.KeyOf("caller", key), Cost: cost}}, now, out)
	if err != nil {
		t.Fatalf("Decide: %v", err)
	}
	if ok != out[0].Allowed {
		t.Fatalf("batch verdict %v disagrees with the only decision %+v", ok, out[0])
	}
	return out[0]
}

func TestBatchIsAllOrNothing(t *testing.T) {
	eachStore(t, func(t *testing.T, newStore func() limits.Store) {
		s := newStore()
		perUser := &limits.Rule{Name: "per-user", Algorithm: limits.SlidingWindow, Limit: 10, Window: time.Minute}
		global := &limits.Rule{Name: "global", Algorithm: limits.SlidingWindow, Limit: 1, Window: time.Minute}
		hits := func(user string) []limits.Hit {
			return []limits.Hit{
				{Rule: perUser, Key: limits.KeyOf("caller", user), Cost: 1},
				{Rule: global, Key: limits.NewKey(), Cost: 1},
			}
		}
		out := make([]limits.Decision, 2)
		if ok, _ := s.Decide(context.Background(), hits("a"), at(0), out); !ok || out[0].Remaining != 9 || out[1].Remaining != 0 {
			t.Fatalf("first batch: %v %+v", ok, out)
		}
		ok, _ := s.Decide(context.Background(), hits("b"), at(1), out)
		if ok || !out[0].Allowed || out[1].Allowed {
			t.Fatalf("second batch: %v %+v", ok, out)
		}
		// The refused batch recorded nothing for b on per-user.
		if d := allow(t, s, perUser, "b", 1, at(2)); d.Remaining != 9 {
			t.Fatalf("refused batch was recorded: %+v", d)
		}
	})
}

func TestMalformedBatch(t *testing.T) {
	eachStore(t, func(t *testing.T, newStore func() limits.Store) {
		s := newStore()
		out := make([]limits.Decision, 1)
		for _, hits := range [][]limits.Hit{nil, {{Rule: nil}}, {{Rule: rule(1, time.Minute), Cost: -1}}, {{Rule: rule(1, 0), Cost: 1}}} {
			if _, err := s.Decide(context.Background(), hits, t0, out); err == nil {
				t.Errorf("batch %+v accepted", hits)
			}
		}
	})
}

// TestNeverAdmitsMoreThanLimit replays random traffic and checks, against
// the full admission log, that no rolling window ever holds more than the
// limit; for limits that fit in the slot bound, the decisions must also be
// exactly those of an unbounded log.
func TestNeverAdmitsMoreThanLimit(t *testing.T) {
	eachStore(t, func(t *testing.T, newStore func() limits.Store) {
		for _, limit := range []int64{1, 3, 20, 999, 1000, 1500, 5000} {
			t.Run(fmt.Sprint(limit), func(t *testing.T) {
				rng := rand.New(rand.NewPCG(uint64(limit), 7))
				s := newStore()
				steps := 20000
				if _, remote := s.(*limits.Redis); remote {
					steps = 3000 // a round trip each
				}
				win := 10 * time.Second
				r := rule(limit, win)
				type adm struct {
					at   time.Time
					cost int64
				}
				var log []adm
				var first int      // oldest admission still in the window
				var inWindow int64 // cost admitted in (now-win, now]
				now := t0
				exactRefusals := 0
				for i := 0; i < steps; i++ {
					now = now.Add(time.Duration(rng.ExpFloat64() * float64(win) / float64(limit) / 1.5))
					cost := int64(1 + rng.IntN(3))
					for ; first < len(log) && !log[first].at.After(now.Add(-win)); first++ {
						inWindow -= log[first].cost
					}
					exact := inWindow+cost <= limit
					d := allow(t, s, r, "k", cost, now)
					if d.Allowed && !exact {
						t.Fatalf("step %d: admitted cost %d with %d of %d used in the window", i, cost, inWindow, limit)
					}
					if d.Allowed {
						log = append(log, adm{now, cost})
						inWindow += cost
					} else if exact {
						exactRefusals++
					}
				}
				if limit <= 1000 && exactRefusals > 0 {
					t.Fatalf("%d refusals an exact log would have admitted", exactRefusals)
				}
			})
		}
	})
}

func TestConcurrentExactAdmissions(t *testing.T) {
	eachStore(t, func(t *testing.T, newStore func() limits.Store) {
		for round := 0; round < 20; round++ {
			s := newStore()
			r := rule(20, time.Minute)
			for i := 0; i < 10; i++ { // 10 of 20 used: 10 remain
				allow(t, s, r, "k", 1, at(0))
			}
			var admitted atomic.Int64
			var wg sync.WaitGroup
			start := make(chan struct{})
			for g := 0; g < 50; g++ {
				wg.Add(1)
				go func() {
					defer wg.Done()
					<-start
					if allow(t, s, r, "k", 1, at(1)).Allowed {
						admitted.Add(1)
					}
				}()
			}
			close(start)
			wg.Wait()
			if n := admitted.Load(); n != 10 {
				t.Fatalf("round %d: %d admitted, want exactly 10", round, n)
			}
		}
	})
}

func TestKeysAreBounded(t *testing.T) {
	s := limits.NewMemory(limits.MemoryOptions{MaxKeys: 640})
	r := rule(5, time.Minute)
	for i := 0; i < 20000; i++ {
		allow(t, s, r, fmt.Sprint("flood-", i), 1, at(float64(i)/1000))
	}
	st := s.Stats()
	if st.Keys > 640 || st.Keys < 600 {
		t.Fatalf("tracked %d keys with MaxKeys 640", st.Keys)
	}
	if st.CapacityEvicted == 0 {
		t.Fatalf("no capacity evictions counted: %+v", st)
	}
	// Long after the window, everything is idle and a sweep drops it all.
	if n := s.Sweep(at(1000)); int64(n) != st.Keys || s.Stats().Keys != 0 {
		t.Fatalf("swept %d of %d, left %d", n, st.Keys, s.Stats().Keys)
	}
}

func TestSweepKeepsLiveCounters(t *testing.T) {
	s := limits.NewMemory(limits.MemoryOptions{})
	r := rule(2, time.Minute)
	allow(t, s, r, "old", 1, at(0))
	allow(t, s, r, "live", 1, at(30))
	if n := s.Sweep(at(61)); n != 1 {
		t.Fatalf("swept %d, want 1", n)
	}
	if d := allow(t, s, r, "live", 1, at(62)); d.Remaining != 0 {
		t.Fatalf("live counter lost: %+v", d)
	}
	if st := s.Stats(); st.ExpiredEvictions != 1 || st.Keys != 1 {
		t.Fatalf("stats %+v", st)
	}
}

func TestKeyPublicForm(t *testing.T) {
	tests := []struct {
		key  limits.Key
		want string
	}{
		{limits.KeyOf("caller", "ip:203.0.113.7"), "caller=ip:203.0.113.7"},
		{limits.NewKey(limits.Part{Name: "xml:dRucEm", Value: "80012345-6"}, limits.Part{Name: "header:X-Env", Value: "prod"}), "xml:dRucEm=80012345-6&header:X-Env=prod"},
		{limits.KeyOf("header:X", "a&b=c%\n"), "header:X=a%26b%3Dc%25%0A"},
		{limits.NewKey(), ""},
	}
	for _, tt := range tests {
		if got := tt.key.String(); got != tt.want {
			t.Errorf("got %q, want %q", got, tt.want)
		}
	}
}

// A token bucket is dropped by a sweep once full again (a fresh one is
// the same), not before; a bucket never taken from is dropped at once.
func TestSweepDropsFullBuckets(t *testing.T) {
	s := limits.NewMemory(limits.MemoryOptions{})
	r := tb("r", 10, time.Minute, 10)
	for range 3 {
		allow(t, s, r, "taken", 1, at(0))
	}
	allow(t, s, r, "refused", 11, at(0)) // never fits: nothing taken
	if n := s.Sweep(at(1)); n != 1 {
		t.Fatalf("swept %d at 1 s, want the bucket nothing was taken from", n)
	}
	if n := s.Sweep(at(17.9)); n != 0 {
		t.Fatalf("swept %d at 17.9 s: the bucket is full only at 18 s", n)
	}
	if n := s.Sweep(at(18)); n != 1 || s.Stats().Keys != 0 {
		t.Fatalf("swept %d at 18 s, %d keys left", n, s.Stats().Keys)
	}
	if d := allow(t, s, r, "taken", 1, at(19)); d.Remaining != 9 {
		t.Fatalf("after the sweep: %+v", d)
	}
}

// proxyKey is the key the proxy counts an API key under: its public form
// (caller=key: and 16 hex digits of its hash).
func proxyKey(i int) limits.Key {
	return limits.KeyOf("caller", fmt.Sprintf("key:%016x", uint64(i)*0x9e3779b97f4a7c15))
}

// memoryPerKey is the heap in use per (rule, key) counter of a Memory store
// holding n keys with adm admissions each under a sliding window of limit
// per minute: the counters, their keys (as the proxy builds them, kept by
// the store) and the maps that find them.
func memoryPerKey(tb testing.TB, n int, limit, adm int64) float64 {
	r := rule(limit, time.Minute)
	keys := make([]limits.Key, n)
	for i := range keys {
		keys[i] = proxyKey(i)
	}
	hits := make([]limits.Hit, 1)
	out := make([]limits.Decision, 1)
	var before, after runtime.MemStats
	runtime.GC()
	runtime.GC()
	runtime.ReadMemStats(&before)
	s := limits.NewMemory(limits.MemoryOptions{MaxKeys: 2 * n})
	for i := range keys {
		hits[0] = limits.Hit{Rule: r, Key: keys[i], Cost: 1}
		for j := range adm {
			if ok, err := s.Decide(context.Background(), hits, t0.Add(time.Duration(j)*time.Millisecond), out); !ok || err != nil {
				tb.Fatalf("key %d admission %d: %v %v", i, j, ok, err)
			}
		}
	}
	keys = nil // the store holds the key strings it keeps
	runtime.GC()
	runtime.GC()
	runtime.ReadMemStats(&after)
	if got := s.Stats().Keys; got != int64(n) {
		tb.Fatalf("store holds %d keys, want %d", got, n)
	}
	runtime.KeepAlive(s)
	return float64(int64(after.HeapInuse)-int64(before.HeapInuse)) / float64(n)
}

// TestMemoryPerKey bounds what one caller with one admission costs in
// memory (the 200,000-key load of the README stays well under its RSS
// bound): its counter, its key and its share of the map.
func TestMemoryPerKey(t *testing.T) {
	if testing.Short() {
		t.Skip("allocates 200,000 counters")
	}
	const bound = 160
	if got := memoryPerKey(t, 200_000, 5, 1); got > bound {
		t.Fatalf("%.0f bytes per key with one admission, want at most %d", got, bound)
	}
}
