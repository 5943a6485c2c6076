// Package h1 is an HTTP/1.1 client towards one trusted origin: a LIFO
// pool of kept-alive connections, a request written with its in-memory
// body in one write, and a response head parsed straight from the
// connection's read buffer. Client is an http.RoundTripper; Conn and Body
// are the layer below it (write a request, read a response head, read a
// body that tells what is already buffered) for callers that do not go
// through http.Request/Response.
//
// What it does not carry itself (protocol upgrades, requests with
// trailers, CONNECT, another scheme or host) goes to Options.Fallback.
package h1

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"runtime"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/ratelimit-proxy/ratelimit-proxy/internal/quiet"
)

// Options configures New.
type Options struct {
	// Host is the origin's host[:port] as in its URL; port 80 when none.
	Host string
	// DialTimeout bounds a connect; 10 s when 0.
	DialTimeout time.Duration
	// ResponseHeaderTimeout bounds the wait from the request's write to
	// the end of the response head (a net.Error with Timeout() past it);
	// 0: no bound. A body, once started, is never cut.
	ResponseHeaderTimeout time.Duration
	// MaxIdle bounds the idle pool; 1024 when 0.
	MaxIdle int
	// IdleTimeout closes a connection idle that long; 90 s when 0.
	IdleTimeout time.Duration
	// ReadBufferSize is each connection's read buffer; 16 KiB when 0.
	ReadBufferSize int
	// LingerGrace bounds how long a connection whose client left (the
	// request's context ended after it was written whole) waits for the
	// rest of its answer before it is closed; 100 ms when 0, no linger
	// when negative. See linger.go.
	LingerGrace time.Duration
	// LingerBytes bounds the body a lingering connection reads and
	// discards; 64 KiB when 0.
	LingerBytes int64
	// Fallback carries the requests this client does not: upgrades
	// (which need a 101 with a writable body), requests with trailers,
	// CONNECT, and any other scheme or host. nil: they fail.
	Fallback http.RoundTripper
	// Dial replaces net.Dialer (tests).
	Dial func(ctx context.Context, network, addr string) (net.Conn, error)
}

// Client is an http.RoundTripper towards one origin.
type Client struct {
	o    Options
	addr string

	mu     sync.Mutex
	idle   []*Conn // LIFO: the most recently used on top
	sweep  *time.Timer
	closed bool
	// lingering counts the connections draining an answer whose client
	// left; with idle, they are bounded by MaxIdle.
	lingering int

	dials    atomic.Int64
	peeks    atomic.Int64
	lingered atomic.Int64
	kept     atomic.Int64

	// procs is GOMAXPROCS when the client was made; with one, inFlight
	// counts the round trips under way (until their answer's head is
	// read). See RoundTrip's yield.
	inFlight atomic.Int64
	procs    int64
}

var _ http.RoundTripper = (*Client)(nil)

// New returns a client for o.
func New(o Options) *Client {
	if o.DialTimeout <= 0 {
		o.DialTimeout = 10 * time.Second
	}
	if o.MaxIdle <= 0 {
		o.MaxIdle = 1024
	}
	if o.IdleTimeout <= 0 {
		o.IdleTimeout = 90 * time.Second
	}
	if o.ReadBufferSize <= 0 {
		o.ReadBufferSize = 16 << 10
	}
	if o.LingerGrace == 0 {
		o.LingerGrace = defaultLingerGrace
	}
	if o.LingerBytes <= 0 {
		o.LingerBytes = defaultLingerBytes
	}
	if o.Dial == nil {
		d := &net.Dialer{Timeout: o.DialTimeout, KeepAlive: 30 * time.Second}
		o.Dial = d.DialContext
	}
	addr := o.Host
	if _, _, err := net.SplitHostPort(addr); err != nil {
		addr = net.JoinHostPort(trimBrackets(addr), "80")
	}
	return &Client{o: o, addr: addr, procs: int64(runtime.GOMAXPROCS(0))}
}

func trimBrackets(h string) string {
	if len(h) > 1 && h[0] == '[' && h[len(h)-1] == ']' {
		return h[1 : len(h)-1]
	}
	return h
}

// Stats are counts for tests and metrics.
type Stats struct {
	Dials int64 // connections opened so far
	Peeks int64 // liveness peeks at pooled connections taken
	Idle  int   // connections in the pool now
	// Lingering connections are reading the rest of an answer whose
	// client left, now; Lingered is how many did so far, Kept how many of
	// those went back to the pool.
	Lingering int
	Lingered  int64
	Kept      int64
}

// Stats returns the client's counts.
func (c *Client) Stats() Stats {
	c.mu.Lock()
	defer c.mu.Unlock()
	return Stats{Dials: c.dials.Load(), Peeks: c.peeks.Load(), Idle: len(c.idle),
		Lingering: c.lingering, Lingered: c.lingered.Load(), Kept: c.kept.Load()}
}

// CloseIdleConnections closes the pooled connections; those in use are
// closed when their response ends.
func (c *Client) CloseIdleConnections() {
	c.mu.Lock()
	idle := c.idle
	c.idle = nil
	c.mu.Unlock()
	for _, cn := range idle {
		cn.nc.Close()
	}
	if f, ok := c.o.Fallback.(interface{ CloseIdleConnections() }); ok {
		f.CloseIdleConnections()
	}
}

// carries reports whether the client sends req itself.
func (c *Client) carries(req *http.Request) bool {
	if req.URL == nil || req.URL.Scheme != "http" || req.URL.Host != c.o.Host || req.Method == http.MethodConnect ||
		len(req.Trailer) > 0 {
		return false
	}
	if _, up := req.Header["Upgrade"]; up {
		return false
	}
	return !containsToken(req.Header["Connection"], "upgrade")
}

// RoundTrip implements http.RoundTripper.
//
// A request that failed on a pooled connection is sent again, once, on a
// new connection when the origin cannot have acted on it:
//   - the write failed before a byte of it was sent (any method; its body
//     is still whole), or
//   - the connection ended (EOF or reset) before a byte of a response
//     came, and the request is idempotent as net/http counts it (GET,
//     HEAD, OPTIONS, TRACE, or an Idempotency-Key or X-Idempotency-Key
//     header) and its body, if any, was sent whole from memory.
//
// A POST whose bytes were written is never sent twice: the origin may
// have received it before the connection ended. A failure on a new
// connection is never retried (the origin did not close an idle one).
func (c *Client) RoundTrip(req *http.Request) (*http.Response, error) {
	if !c.carries(req) {
		if c.o.Fallback == nil {
			closeBody(req)
			return nil, fmt.Errorf("h1: cannot send %s %s (no fallback)", req.Method, req.URL)
		}
		return c.o.Fallback.RoundTrip(req)
	}
	ctx := req.Context()
	out, err := prepare(req)
	if err != nil {
		closeBody(req)
		return nil, err
	}
	defer out.free()
	// With one processor and another round trip under way, yield it
	// first: the requests whose guards ran in the same scheduling round
	// then leave together at its end, and an event-loop upstream reads a
	// handful per wakeup instead of waking for each, as behind nginx
	// (upstream wakeups per request 0.95 → 0.1, its CPU 1.2–1.33× → about
	// 1.05× of behind nginx: docs/performance.md). With more processors a
	// yield wakes an idle one, which costs the proxy more than the
	// upstream saves, so the request leaves at once, as a lone one does.
	// The yield comes before a connection is taken, so that a client that
	// left meanwhile costs none (the context is checked below).
	if c.procs == 1 {
		if c.inFlight.Add(1) > 1 {
			runtime.Gosched()
		}
		defer c.inFlight.Add(-1)
	}
	for attempt := 0; ; attempt++ {
		if err := ctx.Err(); err != nil {
			closeBody(req)
			return nil, err
		}
		cn, err := c.get(ctx, attempt > 0)
		if err != nil {
			closeBody(req)
			return nil, err
		}
		reused := cn.reused // cn may be lingering, then pooled, once roundTrip fails
		res, err := cn.roundTrip(req, out)
		if err == nil {
			if out.body != nil {
				closeBody(req) // net/http closes the request body once sent
			}
			return res, nil
		}
		if attempt == 0 && reused && retryable(req, out, cn, err) {
			continue
		}
		closeBody(req)
		return nil, err
	}
}

func closeBody(req *http.Request) {
	if req.Body != nil {
		req.Body.Close()
	}
}

// retryable applies RoundTrip's rule to a failed attempt on a pooled
// connection. It reads cn only when the request's context has not ended:
// otherwise cn may be lingering (linger.go).
func retryable(req *http.Request, out *outgoing, cn *Conn, err error) bool {
	if req.Context().Err() != nil || cn.timedOut {
		return false
	}
	if cn.wrote == 0 && cn.writeFailed {
		return !out.bodyStarted // the request is whole: nothing reached the origin
	}
	if cn.gotByte || out.body != nil || !idempotent(req) {
		return false
	}
	return errors.Is(err, io.EOF) || errors.Is(err, syscall.ECONNRESET) || errors.Is(err, syscall.EPIPE)
}

// idempotent is net/http's Request.isReplayable without its body
// condition (the caller checks that).
func idempotent(req *http.Request) bool {
	switch req.Method {
	case "", http.MethodGet, http.MethodHead, http.MethodOptions, http.MethodTrace:
		return true
	}
	_, k1 := req.Header["Idempotency-Key"]
	_, k2 := req.Header["X-Idempotency-Key"]
	return k1 || k2
}

// get returns a healthy pooled connection, or a new one when fresh or
// when none is pooled.
func (c *Client) get(ctx context.Context, fresh bool) (*Conn, error) {
	if !fresh {
		if cn := c.take(); cn != nil {
			return cn, nil
		}
	}
	nc, err := c.o.Dial(ctx, "tcp", c.addr)
	if err != nil {
		return nil, err
	}
	c.dials.Add(1)
	return newConn(c, quiet.Conn(nc)), nil
}

// take pops the most recently used idle connection that is still
// healthy; connections idle past IdleTimeout, closed by the peer or with
// bytes nobody asked for are closed.
func (c *Client) take() *Conn {
	now := time.Now()
	for {
		c.mu.Lock()
		n := len(c.idle)
		if n == 0 {
			c.mu.Unlock()
			return nil
		}
		cn := c.idle[n-1]
		c.idle[n-1] = nil
		c.idle = c.idle[:n-1]
		var expired []*Conn
		if now.Sub(cn.idleAt) > c.o.IdleTimeout {
			// Everything below is older still.
			expired, c.idle = c.idle, nil
		}
		c.mu.Unlock()
		for _, e := range expired {
			e.nc.Close()
		}
		// A connection that has already been kept alive once (answered
		// again after a stay in the pool) and is back for less than
		// freshIdle is not peeked at, a syscall a request saved: an origin
		// that keeps connections does not close one that soon after
		// answering on it, and one that closes it with an answer says so
		// (Connection: close) and is never pooled. An origin that drops
		// every connection after one answer is always peeked at.
		fresh := cn.proven && now.Sub(cn.idleAt) < freshIdle
		if !fresh {
			c.peeks.Add(1)
		}
		if expired == nil && cn.br.Buffered() == 0 && (fresh || cn.healthy()) {
			cn.reused = true
			return cn
		}
		cn.nc.Close()
	}
}

// freshIdle is how long a pooled connection is taken without a liveness
// peek.
const freshIdle = 100 * time.Millisecond

// put pools cn, or closes it when the pool is full or closed.
func (c *Client) put(cn *Conn) {
	if cn.br.Buffered() > 0 {
		cn.nc.Close() // bytes past the response: the stream is out of step
		return
	}
	cn.idleAt = time.Now()
	cn.proven = cn.reused
	c.mu.Lock()
	if c.closed || len(c.idle) >= c.o.MaxIdle {
		c.mu.Unlock()
		cn.nc.Close()
		return
	}
	c.idle = append(c.idle, cn)
	if c.sweep == nil {
		c.sweep = time.AfterFunc(c.o.IdleTimeout, c.sweepIdle)
	}
	c.mu.Unlock()
}

// sweepIdle closes the connections idle past IdleTimeout (the bottom of
// the stack), and comes back when the next one expires.
func (c *Client) sweepIdle() {
	now := time.Now()
	c.mu.Lock()
	i := 0
	for i < len(c.idle) && now.Sub(c.idle[i].idleAt) >= c.o.IdleTimeout {
		i++
	}
	expired := append([]*Conn(nil), c.idle[:i]...)
	n := copy(c.idle, c.idle[i:])
	clear(c.idle[n:])
	c.idle = c.idle[:n]
	if n > 0 {
		c.sweep.Reset(c.o.IdleTimeout - now.Sub(c.idle[0].idleAt) + time.Millisecond)
	} else {
		c.sweep = nil
	}
	c.mu.Unlock()
	for _, cn := range expired {
		cn.nc.Close()
	}
}
