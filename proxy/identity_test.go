package proxy

import (
	"crypto/sha256"
	"encoding/hex"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"testing"

	"github.com/ratelimit-proxy/ratelimit-proxy/config"
)

func resolver(t testing.TB, trusted ...string) *clientIPs {
	c := &clientIPs{ipv6Prefix: 64}
	for _, s := range trusted {
		p, err := config.ParsePrefix(s)
		if err != nil {
			t.Fatal(err)
		}
		c.trusted = append(c.trusted, p)
	}
	return c
}

func TestClientIP(t *testing.T) {
	tests := []struct {
		name    string
		trusted []string
		peer    string
		xff     []string
		fwd     []string
		want    string
	}{
		{"no trust: peer, xff ignored", nil, "198.51.100.1:5000", []string{"1.2.3.4"}, nil, "198.51.100.1"},
		{"untrusted peer: xff ignored", []string{"10.0.0.0/8"}, "198.51.100.1:5000", []string{"1.2.3.4"}, nil, "198.51.100.1"},
		{"trusted peer: last hop", []string{"10.0.0.0/8"}, "10.0.0.2:5000", []string{"203.0.113.9"}, nil, "203.0.113.9"},
		{"walk past trusted hops", []string{"10.0.0.0/8"}, "10.0.0.2:5000", []string{"6.6.6.6, 203.0.113.9, 10.1.1.1"}, nil, "203.0.113.9"},
		{"several header lines", []string{"10.0.0.0/8"}, "10.0.0.2:5000", []string{"6.6.6.6", "203.0.113.9, 10.1.1.1"}, nil, "203.0.113.9"},
		{"spoofed left part ignored", []string{"10.0.0.0/8"}, "10.0.0.2:5000", []string{"10.9.9.9, 203.0.113.9"}, nil, "203.0.113.9"},
		{"all trusted: leftmost", []string{"10.0.0.0/8"}, "10.0.0.2:5000", []string{"10.0.0.7, 10.0.0.8"}, nil, "10.0.0.7"},
		{"garbage stops at last trusted", []string{"10.0.0.0/8"}, "10.0.0.2:5000", []string{"1.1.1.1, junk, 10.0.0.9"}, nil, "10.0.0.9"},
		{"garbage right after peer", []string{"10.0.0.0/8"}, "10.0.0.2:5000", []string{"junk"}, nil, "10.0.0.2"},
		{"ip:port hop", []string{"10.0.0.0/8"}, "10.0.0.2:5000", []string{"203.0.113.9:4711"}, nil, "203.0.113.9"},
		{"mapped v4", []string{"10.0.0.0/8"}, "[::ffff:10.0.0.2]:5000", []string{"::ffff:203.0.113.9"}, nil, "203.0.113.9"},
		{"forwarded header", []string{"10.0.0.0/8"}, "10.0.0.2:5000", nil, []string{`for=192.0.2.60;proto=http, for="[2001:db8:cafe::17]:4711"`}, "2001:db8:cafe::17"},
		{"forwarded with port", []string{"10.0.0.0/8"}, "10.0.0.2:5000", nil, []string{`for="192.0.2.60:443"`}, "192.0.2.60"},
		{"xff wins over forwarded", []string{"10.0.0.0/8"}, "10.0.0.2:5000", []string{"203.0.113.9"}, []string{"for=192.0.2.60"}, "203.0.113.9"},
		{"empty hops skipped", []string{"10.0.0.0/8"}, "10.0.0.2:5000", []string{"203.0.113.9, , "}, nil, "203.0.113.9"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := httptest.NewRequest(http.MethodPost, "/api/chat", nil)
			r.RemoteAddr = tt.peer
			for _, v := range tt.xff {
				r.Header.Add("X-Forwarded-For", v)
			}
			for _, v := range tt.fwd {
				r.Header.Add("Forwarded", v)
			}
			got := resolver(t, tt.trusted...).clientIP(r)
			if got != netip.MustParseAddr(tt.want) {
				t.Fatalf("got %v, want %s", got, tt.want)
			}
		})
	}
}

func TestIdentify(t *testing.T) {
	c := resolver(t)
	tests := []struct {
		name    string
		peer    string
		headers map[string]string
		value   string
		logged  string
		cred    bool
	}{
		{"ipv4", "203.0.113.7:1", nil, "ip:203.0.113.7", "ip:203.0.113.0/24", false},
		{"ipv6 grouped by /64", "[2001:db8:1:2:3:4:5:6]:1", nil, "ip:2001:db8:1:2::/64", "ip:2001:db8:1::/48", false},
		{"bearer", "203.0.113.7:1", map[string]string{"Authorization": "Bearer sk-test"}, "key:" + sha16("sk-test"), "key:" + sha16("sk-test"), true},
		{"bearer any case", "203.0.113.7:1", map[string]string{"Authorization": "bearer sk-test"}, "key:" + sha16("sk-test"), "key:" + sha16("sk-test"), true},
		{"x-api-key", "203.0.113.7:1", map[string]string{"X-API-Key": "sk-other"}, "key:" + sha16("sk-other"), "key:" + sha16("sk-other"), true},
		{"bearer wins", "203.0.113.7:1", map[string]string{"Authorization": "Bearer a", "X-API-Key": "b"}, "key:" + sha16("a"), "key:" + sha16("a"), true},
		{"empty bearer is no credential", "203.0.113.7:1", map[string]string{"Authorization": "Bearer   "}, "ip:203.0.113.7", "ip:203.0.113.0/24", false},
		{"basic auth is no API key", "203.0.113.7:1", map[string]string{"Authorization": "Basic dXNlcjpwYXNz"}, "ip:203.0.113.7", "ip:203.0.113.0/24", false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := httptest.NewRequest(http.MethodPost, "/api/chat", nil)
			r.RemoteAddr = tt.peer
			for k, v := range tt.headers {
				r.Header.Set(k, v)
			}
			got := c.identify(r, false)
			if got.value != tt.value || got.logged() != tt.logged || got.hasCred != tt.cred {
				t.Fatalf("got %+v", got)
			}
		})
	}
}

func FuzzClientIP(f *testing.F) {
	f.Add("10.0.0.2:5000", "1.1.1.1, 10.0.0.9", `for="[2001:db8::1]:80"`)
	f.Add("[::1]:1", ",,,", "for=;for=\"[")
	f.Add("junk", "::ffff:1.2.3.4:80", "")
	c := resolver(f, "10.0.0.0/8", "::1/128")
	f.Fuzz(func(t *testing.T, peer, xff, fwd string) {
		r := httptest.NewRequest(http.MethodPost, "/api/chat", nil)
		r.RemoteAddr = peer
		r.Header["X-Forwarded-For"] = []string{xff}
		r.Header["Forwarded"] = []string{fwd}
		got := c.clientIP(r)
		// Whatever the headers say, an untrusted peer is its own client.
		if p := peerAddr(r); p.IsValid() && !c.isTrusted(p) && got != p {
			t.Fatalf("untrusted peer %v resolved to %v", p, got)
		}
		c.identify(r, false)
		c.identify(r, true)
	})
}

func BenchmarkClientIP(b *testing.B) {
	c := resolver(b, "10.0.0.0/8", "172.16.0.0/12")
	for _, n := range []int{1, 4, 16} {
		xff := "203.0.113.9"
		for i := 1; i < n; i++ {
			xff += ", 10.0.0.1"
		}
		r := httptest.NewRequest(http.MethodPost, "/api/chat", nil)
		r.RemoteAddr = "10.0.0.2:5000"
		r.Header.Set("X-Forwarded-For", xff)
		b.Run("hops="+string(rune('0'+n/10))+string(rune('0'+n%10)), func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				c.clientIP(r)
			}
		})
	}
}

func sha16(s string) string {
	sum := sha256.Sum256([]byte(s))
	return hex.EncodeToString(sum[:8])
}

// The key comes from the header the path's API reads first; an empty one
// is skipped.
func TestAPIKeyOrder(t *testing.T) {
	tests := []struct {
		anthropic bool
		headers   map[string]string
		want      string
	}{
		{false, map[string]string{"Authorization": "Bearer real", "X-API-Key": "fake"}, "real"},
		{false, map[string]string{"Authorization": "Bearer real", "Api-Key": "fake"}, "real"},
		{false, map[string]string{"X-API-Key": "real", "Api-Key": "fake"}, "real"},
		{false, map[string]string{"Api-Key": " azure "}, "azure"},
		{false, map[string]string{"Authorization": "Bearer  ", "X-API-Key": "", "Api-Key": "azure"}, "azure"},
		{false, map[string]string{"Authorization": "Basic dXNlcjpwYXNz"}, ""},
		{true, map[string]string{"Authorization": "Bearer fake", "X-API-Key": "real"}, "real"},
		{true, map[string]string{"Authorization": "Bearer real", "X-API-Key": "  "}, "real"},
		{true, map[string]string{"Authorization": "Bearer real"}, "real"},
		{true, map[string]string{"Api-Key": "azure"}, ""},
	}
	for _, tt := range tests {
		r := httptest.NewRequest(http.MethodPost, "/v1/messages", nil)
		for k, v := range tt.headers {
			r.Header.Set(k, v)
		}
		if got := apiKey(r, tt.anthropic); got != tt.want {
			t.Errorf("anthropic=%v %v: %q, want %q", tt.anthropic, tt.headers, got, tt.want)
		}
	}
}

// Spellings of one API key that an upstream reads as that key are one
// caller: the scheme in any case, spaces or tabs after it, whitespace
// around the value, a Bearer prefix in X-API-Key or api-key.
func TestAPIKeySpellings(t *testing.T) {
	c := resolver(t)
	want := "key:" + sha16("sk-test-123")
	spellings := []struct {
		header, value string
	}{
		{"Authorization", "Bearer sk-test-123"},
		{"Authorization", "bearer sk-test-123"},
		{"Authorization", "BEARER   sk-test-123"},
		{"Authorization", "Bearer\tsk-test-123"},
		{"Authorization", "Bearer \t sk-test-123 \t"},
		{"Authorization", " \tBearer sk-test-123"},
		{"X-Api-Key", " sk-test-123\t"},
		{"X-Api-Key", "Bearer sk-test-123"},
		{"X-Api-Key", "bearer\tsk-test-123"},
		{"Api-Key", "Bearer  sk-test-123 "},
	}
	for _, anthropic := range []bool{false, true} {
		for _, s := range spellings {
			if anthropic && s.header == "Api-Key" {
				continue // Anthropic's API has no api-key header
			}
			r := httptest.NewRequest(http.MethodPost, "/v1/messages", nil)
			r.RemoteAddr = "203.0.113.7:1"
			r.Header[s.header] = []string{s.value}
			if got := c.identify(r, anthropic); got.value != want || !got.hasCred {
				t.Errorf("anthropic=%v %s: %q: %+v, want %s", anthropic, s.header, s.value, got, want)
			}
		}
	}
	// A scheme with nothing after it is no key; neither is Basic.
	for _, v := range []string{"Bearer", "Bearer \t ", "Basic dXNlcjpwYXNz"} {
		r := httptest.NewRequest(http.MethodPost, "/v1/chat/completions", nil)
		r.RemoteAddr = "203.0.113.7:1"
		r.Header.Set("Authorization", v)
		if got := c.identify(r, false); got.hasCred {
			t.Errorf("%q is a credential: %+v", v, got)
		}
	}
}
