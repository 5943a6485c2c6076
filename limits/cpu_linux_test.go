package limits_test

import (
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// processCPU is the CPU time pid has used so far: the sum of its threads'
// run time in /proc/<pid>/task/*/schedstat (ns), or false where it cannot
// be read.
func processCPU(pid int) (time.Duration, bool) {
	tasks, _ := filepath.Glob("/proc/" + strconv.Itoa(pid) + "/task/*/schedstat")
	if len(tasks) == 0 {
		return 0, false
	}
	var sum int64
	for _, p := range tasks {
		b, err := os.ReadFile(p)
		if err != nil {
			continue // a thread that ended
		}
		f := strings.Fields(string(b))
		if len(f) == 0 {
			return 0, false
		}
		ns, err := strconv.ParseInt(f[0], 10, 64)
		if err != nil {
			return 0, false
		}
		sum += ns
	}
	return time.Duration(sum), true
}

// selfCPU is the CPU time (user and system) this process has used so far.
func selfCPU() (time.Duration, bool) {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0, false
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano()), true
}
