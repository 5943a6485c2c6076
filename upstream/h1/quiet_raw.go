//go:build linux && !race

package h1

import (
	"syscall"
	"unsafe"
)

// rawRead is read(2) without the runtime's system call bookkeeping
// (quiet_linux.go says why); EINTR is retried.
func rawRead(fd uintptr, p []byte) (int, syscall.Errno) {
	for {
		r, _, e := syscall.RawSyscall(syscall.SYS_READ, fd, uintptr(unsafe.Pointer(&p[0])), uintptr(len(p)))
		if e != syscall.EINTR {
			return int(r), e
		}
	}
}

// rawWrite is write(2) likewise.
func rawWrite(fd uintptr, p []byte) (int, syscall.Errno) {
	for {
		r, _, e := syscall.RawSyscall(syscall.SYS_WRITE, fd, uintptr(unsafe.Pointer(&p[0])), uintptr(len(p)))
		if e != syscall.EINTR {
			return int(r), e
		}
	}
}
