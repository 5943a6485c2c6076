//go:build linux && race

package quiet

import "syscall"

// Under the race detector reads and writes go through package syscall,
// whose annotations order a write to a socket before the read of it in
// the same process (a test's origin and the proxy): raw system calls
// would hide that order and make the detector report races that are not.
// Everything else is the same.

func Read(fd uintptr, p []byte) (int, syscall.Errno) {
	for {
		n, err := syscall.Read(int(fd), p)
		if err != syscall.EINTR {
			return n, errno(err)
		}
	}
}

func write(fd uintptr, p []byte) (int, syscall.Errno) {
	for {
		n, err := syscall.Write(int(fd), p)
		if err != syscall.EINTR {
			return n, errno(err)
		}
	}
}

func errno(err error) syscall.Errno {
	if err == nil {
		return 0
	}
	return err.(syscall.Errno)
}
