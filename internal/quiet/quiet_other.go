//go:build !linux

package quiet

import "net"

// Conn returns c: raw system calls are Linux's alone (quiet_linux.go).
func Conn(c net.Conn) net.Conn { return c }

// Listener returns ln.
func Listener(ln net.Listener) net.Listener { return ln }
