package limits

import (
	"container/heap"
	"context"
	"errors"
	"strings"
	"time"
)

// Lister is a store that can list the keys of one rule with the most
// used: the admin API's top keys (SPEC §10). Memory, Redis, Remember and
// Fallback implement it.
type Lister interface {
	// Top returns at most q.N keys of q.Rule that hold something at now
	// (used > 0), most used first (ties in key order), each with the
	// state Peek at cost 0 reads for it.
	Top(ctx context.Context, q TopQuery, now time.Time) (TopResult, error)
}

// ErrNoTop is returned by a wrapper whose store behind cannot list keys.
var ErrNoTop = errors.New("limits: the store cannot list its keys")

// TopQuery asks for the keys of one rule with the most used.
type TopQuery struct {
	Rule *Rule
	N    int // >= 1
	// Own, when set, gives the limit and burst a key is held to when they
	// are not the rule's (a per-key override), as Hit.Own does; ok false
	// means the rule's. It may be called under a store's lock: it must be
	// quick and must not call the store.
	Own func(Key) (limit, burst int64, ok bool)
}

// KeyState is one key's state, as a Peek of cost 0 reads it.
type KeyState struct {
	Key Key
	// Limit and Burst are the key's effective limits (its own or the
	// rule's), Used what it holds of its capacity (the limit of a window,
	// the burst of a bucket): capacity minus Decision.Remaining, never
	// negative.
	Limit, Burst int64
	Used         int64
	Decision     Decision
}

// TopResult is the answer of Top.
type TopResult struct {
	Keys []KeyState // most used first
	// Truncated says that a shared store stopped looking at its bound
	// (Redis: RedisOptions.TopScan keys or TopTime): keys it did not reach
	// may be missing.
	Truncated bool
}

func (q *TopQuery) check() error {
	if q.Rule == nil || q.N < 1 || q.Rule.Validate() != nil {
		return ErrBatch
	}
	return nil
}

// hit is the Peek of key under q: cost 0, the key's own limits when it
// has them.
func (q *TopQuery) hit(key Key) Hit {
	h := Hit{Rule: q.Rule, Key: key}
	if q.Own != nil {
		if limit, burst, ok := q.Own(key); ok {
			h.Own, h.Limit, h.Burst = true, limit, burst
		}
	}
	return h
}

// stateOf is the KeyState of h's key given its decision at cost 0.
func stateOf(h *Hit, d *Decision) KeyState {
	limit, burst := h.Limits()
	capacity := limit
	if h.Rule.Algorithm == TokenBucket {
		capacity = burst
	}
	return KeyState{Key: h.Key, Limit: limit, Burst: burst, Used: max(capacity-d.Remaining, 0), Decision: *d}
}

// topN keeps the n most used key states offered to it (a min-heap whose
// root is the one to drop first).
type topN struct {
	n int
	h topHeap
}

func newTopN(n int) *topN { return &topN{n: n, h: make(topHeap, 0, min(n, 1024))} }

// offer keeps ks if it is among the n most used so far; a key that holds
// nothing is never kept.
func (t *topN) offer(ks KeyState) {
	if ks.Used <= 0 {
		return
	}
	if len(t.h) < t.n {
		heap.Push(&t.h, ks)
		return
	}
	if before(&ks, &t.h[0]) {
		t.h[0] = ks
		heap.Fix(&t.h, 0)
	}
}

// sorted returns the kept states, most used first.
func (t *topN) sorted() []KeyState {
	out := make([]KeyState, len(t.h))
	for i := len(out) - 1; i >= 0; i-- {
		out[i] = heap.Pop(&t.h).(KeyState)
	}
	return out
}

// before orders key states as Top lists them: most used first, then by key.
func before(a, b *KeyState) bool {
	if a.Used != b.Used {
		return a.Used > b.Used
	}
	return strings.Compare(a.Key.s, b.Key.s) < 0
}

type topHeap []KeyState

func (h topHeap) Len() int           { return len(h) }
func (h topHeap) Less(i, j int) bool { return before(&h[j], &h[i]) } // the last in Top's order at the root
func (h topHeap) Swap(i, j int)      { h[i], h[j] = h[j], h[i] }
func (h *topHeap) Push(x any)        { *h = append(*h, x.(KeyState)) }
func (h *topHeap) Pop() any {
	old := *h
	x := old[len(old)-1]
	*h = old[:len(old)-1]
	return x
}

var (
	_ Lister = (*Memory)(nil)
	_ Lister = (*Remember)(nil)
	_ Lister = (*Fallback)(nil)
	_ Lister = (*Redis)(nil)
)

// Top implements Lister. It walks every shard under its lock, letting go
// of it every copyBatch units of work (a counter, a slot) as WriteState
// does, and evaluates each counter of the rule as Peek would, on the
// counter itself (a window's ring is only read, through a copy of its
// header), keeping the N most used in a bounded heap.
func (m *Memory) Top(ctx context.Context, q TopQuery, now time.Time) (TopResult, error) {
	if err := q.check(); err != nil {
		return TopResult{}, err
	}
	ns := now.UnixNano()
	// Matched as the store makes counters (getEntry): the rule's span and
	// algorithm.
	span, isBucket, isCalendar := q.Rule.span(), q.Rule.Algorithm == TokenBucket, q.Rule.Algorithm == Calendar
	t := newTopN(q.N)
	for i := range m.shards {
		if err := ctx.Err(); err != nil {
			return TopResult{}, err
		}
		m.shards[i].walk(func(k stateKey, e *entry) int {
			// A counter made under another algorithm or window is one
			// Peek reads as fresh: it holds nothing for the rule as it is.
			if k.rule != q.Rule.Name || e.w.span != span || e.isBucket != isBucket || e.isCalendar != isCalendar || e.idle(ns) {
				return 1
			}
			h := q.hit(Key{s: k.key})
			var d Decision
			evaluateHit(e, &h, ns, &d, false)
			t.offer(stateOf(&h, &d))
			if !isBucket && !isCalendar {
				return 1 + int(e.w.size)
			}
			return 1
		})
	}
	return TopResult{Keys: t.sorted()}, nil
}

// Top implements Lister: the store behind lists (refusals remembered here
// are only a shortcut to what it holds).
func (r *Remember) Top(ctx context.Context, q TopQuery, now time.Time) (TopResult, error) {
	l, ok := r.next.(Lister)
	if !ok {
		return TopResult{}, ErrNoTop
	}
	return l.Top(ctx, q, now)
}

// Top implements Lister as Peek falls back: the shared store lists, and
// when it fails the local store does, with every key's limits divided as
// its decisions there are.
func (f *Fallback) Top(ctx context.Context, q TopQuery, now time.Time) (TopResult, error) {
	l, ok := f.primary.(Lister)
	if !ok {
		return TopResult{}, ErrNoTop
	}
	res, err := l.Top(ctx, q, now)
	if err == nil || errors.Is(err, ErrBatch) || ctx.Err() != nil {
		return res, err
	}
	local := q
	local.Own = func(k Key) (int64, int64, bool) {
		h := q.hit(k)
		scaled := f.scaleHit(&h)
		return scaled.Limit, scaled.Burst, true
	}
	return f.local.Top(ctx, local, now)
}
