package proxy_test

import (
	"bufio"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"
)

// A caller refused before its body is read gets the 429 at once, even when
// it has sent only part of the body it announced.
func TestEarlyRefusalDoesNotWaitForTheBody(t *testing.T) {
	f := newFixture(t, rpm(0))
	srv := httptest.NewServer(f.handler)
	defer srv.Close()
	conn, err := net.Dial("tcp", srv.Listener.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	io.WriteString(conn, "POST /api/chat HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 100000\r\n\r\n{\"message\":\"")
	conn.SetReadDeadline(time.Now().Add(3 * time.Second))
	resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
	if err != nil {
		t.Fatalf("no answer while the body is unsent: %v", err)
	}
	if resp.StatusCode != 429 {
		t.Fatalf("%d %v", resp.StatusCode, resp.Header)
	}
}

// Header and query key parts in disguise: the _ spelling of a header is
// the header; a header or query parameter that could be read two ways is
// refused; credentials in a key are hashed.
func TestHeaderAndQueryKeyDisguises(t *testing.T) {
	f := newFixture(t, rules(t, `
[[rule]]
name  = "per-env"
key   = ["header:X-Env"]
limit = 1
[[rule]]
name  = "per-tenant"
key   = ["query:tenant"]
limit = 1
[[rule]]
name  = "per-token"
key   = ["header:Authorization"]
limit = 1
`))
	send := func(path string, hdr ...string) *httptest.ResponseRecorder {
		return f.request(http.MethodPost, path, "203.0.113.7:1", `{}`, hdr...)
	}
	if w := send("/api/chat", "X-Env", "prod"); w.Code != 200 {
		t.Fatalf("first: %d %s", w.Code, w.Body)
	}
	if w := send("/api/chat", "X_env", "prod"); w.Code != 429 || body429(t, w).DeniedBy != "per-env" {
		t.Fatalf("underscore spelling: %d %s", w.Code, w.Body)
	}
	if w := send("/api/chat", "X-Env", "test", "X-Env", "prod"); w.Code != 400 || !strings.Contains(w.Body.String(), "given twice") {
		t.Fatalf("two values: %d %s", w.Code, w.Body)
	}
	if w := send("/api/chat?tenant=t1"); w.Code != 200 {
		t.Fatalf("tenant: %d %s", w.Code, w.Body)
	}
	for _, q := range []string{"?tenant=t1;x=1", "?%74enant=t1", "?x=1&tenant=t1"} {
		if w := send("/api/chat" + q); w.Code != 429 || body429(t, w).DeniedBy != "per-tenant" {
			t.Fatalf("%s: %d %s", q, w.Code, w.Body)
		}
	}
	if w := send("/api/chat?tenant=t9&tenant=t1"); w.Code != 400 || !strings.Contains(w.Body.String(), "duplicate query parameter") {
		t.Fatalf("duplicate tenant: %d %s", w.Code, w.Body)
	}
	send("/api/chat", "Authorization", "Bearer sk-secret")
	w := send("/api/chat", "Authorization", "Bearer sk-secret")
	if b := body429(t, w); w.Code != 429 || strings.Contains(w.Body.String(), "sk-secret") || len(b.DeniedKey) != len("header:Authorization=")+16 {
		t.Fatalf("credential in a key: %d %s", w.Code, w.Body)
	}
}

// A method key part with an override naming another method is ambiguous.
func TestMethodKeyWithOverride(t *testing.T) {
	f := newFixture(t, rules(t, `
[[rule]]
name    = "per-method"
methods = ["*"]
key     = ["ip", "method"]
limit   = 1
`))
	if w := f.send("/api/chat", "203.0.113.7:1", "", `{}`); w.Code != 200 {
		t.Fatalf("first: %d", w.Code)
	}
	w := f.send("/api/chat", "203.0.113.7:1", "", `{}`, "X-HTTP-Method-Override", "GET")
	if w.Code != 400 || !strings.Contains(w.Body.String(), "names GET") {
		t.Fatalf("override: %d %s", w.Code, w.Body)
	}
	if w := f.send("/api/chat", "203.0.113.7:1", "", `{}`, "X-HTTP-Method-Override", "post"); w.Code != 429 {
		t.Fatalf("an override naming the same method: %d %s", w.Code, w.Body)
	}
}
