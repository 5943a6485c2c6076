package proxy_test

import (
	"context"
	"io"
	"math/rand/v2"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/ratelimit-proxy/ratelimit-proxy/config"
	"github.com/ratelimit-proxy/ratelimit-proxy/internal/redistest"
	"github.com/ratelimit-proxy/ratelimit-proxy/limits"
	"github.com/ratelimit-proxy/ratelimit-proxy/proxy"
	"github.com/redis/go-redis/v9"
)

// holdingUpstream answers by the request's X-Mode: "hold" waits until
// release is closed, "stream" writes a chunk every 5 ms until release is
// closed, "fail" drops the connection (the proxy answers 502), anything
// else answers at once. arrived counts requests that reached it.
type holdingUpstream struct {
	srv     *httptest.Server
	release chan struct{}
	arrived chan struct{}
}

func newHoldingUpstream(t *testing.T) *holdingUpstream {
	u := &holdingUpstream{release: make(chan struct{}), arrived: make(chan struct{}, 1000)}
	u.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.Copy(io.Discard, r.Body)
		u.arrived <- struct{}{}
		switch r.Header.Get("X-Mode") {
		case "hold":
			select {
			case <-u.release:
			case <-r.Context().Done():
			}
		case "stream":
			for {
				io.WriteString(w, "data: x\n\n")
				w.(http.Flusher).Flush()
				select {
				case <-u.release:
					return
				case <-r.Context().Done():
					return
				case <-time.After(5 * time.Millisecond):
				}
			}
		case "fail":
			c, _, _ := w.(http.Hijacker).Hijack()
			c.Close()
			return
		}
		io.WriteString(w, `{"ok":true}`)
	}))
	t.Cleanup(u.srv.Close)
	return u
}

const concRules = `
[[rule]]
name      = "conc"
paths     = ["/api/chat"]
key       = ["header:X-Team"]
algorithm = "concurrency"
limit     = 2
`

// inFlight is the admin API's used for the team's key.
func inFlight(t *testing.T, f *fixture, team string) int {
	t.Helper()
	code, m := f.adminDo(t, "GET", "/admin/limits/conc?key=header:X-Team%3D"+team, "", "")
	if code != 200 {
		t.Fatalf("admin: %d %v", code, m)
	}
	used, rem, limit := m["used"].(float64), m["remaining"].(float64), m["limit"].(float64)
	if m["algorithm"] != "concurrency" || used+rem != limit || m["reset_after_seconds"] != 1.0 {
		t.Fatalf("view %v", m)
	}
	return int(used)
}

// awaitInFlight waits (bounded) until the key has n requests in flight: a
// client's departure reaches the server's handler asynchronously.
func awaitInFlight(t *testing.T, f *fixture, team string, n int) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for {
		got := inFlight(t, f, team)
		if got == n {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("in flight %d, want %d", got, n)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

func postTeam(ctx context.Context, url, team, mode string) (*http.Response, error) {
	r, _ := http.NewRequestWithContext(ctx, http.MethodPost, url+"/api/chat", strings.NewReader(`{"message":"hi"}`))
	r.Header.Set("Content-Type", "application/json")
	r.Header.Set("X-Team", team)
	r.Header.Set("X-Mode", mode)
	return http.DefaultClient.Do(r)
}

func TestConcurrencyRule(t *testing.T) {
	u := newHoldingUpstream(t)
	f := newFixture(t, upstreamAt(u.srv.URL), rules(t, concRules))
	srv := httptest.NewServer(f.handler)
	t.Cleanup(srv.Close)

	// Two held requests take both places.
	done := make(chan *http.Response, 2)
	for range 2 {
		go func() {
			resp, err := postTeam(context.Background(), srv.URL, "t", "hold")
			if err != nil {
				t.Error(err)
			}
			done <- resp
		}()
	}
	<-u.arrived
	<-u.arrived
	if n := inFlight(t, f, "t"); n != 2 {
		t.Fatalf("in flight %d, want 2", n)
	}
	w := f.do("/api/chat", "203.0.113.7:1", "X-Team", "t")
	h := w.Header()
	if w.Code != 429 || h.Get("Retry-After") != "1" || h.Get("X-Ratelimit-Limit") != "2" ||
		h.Get("X-Ratelimit-Remaining") != "0" || h.Get("X-Ratelimit-Reset") != "1" {
		t.Fatalf("3rd: %d %v %s", w.Code, h, w.Body)
	}
	if b := body429(t, w); b.RetryAfter != 1 || b.DeniedBy != "conc" {
		t.Fatalf("3rd body %+v", b)
	}
	// Another key has its own places.
	if w := f.do("/api/chat", "203.0.113.7:1", "X-Team", "other"); w.Code != 200 || w.Header().Get("X-Ratelimit-Remaining") != "1" {
		t.Fatalf("other key: %d %v", w.Code, w.Header())
	}
	<-u.arrived

	// The end of a response frees its place at once.
	close(u.release)
	for range 2 {
		resp := <-done
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		if resp.StatusCode != 200 || resp.Header.Get("X-Ratelimit-Limit") != "2" {
			t.Fatalf("held: %d %v", resp.StatusCode, resp.Header)
		}
	}
	awaitInFlight(t, f, "t", 0)
	if w := f.do("/api/chat", "203.0.113.7:1", "X-Team", "t"); w.Code != 200 || w.Header().Get("X-Ratelimit-Remaining") != "1" ||
		w.Header().Get("X-Ratelimit-Reset") != "1" {
		t.Fatalf("after release: %d %v", w.Code, w.Header())
	}
	if n := inFlight(t, f, "t"); n != 0 {
		t.Fatalf("in flight after a normal end: %d", n)
	}
}

func TestConcurrencyReleasedOnEveryEnding(t *testing.T) {
	u := newHoldingUpstream(t)
	f := newFixture(t, upstreamAt(u.srv.URL), rules(t, concRules+`
[[rule]]
name  = "window"
paths = ["/api/chat"]
key   = ["header:X-Team"]
limit = 1
`))
	srv := httptest.NewServer(f.handler)
	t.Cleanup(srv.Close)

	// The upstream fails: 502, and the place is free.
	resp, err := postTeam(context.Background(), srv.URL, "t", "fail")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != 502 {
		t.Fatalf("upstream failure: %d", resp.StatusCode)
	}
	<-u.arrived
	awaitInFlight(t, f, "t", 0)

	// Refused by another rule after the place was taken: given back.
	if w := f.do("/api/chat", "203.0.113.7:1", "X-Team", "t"); w.Code != 429 {
		t.Fatalf("window: %d", w.Code)
	} else if b := body429(t, w); b.DeniedBy != "window" {
		t.Fatalf("denied by %q", b.DeniedBy)
	}
	if n := inFlight(t, f, "t"); n != 0 {
		t.Fatalf("in flight after another rule refused: %d", n)
	}

	// A stream to its last byte, and a client gone mid-stream.
	f2 := newFixture(t, upstreamAt(u.srv.URL), rules(t, concRules))
	srv2 := httptest.NewServer(f2.handler)
	t.Cleanup(srv2.Close)
	ctx, cancel := context.WithCancel(context.Background())
	resp, err = postTeam(ctx, srv2.URL, "s", "stream")
	if err != nil {
		t.Fatal(err)
	}
	<-u.arrived
	buf := make([]byte, 9)
	if _, err := io.ReadFull(resp.Body, buf); err != nil {
		t.Fatal(err)
	}
	if n := inFlight(t, f2, "s"); n != 1 {
		t.Fatalf("streaming: in flight %d", n)
	}
	cancel()
	resp.Body.Close()
	awaitInFlight(t, f2, "s", 0)

	resp, err = postTeam(context.Background(), srv2.URL, "s", "stream")
	if err != nil {
		t.Fatal(err)
	}
	<-u.arrived
	if n := inFlight(t, f2, "s"); n != 1 {
		t.Fatalf("streaming: in flight %d", n)
	}
	close(u.release)
	io.Copy(io.Discard, resp.Body) // to its last byte
	resp.Body.Close()
	awaitInFlight(t, f2, "s", 0)
}

// TestConcurrencyNoLeak ends 200 concurrent requests in every way at
// random; afterwards none is in flight.
// Nothing leaks, in memory and with places leased on Redis: 200 requests
// that end every way — answered, upstream failures, streams and holds cut
// by clients that leave, refusals by a later rule after the place was
// taken — and every place is free again.
func TestConcurrencyNoLeak(t *testing.T) {
	for _, store := range []string{"memory", "redis"} {
		t.Run(store, func(t *testing.T) {
			u := newHoldingUpstream(t)
			opts := []option{upstreamAt(u.srv.URL), rules(t, strings.Replace(concRules, "limit     = 2", "limit     = 50", 1)+`
[[rule]]
name   = "rate"
paths  = ["/api/chat"]
key    = ["header:X-Team"]
limit  = 30
window = "1m"
`)}
			var places *limits.RedisPlaces
			if store == "redis" {
				srv := redistest.Start(t)
				client := redis.NewClient(&redis.Options{Addr: srv.Addr})
				t.Cleanup(func() { client.Close() })
				places = limits.NewRedisPlaces(limits.RedisPlacesOptions{Client: client, Prefix: "leak:", Timeout: time.Second})
				t.Cleanup(places.Close)
				opts = append(opts, func(_ *config.Config, o *proxy.Options) { o.Places = places })
			}
			f := newFixture(t, opts...)
			srv := httptest.NewServer(f.handler)
			t.Cleanup(srv.Close)
			// One request first, so that the token counter is loaded.
			if resp, err := postTeam(context.Background(), srv.URL, "warm", ""); err != nil || resp.StatusCode != 200 {
				t.Fatalf("warm-up: %v %v", resp, err)
			} else {
				resp.Body.Close()
			}
			var wg sync.WaitGroup
			var mu sync.Mutex
			codes := map[int]int{}
			for i := range 200 {
				wg.Add(1)
				go func() {
					defer wg.Done()
					rng := rand.New(rand.NewPCG(uint64(i), 1))
					mode := []string{"", "fail", "stream", "hold"}[rng.IntN(4)]
					ctx, cancel := context.WithTimeout(context.Background(), time.Duration(20+rng.IntN(300))*time.Millisecond)
					defer cancel()
					resp, err := postTeam(ctx, srv.URL, "t", mode)
					if err != nil {
						mu.Lock()
						codes[-1]++ // the client left
						mu.Unlock()
						return
					}
					io.Copy(io.Discard, resp.Body)
					resp.Body.Close()
					mu.Lock()
					codes[resp.StatusCode]++
					mu.Unlock()
				}()
			}
			wg.Wait()
			awaitInFlight(t, f, "t", 0)
			if places != nil && places.Held() != 0 {
				t.Fatalf("%d leases still renewed", places.Held())
			}
			if metric(t, f, "ratelimit_proxy_rule_decisions_total", map[string]string{"rule": "rate", "result": "rate_limited"}) == 0 {
				t.Fatalf("no refusal by the later rule: %v", codes)
			}
			t.Logf("answers: %v", codes)
		})
	}
}

// The cookbook's in-flight.toml: four streams of a caller at once, the
// fifth refused; the team plan gets sixteen.
func TestCookbookInFlight(t *testing.T) {
	u := newHoldingUpstream(t)
	f := newFixture(t, upstreamAt(u.srv.URL), cookbook(t, "in-flight.toml", "UPSTREAM_URL", u.srv.URL))
	srv := httptest.NewServer(f.handler)
	t.Cleanup(srv.Close)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	post := func(key, plan string) (*http.Response, error) {
		r, _ := http.NewRequestWithContext(ctx, http.MethodPost, srv.URL+"/api/chat", strings.NewReader(`{"message":"hi"}`))
		r.Header.Set("Content-Type", "application/json")
		r.Header.Set("Authorization", "Bearer "+key)
		r.Header.Set("X-Plan", plan)
		r.Header.Set("X-Mode", "stream")
		return http.DefaultClient.Do(r)
	}
	var open []*http.Response
	for i := range 4 {
		resp, err := post("k1", "")
		if err != nil || resp.StatusCode != 200 {
			t.Fatalf("stream %d: %v %v", i+1, resp, err)
		}
		open = append(open, resp)
	}
	if resp, err := post("k1", ""); err != nil || resp.StatusCode != 429 || resp.Header.Get("Retry-After") != "1" {
		t.Fatalf("the fifth: %v %v", resp, err)
	} else {
		resp.Body.Close()
	}
	for i := range 5 {
		resp, err := post("k2", "team")
		if err != nil || resp.StatusCode != 200 || resp.Header.Get("X-RateLimit-Limit") != "16" {
			t.Fatalf("team stream %d: %v %v", i+1, resp, err)
		}
		open = append(open, resp)
	}
	close(u.release)
	for _, r := range open {
		io.Copy(io.Discard, r.Body)
		r.Body.Close()
	}
}

// ?top=N on a concurrency rule lists the keys with the most requests in
// flight, in memory and on Redis leases.
func TestConcurrencyTop(t *testing.T) {
	for _, store := range []string{"memory", "redis"} {
		t.Run(store, func(t *testing.T) {
			u := newHoldingUpstream(t)
			opts := []option{upstreamAt(u.srv.URL), rules(t, strings.Replace(concRules, "limit     = 2", "limit     = 5", 1))}
			if store == "redis" {
				srv := redistest.Start(t)
				client := redis.NewClient(&redis.Options{Addr: srv.Addr})
				t.Cleanup(func() { client.Close() })
				places := limits.NewRedisPlaces(limits.RedisPlacesOptions{Client: client, Prefix: "top:", Timeout: time.Second})
				t.Cleanup(places.Close)
				opts = append(opts, func(_ *config.Config, o *proxy.Options) { o.Places = places })
			}
			f := newFixture(t, opts...)
			srv := httptest.NewServer(f.handler)
			t.Cleanup(srv.Close)
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			var open []*http.Response
			for team, n := range map[string]int{"a": 3, "b": 1, "c": 2} {
				for range n {
					resp, err := postTeam(ctx, srv.URL, team, "stream")
					if err != nil || resp.StatusCode != 200 {
						t.Fatalf("%s: %v %v", team, resp, err)
					}
					open = append(open, resp)
				}
			}
			code, m := f.adminDo(t, "GET", "/admin/limits/conc?top=2", "", "")
			keys := topKeys(t, m)
			if code != 200 || len(keys) != 2 || keys[0]["key"] != "header:X-Team=a" || keys[0]["used"] != 3.0 || keys[0]["remaining"] != 2.0 ||
				keys[1]["key"] != "header:X-Team=c" || keys[1]["used"] != 2.0 {
				t.Fatalf("top=2: %d %v", code, m)
			}
			close(u.release)
			for _, r := range open {
				io.Copy(io.Discard, r.Body)
				r.Body.Close()
			}
			awaitInFlight(t, f, "a", 0)
			if _, m := f.adminDo(t, "GET", "/admin/limits/conc?top=5", "", ""); len(topKeys(t, m)) != 0 {
				t.Fatalf("all ended: %v", m)
			}
		})
	}
}
