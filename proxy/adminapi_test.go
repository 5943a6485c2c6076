package proxy_test

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
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

// configFile is a fixture whose configuration is a file a reload reads
// again; it returns the option and a function that rewrites the file.
func configFile(t testing.TB, toml string, environ ...string) (option, func(string)) {
	path := filepath.Join(t.TempDir(), "config.toml")
	write := func(s string) {
		if err := os.WriteFile(path, []byte(s), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	write(toml)
	return func(c *config.Config, o *proxy.Options) {
		env := map[string]string{"UPSTREAM_URL": c.UpstreamURL}
		for i := 0; i+1 < len(environ); i += 2 {
			env[environ[i]] = environ[i+1]
		}
		getenv := func(k string) (string, bool) { v, ok := env[k]; return v, ok }
		loaded, err := config.Load(path, getenv)
		if err == nil {
			err = loaded.Validate()
		}
		if err != nil {
			t.Fatal(err)
		}
		*c = loaded
		o.ConfigPath, o.Getenv = path, getenv
	}, write
}

// remembering puts a memory of refusals in front of the store, wired to
// the proxy's Forget as main does.
func remembering(c *config.Config, o *proxy.Options) {
	r := limits.NewRemember(o.Store, 1000).(*limits.Remember)
	o.Store, o.Refusals, o.Forget = r, r.Stats, r.Forget
}

// admin sends an admin request with the bearer token tok ("" none).
func (f *fixture) adminDo(t *testing.T, method, target, tok, body string) (int, map[string]any) {
	t.Helper()
	r := httptest.NewRequest(method, target, strings.NewReader(body))
	if tok != "" {
		r.Header.Set("Authorization", "Bearer "+tok)
	}
	w := httptest.NewRecorder()
	f.admin.ServeHTTP(w, r)
	var m map[string]any
	if w.Body.Len() > 0 {
		if ct := w.Header().Get("Content-Type"); ct != "application/json" {
			t.Fatalf("%s %s: Content-Type %q", method, target, ct)
		}
		if err := json.Unmarshal(w.Body.Bytes(), &m); err != nil {
			t.Fatalf("%s %s: %v: %s", method, target, err, w.Body)
		}
	}
	return w.Code, m
}

func TestAdminToken(t *testing.T) {
	opt, _ := configFile(t, `admin_token = "s3cret"`+"\n")
	f := newFixture(t, opt)
	for _, tc := range []struct {
		method, path, tok string
		want              int
	}{
		{"GET", "/admin/rules", "", 401},
		{"GET", "/admin/rules", "wrong", 401},
		{"GET", "/admin/rules", "s3cret", 200},
		{"GET", "/admin/nothing", "", 401}, // an unknown admin path tells nothing either
		{"GET", "/admin/nothing", "s3cret", 404},
		{"POST", "/admin/reload", "", 401},
		{"DELETE", "/admin/limits/chat_rpm?key=caller=ip:1.2.3.4", "", 401},
		{"GET", "/debug/pprof/", "", 401},
		{"GET", "/debug/pprof/", "s3cret", 200},
		{"GET", "/metrics", "", 200}, // the scraper needs no token
		{"GET", "/healthz", "", 200},
		{"GET", "/readyz", "", 200},
	} {
		r := httptest.NewRequest(tc.method, tc.path, nil)
		if tc.tok != "" {
			r.Header.Set("Authorization", "Bearer "+tc.tok)
		}
		w := httptest.NewRecorder()
		f.admin.ServeHTTP(w, r)
		if w.Code != tc.want {
			t.Errorf("%s %s token %q: %d, want %d", tc.method, tc.path, tc.tok, w.Code, tc.want)
		}
		if w.Code == 401 && w.Header().Get("WWW-Authenticate") == "" {
			t.Errorf("%s %s: 401 without WWW-Authenticate", tc.method, tc.path)
		}
	}
	code, m := f.adminDo(t, "GET", "/admin/config", "s3cret", "")
	if code != 200 || m["admin_token"] != config.Redacted || strings.Contains(mustString(m), "s3cret") {
		t.Fatalf("config shows the token: %d %v", code, m["admin_token"])
	}
}

func mustString(v any) string {
	b, _ := json.Marshal(v)
	return string(b)
}

func TestAdminLimitsReadResetOverride(t *testing.T) {
	opt, _ := configFile(t, `
[[rule]]
name   = "per-key"
key    = ["api_key"]
limit  = 3
window = "1m"
[[rule]]
name   = "bucket"
key    = ["caller"]
algorithm = "token_bucket"
limit  = 10
burst  = 4
window = "10s"
`)
	f := newFixture(t, opt, remembering)
	key := "Authorization"
	send := func() int { return f.do("/api/chat", "203.0.113.7:1", key, "Bearer sk-test").Code }
	for range 3 {
		if c := send(); c != 200 {
			t.Fatalf("admission %d", c)
		}
	}
	if c := send(); c != 429 {
		t.Fatalf("4th: %d", c)
	}
	pub := "api_key=" + keyHash("sk-test")
	code, m := f.adminDo(t, "GET", "/admin/limits/per-key?key="+pub, "", "")
	if code != 200 {
		t.Fatalf("GET limits: %d %v", code, m)
	}
	want := map[string]any{"rule": "per-key", "key": pub, "limit": 3.0, "used": 3.0, "remaining": 0.0, "window_seconds": 60.0}
	for k, v := range want {
		if m[k] != v {
			t.Errorf("%s = %v, want %v (%v)", k, m[k], v, m)
		}
	}
	if ra := m["reset_after_seconds"].(float64); ra <= 0 || ra > 60 {
		t.Errorf("reset_after_seconds %v", ra)
	}
	// The bucket: 4 of a burst of 4 taken (the 429 took none).
	_, b := f.adminDo(t, "GET", "/admin/limits/bucket?key=caller%3Dkey:"+keyHash("sk-test"), "", "")
	if b["used"] != 3.0 || b["remaining"] != 1.0 || b["burst"] != 4.0 || b["limit"] != 10.0 {
		t.Errorf("bucket: %v", b)
	}
	// Errors: unknown rule 404; a key of another shape 400; a tier without a key 400.
	if code, m := f.adminDo(t, "GET", "/admin/limits/nope?key=x", "", ""); code != 404 || m["error"] != "unknown_rule" {
		t.Errorf("unknown rule: %d %v", code, m)
	}
	if code, _ := f.adminDo(t, "GET", "/admin/limits/per-key?key=ip=1.2.3.4", "", ""); code != 400 {
		t.Errorf("wrong key shape: %d", code)
	}
	// No question at all is the top 20.
	if code, m := f.adminDo(t, "GET", "/admin/limits/per-key", "", ""); code != 200 || m["keys"] == nil {
		t.Errorf("no key: %d %v", code, m)
	}
	if code, _ := f.adminDo(t, "GET", "/admin/limits/per-key?tier=pro", "", ""); code != 400 {
		t.Errorf("a tier and no key: %d", code)
	}
	// DELETE forgets the counters and the remembered refusal at once.
	if code, _ := f.adminDo(t, "DELETE", "/admin/limits/per-key?key="+pub, "", ""); code != 204 {
		t.Fatalf("DELETE: %d", code)
	}
	if c := send(); c != 200 {
		t.Fatalf("after reset: %d", c)
	}
	// A live override of one key: 0 refuses it, "unlimited" frees it, null
	// drops it.
	code, m = f.adminDo(t, "PUT", "/admin/limits/per-key?key="+pub, "", `{"limit":0}`)
	if code != 200 || m["limit"] != 0.0 || m["override"] != 0.0 {
		t.Fatalf("PUT override: %d %v", code, m)
	}
	if c := send(); c != 429 {
		t.Fatalf("override 0: %d", c)
	}
	code, m = f.adminDo(t, "PUT", "/admin/limits/per-key?key="+pub, "", `{"limit":"unlimited"}`)
	if code != 200 || m["limit"] != "unlimited" {
		t.Fatalf("PUT unlimited: %d %v", code, m)
	}
	for range 5 {
		if c := send(); c != 200 && c != 429 {
			t.Fatalf("unlimited: %d", c)
		}
	}
	code, m = f.adminDo(t, "PUT", "/admin/limits/per-key?key="+pub, "", `{"limit":null}`)
	if code != 200 || m["limit"] != 3.0 {
		t.Fatalf("PUT null: %d %v", code, m)
	}
	for _, bad := range []string{`{"limit":-1}`, `{"limit":1.5}`, `{"limit":"lots"}`, `{"limt":1}`, `[1]`, `{}`} {
		if code, _ := f.adminDo(t, "PUT", "/admin/limits/per-key?key="+pub, "", bad); code != 400 {
			t.Errorf("PUT %s: %d, want 400", bad, code)
		}
	}
	_, cfg := f.adminDo(t, "GET", "/admin/config", "", "")
	if live := cfg["live_changes"].([]any); len(live) != 0 {
		t.Errorf("live changes after the override was dropped: %v", live)
	}
}

func TestAdminRuleChangeKeepsCounters(t *testing.T) {
	opt, _ := configFile(t, `
[[rule]]
name   = "per-ip"
key    = ["ip"]
limit  = 2
window = "1m"
`)
	f := newFixture(t, opt, remembering)
	send := func() int { return f.do("/api/chat", "203.0.113.7:1").Code }
	send()
	send()
	if c := send(); c != 429 {
		t.Fatalf("3rd: %d", c)
	}
	code, m := f.adminDo(t, "PUT", "/admin/rules/per-ip", "", `{"limit":3}`)
	if code != 200 || m["limit"] != 3.0 || mustString(m["live"]) != `["limit"]` {
		t.Fatalf("PUT rule: %d %v", code, m)
	}
	// The counters were kept (2 used) and the remembered refusal forgotten:
	// exactly one more.
	if c := send(); c != 200 {
		t.Fatalf("after raising the limit: %d", c)
	}
	if c := send(); c != 429 {
		t.Fatalf("past the new limit: %d", c)
	}
	code, m = f.adminDo(t, "PUT", "/admin/rules/per-ip", "", `{"action":"shadow"}`)
	if code != 200 || m["action"] != "shadow" || m["limit"] != 3.0 {
		t.Fatalf("PUT action: %d %v", code, m)
	}
	if c := send(); c != 200 {
		t.Fatalf("shadow refuses: %d", c)
	}
	for _, bad := range []string{`{"burst":5}`, `{"action":"delay"}`, `{"action":"drop"}`, `{"limit":-2}`} {
		if code, _ := f.adminDo(t, "PUT", "/admin/rules/per-ip", "", bad); code != 400 {
			t.Errorf("PUT %s: %d, want 400", bad, code)
		}
	}
	if code, _ := f.adminDo(t, "PUT", "/admin/rules/nope", "", `{"limit":1}`); code != 404 {
		t.Errorf("unknown rule: %d", code)
	}
	_, rules := f.adminDo(t, "GET", "/admin/rules", "", "")
	list := rules["rules"].([]any)
	if len(list) != 1 || list[0].(map[string]any)["action"] != "shadow" {
		t.Fatalf("rules: %v", rules)
	}
	_, cfg := f.adminDo(t, "GET", "/admin/config", "", "")
	r0 := cfg["rule"].([]any)[0].(map[string]any)
	if r0["limit"] != 3.0 || r0["action"] != "shadow" || len(cfg["live_changes"].([]any)) != 2 {
		t.Fatalf("config does not show the live changes: %v %v", r0, cfg["live_changes"])
	}
}

func TestReload(t *testing.T) {
	opt, write := configFile(t, `
max_input_tokens = 2000
[[rule]]
name   = "per-ip"
key    = ["ip"]
limit  = 2
window = "1m"
[[rule]]
name   = "doomed"
key    = ["global"]
limit  = 100
window = "1m"
`)
	f := newFixture(t, opt, remembering)
	send := func() int { return f.do("/api/chat", "203.0.113.7:1").Code }
	send()
	send()
	if c := send(); c != 429 {
		t.Fatalf("3rd: %d", c)
	}
	if metric(t, f, "ratelimit_proxy_rule_decisions_total", map[string]string{"rule": "doomed", "result": "allowed"}) == 0 {
		t.Fatal("doomed rule not counted")
	}
	f.adminDo(t, "PUT", "/admin/rules/per-ip", "", `{"limit":50}`)

	// An invalid file changes nothing: 400 with every error.
	write(`
max_input_tokens = -1
[[rule]]
name   = "per-ip"
key    = ["ip"]
limit  = 2
window = "10"
`)
	code, m := f.adminDo(t, "POST", "/admin/reload", "", "")
	if code != 400 || m["error"] != "invalid_configuration" || len(m["errors"].([]any)) != 2 {
		t.Fatalf("invalid reload: %d %v", code, m)
	}
	if _, r := f.adminDo(t, "GET", "/admin/rules/per-ip", "", ""); r["limit"] != 50.0 {
		t.Fatalf("a refused reload changed the rule: %v", r)
	}

	// A valid one: the unchanged rule keeps its counters, the live change
	// is dropped, the removed rule's series go, the new setting applies.
	write(`
max_input_tokens = 5
[[rule]]
name   = "per-ip"
key    = ["ip"]
limit  = 2
window = "1m"
[[rule]]
name   = "added"
key    = ["global"]
limit  = 100
window = "1m"
`)
	code, m = f.adminDo(t, "POST", "/admin/reload", "", "")
	if code != 200 || m["status"] != "reloaded" {
		t.Fatalf("reload: %d %v", code, m)
	}
	if got := mustString(m["changed"]); !strings.Contains(got, "max_input_tokens: 2000 → 5") ||
		!strings.Contains(got, "rule doomed: removed") || !strings.Contains(got, "rule added: added") ||
		!strings.Contains(got, "rule per-ip: limit changed") {
		t.Fatalf("changed: %s", got)
	}
	if got := mustString(m["dropped_live_changes"]); got != `["rule per-ip: limit 50"]` {
		t.Fatalf("dropped: %s", got)
	}
	if c := send(); c != 429 {
		t.Fatalf("counters of an unchanged rule were lost: %d", c)
	}
	if _, l := f.adminDo(t, "GET", "/admin/limits/per-ip?key=ip=203.0.113.7", "", ""); l["used"] != 2.0 {
		t.Fatalf("per-ip after reload: %v", l)
	}
	w := f.send("/api/chat", "198.51.100.1:1", "application/json", `{"message":"`+strings.Repeat("word ", 50)+`"}`) // a fresh caller meets the new token cap
	if w.Code != 413 {
		t.Fatalf("new max_input_tokens not applied: %d %s", w.Code, w.Body)
	}
	mfs, _ := f.reg.Gather()
	for _, mf := range mfs {
		for _, s := range mf.GetMetric() {
			for _, l := range s.GetLabel() {
				if l.GetName() == "rule" && l.GetValue() == "doomed" {
					t.Fatalf("%s still reports the removed rule", mf.GetName())
				}
			}
		}
	}
	if metric(t, f, "ratelimit_proxy_config_reloads_total", map[string]string{"result": "error"}) != 1 ||
		metric(t, f, "ratelimit_proxy_config_reloads_total", map[string]string{"result": "ok"}) != 1 {
		t.Fatal("reload counters")
	}
}

// Reloads and live changes while requests flow: none fails, and the
// counters of the rule that stays are exact across every swap.
func TestReloadUnderLoad(t *testing.T) {
	const limit = 200
	base := `
[[rule]]
name   = "per-ip"
key    = ["ip"]
limit  = 200
window = "1h"
`
	opt, write := configFile(t, base)
	f := newFixture(t, opt, remembering)
	var ok, refused, other atomic.Int64
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for g := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; ; i++ {
				select {
				case <-stop:
					return
				default:
				}
				switch c := f.do("/v1/chat/completions", "203.0.113.7:1").Code; c {
				case 200:
					ok.Add(1)
				case 429:
					refused.Add(1)
				default:
					other.Add(1)
					t.Errorf("goroutine %d request %d: %d", g, i, c)
				}
			}
		}()
	}
	for i := 0; i < 40 || ok.Load()+refused.Load() < 3*limit; i++ {
		extra := ""
		if i%2 == 0 {
			extra = "\n[[rule]]\nname = \"extra\"\nkey = [\"global\"]\nlimit = 1000000\nwindow = \"1m\"\n"
		}
		write(base + extra)
		if code, m := f.adminDo(t, "POST", "/admin/reload", "", ""); code != 200 {
			t.Fatalf("reload %d: %d %v", i, code, m)
		}
		if code, _ := f.adminDo(t, "PUT", "/admin/limits/chat_rpm?key=caller=ip:1.1.1.1", "", `{"limit":5}`); code != 404 {
			// chat_rpm does not exist when the file has rules
			t.Fatalf("live change on a missing rule: %d", code)
		}
	}
	close(stop)
	wg.Wait()
	if ok.Load() != limit || other.Load() != 0 {
		t.Fatalf("admitted %d (want exactly %d), refused %d, other %d", ok.Load(), limit, refused.Load(), other.Load())
	}
}

func TestAdminTokensEstimate(t *testing.T) {
	f := newFixture(t)
	body := `{"model":"gpt-4o","messages":[{"role":"user","content":"hello world"}]}`
	code, m := f.adminDo(t, "POST", "/admin/tokens?model=gpt-4o", "", body)
	if code != 200 || m["encoding"] != "o200k_base" || m["estimated_tokens"].(float64) < 5 {
		t.Fatalf("%d %v", code, m)
	}
	code, m = f.adminDo(t, "POST", "/admin/tokens?model=gpt-4", "", body)
	if code != 200 || m["encoding"] != "cl100k_base" {
		t.Fatalf("model parameter: %d %v", code, m)
	}
	if code, _ := f.adminDo(t, "POST", "/admin/tokens", "", `{"messages":`); code != 400 {
		t.Fatalf("unparsable: %d", code)
	}
}

// keyHash is an API key's public form without its "key:" (SPEC §5).
func keyHash(tok string) string {
	sum := sha256.Sum256([]byte(tok))
	return hex.EncodeToString(sum[:8])
}

// An IPv6 client address pasted from an access log finds the counter of
// its IPV6_PREFIX; a header part's name is case-insensitive.
func TestAdminKeyForms(t *testing.T) {
	opt, _ := configFile(t, `
chat_rpm = 1
[[rule]]
name   = "per-env"
key    = ["header:X-Env", "ip"]
limit  = 5
window = "1m"
`)
	f := newFixture(t, opt)
	f.do("/api/chat", "[2001:db8::7]:1", "X-Env", "prod")
	if w := f.do("/api/chat", "[2001:db8::8]:1", "X-Env", "prod"); w.Code != 429 || deniedKey(t, w) != "caller=ip:2001:db8::/64" {
		t.Fatalf("second: %d %s", w.Code, w.Body)
	}
	if _, m := f.adminDo(t, "GET", "/admin/limits/chat_rpm?key=ip:2001:db8::99", "", ""); m["used"] != 1.0 || m["key"] != "caller=ip:2001:db8::/64" {
		t.Fatalf("a pasted address: %v", m)
	}
	if code, _ := f.adminDo(t, "DELETE", "/admin/limits/chat_rpm?key=caller%3Dip:2001:db8::99", "", ""); code != 204 {
		t.Fatalf("DELETE: %d", code)
	}
	if w := f.do("/api/chat", "[2001:db8::8]:1", "X-Env", "prod"); w.Code != 200 {
		t.Fatalf("after the reset: %d", w.Code)
	}
	if _, m := f.adminDo(t, "GET", "/admin/limits/per-env?key=header:x-env%3Dprod%26ip%3D2001:db8::1", "", ""); m["used"] != 2.0 {
		t.Fatalf("lower-case header name: %v", m)
	}
}

// A reload that changes a secret says so, without showing it.
func TestReloadReportsSecretChanges(t *testing.T) {
	opt, write := configFile(t, "admin_token = \"tok-one\"\n")
	f := newFixture(t, opt)
	write("admin_token = \"tok-two\"\n")
	code, m := f.adminDo(t, "POST", "/admin/reload", "tok-one", "")
	if code != 200 || mustString(m["changed"]) != `["admin_token: changed"]` {
		t.Fatalf("%d %v", code, m)
	}
	if code, _ := f.adminDo(t, "GET", "/admin/rules", "tok-one", ""); code != 401 {
		t.Fatalf("old token still works: %d", code)
	}
}

// Every restart-only setting changed in the file is named and keeps its
// running value.
func TestReloadKeepsRestartOnlySettings(t *testing.T) {
	opt, write := configFile(t, "")
	f := newFixture(t, opt)
	_, before := f.adminDo(t, "GET", "/admin/config", "", "")
	write(`
listen_addr = "127.0.0.1:1"
admin_addr = "127.0.0.1:2"
upstream_url = "http://changed.test:1"
upstream_timeout = "7s"
redis_url = "redis://127.0.0.1:1/0"
redis_prefix = "other:"
redis_timeout = "9ms"
redis_instances = 3
fail_open = false
max_tracked_keys = 5
refusal_cache_size = 6
log_format = "json"
state_file = "/tmp/x"
state_flush_interval = "3s"
shutdown_timeout = "4s"
`)
	code, m := f.adminDo(t, "POST", "/admin/reload", "", "")
	if code != 200 || len(m["restart_required"].([]any)) != 14 { // upstream_url comes from the environment, which wins
		t.Fatalf("%d %v", code, m["restart_required"])
	}
	_, after := f.adminDo(t, "GET", "/admin/config", "", "")
	for _, k := range m["restart_required"].([]any) {
		if mustString(before[k.(string)]) != mustString(after[k.(string)]) {
			t.Errorf("%s changed by a reload: %v → %v", k, before[k.(string)], after[k.(string)])
		}
	}
}
