package h1_test

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/ratelimit-proxy/ratelimit-proxy/upstream/h1"
)

// Requests sent at once by many goroutines (with one processor, so that
// they yield to each other before taking a connection) each reach the
// origin whole and get their own answer; some of their clients leave
// around the yield: those are not sent, or are sent whole, and a request
// whose client stays is never failed by another's leaving.
func TestRequestsSentTogetherIntact(t *testing.T) {
	var mismatched atomic.Int64
	o := newRawOrigin(t, func(_ int64, c net.Conn, req *http.Request, body []byte) bool {
		if string(body) != "body of "+req.URL.Path {
			mismatched.Add(1)
		}
		fmt.Fprintf(c, "HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nContent-Length: %d\r\n\r\n%s", len(body), body)
		return true
	})
	defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(1))
	cl := o.client(h1.Options{}) // made with one processor: it yields under load
	defer cl.CloseIdleConnections()
	var wg sync.WaitGroup
	var kept, sent atomic.Int64
	for g := range 32 {
		wg.Go(func() {
			for i := range 40 {
				path := fmt.Sprintf("/g%d/r%d", g, i)
				ctx, cancel := context.WithCancel(context.Background())
				leaves := (g+i)%3 == 0
				if leaves {
					go cancel()
				}
				req, _ := http.NewRequestWithContext(ctx, "POST", o.url(path), strings.NewReader("body of "+path))
				res, err := cl.RoundTrip(req)
				if err != nil {
					cancel()
					if !leaves {
						t.Errorf("%s: %v", path, err)
					}
					continue
				}
				b, err := io.ReadAll(res.Body)
				res.Body.Close()
				cancel()
				if err != nil {
					if !leaves {
						t.Errorf("%s: reading: %v", path, err)
					}
					continue
				}
				sent.Add(1)
				if !leaves {
					kept.Add(1)
				}
				if string(b) != "body of "+path {
					t.Errorf("%s: answered %q", path, b)
				}
			}
		})
	}
	wg.Wait()
	if n := mismatched.Load(); n != 0 {
		t.Errorf("the origin got %d requests whose body was not their own", n)
	}
	if kept.Load() != 32*40-(32*40+2)/3 {
		t.Errorf("%d requests whose client stayed were answered, want %d", kept.Load(), 32*40-(32*40+2)/3)
	}
	if got := o.reqs.Load(); got < sent.Load() {
		t.Errorf("the origin got %d requests, fewer than the %d answered", got, sent.Load())
	}
}
