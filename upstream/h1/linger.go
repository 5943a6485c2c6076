package h1

import (
	"errors"
	"io"
	"net/http"
	"os"
	"strings"
	"time"
)

// A request whose client left (its context ended) after it was written
// whole need not cost its connection: the answer is often about to come
// (a load generator that stops, a user who closes a tab as the answer
// lands). Such a connection lingers: one goroutine reads the rest of the
// answer and discards it, then pools the connection. The linger is
// strictly bounded, because closing the connection is what tells an
// origin still working (an LLM generating) to stop, and that matters
// more than a connection:
//   - the whole answer must be in within Options.LingerGrace of the
//     client leaving (the head, then the body);
//   - the body to discard must be at most Options.LingerBytes: a declared
//     Content-Length above it, or a chunked body that runs past it,
//     closes;
//   - an event stream, a body read until the peer closes, Connection:
//     close, a 1xx or 101, an error: closes;
//   - a lingering connection is neither idle nor handed to a request, and
//     lingering connections count with the idle ones towards MaxIdle:
//     past it, the connection is closed at once.
//
// A request not written whole when the client left is closed at once: the
// origin's view of where it stands is unknown.

const (
	defaultLingerGrace = 100 * time.Millisecond
	defaultLingerBytes = 64 << 10
)

// errPartHead marks a read error after part of a long head was consumed:
// the head cannot be read again from the start.
var errPartHead = errors.New("h1: part of a long response head read")

// lingerFrom reserves a linger slot; false when the client is closed or
// the idle and lingering connections fill MaxIdle.
func (c *Client) lingerFrom() bool {
	if c.o.LingerGrace < 0 {
		return false
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed || c.lingering+len(c.idle) >= c.o.MaxIdle {
		return false
	}
	c.lingering++
	c.lingered.Add(1)
	return true
}

// lingerDone frees the slot lingerFrom took and pools or closes cn.
func (c *Client) lingerDone(cn *Conn, keep bool) {
	c.mu.Lock()
	c.lingering--
	c.mu.Unlock()
	if keep && cn.nc.SetDeadline(time.Time{}) == nil {
		c.kept.Add(1)
		c.put(cn)
		return
	}
	cn.nc.Close()
}

// detach takes the connection back from the request's watcher, whether
// or not it has aborted, and sets d as its deadline.
func (cn *Conn) detach(d time.Time) bool {
	if cn.unwatch() {
		return cn.nc.SetDeadline(d) == nil
	}
	if !cn.undoAbort() {
		return false
	}
	return cn.nc.SetDeadline(d) == nil
}

// lingerHead starts a linger for a request whose wait for its response
// head ended with err (read before any byte of the head was consumed):
// false when the connection cannot linger, and the caller closes it.
func (cn *Conn) lingerHead(method string, err error) bool {
	if cn.ctx == nil || cn.ctx.Err() == nil || cn.writeFailed || cn.closeAfter ||
		!errors.Is(err, os.ErrDeadlineExceeded) || errors.Is(err, errPartHead) {
		return false
	}
	return cn.linger(func() bool { return cn.drainAnswer(method) })
}

// lingerBody starts a linger that discards the left bytes still to come
// of a Content-Length body; false when it cannot (the caller closes).
func (cn *Conn) lingerBody(left int64) bool {
	if left > cn.c.o.LingerBytes || cn.writeFailed || cn.closeAfter {
		return false
	}
	return cn.linger(func() bool {
		_, err := cn.br.Discard(int(left))
		return err == nil
	})
}

// linger runs drain on its own goroutine under the linger deadline, then
// pools the connection when drain reports it read its answer whole.
func (cn *Conn) linger(drain func() bool) bool {
	c := cn.c
	if !c.lingerFrom() {
		return false
	}
	if !cn.detach(time.Now().Add(c.o.LingerGrace)) {
		c.lingerDone(cn, false)
		return true // closed
	}
	go func() { c.lingerDone(cn, drain()) }()
	return true
}

// drainAnswer reads and discards a whole final response; false when it
// cannot or should not be kept.
func (cn *Conn) drainAnswer(method string) bool {
	res := &http.Response{}
	b := &Body{}
	if _, err := readResponse(cn.br, method, res, b); err != nil {
		return false
	}
	if res.StatusCode < 200 || res.Close {
		return false // a 1xx or 101, or the origin closes it anyway
	}
	if res.Body == http.NoBody {
		return true
	}
	if eventStream(res) {
		return false // a stream: its end is the origin's to learn now
	}
	limit := cn.c.o.LingerBytes
	switch b.kind {
	case bodyLength:
		if b.left > limit {
			return false
		}
		_, err := cn.br.Discard(int(b.left))
		return err == nil
	case bodyChunked:
		n, err := io.CopyN(io.Discard, b, limit+1)
		return err == io.EOF && n <= limit
	}
	return false
}

// eventStream reports whether res is an event stream (SSE), which never
// lingers whatever its length.
func eventStream(res *http.Response) bool {
	ct := res.Header["Content-Type"]
	return len(ct) > 0 && strings.HasPrefix(strings.ToLower(strings.TrimSpace(ct[0])), "text/event-stream")
}
