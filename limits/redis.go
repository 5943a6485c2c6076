package limits

import (
	"context"
	_ "embed"
	"errors"
	"fmt"
	"runtime"
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

// ErrUnavailable is returned while the store is known to be down (its
// circuit breaker is open): the caller applies its FAIL_OPEN policy
// without waiting.
var ErrUnavailable = errors.New("limits: store unavailable")

// RedisOptions configures a Redis store.
type RedisOptions struct {
	Client redis.UniversalClient
	// Prefix starts every key ("ratelimit-proxy:").
	Prefix string
	// Timeout bounds one decision (default 50 ms): a slow Redis must not
	// add seconds to every request.
	Timeout time.Duration
	// Failures is how many consecutive failed decisions open the breaker
	// (default 3). While open, Decide fails at once with ErrUnavailable and
	// a probe pings Redis every ProbeEvery (default 250 ms) until it
	// answers.
	Failures   int
	ProbeEvery time.Duration
	// OnCall, when set, is told the duration and outcome of each call to
	// Redis (for metrics).
	OnCall func(d time.Duration, err error)
	// OnStateChange, when set, is told each time the store goes down (the
	// breaker opens, with the error that opened it) or comes back.
	OnStateChange func(up bool, err error)
	// ClientClock makes the script use the now passed to Decide instead of
	// Redis's TIME. For tests that step a fake clock only.
	ClientClock bool
}

// Redis is a Store shared by every proxy instance: each decision is one
// EVALSHA (reloaded after NOSCRIPT) that evaluates and records atomically
// on Redis's own clock, so instance clocks never matter.
type Redis struct {
	o      RedisOptions
	script *redis.Script

	down     atomic.Bool
	failures atomic.Int64
	probing  sync.Mutex // held by the one running probe
	stop     chan struct{}
	stopOnce sync.Once
}

var _ Store = (*Redis)(nil)

// NewRedis returns a Redis store. Close stops its probe.
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
	return &Redis{o: o, script: redis.NewScript(decideScript), stop: make(chan struct{})}
}

// Load loads the script into Redis, so the first decisions do not pay the
// NOSCRIPT round trip within their timeout. Decide reloads it by itself
// whenever Redis has lost it (a restart, SCRIPT FLUSH, a failover).
func (s *Redis) Load(ctx context.Context) error {
	return s.script.Load(ctx, s.o.Client).Err()
}

// Close stops the background probe; the client is the caller's to close.
func (s *Redis) Close() { s.stopOnce.Do(func() { close(s.stop) }) }

// Up reports whether the store is believed reachable (breaker closed).
func (s *Redis) Up() bool { return !s.down.Load() }

// keyNames returns the two Redis keys of a (rule, key) counter. They share
// a hash tag, so in Redis Cluster they live in one slot.
func (s *Redis) keyNames(h *Hit) (string, string) {
	base := s.o.Prefix + "{" + h.Rule.Name + "|" + h.Key.s + "}"
	return base + ":z", base + ":h"
}

// Decide implements Store.
func (s *Redis) Decide(ctx context.Context, hits []Hit, now time.Time, out []Decision) (bool, error) {
	if err := checkBatch(hits, out); err != nil {
		return false, err
	}
	if s.down.Load() {
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
		s.failed(err)
		return false, fmt.Errorf("redis decision: %w", err)
	}
	s.failures.Store(0)
	if len(res) != 1+5*len(hits) {
		return false, fmt.Errorf("redis decision: %d values returned for %d hits", len(res), len(hits))
	}
	for i := range hits {
		r := res[1+5*i:]
		out[i] = Decision{
			Allowed:    r[0] == 1,
			Limit:      hits[i].Rule.Limit,
			Remaining:  r[1],
			RetryAfter: time.Duration(r[2]) * time.Microsecond,
			ResetAfter: time.Duration(r[3]) * time.Microsecond,
			NextAfter:  time.Duration(r[4]) * time.Microsecond,
		}
	}
	return res[0] == 1, nil
}

// failed counts a failure and opens the breaker after enough in a row.
func (s *Redis) failed(err error) {
	if s.failures.Add(1) >= int64(s.o.Failures) {
		s.MarkDown(err)
	}
}

// MarkDown opens the breaker now (Redis is known to be unreachable, e.g.
// at start) and starts the probe that closes it when Redis answers.
func (s *Redis) MarkDown(err error) {
	if !s.down.CompareAndSwap(false, true) {
		return
	}
	if s.o.OnStateChange != nil {
		s.o.OnStateChange(false, err)
	}
	go s.probe()
}

// Check reports whether Redis answers a PING within the timeout now; a
// failure counts towards opening the breaker. For readiness probes: an
// idle proxy learns that Redis is gone without waiting for traffic.
func (s *Redis) Check(ctx context.Context) bool {
	if s.down.Load() {
		return false
	}
	ctx, cancel := context.WithTimeout(ctx, s.o.Timeout)
	defer cancel()
	if err := s.o.Client.Ping(ctx).Err(); err != nil {
		s.failed(err)
		return false
	}
	return true
}

// probe pings Redis until it answers, then closes the breaker.
func (s *Redis) probe() {
	if !s.probing.TryLock() {
		return
	}
	defer s.probing.Unlock()
	t := time.NewTicker(s.o.ProbeEvery)
	defer t.Stop()
	for {
		select {
		case <-s.stop:
			return
		case <-t.C:
		}
		ctx, cancel := context.WithTimeout(context.Background(), max(s.o.Timeout, 100*time.Millisecond))
		err := s.o.Client.Ping(ctx).Err()
		cancel()
		if err == nil {
			s.failures.Store(0)
			s.down.Store(false)
			if s.o.OnStateChange != nil {
				s.o.OnStateChange(true, nil)
			}
			return
		}
	}
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
	if o.PoolSize == 0 {
		// go-redis's default (10 per CPU) makes concurrent decisions queue
		// for a connection: parking and waking cost more than the call
		// (tests/bench/redis.sh).
		o.PoolSize = max(64, 10*runtime.GOMAXPROCS(0))
	}
	return redis.NewUniversalClient(o), nil
}
