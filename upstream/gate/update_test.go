package gate_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/ratelimit-proxy/ratelimit-proxy/internal/redistest"
	"github.com/ratelimit-proxy/ratelimit-proxy/upstream/gate"
)

// waiters queues n requests on g and waits until they are queued.
func waiters(t *testing.T, g *gate.Group, n int) []chan result {
	t.Helper()
	chs := make([]chan result, n)
	for i := range chs {
		chs[i] = pending(context.Background(), g, 1)
	}
	waitQueued(t, g, 1, int64(n))
	return chs
}

// granted requires every waiter of chs to get its slot within d.
func granted(t *testing.T, chs []chan result, d time.Duration) {
	t.Helper()
	deadline := time.Now().Add(d)
	for i, ch := range chs {
		r := get(t, ch, max(time.Until(deadline), time.Millisecond))
		if r.err != nil {
			t.Fatalf("waiter %d: %v", i, r.err)
		}
		t.Cleanup(r.tk.Release)
	}
}

// Update raises the cap in place: the waiters queued under the old cap
// get the room at once, and the slots held carry over (no more than the
// new cap in all).
func TestUpdateRaisesCap(t *testing.T) {
	eachBackend(t, func(t *testing.T, mk maker) {
		o := opts(gate.Options{MaxInFlight: 2})
		g := mk(t, o)
		for range 2 {
			t.Cleanup(acquire(t, g, 1).Release)
		}
		chs := waiters(t, g, 4)
		o.MaxInFlight = 5
		if err := g.Update(o); err != nil {
			t.Fatal(err)
		}
		// Three of the four (they arrived together: any three) get a
		// slot; with 5 in flight the fourth waits.
		deadline := time.Now().Add(time.Second)
		got := 0
		for got < 3 && time.Now().Before(deadline) {
			for _, ch := range chs {
				select {
				case r := <-ch:
					if r.err != nil {
						t.Fatal(r.err)
					}
					t.Cleanup(r.tk.Release)
					got++
				default:
				}
			}
			time.Sleep(time.Millisecond)
		}
		if got != 3 {
			t.Fatalf("%d of the waiters got a slot within 1 s of the raise to 5, want 3", got)
		}
		time.Sleep(200 * time.Millisecond)
		if g.Waiting(1) != 1 {
			t.Fatalf("%d waiting with 5 in flight, want 1", g.Waiting(1))
		}
		if g.InFlight() != 5 {
			t.Fatalf("in flight %d, want 5", g.InFlight())
		}
		o.Priorities = []string{"high", "low"}
		if err := g.Update(o); err == nil {
			t.Fatal("an update changed the priorities")
		}
	})
}

// On Redis the limits are the group's, not an instance's: raised on one
// instance (an update, or an instance started with them), they reach
// the waiters of every instance within a second, also of an instance
// that still runs with the old ones.
func TestRedisRaisedCapReachesEveryInstance(t *testing.T) {
	for _, how := range []string{"update", "new instance"} {
		t.Run(how, func(t *testing.T) {
			srv := redistest.Start(t)
			mk := redisMaker(srv.Addr, fmt.Sprintf("gr%d:", prefixes.Add(1)), gate.RedisOptions{})
			o := opts(gate.Options{MaxInFlight: 2})
			a, b := mk(t, o), mk(t, o)
			for range 2 {
				t.Cleanup(acquire(t, a, 1).Release)
			}
			chs := append(waiters(t, a, 1), waiters(t, b, 2)...)
			time.Sleep(100 * time.Millisecond)
			for _, ch := range chs {
				if len(ch) != 0 {
					t.Fatal("a waiter got a slot over the cap")
				}
			}
			o.MaxInFlight = 5
			if how == "update" {
				if err := a.Update(o); err != nil {
					t.Fatal(err)
				}
			} else {
				mk(t, o) // a's replacement, as after a reload that changed the priorities
			}
			granted(t, chs, time.Second)
			if n := a.InFlight() + b.InFlight(); n != 5 {
				t.Fatalf("in flight %d, want 5", n)
			}
			// The cap is 5 for b too, although b was built with 2.
			extra := pending(context.Background(), b, 1)
			waitQueued(t, b, 1, 1)
			quiet(t, extra, 200*time.Millisecond)
		})
	}
}
