//go:build unix

package proxy

import (
	"os"
	"syscall"
)

// mapFile maps the first size bytes of f read-only: a spooled body is
// read in place, from the page cache, not copied onto the heap.
func mapFile(f *os.File, size int64) ([]byte, func(), error) {
	if size == 0 {
		return nil, func() {}, nil
	}
	b, err := syscall.Mmap(int(f.Fd()), 0, int(size), syscall.PROT_READ, syscall.MAP_SHARED)
	if err != nil {
		return nil, nil, err
	}
	return b, func() { syscall.Munmap(b) }, nil
}
