package gate_test

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/ratelimit-proxy/ratelimit-proxy/upstream/gate"
)

// fairGroup is a group of the backend mk makes, with fair share on.
func fairGroup(t *testing.T, mk maker, o gate.Options) *gate.Group {
	t.Helper()
	o.Fair = true
	return mk(t, opts(o))
}

// grantLog collects the grants of background Acquires, tagged by key.
type grant struct {
	key string
	tk  *gate.Ticket
	err error
}

func fairPending(ctx context.Context, g *gate.Group, prio int, f gate.Fair, out chan<- grant) {
	go func() {
		tk, err := g.AcquireFair(ctx, prio, f, time.Time{})
		out <- grant{f.Key, tk, err}
	}()
}

func next(t *testing.T, ch <-chan grant) grant {
	t.Helper()
	select {
	case gr := <-ch:
		if gr.err != nil {
			t.Fatalf("%s: %v", gr.key, gr.err)
		}
		return gr
	case <-time.After(5 * time.Second):
		t.Fatal("no grant within 5s")
		return grant{}
	}
}

// One caller's backlog of 1,000 queued requests delays another caller's
// single request by at most one turn: it is granted within the next two
// grants after it arrives.
func TestFairBacklogDelaysOtherByOneTurn(t *testing.T) {
	eachBackend(t, func(t *testing.T, mk maker) {
		g := fairGroup(t, mk, gate.Options{MaxInFlight: 1, Queue: 2000})
		hold := acquire(t, g, 1)
		ch := make(chan grant, 1100)
		for range 1000 {
			fairPending(context.Background(), g, 1, gate.Fair{Key: "batch-tenant"}, ch)
		}
		waitQueued(t, g, 1, 1000)
		// A few of the backlog's go first, so that the newcomer arrives in
		// the middle of the ring's life, not at its start.
		prev := hold
		for range 5 {
			prev.Release()
			prev = next(t, ch).tk
		}
		fairPending(context.Background(), g, 1, gate.Fair{Key: "alice"}, ch)
		waitQueued(t, g, 1, 996)
		at := 0
		for i := 1; i <= 4; i++ {
			prev.Release()
			gr := next(t, ch)
			prev = gr.tk
			if gr.key == "alice" {
				at = i
				break
			}
		}
		if at == 0 || at > 2 {
			t.Fatalf("alice granted at grant %d after arriving, want 1 or 2", at)
		}
		// The backlog carries on alone, one grant per release.
		for range 10 {
			prev.Release()
			if gr := next(t, ch); gr.key != "batch-tenant" {
				t.Fatalf("grant to %s", gr.key)
			} else {
				prev = gr.tk
			}
		}
		prev.Release()
	})
}

// A caller alone gets the whole capacity: every slot freed goes to it at
// once while it has waiters (work-conserving), whatever its weight.
func TestFairLoneCallerTakesAll(t *testing.T) {
	eachBackend(t, func(t *testing.T, mk maker) { testFairLoneCallerTakesAll(t, mk) })
}

func testFairLoneCallerTakesAll(t *testing.T, mk maker) {
	for _, w := range []int{1, 3} {
		t.Run(fmt.Sprintf("weight%d", w), func(t *testing.T) {
			g := fairGroup(t, mk, gate.Options{MaxInFlight: 4})
			held := []*gate.Ticket{acquire(t, g, 1), acquire(t, g, 1), acquire(t, g, 1), acquire(t, g, 1)}
			ch := make(chan grant, 20)
			for range 20 {
				fairPending(context.Background(), g, 1, gate.Fair{Key: "solo", Weight: w}, ch)
			}
			waitQueued(t, g, 1, 20)
			for _, tk := range held {
				tk.Release()
			}
			// The four slots go to four waiters at once; then each release
			// hands its slot on, so that four are always in flight.
			var flying []*gate.Ticket
			for range 4 {
				flying = append(flying, next(t, ch).tk)
			}
			for i := range 16 {
				if n := g.InFlight(); n != 4 {
					t.Fatalf("in flight %d with %d waiting, want 4", n, g.Waiting(1))
				}
				flying[i%4].Release()
				flying[i%4] = next(t, ch).tk
			}
			waitQueued(t, g, 1, 0)
			for _, tk := range flying {
				tk.Release()
			}
			if g.InFlight() != 0 {
				t.Fatalf("in flight %d", g.InFlight())
			}
		})
	}
}

// Weights 3:1 share the grants 3:1 while both are backlogged, within one
// turn; each turn is whole (three of pro's in a row).
func TestFairWeights(t *testing.T) {
	eachBackend(t, func(t *testing.T, mk maker) {
		g := fairGroup(t, mk, gate.Options{MaxInFlight: 1, Queue: 1000})
		hold := acquire(t, g, 1)
		ch := make(chan grant, 900)
		for range 400 {
			fairPending(context.Background(), g, 1, gate.Fair{Key: "pro", Weight: 3}, ch)
			fairPending(context.Background(), g, 1, gate.Fair{Key: "free", Weight: 1}, ch)
		}
		waitQueued(t, g, 1, 800)
		prev := hold
		count := map[string]int{}
		var seq []byte
		for range 400 {
			prev.Release()
			gr := next(t, ch)
			prev = gr.tk
			count[gr.key]++
			seq = append(seq, gr.key[0])
		}
		if count["pro"] < 300-3 || count["pro"] > 300+3 || count["free"] < 100-1 || count["free"] > 100+1 {
			t.Fatalf("400 grants: pro %d, free %d, want 300 and 100 (±1 turn)", count["pro"], count["free"])
		}
		// After the first turn the pattern is ppp f ppp f …
		for i := 8; i+4 <= len(seq); i += 4 {
			window := string(seq[i : i+4])
			n := 0
			for _, c := range window {
				if c == 'f' {
					n++
				}
			}
			if n != 1 {
				t.Fatalf("grants %d..%d: %q, want one free per four", i, i+3, window)
			}
		}
		prev.Release()
		for range 400 { // the rest, so that nothing is left waiting
			next(t, ch).tk.Release()
		}
	})
}

// Turns are per priority: a higher priority is served first whatever
// the keys; a client gone from the lane whose turn it is hands the turn
// on; the queue bound counts every key's waiters together.
func TestFairPriorityGoneAndBound(t *testing.T) {
	eachBackend(t, func(t *testing.T, mk maker) {
		g := fairGroup(t, mk, gate.Options{MaxInFlight: 1, Queue: 4})
		hold := acquire(t, g, 0)
		ch := make(chan grant, 10)
		ctx, cancel := context.WithCancel(context.Background())
		fairPending(ctx, g, 1, gate.Fair{Key: "a"}, ch)
		waitQueued(t, g, 1, 1)
		fairPending(context.Background(), g, 1, gate.Fair{Key: "b"}, ch)
		waitQueued(t, g, 1, 2)
		fairPending(context.Background(), g, 2, gate.Fair{Key: "a"}, ch)
		waitQueued(t, g, 2, 1)
		fairPending(context.Background(), g, 0, gate.Fair{Key: "c"}, ch)
		waitQueued(t, g, 0, 1)
		// Four wait: the fifth, of a new key, is refused.
		var busy *gate.BusyError
		if _, err := g.AcquireFair(context.Background(), 1, gate.Fair{Key: "d"}, time.Time{}); !errors.As(err, &busy) || busy.Reason != gate.ReasonQueueFull {
			t.Fatalf("fifth waiter: %v, want queue_full", err)
		}
		cancel() // a's request of priority 1 leaves: the turn is b's
		if gr := <-ch; !errors.Is(gr.err, context.Canceled) {
			t.Fatalf("gone waiter: %+v", gr)
		}
		waitQueued(t, g, 1, 1)
		prev := hold
		for _, want := range []string{"c", "b", "a"} {
			prev.Release()
			gr := next(t, ch)
			if gr.key != want {
				t.Fatalf("grant to %s, want %s", gr.key, want)
			}
			prev = gr.tk
		}
		prev.Release()
		if g.InFlight() != 0 {
			t.Fatalf("in flight %d", g.InFlight())
		}
	})
}

// On Redis the turns are shared: a backlog queued on one instance delays
// a single request queued on another by at most one turn, whichever
// instance frees the slot; and once every waiter is gone the fair state
// holds no caller (only each priority's virtual time).
func TestRedisFairAcrossInstances(t *testing.T) {
	s := startShared(t)
	mk := s.maker(gate.RedisOptions{Poll: time.Minute}) // woken by the freed-slot notification alone
	o := gate.Options{MaxInFlight: 1, Queue: 500}
	a, b := fairGroup(t, mk, o), fairGroup(t, mk, o)
	hold := acquire(t, a, 1)
	ch := make(chan grant, 300)
	for range 200 {
		fairPending(context.Background(), a, 1, gate.Fair{Key: "batch", Weight: 1}, ch)
	}
	waitQueued(t, a, 1, 200)
	prev := hold
	for range 3 {
		prev.Release()
		prev = next(t, ch).tk
	}
	fairPending(context.Background(), b, 1, gate.Fair{Key: "alice", Weight: 1}, ch)
	waitQueued(t, b, 1, 1)
	if n := b.FairKeys(1); n != 1 {
		t.Fatalf("b's fair keys waiting %d, want 1", n)
	}
	at := 0
	for i := 1; i <= 3 && at == 0; i++ {
		prev.Release()
		gr := next(t, ch)
		prev = gr.tk
		if gr.key == "alice" {
			at = i
		}
	}
	if at == 0 || at > 2 {
		t.Fatalf("alice (on the other instance) granted at grant %d after arriving, want 1 or 2", at)
	}
	prev.Release()
	for range 200 - 3 - (at - 1) {
		next(t, ch).tk.Release()
	}
	fields, err := s.rdb.HKeys(context.Background(), key(s.prefix, "chat", "v")).Result()
	if err != nil {
		t.Fatal(err)
	}
	if len(fields) != 1 || fields[0] != "v1" {
		t.Fatalf("fair state after the queue emptied: %q, want only v1", fields)
	}
}

// A caller whose queued requests all left (timeouts, clients gone) is not
// pushed back behind its abandoned places: its next request is served
// within one turn of a backlogged caller's.
func TestRedisFairAbandonedPlacesForgotten(t *testing.T) {
	s := startShared(t)
	g := fairGroup(t, s.maker(gate.RedisOptions{}), gate.Options{MaxInFlight: 1, Queue: 500})
	hold := acquire(t, g, 1)
	ch := make(chan grant, 300)
	for range 100 {
		fairPending(context.Background(), g, 1, gate.Fair{Key: "batch", Weight: 1}, ch)
	}
	waitQueued(t, g, 1, 100)
	gone := make(chan grant, 100)
	ctx, cancel := context.WithCancel(context.Background())
	for range 50 {
		fairPending(ctx, g, 1, gate.Fair{Key: "flaky", Weight: 1}, gone)
	}
	waitQueued(t, g, 1, 150)
	cancel()
	for range 50 {
		if gr := <-gone; !errors.Is(gr.err, context.Canceled) {
			t.Fatalf("a left waiter: %+v", gr)
		}
	}
	waitQueued(t, g, 1, 100)
	prev := hold
	for range 2 {
		prev.Release()
		prev = next(t, ch).tk
	}
	fairPending(context.Background(), g, 1, gate.Fair{Key: "flaky", Weight: 1}, ch)
	waitQueued(t, g, 1, 99)
	at := 0
	for i := 1; i <= 3 && at == 0; i++ {
		prev.Release()
		gr := next(t, ch)
		prev = gr.tk
		if gr.key == "flaky" {
			at = i
		}
	}
	if at == 0 || at > 2 {
		t.Fatalf("flaky's new request granted at grant %d, want 1 or 2 (not behind its 50 abandoned places)", at)
	}
	prev.Release()
	for range 100 - 2 - (at - 1) {
		next(t, ch).tk.Release()
	}
}
