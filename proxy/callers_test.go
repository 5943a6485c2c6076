package proxy_test

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"net/http"
	"net/netip"
	"strconv"
	"testing"

	"github.com/ratelimit-proxy/ratelimit-proxy/config"
	"github.com/ratelimit-proxy/ratelimit-proxy/proxy"
)

// A refused caller asking again is counted as itself, and its 429 says
// the exact wait, whatever else was asked before: more callers than the
// proxy's tables of recent caller values, keys and Retry-After-Ms values
// hold (so their entries collide and are replaced), IPv4 and IPv6 clients
// and API keys, in two proxies of one process whose IPV6_PREFIX differ
// (64 and 48), asked in turn. Caller i spends its one request a minute at
// i ms; asked again at 30 s and 45 s, its wait is 30 000 + i and
// 15 000 + i ms, each its own Retry-After-Ms value. Every 429 says the
// same wait in its headers and body: Retry-After, X-RateLimit-Retry-After
// and retry_after_seconds are Retry-After-Ms in whole seconds rounded up,
// X-RateLimit-Remaining is 0, denied_key the caller's own.
func TestRefusedCallersCountedAsThemselves(t *testing.T) {
	type caller struct {
		peer, key string // the client address, the API key ("" for none)
		want      [2]string
	}
	prefixes := [2]int{64, 48}
	var callers []caller
	for i := range 4500 {
		a := netip.AddrFrom4([4]byte{10, byte(i >> 16), byte(i >> 8), byte(i)})
		callers = append(callers, caller{peer: a.String() + ":4711", want: [2]string{"ip:" + a.String(), "ip:" + a.String()}})
	}
	for i := range 1500 {
		a := netip.MustParseAddr(fmt.Sprintf("2001:db8:%x:%x::%x", i, i%3, i))
		c := caller{peer: netip.AddrPortFrom(a, 4711).String()}
		for j, bits := range prefixes {
			c.want[j] = "ip:" + netip.PrefixFrom(a, bits).Masked().String()
		}
		callers = append(callers, c)
	}
	callers = append(callers, caller{peer: "[fe80::1%eth0]:4711", want: [2]string{"ip:fe80::/64", "ip:fe80::/48"}})
	for i := range 3000 {
		tok := "sk-caller-" + strconv.Itoa(i)
		sum := sha256.Sum256([]byte(tok))
		k := "key:" + hex.EncodeToString(sum[:8])
		callers = append(callers, caller{peer: "192.0.2.1:4711", key: tok, want: [2]string{k, k}})
	}
	var fs [2]*fixture
	for j, bits := range prefixes {
		fs[j] = newFixture(t, rpm(1), remembering, func(c *config.Config, _ *proxy.Options) { c.IPv6Prefix = int64(bits) })
	}
	ask := func(j int, c caller) *http.Response {
		var hdr []string
		if c.key != "" {
			hdr = []string{"Authorization", "Bearer " + c.key}
		}
		return fs[j].do("/api/chat", c.peer, hdr...).Result()
	}
	for i, c := range callers {
		for j := range fs {
			fs[j].clock.Set(float64(i) / 1000)
			if res := ask(j, c); res.StatusCode != 200 {
				t.Fatalf("caller %d (%s %s), IPV6_PREFIX %d, first request: %d", i, c.peer, c.key, prefixes[j], res.StatusCode)
			}
		}
	}
	check := func(at float64, j int, i int, c caller, res *http.Response) {
		t.Helper()
		wantMs := int64(60_000-at*1000) + int64(i) // admitted at i ms, for a minute
		h := res.Header
		var body struct {
			Error      string `json:"error"`
			RetryAfter int64  `json:"retry_after_seconds"`
			DeniedKey  string `json:"denied_key"`
		}
		if err := json.NewDecoder(res.Body).Decode(&body); err != nil {
			t.Fatalf("caller %d at %vs: body: %v", i, at, err)
		}
		secs := strconv.FormatInt((wantMs+999)/1000, 10)
		if res.StatusCode != 429 || body.DeniedKey != "caller="+c.want[j] ||
			h.Get("Retry-After-Ms") != strconv.FormatInt(wantMs, 10) || h.Get("Retry-After") != secs ||
			h.Get("X-RateLimit-Retry-After") != secs || strconv.FormatInt(body.RetryAfter, 10) != secs ||
			h.Get("X-RateLimit-Remaining") != "0" {
			t.Fatalf("caller %d (%s %s), IPV6_PREFIX %d, at %vs: %d denied_key %q retry_after_seconds %d, headers %v; want 429 %q, Retry-After-Ms %d",
				i, c.peer, c.key, prefixes[j], at, res.StatusCode, body.DeniedKey, body.RetryAfter, h, "caller="+c.want[j], wantMs)
		}
	}
	for _, at := range []float64{30, 30, 45} {
		for j := range fs {
			fs[j].clock.Set(at)
		}
		for i, c := range callers {
			for j := range fs {
				check(at, j, i, c, ask(j, c))
			}
		}
	}
	// One caller, however its address is written: an IPv4 client seen
	// through an IPv6 socket is the IPv4 caller; an IPv6 client is its
	// prefix, whatever its zone.
	for _, alias := range []struct {
		peer  string
		as    int // the caller it is counted as
		fresh [2]bool
	}{
		{peer: "[::ffff:10.0.0.7]:1", as: 7},
		{peer: "[::ffff:10.0.17.112]:1", as: 17<<8 | 112},
		{peer: "[fe80::2%eth1]:1", as: 4500 + 1500},
		{peer: "[2001:db8:5:2::ffff]:1", as: 4500 + 5},                    // the same /64 as caller 5's
		{peer: "[2001:db8:5:7::1]:1", as: 4500 + 5, fresh: [2]bool{true}}, // another /64, the same /48
	} {
		c := callers[alias.as]
		c.peer = alias.peer
		for j := range fs {
			res := ask(j, c)
			if alias.fresh[j] {
				if res.StatusCode != 200 {
					t.Fatalf("%s, IPV6_PREFIX %d: %d, want 200 (a caller of its own)", alias.peer, prefixes[j], res.StatusCode)
				}
				continue
			}
			check(45, j, alias.as, c, res)
		}
	}
}

// IPV6_PREFIX changed by a reload counts IPv6 callers by the new prefix at
// once, and changed back by the old one again (the counters of the old
// prefix's keys are still there).
func TestIPv6PrefixReloaded(t *testing.T) {
	opt, write := configFile(t, "chat_rpm = 1\nipv6_prefix = 64\n")
	f := newFixture(t, opt, remembering)
	ask := func(peer string, status int, denied string) {
		t.Helper()
		w := f.do("/api/chat", peer)
		var body struct {
			DeniedKey string `json:"denied_key"`
		}
		json.Unmarshal(w.Body.Bytes(), &body)
		if w.Code != status || body.DeniedKey != denied {
			t.Fatalf("%s: %d denied_key %q, want %d %q", peer, w.Code, body.DeniedKey, status, denied)
		}
	}
	ask("[2001:db8:1:2::1]:1", 200, "")
	ask("[2001:db8:1:2::9]:1", 429, "caller=ip:2001:db8:1:2::/64")
	ask("[2001:db8:1:3::1]:1", 200, "")
	write("chat_rpm = 1\nipv6_prefix = 48\n")
	if _, err := f.p.Reload("test"); err != nil {
		t.Fatal(err)
	}
	ask("[2001:db8:1:4::1]:1", 200, "") // the /48's first request
	ask("[2001:db8:1:2::1]:1", 429, "caller=ip:2001:db8:1::/48")
	ask("[2001:db8:2:2::1]:1", 200, "")
	write("chat_rpm = 1\nipv6_prefix = 64\n")
	if _, err := f.p.Reload("test"); err != nil {
		t.Fatal(err)
	}
	ask("[2001:db8:1:2::1]:1", 429, "caller=ip:2001:db8:1:2::/64")
	ask("[2001:db8:1:4::1]:1", 200, "")
}
