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
// store. This is exact, not an approximation: neither a sliding window nor
// a token bucket can admit that cost for that key before the wait ends,
// since other instances only add to its counters (take from its bucket).
// On a Redis Cluster a split batch's rollback takes back from counters: a
// refusal whose counter holds a charge that may still be rolled back (the
// store marks it pending) is not remembered, so every refusal remembered
// rests on charges that stay. It holds whatever the store's health: a remembered caller is refused
// while the store is slow or dead, whatever FAIL_OPEN says.
//
// Under a rule whose charges are settled later (Rule.Settles), a refund
// can shorten the wait: such a refusal is remembered at most 1 s (its
// wait still counted down from the store's). A request of smaller cost
// than the one refused is decided as usual (it may fit). A rule changed
// since (another algorithm, window, or effective limit or burst: a
// reload, a tier, an override) does not match its old memories. Shadow hits are never remembered nor answered from memory.
// The memory is bounded: up to 16 LRU shards holding size entries in all
// (a full shard evicts its least recently used entry), each entry dropped
// when its wait ends.
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
	cost      int64
	limit     int64
	burst     int64 // token buckets only
	window    time.Duration
	algorithm Algorithm
	remaining int64
	until     time.Time // when the wait ends
	keep      time.Time // when the memory ends: until, or sooner (settlesMemory)
	reset     time.Time // when the key is back to fresh (window empty, bucket full)
	// refused is false for a snapshot: a hit its batch's refusal did not
	// concern (it admitted), kept as long as the refusal, so that a 429
	// answered from memory shows that rule as the store last did.
	refused bool
	next    time.Time // the decision's NextAfter, as a time
}

// sameCounting reports whether m was made under h's counting and limits.
func (m *refusal) sameCounting(h *Hit) bool {
	limit, burst := h.Limits()
	if h.Rule.Algorithm != TokenBucket {
		burst = 0
	}
	return m.limit == limit && m.burst == burst && m.window == h.Rule.Window && m.algorithm == h.Rule.Algorithm
}

// matches reports whether the refusal answers h: the same counting and
// limits, and a cost at least the one refused.
func (m *refusal) matches(h *Hit) bool {
	return m.refused && h.Cost >= m.cost && m.sameCounting(h)
}

// settlesMemory is the longest a refusal under a rule whose charges are
// settled later is remembered (SPEC §4.2).
const settlesMemory = time.Second

// kept is how long a refusal d of h is remembered: not at all when its
// counter holds a charge a Cluster's split batch may still roll back.
func kept(h *Hit, d *Decision) time.Duration {
	if d.pending {
		return 0
	}
	if h.Rule.Settles {
		return min(d.RetryAfter, settlesMemory)
	}
	return d.RetryAfter
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
	return r.evaluate(ctx, hits, now, out, r.next.Decide)
}

// Peek implements Store: a remembered refusal answers it, else the store
// behind peeks, and a refusal it finds is remembered (it is a real refusal
// at that cost).
func (r *Remember) Peek(ctx context.Context, hits []Hit, now time.Time, out []Decision) (bool, error) {
	return r.evaluate(ctx, hits, now, out, r.next.Peek)
}

// Settle implements Store: the store behind settles.
func (r *Remember) Settle(ctx context.Context, s []Settlement, now time.Time) error {
	return r.next.Settle(ctx, s, now)
}

// Reset implements Store: it forgets the memory of key under rule, then
// resets the store behind.
func (r *Remember) Reset(ctx context.Context, rule *Rule, key Key) error {
	if rule == nil {
		return ErrBatch
	}
	k := memoryKey{rule.Name, key.s}
	s := r.shard(k)
	s.mu.Lock()
	s.lru.Remove(k)
	s.mu.Unlock()
	return r.next.Reset(ctx, rule, key)
}

func (r *Remember) evaluate(ctx context.Context, hits []Hit, now time.Time, out []Decision,
	next func(context.Context, []Hit, time.Time, []Decision) (bool, error)) (bool, error) {
	if err := checkBatch(hits, out); err != nil {
		return false, err
	}
	if r.recall(hits, now, out) {
		return false, nil
	}
	ok, err := next(ctx, hits, now, out)
	if err != nil || ok {
		return ok, err
	}
	// Remember every refusing enforcing hit, and a snapshot of the others
	// for as long as the longest refusal is remembered.
	var longest time.Duration
	for i := range hits {
		if d := &out[i]; !d.Allowed && !hits[i].Rule.Shadow {
			longest = max(longest, kept(&hits[i], d))
		}
	}
	if longest <= 0 {
		return false, nil
	}
	for i := range hits {
		d := &out[i]
		h := &hits[i]
		if h.Rule.Shadow || !d.Allowed && kept(h, d) <= 0 {
			continue
		}
		limit, burst := h.Limits()
		if h.Rule.Algorithm != TokenBucket {
			burst = 0
		}
		m := refusal{cost: h.Cost, limit: limit, burst: burst, window: h.Rule.Window, algorithm: h.Rule.Algorithm,
			remaining: d.Remaining, reset: now.Add(d.ResetAfter), refused: !d.Allowed}
		m.next = now.Add(d.NextAfter)
		if m.refused {
			m.until, m.keep = now.Add(d.RetryAfter), now.Add(kept(h, d))
		} else {
			m.until, m.keep = now.Add(longest), now.Add(longest)
		}
		k := memoryKey{h.Rule.Name, h.Key.s}
		s := r.shard(k)
		s.mu.Lock()
		evicted := false
		if old, ok := s.lru.Peek(k); m.refused || !ok || !old.refused || !now.Before(old.keep) {
			evicted = s.lru.Add(k, m)
		} else if old.sameCounting(h) {
			// A snapshot never replaces a live refusal (of a larger cost:
			// its wait still holds, the key's counters have only grown
			// since), but its state is newer.
			old.remaining, old.reset, old.next = m.remaining, m.reset, m.next
			s.lru.Add(k, old)
		}
		s.mu.Unlock()
		if evicted {
			r.evicts.Add(1)
		}
	}
	return false, nil
}

// recall answers the batch from memory when an enforcing hit's refusal is
// remembered and its wait has not ended, and reports whether it did: every
// remembered refusal of the batch refuses again with its times counted
// down (so the 429 names the same rules and the longest wait), the other
// hits show what is remembered of their key (a snapshot from that
// refusal, or a refusal of a larger cost: the state it left), or, nothing
// remembered, their full limit (they were not asked).
func (r *Remember) recall(hits []Hit, now time.Time, out []Decision) bool {
	var buf [8]refusal
	var seen, hitBuf [8]bool
	mem := buf[:0]
	found := seen[:0]
	refusing := hitBuf[:0]
	refused := false
	for i := range hits {
		h := &hits[i]
		var m refusal
		ok := false
		if !h.Rule.Shadow {
			k := memoryKey{h.Rule.Name, h.Key.s}
			s := r.shard(k)
			s.mu.Lock()
			m, ok = s.lru.Get(k)
			if ok && !now.Before(m.keep) {
				s.lru.Remove(k) // the wait is over: forget it
				ok = false
			}
			s.mu.Unlock()
		}
		ok = ok && m.sameCounting(h)
		again := ok && m.matches(h)
		refused = refused || again
		mem = append(mem, m)
		found = append(found, ok)
		refusing = append(refusing, again)
	}
	if !refused {
		return false
	}
	r.hits.Add(1)
	for j := range hits {
		limit, burst := hits[j].Limits()
		m := &mem[j]
		switch {
		case refusing[j]:
			wait := m.until.Sub(now)
			out[j] = Decision{Limit: m.limit, Remaining: m.remaining, RetryAfter: wait,
				ResetAfter: max(m.reset.Sub(now), wait), NextAfter: wait}
		case found[j]:
			out[j] = Decision{Allowed: true, Limit: m.limit, Remaining: m.remaining,
				ResetAfter: max(m.reset.Sub(now), 0), NextAfter: max(m.next.Sub(now), 0)}
		default:
			full := limit
			if hits[j].Rule.Algorithm == TokenBucket && limit > 0 {
				full = burst
			}
			out[j] = Decision{Allowed: true, Limit: limit, Remaining: full}
		}
	}
	return true
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

// Sweep drops the refusals no longer remembered at now (their wait over).
func (r *Remember) Sweep(now time.Time) int {
	n := 0
	for i := range r.shards {
		s := &r.shards[i]
		s.mu.Lock()
		for _, k := range s.lru.Keys() {
			if m, ok := s.lru.Peek(k); ok && !now.Before(m.keep) {
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
