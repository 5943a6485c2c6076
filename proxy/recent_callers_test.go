package proxy_test

import (
	"net/http"
	"strconv"
	"testing"

	"github.com/ratelimit-proxy/ratelimit-proxy/config"
	"github.com/ratelimit-proxy/ratelimit-proxy/proxy"
)

// TestRefusalAllocatesNothingForEveryCaller: a refused caller asking again
// costs no allocation whoever it is — an IPv6 client (counted by its
// prefix), an API key in Authorization or, on Anthropic's path, X-API-Key
// — and under rules from a file: keyed by the caller, by a header, by
// both.
func TestRefusalAllocatesNothingForEveryCaller(t *testing.T) {
	if raceOn {
		t.Skip("the race detector empties sync.Pool at random")
	}
	for _, tc := range []struct {
		name string
		path string
		rule string
		set  func(r *http.Request, i int)
	}{
		{"IPv6", "/v1/chat/completions", "", func(r *http.Request, i int) {
			r.RemoteAddr = "[2001:db8:" + strconv.FormatInt(int64(i), 16) + "::7]:4711"
		}},
		{"API key", "/v1/chat/completions", "", func(r *http.Request, i int) {
			r.Header.Set("Authorization", "Bearer sk-refused-"+strconv.Itoa(i))
		}},
		{"X-API-Key", "/v1/messages", "", func(r *http.Request, i int) {
			r.Header.Set("X-API-Key", "sk-ant-refused-"+strconv.Itoa(i))
		}},
		{"file caller", "/v1/chat/completions", `
[[rule]]
name   = "per-caller"
key    = ["caller"]
limit  = 1
window = "1m"
`, func(r *http.Request, i int) {}},
		{"file header", "/v1/chat/completions", `
[[rule]]
name   = "per-team"
key    = ["header:X-Team"]
limit  = 1
window = "1m"
`, func(r *http.Request, i int) { r.Header.Set("X-Team", "team-"+strconv.Itoa(i)) }},
		{"chat_rpm plus X-Team", "/v1/chat/completions", "", func(r *http.Request, i int) { r.Header.Set("X-Team", "team-"+strconv.Itoa(i%7)) }},
		{"two key parts", "/v1/chat/completions", `
[[rule]]
name   = "per-team"
key    = ["caller", "header:X-Team"]
limit  = 1
window = "1m"
`, func(r *http.Request, i int) {
			r.Header.Set("X-Team", "team-"+strconv.Itoa(i%7))
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg := config.Default()
			cfg.UpstreamURL = "http://upstream.invalid"
			cfg.ChatRPM = 1
			if tc.rule != "" {
				var o proxy.Options
				rules(t, tc.rule)(&cfg, &o)
				cfg.ChatRPM = 0
			}
			w, again := replayed(rememberingProxyFor(t, cfg), tc.path, 128, tc.set)
			for i := range 128 {
				if again(i); w.status != 200 { // admitted: the one request
					t.Fatalf("caller %d's first request: %d", i, w.status)
				}
			}
			ask := func(i int) {
				if again(i); w.status != http.StatusTooManyRequests {
					t.Fatalf("caller %d asking again: %d, want 429", i%128, w.status)
				}
			}
			for i := range 2 * 128 { // every caller's answer prepared
				ask(i)
			}
			i := 0
			if n := testing.AllocsPerRun(1024, func() { ask(i); i++ }); n != 0 {
				t.Errorf("%v allocations per remembered 429, want 0", n)
			}
		})
	}
}
