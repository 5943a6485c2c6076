package limits_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/ratelimit-proxy/ratelimit-proxy/internal/redistest"
	"github.com/ratelimit-proxy/ratelimit-proxy/limits"
)

// counting is a store that counts the decisions it is asked for, and can
// be made to fail.
type counting struct {
	limits.Store
	calls atomic.Int64
	down  atomic.Bool
}

func (c *counting) Decide(ctx context.Context, hits []limits.Hit, now time.Time, out []limits.Decision) (bool, error) {
	c.calls.Add(1)
	if c.down.Load() {
		return false, limits.ErrUnavailable
	}
	return c.Store.Decide(ctx, hits, now, out)
}

func (c *counting) Reset(ctx context.Context, r *limits.Rule, k limits.Key) error {
	if c.down.Load() {
		return limits.ErrUnavailable
	}
	return c.Store.Reset(ctx, r, k)
}

func (c *counting) Peek(ctx context.Context, hits []limits.Hit, now time.Time, out []limits.Decision) (bool, error) {
	c.calls.Add(1)
	if c.down.Load() {
		return false, limits.ErrUnavailable
	}
	return c.Store.Peek(ctx, hits, now, out)
}

func decideOne(s limits.Store, r *limits.Rule, key string, cost int64, now time.Time) (limits.Decision, error) {
	out := make([]limits.Decision, 1)
	_, err := s.Decide(context.Background(), []limits.Hit{{Rule: r, Key: limits.KeyOf("caller", key), Cost: cost}}, now, out)
	return out[0], err
}

func TestRememberRefusals(t *testing.T) {
	for name, newStore := range stores(t) {
		t.Run(name, func(t *testing.T) {
			inner := &counting{Store: newStore(t)}
			s := limits.NewRemember(inner, 1000)
			r := rule(3, time.Minute)
			t0 := time.Date(2026, 1, 1, 12, 0, 0, 0, time.UTC)
			for i := range 3 {
				if d, err := decideOne(s, r, "k", 1, t0.Add(time.Duration(i)*time.Second)); err != nil || !d.Allowed {
					t.Fatalf("admission %d: %+v %v", i, d, err)
				}
			}
			first, err := decideOne(s, r, "k", 1, t0.Add(10*time.Second))
			if err != nil || first.Allowed || first.RetryAfter != 50*time.Second {
				t.Fatalf("the refusal: %+v %v", first, err)
			}
			asked := inner.calls.Load()
			// The next requests are refused from memory, their times
			// counted down, and the store is not asked — dead or alive.
			inner.down.Store(true)
			for i := 1; i <= 200; i++ {
				now := t0.Add(10*time.Second + time.Duration(i)*200*time.Millisecond)
				d, err := decideOne(s, r, "k", 1, now)
				want := 50*time.Second - time.Duration(i)*200*time.Millisecond
				if err != nil || d.Allowed || d.RetryAfter != want || d.Remaining != 0 || d.Limit != 3 || d.ResetAfter < d.RetryAfter {
					t.Fatalf("request %d: %+v %v, want a refusal with %v to wait", i, d, err, want)
				}
			}
			if n := inner.calls.Load() - asked; n != 0 {
				t.Fatalf("the store was asked %d times for a remembered caller", n)
			}
			// A caller never refused still goes to the store (and fails with it).
			if _, err := decideOne(s, r, "other", 1, t0.Add(20*time.Second)); !errors.Is(err, limits.ErrUnavailable) {
				t.Fatalf("a caller never refused: %v", err)
			}
			inner.down.Store(false)
			// A cheaper request, or the rule changed, is decided by the store.
			before := inner.calls.Load()
			decideOne(s, r, "k", 0, t0.Add(51*time.Second))
			changed := rule(10, time.Minute)
			if d, _ := decideOne(s, changed, "k", 1, t0.Add(52*time.Second)); !d.Allowed {
				t.Fatalf("a rule raised to 10 still refuses from memory: %+v", d)
			}
			if inner.calls.Load()-before != 2 {
				t.Fatalf("a cheaper request or a changed rule was answered from memory")
			}
			// When the wait ends, the store decides again: at 61 s the
			// admissions at 0 s and 1 s have left the window; those at 2 s
			// and 52 s (under the raised rule) remain.
			if d, err := decideOne(s, r, "k", 1, t0.Add(61*time.Second)); err != nil || !d.Allowed || d.Remaining != 0 {
				t.Fatalf("at the end of the wait: %+v %v", d, err)
			}
		})
	}
}

func TestRememberForgetAndBounds(t *testing.T) {
	inner := &counting{Store: limits.NewMemory(limits.MemoryOptions{})}
	s := limits.NewRemember(inner, 32).(*limits.Remember)
	r := rule(0, time.Minute) // refuses everything
	now := time.Now()
	for i := range 100 {
		decideOne(s, r, fmt.Sprint(i), 1, now)
	}
	st := s.Stats()
	if st.Entries > 32 || st.Evictions < 100-32 {
		t.Fatalf("100 refusals in a memory of 32: %+v", st)
	}
	// A cost-0 limit never fits: the refusal waits a whole window.
	decideOne(s, r, "f", 1, now)
	before := inner.calls.Load()
	decideOne(s, r, "f", 1, now)
	if inner.calls.Load() != before {
		t.Fatal("not remembered")
	}
	s.Forget(r.Name, limits.KeyOf("caller", "f"))
	decideOne(s, r, "f", 1, now)
	if inner.calls.Load() != before+1 {
		t.Fatal("Forget did not forget the key")
	}
	s.Forget(r.Name, limits.Key{})
	if st := s.Stats(); st.Entries != 0 {
		t.Fatalf("Forget(rule) left %d entries", st.Entries)
	}
	decideOne(s, r, "g", 1, now)
	if n := s.Sweep(now.Add(2 * time.Minute)); n != 1 || s.Stats().Entries != 0 {
		t.Fatalf("Sweep dropped %d", n)
	}
	small := limits.NewRemember(inner, 2).(*limits.Remember)
	for i := range 10 {
		decideOne(small, r, fmt.Sprint("s", i), 1, now)
	}
	// Two shards of one entry each; the seeded hash puts all ten keys in
	// one of them about once in 500 runs, which leaves one entry.
	if st := small.Stats(); st.Entries < 1 || st.Entries > 2 || st.Evictions != 10-int64(st.Entries) {
		t.Fatalf("10 refusals in a memory of 2: %+v", st)
	}
	if limits.NewRemember(inner, 0) != limits.Store(inner) {
		t.Fatal("size 0 is not the store itself")
	}
}

// The attack of issue 17 against a real Redis: a refused caller's next 200
// requests, sequential and 50 at once, cost Redis at most 10 decisions.
func TestRememberSparesRedis(t *testing.T) {
	srv := redistest.Start(t)
	client := redis.NewClient(&redis.Options{Addr: srv.Addr})
	t.Cleanup(func() { client.Close() })
	store := limits.NewRedis(limits.RedisOptions{Client: client, Prefix: "remember:", Timeout: time.Second})
	t.Cleanup(store.Close)
	s := limits.NewRemember(store, 1000)
	r := rule(5, time.Minute)
	for range 6 {
		decideOne(s, r, "attacker", 1, time.Now())
	}
	client.ConfigResetStat(context.Background())
	for range 100 {
		if d, err := decideOne(s, r, "attacker", 1, time.Now()); err != nil || d.Allowed || d.RetryAfter <= 0 {
			t.Fatalf("%+v %v", d, err)
		}
	}
	var wg sync.WaitGroup
	for range 50 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range 2 {
				if d, err := decideOne(s, r, "attacker", 1, time.Now()); err != nil || d.Allowed {
					t.Errorf("%+v %v", d, err)
				}
			}
		}()
	}
	wg.Wait()
	info, err := client.Info(context.Background(), "commandstats").Result()
	if err != nil {
		t.Fatal(err)
	}
	calls := 0
	for _, line := range strings.Split(info, "\n") {
		if strings.HasPrefix(line, "cmdstat_evalsha:") {
			fmt.Sscanf(line[strings.Index(line, "calls=")+len("calls="):], "%d", &calls)
		}
	}
	if calls > 10 {
		t.Fatalf("200 requests of a refused caller ran %d decisions on Redis", calls)
	}
}

// Token-bucket refusals are remembered with their exact wait; shadow hits
// never are; a memory holds only for the same effective limits; Peek reads
// and feeds the memory; Reset forgets it.
func TestRememberBucketsShadowsTiersPeekReset(t *testing.T) {
	ctx := context.Background()
	t.Run("token bucket", func(t *testing.T) {
		inner := &counting{Store: limits.NewMemory(limits.MemoryOptions{})}
		s := limits.NewRemember(inner, 100)
		r := tb("r", 10, time.Minute, 10)
		for range 10 {
			decideOne(s, r, "k", 1, at(0))
		}
		if d, _ := decideOne(s, r, "k", 1, at(2)); d.Allowed || d.RetryAfter != 4*time.Second {
			t.Fatalf("the refusal: %+v", d)
		}
		before := inner.calls.Load()
		if d, _ := decideOne(s, r, "k", 1, at(3)); d.Allowed || d.RetryAfter != 3*time.Second || d.Remaining != 0 {
			t.Fatalf("from memory: %+v", d)
		}
		if inner.calls.Load() != before {
			t.Fatal("a remembered bucket refusal asked the store")
		}
		if d, _ := decideOne(s, r, "k", 1, at(6)); !d.Allowed || d.Remaining != 0 {
			t.Fatalf("at the end of the wait: %+v", d)
		}
	})
	t.Run("shadow hits are never remembered", func(t *testing.T) {
		inner := &counting{Store: limits.NewMemory(limits.MemoryOptions{})}
		s := limits.NewRemember(inner, 100)
		sh := shadow(sw("shadow", 0, time.Minute))
		for i := range 3 {
			ok, err := s.Decide(ctx, one(sh, "k"), at(float64(i)), make([]limits.Decision, 1))
			if !ok || err != nil {
				t.Fatalf("a shadow-only batch refused: %v", err)
			}
		}
		if n := inner.calls.Load(); n != 3 {
			t.Fatalf("the store was asked %d times for 3 batches", n)
		}
		// An enforcing refusal beside a refusing shadow hit: only the
		// enforcing one is remembered.
		en := sw("enforce", 0, time.Minute)
		batch := []limits.Hit{one(en, "k")[0], one(sh, "k")[0]}
		s.Decide(ctx, batch, at(10), make([]limits.Decision, 2))
		before := inner.calls.Load()
		s.Decide(ctx, one(sh, "k"), at(11), make([]limits.Decision, 1))
		if inner.calls.Load() != before+1 {
			t.Fatal("a shadow hit was answered from memory")
		}
		if st := s.(*limits.Remember).Stats(); st.Entries != 1 {
			t.Fatalf("%d refusals remembered, want the enforcing one", st.Entries)
		}
	})
	t.Run("effective limits", func(t *testing.T) {
		inner := &counting{Store: limits.NewMemory(limits.MemoryOptions{})}
		s := limits.NewRemember(inner, 100)
		r := tb("r", 10, time.Minute, 10)
		tier := func(limit, burst int64) []limits.Hit {
			h := one(r, "k")
			h[0].Own, h[0].Limit, h[0].Burst = true, limit, burst
			return h
		}
		out := make([]limits.Decision, 1)
		for range 2 {
			s.Decide(ctx, tier(60, 2), at(0), out)
		}
		if ok, _ := s.Decide(ctx, tier(60, 2), at(0), out); ok || out[0].Limit != 60 {
			t.Fatalf("the tier's refusal: %+v", out[0])
		}
		before := inner.calls.Load()
		s.Decide(ctx, tier(60, 2), at(0.5), out)
		if inner.calls.Load() != before {
			t.Fatal("the same tier was not answered from memory")
		}
		s.Decide(ctx, tier(60, 5), at(0.5), out)
		s.Decide(ctx, tier(120, 2), at(0.5), out)
		if inner.calls.Load() != before+2 {
			t.Fatal("another burst or limit was answered from the memory of a refusal under the tier")
		}
	})
	t.Run("peek", func(t *testing.T) {
		inner := &counting{Store: limits.NewMemory(limits.MemoryOptions{})}
		s := limits.NewRemember(inner, 100)
		r := sw("r", 1, time.Minute)
		out := make([]limits.Decision, 1)
		s.Decide(ctx, one(r, "k"), at(0), out)
		// The refusal a Peek finds is remembered: the Decide after it is
		// answered from memory, and so is the next Peek.
		if ok, _ := s.Peek(ctx, one(r, "k"), at(1), out); ok || out[0].RetryAfter != 59*time.Second {
			t.Fatalf("peek: %+v", out[0])
		}
		before := inner.calls.Load()
		if ok, _ := s.Decide(ctx, one(r, "k"), at(2), out); ok || out[0].RetryAfter != 58*time.Second {
			t.Fatalf("decide after the peek: %+v", out[0])
		}
		if ok, _ := s.Peek(ctx, one(r, "k"), at(3), out); ok || out[0].RetryAfter != 57*time.Second {
			t.Fatalf("peek from memory: %+v", out[0])
		}
		if inner.calls.Load() != before {
			t.Fatal("remembered refusals asked the store")
		}
	})
	t.Run("reset", func(t *testing.T) {
		inner := &counting{Store: limits.NewMemory(limits.MemoryOptions{})}
		s := limits.NewRemember(inner, 100)
		r := tb("r", 1, time.Hour, 1)
		out := make([]limits.Decision, 1)
		s.Decide(ctx, one(r, "k"), at(0), out)
		s.Decide(ctx, one(r, "k"), at(1), out)
		if err := s.Reset(ctx, r, limits.KeyOf("caller", "k")); err != nil {
			t.Fatal(err)
		}
		if ok, _ := s.Decide(ctx, one(r, "k"), at(2), out); !ok || out[0].Remaining != 0 {
			t.Fatalf("after Reset: %+v", out[0])
		}
	})
}

// A batch answered from memory shows, for a hit whose own remembered
// refusal was of a larger cost, the key's state as last seen (kept fresh
// by later snapshots), not a full limit; that refusal still answers a
// request of its cost without the store.
func TestRememberShowsStateBesideALargerRefusal(t *testing.T) {
	ctx := context.Background()
	inner := &counting{Store: limits.NewMemory(limits.MemoryOptions{})}
	s := limits.NewRemember(inner, 100)
	req, tok := sw("rpm", 3, time.Minute), sw("tpm", 100, time.Minute)
	batch := func(cost int64) []limits.Hit {
		return []limits.Hit{{Rule: req, Key: limits.KeyOf("caller", "k"), Cost: 1}, {Rule: tok, Key: limits.KeyOf("caller", "k"), Cost: cost}}
	}
	out := make([]limits.Decision, 2)
	if ok, _ := s.Decide(ctx, batch(30), at(0), out); !ok {
		t.Fatal("first")
	}
	if ok, _ := s.Decide(ctx, batch(80), at(1), out); ok || out[1].Allowed { // tpm refuses 80 with 70 left
		t.Fatalf("the larger one: %+v", out)
	}
	for i := range 2 {
		if ok, _ := s.Decide(ctx, batch(10), at(2+float64(i)), out); !ok {
			t.Fatalf("small %d: %+v", i, out)
		}
	}
	// rpm is spent: the store refuses it (a peek at tpm's state beside),
	// then memory does.
	for i := range 2 {
		ok, err := s.Peek(ctx, batch(0), at(5+float64(i)), out)
		if ok || err != nil || out[0].Allowed || !out[1].Allowed || out[1].Remaining != 50 || out[1].Limit != 100 {
			t.Fatalf("refusal %d: %+v %v, want tpm's 50 left", i, out, err)
		}
	}
	before := inner.calls.Load()
	if ok, _ := s.Decide(ctx, []limits.Hit{batch(80)[1]}, at(7), out[:1]); ok || out[0].Remaining != 50 {
		t.Fatalf("the larger cost again: %+v", out[0])
	}
	if inner.calls.Load() != before {
		t.Fatal("the larger cost's remembered refusal asked the store")
	}
}
