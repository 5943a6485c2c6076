package h1_test

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"runtime"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ratelimit-proxy/ratelimit-proxy/upstream/h1"
)

// leave sends a request whose context ends as soon as the origin has it
// whole (got receives), as a client that leaves while its answer is being
// prepared; it returns the round trip's error and when the context ended.
func leave(t *testing.T, cl *h1.Client, got <-chan struct{}, method, url string, body io.Reader) (error, time.Time) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, method, url, body)
	done := make(chan error, 1)
	go func() {
		res, err := cl.RoundTrip(req)
		if err == nil {
			res.Body.Close()
			err = fmt.Errorf("answered %d before the client left", res.StatusCode)
		}
		done <- err
	}()
	select {
	case <-got:
	case <-time.After(5 * time.Second):
		t.Fatal("the origin did not get the request")
	}
	cancel()
	at := time.Now()
	select {
	case err := <-done:
		return err, at
	case <-time.After(5 * time.Second):
		t.Fatal("the round trip did not end when the client left")
	}
	return nil, at
}

// settled waits until no connection lingers.
func settled(t *testing.T, cl *h1.Client) h1.Stats {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for {
		s := cl.Stats()
		if s.Lingering == 0 {
			return s
		}
		if time.Now().After(deadline) {
			t.Fatalf("still %d lingering after 5 s", s.Lingering)
		}
		time.Sleep(time.Millisecond)
	}
}

// TestClientLeavesBeforeAnswerKeepsConnection: the answer comes a few ms
// after the client left: the connection lingers, reads it and is reused;
// no goroutine is left behind.
func TestClientLeavesBeforeAnswerKeepsConnection(t *testing.T) {
	got := make(chan struct{}, 1)
	o := newRawOrigin(t, func(_ int64, c net.Conn, r *http.Request, _ []byte) bool {
		if r.URL.Path == "/slow" {
			got <- struct{}{}
			time.Sleep(5 * time.Millisecond)
		}
		return okJSON(c)
	})
	cl := o.client(h1.Options{})
	do(t, cl, "GET", o.url("/"), "") // the origin's connection goroutine exists
	base := runtime.NumGoroutine()
	const n = 20
	for range n {
		if err, _ := leave(t, cl, got, "POST", o.url("/slow"), strings.NewReader(`{"model":"x"}`)); err != context.Canceled {
			t.Fatalf("error %v, want context.Canceled", err)
		}
		settled(t, cl)
	}
	if _, b := do(t, cl, "GET", o.url("/"), ""); b != `{"ok":true}` {
		t.Fatalf("body %q after the lingers", b)
	}
	if c := o.conns.Load(); c != 1 {
		t.Fatalf("%d connections for %d requests whose client left before the answer, want 1", c, n)
	}
	if s := cl.Stats(); s.Lingered != n || s.Kept != n {
		t.Fatalf("lingered %d, kept %d, want %d and %d", s.Lingered, s.Kept, n, n)
	}
	deadline := time.Now().Add(5 * time.Second)
	for runtime.NumGoroutine() > base {
		if time.Now().After(deadline) {
			t.Fatalf("%d goroutines, %d before the lingers", runtime.NumGoroutine(), base)
		}
		time.Sleep(time.Millisecond)
	}
}

// TestLingeringConnectionNotHandedOut: while a connection lingers, a new
// request gets another one, and neither reads the other's answer.
func TestLingeringConnectionNotHandedOut(t *testing.T) {
	got := make(chan struct{}, 1)
	o := newRawOrigin(t, func(_ int64, c net.Conn, r *http.Request, _ []byte) bool {
		if r.URL.Path == "/slow" {
			got <- struct{}{}
			time.Sleep(50 * time.Millisecond)
			io.WriteString(c, "HTTP/1.1 200 OK\r\nContent-Length: 4\r\n\r\nslow")
			return true
		}
		io.WriteString(c, "HTTP/1.1 200 OK\r\nContent-Length: 4\r\n\r\nfast")
		return true
	})
	cl := o.client(h1.Options{LingerGrace: time.Second})
	do(t, cl, "GET", o.url("/"), "")
	leave(t, cl, got, "GET", o.url("/slow"), nil)
	if s := cl.Stats(); s.Lingering != 1 {
		t.Fatalf("%d lingering, want 1", s.Lingering)
	}
	if _, b := do(t, cl, "GET", o.url("/"), ""); b != "fast" {
		t.Fatalf("body %q during the linger, want fast", b)
	}
	if c := o.conns.Load(); c != 2 {
		t.Fatalf("%d connections, want 2: the lingering one is not handed out", c)
	}
	settled(t, cl)
	for range 3 {
		if _, b := do(t, cl, "GET", o.url("/"), ""); b != "fast" {
			t.Fatalf("body %q after the linger, want fast", b)
		}
	}
	if s := cl.Stats(); s.Kept != 1 || s.Idle != 2 || o.conns.Load() != 2 {
		t.Fatalf("kept %d, idle %d, connections %d; want 1, 2, 2", s.Kept, s.Idle, o.conns.Load())
	}
}

// TestLingerPastGraceCloses: an origin still working past the grace (an
// LLM generating) sees its connection closed within the grace.
func TestLingerPastGraceCloses(t *testing.T) {
	const grace = 100 * time.Millisecond
	got := make(chan struct{}, 1)
	closedAt := make(chan time.Time, 1)
	o := newRawOrigin(t, func(_ int64, c net.Conn, _ *http.Request, _ []byte) bool {
		got <- struct{}{}
		c.SetReadDeadline(time.Now().Add(10 * time.Second))
		c.Read(make([]byte, 1)) // "generating" until the proxy hangs up
		closedAt <- time.Now()
		return false
	})
	cl := o.client(h1.Options{LingerGrace: grace})
	_, left := leave(t, cl, got, "POST", o.url("/"), strings.NewReader("x"))
	at := <-closedAt
	if d := at.Sub(left); d < grace-10*time.Millisecond || d > grace+400*time.Millisecond {
		t.Fatalf("the origin saw its connection closed %v after the client left, want about %v", d, grace)
	}
	if s := settled(t, cl); s.Lingered != 1 || s.Kept != 0 || s.Idle != 0 {
		t.Fatalf("stats %+v, want one linger, nothing kept", s)
	}
}

// TestNoLingerCloses: without a linger the connection is closed as the
// client leaves.
func TestNoLingerCloses(t *testing.T) {
	got := make(chan struct{}, 1)
	closedAt := make(chan time.Time, 1)
	o := newRawOrigin(t, func(_ int64, c net.Conn, _ *http.Request, _ []byte) bool {
		got <- struct{}{}
		c.SetReadDeadline(time.Now().Add(10 * time.Second))
		c.Read(make([]byte, 1))
		closedAt <- time.Now()
		return false
	})
	cl := o.client(h1.Options{LingerGrace: -1})
	_, left := leave(t, cl, got, "POST", o.url("/"), strings.NewReader("x"))
	if d := (<-closedAt).Sub(left); d > 300*time.Millisecond {
		t.Fatalf("the origin saw its connection closed %v after the client left", d)
	}
	if s := cl.Stats(); s.Lingered != 0 {
		t.Fatalf("%d lingered with LingerGrace < 0", s.Lingered)
	}
}

// TestLingerClosesOnAnswersNotToKeep: answers that come within the grace
// but are too large, a stream, or end the connection are not kept.
func TestLingerClosesOnAnswersNotToKeep(t *testing.T) {
	big := strings.Repeat("x", 100<<10)
	cases := []struct {
		name, answer string
		keep         bool
	}{
		{"small chunked", "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n400\r\n" + strings.Repeat("y", 1024) + "\r\n0\r\n\r\n", true},
		{"no body", "HTTP/1.1 204 No Content\r\n\r\n", true},
		{"declared too large", fmt.Sprintf("HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n%s", len(big), big), false},
		{"chunked too large", fmt.Sprintf("HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n%x\r\n%s\r\n0\r\n\r\n", len(big), big), false},
		{"connection close", "HTTP/1.1 200 OK\r\nConnection: close\r\nContent-Length: 2\r\n\r\nok", false},
		{"until close", "HTTP/1.1 200 OK\r\n\r\nok", false},
		{"event stream", "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n6\r\ndata:1\r\n0\r\n\r\n", false},
		{"informational", "HTTP/1.1 102 Processing\r\n\r\nHTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok", false},
		{"malformed", "HTTP/1.1 2x0 OK\r\nContent-Length: 2\r\n\r\nok", false},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			got := make(chan struct{}, 1)
			o := newRawOrigin(t, func(_ int64, c net.Conn, r *http.Request, _ []byte) bool {
				if r.URL.Path == "/slow" {
					got <- struct{}{}
					time.Sleep(5 * time.Millisecond)
					io.WriteString(c, tc.answer)
					return true
				}
				return okJSON(c)
			})
			cl := o.client(h1.Options{LingerGrace: time.Second})
			leave(t, cl, got, "POST", o.url("/slow"), strings.NewReader("x"))
			s := settled(t, cl)
			do(t, cl, "GET", o.url("/"), "")
			want := int64(2)
			if tc.keep {
				want = 1
			}
			if s.Lingered != 1 || (s.Kept == 1) != tc.keep || o.conns.Load() != want {
				t.Fatalf("lingered %d, kept %d, %d connections; want keep=%v", s.Lingered, s.Kept, o.conns.Load(), tc.keep)
			}
		})
	}
}

// TestRequestNotWrittenWholeCloses: a client that leaves while its body is
// still on its way costs the connection, which is never lingered on.
func TestRequestNotWrittenWholeCloses(t *testing.T) {
	var reqs atomic.Int64
	o := newRawOrigin(t, func(_ int64, c net.Conn, r *http.Request, _ []byte) bool {
		if r.Method == "GET" {
			reqs.Add(1)
		}
		return okJSON(c) // the cut POST gets an answer nobody reads
	})
	cl := o.client(h1.Options{LingerGrace: time.Second})
	do(t, cl, "GET", o.url("/"), "")
	ctx, cancel := context.WithCancel(context.Background())
	pr, pw := io.Pipe()
	req, _ := http.NewRequestWithContext(ctx, "POST", o.url("/"), pr)
	done := make(chan error, 1)
	go func() {
		_, err := cl.RoundTrip(req)
		done <- err
	}()
	pw.Write([]byte(`{"model":`)) // part of the body is read (and sent)
	cancel()
	pw.CloseWithError(context.Canceled) // as the server does to a body whose client left
	if err := <-done; err == nil {
		t.Fatal("no error for a request whose client left midway")
	}
	s := settled(t, cl)
	do(t, cl, "GET", o.url("/"), "")
	if s.Lingered != 0 || o.conns.Load() != 2 || reqs.Load() != 2 {
		t.Fatalf("lingered %d, %d connections, %d GETs served; want 0, 2, 2", s.Lingered, o.conns.Load(), reqs.Load())
	}
}

// TestLingerBodyMidway: a client that leaves while a small Content-Length
// body is still coming keeps the connection; one that leaves a stream
// (chunked, or an event stream even of declared length) closes it at once.
func TestLingerBodyMidway(t *testing.T) {
	heads := map[string]string{
		"length":       "HTTP/1.1 200 OK\r\nContent-Length: 6\r\n\r\nabc",
		"chunked":      "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n",
		"event-stream": "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nContent-Length: 6\r\n\r\nabc",
	}
	for name, head := range heads {
		t.Run(name, func(t *testing.T) {
			keep := name == "length"
			closed := make(chan struct{}, 1)
			o := newRawOrigin(t, func(_ int64, c net.Conn, r *http.Request, _ []byte) bool {
				if r.URL.Path != "/part" {
					return okJSON(c)
				}
				io.WriteString(c, head)
				time.Sleep(30 * time.Millisecond)
				if !keep {
					c.SetReadDeadline(time.Now().Add(10 * time.Second))
					c.Read(make([]byte, 1))
					closed <- struct{}{}
					return false
				}
				io.WriteString(c, "def")
				return true
			})
			cl := o.client(h1.Options{LingerGrace: time.Second})
			ctx, cancel := context.WithCancel(context.Background())
			req, _ := http.NewRequestWithContext(ctx, "GET", o.url("/part"), nil)
			res, err := cl.RoundTrip(req)
			if err != nil {
				t.Fatal(err)
			}
			buf := make([]byte, 3)
			if _, err := io.ReadFull(res.Body, buf); err != nil {
				t.Fatal(err)
			}
			go func() {
				time.Sleep(5 * time.Millisecond)
				cancel()
			}()
			_, err = io.ReadAll(res.Body)
			res.Body.Close()
			if err != context.Canceled {
				t.Fatalf("read error %v, want context.Canceled", err)
			}
			if !keep {
				select {
				case <-closed:
				case <-time.After(time.Second):
					t.Fatal("a stream whose client left was not closed")
				}
			}
			s := settled(t, cl)
			do(t, cl, "GET", o.url("/"), "")
			if !keep && (s.Lingered != 0 || o.conns.Load() != 2) ||
				keep && (s.Kept != 1 || o.conns.Load() != 1) {
				t.Fatalf("stats %+v, %d connections", s, o.conns.Load())
			}
		})
	}
}

// TestLingerBoundedByPool: lingering connections count with the idle ones
// towards MaxIdle; past it, a connection whose client left is closed.
func TestLingerBoundedByPool(t *testing.T) {
	release := make(chan struct{})
	got := make(chan struct{}, 4)
	o := newRawOrigin(t, func(_ int64, c net.Conn, _ *http.Request, _ []byte) bool {
		got <- struct{}{}
		<-release
		return okJSON(c)
	})
	cl := o.client(h1.Options{MaxIdle: 2, LingerGrace: 5 * time.Second})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 4)
	for range 4 {
		go func() {
			req, _ := http.NewRequestWithContext(ctx, "GET", o.url("/"), nil)
			_, err := cl.RoundTrip(req)
			done <- err
		}()
	}
	for range 4 {
		<-got
	}
	cancel()
	for range 4 {
		<-done
	}
	if s := cl.Stats(); s.Lingering != 2 || s.Lingered != 2 {
		t.Fatalf("stats %+v, want 2 lingering (MaxIdle)", s)
	}
	close(release)
	if s := settled(t, cl); s.Kept != 2 || s.Idle != 2 {
		t.Fatalf("stats %+v, want 2 kept and idle", s)
	}
}
