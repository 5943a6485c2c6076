package upstream_test

import (
	"bufio"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ratelimit-proxy/ratelimit-proxy/upstream"
)

// TestClientGoneBeforeAnswerKeepsUpstreamConnection: clients that close
// their connection while the upstream prepares its answer (a load
// generator that stops) cost no upstream connection when the answer comes
// a few ms later; one that waits for a slow (generating) upstream has its
// upstream connection closed soon after it leaves.
func TestClientGoneBeforeAnswerKeepsUpstreamConnection(t *testing.T) {
	var conns atomic.Int64
	got := make(chan struct{}, 1)
	gone := make(chan time.Duration, 1)
	origin := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.Copy(io.Discard, r.Body)
		switch r.URL.Path {
		case "/v1/chat/completions":
			got <- struct{}{}
			time.Sleep(5 * time.Millisecond)
			w.Header().Set("Content-Type", "application/json")
			io.WriteString(w, `{"choices":[]}`)
		case "/generate":
			got <- struct{}{}
			start := time.Now()
			select {
			case <-r.Context().Done():
				gone <- time.Since(start)
			case <-time.After(10 * time.Second):
			}
		default:
			io.WriteString(w, "ok")
		}
	}))
	origin.Config.ConnState = func(_ net.Conn, s http.ConnState) {
		if s == http.StateNew {
			conns.Add(1)
		}
	}
	origin.Start()
	defer origin.Close()
	target, _ := url.Parse(origin.URL)
	front := httptest.NewServer(upstream.New(upstream.Options{Target: target}))
	defer front.Close()

	leave := func(path string) {
		c, err := net.Dial("tcp", front.Listener.Addr().String())
		if err != nil {
			t.Fatal(err)
		}
		body := `{"model":"m","messages":[]}`
		io.WriteString(c, "POST "+path+" HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: "+
			strconv.Itoa(len(body))+"\r\n\r\n"+body)
		select {
		case <-got:
		case <-time.After(5 * time.Second):
			t.Fatal("the upstream never got the request")
		}
		c.Close()
	}
	get := func() {
		res, err := http.Get(front.URL + "/")
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(bufio.NewReader(res.Body))
		res.Body.Close()
		if string(b) != "ok" {
			t.Fatalf("body %q", b)
		}
	}
	get()
	for range 10 {
		leave("/v1/chat/completions")
		time.Sleep(50 * time.Millisecond) // the answer came (5 ms), the linger ended
		get()
	}
	if n := conns.Load(); n != 1 {
		t.Fatalf("%d upstream connections for 11 requests, 10 of whose clients left before the answer, want 1", n)
	}

	leave("/generate")
	select {
	case d := <-gone:
		if d > 2*time.Second {
			t.Fatalf("the upstream saw the client leave after %v", d)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("the upstream never saw the client leave")
	}
}
