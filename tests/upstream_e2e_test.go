package tests

import (
	"bytes"
	"context"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/ratelimit-proxy/ratelimit-proxy/internal/redistest"
)

// runUpstreamGroup checks SPEC §9 through instances that share one store
// (one instance in memory, or several on one Redis); requests alternate
// between them.
func runUpstreamGroup(t *testing.T, ps []*proc, u *gateUpstream) {
	pick := func(i int) *proc { return ps[i%len(ps)] }
	ctx := context.Background()

	t.Run("cap", func(t *testing.T) {
		// 8 POSTs and 2 GETs (any method is gated) at once against
		// max_in_flight 2; each held 300 ms by the upstream.
		var chans []<-chan result
		for i := range 10 {
			method := http.MethodPost
			if i >= 8 {
				method = http.MethodGet
			}
			chans = append(chans, goSend(ctx, pick(i), method, gpCap, nil, "X-Tag", strconv.Itoa(i)))
		}
		for i, ch := range chans {
			wantOK(t, await(t, ch, 20*time.Second, "cap request "+strconv.Itoa(i)), "cap request "+strconv.Itoa(i))
		}
		if n := u.count(gpCap); n != 10 {
			t.Errorf("the upstream saw %d requests, want 10", n)
		}
		if peak := u.peakOf(gpCap); peak != 2 {
			t.Errorf("upstream peak concurrency %d, want exactly 2 (max_in_flight)", peak)
		}
	})

	t.Run("queue order", func(t *testing.T) {
		holder := goSend(ctx, pick(0), http.MethodPost, gpOrder, nil, "X-Tag", "holder")
		u.waitHits(t, gpOrder, 1, 5*time.Second)
		// Queued in this order; each is in the queue before the next goes.
		queued := []struct{ prio, label, tag string }{
			{"BATCH", "batch", "batch"},      // case-insensitive
			{"urgent", "default", "unknown"}, // unknown: default
			{"", "default", "missing"},       // none: default
			{"Interactive", "interactive", "interactive"},
		}
		var chans []<-chan result
		depth := map[string]float64{}
		for i, q := range queued {
			hdr := []string{"X-Tag", q.tag}
			if q.prio != "" {
				hdr = append(hdr, "X-Priority", q.prio)
			}
			chans = append(chans, goSend(ctx, pick(i+1), http.MethodPost, gpOrder, nil, hdr...))
			depth[q.label]++
			waitDepth(t, ps, "order", q.label, depth[q.label], 5*time.Second)
		}
		if n := u.count(gpOrder); n != 1 {
			t.Fatalf("the upstream saw %d requests while the slot was taken, want 1", n)
		}
		want := []string{"interactive", "unknown", "missing", "batch"}
		for i := range want {
			released := u.release(t, gpOrder)
			u.waitHits(t, gpOrder, i+2, 5*time.Second)
			next := u.hitsOf(gpOrder)[i+1]
			if gap := next.at.Sub(released); gap > time.Second {
				t.Errorf("the freed slot reached the next waiter (%s) after %v; SPEC §9: within 1 s", next.tag, gap)
			}
		}
		u.release(t, gpOrder)
		wantOK(t, await(t, holder, 10*time.Second, "holder"), "holder")
		for i, ch := range chans {
			wantOK(t, await(t, ch, 10*time.Second, queued[i].tag), queued[i].tag)
		}
		var got []string
		for _, h := range u.hitsOf(gpOrder)[1:] {
			got = append(got, h.tag)
		}
		if strings.Join(got, ",") != strings.Join(want, ",") {
			t.Errorf("the upstream got the queued requests in the order %v, want %v (priority, then arrival)", got, want)
		}
		// Every admitted request is observed: the holder (no priority:
		// default, no wait) and the four that waited.
		wantCounter(t, ps, `ratelimit_proxy_upstream_queue_wait_seconds_count{group="order",priority="default"}`, 3)
		wantCounter(t, ps, `ratelimit_proxy_upstream_queue_wait_seconds_count{group="order",priority="batch"}`, 1)
		wantCounter(t, ps, `ratelimit_proxy_upstream_queue_wait_seconds_count{group="order",priority="interactive"}`, 1)
	})

	t.Run("queue bound and max_wait", func(t *testing.T) {
		// Round 1: the queued one is on /api/chat (flat envelope), the
		// refused one on /v1 (OpenAI's); round 2 the other way round.
		rounds := []struct{ holder, queued, refused string }{
			{gpBound, gpSeed, gpBound},
			{gpSeed, gpBound, gpSeed},
		}
		for n, rd := range rounds {
			before := u.count(gpBound) + u.count(gpSeed)
			holder := goSend(ctx, pick(n), http.MethodPost, rd.holder, nil)
			if !waitFor(5*time.Second, func() bool { return u.count(gpBound)+u.count(gpSeed) == before+1 }) {
				t.Fatalf("round %d: the holder did not reach the upstream", n+1)
			}
			queued := goSend(ctx, pick(n+1), http.MethodPost, rd.queued, nil)
			// max_wait is 500 ms: look often.
			deadline := time.Now().Add(400 * time.Millisecond)
			for total(t, ps, depthSeries("bound", "default")) != 1 {
				if time.Now().After(deadline) {
					t.Fatalf("round %d: the second request was not seen queued within 400 ms", n+1)
				}
				time.Sleep(5 * time.Millisecond)
			}
			refused := send(ctx, pick(n), http.MethodPost, rd.refused, nil)
			if refused.err != nil {
				t.Fatal(refused.err)
			}
			wantBusy(t, refused.r, rd.refused, "bound", "queue_full")
			if refused.elapsed > 2*time.Second {
				t.Errorf("round %d: queue_full took %v, want it at once", n+1, refused.elapsed)
			}
			q := await(t, queued, 5*time.Second, "queued request")
			wantBusy(t, q.r, rd.queued, "bound", "max_wait")
			if q.elapsed < 400*time.Millisecond || q.elapsed > 3*time.Second {
				t.Errorf("round %d: max_wait refusal after %v, want about 500 ms", n+1, q.elapsed)
			}
			if got := u.count(gpBound) + u.count(gpSeed); got != before+1 {
				t.Errorf("round %d: the upstream saw %d requests, want only the holder", n+1, got-before)
			}
			u.release(t, rd.holder)
			wantOK(t, await(t, holder, 10*time.Second, "holder"), "holder")
		}
		wantCounter(t, ps, `ratelimit_proxy_upstream_busy_total{group="bound",reason="queue_full"}`, 2)
		wantCounter(t, ps, `ratelimit_proxy_upstream_busy_total{group="bound",reason="max_wait"}`, 2)
		wantCounter(t, ps, `ratelimit_proxy_requests_total{decision="upstream_busy",route="/api/chat"}`, 2)
		wantCounter(t, ps, `ratelimit_proxy_requests_total{decision="upstream_busy",route="/v1/bound/chat/completions"}`, 2)
	})

	t.Run("client gone while queued", func(t *testing.T) {
		holder := goSend(ctx, pick(0), http.MethodPost, gpGone, nil, "X-Tag", "holder")
		u.waitHits(t, gpGone, 1, 5*time.Second)
		cctx, cancel := context.WithCancel(ctx)
		defer cancel()
		gone := goSend(cctx, pick(1), http.MethodPost, gpGone, nil, "X-Tag", "gone")
		waitDepth(t, ps, "gone", "default", 1, 5*time.Second)
		cancel()
		if res := <-gone; res.err == nil {
			t.Fatalf("the cancelled request got an answer: %d %s", res.r.StatusCode, res.r.body)
		}
		// It leaves the queue at once (1 s on a loaded machine).
		waitDepth(t, ps, "gone", "default", 0, time.Second)
		wantCounter(t, ps, `ratelimit_proxy_upstream_queue_abandoned_total{group="gone"}`, 1)

		// A caller whose SDK says it waits 0.5 s is not kept for the
		// group's max_wait (20 s).
		sdk := send(ctx, pick(1), http.MethodPost, gpGone, nil, "X-Stainless-Timeout", "0.5", "X-Tag", "sdk")
		if sdk.err != nil {
			t.Fatal(sdk.err)
		}
		wantBusy(t, sdk.r, gpGone, "gone", "max_wait")
		if sdk.elapsed < 400*time.Millisecond || sdk.elapsed > 5*time.Second {
			t.Errorf("X-Stainless-Timeout 0.5: refused after %v, want about 0.5 s", sdk.elapsed)
		}

		u.release(t, gpGone)
		wantOK(t, await(t, holder, 10*time.Second, "holder"), "holder")
		time.Sleep(300 * time.Millisecond) // a leaked grant would reach the upstream now
		if hs := u.hitsOf(gpGone); len(hs) != 1 {
			var tags []string
			for _, h := range hs {
				tags = append(tags, h.tag)
			}
			t.Errorf("the upstream saw %v, want only the holder", tags)
		}
		wantCounter(t, ps, `ratelimit_proxy_upstream_in_flight{group="gone"}`, 0)
		// The slot is free: the next request goes straight through.
		next := goSend(ctx, pick(1), http.MethodPost, gpGone, nil, "X-Tag", "next")
		u.waitHits(t, gpGone, 2, 5*time.Second)
		u.release(t, gpGone)
		wantOK(t, await(t, next, 10*time.Second, "next"), "next")
	})

	t.Run("retries", func(t *testing.T) {
		// Two 429s, then 200: the client sees the 200, the upstream the
		// same body three times.
		u.setScript(gpRetry, reply{429, map[string]string{"retry-after-ms": "200"}}, reply{429, map[string]string{"retry-after-ms": "200"}})
		body := []byte(`{"model":"gpt-4o-mini","messages":[{"role":"user","content":"retry me, please"}]}`)
		res := send(ctx, pick(0), http.MethodPost, gpRetry, body)
		wantOK(t, res, "retried request")
		hs := u.hitsOf(gpRetry)
		if len(hs) != 3 {
			t.Fatalf("the upstream saw %d attempts, want 3", len(hs))
		}
		for i, h := range hs {
			if len(h.body) == 0 || !bytes.Equal(h.body, hs[0].body) || h.contentLength != int64(len(h.body)) {
				t.Errorf("attempt %d: body %q (Content-Length %d), want the first attempt's %q", i+1, h.body, h.contentLength, hs[0].body)
			}
		}
		if !bytes.Contains(hs[0].body, []byte("retry me, please")) {
			t.Errorf("the upstream got %q, not the client's body", hs[0].body)
		}
		// Each retry waited for the pause (200 ms).
		for i := 1; i < len(hs); i++ {
			if gap := hs[i].at.Sub(hs[i-1].at); gap < 190*time.Millisecond {
				t.Errorf("retry %d came %v after the 429 asking for 200 ms", i, gap)
			}
		}
		wantCounter(t, ps, `ratelimit_proxy_upstream_retries_total{group="retry"}`, 2)
		wantCounter(t, ps, `ratelimit_proxy_upstream_throttled_total{group="retry",status="429"}`, 2)

		// Retries exhausted: the third 429 is passed on with Retry-After.
		u.setScript(gpRetry, reply{429, map[string]string{"retry-after-ms": "200"}}, reply{429, map[string]string{"retry-after-ms": "200"}},
			reply{429, map[string]string{"retry-after-ms": "200"}})
		res = send(ctx, pick(1), http.MethodPost, gpRetry, nil)
		if res.err != nil {
			t.Fatal(res.err)
		}
		if res.r.StatusCode != http.StatusTooManyRequests || !bytes.Contains(res.r.body, []byte("slow down")) {
			t.Fatalf("retries exhausted: %d %s, want the upstream's 429", res.r.StatusCode, res.r.body)
		}
		if s, ms := retryAfter(t, res.r); s < 1 || ms < 1 {
			t.Errorf("retries exhausted: Retry-After %d retry-after-ms %d, want ≥ 1", s, ms)
		}
		if n := u.count(gpRetry); n != 6 {
			t.Errorf("the upstream saw %d attempts in all, want 6", n)
		}
		wantCounter(t, ps, `ratelimit_proxy_upstream_retries_total{group="retry"}`, 4)

		// A 503 is retried too.
		u.setScript(gpRetry, reply{503, map[string]string{"retry-after-ms": "100"}})
		wantOK(t, send(ctx, pick(0), http.MethodPost, gpRetry, nil), "after a 503")
		wantCounter(t, ps, `ratelimit_proxy_upstream_throttled_total{group="retry",status="503"}`, 1)

		// Never past the caller's deadline: a client that waits 0.3 s
		// gets the 429 asking for 1 s at once, not retried.
		time.Sleep(300 * time.Millisecond) // the pause above is over
		n0 := u.count(gpRetry)
		u.setScript(gpRetry, reply{429, map[string]string{"retry-after-ms": "1000"}})
		res = send(ctx, pick(1), http.MethodPost, gpRetry, nil, "X-Stainless-Timeout", "0.3")
		if res.err != nil {
			t.Fatal(res.err)
		}
		if res.r.StatusCode != http.StatusTooManyRequests {
			t.Errorf("deadline 0.3 s, upstream asks for 1 s: %d %s, want its 429 passed on", res.r.StatusCode, res.r.body)
		}
		if n := u.count(gpRetry) - n0; n != 1 {
			t.Errorf("deadline 0.3 s: the upstream saw %d attempts, want 1", n)
		}
		u.setScript(gpRetry)

		// retries = 0: the 429 passes with Retry-After, and the next
		// request waits out the pause before it reaches the upstream.
		u.setScript(gpNoRetry, reply{429, map[string]string{"retry-after-ms": "1000"}})
		first := send(ctx, pick(0), http.MethodPost, gpNoRetry, nil)
		if first.err != nil {
			t.Fatal(first.err)
		}
		if first.r.StatusCode != http.StatusTooManyRequests {
			t.Fatalf("retries 0: %d %s, want the upstream's 429", first.r.StatusCode, first.r.body)
		}
		if s, ms := retryAfter(t, first.r); s != 1 || ms < 1 || ms > 1000 {
			t.Errorf("retries 0: Retry-After %d retry-after-ms %d, want 1 and (0, 1000]", s, ms)
		}
		if v := sample(t, pick(0), `ratelimit_proxy_upstream_pause_remaining_seconds{group="noretry"}`); v <= 0 || v > 1 {
			t.Errorf("pause_remaining_seconds %v right after the 429, want in (0, 1]", v)
		}
		second := send(ctx, pick(1), http.MethodPost, gpNoRetry, nil)
		wantOK(t, second, "the request after the 429")
		hs = u.hitsOf(gpNoRetry)
		if len(hs) != 2 {
			t.Fatalf("the upstream saw %d requests, want 2", len(hs))
		}
		if gap := hs[1].at.Sub(hs[0].at); gap < 950*time.Millisecond {
			t.Errorf("the next request reached the upstream %v after its 429 asking for 1 s", gap)
		}
		wantCounter(t, ps, `ratelimit_proxy_upstream_retries_total{group="noretry"}`, 0)
		wantCounter(t, ps, `ratelimit_proxy_upstream_throttled_total{group="noretry",status="429"}`, 1)
	})

	t.Run("pause shared", func(t *testing.T) {
		// Retry-After: 2 on one instance; the other holds its next request
		// until the pause ends.
		u.setScript(gpPause, reply{429, map[string]string{"Retry-After": "2"}})
		a := send(ctx, pick(0), http.MethodPost, gpPause, nil)
		if a.err != nil {
			t.Fatal(a.err)
		}
		if a.r.StatusCode != http.StatusTooManyRequests {
			t.Fatalf("%d %s, want the upstream's 429", a.r.StatusCode, a.r.body)
		}
		if s, _ := retryAfter(t, a.r); s != 2 {
			t.Errorf("Retry-After %d, want 2 (the pause remaining)", s)
		}
		b := send(ctx, pick(1), http.MethodPost, gpPause, nil)
		wantOK(t, b, "the request on the other instance")
		hs := u.hitsOf(gpPause)
		if len(hs) != 2 {
			t.Fatalf("the upstream saw %d requests, want 2", len(hs))
		}
		if gap := hs[1].at.Sub(hs[0].at); gap < 1900*time.Millisecond {
			t.Errorf("the other instance's request reached the upstream %v after the 429 asking for 2 s", gap)
		}

		// With max_wait (500 ms) shorter than the pause: refused at once.
		u.setScript(gpPauseShort, reply{429, map[string]string{"Retry-After": "2"}})
		a = send(ctx, pick(0), http.MethodPost, gpPauseShort, nil)
		if a.err != nil {
			t.Fatal(a.err)
		}
		if a.r.StatusCode != http.StatusTooManyRequests {
			t.Fatalf("%d %s, want the upstream's 429", a.r.StatusCode, a.r.body)
		}
		b = send(ctx, pick(1), http.MethodPost, gpPauseShort, nil)
		if b.err != nil {
			t.Fatal(b.err)
		}
		wantBusy(t, b.r, gpPauseShort, "pauseshort", "paused")
		if b.elapsed > time.Second {
			t.Errorf("paused refusal after %v, want at once", b.elapsed)
		}
		if s := b.r.Header.Get("Retry-After"); s != "2" && s != "1" {
			t.Errorf("paused refusal: Retry-After %q, want the pause remaining (2 s)", s)
		}
		if n := u.count(gpPauseShort); n != 1 {
			t.Errorf("the upstream saw %d requests, want 1", n)
		}
		wantCounter(t, ps, `ratelimit_proxy_upstream_busy_total{group="pauseshort",reason="paused"}`, 1)
	})

	t.Run("rate", func(t *testing.T) {
		var chans []<-chan result
		for i := range 6 {
			chans = append(chans, goSend(ctx, pick(i), http.MethodPost, gpRate, nil, "X-Tag", strconv.Itoa(i)))
		}
		for i, ch := range chans {
			wantOK(t, await(t, ch, 20*time.Second, "rate request "+strconv.Itoa(i)), "rate request "+strconv.Itoa(i))
		}
		hs := u.hitsOf(gpRate)
		if len(hs) != 6 {
			t.Fatalf("the upstream saw %d requests, want 6", len(hs))
		}
		// At most 3 in any 1 s window, as the upstream sees them (less
		// 100 ms for the way from the proxy's decision to the upstream).
		const window = 900 * time.Millisecond
		for i := range hs {
			n := 0
			for j := range hs {
				if d := hs[j].at.Sub(hs[i].at); d >= 0 && d < window {
					n++
				}
			}
			if n > 3 {
				var ats []string
				for _, h := range hs {
					ats = append(ats, h.at.Sub(hs[0].at).Round(time.Millisecond).String())
				}
				t.Fatalf("%d requests within %v of one another at the upstream (rate 3 per 1s): arrivals %v", n, window, ats)
			}
		}
	})

	t.Run("nothing leaks", func(t *testing.T) {
		for _, g := range gateGroups {
			wantCounter(t, ps, fmt.Sprintf(`ratelimit_proxy_upstream_in_flight{group=%q}`, g), 0)
			for _, prio := range []string{"interactive", "default", "batch"} {
				if v := total(t, ps, depthSeries(g, prio)); v != 0 {
					t.Errorf("queue depth %s/%s = %v, want 0", g, prio, v)
				}
			}
		}
		// Every group is reported on every instance.
		for _, p := range ps {
			text := string(p.do(t, http.MethodGet, p.adminURL("/metrics"), nil).body)
			for _, g := range gateGroups {
				for _, s := range []string{
					fmt.Sprintf(`ratelimit_proxy_upstream_in_flight{group=%q}`, g),
					fmt.Sprintf(`ratelimit_proxy_upstream_adaptive_factor{group=%q}`, g),
					fmt.Sprintf(`ratelimit_proxy_upstream_pause_remaining_seconds{group=%q}`, g),
				} {
					if metricValue(text, s) == "" {
						t.Errorf("%s: no %s", p.admin, s)
					}
				}
				if v := metricValue(text, fmt.Sprintf(`ratelimit_proxy_upstream_adaptive_factor{group=%q}`, g)); v != "" && num(v) != 1 {
					t.Errorf("%s: adaptive factor of %s is %s without adaptive, want 1", p.admin, g, v)
				}
			}
		}
	})
}

func TestUpstreamGroupInMemory(t *testing.T) {
	t.Parallel()
	u := newGateUpstream(t, []string{gpOrder, gpBound, gpSeed, gpGone}, map[string]time.Duration{gpCap: 300 * time.Millisecond})
	p := startProxy(t, u.srv.URL, gateEnv(), "-config", writeRules(t, gateFile))
	t.Cleanup(u.unblock)
	runUpstreamGroup(t, []*proc{p}, u)
}

func TestUpstreamGroupTwoInstancesOneRedis(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	u := newGateUpstream(t, []string{gpOrder, gpBound, gpSeed, gpGone}, map[string]time.Duration{gpCap: 300 * time.Millisecond})
	env := gateEnv()
	env["REDIS_URL"], env["REDIS_TIMEOUT"] = srv.URL(), "1s"
	cfg := writeRules(t, gateFile)
	ps := []*proc{startProxy(t, u.srv.URL, env, "-config", cfg), startProxy(t, u.srv.URL, env, "-config", cfg)}
	t.Cleanup(u.unblock)
	runUpstreamGroup(t, ps, u)
}

// SPEC §9: with Redis, a dead instance's slots are free again within
// 15 s, and go to a waiter on another instance.
func TestUpstreamGroupKilledInstanceFreesItsSlots(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	const path = "/v1/chat/completions"
	u := newGateUpstream(t, []string{path}, nil)
	env := gateEnv()
	env["PROTECTED_PATHS"] = path
	env["REDIS_URL"], env["REDIS_TIMEOUT"] = srv.URL(), "1s"
	cfg := writeRules(t, `
[[upstream_group]]
name          = "solo"
max_in_flight = 1
max_wait      = "25s"
`)
	a := startProxy(t, u.srv.URL, env, "-config", cfg)
	b := startProxy(t, u.srv.URL, env, "-config", cfg)
	t.Cleanup(u.unblock)
	ctx := context.Background()

	goSend(ctx, a, http.MethodPost, path, nil, "X-Tag", "dies") // its answer never comes
	u.waitHits(t, path, 1, 5*time.Second)
	waiter := goSend(ctx, b, http.MethodPost, path, nil, "X-Tag", "waits")
	waitDepth(t, []*proc{b}, "solo", "default", 1, 5*time.Second)

	if err := a.cmd.Process.Kill(); err != nil { // SIGKILL: no release, no renewal
		t.Fatal(err)
	}
	killed := time.Now()
	if _, ok := a.exited(5 * time.Second); !ok {
		t.Fatal("the killed instance did not exit")
	}
	u.waitHits(t, path, 2, 20*time.Second)
	took := u.hitsOf(path)[1].at.Sub(killed)
	t.Logf("the dead instance's slot went to the other instance's waiter %v after the kill", took.Round(time.Millisecond))
	if took > 15*time.Second {
		t.Errorf("the dead instance's slot was free after %v, want within 15 s", took)
	}
	u.release(t, path)
	wantOK(t, await(t, waiter, 10*time.Second, "the waiter"), "the waiter")
	wantCounter(t, []*proc{b}, `ratelimit_proxy_upstream_in_flight{group="solo"}`, 0)
}

// SPEC §1, §9: -check names the group and the field of a bad
// [[upstream_group]], and prints the effective tables of a good one.
func TestUpstreamGroupCheck(t *testing.T) {
	t.Parallel()
	write := func(body string) string {
		p := filepath.Join(t.TempDir(), "config.toml")
		if err := os.WriteFile(p, []byte("upstream_url = \"http://127.0.0.1:1\"\n"+body), 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	t.Run("bad", func(t *testing.T) {
		code, out, errOut := runOnce(t, nil, "-check", "-config", write(`
[[upstream_group]]
name          = "chat"
max_in_flight = -1
retries       = 11
`))
		if code != 1 {
			t.Errorf("exit %d, want 1\nstdout: %s\nstderr: %s", code, out, errOut)
		}
		if strings.Count(strings.TrimRight(errOut, "\n"), "\n") != 0 {
			t.Errorf("stderr must be one line:\n%s", errOut)
		}
		for _, want := range []string{`upstream_group "chat": max_in_flight`, "-1", `upstream_group "chat": retries`, "11"} {
			if !strings.Contains(errOut, want) {
				t.Errorf("stderr lacks %q:\n%s", want, errOut)
			}
		}
	})
	t.Run("good", func(t *testing.T) {
		code, out, errOut := runOnce(t, nil, "-check", "-config", write(`
[[upstream_group]]
name          = "chat"
paths         = ["/v1/chat/completions", "/api/chat"]
max_in_flight = 32
rate          = 600
per           = "1m"
queue         = 1000
max_wait      = "30s"
priority_from = "header:X-Priority"
priorities    = ["interactive", "default", "batch"]
retries       = 2
max_backoff   = "20s"
adaptive      = { start = 0.5, increase = 0.1, every = "5m", decrease = 0.5, hold = "10m", ceiling = 0.8 }

[[upstream_group]]
name = "rest"
paths = ["/v1/embeddings"]
`))
		if code != 0 {
			t.Fatalf("exit %d, want 0\nstderr: %s", code, errOut)
		}
		if strings.Count(out, "[[upstream_group]]") != 2 {
			t.Errorf("stdout must print both [[upstream_group]] tables:\n%s", out)
		}
		for _, want := range []string{`name = "chat"`, "max_in_flight = 32", "rate = 600", "queue = 1000", `priority_from = "header:X-Priority"`,
			"retries = 2", `name = "rest"`, "start = 0.5", "ceiling = 0.8"} {
			if !strings.Contains(out, want) {
				t.Errorf("stdout lacks %q:\n%s", want, out)
			}
		}
		// The defaults of the second group are printed, effective.
		rest := out[strings.LastIndex(out, "[[upstream_group]]"):]
		for _, want := range []string{"max_in_flight = 0", "queue = 1000", "retries = 2"} {
			if !strings.Contains(rest, want) {
				t.Errorf("the second group lacks its default %q:\n%s", want, rest)
			}
		}
	})
}
