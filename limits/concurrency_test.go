package limits_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/ratelimit-proxy/ratelimit-proxy/internal/redistest"
	"github.com/ratelimit-proxy/ratelimit-proxy/limits"
)

// fire sends n concurrent batches, all released at once, and returns how
// many were admitted.
func fire(t *testing.T, s limits.Store, n int, batch func(g int) []limits.Hit, now time.Time) int64 {
	t.Helper()
	var admitted atomic.Int64
	var wg sync.WaitGroup
	start := make(chan struct{})
	for g := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			hits := batch(g)
			out := make([]limits.Decision, len(hits))
			<-start
			ok, err := s.Decide(context.Background(), hits, now, out)
			if err != nil {
				t.Error(err)
				return
			}
			if ok {
				admitted.Add(1)
			}
		}()
	}
	close(start)
	wg.Wait()
	return admitted.Load()
}

// read peeks cost 0 at each hit and returns what remains.
func read(t *testing.T, s limits.Store, hits []limits.Hit, now time.Time) []int64 {
	t.Helper()
	probe := make([]limits.Hit, len(hits))
	for i, h := range hits {
		probe[i] = h
		probe[i].Cost = 0
	}
	out := make([]limits.Decision, len(hits))
	if _, err := s.Peek(context.Background(), probe, now, out); err != nil {
		t.Fatal(err)
	}
	rem := make([]int64, len(hits))
	for i := range out {
		rem[i] = out[i].Remaining
	}
	return rem
}

func one(r *limits.Rule, key string) []limits.Hit {
	return []limits.Hit{{Rule: r, Key: limits.KeyOf("caller", key), Cost: 1}}
}

// Seed 001, Behaviour Story 4, and the same for sliding windows.
func TestConcurrentRequestsAreExact(t *testing.T) {
	eachStore(t, func(t *testing.T, newStore func() limits.Store) {
		t.Run("story4/concurrent-requests-respect-the-limit", func(t *testing.T) {
			for round := range 10 {
				s := newStore()
				r := tb("r", 10, time.Minute, 10)
				if n := fire(t, s, 20, func(int) []limits.Hit { return one(r, "a") }, at(0)); n != 10 {
					t.Fatalf("round %d: %d of 20 admitted against 10 tokens, want exactly 10", round, n)
				}
			}
		})
		t.Run("story4/no-phantom-tokens", func(t *testing.T) {
			for round := range 10 {
				s := newStore()
				r := tb("r", 10, time.Minute, 10)
				for range 9 {
					allow(t, s, r, "a", 1, at(0))
				}
				if n := fire(t, s, 5, func(int) []limits.Hit { return one(r, "a") }, at(0)); n != 1 {
					t.Fatalf("round %d: %d of 5 admitted against 1 token, want exactly 1", round, n)
				}
			}
		})
		t.Run("story4/clients-do-not-block-each-other", func(t *testing.T) {
			s := newStore()
			r := tb("r", 10, time.Minute, 5)
			var perKey [2]atomic.Int64
			var wg sync.WaitGroup
			for g := range 20 {
				wg.Add(1)
				go func() {
					defer wg.Done()
					if allow(t, s, r, fmt.Sprint(g%2), 1, at(0)).Allowed {
						perKey[g%2].Add(1)
					}
				}()
			}
			wg.Wait()
			if a, b := perKey[0].Load(), perKey[1].Load(); a != 5 || b != 5 {
				t.Fatalf("admitted %d and %d of 10 each against 5 tokens each, want 5 and 5", a, b)
			}
		})
		t.Run("window-and-bucket-batch/100-goroutines", func(t *testing.T) {
			s := newStore()
			w := sw("w", 30, time.Minute)
			b := tb("b", 1, time.Hour, 40)
			batch := []limits.Hit{{Rule: w, Key: limits.KeyOf("caller", "a"), Cost: 1}, {Rule: b, Key: limits.KeyOf("caller", "a"), Cost: 1}}
			if n := fire(t, s, 100, func(int) []limits.Hit { return batch }, at(0)); n != 30 {
				t.Fatalf("%d of 100 batches admitted, want exactly 30", n)
			}
			if rem := read(t, s, batch, at(0)); rem[0] != 0 || rem[1] != 10 {
				t.Fatalf("remaining %v, want [0 10]: only the admitted batches were recorded", rem)
			}
		})
		t.Run("refusing-third-rule-leaves-the-others-untouched", func(t *testing.T) {
			s := newStore()
			rules := []*limits.Rule{sw("one", 10, time.Minute), tb("two", 10, time.Minute, 10), sw("three", 1, time.Minute)}
			batch := make([]limits.Hit, len(rules))
			for i, r := range rules {
				batch[i] = limits.Hit{Rule: r, Key: limits.KeyOf("caller", "a"), Cost: 1}
			}
			allow(t, s, rules[2], "a", 1, at(0)) // the third is full
			if n := fire(t, s, 100, func(int) []limits.Hit { return batch }, at(1)); n != 0 {
				t.Fatalf("%d batches admitted past a full rule", n)
			}
			if rem := read(t, s, batch, at(1)); rem[0] != 10 || rem[1] != 10 || rem[2] != 0 {
				t.Fatalf("remaining %v, want [10 10 0]: a refused batch records nothing", rem)
			}
		})
	})
}

// Memory and Redis give identical answers to the same random traffic,
// token buckets and sliding windows (within the exact slot bound),
// shadow hits, tiers, a clock that sometimes goes backwards, and
// settlements (refunds and extra charges, some long after their
// admission): the Lua scripts and the Go code run the same arithmetic.
func TestStoresAgree(t *testing.T) {
	storesAgree(t, []*limits.Rule{
		tb("b1", 10, time.Minute, 10), tb("b2", 7, 3*time.Second, 3), tb("b3", 1000, time.Hour, 25),
		sw("w1", 5, 10*time.Second), sw("w2", 40, time.Minute),
		shadow(tb("s1", 3, time.Second, 2)), shadow(sw("s2", 2, 5*time.Second)),
	}, 4000, 300*time.Millisecond, 1)
}

// The same for sliding windows of many slots, where Redis keeps the
// middle of the window in a list: exact ones (a slot per admission) and
// grouped ones (past maxSlots; windows whose 1/1000 is whole µs, so that
// both stores group alike), busier than their limits, with the same
// settlements and clocks.
func TestStoresAgreeOnBigWindows(t *testing.T) {
	srv := storesAgree(t, []*limits.Rule{
		sw("x1", 60, 4*time.Second), sw("x2", 25, 2*time.Second),
		sw("g1", 5000, 2*time.Second), sw("g2", 1500, 500*time.Millisecond),
		shadow(sw("x3", 30, 3*time.Second)),
	}, 5000, 15*time.Millisecond, 5)
	// The list was used every way but one: slots pushed past the tail,
	// the front refilled from it, refunds in it (an emptied slot removed,
	// another reduced); and admissions joining the newest slot wrote the
	// header alone. The newest slot emptied and taken back from the list
	// is TestRedisWindowListAgreesWithMemory's.
	client := redis.NewClient(&redis.Options{Addr: srv.Addr})
	defer client.Close()
	info := client.Info(context.Background(), "commandstats").Val()
	for _, c := range []string{"rpush", "lrange", "ltrim", "lrem", "lset", "setrange"} {
		if !strings.Contains(info, "cmdstat_"+c+":calls=") {
			t.Errorf("no %s: the list is not exercised\n%s", strings.ToUpper(c), info)
		}
	}
}

func storesAgree(t *testing.T, rules []*limits.Rule, steps int, gap time.Duration, seed uint64) *redistest.Server {
	redistest.Require(t)
	srv := redistest.Start(t)
	mem := limits.NewMemory(limits.MemoryOptions{})
	red := newRedisStore(t, srv, true)
	rng := rand.New(rand.NewPCG(seed, 2))
	srng := rand.New(rand.NewPCG(seed+2, 4)) // settlements: the traffic stays as it was
	type pending struct {
		hit      limits.Hit
		mem, red limits.Ticket
	}
	var owed []pending // admitted hits not settled yet
	settled := 0
	now := t0
	ctx := context.Background()
	hist := map[string][]string{} // each counter's steps, shown on a disagreement
	for i := range steps {
		// Whole µs: Redis's resolution (a sliding window in Memory counts ns).
		now = now.Add(time.Duration(rng.ExpFloat64() * float64(gap))).Truncate(time.Microsecond)
		when := now
		if rng.IntN(20) == 0 {
			when = now.Add(-time.Duration(rng.IntN(5_000_000)) * time.Microsecond)
		}
		var hits []limits.Hit
		for _, ri := range rng.Perm(len(rules))[:1+rng.IntN(3)] { // a rule at most once per batch
			r := rules[ri]
			h := limits.Hit{Rule: r, Key: limits.KeyOf("caller", fmt.Sprint(rng.IntN(3))), Cost: int64(rng.IntN(4))}
			if rng.IntN(4) == 0 {
				h.Own, h.Limit, h.Burst = true, r.Limit*2, r.Burst+1
			}
			hits = append(hits, h)
		}
		peek := rng.IntN(5) == 0
		mout, rout := make([]limits.Decision, len(hits)), make([]limits.Decision, len(hits))
		var mok, rok bool
		var merr, rerr error
		if peek {
			mok, merr = mem.Peek(ctx, hits, when, mout)
			rok, rerr = red.Peek(ctx, hits, when, rout)
		} else {
			mok, merr = mem.Decide(ctx, hits, when, mout)
			rok, rerr = red.Decide(ctx, hits, when, rout)
		}
		for j, h := range hits {
			k := h.Rule.Name + h.Key.String()
			hist[k] = append(hist[k], fmt.Sprintf("%d %v ok=%v/%v peek=%v cost=%d own=%v/%d mem=%+v red=%+v", i, when.Sub(t0), mok, rok, peek, h.Cost, h.Own, h.Limit, mout[j], rout[j]))
		}
		if merr != nil || rerr != nil {
			t.Fatalf("step %d: %v %v", i, merr, rerr)
		}
		for j := range hits {
			if mout[j].Ticket.IsZero() != rout[j].Ticket.IsZero() {
				t.Fatalf("step %d: hit %d recorded by one store only: %+v %+v", i, j, mout[j], rout[j])
			}
			if !mout[j].Ticket.IsZero() {
				owed = append(owed, pending{hits[j], mout[j].Ticket, rout[j].Ticket})
			}
		}
		for len(owed) > 0 && srng.IntN(3) == 0 {
			k := srng.IntN(len(owed))
			p := owed[k]
			owed[k] = owed[len(owed)-1]
			owed = owed[:len(owed)-1]
			actual := int64(srng.IntN(2*int(p.hit.Cost) + 2))
			merr := mem.Settle(ctx, []limits.Settlement{{Hit: p.hit, Ticket: p.mem, Actual: actual}}, when)
			rerr := red.Settle(ctx, []limits.Settlement{{Hit: p.hit, Ticket: p.red, Actual: actual}}, when)
			if merr != nil || rerr != nil {
				t.Fatalf("step %d: settling: %v %v", i, merr, rerr)
			}
			k2 := p.hit.Rule.Name + p.hit.Key.String()
			hist[k2] = append(hist[k2], fmt.Sprintf("%d %v settled cost=%d own=%v/%d to %d (mem %+v, red %+v)", i, when.Sub(t0), p.hit.Cost, p.hit.Own, p.hit.Limit, actual, p.mem, p.red))
			settled++
		}
		if mok != rok || fmt.Sprint(untick(mout)) != fmt.Sprint(untick(rout)) {
			for _, h := range hits {
				for _, l := range hist[h.Rule.Name+h.Key.String()] {
					t.Log(h.Rule.Name, h.Key, l)
				}
			}
			t.Fatalf("step %d (peek %v) at %v: memory %v %+v, redis %v %+v", i, peek, when.Sub(t0), mok, mout, rok, rout)
		}
	}
	if settled < steps/8 {
		t.Fatalf("only %d settlements", settled)
	}
	return srv
}
