package limits_test

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/ratelimit-proxy/ratelimit-proxy/internal/redistest"
	"github.com/ratelimit-proxy/ratelimit-proxy/limits"
)

// After any burst of concurrent batches whose counters live in three slots
// (a global window, a caller's token bucket, a caller's window), decided by
// two instances each behind its refusal memory as the binary runs them,
// every counter holds exactly what was admitted, and every caller with
// room is admitted at once: a refusal caused by another batch's part that
// was rolled back a moment later is not remembered as final.
func TestRedisClusterBurstLeavesNothingBehind(t *testing.T) {
	c := redistest.StartCluster(t, redistest.ClusterOptions{Masters: 3})
	stores := []*limits.Redis{clusterStore(t, c, "burst:", time.Second), clusterStore(t, c, "burst:", time.Second)}
	mems := []limits.Store{limits.NewRemember(stores[0], 1000), limits.NewRemember(stores[1], 1000)}
	const burst, windowLimit = 4, 5
	for round := range 24 {
		glimit := int64(6 + round%7)
		callers := 3 + round%6
		global := sw(fmt.Sprintf("global%d", round), glimit, time.Minute)
		// A refill of 1 per hour: within the test, the bucket holds
		// exactly burst minus what it admitted.
		bucket := tb(fmt.Sprintf("bucket%d", round), 1, time.Hour, burst)
		window := sw(fmt.Sprintf("window%d", round), windowLimit, time.Minute)
		batch := func(caller int) []limits.Hit {
			k := limits.KeyOf("caller", fmt.Sprint("c", caller))
			return []limits.Hit{{Rule: global, Key: limits.NewKey(), Cost: 1}, {Rule: bucket, Key: k, Cost: 1}, {Rule: window, Key: k, Cost: 1}}
		}
		admitted := make([]int64, callers)
		var total int64
		var mu sync.Mutex
		var wg sync.WaitGroup
		for i := range 24 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				out := make([]limits.Decision, 3)
				ok, err := mems[i%2].Decide(context.Background(), batch(i%callers), time.Now(), out)
				if err != nil {
					t.Error(err)
					return
				}
				if ok {
					mu.Lock()
					admitted[i%callers]++
					total++
					mu.Unlock()
				}
			}()
		}
		wg.Wait()
		if t.Failed() {
			t.FailNow()
		}
		if total > glimit {
			t.Fatalf("round %d: %d admitted past the global limit %d", round, total, glimit)
		}
		// Every counter, read from the store itself: exactly the admissions.
		if rem := read(t, stores[0], batch(0)[:1], time.Now()); rem[0] != glimit-total {
			t.Fatalf("round %d: global window has %d left after %d admitted of %d (a refused batch left a charge)", round, rem[0], total, glimit)
		}
		for ci := range callers {
			rem := read(t, stores[1], batch(ci)[1:], time.Now())
			if rem[0] != burst-admitted[ci] || rem[1] != windowLimit-admitted[ci] {
				t.Fatalf("round %d: caller %d admitted %d, its bucket and window have %v left, want [%d %d]",
					round, ci, admitted[ci], rem, burst-admitted[ci], windowLimit-admitted[ci])
			}
		}
		// Sequentially, each caller once through each instance: admitted
		// exactly when its bucket and the global window have room.
		left := glimit - total
		for ci := range callers {
			for _, m := range mems {
				out := make([]limits.Decision, 3)
				ok, err := m.Decide(context.Background(), batch(ci), time.Now(), out)
				if err != nil {
					t.Fatal(err)
				}
				room := admitted[ci] < burst && left > 0
				if ok != room {
					t.Fatalf("round %d: caller %d (admitted %d, global %d left) answered %v, want %v: %+v",
						round, ci, admitted[ci], left, ok, room, out)
				}
				if ok {
					admitted[ci]++
					left--
				}
			}
		}
	}
}

// A rollback waits for a master that is slow to answer, rather than giving
// up after a decision's timeout and leaving the part it takes back
// counted: the rollback is complete before the refusal is returned.
func TestRedisClusterRollbackOutlastsASlowMaster(t *testing.T) {
	c := redistest.StartCluster(t, redistest.ClusterOptions{Masters: 3})
	s := clusterStore(t, c, "slow:", time.Second)
	rules := []*limits.Rule{tb("bucket", 1, time.Hour, 10), sw("full", 1, time.Minute)}
	batch := splitBatch(t, c, "slow:", rules)
	ctx := context.Background()
	if ok, err := s.Decide(ctx, batch[1:], time.Now(), make([]limits.Decision, 1)); !ok || err != nil {
		t.Fatalf("filling the window: %v %v", ok, err)
	}
	node := func(h limits.Hit) *redis.Client {
		n := c.MasterOf("slow:{" + h.Rule.Name + "|" + h.Key.String() + "}")
		cl := redis.NewClient(&redis.Options{Addr: n.Addr})
		t.Cleanup(func() { cl.Close() })
		return cl
	}
	first, last := node(batch[0]), node(batch[1])
	// The refusing part (the window, decided last) answers after 600 ms;
	// meanwhile the bucket's master stops running scripts for 1.5 s: the
	// rollback of its part waits 1.1 s, longer than a decision's timeout.
	if err := last.Do(ctx, "CLIENT", "PAUSE", 600, "WRITE").Err(); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	out := make([]limits.Decision, 2)
	go func() {
		ok, err := s.Decide(ctx, batch, time.Now(), out)
		if ok {
			err = fmt.Errorf("admitted over a full window: %+v", out)
		}
		done <- err
	}()
	time.Sleep(200 * time.Millisecond)
	if err := first.Do(ctx, "CLIENT", "PAUSE", 1500, "WRITE").Err(); err != nil {
		t.Fatal(err)
	}
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if rem := read(t, s, batch[:1], time.Now()); rem[0] != 10 {
		t.Fatalf("the refused batch left its bucket at %d of 10 (a rollback given up)", rem[0])
	}
}

// A request that goes away while a part of its batch is in flight leaves
// the batch all-or-nothing: the part sent is waited for (a busy master runs
// it later anyway), then the batch is admitted or rolled back whole.
func TestRedisClusterCancelledSplitBatchIsAllOrNothing(t *testing.T) {
	c := redistest.StartCluster(t, redistest.ClusterOptions{Masters: 3})
	s := clusterStore(t, c, "gone:", time.Second)
	batch := splitBatch(t, c, "gone:", []*limits.Rule{tb("first", 1, time.Hour, 10), tb("second", 1, time.Hour, 10)})
	n := c.MasterOf("gone:{" + batch[1].Rule.Name + "|" + batch[1].Key.String() + "}")
	last := redis.NewClient(&redis.Options{Addr: n.Addr})
	t.Cleanup(func() { last.Close() })
	// The last part's master is busy for 500 ms (a script that spins).
	busy := make(chan error, 1)
	go func() {
		busy <- last.Eval(context.Background(), `local t = redis.call('TIME')
local stop = t[1] * 1000000 + t[2] + 500000
while true do
  t = redis.call('TIME')
  if t[1] * 1000000 + t[2] >= stop then return 1 end
end`, nil).Err()
	}()
	time.Sleep(50 * time.Millisecond)
	ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
	defer cancel()
	ok, err := s.Decide(ctx, batch, time.Now(), make([]limits.Decision, 2))
	if err := <-busy; err != nil {
		t.Fatal(err)
	}
	want := "[10 10]"
	if ok {
		want = "[9 9]"
	}
	if rem := read(t, s, batch, time.Now()); fmt.Sprint(rem) != want {
		t.Fatalf("a batch whose request went away (%v %v) left %v, want %s", ok, err, rem, want)
	}
}
