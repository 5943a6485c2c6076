package limits

import (
	"context"
	"hash/maphash"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hashicorp/golang-lru/v2/simplelru"
)

// Remember is a Store that remembers whom the store behind it refused
// (SPEC §4.2 "Refusals are remembered"): until a refusal's wait has
// passed, the same key's requests under the same rule are refused here,
// with the original decision's times counted down, without asking the
// store. This is exact, not an approximation: a sliding window cannot
// admit that key before the wait ends, since other instances only add to
// its counters. It holds whatever the store's health: a remembered caller
// is refused while the store is slow or dead, whatever FAIL_OPEN says.
//
// A request of smaller cost than the one refused is decided as usual (it
// may fit). A rule changed since (another limit or window: a reload) does
// not match its old memories. The memory is bounded: up to 16 LRU shards
// holding size entries in all (a full shard evicts its least recently
// used entry), each entry dropped when its wait ends.
type Remember struct {
	next   Store
	seed   maphash.Seed
	shards []rememberShard
	hits   atomic.Int64
	evicts atomic.Int64
}

var _ Store = (*Remember)(nil)

const rememberShards = 16

type rememberShard struct {
	mu  sync.Mutex
	lru *simplelru.LRU[memoryKey, refusal]
}

// memoryKey is a (rule, key) counter.
type memoryKey struct{ rule, key string }

// refusal is what is remembered of one refused hit.
type refusal struct {
	cost   int64
	limit  int64
	window time.Duration
	until  time.Time // when the wait ends
	reset  time.Time // when all of the key's counted requests have left the window
}

// RememberStats is the memory's bookkeeping, for metrics.
type RememberStats struct {
	Entries   int   // refusals held (some may have ended, until swept)
	Hits      int64 // requests refused from memory
	Evictions int64 // refusals dropped for room before their wait ended
}

// NewRemember returns next behind a memory of at most size refusals; size
// 0 returns next itself (the feature off).
func NewRemember(next Store, size int) Store {
	if size <= 0 {
		return next
	}
	// Up to 16 shards whose sizes add up to size exactly: the bound holds
	// for small sizes too. Each shard is an LRU of its own.
	n := min(rememberShards, size)
	r := &Remember{next: next, seed: maphash.MakeSeed(), shards: make([]rememberShard, n)}
	for i := range r.shards {
		per := size / n
		if i < size%n {
			per++
		}
		// simplelru's only error is a non-positive size.
		r.shards[i].lru, _ = simplelru.NewLRU[memoryKey, refusal](per, nil)
	}
	return r
}

func (r *Remember) shard(k memoryKey) *rememberShard {
	return &r.shards[maphash.String(r.seed, k.key)%uint64(len(r.shards))]
}

// Decide implements Store.
func (r *Remember) Decide(ctx context.Context, hits []Hit, now time.Time, out []Decision) (bool, error) {
	if err := checkBatch(hits, out); err != nil {
		return false, err
	}
	for i := range hits {
		h := &hits[i]
		k := memoryKey{h.Rule.Name, h.Key.s}
		s := r.shard(k)
		s.mu.Lock()
		m, ok := s.lru.Get(k)
		if ok && !now.Before(m.until) {
			s.lru.Remove(k) // the wait is over: forget it
			ok = false
		}
		s.mu.Unlock()
		if !ok || h.Cost < m.cost || m.limit != h.Rule.Limit || m.window != h.Rule.Window {
			continue
		}
		r.hits.Add(1)
		for j := range hits {
			// The other hits were not asked: they show their full limit,
			// never the fewest remaining.
			out[j] = Decision{Allowed: true, Limit: hits[j].Rule.Limit, Remaining: hits[j].Rule.Limit}
		}
		wait := m.until.Sub(now)
		out[i] = Decision{Limit: h.Rule.Limit, RetryAfter: wait, ResetAfter: max(m.reset.Sub(now), wait), NextAfter: wait}
		return false, nil
	}
	ok, err := r.next.Decide(ctx, hits, now, out)
	if err != nil || ok {
		return ok, err
	}
	for i := range hits {
		d := &out[i]
		if d.Allowed || d.RetryAfter <= 0 {
			continue
		}
		h := &hits[i]
		k := memoryKey{h.Rule.Name, h.Key.s}
		s := r.shard(k)
		s.mu.Lock()
		evicted := s.lru.Add(k, refusal{cost: h.Cost, limit: h.Rule.Limit, window: h.Rule.Window,
			until: now.Add(d.RetryAfter), reset: now.Add(d.ResetAfter)})
		s.mu.Unlock()
		if evicted {
			r.evicts.Add(1)
		}
	}
	return false, nil
}

// Forget drops the memory of key under rule, or of every key of the rule
// when key is zero: a reset, a live change or a reload that concerns them.
func (r *Remember) Forget(rule string, key Key) {
	for i := range r.shards {
		s := &r.shards[i]
		s.mu.Lock()
		if !key.IsZero() {
			s.lru.Remove(memoryKey{rule, key.s})
		} else {
			for _, k := range s.lru.Keys() {
				if k.rule == rule {
					s.lru.Remove(k)
				}
			}
		}
		s.mu.Unlock()
	}
}

// Sweep drops the refusals whose wait has ended by now.
func (r *Remember) Sweep(now time.Time) int {
	n := 0
	for i := range r.shards {
		s := &r.shards[i]
		s.mu.Lock()
		for _, k := range s.lru.Keys() {
			if m, ok := s.lru.Peek(k); ok && !now.Before(m.until) {
				s.lru.Remove(k)
				n++
			}
		}
		s.mu.Unlock()
	}
	return n
}

// Stats reports the memory's bookkeeping.
func (r *Remember) Stats() RememberStats {
	st := RememberStats{Hits: r.hits.Load(), Evictions: r.evicts.Load()}
	for i := range r.shards {
		s := &r.shards[i]
		s.mu.Lock()
		st.Entries += s.lru.Len()
		s.mu.Unlock()
	}
	return st
}
