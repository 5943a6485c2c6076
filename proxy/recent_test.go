package proxy_test

import (
	"net/http"
	"strconv"
	"testing"

	"github.com/ratelimit-proxy/ratelimit-proxy/config"
	"github.com/ratelimit-proxy/ratelimit-proxy/proxy"
)

// TestRefusalAllocatesNothing: a refused caller asking again, the
// attacker's hot path, costs the proxy no allocation (the server's own
// are not counted: the writer here keeps nothing).
func TestRefusalAllocatesNothing(t *testing.T) {
	if raceOn {
		t.Skip("the race detector empties sync.Pool at random")
	}
	ask := rememberedRefusals(t)
	for i := range 512 { // every caller's answer prepared once
		ask(i)
	}
	i := 0
	if n := testing.AllocsPerRun(2048, func() { ask(i); i++ }); n != 0 {
		t.Errorf("%v allocations per remembered 429, want 0", n)
	}
}

// TestRefusalRotatingHeaderAllocatesNothing: a refused caller who rotates
// a header that another rule (one that still admits) is keyed by gets the
// same answer each time — that rule's key is not in it — so the answer
// prepared once serves every spelling, without an allocation.
func TestRefusalRotatingHeaderAllocatesNothing(t *testing.T) {
	if raceOn {
		t.Skip("the race detector empties sync.Pool at random")
	}
	cfg := config.Default()
	cfg.UpstreamURL = "http://upstream.invalid"
	var o proxy.Options
	rules(t, `
chat_rpm = 1

[[rule]]
name   = "per-team"
key    = ["header:X-Team"]
limit  = 1000000000
window = "1m"
`)(&cfg, &o)
	w, ask := replayed(rememberingProxyFor(t, cfg), "/v1/chat/completions", 128, func(r *http.Request, i int) {
		r.RemoteAddr = "203.0.113.9:4711" // one caller
		r.Header.Set("X-Team", "team-"+strconv.Itoa(i))
	})
	ask(0) // the one request chat_rpm admits
	for i := 1; i <= 2*128; i++ {
		if ask(i); w.status != http.StatusTooManyRequests {
			t.Fatalf("request %d: %d, want 429", i, w.status)
		}
	}
	i := 0
	if n := testing.AllocsPerRun(1024, func() { ask(i); i++ }); n != 0 {
		t.Errorf("%v allocations per 429 to a caller rotating X-Team, want 0", n)
	}
}
