// Package quiet makes the reads and writes of TCP connections raw system
// calls.
//
// Why: Go's sockets are non-blocking, so read(2) and write(2) on them
// return at once, and the runtime's bookkeeping for a system call that
// might block is wasted on them. It is not only its own cost: the first
// such call after the process was idle wakes the runtime's monitor thread
// (sysmon), which then polls every 20 µs for a while, and a write that does
// the loopback receiver's work long enough has its processor handed to
// another thread. A proxy that goes idle between the events of its streams
// thousands of times a second paid for all of that: 8 % of its CPU for
// the monitor alone (docs/performance.md, "Quiet connections"). Waiting is
// unchanged: on EAGAIN the goroutine parks on the network poller,
// deadlines included, through the connection's syscall.RawConn.
//
// Under the race detector the calls go through package syscall (race.go);
// on other systems Conn returns its connection as it is.
package quiet

import (
	"io"
	"net"
	"os"
	"sync"
	"syscall"
)

// Conn returns c with its reads and writes made as raw system calls, when
// c is a TCP connection; any other connection is returned as it is.
func Conn(c net.Conn) net.Conn {
	tc, ok := c.(*net.TCPConn)
	if !ok {
		return c
	}
	rc, err := tc.SyscallConn()
	if err != nil {
		return c
	}
	q := &quietConn{TCPConn: tc, rc: rc}
	q.r.fn = func(fd uintptr) bool {
		q.r.n, q.r.errno = Read(fd, q.r.p)
		return q.r.errno != syscall.EAGAIN
	}
	q.w.fn = func(fd uintptr) bool {
		for q.w.n < len(q.w.p) {
			n, e := write(fd, q.w.p[q.w.n:])
			if e == syscall.EAGAIN {
				return false
			}
			if e != 0 {
				q.w.errno = e
				return true
			}
			q.w.n += n
		}
		return true
	}
	return q
}

// quietConn is a TCP connection read and written with raw system calls.
// The rest (deadlines, Close, CloseWrite, ReadFrom for sendfile) is the
// TCPConn's.
type quietConn struct {
	*net.TCPConn
	rc   syscall.RawConn
	r, w call
}

// call is one direction's system call with its arguments and results,
// and the function RawConn runs, made once: a Read or Write allocates
// nothing (a closure per call cost two allocations each). Its mutex
// serializes the calls of one direction, as the socket's own lock does
// inside RawConn anyway.
type call struct {
	mu    sync.Mutex
	p     []byte
	n     int
	errno syscall.Errno
	fn    func(fd uintptr) bool
}

// do runs the call on p: what it did and the error RawConn returned.
func (k *call) do(run func(func(uintptr) bool) error, p []byte) (int, syscall.Errno, error) {
	k.mu.Lock()
	k.p, k.n, k.errno = p, 0, 0
	err := run(k.fn)
	n, errno := k.n, k.errno
	k.p = nil // the caller's buffer is not kept
	k.mu.Unlock()
	return n, errno, err
}

func (c *quietConn) Read(p []byte) (int, error) {
	if len(p) == 0 {
		return 0, nil
	}
	n, errno, err := c.r.do(c.rc.Read, p)
	switch {
	case err != nil:
		return 0, err
	case errno != 0:
		return 0, c.opError("read", errno)
	case n == 0:
		return 0, io.EOF
	}
	return n, nil
}

func (c *quietConn) Write(p []byte) (int, error) {
	n, errno, err := c.w.do(c.rc.Write, p)
	switch {
	case err != nil:
		return n, err
	case errno != 0:
		return n, c.opError("write", errno)
	}
	return n, nil
}

func (c *quietConn) opError(op string, errno syscall.Errno) error {
	return &net.OpError{Op: op, Net: "tcp", Source: c.LocalAddr(), Addr: c.RemoteAddr(),
		Err: os.NewSyscallError(op, errno)}
}

// Listener hands out its connections through Conn.
func Listener(ln net.Listener) net.Listener { return listener{ln} }

type listener struct{ net.Listener }

func (l listener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err != nil {
		return nil, err
	}
	return Conn(c), nil
}
