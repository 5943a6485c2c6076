package gate_test

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/ratelimit-proxy/ratelimit-proxy/internal/redistest"
	"github.com/ratelimit-proxy/ratelimit-proxy/upstream/gate"
)

// shared is one Redis server with a fresh prefix: mk builds instances of
// a group on it (each with its own client), rdb inspects the keys.
type shared struct {
	srv    *redistest.Server
	prefix string
	rdb    *redis.Client
}

func startShared(t *testing.T) *shared {
	t.Helper()
	srv := redistest.Start(t)
	rdb := redis.NewClient(&redis.Options{Addr: srv.Addr})
	t.Cleanup(func() { rdb.Close() })
	return &shared{srv: srv, prefix: fmt.Sprintf("gs%d:", prefixes.Add(1)), rdb: rdb}
}

func (s *shared) maker(ro gate.RedisOptions) maker { return redisMaker(s.srv.Addr, s.prefix, ro) }

// key is the name of one of a group's keys on Redis: f (slots), q (the
// queue), l (the queue's liveness), r (sends), s (state).
func key(prefix, group, k string) string { return prefix + "{gate:" + group + "}:" + k }

// zcards are the sizes of a group's slot, queue and liveness sets.
func zcards(t *testing.T, rdb redis.UniversalClient, prefix, group string) [3]int64 {
	t.Helper()
	var n [3]int64
	for i, k := range []string{"f", "q", "l"} {
		c, err := rdb.ZCard(context.Background(), key(prefix, group, k)).Result()
		if err != nil {
			t.Fatalf("ZCARD %s: %v", k, err)
		}
		n[i] = c
	}
	return n
}

// eventually polls cond every 10 ms until it holds or within passes.
func eventually(t *testing.T, within time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(within)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("not within %s: %s", within, what)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// peakMeter measures the most tickets held at once across instances.
type peakMeter struct{ cur, peak atomic.Int64 }

func (p *peakMeter) in() {
	n := p.cur.Add(1)
	for {
		old := p.peak.Load()
		if n <= old || p.peak.CompareAndSwap(old, n) {
			return
		}
	}
}

func (p *peakMeter) out() { p.cur.Add(-1) }

// hammer runs n acquires spread over the instances round robin, each
// holding its slot for hold, and returns the peak held at once.
func hammer(t *testing.T, gs []*gate.Group, n int, hold time.Duration) int64 {
	t.Helper()
	var pm peakMeter
	var wg sync.WaitGroup
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			tk, err := gs[i%len(gs)].Acquire(context.Background(), 1, time.Time{})
			if err != nil {
				t.Errorf("Acquire: %v", err)
				return
			}
			pm.in()
			time.Sleep(hold)
			pm.out()
			tk.Release()
		}()
	}
	wg.Wait()
	return pm.peak.Load()
}

// Two instances share the cap exactly; a slot freed on one goes to a
// waiter on the other at once (by notification: polling is off here);
// the queue is ordered by priority then arrival across instances.
func TestRedisTwoInstances(t *testing.T) {
	s := startShared(t)
	// A Poll far beyond the test's bounds: only the notification of a
	// freed slot can wake the other instance in time.
	mk := s.maker(gate.RedisOptions{Poll: time.Minute})
	o := opts(gate.Options{MaxInFlight: 3})
	a, b := mk(t, o), mk(t, o)

	t.Run("cap", func(t *testing.T) {
		if peak := hammer(t, []*gate.Group{a, b}, 10, 30*time.Millisecond); peak != 3 {
			t.Fatalf("peak in flight over both instances %d, want 3", peak)
		}
		if a.InFlight()+b.InFlight() != 0 {
			t.Fatalf("in flight after all released: %d + %d", a.InFlight(), b.InFlight())
		}
		if n := zcards(t, s.rdb, s.prefix, o.Name); n != [3]int64{} {
			t.Fatalf("slots, queue, liveness on Redis after all released: %v", n)
		}
	})

	t.Run("freed slot wakes the other instance", func(t *testing.T) {
		var held []*gate.Ticket
		for range 3 {
			held = append(held, acquire(t, a, 1))
		}
		waiter := pending(context.Background(), b, 1)
		waitQueued(t, b, 1, 1)
		quiet(t, waiter, 100*time.Millisecond)
		start := time.Now()
		held[0].Release()
		r := get(t, waiter, 5*time.Second)
		took := time.Since(start)
		if r.err != nil {
			t.Fatal(r.err)
		}
		t.Logf("a slot released on A reached B's waiter in %s", took)
		if took >= time.Second {
			t.Fatalf("a slot released on A reached B's waiter in %s, want < 1s", took)
		}
		r.tk.Release()
		for _, tk := range held[1:] {
			tk.Release()
		}
	})

	t.Run("queue bound shared", func(t *testing.T) {
		o := opts(gate.Options{Name: "qbound", MaxInFlight: 1, Queue: 2})
		a, b := mk(t, o), mk(t, o)
		hold := acquire(t, a, 1)
		wa, wb := pending(context.Background(), a, 1), pending(context.Background(), b, 1)
		waitQueued(t, a, 1, 1)
		waitQueued(t, b, 1, 1)
		for i, g := range []*gate.Group{a, b} {
			_, err := g.Acquire(context.Background(), 1, time.Time{})
			var busy *gate.BusyError
			if !errors.As(err, &busy) || busy.Reason != gate.ReasonQueueFull {
				t.Fatalf("instance %d, third waiter of a queue of 2: %v, want queue_full", i, err)
			}
		}
		// Both are served, one after the other (they may have arrived
		// in the same millisecond: either may be first).
		hold.Release()
		for range 2 {
			var r result
			select {
			case r = <-wa:
			case r = <-wb:
			case <-time.After(3 * time.Second):
				t.Fatal("a waiter was not served within 3s")
			}
			if r.err != nil {
				t.Fatal(r.err)
			}
			r.tk.Release()
		}
	})

	t.Run("priority then arrival across instances", func(t *testing.T) {
		o := opts(gate.Options{Name: "order", MaxInFlight: 1})
		a, b := mk(t, o), mk(t, o)
		hold := acquire(t, a, 1)
		// Arrivals: A batch, B default, A default, B interactive.
		aBatch := pending(context.Background(), a, 2)
		waitQueued(t, a, 2, 1)
		bDefault := pending(context.Background(), b, 1)
		waitQueued(t, b, 1, 1)
		time.Sleep(5 * time.Millisecond) // a later millisecond: arrival order is by ms
		aDefault := pending(context.Background(), a, 1)
		waitQueued(t, a, 1, 1)
		bInteractive := pending(context.Background(), b, 0)
		waitQueued(t, b, 0, 1)
		chs := []chan result{bInteractive, bDefault, aDefault, aBatch}
		names := []string{"B interactive", "B default", "A default", "A batch"}
		prev := hold
		for i, ch := range chs {
			prev.Release()
			r := get(t, ch, 3*time.Second)
			if r.err != nil {
				t.Fatalf("%s: %v", names[i], r.err)
			}
			prev = r.tk
			for j := i + 1; j < len(chs); j++ {
				if len(chs[j]) > 0 {
					t.Fatalf("%s served along with %s", names[j], names[i])
				}
			}
		}
		prev.Release()
	})
}

// A dead instance's slots are free again within its lease; a live one
// keeps its slots however long its request lasts.
func TestRedisLeases(t *testing.T) {
	const lease = 1500 * time.Millisecond
	s := startShared(t)
	mk := s.maker(gate.RedisOptions{Lease: lease})

	t.Run("dead instance", func(t *testing.T) {
		o := opts(gate.Options{Name: "dead", MaxInFlight: 2, MaxWait: time.Minute})
		a, b := mk(t, o), mk(t, o)
		acquire(t, a, 1)
		acquire(t, a, 1)
		waiter := pending(context.Background(), b, 1)
		waitQueued(t, b, 1, 1)
		// A dies: its renewals stop, its tickets are never released.
		a.Close()
		start := time.Now()
		r := get(t, waiter, 4*lease)
		took := time.Since(start)
		if r.err != nil {
			t.Fatal(r.err)
		}
		t.Logf("a dead instance's slot reached B's waiter %s after its death (lease %s)", took, lease)
		if took > 2*lease+time.Second {
			t.Fatalf("a dead instance's slot came back after %s, want ≤ %s", took, 2*lease+time.Second)
		}
		r.tk.Release()
	})

	t.Run("lost notification", func(t *testing.T) {
		// A slot freed without a notification (here: removed behind the
		// script's back) reaches a waiter on the next poll.
		o := opts(gate.Options{Name: "poll", MaxInFlight: 1, MaxWait: time.Minute})
		a, b := mk(t, o), mk(t, o)
		hold := acquire(t, a, 1)
		defer hold.Release()
		waiter := pending(context.Background(), b, 1)
		waitQueued(t, b, 1, 1)
		ctx := context.Background()
		ids, err := s.rdb.ZRange(ctx, key(s.prefix, o.Name, "f"), 0, -1).Result()
		if err != nil || len(ids) != 1 {
			t.Fatalf("slots %v, %v", ids, err)
		}
		start := time.Now()
		s.rdb.ZRem(ctx, key(s.prefix, o.Name, "f"), ids[0])
		r := get(t, waiter, 5*time.Second)
		if r.err != nil {
			t.Fatal(r.err)
		}
		took := time.Since(start)
		t.Logf("a slot freed silently reached B's waiter in %s (Poll 500ms)", took)
		if took > 2*time.Second {
			t.Fatalf("took %s, want about Poll", took)
		}
		r.tk.Release()
	})

	t.Run("live instance keeps its slot", func(t *testing.T) {
		o := opts(gate.Options{Name: "live", MaxInFlight: 1, MaxWait: time.Minute})
		a, b := mk(t, o), mk(t, o)
		hold := acquire(t, a, 1)
		waiter := pending(context.Background(), b, 1)
		waitQueued(t, b, 1, 1)
		quiet(t, waiter, 3*lease) // renewals keep A's slot (and B's place)
		if n := zcards(t, s.rdb, s.prefix, o.Name); n != [3]int64{1, 1, 1} {
			t.Fatalf("slots, queue, liveness on Redis while A holds and B waits: %v, want [1 1 1]", n)
		}
		hold.Release()
		r := get(t, waiter, time.Second)
		if r.err != nil {
			t.Fatal(r.err)
		}
		r.tk.Release()
	})
}

// While Redis is down each instance decides alone with its share of the
// bounds (or refuses, FailClosed); once Redis is back it is used again.
func TestRedisFallback(t *testing.T) {
	s := startShared(t)
	mk := s.maker(gate.RedisOptions{Instances: 2, Timeout: 300 * time.Millisecond})
	o := opts(gate.Options{MaxInFlight: 4, MaxWait: 200 * time.Millisecond})
	g := mk(t, o)
	closed := s.maker(gate.RedisOptions{Instances: 2, Timeout: 300 * time.Millisecond, FailClosed: true})(t,
		opts(gate.Options{Name: "closed", MaxInFlight: 4}))
	acquire(t, g, 1).Release()
	acquire(t, closed, 1).Release()

	s.srv.Stop()
	t1, t2 := acquire(t, g, 1), acquire(t, g, 1) // 4 ÷ 2 instances
	_, err := g.Acquire(context.Background(), 1, time.Time{})
	var busy *gate.BusyError
	if !errors.As(err, &busy) || busy.Reason != gate.ReasonMaxWait {
		t.Fatalf("third acquire with Redis down: %v, want max_wait (the local share is 2)", err)
	}
	// The third waits locally for a local slot.
	third := pending(context.Background(), g, 1)
	waitQueued(t, g, 1, 1)
	t1.Release()
	r := get(t, third, 3*time.Second)
	if r.err != nil {
		t.Fatal(r.err)
	}
	if _, err := closed.Acquire(context.Background(), 1, time.Time{}); !errors.Is(err, gate.ErrUnavailable) {
		t.Fatalf("FailClosed with Redis down: %v, want ErrUnavailable", err)
	}

	s.srv.Restart(t)
	start := time.Now()
	eventually(t, 10*time.Second, "a slot taken on Redis again", func() bool {
		tk, err := g.Acquire(context.Background(), 1, time.Time{})
		if err != nil {
			return false
		}
		defer tk.Release()
		n, _ := s.rdb.ZCard(context.Background(), key(s.prefix, o.Name, "f")).Result()
		return n == 1
	})
	t.Logf("Redis used again %s after its restart", time.Since(start))
	// The local tickets held across the restart go back locally.
	t2.Release()
	r.tk.Release()
	eventually(t, 5*time.Second, "FailClosed group served again", func() bool {
		tk, err := closed.Acquire(context.Background(), 1, time.Time{})
		if err == nil {
			tk.Release()
		}
		return err == nil
	})
	if g.InFlight() != 0 || closed.InFlight() != 0 {
		t.Fatalf("in flight %d, %d", g.InFlight(), closed.InFlight())
	}
	// The cap is the shared one again: 4 at once.
	var held []*gate.Ticket
	for range 4 {
		held = append(held, acquire(t, g, 1))
	}
	if n, _ := s.rdb.ZCard(context.Background(), key(s.prefix, o.Name, "f")).Result(); n != 4 {
		t.Fatalf("slots on Redis %d, want 4", n)
	}
	for _, tk := range held {
		tk.Release()
	}
}

// Waiters queued on Redis when it goes down move to the fallback: they
// are served there with the local share, and can still leave.
func TestRedisFallbackMovesWaiters(t *testing.T) {
	s := startShared(t)
	mk := s.maker(gate.RedisOptions{Instances: 2, Timeout: 300 * time.Millisecond, Poll: 50 * time.Millisecond})
	g := mk(t, opts(gate.Options{MaxInFlight: 4, MaxWait: time.Minute}))
	var held []*gate.Ticket
	for range 4 {
		held = append(held, acquire(t, g, 1)) // held on Redis
	}
	w1, w2 := pending(context.Background(), g, 1), pending(context.Background(), g, 1)
	waitQueued(t, g, 1, 2)
	ctx, cancel := context.WithCancel(context.Background())
	w3 := pending(ctx, g, 2)
	waitQueued(t, g, 2, 1)
	w4 := pending(context.Background(), g, 2)
	waitQueued(t, g, 2, 2)
	closed := s.maker(gate.RedisOptions{FailClosed: true, Timeout: 300 * time.Millisecond, Poll: 50 * time.Millisecond})(t,
		opts(gate.Options{Name: "closed", MaxInFlight: 1, MaxWait: time.Minute}))
	acquire(t, closed, 1)
	wc := pending(context.Background(), closed, 1)
	waitQueued(t, closed, 1, 1)

	s.srv.Stop()
	if r := get(t, wc, 10*time.Second); !errors.Is(r.err, gate.ErrUnavailable) {
		t.Fatalf("FailClosed waiter with Redis down: %v, want ErrUnavailable", r.err)
	}
	// The local share is 2, and this instance still holds 4 slots granted
	// on Redis: the fallback admits nobody until they end.
	quiet(t, w1, 300*time.Millisecond)
	for _, tk := range held {
		tk.Release()
	}
	// Then the two default waiters get the share (the queue's order
	// survives the move).
	r1 := get(t, w1, 10*time.Second)
	r2 := get(t, w2, 10*time.Second)
	if r1.err != nil || r2.err != nil {
		t.Fatalf("moved waiters: %v, %v", r1.err, r2.err)
	}
	quiet(t, w3, 100*time.Millisecond)
	if len(w4) > 0 {
		t.Fatal("a batch waiter was served before the default ones")
	}
	cancel() // leaves the local queue
	if r := get(t, w3, 3*time.Second); !errors.Is(r.err, context.Canceled) {
		t.Fatalf("cancelled waiter: %v", r.err)
	}
	waitQueued(t, g, 2, 1)
	r1.tk.Release()
	r4 := get(t, w4, 3*time.Second)
	if r4.err != nil {
		t.Fatal(r4.err)
	}
	r2.tk.Release()
	r4.tk.Release()
	// Every local slot is free again.
	a, b := acquire(t, g, 1), acquire(t, g, 1)
	a.Release()
	b.Release()
}

// A group on a Redis Cluster: its keys share one slot, the cap holds,
// and the notification of a freed slot crosses the cluster.
func TestRedisCluster(t *testing.T) {
	c := redistest.StartCluster(t, redistest.ClusterOptions{})
	prefix := fmt.Sprintf("gc%d:", prefixes.Add(1))
	mk := func(t *testing.T, o gate.Options) *gate.Group {
		t.Helper()
		client := redis.NewClusterClient(&redis.ClusterOptions{Addrs: c.Addrs()})
		g, err := gate.NewRedis(o, gate.RedisOptions{Client: client, Prefix: prefix, Timeout: time.Second, Poll: time.Minute})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() {
			g.Close()
			client.Close()
		})
		return g
	}
	o := opts(gate.Options{MaxInFlight: 2})
	a, b := mk(t, o), mk(t, o)
	if peak := hammer(t, []*gate.Group{a, b}, 8, 30*time.Millisecond); peak != 2 {
		t.Fatalf("peak in flight %d, want 2", peak)
	}

	h1, h2 := acquire(t, a, 1), acquire(t, a, 1)
	waiter := pending(context.Background(), b, 1)
	waitQueued(t, b, 1, 1)
	quiet(t, waiter, 100*time.Millisecond)
	start := time.Now()
	h1.Release()
	r := get(t, waiter, 5*time.Second)
	if r.err != nil {
		t.Fatal(r.err)
	}
	took := time.Since(start)
	t.Logf("a slot released on A reached B's waiter through the cluster in %s", took)
	if took >= time.Second {
		t.Fatalf("wake-up took %s, want < 1s", took)
	}
	r.tk.Release()
	h2.Release()

	cc := redis.NewClusterClient(&redis.ClusterOptions{Addrs: c.Addrs()})
	defer cc.Close()
	if n := zcards(t, cc, prefix, o.Name); n != [3]int64{} {
		t.Fatalf("slots, queue, liveness on the cluster after all released: %v", n)
	}
}

// Thousands of requests with every ending — released, client gone while
// queued, max_wait — leave nothing behind: no slot, no waiter, no key
// member, no goroutine.
func TestNoLeak(t *testing.T) {
	const ops = 3000
	run := func(t *testing.T, g *gate.Group, check func() bool) {
		acquire(t, g, 1).Release() // connections and background work started
		runtime.GC()
		base := runtime.NumGoroutine()
		var granted, gone, maxWait, full atomic.Int64
		var pm peakMeter
		var wg sync.WaitGroup
		next := atomic.Int64{}
		for range 12 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for next.Add(1) <= ops {
					prio := rand.IntN(3)
					ctx, cancel := context.WithCancel(context.Background())
					deadline := time.Time{}
					switch rand.IntN(3) {
					case 0: // the client leaves, maybe while queued
						time.AfterFunc(time.Duration(rand.IntN(3000))*time.Microsecond, cancel)
					case 1: // a short deadline: max_wait
						deadline = time.Now().Add(time.Duration(rand.IntN(5000)) * time.Microsecond)
					}
					tk, err := g.Acquire(ctx, prio, deadline)
					var busy *gate.BusyError
					switch {
					case err == nil:
						granted.Add(1)
						pm.in()
						time.Sleep(time.Duration(rand.IntN(1500)) * time.Microsecond)
						pm.out()
						tk.Release()
					case errors.Is(err, context.Canceled):
						gone.Add(1)
					case errors.As(err, &busy) && busy.Reason == gate.ReasonMaxWait:
						maxWait.Add(1)
					case errors.As(err, &busy) && busy.Reason == gate.ReasonQueueFull:
						full.Add(1)
						time.Sleep(time.Millisecond) // no spinning through the ops
					default:
						t.Errorf("Acquire: %v", err)
					}
					cancel()
				}
			}()
		}
		wg.Wait()
		t.Logf("%d granted, %d gone, %d max_wait, %d queue_full", granted.Load(), gone.Load(), maxWait.Load(), full.Load())
		if granted.Load() == 0 || gone.Load() == 0 || maxWait.Load() == 0 {
			t.Fatalf("not every ending happened")
		}
		if p := pm.peak.Load(); p > 3 {
			t.Fatalf("peak in flight %d, over the cap of 3", p)
		}
		eventually(t, 5*time.Second, "nothing in flight or waiting", func() bool {
			return g.InFlight() == 0 && g.Waiting(0) == 0 && g.Waiting(1) == 0 && g.Waiting(2) == 0 && check()
		})
		// Every slot is free: the cap's worth pass at once.
		var held []*gate.Ticket
		for range 3 {
			tk, err := g.Acquire(context.Background(), 1, time.Now().Add(time.Second))
			if err != nil {
				t.Fatalf("after the run: %v", err)
			}
			held = append(held, tk)
		}
		for _, tk := range held {
			tk.Release()
		}
		eventually(t, 10*time.Second, fmt.Sprintf("goroutines back to %d", base), func() bool {
			runtime.GC()
			return runtime.NumGoroutine() <= base+2
		})
	}
	o := opts(gate.Options{Name: "leak", MaxInFlight: 3, Queue: 8, MaxWait: 20 * time.Millisecond})
	t.Run("memory", func(t *testing.T) {
		g, err := gate.New(o)
		if err != nil {
			t.Fatal(err)
		}
		defer g.Close()
		run(t, g, func() bool { return true })
	})
	t.Run("redis", func(t *testing.T) {
		s := startShared(t)
		g := s.maker(gate.RedisOptions{})(t, o)
		var last [3]int64
		run(t, g, func() bool {
			last = zcards(t, s.rdb, s.prefix, o.Name)
			return last == [3]int64{}
		})
		if last != [3]int64{} {
			t.Fatalf("slots, queue, liveness on Redis: %v", last)
		}
	})
}
