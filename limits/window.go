package limits

import (
	"sort"
	"time"
)

// maxSlots bounds the memory of one sliding-window key whatever its limit
// (SPEC §7.3): up to this many time slots are kept. A rule whose limit fits
// gives every admission a slot of its own and is exact; a larger limit merges
// admissions that fall in the same 1/1000 of the window into one slot that
// leaves the window with its latest admission, so the window may refuse up to
// window/1000 early and never admits more than the limit.
const maxSlots = 1000

// slot is one or more admissions counted together; it holds at least one
// unit (a slot a refund empties is dropped).
type slot struct {
	at int64 // unix ns of the latest admission in the slot
	n  int64 // cost units
}

// window is one key's sliding-window log: its slots in time order, in one
// while it has never held more than one (most callers: one admission
// costs no allocation beside the counter), then in a ring.
type window struct {
	one  slot    // the only slot while ring is nil
	ring *[]slot // nil until a second slot is needed
	head int32   // the ring holds at most maxSlots+1 slots
	size int32
	used int64 // sum of n over live slots
	span int64 // window length, ns
	// gone is the latest time up to which slots were dropped as expired:
	// an admission counted then or before may have lost its slot (see
	// refund).
	gone int64
}

func newWindow(span time.Duration) *window {
	return &window{span: int64(span)}
}

func (w *window) at(i int) *slot {
	if w.ring == nil {
		return &w.one
	}
	r := *w.ring
	return &r[(int(w.head)+i)%len(r)]
}

// capacity is how many slots the window holds without growing.
func (w *window) capacity() int {
	if w.ring == nil {
		return 1
	}
	return len(*w.ring)
}

// expire drops the slots whose latest admission has left the window
// (now-span, now].
func (w *window) expire(now int64) {
	for w.size > 0 {
		s := w.at(0)
		if s.at > now-w.span {
			return
		}
		w.gone = max(w.gone, now-w.span)
		w.used -= s.n
		w.head = int32((int(w.head) + 1) % w.capacity())
		w.size--
	}
	w.head = 0 // empty: restart at the front, keeps the ring compact
}

// idle reports whether nothing counted is left in the window at now.
func (w *window) idle(now int64) bool {
	return w.size == 0 || w.at(int(w.size)-1).at <= now-w.span
}

// decide evaluates cost at now against limit without recording it. The
// caller must have called expire(now).
func (w *window) decide(now, cost, limit int64) Decision {
	// A settled charge may have taken used past the limit; a cost of 0
	// still reads the state.
	d := Decision{Limit: limit, Allowed: cost == 0 || w.used+cost <= limit}
	if d.Allowed {
		d.Remaining = max(limit-w.used, 0)
	} else {
		d.Remaining = max(limit-w.used, 0)
		d.RetryAfter = w.retryAfter(now, cost, limit)
	}
	w.fillAfters(now, &d)
	return d
}

// retryAfter is the wait until enough slots leave for cost to fit.
func (w *window) retryAfter(now, cost, limit int64) time.Duration {
	if cost > limit {
		// Can never fit; the honest answer is "not within this window".
		return time.Duration(w.span)
	}
	need := w.used + cost - limit
	var freed int64
	for i := 0; i < int(w.size); i++ {
		s := w.at(i)
		freed += s.n
		if freed >= need {
			return time.Duration(max(s.at+w.span-now, 1))
		}
	}
	return time.Duration(w.span) // unreachable while used is consistent
}

func (w *window) fillAfters(now int64, d *Decision) {
	if w.size == 0 {
		return
	}
	d.NextAfter = time.Duration(max(w.at(0).at+w.span-now, 0))
	d.ResetAfter = time.Duration(max(w.at(int(w.size)-1).at+w.span-now, 0))
}

// record counts cost at now and updates d to the state after it. limit
// decides the slot policy (see maxSlots).
func (w *window) record(now, cost, limit int64, d *Decision) {
	if cost == 0 {
		return // nothing to count; must not move a slot's expiry
	}
	at := w.add(now, cost, limit)
	d.Remaining = max(limit-w.used, 0)
	w.fillAfters(now, d)
	d.Ticket = Ticket{at: at, set: true}
}

// add counts cost (> 0) at now, in a slot of its own or merged into the
// newest one as place says, and returns the time it is counted at.
func (w *window) add(now, cost, limit int64) int64 {
	at, merge, capacity := w.place(now, limit)
	if merge {
		// Merging moves the slot's earlier admissions later: it can only
		// refuse early, never admit more.
		t := w.at(int(w.size) - 1)
		t.at = at
		t.n += cost
	} else {
		if int(w.size) == w.capacity() {
			w.grow(int(capacity))
		}
		*w.at(int(w.size)) = slot{at: at, n: cost}
		w.size++
	}
	w.used += cost
	return at
}

// refund gives back up to n units of the admission counted at ticket
// (the time add returned), at now: taken out of its slot, never more than
// the slot holds, and only while the admission is in the window. Merging
// only moves a slot's time later and slots never share a time, so while
// no slot counted at ticket or later was dropped, the first slot counted
// at ticket or later is the admission's. A slot left empty is dropped.
func (w *window) refund(ticket, now, n int64) {
	if ticket+w.span <= now || ticket <= w.gone {
		// It has left the window, or its slot may have been dropped (at a
		// clock read later than now) and the first slot at ticket or later
		// is someone else's: nothing to give back.
		return
	}
	i := sort.Search(int(w.size), func(i int) bool { return w.at(i).at >= ticket })
	if i == int(w.size) {
		return
	}
	s := w.at(i)
	n = min(n, s.n)
	s.n -= n
	w.used -= n
	if s.n == 0 {
		w.remove(i)
	}
}

// remove drops the i-th slot, keeping the others in order.
func (w *window) remove(i int) {
	if i == 0 {
		w.head = int32((int(w.head) + 1) % w.capacity())
	} else {
		for j := i; j < int(w.size)-1; j++ {
			*w.at(j) = *w.at(j + 1)
		}
	}
	if w.size--; w.size == 0 {
		w.head = 0
	}
}

// preview updates d to the state record would leave, recording nothing.
func (w *window) preview(now, cost, limit int64, d *Decision) {
	if cost == 0 {
		return
	}
	at, merge, _ := w.place(now, limit)
	oldest := at
	if w.size > 0 && !(merge && w.size == 1) {
		oldest = w.at(0).at
	}
	d.Remaining = max(limit-w.used-cost, 0)
	d.NextAfter = time.Duration(max(oldest+w.span-now, 0))
	d.ResetAfter = time.Duration(max(at+w.span-now, 0))
}

// place is where record counts an admission at now: the time it is
// counted at, whether it merges into the newest slot, and the ring's
// capacity under limit. An admission counted at the newest slot's time
// joins it (they leave the window together: merging them is exact), so
// no two slots share a time and a time names a slot (see refund).
func (w *window) place(now, limit int64) (at int64, merge bool, capacity int64) {
	tie := false
	if w.size > 0 {
		// A clock that went backwards must not break the time order of the
		// ring: count the admission at the latest time seen.
		newest := w.at(int(w.size) - 1).at
		tie = now <= newest
		now = max(now, newest)
	}
	capacity = max(min(limit, maxSlots), 1)
	if limit > maxSlots {
		capacity = maxSlots + 1 // live slots span up to 1001 distinct 1/1000 buckets
	}
	merge = w.size > 0 && (tie || int64(w.size) >= capacity || (limit > maxSlots && sameBucket(w.at(int(w.size)-1).at, now, w.span)))
	return now, merge, capacity
}

func sameBucket(a, b, span int64) bool {
	g := max(span/maxSlots, 1)
	return a/g == b/g
}

// grow enlarges the ring (doubling, up to capacity), keeping slot order;
// the first growth moves the window's one slot into a ring. It is called
// only when the window is full and below capacity.
func (w *window) grow(capacity int) {
	n := min(2*w.capacity(), capacity)
	ring := make([]slot, n)
	for i := 0; i < int(w.size); i++ {
		ring[i] = *w.at(i)
	}
	if w.ring == nil {
		w.ring, w.one = new([]slot), slot{}
	}
	*w.ring, w.head = ring, 0 // one header per window, however often it grows
}
