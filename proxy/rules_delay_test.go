package proxy_test

import (
	"context"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/ratelimit-proxy/ratelimit-proxy/config"
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
	f := newFixture(t, rules(t, delayRule), realClock)
	start := time.Now()
	for i := range 3 {
		if w := f.send("/api/chat", "203.0.113.7:1", "", `{}`); w.Code != 200 {
			t.Fatalf("request %d: %d %s", i, w.Code, w.Body)
		}
	}
	// Three requests at one a second: the last two were held about 1 s each.
	if d := time.Since(start); d < 1900*time.Millisecond {
		t.Fatalf("three requests took %v; the delay rule held none", d)
	}
	if got := metric(t, f, "ratelimit_proxy_delayed_requests_total", map[string]string{"rule": "smooth", "outcome": "admitted"}); got != 2 {
		t.Fatalf("delayed admitted %v", got)
	}

	none := newFixture(t, rules(t, delayRule, "MAX_DELAYED", "0"), realClock)
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

// A client that leaves while held is not counted.
func TestDelayedClientLeaves(t *testing.T) {
	f := newFixture(t, rules(t, delayRule), realClock)
	f.send("/api/chat", "203.0.113.7:1", "", `{}`)
	ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
	defer cancel()
	r := httptest.NewRequest(http.MethodPost, "/api/chat", strings.NewReader(`{}`)).WithContext(ctx)
	r.RemoteAddr = "203.0.113.7:1"
	f.handler.ServeHTTP(httptest.NewRecorder(), r)
	if got := metric(t, f, "ratelimit_proxy_delayed_requests_total", map[string]string{"rule": "smooth", "outcome": "client_closed"}); got != 1 {
		t.Fatalf("client_closed %v", got)
	}
	time.Sleep(time.Second) // the first admission leaves the window
	// Had the gone request been counted, this one would be held again.
	start := time.Now()
	if w := f.send("/api/chat", "203.0.113.7:1", "", `{}`); w.Code != 200 || time.Since(start) > 300*time.Millisecond {
		t.Fatalf("after the window: %d in %v", w.Code, time.Since(start))
	}
	if got := metric(t, f, "ratelimit_proxy_delayed_requests", nil); got != 0 {
		t.Fatalf("held now %v", got)
	}
}
