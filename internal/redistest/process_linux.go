package redistest

import (
	"fmt"
	"os"
	"strconv"
	"strings"
	"syscall"
)

// sysProcAttr puts each server in its own process group (so a kill takes
// the children it forks for replication with it) and asks Linux to kill
// it should the test binary die without running its cleanups (a panic,
// go test -timeout).
func sysProcAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
}

// killGroup sends SIGKILL to the process group led by p, then to p. A
// PID still in use as a group ID is not handed out again, so the group
// kill cannot hit a stranger while the group has members.
func killGroup(p *os.Process) {
	syscall.Kill(-p.Pid, syscall.SIGKILL)
	p.Kill()
}

// groupGone reports an error when a process of the group led by pid
// (which has been reaped) is still alive.
func groupGone(pid int) error {
	if err := syscall.Kill(-pid, 0); err == nil {
		return fmt.Errorf("process group %d still has live members", pid)
	}
	return nil
}

// Alive reports whether a process with this PID is running (a zombie,
// dead but not yet reaped by its new parent, is not). Tests use it to
// check that nothing they started outlives them.
func Alive(pid int) bool {
	if pid <= 0 || syscall.Kill(pid, 0) != nil {
		return false
	}
	stat, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return true
	}
	// pid (comm) state …: comm may hold spaces and parentheses.
	s := string(stat)
	if i := strings.LastIndexByte(s, ')'); i >= 0 && i+2 < len(s) {
		return s[i+2] != 'Z'
	}
	return true
}
