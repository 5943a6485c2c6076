package limits

import (
	"context"
	"sync"
	"time"
)

// A Concurrency rule (SPEC §7.3) counts requests in flight, as nginx's
// limit_conn: a place is taken at admission and given back when the
// request ends, whatever the ending. Places hold them; WithPlaces joins
// them to a Store so that a batch mixing both algorithms is still decided
// all-or-nothing: the places are taken first, then the other hits are
// decided, and the places are given back when those refuse.

// Places holds the places of Concurrency rules. Implementations are safe
// for concurrent use.
type Places interface {
	// Take evaluates hits (all of Concurrency rules) into out. With take,
	// when every enforcing hit has a free place, each enforcing hit of
	// cost > 0, and each shadow hit that fits, takes one: its Decision's
	// Ticket is set and must be given back to Release exactly once.
	// Otherwise (a refusal, or without take) nothing is taken. A hit of
	// cost 0 reads its key's places.
	Take(ctx context.Context, hits []Hit, out []Decision, take bool) (allowed bool, err error)
	// Release gives back the places named by the tickets of p (a zero
	// Ticket is skipped). It never blocks on the request's context.
	Release(p []Place)
}

// Place is one place taken: the hit as decided and its Decision's Ticket.
type Place struct {
	Hit    Hit
	Ticket Ticket
}

// placeWait is the Retry-After and X-RateLimit-Reset of a concurrency
// rule: a place may be freed at any moment.
const placeWait = time.Second

// placeDecision is the decision of a hit of cost on a key with n places
// taken of limit; Remaining is after the hit's place when it fits.
func placeDecision(n, limit, cost int64) Decision {
	d := Decision{Limit: limit, ResetAfter: placeWait}
	if n > 0 {
		d.NextAfter = placeWait
	}
	if cost == 0 || n < limit {
		d.Allowed = true
		d.Remaining = max(limit-n-min(cost, 1), 0)
		return d
	}
	d.Remaining = max(limit-n, 0)
	d.RetryAfter = placeWait
	return d
}

// MemoryPlaces keeps the places of one instance in process.
type MemoryPlaces struct {
	mu  sync.Mutex
	n   map[stateKey]placeCount
	gen uint32 // the generation the next new count gets
}

// placeCount is a (rule, key)'s places in use; gen tells a count made
// after a ResetKey from the one a ticket was taken from.
type placeCount struct {
	n   int64
	gen uint32
}

var _ Places = (*MemoryPlaces)(nil)

// NewMemoryPlaces returns an empty in-process Places.
func NewMemoryPlaces() *MemoryPlaces { return &MemoryPlaces{n: make(map[stateKey]placeCount)} }

// Take implements Places, in one critical section.
func (m *MemoryPlaces) Take(_ context.Context, hits []Hit, out []Decision, take bool) (bool, error) {
	if err := checkPlaces(hits, out); err != nil {
		return false, err
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	allowed := true
	for i := range hits {
		h := &hits[i]
		limit, _ := h.Limits()
		out[i] = placeDecision(m.n[stateKey{rule: h.Rule.Name, key: h.Key.s}].n, limit, h.Cost)
		if !h.Rule.Shadow {
			allowed = allowed && out[i].Allowed
		}
	}
	if !allowed || !take {
		return allowed, nil
	}
	for i := range hits {
		if out[i].Allowed && hits[i].Cost > 0 {
			k := stateKey{rule: hits[i].Rule.Name, key: hits[i].Key.s}
			c, ok := m.n[k]
			if !ok {
				m.gen++
				c.gen = m.gen
			}
			c.n++
			m.n[k] = c
			out[i].NextAfter = placeWait
			out[i].Ticket = Ticket{set: true, gen: c.gen}
		}
	}
	return true, nil
}

// Release implements Places.
func (m *MemoryPlaces) Release(p []Place) {
	m.mu.Lock()
	defer m.mu.Unlock()
	for i := range p {
		if p[i].Ticket.IsZero() || p[i].Hit.Rule == nil {
			continue
		}
		k := stateKey{rule: p[i].Hit.Rule.Name, key: p[i].Hit.Key.s}
		c, ok := m.n[k]
		switch {
		case !ok || c.gen != p[i].Ticket.gen:
			// reset since: the place is no longer counted
		case c.n > 1:
			c.n--
			m.n[k] = c
		default:
			delete(m.n, k)
		}
	}
}

// ResetKey forgets the places of (rule, key) in use (the admin API's
// DELETE): the requests holding them keep running, no longer counted.
func (m *MemoryPlaces) ResetKey(_ context.Context, rule *Rule, key Key) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	delete(m.n, stateKey{rule: rule.Name, key: key.s})
	return nil
}

// Held is how many places are in use now, over every key.
func (m *MemoryPlaces) Held() int {
	m.mu.Lock()
	defer m.mu.Unlock()
	n := 0
	for _, c := range m.n {
		n += int(c.n)
	}
	return n
}

// checkPlaces reports a malformed batch of concurrency hits.
func checkPlaces(hits []Hit, out []Decision) error {
	if len(out) < len(hits) {
		return ErrBatch
	}
	for i := range hits {
		h := &hits[i]
		if h.Rule == nil || h.Rule.Algorithm != Concurrency || h.Cost < 0 {
			return ErrBatch
		}
		if limit, _ := h.Limits(); limit < 0 {
			return ErrBatch
		}
	}
	return nil
}

// WithPlaces returns a Store that decides the hits of Concurrency rules
// with places and the others with s, all-or-nothing: places are taken
// first (a refusal among them leaves s's hits only peeked, for their
// decisions), then s decides; when it refuses or fails, the places are
// given back. The caller releases the places of an admitted batch
// (Places.Release with the hits and their Decisions' Tickets) when the
// request ends. A batch without a Concurrency hit goes to s as it is.
func WithPlaces(s Store, places Places) Store { return &placed{Store: s, places: places} }

type placed struct {
	Store
	places Places
}

// split copies the concurrency hits of hits into c and the others into o,
// with their indexes.
func split(hits []Hit, c, o *[]Hit, ci, oi *[]int) {
	for i := range hits {
		if hits[i].Rule != nil && hits[i].Rule.Algorithm == Concurrency {
			*c, *ci = append(*c, hits[i]), append(*ci, i)
		} else {
			*o, *oi = append(*o, hits[i]), append(*oi, i)
		}
	}
}

func (p *placed) Decide(ctx context.Context, hits []Hit, now time.Time, out []Decision) (bool, error) {
	return p.evaluate(ctx, hits, now, out, true)
}

func (p *placed) Peek(ctx context.Context, hits []Hit, now time.Time, out []Decision) (bool, error) {
	return p.evaluate(ctx, hits, now, out, false)
}

func (p *placed) evaluate(ctx context.Context, hits []Hit, now time.Time, out []Decision, record bool) (bool, error) {
	if !hasPlaces(hits) {
		// The common case, kept apart: the buffers below escape to the
		// heap (1.6 KB and 4 allocations a request, measured).
		if record {
			return p.Store.Decide(ctx, hits, now, out)
		}
		return p.Store.Peek(ctx, hits, now, out)
	}
	return p.evaluatePlaces(ctx, hits, now, out, record)
}

// hasPlaces reports whether a hit of hits is a concurrency rule's.
func hasPlaces(hits []Hit) bool {
	for i := range hits {
		if hits[i].Rule != nil && hits[i].Rule.Algorithm == Concurrency {
			return true
		}
	}
	return false
}

func (p *placed) evaluatePlaces(ctx context.Context, hits []Hit, now time.Time, out []Decision, record bool) (bool, error) {
	var cBuf, oBuf [maxInlineHits]Hit
	var ciBuf, oiBuf [maxInlineHits]int
	c, o, ci, oi := cBuf[:0], oBuf[:0], ciBuf[:0], oiBuf[:0]
	split(hits, &c, &o, &ci, &oi)
	if len(out) < len(hits) {
		return false, ErrBatch
	}
	var cdBuf, odBuf [maxInlineHits]Decision
	cd, od := cdBuf[:0], odBuf[:0]
	cd, od = append(cd, make([]Decision, len(c))...), append(od, make([]Decision, len(o))...)
	defer func() {
		for j, i := range ci {
			out[i] = cd[j]
		}
		for j, i := range oi {
			out[i] = od[j]
		}
	}()
	allowed, err := p.places.Take(ctx, c, cd, record)
	if err != nil {
		return false, err
	}
	if len(o) == 0 {
		return allowed, nil
	}
	if !allowed || !record {
		ok, err := p.Store.Peek(ctx, o, now, od)
		return ok && allowed, err
	}
	ok, err := p.Store.Decide(ctx, o, now, od)
	if err != nil || !ok {
		p.giveBack(c, cd)
	}
	return ok, err
}

// giveBack releases the places taken for c (a batch refused after they
// were taken): their decisions show the place free again.
func (p *placed) giveBack(c []Hit, cd []Decision) {
	var buf [maxInlineHits]Place
	taken := buf[:0]
	for j := range c {
		if !cd[j].Ticket.IsZero() {
			taken = append(taken, Place{Hit: c[j], Ticket: cd[j].Ticket})
			cd[j].Ticket = Ticket{}
			cd[j].Remaining = min(cd[j].Remaining+1, cd[j].Limit)
		}
	}
	p.places.Release(taken)
}

// Reset forgets s's counters, and a concurrency rule's places of key: the
// requests holding them keep running, no longer counted.
func (p *placed) Reset(ctx context.Context, rule *Rule, key Key) error {
	if rule != nil && rule.Algorithm == Concurrency {
		if r, ok := p.places.(interface {
			ResetKey(context.Context, *Rule, Key) error
		}); ok && key.s != "" {
			return r.ResetKey(ctx, rule, key)
		}
		return nil
	}
	return p.Store.Reset(ctx, rule, key)
}

// Settle passes s the settlements of its own hits (a place is released,
// never settled).
func (p *placed) Settle(ctx context.Context, s []Settlement, now time.Time) error {
	for i := range s {
		if s[i].Hit.Rule != nil && s[i].Hit.Rule.Algorithm == Concurrency {
			kept := make([]Settlement, 0, len(s))
			for j := range s {
				if s[j].Hit.Rule == nil || s[j].Hit.Rule.Algorithm != Concurrency {
					kept = append(kept, s[j])
				}
			}
			if len(kept) == 0 {
				return nil
			}
			return p.Store.Settle(ctx, kept, now)
		}
	}
	return p.Store.Settle(ctx, s, now)
}

// Top implements Lister for the places of concurrency rules (the admin
// API's top keys: used is the requests in flight) and passes other rules
// to the store.
func (p *placed) Top(ctx context.Context, q TopQuery, now time.Time) (TopResult, error) {
	if q.Rule != nil && q.Rule.Algorithm == Concurrency {
		if l, ok := p.places.(Lister); ok {
			return l.Top(ctx, q, now)
		}
		return TopResult{}, ErrNoTop
	}
	if l, ok := p.Store.(Lister); ok {
		return l.Top(ctx, q, now)
	}
	return TopResult{}, ErrNoTop
}

// Top implements Lister: the keys of q.Rule with the most places in use.
func (m *MemoryPlaces) Top(_ context.Context, q TopQuery, _ time.Time) (TopResult, error) {
	if err := q.check(); err != nil {
		return TopResult{}, err
	}
	t := newTopN(q.N)
	m.mu.Lock()
	for k, c := range m.n {
		if k.rule != q.Rule.Name {
			continue
		}
		h := q.hit(Key{s: k.key})
		limit, _ := h.Limits()
		d := placeDecision(c.n, limit, 0)
		t.offer(stateOf(&h, &d))
	}
	m.mu.Unlock()
	return TopResult{Keys: t.sorted()}, nil
}
