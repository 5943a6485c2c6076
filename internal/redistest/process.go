package redistest

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

// pollEvery is the sleep between two looks at a process or a cluster:
// short, so that readiness and failover are seen within a few ms.
const pollEvery = 20 * time.Millisecond

// Node is one redis-server (a cluster node, a master or replica watched
// by Sentinels, or a Sentinel) started by this package. Addr never
// changes; PID changes when the node is restarted.
type Node struct {
	Addr string
	PID  int

	name    string   // for messages: "node 2", "sentinel 1"
	dir     string   // its own t.TempDir(): config, nodes.conf, log
	bin     string   // redis-server
	args    []string // command line, rebuilt when ports change
	logPath string

	mu     sync.Mutex
	proc   *process
	dead   bool // killed by the test (not yet restarted)
	client *redis.Client
}

// String names the node in test messages.
func (n *Node) String() string { return n.name + " (" + n.Addr + ")" }

// process is one started redis-server; done closes when it has exited
// and been reaped.
type process struct {
	cmd  *exec.Cmd
	done chan struct{}
	err  error // exit status, valid after done
}

// start runs the node's command line with its output appended to its log
// file, in its own process group so that Kill takes any fork with it.
func (n *Node) start() error {
	f, err := os.OpenFile(n.logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return fmt.Errorf("opening log of %s: %w", n, err)
	}
	defer f.Close() // the child holds its own copy
	fmt.Fprintf(f, "### %s %s\n", n.bin, strings.Join(n.args, " "))
	cmd := exec.Command(n.bin, n.args...)
	cmd.Dir = n.dir
	cmd.Stdout, cmd.Stderr = f, f
	cmd.SysProcAttr = sysProcAttr()
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("starting %s: %w", n, err)
	}
	p := &process{cmd: cmd, done: make(chan struct{})}
	go func() {
		p.err = cmd.Wait()
		close(p.done)
	}()
	n.mu.Lock()
	n.proc, n.dead, n.PID = p, false, cmd.Process.Pid
	n.mu.Unlock()
	return nil
}

// kill sends SIGKILL to the node's process group and waits until the
// process is reaped. It is a no-op when the node is not running.
func (n *Node) kill() error {
	n.mu.Lock()
	p := n.proc
	n.proc, n.dead = nil, true
	n.mu.Unlock()
	if p == nil {
		return nil
	}
	select {
	case <-p.done:
		// It died on its own and was reaped: its PID may belong to
		// someone else by now, so only its group (if it left children
		// behind, the group ID is still reserved) gets the signal.
		if groupGone(p.cmd.Process.Pid) != nil {
			killGroup(p.cmd.Process)
		}
	default:
		killGroup(p.cmd.Process)
	}
	select {
	case <-p.done:
	case <-time.After(5 * time.Second):
		return fmt.Errorf("%s (pid %d) did not exit 5s after SIGKILL", n, p.cmd.Process.Pid)
	}
	// A child forked for replication (a BGSAVE to a replica) was killed
	// with the group, but it is only gone once its new parent has reaped
	// it: give that a moment before calling it a leak.
	var err error
	for wait := time.Now().Add(3 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		if err = groupGone(p.cmd.Process.Pid); err == nil || time.Now().After(wait) {
			break
		}
	}
	if err != nil {
		return fmt.Errorf("%s: %w", n, err)
	}
	return nil
}

// exited reports whether the process has ended on its own.
func (n *Node) exited() bool {
	n.mu.Lock()
	p := n.proc
	n.mu.Unlock()
	if p == nil {
		return true
	}
	select {
	case <-p.done:
		return true
	default:
		return false
	}
}

func (n *Node) isDead() bool {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.dead
}

// conn is a client for the node's own questions (INFO, CLUSTER …): no
// retries and short timeouts, so that a dead node costs one quick error.
func (n *Node) conn() *redis.Client {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.client == nil {
		n.client = redis.NewClient(&redis.Options{
			Addr: n.Addr, Protocol: 2, MaxRetries: -1, PoolSize: 2, DialerRetries: 1,
			DialTimeout: 300 * time.Millisecond, ReadTimeout: time.Second, WriteTimeout: time.Second,
			DisableIdentity: true,
		})
	}
	return n.client
}

// do runs one command on the node with a short deadline.
func (n *Node) do(args ...any) *redis.Cmd {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	return n.conn().Do(ctx, args...)
}

// text runs a command whose answer is one bulk string (INFO, CLUSTER INFO…).
func (n *Node) text(args ...any) (string, error) {
	return n.do(args...).Text()
}

// stop kills the node and closes its client; it is the t.Cleanup of
// every node, and prints the tail of the log when the test failed.
func (n *Node) stop(t testing.TB) {
	if err := n.kill(); err != nil {
		t.Errorf("stopping %v", err)
	}
	n.mu.Lock()
	if n.client != nil {
		n.client.Close()
		n.client = nil
	}
	n.mu.Unlock()
	if t.Failed() {
		t.Logf("--- last lines of %s log %s:\n%s", n, n.logPath, tail(n.logPath, 20))
	}
}

// waitUp starts the nodes, all at once, and waits until each answers
// with its own process_id (not a stranger that took the port). A node that exits first (typically: its port was taken between
// freePorts and its start) gets new ports from reassign and another try.
func waitUp(t testing.TB, nodes []*Node, reassign func(*Node), timeout time.Duration) {
	t.Helper()
	for _, n := range nodes {
		if err := n.start(); err != nil {
			t.Fatal(err)
		}
	}
	deadline := time.Now().Add(timeout)
	tries := map[*Node]int{}
	pending := append([]*Node(nil), nodes...)
	for len(pending) > 0 {
		var next []*Node
		for _, n := range pending {
			switch {
			case serverPID(n.Addr) == n.PID: // ours, not a stranger on a reused port
			case n.exited():
				if tries[n]++; tries[n] > 3 || reassign == nil {
					t.Fatalf("%s exited at start:\n%s", n, tail(n.logPath, 15))
				}
				old := n.Addr
				reassign(n)
				t.Logf("redistest: %s exited at start (port taken?); trying %s", old, n.Addr)
				if err := n.start(); err != nil {
					t.Fatal(err)
				}
				next = append(next, n)
			default:
				next = append(next, n)
			}
		}
		pending = next
		if len(pending) == 0 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s did not answer within %v:\n%s", pending[0], timeout, tail(pending[0].logPath, 15))
		}
		time.Sleep(pollEvery)
	}
}

// serverPID asks the server at addr for its process_id (INFO server), or
// returns 0 when nothing answers.
func serverPID(addr string) int {
	c, err := net.DialTimeout("tcp", addr, 200*time.Millisecond)
	if err != nil {
		return 0
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(time.Second))
	if _, err := fmt.Fprint(c, "INFO server\r\n"); err != nil {
		return 0
	}
	r := bufio.NewReader(c)
	head, err := r.ReadString('\n')
	if err != nil || !strings.HasPrefix(head, "$") {
		return 0
	}
	size, err := strconv.Atoi(strings.TrimSpace(head[1:]))
	if err != nil || size < 0 {
		return 0
	}
	body := make([]byte, size)
	if _, err := io.ReadFull(r, body); err != nil {
		return 0
	}
	pid, _ := strconv.Atoi(infoField(string(body), "process_id"))
	return pid
}

// freePorts returns n distinct free loopback ports, holding them all
// until it has them all so that it cannot hand out one port twice.
func freePorts(t testing.TB, n int) []string {
	t.Helper()
	ports := make([]string, 0, n)
	for range n {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatalf("finding a free port: %v", err)
		}
		defer l.Close()
		_, port, _ := net.SplitHostPort(l.Addr().String())
		ports = append(ports, port)
	}
	return ports
}

// tail returns the last lines of a file, for failure messages.
func tail(path string, lines int) string {
	b, err := os.ReadFile(path)
	if err != nil {
		return "(" + err.Error() + ")"
	}
	b = bytes.TrimRight(b, "\n")
	for i, cut := len(b)-1, 0; i >= 0; i-- {
		if b[i] == '\n' {
			if cut++; cut == lines {
				return string(b[i+1:])
			}
		}
	}
	return string(b)
}

// infoField reads "field:value" out of an INFO or CLUSTER INFO answer.
func infoField(info, field string) string {
	for _, line := range strings.Split(info, "\n") {
		if v, ok := strings.CutPrefix(strings.TrimSpace(line), field+":"); ok {
			return v
		}
	}
	return ""
}

// newNode lays out a node's directory and log; the caller fills args.
func newNode(t testing.TB, bin, name string) *Node {
	dir := t.TempDir()
	n := &Node{name: name, dir: dir, bin: bin, logPath: filepath.Join(dir, "redis.log")}
	t.Cleanup(func() { n.stop(t) })
	return n
}

// errTimeout marks the errors of the Wait… methods that ran out of time.
var errTimeout = errors.New("timed out")
