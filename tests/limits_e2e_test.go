package tests

import (
	"fmt"
	"math/rand/v2"
	"net/http"
	"strconv"
	"strings"
	"testing"
)

// 1. An admitted request carries the rate-limit headers of SPEC §5.
func TestAdmittedRequestCarriesRateLimitHeaders(t *testing.T) {
	t.Parallel()
	up := newRecorder(t)
	p := startProxy(t, up.URL(), map[string]string{"CHAT_RPM": "3"})

	r := p.post(t, "/v1/chat/completions")
	wantStatus(t, r, http.StatusOK)
	if r.Header.Get("X-Upstream") != "yes" {
		t.Errorf("200 did not come from the upstream: %v", r.Header)
	}
	wantHeader(t, r, "X-RateLimit-Limit", "3")
	wantHeader(t, r, "X-RateLimit-Remaining", "2")
	wantHeader(t, r, "X-RateLimit-Reset", "60")
	wantHeader(t, r, "RateLimit-Policy", `"chat_rpm";q=3;w=60`)
	wantHeader(t, r, "RateLimit", `"chat_rpm";r=2;t=60`)
}

// 2. The 429: status, headers and the body in each envelope of SPEC §5;
// the upstream sees only the admitted requests.
func TestRateLimited429BodyAndHeaders(t *testing.T) {
	t.Parallel()
	cases := []struct {
		name, path, format string
		check              func(t *testing.T, body map[string]any, n float64)
	}{
		{"flat /api/chat", "/api/chat", "", func(t *testing.T, b map[string]any, n float64) {
			wantFlat(t, b, "rate_limited", n)
		}},
		{"openai /v1/chat/completions", "/v1/chat/completions", "", func(t *testing.T, b map[string]any, n float64) {
			want := map[string]any{"code": "rate_limited", "type": "rate_limit_error", "message": retryMessage(n)}
			for k, v := range want {
				if got := field(b, "error", k); got != v {
					t.Errorf("error.%s = %#v, want %#v", k, got, v)
				}
			}
			if e, _ := b["error"].(map[string]any); e == nil {
				t.Errorf("no error object: %v", b)
			} else if v, ok := e["param"]; !ok || v != nil {
				t.Errorf("error.param = %#v (present %v), want null", v, ok)
			}
			wantTopLevel(t, b, n)
		}},
		{"anthropic /v1/messages", "/v1/messages", "", func(t *testing.T, b map[string]any, n float64) {
			want := map[string]any{"code": "rate_limited", "type": "rate_limit_error", "message": retryMessage(n)}
			if b["type"] != "error" {
				t.Errorf("type = %#v, want \"error\"", b["type"])
			}
			for k, v := range want {
				if got := field(b, "error", k); got != v {
					t.Errorf("error.%s = %#v, want %#v", k, got, v)
				}
			}
			wantTopLevel(t, b, n)
		}},
		{"ERROR_FORMAT=flat /v1/chat/completions", "/v1/chat/completions", "flat", func(t *testing.T, b map[string]any, n float64) {
			wantFlat(t, b, "rate_limited", n)
		}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			up := newRecorder(t)
			env := map[string]string{"CHAT_RPM": "2"}
			if tc.format != "" {
				env["ERROR_FORMAT"] = tc.format
			}
			p := startProxy(t, up.URL(), env)
			for i := range 2 {
				wantStatus(t, p.post(t, tc.path), http.StatusOK)
				if up.count() != i+1 {
					t.Fatalf("upstream saw %d requests after %d admitted", up.count(), i+1)
				}
			}
			r := p.post(t, tc.path)
			wantStatus(t, r, http.StatusTooManyRequests)
			n := check429Headers(t, r, 2)
			tc.check(t, r.json(t), float64(n))
			if got := up.count(); got != 2 {
				t.Errorf("upstream received %d requests, want exactly the 2 admitted", got)
			}
		})
	}
}

func retryMessage(n float64) string {
	return fmt.Sprintf("Too many requests. Please retry after %d seconds.", int(n))
}

// check429Headers checks the headers of a 429 of SPEC §5 and returns
// Retry-After.
func check429Headers(t *testing.T, r *response, limit int) int {
	t.Helper()
	if ct := r.Header.Get("Content-Type"); ct != "application/json" {
		t.Errorf("Content-Type = %q, want application/json", ct)
	}
	ra, err := strconv.Atoi(r.Header.Get("Retry-After"))
	if err != nil || ra < 1 || ra > 60 {
		t.Errorf("Retry-After = %q, want an integer in [1, 60]", r.Header.Get("Retry-After"))
	}
	wantHeader(t, r, "X-RateLimit-Retry-After", strconv.Itoa(ra))
	ms, err := strconv.ParseInt(r.Header.Get("retry-after-ms"), 10, 64)
	if err != nil || ms < 1 {
		t.Errorf("retry-after-ms = %q, want a positive integer", r.Header.Get("retry-after-ms"))
	} else if int((ms+999)/1000) != ra {
		t.Errorf("retry-after-ms %d rounds up to %d s, Retry-After is %d", ms, (ms+999)/1000, ra)
	}
	wantHeader(t, r, "X-RateLimit-Remaining", "0")
	wantHeader(t, r, "X-RateLimit-Limit", strconv.Itoa(limit))
	wantHeader(t, r, "RateLimit-Policy", fmt.Sprintf(`"chat_rpm";q=%d;w=60`, limit))
	return ra
}

// wantFlat checks the flat 429 body (fields may be added, never removed).
func wantFlat(t *testing.T, b map[string]any, code string, n float64) {
	t.Helper()
	if b["error"] != code {
		t.Errorf("error = %#v, want %q (body %v)", b["error"], code, b)
	}
	if b["message"] != retryMessage(n) {
		t.Errorf("message = %#v, want %q", b["message"], retryMessage(n))
	}
	wantTopLevel(t, b, n)
}

// wantTopLevel checks the 429's top-level members of SPEC §5 for the
// loopback IP caller and limit 2.
func wantTopLevel(t *testing.T, b map[string]any, n float64) {
	t.Helper()
	want := map[string]any{"retry_after_seconds": n, "denied_by": "chat_rpm", "denied_key": "caller=ip:127.0.0.1", "limit": 2.0}
	for k, v := range want {
		if b[k] != v {
			t.Errorf("%s = %#v, want %#v (body %v)", k, b[k], v, b)
		}
	}
}

// 3. One budget per caller across every protected route; an API key is a
// caller of its own, whichever header carries it.
func TestOneBudgetPerCallerAcrossRoutes(t *testing.T) {
	t.Parallel()
	up := newRecorder(t)
	p := startProxy(t, up.URL(), map[string]string{"CHAT_RPM": "3"})

	for i, path := range []string{"/api/chat", "/v1/chat/completions", "/v1/messages"} {
		r := p.post(t, path)
		wantStatus(t, r, http.StatusOK)
		wantHeader(t, r, "X-RateLimit-Remaining", strconv.Itoa(2-i))
	}
	r := p.post(t, "/v1/embeddings")
	wantStatus(t, r, http.StatusTooManyRequests)
	if got := r.json(t); got["denied_key"] != "caller=ip:127.0.0.1" {
		t.Errorf("IP caller denied_key = %#v", got["denied_key"])
	}

	// The IP is exhausted; API key callers have budgets of their own.
	const k1, k2 = "sk-test-key-one", "sk-test-key-two"
	steps := []struct {
		hdr       []string
		remaining string
	}{
		{[]string{"Authorization", "Bearer " + k1}, "2"},
		{[]string{"X-API-Key", k1}, "1"}, // the same key in the other header: the same caller
		{[]string{"Authorization", "Bearer " + k1}, "0"},
	}
	for _, s := range steps {
		r := p.post(t, "/v1/completions", s.hdr...)
		wantStatus(t, r, http.StatusOK)
		wantHeader(t, r, "X-RateLimit-Remaining", s.remaining)
	}
	r = p.post(t, "/api/chat", "Authorization", "Bearer "+k1)
	wantStatus(t, r, http.StatusTooManyRequests)
	if got, want := r.json(t)["denied_key"], "caller="+keyHash(k1); got != want {
		t.Errorf("API key caller denied_key = %#v, want %q", got, want)
	}
	if r := p.post(t, "/v1/responses", "Authorization", "Bearer "+k2); r.StatusCode != http.StatusOK {
		t.Errorf("a second API key shares the first key's budget: status %d %s", r.StatusCode, r.body)
	}
	if r := p.post(t, "/v1/chat/completions"); r.StatusCode != http.StatusTooManyRequests {
		t.Errorf("IP caller after API key traffic: status %d, want 429 (budget already spent)", r.StatusCode)
	}
	if got := up.count(); got != 7 {
		t.Errorf("upstream received %d requests, want the 7 admitted", got)
	}
}

// 4a. Routes outside PROTECTED_PATHS, and GETs on protected paths, pass
// without guards.
func TestUnprotectedRoutesPassWithoutGuards(t *testing.T) {
	t.Parallel()
	up := newRecorder(t)
	p := startProxy(t, up.URL(), map[string]string{"CHAT_RPM": "1"})

	wantStatus(t, p.post(t, "/v1/chat/completions"), http.StatusOK) // spends the budget
	for range 4 {
		for _, req := range []struct{ method, path string }{
			{http.MethodGet, "/v1/models"},
			{http.MethodPost, "/v1/other"},
			{http.MethodGet, "/v1/chat/completions"},
			{http.MethodGet, "/api/chat"},
		} {
			var body []byte
			if req.method == http.MethodPost {
				body = bodyFor(req.path)
			}
			r := p.do(t, req.method, p.url(req.path), body)
			wantStatus(t, r, http.StatusOK)
			if r.Header.Get("X-Upstream") != "yes" {
				t.Errorf("%s %s not answered by the upstream", req.method, req.path)
			}
			wantNoRateLimitHeaders(t, r)
		}
	}
	if got := up.count(); got != 1+16 {
		t.Errorf("upstream received %d requests, want 17", got)
	}
}

// 4b. A query string does not change protection, and path spellings the
// upstream's router would treat as the protected path count against the
// same budget.
func TestQueryAndPathTricksStillGuarded(t *testing.T) {
	t.Parallel()
	up := newRecorder(t)
	p := startProxy(t, up.URL(), map[string]string{"CHAT_RPM": "5"})

	paths := []string{"/v1/chat/completions?x=1", "/v1//chat/completions", "/v1/chat/completions/", "/v1/./chat/completions?stream=0", "/v1/x/../chat/completions"}
	for i, path := range paths {
		r := p.do(t, http.MethodPost, p.url(path), bodyFor("/v1/chat/completions"))
		wantStatus(t, r, http.StatusOK)
		wantHeader(t, r, "X-RateLimit-Remaining", strconv.Itoa(4-i))
	}
	for _, path := range append(paths, "/v1/chat/completions") {
		r := p.do(t, http.MethodPost, p.url(path), bodyFor("/v1/chat/completions"))
		if r.StatusCode != http.StatusTooManyRequests {
			t.Errorf("POST %s after the budget is spent: status %d, want 429", path, r.StatusCode)
		}
	}
	if got := up.count(); got != 5 {
		t.Errorf("upstream received %d requests, want the 5 admitted", got)
	}
}

// 7. X-Forwarded-For from an untrusted peer is ignored: rotating it does
// not buy a fresh budget.
func TestSpoofedXForwardedForDoesNotCreateBudget(t *testing.T) {
	t.Parallel()
	up := newRecorder(t)
	p := startProxy(t, up.URL(), map[string]string{"CHAT_RPM": "2"})
	randIP := func() string {
		return fmt.Sprintf("%d.%d.%d.%d", 1+rand.IntN(222), rand.IntN(256), rand.IntN(256), 1+rand.IntN(254))
	}
	for i := range 3 {
		r := p.post(t, "/v1/chat/completions", "X-Forwarded-For", randIP())
		want := http.StatusOK
		if i == 2 {
			want = http.StatusTooManyRequests
		}
		wantStatus(t, r, want)
		if i == 2 {
			if got := r.json(t)["denied_key"]; got != "caller=ip:127.0.0.1" {
				t.Errorf("denied_key = %#v, want the socket peer caller=ip:127.0.0.1", got)
			}
		}
	}
}

// 14. REQUIRE_AUTH: no credential (an empty bearer token is none) is 401
// with WWW-Authenticate; any key passes.
func TestRequireAuth(t *testing.T) {
	t.Parallel()
	up := newRecorder(t)
	p := startProxy(t, up.URL(), map[string]string{"REQUIRE_AUTH": "true"})

	for _, tc := range []struct {
		path string
		hdr  []string
	}{
		{"/v1/chat/completions", nil},
		{"/v1/chat/completions", []string{"Authorization", "Bearer "}},
		{"/v1/chat/completions", []string{"Authorization", "Bearer    "}},
		{"/api/chat", []string{"X-API-Key", ""}},
		{"/api/chat", nil},
	} {
		r := p.post(t, tc.path, tc.hdr...)
		wantStatus(t, r, http.StatusUnauthorized)
		if got := r.Header.Get("WWW-Authenticate"); got != "Bearer" && !strings.HasPrefix(got, "Bearer ") {
			t.Errorf("%s %q: WWW-Authenticate = %q, want Bearer", tc.path, tc.hdr, got)
		}
		if ct := r.Header.Get("Content-Type"); ct != "application/json" {
			t.Errorf("401 Content-Type = %q", ct)
		}
		b := r.json(t)
		if tc.path == "/api/chat" {
			if b["error"] != "unauthorized" {
				t.Errorf("flat 401 error = %#v", b["error"])
			}
		} else if field(b, "error", "code") != "unauthorized" || field(b, "error", "type") != "authentication_error" {
			t.Errorf("OpenAI 401 envelope = %v", b)
		}
	}
	if n := up.count(); n != 0 {
		t.Fatalf("upstream received %d unauthenticated requests", n)
	}
	wantStatus(t, p.post(t, "/v1/chat/completions", "Authorization", "Bearer sk-valid"), http.StatusOK)
	wantStatus(t, p.post(t, "/api/chat", "X-API-Key", "sk-other"), http.StatusOK)
	if n := up.count(); n != 2 {
		t.Errorf("upstream received %d requests, want 2", n)
	}
}

// CHAT_RPM=0 refuses every protected request (and nothing else).
func TestChatRPMZeroRefusesProtected(t *testing.T) {
	t.Parallel()
	up := newRecorder(t)
	p := startProxy(t, up.URL(), map[string]string{"CHAT_RPM": "0"})

	r := p.post(t, "/api/chat")
	wantStatus(t, r, http.StatusTooManyRequests)
	check429Headers(t, r, 0)
	if b := r.json(t); b["error"] != "rate_limited" || b["limit"] != 0.0 {
		t.Errorf("429 body = %v", b)
	}
	wantStatus(t, p.do(t, http.MethodGet, p.url("/v1/models"), nil), http.StatusOK)
	if got := up.count(); got != 1 {
		t.Errorf("upstream received %d requests, want only the unprotected one", got)
	}
}

// RATE_LIMIT_ENABLED=false admits everything, without rate-limit headers.
func TestRateLimitDisabled(t *testing.T) {
	t.Parallel()
	up := newRecorder(t)
	p := startProxy(t, up.URL(), map[string]string{"CHAT_RPM": "1", "RATE_LIMIT_ENABLED": "false"})
	for range 3 {
		r := p.post(t, "/v1/chat/completions")
		wantStatus(t, r, http.StatusOK)
		wantNoRateLimitHeaders(t, r)
	}
}
