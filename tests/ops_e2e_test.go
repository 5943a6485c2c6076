package tests

import (
	"encoding/json"
	"net/http"
	"strings"
	"testing"
	"time"
)

// metricValue returns the value of the sample line that starts with
// series (name and labels, exactly as exposed), or "" if absent.
func metricValue(exposition, series string) string {
	for _, line := range strings.Split(exposition, "\n") {
		if rest, ok := strings.CutPrefix(line, series+" "); ok {
			return strings.TrimSpace(rest)
		}
	}
	return ""
}

// 13. The admin listener counts the 429s it sent and answers health
// checks; the public listener does not serve /metrics (it forwards it).
func TestMetricsAndHealth(t *testing.T) {
	t.Parallel()
	up := newRecorder(t)
	p := startProxy(t, up.URL(), map[string]string{"CHAT_RPM": "1"})

	const denied = 3
	wantStatus(t, p.post(t, "/api/chat"), http.StatusOK)
	for range denied {
		wantStatus(t, p.post(t, "/api/chat"), http.StatusTooManyRequests)
	}
	series := map[string]string{
		`ratelimit_proxy_requests_total{decision="rate_limited",route="/api/chat"}`: "3",
		`ratelimit_proxy_requests_total{decision="allowed",route="/api/chat"}`:      "1",
	}
	var last string
	ok := waitFor(3*time.Second, func() bool {
		r := p.do(t, http.MethodGet, p.adminURL("/metrics"), nil)
		if r.StatusCode != http.StatusOK {
			return false
		}
		last = string(r.body)
		for s, v := range series {
			if metricValue(last, s) != v {
				return false
			}
		}
		return true
	})
	if !ok {
		for s, v := range series {
			t.Errorf("admin /metrics: %s = %q, want %s", s, metricValue(last, s), v)
		}
	}

	r := p.do(t, http.MethodGet, p.adminURL("/healthz"), nil)
	wantStatus(t, r, http.StatusOK)
	r = p.do(t, http.MethodGet, p.adminURL("/readyz"), nil)
	wantStatus(t, r, http.StatusOK)
	if ct := r.Header.Get("Content-Type"); !strings.HasPrefix(ct, "application/json") {
		t.Errorf("/readyz Content-Type = %q", ct)
	}
	r.json(t)

	r = p.do(t, http.MethodGet, p.url("/metrics"), nil)
	wantStatus(t, r, http.StatusOK)
	if strings.Contains(string(r.body), "ratelimit_proxy_") || r.Header.Get("X-Upstream") != "yes" {
		t.Errorf("the public listener served its own /metrics instead of forwarding it:\n%.300s", r.body)
	}
	if got := up.last(t); got.Path != "/metrics" || got.Method != http.MethodGet {
		t.Errorf("upstream last saw %s %s, want GET /metrics", got.Method, got.Path)
	}
}

// 16. A denial is logged once with rule, truncated key and retry-after;
// no log line carries the request body or a raw API key.
func TestDenialLogLine(t *testing.T) {
	t.Parallel()
	up := newRecorder(t)
	p := startProxy(t, up.URL(), map[string]string{"CHAT_RPM": "1", "LOG_LEVEL": "debug"})

	const marker = "PROMPT-MARKER-7f3c9e"
	const rawKey = "sk-raw-LOGKEY-5a1d0c"
	body := []byte(`{"model":"gpt-4o-mini","messages":[{"role":"user","content":"` + marker + `"}]}`)
	for i := range 2 {
		r := p.do(t, http.MethodPost, p.url("/v1/chat/completions"), body)
		if i == 1 {
			wantStatus(t, r, http.StatusTooManyRequests)
		}
		r = p.do(t, http.MethodPost, p.url("/api/chat"), body, "Authorization", "Bearer "+rawKey)
		if i == 1 {
			wantStatus(t, r, http.StatusTooManyRequests)
		}
	}
	p.stop() // flush every log line
	if code, _ := p.exited(0); code != 0 {
		t.Errorf("exit code %d after SIGTERM", code)
	}

	lines := p.logs.Lines()
	var denials []logLine
	for _, l := range lines {
		var m logLine
		if err := json.Unmarshal([]byte(l), &m); err != nil {
			t.Errorf("LOG_FORMAT=json but a stderr line is not JSON: %q", l)
			continue
		}
		if m["msg"] == "request denied" {
			denials = append(denials, m)
		}
		if strings.Contains(l, marker) {
			t.Errorf("a log line contains the request body: %s", l)
		}
		if strings.Contains(l, rawKey) {
			t.Errorf("a log line contains the raw API key: %s", l)
		}
	}
	wantKeys := map[string]bool{"caller=ip:127.0.0.0/24": false, "caller=" + keyHash(rawKey): false}
	for _, d := range denials {
		key, _ := d["key"].(string)
		if _, ok := wantKeys[key]; !ok {
			t.Errorf("denial logged with key %q, want one of %v (IPs truncated to /24, keys hashed)", key, wantKeys)
			continue
		}
		wantKeys[key] = true
		if d["rule"] != "chat_rpm" {
			t.Errorf("denial rule = %#v, want chat_rpm", d["rule"])
		}
		if ra := num(d["retry_after"]); ra < 1 || ra > 60 {
			t.Errorf("denial retry_after = %#v, want seconds in [1, 60]", d["retry_after"])
		}
	}
	if len(denials) != 2 {
		t.Errorf("%d \"request denied\" lines, want 2 (one per 429)", len(denials))
	}
	for k, seen := range wantKeys {
		if !seen {
			t.Errorf("no denial logged for %s\nlogs:\n%s", k, strings.Join(lines, "\n"))
		}
	}
}

// ACCESS_LOG=true: one line per proxied request, admitted, refused or
// unprotected, with the caller in its log form and no query, key or body.
func TestAccessLog(t *testing.T) {
	t.Parallel()
	rec := newRecorder(t)
	p := startProxy(t, rec.URL(), map[string]string{"ACCESS_LOG": "true", "CHAT_RPM": "1"})
	const key = "sk-access-log-secret"
	wantStatus(t, p.post(t, "/v1/chat/completions?api_key=q-secret", "Authorization", "Bearer "+key), http.StatusOK)
	wantStatus(t, p.post(t, "/v1/chat/completions", "Authorization", "Bearer "+key), http.StatusTooManyRequests)
	wantStatus(t, p.do(t, http.MethodGet, p.url("/v1/models?x=1"), nil), http.StatusOK)
	var lines []logLine
	deadline := time.Now().Add(5 * time.Second)
	for len(lines) < 3 && time.Now().Before(deadline) {
		lines = lines[:0]
		for _, l := range p.logs.JSONLines() {
			if l["msg"] == "request" {
				lines = append(lines, l)
			}
		}
		time.Sleep(20 * time.Millisecond)
	}
	if len(lines) != 3 {
		t.Fatalf("%d access log lines, want 3: %v", len(lines), lines)
	}
	hash := keyHash(key)
	ok, refused, other := lines[0], lines[1], lines[2]
	if ok["status"] != 200.0 || ok["caller"] != hash || ok["rule"] != "chat_rpm" || ok["path"] != "/v1/chat/completions" ||
		ok["tokens"] == nil || ok["upstream_seconds"] == nil || ok["bytes"].(float64) <= 0 || ok["method"] != "POST" {
		t.Errorf("admitted: %v", ok)
	}
	if refused["status"] != 429.0 || refused["rule"] != "chat_rpm" || refused["decision"] != "rate_limited" || refused["upstream_seconds"] != nil {
		t.Errorf("refused: %v", refused)
	}
	if other["status"] != 200.0 || other["path"] != "/v1/models" || other["caller"] != "ip:127.0.0.0/24" {
		t.Errorf("unprotected: %v", other)
	}
	all := p.logs.Text()
	for _, secret := range []string{key, "q-secret", "hi\"", "x=1"} {
		if strings.Contains(all, secret) {
			t.Errorf("the log holds %q:\n%s", secret, all)
		}
	}
}
