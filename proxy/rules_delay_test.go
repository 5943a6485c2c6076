package proxy_test

import (
	"bytes"
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/ratelimit-proxy/ratelimit-proxy/config"
	"github.com/ratelimit-proxy/ratelimit-proxy/internal/redistest"
	"github.com/ratelimit-proxy/ratelimit-proxy/limits"
	"github.com/ratelimit-proxy/ratelimit-proxy/proxy"
)

func realClock(_ *config.Config, o *proxy.Options) { o.Now = time.Now }

const delayRule = `
[[rule]]
name      = "smooth"
paths     = ["/api/chat"]
limit     = 1
window    = "1s"
action    = "delay"
max_delay = "3s"
`

// A delay rule holds a request over its limit until it fits, then
// decides again; past MAX_DELAYED held requests it refuses at once.
func TestDelayRule(t *testing.T) {
	// Two requests, one a 2 s window: the second is held until the first
	// leaves it. (A second apart, as before, a loaded machine could take
	// the second between two sends and hold nothing.)
	f := newFixture(t, rules(t, strings.Replace(strings.Replace(delayRule, `window    = "1s"`, `window    = "2s"`, 1),
		`max_delay = "3s"`, `max_delay = "5s"`, 1)), realClock)
	start := time.Now()
	for i := range 2 {
		if w := f.send("/api/chat", "203.0.113.7:1", "", `{}`); w.Code != 200 {
			t.Fatalf("request %d: %d %s", i, w.Code, w.Body)
		}
	}
	if d := time.Since(start); d < 1900*time.Millisecond {
		t.Fatalf("two requests took %v; the delay rule held none", d)
	}
	if got := metric(t, f, "ratelimit_proxy_delayed_requests_total", map[string]string{"rule": "smooth", "outcome": "admitted"}); got != 1 {
		t.Fatalf("delayed admitted %v", got)
	}

	// A minute's window (and the fixture's clock): the second request is
	// over the limit however slowly the first was served.
	none := newFixture(t, rules(t, `
[[rule]]
name      = "smooth"
paths     = ["/api/chat"]
limit     = 1
window    = "1m"
action    = "delay"
max_delay = "2m"
`, "MAX_DELAYED", "0"))
	none.send("/api/chat", "203.0.113.7:1", "", `{}`)
	if w := none.send("/api/chat", "203.0.113.7:1", "", `{}`); w.Code != 429 || body429(t, w).DeniedBy != "smooth" {
		t.Fatalf("MAX_DELAYED=0: %d %s", w.Code, w.Body)
	}
}

// A wait longer than max_delay is refused at once.
func TestDelayBeyondMaxDelayRefuses(t *testing.T) {
	f := newFixture(t, rules(t, `
[[rule]]
name      = "slow"
paths     = ["/api/chat"]
limit     = 1
window    = "1m"
action    = "delay"
max_delay = "2s"
`), realClock)
	f.send("/api/chat", "203.0.113.7:1", "", `{}`)
	start := time.Now()
	if w := f.send("/api/chat", "203.0.113.7:1", "", `{}`); w.Code != 429 || time.Since(start) > time.Second {
		t.Fatalf("%d after %v", w.Code, time.Since(start))
	}
}

// A client that leaves while held is not counted. The decisions follow
// the fixture's clock, moved by hand (a loaded machine cannot let the
// window pass between two requests); the hold's waits are real.
func TestDelayedClientLeaves(t *testing.T) {
	f := newFixture(t, rules(t, delayRule))
	f.send("/api/chat", "203.0.113.7:1", "", `{}`)
	f.clock.Set(0.5) // had the next request been counted, it would be at 0.5 s
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	r := httptest.NewRequest(http.MethodPost, "/api/chat", strings.NewReader(`{}`)).WithContext(ctx)
	r.RemoteAddr = "203.0.113.7:1"
	done := make(chan struct{})
	go func() {
		defer close(done)
		f.handler.ServeHTTP(httptest.NewRecorder(), r)
	}()
	// The client leaves once the request is held.
	if !waitUntil(func() bool { return metric(t, f, "ratelimit_proxy_delayed_requests", nil) == 1 }) {
		t.Fatal("the second request was not held")
	}
	cancel()
	<-done
	if got := metric(t, f, "ratelimit_proxy_delayed_requests_total", map[string]string{"rule": "smooth", "outcome": "client_closed"}); got != 1 {
		t.Fatalf("client_closed %v", got)
	}
	f.clock.Set(1.1) // the first admission has left the window; one at 0.5 s would not have
	// Had the gone request been counted, this one would be held again.
	if w := f.send("/api/chat", "203.0.113.7:1", "", `{}`); w.Code != 200 {
		t.Fatalf("after the window: %d", w.Code)
	}
	if got := metric(t, f, "ratelimit_proxy_delayed_requests_total", map[string]string{"rule": "smooth", "outcome": "admitted"}); got != 0 {
		t.Fatalf("held and admitted %v: the gone request was counted", got)
	}
}

// A real client that sends its whole request and closes the connection
// while a delay rule holds it leaves uncounted and unforwarded, whether
// the body was read before the decision (a rule reads the body) or not
// (the rule decides first), on memory and on Redis.
func TestDelayedClientClosesConnection(t *testing.T) {
	const bodyRule = `
[[rule]]
name      = "smooth"
paths     = ["/api/chat"]
key       = ["model"]
limit     = 2
window    = "2s"
action    = "delay"
max_delay = "5s"
`
	const headerRule = `
[[rule]]
name      = "smooth"
paths     = ["/api/chat"]
limit     = 2
window    = "2s"
action    = "delay"
max_delay = "5s"
`
	stores := map[string]func(t *testing.T) option{
		"memory": func(*testing.T) option { return func(*config.Config, *proxy.Options) {} },
		"redis": func(t *testing.T) option {
			srv := redistest.Start(t)
			client := redis.NewClient(&redis.Options{Addr: srv.Addr})
			t.Cleanup(func() { client.Close() })
			return func(_ *config.Config, o *proxy.Options) {
				o.Store = limits.NewRedis(limits.RedisOptions{Client: client, Prefix: "delay:", Timeout: 5 * time.Second, ClientClock: true})
			}
		},
	}
	for _, name := range []string{"memory", "redis"} {
		for _, tc := range []struct{ name, rule string }{{"body read", bodyRule}, {"body not yet read", headerRule}} {
			t.Run(name+"/"+tc.name, func(t *testing.T) {
				testDelayedClientCloses(t, tc.rule, stores[name](t))
			})
		}
	}
}

func testDelayedClientCloses(t *testing.T, rule string, store option) {
	// The decisions follow the test's clock, set to the wall clock's time
	// (the server's read deadlines are taken from it) and moved by hand:
	// the test does not race a window on a loaded machine.
	f := newFixture(t, rules(t, rule), store)
	base := time.Since(time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)).Seconds()
	f.clock.Set(base)
	srv := fixtureServer(t, f)
	const body = `{"model":"gpt-4o","message":"hi"}`
	post := func() *http.Response {
		t.Helper()
		res, err := http.Post(srv.URL+"/api/chat", "application/json", strings.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		io.Copy(io.Discard, res.Body)
		res.Body.Close()
		return res
	}
	for i := range 2 {
		if res := post(); res.StatusCode != 200 {
			t.Fatalf("request %d: %d", i, res.StatusCode)
		}
	}
	held := func() float64 { return metric(t, f, "ratelimit_proxy_delayed_requests", nil) }
	waitFor := func(what string, ok func() bool) {
		t.Helper()
		for deadline := time.Now().Add(10 * time.Second); !ok(); time.Sleep(10 * time.Millisecond) {
			if time.Now().After(deadline) {
				t.Fatal(what)
			}
		}
	}
	// The third is held for 2 s (real time, on the timer); its client
	// sends it whole, then closes the connection.
	rc := dialRaw(t, srv)
	rc.head("/api/chat", len(body))
	rc.write(body)
	waitFor("the third request was not held", func() bool { return held() == 1 })
	rc.c.Close()
	// Past the window: had the hold gone on, its next decision admits it.
	f.clock.Set(base + 2.1)
	waitFor("still held", func() bool { return held() == 0 })
	if n := f.upstream.Load(); n != 2 {
		t.Fatalf("the upstream saw %d requests, want the 2 admitted", n)
	}
	gone := metric(t, f, "ratelimit_proxy_delayed_requests_total", map[string]string{"rule": "smooth", "outcome": "client_closed"})
	admitted := metric(t, f, "ratelimit_proxy_delayed_requests_total", map[string]string{"rule": "smooth", "outcome": "admitted"})
	if gone != 1 || admitted != 0 {
		t.Fatalf("delayed outcomes: client_closed %v, admitted %v", gone, admitted)
	}
	// The first two have left the window and the one that left was never
	// counted: this one finds the whole limit, and takes one.
	res := post()
	if res.StatusCode != 200 || res.Header.Get("X-RateLimit-Remaining") != "1" {
		t.Fatalf("after the window: %d, remaining %q, want 1 (%v)", res.StatusCode, res.Header.Get("X-RateLimit-Remaining"), res.Header)
	}
	if n := f.upstream.Load(); n != 3 {
		t.Fatalf("the upstream saw %d requests, want 3", n)
	}
}

// The body of a held request is read while it waits: a client that sent
// Expect: 100-continue gets 100 Continue, and once admitted the body
// (here larger than what is kept in memory) is forwarded byte for byte.
func TestDelayedBodyReadWhileHeld(t *testing.T) {
	rec := &recorder{}
	up := httptest.NewServer(rec)
	t.Cleanup(up.Close)
	f := newFixture(t, rules(t, `
max_body_bytes = 1048576
max_input_tokens = 10000000

[[rule]]
name      = "smooth"
paths     = ["/v1/embeddings"]
limit     = 1
window    = "2s"
action    = "delay"
max_delay = "5s"
`), func(c *config.Config, _ *proxy.Options) { c.UpstreamURL = up.URL })
	base := time.Since(time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)).Seconds()
	f.clock.Set(base)
	srv := fixtureServer(t, f)
	first := dialRaw(t, srv)
	first.head("/v1/embeddings", 2)
	first.write("{}")
	if res := first.response(); res.StatusCode != 200 {
		t.Fatalf("first: %d", res.StatusCode)
	}
	body := []byte(`{"input":"` + strings.Repeat("0123456789", 30<<10) + `"}`)
	rc := dialRaw(t, srv)
	rc.head("/v1/embeddings", len(body), "Expect: 100-continue")
	if res := rc.response(); res.StatusCode != http.StatusContinue {
		t.Fatalf("held: %d, want 100 Continue", res.StatusCode)
	}
	go rc.c.Write(body)
	for deadline := time.Now().Add(10 * time.Second); metric(t, f, "ratelimit_proxy_delayed_requests", nil) != 1; time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("not held")
		}
	}
	f.clock.Set(base + 2.1)
	if res := rc.response(); res.StatusCode != 200 {
		t.Fatalf("after the hold: %d", res.StatusCode)
	}
	rec.mu.Lock()
	defer rec.mu.Unlock()
	if len(rec.bodies) != 2 || !bytes.Equal(rec.bodies[1], body) || rec.lengths[1] != int64(len(body)) {
		t.Fatalf("the upstream got %d requests, the last of %d bytes; want %d", len(rec.bodies), len(rec.bodies[len(rec.bodies)-1]), len(body))
	}
}

// A held request refused when its wait ends is answered at once, though
// its body has not all arrived: the read under way is cut short.
func TestDelayedRefusedWhileBodyArrives(t *testing.T) {
	f := newFixture(t, rules(t, `
[[rule]]
name      = "smooth"
paths     = ["/api/chat"]
limit     = 1
window    = "1m"
action    = "delay"
max_delay = "3s"
`))
	base := time.Since(time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)).Seconds()
	f.clock.Set(base)
	srv := fixtureServer(t, f)
	post := func() int {
		t.Helper()
		res, err := http.Post(srv.URL+"/api/chat", "application/json", strings.NewReader(`{}`))
		if err != nil {
			t.Fatal(err)
		}
		res.Body.Close()
		return res.StatusCode
	}
	if code := post(); code != 200 {
		t.Fatalf("first: %d", code)
	}
	// 2 s before the first leaves the window: held, with half a body sent.
	f.clock.Set(base + 58)
	rc := dialRaw(t, srv)
	rc.head("/api/chat", 1000)
	rc.write(`{"message":"`)
	for deadline := time.Now().Add(10 * time.Second); metric(t, f, "ratelimit_proxy_delayed_requests", nil) != 1; time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("not held")
		}
	}
	// Another takes the place as it frees; when the wait ends, the held
	// one would wait past max_delay: 429.
	f.clock.Set(base + 60.5)
	if code := post(); code != 200 {
		t.Fatalf("the other: %d", code)
	}
	start := time.Now()
	res := rc.response()
	if res.StatusCode != 429 || time.Since(start) > 3*time.Second {
		t.Fatalf("held one: %d after %v", res.StatusCode, time.Since(start))
	}
	if got := metric(t, f, "ratelimit_proxy_delayed_requests_total", map[string]string{"rule": "smooth", "outcome": "rate_limited"}); got != 1 {
		t.Fatalf("rate_limited after the hold: %v", got)
	}
	if n := f.upstream.Load(); n != 2 {
		t.Fatalf("upstream saw %d", n)
	}
}
