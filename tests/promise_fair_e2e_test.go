package tests

import (
	"context"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/ratelimit-proxy/ratelimit-proxy/internal/redistest"
)

// ---------------------------------------------------------------------------
// 3. Fair share in an upstream group: within a priority, waiters are served
// in turns across the values of fair_by (w per turn for a plan of weight
// w); a newcomer waits at most one turn, a caller alone gets every slot.

const (
	fpOne    = "/v1/fair/chat/completions"  // max_in_flight 1
	fpWeight = "/v1/fairw/chat/completions" // max_in_flight 1, pro 3 : free 1
	fpFour   = "/v1/fair4/chat/completions" // max_in_flight 4
)

const fairFile = `
tier_from = "header:X-Plan"

[[upstream_group]]
name          = "fair"
paths         = ["/v1/fair/chat/completions"]
max_in_flight = 1
queue         = 5000
max_wait      = "60s"
fair_by       = "header:X-Team"
fair_weights  = { pro = 3, free = 1 }

[[upstream_group]]
name          = "fairw"
paths         = ["/v1/fairw/chat/completions"]
max_in_flight = 1
queue         = 5000
max_wait      = "60s"
fair_by       = "header:X-Team"
fair_weights  = { pro = 3, free = 1 }

[[upstream_group]]
name          = "fair4"
paths         = ["/v1/fair4/chat/completions"]
max_in_flight = 4
queue         = 5000
max_wait      = "60s"
fair_by       = "header:X-Team"
`

func fairKeysSeries(group string) string {
	return fmt.Sprintf(`ratelimit_proxy_upstream_queue_fair_keys{group=%q,priority="default"}`, group)
}

// grantOrder releases the held request n times, one at a time, each time
// waiting for the next request to reach the upstream; it returns the teams
// (X-Tag) in the order they reached it, the first one included.
func grantOrder(t *testing.T, u *gateUpstream, path string, n int) []string {
	t.Helper()
	heldOne(t, u, path)
	for i := range n {
		before := u.count(path)
		start := u.release(t, path)
		// The released request is done and the next one is held.
		if !waitFor(15*time.Second, func() bool { return u.count(path) == before+1 && u.inFlight(path) == 1 }) {
			t.Fatalf("grant %d: no next request reached the upstream within 15 s of a release (%d requests so far, %d in flight)", i+1, u.count(path), u.inFlight(path))
		}
		if d := time.Since(start); d > 2*time.Second {
			t.Logf("grant %d took %v after its slot was freed", i+1, d)
		}
	}
	var order []string
	for _, h := range u.hitsOf(path) {
		order = append(order, h.tag)
	}
	return order
}

// heldOne waits until exactly one request of a max_in_flight = 1 group is
// held at the upstream: no grant is on its way.
func heldOne(t *testing.T, u *gateUpstream, path string) {
	t.Helper()
	if !waitFor(15*time.Second, func() bool { return u.inFlight(path) == 1 }) {
		t.Fatalf("%s: %d requests in flight, want 1 held", path, u.inFlight(path))
	}
}

func (u *gateUpstream) inFlight(path string) int {
	u.mu.Lock()
	defer u.mu.Unlock()
	return u.cur[path]
}

// patient is p with a client that waits up to a minute: queued backlogs
// outlive the harness client's 15 s.
func patient(p *proc) *proc {
	q := *p
	q.client = &http.Client{Transport: &http.Transport{Proxy: nil, DisableCompression: true, MaxIdleConnsPerHost: 64}, Timeout: 60 * time.Second}
	return &q
}

func fairHdr(team, plan string) []string {
	h := []string{"X-Team", team, "X-Tag", team}
	if plan != "" {
		h = append(h, "X-Plan", plan)
	}
	return h
}

// sendBacklog sends n requests of a team in the background on p.
func sendBacklog(ctx context.Context, p *proc, path string, n int, team, plan string) []<-chan result {
	var out []<-chan result
	for range n {
		out = append(out, goSend(ctx, p, http.MethodPost, path, nil, fairHdr(team, plan)...))
	}
	return out
}

func runFairPromise(t *testing.T, ps []*proc, u *gateUpstream) {
	a, b := patient(ps[0]), patient(ps[len(ps)-1])
	t.Cleanup(func() {
		a.client.CloseIdleConnections()
		b.client.CloseIdleConnections()
	})

	t.Run("admin rules list fair_by and fair_weights", func(t *testing.T) {
		r := a.do(t, http.MethodGet, a.adminURL("/admin/rules"), nil)
		wantStatus(t, r, 200)
		groups, _ := r.json(t)["upstream_groups"].([]any)
		found := false
		for _, x := range groups {
			m, _ := x.(map[string]any)
			if m["name"] != "fair" {
				continue
			}
			found = true
			if m["fair_by"] != "header:X-Team" {
				t.Errorf("fair_by %v", m["fair_by"])
			}
			if w, _ := m["fair_weights"].(map[string]any); num(w["pro"]) != 3 || num(w["free"]) != 1 || len(w) != 2 {
				t.Errorf("fair_weights %v, want pro 3 free 1", m["fair_weights"])
			}
		}
		if !found {
			t.Errorf("/admin/rules lists no upstream group \"fair\": %s", r.body)
		}
	})

	t.Run("a newcomer waits at most one turn behind a backlog", func(t *testing.T) {
		ctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		first := goSend(ctx, a, http.MethodPost, fpOne, nil, fairHdr("alpha", "")...)
		u.waitHits(t, fpOne, 1, 15*time.Second)
		const backlog = 200
		_ = sendBacklog(ctx, a, fpOne, backlog, "alpha", "")
		waitDepth(t, ps, "fair", "default", backlog, 20*time.Second)
		if got := sample(t, a, fairKeysSeries("fair")); got != 1 {
			t.Errorf("%s = %v with one team waiting, want 1", fairKeysSeries("fair"), got)
		}
		single := goSend(ctx, b, http.MethodPost, fpOne, nil, fairHdr("beta", "")...)
		waitDepth(t, ps, "fair", "default", backlog+1, 15*time.Second)
		if len(ps) == 1 {
			if got := sample(t, a, fairKeysSeries("fair")); got != 2 {
				t.Errorf("%s = %v with two teams waiting, want 2", fairKeysSeries("fair"), got)
			}
		} else {
			for i, p := range ps {
				if got := sample(t, p, fairKeysSeries("fair")); got != 1 {
					t.Errorf("instance %d: %s = %v with one team waiting on it, want 1", i, fairKeysSeries("fair"), got)
				}
			}
		}
		order := grantOrder(t, u, fpOne, 2)
		t.Logf("grants: %v", order)
		if order[0] != "alpha" || (order[1] != "beta" && order[2] != "beta") {
			t.Errorf("DEFECT? beta's single request was not among the 2 grants after it queued behind %d of alpha's: %v", backlog, order)
			return
		}
		// beta's answer: a 200 once its held request is released (the
		// second release let it go if it came first).
		if order[2] == "beta" {
			u.release(t, fpOne)
		}
		wantOK(t, await(t, single, 15*time.Second, "beta's request"), "beta's request")
		wantOK(t, await(t, first, 15*time.Second, "alpha's first request"), "alpha's first request")

		// 20 turns later (alpha alone), gamma comes, and beta again: each
		// within one turn.
		_ = grantOrder(t, u, fpOne, 20)
		// The teams waiting on b once the newcomer is queued: alpha's
		// backlog too when b is the only instance (and then the newcomer
		// must be seen beside it, or the grants below may run before it
		// is queued).
		queued := 1.0
		if len(ps) == 1 {
			queued = 2
		}
		for _, team := range []string{"gamma", "beta"} {
			heldOne(t, u, fpOne)
			before := u.count(fpOne)
			late := goSend(ctx, b, http.MethodPost, fpOne, nil, fairHdr(team, "")...)
			if !waitFor(15*time.Second, func() bool { return sample(t, b, fairKeysSeries("fair")) >= queued }) {
				t.Fatalf("%s's request is not queued on its instance", team)
			}
			order := grantOrder(t, u, fpOne, 2)[before:]
			t.Logf("grants after %s came: %v", team, order)
			if order[0] != team && order[1] != team {
				t.Errorf("DEFECT? %s's request, arriving after %d grants, was not among the next 2 grants: %v", team, before, order)
				return
			}
			if order[1] == team {
				u.release(t, fpOne)
			}
			wantOK(t, await(t, late, 15*time.Second, team+"'s request"), team+"'s request")
		}
		cancel() // the backlog leaves the queue
		waitDepth(t, ps, "fair", "default", 0, 20*time.Second)
	})

	t.Run("a caller who abandoned its backlog starts afresh", func(t *testing.T) {
		ctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		_ = goSend(ctx, a, http.MethodPost, fpOne, nil, fairHdr("holder", "")...)
		heldOne(t, u, fpOne)
		// delta queues 100 and gives up on all of them.
		gone, leave := context.WithCancel(ctx)
		_ = sendBacklog(gone, a, fpOne, 100, "delta", "")
		waitDepth(t, ps, "fair", "default", 100, 20*time.Second)
		leave()
		waitDepth(t, ps, "fair", "default", 0, 20*time.Second)
		// epsilon's backlog on one instance, then delta's one request on the other.
		_ = sendBacklog(ctx, a, fpOne, 30, "epsilon", "")
		waitDepth(t, ps, "fair", "default", 30, 20*time.Second)
		back := goSend(ctx, b, http.MethodPost, fpOne, nil, fairHdr("delta", "")...)
		waitDepth(t, ps, "fair", "default", 31, 15*time.Second)
		heldOne(t, u, fpOne)
		before := u.count(fpOne)
		order := grantOrder(t, u, fpOne, 2)[before:]
		t.Logf("grants after delta came back: %v", order)
		if order[0] != "delta" && order[1] != "delta" {
			t.Errorf("DEFECT? delta, back after abandoning 100 queued requests, was not among the next 2 grants behind epsilon's 30: %v", order)
			return
		}
		if order[1] == "delta" {
			u.release(t, fpOne)
		}
		wantOK(t, await(t, back, 15*time.Second, "delta's request"), "delta's request")
		cancel()
		waitDepth(t, ps, "fair", "default", 0, 20*time.Second)
	})

	t.Run("weights 3:1 share the grants 3:1", func(t *testing.T) {
		ctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		_ = goSend(ctx, a, http.MethodPost, fpWeight, nil, fairHdr("zeta", "")...)
		u.waitHits(t, fpWeight, 1, 15*time.Second)
		const each = 40
		_ = sendBacklog(ctx, a, fpWeight, each, "pro-team", "pro")
		waitDepth(t, ps, "fairw", "default", each, 20*time.Second)
		_ = sendBacklog(ctx, b, fpWeight, each, "free-team", "free")
		waitDepth(t, ps, "fairw", "default", 2*each, 20*time.Second)
		const window = 40
		order := grantOrder(t, u, fpWeight, window)[1:]
		t.Logf("grants: %v", order)
		pro := 0
		for i, team := range order {
			if team == "pro-team" {
				pro++
			}
			if i > 0 && team == "free-team" && order[i-1] == "free-team" {
				t.Errorf("DEFECT? free (weight 1) got two grants in a row at %d while pro (weight 3) waited: %v", i, order)
			}
		}
		if pro < 3*window/4-3 || pro > 3*window/4+3 {
			t.Errorf("DEFECT? pro got %d of %d grants with weights 3:1, want %d ± 3: %v", pro, window, 3*window/4, order)
		}
		cancel()
		waitDepth(t, ps, "fairw", "default", 0, 20*time.Second)
	})

	t.Run("a team alone gets the whole capacity", func(t *testing.T) {
		ctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		const n = 20
		for i := range n {
			_ = goSend(ctx, ps[i%len(ps)], http.MethodPost, fpFour, nil, fairHdr("lone", "")...)
		}
		cur := func() int {
			u.mu.Lock()
			defer u.mu.Unlock()
			return u.cur[fpFour]
		}
		u.waitHits(t, fpFour, 4, 15*time.Second)
		waitDepth(t, ps, "fair4", "default", n-4, 20*time.Second)
		for i := range 8 {
			before := u.count(fpFour)
			u.release(t, fpFour)
			u.waitHits(t, fpFour, before+1, 15*time.Second)
			if !waitFor(10*time.Second, func() bool { return cur() == 4 }) {
				t.Fatalf("after release %d: %d in flight while the lone team has waiters, want 4", i+1, cur())
			}
		}
		if pk := u.peakOf(fpFour); pk != 4 {
			t.Errorf("peak in flight %d, want 4 (max_in_flight)", pk)
		}
		cancel()
		waitDepth(t, ps, "fair4", "default", 0, 20*time.Second)
	})
}

func fairEnv() map[string]string {
	return map[string]string{"CHAT_RPM": "1000000", "PROTECTED_PATHS": strings.Join([]string{fpOne, fpWeight, fpFour}, ","),
		"SHUTDOWN_TIMEOUT": "2s"}
}

func TestPromiseFairShare(t *testing.T) {
	t.Run("memory", func(t *testing.T) {
		t.Parallel()
		u := newGateUpstream(t, []string{fpOne, fpWeight, fpFour}, nil)
		p := startProxy(t, u.srv.URL, fairEnv(), "-config", writeRules(t, fairFile))
		t.Cleanup(u.unblock)
		runFairPromise(t, []*proc{p}, u)
	})
	t.Run("two instances on one redis", func(t *testing.T) {
		t.Parallel()
		u := newGateUpstream(t, []string{fpOne, fpWeight, fpFour}, nil)
		ps := twoOnOneRedis(t, u.srv.URL, fairEnv(), fairFile)
		t.Cleanup(u.unblock)
		runFairPromise(t, ps, u)
	})
}

// twoOnOneRedis starts two instances in front of upstream sharing a Redis
// of their own, with env and the configuration file text cfg.
func twoOnOneRedis(t *testing.T, upstream string, env map[string]string, cfg string) []*proc {
	t.Helper()
	srv := redistest.Start(t)
	env["REDIS_URL"], env["REDIS_TIMEOUT"] = srv.URL(), "2s"
	file := writeRules(t, cfg)
	return []*proc{startProxy(t, upstream, env, "-config", file), startProxy(t, upstream, env, "-config", file)}
}
