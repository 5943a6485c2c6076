package redistest_test

import (
	"fmt"
	"net"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"testing"

	"github.com/ratelimit-proxy/ratelimit-proxy/internal/redistest"
)

// TestMain fails the run when a process this test binary started is
// still alive once every test is done, however the tests ended.
func TestMain(m *testing.M) {
	code := m.Run()
	if left := children(); len(left) > 0 {
		fmt.Fprintf(os.Stderr, "FAIL: processes started by the tests are still running: %s\n", strings.Join(left, ", "))
		code = 1
	}
	os.Exit(code)
}

// children lists the live child processes of this test binary, read from
// /proc (Linux only; elsewhere it finds none).
func children() []string {
	if runtime.GOOS != "linux" {
		return nil
	}
	stats, _ := filepath.Glob("/proc/[0-9]*/stat")
	me := strconv.Itoa(os.Getpid())
	var left []string
	for _, path := range stats {
		b, err := os.ReadFile(path)
		if err != nil {
			continue
		}
		// pid (comm) state ppid …; comm may hold spaces, so cut at ')'.
		s := string(b)
		i := strings.LastIndexByte(s, ')')
		f := strings.Fields(s[i+1:])
		if len(f) > 1 && f[1] == me {
			left = append(left, fmt.Sprintf("%s %s", strings.Fields(s)[0], s[strings.IndexByte(s, '('):i+1]))
		}
	}
	return left
}

// checkGone fails t when a node's process is still alive.
func checkGone(t *testing.T, nodes []*redistest.Node) {
	t.Helper()
	for _, n := range nodes {
		if redistest.Alive(n.PID) {
			t.Errorf("%s: pid %d still alive after the test", n, n.PID)
		}
	}
}

// portOf is the port of a host:port address.
func portOf(addr string) string {
	_, port, _ := net.SplitHostPort(addr)
	return port
}
