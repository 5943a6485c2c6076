package limits_test

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/ratelimit-proxy/ratelimit-proxy/internal/redistest"
	"github.com/ratelimit-proxy/ratelimit-proxy/limits"
)

// topStores are the Listers Top is checked on, each made fresh: Memory,
// Redis on one server and on a Cluster (both on the test's clock), and
// the wrappers around them.
func topStores(top *testing.T) map[string]func(t *testing.T) limits.Store {
	var srv *redistest.Server
	var cluster *redistest.Cluster
	single := func(t *testing.T) *limits.Redis {
		redistest.Require(t)
		if srv == nil {
			srv = redistest.Start(top)
		}
		return newRedisStore(t, srv, true)
	}
	return map[string]func(t *testing.T) limits.Store{
		"memory": func(*testing.T) limits.Store { return limits.NewMemory(limits.MemoryOptions{}) },
		"remember": func(*testing.T) limits.Store {
			return limits.NewRemember(limits.NewMemory(limits.MemoryOptions{}), 100)
		},
		"redis": func(t *testing.T) limits.Store { return single(t) },
		"fallback": func(t *testing.T) limits.Store {
			return limits.NewFallback(single(t), limits.NewMemory(limits.MemoryOptions{}), 2)
		},
		"cluster": func(t *testing.T) limits.Store {
			redistest.Require(t)
			if cluster == nil {
				cluster = redistest.StartCluster(top, redistest.ClusterOptions{Masters: 3})
			}
			client, err := limits.NewRedisClient(cluster.URL())
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { client.Close() })
			s := limits.NewRedis(limits.RedisOptions{Client: client, Prefix: fmt.Sprintf("top%d:", prefixes.Add(1)),
				Timeout: time.Second, ClientClock: true, TopTime: 30 * time.Second}) // not the bound under test: a loaded machine
			t.Cleanup(s.Close)
			return s
		},
	}
}

func topOf(t *testing.T, s limits.Store, q limits.TopQuery, now time.Time) limits.TopResult {
	t.Helper()
	res, err := s.(limits.Lister).Top(context.Background(), q, now)
	if err != nil {
		t.Fatalf("Top: %v", err)
	}
	return res
}

func peekOne(t *testing.T, s limits.Store, h limits.Hit, now time.Time) limits.Decision {
	t.Helper()
	out := make([]limits.Decision, 1)
	if _, err := s.Peek(context.Background(), []limits.Hit{h}, now, out); err != nil {
		t.Fatalf("Peek: %v", err)
	}
	return out[0]
}

// 50 keys used 1..50 times under rule "a": the top 5 are the 5 most used,
// in order, with the numbers a Peek of each key reads; rule "ab"'s keys
// (more used) and a counter that has emptied are not among them.
func TestTopWindow(t *testing.T) {
	for name, mk := range topStores(t) {
		t.Run(name, func(t *testing.T) {
			s := mk(t)
			a := &limits.Rule{Name: "a", Algorithm: limits.SlidingWindow, Limit: 100, Window: time.Minute}
			ab := &limits.Rule{Name: "ab", Algorithm: limits.SlidingWindow, Limit: 1000, Window: time.Minute}
			allow(t, s, a, "gone", 99, at(0)) // left the window at 60 s
			for i := range 50 {
				for range i + 1 {
					if !allow(t, s, a, fmt.Sprintf("k%02d", i), 1, at(30+float64(i)/10)).Allowed {
						t.Fatal("refused")
					}
				}
				allow(t, s, ab, fmt.Sprintf("k%02d", i), 500, at(30))
			}
			now := at(61)
			res := topOf(t, s, limits.TopQuery{Rule: a, N: 5}, now)
			if res.Truncated || len(res.Keys) != 5 {
				t.Fatalf("top 5: %d keys, truncated %v", len(res.Keys), res.Truncated)
			}
			for j, ks := range res.Keys {
				i := 49 - j
				want := limits.KeyOf("caller", fmt.Sprintf("k%02d", i))
				if ks.Key != want || ks.Used != int64(i+1) || ks.Limit != 100 || ks.Decision.Remaining != 100-int64(i+1) {
					t.Fatalf("#%d: %s used %d limit %d remaining %d, want %s used %d", j, ks.Key, ks.Used, ks.Limit, ks.Decision.Remaining, want, i+1)
				}
				d := peekOne(t, s, limits.Hit{Rule: a, Key: ks.Key}, now)
				if d.Remaining != ks.Decision.Remaining || d.ResetAfter != ks.Decision.ResetAfter || d.Limit != ks.Decision.Limit {
					t.Fatalf("%s: Top %+v, Peek %+v", ks.Key, ks.Decision, d)
				}
			}
			all := topOf(t, s, limits.TopQuery{Rule: a, N: 1000}, now)
			if len(all.Keys) != 50 {
				t.Fatalf("every key of a: %d, want 50 (none of ab, not the emptied one)", len(all.Keys))
			}
			for _, ks := range all.Keys {
				if ks.Used < 1 || ks.Used > 50 || ks.Key == limits.KeyOf("caller", "gone") {
					t.Fatalf("listed %s used %d", ks.Key, ks.Used)
				}
			}
			abTop := topOf(t, s, limits.TopQuery{Rule: ab, N: 1000}, now)
			if len(abTop.Keys) != 50 || abTop.Keys[0].Used != 500 {
				t.Fatalf("ab: %d keys, first %+v", len(abTop.Keys), abTop.Keys[0])
			}
			// Reset keys are no longer listed.
			for _, ks := range all.Keys {
				if err := s.Reset(context.Background(), a, ks.Key); err != nil {
					t.Fatal(err)
				}
			}
			if n := len(topOf(t, s, limits.TopQuery{Rule: a, N: 10}, now).Keys); n != 0 {
				t.Fatalf("after reset: %d keys", n)
			}
		})
	}
}

// A token bucket's used is its burst less the tokens it holds, rounded as
// Remaining is; a key's own limits (an override) count; ties are listed
// in key order.
func TestTopBucketAndOwnLimits(t *testing.T) {
	for name, mk := range topStores(t) {
		t.Run(name, func(t *testing.T) {
			s := mk(t)
			b := &limits.Rule{Name: "b", Algorithm: limits.TokenBucket, Limit: 60, Burst: 10, Window: time.Minute}
			big := limits.KeyOf("caller", "big")
			own := func(k limits.Key) (int64, int64, bool) { return 60, 40, k == big }
			take := func(key string, cost int64) {
				h := limits.Hit{Rule: b, Key: limits.KeyOf("caller", key), Cost: cost}
				h.Limit, h.Burst, h.Own = own(h.Key)
				out := make([]limits.Decision, 1)
				if ok, err := s.Decide(context.Background(), []limits.Hit{h}, at(0), out); err != nil || !ok {
					t.Fatalf("take %s %d: %v %v", key, cost, ok, err)
				}
			}
			take("x", 7)
			take("y", 4)
			take("z", 4)
			take("big", 30)
			take("w", 1)
			// 2.5 s later each bucket has 2.5 tokens more (1 a second).
			res := topOf(t, s, limits.TopQuery{Rule: b, N: 4, Own: own}, at(2.5))
			got := ""
			for _, ks := range res.Keys {
				got += fmt.Sprintf("%s:%d/%d ", ks.Key, ks.Used, ks.Burst)
			}
			if want := "caller=big:28/40 caller=x:5/10 caller=y:2/10 caller=z:2/10 "; got != want {
				t.Fatalf("top 4: %q, want %q", got, want)
			}
			for _, ks := range res.Keys {
				h := limits.Hit{Rule: b, Key: ks.Key}
				h.Limit, h.Burst, h.Own = own(h.Key)
				if d := peekOne(t, s, h, at(2.5)); d.Remaining != ks.Decision.Remaining || d.ResetAfter != ks.Decision.ResetAfter {
					t.Fatalf("%s: Top %+v, Peek %+v", ks.Key, ks.Decision, d)
				}
			}
			// w's bucket (1 taken) is full again at 1 s: not listed.
			if n := len(topOf(t, s, limits.TopQuery{Rule: b, N: 100, Own: own}, at(2.5)).Keys); n != 4 {
				t.Fatalf("%d keys hold something, want 4", n)
			}
		})
	}
}

func TestTopRefusesABadQuery(t *testing.T) {
	m := limits.NewMemory(limits.MemoryOptions{})
	for _, q := range []limits.TopQuery{{Rule: rule(1, time.Minute), N: 0}, {N: 5}, {Rule: &limits.Rule{Name: "x", Algorithm: "other", Window: time.Second}, N: 1}} {
		if _, err := m.Top(context.Background(), q, at(0)); !errors.Is(err, limits.ErrBatch) {
			t.Errorf("%+v: %v, want ErrBatch", q, err)
		}
	}
}

// The SCAN stops at TopScan keys examined and says so; rule names and a
// prefix holding MATCH's special characters match only themselves.
func TestRedisTopScanBound(t *testing.T) {
	srv := redistest.Start(t)
	client := redis.NewClient(&redis.Options{Addr: srv.Addr})
	t.Cleanup(func() { client.Close() })
	mk := func(prefix string, scan int) *limits.Redis {
		s := limits.NewRedis(limits.RedisOptions{Client: client, Prefix: prefix, Timeout: time.Second, ClientClock: true, TopScan: scan, TopTime: 30 * time.Second})
		t.Cleanup(s.Close)
		return s
	}
	r := &limits.Rule{Name: "r*", Algorithm: limits.SlidingWindow, Limit: 100, Window: time.Minute}
	other := &limits.Rule{Name: "r?x", Algorithm: limits.SlidingWindow, Limit: 100, Window: time.Minute}
	s := mk("p[1]\\:", 0)
	for i := range 200 {
		allow(t, s, r, fmt.Sprintf("k%03d", i), int64(1+i%7), at(0))
		allow(t, s, other, fmt.Sprintf("k%03d", i), 50, at(0))
	}
	// The same names under a prefix the escaped pattern must not match.
	allow(t, mk("p1:", 0), r, "stranger", 90, at(0))
	allow(t, mk("p[1]\\:", 0), &limits.Rule{Name: "rr", Algorithm: limits.SlidingWindow, Limit: 100, Window: time.Minute}, "stranger", 90, at(0))

	full := topOf(t, s, limits.TopQuery{Rule: r, N: 1000}, at(1))
	if full.Truncated || len(full.Keys) != 200 || full.Keys[0].Used != 7 || full.Keys[199].Used != 1 {
		t.Fatalf("unbounded: %d keys, truncated %v: %+v", len(full.Keys), full.Truncated, full.Keys)
	}
	cut := topOf(t, mk("p[1]\\:", 50), limits.TopQuery{Rule: r, N: 1000}, at(1))
	if !cut.Truncated || len(cut.Keys) == 0 || len(cut.Keys) >= 200 {
		t.Fatalf("bounded at 50 examined: %d keys, truncated %v", len(cut.Keys), cut.Truncated)
	}
}

// TopTime bounds the reading of the counters found too, not only the
// SCAN: on a clock that moves 1 ms at each look (one to set the deadline,
// one before each SCAN call, one before each batch of 100 Peeks after the
// first, which is always read), a 5 ms bound lets the n SCAN calls that
// walk the keyspace and 5−n batches through, and Top ranks those and says
// it was cut short.
func TestRedisTopTimeBoundsTheReads(t *testing.T) {
	srv := redistest.Start(t)
	client := redis.NewClient(&redis.Options{Addr: srv.Addr})
	t.Cleanup(func() { client.Close() })
	var ticks atomic.Int64
	clock := func() time.Time { return time.Unix(0, 0).Add(time.Duration(ticks.Add(1)) * time.Millisecond) }
	r := &limits.Rule{Name: "r", Algorithm: limits.SlidingWindow, Limit: 1000, Window: time.Minute}
	fill := limits.NewRedis(limits.RedisOptions{Client: client, Prefix: "tt:", Timeout: time.Second, ClientClock: true})
	t.Cleanup(fill.Close)
	for i := range 500 {
		allow(t, fill, r, fmt.Sprintf("k%03d", i), int64(1+i%9), at(0))
	}
	all := topOf(t, fill, limits.TopQuery{Rule: r, N: 1000}, at(1))
	if all.Truncated || len(all.Keys) != 500 {
		t.Fatalf("unbounded: %d keys, truncated %v", len(all.Keys), all.Truncated)
	}
	s := limits.NewRedis(limits.RedisOptions{Client: client, Prefix: "tt:", Timeout: time.Second, ClientClock: true,
		TopTime: 5 * time.Millisecond, TopClock: clock})
	t.Cleanup(s.Close)
	scans := func() int {
		info := client.Info(context.Background(), "commandstats").Val()
		_, after, _ := strings.Cut(info, "cmdstat_scan:calls=")
		n, _ := strconv.Atoi(after[:strings.IndexByte(after, ',')])
		return n
	}
	before := scans()
	cut := topOf(t, s, limits.TopQuery{Rule: r, N: 1000}, at(1))
	n := scans() - before
	if n < 1 || n > 3 {
		t.Fatalf("%d SCAN calls", n)
	}
	if want := (5 - n) * 100; !cut.Truncated || len(cut.Keys) != want {
		t.Fatalf("5 ms on a 1 ms-a-look clock after %d SCAN calls: %d keys read, truncated %v (want %d, true)", n, len(cut.Keys), cut.Truncated, want)
	}
	for i := 1; i < len(cut.Keys); i++ {
		if cut.Keys[i].Used > cut.Keys[i-1].Used {
			t.Fatalf("not ranked at %d: %+v", i, cut.Keys[i-1:i+1])
		}
	}
}
