package proxy

import (
	"log/slog"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/ratelimit-proxy/ratelimit-proxy/config"
	"github.com/ratelimit-proxy/ratelimit-proxy/limits"
)

// The guard steps are called one by one here, on an exchange that
// answers nothing: what a step refuses is the denial it returns, which
// x.deny alone would write.

// silent is a ResponseWriter a step must not write to.
type silent struct {
	t *testing.T
	h http.Header
}

func (s *silent) Header() http.Header { return s.h }
func (s *silent) Write([]byte) (int, error) {
	s.t.Error("a step wrote a body")
	return 0, nil
}
func (s *silent) WriteHeader(int) { s.t.Error("a step wrote a status") }

func stepProxy(t *testing.T, cfg config.Config, now func() time.Time) *Proxy {
	t.Helper()
	cfg.UpstreamURL = "http://upstream.invalid"
	p, err := New(Options{Config: cfg, Store: limits.NewMemory(limits.MemoryOptions{}), Logger: slog.New(slog.DiscardHandler),
		Registerer: prometheus.NewRegistry(), Now: now})
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// stepExchange is the exchange ServeHTTP would make for r.
func stepExchange(t *testing.T, p *Proxy, r *http.Request) *exchange {
	x := new(exchange)
	x.begin(p, &silent{t: t, h: http.Header{}}, r)
	return x
}

func chatRequest(body string) *http.Request {
	r := httptest.NewRequest(http.MethodPost, "/v1/chat/completions", strings.NewReader(body))
	r.Header.Set("Content-Type", "application/json")
	return r
}

// attr is the value of a log attribute of d's line.
func attr(d *denial, name string) any {
	for i := 0; i+1 < len(d.log); i += 2 {
		if d.log[i] == name {
			return d.log[i+1]
		}
	}
	return nil
}

func TestStepIdentify(t *testing.T) {
	cfg := config.Default()
	cfg.RequireAuth = true
	p := stepProxy(t, cfg, nil)

	x := stepExchange(t, p, chatRequest(`{}`))
	d := x.identify()
	if d == nil {
		t.Fatal("no credential under REQUIRE_AUTH: admitted")
	}
	if d.decision != decUnauthorized || d.e.status != http.StatusUnauthorized || d.e.code != codeUnauthorized {
		t.Errorf("denial %q %d %q, want unauthorized 401", d.decision, d.e.status, d.e.code)
	}
	if d.nh != 1 || d.headers[0].name != "Www-Authenticate" || d.headers[0].value[0] != "Bearer" {
		t.Errorf("headers %+v, want WWW-Authenticate: Bearer", d.headers[:d.nh])
	}
	if d.msg != "request denied" || attr(d, "rule") != "require_auth" || attr(d, "path") != "/v1/chat/completions" {
		t.Errorf("log %q %v", d.msg, d.log)
	}

	r := chatRequest(`{}`)
	r.Header.Set("Authorization", "Bearer sk-test-1")
	x = stepExchange(t, p, r)
	if d := x.identify(); d != nil {
		t.Fatalf("with a key: %+v", d.e)
	}
	if !x.keys.c.hasCred || !strings.HasPrefix(x.keys.c.value, "key:") {
		t.Errorf("caller %+v, want the API key", x.keys.c)
	}
}

// decide records an admission, then refuses the next request of the
// caller with the 429 of SPEC §5, its waits from the injected clock.
func TestStepDecide(t *testing.T) {
	cfg := config.Default()
	cfg.ChatRPM = 1
	now := time.Unix(1_700_000_000, 0)
	p := stepProxy(t, cfg, func() time.Time { return now })

	run := func() (*exchange, *denial) {
		x := stepExchange(t, p, chatRequest(`{}`))
		if d := x.identify(); d != nil {
			t.Fatalf("identify: %+v", d.e)
		}
		if d := x.addHits(); d != nil {
			t.Fatalf("addHits: %+v", d.e)
		}
		return x, x.decide()
	}
	x, d := run()
	if d != nil || !x.limited || x.out[0].Remaining != 0 || len(x.hits) != 1 {
		t.Fatalf("first: denial %v, limited %v, out %+v", d, x.limited, x.out)
	}
	now = now.Add(15 * time.Second)
	x, d = run()
	if d == nil {
		t.Fatal("second within the minute: admitted")
	}
	if d.decision != decRateLimited || d.e.status != http.StatusTooManyRequests || d.e.code != codeRateLimited {
		t.Errorf("denial %q %d %q", d.decision, d.e.status, d.e.code)
	}
	if d.e.message != "Too many requests. Please retry after 45 seconds." {
		t.Errorf("message %q", d.e.message)
	}
	want := []field{{"retry_after_seconds", int64(45)}, {"denied_by", "chat_rpm"}, {"denied_key", x.hits[0].Key.String()},
		{"limit", int64(1)}, {"violated", []string{"chat_rpm"}}}
	if len(d.e.fields) != len(want) {
		t.Fatalf("fields %v", d.e.fields)
	}
	for i, f := range want {
		g := d.e.fields[i]
		if g.name != f.name || !equalValue(g.value, f.value) {
			t.Errorf("field %d: %s=%v, want %s=%v", i, g.name, g.value, f.name, f.value)
		}
	}
	var names []string
	for _, h := range d.headers[:d.nh] {
		names = append(names, h.name+": "+h.value[0])
	}
	if !slices.Equal(names, []string{"Retry-After: 45", "X-Ratelimit-Retry-After: 45"}) || d.retryMs != 45000 {
		t.Errorf("headers %q, Retry-After-Ms %d", names, d.retryMs)
	}
	if !x.limited || !x.refused {
		t.Error("the 429 does not stamp its rate-limit headers")
	}
	if d.msg != "" {
		t.Errorf("logged %q with logging off", d.msg)
	}
}

func equalValue(a, b any) bool {
	if as, ok := a.([]string); ok {
		bs, ok := b.([]string)
		return ok && slices.Equal(as, bs)
	}
	return a == b
}

// A rule keyed by a header the request lacks, on_missing_key = reject:
// 400 missing_key, counted on the rule's missing counter when answered.
func TestStepAddHitsMissingKey(t *testing.T) {
	cfg := config.Default()
	cfg.Rules = []config.Rule{{Name: "per-team", Methods: []string{"POST"}, Key: []string{"header:X-Team"}, OnMissingKey: "reject",
		Algorithm: config.AlgSlidingWindow, Limit: 10, Window: time.Minute, Cost: config.CostRequests, Action: "reject"}}
	p := stepProxy(t, cfg, nil)
	x := stepExchange(t, p, chatRequest(`{}`))
	if d := x.identify(); d != nil {
		t.Fatal(d.e)
	}
	d := x.addHits()
	if d == nil {
		t.Fatal("missing key part: no denial")
	}
	if d.decision != decInvalid || d.e.status != http.StatusBadRequest || d.e.code != codeMissingKey {
		t.Errorf("denial %q %d %q", d.decision, d.e.status, d.e.code)
	}
	if attr(d, "key_part") != "header:X-Team" || attr(d, "reason") != "missing_key" {
		t.Errorf("log %v", d.log)
	}
	ru := x.cands[len(x.cands)-1]
	if got := testutil.ToFloat64(ru.metrics.missing); got != 0 {
		t.Errorf("counted %v before the answer", got)
	}
	x.ResponseWriter = httptest.NewRecorder() // deny writes
	x.deny(d)
	if got := testutil.ToFloat64(ru.metrics.missing); got != 1 {
		t.Errorf("missing counter %v, want 1", got)
	}
	if x.decision != decInvalid || x.status != http.StatusBadRequest {
		t.Errorf("answered %q %d", x.decision, x.status)
	}
}

// The body steps: a compressed body is refused unread (415), a body over
// the token cap is read and refused by the cap (413), an unprotected
// route without body rules reads nothing.
func TestStepBody(t *testing.T) {
	cfg := config.Default()
	cfg.MaxInputTokens = 5
	p := stepProxy(t, cfg, nil)

	r := chatRequest(`{"model":"gpt-4o","messages":[{"role":"user","content":"hello"}]}`)
	r.Header.Set("Content-Encoding", "gzip")
	x := stepExchange(t, p, r)
	x.identify()
	d := x.readBody()
	if d == nil || d.e.status != http.StatusUnsupportedMediaType || d.decision != decUnsupportedEncoding ||
		d.headers[0].name != "Accept-Encoding" || x.body != nil {
		t.Fatalf("compressed: %+v, body read %v", d, x.body != nil)
	}

	x = stepExchange(t, p, chatRequest(`{"model":"gpt-4o","messages":[{"role":"user","content":"one two three four five six seven"}]}`))
	x.identify()
	if d := x.readBody(); d != nil {
		t.Fatalf("readBody: %+v", d.e)
	}
	d = x.tokenCap()
	if d == nil || d.e.status != http.StatusRequestEntityTooLarge || d.e.code != codeInputTooLarge || attr(d, "rule") != "max_input_tokens" {
		t.Fatalf("token cap: %+v", d)
	}
	if est := d.e.fields[1]; est.name != "estimated_tokens" || est.value.(int) <= 5 {
		t.Errorf("fields %v", d.e.fields)
	}
	x.body.close()

	u := httptest.NewRequest(http.MethodPost, "/v1/models", strings.NewReader("x"))
	x = stepExchange(t, p, u)
	if x.protected || x.readBody() != nil || x.tokenCap() != nil || x.body != nil {
		t.Error("an unprotected route's body was read or capped")
	}
}
