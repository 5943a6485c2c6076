package proxy_test

import (
	"bytes"
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"

	"github.com/ratelimit-proxy/ratelimit-proxy/config"
)

// A request refused before its body was read (here a 429 on the client's
// IP) has its body drained when it is small and has all arrived: the
// connection stays usable, and the next request on it (another caller, by
// its API key) reaches the upstream byte for byte, nothing of the refused
// body in it. A body over 256 KiB, announced or chunked, is not drained:
// the answer says Connection: close and the connection ends. The whole
// request is written before the answer is read, so that it has arrived
// when the proxy drains it (the drain's deadline is not what is tested).
func TestRefusedBodyDrainedOrConnectionClosed(t *testing.T) {
	const max = 256 << 10
	for _, tc := range []struct {
		name    string
		size    int
		chunked bool
		keep    bool
	}{
		{"small", 1000, false, true},
		{"exactly 256 KiB", max, false, true},
		{"256 KiB and one byte", max + 1, false, false},
		{"chunked, small", 1000, true, true},
		{"chunked, exactly 256 KiB", max, true, true},
		{"chunked, 256 KiB and one byte", max + 1, true, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			srv, rec := capsServer(t, func(c *config.Config) { c.ChatRPM = 1 })
			// The client's IP spends its one request.
			if code, _ := post(t, srv.URL+"/api/chat", "application/json", strings.NewReader(`{"message":"warm"}`), false); code != 200 {
				t.Fatalf("warm-up: %d", code)
			}
			refused := []byte(`{"message":"` + strings.Repeat("r", tc.size-len(`{"message":""}`)) + `"}`)
			var req bytes.Buffer
			fmt.Fprintf(&req, "POST /api/chat HTTP/1.1\r\nHost: proxy.test\r\nContent-Type: application/json\r\n")
			if tc.chunked {
				req.WriteString("Transfer-Encoding: chunked\r\n\r\n")
				for b := refused; len(b) > 0; {
					n := min(len(b), 10_000)
					fmt.Fprintf(&req, "%x\r\n%s\r\n", n, b[:n])
					b = b[n:]
				}
				req.WriteString("0\r\n\r\n")
			} else {
				fmt.Fprintf(&req, "Content-Length: %d\r\n\r\n%s", len(refused), refused)
			}
			next := `{"message":"the next request"}`
			fmt.Fprintf(&req, "POST /api/chat HTTP/1.1\r\nHost: proxy.test\r\nContent-Type: application/json\r\nAuthorization: Bearer sk-next\r\nContent-Length: %d\r\n\r\n%s", len(next), next)

			rc := dialRaw(t, srv)
			sent := make(chan error, 1)
			go func() { _, err := rc.c.Write(req.Bytes()); sent <- err }()
			res := rc.response()
			if res.StatusCode != http.StatusTooManyRequests {
				t.Fatalf("the refused request: %d, want 429", res.StatusCode)
			}
			if res.Close == tc.keep {
				t.Fatalf("the 429 says Connection: close = %v, want %v (body of %d bytes, chunked %v)", res.Close, !tc.keep, len(refused), tc.chunked)
			}
			if !tc.keep {
				return // the next request is not read: the connection ends
			}
			if err := <-sent; err != nil {
				t.Fatal(err)
			}
			res = rc.response()
			if res.StatusCode != 200 {
				b, _ := io.ReadAll(res.Body)
				t.Fatalf("the next request on the connection: %d %s, want 200", res.StatusCode, b)
			}
			rec.mu.Lock()
			defer rec.mu.Unlock()
			if len(rec.bodies) != 2 || string(rec.bodies[1]) != next {
				t.Fatalf("the upstream got %d bodies, the last %.80q, want the warm-up's and %q", len(rec.bodies), rec.bodies[len(rec.bodies)-1], next)
			}
		})
	}
}

// A refused request whose body has not all arrived within the drain's
// wait is answered with Connection: close, and its answer does not wait
// for the rest of the body.
func TestRefusedSlowBodyClosesConnection(t *testing.T) {
	srv, _ := capsServer(t, func(c *config.Config) { c.ChatRPM = 1 })
	if code, _ := post(t, srv.URL+"/api/chat", "application/json", strings.NewReader(`{"message":"warm"}`), false); code != 200 {
		t.Fatalf("warm-up: %d", code)
	}
	rc := dialRaw(t, srv)
	rc.head("/api/chat", 1000)
	rc.write(`{"message":"only the start`)
	res := rc.response() // within the 5 s deadline: the rest never comes
	if res.StatusCode != http.StatusTooManyRequests || !res.Close {
		t.Fatalf("%d, Connection: close %v; want 429 and close", res.StatusCode, res.Close)
	}
}

// A refused request sent with Expect: 100-continue never sent its body:
// the answer ends the connection (the body that might follow would
// otherwise be read as the next request).
func TestRefusedExpectContinueClosesConnection(t *testing.T) {
	srv, _ := capsServer(t, func(c *config.Config) { c.ChatRPM = 1 })
	if code, _ := post(t, srv.URL+"/api/chat", "application/json", strings.NewReader(`{"message":"warm"}`), false); code != 200 {
		t.Fatalf("warm-up: %d", code)
	}
	rc := dialRaw(t, srv)
	rc.head("/api/chat", 20, "Expect: 100-continue")
	res := rc.response()
	if res.StatusCode != http.StatusTooManyRequests || !res.Close {
		t.Fatalf("%d, Connection: close %v; want 429 and close", res.StatusCode, res.Close)
	}
}
