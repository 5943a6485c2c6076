package limits_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/ratelimit-proxy/ratelimit-proxy/internal/redistest"
	"github.com/ratelimit-proxy/ratelimit-proxy/limits"
)

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
