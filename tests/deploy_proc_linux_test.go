package tests

import "syscall"

// deployProcAttr asks Linux to kill a server the deploy tests start should
// the test binary die without running its cleanups (a panic, go test
// -timeout).
func deployProcAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
}
