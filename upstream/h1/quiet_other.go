//go:build !linux

package h1

import "net"

// Quiet returns c: raw system calls are Linux's alone (quiet_linux.go).
func Quiet(c net.Conn) net.Conn { return c }
