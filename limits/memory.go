package limits

import (
	"context"
	"hash/maphash"
	"math"
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
// different keys do not contend. A counter whose rule changed algorithm or
// window (a reload) restarts.
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

// entry is the counter of one (rule, key): a sliding window or a token
// bucket, as isBucket says. w.span is the rule's window in both cases; a
// bucket keeps its state in the window's words it does not use (see
// bucket), so that a counter is 72 bytes (one 80-byte allocation).
type entry struct {
	w       window // inline: one cache miss less per decision
	touched uint32 // unix seconds of the last decision that touched it, for LRU
	// gen is the counter's generation in its shard, named by the Tickets
	// of its hits: a counter reset, restarted or dropped since is another
	// one (see Settle).
	gen        uint32
	isBucket   bool
	isCalendar bool
}

// A calendar counter keeps its period's start (unix s) in its window's
// first slot's time, its count in the window's used count and the
// period's end (unix s) in gone; its window holds no slots.

// calendar returns the counter's period start, end and count.
func (e *entry) calendar() (start, end, count int64) { return e.w.one.at, e.w.gone, e.w.used }

// setCalendar stores a calendar counter's period and count.
func (e *entry) setCalendar(start, end, count int64) {
	e.w.one.at, e.w.gone, e.w.used = start, end, count
}

// calendarCount is what e (nil: a fresh counter) holds of the period p:
// nothing unless it was counted in p (or in a later one, for a clock read
// behind it).
func calendarCount(e *entry, p *calendarPeriod) int64 {
	if e == nil {
		return 0
	}
	if start, _, count := e.calendar(); start >= p.start {
		return count
	}
	return 0
}

// bucket is the state of a token-bucket counter, kept in its window's
// first slot and used count (a bucket has no slots).
func (e *entry) bucket() bucket {
	return bucket{tokens: math.Float64frombits(uint64(e.w.one.at)), last: e.w.one.n, full: e.w.used}
}

// setBucket stores b as the counter's bucket state.
func (e *entry) setBucket(b bucket) {
	e.w.one = slot{at: int64(math.Float64bits(b.tokens)), n: b.last}
	e.w.used = b.full
}

// idle reports whether the entry holds nothing at now that a fresh one
// would not: its window is empty, or its bucket is full.
func (e *entry) idle(now int64) bool {
	if e.isBucket {
		return e.bucket().full <= now/1000
	}
	if e.isCalendar {
		_, end, count := e.calendar()
		return count <= 0 || end <= now/int64(time.Second)
	}
	return e.w.idle(now)
}

type shard struct {
	mu      sync.Mutex
	m       map[stateKey]*entry
	sweptAt int64 // unix ns of the last full sweep, bounds sweep work
	// gen is the last generation given to a counter of the shard; resetGen
	// the one current when a counter of the shard was last reset or
	// restarted by a rule change. Both wrap (compared by newer).
	gen      uint32
	resetGen uint32
	_        [32]byte
}

// nextGen gives a new counter of s its generation (never 0).
func (s *shard) nextGen() uint32 {
	if s.gen++; s.gen == 0 {
		s.gen++
	}
	return s.gen
}

// newer reports whether generation a was given after b (within 2³¹
// generations of each other).
func newer(a, b uint32) bool { return int32(a-b) > 0 }

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
	return m.evaluate(hits, now, out, true)
}

// Peek implements Store, under the same locks as Decide. It creates no
// counter: a key the store does not hold is evaluated as a fresh one.
func (m *Memory) Peek(_ context.Context, hits []Hit, now time.Time, out []Decision) (bool, error) {
	return m.evaluate(hits, now, out, false)
}

// Reset implements Store: it drops the counter of key under rule.
func (m *Memory) Reset(_ context.Context, rule *Rule, key Key) error {
	if rule == nil {
		return ErrBatch
	}
	s := &m.shards[m.shardOf(rule.Name, key.s)]
	k := stateKey{rule: rule.Name, key: key.s}
	s.mu.Lock()
	if _, ok := s.m[k]; ok {
		delete(s.m, k)
		m.keys.Add(-1)
		s.resetGen = s.nextGen() // settlements of its hits are skipped
	}
	s.mu.Unlock()
	return nil
}

// evaluate decides hits at now in one critical section; with record, an
// admitted batch is recorded, else only previewed.
func (m *Memory) evaluate(hits []Hit, now time.Time, out []Decision, record bool) (bool, error) {
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
	var entBuf [maxInlineHits]*entry
	var levelBuf [maxInlineHits]float64
	ents, levels := entBuf[:0], levelBuf[:0]
	for i := range hits {
		h := &hits[i]
		e := m.entry(&m.shards[idx[i]], h, ns, record)
		ents = append(ents, e)
		levels = append(levels, evaluateHit(e, h, ns, &out[i], record))
		if !h.Rule.Shadow {
			allowed = allowed && out[i].Allowed
		}
	}
	caller := hits
	if o, lowered := clampOutput(hits, func(i int) int64 { return out[i].Remaining }); lowered {
		// What remains is read under the same locks as the charge is
		// taken: the clamping hits are decided again at the lowered cost.
		hits = append([]Hit(nil), hits...)
		allowed = true
		for i := range hits {
			h := &hits[i]
			if h.clamps() {
				h.Cost = h.Clamp.cost(o)
				levels[i] = evaluateHit(ents[i], h, ns, &out[i], record)
			}
			if !h.Rule.Shadow {
				allowed = allowed && out[i].Allowed
			}
		}
		for i := range hits {
			if hits[i].clamps() {
				out[i].Output = o
			}
		}
	} else if _, _, ok := clampBounds(hits); ok {
		for i := range hits {
			if hits[i].clamps() {
				out[i].Output = hits[i].Clamp.Max
			}
		}
	}
	if !allowed {
		return false, nil
	}
	for i := range hits {
		// Every enforcing hit admits here; a shadow hit counts if it fits.
		if out[i].Allowed && hits[i].Cost > 0 {
			takeHit(ents[i], &hits[i], ns, levels[i], &out[i], record)
		}
		if record && hits[i].clamps() {
			caller[i].Cost = hits[i].Cost // what was charged
		}
	}
	return true, nil
}

// evaluateHit decides h at now (ns) against e, nil for a fresh counter,
// recording nothing; for a token bucket it returns the level at now.
func evaluateHit(e *entry, h *Hit, now int64, d *Decision, record bool) float64 {
	limit, burst := h.Limits()
	if h.Rule.Algorithm == Calendar {
		p := periodOf(h.Rule, time.Unix(0, now))
		*d = calendarDecide(&p, calendarCount(e, &p), h.Cost, limit)
		return 0
	}
	if h.Rule.Algorithm == TokenBucket {
		p := newBucketParams(h.Rule.Window, limit, burst)
		us := now / 1000
		tokens, last := p.burst, us
		if e != nil {
			b := e.bucket()
			tokens, last = b.state(&p, us)
		}
		var level float64
		*d, level = p.decide(tokens, last, us, h.Cost)
		return level
	}
	if e == nil || !record {
		// A Peek records nothing, not even an expiry (a later decision
		// at an earlier clock reading must not see it): it decides on a
		// copy, which shares the ring expire never writes.
		w := window{span: int64(h.Rule.Window)}
		if e != nil {
			w = e.w
		}
		w.expire(now)
		*d = w.decide(now, h.Cost, limit)
		return 0
	}
	e.w.expire(now)
	*d = e.w.decide(now, h.Cost, limit)
	return 0
}

// takeHit records the admitted h in e (with record) or sets d to what
// recording would leave (without).
func takeHit(e *entry, h *Hit, now int64, level float64, d *Decision, record bool) {
	limit, burst := h.Limits()
	if h.Rule.Algorithm == Calendar {
		p := periodOf(h.Rule, time.Unix(0, now))
		count := calendarCount(e, &p)
		calendarTake(&p, count, h.Cost, limit, d)
		if record {
			start, end := p.start, p.end
			if s, en, _ := e.calendar(); s > start {
				start, end = s, en // a clock read behind: the later period stays
			}
			e.setCalendar(start, end, count+h.Cost)
			d.Ticket = Ticket{at: start, gen: e.gen, set: true}
		}
		return
	}
	if h.Rule.Algorithm == TokenBucket {
		p := newBucketParams(h.Rule.Window, limit, burst)
		us := now / 1000
		last := us
		if e != nil {
			b := e.bucket()
			_, last = b.state(&p, us)
		}
		tokens, last := p.take(level, last, us, h.Cost, d)
		if record {
			e.setBucket(bucket{tokens: tokens, last: last, full: us + int64(d.ResetAfter/time.Microsecond)})
			d.Ticket = Ticket{gen: e.gen, set: true}
		}
		return
	}
	if record {
		e.w.record(now, h.Cost, limit, d)
		d.Ticket.gen = e.gen
		return
	}
	w := window{span: int64(h.Rule.Window)}
	if e != nil {
		w = e.w
	}
	w.expire(now)
	w.preview(now, h.Cost, limit, d)
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

// entry returns h's counter, or nil when the shard holds none for h's
// rule as it is now (a new key, or a rule whose algorithm or window
// changed). With create, such a counter is made (or restarted) instead,
// making room for it. The shard is locked.
func (m *Memory) entry(s *shard, h *Hit, now int64, create bool) *entry {
	k := stateKey{rule: h.Rule.Name, key: h.Key.s}
	span, isBucket, isCalendar := h.Rule.span(), h.Rule.Algorithm == TokenBucket, h.Rule.Algorithm == Calendar
	e, ok := s.m[k]
	if ok && e.w.span == span && e.isBucket == isBucket && e.isCalendar == isCalendar {
		if create {
			e.touched = unixSeconds(now)
		}
		return e
	}
	if !create {
		return nil
	}
	if ok {
		// The rule changed (reload): restart its counting.
		*e = entry{w: window{span: span}, isBucket: isBucket, isCalendar: isCalendar, touched: unixSeconds(now), gen: s.nextGen()}
		s.resetGen = e.gen
		return e
	}
	if len(s.m) >= m.perShardCap {
		m.makeRoom(s, now)
	}
	e = &entry{w: window{span: span}, isBucket: isBucket, isCalendar: isCalendar, touched: unixSeconds(now), gen: s.nextGen()}
	s.m[k] = e
	m.keys.Add(1)
	return e
}

// unixSeconds is ns in whole seconds, the LRU's resolution (until 2106).
func unixSeconds(ns int64) uint32 { return uint32(max(ns/int64(time.Second), 0)) }

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
		if oldest == nil || e.touched < oldest.touched {
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
		if e.idle(now) {
			delete(s.m, k)
			n++
		}
	}
	m.keys.Add(int64(-n))
	m.expiredEvicts.Add(int64(n))
	return n
}

// Sweep drops every counter with nothing left at now (an empty window, a
// full bucket) and returns how many it dropped. Run it periodically so
// idle callers do not hold memory; it locks one shard at a time.
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
