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

var prefixes atomic.Int64

// newRedisStore is a store on srv under a fresh prefix; clientClock makes
// it follow the test's clock instead of Redis's.
func newRedisStore(t *testing.T, srv *redistest.Server, clientClock bool) *limits.Redis {
	t.Helper()
	client := redis.NewClient(&redis.Options{Addr: srv.Addr})
	t.Cleanup(func() { client.Close() })
	s := limits.NewRedis(limits.RedisOptions{Client: client, Prefix: fmt.Sprintf("test%d:", prefixes.Add(1)),
		Timeout: time.Second, ClientClock: clientClock, TopTime: 30 * time.Second}) // Top's time bound is tested on its own
	t.Cleanup(s.Close)
	return s
}

// Two instances whose clocks disagree by hours still share one exact
// budget: the window runs on Redis's clock.
func TestRedisSkewedClocksAgree(t *testing.T) {
	srv := redistest.Start(t)
	// Two clients, as two instances have, under one prefix.
	prefix := fmt.Sprintf("skew%d:", prefixes.Add(1))
	a := limits.NewRedis(limits.RedisOptions{Client: redis.NewClient(&redis.Options{Addr: srv.Addr}), Prefix: prefix})
	b := limits.NewRedis(limits.RedisOptions{Client: redis.NewClient(&redis.Options{Addr: srv.Addr}), Prefix: prefix})
	r := rule(3, time.Minute)
	now := time.Now()
	got := []bool{
		allow(t, a, r, "k", 1, now.Add(-3*time.Hour)).Allowed,
		allow(t, b, r, "k", 1, now.Add(5*time.Hour)).Allowed,
		allow(t, a, r, "k", 1, now).Allowed,
		allow(t, b, r, "k", 1, now.Add(-time.Hour)).Allowed,
	}
	if fmt.Sprint(got) != "[true true true false]" {
		t.Fatalf("admissions %v, want the first three", got)
	}
	d := allow(t, a, r, "k", 1, now.Add(10*time.Hour))
	if d.Allowed || d.RetryAfter <= 59*time.Second || d.RetryAfter > time.Minute {
		t.Fatalf("a skewed clock changed the window: %+v", d)
	}
}

// 40 concurrent decisions split across two clients against a limit of 10
// admit exactly 10.
func TestRedisConcurrentAcrossClients(t *testing.T) {
	srv := redistest.Start(t)
	for round := 0; round < 5; round++ {
		prefix := fmt.Sprintf("conc%d:", prefixes.Add(1))
		stores := []*limits.Redis{
			limits.NewRedis(limits.RedisOptions{Client: redis.NewClient(&redis.Options{Addr: srv.Addr}), Prefix: prefix, Timeout: time.Second}),
			limits.NewRedis(limits.RedisOptions{Client: redis.NewClient(&redis.Options{Addr: srv.Addr}), Prefix: prefix, Timeout: time.Second}),
		}
		r := rule(10, time.Minute)
		var admitted atomic.Int64
		var wg sync.WaitGroup
		for i := 0; i < 40; i++ {
			wg.Add(1)
			go func() {
				defer wg.Done()
				if allow(t, stores[i%2], r, "k", 1, time.Now()).Allowed {
					admitted.Add(1)
				}
			}()
		}
		wg.Wait()
		if n := admitted.Load(); n != 10 {
			t.Fatalf("round %d: %d admitted, want exactly 10", round, n)
		}
	}
}

// A dead Redis costs at most the timeout per call, then nothing (the
// breaker opens); it is noticed back within a second of returning.
func TestRedisBreaker(t *testing.T) {
	srv := redistest.Start(t)
	var mu sync.Mutex
	var states []bool
	s := limits.NewRedis(limits.RedisOptions{
		Client: redis.NewClient(&redis.Options{Addr: srv.Addr, MaxRetries: -1}), Prefix: "breaker:", Timeout: 50 * time.Millisecond,
		OnStateChange: func(_ string, up bool, _ error) { mu.Lock(); states = append(states, up); mu.Unlock() },
	})
	t.Cleanup(s.Close)
	r := rule(100, time.Minute)
	out := make([]limits.Decision, 1)
	hits := []limits.Hit{{Rule: r, Key: limits.KeyOf("caller", "k"), Cost: 1}}
	if _, err := s.Decide(context.Background(), hits, time.Now(), out); err != nil {
		t.Fatal(err)
	}
	srv.Stop()
	for i := 0; i < 3; i++ {
		start := time.Now()
		_, err := s.Decide(context.Background(), hits, time.Now(), out)
		if err == nil || time.Since(start) > 500*time.Millisecond {
			t.Fatalf("call %d on a dead Redis: %v after %v", i, err, time.Since(start))
		}
	}
	if _, err := s.Decide(context.Background(), hits, time.Now(), out); !errors.Is(err, limits.ErrUnavailable) || s.Up() {
		t.Fatalf("breaker not open: %v", err)
	}
	srv.Restart(t)
	deadline := time.Now().Add(2 * time.Second)
	for !s.Up() && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	if !s.Up() {
		t.Fatal("Redis back, store still down after 2 s")
	}
	if _, err := s.Decide(context.Background(), hits, time.Now(), out); err != nil {
		t.Fatal(err)
	}
	mu.Lock()
	defer mu.Unlock()
	if fmt.Sprint(states) != "[false true]" {
		t.Fatalf("state changes %v, want one down then one up", states)
	}
}

func TestParseRedisURL(t *testing.T) {
	for raw, want := range map[string]string{
		"redis://:pw@h:6379/2":                        "addrs=[h:6379] master= cluster=false db=2 pw=pw",
		"rediss://h:6380":                             "addrs=[h:6380] master= cluster=false db=0 pw=",
		"redis://h1:7000,h2:7001":                     "addrs=[h1:7000 h2:7001] master= cluster=true db=0 pw=",
		"redis+sentinel://:pw@s1:26379,s2/mymaster/1": "addrs=[s1:26379 s2] master=mymaster cluster=false db=1 pw=pw",
	} {
		o, err := limits.ParseRedisURL(raw)
		if err != nil {
			t.Fatalf("%s: %v", raw, err)
		}
		got := fmt.Sprintf("addrs=%v master=%s cluster=%v db=%d pw=%s", o.Addrs, o.MasterName, o.IsClusterMode, o.DB, o.Password)
		if got != want {
			t.Errorf("%s: %s, want %s", raw, got, want)
		}
	}
	if _, err := limits.ParseRedisURL("redis+sentinel://s1:26379"); err == nil {
		t.Error("sentinel URL without a master accepted")
	}
}

// With FAIL_OPEN=local a dead Redis hands decisions to memory with the
// limit divided by the instance count.
func TestFallbackToLocal(t *testing.T) {
	srv := redistest.Start(t)
	rs := limits.NewRedis(limits.RedisOptions{Client: redis.NewClient(&redis.Options{Addr: srv.Addr, MaxRetries: -1}), Prefix: "fb:", Timeout: 50 * time.Millisecond})
	t.Cleanup(rs.Close)
	var local atomic.Int64
	f := limits.NewFallback(rs, limits.NewMemory(limits.MemoryOptions{}), 4)
	f.OnFallback = func() { local.Add(1) }
	r := rule(10, time.Minute)
	if d := allow(t, f, r, "k", 1, time.Now()); !d.Allowed || d.Remaining != 9 || local.Load() != 0 {
		t.Fatalf("shared: %+v", d)
	}
	srv.Stop()
	var admitted int
	for i := 0; i < 10; i++ {
		if d := allow(t, f, r, "k", 1, time.Now()); d.Allowed {
			admitted++
			if d.Limit != 2 {
				t.Fatalf("local limit %d, want 10/4 = 2", d.Limit)
			}
		}
	}
	if admitted != 2 || local.Load() != 10 {
		t.Fatalf("%d admitted locally (want 2), %d local decisions", admitted, local.Load())
	}
}

// Redis losing the script (a restart, SCRIPT FLUSH) is repaired on the
// next decision, without an error.
func TestRedisReloadsTheScript(t *testing.T) {
	srv := redistest.Start(t)
	client := redis.NewClient(&redis.Options{Addr: srv.Addr})
	t.Cleanup(func() { client.Close() })
	s := limits.NewRedis(limits.RedisOptions{Client: client, Prefix: "reload:", Timeout: time.Second})
	t.Cleanup(s.Close)
	if err := s.Load(context.Background()); err != nil {
		t.Fatal(err)
	}
	r := rule(5, time.Minute)
	allow(t, s, r, "k", 1, time.Now())
	if err := client.ScriptFlush(context.Background()).Err(); err != nil {
		t.Fatal(err)
	}
	if d := allow(t, s, r, "k", 1, time.Now()); !d.Allowed || d.Remaining != 3 {
		t.Fatalf("after SCRIPT FLUSH: %+v", d)
	}
}

// Requests whose callers went away do not count as Redis failures.
func TestRedisCancelledCallsKeepTheBreakerClosed(t *testing.T) {
	srv := redistest.Start(t)
	s := limits.NewRedis(limits.RedisOptions{Client: redis.NewClient(&redis.Options{Addr: srv.Addr}), Prefix: "cancel:", Timeout: time.Second})
	t.Cleanup(s.Close)
	hits := []limits.Hit{{Rule: rule(5, time.Minute), Key: limits.KeyOf("caller", "k"), Cost: 1}}
	out := make([]limits.Decision, 1)
	for i := 0; i < 5; i++ {
		ctx, cancel := context.WithCancel(context.Background())
		cancel()
		if _, err := s.Decide(ctx, hits, time.Now(), out); err == nil {
			t.Fatal("a cancelled call succeeded")
		}
	}
	if !s.Up() {
		t.Fatal("cancelled calls opened the breaker")
	}
}

// A store is ready once warmed up; an idle store learns of a dead Redis
// from Check, and of its return from the probe; MarkDown opens the
// breaker at once.
func TestRedisCheckAndMarkDown(t *testing.T) {
	srv := redistest.Start(t)
	s := limits.NewRedis(limits.RedisOptions{Client: redis.NewClient(&redis.Options{Addr: srv.Addr, MaxRetries: -1}), Prefix: "check:", Timeout: 50 * time.Millisecond})
	t.Cleanup(s.Close)
	if s.Check(context.Background()) || s.Ready() {
		t.Fatal("ready before Warm: the first burst would open connections within its timeout")
	}
	if err := s.Warm(context.Background()); err != nil {
		t.Fatal(err)
	}
	if !s.Check(context.Background()) {
		t.Fatal("Check failed with Redis up")
	}
	srv.Stop()
	if s.Check(context.Background()) {
		t.Fatal("Check passed with Redis down")
	}
	s.MarkDown(errors.New("test"))
	if s.Up() || s.Check(context.Background()) {
		t.Fatal("MarkDown did not open the breaker")
	}
	srv.Restart(t)
	if !waitUp(s, 2*time.Second) {
		t.Fatal("the probe did not notice Redis back")
	}
}

func waitUp(s *limits.Redis, d time.Duration) bool {
	deadline := time.Now().Add(d)
	for time.Now().Before(deadline) {
		if s.Up() {
			return true
		}
		time.Sleep(10 * time.Millisecond)
	}
	return false
}

// Seed 001, Behaviour Story 5 at the store's level: a failing store
// answers an error, never a refusal, so that its caller applies its
// FAIL_OPEN policy (the HTTP layer's 200 or 503); Fallback decides
// locally instead.
func TestStory5StoreFailures(t *testing.T) {
	srv := redistest.Start(t)
	rs := limits.NewRedis(limits.RedisOptions{Client: redis.NewClient(&redis.Options{Addr: srv.Addr, MaxRetries: -1}),
		Prefix: "story5:", Timeout: 50 * time.Millisecond})
	t.Cleanup(rs.Close)
	r := tb("r", 10, time.Minute, 10)
	hits := []limits.Hit{{Rule: r, Key: limits.KeyOf("caller", "k"), Cost: 1}}
	out := make([]limits.Decision, 1)
	srv.Stop()
	t.Run("story5/store-error-is-no-refusal", func(t *testing.T) {
		for _, op := range []func() (bool, error){
			func() (bool, error) { return rs.Decide(context.Background(), hits, time.Now(), out) },
			func() (bool, error) { return rs.Peek(context.Background(), hits, time.Now(), out) },
		} {
			if ok, err := op(); err == nil || ok || errors.Is(err, limits.ErrBatch) {
				t.Fatalf("a dead store answered %v %v", ok, err)
			}
		}
		if err := rs.Reset(context.Background(), r, hits[0].Key); err == nil {
			t.Fatal("Reset on a dead store succeeded")
		}
	})
	t.Run("story5/fail-open-local", func(t *testing.T) {
		f := limits.NewFallback(rs, limits.NewMemory(limits.MemoryOptions{}), 1)
		if ok, err := f.Decide(context.Background(), hits, time.Now(), out); !ok || err != nil || out[0].Remaining != 9 {
			t.Fatalf("local decision: %v %v %+v", ok, err, out[0])
		}
	})
}

// Every key the script writes has an expiry: a window's string (also
// when all its slots had left and it was written again), a bucket's.
func TestRedisKeysExpire(t *testing.T) {
	srv := redistest.Start(t)
	client := redis.NewClient(&redis.Options{Addr: srv.Addr})
	t.Cleanup(func() { client.Close() })
	s := limits.NewRedis(limits.RedisOptions{Client: client, Prefix: "ttl:", Timeout: time.Second, ClientClock: true})
	t.Cleanup(s.Close)
	w, b := sw("w", 2, time.Minute), tb("b", 10, time.Minute, 10)
	check := func(when string, keys ...string) {
		t.Helper()
		for _, k := range keys {
			ttl, err := client.PTTL(context.Background(), k).Result()
			if err != nil || ttl <= 0 {
				t.Fatalf("%s: %s has TTL %v (%v)", when, k, ttl, err)
			}
		}
	}
	wk, bk := "ttl:{w|caller=k}:w", "ttl:{b|caller=k}:b"
	allow(t, s, w, "k", 1, at(0))
	allow(t, s, b, "k", 1, at(0))
	check("first admission", wk, bk)
	allow(t, s, w, "k", 1, at(30))
	check("second admission", wk)
	// At 100 s both slots have left: they are dropped, then the admission
	// counted.
	allow(t, s, w, "k", 1, at(100))
	check("after the window emptied", wk)
	if ttl := client.PTTL(context.Background(), bk).Val(); ttl > 8*time.Second {
		t.Fatalf("a bucket one token short of full kept for %v", ttl)
	}
}

// A window's keys expire one window after its last admission, when every
// slot has left it (a slot leaves with its latest admission), on Redis's
// clock as on a store's own: and a thousandth of the window later, so
// that the admissions joining the newest slot in its thousandth write the
// header alone, without an expiry.
func TestRedisWindowKeysLiveOneWindow(t *testing.T) {
	srv := redistest.Start(t)
	client := redis.NewClient(&redis.Options{Addr: srv.Addr})
	t.Cleanup(func() { client.Close() })
	for _, own := range []bool{false, true} {
		prefix := fmt.Sprintf("life%v:", own)
		s := limits.NewRedis(limits.RedisOptions{Client: client, Prefix: prefix, Timeout: time.Second, ClientClock: own})
		t.Cleanup(s.Close)
		w := sw("w", 5, time.Minute)
		base := time.Now()
		for i, after := range []time.Duration{0, 20 * time.Second, 50 * time.Second} {
			now := base.Add(after)
			if !own {
				now = time.Now()
			}
			if !allow(t, s, w, "k", 1, now).Allowed {
				t.Fatalf("admission %d refused", i)
			}
			for _, k := range []string{prefix + "{w|caller=k}:w"} {
				ttl, err := client.PTTL(context.Background(), k).Result()
				if err != nil || ttl > time.Minute+60*time.Millisecond || ttl < time.Minute-5*time.Second {
					t.Fatalf("store clock %v, admission %d: %s expires in %v (%v), want one window and a thousandth, 60.06 s", own, i, k, ttl, err)
				}
			}
		}
	}
}

// A window of many slots keeps its middle in a list (see redis.lua).
// Refunds that empty the newest slots take the list's newest back into
// the string, and the front runs out and is refilled from the list, with
// every answer Memory's.
func TestRedisWindowListAgreesWithMemory(t *testing.T) {
	srv := redistest.Start(t)
	red := newRedisStore(t, srv, true)
	mem := limits.NewMemory(limits.MemoryOptions{})
	r := sw("list", 100, 10*time.Second)
	ctx := context.Background()
	hit := limits.Hit{Rule: r, Key: limits.KeyOf("caller", "k"), Cost: 2}
	type both struct{ mem, red limits.Ticket }
	var tickets []both
	same := func(label string, now time.Time, peek bool) {
		t.Helper()
		mo, ro := make([]limits.Decision, 1), make([]limits.Decision, 1)
		var mok, rok bool
		var merr, rerr error
		if peek {
			h := hit
			h.Cost = 0
			mok, merr = mem.Peek(ctx, []limits.Hit{h}, now, mo)
			rok, rerr = red.Peek(ctx, []limits.Hit{h}, now, ro)
		} else {
			mok, merr = mem.Decide(ctx, []limits.Hit{hit}, now, mo)
			rok, rerr = red.Decide(ctx, []limits.Hit{hit}, now, ro)
			if mok && rok {
				tickets = append(tickets, both{mo[0].Ticket, ro[0].Ticket})
			}
		}
		if merr != nil || rerr != nil || mok != rok || fmt.Sprint(untick(mo)) != fmt.Sprint(untick(ro)) {
			t.Fatalf("%s: memory %v %v %+v, redis %v %v %+v", label, mok, merr, mo[0], rok, rerr, ro[0])
		}
	}
	settle := func(i int, actual int64, now time.Time) {
		t.Helper()
		if err := mem.Settle(ctx, []limits.Settlement{{Hit: hit, Ticket: tickets[i].mem, Actual: actual}}, now); err != nil {
			t.Fatal(err)
		}
		if err := red.Settle(ctx, []limits.Settlement{{Hit: hit, Ticket: tickets[i].red, Actual: actual}}, now); err != nil {
			t.Fatal(err)
		}
	}
	client := redis.NewClient(&redis.Options{Addr: srv.Addr})
	t.Cleanup(func() { client.Close() })
	calls := func(cmd string) int64 {
		t.Helper()
		info := client.Info(ctx, "commandstats").Val()
		var n int64
		if _, rest, ok := strings.Cut(info, "cmdstat_"+cmd+":calls="); ok {
			fmt.Sscanf(rest, "%d", &n)
		}
		return n
	}
	// 30 admissions 0.1 s apart: a slot each, most of them in the list.
	for i := range 30 {
		same(fmt.Sprint("admission ", i), at(0.1*float64(i+1)), false)
	}
	if calls("rpush") == 0 {
		t.Fatal("no slot went to the list")
	}
	// Give back the newest ten whole, newest first, then half of some in
	// the list: the string's tail empties and takes the list's newest.
	for i := 29; i >= 20; i-- {
		settle(i, 0, at(3.1))
		same(fmt.Sprint("after refunding ", i), at(3.1), true)
	}
	for _, i := range []int{12, 14, 9} {
		settle(i, 1, at(3.2))
		same(fmt.Sprint("after settling ", i), at(3.2), true)
	}
	if calls("rpop") == 0 || calls("lset") == 0 {
		t.Fatal("the list's newest never came back, or no slot in it was settled")
	}
	// Time passes: the front leaves the window and is refilled from the
	// list, while admissions go on.
	for i := range 40 {
		now := at(10 + 0.05*float64(i))
		same(fmt.Sprint("later ", i), now, i%3 == 0)
	}
	if calls("ltrim") == 0 {
		t.Fatal("the front was never refilled")
	}
	// A whole window later nothing is left, in the string or the list.
	same("a window later", at(30), true)
}

// A list deleted by hand (or evicted) is no error: the window goes on
// with what its string holds, and gives nothing back for admissions that
// were counted in the list.
func TestRedisWindowWithoutItsList(t *testing.T) {
	srv := redistest.Start(t)
	client := redis.NewClient(&redis.Options{Addr: srv.Addr})
	t.Cleanup(func() { client.Close() })
	s := limits.NewRedis(limits.RedisOptions{Client: client, Prefix: "lost:", Timeout: time.Second, ClientClock: true})
	t.Cleanup(s.Close)
	ctx := context.Background()
	r := sw("w", 100, 10*time.Second)
	var tickets []limits.Ticket
	for i := range 30 {
		d := allow(t, s, r, "k", 1, at(0.1*float64(i+1)))
		tickets = append(tickets, d.Ticket)
	}
	if n := client.Exists(ctx, "lost:{w|caller=k}:l").Val(); n != 1 {
		t.Fatal("no list")
	}
	client.Del(ctx, "lost:{w|caller=k}:l")
	hit := limits.Hit{Rule: r, Key: limits.KeyOf("caller", "k"), Cost: 1}
	// The first refund finds the list gone: the units it held are
	// forgotten (the window holds what its string does). A refund of an
	// admission that was in the list gives nothing back.
	remaining := func() int64 { return allow(t, s, r, "k", 0, at(3.5)).Remaining }
	refund := func(i int) {
		t.Helper()
		if err := s.Settle(ctx, []limits.Settlement{{Hit: hit, Ticket: tickets[i], Actual: 0}}, at(3.5)); err != nil {
			t.Fatal(err)
		}
	}
	before := remaining()
	refund(12)
	lost := remaining()
	if lost <= before || lost >= 100 {
		t.Fatalf("remaining %d, then %d once the list was found gone", before, lost)
	}
	for _, i := range []int{13, 3, 14} {
		refund(i)
		if n := remaining(); n != lost {
			t.Fatalf("admission %d given back after the list was lost: remaining %d, then %d", i, lost, n)
		}
	}
	// Admissions go on, and the front leaving the window is no error.
	for i := range 50 {
		if d := allow(t, s, r, "k", 1, at(4+0.2*float64(i))); !d.Allowed {
			t.Fatalf("admission %d refused: %+v", i, d)
		}
	}
}

// A bucket written by an earlier release ("tokens last", text) is read
// as it was, by decisions and settlements, and written in this one's
// form: an upgrade does not refill it.
func TestRedisBucketOfAnEarlierRelease(t *testing.T) {
	srv := redistest.Start(t)
	client := redis.NewClient(&redis.Options{Addr: srv.Addr})
	t.Cleanup(func() { client.Close() })
	s := limits.NewRedis(limits.RedisOptions{Client: client, Prefix: "old:", Timeout: time.Second, ClientClock: true})
	t.Cleanup(s.Close)
	ctx := context.Background()
	r := tb("b", 10, time.Minute, 10)
	now := at(0)
	// A ticket to settle, then both buckets as an earlier release left them.
	hit := limits.Hit{Rule: r, Key: limits.KeyOf("caller", "s"), Cost: 3}
	out := make([]limits.Decision, 1)
	if ok, err := s.Decide(ctx, []limits.Hit{hit}, now, out); !ok || err != nil {
		t.Fatal(ok, err)
	}
	old := fmt.Sprintf("%.17g %d", 3.5, now.UnixMicro())
	for _, k := range []string{"old:{b|caller=k}:b", "old:{b|caller=s}:b"} {
		if err := client.Set(ctx, k, old, time.Minute).Err(); err != nil {
			t.Fatal(err)
		}
	}
	if d := allow(t, s, r, "k", 1, now); !d.Allowed || d.Remaining != 2 {
		t.Fatalf("a bucket of 3.5 tokens taken 1: %+v", d)
	}
	if v := client.Get(ctx, "old:{b|caller=k}:b").Val(); v == old || len(v) != 17 {
		t.Fatalf("the bucket was written back as %q", v)
	}
	if d := allow(t, s, r, "k", 2, now); !d.Allowed || d.Remaining != 0 {
		t.Fatalf("2.5 tokens taken 2: %+v", d)
	}
	// A settlement reads the text too: 3.5 tokens, 2 given back.
	if err := s.Settle(ctx, []limits.Settlement{{Hit: hit, Ticket: out[0].Ticket, Actual: 1}}, now); err != nil {
		t.Fatal(err)
	}
	if d := allow(t, s, r, "s", 0, now); d.Remaining != 5 {
		t.Fatalf("3.5 tokens and 2 given back: %+v", d)
	}
}
