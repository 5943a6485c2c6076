package redistest

import (
	"context"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"
)

// SentinelOptions shapes a master watched by Sentinels.
type SentinelOptions struct {
	// Replicas is taken as given: 0 means no replica and so no failover.
	Replicas int
	// Sentinels is 3 when zero.
	Sentinels int
	// Quorum is the number of Sentinels that must agree the master is
	// down; a majority of Sentinels when zero.
	Quorum int
	// MasterName is "mymaster" when empty.
	MasterName string
	// DownAfter is down-after-milliseconds, 1s when zero: how long the
	// master may stay silent before a Sentinel calls it down. With 1s,
	// a failover takes about 2–4 s after the kill: up to 1 s until the
	// Sentinel's last reply is DownAfter old, ~1 s to hear the quorum
	// agree, 0–1 s of random delay before a Sentinel stands for leader,
	// and ~1 s until the promoted replica's INFO confirms it; see
	// TestSentinelFailover for the measured figure.
	DownAfter time.Duration
	// FailoverTimeout is failover-timeout, 3s when zero: a failover that
	// has not promoted the replica by then is abandoned, and retried
	// after twice that. The default (3 min) would turn one lost election
	// into a six-minute wait; 3 s is three times what promotion takes
	// on loopback.
	FailoverTimeout time.Duration
	// TiltPeriod is how long a Sentinel stays in TILT mode, 5s when
	// zero; negative keeps Redis's 30 s. A Sentinel whose timer fires
	// more than 2 s late (a stalled test machine: this 2-core one stalls
	// for seconds when other tests fuzz) distrusts what it saw and takes
	// no action for TiltPeriod; 30 s of that would sink any failover test.
	// It is set with SENTINEL DEBUG tilt-period, the one setting here an
	// operator would not make.
	TiltPeriod time.Duration
	// StartTimeout bounds StartSentinel; 30s when zero.
	StartTimeout time.Duration
}

// SentinelSet is a master, its replicas and the Sentinels watching them,
// on loopback. Its methods fail the test on errors they cannot return,
// so call them from the test's goroutine, like t.Fatal.
type SentinelSet struct {
	t         testing.TB
	opts      SentinelOptions
	data      []*Node // the first master, then its replicas, in start order
	sentinels []*Node
}

// StartSentinel starts a master with opts.Replicas replicas (--replicaof)
// and opts.Sentinels Sentinels (redis-server sentinel.conf --sentinel,
// each with its own conf, which Sentinel rewrites, in its own dir), on
// free loopback ports, and returns once the replicas are in sync and
// every Sentinel knows the master, every replica and every other
// Sentinel. It skips or fails like Require when redis-server is
// missing. Everything it starts is killed in t.Cleanup.
func StartSentinel(t testing.TB, opts SentinelOptions) *SentinelSet {
	t.Helper()
	bin := Require(t)
	exclusive(t)
	if opts.Sentinels == 0 {
		opts.Sentinels = 3
	}
	if opts.Quorum == 0 {
		opts.Quorum = opts.Sentinels/2 + 1
	}
	if opts.MasterName == "" {
		opts.MasterName = "mymaster"
	}
	if opts.DownAfter == 0 {
		opts.DownAfter = time.Second
	}
	if opts.FailoverTimeout == 0 {
		opts.FailoverTimeout = 3 * time.Second
	}
	if opts.TiltPeriod == 0 {
		opts.TiltPeriod = 5 * time.Second
	}
	if opts.StartTimeout == 0 {
		opts.StartTimeout = 30 * time.Second
	}
	if opts.Replicas < 0 || opts.Sentinels < 1 || opts.Quorum > opts.Sentinels {
		t.Fatalf("StartSentinel: bad options %+v", opts)
	}
	began := time.Now()
	deadline := began.Add(opts.StartTimeout)
	s := &SentinelSet{t: t, opts: opts}
	ports := freePorts(t, 1+opts.Replicas+opts.Sentinels)
	for i := range 1 + opts.Replicas {
		name := "master"
		if i > 0 {
			name = "replica " + strconv.Itoa(i)
		}
		n := newNode(t, bin, name)
		n.Addr = "127.0.0.1:" + ports[i]
		s.data = append(s.data, n)
	}
	for i := range opts.Sentinels {
		n := newNode(t, bin, "sentinel "+strconv.Itoa(i+1))
		n.Addr = "127.0.0.1:" + ports[1+opts.Replicas+i]
		s.sentinels = append(s.sentinels, n)
	}
	reassign := func(n *Node) {
		n.Addr = "127.0.0.1:" + freePorts(t, 1)[0]
		s.setDataArgs(n)
	}
	// The master first: a replica that finds no master tries again only
	// a second later (and a replica's command line names the master's
	// final port).
	s.setDataArgs(s.data[0])
	waitUp(t, s.data[:1], reassign, time.Until(deadline))
	for _, n := range s.data[1:] {
		s.setDataArgs(n)
	}
	waitUp(t, s.data[1:], reassign, time.Until(deadline))
	if err := s.waitSynced(time.Until(deadline)); err != nil {
		t.Fatal(err)
	}
	synced := time.Now()

	for _, n := range s.sentinels {
		s.setSentinelArgs(n)
	}
	waitUp(t, s.sentinels, func(n *Node) {
		n.Addr = "127.0.0.1:" + freePorts(t, 1)[0]
		s.setSentinelArgs(n)
	}, time.Until(deadline))
	for _, n := range s.sentinels {
		s.setTilt(n)
	}
	if err := s.waitAcquainted(time.Until(deadline)); err != nil {
		t.Fatal(err)
	}
	t.Logf("redistest: master, %d replicas and %d sentinels ready in %v (data nodes in sync %v, sentinels acquainted %v)",
		opts.Replicas, opts.Sentinels, time.Since(began).Round(time.Millisecond),
		synced.Sub(began).Round(time.Millisecond), time.Since(synced).Round(time.Millisecond))
	return s
}

// setDataArgs builds the command line of the master (s.data[0]) or a
// replica of it.
func (s *SentinelSet) setDataArgs(n *Node) {
	_, port, _ := net.SplitHostPort(n.Addr)
	n.args = []string{
		"--port", port, "--bind", "127.0.0.1", "--protected-mode", "yes",
		"--dir", n.dir, "--save", "", "--appendonly", "no",
		"--repl-diskless-sync-delay", "0",
	}
	if n != s.data[0] {
		host, mport, _ := net.SplitHostPort(s.data[0].Addr)
		n.args = append(n.args, "--replicaof", host, mport)
	}
}

// setSentinelArgs writes the Sentinel's own sentinel.conf (Sentinel
// rewrites it as it learns) and its command line.
func (s *SentinelSet) setSentinelArgs(n *Node) {
	_, port, _ := net.SplitHostPort(n.Addr)
	host, mport, _ := net.SplitHostPort(s.data[0].Addr)
	conf := filepath.Join(n.dir, "sentinel.conf")
	name := s.opts.MasterName
	text := strings.Join([]string{
		"port " + port,
		"bind 127.0.0.1",
		"protected-mode yes",
		"dir " + n.dir,
		"sentinel resolve-hostnames no",
		"sentinel announce-hostnames no",
		fmt.Sprintf("sentinel monitor %s %s %s %d", name, host, mport, s.opts.Quorum),
		fmt.Sprintf("sentinel down-after-milliseconds %s %d", name, s.opts.DownAfter.Milliseconds()),
		fmt.Sprintf("sentinel failover-timeout %s %d", name, s.opts.FailoverTimeout.Milliseconds()),
		fmt.Sprintf("sentinel parallel-syncs %s 1", name),
		"",
	}, "\n")
	if err := os.WriteFile(conf, []byte(text), 0o644); err != nil {
		s.t.Fatal(err)
	}
	n.args = []string{conf, "--sentinel"}
}

// setTilt applies TiltPeriod to a running Sentinel (SENTINEL DEBUG is
// not saved in its conf, so a restarted Sentinel needs it again).
func (s *SentinelSet) setTilt(n *Node) {
	if s.opts.TiltPeriod < 0 {
		return
	}
	ms := strconv.FormatInt(s.opts.TiltPeriod.Milliseconds(), 10)
	if err := n.do("SENTINEL", "DEBUG", "tilt-period", ms).Err(); err != nil {
		s.t.Logf("redistest: %s: SENTINEL DEBUG tilt-period %s: %v (TILT will last 30s)", n, ms, err)
	}
}

// waitSynced waits until the master counts every replica online and
// every replica's link is up.
func (s *SentinelSet) waitSynced(timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	master := s.data[0]
	for {
		problem := ""
		info, err := master.text("INFO", "replication")
		if err != nil {
			problem = fmt.Sprintf("%s: %v", master, err)
		} else if got := strings.Count(info, ",state=online,"); got != s.opts.Replicas {
			problem = fmt.Sprintf("%s has %d of %d replicas online:\n%s", master, got, s.opts.Replicas, info)
		}
		for _, r := range s.data[1:] {
			if problem != "" {
				break
			}
			info, err := r.text("INFO", "replication")
			if err != nil {
				problem = fmt.Sprintf("%s: %v", r, err)
			} else if infoField(info, "master_link_status") != "up" {
				problem = fmt.Sprintf("%s: master_link_status:%s", r, infoField(info, "master_link_status"))
			}
		}
		if problem == "" {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("replicas not in sync after %v (%w): %s", timeout, errTimeout, problem)
		}
		time.Sleep(pollEvery)
	}
}

// waitAcquainted waits until every live Sentinel sees the master up,
// every replica up, and every other Sentinel.
func (s *SentinelSet) waitAcquainted(timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	name := s.opts.MasterName
	for {
		problem := ""
		for _, sn := range s.sentinels {
			if sn.isDead() {
				continue
			}
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
			m, err := sn.conn().Do(ctx, "SENTINEL", "MASTER", name).Slice()
			var reps, others []any
			if err == nil {
				reps, err = sn.conn().Do(ctx, "SENTINEL", "REPLICAS", name).Slice()
			}
			if err == nil {
				others, err = sn.conn().Do(ctx, "SENTINEL", "SENTINELS", name).Slice()
			}
			cancel()
			switch {
			case err != nil:
				problem = fmt.Sprintf("%s: %v", sn, err)
			case pairs(m)["flags"] != "master":
				problem = fmt.Sprintf("%s: SENTINEL MASTER: %v", sn, pairs(m))
			case upCount(reps, "slave") != s.opts.Replicas:
				problem = fmt.Sprintf("%s: SENTINEL REPLICAS: %v", sn, reps)
			case upCount(others, "sentinel") != len(s.sentinels)-1:
				problem = fmt.Sprintf("%s: SENTINEL SENTINELS: %v", sn, others)
			}
			if problem != "" {
				break
			}
		}
		if problem == "" {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("sentinels did not get to know each other and the data nodes within %v (%w); last answer: %s",
				timeout, errTimeout, problem)
		}
		time.Sleep(pollEvery)
	}
}

// pairs turns a RESP2 flat [k1 v1 k2 v2 …] answer into a map.
func pairs(v any) map[string]string {
	flat, _ := v.([]any)
	m := make(map[string]string, len(flat)/2)
	for i := 0; i+1 < len(flat); i += 2 {
		m[fmt.Sprint(flat[i])] = fmt.Sprint(flat[i+1])
	}
	return m
}

// upCount counts the entries of a SENTINEL REPLICAS or SENTINELS answer
// whose flags are exactly flag (no s_down, disconnected, …).
func upCount(list []any, flag string) int {
	n := 0
	for _, e := range list {
		if pairs(e)["flags"] == flag {
			n++
		}
	}
	return n
}

// MasterName is the name the Sentinels know the master by.
func (s *SentinelSet) MasterName() string { return s.opts.MasterName }

// SentinelAddrs returns the address of every Sentinel, dead or alive.
func (s *SentinelSet) SentinelAddrs() []string {
	addrs := make([]string, len(s.sentinels))
	for i, n := range s.sentinels {
		addrs[i] = n.Addr
	}
	return addrs
}

// URL is the set as REDIS_URL names it:
// redis+sentinel://127.0.0.1:p1,127.0.0.1:p2,127.0.0.1:p3/mymaster
func (s *SentinelSet) URL() string {
	return "redis+sentinel://" + strings.Join(s.SentinelAddrs(), ",") + "/" + s.opts.MasterName
}

// Nodes returns the data nodes: the first master, then its replicas.
func (s *SentinelSet) Nodes() []*Node { return slices.Clone(s.data) }

// Sentinels returns the Sentinel nodes.
func (s *SentinelSet) Sentinels() []*Node { return slices.Clone(s.sentinels) }

// Master returns the node the first live Sentinel names as master
// (SENTINEL GET-MASTER-ADDR-BY-NAME).
func (s *SentinelSet) Master() *Node {
	s.t.Helper()
	var errs []string
	for _, sn := range s.sentinels {
		if sn.isDead() {
			continue
		}
		addr, err := s.masterAddr(sn)
		if err != nil {
			errs = append(errs, err.Error())
			continue
		}
		if n := s.byAddr(addr); n != nil {
			return n
		}
		s.t.Fatalf("%s names %s as master, not a node of this set", sn, addr)
	}
	s.t.Fatalf("no sentinel named the master: %s", strings.Join(errs, "; "))
	return nil
}

// Kill sends SIGKILL to a node (data node or Sentinel) and waits for it
// to be gone.
func (s *SentinelSet) Kill(n *Node) {
	s.t.Helper()
	if err := n.kill(); err != nil {
		s.t.Fatal(err)
	}
}

// Restart starts a killed node again on the same port and with the same
// command line (a Sentinel with the conf it rewrote; an old master as a
// master, until the Sentinels turn it into a replica). It returns once
// the process answers.
func (s *SentinelSet) Restart(n *Node) {
	s.t.Helper()
	if err := n.kill(); err != nil {
		s.t.Fatal(err)
	}
	waitUp(s.t, []*Node{n}, nil, 10*time.Second)
	if slices.Contains(s.sentinels, n) {
		s.setTilt(n)
	}
}

// WaitFailover waits until a live Sentinel names a master other than old
// and that node reports role:master, and returns it with the time that
// was first seen. It then waits, within the same timeout, until every
// live Sentinel names it, so that a client asking any of them finds it.
func (s *SentinelSet) WaitFailover(old *Node, timeout time.Duration) (*Node, time.Time, error) {
	deadline := time.Now().Add(timeout)
	var (
		promoted *Node
		at       time.Time
		last     []string
	)
	for {
		last = last[:0]
		agree := 0
		live := 0
		for _, sn := range s.sentinels {
			if sn.isDead() {
				continue
			}
			live++
			addr, err := s.masterAddr(sn)
			if err != nil {
				last = append(last, err.Error())
				continue
			}
			last = append(last, fmt.Sprintf("%s names %s", sn, addr))
			if promoted == nil && addr != old.Addr {
				n := s.byAddr(addr)
				if n == nil || n.isDead() {
					continue
				}
				if info, err := n.text("INFO", "replication"); err == nil && infoField(info, "role") == "master" {
					promoted, at = n, time.Now()
				}
			}
			if promoted != nil && addr == promoted.Addr {
				agree++
			}
		}
		if promoted != nil && agree == live {
			return promoted, at, nil
		}
		if time.Now().After(deadline) {
			what := "no sentinel named a new master"
			if promoted != nil {
				what = fmt.Sprintf("%s was promoted but not every sentinel names it", promoted)
			}
			return promoted, at, fmt.Errorf("%s within %v of killing %s (%w); last answers:\n%s",
				what, timeout, old, errTimeout, strings.Join(last, "\n"))
		}
		time.Sleep(pollEvery)
	}
}

// masterAddr asks one Sentinel for the master's address.
func (s *SentinelSet) masterAddr(sn *Node) (string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	hp, err := sn.conn().Do(ctx, "SENTINEL", "GET-MASTER-ADDR-BY-NAME", s.opts.MasterName).StringSlice()
	if err != nil || len(hp) != 2 {
		return "", fmt.Errorf("%s: GET-MASTER-ADDR-BY-NAME = %v, %v", sn, hp, err)
	}
	return net.JoinHostPort(hp[0], hp[1]), nil
}

func (s *SentinelSet) byAddr(addr string) *Node {
	for _, n := range s.data {
		if n.Addr == addr {
			return n
		}
	}
	return nil
}
