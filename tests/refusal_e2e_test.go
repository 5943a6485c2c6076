package tests

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/ratelimit-proxy/ratelimit-proxy/internal/redistest"
)

// evalshaCalls is how many EVALSHA Redis ran since its stats were reset.
func evalshaCalls(t *testing.T, c *redis.Client) int {
	t.Helper()
	info, err := c.Info(context.Background(), "commandstats").Result()
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, line := range strings.Split(info, "\n") {
		if i := strings.Index(line, "calls="); strings.HasPrefix(line, "cmdstat_evalsha:") && i >= 0 {
			fmt.Sscanf(line[i+len("calls="):], "%d", &n)
		}
	}
	return n
}

// want429 checks the full 429 contract of SPEC §5 on r.
func want429(t *testing.T, r *response) {
	t.Helper()
	wantStatus(t, r, 429)
	retry, err := strconv.Atoi(r.Header.Get("Retry-After"))
	ms, err2 := strconv.Atoi(r.Header.Get("Retry-After-Ms"))
	if err != nil || err2 != nil || retry < 1 || ms < 1 || (ms+999)/1000 != retry ||
		r.Header.Get("X-RateLimit-Remaining") != "0" || r.Header.Get("X-RateLimit-Retry-After") != strconv.Itoa(retry) {
		t.Fatalf("429 headers: %v", r.Header)
	}
	m := r.json(t)
	if m["error"] != "rate_limited" || m["denied_by"] != "chat_rpm" || num(m["retry_after_seconds"]) != float64(retry) || m["limit"] == nil {
		t.Fatalf("429 body: %s", r.body)
	}
}

// A refused caller who keeps sending costs the shared Redis nothing, stays
// refused while Redis is dead (FAIL_OPEN=true), and sees its wait counted
// down; a caller never refused is admitted without rate-limit headers
// while Redis is dead.
func TestRefusalsAreRemembered(t *testing.T) {
	srv := redistest.Start(t)
	client := redis.NewClient(&redis.Options{Addr: srv.Addr})
	t.Cleanup(func() { client.Close() })
	rec := newRecorder(t)
	p := startProxy(t, rec.URL(), map[string]string{"REDIS_URL": srv.URL(), "CHAT_RPM": "5", "REDIS_TIMEOUT": "1s"})
	attacker := []string{"Authorization", "Bearer attacker-key"}
	for range 5 {
		wantStatus(t, p.post(t, "/api/chat", attacker...), 200)
	}
	first := p.post(t, "/api/chat", attacker...)
	want429(t, first)
	client.ConfigResetStat(context.Background())
	for range 100 {
		want429(t, p.post(t, "/api/chat", attacker...))
	}
	var wg sync.WaitGroup
	var mu sync.Mutex
	var bad []string
	for range 50 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range 2 {
				if r := p.post(t, "/api/chat", attacker...); r.StatusCode != 429 {
					mu.Lock()
					bad = append(bad, fmt.Sprintf("%d %s", r.StatusCode, r.body))
					mu.Unlock()
				}
			}
		}()
	}
	wg.Wait()
	if len(bad) > 0 {
		t.Fatalf("%d of 100 concurrent requests were not refused: %v", len(bad), bad[0])
	}
	if n := evalshaCalls(t, client); n > 10 {
		t.Fatalf("200 requests of a refused caller ran %d decisions on Redis", n)
	}
	// The wait counts down.
	ms1, _ := strconv.Atoi(p.post(t, "/api/chat", attacker...).Header.Get("Retry-After-Ms"))
	time.Sleep(1100 * time.Millisecond)
	ms2, _ := strconv.Atoi(p.post(t, "/api/chat", attacker...).Header.Get("Retry-After-Ms"))
	if d := ms1 - ms2; d < 1000 || d > 1500 {
		t.Fatalf("retry-after-ms went from %d to %d in 1.1 s", ms1, ms2)
	}
	if got := rec.count(); got != 5 {
		t.Fatalf("the upstream saw %d requests, want the 5 admitted", got)
	}

	srv.Stop()
	for range 20 {
		want429(t, p.post(t, "/api/chat", attacker...))
		r := p.post(t, "/api/chat", "Authorization", "Bearer innocent-key")
		wantStatus(t, r, 200)
		wantNoRateLimitHeaders(t, r)
	}
	m := p.do(t, "GET", p.adminURL("/metrics"), nil)
	if !strings.Contains(string(m.body), "ratelimit_proxy_refusal_cache_hits_total") {
		t.Fatal("no refusal cache metrics")
	}
}

// The attack of issue 17 as a bounded load test: a caller that has spent
// its budget keeps 50 connections busy for two seconds while a neighbour
// spends its own. The attacker gets nothing beyond its limit, the
// neighbour exactly its limit, and Redis runs (almost) nothing for the
// attacker: its CPU stays flat.
func TestRefusedCallerHammering(t *testing.T) {
	srv := redistest.Start(t)
	client := redis.NewClient(&redis.Options{Addr: srv.Addr})
	t.Cleanup(func() { client.Close() })
	rec := newRecorder(t)
	const limit = 100
	p := startProxy(t, rec.URL(), map[string]string{"REDIS_URL": srv.URL(), "CHAT_RPM": strconv.Itoa(limit), "REDIS_TIMEOUT": "50ms"})
	attacker := []string{"Authorization", "Bearer attacker"}
	for range limit {
		wantStatus(t, p.post(t, "/api/chat", attacker...), 200)
	}
	want429(t, p.post(t, "/api/chat", attacker...))
	client.ConfigResetStat(context.Background())
	cpu0 := redisCPU(t, client)

	var wg sync.WaitGroup
	var mu sync.Mutex
	counts := map[string]map[int]int{"attacker": {}, "neighbour": {}}
	count := func(who string, status int) {
		mu.Lock()
		counts[who][status]++
		mu.Unlock()
	}
	stop := time.Now().Add(2 * time.Second)
	for range 50 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for time.Now().Before(stop) {
				count("attacker", p.post(t, "/api/chat", attacker...).StatusCode)
			}
		}()
	}
	wg.Add(1)
	go func() {
		defer wg.Done()
		for range limit + 20 {
			count("neighbour", p.post(t, "/api/chat", "Authorization", "Bearer neighbour").StatusCode)
		}
	}()
	wg.Wait()
	calls, cpu := evalshaCalls(t, client), redisCPU(t, client)-cpu0
	t.Logf("attacker %v, neighbour %v; Redis ran %d decisions, %.1f ms of CPU", counts["attacker"], counts["neighbour"], calls, cpu*1000)
	if a := counts["attacker"]; a[200] != 0 || a[429] == 0 || len(a) != 1 {
		t.Fatalf("the attacker got %v", a)
	}
	if nb := counts["neighbour"]; nb[200] != limit || nb[429] != 20 {
		t.Fatalf("the neighbour got %v, want exactly %d admitted", nb, limit)
	}
	// The neighbour's 120 decisions (and a few of the attacker's) are all
	// Redis ran, whatever the attacker sent.
	if calls > limit+20+10 {
		t.Fatalf("Redis ran %d decisions for %d neighbour requests", calls, limit+20)
	}
	if got := rec.count(); got != 2*limit {
		t.Fatalf("the upstream saw %d requests, want %d", got, 2*limit)
	}
}

// redisCPU is Redis's own CPU time so far, in seconds.
func redisCPU(t *testing.T, c *redis.Client) float64 {
	t.Helper()
	info, err := c.Info(context.Background(), "cpu").Result()
	if err != nil {
		t.Fatal(err)
	}
	var total float64
	for _, line := range strings.Split(info, "\n") {
		line = strings.TrimSpace(line)
		for _, f := range []string{"used_cpu_sys:", "used_cpu_user:"} {
			if v, ok := strings.CutPrefix(line, f); ok {
				x, _ := strconv.ParseFloat(v, 64)
				total += x
			}
		}
	}
	return total
}
