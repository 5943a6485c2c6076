package limits_test

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/ratelimit-proxy/ratelimit-proxy/internal/redistest"
	"github.com/ratelimit-proxy/ratelimit-proxy/limits"
)

// A decision made while the shared store was down is settled in the local
// store, with the hit scaled as it was decided there, and never reaches
// Redis; one made by Redis is settled in Redis.
func TestFallbackSettlesLocally(t *testing.T) {
	srv := redistest.Start(t)
	newStore := func() *limits.Redis {
		client := redis.NewClient(&redis.Options{Addr: srv.Addr, MaxRetries: -1})
		t.Cleanup(func() { client.Close() })
		s := limits.NewRedis(limits.RedisOptions{Client: client, Prefix: "fbsettle:", Timeout: time.Second, ProbeEvery: time.Hour})
		t.Cleanup(s.Close)
		return s
	}
	rs, witness := newStore(), newStore() // witness reads Redis while rs is down
	local := limits.NewMemory(limits.MemoryOptions{})
	f := limits.NewFallback(rs, local, 2)
	r := sw("tokens", 100, time.Minute)
	r.Settles = true
	hit := limits.Hit{Rule: r, Key: limits.KeyOf("caller", "k"), Cost: 20}
	ctx := context.Background()
	decide := func() limits.Ticket {
		t.Helper()
		out := make([]limits.Decision, 1)
		if ok, err := f.Decide(ctx, []limits.Hit{hit}, time.Now(), out); !ok || err != nil {
			t.Fatalf("decision: %v %v %+v", ok, err, out[0])
		}
		return out[0].Ticket
	}
	shared := decide()
	rs.MarkDown(errors.New("test: Redis is down"))
	local1, local2 := decide(), decide() // 40 of the local 50
	// Settled while Redis is down: the local store only, no error.
	if err := f.Settle(ctx, []limits.Settlement{{Hit: hit, Ticket: local1, Actual: 5}}, time.Now()); err != nil {
		t.Fatalf("settling a local decision asked Redis: %v", err)
	}
	scaled := hit
	scaled.Own, scaled.Limit = true, 50
	if rem := read(t, local, []limits.Hit{scaled}, time.Now()); rem[0] != 50-5-20 {
		t.Fatalf("local store: %d remaining, want 25", rem[0])
	}
	// A shared decision cannot be settled while Redis is down; the local
	// one beside it is.
	err := f.Settle(ctx, []limits.Settlement{{Hit: hit, Ticket: shared, Actual: 0}, {Hit: hit, Ticket: local2, Actual: 0}}, time.Now())
	if !errors.Is(err, limits.ErrUnavailable) {
		t.Fatalf("settling a shared decision with Redis down: %v", err)
	}
	if rem := read(t, local, []limits.Hit{scaled}, time.Now()); rem[0] != 50-5 {
		t.Fatalf("local store: %d remaining, want 45", rem[0])
	}
	if rem := read(t, witness, []limits.Hit{hit}, time.Now()); rem[0] != 80 {
		t.Fatalf("Redis: %d remaining, want 80: only the shared decision, never settled", rem[0])
	}
	// The shared decision, settled through another instance's store.
	if err := witness.Settle(ctx, []limits.Settlement{{Hit: hit, Ticket: shared, Actual: 12}}, time.Now()); err != nil {
		t.Fatal(err)
	}
	if rem := read(t, witness, []limits.Hit{hit}, time.Now()); rem[0] != 88 {
		t.Fatalf("Redis: %d remaining, want 88", rem[0])
	}
}

// A refusal under a rule whose charges are settled later is answered from
// memory for at most 1 s, with its real wait counted down; then the store
// decides again (a refund may have made room). Settle reaches the store.
func TestRememberSettlesRuleForOneSecond(t *testing.T) {
	inner := &counting{Store: limits.NewMemory(limits.MemoryOptions{})}
	s := limits.NewRemember(inner, 100)
	r := sw("tokens", 10, time.Minute)
	r.Settles = true
	plain := sw("requests", 1, time.Minute)
	ctx := context.Background()
	out := make([]limits.Decision, 1)
	hit := limits.Hit{Rule: r, Key: limits.KeyOf("caller", "k"), Cost: 10}
	if ok, _ := s.Decide(ctx, []limits.Hit{hit}, at(0), out); !ok {
		t.Fatal(out[0])
	}
	reserved := out[0].Ticket
	allow(t, s, plain, "k", 1, at(0))
	if d := allow(t, s, r, "k", 5, at(1)); d.Allowed || d.RetryAfter != 59*time.Second {
		t.Fatalf("the refusal: %+v", d)
	}
	if d := allow(t, s, plain, "k", 1, at(1)); d.Allowed || d.RetryAfter != 59*time.Second {
		t.Fatalf("the plain refusal: %+v", d)
	}
	// The reservation is settled: 8 back, in the store behind.
	if err := s.Settle(ctx, []limits.Settlement{{Hit: hit, Ticket: reserved, Actual: 2}}, at(1.2)); err != nil {
		t.Fatal(err)
	}
	before := inner.calls.Load()
	for _, sec := range []float64{1.5, 1.999} {
		d := allow(t, s, r, "k", 5, at(sec))
		if want := time.Duration((60 - sec) * float64(time.Second)); d.Allowed || d.RetryAfter != want {
			t.Fatalf("at %vs: %+v, want a refusal from memory with %v to wait", sec, d, want)
		}
	}
	if inner.calls.Load() != before {
		t.Fatal("the store was asked within 1 s of the refusal")
	}
	if d := allow(t, s, r, "k", 5, at(2)); !d.Allowed || d.Remaining != 3 || inner.calls.Load() != before+1 {
		t.Fatalf("1 s after the refusal: %+v (store asked %d times)", d, inner.calls.Load()-before)
	}
	// A rule that does not settle stays remembered until its wait ends.
	if d := allow(t, s, plain, "k", 1, at(30)); d.Allowed || d.RetryAfter != 30*time.Second || inner.calls.Load() != before+1 {
		t.Fatalf("the plain refusal at 30 s: %+v", d)
	}
}

// Concurrent reservations of cost C against a limit L, each settled to a
// random actual cost up to C as soon as it is admitted: the counter never
// holds more than L (every admission fitted what was reserved and settled
// before it), and in the end it holds exactly the sum of the actual costs.
func TestSettleConcurrentReservations(t *testing.T) {
	eachStore(t, func(t *testing.T, newStore func() limits.Store) {
		for _, r := range []*limits.Rule{sw("w", 100, time.Hour), tb("b", 1, time.Hour, 100)} {
			t.Run(string(r.Algorithm), func(t *testing.T) {
				s := newStore()
				const goroutines, attempts, cost, limit = 16, 20, 10, 100
				now := at(0) // one instant: nothing leaves the window, nothing refills
				var settled, admitted atomic.Int64
				var wg sync.WaitGroup
				start := make(chan struct{})
				for g := range goroutines {
					wg.Add(1)
					go func() {
						defer wg.Done()
						rng := rand.New(rand.NewPCG(uint64(g), 9))
						hit := limits.Hit{Rule: r, Key: limits.KeyOf("caller", "k"), Cost: cost}
						out := make([]limits.Decision, 1)
						<-start
						for range attempts {
							ok, err := s.Decide(context.Background(), []limits.Hit{hit}, now, out)
							if err != nil {
								t.Error(err)
								return
							}
							if !ok {
								continue
							}
							if used := limit - out[0].Remaining; used < cost || used > limit {
								t.Errorf("admitted with %d of %d counted", used, limit)
							}
							admitted.Add(1)
							actual := rng.Int64N(cost + 1)
							err = s.Settle(context.Background(), []limits.Settlement{{Hit: hit, Ticket: out[0].Ticket, Actual: actual}}, now)
							if err != nil {
								t.Error(err)
								return
							}
							settled.Add(actual)
						}
					}()
				}
				close(start)
				wg.Wait()
				used := limit - read(t, s, one(r, "k"), now)[0]
				if used != settled.Load() || used > limit {
					t.Fatalf("%d counted after %d admissions settled to %d in all (limit %d)", used, admitted.Load(), settled.Load(), limit)
				}
				if admitted.Load() <= limit/cost {
					t.Fatalf("%d admitted: the refunds made no room", admitted.Load())
				}
				t.Logf("%d of %d reservations admitted, %d units used", admitted.Load(), goroutines*attempts, used)
			})
		}
	})
}

// clusterSettle: a batch whose two counters live on two masters is
// admitted, then settled (a refund and an extra charge): both corrected,
// one script per slot.
func clusterSettle(t *testing.T, c *redistest.Cluster) {
	s := clusterStore(t, c, "settle:", time.Second)
	rules := []*limits.Rule{sw("window", 100, time.Minute), tb("bucket", 1, time.Hour, 100)}
	batch := splitBatch(t, c, "settle:", rules)
	for i := range batch {
		batch[i].Cost = 40
	}
	out := make([]limits.Decision, len(batch))
	if ok, err := s.Decide(context.Background(), batch, time.Now(), out); !ok || err != nil {
		t.Fatalf("%v %v %+v", ok, err, out)
	}
	err := s.Settle(context.Background(), []limits.Settlement{
		{Hit: batch[0], Ticket: out[0].Ticket, Actual: 10},
		{Hit: batch[1], Ticket: out[1].Ticket, Actual: 55},
	}, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	if rem := read(t, s, batch, time.Now()); fmt.Sprint(rem) != "[90 45]" {
		t.Fatalf("remaining %v after settling 40 to 10 and 55, want [90 45]", rem)
	}
	// A refused split batch is rolled back: its decisions carry no ticket.
	batch[1].Cost = 100
	if ok, err := s.Decide(context.Background(), batch, time.Now(), out); ok || err != nil {
		t.Fatalf("%v %v %+v", ok, err, out)
	}
	for i := range out {
		if !out[i].Ticket.IsZero() {
			t.Fatalf("hit %d of a refused batch has a ticket: %+v", i, out[i])
		}
	}
}

// On a Cluster, a settlement group whose master is dead fails without
// stopping the others; the first error is returned.
func TestRedisClusterSettleSurvivesADeadMaster(t *testing.T) {
	c := redistest.StartCluster(t, redistest.ClusterOptions{Masters: 3, PartialCoverage: true})
	s := clusterStore(t, c, "settledead:", 200*time.Millisecond)
	r := sw("w", 100, time.Minute)
	keys := keysOnDistinctMasters(t, c, "settledead:", "w", 2)
	var ss []limits.Settlement
	for _, k := range keys {
		hit := limits.Hit{Rule: r, Key: limits.KeyOf("caller", k), Cost: 50}
		out := make([]limits.Decision, 1)
		if ok, err := s.Decide(context.Background(), []limits.Hit{hit}, time.Now(), out); !ok || err != nil {
			t.Fatal(ok, err)
		}
		ss = append(ss, limits.Settlement{Hit: hit, Ticket: out[0].Ticket, Actual: 20})
	}
	c.Kill(c.MasterOf("settledead:{w|caller=" + keys[0] + "}:w"))
	start := time.Now()
	if err := s.Settle(context.Background(), ss, time.Now()); err == nil {
		t.Fatal("settling on a dead master succeeded")
	}
	if took := time.Since(start); took > 2*time.Second {
		t.Fatalf("settling took %v", took)
	}
	hit := ss[1].Hit
	if rem := read(t, s, []limits.Hit{hit}, time.Now()); rem[0] != 80 {
		t.Fatalf("the live master's counter: %d remaining, want 80 (settled from 50 to 20)", rem[0])
	}
}

// Every key a settlement writes has an expiry: a window's two keys and a
// bucket's one, also when the charge makes them again (after a Reset).
func TestRedisSettleKeysExpire(t *testing.T) {
	srv := redistest.Start(t)
	client := redis.NewClient(&redis.Options{Addr: srv.Addr})
	t.Cleanup(func() { client.Close() })
	s := limits.NewRedis(limits.RedisOptions{Client: client, Prefix: "settlettl:", Timeout: time.Second, ClientClock: true})
	t.Cleanup(s.Close)
	ctx := context.Background()
	keys := []string{"settlettl:{w|caller=k}:w", "settlettl:{b|caller=k}:b"}
	for _, r := range []*limits.Rule{sw("w", 10, time.Minute), tb("b", 10, time.Minute, 10)} {
		hit := limits.Hit{Rule: r, Key: limits.KeyOf("caller", "k"), Cost: 2}
		out := make([]limits.Decision, 1)
		if ok, err := s.Decide(ctx, []limits.Hit{hit}, at(0), out); !ok || err != nil {
			t.Fatal(ok, err)
		}
		if err := s.Reset(ctx, r, hit.Key); err != nil {
			t.Fatal(err)
		}
		if err := s.Settle(ctx, []limits.Settlement{{Hit: hit, Ticket: out[0].Ticket, Actual: 5}}, at(1)); err != nil {
			t.Fatal(err)
		}
	}
	for _, k := range keys {
		if ttl, err := client.PTTL(ctx, k).Result(); err != nil || ttl <= 0 {
			t.Fatalf("%s has TTL %v (%v)", k, ttl, err)
		}
	}
}

// Redis losing the scripts (a restart, SCRIPT FLUSH) is repaired by the
// next settlement, without an error.
func TestRedisSettleReloadsTheScript(t *testing.T) {
	srv := redistest.Start(t)
	client := redis.NewClient(&redis.Options{Addr: srv.Addr})
	t.Cleanup(func() { client.Close() })
	s := limits.NewRedis(limits.RedisOptions{Client: client, Prefix: "settlereload:", Timeout: time.Second})
	t.Cleanup(s.Close)
	ctx := context.Background()
	if err := s.Load(ctx); err != nil {
		t.Fatal(err)
	}
	r := sw("r", 10, time.Minute)
	hit := limits.Hit{Rule: r, Key: limits.KeyOf("caller", "k"), Cost: 6}
	out := make([]limits.Decision, 1)
	if ok, err := s.Decide(ctx, []limits.Hit{hit}, time.Now(), out); !ok || err != nil {
		t.Fatal(ok, err)
	}
	if err := client.ScriptFlush(ctx).Err(); err != nil {
		t.Fatal(err)
	}
	if err := s.Settle(ctx, []limits.Settlement{{Hit: hit, Ticket: out[0].Ticket, Actual: 1}}, time.Now()); err != nil {
		t.Fatal(err)
	}
	if rem := read(t, s, []limits.Hit{hit}, time.Now()); rem[0] != 9 {
		t.Fatalf("after SCRIPT FLUSH: %d remaining, want 9", rem[0])
	}
}
