package tests

import (
	"math"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/ratelimit-proxy/ratelimit-proxy/internal/redistest"
)

// The admin API of SPEC §10 on the real binary: the token, reading and
// resetting a key, a live rule change, and a reload by SIGHUP and by POST.
func TestAdminAPIAndReload(t *testing.T) {
	rec := newRecorder(t)
	cfgPath := filepath.Join(t.TempDir(), "config.toml")
	write := func(s string) {
		if err := os.WriteFile(cfgPath, []byte(s), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	write(`
chat_rpm = 2
[[rule]]
name   = "per-ip"
key    = ["ip"]
limit  = 10
window = "1m"
`)
	p := startProxy(t, rec.URL(), map[string]string{"ADMIN_TOKEN": "tok-123"}, "-config", cfgPath)
	auth := []string{"Authorization", "Bearer tok-123"}
	wantStatus(t, p.do(t, "GET", p.adminURL("/admin/rules"), nil), 401)
	wantStatus(t, p.do(t, "GET", p.adminURL("/metrics"), nil), 200)

	key := []string{"Authorization", "Bearer sk-caller"}
	wantStatus(t, p.post(t, "/v1/chat/completions", key...), 200)
	wantStatus(t, p.post(t, "/v1/chat/completions", key...), 200)
	r := p.post(t, "/v1/chat/completions", key...)
	wantStatus(t, r, 429)
	denied := r.json(t)["denied_key"].(string)

	lim := p.do(t, "GET", p.adminURL("/admin/limits/chat_rpm?key="+denied), nil, auth...)
	wantStatus(t, lim, 200)
	if m := lim.json(t); num(m["used"]) != 2 || num(m["remaining"]) != 0 || num(m["limit"]) != 2 || m["key"] != denied {
		t.Fatalf("limits: %s", lim.body)
	}
	wantStatus(t, p.do(t, "DELETE", p.adminURL("/admin/limits/chat_rpm?key="+denied), nil, auth...), 204)
	wantStatus(t, p.post(t, "/v1/chat/completions", key...), 200)

	// A live change, then SIGHUP: the file wins again.
	ch := p.do(t, "PUT", p.adminURL("/admin/rules/chat_rpm"), []byte(`{"limit":3}`), auth...)
	wantStatus(t, ch, 200)
	wantStatus(t, p.post(t, "/v1/chat/completions", key...), 200)
	wantStatus(t, p.post(t, "/v1/chat/completions", key...), 200)
	wantStatus(t, p.post(t, "/v1/chat/completions", key...), 429)
	if !strings.Contains(p.logs.Text(), "admin: rule changed live") {
		t.Fatal("the live change was not logged")
	}
	write(`
chat_rpm = 4
[[rule]]
name   = "per-ip"
key    = ["ip"]
limit  = 10
window = "1m"
`)
	if err := p.cmd.Process.Signal(syscall.SIGHUP); err != nil {
		t.Fatal(err)
	}
	if !waitFor(5*time.Second, func() bool { return strings.Contains(p.logs.Text(), `"source":"SIGHUP"`) }) {
		t.Fatalf("no reload logged after SIGHUP:\n%s", p.logs.Text())
	}
	// 3 counted; the new limit of 4 leaves one.
	wantStatus(t, p.post(t, "/v1/chat/completions", key...), 200)
	wantStatus(t, p.post(t, "/v1/chat/completions", key...), 429)

	// An invalid file: 400 with the errors, nothing changes.
	write("chat_rpm = -5\nmax_file_bytes = \"lots\"\n")
	bad := p.do(t, "POST", p.adminURL("/admin/reload"), nil, auth...)
	wantStatus(t, bad, 400)
	if m := bad.json(t); m["error"] != "invalid_configuration" || len(m["errors"].([]any)) < 2 {
		t.Fatalf("invalid reload: %s", bad.body)
	}
	rules := p.do(t, "GET", p.adminURL("/admin/rules"), nil, auth...)
	if !strings.Contains(string(rules.body), `"per-ip"`) {
		t.Fatalf("an invalid reload changed the rules: %s", rules.body)
	}
	tok := p.do(t, "POST", p.adminURL("/admin/tokens?model=gpt-4o"), []byte(`{"messages":[{"role":"user","content":"hello"}]}`), auth...)
	wantStatus(t, tok, 200)
	if m := tok.json(t); m["encoding"] != "o200k_base" || num(m["estimated_tokens"]) < 1 {
		t.Fatalf("tokens: %s", tok.body)
	}
	if !strings.Contains(string(p.do(t, "GET", p.adminURL("/metrics"), nil).body), `ratelimit_proxy_config_reloads_total{result="error"} 1`) {
		t.Fatal("the refused reload is not counted")
	}
}

// -check refuses an admin listener beyond loopback without ADMIN_TOKEN.
func TestCheckAdminAddrNeedsToken(t *testing.T) {
	t.Parallel()
	code, _, errOut := runOnce(t, map[string]string{"UPSTREAM_URL": "http://127.0.0.1:1", "ADMIN_ADDR": "0.0.0.0:9090"}, "-check")
	if code != 1 || !strings.Contains(errOut, "ADMIN_ADDR") || !strings.Contains(errOut, "ADMIN_TOKEN") {
		t.Fatalf("exit %d: %s", code, errOut)
	}
	code, _, errOut = runOnce(t, map[string]string{"UPSTREAM_URL": "http://127.0.0.1:1", "ADMIN_ADDR": "0.0.0.0:9090", "ADMIN_TOKEN": "x"}, "-check")
	if code != 0 {
		t.Fatalf("with a token: exit %d: %s", code, errOut)
	}
	code, _, errOut = runOnce(t, map[string]string{"UPSTREAM_URL": "http://127.0.0.1:1", "ADMIN_ADDR": "[::1]:9090"}, "-check")
	if code != 0 {
		t.Fatalf("loopback v6: exit %d: %s", code, errOut)
	}
}

// A reset on one instance forgets the remembered refusal on the other
// within 1 s (SPEC §4.2): the other admits the key again at once instead of
// answering from its memory.
func TestResetForgetsOnEveryInstance(t *testing.T) {
	srv := redistest.Start(t)
	rec := newRecorder(t)
	env := map[string]string{"REDIS_URL": srv.URL(), "CHAT_RPM": "2", "REDIS_TIMEOUT": "1s"}
	a := startProxy(t, rec.URL(), env)
	b := startProxy(t, rec.URL(), env)
	key := []string{"Authorization", "Bearer sk-shared"}
	wantStatus(t, a.post(t, "/api/chat", key...), 200)
	wantStatus(t, a.post(t, "/api/chat", key...), 200)
	r := b.post(t, "/api/chat", key...)
	wantStatus(t, r, 429) // b remembers this refusal now
	denied := r.json(t)["denied_key"].(string)
	wantStatus(t, a.do(t, "DELETE", a.adminURL("/admin/limits/chat_rpm?key="+denied), nil), 204)
	start := time.Now()
	if !waitFor(time.Second, func() bool { return b.post(t, "/api/chat", key...).StatusCode == 200 }) {
		t.Fatalf("instance b still refuses from memory %v after the reset on a", time.Since(start))
	}
}

// ?top=N on two instances sharing Redis: the callers with the most used
// across both, most used first, each a public form that ?key= reads back
// with the same numbers (the refused caller's denied_key among them), and
// never an API key itself.
func TestAdminTopAcrossInstances(t *testing.T) {
	srv := redistest.Start(t)
	rec := newRecorder(t)
	cfgPath := filepath.Join(t.TempDir(), "config.toml")
	if err := os.WriteFile(cfgPath, []byte(`
chat_rpm = 1000
[[rule]]
name   = "per-caller"
key    = ["caller"]
limit  = 6
window = "1m"
[[rule]]
name   = "per-caller-2"
key    = ["caller"]
limit  = 100
window = "1m"
`), 0o600); err != nil {
		t.Fatal(err)
	}
	env := map[string]string{"REDIS_URL": srv.URL(), "REDIS_TIMEOUT": "1s"}
	a := startProxy(t, rec.URL(), env, "-config", cfgPath)
	b := startProxy(t, rec.URL(), env, "-config", cfgPath)
	send := func(p *proc, secret string, n int) {
		for range n {
			wantStatus(t, p.post(t, "/api/chat", "Authorization", "Bearer "+secret), 200)
		}
	}
	send(a, "sk-e2e-one", 3)
	send(b, "sk-e2e-one", 2) // 5 across both
	send(b, "sk-e2e-two", 2)
	send(a, "sk-e2e-three", 6)
	r := b.post(t, "/api/chat", "Authorization", "Bearer sk-e2e-three")
	wantStatus(t, r, 429)
	denied := r.json(t)["denied_key"].(string)

	top := a.do(t, "GET", a.adminURL("/admin/limits/per-caller?top=2"), nil)
	wantStatus(t, top, 200)
	m := top.json(t)
	keys, _ := m["keys"].([]any)
	if m["rule"] != "per-caller" || len(keys) != 2 || strings.Contains(string(top.body), "sk-e2e") {
		t.Fatalf("top=2: %s", top.body)
	}
	first, second := keys[0].(map[string]any), keys[1].(map[string]any)
	if first["key"] != denied || num(first["used"]) != 6 || num(first["remaining"]) != 0 || num(first["limit"]) != 6 ||
		num(second["used"]) != 5 || num(second["remaining"]) != 1 || !strings.HasPrefix(second["key"].(string), "caller=key:") {
		t.Fatalf("top=2: %s", top.body)
	}
	for _, k := range keys {
		k := k.(map[string]any)
		one := b.do(t, "GET", b.adminURL("/admin/limits/per-caller?key="+url.QueryEscape(k["key"].(string))), nil)
		wantStatus(t, one, 200)
		o := one.json(t)
		if o["key"] != k["key"] || num(o["used"]) != num(k["used"]) || num(o["remaining"]) != num(k["remaining"]) || num(o["limit"]) != num(k["limit"]) ||
			math.Abs(num(o["reset_after_seconds"])-num(k["reset_after_seconds"])) > 1 {
			t.Fatalf("?key= reads %s, top listed %v", one.body, k)
		}
	}
	// per-caller-2's counters (a name that starts with per-caller's) are
	// not per-caller's: three callers, each once.
	all := a.do(t, "GET", a.adminURL("/admin/limits/per-caller?top"), nil)
	if keys, _ := all.json(t)["keys"].([]any); len(keys) != 3 {
		t.Fatalf("every key: %s", all.body)
	}
	wantStatus(t, a.do(t, "GET", a.adminURL("/admin/limits/per-caller?top=1001"), nil), 400)
	wantStatus(t, a.do(t, "GET", a.adminURL("/admin/limits/nope?top=3"), nil), 404)
}
