// Package redistest starts real Redis deployments for tests, as an
// operator would run them, on 127.0.0.1 and free ports: one
// redis-server (Start), a Redis Cluster made with redis-cli --cluster
// create (StartCluster), or a master and replicas watched by Sentinels
// (StartSentinel). Every process is started by the test, logs into its
// own t.TempDir(), and is killed by PID in t.Cleanup (on Linux it also
// dies with the test binary); the tail of each log is printed when the
// test fails. Cluster and Sentinel failovers can be provoked (Kill) and
// awaited (WaitPromoted, WaitFailover) with bounded waits.
package redistest

import (
	"bufio"
	"fmt"
	"net"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"
)

// Server is a running redis-server.
type Server struct {
	Addr string
	port string
	dir  string
	cmd  *exec.Cmd
}

// Require skips the test when redis-server is not installed — unless
// REQUIRE_REDIS=1, when its absence fails the test.
func Require(t testing.TB) string {
	t.Helper()
	return requireBin(t, "redis-server")
}

// requireBin finds a program the way Require finds redis-server.
func requireBin(t testing.TB, name string) string {
	t.Helper()
	bin, err := exec.LookPath(name)
	if err != nil {
		if os.Getenv("REQUIRE_REDIS") == "1" {
			t.Fatal(name + " not found and REQUIRE_REDIS=1")
		}
		t.Skip(name + " not installed (install it, or set REQUIRE_REDIS=1 to make this a failure)")
	}
	return bin
}

// Start starts redis-server for t (see Require for when it is missing).
func Start(t testing.TB) *Server {
	t.Helper()
	bin := Require(t)
	s := &Server{dir: t.TempDir()}
	s.port = freePort(t)
	s.Addr = "127.0.0.1:" + s.port
	s.start(t, bin)
	t.Cleanup(s.Stop)
	return s
}

func (s *Server) start(t testing.TB, bin string) {
	t.Helper()
	s.cmd = exec.Command(bin, "--bind", "127.0.0.1", "--port", s.port, "--save", "", "--appendonly", "no",
		"--dir", s.dir, "--protected-mode", "yes")
	if err := s.cmd.Start(); err != nil {
		t.Fatalf("starting redis-server: %v", err)
	}
	deadline := time.Now().Add(10 * time.Second)
	for time.Now().Before(deadline) {
		if ping(s.Addr) {
			return
		}
		time.Sleep(20 * time.Millisecond)
	}
	s.Stop()
	t.Fatalf("redis-server on %s did not answer PING", s.Addr)
}

// Stop kills the server (it can be restarted on the same port).
func (s *Server) Stop() {
	if s.cmd != nil && s.cmd.Process != nil {
		s.cmd.Process.Kill()
		s.cmd.Wait()
	}
	s.cmd = nil
}

// Restart starts the server again on the same port, empty.
func (s *Server) Restart(t testing.TB) {
	t.Helper()
	s.Stop()
	bin, _ := exec.LookPath("redis-server")
	s.start(t, bin)
}

// PID is the server's process id (0 when stopped): benchmarks read its
// CPU time from /proc.
func (s *Server) PID() int {
	if s.cmd == nil || s.cmd.Process == nil {
		return 0
	}
	return s.cmd.Process.Pid
}

// URL is the server's redis:// URL.
func (s *Server) URL() string { return "redis://" + s.Addr + "/0" }

func ping(addr string) bool {
	c, err := net.DialTimeout("tcp", addr, 200*time.Millisecond)
	if err != nil {
		return false
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(time.Second))
	fmt.Fprint(c, "PING\r\n")
	line, err := bufio.NewReader(c).ReadString('\n')
	return err == nil && strings.HasPrefix(line, "+PONG")
}

func freePort(t testing.TB) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	_, port, _ := net.SplitHostPort(l.Addr().String())
	return port
}
