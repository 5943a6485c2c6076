//go:build linux

package h1_test

import (
	"bytes"
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/ratelimit-proxy/ratelimit-proxy/upstream/h1"
)

type pusher interface {
	Push(w io.Writer, flush func() error, buf []byte) (bool, error)
}

// flushLog records what a push writes and where it flushed.
type flushLog struct {
	mu      sync.Mutex
	out     bytes.Buffer
	flushed []int // out.Len() at each flush
	failAt  int   // fail the write that would pass this many bytes (0: never)
}

func (f *flushLog) Write(p []byte) (int, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.failAt > 0 && f.out.Len()+len(p) >= f.failAt {
		return 0, errClientGone
	}
	return f.out.Write(p)
}

func (f *flushLog) flush() error {
	f.mu.Lock()
	f.flushed = append(f.flushed, f.out.Len())
	f.mu.Unlock()
	return nil
}

var errClientGone = errors.New("client gone")

// push sends a request and pushes its answer's body into f.
func push(t *testing.T, cl *h1.Client, ctx context.Context, url string, f *flushLog) (*http.Response, bool, error) {
	t.Helper()
	req, _ := http.NewRequestWithContext(ctx, "POST", url, strings.NewReader(`{"stream":true}`))
	res, err := cl.RoundTrip(req)
	if err != nil {
		t.Fatalf("POST %s: %v", url, err)
	}
	pushed, err := res.Body.(pusher).Push(f, f.flush, make([]byte, 32<<10))
	return res, pushed, err
}

const sseHead = "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n"

func event(i int) string {
	return "data: {\"n\":" + strings.Repeat("7", i+1) + "}\n\n"
}

func chunk(s string) string {
	return strconv.FormatInt(int64(len(s)), 16) + "\r\n" + s + "\r\n"
}

// TestPushStreamsEventsAsTheyCome: the events the upstream sends apart
// reach the client apart, each flushed, the first ones with the head; the
// body ends as a Read to its end would, and the connection is reused.
func TestPushStreamsEventsAsTheyCome(t *testing.T) {
	o := newRawOrigin(t, func(_ int64, c net.Conn, _ *http.Request, _ []byte) bool {
		io.WriteString(c, sseHead+chunk(event(0))+chunk(event(1)))
		for i := 2; i < 6; i++ {
			time.Sleep(5 * time.Millisecond)
			io.WriteString(c, chunk(event(i)))
		}
		io.WriteString(c, "0\r\n\r\n")
		return true
	})
	cl := o.client(h1.Options{})
	var want strings.Builder
	for i := 0; i < 6; i++ {
		want.WriteString(event(i))
	}
	for round := 0; round < 3; round++ {
		var f flushLog
		res, pushed, err := push(t, cl, context.Background(), o.url("/v1/chat/completions"), &f)
		if !pushed || err != nil {
			t.Fatalf("pushed %v, error %v", pushed, err)
		}
		if f.out.String() != want.String() {
			t.Fatalf("pushed %q, want %q", f.out.String(), want.String())
		}
		// The two events that came with the head leave together; the four
		// sent 5 ms apart leave apart (the last with the body's end, which
		// the server flushes). Under load two may come together.
		if head := len(event(0) + event(1)); len(f.flushed) < 3 || f.flushed[0] != head {
			t.Fatalf("flushed at %v: want the head's events at %d, then the later ones apart", f.flushed, head)
		}
		if b, err := io.ReadAll(res.Body); len(b) != 0 || err != nil {
			t.Fatalf("after the push, Read gives %q, %v", b, err)
		}
		res.Body.Close()
	}
	if n := o.conns.Load(); n != 1 {
		t.Fatalf("%d connections for 3 pushed streams, want 1", n)
	}
}

// TestPushEnds covers how a chunked body can end: each gives the body
// and trailers a Read gives, and keeps the connection only when the
// response ends where it should.
func TestPushEnds(t *testing.T) {
	for _, tc := range []struct {
		name    string
		writes  []string
		body    string
		trailer http.Header
		err     bool
		reuse   bool
	}{
		{name: "last chunk with the data", writes: []string{"5\r\nhello\r\n0\r\n\r\n"}, body: "hello", reuse: true},
		{name: "final CRLF later", writes: []string{"5\r\nhello\r\n0\r\n", "\r\n"}, body: "hello", reuse: true},
		{name: "last chunk split", writes: []string{"5\r\nhello\r\n0", "\r", "\n\r\n"}, body: "hello", reuse: true},
		{name: "trailer", writes: []string{"5\r\nhello\r\n0\r\nX-Usage: 7\r\n\r\n"}, body: "hello",
			trailer: http.Header{"X-Usage": {"7"}}, reuse: true},
		{name: "trailer later", writes: []string{"5\r\nhello\r\n0\r\nX-Us", "age: 7\r\n\r\n"}, body: "hello",
			trailer: http.Header{"X-Usage": {"7"}}, reuse: true},
		{name: "bytes after the end", writes: []string{"5\r\nhello\r\n0\r\n\r\nHTTP/1.1 200 OK\r\n"}, body: "hello"},
		{name: "malformed after data", writes: []string{"5\r\nhelloXY0\r\n\r\n"}, body: "hello", err: true},
		{name: "bad size", writes: []string{"5\r\nhello\r\nzz\r\n"}, body: "hello", err: true},
		{name: "cut short", writes: []string{"5\r\nhel"}, body: "hel", err: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			o := newRawOrigin(t, func(n int64, c net.Conn, _ *http.Request, _ []byte) bool {
				if n > 1 {
					return okJSON(c)
				}
				io.WriteString(c, "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTrailer: X-Usage\r\nTransfer-Encoding: chunked\r\n\r\n")
				for _, w := range tc.writes {
					time.Sleep(2 * time.Millisecond)
					io.WriteString(c, w)
				}
				return !tc.err // a cut-short answer ends with the connection
			})
			cl := o.client(h1.Options{})
			var f flushLog
			start := time.Now()
			res, pushed, err := push(t, cl, context.Background(), o.url("/"), &f)
			if !pushed {
				t.Fatal("not pushed")
			}
			// A close that came with the last bytes is signalled once, with
			// them: the push reads again within its probe period all the same.
			if d := time.Since(start); d > 2*time.Second {
				t.Fatalf("the push took %v", d)
			}
			if (err != nil) != tc.err {
				t.Fatalf("error %v, want one: %v", err, tc.err)
			}
			if f.out.String() != tc.body {
				t.Fatalf("pushed %q, want %q", f.out.String(), tc.body)
			}
			ended(t, o, cl, res, tc.trailer, tc.reuse)
		})
	}
}

// ended closes a pushed answer and checks how it ended: its trailer
// (when trailer is not nil), and the connection kept for the next answer
// (reuse) or not.
func ended(t *testing.T, o *rawOrigin, cl *h1.Client, res *http.Response, trailer http.Header, reuse bool) {
	t.Helper()
	res.Body.Close()
	if trailer != nil && !equalHeaders(res.Trailer, trailer) {
		t.Fatalf("trailer %q, want %q", res.Trailer, trailer)
	}
	if _, b := do(t, cl, "GET", o.url("/"), ""); b != `{"ok":true}` {
		t.Fatalf("next answer %q", b)
	}
	want := int64(2)
	if reuse {
		want = 1
	}
	if n := o.conns.Load(); n != want {
		t.Fatalf("%d connections, want %d", n, want)
	}
}

func equalHeaders(a, b http.Header) bool {
	if len(a) != len(b) {
		return false
	}
	for k := range a {
		if strings.Join(a[k], ",") != strings.Join(b[k], ",") {
			return false
		}
	}
	return true
}

// TestPushUntilClose: an answer without framing is pushed until the
// upstream closes, and its connection is not kept. The close comes with
// the last bytes, so it is not signalled again after they are read: the
// push notices it by reading once more within its probe period.
func TestPushUntilClose(t *testing.T) {
	o := newRawOrigin(t, func(_ int64, c net.Conn, _ *http.Request, _ []byte) bool {
		io.WriteString(c, "HTTP/1.0 200 OK\r\nContent-Type: text/event-stream\r\n\r\n"+event(0))
		time.Sleep(3 * time.Millisecond)
		io.WriteString(c, event(1))
		return false
	})
	cl := o.client(h1.Options{})
	var f flushLog
	start := time.Now()
	res, pushed, err := push(t, cl, context.Background(), o.url("/"), &f)
	if !pushed || err != nil {
		t.Fatalf("pushed %v, error %v", pushed, err)
	}
	if d := time.Since(start); d > 2*time.Second {
		t.Fatalf("the push took %v to see the upstream close", d)
	}
	res.Body.Close()
	if want := event(0) + event(1); f.out.String() != want {
		t.Fatalf("pushed %q, want %q", f.out.String(), want)
	}
	if s := cl.Stats(); s.Idle != 0 {
		t.Fatalf("%d idle connections after an answer read until close", s.Idle)
	}
}

// TestPushClientLeaves: a client that leaves mid-stream ends the push at
// once with its context's error, and the connection is closed (the
// upstream sees it leave).
func TestPushClientLeaves(t *testing.T) {
	closed := make(chan struct{})
	o := newRawOrigin(t, func(_ int64, c net.Conn, _ *http.Request, _ []byte) bool {
		io.WriteString(c, sseHead+chunk(event(0)))
		c.SetReadDeadline(time.Now().Add(10 * time.Second))
		c.Read(make([]byte, 1)) // until the proxy closes
		close(closed)
		return false
	})
	cl := o.client(h1.Options{})
	ctx, cancel := context.WithCancel(context.Background())
	time.AfterFunc(20*time.Millisecond, cancel)
	var f flushLog
	start := time.Now()
	res, pushed, err := push(t, cl, ctx, o.url("/"), &f)
	if !pushed || !errors.Is(err, context.Canceled) {
		t.Fatalf("pushed %v, error %v; want context.Canceled", pushed, err)
	}
	if d := time.Since(start); d > 2*time.Second {
		t.Fatalf("the push ended %v after the client left", d)
	}
	res.Body.Close()
	select {
	case <-closed:
	case <-time.After(5 * time.Second):
		t.Fatal("the upstream connection was not closed")
	}
}

// TestPushWriteFails: a client that cannot be written to ends the push
// with the write's error; the body ends with it (a Read after it does not
// take the framing up afresh, and hung doing so) and its connection is
// closed (the rest of the stream is never read as the next answer).
func TestPushWriteFails(t *testing.T) {
	o := newRawOrigin(t, func(n int64, c net.Conn, _ *http.Request, _ []byte) bool {
		if n > 1 {
			return okJSON(c)
		}
		io.WriteString(c, sseHead+chunk(event(0)))
		time.Sleep(3 * time.Millisecond)
		io.WriteString(c, chunk(event(1))+"0\r\n\r\n")
		return true
	})
	cl := o.client(h1.Options{})
	f := flushLog{failAt: len(event(0)) + 1}
	res, pushed, err := push(t, cl, context.Background(), o.url("/"), &f)
	if !pushed || !errors.Is(err, errClientGone) {
		t.Fatalf("pushed %v, error %v; want the write's", pushed, err)
	}
	// Its place in the framing is the push's: a Read now does not parse
	// the rest afresh.
	if n, err := res.Body.Read(make([]byte, 64)); n != 0 || err == nil || err == io.EOF {
		t.Fatalf("read after a failed push: %d, %v; want an error", n, err)
	}
	res.Body.Close()
	if _, b := do(t, cl, "GET", o.url("/"), ""); b != `{"ok":true}` {
		t.Fatalf("next answer %q", b)
	}
	if n := o.conns.Load(); n != 2 {
		t.Fatalf("%d connections, want 2: the cut stream's is not reused", n)
	}
}

// TestPushDeclinesLengthBody: a body of known length is not pushed, and
// nothing of it was read.
func TestPushDeclinesLengthBody(t *testing.T) {
	o := newRawOrigin(t, func(_ int64, c net.Conn, _ *http.Request, _ []byte) bool { return okJSON(c) })
	cl := o.client(h1.Options{})
	var f flushLog
	res, pushed, err := push(t, cl, context.Background(), o.url("/"), &f)
	if pushed || err != nil || f.out.Len() != 0 {
		t.Fatalf("pushed %v (%q), error %v; want not pushed", pushed, f.out.String(), err)
	}
	if b, _ := io.ReadAll(res.Body); string(b) != `{"ok":true}` {
		t.Fatalf("read %q after the push declined", b)
	}
	res.Body.Close()
}

// TestPushBufferSmallerThanHead: a buffer smaller than what came with the
// head still gives the whole body and trailer, and the connection is kept
// only when nothing follows the response: what the read buffer still
// holds after the last chunk's line is part of the trailer, not lost (the
// push waited on the socket for a trailer it had already read) nor left
// to be read as the next answer.
func TestPushBufferSmallerThanHead(t *testing.T) {
	const head = "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n"
	for _, tc := range []struct {
		name, body string
		trailer    http.Header
		reuse      bool
	}{
		{name: "final CRLF", body: "5\r\nhello\r\n0\r\n\r\n", reuse: true},
		{name: "trailer", body: "5\r\nhello\r\n0\r\nX-Usage: 7\r\n\r\n", trailer: http.Header{"X-Usage": {"7"}}, reuse: true},
		{name: "bytes after the end", body: "5\r\nhello\r\n0\r\n\r\nHTTP/1.1 200 OK\r\n\r\n"},
	} {
		for size := 1; size <= len(tc.body); size++ {
			t.Run(tc.name+"/"+strconv.Itoa(size), func(t *testing.T) {
				o := newRawOrigin(t, func(n int64, c net.Conn, _ *http.Request, _ []byte) bool {
					if n > 1 {
						return okJSON(c)
					}
					io.WriteString(c, head+tc.body) // all in the read buffer with the head
					return true
				})
				cl := o.client(h1.Options{})
				ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
				defer cancel()
				req, _ := http.NewRequestWithContext(ctx, "GET", o.url("/"), nil)
				res, err := cl.RoundTrip(req)
				if err != nil {
					t.Fatal(err)
				}
				var f flushLog
				pushed, err := res.Body.(pusher).Push(&f, f.flush, make([]byte, size))
				if !pushed || err != nil {
					t.Fatalf("pushed %v, error %v", pushed, err)
				}
				if f.out.String() != "hello" {
					t.Fatalf("pushed %q, want %q", f.out.String(), "hello")
				}
				ended(t, o, cl, res, tc.trailer, tc.reuse)
			})
		}
	}
}

// slowClient is a client that takes a while over each write (a slow
// reader on the far end of a fast upstream); it cancels its request once
// it has taken cancelAt bytes.
type slowClient struct {
	n        int
	cancelAt int
	cancel   func()
}

func (s *slowClient) Write(p []byte) (int, error) {
	time.Sleep(time.Millisecond)
	s.n += len(p)
	if s.n >= s.cancelAt && s.cancel != nil {
		s.cancel()
		s.cancel = nil
	}
	return len(p), nil
}

// TestPushCancelWhileUpstreamOutpaces: a request cancelled while the
// upstream sends faster than the client takes (every read fills the
// buffer, so the push never waits on the poller, where the abort's
// deadline would be seen) still ends the push at once with the context's
// error, as a Read would: the rest is not read and sent on.
func TestPushCancelWhileUpstreamOutpaces(t *testing.T) {
	const total = 8 << 20
	o := newRawOrigin(t, func(_ int64, c net.Conn, _ *http.Request, _ []byte) bool {
		c.(*net.TCPConn).SetWriteBuffer(4 << 20)
		io.WriteString(c, "HTTP/1.0 200 OK\r\nContent-Type: application/octet-stream\r\n\r\n")
		block := bytes.Repeat([]byte("x"), 256<<10)
		for sent := 0; sent < total; sent += len(block) {
			if _, err := c.Write(block); err != nil {
				break
			}
		}
		return false
	})
	// Socket buffers as large as a long fat network's, so that the
	// upstream keeps the queue full and no read comes back short.
	var d net.Dialer
	cl := o.client(h1.Options{Dial: func(ctx context.Context, network, addr string) (net.Conn, error) {
		c, err := d.DialContext(ctx, network, addr)
		if err == nil {
			c.(*net.TCPConn).SetReadBuffer(4 << 20)
		}
		return c, err
	}})
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, "GET", o.url("/"), nil)
	res, err := cl.RoundTrip(req)
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	w := &slowClient{cancelAt: 1 << 20, cancel: cancel}
	// A small buffer keeps the socket's queue from draining between reads.
	pushed, err := res.Body.(pusher).Push(w, func() error { return nil }, make([]byte, 4<<10))
	if !pushed || !errors.Is(err, context.Canceled) {
		t.Fatalf("pushed %v, error %v; want context.Canceled", pushed, err)
	}
	if w.n > 2<<20 {
		t.Fatalf("%d bytes sent on after the request was cancelled at %d", w.n-(1<<20), 1<<20)
	}
}

// TestPushDeclinesEndedBody: a body already read to its end is not pushed
// (nothing is read, as the push's contract says), so that a caller that
// then reads gets the end, not an error for a body that ended well.
func TestPushDeclinesEndedBody(t *testing.T) {
	o := newRawOrigin(t, func(_ int64, c net.Conn, _ *http.Request, _ []byte) bool {
		io.WriteString(c, sseHead+chunk(event(0))+"0\r\n\r\n")
		return true
	})
	cl := o.client(h1.Options{})
	req, _ := http.NewRequest("GET", o.url("/"), nil)
	res, err := cl.RoundTrip(req)
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	if b, err := io.ReadAll(res.Body); err != nil || string(b) != event(0) {
		t.Fatalf("read %q, %v", b, err)
	}
	var f flushLog
	pushed, err := res.Body.(pusher).Push(&f, f.flush, make([]byte, 32<<10))
	if pushed || err != nil || f.out.Len() != 0 {
		t.Fatalf("pushed %v (%q), error %v; want not pushed", pushed, f.out.String(), err)
	}
	if n, err := res.Body.Read(make([]byte, 10)); n != 0 || err != io.EOF {
		t.Fatalf("read after the end: %d, %v", n, err)
	}
}

// TestPushAfterRead: a chunked body partly read already is pushed from
// where the reads left it, or not at all: never with its framing read
// afresh from the middle of a chunk.
func TestPushAfterRead(t *testing.T) {
	o := newRawOrigin(t, func(_ int64, c net.Conn, _ *http.Request, _ []byte) bool {
		io.WriteString(c, sseHead+chunk(event(0)))
		time.Sleep(3 * time.Millisecond)
		io.WriteString(c, chunk(event(1))+"0\r\n\r\n")
		return true
	})
	cl := o.client(h1.Options{})
	req, _ := http.NewRequest("GET", o.url("/"), nil)
	res, err := cl.RoundTrip(req)
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	head := make([]byte, 5)
	if _, err := io.ReadFull(res.Body, head); err != nil {
		t.Fatal(err)
	}
	var f flushLog
	pushed, err := res.Body.(pusher).Push(&f, f.flush, make([]byte, 32<<10))
	if err != nil {
		t.Fatalf("pushed %v, error %v", pushed, err)
	}
	rest := f.out.String()
	if !pushed {
		b, err := io.ReadAll(res.Body)
		if err != nil {
			t.Fatalf("read after a declined push: %v", err)
		}
		rest = string(b)
	}
	if got, want := string(head)+rest, event(0)+event(1); got != want {
		t.Fatalf("body %q, want %q", got, want)
	}
}
