package proxy_test

import (
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/ratelimit-proxy/ratelimit-proxy/config"
	"github.com/ratelimit-proxy/ratelimit-proxy/limits"
	"github.com/ratelimit-proxy/ratelimit-proxy/proxy"
)

// rules loads TOML (rules and settings) over the fixture's configuration,
// as -config would.
func rules(t testing.TB, toml string, environ ...string) option {
	return func(c *config.Config, _ *proxy.Options) {
		p := filepath.Join(t.TempDir(), "rules.toml")
		if err := os.WriteFile(p, []byte(toml), 0o600); err != nil {
			t.Fatal(err)
		}
		env := map[string]string{"UPSTREAM_URL": c.UpstreamURL}
		for i := 0; i+1 < len(environ); i += 2 {
			env[environ[i]] = environ[i+1]
		}
		loaded, err := config.Load(p, func(k string) (string, bool) { v, ok := env[k]; return v, ok })
		if err != nil {
			t.Fatal(err)
		}
		if err := loaded.Validate(); err != nil {
			t.Fatal(err)
		}
		*c = loaded
	}
}

// send posts body to path with headers (name, value pairs).
func (f *fixture) send(path, peer, contentType, body string, hdr ...string) *httptest.ResponseRecorder {
	if contentType != "" {
		hdr = append([]string{"Content-Type", contentType}, hdr...)
	}
	return f.request(http.MethodPost, path, peer, body, hdr...)
}

// request sends one request; each header pair is added, so a name given
// twice sends two lines.
func (f *fixture) request(method, path, peer, body string, hdr ...string) *httptest.ResponseRecorder {
	r := httptest.NewRequest(method, path, strings.NewReader(body))
	r.RemoteAddr = peer
	for i := 0; i+1 < len(hdr); i += 2 {
		r.Header.Add(hdr[i], hdr[i+1])
	}
	w := httptest.NewRecorder()
	f.handler.ServeHTTP(w, r)
	return w
}

func body429(t *testing.T, w *httptest.ResponseRecorder) (b struct {
	Error      json.RawMessage `json:"error"`
	DeniedBy   string          `json:"denied_by"`
	DeniedKey  string          `json:"denied_key"`
	Limit      int64           `json:"limit"`
	Violated   []string        `json:"violated"`
	RetryAfter int64           `json:"retry_after_seconds"`
	Rule       string          `json:"rule"`
	KeyPart    string          `json:"key_part"`
}) {
	t.Helper()
	if err := json.Unmarshal(w.Body.Bytes(), &b); err != nil {
		t.Fatalf("body %q: %v", w.Body, err)
	}
	return b
}

const threeRules = `
[[rule]]
name   = "per-caller"
paths  = ["/api/chat"]
limit  = 5
window = "1m"

[[rule]]
name   = "per-team"
paths  = ["/api/chat"]
key    = ["header:X-Team"]
limit  = 3
window = "1m"

[[rule]]
name   = "global"
paths  = ["/api/chat"]
key    = ["global"]
limit  = 2
window = "10s"
`

// A request refused by its third rule leaves the other two untouched;
// the 429 names the first refusing rule and lists every one.
func TestRulesAllOrNothing(t *testing.T) {
	f := newFixture(t, rules(t, threeRules))
	for i := range 2 {
		if w := f.send("/api/chat", "203.0.113.7:1", "", `{}`, "X-Team", "a"); w.Code != 200 {
			t.Fatalf("request %d: %d %s", i, w.Code, w.Body)
		}
	}
	for i := range 5 { // refused by global only: per-caller and per-team must not move
		w := f.send("/api/chat", "203.0.113.7:1", "", `{}`, "X-Team", "a")
		b := body429(t, w)
		if w.Code != 429 || b.DeniedBy != "global" || b.DeniedKey != "global=global" || b.Limit != 2 || len(b.Violated) != 1 {
			t.Fatalf("refusal %d: %d %s", i, w.Code, w.Body)
		}
	}
	f.clock.Set(10)
	w := f.send("/api/chat", "203.0.113.7:1", "", `{}`, "X-Team", "a")
	if w.Code != 200 || w.Header().Get("RateLimit") != `"per-caller";r=2;t=50, "per-team";r=0;t=50, "global";r=1;t=10` {
		t.Fatalf("after the global window: %d %v", w.Code, w.Header())
	}
	// Fewest remaining: per-team (0) describes X-RateLimit-*.
	if w.Header().Get("X-RateLimit-Limit") != "3" || w.Header().Get("X-RateLimit-Remaining") != "0" {
		t.Errorf("X-RateLimit-* %v", w.Header())
	}
	if w.Header().Get("RateLimit-Policy") != `"per-caller";q=5;w=60, "per-team";q=3;w=60, "global";q=2;w=10` {
		t.Errorf("RateLimit-Policy %q", w.Header().Get("RateLimit-Policy"))
	}
	// Another team takes global's last place; then per-team and global both
	// refuse team a: per-team comes first in file order; the wait is the
	// longest of the two.
	if w := f.send("/api/chat", "198.51.100.1:1", "", `{}`, "X-Team", "b"); w.Code != 200 {
		t.Fatalf("team b: %d %s", w.Code, w.Body)
	}
	w = f.send("/api/chat", "203.0.113.7:1", "", `{}`, "X-Team", "a")
	b := body429(t, w)
	if w.Code != 429 || b.DeniedBy != "per-team" || strings.Join(b.Violated, ",") != "per-team,global" || b.RetryAfter != 50 ||
		w.Header().Get("Retry-After") != "50" || b.DeniedKey != "header:X-Team=a" {
		t.Fatalf("two refusing: %d %s", w.Code, w.Body)
	}
	// A request without X-Team skips per-team (on_missing_key = "skip").
	if w := f.send("/api/chat", "203.0.113.7:1", "", `{}`); w.Code != 429 || body429(t, w).DeniedBy != "global" {
		t.Fatalf("without X-Team: %d %s", w.Code, w.Body)
	}
	if n := f.upstream.Load(); n != 4 {
		t.Errorf("upstream got %d", n)
	}
}

// 100 concurrent requests against 3 rules admit exactly the smallest
// remaining, and the refused ones record nothing.
func TestRulesConcurrentAllOrNothing(t *testing.T) {
	f := newFixture(t, rules(t, `
[[rule]]
name  = "a"
paths = ["/api/chat"]
limit = 50
[[rule]]
name  = "b"
paths = ["/api/chat"]
key   = ["global"]
limit = 30
[[rule]]
name  = "c"
paths = ["/api/chat"]
key   = ["header:X-Team"]
limit = 10
`))
	var ok atomic.Int64
	var wg sync.WaitGroup
	for range 100 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if f.send("/api/chat", "203.0.113.7:1", "", `{}`, "X-Team", "t").Code == 200 {
				ok.Add(1)
			}
		}()
	}
	wg.Wait()
	if ok.Load() != 10 {
		t.Fatalf("admitted %d, want 10", ok.Load())
	}
	// b has 20 left and a 40: another team gets exactly 10 (its own limit).
	n := 0
	for range 30 {
		if f.send("/api/chat", "203.0.113.7:1", "", `{}`, "X-Team", "u").Code == 200 {
			n++
		}
	}
	if n != 10 {
		t.Fatalf("second team admitted %d, want 10", n)
	}
}

// A protected route no rule applies to passes with no rate-limit headers.
func TestNoApplyingRuleNoHeaders(t *testing.T) {
	f := newFixture(t, rules(t, threeRules))
	w := f.send("/v1/chat/completions", "203.0.113.7:1", "application/json", `{"messages":[{"role":"user","content":"hi"}]}`)
	if w.Code != 200 || w.Header().Get("RateLimit-Policy") != "" || w.Header().Get("X-RateLimit-Limit") != "999" {
		t.Fatalf("%d %v", w.Code, w.Header())
	}
}

// Body key parts: JSON by dotted path (folded member names), XML by local
// name (namespaces ignored), form fields, the model; a missing one skips
// or rejects.
func TestBodyKeyParts(t *testing.T) {
	f := newFixture(t, rules(t, `
[[rule]]
name  = "per-user"
paths = ["/v1/chat/completions"]
key   = ["json:metadata.user"]
limit = 1
on_missing_key = "reject"

[[rule]]
name  = "per-model"
paths = ["/v1/chat/completions", "/api/chat"]
key   = ["model"]
limit = 2

[[rule]]
name  = "sifen"
paths = ["/sifen/*"]
key   = ["xml:dRucEm", "header:X-Sifen-Env"]
limit = 1
window = "10s"

[[rule]]
name  = "per-form-user"
paths = ["/upload"]
key   = ["form:user"]
limit = 1
`))
	chat := func(user string) string {
		return `{"model":"gpt-4o","metadata":{"user":"` + user + `"},"messages":[{"role":"user","content":"hi"}]}`
	}
	if w := f.send("/v1/chat/completions", "203.0.113.7:1", "application/json", chat("ana")); w.Code != 200 {
		t.Fatalf("first: %d %s", w.Code, w.Body)
	}
	// The same user in another spelling of the member names.
	w := f.send("/v1/chat/completions", "203.0.113.7:1", "application/json",
		`{"model":"gpt-4o","Metadata":{"USER":"ana"},"messages":[{"role":"user","content":"hi"}]}`)
	if b := body429(t, w); w.Code != 429 || b.DeniedBy != "per-user" || b.DeniedKey != "json:metadata.user=ana" {
		t.Fatalf("folded spelling: %d %s", w.Code, w.Body)
	}
	// Two copies of a member the key reads: 400, nothing counted.
	w = f.send("/v1/chat/completions", "203.0.113.7:1", "application/json",
		`{"model":"gpt-4o","metadata":{"user":"bob","uſer":"ana"},"messages":[]}`)
	if w.Code != 400 || !strings.Contains(w.Body.String(), "duplicate member") {
		t.Fatalf("duplicate: %d %s", w.Code, w.Body)
	}
	// Missing with on_missing_key = "reject".
	w = f.send("/v1/chat/completions", "203.0.113.7:1", "application/json", `{"model":"gpt-4o","messages":[]}`)
	if b := body429(t, w); w.Code != 400 || b.Rule != "per-user" || b.KeyPart != "json:metadata.user" ||
		!strings.Contains(w.Body.String(), `"code":"missing_key"`) {
		t.Fatalf("missing: %d %s", w.Code, w.Body)
	}
	// per-model: gpt-4o has been admitted once; a third admission refuses.
	if w := f.send("/v1/chat/completions", "203.0.113.7:1", "application/json", chat("carl")); w.Code != 200 {
		t.Fatalf("carl: %d %s", w.Code, w.Body)
	}
	if w := f.send("/v1/chat/completions", "203.0.113.7:1", "application/json", chat("dora")); w.Code != 429 || body429(t, w).DeniedBy != "per-model" {
		t.Fatalf("per-model: %d %s", w.Code, w.Body)
	}

	// XML: the issuer inside a namespaced element; an unprotected route.
	invoice := func(ruc string) string {
		return `<?xml version="1.0" encoding="UTF-8"?><rDE xmlns="http://ekuatia.set.gov.py/sifen/xsd"><DE><gDatGralOpe><gEmis>` +
			`<ns2:dRucEm xmlns:ns2="urn:x">` + ruc + `</ns2:dRucEm></gEmis></gDatGralOpe></DE></rDE>`
	}
	if w := f.send("/sifen/recibe-lote", "203.0.113.7:1", "application/xml", invoice("80012345"), "X-Sifen-Env", "test"); w.Code != 200 {
		t.Fatalf("sifen first: %d %s", w.Code, w.Body)
	}
	w = f.send("/SIFEN//recibe-lote", "198.51.100.1:1", "text/xml", invoice("80012345"), "X-Sifen-Env", "test")
	if b := body429(t, w); w.Code != 429 || b.DeniedKey != "xml:dRucEm=80012345&header:X-Sifen-Env=test" || b.RetryAfter != 10 {
		t.Fatalf("sifen second: %d %s", w.Code, w.Body)
	}
	if w := f.send("/sifen/recibe-lote", "203.0.113.7:1", "application/xml", invoice("80012345"), "X-Sifen-Env", "prod"); w.Code != 200 {
		t.Fatalf("sifen other environment: %d %s", w.Code, w.Body)
	}
	if w := f.send("/sifen/recibe-lote", "203.0.113.7:1", "application/xml", `<rDE/>`, "X-Sifen-Env", "test"); w.Code != 200 || w.Header().Get("RateLimit-Policy") != "" {
		t.Fatalf("sifen without issuer (skip): %d %v", w.Code, w.Header())
	}

	// Form fields, multipart and URL-encoded alike.
	if w := f.send("/upload", "203.0.113.7:1", "application/x-www-form-urlencoded", "user=eve&x=1"); w.Code != 200 {
		t.Fatalf("form first: %d %s", w.Code, w.Body)
	}
	mp := "--b\r\nContent-Disposition: form-data; name=\"user\"\r\n\r\neve\r\n--b--\r\n"
	if w := f.send("/upload", "203.0.113.7:1", "multipart/form-data; boundary=b", mp); w.Code != 429 {
		t.Fatalf("multipart same user: %d %s", w.Code, w.Body)
	}
}

// A caller already over a rule that needs no body is refused before its
// body is read.
func TestRefusedBeforeBodyIsRead(t *testing.T) {
	f := newFixture(t, rules(t, `
[[rule]]
name  = "per-caller"
paths = ["/api/chat"]
limit = 1
[[rule]]
name  = "per-user"
paths = ["/api/chat"]
key   = ["json:user"]
limit = 10
`))
	if w := f.send("/api/chat", "203.0.113.7:1", "application/json", `{"user":"a","message":"hi"}`); w.Code != 200 {
		t.Fatalf("first: %d %s", w.Code, w.Body)
	}
	var read atomic.Bool
	r := httptest.NewRequest(http.MethodPost, "/api/chat", readSpy{&read})
	r.RemoteAddr = "203.0.113.7:1"
	w := httptest.NewRecorder()
	f.handler.ServeHTTP(w, r)
	if w.Code != 429 || read.Load() || body429(t, w).DeniedBy != "per-caller" {
		t.Fatalf("second: %d read=%v %s", w.Code, read.Load(), w.Body)
	}
	// Refused before the body: still a refusal of the rule in its metrics.
	if got := metric(t, f, "ratelimit_proxy_rule_decisions_total", map[string]string{"rule": "per-caller", "result": "rate_limited"}); got != 1 {
		t.Fatalf("refusal before the body counted %v times", got)
	}
	// per-user was not charged by the refused request: 9 more for user a
	// from other callers.
	for i := range 9 {
		if w := f.send("/api/chat", "198.51.100."+string(rune('1'+i))+":1", "application/json", `{"user":"a"}`); w.Code != 200 {
			t.Fatalf("user a, caller %d: %d %s", i, w.Code, w.Body)
		}
	}
	if w := f.send("/api/chat", "192.0.2.1:1", "application/json", `{"user":"a"}`); w.Code != 429 || body429(t, w).DeniedBy != "per-user" {
		t.Fatalf("user a over: %d %s", w.Code, w.Body)
	}
}

type readSpy struct{ read *atomic.Bool }

func (s readSpy) Read(p []byte) (int, error) {
	s.read.Store(true)
	return 0, io.EOF
}

// A token bucket through the proxy: burst, refill, the policy's burst.
func TestTokenBucketRule(t *testing.T) {
	f := newFixture(t, rules(t, `
tier_from = "header:X-Plan"
[[rule]]
name      = "chat-per-user"
paths     = ["/api/chat"]
algorithm = "token_bucket"
limit     = 20
window    = "1m"
burst     = 5
tiers     = { free = 10, pro = 60, expert = "unlimited" }
overrides = { "caller=ip:192.0.2.9" = 1 }
`))
	for i := range 5 {
		w := f.send("/api/chat", "203.0.113.7:1", "", `{}`)
		if w.Code != 200 || w.Header().Get("X-RateLimit-Remaining") != string(rune('4'-i)) ||
			w.Header().Get("RateLimit-Policy") != `"chat-per-user";q=20;w=60;burst=5` || w.Header().Get("X-RateLimit-Limit") != "20" {
			t.Fatalf("burst %d: %d %v", i, w.Code, w.Header())
		}
	}
	w := f.send("/api/chat", "203.0.113.7:1", "", `{}`)
	if w.Code != 429 || w.Header().Get("Retry-After") != "3" || w.Header().Get("Retry-After-Ms") != "3000" {
		t.Fatalf("empty bucket: %d %v", w.Code, w.Header())
	}
	f.clock.Set(3)
	if w := f.send("/api/chat", "203.0.113.7:1", "", `{}`); w.Code != 200 || w.Header().Get("X-RateLimit-Remaining") != "0" {
		t.Fatalf("after one refill: %d %v", w.Code, w.Header())
	}
	// Plans: pro refills at 60 a minute (burst stays 5); expert is not limited.
	for i := range 5 {
		if w := f.send("/api/chat", "198.51.100.1:1", "", `{}`, "X-Plan", "pro"); w.Code != 200 || w.Header().Get("X-RateLimit-Limit") != "60" {
			t.Fatalf("pro %d: %d %v", i, w.Code, w.Header())
		}
	}
	if w := f.send("/api/chat", "198.51.100.1:1", "", `{}`, "X-Plan", "pro"); w.Code != 429 || w.Header().Get("Retry-After") != "1" {
		t.Fatalf("pro over: %d %v", w.Code, w.Header())
	}
	for range 20 {
		if w := f.send("/api/chat", "198.51.100.2:1", "", `{}`, "X-Plan", "expert"); w.Code != 200 || w.Header().Get("RateLimit-Policy") != "" {
			t.Fatalf("expert: %d %v", w.Code, w.Header())
		}
	}
	// An override wins over everything: one token, a burst of 5 kept.
	if w := f.send("/api/chat", "192.0.2.9:1", "", `{}`, "X-Plan", "pro"); w.Code != 200 || w.Header().Get("X-RateLimit-Limit") != "1" {
		t.Fatalf("override: %d %v", w.Code, w.Header())
	}
}

// A shadow rule never refuses and adds no headers; it counts and logs what
// it would have refused.
func TestShadowRule(t *testing.T) {
	f := newFixture(t, rules(t, `
chat_rpm = 100
[[rule]]
name   = "daily-per-key"
key    = ["api_key"]
limit  = 2
window = "24h"
action = "shadow"
`))
	for i := range 5 {
		w := f.send("/api/chat", "203.0.113.7:1", "", `{}`, "Authorization", "Bearer k1")
		if w.Code != 200 || w.Header().Get("RateLimit-Policy") != `"chat_rpm";q=100;w=60` {
			t.Fatalf("request %d: %d %v", i, w.Code, w.Header())
		}
	}
	if got := metric(t, f, "ratelimit_proxy_shadow_denials_total", map[string]string{"rule": "daily-per-key"}); got != 3 {
		t.Fatalf("shadow denials %v, want 3", got)
	}
	if got := metric(t, f, "ratelimit_proxy_rule_decisions_total", map[string]string{"rule": "chat_rpm", "result": "allowed"}); got != 5 {
		t.Fatalf("chat_rpm allowed %v, want 5", got)
	}
}

// metric is the value of the family's sample whose labels include want.
func metric(t *testing.T, f *fixture, name string, want map[string]string) float64 {
	t.Helper()
	mfs, err := f.reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
	samples:
		for _, m := range mf.GetMetric() {
			got := map[string]string{}
			for _, l := range m.GetLabel() {
				got[l.GetName()] = l.GetValue()
			}
			for k, v := range want {
				if got[k] != v {
					continue samples
				}
			}
			switch {
			case m.GetCounter() != nil:
				return m.GetCounter().GetValue()
			case m.GetGauge() != nil:
				return m.GetGauge().GetValue()
			case m.GetHistogram() != nil:
				return float64(m.GetHistogram().GetSampleCount())
			}
		}
	}
	t.Fatalf("no sample of %s with %v", name, want)
	return 0
}

// A refusal answered from memory (SPEC §4.2) is the original 429: every
// refusing rule, the longest wait, the other rules as the store left them,
// times counted down.
func TestRememberedRefusalKeepsEveryRule(t *testing.T) {
	f := newFixture(t, rules(t, `
[[rule]]
name   = "short"
limit  = 1
window = "10s"
[[rule]]
name   = "long"
limit  = 1
window = "1h"
[[rule]]
name      = "tb"
algorithm = "token_bucket"
limit     = 10
burst     = 3
`), func(_ *config.Config, o *proxy.Options) { o.Store = limits.NewRemember(o.Store, 100) })
	f.send("/api/chat", "203.0.113.7:1", "", `{}`)
	f.clock.Set(1)
	first := f.send("/api/chat", "203.0.113.7:1", "", `{}`)
	f.clock.Set(2)
	again := f.send("/api/chat", "203.0.113.7:1", "", `{}`)
	for _, w := range []*httptest.ResponseRecorder{first, again} {
		if b := body429(t, w); w.Code != 429 || b.DeniedBy != "short" || strings.Join(b.Violated, ",") != "short,long" {
			t.Fatalf("%d %s", w.Code, w.Body)
		}
	}
	if first.Header().Get("Retry-After") != "3599" || again.Header().Get("Retry-After") != "3598" {
		t.Fatalf("Retry-After %q then %q", first.Header().Get("Retry-After"), again.Header().Get("Retry-After"))
	}
	if got := again.Header().Get("RateLimit"); got != `"short";r=0;t=8, "long";r=0;t=3598, "tb";r=2;t=4` {
		t.Fatalf("remembered RateLimit %q (first %q)", got, first.Header().Get("RateLimit"))
	}
}

// A rule on other methods of a protected path applies to them (GET is
// not guarded otherwise); a method override counts as the method.
func TestRuleOnOtherMethods(t *testing.T) {
	f := newFixture(t, rules(t, `
[[rule]]
name    = "reads"
paths   = ["/v1/chat/completions"]
methods = ["GET"]
limit   = 1
`))
	get := func() int { return f.request(http.MethodGet, "/v1/chat/completions", "203.0.113.7:1", "").Code }
	if get() != 200 || get() != 429 {
		t.Fatal("GET rule")
	}
	w := f.request(http.MethodHead, "/v1/chat/completions", "203.0.113.7:1", "")
	if w.Code != 429 {
		t.Fatalf("HEAD, which routers serve as GET: %d", w.Code)
	}
	// A POST naming GET in an override is counted by the GET rule too.
	if w := f.send("/v1/chat/completions", "203.0.113.7:1", "application/json", `{"messages":[]}`, "X-HTTP-Method-Override", "GET"); w.Code != 429 {
		t.Fatalf("override: %d", w.Code)
	}
}
