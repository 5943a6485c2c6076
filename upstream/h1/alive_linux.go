package h1

import (
	"net"
	"syscall"
)

// aliveCheck peeks at a pooled connection without blocking: a peer that
// closed it reads as EOF, one that sent bytes nobody asked for as data.
type aliveCheck struct {
	raw  syscall.RawConn
	buf  [1]byte
	n    int
	err  error
	peek func(fd uintptr) bool
}

func newAliveCheck(nc net.Conn) aliveCheck {
	sc, ok := nc.(syscall.Conn)
	if !ok {
		return aliveCheck{}
	}
	raw, err := sc.SyscallConn()
	if err != nil {
		return aliveCheck{}
	}
	return aliveCheck{raw: raw}
}

// ok reports whether the connection is open with nothing to read.
func (a *aliveCheck) ok() bool {
	if a.raw == nil {
		return true
	}
	if a.peek == nil {
		a.peek = func(fd uintptr) bool {
			a.n, _, a.err = syscall.Recvfrom(int(fd), a.buf[:], syscall.MSG_PEEK|syscall.MSG_DONTWAIT)
			return true
		}
	}
	if err := a.raw.Read(a.peek); err != nil {
		return false
	}
	return a.err == syscall.EAGAIN
}
