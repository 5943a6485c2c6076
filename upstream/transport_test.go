package upstream_test

import (
	"bufio"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"testing"

	"github.com/ratelimit-proxy/ratelimit-proxy/upstream"
	"github.com/ratelimit-proxy/ratelimit-proxy/upstream/h1"
)

func TestNewTransportPerScheme(t *testing.T) {
	if _, ok := upstream.NewTransport(&url.URL{Scheme: "http", Host: "127.0.0.1:9"}, 0).(*h1.Client); !ok {
		t.Fatal("http:// upstream: not the h1 client")
	}
	if _, ok := upstream.NewTransport(&url.URL{Scheme: "https", Host: "api.example"}, 0).(*http.Transport); !ok {
		t.Fatal("https:// upstream: not net/http's transport")
	}
}

// A WebSocket upgrade on an unprotected route is tunnelled through the
// default transport of an http:// upstream (its fallback carries it).
func TestWebSocketThroughDefaultTransport(t *testing.T) {
	origin := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("Upgrade") != "websocket" {
			http.Error(w, "no upgrade", 400)
			return
		}
		c, brw, err := http.NewResponseController(w).Hijack()
		if err != nil {
			return
		}
		defer c.Close()
		io.WriteString(c, "HTTP/1.1 101 Switching Protocols\r\nConnection: Upgrade\r\nUpgrade: websocket\r\n\r\n")
		line, _ := brw.ReadString('\n')
		io.WriteString(c, "echo "+line)
	}))
	defer origin.Close()
	target, _ := url.Parse(origin.URL)
	front := httptest.NewServer(upstream.New(upstream.Options{Target: target}))
	defer front.Close()
	c, err := net.Dial("tcp", front.Listener.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	io.WriteString(c, "GET /ws HTTP/1.1\r\nHost: x\r\nConnection: Upgrade\r\nUpgrade: websocket\r\n\r\n")
	br := bufio.NewReader(c)
	res, err := http.ReadResponse(br, nil)
	if err != nil || res.StatusCode != http.StatusSwitchingProtocols {
		t.Fatalf("status %v, %v", res, err)
	}
	io.WriteString(c, "hello\n")
	if got, _ := br.ReadString('\n'); got != "echo hello\n" {
		t.Fatalf("tunnel answered %q", got)
	}
}
