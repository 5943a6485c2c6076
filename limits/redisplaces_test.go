package limits_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/ratelimit-proxy/ratelimit-proxy/internal/redistest"
	"github.com/ratelimit-proxy/ratelimit-proxy/limits"
)

func concRule(name string, limit int64) *limits.Rule {
	return &limits.Rule{Name: name, Algorithm: limits.Concurrency, Limit: limit}
}

func placesOn(t *testing.T, client redis.UniversalClient, o limits.RedisPlacesOptions) *limits.RedisPlaces {
	t.Helper()
	o.Client = client
	if o.Prefix == "" {
		o.Prefix = "pl:"
	}
	if o.Timeout == 0 {
		o.Timeout = time.Second
	}
	p := limits.NewRedisPlaces(o)
	t.Cleanup(p.Close)
	return p
}

// take asks p for one place of each rule for key; the places taken, and
// whether the batch was admitted.
func take(t *testing.T, p limits.Places, key string, rules ...*limits.Rule) ([]limits.Place, bool, []limits.Decision) {
	t.Helper()
	hits := make([]limits.Hit, len(rules))
	for i, r := range rules {
		hits[i] = limits.Hit{Rule: r, Key: limits.KeyOf("caller", key), Cost: 1}
	}
	out := make([]limits.Decision, len(hits))
	ok, err := p.Take(context.Background(), hits, out, true)
	if err != nil {
		t.Fatal(err)
	}
	var taken []limits.Place
	for i := range hits {
		if !out[i].Ticket.IsZero() {
			taken = append(taken, limits.Place{Hit: hits[i], Ticket: out[i].Ticket})
		}
	}
	return taken, ok, out
}

func inUse(t *testing.T, client redis.UniversalClient, prefix string, r *limits.Rule, key string) int64 {
	t.Helper()
	n, err := client.ZCard(context.Background(), prefix+"{"+r.Name+"|"+limits.KeyOf("caller", key).String()+"}:f").Result()
	if err != nil {
		t.Fatal(err)
	}
	return n
}

// Two instances on one Redis share a key's places; a release frees one at
// once; a batch refused by one rule takes no place of another.
func TestRedisPlacesShared(t *testing.T) {
	srv := redistest.Start(t)
	client := redis.NewClient(&redis.Options{Addr: srv.Addr})
	t.Cleanup(func() { client.Close() })
	a, b := placesOn(t, client, limits.RedisPlacesOptions{}), placesOn(t, client, limits.RedisPlacesOptions{})
	two, one := concRule("two", 2), concRule("one", 1)

	pa, ok, _ := take(t, a, "k", two)
	pb, ok2, out := take(t, b, "k", two)
	if !ok || !ok2 || out[0].Remaining != 0 || out[0].Limit != 2 {
		t.Fatalf("two places: %v %v %+v", ok, ok2, out)
	}
	if _, ok, out := take(t, a, "k", two); ok || out[0].RetryAfter != time.Second || out[0].Remaining != 0 {
		t.Fatalf("a third in flight: admitted %v %+v", ok, out)
	}
	b.Release(pb)
	if n := inUse(t, client, "pl:", two, "k"); n != 1 {
		t.Fatalf("after b's release: %d in use", n)
	}
	pa2, ok, _ := take(t, a, "k", two)
	if !ok {
		t.Fatal("a freed place was not given")
	}
	a.Release(append(pa, pa2...))
	if n := inUse(t, client, "pl:", two, "k"); n != 0 || a.Held() != 0 || b.Held() != 0 {
		t.Fatalf("all released: %d in use, held %d %d", n, a.Held(), b.Held())
	}

	// All or nothing: "one" is full, so "two" takes nothing.
	po, _, _ := take(t, b, "x", one)
	if _, ok, _ := take(t, a, "x", two, one); ok || inUse(t, client, "pl:", two, "x") != 0 {
		t.Fatalf("a refused batch took a place: %v, %d in use", ok, inUse(t, client, "pl:", two, "x"))
	}
	b.Release(po)
}

// A place lives while its instance renews it, and comes back within the
// lease when the instance dies holding it (closed without releasing).
func TestRedisPlacesLeaseOfADeadInstance(t *testing.T) {
	srv := redistest.Start(t)
	client := redis.NewClient(&redis.Options{Addr: srv.Addr})
	t.Cleanup(func() { client.Close() })
	r := concRule("c", 1)
	live := placesOn(t, client, limits.RedisPlacesOptions{Lease: 300 * time.Millisecond, Renew: 50 * time.Millisecond})
	held, ok, _ := take(t, live, "alive", r)
	if !ok {
		t.Fatal("refused")
	}
	dead := placesOn(t, client, limits.RedisPlacesOptions{Lease: 300 * time.Millisecond, Renew: 50 * time.Millisecond})
	if _, ok, _ := take(t, dead, "dead", r); !ok {
		t.Fatal("refused")
	}
	dead.Close() // dies: no release, no renewal
	other := placesOn(t, client, limits.RedisPlacesOptions{})
	deadline := time.Now().Add(5 * time.Second)
	for {
		_, ok, _ := take(t, other, "dead", r)
		if ok {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the dead instance's place never came back")
		}
		time.Sleep(20 * time.Millisecond)
	}
	// Three leases' time later, the renewed place is still held.
	time.Sleep(900 * time.Millisecond)
	if _, ok, _ := take(t, other, "alive", r); ok {
		t.Fatal("a renewed place expired")
	}
	live.Release(held)
	if _, ok, _ := take(t, other, "alive", r); !ok {
		t.Fatal("released, still held")
	}
}

// DELETE in the admin API drops a key's places; a release of a place
// dropped so removes nothing else.
func TestRedisPlacesResetKey(t *testing.T) {
	srv := redistest.Start(t)
	client := redis.NewClient(&redis.Options{Addr: srv.Addr})
	t.Cleanup(func() { client.Close() })
	p := placesOn(t, client, limits.RedisPlacesOptions{})
	r := concRule("c", 1)
	old, _, _ := take(t, p, "k", r)
	if err := p.ResetKey(context.Background(), r, limits.KeyOf("caller", "k")); err != nil {
		t.Fatal(err)
	}
	fresh, ok, _ := take(t, p, "k", r)
	if !ok {
		t.Fatal("reset, still full")
	}
	p.Release(old)
	if n := inUse(t, client, "pl:", r, "k"); n != 1 {
		t.Fatalf("the old place's release removed the new one: %d in use", n)
	}
	p.Release(fresh)
}

// Redis down with FAIL_OPEN = "local": places are taken in memory, limit
// ÷ instances, and released there.
func TestRedisPlacesLocalFallback(t *testing.T) {
	srv := redistest.Start(t)
	client := redis.NewClient(&redis.Options{Addr: srv.Addr, MaxRetries: -1})
	t.Cleanup(func() { client.Close() })
	local := limits.NewMemoryPlaces()
	p := placesOn(t, client, limits.RedisPlacesOptions{Local: local, Instances: 2, Timeout: 200 * time.Millisecond})
	srv.Stop()
	r := concRule("c", 4)
	a, ok1, _ := take(t, p, "k", r)
	b, ok2, _ := take(t, p, "k", r)
	if _, ok3, out := take(t, p, "k", r); !ok1 || !ok2 || ok3 || out[0].Limit != 2 {
		t.Fatalf("local places: %v %v %v %+v", ok1, ok2, ok3, out)
	}
	p.Release(append(a, b...))
	if local.Held() != 0 {
		t.Fatalf("%d local places held after release", local.Held())
	}
}

// On a Cluster every (rule, key) is its own slot: places are taken key by
// key, and a refusal gives back those taken before it.
func TestRedisPlacesCluster(t *testing.T) {
	redistest.Require(t)
	c := redistest.StartCluster(t, redistest.ClusterOptions{Masters: 3})
	client, err := limits.NewRedisClient(c.URL())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { client.Close() })
	a, b := placesOn(t, client, limits.RedisPlacesOptions{}), placesOn(t, client, limits.RedisPlacesOptions{})
	var rules []*limits.Rule
	for i := range 6 {
		rules = append(rules, concRule(fmt.Sprint("r", i), 1))
	}
	// b fills the last rule's place; a's batch of all six is refused, and
	// takes nothing on the five it could have.
	hb, ok, _ := take(t, b, "k", rules[5])
	if !ok {
		t.Fatal("refused")
	}
	if _, ok, _ := take(t, a, "k", rules...); ok {
		t.Fatal("admitted past a full rule")
	}
	for _, r := range rules[:5] {
		if n := inUse(t, client, "pl:", r, "k"); n != 0 {
			t.Fatalf("%s: %d place left behind by a refused batch", r.Name, n)
		}
	}
	b.Release(hb)
	ha, ok, _ := take(t, a, "k", rules...)
	if !ok || len(ha) != 6 {
		t.Fatalf("all free: %v, %d taken", ok, len(ha))
	}
	a.Release(ha)
	for _, r := range rules {
		if n := inUse(t, client, "pl:", r, "k"); n != 0 {
			t.Fatalf("%s: %d in use after release", r.Name, n)
		}
	}
}

// Many takers on two instances never hold more than the limit at once,
// and leave nothing behind.
func TestRedisPlacesNeverPastTheLimit(t *testing.T) {
	srv := redistest.Start(t)
	client := redis.NewClient(&redis.Options{Addr: srv.Addr})
	t.Cleanup(func() { client.Close() })
	stores := []*limits.RedisPlaces{placesOn(t, client, limits.RedisPlacesOptions{}), placesOn(t, client, limits.RedisPlacesOptions{})}
	r := concRule("c", 3)
	var mu sync.Mutex
	holding, most := 0, 0
	var wg sync.WaitGroup
	for g := range 16 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			p := stores[g%2]
			rng := rand.New(rand.NewPCG(uint64(g), 1))
			for range 30 {
				held, ok, _ := take(t, p, "k", r)
				if !ok {
					continue
				}
				mu.Lock()
				holding++
				most = max(most, holding)
				mu.Unlock()
				time.Sleep(time.Duration(rng.IntN(2000)) * time.Microsecond)
				mu.Lock()
				holding--
				mu.Unlock()
				p.Release(held)
			}
		}()
	}
	wg.Wait()
	if most > 3 || most == 0 {
		t.Fatalf("at most %d held at once (limit 3)", most)
	}
	if n := inUse(t, client, "pl:", r, "k"); n != 0 {
		t.Fatalf("%d places left", n)
	}
}

// A batch without a concurrency rule goes through WithPlaces as it would
// to the store alone: no allocation (the split's buffers once escaped to
// the heap for every request, 1.6 KB in four allocations).
func TestWithPlacesAddsNoAllocation(t *testing.T) {
	s := limits.WithPlaces(limits.NewMemory(limits.MemoryOptions{}), limits.NewMemoryPlaces())
	hits := []limits.Hit{{Rule: &limits.Rule{Name: "w", Algorithm: limits.SlidingWindow, Limit: 1 << 40, Window: time.Minute},
		Key: limits.KeyOf("caller", "k"), Cost: 1}}
	out := make([]limits.Decision, 1)
	ctx := context.Background()
	now := time.Unix(1_800_000_000, 0)
	s.Decide(ctx, hits, now, out) // the counter exists
	if n := testing.AllocsPerRun(200, func() {
		now = now.Add(time.Millisecond)
		s.Decide(ctx, hits, now, out)
	}); n != 0 {
		t.Fatalf("%v allocations a decision", n)
	}
}
