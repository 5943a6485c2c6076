package tests

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func sha(key string) string {
	s := sha256.Sum256([]byte(key))
	return hex.EncodeToString(s[:])
}

// API_KEYS_FILE: listed keys are their caller (two keys of one person share
// a budget, the key's tier is the plan); an unlisted or expired key is no
// credential (the IP, or 401 with REQUIRE_AUTH); a reload reads the file
// again. UPSTREAM_AUTHORIZATION: the caller's credential never reaches the
// upstream, the proxy's does.
func TestKnownKeysAndUpstreamCredential(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	keys := filepath.Join(dir, "keys.toml")
	write := func(extra string) {
		body := fmt.Sprintf(`
[[key]]
sha256 = %q
caller = "alice"
tier   = "pro"

[[key]]
sha256 = %q
caller = "alice"
tier   = "pro"

[[key]]
sha256  = %q
caller  = "bob"
expires = "2001-01-01T00:00:00Z"
`, sha("sk-alice-1"), sha("sk-alice-2"), sha("sk-bob-old")) + extra
		if err := os.WriteFile(keys, []byte(body), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	write("")
	rec := newRecorder(t)
	cfg := writeRules(t, `
[[rule]]
name   = "per-caller"
key    = ["caller"]
limit  = 1
window = "1m"
tiers  = { pro = 2 }
`)
	p := startProxy(t, rec.URL(), map[string]string{"API_KEYS_FILE": keys, "UPSTREAM_AUTHORIZATION": "Bearer sk-provider"}, "-config", cfg)
	bearer := func(k string) []string { return []string{"Authorization", "Bearer " + k} }

	// alice's two keys share her pro budget of 2.
	wantStatus(t, p.post(t, "/v1/chat/completions", bearer("sk-alice-1")...), http.StatusOK)
	got := rec.last(t).Header
	if got.Get("Authorization") != "Bearer sk-provider" {
		t.Fatalf("the upstream got Authorization %q", got.Get("Authorization"))
	}
	wantStatus(t, p.post(t, "/v1/chat/completions", bearer("sk-alice-2")...), http.StatusOK)
	r := p.post(t, "/v1/chat/completions", bearer("sk-alice-1")...)
	wantStatus(t, r, http.StatusTooManyRequests)
	if d := r.json(t)["denied_key"]; d != "caller=user:alice" {
		t.Fatalf("denied_key %v", d)
	}
	// The admin API shows alice the limit she is held to: her keys' tier.
	lim := p.do(t, "GET", p.adminURL("/admin/limits/per-caller?key=caller%3Duser%3Aalice"), nil)
	wantStatus(t, lim, http.StatusOK)
	if m := lim.json(t); m["limit"] != 2.0 || m["used"] != 2.0 || m["remaining"] != 0.0 {
		t.Fatalf("admin view of alice: %v", m)
	}
	top := p.do(t, "GET", p.adminURL("/admin/limits/per-caller?top=5"), nil)
	if keys, _ := top.json(t)["keys"].([]any); len(keys) != 1 || keys[0].(map[string]any)["limit"] != 2.0 {
		t.Fatalf("admin top: %s", top.body)
	}
	// An unknown key and an expired one count as the client IP.
	wantStatus(t, p.post(t, "/v1/chat/completions", bearer("sk-made-up")...), http.StatusOK)
	r = p.post(t, "/v1/chat/completions", bearer("sk-bob-old")...)
	wantStatus(t, r, http.StatusTooManyRequests)
	if d := r.json(t)["denied_key"]; d != "caller=ip:127.0.0.1" {
		t.Fatalf("expired key: denied_key %v", d)
	}
	// On Anthropic's path a non-Bearer credential goes as X-API-Key; no
	// spelling of the caller's own headers passes.
	p2 := startProxy(t, rec.URL(), map[string]string{"API_KEYS_FILE": keys, "UPSTREAM_AUTHORIZATION": "sk-ant-provider", "CHAT_RPM": "100"})
	wantStatus(t, p2.post(t, "/v1/messages", "X-Api-Key", "sk-alice-1", "X_api_key", "sk-caller", "Api-Key", "sk-caller"), http.StatusOK)
	got = rec.last(t).Header
	if got.Get("X-Api-Key") != "sk-ant-provider" || got.Get("Authorization") != "" || got.Get("Api-Key") != "" || len(got["X_api_key"]) != 0 {
		t.Fatalf("the upstream got %v", got)
	}
	wantStatus(t, p2.post(t, "/v1/chat/completions", bearer("sk-alice-1")...), http.StatusOK)
	if got := rec.last(t).Header; got.Get("Authorization") != "sk-ant-provider" || got.Get("X-Api-Key") != "" {
		t.Fatalf("elsewhere the upstream got %v", got)
	}
	// A key added to the file counts as its caller after a reload.
	write(fmt.Sprintf("\n[[key]]\nsha256 = %q\ncaller = \"carol\"\n", sha("sk-carol")))
	wantStatus(t, p.do(t, http.MethodPost, p.adminURL("/admin/reload"), nil), http.StatusOK)
	wantStatus(t, p.post(t, "/v1/chat/completions", bearer("sk-carol")...), http.StatusOK)
	r = p.post(t, "/v1/chat/completions", bearer("sk-carol")...)
	if d := r.json(t)["denied_key"]; r.StatusCode != http.StatusTooManyRequests || d != "caller=user:carol" {
		t.Fatalf("after the reload: %d, denied_key %v", r.StatusCode, d)
	}
	// With REQUIRE_AUTH an unknown key is no credential: 401.
	p3 := startProxy(t, rec.URL(), map[string]string{"API_KEYS_FILE": keys, "REQUIRE_AUTH": "true"})
	wantStatus(t, p3.post(t, "/v1/chat/completions", bearer("sk-made-up")...), http.StatusUnauthorized)
	wantStatus(t, p3.post(t, "/v1/chat/completions", bearer("sk-alice-2")...), http.StatusOK)
}

// -check validates the keys file, and never prints the upstream's credential.
func TestKnownKeysCheck(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	keys := filepath.Join(dir, "keys.toml")
	os.WriteFile(keys, []byte("[[key]]\nsha256 = \"abc\"\ncaller = \"a b\"\n"), 0o600)
	code, _, errOut := runOnce(t, map[string]string{"UPSTREAM_URL": "http://127.0.0.1:1", "API_KEYS_FILE": keys}, "-check")
	if code != 1 {
		t.Fatalf("-check accepted a bad keys file: %d\n%s", code, errOut)
	}
	for _, want := range []string{"API_KEYS_FILE", "key #1: sha256", `caller "a b"`} {
		if !strings.Contains(errOut, want) {
			t.Errorf("-check output lacks %q:\n%s", want, errOut)
		}
	}
	os.WriteFile(keys, []byte(fmt.Sprintf("[[key]]\nsha256 = %q\ncaller = \"alice\"\n", sha("k"))), 0o600)
	code, out, errOut := runOnce(t, map[string]string{"UPSTREAM_URL": "http://127.0.0.1:1", "API_KEYS_FILE": keys, "UPSTREAM_AUTHORIZATION": "Bearer sk-secret-provider"}, "-check")
	if code != 0 || strings.Contains(out+errOut, "sk-secret-provider") || !strings.Contains(out, `upstream_authorization = "[redacted]"`) {
		t.Fatalf("-check: %d\n%s\n%s", code, out, errOut)
	}
}
