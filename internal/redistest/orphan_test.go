package redistest_test

import (
	"bufio"
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/ratelimit-proxy/ratelimit-proxy/internal/redistest"
)

// TestHelperProcess is run by TestNoOrphans in a child test binary: it
// starts a small Sentinel set, prints the PIDs, then ends badly.
func TestHelperProcess(t *testing.T) {
	mode := os.Getenv("REDISTEST_HELPER")
	if mode == "" {
		t.Skip("run by TestNoOrphans")
	}
	s := redistest.StartSentinel(t, redistest.SentinelOptions{Replicas: 1, Sentinels: 1})
	var pids []string
	for _, n := range append(s.Nodes(), s.Sentinels()...) {
		pids = append(pids, strconv.Itoa(n.PID))
	}
	fmt.Println("PIDS", strings.Join(pids, " "))
	switch mode {
	case "fatal":
		t.Fatal("failing midway on purpose")
	case "panic":
		panic("panicking midway on purpose")
	case "killed":
		time.Sleep(time.Minute) // until TestNoOrphans kills this binary
	}
}

// TestNoOrphans checks that what a test started dies with it when the
// test fails, panics, or its binary is killed outright (go test
// -timeout, a crash).
func TestNoOrphans(t *testing.T) {
	redistest.Require(t)
	for _, mode := range []string{"fatal", "panic", "killed"} {
		t.Run(mode, func(t *testing.T) {
			cmd := exec.Command(os.Args[0], "-test.run=^TestHelperProcess$", "-test.v")
			cmd.Env = append(os.Environ(), "REDISTEST_HELPER="+mode)
			out, err := cmd.StdoutPipe()
			if err != nil {
				t.Fatal(err)
			}
			cmd.Stderr = cmd.Stdout
			if err := cmd.Start(); err != nil {
				t.Fatal(err)
			}
			timer := time.AfterFunc(30*time.Second, func() { cmd.Process.Kill() })
			defer timer.Stop()
			var pids []int
			var lines []string
			sc := bufio.NewScanner(out)
			for sc.Scan() {
				lines = append(lines, sc.Text())
				if rest, ok := strings.CutPrefix(sc.Text(), "PIDS "); ok {
					for _, f := range strings.Fields(rest) {
						pid, _ := strconv.Atoi(f)
						pids = append(pids, pid)
					}
					if mode == "killed" {
						cmd.Process.Kill()
					}
				}
			}
			cmd.Wait()
			if len(pids) != 3 {
				t.Fatalf("helper printed PIDs %v, want 3; its output:\n%s", pids, strings.Join(lines, "\n"))
			}
			deadline := time.Now().Add(3 * time.Second)
			for _, pid := range pids {
				for redistest.Alive(pid) {
					if time.Now().After(deadline) {
						t.Fatalf("pid %d outlived a helper test that ended by %q", pid, mode)
					}
					time.Sleep(20 * time.Millisecond)
				}
			}
		})
	}
}
