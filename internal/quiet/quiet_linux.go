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
	return &quietConn{TCPConn: tc, rc: rc}
}

// quietConn is a TCP connection read and written with raw system calls.
// The rest (deadlines, Close, CloseWrite, ReadFrom for sendfile) is the
// TCPConn's.
type quietConn struct {
	*net.TCPConn
	rc syscall.RawConn
}

func (c *quietConn) Read(p []byte) (int, error) {
	if len(p) == 0 {
		return 0, nil
	}
	var n int
	var errno syscall.Errno
	err := c.rc.Read(func(fd uintptr) bool {
		n, errno = Read(fd, p)
		return errno != syscall.EAGAIN
	})
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
	var n int
	var errno syscall.Errno
	err := c.rc.Write(func(fd uintptr) bool {
		for n < len(p) {
			w, e := write(fd, p[n:])
			if e == syscall.EAGAIN {
				return false
			}
			if e != 0 {
				errno = e
				return true
			}
			n += w
		}
		return true
	})
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
