package limits

import (
	"context"
	_ "embed"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"
)

// decideScript evaluates (and records, or previews) a batch in one round
// trip, on Redis's clock. See redis.lua.
//
//go:embed redis.lua
var decideScript string

// settleScript corrects what decideScript recorded: settlements, and the
// rollback of a split batch's parts. See settle.lua.
//
//go:embed settle.lua
var settleScript string

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
	// RollbackTimeout bounds the rollback of a split batch's recorded parts
	// on a Cluster (default 2 s, never less than Timeout): a rollback is
	// complete before the refusal is returned, so it does not give up at a
	// decision's timeout (see Redis.rollback).
	RollbackTimeout time.Duration
	// ClientClock makes the script use the now passed to Decide instead of
	// Redis's TIME. For tests that step a fake clock only.
	ClientClock bool
	// TopScan and TopTime bound one Top (the admin API's top keys): at
	// most TopScan keys examined by its SCAN (default 100,000) and TopTime
	// spent scanning and reading the counters found (default 100 ms), over
	// every master together; past either, Top answers with what it read
	// and says so (redistop.go). TopClock is that bound's clock (time.Now
	// when nil; tests step it).
	TopScan  int
	TopTime  time.Duration
	TopClock func() time.Time
}

// Redis is a Store shared by every proxy instance: each decision (and
// each Peek) of a batch is one EVALSHA (reloaded after NOSCRIPT) that
// evaluates and records atomically on Redis's own clock, so instance
// clocks never matter. A (rule, key) counter lives under the hash tag
// {rule|key}: a sliding window in a string (:w, its header and up to 32
// slots) and, past 32 slots, a list of the slots between its oldest and
// newest (:l); a token bucket in one string (:b), a calendar counter in
// one (:c), so a rule whose algorithm changes never reads the other's
// state (see redis.lua). A window's keys of earlier releases (a sorted
// set :z and a hash :h) are never read: an upgrade starts every window
// afresh, and the old keys expire within their window.
//
// On a Redis Cluster a batch whose counters hash to different slots cannot
// be one script: it is decided one slot at a time, in slot order (parts
// holding only shadow hits last: they never refuse), and when a later part
// refuses, the parts already recorded are rolled back (settle.lua); the
// parts after the refusal are evaluated without recording. Between the
// two, a concurrent request may see those units taken and be refused: the
// split batch can refuse a little more than an exact one, and never admits
// more. The decisions of rolled-back hits show Remaining as it was; their
// ResetAfter and NextAfter are those after the rolled-back recording.
//
// Settle is one script (settle.lua) per server, on Redis's clock too; on a
// Cluster one per slot holding settled counters.
type Redis struct {
	o       RedisOptions
	script  *redis.Script
	settle  *redis.Script
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
	if o.RollbackTimeout <= 0 {
		o.RollbackTimeout = 2 * time.Second
	}
	o.RollbackTimeout = max(o.RollbackTimeout, o.Timeout)
	if o.TopScan <= 0 {
		o.TopScan = 100_000
	}
	if o.TopClock == nil {
		o.TopClock = time.Now
	}
	if o.TopTime <= 0 {
		o.TopTime = 100 * time.Millisecond
	}
	s := &Redis{o: o, script: redis.NewScript(decideScript), settle: redis.NewScript(settleScript), stop: make(chan struct{})}
	s.cluster, _ = o.Client.(*redis.ClusterClient)
	return s
}

// Load loads the scripts on every node (every master and replica of a
// cluster: a replica promoted by a failover has them already), so the
// first decisions do not pay the NOSCRIPT round trip within their
// timeout. Decide reloads them by itself whenever a node has lost them.
func (s *Redis) Load(ctx context.Context) error {
	load := func(ctx context.Context, c *redis.Client) error {
		return errors.Join(s.script.Load(ctx, c).Err(), s.settle.Load(ctx, c).Err())
	}
	if s.cluster != nil {
		return s.cluster.ForEachShard(ctx, load)
	}
	return errors.Join(s.script.Load(ctx, s.o.Client).Err(), s.settle.Load(ctx, s.o.Client).Err())
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
