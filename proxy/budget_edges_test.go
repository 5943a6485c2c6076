package proxy_test

import (
	"bufio"
	"io"
	"net"
	"net/http/httptest"
	"strings"
	"testing"
	"time"
)

// Cases an attacker or a lenient upstream brings (found in review).
func TestBudgetEdges(t *testing.T) {
	u, url := newLLM(t)
	f := newFixture(t, budgetRules(t, url, `
chat_rpm = 1000

[[rule]]
name   = "tpm"
cost   = "total_tokens"
limit  = 1000
window = "1m"

[[rule]]
name    = "ws"
paths   = ["/realtime/*"]
methods = ["*"]
cost    = "total_tokens"
limit   = 100000
window  = "1m"
`, "MAX_INPUT_TOKENS", "200")...)

	// A model name that is no valid label value: neither a panic nor a
	// stuck metric lock.
	for range 2 {
		w := f.send("/v1/chat/completions", "203.0.113.7:1", "application/x-www-form-urlencoded", "model=%ff%fe&messages=hi&max_tokens=5", "X-Test-Usage", "3,4")
		if w.Code != 200 {
			t.Fatalf("invalid UTF-8 model: %d %s", w.Code, w.Body)
		}
	}
	// Compressed answers cannot be read: the upstream is asked for none.
	f.send("/v1/chat/completions", "203.0.113.7:1", "application/json", weatherBody+`,"max_tokens":5}`, "Accept-Encoding", "gzip, br", "X-Test-Usage", "3,4")
	if got := u.hdrs[len(u.hdrs)-1].Get("Accept-Encoding"); got != "identity" {
		t.Fatalf("upstream Accept-Encoding %q", got)
	}
	// An SSE stream labelled text/plain is still a stream: the usage the
	// proxy asked for is taken out and settled.
	body := weatherBody + `,"stream":true,"max_tokens":5}`
	used := usedBeforeOn(t, f, 1000)
	w := f.send("/v1/chat/completions", "203.0.113.7:1", "application/json", body, "X-Test-Usage", "10,20", "X-Test-Type", "text/plain")
	if strings.Contains(w.Body.String(), "usage") {
		t.Fatalf("mislabelled stream: the client got the usage:\n%s", w.Body)
	}
	if got := usedBeforeOn(t, f, 1000); got-used != 30 {
		t.Fatalf("mislabelled stream settled to %d, want 30", got-used)
	}
	// A stream asked for, one JSON document answered: its usage counts.
	used = usedBeforeOn(t, f, 1000)
	f.send("/v1/chat/completions", "203.0.113.7:1", "application/json", body, "X-Test-Usage", "11,22", "X-Test-Ignore-Stream", "1")
	if got := usedBeforeOn(t, f, 1000); got-used != 33 {
		t.Fatalf("JSON answer to a stream request settled to %d, want 33", got-used)
	}
	// include_usage given as "true" or 1: the client asked; nothing is
	// added or taken out.
	for _, v := range []string{`"true"`, `1`} {
		asked := weatherBody + `,"stream":true,"max_tokens":5,"stream_options":{"include_usage":` + v + `}}`
		f.send("/v1/chat/completions", "203.0.113.7:1", "application/json", asked, "X-Test-Usage", "1,1")
		if u.last() != asked {
			t.Fatalf("include_usage %s: upstream got %s", v, u.last())
		}
	}
	// A batch reserves every member's output and keeps its reservation.
	batch := `[{"model":"gpt-4o","prompt":"a","max_tokens":100},{"model":"gpt-4o","prompt":"b","max_tokens":100}]`
	est := estimate(t, "/v1/completions", batch)
	used = usedBeforeOn(t, f, 1000)
	f.send("/v1/completions", "203.0.113.7:1", "application/json", batch, "X-Test-Usage", "1,1")
	if got := usedBeforeOn(t, f, 1000) - used; got != est+200 {
		t.Fatalf("batch charged %d, want %d", got, est+200)
	}
	// A batch sent as a form is counted as the JSON it is: over the cap.
	long := `[{"model":"gpt-4o","prompt":"` + strings.Repeat("lorem ipsum dolor ", 200) + `"}]`
	if w := f.send("/v1/completions", "203.0.113.7:1", "application/x-www-form-urlencoded", long); w.Code != 413 {
		t.Fatalf("form-encoded batch over the cap: %d %s", w.Code, w.Body)
	}
	// Over the cap: 413 from the token cap, with the token rule's state.
	w = f.send("/v1/chat/completions", "203.0.113.7:1", "application/json", `{"model":"gpt-4o","messages":[{"role":"user","content":"`+strings.Repeat("lorem ipsum ", 300)+`"}]}`)
	if w.Code != 413 || w.Header().Get("X-Ratelimit-Limit-Tokens") != "1000" {
		t.Fatalf("over the cap: %d %v", w.Code, w.Header())
	}
	// A 429 from the token rule: X-RateLimit-* describe the request rule.
	for w.Code != 429 {
		w = f.send("/v1/chat/completions", "203.0.113.7:1", "application/json", weatherBody+`,"max_tokens":400}`, "X-Test-Usage", "none", "X-Test-Hang", "")
	}
	if body429(t, w).DeniedBy != "tpm" || w.Header().Get("X-Ratelimit-Limit") != "1000" || w.Header().Get("X-Ratelimit-Remaining") != "0" ||
		w.Header().Get("X-Ratelimit-Limit-Tokens") != "1000" {
		t.Fatalf("429: %v", w.Header())
	}
	// An upgrade on a token rule's own route passes (no body to read).
	srv := httptest.NewServer(f.handler)
	defer srv.Close()
	c, err := net.Dial("tcp", srv.Listener.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	io.WriteString(c, "GET /realtime/x HTTP/1.1\r\nHost: x\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\r\n")
	c.SetReadDeadline(time.Now().Add(5 * time.Second))
	br := bufio.NewReader(c)
	line, _ := br.ReadString('\n')
	if !strings.Contains(line, "101") {
		rest := make([]byte, 2000)
		c.SetReadDeadline(time.Now().Add(time.Second))
		n, _ := io.ReadAtLeast(br, rest, 1)
		t.Fatalf("upgrade: %q %q (upstream saw %d requests, last %v)", line, rest[:n], len(u.hdrs), u.hdrs[len(u.hdrs)-1])
	}
}

// usedBeforeOn is usedBefore for a rule of the given limit: what the
// budget had used before a probe that reserves probeCost and settles to 0.
func usedBeforeOn(t *testing.T, f *fixture, limit int64) int64 {
	t.Helper()
	w := f.send("/v1/chat/completions", "203.0.113.7:1", "application/json", `{"model":"gpt-4o","messages":[],"max_tokens":1}`, "X-Test-Usage", "0,0")
	if w.Code != 200 {
		t.Fatalf("probe: %d %s", w.Code, w.Body)
	}
	return limit - header(w, "X-Ratelimit-Remaining-Tokens") - probeCost(t)
}
