package gate

// The memory backend's queue of one priority: fair share (SPEC §9,
// fair_by) as deficit round robin. Each value of the group's fair key
// with waiters has a lane, its own FIFO; the lanes form a ring, and the
// grant goes to the lane whose turn it is, weight requests per turn
// (quantum = weight), then the turn passes on. A lane that empties leaves
// the ring; a new lane joins it at the end of the round (just before the
// lane being served), so a newcomer waits for at most the rest of the
// current turn and one turn of every lane ahead of it. With fair_by
// empty every waiter has the key "": one lane, arrival order.

// lane is one fair key's waiters, the oldest first.
type lane struct {
	key        string
	weight     int // requests per turn, ≥ 1 (the newest waiter's)
	head, tail *waiter
	n          int64
	prev, next *lane // the ring
}

// fairQueue is one priority's waiters.
type fairQueue struct {
	byKey map[string]*lane
	cur   *lane // whose turn it is; nil when nobody waits
	left  int   // requests cur may still take in this turn; 0: a new turn
	count int64
	spare *lane // the last emptied lane, reused (no allocation per busy moment)
}

// push queues w at the tail of its key's lane.
func (q *fairQueue) push(w *waiter) {
	l := q.byKey[w.fair]
	if l == nil {
		l = q.spare
		q.spare = nil
		if l == nil {
			l = &lane{}
		}
		l.key = w.fair
		if q.byKey == nil {
			q.byKey = map[string]*lane{}
		}
		q.byKey[w.fair] = l
		if q.cur == nil {
			l.prev, l.next = l, l
			q.cur, q.left = l, 0
		} else { // at the end of the round: just before the lane served now
			l.prev, l.next = q.cur.prev, q.cur
			q.cur.prev.next = l
			q.cur.prev = l
		}
	}
	l.weight = max(w.weight, 1)
	w.lane = l
	w.prev, w.next = l.tail, nil
	if w.prev != nil {
		w.prev.next = w
	} else {
		l.head = w
	}
	l.tail = w
	l.n++
	q.count++
}

// unlink takes w out of its lane; an emptied lane leaves the ring.
func (q *fairQueue) unlink(w *waiter) {
	l := w.lane
	if w.prev != nil {
		w.prev.next = w.next
	} else {
		l.head = w.next
	}
	if w.next != nil {
		w.next.prev = w.prev
	} else {
		l.tail = w.prev
	}
	w.prev, w.next, w.lane = nil, nil, nil
	l.n--
	q.count--
	if l.n > 0 {
		return
	}
	delete(q.byKey, l.key)
	if l.next == l {
		q.cur, q.left = nil, 0
	} else {
		l.prev.next, l.next.prev = l.next, l.prev
		if q.cur == l {
			q.cur, q.left = l.next, 0
		}
	}
	*l = lane{}
	q.spare = l
}

// pop takes the waiter whose turn it is out of the queue; nil when none.
func (q *fairQueue) pop() *waiter {
	l := q.cur
	if l == nil {
		return nil
	}
	if q.left <= 0 {
		q.left = l.weight
	}
	w := l.head
	q.left--
	next := l.next
	q.unlink(w) // may move cur on (the lane emptied)
	if q.cur == l && q.left == 0 {
		q.cur = next
	}
	return w
}

// lanes is how many fair keys have waiters.
func (q *fairQueue) lanes() int { return len(q.byKey) }
