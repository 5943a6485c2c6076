//go:build linux && !race

package quiet_test

import "testing"

// TestQuietConnAllocatesNothing: a Write and a Read on a quiet connection
// allocate nothing, as on the TCPConn it wraps; a closure per call would
// cost two allocations each.
func TestQuietConnAllocatesNothing(t *testing.T) {
	a, b := quietPair(t)
	buf := make([]byte, 64)
	msg := []byte("hello")
	if n := testing.AllocsPerRun(200, func() {
		a.Write(msg)
		b.Read(buf)
	}); n != 0 {
		t.Fatalf("%v allocations per Write and Read, want 0", n)
	}
}
