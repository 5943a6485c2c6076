package limits

import (
	"context"
	_ "embed"
	"errors"
	"fmt"
	"runtime"
	"sort"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"
)

// decideScript evaluates and records a batch in one round trip, on Redis's
// clock. See redis.lua.
//
//go:embed redis.lua
var decideScript string

// undoScript takes back admissions decideScript recorded. See undo.lua.
//
//go:embed undo.lua
var undoScript string

// ErrUnavailable is returned while the store is known to be down (its
// circuit breaker is open): the caller applies its FAIL_OPEN policy
// without waiting.
var ErrUnavailable = errors.New("limits: store unavailable")

// RedisOptions configures a Redis store.
type RedisOptions struct {
	// Client is a single server's, a Sentinel failover client or a
	// *redis.ClusterClient; with a cluster, health is judged per shard.
	Client redis.UniversalClient
	// Prefix starts every key ("ratelimit-proxy:").
	Prefix string
	// Timeout bounds one decision (default 50 ms): a slow Redis must not
	// add seconds to every request.
	Timeout time.Duration
	// Failures is how many consecutive failed decisions on one shard open
	// its breaker (default 3). While open, decisions for its keys fail at
	// once with ErrUnavailable and a probe checks that shard every
	// ProbeEvery (default 250 ms) until it answers — or, in a cluster, until
	// another node serves its slots.
	Failures   int
	ProbeEvery time.Duration
	// WarmConns is how many connections Warm opens to each master before
	// the first decision (default: the client's pool size).
	WarmConns int
	// OnCall, when set, is told the duration and outcome of each call to
	// Redis (for metrics).
	OnCall func(d time.Duration, err error)
	// OnStateChange, when set, is told each time a shard goes down (its
	// breaker opens, with the error that opened it) or comes back. shard
	// is the master's address in a cluster, "" for a single server or a
	// Sentinel-managed master.
	OnStateChange func(shard string, up bool, err error)
	// ClientClock makes the script use the now passed to Decide instead of
	// Redis's TIME. For tests that step a fake clock only.
	ClientClock bool
}

// Redis is a Store shared by every proxy instance: each decision is one
// EVALSHA (reloaded after NOSCRIPT) that evaluates and records atomically
// on Redis's own clock, so instance clocks never matter.
//
// On a Redis Cluster a batch whose counters hash to different slots cannot
// be one script: it is decided one slot at a time, in slot order, and when
// a later part refuses, the parts already admitted are rolled back
// (undo.lua). Between the two, a concurrent request may see those units
// taken and be refused: the split batch can refuse a little more than an
// exact one, and never admits more.
type Redis struct {
	o       RedisOptions
	script  *redis.Script
	undo    *redis.Script
	cluster *redis.ClusterClient // nil unless the client is a cluster's

	shards sync.Map // shard address → *redisShard
	down   atomic.Int64
	warm   atomic.Bool // Warm succeeded: connections open, scripts on every node
	stop   chan struct{}
	closed sync.Once
}

var _ Store = (*Redis)(nil)

// redisShard is the health of one master: its own breaker, so that a dead
// shard neither slows nor fails the keys of the others.
type redisShard struct {
	addr     string
	down     atomic.Bool
	failures atomic.Int64
	probing  atomic.Bool
}

// NewRedis returns a Redis store. Close stops its probes.
func NewRedis(o RedisOptions) *Redis {
	if o.Timeout <= 0 {
		o.Timeout = 50 * time.Millisecond
	}
	if o.Failures <= 0 {
		o.Failures = 3
	}
	if o.ProbeEvery <= 0 {
		o.ProbeEvery = 250 * time.Millisecond
	}
	s := &Redis{o: o, script: redis.NewScript(decideScript), undo: redis.NewScript(undoScript), stop: make(chan struct{})}
	s.cluster, _ = o.Client.(*redis.ClusterClient)
	return s
}

// Load loads the scripts on every node (every master and replica of a
// cluster: a replica promoted by a failover has them already), so the
// first decisions do not pay the NOSCRIPT round trip within their
// timeout. Decide reloads them by itself whenever a node has lost them.
func (s *Redis) Load(ctx context.Context) error {
	load := func(ctx context.Context, c *redis.Client) error {
		return errors.Join(s.script.Load(ctx, c).Err(), s.undo.Load(ctx, c).Err())
	}
	if s.cluster != nil {
		return s.cluster.ForEachShard(ctx, load)
	}
	return errors.Join(s.script.Load(ctx, s.o.Client).Err(), s.undo.Load(ctx, s.o.Client).Err())
}

// Warm loads the scripts and opens WarmConns connections to every master,
// so that the first burst after a start is decided within the timeout
// instead of queueing behind connection set-up. Ready reports whether it
// has succeeded; a store that was down at start warms itself when its
// probe finds Redis back.
func (s *Redis) Warm(ctx context.Context) error {
	if err := s.Load(ctx); err != nil {
		return fmt.Errorf("loading the scripts: %w", err)
	}
	open := func(ctx context.Context, c *redis.Client) error {
		n := s.o.WarmConns
		if n <= 0 {
			n = c.Options().PoolSize
		}
		errs := make(chan error, n)
		for range n {
			go func() { errs <- c.Ping(ctx).Err() }()
		}
		var err error
		for range n {
			err = errors.Join(err, <-errs)
		}
		return err
	}
	var err error
	switch c := s.o.Client.(type) {
	case *redis.ClusterClient:
		err = c.ForEachMaster(ctx, open)
	case *redis.Client:
		err = open(ctx, c)
	default:
		err = s.o.Client.Ping(ctx).Err()
	}
	if err != nil {
		return fmt.Errorf("opening connections: %w", err)
	}
	s.warm.Store(true)
	return nil
}

// Ready reports whether the store decides within its timeout now: warmed
// up and no shard's breaker open.
func (s *Redis) Ready() bool { return s.warm.Load() && s.down.Load() == 0 }

// Close stops the background probes; the client is the caller's to close.
func (s *Redis) Close() { s.closed.Do(func() { close(s.stop) }) }

// Up reports whether every shard is believed reachable (no breaker open).
func (s *Redis) Up() bool { return s.down.Load() == 0 }

// keyNames returns the two Redis keys of a (rule, key) counter. They share
// a hash tag, so in Redis Cluster they live in one slot; counters of
// different keys or rules live in different slots (see Redis).
func (s *Redis) keyNames(h *Hit) (string, string) {
	base := s.o.Prefix + "{" + h.Rule.Name + "|" + h.Key.s + "}"
	return base + ":z", base + ":h"
}

// Decide implements Store.
func (s *Redis) Decide(ctx context.Context, hits []Hit, now time.Time, out []Decision) (bool, error) {
	if err := checkBatch(hits, out); err != nil {
		return false, err
	}
	if s.cluster == nil {
		return s.decide(ctx, s.shard(""), hits, now, out, nil)
	}
	parts := s.slotParts(hits)
	if len(parts) == 1 {
		sh, err := s.shardOf(ctx, hits[0])
		if err != nil {
			return false, err
		}
		return s.decide(ctx, sh, hits, now, out, nil)
	}
	return s.decideSplit(ctx, hits, parts, now, out)
}

// slotParts groups a batch's hits by cluster slot, in slot order: the
// fixed order in which every instance decides the parts of a split batch.
func (s *Redis) slotParts(hits []Hit) [][]int {
	if len(hits) == 1 {
		return [][]int{{0}}
	}
	slots := make([]int, len(hits))
	for i := range hits {
		z, _ := s.keyNames(&hits[i])
		slots[i] = Slot(z)
	}
	order := make([]int, len(hits))
	for i := range order {
		order[i] = i
	}
	sort.SliceStable(order, func(a, b int) bool { return slots[order[a]] < slots[order[b]] })
	var parts [][]int
	for _, i := range order {
		if n := len(parts); n > 0 && slots[parts[n-1][0]] == slots[i] {
			parts[n-1] = append(parts[n-1], i)
		} else {
			parts = append(parts, []int{i})
		}
	}
	return parts
}

// decideSplit decides a batch whose hits live in several cluster slots:
// part by part in slot order, rolling back the admitted parts when a later
// one refuses or fails; the parts after a refusal are read without being
// charged (cost 0), so every hit still gets its decision.
func (s *Redis) decideSplit(ctx context.Context, hits []Hit, parts [][]int, now time.Time, out []Decision) (bool, error) {
	type admitted struct {
		sh    *redisShard
		hits  []Hit
		slots []int64
	}
	var done []admitted
	rollback := func() {
		for _, a := range done {
			s.rollback(a.sh, a.hits, a.slots)
		}
	}
	allowed := true
	for _, part := range parts {
		ph := make([]Hit, len(part))
		for j, i := range part {
			ph[j] = hits[i]
			if !allowed {
				ph[j].Cost = 0 // a peek: the batch is refused already
			}
		}
		sh, err := s.shardOf(ctx, ph[0])
		if err != nil {
			rollback()
			return false, err
		}
		pout := make([]Decision, len(part))
		slots := make([]int64, len(part))
		ok, err := s.decide(ctx, sh, ph, now, pout, slots)
		if err != nil {
			rollback()
			return false, err
		}
		for j, i := range part {
			out[i] = pout[j]
			if !allowed {
				out[i].Allowed = pout[j].Remaining >= hits[i].Cost && hits[i].Cost <= hits[i].Rule.Limit
			}
		}
		if !allowed {
			continue
		}
		if !ok {
			allowed = false
			rollback()
			continue
		}
		done = append(done, admitted{sh: sh, hits: ph, slots: slots})
	}
	return allowed, nil
}

// rollback takes back the admissions of one part (best effort: a part
// that cannot be taken back stays counted, which refuses more, never
// admits more, and leaves the window like any admission).
func (s *Redis) rollback(sh *redisShard, hits []Hit, slots []int64) {
	keys := make([]string, 0, 2*len(hits))
	args := make([]any, 0, 1+2*len(hits))
	args = append(args, 0)
	for i := range hits {
		if slots[i] == 0 {
			continue
		}
		z, h := s.keyNames(&hits[i])
		keys = append(keys, z, h)
		args = append(args, slots[i], hits[i].Cost)
	}
	if len(keys) == 0 {
		return
	}
	args[0] = len(keys) / 2
	ctx, cancel := context.WithTimeout(context.Background(), s.o.Timeout)
	defer cancel()
	if err := s.undo.Run(ctx, s.o.Client, keys, args...).Err(); err != nil {
		s.failed(sh, err)
	}
}

// shardOf returns the shard that serves h's counters: in a cluster, the
// master of its slot by the client's current slot map.
func (s *Redis) shardOf(ctx context.Context, h Hit) (*redisShard, error) {
	z, _ := s.keyNames(&h)
	ctx, cancel := context.WithTimeout(ctx, s.o.Timeout)
	defer cancel()
	c, err := s.cluster.MasterForKey(ctx, z)
	if err != nil {
		// No slot map (every node unreachable since start): the cluster as
		// a whole is the shard.
		sh := s.shard("")
		s.failed(sh, err)
		if sh.down.Load() {
			return nil, ErrUnavailable
		}
		return nil, fmt.Errorf("redis decision: %w", err)
	}
	return s.shard(c.Options().Addr), nil
}

// shard returns the breaker of the shard at addr.
func (s *Redis) shard(addr string) *redisShard {
	if v, ok := s.shards.Load(addr); ok {
		return v.(*redisShard)
	}
	v, _ := s.shards.LoadOrStore(addr, &redisShard{addr: addr})
	return v.(*redisShard)
}

// decide runs the script for hits, which all live on sh; slots, when not
// nil, receives the slot each admission went into (for rollback).
func (s *Redis) decide(ctx context.Context, sh *redisShard, hits []Hit, now time.Time, out []Decision, slots []int64) (bool, error) {
	if sh.down.Load() {
		return false, ErrUnavailable
	}
	keys := make([]string, 0, 2*len(hits))
	args := make([]any, 0, 2+4*len(hits))
	args = append(args, len(hits), int64(0))
	if s.o.ClientClock {
		args[1] = now.UnixMicro()
	}
	for i := range hits {
		h := &hits[i]
		z, hk := s.keyNames(h)
		keys = append(keys, z, hk)
		args = append(args, h.Rule.Limit, h.Rule.Window.Microseconds(), h.Cost, maxSlots)
	}
	callCtx, cancel := context.WithTimeout(ctx, s.o.Timeout)
	start := time.Now()
	res, err := s.script.Run(callCtx, s.o.Client, keys, args...).Int64Slice()
	cancel()
	if err != nil && ctx.Err() != nil {
		// The request itself went away (a client disconnect): not a
		// failure of Redis, and no reason to open the breaker.
		return false, fmt.Errorf("redis decision: %w", ctx.Err())
	}
	if s.o.OnCall != nil {
		s.o.OnCall(time.Since(start), err)
	}
	if err != nil {
		if redis.IsClusterDownError(err) {
			// The whole cluster refuses while a slot has no master (Redis's
			// cluster-require-full-coverage): not this shard's failure, so
			// its breaker stays closed; the request fails and FAIL_OPEN
			// applies.
			s.cluster.ReloadState(context.Background())
			return false, fmt.Errorf("redis decision: %w", err)
		}
		s.failed(sh, err)
		return false, fmt.Errorf("redis decision: %w", err)
	}
	sh.failures.Store(0)
	const per = 6
	if len(res) != 1+per*len(hits) {
		return false, fmt.Errorf("redis decision: %d values returned for %d hits", len(res), len(hits))
	}
	for i := range hits {
		r := res[1+per*i:]
		out[i] = Decision{
			Allowed:    r[0] == 1,
			Limit:      hits[i].Rule.Limit,
			Remaining:  r[1],
			RetryAfter: time.Duration(r[2]) * time.Microsecond,
			ResetAfter: time.Duration(r[3]) * time.Microsecond,
			NextAfter:  time.Duration(r[4]) * time.Microsecond,
		}
		if slots != nil {
			slots[i] = r[5]
		}
	}
	return res[0] == 1, nil
}

// failed counts a failure of sh, opens its breaker after enough in a row
// and, in a cluster, asks the client to reload its slot map: a failover
// moves slots to another node without any MOVED reply to tell the client.
// (The client reloads at most every 200 ms however often it is asked.)
func (s *Redis) failed(sh *redisShard, err error) {
	if s.cluster != nil {
		s.cluster.ReloadState(context.Background())
	}
	if sh.failures.Add(1) >= int64(s.o.Failures) {
		s.markDown(sh, err)
	}
}

// MarkDown opens every breaker now (Redis is known to be unreachable, e.g.
// at start) and starts the probe that closes it when Redis answers.
func (s *Redis) MarkDown(err error) { s.markDown(s.shard(""), err) }

func (s *Redis) markDown(sh *redisShard, err error) {
	if !sh.down.CompareAndSwap(false, true) {
		return
	}
	s.down.Add(1)
	if s.o.OnStateChange != nil {
		s.o.OnStateChange(sh.addr, false, err)
	}
	go s.probe(sh)
}

func (s *Redis) markUp(sh *redisShard) {
	sh.failures.Store(0)
	if !sh.down.CompareAndSwap(true, false) {
		return
	}
	s.down.Add(-1)
	if s.o.OnStateChange != nil {
		s.o.OnStateChange(sh.addr, true, nil)
	}
}

// Check reports whether the store is ready and Redis answers a PING (every
// master's, in a cluster) within the timeout now; a failure counts towards
// opening a breaker. For readiness probes: an idle proxy learns that Redis
// is gone without waiting for traffic.
func (s *Redis) Check(ctx context.Context) bool {
	if !s.Ready() {
		return false
	}
	ctx, cancel := context.WithTimeout(ctx, s.o.Timeout)
	defer cancel()
	if s.cluster != nil {
		err := s.cluster.ForEachMaster(ctx, func(ctx context.Context, c *redis.Client) error {
			err := c.Ping(ctx).Err()
			if err != nil {
				s.failed(s.shard(c.Options().Addr), err)
			}
			return err
		})
		return err == nil
	}
	if err := s.o.Client.Ping(ctx).Err(); err != nil {
		s.failed(s.shard(""), err)
		return false
	}
	return true
}

// probe checks sh until it can be used again, then closes its breaker:
// the master answers a PING, or (in a cluster) its slots are served by
// another master now — a failover promoted a replica — so the keys that
// mapped to it map elsewhere and their breaker is another one. A store
// that never warmed up warms up first.
func (s *Redis) probe(sh *redisShard) {
	if !sh.probing.CompareAndSwap(false, true) {
		return
	}
	defer sh.probing.Store(false)
	t := time.NewTicker(s.o.ProbeEvery)
	defer t.Stop()
	for {
		select {
		case <-s.stop:
			return
		case <-t.C:
		}
		ctx, cancel := context.WithTimeout(context.Background(), max(s.o.Timeout, 100*time.Millisecond))
		ok := s.probeOnce(ctx, sh)
		if ok && !s.warm.Load() {
			wctx, wcancel := context.WithTimeout(context.Background(), time.Second)
			ok = s.Warm(wctx) == nil
			wcancel()
		}
		cancel()
		if ok {
			s.markUp(sh)
			return
		}
	}
}

func (s *Redis) probeOnce(ctx context.Context, sh *redisShard) bool {
	if s.cluster == nil || sh.addr == "" {
		if s.cluster != nil {
			return s.cluster.ForEachMaster(ctx, func(ctx context.Context, c *redis.Client) error { return nil }) == nil
		}
		return s.o.Client.Ping(ctx).Err() == nil
	}
	// ForEachMaster reloads the slot map first.
	serving := false
	err := s.cluster.ForEachMaster(ctx, func(ctx context.Context, c *redis.Client) error {
		if c.Options().Addr != sh.addr {
			return nil
		}
		serving = true
		return c.Ping(ctx).Err()
	})
	if !serving {
		return err == nil || !errors.Is(err, context.DeadlineExceeded)
	}
	return err == nil
}

// ParseRedisURL turns REDIS_URL into client options: redis:// and
// rediss:// (one server, or several hosts for Cluster), and
// redis+sentinel://[:password@]host1:26379,host2:26379/master[/db].
func ParseRedisURL(raw string) (*redis.UniversalOptions, error) {
	return parseRedisURL(raw)
}

// NewRedisClient builds the UniversalClient for REDIS_URL, tuned for
// decisions bounded by a short timeout: the context's deadline governs
// every socket operation, and a failed call is not retried (a retry would
// only spend the same deadline; the next request tries again).
func NewRedisClient(raw string) (redis.UniversalClient, error) {
	o, err := parseRedisURL(raw)
	if err != nil {
		return nil, err
	}
	o.ContextTimeoutEnabled = true
	o.MaxRetries = -1
	o.DialTimeout = time.Second
	// RESP2 unless the URL asks for 3: RESP3's push notifications (which
	// the decisions never use) cost a check of the socket on every call,
	// ~13 % of the client's CPU per decision.
	if o.Protocol == 0 {
		o.Protocol = 2
	}
	// One dial attempt: a dead node refuses at once, and go-redis's five
	// attempts 100 ms apart would hold a cluster's slot-map reload on it.
	o.DialerRetries = 1
	if o.PoolSize == 0 {
		// go-redis's default (10 per CPU) makes concurrent decisions queue
		// for a connection: parking and waking cost more than the call
		// (tests/bench/redis.sh).
		o.PoolSize = max(64, 10*runtime.GOMAXPROCS(0))
	}
	// Keep the connections Warm opened: opening one within a decision's
	// 50 ms is what made the first burst after a start time out.
	if o.MinIdleConns == 0 {
		o.MinIdleConns = o.PoolSize
	}
	if o.MasterName == "" && (len(o.Addrs) > 1 || o.IsClusterMode) {
		co := o.Cluster()
		// Failures reload the slot map at once (Redis.failed); this bounds
		// how stale it gets without them.
		co.ClusterStateReloadInterval = 5 * time.Second
		// Follow one MOVED (a resharded slot), but do not retry
		// CLUSTERDOWN with back-off until the deadline: the cluster is
		// degraded for as long as a failover takes, and the decision
		// should fail fast so FAIL_OPEN applies.
		co.MaxRedirects = 1
		return redis.NewClusterClient(co), nil
	}
	return redis.NewUniversalClient(o), nil
}
