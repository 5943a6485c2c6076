package redistest

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

// ClusterOptions shapes a Redis Cluster for a test.
type ClusterOptions struct {
	// Masters is the number of masters (slot owners): 3 when zero, the
	// least redis-cli --cluster create accepts.
	Masters int
	// ReplicasPerMaster is taken as given: 0 means no replicas and so
	// no failover.
	ReplicasPerMaster int
	// NodeTimeout is cluster-node-timeout, 1s when zero. It sets the
	// failover time: a node pings a peer whose last answer is
	// NodeTimeout/2 old and flags it PFAIL when that ping goes
	// NodeTimeout unanswered (so 0.5–1.5 × NodeTimeout after the kill),
	// FAIL once a majority of masters agree (a few gossip rounds, 100–300
	// ms), and the replica then waits 500 ms + random(0..500 ms) (+1 s per
	// better-ranked replica) before asking for votes. With 1s the replica
	// takes over 2.0–2.7 s after the kill on loopback, that is
	// NodeTimeout + 1–1.7 s (measured by TestClusterFailover).
	NodeTimeout time.Duration
	// StartTimeout bounds StartCluster (processes up, cluster created,
	// every node agreeing); 60s when zero.
	StartTimeout time.Duration
	// PartialCoverage runs the nodes with cluster-require-full-coverage
	// no: while a master is down, the other masters keep serving their
	// slots. With Redis's default (yes) every node answers CLUSTERDOWN
	// from the moment a master is flagged FAIL until its replica takes
	// over.
	PartialCoverage bool
}

// Cluster is a running Redis Cluster on loopback. Its methods fail the
// test on errors they cannot return, so call them from the test's
// goroutine, like t.Fatal.
type Cluster struct {
	t     testing.TB
	opts  ClusterOptions
	nodes []*Node

	mu    sync.Mutex
	ids   map[*Node]string  // cluster node IDs
	heirs map[*Node][]*Node // the replicas a node had when it was killed
}

// StartCluster starts Masters×(1+ReplicasPerMaster) cluster nodes on free
// loopback ports, joins them with redis-cli --cluster create, and returns
// once every node reports cluster_state:ok with all 16384 slots served,
// all nodes agree on who serves them, and every replica is in sync. It
// skips or fails like Require when redis-server or redis-cli is missing.
// Everything it starts is killed in t.Cleanup.
//
// The nodes run with cluster-replica-validity-factor 0, so a replica
// always stands for election however long it was cut off from its
// master (the default, 10, can make a replica refuse after a stall of a
// loaded test machine), and with repl-diskless-sync-delay 0 so that a
// replica's first sync starts at once rather than after 5 s.
// cluster-require-full-coverage and cluster-allow-reads-when-down keep
// their defaults (yes, no): while a master is down and not yet replaced,
// every node answers CLUSTERDOWN, as in production. Each node's cluster
// bus gets its own free port (--cluster-port) rather than port+10000,
// which may be taken or past 65535.
//
// Startup takes about 2 s, nearly all of it Redis's own waiting: redis-cli
// sleeps a second after CLUSTER MEET, and a master does not report
// cluster_state:ok until 2 s after its process started.
func StartCluster(t testing.TB, opts ClusterOptions) *Cluster {
	t.Helper()
	bin := Require(t)
	cli := requireBin(t, "redis-cli")
	exclusive(t)
	if opts.Masters == 0 {
		opts.Masters = 3
	}
	if opts.NodeTimeout == 0 {
		opts.NodeTimeout = time.Second
	}
	if opts.StartTimeout == 0 {
		opts.StartTimeout = 60 * time.Second
	}
	if opts.Masters < 3 || opts.ReplicasPerMaster < 0 {
		t.Fatalf("StartCluster: need at least 3 masters and no negative replicas, got %+v", opts)
	}
	began := time.Now()
	deadline := began.Add(opts.StartTimeout)
	c := &Cluster{t: t, opts: opts, ids: map[*Node]string{}, heirs: map[*Node][]*Node{}}
	total := opts.Masters * (1 + opts.ReplicasPerMaster)
	ports := freePorts(t, 2*total)
	for i := range total {
		n := newNode(t, bin, "node "+strconv.Itoa(i))
		c.setPorts(n, ports[2*i], ports[2*i+1])
		c.nodes = append(c.nodes, n)
	}
	waitUp(t, c.nodes, func(n *Node) {
		p := freePorts(t, 2)
		c.setPorts(n, p[0], p[1])
	}, time.Until(deadline))
	up := time.Now()

	c.create(cli, deadline)
	created := time.Now()
	for _, n := range c.nodes {
		id, err := n.text("CLUSTER", "MYID")
		if err != nil {
			t.Fatalf("CLUSTER MYID on %s: %v", n, err)
		}
		c.ids[n] = id
	}
	if err := c.waitHealthy(time.Until(deadline), true); err != nil {
		t.Fatalf("cluster did not converge within %v of start: %v", opts.StartTimeout, err)
	}
	t.Logf("redistest: cluster of %d nodes ready in %v (processes %v, redis-cli create %v, convergence %v)",
		total, time.Since(began).Round(time.Millisecond), up.Sub(began).Round(time.Millisecond),
		created.Sub(up).Round(time.Millisecond), time.Since(created).Round(time.Millisecond))
	return c
}

// setPorts gives a node its client and cluster bus ports and the command
// line that goes with them.
func (c *Cluster) setPorts(n *Node, port, bus string) {
	n.Addr = "127.0.0.1:" + port
	n.args = []string{
		"--port", port, "--bind", "127.0.0.1", "--protected-mode", "yes",
		"--dir", n.dir, "--save", "", "--appendonly", "no",
		"--cluster-enabled", "yes",
		"--cluster-config-file", filepath.Join(n.dir, "nodes.conf"),
		"--cluster-port", bus,
		"--cluster-node-timeout", strconv.FormatInt(c.opts.NodeTimeout.Milliseconds(), 10),
		"--cluster-replica-validity-factor", "0",
		"--repl-diskless-sync-delay", "0",
	}
	if c.opts.PartialCoverage {
		n.args = append(n.args, "--cluster-require-full-coverage", "no")
	}
}

// create runs redis-cli --cluster create, as an operator would.
func (c *Cluster) create(cli string, deadline time.Time) {
	c.t.Helper()
	args := []string{"--cluster", "create"}
	args = append(args, c.Addrs()...)
	args = append(args, "--cluster-replicas", strconv.Itoa(c.opts.ReplicasPerMaster), "--cluster-yes")
	logPath := filepath.Join(c.t.TempDir(), "redis-cli.log")
	f, err := os.Create(logPath)
	if err != nil {
		c.t.Fatal(err)
	}
	defer f.Close()
	ctx, cancel := context.WithDeadline(context.Background(), deadline)
	defer cancel()
	cmd := exec.CommandContext(ctx, cli, args...)
	cmd.Stdout, cmd.Stderr = f, f
	cmd.SysProcAttr = sysProcAttr()
	cmd.Cancel = func() error { killGroup(cmd.Process); return nil }
	if err := cmd.Run(); err != nil {
		c.t.Fatalf("redis-cli %s: %v\n%s", strings.Join(args, " "), err, tail(logPath, 30))
	}
}

// Nodes returns every node, dead or alive, in start order.
func (c *Cluster) Nodes() []*Node { return slices.Clone(c.nodes) }

// Addrs returns the address of every node, dead or alive.
func (c *Cluster) Addrs() []string {
	addrs := make([]string, len(c.nodes))
	for i, n := range c.nodes {
		addrs[i] = n.Addr
	}
	return addrs
}

// URL is the cluster as REDIS_URL names one: redis://host:port,host:port,…
func (c *Cluster) URL() string { return "redis://" + strings.Join(c.Addrs(), ",") }

// Masters returns the live nodes that serve slots now, as CLUSTER SLOTS
// on a live node says, in start order.
func (c *Cluster) Masters() []*Node {
	c.t.Helper()
	slots, _, err := c.slots()
	if err != nil {
		c.t.Fatal(err)
	}
	var masters []*Node
	for _, n := range c.nodes {
		for _, s := range slots {
			if s.Nodes[0].Addr == n.Addr && !n.isDead() {
				masters = append(masters, n)
				break
			}
		}
	}
	return masters
}

// MasterOf returns the node that serves key's slot now (see Slot), as
// CLUSTER SLOTS on a live node says.
func (c *Cluster) MasterOf(key string) *Node {
	c.t.Helper()
	slot := Slot(key)
	slots, from, err := c.slots()
	if err != nil {
		c.t.Fatal(err)
	}
	for _, s := range slots {
		if s.Start <= slot && slot <= s.End {
			if n := c.byAddr(s.Nodes[0].Addr); n != nil {
				return n
			}
			c.t.Fatalf("%s says slot %d is served by %s, not a node of this cluster", from, slot, s.Nodes[0].Addr)
		}
	}
	c.t.Fatalf("%s says no node serves slot %d (key %q)", from, slot, key)
	return nil
}

// Kill sends SIGKILL to the node and waits for it to be gone; the
// cluster remembers it as dead, and which replicas it had, for
// WaitPromoted.
func (c *Cluster) Kill(n *Node) {
	c.t.Helper()
	heirs := c.replicasOf(n)
	if err := n.kill(); err != nil {
		c.t.Fatal(err)
	}
	c.mu.Lock()
	c.heirs[n] = heirs
	c.mu.Unlock()
}

// Restart starts a killed node again on the same ports with its own
// nodes.conf, so it rejoins under its old ID (a killed master comes
// back as a replica of the node that replaced it). It returns once the
// process answers; call WaitOK to wait until the cluster has taken it in.
func (c *Cluster) Restart(n *Node) {
	c.t.Helper()
	if err := n.kill(); err != nil { // no-op if it is already dead
		c.t.Fatal(err)
	}
	waitUp(c.t, []*Node{n}, nil, 10*time.Second)
}

// WaitPromoted waits until a replica that replicated old when it was
// killed (see Kill) reports role:master and cluster_state:ok, and returns
// it with the time that was first seen. It then waits, within the same
// timeout, until the whole cluster is healthy again (see WaitOK), so
// that clients the test builds next see the new topology everywhere.
func (c *Cluster) WaitPromoted(old *Node, timeout time.Duration) (*Node, time.Time, error) {
	deadline := time.Now().Add(timeout)
	c.mu.Lock()
	heirs, killed := c.heirs[old]
	c.mu.Unlock()
	if !killed {
		return nil, time.Time{}, fmt.Errorf("WaitPromoted: %s was not killed with Kill", old)
	}
	if len(heirs) == 0 {
		return nil, time.Time{}, fmt.Errorf("WaitPromoted: %s had no replicas when it was killed", old)
	}
	var last []string
	for {
		last = last[:0]
		for _, r := range heirs {
			if r.isDead() {
				last = append(last, r.String()+": dead")
				continue
			}
			repl, err1 := r.text("INFO", "replication")
			info, err2 := r.text("CLUSTER", "INFO")
			if err1 == nil && err2 == nil && infoField(repl, "role") == "master" && infoField(info, "cluster_state") == "ok" {
				at := time.Now()
				if err := c.WaitOK(time.Until(deadline)); err != nil {
					return r, at, fmt.Errorf("%s was promoted but the cluster did not settle: %w", r, err)
				}
				return r, at, nil
			}
			last = append(last, fmt.Sprintf("%s: role:%s cluster_state:%s errors:%v %v",
				r, infoField(repl, "role"), infoField(info, "cluster_state"), err1, err2))
		}
		if time.Now().After(deadline) {
			return nil, time.Time{}, fmt.Errorf("no replica of %s promoted within %v (%w); last seen:\n%s\nCLUSTER INFO:\n%s",
				old, timeout, errTimeout, strings.Join(last, "\n"), c.clusterInfos())
		}
		time.Sleep(pollEvery)
	}
}

// WaitOK waits until every live node reports cluster_state:ok, all
// 16384 slots ok and all nodes known, every live node names the same
// live masters for the same slots, and every live replica's link to its
// master is up.
func (c *Cluster) WaitOK(timeout time.Duration) error {
	return c.waitHealthy(timeout, false)
}

// waitHealthy is WaitOK; at start it also waits until every master has
// its ReplicasPerMaster replicas.
func (c *Cluster) waitHealthy(timeout time.Duration, atStart bool) error {
	deadline := time.Now().Add(timeout)
	for {
		problem := c.problem(atStart)
		if problem == "" {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%w after %v: %s\nCLUSTER INFO:\n%s", errTimeout, timeout, problem, c.clusterInfos())
		}
		time.Sleep(pollEvery)
	}
}

// problem returns why the cluster is not healthy, or "".
func (c *Cluster) problem(atStart bool) string {
	want, wantRoles := "", ""
	for _, n := range c.nodes {
		if n.isDead() {
			continue
		}
		info, err := n.text("CLUSTER", "INFO")
		if err != nil {
			return fmt.Sprintf("%s: CLUSTER INFO: %v", n, err)
		}
		if s := infoField(info, "cluster_state"); s != "ok" {
			return fmt.Sprintf("%s: cluster_state:%s", n, s)
		}
		if s := infoField(info, "cluster_slots_ok"); s != strconv.Itoa(SlotCount) {
			return fmt.Sprintf("%s: cluster_slots_ok:%s", n, s)
		}
		if s := infoField(info, "cluster_known_nodes"); s != strconv.Itoa(len(c.nodes)) {
			return fmt.Sprintf("%s: cluster_known_nodes:%s of %d", n, s, len(c.nodes))
		}
		slots, err := n.do("CLUSTER", "SLOTS").Slice()
		if err != nil {
			return fmt.Sprintf("%s: CLUSTER SLOTS: %v", n, err)
		}
		got, err := c.slotMap(slots)
		if err != nil {
			return fmt.Sprintf("%s: %v", n, err)
		}
		if want == "" {
			want = got
		} else if got != want {
			return fmt.Sprintf("nodes disagree on slot owners: %s vs %s", want, got)
		}
		nodes, err := n.text("CLUSTER", "NODES")
		if err != nil {
			return fmt.Sprintf("%s: CLUSTER NODES: %v", n, err)
		}
		roles := roleMap(nodes)
		if atStart {
			for _, f := range strings.Fields(roles) {
				if id, ok := strings.CutSuffix(f, ":master"); ok {
					if got := strings.Count(roles, ":slave-of-"+id); got != c.opts.ReplicasPerMaster {
						return fmt.Sprintf("%s sees %d replicas of master %s, want %d", n, got, id, c.opts.ReplicasPerMaster)
					}
				}
			}
		}
		if wantRoles == "" {
			wantRoles = roles
		} else if roles != wantRoles {
			return fmt.Sprintf("nodes disagree on roles: %s vs %s", wantRoles, roles)
		}
		repl, err := n.text("INFO", "replication")
		if err != nil {
			return fmt.Sprintf("%s: INFO replication: %v", n, err)
		}
		if infoField(repl, "role") == "slave" && infoField(repl, "master_link_status") != "up" {
			return fmt.Sprintf("%s: replica of %s:%s, link %s", n, infoField(repl, "master_host"),
				infoField(repl, "master_port"), infoField(repl, "master_link_status"))
		}
	}
	return ""
}

// roleMap renders a CLUSTER NODES answer as "id:master …" and
// "id:slave-of-masterid …", sorted: what every node must agree on before
// a test can trust any one node's view of who replicates whom.
func roleMap(nodes string) string {
	var parts []string
	for _, line := range strings.Split(strings.TrimSpace(nodes), "\n") {
		f := strings.Fields(line)
		if len(f) < 4 {
			continue
		}
		switch flags := "," + f[2] + ","; {
		case strings.Contains(flags, ",slave,"):
			parts = append(parts, f[0]+":slave-of-"+f[3])
		case strings.Contains(flags, ",master,"):
			parts = append(parts, f[0]+":master")
		default:
			parts = append(parts, f[0]+":"+f[2])
		}
	}
	slices.Sort(parts)
	return strings.Join(parts, " ")
}

// slotMap renders a CLUSTER SLOTS answer as "start-end=master …", sorted,
// and checks that every master is a live node of this cluster.
func (c *Cluster) slotMap(raw []any) (string, error) {
	var parts []string
	for _, r := range raw {
		s, ok := r.([]any)
		if !ok || len(s) < 3 {
			return "", fmt.Errorf("odd CLUSTER SLOTS entry %v", r)
		}
		m, _ := s[2].([]any)
		if len(m) < 2 {
			return "", fmt.Errorf("odd CLUSTER SLOTS entry %v", r)
		}
		addr := fmt.Sprintf("%v:%v", m[0], m[1])
		if n := c.byAddr(addr); n == nil || n.isDead() {
			return "", fmt.Errorf("slots %v-%v are served by %s, which is not a live node", s[0], s[1], addr)
		}
		parts = append(parts, fmt.Sprintf("%v-%v=%s", s[0], s[1], addr))
	}
	slices.Sort(parts)
	return strings.Join(parts, " "), nil
}

// slots asks the first live node that answers for CLUSTER SLOTS.
func (c *Cluster) slots() ([]redis.ClusterSlot, *Node, error) {
	var errs []string
	for _, n := range c.nodes {
		if n.isDead() {
			continue
		}
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		s, err := n.conn().ClusterSlots(ctx).Result()
		cancel()
		if err == nil {
			return s, n, nil
		}
		errs = append(errs, fmt.Sprintf("%s: %v", n, err))
	}
	return nil, nil, fmt.Errorf("no live node answered CLUSTER SLOTS: %s", strings.Join(errs, "; "))
}

// replicasOf returns the nodes that replicate n now according to any
// live node (n itself included): gossip may not have told every node yet.
func (c *Cluster) replicasOf(n *Node) []*Node {
	c.mu.Lock()
	id := c.ids[n]
	c.mu.Unlock()
	var heirs []*Node
	for _, other := range c.nodes {
		if other.isDead() {
			continue
		}
		text, err := other.text("CLUSTER", "NODES")
		if err != nil {
			continue
		}
		for _, line := range strings.Split(strings.TrimSpace(text), "\n") {
			f := strings.Fields(line)
			if len(f) < 4 || f[3] != id || !strings.Contains(","+f[2]+",", ",slave,") {
				continue
			}
			addr, _, _ := strings.Cut(f[1], "@")
			if r := c.byAddr(addr); r != nil && !slices.Contains(heirs, r) {
				heirs = append(heirs, r)
			}
		}
	}
	return heirs
}

func (c *Cluster) byAddr(addr string) *Node {
	for _, n := range c.nodes {
		if n.Addr == addr {
			return n
		}
	}
	return nil
}

// clusterInfos is the last word of every node, for timeout messages.
func (c *Cluster) clusterInfos() string {
	var b strings.Builder
	for _, n := range c.nodes {
		if n.isDead() {
			fmt.Fprintf(&b, "%s: killed\n", n)
			continue
		}
		info, err := n.text("CLUSTER", "INFO")
		if err != nil {
			fmt.Fprintf(&b, "%s: %v\n", n, err)
			continue
		}
		fmt.Fprintf(&b, "%s: state:%s slots_ok:%s slots_pfail:%s slots_fail:%s known_nodes:%s epoch:%s\n", n,
			infoField(info, "cluster_state"), infoField(info, "cluster_slots_ok"),
			infoField(info, "cluster_slots_pfail"), infoField(info, "cluster_slots_fail"),
			infoField(info, "cluster_known_nodes"), infoField(info, "cluster_current_epoch"))
	}
	return b.String()
}
