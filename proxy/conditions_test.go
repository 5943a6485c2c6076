package proxy_test

import (
	"testing"
)

// `when` values may be lists (any of them) and, for ip, CIDRs; `unless`
// exempts the requests for which all its conditions hold. Disguises of the
// exempt address (an X-Forwarded-For from an untrusted peer) do not exempt.
func TestWhenListsCIDRsAndUnless(t *testing.T) {
	f := newFixture(t, rules(t, `
[[rule]]
name   = "outsiders"
key    = ["ip"]
limit  = 1
window = "1m"
unless = { ip = ["10.0.0.0/8", "2001:db8::/32", "192.0.2.7"] }

[[rule]]
name   = "envs"
key    = ["global"]
limit  = 1
window = "1m"
when   = { "header:X-Env" = ["prod", "stag*"], ip = ["198.51.100.0/24"] }
`))
	chat := `{"messages":[{"role":"user","content":"hi"}]}`
	post := func(peer string, hdr ...string) int {
		return f.send("/v1/chat/completions", peer, "application/json", chat, hdr...).Code
	}
	// Inside the allow list: never limited by "outsiders", any number of times.
	for _, peer := range []string{"10.1.2.3:1", "10.1.2.3:2", "[2001:db8::1]:1", "[2001:db8::1]:2", "192.0.2.7:1", "192.0.2.7:2"} {
		if c := post(peer); c != 200 {
			t.Fatalf("%s, exempt: %d", peer, c)
		}
	}
	// Outside it: limited, and a claimed address from an untrusted peer
	// changes nothing.
	if c := post("203.0.113.9:1", "X-Forwarded-For", "10.0.0.1"); c != 200 {
		t.Fatalf("first outsider request: %d", c)
	}
	if c := post("203.0.113.9:2", "X-Forwarded-For", "10.0.0.1"); c != 429 {
		t.Fatalf("second outsider request claiming 10.0.0.1: %d, want 429", c)
	}
	if c := post("192.0.2.8:1"); c != 200 { // next to the exempt address, not it
		t.Fatalf("192.0.2.8 first: %d", c)
	}
	if c := post("192.0.2.8:2"); c != 429 {
		t.Fatalf("192.0.2.8 second: %d, want 429", c)
	}
	// "envs" applies only to both conditions together, any listed value.
	if c := post("10.9.9.9:1", "X-Env", "prod"); c != 200 { // ip outside 198.51.100.0/24: not applying
		t.Fatalf("envs, other ip: %d", c)
	}
	if c := post("10.9.9.9:2", "X-Env", "prod"); c != 200 {
		t.Fatalf("envs, other ip again: %d", c)
	}
	// (each from an address of its own: "outsiders" admits one per ip)
	if c := post("198.51.100.20:1", "X-Env", "dev"); c != 200 {
		t.Fatalf("envs, dev: %d", c)
	}
	if c := post("198.51.100.23:1", "X-Env", "dev"); c != 200 {
		t.Fatal("envs applied to X-Env: dev")
	}
	_ = post("198.51.100.21:1", "X-Env", "staging") // outsiders: a fresh ip; envs: its one admission
	w := f.send("/v1/chat/completions", "198.51.100.22:1", "application/json", chat, "X-Env", "prod")
	if w.Code != 429 || w.Header().Get("X-RateLimit-Limit") != "1" {
		t.Fatalf("envs, second request in prod/staging: %d", w.Code)
	}
}
