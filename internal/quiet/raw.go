//go:build linux && !race

package quiet

import (
	"syscall"
	"unsafe"
)

// Read is read(2) on fd without the runtime's system call bookkeeping
// (the package's comment says why); EINTR is retried. For a caller that
// reads inside syscall.RawConn.Read itself (h1's pushed streams).
func Read(fd uintptr, p []byte) (int, syscall.Errno) {
	for {
		r, _, e := syscall.RawSyscall(syscall.SYS_READ, fd, uintptr(unsafe.Pointer(&p[0])), uintptr(len(p)))
		if e != syscall.EINTR {
			return int(r), e
		}
	}
}

// write is write(2) likewise.
func write(fd uintptr, p []byte) (int, syscall.Errno) {
	for {
		r, _, e := syscall.RawSyscall(syscall.SYS_WRITE, fd, uintptr(unsafe.Pointer(&p[0])), uintptr(len(p)))
		if e != syscall.EINTR {
			return int(r), e
		}
	}
}
