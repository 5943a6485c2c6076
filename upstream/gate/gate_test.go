package gate_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/ratelimit-proxy/ratelimit-proxy/internal/redistest"
	"github.com/ratelimit-proxy/ratelimit-proxy/upstream/gate"
)

var prefixes atomic.Int64

var prios = []string{"interactive", "default", "batch"}

// maker builds the instances of one group: every call is another
// instance sharing the same state (in memory there is only one).
type maker func(t *testing.T, o gate.Options) *gate.Group

// eachBackend runs f with the memory backend and, where redis-server is
// installed, the Redis one.
func eachBackend(t *testing.T, f func(t *testing.T, mk maker)) {
	t.Run("memory", func(t *testing.T) {
		f(t, func(t *testing.T, o gate.Options) *gate.Group {
			g, err := gate.New(o)
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(g.Close)
			return g
		})
	})
	t.Run("redis", func(t *testing.T) {
		srv := redistest.Start(t)
		f(t, redisMaker(srv.Addr, fmt.Sprintf("gt%d:", prefixes.Add(1)), gate.RedisOptions{}))
	})
}

func redisMaker(addr, prefix string, ro gate.RedisOptions) maker {
	return func(t *testing.T, o gate.Options) *gate.Group {
		t.Helper()
		client := redis.NewClient(&redis.Options{Addr: addr})
		ro := ro
		ro.Client, ro.Prefix = client, prefix
		if ro.Timeout == 0 {
			ro.Timeout = time.Second
		}
		g, err := gate.NewRedis(o, ro)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() {
			g.Close()
			client.Close()
		})
		return g
	}
}

func opts(o gate.Options) gate.Options {
	if o.Name == "" {
		o.Name = "chat"
	}
	if o.Priorities == nil {
		o.Priorities = prios
	}
	if o.MaxWait == 0 {
		o.MaxWait = 10 * time.Second
	}
	if o.Queue == 0 {
		o.Queue = 100
	}
	return o
}

func acquire(t *testing.T, g *gate.Group, prio int) *gate.Ticket {
	t.Helper()
	tk, err := g.Acquire(context.Background(), prio, time.Time{})
	if err != nil {
		t.Fatalf("Acquire: %v", err)
	}
	return tk
}

// pending starts an Acquire in the background; its result arrives on the
// channel.
type result struct {
	tk  *gate.Ticket
	err error
}

func pending(ctx context.Context, g *gate.Group, prio int) chan result {
	ch := make(chan result, 1)
	go func() {
		tk, err := g.Acquire(ctx, prio, time.Time{})
		ch <- result{tk, err}
	}()
	return ch
}

// waitQueued waits until g has n waiters of priority prio.
func waitQueued(t *testing.T, g *gate.Group, prio int, n int64) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for g.Waiting(prio) != n {
		if time.Now().After(deadline) {
			t.Fatalf("waiting[%d] = %d, want %d", prio, g.Waiting(prio), n)
		}
		time.Sleep(time.Millisecond)
	}
}

func get(t *testing.T, ch chan result, within time.Duration) result {
	t.Helper()
	select {
	case r := <-ch:
		return r
	case <-time.After(within):
		t.Fatalf("no answer within %s", within)
		return result{}
	}
}

func quiet(t *testing.T, ch chan result, d time.Duration) {
	t.Helper()
	select {
	case r := <-ch:
		t.Fatalf("answered early: %+v", r)
	case <-time.After(d):
	}
}

// The cap is exact under concurrency: 20 at once against a cap of 5 get
// 5 slots; the rest wait and are served as slots come back.
func TestCapExact(t *testing.T) {
	eachBackend(t, func(t *testing.T, mk maker) {
		g := mk(t, opts(gate.Options{MaxInFlight: 5}))
		var wg sync.WaitGroup
		var peak, cur atomic.Int64
		for range 20 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				tk := acquire(t, g, 1)
				n := cur.Add(1)
				for {
					p := peak.Load()
					if n <= p || peak.CompareAndSwap(p, n) {
						break
					}
				}
				time.Sleep(5 * time.Millisecond)
				cur.Add(-1)
				tk.Release()
			}()
		}
		wg.Wait()
		if peak.Load() != 5 {
			t.Fatalf("peak in flight %d, want 5", peak.Load())
		}
		if g.InFlight() != 0 {
			t.Fatalf("in flight after all released: %d", g.InFlight())
		}
	})
}

// Waiters are served by priority, then by arrival.
func TestQueueOrder(t *testing.T) {
	eachBackend(t, func(t *testing.T, mk maker) {
		g := mk(t, opts(gate.Options{MaxInFlight: 1}))
		hold := acquire(t, g, 0)
		order := []int{2, 1, 2, 0, 1, 0} // arrival order, by priority index
		chs := make([]chan result, len(order))
		counts := map[int]int64{}
		for i, p := range order {
			chs[i] = pending(context.Background(), g, p)
			counts[p]++
			waitQueued(t, g, p, counts[p])
		}
		want := []int{3, 5, 1, 4, 0, 2} // interactive, then default, then batch; each by arrival
		prev := hold
		for _, i := range want {
			prev.Release()
			r := get(t, chs[i], 3*time.Second)
			if r.err != nil {
				t.Fatalf("waiter %d: %v", i, r.err)
			}
			prev = r.tk
			for _, j := range want {
				if j != i && len(chs[j]) > 0 {
					t.Fatalf("waiter %d served with %d", j, i)
				}
			}
		}
		prev.Release()
	})
}

// The queue is bounded: past it, 503 at once; a wait past max_wait is
// refused too.
func TestQueueBoundAndMaxWait(t *testing.T) {
	eachBackend(t, func(t *testing.T, mk maker) {
		g := mk(t, opts(gate.Options{MaxInFlight: 1, Queue: 2, MaxWait: 300 * time.Millisecond}))
		hold := acquire(t, g, 1)
		a, b := pending(context.Background(), g, 1), pending(context.Background(), g, 1)
		waitQueued(t, g, 1, 2)
		_, err := g.Acquire(context.Background(), 1, time.Time{})
		var busy *gate.BusyError
		if !errors.As(err, &busy) || busy.Reason != gate.ReasonQueueFull || busy.RetryAfter < time.Second {
			t.Fatalf("third waiter: %v, want queue_full", err)
		}
		for _, ch := range []chan result{a, b} {
			r := get(t, ch, 3*time.Second)
			if !errors.As(r.err, &busy) || busy.Reason != gate.ReasonMaxWait {
				t.Fatalf("waiter: %v, want max_wait", r.err)
			}
		}
		hold.Release()
		acquire(t, g, 1).Release()
	})
}

// The caller's deadline cuts the wait short.
func TestDeadlineBoundsWait(t *testing.T) {
	eachBackend(t, func(t *testing.T, mk maker) {
		g := mk(t, opts(gate.Options{MaxInFlight: 1, MaxWait: time.Minute}))
		hold := acquire(t, g, 1)
		defer hold.Release()
		start := time.Now()
		_, err := g.Acquire(context.Background(), 1, start.Add(100*time.Millisecond))
		var busy *gate.BusyError
		if !errors.As(err, &busy) || busy.Reason != gate.ReasonMaxWait {
			t.Fatalf("got %v, want max_wait", err)
		}
		if el := time.Since(start); el > 5*time.Second {
			t.Fatalf("waited %s", el)
		}
	})
}

// A client that leaves while queued leaves the queue at once: the next
// free slot goes to the one behind it, and nothing leaks.
func TestClientGoneLeavesQueue(t *testing.T) {
	eachBackend(t, func(t *testing.T, mk maker) {
		g := mk(t, opts(gate.Options{MaxInFlight: 1}))
		hold := acquire(t, g, 1)
		ctx, cancel := context.WithCancel(context.Background())
		gone := pending(ctx, g, 1)
		waitQueued(t, g, 1, 1)
		next := pending(context.Background(), g, 1)
		waitQueued(t, g, 1, 2)
		cancel()
		if r := get(t, gone, 3*time.Second); !errors.Is(r.err, context.Canceled) {
			t.Fatalf("cancelled waiter: %v", r.err)
		}
		waitQueued(t, g, 1, 1)
		hold.Release()
		r := get(t, next, 3*time.Second)
		if r.err != nil {
			t.Fatal(r.err)
		}
		r.tk.Release()
		r.tk.Release() // a second release counts for nothing
		if g.InFlight() != 0 {
			t.Fatalf("in flight %d", g.InFlight())
		}
		// The slot is free: two in a row pass at once.
		acquire(t, g, 1).Release()
		acquire(t, g, 1).Release()
	})
}

// The outbound rate: at most Rate sends per Per; the next waits for the
// oldest to leave the window.
func TestRate(t *testing.T) {
	eachBackend(t, func(t *testing.T, mk maker) {
		g := mk(t, opts(gate.Options{Rate: 3, Per: 400 * time.Millisecond}))
		start := time.Now()
		for range 3 {
			acquire(t, g, 1).Release()
		}
		fourth := pending(context.Background(), g, 1)
		r := get(t, fourth, 3*time.Second)
		if r.err != nil {
			t.Fatal(r.err)
		}
		r.tk.Release()
		if el := time.Since(start); el < 350*time.Millisecond {
			t.Fatalf("fourth sent after %s, within the window", el)
		}
	})
}

// Zero queue or zero max_wait: nobody waits.
func TestNoQueue(t *testing.T) {
	eachBackend(t, func(t *testing.T, mk maker) {
		g := mk(t, gate.Options{Name: "q0", Priorities: prios, MaxInFlight: 1, Queue: 10})
		hold := acquire(t, g, 1)
		defer hold.Release()
		_, err := g.Acquire(context.Background(), 1, time.Time{})
		var busy *gate.BusyError
		if !errors.As(err, &busy) || busy.Reason != gate.ReasonQueueFull {
			t.Fatalf("got %v, want queue_full", err)
		}
	})
}
