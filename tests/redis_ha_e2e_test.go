package tests

import (
	"fmt"
	"net/http"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ratelimit-proxy/ratelimit-proxy/internal/redistest"
)

// What an operator runs: a 3-master Redis Cluster with replicas and a
// Sentinel-managed master, in front of which two proxy processes share
// every caller's budget, and which lose a master mid-traffic. These tests
// are not parallel: their timing claims need the machine to themselves.

// redisKeyOf is the Redis key of an API key's chat_rpm counter.
func redisKeyOf(apiKey string) string {
	return "ratelimit-proxy:{chat_rpm|caller=" + keyHash(apiKey) + "}:w"
}

// callersOn returns n API keys whose counters live on master (or, with
// master nil, spread over every master of c).
func callersOn(c *redistest.Cluster, master *redistest.Node, n int, tag string) []string {
	var keys []string
	for i := 0; len(keys) < n && i < 100000; i++ {
		k := fmt.Sprintf("%s-%d", tag, i)
		if master == nil || c.MasterOf(redisKeyOf(k)).Addr == master.Addr {
			keys = append(keys, k)
		}
	}
	return keys
}

// burst sends each caller perCaller requests at once, alternating between
// the proxies, and returns the admissions per caller.
func burst(t *testing.T, ps []*proc, callers []string, perCaller int) map[string]int {
	var mu sync.Mutex
	got := map[string]int{}
	var wg sync.WaitGroup
	for _, k := range callers {
		for i := range perCaller {
			wg.Add(1)
			go func() {
				defer wg.Done()
				r := ps[i%len(ps)].post(t, "/api/chat", "Authorization", "Bearer "+k)
				if r.StatusCode == 200 {
					mu.Lock()
					got[k]++
					mu.Unlock()
				} else if r.StatusCode != 429 {
					t.Errorf("caller %s: %d %s", k, r.StatusCode, r.body)
				}
			}()
		}
	}
	wg.Wait()
	return got
}

// The cluster runs with cluster-require-full-coverage no, as the README
// advises for a rate limiter: a dead master's slots then do not stop the
// others (limits' tests cover Redis's default too).
func TestRedisClusterSharedBudgetAndFailover(t *testing.T) {
	c := redistest.StartCluster(t, redistest.ClusterOptions{Masters: 3, ReplicasPerMaster: 1, PartialCoverage: true})
	rec := newRecorder(t)

	t.Run("shared budget", func(t *testing.T) {
		env := map[string]string{"REDIS_URL": c.URL(), "CHAT_RPM": "10", "REDIS_TIMEOUT": "1s"}
		ps := []*proc{startProxy(t, rec.URL(), env), startProxy(t, rec.URL(), env)}
		callers := callersOn(c, nil, 30, "budget")
		got := burst(t, ps, callers, 20)
		for _, k := range callers {
			if got[k] != 10 {
				t.Fatalf("caller %s: %d admitted of 20 across two instances, want 10", k, got[k])
			}
		}
	})

	// One master per mode: the first kill leaves the other two with their
	// replicas.
	masters := c.Masters()
	for i, failOpen := range []string{"true", "false"} {
		t.Run("failover, FAIL_OPEN="+failOpen, func(t *testing.T) {
			haFailover(t, rec, failOpen, c.URL(),
				func() { c.Kill(masters[i]) },
				func(timeout time.Duration) (time.Time, error) {
					_, at, err := c.WaitPromoted(masters[i], timeout)
					return at, err
				},
				callersOn(c, masters[i], 1, "dead"+failOpen)[0],
				callersOn(c, masters[i+1], 1, "alive"+failOpen)[0], time.Second)
		})
	}
}

func TestRedisSentinelSharedBudgetAndFailover(t *testing.T) {
	rec := newRecorder(t)
	for _, failOpen := range []string{"true", "false"} {
		t.Run("FAIL_OPEN="+failOpen, func(t *testing.T) {
			s := redistest.StartSentinel(t, redistest.SentinelOptions{Replicas: 1})
			env := map[string]string{"REDIS_URL": s.URL(), "CHAT_RPM": "10", "REDIS_TIMEOUT": "1s"}
			ps := []*proc{startProxy(t, rec.URL(), env), startProxy(t, rec.URL(), env)}
			callers := []string{"s1" + failOpen, "s2" + failOpen, "s3" + failOpen}
			got := burst(t, ps, callers, 20)
			for _, k := range callers {
				if got[k] != 10 {
					t.Fatalf("caller %s: %d admitted of 20 across two instances, want 10", k, got[k])
				}
			}
			master := s.Master()
			haFailover(t, rec, failOpen, s.URL(),
				func() { s.Kill(master) },
				func(timeout time.Duration) (time.Time, error) {
					_, at, err := s.WaitFailover(master, timeout)
					return at, err
				},
				// Sentinels announce the new master to each other within
				// their 2 s hello period; the client follows the one it
				// asks.
				"sentinel-caller"+failOpen, "", 2*time.Second)
		})
	}
}

// haFailover runs a proxy on url with CHAT_RPM=1000000 and REDIS_TIMEOUT
// 200ms, sends traffic for dead (a caller whose master is killed) and
// alive (one on another master; "" with a single master), kills the
// master, and checks: only 200, 429 or (FAIL_OPEN=false, for dead) the
// documented 503; no request waits past the timeout and a margin; alive
// stays limited (rate-limit headers, Remaining counting down exactly);
// and dead's requests are limited again within resumeWithin of the
// promotion.
func haFailover(t *testing.T, rec *recorder, failOpen, url string, kill func(), promoted func(time.Duration) (time.Time, error), dead, alive string, resumeWithin time.Duration) {
	// A timeout a loaded CI machine never reaches on a healthy master; the
	// margin is for -race on two shared cores.
	const timeout, margin = 200 * time.Millisecond, 250 * time.Millisecond
	p := startProxy(t, rec.URL(), map[string]string{"REDIS_URL": url, "CHAT_RPM": "1000000", "REDIS_TIMEOUT": timeout.String(), "FAIL_OPEN": failOpen})
	send := func(caller string) (*response, time.Duration) {
		start := time.Now()
		r := p.do(t, http.MethodPost, p.url("/api/chat"), bodyFor("/api/chat"), "Authorization", "Bearer "+caller)
		return r, time.Since(start)
	}
	for _, k := range []string{dead, alive} {
		if k == "" {
			continue
		}
		if r, _ := send(k); r.StatusCode != 200 || r.Header.Get("X-RateLimit-Remaining") == "" {
			t.Fatalf("before the kill: %d %v", r.StatusCode, r.Header)
		}
	}
	aliveCount := int64(1)
	var promotedAt atomic.Value
	kill()
	killed := time.Now()
	go func() {
		at, err := promoted(30 * time.Second)
		if err != nil {
			t.Error(err)
			at = time.Now()
		}
		promotedAt.Store(at)
	}()
	var slowest time.Duration
	var resumed time.Time
	for time.Since(killed) < 30*time.Second && resumed.IsZero() {
		r, took := send(dead)
		slowest = max(slowest, took)
		switch {
		case r.StatusCode == 200 && r.Header.Get("X-RateLimit-Remaining") != "":
			if at, ok := promotedAt.Load().(time.Time); ok && !at.IsZero() {
				resumed = time.Now()
			}
		case r.StatusCode == 200 && failOpen == "true":
		case r.StatusCode == 503 && failOpen == "false":
			if m := r.json(t); m["error"] != "rate_limiter_unavailable" {
				t.Fatalf("503 body: %s", r.body)
			}
		default:
			t.Fatalf("dead master's caller got %d %s", r.StatusCode, r.body)
		}
		if alive != "" {
			r, took := send(alive)
			slowest = max(slowest, took)
			if r.StatusCode != 200 {
				t.Fatalf("a caller on a healthy master got %d %s", r.StatusCode, r.body)
			}
			if got := r.Header.Get("X-RateLimit-Remaining"); got != "" {
				aliveCount++
				if want := fmt.Sprint(1000000 - aliveCount); got != want {
					t.Fatalf("a caller on a healthy master: Remaining %s, want %s", got, want)
				}
			}
		}
		time.Sleep(5 * time.Millisecond)
	}
	at, _ := promotedAt.Load().(time.Time)
	if resumed.IsZero() || at.IsZero() {
		t.Fatal("limiting did not resume after the failover")
	}
	t.Logf("killed → promoted %v; promoted → limited again %v; slowest request %v", at.Sub(killed), resumed.Sub(at), slowest)
	if d := resumed.Sub(at); d > resumeWithin {
		t.Fatalf("limiting resumed %v after the promotion, want within %v", d, resumeWithin)
	}
	if slowest > timeout+margin {
		t.Fatalf("a request waited %v with REDIS_TIMEOUT=%v", slowest, timeout)
	}
}
