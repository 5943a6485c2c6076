package gate

import (
	"context"
	"math"
	"sync"
	"time"
)

// memory keeps a group's state in this process: one lock, a queue per
// priority (fair.go: FIFOs taking turns by fair key), the send times of the rate's window. A freed slot goes to the
// head waiter under the same lock as the release, so nothing can take it
// in between; a timer wakes the queue when the rate or a pause lets the
// next request go.
type memory struct {
	o   Options
	now func() time.Time

	mu       sync.Mutex
	inflight int64
	qs       []fairQueue // per priority: the waiters, in turns across fair keys
	queued   int64
	sends    ring // send times (ms) within the rate's window
	pause    int64
	ad       *aimd
	timer    *time.Timer
	timerAt  int64 // ms the timer fires at; 0 none
	closed   bool
}

var _ backend = (*memory)(nil)

func newMemory(o Options) *memory {
	m := &memory{o: o, now: o.Now, qs: make([]fairQueue, len(o.Priorities))}
	if o.Adaptive != nil {
		m.ad = newAIMD(*o.Adaptive, o.Rate)
	}
	return m
}

func millis(t time.Time) int64 { return t.UnixMilli() }

func (m *memory) enter(_ context.Context, w *waiter, now time.Time) (enterResult, error) {
	n := millis(now)
	m.mu.Lock()
	defer m.mu.Unlock()
	m.sends.drop(n - m.o.Per.Milliseconds())
	if m.pause > n {
		left := time.Duration(m.pause-n) * time.Millisecond
		if left > m.o.MaxWait {
			return enterResult{outcome: refused, reason: ReasonPaused, hint: left}, nil
		}
		if m.queued >= m.o.Queue {
			return enterResult{outcome: refused, reason: ReasonQueueFull, hint: left}, nil
		}
		m.push(w)
		m.arm(m.pause)
		return enterResult{outcome: queued, hint: left}, nil
	}
	free, rfree, next := m.room(n)
	var ahead int64
	for p := 0; p <= w.prio; p++ {
		ahead += m.qs[p].count
	}
	if ahead < min(free, rfree) {
		m.take(n)
		return enterResult{outcome: granted}, nil
	}
	var hint time.Duration
	if rfree <= 0 {
		hint = time.Duration(next-n) * time.Millisecond
	}
	if m.queued >= m.o.Queue {
		return enterResult{outcome: refused, reason: ReasonQueueFull, hint: hint}, nil
	}
	m.push(w)
	if rfree <= 0 {
		m.arm(next)
	}
	return enterResult{outcome: queued, hint: hint}, nil
}

// room is the free slots, the rate's free sends and, when none, the ms
// at which the next one frees.
func (m *memory) room(n int64) (free, rfree, next int64) {
	free, rfree = math.MaxInt64, math.MaxInt64
	if m.o.MaxInFlight > 0 {
		free = m.o.MaxInFlight - m.inflight
	}
	if m.o.Rate > 0 {
		limit := m.o.Rate
		if m.ad != nil {
			limit = m.ad.limit(n)
		}
		rfree = limit - int64(m.sends.len())
		if rfree <= 0 {
			next = m.sends.at(m.sends.len()-int(limit)) + m.o.Per.Milliseconds()
		}
	}
	return free, rfree, next
}

func (m *memory) take(n int64) {
	m.inflight++
	if m.o.Rate > 0 {
		m.sends.push(n)
	}
}

func (m *memory) push(w *waiter) {
	if w.done == nil {
		w.done = make(chan error, 1)
	}
	w.queued = true
	m.qs[w.prio].push(w)
	m.queued++
}

func (m *memory) unlink(w *waiter) {
	m.qs[w.prio].unlink(w)
	w.queued = false
	m.queued--
}

// dispatch grants the head waiters as long as slots, the rate and no
// pause allow, and arms the timer for when the rate or pause ends.
func (m *memory) dispatch(n int64) {
	if m.queued == 0 {
		return
	}
	if m.pause > n {
		m.arm(m.pause)
		return
	}
	m.sends.drop(n - m.o.Per.Milliseconds())
	for m.queued > 0 {
		free, rfree, next := m.room(n)
		if free <= 0 {
			return
		}
		if rfree <= 0 {
			m.arm(next)
			return
		}
		var w *waiter
		for p := range m.qs {
			if w = m.qs[p].pop(); w != nil {
				break
			}
		}
		w.queued = false
		m.queued--
		m.take(n)
		w.grant()
	}
}

// arm makes the timer fire at ms at (or earlier, when it already would).
func (m *memory) arm(at int64) {
	if m.closed || m.timerAt != 0 && m.timerAt <= at {
		return
	}
	d := time.Duration(at-millis(m.now())) * time.Millisecond
	m.timerAt = at
	if m.timer == nil {
		m.timer = time.AfterFunc(max(d, 0), m.wake)
		return
	}
	m.timer.Reset(max(d, 0))
}

func (m *memory) wake() {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.timerAt = 0
	m.dispatch(millis(m.now()))
}

func (m *memory) leave(_ context.Context, w *waiter, _ time.Time) (bool, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if !w.queued {
		return false, nil
	}
	m.unlink(w)
	return true, nil
}

func (m *memory) release(_ context.Context, _ *waiter, now time.Time) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.inflight--
	m.dispatch(millis(now))
}

func (m *memory) throttle(_ context.Context, _ *waiter, t throttle, now time.Time) (time.Duration, error) {
	n := millis(now)
	m.mu.Lock()
	defer m.mu.Unlock()
	m.pause = max(m.pause, n+ceilMillis(t.pause))
	if t.decrease && m.ad != nil {
		m.ad.decrease(n, n-t.age.Milliseconds())
	}
	if m.queued > 0 {
		m.arm(m.pause)
	}
	return time.Duration(max(m.pause-n, 0)) * time.Millisecond, nil
}

func (m *memory) resend(_ context.Context, _ *waiter, _ int, now time.Time) (time.Duration, error) {
	n := millis(now)
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.pause > n {
		return time.Duration(m.pause-n) * time.Millisecond, nil
	}
	if m.o.Rate <= 0 {
		return 0, nil
	}
	m.sends.drop(n - m.o.Per.Milliseconds())
	if _, rfree, next := m.room(n); rfree <= 0 {
		return time.Duration(max(next-n, 1)) * time.Millisecond, nil
	}
	m.sends.push(n)
	return 0, nil
}

func (m *memory) update(o Options, now time.Time) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.o = o
	switch {
	case o.Adaptive == nil:
		m.ad = nil
	case m.ad == nil:
		m.ad = newAIMD(*o.Adaptive, o.Rate)
	default: // the factor carries on under the new settings, as on Redis
		m.ad.o, m.ad.rate = *o.Adaptive, o.Rate
		m.ad.floor = min((PPM+o.Rate-1)/o.Rate, o.Adaptive.Ceiling)
	}
	if m.timerAt != 0 { // the rate's end may have moved
		m.timer.Stop()
		m.timerAt = 0
	}
	m.dispatch(millis(now))
}

// hold and unhold count a slot decided elsewhere (on Redis, by this
// instance) as in flight here, for when this memory decides alone.
func (m *memory) hold(now time.Time) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.take(millis(now))
}

func (m *memory) unhold(now time.Time) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.inflight--
	m.dispatch(millis(now))
}

func (m *memory) fairKeys(prio int) int {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.qs[prio].lanes()
}

func (m *memory) snapshot(now time.Time) snapshot {
	n := millis(now)
	m.mu.Lock()
	defer m.mu.Unlock()
	s := snapshot{factor: PPM, pause: time.Duration(max(m.pause-n, 0)) * time.Millisecond}
	if m.ad != nil {
		s.factor = m.ad.factor(n)
	}
	return s
}

func (m *memory) close() {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.closed = true
	if m.timer != nil {
		m.timer.Stop()
	}
}

// ceilMillis is d in whole milliseconds rounded up.
func ceilMillis(d time.Duration) int64 {
	return int64((d + time.Millisecond - 1) / time.Millisecond)
}

// ring is a FIFO of times in milliseconds.
type ring struct {
	buf   []int64
	start int
}

func (r *ring) len() int       { return len(r.buf) - r.start }
func (r *ring) at(i int) int64 { return r.buf[r.start+i] }
func (r *ring) push(ms int64)  { r.buf = append(r.buf, ms) }

// drop removes the times at or before cut: they have left the window.
func (r *ring) drop(cut int64) {
	for r.start < len(r.buf) && r.buf[r.start] <= cut {
		r.start++
	}
	if r.start == len(r.buf) {
		r.buf, r.start = r.buf[:0], 0
	} else if r.start > 1024 && r.start > len(r.buf)/2 {
		r.buf = append(r.buf[:0], r.buf[r.start:]...)
		r.start = 0
	}
}

// aimd is the adaptive factor (ppm), advanced lazily: after the hold, each
// whole Every without a 429 adds Increase, up to Ceiling.
type aimd struct {
	o     Adaptive
	rate  int64
	floor int64 // the factor below which a decrease stops: one request per window (at most the ceiling)
	init  bool
	fa    int64 // the factor
	mk    int64 // ms the current clean period began
	hd    int64 // ms the hold ends
	ld    int64 // ms of the last decrease: 429s of requests sent before it do not count again
}

func newAIMD(o Adaptive, rate int64) *aimd {
	return &aimd{o: o, rate: rate, floor: min((PPM+rate-1)/rate, o.Ceiling)}
}

func (a *aimd) factor(n int64) int64 {
	if !a.init {
		a.init, a.fa, a.mk = true, min(a.o.Start, a.o.Ceiling), n
		return a.fa
	}
	if n >= a.hd {
		base := max(a.mk, a.hd)
		if every := a.o.Every.Milliseconds(); every > 0 && n-base >= every {
			steps := (n - base) / every
			a.fa = min(a.o.Ceiling, a.fa+steps*a.o.Increase)
			a.mk = base + steps*every
		}
	}
	return min(a.fa, a.o.Ceiling)
}

// limit is the effective rate: at least one request per window.
func (a *aimd) limit(n int64) int64 {
	return max(1, a.rate*a.factor(n)/PPM)
}

// decrease applies a 429 to a request sent at sent: once per round, so
// the 429s of requests already in flight at the first do not compound.
func (a *aimd) decrease(n, sent int64) {
	f := a.factor(n)
	if sent < a.ld {
		return
	}
	a.fa = min(f, max(a.floor, f*a.o.Decrease/PPM)) // a decrease never raises it
	a.hd = n + a.o.Hold.Milliseconds()
	a.mk = a.hd
	a.ld = n
}
