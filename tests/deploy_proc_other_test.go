//go:build !linux

package tests

import "syscall"

// deployProcAttr: elsewhere the cleanups alone stop what the tests start.
func deployProcAttr() *syscall.SysProcAttr { return nil }
