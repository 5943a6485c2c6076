package tests

import (
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ratelimit-proxy/ratelimit-proxy/internal/redistest"
)

// Two proxy processes on one Redis share each caller's budget exactly, even
// for a concurrent burst split across both.
func TestTwoInstancesShareOneBudget(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	rec := newRecorder(t)
	env := map[string]string{"REDIS_URL": srv.URL(), "CHAT_RPM": "10", "REDIS_TIMEOUT": "1s"}
	a := startProxy(t, rec.URL(), env)
	b := startProxy(t, rec.URL(), env)
	var ok, limited atomic.Int64
	var wg sync.WaitGroup
	for i := 0; i < 30; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			p := a
			if i%2 == 1 {
				p = b
			}
			switch p.post(t, "/api/chat").StatusCode {
			case 200:
				ok.Add(1)
			case 429:
				limited.Add(1)
			}
		}()
	}
	wg.Wait()
	if ok.Load() != 10 || limited.Load() != 20 || rec.count() != 10 {
		t.Fatalf("%d admitted, %d limited, upstream saw %d; want 10, 20, 10", ok.Load(), limited.Load(), rec.count())
	}
	// The refusal from either instance names the same shared window.
	r := b.post(t, "/api/chat")
	wantStatus(t, r, 429)
	wantHeader(t, r, "X-RateLimit-Limit", "10")
}

// Redis killed mid-traffic: with FAIL_OPEN=true nothing fails and nothing
// waits longer than the timeout; with false the answer is 503 JSON;
// restarted, limiting resumes within a second without restarting the proxy.
func TestRedisGoesAwayAndComesBack(t *testing.T) {
	t.Parallel()
	for _, failOpen := range []string{"true", "false"} {
		t.Run("fail_open="+failOpen, func(t *testing.T) {
			srv := redistest.Start(t)
			rec := newRecorder(t)
			p := startProxy(t, rec.URL(), map[string]string{"REDIS_URL": srv.URL(), "CHAT_RPM": "3",
				"REDIS_TIMEOUT": "50ms", "FAIL_OPEN": failOpen})
			// Redis is up: the first request is decided there (a loaded
			// machine may need a retry within the 50 ms timeout).
			if !waitFor(5*time.Second, func() bool { return p.post(t, "/api/chat").StatusCode == 200 }) {
				t.Fatal("no request admitted while Redis was up")
			}
			srv.Stop()
			for i := 0; i < 20; i++ {
				start := time.Now()
				r := p.post(t, "/api/chat")
				took := time.Since(start)
				if took > 400*time.Millisecond {
					t.Fatalf("request %d with Redis dead took %v", i, took)
				}
				if failOpen == "true" {
					wantStatus(t, r, 200)
					wantNoRateLimitHeaders(t, r)
				} else {
					wantStatus(t, r, 503)
					if m := r.json(t); m["error"] != "rate_limiter_unavailable" {
						t.Fatalf("%s", r.body)
					}
				}
			}
			ready := p.do(t, "GET", p.adminURL("/readyz"), nil)
			if (failOpen == "false") != (ready.StatusCode == 503) {
				t.Fatalf("/readyz while Redis is down: %d %s", ready.StatusCode, ready.body)
			}
			if !waitFor(5*time.Second, func() bool {
				return len(p.logs.Lines()) > 0 && strings.Contains(p.logs.Text(), "state store unreachable")
			}) {
				t.Fatal("the outage was not logged")
			}

			srv.Restart(t)
			back := time.Now()
			var limitedAgain bool
			for time.Since(back) < 3*time.Second && !limitedAgain {
				r := p.post(t, "/api/chat")
				limitedAgain = r.StatusCode == 429
				time.Sleep(20 * time.Millisecond)
			}
			if !limitedAgain {
				t.Fatal("limiting did not resume after Redis came back")
			}
			// 3 admissions then a 429: the breaker closed within the first
			// second (the probe runs every 250 ms).
			if d := time.Since(back); d > 1500*time.Millisecond {
				t.Fatalf("limiting resumed %v after Redis came back", d)
			}
		})
	}
}

// A proxy whose Redis is unreachable from the start is not ready with
// FAIL_OPEN=false, before any traffic.
func TestReadyzWithRedisDownAtStart(t *testing.T) {
	t.Parallel()
	rec := newRecorder(t)
	dead := "redis://" + strings.TrimPrefix(deadURL(t), "http://") + "/0"
	p := startProxy(t, rec.URL(), map[string]string{"REDIS_URL": dead, "FAIL_OPEN": "false"})
	r := p.do(t, "GET", p.adminURL("/readyz"), nil)
	if r.StatusCode != 503 || !strings.Contains(string(r.body), `"store_state":"down"`) {
		t.Fatalf("/readyz: %d %s", r.StatusCode, r.body)
	}
	wantStatus(t, p.post(t, "/api/chat"), 503)
}
