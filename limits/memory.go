package limits

import (
	"context"
	"hash/maphash"
	"math/bits"
	"sync"
	"sync/atomic"
	"time"
)

const (
	shardCount = 64 // power of two; spreads lock contention over keys
	// evictSample is how many entries a full shard inspects to pick the
	// least recently used one to drop (Redis's approximated LRU).
	evictSample = 8
)

// MemoryOptions configures a Memory store.
type MemoryOptions struct {
	// MaxKeys bounds the (rule, key) counters kept in memory. When a new key
	// arrives at a full store, expired counters are swept first, then the
	// least recently used of a small sample is evicted. <= 0 means 1,000,000.
	MaxKeys int
}

// Memory is an in-process Store: exact, sharded by key, bounded in size.
// The decision for a batch locks the shards its keys live in, in index
// order, so a batch is one critical section and concurrent batches on
// different keys do not contend.
type Memory struct {
	seed        maphash.Seed
	perShardCap int
	shards      [shardCount]shard

	keys          atomic.Int64
	expiredEvicts atomic.Int64
	capacityEvics atomic.Int64
}

var _ Store = (*Memory)(nil)

type stateKey struct {
	rule string
	key  string
}

type entry struct {
	w    window // inline: one cache miss less per decision
	last int64  // unix ns of the last decision that touched it, for LRU
}

type shard struct {
	mu      sync.Mutex
	m       map[stateKey]*entry
	sweptAt int64 // unix ns of the last full sweep, bounds sweep work
	_       [40]byte
}

// NewMemory returns an empty in-memory store.
func NewMemory(o MemoryOptions) *Memory {
	if o.MaxKeys <= 0 {
		o.MaxKeys = 1_000_000
	}
	m := &Memory{seed: maphash.MakeSeed(), perShardCap: max(1, (o.MaxKeys+shardCount-1)/shardCount)}
	for i := range m.shards {
		m.shards[i].m = make(map[stateKey]*entry)
	}
	return m
}

func (m *Memory) shardOf(rule, key string) uint8 {
	h := maphash.String(m.seed, key) ^ maphash.String(m.seed, rule)>>1
	return uint8(h & (shardCount - 1))
}

// maxInlineHits is the batch size decided without allocating.
const maxInlineHits = 8

// Decide implements Store. It never fails but for a malformed batch.
func (m *Memory) Decide(_ context.Context, hits []Hit, now time.Time, out []Decision) (bool, error) {
	if err := checkBatch(hits, out); err != nil {
		return false, err
	}
	var idxBuf [maxInlineHits]uint8
	idx := idxBuf[:0]
	for i := range hits {
		idx = append(idx, m.shardOf(hits[i].Rule.Name, hits[i].Key.s))
	}
	locked := lockSorted(&m.shards, idx)
	defer unlockAll(&m.shards, locked)

	ns := now.UnixNano()
	allowed := true
	var winBuf [maxInlineHits]*window
	wins := winBuf[:0]
	for i := range hits {
		h := &hits[i]
		w := m.window(&m.shards[idx[i]], h, ns)
		w.expire(ns)
		out[i] = w.decide(ns, h.Cost, h.Rule.Limit)
		allowed = allowed && out[i].Allowed
		wins = append(wins, w)
	}
	if allowed {
		for i := range hits {
			wins[i].record(ns, hits[i].Cost, hits[i].Rule.Limit, &out[i])
		}
	}
	return allowed, nil
}

// lockSorted locks each distinct shard in idx in ascending order (a global
// order, so batches cannot deadlock) and returns them as a bit set.
func lockSorted(shards *[shardCount]shard, idx []uint8) uint64 {
	var set uint64
	for _, i := range idx {
		set |= 1 << i
	}
	for s := set; s != 0; s &= s - 1 {
		shards[bits.TrailingZeros64(s)].mu.Lock()
	}
	return set
}

func unlockAll(shards *[shardCount]shard, set uint64) {
	for s := set; s != 0; s &= s - 1 {
		shards[bits.TrailingZeros64(s)].mu.Unlock()
	}
}

// window returns the hit's window, creating it (and making room) when new.
// The shard is locked.
func (m *Memory) window(s *shard, h *Hit, now int64) *window {
	k := stateKey{rule: h.Rule.Name, key: h.Key.s}
	if e, ok := s.m[k]; ok {
		e.last = now
		if e.w.span != int64(h.Rule.Window) {
			// The rule's window changed (reload): restart its counting.
			e.w = window{span: int64(h.Rule.Window)}
		}
		return &e.w
	}
	if len(s.m) >= m.perShardCap {
		m.makeRoom(s, now)
	}
	e := &entry{w: window{span: int64(h.Rule.Window)}, last: now}
	s.m[k] = e
	m.keys.Add(1)
	return &e.w
}

// makeRoom frees at least one place in a full shard: expired counters first
// (at most one full sweep per shard per second), else the least recently
// used of a sample. The shard is locked.
func (m *Memory) makeRoom(s *shard, now int64) {
	if now-s.sweptAt >= int64(time.Second) || now < s.sweptAt {
		s.sweptAt = now
		if m.sweepShard(s, now) > 0 {
			return
		}
	}
	var victim stateKey
	var oldest *entry
	n := 0
	for k, e := range s.m { // map iteration starts at a random place
		if oldest == nil || e.last < oldest.last {
			victim, oldest = k, e
		}
		if n++; n == evictSample {
			break
		}
	}
	if oldest != nil {
		delete(s.m, victim)
		m.keys.Add(-1)
		m.capacityEvics.Add(1)
	}
}

func (m *Memory) sweepShard(s *shard, now int64) int {
	n := 0
	for k, e := range s.m {
		if e.w.idle(now) {
			delete(s.m, k)
			n++
		}
	}
	m.keys.Add(int64(-n))
	m.expiredEvicts.Add(int64(n))
	return n
}

// Sweep drops every counter with nothing left in its window at now and
// returns how many it dropped. Run it periodically so idle callers do not
// hold memory; it locks one shard at a time.
func (m *Memory) Sweep(now time.Time) int {
	ns := now.UnixNano()
	total := 0
	for i := range m.shards {
		s := &m.shards[i]
		s.mu.Lock()
		total += m.sweepShard(s, ns)
		s.sweptAt = ns
		s.mu.Unlock()
	}
	return total
}

// MemoryStats is a snapshot of a Memory store's bookkeeping.
type MemoryStats struct {
	Keys             int64 // counters held now
	ExpiredEvictions int64 // idle counters dropped, total
	CapacityEvicted  int64 // live counters dropped to respect MaxKeys, total
}

// Stats returns the store's counters.
func (m *Memory) Stats() MemoryStats {
	return MemoryStats{
		Keys:             m.keys.Load(),
		ExpiredEvictions: m.expiredEvicts.Load(),
		CapacityEvicted:  m.capacityEvics.Load(),
	}
}
