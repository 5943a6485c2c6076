package limits

import (
	"context"
	"crypto/rand"
	_ "embed"
	"encoding/hex"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"
)

//go:embed places.lua
var placesScript string

// RedisPlacesOptions configures RedisPlaces.
type RedisPlacesOptions struct {
	// Client and Prefix are the Redis store's (the lease sets share the
	// counters' hash tags, so a Cluster spreads them the same way).
	Client redis.UniversalClient
	Prefix string
	// Timeout bounds one call (default 50 ms).
	Timeout time.Duration
	// Lease is how long a place lasts unless its instance renews it
	// (default 15 s): an instance that dies holding places frees them
	// within it. Renew is how often an instance renews its places
	// (default Lease ÷ 3).
	Lease, Renew time.Duration
	// Local, when set (FAIL_OPEN = "local"), holds the places while Redis
	// fails: each instance then takes limit ÷ Instances (at least 1
	// instance) of its own.
	Local     *MemoryPlaces
	Instances int64
	// OnCall, when set, is told the duration and outcome of each call.
	OnCall func(d time.Duration, err error)
}

// RedisPlaces shares the places of concurrency rules between instances by
// leases: a (rule, key)'s places are a sorted set of lease ids scored by
// their expiry on Redis's clock (places.lua). A place is taken in the
// decision's script, given back by ZREM when its request ends, and its
// lease renewed every Renew by the instance that holds it, so a dead
// instance's places come back within Lease.
//
// On a single server (or a Sentinel-managed master) one script call takes
// every place of a batch, all or nothing. On a Cluster each (rule, key) is
// its own slot: places are taken one key at a time and, when a later key
// refuses, the ones taken are given back (meanwhile another request may
// see them taken: it is refused, never admitted past a limit).
type RedisPlaces struct {
	o        RedisPlacesOptions
	script   *redis.Script
	cluster  bool
	instance string // this instance's lease id prefix
	seq      atomic.Int64

	mu   sync.Mutex
	live map[string]map[string]struct{} // set → members this instance holds

	stop   chan struct{}
	done   chan struct{}
	closed sync.Once
}

var _ Places = (*RedisPlaces)(nil)

// NewRedisPlaces returns RedisPlaces and starts its renewals; Close stops
// them.
func NewRedisPlaces(o RedisPlacesOptions) *RedisPlaces {
	if o.Timeout <= 0 {
		o.Timeout = 50 * time.Millisecond
	}
	if o.Lease <= 0 {
		o.Lease = 15 * time.Second
	}
	if o.Renew <= 0 {
		o.Renew = o.Lease / 3
	}
	o.Instances = max(o.Instances, 1)
	var id [8]byte
	rand.Read(id[:])
	_, cluster := o.Client.(*redis.ClusterClient)
	p := &RedisPlaces{o: o, script: redis.NewScript(placesScript), cluster: cluster, instance: hex.EncodeToString(id[:]),
		live: map[string]map[string]struct{}{}, stop: make(chan struct{}), done: make(chan struct{})}
	go p.renewLoop()
	return p
}

// Close stops the renewals. Places still held are not given back: they
// expire within Lease, as a dead instance's would.
func (p *RedisPlaces) Close() {
	p.closed.Do(func() {
		close(p.stop)
		<-p.done
	})
}

// setKey is the sorted set of (rule, key)'s places.
func (p *RedisPlaces) setKey(h *Hit) string {
	return p.o.Prefix + "{" + h.Rule.Name + "|" + h.Key.s + "}:f"
}

func (p *RedisPlaces) member(seq int64) string {
	return p.instance + ":" + strconv.FormatInt(seq, 10)
}

// Take implements Places.
func (p *RedisPlaces) Take(ctx context.Context, hits []Hit, out []Decision, take bool) (bool, error) {
	if err := checkPlaces(hits, out); err != nil {
		return false, err
	}
	var (
		allowed bool
		err     error
	)
	if p.cluster {
		allowed, err = p.takeEach(ctx, hits, out, take)
	} else {
		allowed, err = p.takeAll(ctx, hits, out, take)
	}
	if err != nil && p.o.Local != nil && !errors.Is(err, ErrBatch) {
		local := make([]Hit, len(hits))
		for i := range hits {
			limit, _ := hits[i].Limits()
			local[i] = hits[i]
			local[i].Own, local[i].Limit = true, limit/p.o.Instances
		}
		allowed, err = p.o.Local.Take(ctx, local, out, take)
		for i := range out[:len(hits)] {
			if !out[i].Ticket.IsZero() {
				out[i].Ticket.local = true
			}
		}
	}
	return allowed, err
}

// takeAll decides hits in one script call (their keys on one server).
func (p *RedisPlaces) takeAll(ctx context.Context, hits []Hit, out []Decision, take bool) (bool, error) {
	keys := make([]string, len(hits))
	args := make([]any, 0, 3+4*len(hits))
	mode := "read"
	if take {
		mode = "take"
	}
	args = append(args, mode, p.o.Lease.Milliseconds(), 2*p.o.Lease.Milliseconds())
	seqs := make([]int64, len(hits))
	for i := range hits {
		h := &hits[i]
		keys[i] = p.setKey(h)
		limit, _ := h.Limits()
		cost := min(h.Cost, 1)
		if take && cost > 0 {
			seqs[i] = p.seq.Add(1)
		}
		shadow := 0
		if h.Rule.Shadow {
			shadow = 1
		}
		args = append(args, limit, cost, shadow, p.member(seqs[i]))
	}
	res, err := p.run(ctx, keys, args)
	if err != nil {
		return false, err
	}
	allowed := res[0] == 1
	for i := range hits {
		limit, _ := hits[i].Limits()
		out[i] = placeDecision(res[i+1], limit, hits[i].Cost)
		if allowed && take && seqs[i] > 0 && out[i].Allowed {
			out[i].NextAfter = placeWait
			out[i].Ticket = Ticket{set: true, rec: seqs[i]}
			p.hold(keys[i], p.member(seqs[i]))
		}
	}
	return allowed, nil
}

// takeEach decides hits one key at a time (a Cluster): a refusal gives
// back what was taken before it, and the keys after it are only read.
func (p *RedisPlaces) takeEach(ctx context.Context, hits []Hit, out []Decision, take bool) (bool, error) {
	allowed := true
	for i := range hits {
		ok, err := p.takeAll(ctx, hits[i:i+1], out[i:i+1], take && allowed)
		if err != nil {
			p.giveBack(hits[:i], out[:i])
			return false, err
		}
		if !ok && !hits[i].Rule.Shadow {
			if allowed {
				p.giveBack(hits[:i], out[:i])
			}
			allowed = false
		}
	}
	return allowed, nil
}

// giveBack releases the places taken for hits (a batch refused after they
// were taken): their decisions show them free again.
func (p *RedisPlaces) giveBack(hits []Hit, out []Decision) {
	var taken []Place
	for i := range hits {
		if !out[i].Ticket.IsZero() {
			taken = append(taken, Place{Hit: hits[i], Ticket: out[i].Ticket})
			out[i].Ticket = Ticket{}
			out[i].Remaining = min(out[i].Remaining+1, out[i].Limit)
		}
	}
	p.Release(taken)
}

func (p *RedisPlaces) run(ctx context.Context, keys []string, args []any) ([]int64, error) {
	ctx, cancel := context.WithTimeout(ctx, p.o.Timeout)
	defer cancel()
	start := time.Now()
	res, err := p.script.Run(ctx, p.o.Client, keys, args...).Int64Slice()
	if p.o.OnCall != nil {
		p.o.OnCall(time.Since(start), err)
	}
	if err == nil && len(res) != len(keys)+1 {
		err = errors.New("limits: places script: unexpected reply")
	}
	return res, err
}

// hold notes a place this instance must renew until released.
func (p *RedisPlaces) hold(set, member string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	m := p.live[set]
	if m == nil {
		m = map[string]struct{}{}
		p.live[set] = m
	}
	m[member] = struct{}{}
}

// Release implements Places: one pipelined ZREM per place, on a context
// of its own (the request may be gone). A failed release leaves the place
// to its lease, which is no longer renewed.
func (p *RedisPlaces) Release(places []Place) {
	var local []Place
	type rm struct{ set, member string }
	var gone []rm
	p.mu.Lock()
	for i := range places {
		t := places[i].Ticket
		if t.IsZero() || places[i].Hit.Rule == nil {
			continue
		}
		if t.local {
			local = append(local, places[i])
			continue
		}
		set, member := p.setKey(&places[i].Hit), p.member(t.rec)
		if m := p.live[set]; m != nil {
			delete(m, member)
			if len(m) == 0 {
				delete(p.live, set)
			}
		}
		gone = append(gone, rm{set, member})
	}
	p.mu.Unlock()
	if len(local) > 0 && p.o.Local != nil {
		p.o.Local.Release(local)
	}
	if len(gone) == 0 {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), max(p.o.Timeout, 250*time.Millisecond))
	defer cancel()
	start := time.Now()
	_, err := p.o.Client.Pipelined(ctx, func(pl redis.Pipeliner) error {
		for _, g := range gone {
			pl.ZRem(ctx, g.set, g.member)
		}
		return nil
	})
	if p.o.OnCall != nil {
		p.o.OnCall(time.Since(start), err)
	}
}

// renewLoop renews this instance's leases every Renew.
func (p *RedisPlaces) renewLoop() {
	defer close(p.done)
	t := time.NewTicker(p.o.Renew)
	defer t.Stop()
	for {
		select {
		case <-p.stop:
			return
		case <-t.C:
			p.RenewNow()
		}
	}
}

// RenewNow renews every place this instance holds, in one pipelined round
// trip (one script call per set). Exported for tests.
func (p *RedisPlaces) RenewNow() {
	p.mu.Lock()
	sets := make(map[string][]any, len(p.live))
	for set, m := range p.live {
		args := make([]any, 0, 3+len(m))
		args = append(args, "renew", p.o.Lease.Milliseconds(), 2*p.o.Lease.Milliseconds())
		for member := range m {
			args = append(args, member)
		}
		sets[set] = args
	}
	p.mu.Unlock()
	if len(sets) == 0 {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), max(p.o.Timeout, time.Second))
	defer cancel()
	start := time.Now()
	// Eval, not EvalSha: a pipeline does not retry NOSCRIPT, and a few
	// kilobytes every Renew cost nothing.
	_, err := p.o.Client.Pipelined(ctx, func(pl redis.Pipeliner) error {
		for set, args := range sets {
			p.script.Eval(ctx, pl, []string{set}, args...)
		}
		return nil
	})
	if p.o.OnCall != nil {
		p.o.OnCall(time.Since(start), err)
	}
}

// Held is how many places this instance holds now (tests, metrics).
func (p *RedisPlaces) Held() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	n := 0
	for _, m := range p.live {
		n += len(m)
	}
	return n
}

// ResetKey drops every place of (rule, key), whoever holds it (the admin
// API's DELETE): requests in flight keep running, and their releases find
// nothing to remove.
func (p *RedisPlaces) ResetKey(ctx context.Context, rule *Rule, key Key) error {
	h := Hit{Rule: rule, Key: key}
	ctx, cancel := context.WithTimeout(ctx, max(p.o.Timeout, 250*time.Millisecond))
	defer cancel()
	return p.o.Client.Del(ctx, p.setKey(&h)).Err()
}

// Top implements Lister: a SCAN of every master for q.Rule's lease sets
// (at most 100,000 keys examined), then their places in use read by the
// script, 100 sets a call on a server, one on a Cluster; bounded by
// 100 ms in all, past which it ranks what it read and says Truncated.
func (p *RedisPlaces) Top(ctx context.Context, q TopQuery, _ time.Time) (TopResult, error) {
	if err := q.check(); err != nil {
		return TopResult{}, err
	}
	head := p.o.Prefix + "{" + q.Rule.Name + "|"
	const tail = "}:f"
	match := globEscape(head) + "*" + globEscape(tail)
	deadline := time.Now().Add(100 * time.Millisecond)
	var (
		mu        sync.Mutex
		keys      []Key
		seen      = map[string]bool{}
		examined  atomic.Int64
		truncated atomic.Bool
	)
	scan := func(ctx context.Context, c redis.Cmdable) error {
		var cursor uint64
		for {
			if examined.Load() >= 100_000 || !time.Now().Before(deadline) {
				truncated.Store(true)
				return nil
			}
			examined.Add(1000)
			names, next, err := c.Scan(ctx, cursor, match, 1000).Result()
			if err != nil {
				return err
			}
			mu.Lock()
			for _, n := range names {
				k, ok := strings.CutPrefix(n, head)
				if k, ok = strings.CutSuffix(k, tail); ok && !seen[k] {
					if pk, err := ParseKey(k); err == nil && pk.s == k {
						seen[k] = true
						keys = append(keys, Key{s: k})
					}
				}
			}
			mu.Unlock()
			if cursor = next; cursor == 0 {
				return nil
			}
		}
	}
	var err error
	if c, ok := p.o.Client.(*redis.ClusterClient); ok {
		err = c.ForEachMaster(ctx, func(ctx context.Context, c *redis.Client) error { return scan(ctx, c) })
	} else {
		err = scan(ctx, p.o.Client)
	}
	if err != nil {
		return TopResult{}, fmt.Errorf("redis scan: %w", err)
	}
	batch := 100
	if p.cluster {
		batch = 1
	}
	t := newTopN(q.N)
	for from := 0; from < len(keys); from += batch {
		if from > 0 && !time.Now().Before(deadline) { // the first batch is always read
			truncated.Store(true)
			break
		}
		hits := make([]Hit, 0, batch)
		for _, k := range keys[from:min(from+batch, len(keys))] {
			hits = append(hits, q.hit(k))
		}
		out := make([]Decision, len(hits))
		if _, err := p.takeAll(ctx, hits, out, false); err != nil {
			return TopResult{}, err
		}
		for i := range hits {
			t.offer(stateOf(&hits[i], &out[i]))
		}
	}
	return TopResult{Keys: t.sorted(), Truncated: truncated.Load()}, nil
}
