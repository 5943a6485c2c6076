package limits_test

import (
	"context"
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

// clusterStore is a store on c as the binary builds it (NewRedisClient),
// warmed up.
func clusterStore(t *testing.T, c *redistest.Cluster, prefix string, timeout time.Duration) *limits.Redis {
	t.Helper()
	client, err := limits.NewRedisClient(c.URL())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { client.Close() })
	s := limits.NewRedis(limits.RedisOptions{Client: client, Prefix: prefix, Timeout: timeout, WarmConns: 4})
	t.Cleanup(s.Close)
	if err := s.Warm(context.Background()); err != nil {
		t.Fatal(err)
	}
	return s
}

// keysOnDistinctSlots returns n caller keys whose counters under rule
// hash to n different masters of c.
func keysOnDistinctMasters(t *testing.T, c *redistest.Cluster, prefix, rule string, n int) []string {
	t.Helper()
	seen := map[string]bool{}
	var keys []string
	for i := 0; len(keys) < n && i < 10000; i++ {
		k := fmt.Sprintf("k%d", i)
		m := c.MasterOf(prefix + "{" + rule + "|caller=" + k + "}:w").Addr
		if !seen[m] {
			seen[m] = true
			keys = append(keys, k)
		}
	}
	if len(keys) < n {
		t.Fatalf("found keys on %d masters, want %d", len(keys), n)
	}
	return keys
}

func TestRedisCluster(t *testing.T) {
	c := redistest.StartCluster(t, redistest.ClusterOptions{Masters: 3, ReplicasPerMaster: 1, PartialCoverage: true})

	// A batch whose counters live on three masters is decided part by part;
	// a refusal by the last part takes the first two back, exactly, even
	// under 100 concurrent batches.
	t.Run("split batch is all-or-nothing", func(t *testing.T) {
		s := clusterStore(t, c, "split:", 5*time.Second)
		keys := keysOnDistinctMasters(t, c, "split:", "r", 3)
		rules := []*limits.Rule{
			{Name: "r", Algorithm: limits.SlidingWindow, Limit: 10, Window: time.Minute},
			{Name: "r", Algorithm: limits.SlidingWindow, Limit: 10, Window: time.Minute},
			{Name: "r", Algorithm: limits.SlidingWindow, Limit: 5, Window: time.Minute},
		}
		batch := func() []limits.Hit {
			h := make([]limits.Hit, 3)
			for i := range h {
				h[i] = limits.Hit{Rule: rules[i], Key: limits.KeyOf("caller", keys[i]), Cost: 1}
			}
			return h
		}
		var admitted atomic.Int64
		var wg sync.WaitGroup
		for range 100 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				out := make([]limits.Decision, 3)
				ok, err := s.Decide(context.Background(), batch(), time.Now(), out)
				if err != nil {
					t.Error(err)
					return
				}
				if ok {
					admitted.Add(1)
				} else if out[2].Allowed || out[2].RetryAfter <= 0 {
					t.Errorf("refused batch, but its refusing hit says %+v", out[2])
				}
			}()
		}
		wg.Wait()
		if admitted.Load() != 5 {
			t.Fatalf("%d batches admitted, want 5 (the smallest limit)", admitted.Load())
		}
		// The first two counters hold exactly the 5 admitted batches: every
		// refused batch was rolled back.
		for i := 0; i < 2; i++ {
			d := allow(t, s, rules[i], keys[i], 0, time.Now())
			if d.Remaining != 5 {
				t.Fatalf("counter %d: %d remaining after 5 admitted batches, want 5 (rollback lost or doubled)", i, d.Remaining)
			}
		}
	})

	// Two stores (two instances) share each caller's budget exactly, with
	// callers spread over every master (calls get 5 s: the claim is about
	// exactness, and 600 at once on a loaded machine can take more than 1 s).
	t.Run("shared budget", func(t *testing.T) {
		a, b := clusterStore(t, c, "shared:", 5*time.Second), clusterStore(t, c, "shared:", 5*time.Second)
		r := rule(10, time.Minute)
		var wg sync.WaitGroup
		counts := make([]atomic.Int64, 30)
		for caller := range 30 {
			for i := range 20 {
				wg.Add(1)
				go func() {
					defer wg.Done()
					s := a
					if i%2 == 1 {
						s = b
					}
					if allow(t, s, r, fmt.Sprint("caller", caller), 1, time.Now()).Allowed {
						counts[caller].Add(1)
					}
				}()
			}
		}
		wg.Wait()
		for i := range counts {
			if n := counts[i].Load(); n != 10 {
				t.Fatalf("caller %d: %d admitted of 20, want 10", i, n)
			}
		}
	})

	// A refusal is answered from the oldest slot, not the whole window.
	t.Run("refusal reads what it needs", func(t *testing.T) {
		s := clusterStore(t, c, "refuse:", time.Second)
		r := rule(1000, time.Minute)
		hits := make([]limits.Hit, 1)
		hits[0] = limits.Hit{Rule: r, Key: limits.KeyOf("caller", "full"), Cost: 1}
		out := make([]limits.Decision, 1)
		for range 1000 {
			if _, err := s.Decide(context.Background(), hits, time.Now(), out); err != nil {
				t.Fatal(err)
			}
		}
		d := allow(t, s, r, "full", 1, time.Now())
		if d.Allowed || d.RetryAfter <= 55*time.Second || d.RetryAfter > time.Minute || d.Remaining != 0 {
			t.Fatalf("refusal: %+v", d)
		}
	})

	// A token bucket decided first and a sliding window decided last, on
	// other masters: the bucket's tokens of every refused batch come back.
	t.Run("split batch rolls back a token bucket", func(t *testing.T) {
		s := clusterStore(t, c, "splitb:", time.Second)
		rules := []*limits.Rule{tb("bucket", 1, time.Hour, 10), sw("window", 10, time.Minute), sw("small", 5, time.Minute)}
		batch := splitBatch(t, c, "splitb:", rules)
		var admitted atomic.Int64
		var wg sync.WaitGroup
		for range 100 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				out := make([]limits.Decision, 3)
				ok, err := s.Decide(context.Background(), batch, time.Now(), out)
				if err != nil {
					t.Error(err)
				} else if ok {
					admitted.Add(1)
				}
			}()
		}
		wg.Wait()
		if admitted.Load() != 5 {
			t.Fatalf("%d batches admitted, want 5 (the smallest limit)", admitted.Load())
		}
		if rem := read(t, s, batch, time.Now()); fmt.Sprint(rem) != "[5 5 0]" {
			t.Fatalf("remaining %v after 5 admitted batches, want [5 5 0] (a rollback lost or doubled)", rem)
		}
	})

	// Peek decides every part and records nothing; it answers a refused
	// split batch as Decide does (with the rolled-back part's Remaining as
	// it was). A part of shadow hits only never refuses, and counts only
	// what fits.
	t.Run("split batch peek and shadow", func(t *testing.T) {
		s := clusterStore(t, c, "splitp:", time.Second)
		rules := []*limits.Rule{tb("bucket", 1, time.Hour, 3), shadow(tb("shadow", 1, time.Hour, 1)), sw("small", 2, time.Minute)}
		batch := splitBatch(t, c, "splitp:", rules)
		ctx := context.Background()
		out := make([]limits.Decision, 3)
		for range 3 {
			if ok, err := s.Peek(ctx, batch, time.Now(), out); !ok || err != nil || out[0].Remaining != 2 || out[2].Remaining != 1 {
				t.Fatalf("peek: %v %v %+v", ok, err, out)
			}
		}
		for i, want := range []string{"[2 0 1]", "[1 0 0]"} {
			if ok, err := s.Decide(ctx, batch, time.Now(), out); !ok || err != nil {
				t.Fatalf("decision %d: %v %v %+v", i, ok, err, out)
			}
			if i == 1 && out[1].Allowed {
				t.Fatalf("the shadow bucket admitted past its burst: %+v", out[1])
			}
			if rem := read(t, s, batch, time.Now()); fmt.Sprint(rem) != want {
				t.Fatalf("decision %d: remaining %v, want %s", i, rem, want)
			}
		}
		peek := make([]limits.Decision, 3)
		pok, err := s.Peek(ctx, batch, time.Now(), peek)
		if err != nil {
			t.Fatal(err)
		}
		dok, err := s.Decide(ctx, batch, time.Now(), out)
		if err != nil || pok || dok {
			t.Fatalf("a full rule admitted: %v %v %v", pok, dok, err)
		}
		for i := range out {
			if out[i].Allowed != peek[i].Allowed || out[i].Remaining != peek[i].Remaining || (out[i].RetryAfter == 0) != (peek[i].RetryAfter == 0) {
				t.Fatalf("hit %d: peek %+v, decide %+v", i, peek[i], out[i])
			}
		}
		if out[0].Remaining != 1 || !out[0].Allowed || out[2].Allowed || out[2].RetryAfter <= 0 {
			t.Fatalf("refused batch: %+v", out)
		}
		if rem := read(t, s, batch, time.Now()); fmt.Sprint(rem) != "[1 0 0]" {
			t.Fatalf("a refused batch was recorded: %v", rem)
		}
		// A batch of shadow hits only is admitted, whatever they say.
		if ok, err := s.Decide(ctx, batch[1:2], time.Now(), out[:1]); !ok || err != nil || out[0].Allowed {
			t.Fatalf("shadow only: %v %v %+v", ok, err, out[0])
		}
	})

	// Reset deletes the key's counters of both algorithms.
	t.Run("reset", func(t *testing.T) {
		s := clusterStore(t, c, "reset:", time.Second)
		w, b := sw("r", 1, time.Minute), tb("r", 1, time.Hour, 1)
		allow(t, s, w, "k", 1, time.Now())
		allow(t, s, b, "k", 1, time.Now())
		if err := s.Reset(context.Background(), w, limits.KeyOf("caller", "k")); err != nil {
			t.Fatal(err)
		}
		if !allow(t, s, w, "k", 1, time.Now()).Allowed || !allow(t, s, b, "k", 1, time.Now()).Allowed {
			t.Fatal("counters survived Reset")
		}
	})

	// Settling a split batch: see clusterSettle.
	t.Run("settle split batch", func(t *testing.T) { clusterSettle(t, c) })
	t.Run("clamp split batch", func(t *testing.T) { clusterClamp(t, c) })

	// A master killed: see clusterFailover.
	t.Run("failover", func(t *testing.T) { clusterFailover(t, c, true) })
}

// With Redis's default cluster-require-full-coverage, every node refuses
// from the moment a master is flagged FAIL until its replica takes over:
// no key can be decided then, but no healthy master's breaker opens for
// it, nothing waits past the timeout, and decisions resume as fast.
func TestRedisClusterFullCoverageFailover(t *testing.T) {
	c := redistest.StartCluster(t, redistest.ClusterOptions{Masters: 3, ReplicasPerMaster: 1})
	clusterFailover(t, c, false)
}

// clusterFailover kills the master of one key of three, on three masters:
// its keys fail (then ErrUnavailable at once), keys on the other masters
// stay decided exactly (partial: the cluster runs with
// cluster-require-full-coverage no; else they may be refused with
// CLUSTERDOWN until the promotion) and their breakers never move, no
// decision waits past the timeout, and the dead master's keys are decided
// again within a second of its replica's promotion.
func clusterFailover(t *testing.T, c *redistest.Cluster, partial bool) {

	var mu sync.Mutex
	var transitions []string
	client, err := limits.NewRedisClient(c.URL())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { client.Close() })
	// A timeout a loaded CI machine never reaches on a healthy master.
	const timeout = 200 * time.Millisecond
	s := limits.NewRedis(limits.RedisOptions{Client: client, Prefix: "fo:", Timeout: timeout, WarmConns: 4,
		OnStateChange: func(shard string, up bool, _ error) {
			mu.Lock()
			transitions = append(transitions, fmt.Sprintf("%s:%v", shard, up))
			mu.Unlock()
		}})
	t.Cleanup(s.Close)
	if err := s.Warm(context.Background()); err != nil {
		t.Fatal(err)
	}
	keys := keysOnDistinctMasters(t, c, "fo:", "chat_rpm", 3)
	dead := c.MasterOf("fo:{chat_rpm|caller=" + keys[0] + "}:w")
	r := rule(1000000, time.Minute)
	decide := func(key string) (limits.Decision, error, time.Duration) {
		out := make([]limits.Decision, 1)
		start := time.Now()
		_, err := s.Decide(context.Background(), []limits.Hit{{Rule: r, Key: limits.KeyOf("caller", key), Cost: 1}}, time.Now(), out)
		return out[0], err, time.Since(start)
	}
	for _, k := range keys {
		if _, err, _ := decide(k); err != nil {
			t.Fatal(err)
		}
	}
	c.Kill(dead)
	killed := time.Now()
	healthy := map[string]int64{keys[1]: 1, keys[2]: 1} // admissions so far
	var firstBack time.Time
	var promotedAt time.Time
	promoted := make(chan time.Time, 1)
	go func() {
		_, at, err := c.WaitPromoted(dead, 30*time.Second)
		if err != nil {
			t.Error(err)
		}
		promoted <- at
	}()
	var slow []time.Duration
	for time.Since(killed) < 30*time.Second {
		for _, k := range keys[1:] {
			d, err, took := decide(k)
			if err != nil {
				if !partial && redis.IsClusterDownError(err) {
					continue // the whole cluster refuses until the promotion
				}
				t.Fatalf("a key on a healthy master failed during the outage: %v", err)
			}
			healthy[k]++
			if d.Remaining != r.Limit-healthy[k] {
				t.Fatalf("healthy key %s: remaining %d, want %d", k, d.Remaining, r.Limit-healthy[k])
			}
			if took > timeout+150*time.Millisecond {
				slow = append(slow, took)
			}
		}
		_, err, took := decide(keys[0])
		if took > timeout+150*time.Millisecond {
			slow = append(slow, took)
		}
		if err == nil && time.Since(killed) > 100*time.Millisecond && firstBack.IsZero() && !promotedAt.IsZero() {
			firstBack = time.Now()
		}
		select {
		case promotedAt = <-promoted:
		default:
		}
		if !firstBack.IsZero() {
			break
		}
		time.Sleep(5 * time.Millisecond)
	}
	if promotedAt.IsZero() || firstBack.IsZero() {
		t.Fatalf("the dead master's keys were not decided again (promoted at %v)", promotedAt)
	}
	back := firstBack.Sub(promotedAt)
	t.Logf("killed → promoted %v, promoted → decided again %v", promotedAt.Sub(killed), back)
	if back > time.Second {
		t.Fatalf("decisions resumed %v after the promotion, want within 1 s", back)
	}
	if len(slow) > 0 {
		t.Fatalf("%d decisions waited past the timeout: %v", len(slow), slow)
	}
	// The dead master's breaker closes when its probe finds the slots
	// served elsewhere, which may come a moment after the first decision
	// on the new master.
	for deadline := time.Now().Add(2 * time.Second); time.Now().Before(deadline); time.Sleep(10 * time.Millisecond) {
		mu.Lock()
		n := len(transitions)
		mu.Unlock()
		if n >= 2 {
			break
		}
	}
	mu.Lock()
	defer mu.Unlock()
	for _, tr := range transitions {
		if !strings.HasPrefix(tr, dead.Addr+":") {
			t.Fatalf("a breaker other than the dead master's moved: %v", transitions)
		}
	}
	if len(transitions) != 2 {
		t.Fatalf("breaker transitions %v, want the dead master's down then up", transitions)
	}
}

// The refusal of a caller over a full window of 1000 costs Redis no more
// than an admission (SPEC §4.2: the over-limit caller's hot path).
func TestRedisRefusalCostsNoMoreThanAdmission(t *testing.T) {
	srv := redistest.Start(t)
	client := redis.NewClient(&redis.Options{Addr: srv.Addr})
	t.Cleanup(func() { client.Close() })
	s := limits.NewRedis(limits.RedisOptions{Client: client, Prefix: "cost:", Timeout: time.Second})
	t.Cleanup(s.Close)
	r := rule(1000, time.Minute)
	for range 1000 {
		allow(t, s, r, "full", 1, time.Now())
	}
	// Commands run inside the script, by the server's own count.
	calls := func(do func()) int64 {
		if err := client.ConfigResetStat(context.Background()).Err(); err != nil {
			t.Fatal(err)
		}
		do()
		info, err := client.Info(context.Background(), "commandstats").Result()
		if err != nil {
			t.Fatal(err)
		}
		var total int64
		for _, line := range strings.Split(info, "\n") {
			if !strings.HasPrefix(line, "cmdstat_") || strings.HasPrefix(line, "cmdstat_evalsha") || strings.HasPrefix(line, "cmdstat_config") {
				continue
			}
			var n int64
			if i := strings.Index(line, "calls="); i >= 0 {
				fmt.Sscanf(line[i+len("calls="):], "%d", &n)
			}
			total += n
		}
		return total
	}
	refused := calls(func() {
		if d := allow(t, s, r, "full", 1, time.Now()); d.Allowed {
			t.Fatal("admitted past the limit")
		}
	})
	admitted := calls(func() {
		if d := allow(t, s, rule(2000, time.Minute), "full", 1, time.Now()); !d.Allowed {
			t.Fatal("refused under the limit")
		}
	})
	if refused > admitted {
		t.Fatalf("a refusal ran %d commands, an admission %d", refused, admitted)
	}
	// And the time Redis spent in them, over many decisions: the old
	// refusal read all 1000 slots and cost ~9 times an admission.
	usec := func(do func()) float64 {
		client.ConfigResetStat(context.Background())
		do()
		info, _ := client.Info(context.Background(), "commandstats").Result()
		for _, line := range strings.Split(info, "\n") {
			if strings.HasPrefix(line, "cmdstat_evalsha:") {
				var per float64
				if i := strings.Index(line, "usec_per_call="); i >= 0 {
					fmt.Sscanf(line[i+len("usec_per_call="):], "%f", &per)
				}
				return per
			}
		}
		t.Fatal("no evalsha stats")
		return 0
	}
	big := rule(1<<40, time.Minute)
	perRefusal := usec(func() {
		for range 300 {
			allow(t, s, r, "full", 1, time.Now())
		}
	})
	perAdmission := usec(func() {
		for i := range 300 {
			allow(t, s, big, fmt.Sprint("fresh", i%10), 1, time.Now())
		}
	})
	t.Logf("Redis time per decision: refused %.1f µs, admitted %.1f µs", perRefusal, perAdmission)
	if perRefusal > 2*perAdmission {
		t.Fatalf("a refusal costs Redis %.1f µs, an admission %.1f µs", perRefusal, perAdmission)
	}
}

// splitBatch returns one hit per rule, with caller keys chosen so that
// each hit's counter lives on another master and the parts are decided in
// the rules' order (slot order): rule i's in the i-th nth of the slots.
func splitBatch(t *testing.T, c *redistest.Cluster, prefix string, rules []*limits.Rule) []limits.Hit {
	t.Helper()
	used := map[string]bool{}
	var batch []limits.Hit
	for n, r := range rules {
		lo, hi := n*limits.SlotCount/len(rules), (n+1)*limits.SlotCount/len(rules)
		found := false
		for i := 0; i < 10000 && !found; i++ {
			k := fmt.Sprintf("k%d", i)
			base := prefix + "{" + r.Name + "|caller=" + k + "}"
			if slot := limits.Slot(base); slot < lo || slot >= hi {
				continue
			}
			if m := c.MasterOf(base).Addr; !used[m] {
				used[m], found = true, true
				batch = append(batch, limits.Hit{Rule: r, Key: limits.KeyOf("caller", k), Cost: 1})
			}
		}
		if !found {
			t.Fatalf("no key for rule %s on a master of its own", r.Name)
		}
	}
	return batch
}
