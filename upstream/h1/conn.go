package h1

import (
	"bufio"
	"context"
	"errors"
	"net"
	"net/http"
	"net/http/httptrace"
	"net/textproto"
	"os"
	"runtime"
	"sync"
	"time"
)

// max1xx bounds the informational responses before the final one, as
// net/http does.
const max1xx = 5

var errTooMany1xx = errors.New("h1: too many 1xx informational responses")

// timeoutError is the response-header timeout: a net.Error whose
// Timeout() is true, so that it maps to 504.
type timeoutError struct{}

func (timeoutError) Error() string   { return "h1: timeout awaiting response headers" }
func (timeoutError) Timeout() bool   { return true }
func (timeoutError) Temporary() bool { return true }

var _ net.Error = timeoutError{}

// Conn is one connection to the origin, serving one request at a time.
type Conn struct {
	c      *Client
	nc     net.Conn
	br     *bufio.Reader
	alive  aliveCheck
	idleAt time.Time
	reused bool // taken from the pool
	proven bool // answered after a stay in the pool: the origin keeps connections

	// The request in flight. The context's cancellation is watched by a
	// context.AfterFunc (no goroutine while it is not cancelled) that
	// sets a past deadline, which ends any read or write at once.
	mu          sync.Mutex // aborted and deadline changes
	aborted     bool
	abortFn     func()
	ctx         context.Context
	stop        func() bool
	closeAfter  bool // the request asked to close
	wrote       int  // request bytes written
	writeFailed bool
	gotByte     bool // a byte of a response came
	timedOut    bool // the response-header wait ran out
}

func newConn(c *Client, nc net.Conn) *Conn {
	cn := &Conn{c: c, nc: nc, br: bufio.NewReaderSize(nc, c.o.ReadBufferSize)}
	cn.abortFn = cn.abort
	cn.alive = newAliveCheck(nc)
	return cn
}

// healthy reports whether a pooled connection can carry a request: the
// peer has not closed it and sent nothing unasked.
func (cn *Conn) healthy() bool {
	return cn.br.Buffered() == 0 && cn.alive.ok()
}

func (cn *Conn) abort() {
	cn.mu.Lock()
	cn.aborted = true
	cn.nc.SetDeadline(aLongTimeAgo)
	cn.mu.Unlock()
}

var aLongTimeAgo = time.Unix(1, 0)

// setReadDeadline sets t unless the connection was aborted (its deadline
// is then past, and stays so); false when it was.
func (cn *Conn) setReadDeadline(t time.Time) bool {
	cn.mu.Lock()
	defer cn.mu.Unlock()
	if cn.aborted {
		return false
	}
	cn.nc.SetReadDeadline(t)
	return true
}

// watch starts watching ctx for the request in flight.
func (cn *Conn) watch(ctx context.Context) {
	cn.wrote, cn.writeFailed, cn.gotByte, cn.timedOut = 0, false, false, false
	if ctx.Done() == nil {
		return
	}
	cn.ctx = ctx
	cn.stop = context.AfterFunc(ctx, cn.abortFn)
}

// unwatch stops watching; false when the watcher already aborted the
// connection.
func (cn *Conn) unwatch() bool {
	ok := true
	if cn.stop != nil {
		ok = cn.stop()
		cn.stop, cn.ctx = nil, nil
	}
	cn.mu.Lock()
	ok = ok && !cn.aborted
	cn.mu.Unlock()
	return ok
}

// readErr is the error a read ended with, as the caller should see it:
// the context's when it was cancelled, the response-header timeout when
// head and the deadline passed.
func (cn *Conn) readErr(err error, head bool) error {
	if cn.ctx != nil && cn.ctx.Err() != nil {
		return cn.ctx.Err()
	}
	if head && errors.Is(err, os.ErrDeadlineExceeded) {
		cn.timedOut = true
		return timeoutError{}
	}
	return err
}

// release ends the request in flight: the connection goes back to the
// pool when reuse, or is closed.
func (cn *Conn) release(reuse bool) {
	watched := cn.unwatch()
	if reuse && !cn.closeAfter && (watched || cn.undoAbort()) {
		cn.c.put(cn)
		return
	}
	cn.nc.Close()
}

// undoAbort makes a connection whose request was cancelled usable again,
// once its response has been read to the end all the same (it was in the
// read buffer already): a client that leaves after the upstream answered
// costs no upstream connection. The abort has started (the watch could not
// be stopped): wait for it to set its deadline, then clear the deadline.
func (cn *Conn) undoAbort() bool {
	for {
		cn.mu.Lock()
		if cn.aborted {
			break
		}
		cn.mu.Unlock()
		runtime.Gosched()
	}
	defer cn.mu.Unlock()
	cn.aborted = false
	return cn.nc.SetDeadline(time.Time{}) == nil
}

// Close closes the connection.
func (cn *Conn) Close() error {
	cn.unwatch()
	return cn.nc.Close()
}

func (cn *Conn) roundTrip(req *http.Request, out *outgoing) (*http.Response, error) {
	cn.watch(req.Context())
	cn.closeAfter = req.Close || containsToken(req.Header["Connection"], "close")
	if err := cn.send(out); err != nil {
		cn.Close()
		return nil, err
	}
	return cn.ReadResponse(req)
}

// WriteRequest writes req on the connection: its head and, when its
// length is known and small, its body in one write. The connection
// watches req's context until the response's body ends.
func (cn *Conn) WriteRequest(req *http.Request) error {
	out, err := prepare(req)
	if err != nil {
		return err
	}
	defer out.free()
	cn.watch(req.Context())
	cn.closeAfter = req.Close || containsToken(req.Header["Connection"], "close")
	return cn.send(out)
}

func (cn *Conn) send(out *outgoing) error {
	if err := out.writeTo(cn); err != nil {
		cn.writeFailed = true
		if cn.ctx != nil && cn.ctx.Err() != nil {
			return cn.ctx.Err()
		}
		return err
	}
	return nil
}

// Write implements io.Writer for outgoing, counting what was sent.
func (cn *Conn) Write(p []byte) (int, error) {
	n, err := cn.nc.Write(p)
	cn.wrote += n
	return n, err
}

// ReadResponse reads the response to req: informational responses are
// passed to req's httptrace.ClientTrace.Got1xxResponse and skipped, a
// 101 ends the connection. The Body releases the connection when read to
// the end or closed; a response without a body releases it now.
func (cn *Conn) ReadResponse(req *http.Request) (*http.Response, error) {
	if t := cn.c.o.ResponseHeaderTimeout; t > 0 {
		cn.setReadDeadline(time.Now().Add(t))
	}
	for n1xx := 0; ; {
		res := &http.Response{Request: req}
		b := &Body{cn: cn}
		got, err := readResponse(cn.br, req.Method, res, b)
		if err != nil {
			cn.gotByte = cn.gotByte || got
			rerr := cn.readErr(err, true)
			if !cn.lingerHead(req.Method, err) {
				cn.Close()
			}
			return nil, rerr
		}
		cn.gotByte = true
		code := res.StatusCode
		if code >= 100 && code <= 199 && code != http.StatusSwitchingProtocols {
			if n1xx++; n1xx > max1xx {
				cn.Close()
				return nil, errTooMany1xx
			}
			if trace := httptrace.ContextClientTrace(req.Context()); trace != nil && trace.Got1xxResponse != nil {
				if err := trace.Got1xxResponse(code, textproto.MIMEHeader(res.Header)); err != nil {
					cn.Close()
					return nil, err
				}
			}
			continue
		}
		if code < 100 {
			cn.Close()
			return nil, errMalformed
		}
		if cn.c.o.ResponseHeaderTimeout > 0 {
			cn.setReadDeadline(time.Time{})
		}
		if code == http.StatusSwitchingProtocols {
			// Upgrades go to the fallback; a 101 here was not asked for.
			res.Body = http.NoBody
			cn.Close()
			return res, nil
		}
		if res.Body == http.NoBody {
			cn.release(!res.Close)
		}
		return res, nil
	}
}
